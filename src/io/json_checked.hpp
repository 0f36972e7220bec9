// JSON from files fp8proj does not control (safetensors headers, checkpoint indexes, tuned
// tables): parsed with a nesting bound, described in messages without recursion, and read
// through the one number rule of fp8proj/numbers.hpp.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace fp8proj::io {

// Deepest nesting any fp8proj file needs is 4 (a tuned table's buckets); 64 leaves room
// while keeping every later walk of the value shallow. The reference safetensors parser
// (serde_json) stops at 128.
inline constexpr int kMaxJsonDepth = 64;

// Parses `text` as one JSON value. Throws fp8proj::Error "<where> is not valid JSON (...)" on a
// syntax error, a NUL byte anywhere (nlohmann's lexer would stop at it and ignore the rest),
// or nesting deeper than max_depth (checked by a linear pre-scan, before any parsing).
nlohmann::json parse_json(std::string_view text, const std::string& where, int max_depth = kMaxJsonDepth);

// A short, bounded description of a value, for messages: scalars as JSON (strings cut to 64
// characters), arrays of scalars element by element up to 8, anything else by kind and size
// ("an array of 3 elements", "an object of 2 fields"). Never recurses.
std::string describe_json(const nlohmann::json& v);

// A JSON integer (not a bool, not a float such as 12.5 or 1e300) within [lo, hi]; throws
// fp8proj::Error "<what> is ..." otherwise. Unsigned values above INT64_MAX are out of range.
int64_t json_int(const nlohmann::json& v, const std::string& what, int64_t lo, int64_t hi);
// A JSON number (integer or float, not a bool), finite, within [lo, hi].
double json_number(const nlohmann::json& v, const std::string& what, double lo, double hi);
// A JSON string.
const std::string& json_string(const nlohmann::json& v, const std::string& what);

}  // namespace fp8proj::io

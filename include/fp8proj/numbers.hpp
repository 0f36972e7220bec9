// One strict rule for the numbers fp8proj reads from people and files: command-line options,
// environment variables and tuned tables all parse through these functions.
//
// Integers: an optional '-', then decimal digits, nothing else (no spaces, '+', hex, fraction
// or exponent), within the full int64 range and then within [lo, hi]. Numbers: a decimal or
// exponent float (std::from_chars, general format), finite, within [lo, hi]. Anything else
// throws fp8proj::Error naming the knob (`what`) and quoting the value; nothing is coerced.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

namespace fp8proj {

inline constexpr int64_t kInt64Min = std::numeric_limits<int64_t>::min();
inline constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

// The value, or nullopt when `text` is not a decimal integer that fits int64.
std::optional<int64_t> try_parse_int(std::string_view text);
// The value, or nullopt when `text` is not a finite number (NaN, inf, 1e999 are not).
std::optional<double> try_parse_number(std::string_view text);

int64_t parse_int(std::string_view text, std::string_view what, int64_t lo = kInt64Min, int64_t hi = kInt64Max);
double parse_number(std::string_view text, std::string_view what, double lo, double hi);

// The message parse_int / parse_number would throw, or "" when the text is acceptable (for
// validators that report instead of throwing, e.g. the CLI's).
std::string int_problem(std::string_view text, std::string_view what, int64_t lo = kInt64Min, int64_t hi = kInt64Max);
std::string number_problem(std::string_view text, std::string_view what, double lo, double hi);

// `text` cut to a printable excerpt of at most 64 characters, for messages.
std::string quote_excerpt(std::string_view text);

}  // namespace fp8proj

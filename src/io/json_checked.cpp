#include "io/json_checked.hpp"

#include <cmath>
#include <cstring>
#include <sstream>

#include "fp8proj/error.hpp"
#include "fp8proj/numbers.hpp"

namespace fp8proj::io {

using nlohmann::json;

namespace {

// Deepest bracket nesting of JSON text outside strings; stops counting past `limit`. Linear,
// constant memory: a 100 MB header of '[' costs one pass, not a stack.
int nesting_depth(std::string_view text, int limit) {
  int depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > deepest) deepest = depth;
      if (deepest > limit) return deepest;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return deepest;
}

const char* kind(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "a bool";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return "an integer";
    case json::value_t::number_float: return "a fraction";
    case json::value_t::string: return "a string";
    case json::value_t::array: return "an array";
    case json::value_t::object: return "an object";
    default: return "a binary value";
  }
}

std::string describe_scalar(const json& v) {
  if (v.is_string()) return quote_excerpt(v.get_ref<const std::string&>());
  return v.dump();  // a scalar: no recursion
}

}  // namespace

json parse_json(std::string_view text, const std::string& where, int max_depth) {
  if (const void* nul = std::memchr(text.data(), '\0', text.size()))
    FP8PROJ_FAIL(where, " is not valid JSON (a NUL byte at offset ",
                 static_cast<const char*>(nul) - text.data(), ")");
  if (const int depth = nesting_depth(text, max_depth); depth > max_depth)
    FP8PROJ_FAIL(where, " is not valid JSON for fp8proj (nested more than ", max_depth, " levels deep)");
  try {
    return json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    FP8PROJ_FAIL(where, " is not valid JSON (", e.what(), ")");
  }
}

std::string describe_json(const json& v) {
  if (v.is_array()) {
    bool scalars = v.size() <= 8;
    for (const json& e : v) scalars = scalars && !e.is_structured();
    if (!scalars) return std::string("an array of ") + std::to_string(v.size()) + " elements";
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + describe_scalar(v[i]);  // as dump() writes it
    return s + "]";
  }
  if (v.is_object()) return "an object of " + std::to_string(v.size()) + " fields";
  return describe_scalar(v);
}

int64_t json_int(const json& v, const std::string& what, int64_t lo, int64_t hi) {
  std::optional<int64_t> x;
  if (v.is_number_integer() && !v.is_number_unsigned()) x = v.get<int64_t>();
  if (v.is_number_unsigned() && v.get<uint64_t>() <= uint64_t(kInt64Max)) x = static_cast<int64_t>(v.get<uint64_t>());
  if (x && *x >= lo && *x <= hi) return *x;
  std::ostringstream os;
  os << what << " is " << describe_json(v) << ", not an integer in [" << lo << ", " << hi << "]";
  if (!x && !v.is_number_integer()) os << " (it is " << kind(v) << ")";
  FP8PROJ_FAIL(os.str());
}

double json_number(const json& v, const std::string& what, double lo, double hi) {
  if (v.is_number() && !v.is_boolean()) {
    const double x = v.get<double>();
    if (std::isfinite(x) && x >= lo && x <= hi) return x;
  }
  FP8PROJ_FAIL(what, " is ", describe_json(v), ", not a finite number in [", lo, ", ", hi, "]");
}

const std::string& json_string(const json& v, const std::string& what) {
  FP8PROJ_CHECK(v.is_string(), what, " is ", describe_json(v), ", not a string");
  return v.get_ref<const std::string&>();
}

}  // namespace fp8proj::io

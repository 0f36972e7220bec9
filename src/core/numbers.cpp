#include "fp8proj/numbers.hpp"

#include <charconv>
#include <cmath>
#include <sstream>

#include "fp8proj/error.hpp"

namespace fp8proj {

std::string quote_excerpt(std::string_view text) {
  constexpr size_t kMax = 64;
  std::string s = "'";
  for (size_t i = 0; i < text.size() && i < kMax; ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f) {
      s += static_cast<char>(c);
    } else {
      static const char* hex = "0123456789abcdef";
      s += "\\x";
      s += hex[c >> 4];
      s += hex[c & 15];
    }
  }
  s += text.size() > kMax ? "'... (" + std::to_string(text.size()) + " characters)" : "'";
  return s;
}

std::optional<int64_t> try_parse_int(std::string_view text) {
  // from_chars accepts a leading '-' and then digits only: no spaces, '+', "0x" or exponent.
  if (text.empty()) return std::nullopt;
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v, 10);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return v;
}

std::optional<double> try_parse_number(std::string_view text) {
  if (text.empty()) return std::nullopt;
  double v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v, std::chars_format::general);
  if (ec != std::errc() || end != text.data() + text.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

namespace {
std::string range_text(int64_t lo, int64_t hi) {
  std::ostringstream os;
  if (lo == kInt64Min && hi == kInt64Max) os << "a 64-bit integer";
  else if (hi == kInt64Max) os << "an integer >= " << lo;
  else if (lo == kInt64Min) os << "an integer <= " << hi;
  else os << "an integer in [" << lo << ", " << hi << "]";
  return os.str();
}
}  // namespace

std::string int_problem(std::string_view text, std::string_view what, int64_t lo, int64_t hi) {
  const std::optional<int64_t> v = try_parse_int(text);
  if (v && *v >= lo && *v <= hi) return "";
  std::ostringstream os;
  os << what << "=" << quote_excerpt(text) << " is not " << range_text(lo, hi);
  if (!v) {
    // Only a well-formed integer can fail by size: an optional leading '-' and at least one digit.
    const std::string_view body = !text.empty() && text.front() == '-' ? text.substr(1) : text;
    const bool digits = !body.empty() && body.find_first_not_of("0123456789") == std::string_view::npos;
    os << (digits ? " (outside the 64-bit range)" : " (decimal digits only, no sign but '-', no fraction)");
  }
  return os.str();
}

std::string number_problem(std::string_view text, std::string_view what, double lo, double hi) {
  const std::optional<double> v = try_parse_number(text);
  if (v && *v >= lo && *v <= hi) return "";
  std::ostringstream os;
  os << what << "=" << quote_excerpt(text) << " is not a finite number in [" << lo << ", " << hi << "]";
  return os.str();
}

int64_t parse_int(std::string_view text, std::string_view what, int64_t lo, int64_t hi) {
  const std::string problem = int_problem(text, what, lo, hi);
  FP8PROJ_CHECK(problem.empty(), problem);
  return *try_parse_int(text);
}

double parse_number(std::string_view text, std::string_view what, double lo, double hi) {
  const std::string problem = number_problem(text, what, lo, hi);
  FP8PROJ_CHECK(problem.empty(), problem);
  return *try_parse_number(text);
}

}  // namespace fp8proj

// Parsing and validating one safetensors file (format rules: io/safetensors.hpp).
#include "io/safetensors.hpp"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "fp8proj/error.hpp"
#include "io/json_checked.hpp"

namespace fp8proj {

// Tensor bytes are handed out as they lie in the file; a big-endian host would have to swap.
static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian");

namespace {

struct DTypeSpec {
  DType dtype;
  std::string_view name;
  int bits;
};

// Every dtype of safetensors 0.8 (its Rust Dtype enum), with its width in bits.
constexpr DTypeSpec kDTypes[] = {
    {DType::boolean, "BOOL", 8},        {DType::f4, "F4", 4},
    {DType::f6_e2m3, "F6_E2M3", 6},     {DType::f6_e3m2, "F6_E3M2", 6},
    {DType::u8, "U8", 8},               {DType::i8, "I8", 8},
    {DType::f8_e5m2, "F8_E5M2", 8},     {DType::f8_e4m3, "F8_E4M3", 8},
    {DType::f8_e8m0, "F8_E8M0", 8},     {DType::f8_e4m3fnuz, "F8_E4M3FNUZ", 8},
    {DType::f8_e5m2fnuz, "F8_E5M2FNUZ", 8}, {DType::i16, "I16", 16},
    {DType::u16, "U16", 16},            {DType::f16, "F16", 16},
    {DType::bf16, "BF16", 16},          {DType::i32, "I32", 32},
    {DType::u32, "U32", 32},            {DType::f32, "F32", 32},
    {DType::c64, "C64", 64},            {DType::f64, "F64", 64},
    {DType::i64, "I64", 64},            {DType::u64, "U64", 64},
};

const DTypeSpec& spec(DType dtype) {
  for (const auto& s : kDTypes)
    if (s.dtype == dtype) return s;
  FP8PROJ_FAIL("invalid DType value ", static_cast<int>(dtype));
}

}  // namespace

std::string_view dtype_name(DType dtype) { return spec(dtype).name; }
int dtype_bits(DType dtype) { return spec(dtype).bits; }

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;  // cannot overflow: validated against the file's size at open
  return n;
}

std::string TensorInfo::shape_string() const { return io::format_shape(shape); }

namespace io {

using nlohmann::json;

std::optional<DType> parse_dtype(std::string_view name) {
  for (const auto& s : kDTypes)
    if (s.name == name) return s.dtype;
  return std::nullopt;
}

std::string format_shape(const std::vector<int64_t>& shape) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << ']';
  return os.str();
}

namespace {

// The reference implementation's MAX_HEADER_SIZE: a larger length is a corrupt or foreign
// file, and refusing it keeps a garbage length from making us parse gigabytes.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

// nlohmann::json keeps the last of two equal keys without a word, so a header could describe
// one tensor twice and we would read whichever came last. This SAX pass over the (already
// parsed, so valid) text sees every key and records the first repeat, at any depth. A parse
// callback could do the same in one pass, but nlohmann's callback parser rescans the parent
// object at every object's end: quadratic, minutes for DeepSeek-V3's ~90k-entry headers.
class DuplicateKeyFinder final : public nlohmann::json_sax<json> {
 public:
  bool start_object(std::size_t) override {
    open_.emplace_back();
    return true;
  }
  bool end_object() override {
    open_.pop_back();
    return true;
  }
  bool key(string_t& key) override {
    if (open_.size() == 1) entry_ = key;
    if (!open_.back().insert(key).second && found_.empty())
      found_ = open_.size() == 1 ? "tensor '" + key + "' appears twice in the header"
                                 : "field '" + key + "' appears twice in the entry of '" + entry_ + "'";
    return true;
  }
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }

  const std::string& found() const { return found_; }

 private:
  std::vector<std::set<std::string>> open_;  // keys seen so far in each object being parsed
  std::string entry_;                        // the top-level key being parsed
  std::string found_;
};

uint64_t read_le64(const std::byte* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof v);  // little-endian host (static_assert above)
  return v;
}

// A non-negative JSON integer. nlohmann stores those as number_unsigned; negative numbers,
// fractions and integers beyond 2^64 (parsed as float) are rejected.
std::optional<uint64_t> as_u64(const json& v) {
  if (!v.is_number_unsigned()) return std::nullopt;
  return v.get<uint64_t>();
}

TensorRecord parse_entry(const std::string& path, const std::string& name, const json& entry,
                         std::span<const std::byte> data) {
  const std::string where = "safetensors file '" + path + "': tensor '" + name + "'";
  FP8PROJ_CHECK(entry.is_object(), where, ": the header entry is not an object");
  for (const char* field : {"dtype", "shape", "data_offsets"})
    FP8PROJ_CHECK(entry.contains(field), where, ": the header entry has no '", field, "'");

  const json& dtype_json = entry.at("dtype");
  FP8PROJ_CHECK(dtype_json.is_string(), where, ": dtype is not a string");
  const std::string& dtype_str = dtype_json.get_ref<const std::string&>();
  const std::optional<DType> dtype = parse_dtype(dtype_str);
  FP8PROJ_CHECK(dtype.has_value(), where, ": unknown dtype '", dtype_str, "'");

  const json& shape_json = entry.at("shape");
  FP8PROJ_CHECK(shape_json.is_array(), where, ": shape is not an array");
  std::vector<int64_t> shape;
  uint64_t numel = 1;
  bool overflow = false;
  for (const json& d : shape_json) {
    const std::optional<uint64_t> dim = as_u64(d);
    FP8PROJ_CHECK(dim && *dim <= uint64_t(std::numeric_limits<int64_t>::max()), where, ": shape ",
                  describe_json(shape_json), " is not a list of non-negative integers");
    shape.push_back(static_cast<int64_t>(*dim));
    overflow |= __builtin_mul_overflow(numel, *dim, &numel);
  }
  uint64_t bits = 0;
  overflow |= __builtin_mul_overflow(numel, uint64_t(spec(*dtype).bits), &bits);
  FP8PROJ_CHECK(!overflow && numel <= uint64_t(std::numeric_limits<int64_t>::max()), where, ": shape ",
                describe_json(shape_json), " has more elements than any file can hold");
  FP8PROJ_CHECK(bits % 8 == 0, where, ": ", numel, " elements of ", dtype_str,
                " do not fill a whole number of bytes");
  const uint64_t nbytes = bits / 8;

  const json& offsets_json = entry.at("data_offsets");
  FP8PROJ_CHECK(offsets_json.is_array() && offsets_json.size() == 2 && as_u64(offsets_json[0]) &&
                    as_u64(offsets_json[1]),
                where, ": data_offsets ", describe_json(offsets_json), " is not a pair of non-negative integers");
  const uint64_t begin = *as_u64(offsets_json[0]), end = *as_u64(offsets_json[1]);
  FP8PROJ_CHECK(begin <= end, where, ": data_offsets [", begin, ", ", end, ") end before they begin");
  FP8PROJ_CHECK(end - begin == nbytes, where, ": data_offsets [", begin, ", ", end, ") hold ", end - begin,
                " bytes, but ", dtype_str, " ", describe_json(shape_json), " needs ", nbytes);
  FP8PROJ_CHECK(end <= data.size(), where, ": data_offsets [", begin, ", ", end,
                ") reach past the end of the data (", data.size(),
                " bytes after the header): the file is truncated or the offsets are wrong");

  return {TensorInfo{name, *dtype, std::move(shape), path, nbytes}, begin, data.subspan(begin, nbytes)};
}

}  // namespace

SafetensorsFile::SafetensorsFile(const std::string& path) : map_(path) {
  ParsedSafetensors parsed = parse_safetensors(map_.bytes(), path);
  shard_ = std::move(parsed.shard);
  tensors_ = std::move(parsed.tensors);
}

ParsedSafetensors parse_safetensors(std::span<const std::byte> file, const std::string& path) {
  ParsedSafetensors out;
  const std::string where = "safetensors file '" + path + "'";
  FP8PROJ_CHECK(file.size() >= 8, where, " is ", file.size(),
                " bytes, shorter than the 8-byte header length: truncated, or not a safetensors file");
  const uint64_t header_len = read_le64(file.data());
  FP8PROJ_CHECK(header_len <= file.size() - 8, where, ": the header length ", header_len,
                " is larger than the rest of the file (", file.size() - 8,
                " bytes): truncated, or not a safetensors file");
  FP8PROJ_CHECK(header_len <= kMaxHeaderBytes, where, ": the header length ", header_len,
                " exceeds the format's limit of ", kMaxHeaderBytes, " bytes");
  const std::string_view text(reinterpret_cast<const char*>(file.data() + 8), header_len);
  // The reference implementation (Rust `safetensors`) takes the header as UTF-8 JSON
  // (serde_json): JSON whitespace may surround the object. A binary file's accidental length
  // gets a clear message instead of a JSON parser's complaint.
  const size_t first = text.find_first_not_of(" \t\n\r");
  FP8PROJ_CHECK(first != std::string_view::npos && text[first] == '{', where,
                ": the header does not start with '{': not a safetensors file");

  // Bounded nesting and no NUL byte (nlohmann would stop at one and ignore the rest).
  const json header = parse_json(text, where + ": the header");
  DuplicateKeyFinder duplicates;
  json::sax_parse(text.begin(), text.end(), &duplicates);
  FP8PROJ_CHECK(duplicates.found().empty(), where, ": ", duplicates.found());
  FP8PROJ_CHECK(header.is_object(), where, ": the header is not a JSON object");

  const std::span<const std::byte> data = file.subspan(8 + header_len);
  out.shard.path = path;
  out.shard.file_bytes = file.size();
  for (const auto& [key, value] : header.items()) {
    if (key == "__metadata__") {
      if (value.is_null()) continue;  // the reference reads it as an optional map
      FP8PROJ_CHECK(value.is_object(), where, ": __metadata__ is not a JSON object");
      for (const auto& [mk, mv] : value.items()) {
        FP8PROJ_CHECK(mv.is_string(), where, ": __metadata__ entry '", mk, "' is not a string");
        out.shard.metadata.emplace(mk, mv.get<std::string>());
      }
      continue;
    }
    out.tensors.push_back(parse_entry(path, key, value, data));
  }

  // Tile check: sorted by offset, each tensor must start where the previous one ended, and
  // the last must end where the file does. Zero-byte tensors sit between neighbours.
  std::sort(out.tensors.begin(), out.tensors.end(), [](const TensorRecord& a, const TensorRecord& b) {
    return std::pair(a.offset, a.info.bytes) < std::pair(b.offset, b.info.bytes);
  });
  uint64_t covered = 0;
  const TensorRecord* previous = nullptr;
  for (const TensorRecord& t : out.tensors) {
    const uint64_t begin = t.offset;
    FP8PROJ_CHECK(begin >= covered, where, ": tensors '", previous ? previous->info.name : "", "' and '",
                  t.info.name, "' overlap (the first ends at data byte ", covered, ", the second begins at ",
                  begin, ")");
    FP8PROJ_CHECK(begin == covered, where, ": bytes [", covered, ", ", begin,
                  ") of the data belong to no tensor (the format forbids holes); next is tensor '",
                  t.info.name, "'");
    covered = begin + t.info.bytes;
    previous = &t;
  }
  FP8PROJ_CHECK(covered == data.size(), where, ": the tensors cover ", covered, " of the ", data.size(),
                " data bytes; the last ", data.size() - covered,
                " belong to no tensor (trailing bytes, or a header that lost entries)");
  out.shard.tensors = out.tensors.size();
  return out;
}

}  // namespace io
}  // namespace fp8proj

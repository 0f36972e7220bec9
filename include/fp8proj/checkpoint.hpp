// Reading model weights from safetensors checkpoints (docs/design.md, "Parts").
//
// The format (https://github.com/huggingface/safetensors): an 8-byte little-endian header
// length n, n bytes of JSON mapping each tensor name to {dtype, shape, data_offsets} (plus an
// optional "__metadata__" of string pairs), then the data. data_offsets are [begin, end) into
// the data, which starts at byte 8 + n; the tensors tile the data with no holes.
//
// A Checkpoint opens one .safetensors file, a directory of shards, or a Hugging Face
// `model.safetensors.index.json` (its "weight_map" names the shard of every tensor), and looks
// tensors up by their Hugging Face names. Files are memory-mapped read-only: opening a
// multi-GB checkpoint reads only the headers, and a tensor's bytes are touched when it is read.
// Every header is validated in full at open (offsets in bounds, matching dtype x shape, no
// overlap, no holes, no duplicate names), so a malformed file fails at once, with an
// fp8proj::Error naming the file and the tensor, never later as a wrong tensor.
//
// Const member functions may be called from several threads at once (the mapping is
// read-only). Changing or truncating a file while it is open is not supported: a read of a
// mapped page that no longer exists ends the process with SIGBUS, as with any mmap reader.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "fp8proj/bf16.hpp"
#include "fp8proj/quantize.hpp"

namespace fp8proj {

// Every element type of the format, as spelled in the header in upper case
// ("F8_E4M3" is OCP e4m3fn, the type of DeepSeek-V3's FP8 weights).
enum class DType : uint8_t {
  boolean, f4, f6_e2m3, f6_e3m2, u8, i8, f8_e5m2, f8_e4m3, f8_e8m0, f8_e4m3fnuz, f8_e5m2fnuz,
  i16, u16, f16, bf16, i32, u32, f32, c64, f64, i64, u64,
};

std::string_view dtype_name(DType dtype);  // "F8_E4M3"
int dtype_bits(DType dtype);               // 4 for F4, 6 for F6_*, else 8 x bytes

struct TensorInfo {
  std::string name;
  DType dtype = DType::u8;
  std::vector<int64_t> shape;  // row-major; {} is a scalar
  std::string file;            // the shard that holds it
  uint64_t bytes = 0;          // of its data: numel x dtype_bits / 8

  int64_t numel() const;
  std::string shape_string() const;  // "[96, 136]"
};

struct ShardInfo {
  std::string path;
  uint64_t file_bytes = 0;
  size_t tensors = 0;
  std::map<std::string, std::string> metadata;  // the header's "__metadata__" (often {"format": "pt"})
};

class Checkpoint {
 public:
  // `path` is a .safetensors file, an index .json, or a directory: its
  // model.safetensors.index.json when there is one, else every *.safetensors in it.
  explicit Checkpoint(const std::string& path);
  ~Checkpoint();
  Checkpoint(Checkpoint&&) noexcept;
  Checkpoint& operator=(Checkpoint&&) noexcept;

  const std::string& path() const;
  const std::vector<ShardInfo>& shards() const;
  size_t size() const;                     // number of tensors
  std::vector<std::string> names() const;  // sorted

  const TensorInfo* find(std::string_view name) const;  // nullptr when absent
  // Throws for a missing tensor, naming it and listing the closest names the checkpoint has.
  const TensorInfo& info(std::string_view name) const;
  // info(), and throws unless the tensor has exactly this shape.
  const TensorInfo& expect(std::string_view name, const std::vector<int64_t>& shape) const;

  // The tensor's little-endian bytes inside the mapping; valid while the Checkpoint lives.
  // Not aligned beyond 1 byte in general (the format packs tensors back to back).
  std::span<const std::byte> bytes(std::string_view name) const;

  // BF16 as stored; F32 and F16 rounded to nearest even (NaN stays NaN, +-inf stays inf).
  // Any other dtype throws — an FP8 tensor without its scales would be silently wrong.
  // `out` must hold exactly numel() elements.
  void read_bf16(std::string_view name, std::span<bf16> out) const;
  std::vector<bf16> read_bf16(std::string_view name) const;

  // A DeepSeek-V3-style FP8 weight: `name` is F8_E4M3 [N, K] and `<name>_scale_inv` is F32
  // (or F8_E8M0: UE8M0 bytes, widened to fp32 exactly) [ceil(N/128), ceil(K/128)], the factor
  // each 128x128 block's values are multiplied by.
  // Both are copied bit for bit into our layout (which is the same); the scales are kept
  // exactly, whatever fp32 values they hold, and must be finite (a NaN or infinite scale
  // would turn a whole block into NaN: that is a corrupt file, not data). NaN codes among
  // the values are data and are kept.
  HostFp8Weight read_fp8_weight(std::string_view name) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A projection weight [N, K] as the checkpoint holds it.
struct HostBf16Weight {
  std::vector<bf16> values;  // [N, K] row-major
  int64_t n = 0, k = 0;
};
using HostWeight = std::variant<HostBf16Weight, HostFp8Weight>;

// Loads `name`, which must have shape [n, k]: an F8_E4M3 tensor with its `_scale_inv` as
// HostFp8Weight, a BF16/F16/F32 tensor as HostBf16Weight. A `_scale_inv` next to a
// non-FP8 weight is an error (the file does not say what it would scale).
HostWeight load_projection_weight(const Checkpoint& checkpoint, std::string_view name,
                                  int64_t n, int64_t k);

// The weight as bf16: moved through when it already is, dequantized (fp32 value x scale,
// then rounded to nearest even) when FP8 — for consumers that only take bf16, such as the
// layers that always stay bf16.
HostBf16Weight to_bf16(HostWeight weight);

}  // namespace fp8proj

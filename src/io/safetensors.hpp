// One .safetensors file: mapped, its header parsed and validated in full. What a valid file
// is follows the format's reference implementation (huggingface/safetensors, Rust): header
// length at most 100 MB, a JSON object whose entries are {dtype, shape, data_offsets} plus an
// optional "__metadata__" of strings, and tensors that tile the data exactly — each holding
// dtype x shape bytes, no two overlapping, no byte belonging to none ("the byte buffer needs
// to be entirely indexed, and cannot contain holes"). Beyond the reference, a tensor named
// twice in one header is rejected (the reference keeps the last entry without a word).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "fp8proj/checkpoint.hpp"
#include "io/mapped_file.hpp"

namespace fp8proj::io {

struct TensorRecord {
  TensorInfo info;
  uint64_t offset = 0;              // data_offsets[0]: from the end of the header
  std::span<const std::byte> data;  // into the mapping; info.bytes long
};

// The parse and validation of a whole safetensors file held in memory (what SafetensorsFile
// does after mapping it; also the fuzzing entry point, tests/fuzz). `path` names it in errors.
// The records' data spans point into `file`.
struct ParsedSafetensors {
  ShardInfo shard;
  std::vector<TensorRecord> tensors;  // in data order
};
ParsedSafetensors parse_safetensors(std::span<const std::byte> file, const std::string& path);

class SafetensorsFile {
 public:
  // Throws fp8proj::Error naming the file (and the tensor, where one is at fault).
  explicit SafetensorsFile(const std::string& path);

  const ShardInfo& shard() const { return shard_; }
  const std::vector<TensorRecord>& tensors() const { return tensors_; }  // in data order

 private:
  MappedFile map_;
  ShardInfo shard_;
  std::vector<TensorRecord> tensors_;
};

// The dtype a header spells `name` ("BF16"), or nullopt for a name the format does not have.
std::optional<DType> parse_dtype(std::string_view name);

std::string format_shape(const std::vector<int64_t>& shape);  // "[96, 136]"

}  // namespace fp8proj::io

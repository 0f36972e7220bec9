// fp8proj verify --checkpoint: per layer of a Hugging Face MLA checkpoint, which projections are
// eligible and tagged, the memory the FP8 copies add, the weight quantization error and the GEMM
// error on random activations of the model's scale (verify_checkpoint.cpp says how).
#pragma once

#include <cstdint>
#include <string>

#include "fp8proj/formats.hpp"

namespace fp8proj::cli {

struct VerifyCheckpointArgs {
  std::string checkpoint;  // directory (config.json + safetensors / index), index .json or file
  std::string layers;      // "all" or "0,3,7"
  int64_t m = 256;         // activation rows of the GEMM check
  uint64_t seed = 7;
  std::string json, csv;   // result files; empty: none
  ScaleMode weight_scales = ScaleMode::ue8m0;  // the FP8 copy made from a bf16 projection
};

void run_verify_checkpoint(const VerifyCheckpointArgs& args);

}  // namespace fp8proj::cli

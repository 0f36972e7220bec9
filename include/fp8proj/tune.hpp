// Tuned tables: per GPU and weight shape (N, K), the measured crossover from which the FP8
// path (activation quantization included) beats bf16, and per M bucket the fastest FP8
// candidate. Written by `fp8proj tune`, shipped under configs/, read at layer construction.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fp8proj/gemm_config.hpp"

namespace fp8proj {

struct TunedBucket {
  int64_t m_lo = 0, m_hi = 0;   // the bucket covers m_lo <= M <= m_hi
  std::string fp8_backend;      // fastest FP8 candidate's backend ...
  std::string fp8_config;       // ... and its configuration ("" = backend's heuristic)
  double bf16_us = 0;           // geometric mean over the bucket's measured points (its edges
  double fp8_us = 0;            // and geometric middle, tuner.hpp); FP8 quantization included
  // fp8_config typed, parsed once by load_tune_table (parse_gemm_config); a row built in code
  // and passed as ProjectionOptions::tuned has its names parsed when the layer is built.
  GemmConfig config;
  // The same FP8 configuration on activations already quantized: the GEMM alone, what a call
  // pays whose producer writes the e4m3 input itself (a norm fused with the quantization,
  // ProjectionLayer::forward_rmsnorm; an epilogue that quantizes). Measured in the same
  // interleaved rounds as bf16_us and fp8_us; 0: not measured (older tables).
  double fp8_gemm_us = 0;
  // The bucket's verdict, which the gate follows (policy `all`; `prefill` above the decode ceiling).
  bool fp8_wins() const { return fp8_us > 0 && fp8_us < bf16_us; }
  // The verdict where the producer quantizes (its bf16 and its FP8 output cost it the same): the
  // FP8 GEMM alone against bf16; the verdict above where the bucket has no GEMM-alone time.
  bool fp8_gemm_wins() const { return fp8_gemm_us > 0 ? fp8_gemm_us < bf16_us : fp8_wins(); }
};

struct TunedShape {
  int64_t n = 0, k = 0;
  int64_t threshold = 512;      // FP8 when M > threshold (the measured crossover); INT64_MAX:
                                // FP8 never won by the margin at the largest bucket
  std::vector<TunedBucket> buckets;

  const TunedBucket* bucket_for(int64_t m) const;
};

struct TuneStamp {
  std::string gpu_name;
  int sm_count = 0;
  std::string driver, cuda_runtime, cublaslt, fp8proj_version;
};

struct TuneTable {
  TuneStamp stamp;
  std::string source;           // file it came from
  std::vector<TunedShape> shapes;

  const TunedShape* find(int64_t n, int64_t k) const;
};

}  // namespace fp8proj

namespace fp8proj {

struct DeviceInfo;

inline constexpr const char* kTuneFormat = "fp8proj-tune/1";

// GemmPlanOptions::config_by_m of one plan from a tuned row: runs[i] (parallel to
// row.buckets) is what that plan runs in bucket i -- a configuration name, "" for its
// backend's heuristic, nullopt when another plan runs the bucket. Every bucket the plan runs is
// listed, "" included, so that a bucket left to the heuristic does not inherit the next tuned
// bucket's configuration; empty when none of them names a configuration.
std::vector<std::pair<int64_t, std::string>> tuned_config_by_m(const TunedShape& row,
                                                               const std::vector<std::optional<std::string>>& runs);

// Parses and validates a table file; throws fp8proj::Error naming the file and the problem.
TuneTable load_tune_table(const std::string& path);
// The same for a table's text already in memory (`path` names it in errors).
TuneTable parse_tune_table(std::string_view text, const std::string& path);
void save_tune_table(const TuneTable& table, const std::string& path);
// "" when the table was measured on this kind of GPU, else why not (GPU name, SM count).
std::string stamp_mismatch(const TuneStamp& stamp, const DeviceInfo& device);
// The stamp of the running process (GPU, versions).
TuneStamp current_stamp();
// File name under configs/ for a GPU: "NVIDIA H200" -> "nvidia-h200.json".
std::string tune_file_name(const std::string& gpu_name);

// The table this process uses: FP8PROJ_TUNE_FILE if set, else configs/<gpu>.json. nullptr
// (and one log line saying why) when there is none, it is corrupt, or it does not match the
// GPU; callers then use the defaults. Loaded once.
const TuneTable* active_tune_table();

}  // namespace fp8proj

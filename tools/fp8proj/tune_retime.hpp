// Re-timing a tuned row with its own configurations (tune_retime.cpp): `fp8proj tune` runs it
// on every row it writes, `fp8proj tune --retime TABLE` on the buckets of an existing table.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "fp8proj/memory.hpp"
#include "fp8proj/projection.hpp"
#include "fp8proj/timing.hpp"
#include "fp8proj/tune.hpp"

namespace fp8proj::cli {

// The layer that runs exactly one FP8 candidate at every M up to rows_cap: FP8 forced on
// (threshold and ceiling 0), the backend forced, and a one-bucket tuned row that forces the
// configuration ("" = the backend's heuristic). `base` gives the name, workspace and the rest.
std::unique_ptr<ProjectionLayer> forced_fp8_layer(MemorySpace space, const bf16* weight, int64_t n, int64_t k,
                                                  ProjectionOptions base, const std::string& backend,
                                                  const std::string& config, int64_t rows_cap);

// Times each bucket of `row` with m_hi <= max_m at its sample points (edges and geometric
// middle, tuner.hpp) with the bucket's own FP8 backend and configuration: bf16, FP8 from bf16
// rows (quantize + GEMM) and the FP8 GEMM alone on activations quantized once up front,
// interleaved call by call (time_interleaved). Returns the row with those buckets' bf16_us,
// fp8_us and fp8_gemm_us replaced by the geometric means over their points; the other buckets,
// the configurations and the threshold as they were. `label` names the row in progress lines.
TunedShape retime_row(MemorySpace space, const TunedShape& row, int64_t max_m, const TimingOptions& options,
                      const std::string& label);

struct RetimeArgs {
  std::string table;  // the table to re-time
  std::string out;    // the re-timed table (JSON)
  std::string md;     // optional: a markdown table of the old and new times and verdicts
  int64_t max_m = 0;  // re-time buckets with m_hi <= max_m; 0: all
  int reps = 0, warmup = -1;
  bool no_flush = false, force = false;
};
// `fp8proj tune --retime TABLE --out NEW`: GPU only (a CPU time says nothing about a GPU's).
void run_retime(const RetimeArgs& args);

}  // namespace fp8proj::cli

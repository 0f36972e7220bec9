// Shared pieces of the fp8proj command-line tool: argument parsing helpers, test data,
// result files stamped with the GPU and versions.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "fp8proj/device.hpp"
#include "fp8proj/memory.hpp"
#include "fp8proj/models.hpp"
#include "fp8proj/timing.hpp"

namespace fp8proj::cli {

// "1,16,64" or "1-32768" (powers of two in the range) -> sorted unique values >= lo.
std::vector<int64_t> parse_m_list(const std::string& text, int64_t lo = 1);
// "16384x2048" -> ProjectionShape{model "custom"}.
ProjectionShape parse_shape(const std::string& text);
std::vector<int> parse_int_list(const std::string& text);

// Where the work runs: the GPU when present (and not --cpu), else the CPU reference.
MemorySpace choose_space(bool force_cpu);
std::string space_banner(MemorySpace space);

// A bf16 tensor of random N(0, stddev^2) values in a memory space.
struct Tensor {
  Buffer buf;
  int64_t rows = 0, cols = 0;
  bf16* data() const { return buf.data<bf16>(); }
};
Tensor random_bf16(MemorySpace space, int64_t rows, int64_t cols, uint64_t seed, float stddev);

// Times fn on the GPU (device events, timing.hpp) or, in host space, on the host clock.
double time_or_host(MemorySpace space, const std::function<void(StreamHandle)>& fn, const TimingOptions& options);

// Times several variants that are compared with each other, interleaved call by call (A B C
// A B C ...; each call L2-flushed as options say, warm-up only before the first): the median
// of options.reps calls per variant. Clock and power drift -- the H200 caps its clock within
// ~0.1 s of sustained FP8 load -- then hits every variant alike, which blocks of repetitions
// per variant do not. An empty function gives 0.
std::vector<double> time_interleaved(MemorySpace space, const std::vector<std::function<void(StreamHandle)>>& fns,
                                     const TimingOptions& options);

// The header every result file carries: GPU, clocks, versions, commit, time.
nlohmann::json result_stamp();
void write_text(const std::string& path, const std::string& text);

}  // namespace fp8proj::cli

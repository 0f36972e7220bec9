// Shared pieces of the fp8proj command-line tool: argument parsing helpers, test data,
// result files stamped with the GPU and versions.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "fp8proj/device.hpp"
#include "fp8proj/formats.hpp"
#include "fp8proj/memory.hpp"
#include "fp8proj/models.hpp"
#include "fp8proj/numbers.hpp"
#include "fp8proj/timing.hpp"

namespace fp8proj::cli {

// Bounds of the CLI's numbers (docs/robustness.md, "CLI bounds"). Every number is parsed by
// fp8proj/numbers.hpp's one rule; out of bounds is an error naming the option.
inline constexpr int64_t kMaxCliM = int64_t(1) << 31;        // token counts (--m, --max-m, ...)
inline constexpr int64_t kMaxCliDim = int64_t(1) << 31;      // N, K of --shape / --case
inline constexpr int64_t kMaxCliElements = int64_t(1) << 36; // N x K of --shape (128 GiB of bf16)
inline constexpr int64_t kMaxCliTp = 1024;                   // --tp
inline constexpr int64_t kMaxCliReps = 1'000'000;            // --reps, --warmup
inline constexpr int64_t kMaxCliListItems = 4096;            // entries of a list option
// verify: M, N, K of --case and --m at most 2^16; the host fp64 oracle's work per case, M x N x K,
// at most 2^36 multiply-adds (about 5x the largest case scripts/h200.sh runs, minutes on a CPU),
// and M x N, N x K, M x K at most 2^28 elements (2 GiB of doubles).
inline constexpr int64_t kMaxVerifyDim = int64_t(1) << 16;
inline constexpr int64_t kMaxVerifyWork = int64_t(1) << 36;
inline constexpr int64_t kMaxVerifyElements = int64_t(1) << 28;
// --seed: 0 .. 2^63-1, the non-negative range of the one integer rule (an int64); the value is
// then used as the uint64 seed of the random fills.
inline constexpr int64_t kMaxCliSeed = kInt64Max;

// CLI11 validators with the one number rule: an integer in [lo, hi] / a finite number in [lo, hi]
// (with above_lo: in (lo, hi]). They also rewrite the accepted text as plain decimal, because
// CLI11 then converts it itself with strtoll(.., 0), which would read "010" as octal 8: register
// them with ->transform(), which keeps the rewrite (->check() validates a copy).
CLI::Validator int_in(int64_t lo, int64_t hi);
CLI::Validator number_in(double lo, double hi, bool above_lo = false);

// The rules every option shares, applied to the whole app after the subcommands registered:
// an option that takes a value refuses an empty or blank one ("--m ''" is an error naming the
// option, never "use the default"; leave the option out for that).
void refuse_blank_values(CLI::App& app);
// Before CLI11 parses argv: "--opt=" with nothing (or only blanks) after '=' is an error; CLI11
// would take the next argument as the value instead. Throws CLI::ValidationError.
void refuse_empty_assignments(int argc, const char* const* argv);

// A list option: comma-separated entries ("glm5,deepseek-v3"), and the option may be repeated
// (--shape A --shape B). The entries of all values in order, duplicates dropped (the first
// kept); an empty entry ("a,,b", "a,", ",") or more than kMaxCliListItems entries throws
// fp8proj::Error naming the option.
std::vector<std::string> list_entries(const std::vector<std::string>& values, const std::string& what);

// The models a --model option names (list_entries), each one of model_names() (models.hpp).
std::vector<std::string> parse_models(const std::vector<std::string>& values, const std::string& what = "--model");

// Each TP size divides the heads of each model (MLA shards by heads), else fp8proj::Error naming
// --tp and the sizes that do.
void check_tp_sizes(const std::vector<std::string>& models, const std::vector<int>& tps);

// "1,16,64" or "1-32768" (powers of two in the range) -> sorted unique values in [lo, kMaxCliM].
std::vector<int64_t> parse_m_list(const std::string& text, int64_t lo = 1, const std::string& what = "--m");
// "16384x2048" -> ProjectionShape{model "custom"}; N, K <= kMaxCliDim, N x K <= kMaxCliElements.
ProjectionShape parse_shape(const std::string& text);
// The --shape entries of a command, parsed, duplicates (same N and K) dropped.
std::vector<ProjectionShape> parse_shapes(const std::vector<std::string>& values);
// "1,4,8" -> ints in [lo, hi] (default: tensor-parallel sizes) in the order given, duplicates
// dropped.
std::vector<int> parse_int_list(const std::string& text, const std::string& what = "--tp", int64_t lo = 1,
                                int64_t hi = kMaxCliTp);

// "ue8m0", "float" or "ue8m0,float" -> the scale formats in that order, no repeats (formats.hpp).
std::vector<ScaleMode> parse_scale_modes(const std::string& text, const std::string& what = "--weight-scales");
// "fused", "separate" or both, comma-separated: where o_proj's decode input is quantized
// (MlaOptions::fuse_decode_quant true / false), duplicates dropped.
std::vector<bool> parse_decode_quants(const std::string& text, const std::string& what = "--decode-quant");

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
// per variant do not. An empty function gives 0. When a call fails (a CUDA error surfaces at the
// synchronisation after it), the error names the variant -- `labels[i]` where given, else its
// index -- and the call number: after a sticky fault only the call just timed can have raised it.
std::vector<double> time_interleaved(MemorySpace space, const std::vector<std::function<void(StreamHandle)>>& fns,
                                     const TimingOptions& options, const std::vector<std::string>& labels = {});

// Files a command will write, checked before any work so that a long run does not end in an
// error: each is (option, path), "" meaning none. A path must not be a folder, its folder must
// exist and be writable (an existing file too), and no two of them, nor one of them and an input
// file (`inputs`, same form), may be the same file. Throws fp8proj::Error naming the option.
// A write that still fails (a full disk) is write_text's error.
using NamedPath = std::pair<std::string, std::string>;
void check_outputs(const std::vector<NamedPath>& outputs, const std::vector<NamedPath>& inputs = {});

// The header every result file carries: GPU, clocks, versions, commit, time.
nlohmann::json result_stamp();
void write_text(const std::string& path, const std::string& text);

// Host data into a buffer of `space`, and back (the verify commands' operands).
template <typename T>
Buffer to_space(MemorySpace space, const T* data, size_t count) {
  Buffer b(space, count * sizeof(T));
  copy_bytes(b.data(), space, data, MemorySpace::host, count * sizeof(T));
  return b;
}

template <typename T>
std::vector<T> to_host(const Buffer& b, size_t count) {
  std::vector<T> out(count);
  copy_bytes(out.data(), MemorySpace::host, b.data(), b.space(), count * sizeof(T));
  return out;
}

}  // namespace fp8proj::cli

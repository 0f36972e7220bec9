#include "common.hpp"

#include <algorithm>
#include <chrono>
#include <ctime>
#include <fstream>
#include <optional>
#include <sstream>

#include <fmt/format.h>

#include "fp8proj/error.hpp"
#include "fp8proj/numbers.hpp"
#include "fp8proj/quantize.hpp"
#include "fp8proj/random.hpp"

namespace fp8proj::cli {

namespace {

std::vector<std::string> split(const std::string& text, char sep, const std::string& what) {
  std::vector<std::string> parts;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, sep)) {
    FP8PROJ_CHECK(!item.empty(), what, " has an empty entry in '", text, "'");
    parts.push_back(item);
    FP8PROJ_CHECK(parts.size() <= size_t(kMaxCliListItems), what, " has more than ", kMaxCliListItems, " entries");
  }
  return parts;
}

}  // namespace

CLI::Validator int_in(int64_t lo, int64_t hi) {
  return CLI::Validator(
      [lo, hi](std::string& text) { return int_problem(text, "value", lo, hi); },
      "INT in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
}

CLI::Validator number_in(double lo, double hi) {
  return CLI::Validator([lo, hi](std::string& text) { return number_problem(text, "value", lo, hi); },
                        fmt::format("NUMBER in [{}, {}]", lo, hi));
}

std::vector<int64_t> parse_m_list(const std::string& text, int64_t lo, const std::string& what) {
  std::vector<int64_t> out;
  for (const std::string& part : split(text, ',', what)) {
    if (const size_t dash = part.find('-'); dash != std::string::npos && dash > 0) {
      const int64_t a = parse_int(part.substr(0, dash), what + " range start", lo, kMaxCliM);
      const int64_t b = parse_int(part.substr(dash + 1), what + " range end", lo, kMaxCliM);
      FP8PROJ_CHECK(b >= a, "range '", part, "' in ", what, " must satisfy ", lo, " <= a <= b");
      // At most 32 doublings below kMaxCliM = 2^31: no overflow, a bounded list.
      for (int64_t v = a; v <= b; v *= 2) out.push_back(v);
    } else {
      out.push_back(parse_int(part, what, lo, kMaxCliM));
    }
  }
  FP8PROJ_CHECK(!out.empty(), what, " is empty");
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::vector<int> parse_int_list(const std::string& text, const std::string& what, int64_t lo, int64_t hi) {
  std::vector<int> out;
  for (const std::string& part : split(text, ',', what))
    out.push_back(static_cast<int>(parse_int(part, what, std::max<int64_t>(lo, INT32_MIN), std::min<int64_t>(hi, INT32_MAX))));
  FP8PROJ_CHECK(!out.empty(), what, " is empty");
  return out;
}

ProjectionShape parse_shape(const std::string& text) {
  const size_t x = text.find('x');
  FP8PROJ_CHECK(x != std::string::npos, "shape ", quote_excerpt(text), " must look like NxK, e.g. 16384x2048");
  ProjectionShape s;
  s.model = "custom";
  s.gemm = "gemm";
  s.n = parse_int(text.substr(0, x), "--shape N", 1, kMaxCliDim);
  s.k = parse_int(text.substr(x + 1), "--shape K", 1, kMaxCliDim);
  FP8PROJ_CHECK(s.n * s.k <= kMaxCliElements, "shape ", text, " has ", s.n * s.k, " weight elements, more than the ",
                kMaxCliElements, " (128 GiB of bf16) the CLI accepts");
  return s;
}

std::vector<ScaleMode> parse_scale_modes(const std::string& text, const std::string& what) {
  std::vector<ScaleMode> out;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = text.find(',', start);
    const std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    const std::optional<ScaleMode> mode = parse_scale_mode(item);
    FP8PROJ_CHECK(mode.has_value(), what, ": '", item, "' is not a scale format (ue8m0, float)");
    if (std::find(out.begin(), out.end(), *mode) == out.end()) out.push_back(*mode);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

MemorySpace choose_space(bool force_cpu) {
  return (!force_cpu && gpu_available()) ? MemorySpace::device : MemorySpace::host;
}

std::string space_banner(MemorySpace space) {
  const DeviceInfo& d = current_device();
  if (space == MemorySpace::device)
    return fmt::format("GPU: {} ({}, {} SMs, L2 {} MB), driver CUDA {}, runtime {}, cuBLASLt {}", d.name, d.arch(),
                       d.sm_count, d.l2_bytes >> 20, d.driver_version, d.runtime_version, d.cublaslt_version);
  return fmt::format("CPU reference (no GPU: {}) -- small default sizes; CPU times say nothing about GPU speed",
                     d.present ? "--cpu given" : d.why_absent);
}

Tensor random_bf16(MemorySpace space, int64_t rows, int64_t cols, uint64_t seed, float stddev) {
  Tensor t{Buffer(space, static_cast<size_t>(rows * cols) * sizeof(bf16)), rows, cols};
  fill_normal(space, t.data(), rows * cols, seed, stddev);
  return t;
}

double time_or_host(MemorySpace space, const std::function<void(StreamHandle)>& fn, const TimingOptions& options) {
  if (space == MemorySpace::device) return time_device(fn, nullptr, options).median_us;
  return time_host([&] { fn(nullptr); }, options).median_us;
}

std::vector<double> time_interleaved(MemorySpace space, const std::vector<std::function<void(StreamHandle)>>& fns,
                                     const TimingOptions& options) {
  const int reps = std::max(1, options.reps);
  TimingOptions one = options;
  one.reps = 1;
  std::vector<std::vector<double>> samples(fns.size());
  for (int r = 0; r < reps; ++r) {
    one.warmup = r == 0 ? options.warmup : 0;
    for (size_t i = 0; i < fns.size(); ++i)
      if (fns[i]) samples[i].push_back(time_or_host(space, fns[i], one));
  }
  std::vector<double> out(fns.size(), 0.0);
  for (size_t i = 0; i < fns.size(); ++i)
    if (!samples[i].empty()) out[i] = summarize(std::move(samples[i])).median_us;
  return out;
}

nlohmann::json result_stamp() {
  const DeviceInfo& d = current_device();
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  char when[32];
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return {{"gpu", d.present ? d.name : "none (CPU reference)"},
          {"arch", d.arch()},
          {"sm_count", d.sm_count},
          {"sm_clock_mhz", d.sm_clock_khz / 1000},
          {"mem_clock_mhz", d.mem_clock_khz / 1000},
          {"driver_cuda", d.driver_version},
          {"cuda_runtime", d.runtime_version},
          {"cublaslt", d.cublaslt_version},
          {"fp8proj", fp8proj_version()},
          {"time_utc", when}};
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  FP8PROJ_CHECK(out.good(), "cannot write '", path, "'");
  out << text;
  out.close();  // flushes: a full disk (or /dev/full) shows here, not at exit
  FP8PROJ_CHECK(!out.fail(), "writing '", path, "' failed (", text.size(), " bytes; disk full?)");
}

}  // namespace fp8proj::cli

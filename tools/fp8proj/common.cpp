#include "common.hpp"

#include <algorithm>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include "fp8proj/error.hpp"
#include "fp8proj/mla.hpp"
#include "fp8proj/numbers.hpp"
#include "fp8proj/quantize.hpp"
#include "fp8proj/random.hpp"

namespace fp8proj::cli {

namespace {

// Every entry between separators, "a,b," has three (the last empty): an empty one is an error.
std::vector<std::string> split(const std::string& text, char sep, const std::string& what) {
  std::vector<std::string> parts;
  size_t begin = 0;
  while (true) {
    const size_t end = std::min(text.find(sep, begin), text.size());
    FP8PROJ_CHECK(end > begin, what, " has an empty entry in ", quote_excerpt(text));
    parts.push_back(text.substr(begin, end - begin));
    FP8PROJ_CHECK(parts.size() <= size_t(kMaxCliListItems), what, " has more than ", kMaxCliListItems, " entries");
    if (end == text.size()) return parts;
    begin = end + 1;
  }
}

}  // namespace

CLI::Validator int_in(int64_t lo, int64_t hi) {
  return CLI::Validator(
      [lo, hi](std::string& text) {
        std::string problem = int_problem(text, "value", lo, hi);
        if (problem.empty()) text = std::to_string(*try_parse_int(text));
        return problem;
      },
      "INT in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
}

CLI::Validator number_in(double lo, double hi, bool above_lo) {
  return CLI::Validator(
      [lo, hi, above_lo](std::string& text) {
        std::string problem = number_problem(text, "value", lo, hi);
        if (!problem.empty()) return problem;
        const double v = *try_parse_number(text);
        if (above_lo && v <= lo) return fmt::format("value={} must be greater than {}", quote_excerpt(text), lo);
        text = fmt::format("{}", v);  // shortest text that reads back as v
        return std::string();
      },
      fmt::format("NUMBER in {}{}, {}]", above_lo ? "(" : "[", lo, hi));
}

namespace {
bool blank(std::string_view text) { return text.find_first_not_of(" \t\n\r\f\v") == std::string_view::npos; }

const char* const kBlankValue = "an empty value is not accepted (leave the option out for its default)";
}  // namespace

void refuse_blank_values(CLI::App& app) {
  for (CLI::Option* opt : app.get_options()) {
    if (opt->get_type_size_max() == 0) continue;  // a flag: takes no value
    opt->check(CLI::Validator([](std::string& text) { return blank(text) ? std::string(kBlankValue) : std::string(); },
                              ""));
  }
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) refuse_blank_values(*sub);
}

void refuse_empty_assignments(int argc, const char* const* argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--") return;  // what follows is not options
    const size_t eq = arg.find('=');
    if (arg.size() > 2 && arg.substr(0, 2) == "--" && eq != std::string_view::npos && blank(arg.substr(eq + 1)))
      throw CLI::ValidationError(std::string(arg.substr(0, eq)), kBlankValue);
  }
}

std::vector<std::string> list_entries(const std::vector<std::string>& values, const std::string& what) {
  std::vector<std::string> out;
  for (const std::string& value : values)
    for (std::string& entry : split(value, ',', what))
      if (std::find(out.begin(), out.end(), entry) == out.end()) out.push_back(std::move(entry));
  FP8PROJ_CHECK(!out.empty(), what, " is empty");
  FP8PROJ_CHECK(out.size() <= size_t(kMaxCliListItems), what, " has more than ", kMaxCliListItems, " entries");
  return out;
}

std::vector<std::string> parse_models(const std::vector<std::string>& values, const std::string& what) {
  const std::vector<std::string> known = model_names();
  std::vector<std::string> out = list_entries(values, what);
  for (const std::string& m : out)
    FP8PROJ_CHECK(std::find(known.begin(), known.end(), m) != known.end(), what, ": unknown model ", quote_excerpt(m),
                  " (known: ", fmt::format("{}", fmt::join(known, ", ")), ")");
  return out;
}

void check_tp_sizes(const std::vector<std::string>& models, const std::vector<int>& tps) {
  for (const std::string& model : models) {
    const int heads = MlaConfig::preset(model).heads;
    for (int tp : tps) {
      if (heads % tp == 0) continue;
      std::vector<int> fit;
      for (int d = 1; d <= heads; ++d)
        if (heads % d == 0) fit.push_back(d);
      FP8PROJ_FAIL("--tp ", tp, " does not divide the ", heads, " heads of ", model,
                   " (TP sizes that do: ", fmt::format("{}", fmt::join(fit, ", ")), ")");
    }
  }
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
  for (const std::string& part : split(text, ',', what)) {
    const int v =
        static_cast<int>(parse_int(part, what, std::max<int64_t>(lo, INT32_MIN), std::min<int64_t>(hi, INT32_MAX)));
    if (std::find(out.begin(), out.end(), v) == out.end()) out.push_back(v);
  }
  FP8PROJ_CHECK(!out.empty(), what, " is empty");
  return out;
}

std::vector<ProjectionShape> parse_shapes(const std::vector<std::string>& values) {
  std::vector<ProjectionShape> out;
  for (const std::string& text : list_entries(values, "--shape")) {
    ProjectionShape s = parse_shape(text);
    if (std::none_of(out.begin(), out.end(), [&](const ProjectionShape& o) { return o.n == s.n && o.k == s.k; }))
      out.push_back(std::move(s));
  }
  return out;
}

ProjectionShape parse_shape(const std::string& text) {
  const size_t x = text.find('x');
  FP8PROJ_CHECK(x != std::string::npos, "--shape ", quote_excerpt(text), " must look like NxK, e.g. 16384x2048");
  ProjectionShape s;
  s.model = "custom";
  s.gemm = "gemm";
  s.n = parse_int(text.substr(0, x), "--shape N", 1, kMaxCliDim);
  s.k = parse_int(text.substr(x + 1), "--shape K", 1, kMaxCliDim);
  FP8PROJ_CHECK(s.n * s.k <= kMaxCliElements, "--shape ", text, " has ", s.n * s.k, " weight elements, more than the ",
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

std::vector<bool> parse_decode_quants(const std::string& text, const std::string& what) {
  std::vector<bool> out;
  for (const std::string& item : split(text, ',', what)) {
    FP8PROJ_CHECK(item == "fused" || item == "separate", what, ": ", quote_excerpt(item),
                  " is not fused or separate");
    if (std::find(out.begin(), out.end(), item == "fused") == out.end()) out.push_back(item == "fused");
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
                                     const TimingOptions& options, const std::vector<std::string>& labels) {
  const int reps = std::max(1, options.reps);
  TimingOptions one = options;
  one.reps = 1;
  std::vector<std::vector<double>> samples(fns.size());
  for (int r = 0; r < reps; ++r) {
    one.warmup = r == 0 ? options.warmup : 0;
    for (size_t i = 0; i < fns.size(); ++i) {
      if (!fns[i]) continue;
      try {
        samples[i].push_back(time_or_host(space, fns[i], one));
      } catch (const Error& e) {
        const std::string what = i < labels.size() ? labels[i] : "variant " + std::to_string(i + 1);
        throw Error(fmt::format("{} -- while timing {} (variant {} of {}), call {} of {}{}", e.what(), what, i + 1,
                                fns.size(), r + 1, reps, r == 0 && options.warmup > 0 ? " or its warm-up" : ""));
      }
    }
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

void check_outputs(const std::vector<NamedPath>& outputs, const std::vector<NamedPath>& inputs) {
  namespace fs = std::filesystem;
  std::vector<std::pair<std::string, fs::path>> seen;  // (option, canonical path)
  for (const auto& [what, path] : inputs)
    if (!path.empty()) seen.emplace_back(what, fs::weakly_canonical(path));
  for (const auto& [what, path] : outputs) {
    if (path.empty()) continue;
    const fs::path p(path);
    const fs::path dir = p.parent_path().empty() ? fs::path(".") : p.parent_path();
    FP8PROJ_CHECK(!fs::is_directory(p), what, " ", quote_excerpt(path), " is a folder; name a file");
    FP8PROJ_CHECK(fs::is_directory(dir), what, " ", quote_excerpt(path), ": the folder ", quote_excerpt(dir.string()),
                  " does not exist");
    FP8PROJ_CHECK(::access(dir.c_str(), W_OK) == 0, what, " ", quote_excerpt(path), ": the folder ",
                  quote_excerpt(dir.string()), " is not writable");
    FP8PROJ_CHECK(!fs::exists(p) || ::access(p.c_str(), W_OK) == 0, what, " ", quote_excerpt(path),
                  " exists and is not writable");
    const fs::path canonical = fs::weakly_canonical(p);
    for (const auto& [other, q] : seen)
      FP8PROJ_CHECK(q != canonical, what, " and ", other, " name the same file ", quote_excerpt(path));
    seen.emplace_back(what, canonical);
  }
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  FP8PROJ_CHECK(out.good(), "cannot write '", path, "'");
  out << text;
  out.close();  // flushes: a full disk (or /dev/full) shows here, not at exit
  FP8PROJ_CHECK(!out.fail(), "writing '", path, "' failed (", text.size(), " bytes; disk full?)");
}

}  // namespace fp8proj::cli

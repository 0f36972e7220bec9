// fp8proj soak: a seeded, randomized soak of the library's code paths (docs/robustness.md,
// "The soak"). Each iteration draws -- from (seed, iteration) alone, so that any one replays by
// itself -- a weight shape, M, an entry point and 1-3 calls on cached layers (bf16, FP8 with the
// tuned table, the heuristic, a forced sm90 configuration, cuBLASLt's blockwise FP8), a stream,
// eager or CUDA-graph replay, and L2 flushes; runs them into guarded, poisoned outputs; checks
// guards, every element written and finite, sampled rows against the fp64 oracle, and bitwise
// determinism; and (--paths mla, the GPU) the MLA block's decode step, eager and replayed as a
// CUDA graph, and short prefills, against the host block. The first failure (or a CUDA error, or a hang) prints the seed, the iteration,
// the failing launch, the launches before it and the command that replays it; exit status 1.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <deque>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include <fmt/format.h>

#include "commands.hpp"
#include "common.hpp"
#include "fp8proj/error.hpp"
#include "fp8proj/gemm.hpp"
#include "fp8proj/timing.hpp"
#include "fp8proj/tuner.hpp"
#include "soak.hpp"
#include "tune_common.hpp"

namespace fp8proj::cli {

namespace {

using namespace soak;

struct SoakArgs {
  std::string minutes, seed, shapes = "all", m, paths = "all", configs = "all", replay, inject, json, log;
  int64_t iterations = 0, max_m = 0;
  int streams = 2, burst = 1;
  double hang_timeout_s = 300;
  bool cpu = false, no_graphs = false, no_flush = false, stop_on_first = true;
};

constexpr size_t kRingSize = 16;        // launches listed before a failure
constexpr int64_t kMaxSoakM = 65536;    // twice the design's largest M; an output <= 4 GiB at N = 32768
constexpr double kProgressSeconds = 5;  // a progress line at most this often
constexpr int kMaxListedFailures = 20;  // with --no-stop-on-first, in the JSON
const char* const kPathNames[] = {"bf16", "fp8", "cublaslt", "rmsnorm", "quantized", "mla"};

std::vector<std::string> split_list(const std::string& text, const std::string& what) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    const size_t comma = text.find(',', start);
    out.push_back(text.substr(start, comma - start));
    FP8PROJ_CHECK(!out.back().empty(), what, " has an empty entry in ", quote_excerpt(text));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

// "SEED:ITER" -> (seed, iteration).
std::pair<uint64_t, uint64_t> parse_replay(const std::string& text) {
  const size_t colon = text.find(':');
  FP8PROJ_CHECK(colon != std::string::npos, "--replay ", quote_excerpt(text), " must look like SEED:ITERATION");
  return {static_cast<uint64_t>(parse_int(text.substr(0, colon), "--replay seed", 0)),
          static_cast<uint64_t>(parse_int(text.substr(colon + 1), "--replay iteration", 0))};
}

Inject parse_inject(const std::string& text) {
  if (text.empty()) return {};
  const size_t colon = text.find(':');
  FP8PROJ_CHECK(colon != std::string::npos, "--inject-fault must look like KIND:ITERATION");
  Inject in{text.substr(0, colon), parse_int(text.substr(colon + 1), "--inject-fault iteration", 0)};
  FP8PROJ_CHECK(in.kind == "guard" || in.kind == "value" || in.kind == "unwritten",
                "--inject-fault kind must be guard, value or unwritten, got ", quote_excerpt(in.kind));
  return in;
}

class SoakRun {
 public:
  explicit SoakRun(const SoakArgs& a);
  ~SoakRun();
  int loop();
  int replay(uint64_t seed, uint64_t iteration);

 private:
  void setup_draw_space();
  void on_launch(const Launch& l);
  std::string draw_options() const;  // the options that shape the draw, as typed
  std::string counts_text() const;
  void progress(bool force);
  // An iteration as the failure report names it: its seed, index and draw (either kind).
  struct Where {
    uint64_t seed = 0, iteration = 0;
    std::string draw;
  };
  nlohmann::json failure_json(const Where& w, const IterationResult& r, const std::string& what) const;
  void report_failure(const Where& w, const IterationResult& r);
  IterationResult run_mla(uint64_t iteration);  // an MLA iteration: draw, run, count, log
  void write_json() const;
  void write_json_locked() const;  // mu_ held
  void watchdog();

  SoakArgs a_;
  MemorySpace space_;
  bool gpu_;
  uint64_t seed_ = kDefaultSeed;
  DrawSpace ds_;
  std::vector<std::string> skipped_;  // what the CPU reference (or this GPU) cannot run, and why
  std::unique_ptr<Streams> streams_;
  std::unique_ptr<GroupCache> cache_;
  std::unique_ptr<Runner> runner_;
  std::unique_ptr<MlaRunner> mla_;
  FILE* log_ = nullptr;

  // Shared with the watchdog thread.
  mutable std::mutex mu_;
  std::deque<std::string> ring_;
  std::string current_;
  std::optional<Where> current_where_;  // the iteration running (for the hang report)
  int64_t iterations_ = 0, launches_ = 0, failures_ = 0, guard_writes_ = 0, wrong_outputs_ = 0, errors_ = 0;
  std::map<std::string, int64_t> by_path_, by_variant_, by_stream_;
  int64_t graph_launches_ = 0, flushed_launches_ = 0, nan_iterations_ = 0, m0_iterations_ = 0,
          chunked_iterations_ = 0, twins_ = 0, config_fallbacks_ = 0, mla_iterations_ = 0;
  double mla_max_err_ = 0;  // the largest MLA error seen, as a fraction of its tolerance
  std::map<std::string, double> mla_worst_by_block_;  // the largest relative error per block mode
  nlohmann::json failures_json_ = nlohmann::json::array();
  std::chrono::steady_clock::time_point t0_, last_progress_;
  std::atomic<int64_t> heartbeat_ns_{0};
  std::atomic<bool> done_{false};
};

SoakRun::SoakRun(const SoakArgs& a) : a_(a), space_(choose_space(a.cpu)), gpu_(space_ == MemorySpace::device) {
  if (!a.seed.empty() && a.seed != "random") seed_ = static_cast<uint64_t>(parse_int(a.seed, "--seed", 0));
  if (a.seed == "random") {
    std::random_device rd;
    seed_ = ((uint64_t{rd()} << 32) ^ rd()) & static_cast<uint64_t>(kInt64Max);  // 63 bits: --seed reads it back
  }
  setup_draw_space();
  streams_ = std::make_unique<Streams>(ds_.streams);
  // Layers: up to 40% of the GPU's memory (the outputs of M = 32768 at N = 24576 take 1.6 GB
  // each); the oracle's host copies of the weights up to 16 GiB. The CPU reference: 1 GiB each.
  const size_t gib = size_t{1} << 30;
  const size_t budget = gpu_ ? static_cast<size_t>(current_device().global_mem_bytes * 0.4) : gib;
  cache_ = std::make_unique<GroupCache>(space_, budget, gpu_ ? 16 * gib : gib);
  runner_ = std::make_unique<Runner>(space_, *streams_, *cache_, parse_inject(a.inject),
                                     [this](const Launch& l) { on_launch(l); });
  if (ds_.mla) mla_ = std::make_unique<MlaRunner>(*streams_, [this](const Launch& l) { on_launch(l); });
  if (gpu_ && ds_.flush) flush_l2(nullptr);  // its buffer now, never inside a graph capture
  if (!a.log.empty()) {
    log_ = std::fopen(a.log.c_str(), "w");
    FP8PROJ_CHECK(log_ != nullptr, "cannot write --log ", quote_excerpt(a.log));
  }
}

SoakRun::~SoakRun() {
  if (log_) std::fclose(log_);
}

void SoakRun::setup_draw_space() {
  ds_.gpu = gpu_;
  ds_.max_m = a_.max_m > 0 ? a_.max_m : gpu_ ? 32768 : 256;
  if (!a_.m.empty()) {
    ds_.fixed_m = parse_m_list(a_.m, 0, "--m");
    ds_.chunking = false;  // the M asked for runs as one launch
    if (a_.max_m == 0) ds_.max_m = std::max<int64_t>(4, ds_.fixed_m.back());
    FP8PROJ_CHECK(ds_.fixed_m.back() <= std::min(ds_.max_m, kMaxSoakM), "--m ", ds_.fixed_m.back(), " is above ",
                  ds_.max_m < kMaxSoakM ? fmt::format("--max-m {}", ds_.max_m) : fmt::format("{}", kMaxSoakM));
  }
  // Shapes.
  if (a_.shapes == "all" || a_.shapes == "model") ds_.model = model_shapes(gpu_);
  if (a_.shapes == "all" || a_.shapes == "small") ds_.small = small_shapes(seed_, gpu_);
  if (ds_.model.empty() && ds_.small.empty())
    for (const std::string& t : split_list(a_.shapes, "--shapes")) {
      const ProjectionShape p = parse_shape(t);
      FP8PROJ_CHECK(fp8_eligible(p.n, p.k), "--shapes ", t, ": ", fp8_block_shape_reason(p.n, p.k),
                    " (the soak runs the FP8 paths' shapes)");
      const std::string label = shape_label(p.n, p.k);
      ds_.model.push_back({p.n, p.k, label.substr(0, label.find(" = "))});  // the first name of a shared shape
    }
  // Paths.
  if (a_.paths != "all") {
    ds_.bf16 = ds_.fp8 = ds_.cublaslt = ds_.rmsnorm = ds_.quantized = ds_.mla = false;
    for (const std::string& p : split_list(a_.paths, "--paths")) {
      bool* flag = p == "bf16" ? &ds_.bf16 : p == "fp8" ? &ds_.fp8 : p == "cublaslt" ? &ds_.cublaslt
                   : p == "rmsnorm" ? &ds_.rmsnorm : p == "quantized" ? &ds_.quantized : p == "mla" ? &ds_.mla : nullptr;
      FP8PROJ_CHECK(flag, "--paths: unknown path ", quote_excerpt(p),
                    " (bf16, fp8, cublaslt, rmsnorm, quantized, mla, all)");
      *flag = true;
    }
  }
  // FP8 variants.
  const bool sm90 = gpu_ && current_device().is_sm90() && find_backend("sm90_fp8_block") != nullptr;
  if (a_.configs != "all") {
    ds_.tuned = ds_.heuristic = ds_.all_configs = false;
    for (const std::string& c : split_list(a_.configs, "--configs")) {
      if (c == "all") ds_.tuned = ds_.heuristic = ds_.all_configs = true;
      else if (c == "tuned") ds_.tuned = true;
      else if (c == "heuristic") ds_.heuristic = true;
      else {
        FP8PROJ_CHECK(sm90, "--configs ", c, ": forced sm90 configurations need an sm_90 GPU (",
                      gpu_ ? "this one is " + current_device().arch() : std::string("running on the CPU reference"),
                      ")");
        (void)parse_gemm_config("sm90_fp8_block", c);  // an unknown name is an error now, naming it
        ds_.configs.push_back(c);
      }
    }
  }
  if (sm90) {
    const tune::ConfigSpace* space = tune::config_space("sm90_fp8_block");
    ds_.candidates = [space](int64_t m, int64_t n, int64_t k) { return space->candidates(m, n, k); };
  } else if (ds_.all_configs) {
    skipped_.push_back("forced sm90 configurations (no sm_90 GPU here)");
  }
  const GemmBackend* lt = gpu_ ? find_backend("cublaslt_fp8_block", GemmKind::fp8_block) : nullptr;
  if (lt) ds_.cublaslt_ok = [lt](int64_t n, int64_t k) { return lt->unsupported_reason(n, k).empty(); };
  else if (ds_.cublaslt) skipped_.push_back("cublaslt_fp8_block (not available here)");
  if (gpu_ && !current_device().is_sm90()) {  // the FP8 layers would run bf16: nothing to soak there
    ds_.fp8 = ds_.quantized = ds_.tuned = ds_.heuristic = false;
    skipped_.push_back("every FP8 path (GPU " + current_device().arch() + ", the FP8 kernels need sm_90a)");
  }
  if (ds_.mla && !(gpu_ && current_device().is_sm90())) {
    ds_.mla = false;
    skipped_.push_back(gpu_ ? "the MLA block (its decode attention needs sm_90a)"
                            : "the MLA block (GPU only: its reference is the host block itself)");
  }
  FP8PROJ_CHECK(ds_.bf16 || ds_.fp8 || ds_.cublaslt || ds_.rmsnorm || ds_.quantized || ds_.mla,
                "--paths ", quote_excerpt(a_.paths), ": nothing left to run here (skipped: ",
                skipped_.empty() ? std::string("none") : skipped_.back(), ")");
  // Streams, graphs, flushes: the GPU's.
  ds_.streams = gpu_ ? a_.streams : 0;
  ds_.graphs = gpu_ && !a_.no_graphs && ds_.streams > 0;
  ds_.flush = gpu_ && !a_.no_flush;
  ds_.burst = a_.burst;
  if (!gpu_) skipped_.push_back("CUDA graphs, created streams and L2 flushes (CPU reference)");
}

void SoakRun::on_launch(const Launch& l) {
  std::lock_guard<std::mutex> lock(mu_);
  ++launches_;
  ++by_path_[l.path];
  ++by_variant_[l.path + " " + l.variant];
  ++by_stream_[Streams::name(l.stream)];
  graph_launches_ += l.graph;
  flushed_launches_ += l.flush;
  ring_.push_back(l.text);
  if (ring_.size() > kRingSize + 1) ring_.pop_front();  // + 1: the failing one itself
  current_ = l.text;
}

std::string SoakRun::draw_options() const {
  std::string o;
  if (!gpu_) o += " --cpu";
  if (a_.shapes != "all") o += " --shapes " + a_.shapes;
  if (!a_.m.empty()) o += " --m " + a_.m;
  if (a_.max_m > 0) o += fmt::format(" --max-m {}", a_.max_m);
  if (a_.paths != "all") o += " --paths " + a_.paths;
  if (a_.configs != "all") o += " --configs " + a_.configs;
  if (gpu_ && a_.no_graphs) o += " --no-graphs";
  if (gpu_ && a_.no_flush) o += " --no-flush";
  if (gpu_ && a_.streams != 2) o += fmt::format(" --streams {}", a_.streams);
  if (a_.burst != 1) o += fmt::format(" --burst {}", a_.burst);
  if (!a_.inject.empty()) o += " --inject-fault " + a_.inject;
  return o;
}

std::string SoakRun::counts_text() const {
  std::string by;
  for (const char* p : kPathNames) {
    const auto it = by_path_.find(p);
    if (it != by_path_.end()) by += fmt::format("{}{} {}", by.empty() ? "" : ", ", p, it->second);
  }
  return fmt::format("{} iterations, {} launches ({})", iterations_, launches_, by.empty() ? "none" : by);
}

void SoakRun::progress(bool force) {
  const auto now = std::chrono::steady_clock::now();
  if (!force && std::chrono::duration<double>(now - last_progress_).count() < kProgressSeconds) return;
  last_progress_ = now;
  std::lock_guard<std::mutex> lock(mu_);
  const double el = std::chrono::duration<double>(now - t0_).count();
  fmt::print(stderr, "soak: {} elapsed{}, {}, {} failures, {} layer groups built\n", format_duration(el),
             a_.minutes.empty() ? "" : " of " + format_duration(parse_number(a_.minutes, "--minutes", 0, 1e6) * 60),
             counts_text(), failures_, cache_->built());
  std::fflush(stderr);
  write_json_locked();  // so far: a run killed from outside still leaves its counts
}

nlohmann::json SoakRun::failure_json(const Where& d, const IterationResult& r, const std::string& what) const {
  nlohmann::json j;
  j["seed"] = d.seed;
  j["iteration"] = d.iteration;
  j["what"] = what;
  j["draw"] = d.draw;
  j["launch"] = current_;
  j["explain"] = r.explains;
  j["outputs"] = nlohmann::json::array();
  for (size_t o = 0; o < r.checks.size(); ++o) j["outputs"].push_back(r.outputs[o] + ": " + r.checks[o].summary());
  j["notes"] = r.notes;
  j["error"] = r.error;
  j["context"] = r.context;
  j["last_launches"] = std::vector<std::string>(ring_.begin(), ring_.end());
  j["launch_count"] = launches_;
  j["replay"] = fmt::format("fp8proj soak --replay {}:{}{}", d.seed, d.iteration, draw_options());
  j["rerun"] = fmt::format("fp8proj soak --seed {} --iterations {}{}", d.seed, d.iteration + 1, draw_options());
  return j;
}

void SoakRun::report_failure(const Where& d, const IterationResult& r) {
  std::string what = !r.error.empty() ? "error: " + r.error
                                      : fmt::format("{} guard write(s), {} wrong output(s)", r.guard_writes,
                                                    r.wrong_outputs);
  nlohmann::json j;
  {
    std::lock_guard<std::mutex> lock(mu_);
    j = failure_json(d, r, what);
    if (static_cast<int>(failures_json_.size()) < kMaxListedFailures) failures_json_.push_back(j);
  }
  fmt::print("\nsoak: FAILED at seed {} iteration {}: {}\n", d.seed, d.iteration, what);
  if (!r.context.empty()) fmt::print("  CUDA context after the error: {}\n", r.context);
  if (!a_.replay.empty()) {  // replay() printed the rest
    fmt::print("  replay: {}\n", j["replay"].get<std::string>());
    std::fflush(stdout);
    return;
  }
  fmt::print("  draw: {}\n", d.draw);
  for (size_t i = 0; i < r.explains.size(); ++i) fmt::print("  call {}: {}\n", i, r.explains[i]);
  for (const auto& o : j["outputs"]) fmt::print("  {}\n", o.get<std::string>());
  for (const auto& n : r.notes) fmt::print("  note: {}\n", n);
  fmt::print("  last launch: {}\n  the {} launches before it (oldest first):\n", j["launch"].get<std::string>(),
             j["last_launches"].size() > 0 ? j["last_launches"].size() - 1 : 0);
  for (size_t i = 0; i + 1 < j["last_launches"].size(); ++i)
    fmt::print("    {}\n", j["last_launches"][i].get<std::string>());
  fmt::print("  launches so far: {}\n  replay this iteration alone: {}\n  re-run up to it: {}\n",
             j["launch_count"].get<int64_t>(), j["replay"].get<std::string>(), j["rerun"].get<std::string>());
  std::fflush(stdout);
}

void SoakRun::write_json() const {
  std::lock_guard<std::mutex> lock(mu_);
  write_json_locked();
}

void SoakRun::write_json_locked() const {
  if (a_.json.empty()) return;
  const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  nlohmann::json j;
  j["stamp"] = result_stamp();
  j["mode"] = gpu_ ? "gpu" : "cpu";
  j["seed"] = seed_;
  j["options"] = "fp8proj soak" + draw_options();
  j["minutes"] = el / 60;
  j["iterations"] = iterations_;
  j["launches"] = launches_;
  j["by_path"] = by_path_;
  j["by_variant"] = by_variant_;
  j["by_stream"] = by_stream_;
  j["coverage"] = {{"graph_launches", graph_launches_},     {"flushed_launches", flushed_launches_},
                   {"nan_planted_iterations", nan_iterations_}, {"m0_iterations", m0_iterations_},
                   {"chunked_iterations", chunked_iterations_}, {"twin_checks", twins_},
                   {"forced_config_fallbacks", config_fallbacks_}, {"layer_groups_built", cache_->built()},
                   {"mla_iterations", mla_iterations_}, {"mla_worst_error_over_tolerance", mla_max_err_}};
  if (!mla_worst_by_block_.empty()) j["mla_worst_error_by_block"] = mla_worst_by_block_;
  j["failures"] = failures_;
  j["guard_writes"] = guard_writes_;
  j["wrong_outputs"] = wrong_outputs_;
  j["errors"] = errors_;
  j["skipped"] = skipped_;
  j["failure_reports"] = failures_json_;
  write_text(a_.json, j.dump(1) + "\n");
}

// A launch that never finishes (a kernel spinning on a barrier) would hang the soak silently:
// past --hang-timeout without an iteration ending, the report names the launch and the process
// ends with status 1.
void SoakRun::watchdog() {
  using namespace std::chrono;
  while (!done_) {
    std::this_thread::sleep_for(milliseconds(200));
    const double quiet = duration<double>(steady_clock::now().time_since_epoch()).count() - heartbeat_ns_ * 1e-9;
    if (done_ || a_.hang_timeout_s <= 0 || quiet < a_.hang_timeout_s) continue;
    std::lock_guard<std::mutex> lock(mu_);
    fmt::print("\nsoak: FAILED: no iteration ended for {:.0f} s (--hang-timeout): a hang\n  last launch: {}\n",
               quiet, current_);
    fmt::print("  the launches before it (oldest first):\n");
    for (const auto& l : ring_) fmt::print("    {}\n", l);
    if (current_where_)
      fmt::print("  replay this iteration alone: fp8proj soak --replay {}:{}{}\n", current_where_->seed,
                 current_where_->iteration, draw_options());
    fmt::print("  launches so far: {}\n", launches_);
    std::fflush(stdout);
    failures_json_.push_back({{"what", fmt::format("hang: no iteration ended for {:.0f} s", quiet)},
                              {"launch", current_},
                              {"last_launches", std::vector<std::string>(ring_.begin(), ring_.end())},
                              {"launch_count", launches_}});
    try {
      ++failures_;
      write_json_locked();
    } catch (const std::exception& e) {
      fmt::print(stderr, "{}\n", e.what());
    }
    std::_Exit(1);  // the stuck launch never returns; nothing else can end the process
  }
}

IterationResult SoakRun::run_mla(uint64_t it) {
  const MlaDraw d = draw_mla(ds_, seed_, it);
  {
    std::lock_guard<std::mutex> lock(mu_);
    current_where_ = Where{d.seed, d.iteration, d.describe()};
    current_ = fmt::format("seed {} iteration {}: none yet (building the MLA blocks, filling the caches)", seed_, it);
  }
  const IterationResult r = mla_->run(d);
  {
    std::lock_guard<std::mutex> lock(mu_);
    current_where_.reset();
    ++iterations_;
    ++mla_iterations_;
    failures_ += r.failed();
    guard_writes_ += r.guard_writes;
    wrong_outputs_ += r.wrong_outputs;
    errors_ += !r.error.empty();
    for (const auto& c : r.checks) {
      mla_max_err_ = std::max(mla_max_err_, c.rel_err / c.tol);
      double& worst = mla_worst_by_block_[d.block_key()];
      worst = std::max(worst, c.rel_err);
    }
  }
  if (log_) {
    std::string errs;
    for (const auto& c : r.checks) errs += fmt::format(" {:.2e}", c.rel_err);
    fmt::print(log_, "{} MLA {} B={} prefill={} err{} -> {}\n", it, d.block_key(), d.positions.size(),
               d.prefill_lens.size(), errs, r.failed() ? "FAILED" : "ok");
  }
  if (r.failed()) report_failure({d.seed, d.iteration, d.describe()}, r);
  return r;
}

int SoakRun::loop() {
  FP8PROJ_CHECK(!a_.minutes.empty() || a_.iterations > 0, "soak needs --minutes or --iterations (or --replay)");
  const double minutes = a_.minutes.empty() ? 0 : parse_number(a_.minutes, "--minutes", 0, 1e6);
  FP8PROJ_CHECK(a_.minutes.empty() || minutes > 0, "--minutes must be > 0, got ", a_.minutes);
  fmt::print("fp8proj soak -- {}\n", space_banner(space_));
  fmt::print("seed {}{}; {} model + {} small shapes; M {}; streams: {} created + the legacy default; CUDA graphs "
             "{}; L2 flush {}; stop at the first failure: {}\n",
             seed_, a_.seed == "random" ? " (drawn: --seed random)" : "", ds_.model.size(), ds_.small.size(),
             ds_.fixed_m.empty() ? fmt::format("0..{}", ds_.max_m) : a_.m, ds_.streams, ds_.graphs ? "on" : "off",
             ds_.flush ? "on" : "off", a_.stop_on_first ? "yes" : "no");
  for (const auto& s : skipped_) fmt::print("skipped: {}\n", s);
  std::fflush(stdout);
  t0_ = last_progress_ = std::chrono::steady_clock::now();
  auto beat = [this] {
    heartbeat_ns_ = std::chrono::duration_cast<std::chrono::nanoseconds>(
                        std::chrono::steady_clock::now().time_since_epoch()).count();
  };
  beat();
  std::thread dog([this] { watchdog(); });
  struct StopDog {  // also when an exception leaves the loop
    std::atomic<bool>& done;
    std::thread& dog;
    ~StopDog() {
      done = true;
      dog.join();
    }
  } stop_dog{done_, dog};
  bool dead = false;
  for (uint64_t it = 0;; ++it) {
    const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    if ((a_.iterations > 0 && static_cast<int64_t>(it) >= a_.iterations) || (minutes > 0 && el >= minutes * 60)) break;
    if (mla_iteration(ds_, seed_, it)) {
      const IterationResult r = run_mla(it);
      beat();
      if (r.failed()) {
        dead = r.context_dead();
        if (a_.stop_on_first || dead) break;
      }
      progress(false);
      continue;
    }
    const Draw d = draw(ds_, seed_, it);
    {
      std::lock_guard<std::mutex> lock(mu_);
      current_where_ = Where{d.seed, d.iteration, d.describe()};
      current_ = fmt::format("seed {} iteration {}: none yet (building layers, preparing inputs)", seed_, it);
    }
    const IterationResult r = runner_->run(d);
    beat();
    {
      std::lock_guard<std::mutex> lock(mu_);
      current_where_.reset();
      ++iterations_;
      nan_iterations_ += d.nan_row >= 0;
      m0_iterations_ += d.m == 0;
      chunked_iterations_ += d.m > d.max_tokens;
      twins_ += d.twin;
      config_fallbacks_ += r.config_fallbacks;
      failures_ += r.failed();
      guard_writes_ += r.guard_writes;
      wrong_outputs_ += r.wrong_outputs;
      errors_ += !r.error.empty();
    }
    if (log_)
      fmt::print(log_, "{} {} {}x{} M={} {} stream={} {} calls={}{}{} -> {}\n", it, d.shape.label, d.shape.n,
                 d.shape.k, d.m, to_string(d.entry), d.stream, d.graph ? fmt::format("graph*{}", d.replays * d.burst) : fmt::format("eager*{}", d.burst),
                 d.calls.size(), d.twin ? "+twin" : "", d.nan_row >= 0 ? " nan" : "", r.failed() ? "FAILED" : "ok");
    if (r.failed()) {
      report_failure({d.seed, d.iteration, d.describe()}, r);
      dead = r.context_dead();
      if (a_.stop_on_first || dead) break;
    }
    progress(false);
  }
  const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  std::string skipped;
  for (const auto& s : skipped_) skipped += (skipped.empty() ? "; skipped: " : ", ") + s;
  const std::string summary =
      fmt::format("soak: {:.2f} min, seed {}, {}, {} failures, {} guard writes, {} wrong outputs{}", el / 60, seed_,
                  counts_text(), failures_, guard_writes_, wrong_outputs_, skipped);
  fmt::print("{}\n", summary);
  if (dead) fmt::print("soak: the CUDA context is dead; stopped\n");
  write_json();
  if (log_ && (std::fflush(log_) != 0 || std::ferror(log_))) FP8PROJ_FAIL("writing --log ", a_.log, " failed");
  return failures_ > 0 ? 1 : 0;
}

int SoakRun::replay(uint64_t seed, uint64_t iteration) {
  FP8PROJ_CHECK(a_.minutes.empty() && a_.iterations == 0, "--replay runs one iteration: drop --minutes/--iterations");
  FP8PROJ_CHECK(a_.seed.empty(), "--replay SEED:ITERATION carries the seed: drop --seed");
  fmt::print("fp8proj soak --replay {}:{} -- {}\n", seed, iteration, space_banner(space_));
  for (const auto& s : skipped_) fmt::print("skipped: {}\n", s);
  seed_ = seed;
  if (!ds_.small.empty()) ds_.small = small_shapes(seed, gpu_);  // the run's pool
  if (mla_iteration(ds_, seed, iteration)) {
    fmt::print("draw: {}\n", draw_mla(ds_, seed, iteration).describe());
    t0_ = std::chrono::steady_clock::now();
    const IterationResult r = run_mla(iteration);
    for (size_t i = 0; i < r.explains.size(); ++i) fmt::print("explain: {}\n", r.explains[i]);
    fmt::print("launches:\n");
    for (const auto& l : ring_) fmt::print("  {}\n", l);
    for (size_t o = 0; o < r.checks.size(); ++o) fmt::print("{}: {}\n", r.outputs[o], r.checks[o].summary());
    fmt::print("soak replay: seed {} iteration {}: {} ({} launches)\n", seed, iteration,
               r.failed() ? "FAILED" : "passed", launches_);
    write_json();
    return r.failed() ? 1 : 0;
  }
  const Draw d = draw(ds_, seed, iteration);
  fmt::print("draw: {}\n", d.describe());
  t0_ = std::chrono::steady_clock::now();
  const IterationResult r = runner_->run(d);
  for (size_t i = 0; i < r.explains.size(); ++i) fmt::print("call {}: {}\n", i, r.explains[i]);
  fmt::print("launches:\n");
  for (const auto& l : ring_) fmt::print("  {}\n", l);
  for (size_t o = 0; o < r.checks.size(); ++o) fmt::print("{}: {}\n", r.outputs[o], r.checks[o].summary());
  for (const auto& n : r.notes) fmt::print("note: {}\n", n);
  iterations_ = 1;
  failures_ = r.failed();
  guard_writes_ = r.guard_writes;
  wrong_outputs_ = r.wrong_outputs;
  errors_ = !r.error.empty();
  if (!r.error.empty()) fmt::print("error: {}\n", r.error);
  if (r.failed()) report_failure({d.seed, d.iteration, d.describe()}, r);
  fmt::print("soak replay: seed {} iteration {}: {} ({} launches)\n", seed, iteration, r.failed() ? "FAILED" : "passed",
             launches_);
  write_json();
  return r.failed() ? 1 : 0;
}

}  // namespace

void register_soak(CLI::App& app) {
  auto a = std::make_shared<SoakArgs>();
  auto* cmd = app.add_subcommand("soak", "Seeded randomized soak of the GPU code paths with reference checks and "
                                         "guard regions (docs/robustness.md)");
  cmd->add_option("--minutes", a->minutes, "Run this long (a number > 0); with --iterations, whichever ends first");
  cmd->add_option("--iterations", a->iterations, "Run this many iterations")->check(int_in(1, int64_t{1} << 40));
  cmd->add_option("--seed", a->seed,
                  fmt::format("Seed: an integer in [0, 2^63-1], or 'random' (printed) [default: {}]", kDefaultSeed));
  cmd->add_flag("--cpu", a->cpu, "Use the CPU reference (small shapes) even if a GPU is present");
  cmd->add_option("--shapes", a->shapes, "model, small, all, or a list of NxK")->capture_default_str();
  cmd->add_option("--m", a->m, "Fix M: a list '777' or '1,777,4097' (default: drawn, biased to partial tiles)");
  cmd->add_option("--max-m", a->max_m,
                  "Largest M drawn [default: 32768 on the GPU, 256 on the CPU]; with --m, the workspaces' rows "
                  "[default: the largest --m]")
      ->check(int_in(1, kMaxSoakM));
  cmd->add_option("--paths", a->paths, "Paths: all, or a list of bf16, fp8, cublaslt, rmsnorm, quantized, mla (the MLA block's decode "
                  "step and a short prefill against the host block; GPU only)")
      ->capture_default_str();
  cmd->add_option("--configs", a->configs,
                  "FP8 variants: all, tuned, heuristic, or sm90 configuration names (a list may mix them)")
      ->capture_default_str();
  cmd->add_flag("--no-graphs", a->no_graphs, "No CUDA-graph capture and replay");
  cmd->add_flag("--no-flush", a->no_flush, "No L2 flush before calls");
  cmd->add_option("--streams", a->streams, "Created streams besides the legacy default one")
      ->check(int_in(0, 16))
      ->capture_default_str();
  cmd->add_option("--burst", a->burst,
                  "Each iteration runs its calls (or graph replays) this many times before its checks: launches "
                  "back to back, as a timing loop runs them")
      ->check(int_in(1, 10000))
      ->capture_default_str();
  cmd->add_option("--json", a->json, "Write the counts, the stamp and any failure report as JSON");
  cmd->add_option("--log", a->log, "Write one line per iteration");
  cmd->add_option("--replay", a->replay, "SEED:ITERATION: run exactly that iteration of an earlier run, verbosely");
  cmd->add_flag("--stop-on-first,!--no-stop-on-first", a->stop_on_first,
                "Stop at the first failure (default; a dead CUDA context always stops)");
  cmd->add_option("--hang-timeout", a->hang_timeout_s,
                  "Seconds without an iteration ending before the soak reports a hang and exits (0: never)")
      ->check(number_in(0, 1e6))
      ->capture_default_str();
  // The test seam: corrupts an output in the soak's own check path, so a test sees a failure.
  cmd->add_option("--inject-fault", a->inject, "")->group("");
  cmd->callback([a] {
    SoakRun run(*a);
    int failed = 0;
    if (a->replay.empty()) {
      failed = run.loop();
    } else {
      const auto [seed, iteration] = parse_replay(a->replay);
      failed = run.replay(seed, iteration);
    }
    std::fflush(stdout);  // the report before main's one-line error on stderr
    if (failed) throw Error("soak failed (the report above has the seed, the iteration and the replay command)");
  });
}

}  // namespace fp8proj::cli

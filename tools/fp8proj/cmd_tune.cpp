// fp8proj tune: per weight shape (N, K) and M bucket, times the bf16 path and every FP8
// candidate -- each FP8 backend of this device with each configuration it offers
// (tune::config_space, tuner.hpp) and its own heuristic -- through the projection layer with
// FP8 forced on (activation quantization included, FP8PROJ_* ignored), L2 flushed before
// every timed call. Picks the candidate per bucket and the threshold (include/fp8proj/
// tuner.hpp says how), splits buckets whose verdict does not hold across them, and writes the
// table (JSON, tune.hpp), every measurement (CSV) and a markdown summary.
//
// fp8proj tune --check FILE validates a table instead (cmd_gatecheck.cpp); fp8proj tune
// --from FILE --md OUT rewrites the summary of an existing table without measuring.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <set>

#include "commands.hpp"
#include "common.hpp"
#include "fp8proj/error.hpp"
#include "fp8proj/gemm.hpp"
#include "fp8proj/projection.hpp"
#include "fp8proj/tune.hpp"
#include "fp8proj/tuner.hpp"
#include "gatecheck.hpp"
#include "tune_common.hpp"
#include "tune_retime.hpp"

namespace fp8proj::cli {

namespace {

struct TuneArgs {
  std::vector<std::string> models;
  std::string tp;
  std::vector<std::string> shapes;
  int64_t max_m = 0;
  int64_t first_bucket = tune::kDefaultFirstBucketHi;
  int reps = 0, warmup = -1;
  int max_split = 3;
  double margin_pct = 3;
  double budget_s = 330;
  bool no_flush = false, cpu = false, dry_run = false;
  std::string out, csv, md;
  std::string from;  // summarize this table, measure nothing
  CheckArgs check;   // --check FILE
  std::string check_file;
  std::string retime_file;  // --retime FILE
};

// One shape to tune: the model shapes that share (N, K) under one label.
struct ShapeJob {
  std::string label;  // "glm5 q_b_proj TP1"
  std::string model, gemm;
  int tp = 0;
  int64_t n = 0, k = 0;
};

struct Candidate {
  const GemmBackend* backend;
  std::string config;
};

// The FP8 candidates timed at M: each backend's heuristic ("") and every configuration it
// offers at M or at any sample point of the initial bucket holding M. The union matters: a
// name can depend on M (sm90 swap-AB kernels carry the split-K factor chosen for that M), and a
// bucket can only be given a candidate that ran at all its points.
std::vector<Candidate> candidates_at(const std::vector<const GemmBackend*>& backends, int64_t m, int64_t n, int64_t k,
                                     const std::vector<tune::Bucket>& buckets) {
  std::vector<int64_t> ms = {m};
  for (const auto& b : buckets)
    if (m >= b.lo && m <= b.hi)
      for (int64_t p : tune::sample_points(b)) ms.push_back(p);
  std::vector<Candidate> out;
  for (const GemmBackend* be : backends) {
    std::vector<std::string> names = {""};
    if (const tune::ConfigSpace* space = tune::config_space(be->name()))
      for (int64_t p : ms)
        for (auto& nm : space->candidates(p, n, k))
          if (std::find(names.begin(), names.end(), nm) == names.end()) names.push_back(std::move(nm));
    for (auto& nm : names) out.push_back({be, std::move(nm)});
  }
  return out;
}

std::vector<const GemmBackend*> fp8_backends(MemorySpace space, int64_t n, int64_t k) {
  std::vector<const GemmBackend*> out;
  for (const GemmBackend* be : available_backends())
    if (be->kind() == GemmKind::fp8_block && be->space() == space && be->unsupported_reason(n, k).empty())
      out.push_back(be);
  return out;
}

std::string candidate_name(const std::string& backend, const std::string& config) {
  return backend + (config.empty() ? " (heuristic)" : " " + config);
}

// Everything measured for one shape: one row per (M, candidate).
struct Row {
  int64_t m = 0;
  bool fp8 = false;
  std::string backend, config, plan, status = "ok";
  Timing t;
};

class ShapeTuner {
 public:
  // `tag` prefixes the progress line, e.g. "3/16".
  ShapeTuner(const ShapeJob& job, const std::string& tag, MemorySpace space, const std::vector<tune::Bucket>& buckets,
             const TimingOptions& topt, Progress& progress)
      : job_(job), tag_(tag), space_(space), buckets_(buckets), topt_(topt), progress_(progress) {
    rows_cap_ = round_up(buckets.back().hi, 4);
    w_ = random_bf16(space, job.n, job.k, 11, 0.02f);
    x_ = random_bf16(space, rows_cap_, job.k, 12, 1.0f);
    y_ = random_bf16(space, rows_cap_, job.n, 13, 1.0f);
    ws_ = std::make_shared<ActivationWorkspace>(space, rows_cap_, round_up(job.k, 128), false);
    ProjectionOptions o = base_options();
    o.name = job.label + " bf16";
    bf16_ = std::make_unique<ProjectionLayer>(space, w_.data(), job.n, job.k, o);
    backends_ = fp8_backends(space, job.n, job.k);
  }

  const std::vector<const GemmBackend*>& backends() const { return backends_; }

  // Times bf16 and every candidate at each M not measured yet, interleaved call by call
  // (bf16, c1, c2, ..., bf16, c1, ...): the clock and power drift of a long run -- the H200
  // caps its clock within ~0.1 s of sustained FP8 load -- then hits every candidate alike,
  // where blocks of repetitions per candidate would favour whichever ran in a cooler moment.
  void measure(const std::vector<int64_t>& ms) {
    for (int64_t m : ms) {
      if (!measured_.insert(m).second) continue;
      std::vector<Row> rows;
      std::vector<ProjectionLayer*> layers;
      double est = 0;
      auto add = [&](const GemmBackend* be, const std::string& config) {
        Row r = prepare(m, be, config);
        est += tune::estimate_timing_us(r.fp8, m, job_.n, job_.k, topt_.warmup, topt_.reps, topt_.flush_l2,
                                        cost_model(space_));
        layers.push_back(r.status == "ok" ? layer_of(be, config) : nullptr);
        rows.push_back(std::move(r));
      };
      add(nullptr, "");
      for (const Candidate& c : candidates_at(backends_, m, job_.n, job_.k, buckets_)) add(c.backend, c.config);
      progress_.start(fmt::format("[{}] {} M={}: bf16 and {} FP8 candidates", tag_, job_.label, m, rows.size() - 1));
      std::vector<std::vector<double>> samples(rows.size());
      TimingOptions one = topt_;
      one.reps = 1;
      for (int rep = 0; rep < std::max(1, topt_.reps); ++rep) {
        one.warmup = rep == 0 ? topt_.warmup : 0;
        for (size_t i = 0; i < rows.size(); ++i) {
          if (!layers[i]) continue;
          ProjectionLayer* layer = layers[i];
          auto fn = [&](StreamHandle st) { layer->forward(x_.data(), m, y_.data(), st); };
          try {
            samples[i].push_back(space_ == MemorySpace::device ? time_device(fn, nullptr, one).median_us
                                                               : time_host([&] { fn(nullptr); }, one).median_us);
          } catch (const std::exception& e) {
            rows[i].status = std::string("error: ") + e.what();
            layers[i] = nullptr;
          }
        }
      }
      progress_.done(est);
      for (size_t i = 0; i < rows.size(); ++i) {
        Row& r = rows[i];
        r.t = layers[i] && !samples[i].empty() ? summarize(std::move(samples[i])) : Timing{};
        ms_.push_back({m, r.fp8, r.fp8 ? r.backend : "", r.config, r.t.median_us});
        rows_.push_back(std::move(r));
      }
    }
  }

  const std::vector<tune::Measurement>& measurements() const { return ms_; }
  const std::vector<Row>& rows() const { return rows_; }

 private:
  ProjectionOptions base_options() const {
    ProjectionOptions o;
    o.max_tokens = rows_cap_;
    o.workspace = ws_;
    o.use_tune_table = false;  // measure the candidates, not an existing table
    o.apply_env = false;       // FP8PROJ_* must not change what is measured
    return o;
  }

  // The layer that runs exactly this candidate at every M (forced_fp8_layer, tune_retime.hpp).
  ProjectionLayer* layer_for(const GemmBackend* be, const std::string& config) {
    const auto key = std::make_pair(std::string(be->name()), config);
    if (auto it = fp8_.find(key); it != fp8_.end()) return it->second.get();
    ProjectionOptions o = base_options();
    o.name = job_.label + " " + candidate_name(key.first, config);
    return (fp8_[key] = forced_fp8_layer(space_, w_.data(), job_.n, job_.k, o, key.first, config, rows_cap_)).get();
  }

  ProjectionLayer* layer_of(const GemmBackend* be, const std::string& config) {
    return be != nullptr ? layer_for(be, config) : bf16_.get();
  }

  // The row of one candidate at M, with the plan it will run; status says why not when the
  // candidate cannot run there (it is then not timed).
  Row prepare(int64_t m, const GemmBackend* be, const std::string& config) {
    const bool fp8 = be != nullptr;
    Row r;
    r.m = m;
    r.fp8 = fp8;
    r.backend = fp8 ? std::string(be->name()) : std::string("bf16");
    r.config = config;
    try {
      ProjectionLayer* layer = layer_of(be, config);
      const Explanation e = layer->explain(m);
      if (fp8) {
        FP8PROJ_CHECK(e.path == Path::fp8 && e.backend == r.backend, "the candidate layer would not run ", r.backend,
                      " at M=", m, ": ", e.to_string());
      } else {
        r.backend = e.backend;
      }
      r.plan = e.config;
    } catch (const std::exception& e) {
      r.status = std::string("error: ") + e.what();
    }
    return r;
  }

 public:
  static tune::CostModel cost_model(MemorySpace space) {
    tune::CostModel c;
    if (space == MemorySpace::host) {  // the CPU reference: BLAS sgemm after a dequantize
      c.bf16_tflops = 0.05;
      c.fp8_tflops = 0.03;
      c.hbm_bytes_per_us = 5e3;
      c.launch_us = 1;
      c.flush_us = 0;
      c.per_timing_us = 20;
    }
    return c;
  }

 private:
  ShapeJob job_;
  std::string tag_;
  MemorySpace space_;
  std::vector<tune::Bucket> buckets_;  // the initial buckets (candidate sets are per bucket)
  int64_t rows_cap_ = 0;
  TimingOptions topt_;
  Progress& progress_;
  Tensor w_, x_, y_;
  std::shared_ptr<ActivationWorkspace> ws_;
  std::unique_ptr<ProjectionLayer> bf16_;
  std::map<std::pair<std::string, std::string>, std::unique_ptr<ProjectionLayer>> fp8_;
  std::vector<const GemmBackend*> backends_;
  std::set<int64_t> measured_;
  std::vector<tune::Measurement> ms_;
  std::vector<Row> rows_;
};

// The shapes to tune, resolved before anything prints. An explicit --shape outside the FP8 rule
// (fp8_block_shape_reason) is an error: tune measures the FP8 path. A model's shape outside it
// is skipped with a note in `notes` (printed after the banner).
std::vector<ShapeJob> resolve_shapes(const TuneArgs& a, bool gpu, std::vector<std::string>& notes) {
  std::vector<ShapeJob> jobs;
  // A GEMM that several models or TP sizes share is measured once, under all their names.
  auto add = [&](const std::string& model, const std::string& gemm, int tp, int64_t n, int64_t k) {
    for (const auto& j : jobs)
      if (j.n == n && j.k == k) return;
    const std::string known = shape_label(n, k);
    const std::string label = known != "custom" ? known
                              : tp > 0          ? fmt::format("{} {} TP{}", model, gemm, tp)
                                                : fmt::format("custom {}x{}", n, k);
    jobs.push_back({label, model, gemm, tp, n, k});
  };
  if (!a.shapes.empty()) {
    for (const ProjectionShape& s : parse_shapes(a.shapes)) {
      const std::string why = fp8_block_shape_reason(s.n, s.k);
      FP8PROJ_CHECK(why.empty(), "--shape ", s.n, "x", s.k, ": ", why, "; tune measures the block-scaled FP8 path");
      add("custom", "gemm", 0, s.n, s.k);
    }
  } else {
    std::vector<std::string> models = a.models.empty() ? a.models : parse_models(a.models);
    if (models.empty() && gpu) models = {"glm5", "deepseek-v3"};
    FP8PROJ_CHECK(!models.empty() || a.tp.empty(),
                  "--tp picks model shapes: give --model too (without a GPU the default is one 256x256 shape)");
    const std::vector<int> tps = parse_int_list(!a.tp.empty() ? a.tp : "1,2,4,8");
    check_tp_sizes(models, tps);
    for (const auto& model : models)
      for (int t : tps)
        for (const auto& s : dense_gemm_shapes(model, t)) add(s.model, s.gemm, s.tp, s.n, s.k);
    if (models.empty()) add("custom", "gemm", 0, 256, 256);  // CPU default: small enough for the oracle
  }
  std::vector<ShapeJob> ok;
  for (auto& j : jobs) {
    if (const std::string why = fp8_block_shape_reason(j.n, j.k); !why.empty()) {
      notes.push_back(fmt::format("skipping {} ({}x{}): {}, so it has no FP8 path", j.label, j.n, j.k, why));
      continue;
    }
    ok.push_back(j);
  }
  FP8PROJ_CHECK(!ok.empty(), "tune: no shape to measure (", fmt::format("{}", fmt::join(notes, "; ")), ")");
  return ok;
}

std::string replace_ext(const std::string& path, const std::string& ext) {
  return std::filesystem::path(path).replace_extension(ext).string();
}

void write_csv(const std::string& path, const std::vector<std::pair<ShapeJob, std::vector<Row>>>& done,
               const std::vector<std::vector<tune::BucketChoice>>& choices, const std::vector<int64_t>& thresholds) {
  std::string csv =
      "label,model,gemm,tp,n,k,m,kind,backend,config,plan,median_us,min_us,max_us,reps,status,bucket_lo,bucket_hi,"
      "chosen,bf16_us,speedup,threshold\n";
  for (size_t i = 0; i < done.size(); ++i) {
    const auto& [job, rows] = done[i];
    for (const Row& r : rows) {
      const tune::BucketChoice* bc = nullptr;
      for (const auto& c : choices[i])
        if (r.m >= c.bucket.lo && r.m <= c.bucket.hi) bc = &c;
      double bf16 = 0;
      for (const Row& b : rows)
        if (!b.fp8 && b.m == r.m && b.t.median_us > 0) bf16 = b.t.median_us;
      const bool chosen =
          bc && bc->complete && (r.fp8 ? (r.backend == bc->fp8_backend && r.config == bc->fp8_config) : true);
      csv += fmt::format("{},{},{},{},{},{},{},{},{},{},{},{:.3f},{:.3f},{:.3f},{},{},{},{},{},{:.3f},{:.4f},{}\n",
                         csv_escape(job.label), job.model, job.gemm, job.tp, job.n, job.k, r.m, r.fp8 ? "fp8" : "bf16",
                         r.backend, csv_escape(r.config), csv_escape(r.plan), r.t.median_us, r.t.min_us, r.t.max_us,
                         r.t.reps, csv_escape(r.status), bc ? bc->bucket.lo : 0, bc ? bc->bucket.hi : 0, chosen ? 1 : 0,
                         bf16, r.t.median_us > 0 && bf16 > 0 ? bf16 / r.t.median_us : 0.0,
                         tune::threshold_text(thresholds[i]));
    }
  }
  write_text(path, csv);
}

void print_shape_result(const ShapeJob& job, const std::vector<tune::BucketChoice>& choices, int64_t threshold) {
  fmt::print("\n{} ({}x{}): threshold {} (FP8 when M > threshold)\n", job.label, job.n, job.k,
             tune::threshold_text(threshold));
  fmt::print("  {:>13} {:<40} {:>9} {:>9} {:>7} {:>13} {:>7}  {}\n", "M", "FP8 candidate", "bf16 us", "fp8 us", "x",
             "x range", "regret", "verdict");
  for (const auto& c : choices) {
    const std::string range = fmt::format("{}-{}", c.bucket.lo, c.bucket.hi);
    if (!c.complete) {
      fmt::print("  {:>13} {:<40}  incomplete: no FP8 candidate ran at every point\n", range, "-");
      continue;
    }
    fmt::print("  {:>13} {:<40} {:>9.1f} {:>9.1f} {:>7.2f} {:>6.2f}-{:<6.2f} {:>6.1f}%  {}{}\n", range,
               candidate_name(c.fp8_backend, c.fp8_config), c.bf16_gmean, c.fp8_gmean, c.bf16_gmean / c.fp8_gmean,
               c.min_speedup, c.max_speedup, 100 * (c.worst_regret - 1), c.fp8_wins ? "FP8" : "bf16",
               c.wins_by_margin ? " (wins by margin)" : (c.verdict_violated ? " (mixed)" : ""));
  }
}

// The measurement conditions, appended to the summary: what a reader needs to compare runs.
std::string how_measured(bool gpu, const TimingOptions& topt, const std::vector<tune::Bucket>& buckets, int max_split,
                         size_t shapes, double elapsed_s, const std::string& out, const std::string& csv) {
  const nlohmann::json st = result_stamp();
  return fmt::format(
      "\n## How this was measured\n\n`fp8proj tune`, {} shapes, {} elapsed when written. Each time is the median of {} "
      "calls after {} warm-up, {}, L2 {}; the FP8 path is the projection layer with FP8 forced on "
      "(activation quantization + GEMM), bf16 the same layer with FP8 off; random N(0, 1) activations, N(0, 0.02²) "
      "weights. Buckets [1,{}] then powers of two up to {}, each measured at its edges and geometric middle, halved up "
      "to {} "
      "times where the verdict does not hold across it. GPU {} ({}), SM clock {} MHz, memory clock {} MHz, driver "
      "CUDA {}, runtime {}, cuBLASLt {}, fp8proj {}, {}. Table: `{}`; every measurement: `{}`.\n",
      shapes, format_duration(elapsed_s), topt.reps, topt.warmup, gpu ? "device events" : "host clock",
      topt.flush_l2 ? "flushed before every timed call" : "not flushed", buckets.front().hi, buckets.back().hi,
      max_split, st["gpu"].get<std::string>(), st["arch"].get<std::string>(), st["sm_clock_mhz"].get<int>(),
      st["mem_clock_mhz"].get<int>(), st["driver_cuda"].get<std::string>(), st["cuda_runtime"].get<std::string>(),
      st["cublaslt"].get<std::string>(), st["fp8proj"].get<std::string>(), st["time_utc"].get<std::string>(), out, csv);
}

void run_tune(const TuneArgs& a) {
  const double margin = 1 + a.margin_pct / 100;
  if (!a.from.empty()) {  // summary of an existing table
    check_outputs({{"--md", a.md}}, {{"--from", a.from}});
    const TuneTable t = load_tune_table(a.from);
    std::vector<tune::ShapeSummary> ss;
    for (const auto& s : t.shapes) ss.push_back({shape_label(s.n, s.k), s});
    const std::string md = tune::summary_markdown(t.stamp, ss, kDefaultThreshold, kDefaultDecodeCeiling, margin);
    if (!a.md.empty()) write_text(a.md, md);
    fmt::print("{}", md);
    return;
  }

  const MemorySpace space = choose_space(a.cpu);
  const bool gpu = space == MemorySpace::device;
  std::vector<std::string> notes;
  const std::vector<ShapeJob> jobs = resolve_shapes(a, gpu, notes);
  // --out DIR/ (an existing folder, e.g. configs/): the file name the layer looks for there.
  const std::string file = gpu ? tune_file_name(current_device().name) : "tune-cpu.json";
  const std::string out = a.out.empty()                          ? file
                          : std::filesystem::is_directory(a.out) ? (std::filesystem::path(a.out) / file).string()
                                                                 : a.out;
  const std::string csv = !a.csv.empty() ? a.csv : replace_ext(out, ".csv");
  const std::string md = !a.md.empty() ? a.md : replace_ext(out, ".md");
  check_outputs({{"--out", out}, {"--csv", csv}, {"--md", md}});
  fmt::print("fp8proj tune -- {}\n", space_banner(space));
  for (const std::string& note : notes) fmt::print("{}\n", note);
  const int64_t max_m = a.max_m > 0 ? a.max_m : (gpu ? 32768 : 64);
  const std::vector<tune::Bucket> buckets0 = tune::initial_buckets(max_m, a.first_bucket);
  std::vector<int64_t> points0;  // for the estimate
  for (const auto& b : buckets0)
    for (int64_t p : tune::sample_points(b)) points0.push_back(p);

  TimingOptions topt;
  topt.warmup = a.warmup >= 0 ? a.warmup : (gpu ? 3 : 1);
  topt.reps = a.reps > 0 ? a.reps : (gpu ? 30 : 3);
  topt.flush_l2 = gpu && !a.no_flush;
  const tune::CostModel cm = ShapeTuner::cost_model(space);

  // The plan and its estimated time; fewer repetitions when it would not fit the budget.
  int64_t timings = 0;
  auto estimate = [&](int reps) {
    double us = 0;
    timings = 0;
    for (const auto& j : jobs) {
      const auto backends = fp8_backends(space, j.n, j.k);
      FP8PROJ_CHECK(!backends.empty(), "tune: no block-scaled FP8 backend can run ", j.label, " here");
      for (int64_t m : points0) {
        us += tune::estimate_timing_us(false, m, j.n, j.k, topt.warmup, reps, topt.flush_l2, cm);
        const size_t nc = candidates_at(backends, m, j.n, j.k, buckets0).size();
        us += nc * tune::estimate_timing_us(true, m, j.n, j.k, topt.warmup, reps, topt.flush_l2, cm);
        // The chosen configuration re-timed at the same points (retime_row): bf16, quantize +
        // GEMM and the GEMM alone, in the same rounds.
        us += tune::estimate_timing_us(false, m, j.n, j.k, topt.warmup, reps, topt.flush_l2, cm) +
              2 * tune::estimate_timing_us(true, m, j.n, j.k, topt.warmup, reps, topt.flush_l2, cm);
        timings += 1 + static_cast<int64_t>(nc) + 3;
      }
    }
    return us;
  };
  double est_us = estimate(topt.reps);
  if (a.reps <= 0 && est_us * 1e-6 > a.budget_s) {
    const double fixed = estimate(0), per_rep = (estimate(10) - fixed) / 10;
    // Negative when the warm-ups alone exceed the budget; compared in double, so no cast overflows.
    const double fit = per_rep > 0 ? (a.budget_s * 1e6 - fixed) / per_rep : 0.0;
    const int reps = fit >= topt.reps ? topt.reps : std::max(8, static_cast<int>(std::max(fit, 0.0)));
    if (reps < topt.reps) {
      fmt::print("note: {} reps would take about {}; using {} to fit the {:g} s budget (--budget, --reps)\n",
                 topt.reps, format_duration(est_us * 1e-6), reps, a.budget_s);
      topt.reps = reps;
      est_us = estimate(reps);
    }
    if (est_us * 1e-6 > a.budget_s)
      fmt::print("note: the plan takes about {} at {} reps, more than the {:g} s budget (--budget lowers the "
                 "default reps to no fewer than 8)\n",
                 format_duration(est_us * 1e-6), topt.reps, a.budget_s);
  }
  std::string bucket_list;
  for (const auto& b : buckets0) bucket_list += fmt::format("{}[{},{}]", bucket_list.empty() ? "" : " ", b.lo, b.hi);
  fmt::print("shapes: {}; M buckets ({}): {}\n", jobs.size(), buckets0.size(), bucket_list);
  fmt::print(
      "each bucket measured at its edges and geometric middle ({} M values per shape); buckets whose "
      "verdict does not hold across them are split (up to {} times)\n",
      points0.size(), a.max_split);
  fmt::print("timing: median of {} after {} warm-up, L2 {}; FP8 = quantize + GEMM; threshold margin {:.0f}%\n",
             topt.reps, topt.warmup, topt.flush_l2 ? "flushed before every timed call" : "not flushed", a.margin_pct);
  fmt::print("plan: {} timings; estimated {} (+ splits near crossovers){}\n", timings, format_duration(est_us * 1e-6),
             gpu ? "" : " -- CPU reference: times say nothing about a GPU");
  std::fflush(stdout);
  if (a.dry_run) return;

  TuneTable table;
  table.stamp = current_stamp();
  std::vector<tune::ShapeSummary> summaries;
  std::vector<std::pair<ShapeJob, std::vector<Row>>> done;
  std::vector<std::vector<tune::BucketChoice>> all_choices;
  std::vector<int64_t> thresholds;
  std::vector<std::string> failed;
  Progress progress(est_us);
  for (const ShapeJob& job : jobs) {
    std::unique_ptr<ShapeTuner> tuner;
    try {
      const std::string tag = fmt::format("{}/{}", &job - jobs.data() + 1, jobs.size());
      tuner = std::make_unique<ShapeTuner>(job, tag, space, buckets0, topt, progress);
      ShapeTuner& st = *tuner;
      bool first = true;
      const tune::MeasureFn measure = [&](const std::vector<int64_t>& points) -> const std::vector<tune::Measurement>& {
        if (!first)  // points of split buckets: work the estimate did not include
          for (int64_t m : points)
            progress.add_work(
                tune::estimate_timing_us(false, m, job.n, job.k, topt.warmup, topt.reps, topt.flush_l2, cm) +
                candidates_at(st.backends(), m, job.n, job.k, buckets0).size() *
                    tune::estimate_timing_us(true, m, job.n, job.k, topt.warmup, topt.reps, topt.flush_l2, cm));
        first = false;
        st.measure(points);
        return st.measurements();
      };
      // Where the chosen FP8 candidate's time steps up inside a bucket (one more wave).
      const tune::StepFn step = [&](const tune::BucketChoice& c) -> int64_t {
        const tune::ConfigSpace* space = tune::config_space(c.fp8_backend);
        return space ? space->wave_step(c.fp8_config, c.bucket.lo, c.bucket.hi, job.n, job.k) : 0;
      };
      const std::vector<tune::BucketChoice> choices = tune::search(buckets0, measure, a.max_split, margin, step);
      progress.clear();
      print_shape_result(job, choices, tune::select_threshold(choices));
      std::fflush(stdout);
      // The chosen configurations timed again, bf16, quantize + GEMM and the GEMM alone in the
      // same rounds: the table's times, and the verdict behind a fused producer (fp8_gemm_us).
      const TunedShape row = retime_row(space, tune::make_tuned_shape(job.n, job.k, choices),  // throws if incomplete
                                        0, topt, job.label);
      table.shapes.push_back(row);
      summaries.push_back({job.label, row});
      done.emplace_back(job, st.rows());
      all_choices.push_back(choices);
      thresholds.push_back(row.threshold);
    } catch (const std::exception& e) {
      progress.clear();
      fmt::print("\n{} ({}x{}): FAILED -- {}\n", job.label, job.n, job.k, e.what());
      failed.push_back(job.label);
      if (tuner) {  // keep what was measured: the CSV says why
        done.emplace_back(job, tuner->rows());
        all_choices.emplace_back();
        thresholds.push_back(tune::kNeverFp8);
      }
    }
    // Written after every shape: an interrupted run keeps what it measured.
    if (!table.shapes.empty()) {
      save_tune_table(table, out);
      write_text(md, tune::summary_markdown(table.stamp, summaries, kDefaultThreshold, kDefaultDecodeCeiling, margin) +
                         how_measured(gpu, topt, buckets0, a.max_split, jobs.size(), progress.elapsed_s(), out, csv));
    }
    if (!done.empty()) write_csv(csv, done, all_choices, thresholds);
  }
  progress.finish();
  fmt::print("\ntuned {} of {} shapes in {} (estimated {})\n", table.shapes.size(), jobs.size(),
             format_duration(progress.elapsed_s()), format_duration(est_us * 1e-6));
  if (!table.shapes.empty()) fmt::print("wrote {} (table), {} (every measurement), {} (summary)\n", out, csv, md);
  FP8PROJ_CHECK(failed.empty(), "tune: ", failed.size(),
                " shape(s) failed: ", fmt::format("{}", fmt::join(failed, "; ")));
}

}  // namespace

void register_tune(CLI::App& app) {
  auto a = std::make_shared<TuneArgs>();
  auto* cmd = app.add_subcommand("tune",
                                 "Measure per M bucket the fastest FP8 candidate and the bf16/FP8 "
                                 "crossover; write the tuned table (or --check one)");
  // What goes with what: measuring, --check TABLE (validation) and --from TABLE (summary) take
  // different options, and an option that does not apply is an error, not ignored.
  auto* model = cmd->add_option("--model", a->models, "Model(s), e.g. glm5,deepseek-v3 (GPU default: both)");
  auto* tp = cmd->add_option("--tp", a->tp, "Tensor-parallel sizes (default 1,2,4,8)");
  auto* shape =
      cmd->add_option("--shape", a->shapes, "Explicit NxK shape(s) instead of models (N a multiple of 16, K of 128)")
          ->excludes(model)
          ->excludes(tp);
  auto* max_m = cmd->add_option("--max-m", a->max_m, "Largest M (GPU default 32768, CPU 64)")
                    ->transform(int_in(1, kMaxCliM));
  auto* first_bucket = cmd->add_option("--first-bucket", a->first_bucket, "Upper edge of the first bucket [1, X]")
                           ->transform(int_in(1, kMaxCliM))
                           ->capture_default_str();
  auto* reps =
      cmd->add_option("--reps", a->reps, "Timed repetitions per measurement (GPU default 30, reduced to fit --budget)")
          ->transform(int_in(1, kMaxCliReps));
  auto* warmup = cmd->add_option("--warmup", a->warmup, "Warm-up calls per measurement (GPU default 3)")
                     ->transform(int_in(0, kMaxCliReps));
  auto* max_split = cmd->add_option("--max-split", a->max_split,
                                    "How often a bucket may be halved where its verdict is close or its "
                                    "configuration trails")
                        ->transform(int_in(0, 16))
                        ->capture_default_str();
  auto* margin = cmd->add_option("--margin", a->margin_pct, "FP8 must win by this many percent to set the threshold")
      ->transform(number_in(0, 100))
      ->capture_default_str();
  auto* budget =
      cmd->add_option("--budget", a->budget_s,
                      "Seconds the measurement should take at most (> 0; lowers the default --reps to fit, to no "
                      "fewer than 8)")
          ->transform(number_in(0, 1e7, /*above_lo=*/true))
          ->capture_default_str()
          ->excludes(reps);
  auto* no_flush =
      cmd->add_flag("--no-flush", a->no_flush, "Do not flush L2 before timed calls (flatters bf16 at small M)");
  auto* cpu = cmd->add_flag("--cpu", a->cpu, "Use the CPU reference even if a GPU is present");
  auto* dry_run = cmd->add_flag("--dry-run", a->dry_run, "Print the plan and the time estimate, measure nothing");
  auto* out = cmd->add_option("--out", a->out,
                              "Table (JSON) or a folder for <gpu>.json (e.g. configs/); default <gpu>.json here");
  auto* csv = cmd->add_option("--csv", a->csv, "Every measurement (CSV); default: --out with .csv");
  cmd->add_option("--md", a->md, "Markdown summary; default: --out with .md");
  auto* from = cmd->add_option("--from", a->from, "Write the markdown summary of an existing table (no measurement)");
  // Validation of a table (cmd_gatecheck.cpp).
  auto* check = cmd->add_option("--check", a->check_file,
                                "Validate TABLE: gated layer vs pure bf16 and pure FP8 at M off the tuning points");
  cmd->add_option("--check-m", a->check.m, "--check: M values (default 3,24,48,...,24000)")->needs(check);
  cmd->add_option("--decode-ceiling", a->check.decode_ceiling, "--check: decode ceiling of the prefill policy")
      ->transform(int_in(0, kMaxCliM))
      ->capture_default_str()
      ->needs(check);
  cmd->add_option("--tolerance", a->check.tolerance_pct, "--check: gated time within this % of the faster path")
      ->transform(number_in(0, 100))
      ->capture_default_str()
      ->needs(check);
  cmd->add_option("--json", a->check.json, "--check: results as JSON (default: --csv with .json)")->needs(check);
  cmd->add_flag("--no-fail", a->check.no_fail, "--check: report violations but exit 0")->needs(check);
  auto* force = cmd->add_flag("--force", a->check.force, "--check, --retime: take a table stamped for another GPU");
  // Re-timing a table's buckets with their own configurations (tune_retime.cpp).
  auto* retime = cmd->add_option("--retime", a->retime_file,
                                 "Re-time TABLE's buckets (M <= --max-m) with their own configurations: bf16, FP8 "
                                 "quantize + GEMM and the FP8 GEMM alone (fp8_gemm_us) in the same rounds; writes --out");
  for (CLI::Option* measuring_only : {model, tp, shape, max_m, first_bucket, max_split, margin, budget, dry_run, out})
    check->excludes(measuring_only);
  for (CLI::Option* not_retime : {model, tp, shape, first_bucket, max_split, margin, budget, dry_run, cpu, csv, check})
    retime->excludes(not_retime);
  for (CLI::Option* not_summary : {model, tp, shape, max_m, first_bucket, reps, warmup, max_split, budget, no_flush,
                                   cpu, dry_run, out, csv, check, retime})
    from->excludes(not_summary);
  cmd->callback([a, force] {
    FP8PROJ_CHECK(force->count() == 0 || !a->check_file.empty() || !a->retime_file.empty(),
                  "--force applies to --check and --retime only");
    if (!a->retime_file.empty()) {
      FP8PROJ_CHECK(!a->out.empty(), "--retime writes a new table: give --out");
      RetimeArgs r;
      r.table = a->retime_file;
      r.out = a->out;
      r.md = a->md;
      r.max_m = a->max_m;
      r.reps = a->reps;
      r.warmup = a->warmup;
      r.no_flush = a->no_flush;
      r.force = a->check.force;
      run_retime(r);
      return;
    }
    if (!a->check_file.empty()) {
      CheckArgs c = a->check;
      c.table = a->check_file;
      c.reps = a->reps;
      c.warmup = a->warmup;
      c.cpu = a->cpu;
      c.no_flush = a->no_flush;
      c.csv = a->csv;
      c.md = a->md;
      run_gatecheck(c);
      return;
    }
    run_tune(*a);
  });
}

}  // namespace fp8proj::cli

// fp8proj tune --check TABLE: does the tuned gate keep its promise? For every shape in the
// table and M values that are not tuning points (spread from 1 to 32768), it measures in the
// same run, interleaved, with L2 flushed before every timed call:
//   bf16      the layer with FP8 off
//   fp8       the layer with FP8 forced on at every M, running the table's bucket choice
//   untuned   FP8 forced on, no table (the backend's heuristic): what tuning gained
//   all       the gated layer, policy `all`
//   prefill   the gated layer, policy `prefill` with the decode ceiling
// and checks: `all` within the tolerance (3%) of min(bf16, fp8); `prefill` the same above the
// ceiling, and at or below it exactly the bf16 path (the gate says bf16 and the output is
// bit-identical to the bf16 layer's). A failed timing check is measured once more with twice
// the repetitions before it counts (both results are written); any failure -> exit code 1.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <memory>
#include <set>
#include <vector>

#include "common.hpp"
#include "fp8proj/error.hpp"
#include "fp8proj/gemm.hpp"
#include "fp8proj/projection.hpp"
#include "fp8proj/tune.hpp"
#include "fp8proj/tuner.hpp"
#include "gatecheck.hpp"
#include "tune_common.hpp"

namespace fp8proj::cli {

namespace {

const char* const kDefaultCheckM = "3,24,48,96,200,384,700,1500,3000,6000,12000,24000";
constexpr int64_t kCompareRows = 256;  // rows compared for the policy-all output note

enum V : int { kBf16, kFp8, kUntuned, kAll, kPrefill };
constexpr int kVariants = 5;
const char* const kVariantNames[kVariants] = {"bf16", "fp8", "fp8_untuned", "gated_all", "gated_prefill"};

struct CheckRow {
  std::string label;
  int64_t n = 0, k = 0, m = 0, m_asked = 0;
  double us[kVariants] = {};
  double first_all_ratio = 0, first_prefill_ratio = 0;
  bool remeasured = false;
  std::string all_path, prefill_path, bucket, fp8_via;
  double all_ratio = 0, prefill_ratio = 0;  // gated / min(bf16, fp8)
  bool all_ok = true, prefill_ok = true;
  std::string prefill_check;  // "timing" above the ceiling, "exact bf16" at or below it
  std::string all_output;     // "same as bf16" / "same as fp8" / "differs" (first rows)
};

bool same_output(MemorySpace space, ProjectionLayer& a, ProjectionLayer& b, const bf16* x, int64_t m, int64_t rows,
                 bf16* ya, bf16* yb) {
  a.forward(x, m, ya);
  b.forward(x, m, yb);
  const size_t bytes = static_cast<size_t>(rows * a.n()) * sizeof(bf16);
  std::vector<unsigned char> ha(bytes), hb(bytes);
  copy_bytes(ha.data(), MemorySpace::host, ya, space, bytes);
  copy_bytes(hb.data(), MemorySpace::host, yb, space, bytes);
  return std::memcmp(ha.data(), hb.data(), bytes) == 0;
}

class ShapeCheck {
 public:
  ShapeCheck(const TunedShape& row, MemorySpace space, int64_t rows_cap, int64_t ceiling, const std::string& label)
      : row_(row), space_(space), label_(label) {
    w_ = random_bf16(space, row.n, row.k, 11, 0.02f);
    x_ = random_bf16(space, rows_cap, row.k, 12, 1.0f);
    ya_ = random_bf16(space, rows_cap, row.n, 13, 1.0f);
    yb_ = random_bf16(space, rows_cap, row.n, 14, 1.0f);
    ws_ = std::make_shared<ActivationWorkspace>(space, rows_cap, round_up(row.k, 128), false);
    ProjectionOptions base;
    base.max_tokens = rows_cap;
    base.workspace = ws_;
    base.use_tune_table = false;
    base.apply_env = false;
    auto make = [&](V v, ProjectionOptions o) {
      o.name = label + " " + kVariantNames[v];
      layers_[v] = std::make_unique<ProjectionLayer>(space, w_.data(), row.n, row.k, o);
    };
    make(kBf16, base);
    ProjectionOptions fp8 = base;  // FP8 at every M
    fp8.fp8 = true;
    fp8.threshold = 0;
    fp8.decode_ceiling = 0;
    make(kUntuned, fp8);
    fp8.tuned = row;
    make(kFp8, fp8);
    ProjectionOptions gated = base;
    gated.fp8 = true;
    gated.tuned = row;
    gated.policy = Fp8Policy::all;
    make(kAll, gated);
    gated.policy = Fp8Policy::prefill;
    gated.decode_ceiling = ceiling;
    make(kPrefill, gated);
    FP8PROJ_CHECK(layers_[kFp8]->has_fp8_copy(), label, ": the FP8 path is unavailable here (",
                  layers_[kFp8]->explain(1).reason, ")");
  }

  ProjectionLayer& layer(V v) { return *layers_[v]; }
  const bf16* x() const { return x_.data(); }
  bf16* ya() const { return ya_.data(); }
  bf16* yb() const { return yb_.data(); }

  // Median of topt.reps calls per variant, interleaved call by call (time_interleaved): blocks
  // of repetitions per variant left 2-4% between two layers running the same kernel.
  void time_all(int64_t m, const TimingOptions& topt, double (&us)[kVariants]) {
    std::vector<std::function<void(StreamHandle)>> fns;
    std::vector<std::string> labels;  // a failing call names its layer and kernel
    for (int v = 0; v < kVariants; ++v) {
      fns.push_back([this, l = layers_[v].get(), m](StreamHandle st) { l->forward(x_.data(), m, ya_.data(), st); });
      const Explanation e = layers_[v]->explain(m);
      labels.push_back(fmt::format("{} M={}: {} {}", layers_[v]->name(), m, e.backend, e.config));
    }
    const std::vector<double> t = time_interleaved(space_, fns, topt, labels);
    for (int v = 0; v < kVariants; ++v) us[v] = t[v];
  }


 private:
  TunedShape row_;
  MemorySpace space_;
  std::string label_;
  Tensor w_, x_, ya_, yb_;
  std::shared_ptr<ActivationWorkspace> ws_;
  std::unique_ptr<ProjectionLayer> layers_[kVariants];
};

void evaluate(CheckRow& r, int64_t ceiling, double tol) {
  const double best = std::min(r.us[kBf16], r.us[kFp8]);
  r.all_ratio = r.us[kAll] / best;
  r.all_ok = r.all_ratio <= tol;
  if (r.m > ceiling) {
    r.prefill_ratio = r.us[kPrefill] / best;
    r.prefill_ok = r.prefill_ratio <= tol;
  } else {
    r.prefill_ratio = r.us[kPrefill] / r.us[kBf16];  // reported; the check is exactness
  }
}

std::string ok_text(bool ok) { return ok ? "ok" : "FAIL"; }

}  // namespace

void run_gatecheck(const CheckArgs& a) {
  const MemorySpace space = choose_space(a.cpu);
  const bool gpu = space == MemorySpace::device;
  const std::vector<int64_t> asked = parse_m_list(a.m.empty() ? kDefaultCheckM : a.m, 1, "--check-m");
  const std::string csv = !a.csv.empty() ? a.csv : "gatecheck.csv";
  const std::string json = !a.json.empty() ? a.json : std::filesystem::path(csv).replace_extension(".json").string();
  const std::string md = !a.md.empty() ? a.md : std::filesystem::path(csv).replace_extension(".md").string();
  check_outputs({{"--csv", csv}, {"--json", json}, {"--md", md}}, {{"--check", a.table}});
  const TuneTable table = load_tune_table(a.table);
  const std::string why = gpu ? stamp_mismatch(table.stamp, current_device()) : std::string();
  FP8PROJ_CHECK(why.empty() || a.force, "tuned table '", a.table, "' does not match this GPU: ", why,
                " (--force checks it anyway)");
  fmt::print("fp8proj tune --check {} -- {}\n", a.table, space_banner(space));
  if (gpu) {
    if (!why.empty()) fmt::print("warning: {} (checked anyway: --force)\n", why);
  } else {
    fmt::print("note: table measured on {}; checking on the CPU reference, whose times say nothing about a GPU\n",
               table.stamp.gpu_name.empty() ? std::string("the CPU reference") : "'" + table.stamp.gpu_name + "'");
  }
  const double tol = 1 + a.tolerance_pct / 100;
  TimingOptions topt;
  topt.warmup = a.warmup >= 0 ? a.warmup : (gpu ? 3 : 1);
  topt.reps = a.reps > 0 ? a.reps : (gpu ? 60 : 3);  // medians 3% apart must be told apart
  topt.flush_l2 = gpu && !a.no_flush;

  // Per shape: the M values, moved off the points the tuner measured.
  struct Job {
    const TunedShape* row;
    std::string label;
    std::vector<std::pair<int64_t, int64_t>> ms;  // (M, M asked for)
  };
  std::vector<Job> jobs;
  double est_us = 0;
  const tune::CostModel cm;
  // Short calls get more repetitions (at least ~3 ms of timed work per variant, up to 4x the
  // default): at 20 us, the medians of two layers running the same kernels were 1.4% apart with
  // 60 calls each (H200, 2048x2048 at M = 1500), half the 3% being checked. --reps fixes them.
  auto reps_at = [&](int64_t m, int64_t n, int64_t k) {
    if (a.reps > 0 || !gpu) return topt.reps;
    const double call_us = tune::estimate_call_us(true, m, n, k, cm);
    const auto want = static_cast<int>(std::ceil(3000.0 / std::max(call_us, 1.0)));
    return std::clamp(want, topt.reps, 4 * topt.reps);
  };
  for (const TunedShape& s : table.shapes) {
    if (s.buckets.empty() || !fp8_eligible(s.n, s.k)) continue;
    std::set<int64_t> tuning_points;
    for (const auto& b : s.buckets)
      for (int64_t p : tune::sample_points({b.m_lo, b.m_hi, 0})) tuning_points.insert(p);
    Job j{&s, shape_label(s.n, s.k), {}};
    for (int64_t m : asked) {
      if (m > s.buckets.back().m_hi) continue;
      int64_t mm = m;
      while (tuning_points.count(mm)) ++mm;
      j.ms.emplace_back(mm, m);
      est_us += kVariants * tune::estimate_timing_us(true, mm, s.n, s.k, topt.warmup, reps_at(mm, s.n, s.k),
                                                     topt.flush_l2, cm);
    }
    if (!j.ms.empty()) jobs.push_back(std::move(j));
  }
  FP8PROJ_CHECK(!jobs.empty(), "tuned table '", a.table, "' has no shape to check");
  fmt::print(
      "{} shapes x up to {} M values; variants bf16, fp8 (tuned), fp8 untuned, gated all, gated prefill "
      "(ceiling {}); median of {}+ calls each (short calls more), interleaved call by call, L2 {}; tolerance {:.0f}%; "
      "estimated {}\n",
      jobs.size(), asked.size(), a.decode_ceiling, topt.reps,
      topt.flush_l2 ? "flushed before every timed call" : "not flushed", a.tolerance_pct,
      gpu ? format_duration(est_us * 1e-6) : std::string("(CPU)"));
  std::fflush(stdout);

  std::vector<CheckRow> rows;
  Progress progress(est_us);
  for (const Job& j : jobs) {
    const TunedShape& s = *j.row;
    int64_t cap = 4;
    for (const auto& [m, asked_m] : j.ms) cap = std::max(cap, round_up(m, 4));
    ShapeCheck sc(s, space, cap, a.decode_ceiling, j.label);
    for (const auto& [m, asked_m] : j.ms) {
      progress.start(fmt::format("{} ({}x{}) M={}", j.label, s.n, s.k, m));
      CheckRow r;
      r.label = j.label;
      r.n = s.n;
      r.k = s.k;
      r.m = m;
      r.m_asked = asked_m;
      r.all_path = to_string(sc.layer(kAll).path_for(m));
      r.prefill_path = to_string(sc.layer(kPrefill).path_for(m));
      const Explanation fe = sc.layer(kFp8).explain(m);
      r.fp8_via = fe.backend + (fe.config.empty() ? "" : " [" + fe.config + "]");
      if (const TunedBucket* b = s.bucket_for(m))
        r.bucket = fmt::format("{}-{} {}{}", b->m_lo, b->m_hi, b->fp8_backend,
                               b->fp8_config.empty() ? "" : " " + b->fp8_config);
      TimingOptions at_m = topt;
      at_m.reps = reps_at(m, s.n, s.k);
      sc.time_all(m, at_m, r.us);
      evaluate(r, a.decode_ceiling, tol);
      r.first_all_ratio = r.all_ratio;
      r.first_prefill_ratio = r.prefill_ratio;
      if (!r.all_ok || !r.prefill_ok) {  // confirm with twice the repetitions before it counts
        TimingOptions twice = at_m;
        twice.reps *= 2;
        sc.time_all(m, twice, r.us);
        evaluate(r, a.decode_ceiling, tol);
        r.remeasured = true;
      }
      if (m <= a.decode_ceiling) {
        r.prefill_check = "exact bf16";
        r.prefill_ok = sc.layer(kPrefill).path_for(m) == Path::bf16 &&
                       same_output(space, sc.layer(kPrefill), sc.layer(kBf16), sc.x(), m, m, sc.ya(), sc.yb());
      } else {
        r.prefill_check = "timing";
      }
      const V chosen = sc.layer(kAll).path_for(m) == Path::fp8 ? kFp8 : kBf16;
      r.all_output =
          same_output(space, sc.layer(kAll), sc.layer(chosen), sc.x(), m, std::min(m, kCompareRows), sc.ya(), sc.yb())
              ? std::string("same as ") + kVariantNames[chosen]
              : "differs";
      progress.done(kVariants * tune::estimate_timing_us(true, m, s.n, s.k, topt.warmup, topt.reps, topt.flush_l2, cm));
      rows.push_back(r);
    }
  }
  progress.finish();

  // ---- report ----
  int all_fail = 0, prefill_fail = 0;
  std::string cur;
  for (const CheckRow& r : rows) {
    if (r.label != cur) {
      cur = r.label;
      fmt::print("\n{} ({}x{})\n  {:>6} {:>9} {:>9} {:>9} {:>9} {:>5} {:>7} {:>4}   {:>9} {:>5} {:>10} {:>4}\n",
                 r.label, r.n, r.k, "M", "bf16 us", "fp8 us", "untuned", "all us", "path", "/best", "", "prefill",
                 "path", "check", "");
    }
    all_fail += !r.all_ok;
    prefill_fail += !r.prefill_ok;
    fmt::print("  {:>6} {:>9.1f} {:>9.1f} {:>9.1f} {:>9.1f} {:>5} {:>7.3f} {:>4}   {:>9.1f} {:>5} {:>10} {:>4}{}\n",
               r.m, r.us[kBf16], r.us[kFp8], r.us[kUntuned], r.us[kAll], r.all_path, r.all_ratio, ok_text(r.all_ok),
               r.us[kPrefill], r.prefill_path,
               r.prefill_check == "timing" ? fmt::format("{:.3f}", r.prefill_ratio) : r.prefill_check,
               ok_text(r.prefill_ok), r.remeasured ? "  (re-measured)" : "");
  }
  const std::string verdict = fmt::format(
      "policy all: {} of {} within {:.0f}% of min(bf16, fp8); policy prefill: {} of {} ok "
      "(timing above the ceiling {}, exact bf16 at or below it)",
      rows.size() - all_fail, rows.size(), a.tolerance_pct, rows.size() - prefill_fail, rows.size(), a.decode_ceiling);
  fmt::print("\n{}\n", verdict);

  std::string c =
      "label,n,k,m,m_asked,bf16_us,fp8_us,fp8_untuned_us,gated_all_us,gated_prefill_us,fp8_via,bucket,all_path,"
      "all_ratio,all_ok,prefill_path,prefill_check,prefill_ratio,prefill_ok,all_output,remeasured,first_all_ratio,"
      "first_prefill_ratio\n";
  for (const CheckRow& r : rows)
    c += fmt::format(
        "{},{},{},{},{},{:.3f},{:.3f},{:.3f},{:.3f},{:.3f},{},{},{},{:.4f},{},{},{},{:.4f},{},{},{},"
        "{:.4f},{:.4f}\n",
        csv_escape(r.label), r.n, r.k, r.m, r.m_asked, r.us[kBf16], r.us[kFp8], r.us[kUntuned], r.us[kAll],
        r.us[kPrefill], csv_escape(r.fp8_via), csv_escape(r.bucket), r.all_path, r.all_ratio, r.all_ok ? 1 : 0,
        r.prefill_path, r.prefill_check, r.prefill_ratio, r.prefill_ok ? 1 : 0, r.all_output, r.remeasured ? 1 : 0,
        r.first_all_ratio, r.first_prefill_ratio);
  write_text(csv, c);

  nlohmann::json j;
  j["stamp"] = result_stamp();
  j["table"] = {
      {"file", a.table}, {"gpu_name", table.stamp.gpu_name}, {"fp8proj_version", table.stamp.fp8proj_version}};
  j["timing"] = {{"reps", topt.reps},
                 {"reps_short_calls", "about 3 ms of timed work per variant, at most 4x reps"},
                 {"warmup", topt.warmup},
                 {"interleave", "call by call"},
                 {"l2_flush", topt.flush_l2},
                 {"statistic", "median"}};
  j["tolerance"] = tol;
  j["decode_ceiling"] = a.decode_ceiling;
  j["summary"] = {
      {"checks", rows.size()}, {"all_failures", all_fail}, {"prefill_failures", prefill_fail}, {"text", verdict}};
  for (const CheckRow& r : rows)
    j["rows"].push_back({{"label", r.label},
                         {"n", r.n},
                         {"k", r.k},
                         {"m", r.m},
                         {"m_asked", r.m_asked},
                         {"bf16_us", r.us[kBf16]},
                         {"fp8_us", r.us[kFp8]},
                         {"fp8_untuned_us", r.us[kUntuned]},
                         {"gated_all_us", r.us[kAll]},
                         {"gated_prefill_us", r.us[kPrefill]},
                         {"fp8_via", r.fp8_via},
                         {"bucket", r.bucket},
                         {"all_path", r.all_path},
                         {"all_ratio", r.all_ratio},
                         {"all_ok", r.all_ok},
                         {"prefill_path", r.prefill_path},
                         {"prefill_check", r.prefill_check},
                         {"prefill_ratio", r.prefill_ratio},
                         {"prefill_ok", r.prefill_ok},
                         {"all_output", r.all_output},
                         {"remeasured", r.remeasured},
                         {"first_all_ratio", r.first_all_ratio},
                         {"first_prefill_ratio", r.first_prefill_ratio}});
  write_text(json, j.dump(1) + "\n");

  const DeviceInfo& d = current_device();
  std::string m = "# Gate check: tuned table `" + a.table + "`\n\n";
  m += fmt::format("{}; table measured on {} with fp8proj {}.\n",
                   gpu ? fmt::format("Run on {} ({} SMs), driver CUDA {}, "
                                     "cuBLASLt {}, fp8proj {}",
                                     d.name, d.sm_count, d.driver_version, d.cublaslt_version, fp8proj_version())
                       : std::string("Run on the CPU reference"),
                   table.stamp.gpu_name.empty() ? std::string("the CPU reference") : table.stamp.gpu_name,
                   table.stamp.fp8proj_version);
  m += fmt::format(
      "Median of {} or more calls per variant (short calls: about 3 ms of timed work, up to 4x), the variants "
      "interleaved call by call, L2 {}; M values moved off the "
      "tuning points (bucket edges and middles). Ratio = gated time / min(bf16, FP8).\n\n**{}**\n\n",
      topt.reps, topt.flush_l2 ? "flushed before every timed call" : "not flushed", verdict);
  m += "| shape | M | bf16 µs | FP8 µs | FP8 untuned µs | all: path | all: ratio | prefill: path | prefill: check |\n"
       "|---|---|---|---|---|---|---|---|---|\n";
  for (const CheckRow& r : rows)
    m +=
        fmt::format("| {} | {} | {:.1f} | {:.1f} | {:.1f} | {} | {:.3f} {} | {} | {} {} |\n", r.label, r.m, r.us[kBf16],
                    r.us[kFp8], r.us[kUntuned], r.all_path, r.all_ratio, r.all_ok ? "ok" : "**FAIL**", r.prefill_path,
                    r.prefill_check == "timing" ? fmt::format("{:.3f}", r.prefill_ratio) : r.prefill_check,
                    r.prefill_ok ? "ok" : "**FAIL**");
  write_text(md, m);
  fmt::print("wrote {}, {}, {}\n", csv, json, md);
  FP8PROJ_CHECK(a.no_fail || (all_fail == 0 && prefill_fail == 0), "gate check failed: ", verdict);
}

}  // namespace fp8proj::cli

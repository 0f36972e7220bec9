// The pure logic of `fp8proj tune` (include/fp8proj/tuner.hpp): buckets, choices, threshold,
// splits, the run-time estimate and the markdown summary. No timing here.
#include "fp8proj/tuner.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <tuple>

#include "fp8proj/error.hpp"

namespace fp8proj::tune {

std::vector<Bucket> initial_buckets(int64_t max_m, int64_t first_hi) {
  FP8PROJ_CHECK(max_m >= 1, "tune: the largest M must be >= 1, got ", max_m);
  FP8PROJ_CHECK(first_hi >= 1, "tune: the first bucket's upper edge must be >= 1, got ", first_hi);
  // Bounded, so that the doubling below cannot overflow and the list stays short.
  constexpr int64_t kMaxM = int64_t(1) << 40;
  FP8PROJ_CHECK(max_m <= kMaxM && first_hi <= kMaxM, "tune: M up to ", kMaxM, " only, got --max-m ", max_m,
                " and --first-bucket ", first_hi);
  int64_t p2 = 1;
  while (p2 < first_hi) p2 *= 2;
  std::vector<Bucket> out;
  int64_t lo = 1;
  for (int64_t hi = p2; lo <= max_m; hi *= 2) {
    out.push_back({lo, std::min(hi, max_m), 0});
    lo = hi + 1;
  }
  return out;
}

int64_t representative_m(int64_t lo, int64_t hi) {
  FP8PROJ_CHECK(lo >= 1 && hi >= lo, "tune: bad bucket [", lo, ", ", hi, "]");
  const auto r = static_cast<int64_t>(std::llround(std::sqrt(static_cast<double>(lo) * static_cast<double>(hi))));
  return std::clamp(r, lo, hi);
}

std::vector<int64_t> sample_points(const Bucket& b) {
  int64_t r = representative_m(b.lo, b.hi);
  // At least one odd M per bucket: cuBLASLt's blockwise FP8 path chose a plan 1.7x slower at
  // M = 201 than at 200, 208 and 216 (H200, 6144x16384), and a bucket split at even cuts
  // would otherwise never see an unaligned M.
  if (b.lo % 2 == 0 && b.hi % 2 == 0 && r % 2 == 0 && b.hi - b.lo >= 2) r = r + 1 < b.hi ? r + 1 : r - 1;
  std::vector<int64_t> p = {b.lo, r, b.hi};
  std::sort(p.begin(), p.end());
  p.erase(std::unique(p.begin(), p.end()), p.end());
  return p;
}

std::pair<Bucket, Bucket> split_bucket(const Bucket& b) {
  FP8PROJ_CHECK(b.hi - b.lo >= 2, "tune: bucket [", b.lo, ", ", b.hi, "] is too narrow to split");
  // The representative of a bucket at least 3 wide lies strictly below hi, so both halves
  // are non-empty.
  const int64_t r = std::min(representative_m(b.lo, b.hi), b.hi - 1);
  return {{b.lo, r, b.depth + 1}, {r + 1, b.hi, b.depth + 1}};
}

std::pair<Bucket, Bucket> split_bucket_at(const Bucket& b, int64_t cut) {
  FP8PROJ_CHECK(cut >= b.lo && cut < b.hi, "tune: cut ", cut, " outside bucket [", b.lo, ", ", b.hi, ")");
  return {{b.lo, cut, b.depth + 1}, {cut + 1, b.hi, b.depth + 1}};
}

namespace {

// The step inside c's bucket, or 0 (none, or outside [lo, hi - 1]).
int64_t step_in(const BucketChoice& c, const StepFn& step) {
  if (!step || !c.complete) return 0;
  const int64_t s = step(c);
  return s >= c.bucket.lo && s < c.bucket.hi ? s : 0;
}

// The time of one (kind, backend, config) at M, or 0 when it was not measured or failed.
double find_us(const std::vector<Measurement>& ms, int64_t m, bool fp8, const std::string& backend,
               const std::string& config) {
  double us = 0;
  for (const auto& x : ms)
    if (x.m == m && x.fp8 == fp8 && (!fp8 || (x.backend == backend && x.config == config))) us = x.us;
  return us > 0 && std::isfinite(us) ? us : 0.0;
}

}  // namespace

double gmean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += std::log(x);
  return v.empty() ? 0.0 : std::exp(s / static_cast<double>(v.size()));
}

BucketChoice choose_bucket(const Bucket& b, const std::vector<Measurement>& ms, double margin) {
  BucketChoice c;
  c.bucket = b;
  c.points = sample_points(b);
  const size_t np = c.points.size();

  c.bf16_us.resize(np);
  for (size_t i = 0; i < np; ++i) c.bf16_us[i] = find_us(ms, c.points[i], false, "", "");
  std::set<std::pair<std::string, std::string>> keys;
  for (const auto& x : ms)
    if (x.fp8 && std::find(c.points.begin(), c.points.end(), x.m) != c.points.end()) keys.insert({x.backend, x.config});

  // The fastest FP8 time at each point, among every candidate that ran there.
  c.best_fp8_us.assign(np, 0.0);
  std::map<std::pair<std::string, std::string>, std::vector<double>> times;
  for (const auto& key : keys) {
    std::vector<double> t(np);
    for (size_t i = 0; i < np; ++i) {
      t[i] = find_us(ms, c.points[i], true, key.first, key.second);
      if (t[i] > 0 && (c.best_fp8_us[i] == 0 || t[i] < c.best_fp8_us[i])) c.best_fp8_us[i] = t[i];
    }
    times[key] = std::move(t);
  }

  // Minimax regret over the candidates that ran at every point; ties (within 0.5%, below
  // timing noise) go to the better geometric mean, then to the first name.
  bool have = false;
  double best_worst = 0, best_gm = 0;
  for (const auto& [key, t] : times) {
    if (std::any_of(t.begin(), t.end(), [](double x) { return x <= 0; })) continue;
    std::vector<double> r(np);
    for (size_t i = 0; i < np; ++i) r[i] = t[i] / c.best_fp8_us[i];
    const double worst = *std::max_element(r.begin(), r.end()), gm = gmean(r);
    const bool better = !have || worst < best_worst - 0.005 || (worst <= best_worst + 0.005 && gm < best_gm);
    if (better) {
      have = true;
      best_worst = worst;
      best_gm = gm;
      c.fp8_backend = key.first;
      c.fp8_config = key.second;
      c.fp8_us = t;
    }
  }
  c.complete = have && std::all_of(c.bf16_us.begin(), c.bf16_us.end(), [](double x) { return x > 0; });
  if (!c.complete) return c;

  c.worst_regret = best_worst;
  c.bf16_gmean = gmean(c.bf16_us);
  c.fp8_gmean = gmean(c.fp8_us);
  c.fp8_wins = c.fp8_gmean < c.bf16_gmean;
  c.min_speedup = c.max_speedup = c.bf16_us[0] / c.fp8_us[0];
  c.wins_by_margin = true;
  for (size_t i = 0; i < np; ++i) {
    const double s = c.bf16_us[i] / c.fp8_us[i];
    c.min_speedup = std::min(c.min_speedup, s);
    c.max_speedup = std::max(c.max_speedup, s);
    if (s < margin - 1e-9) c.wins_by_margin = false;  // "by at least 3%": exactly 3% counts
  }
  c.verdict_violated = c.fp8_wins ? c.min_speedup * margin < 1.0 : c.max_speedup > margin;
  return c;
}

int64_t select_threshold(const std::vector<BucketChoice>& choices) {
  size_t i = choices.size();
  while (i > 0 && choices[i - 1].complete && choices[i - 1].wins_by_margin) --i;
  if (i == choices.size()) return kNeverFp8;
  return choices[i].bucket.lo - 1;
}

std::vector<Bucket> buckets_to_split(const std::vector<BucketChoice>& choices, int max_depth, double margin,
                                     const StepFn& step) {
  std::vector<Bucket> out;
  auto splittable = [&](const BucketChoice& c) {
    return c.complete && c.bucket.depth < max_depth && c.bucket.hi - c.bucket.lo >= 2;
  };
  // Half the margin for the verdict: the points are sparse, and a path that loses by 1.5% at
  // a sample point lost by 6% between two of them on the H200 (4096x2048, M 513..725). And
  // a configuration that trails the best one by more than the margin at a point: the halves
  // may each have their own.
  const double near = std::sqrt(margin);
  for (const auto& c : choices) {
    const bool verdict_close = c.fp8_wins ? c.min_speedup * near < 1.0 : c.max_speedup > near;
    // A near tie across a step of the FP8 time: one side of the step may go the other way.
    const bool tie_over_step =
        c.min_speedup * margin * margin >= 1.0 && c.max_speedup <= margin * margin && step_in(c, step) != 0;
    if (splittable(c) && (c.verdict_violated || verdict_close || c.worst_regret > margin || tie_over_step))
      out.push_back(c.bucket);
  }
  // The bucket just below the threshold: when FP8 already wins by the margin at its upper
  // edge, a finer cut can move the threshold down.
  const int64_t t = select_threshold(choices);
  if (t != kNeverFp8 && t > 0)
    for (const auto& c : choices)
      if (c.bucket.hi == t && splittable(c) && c.bf16_us.back() >= margin * c.fp8_us.back() &&
          std::find(out.begin(), out.end(), c.bucket) == out.end())
        out.push_back(c.bucket);
  return out;
}

std::vector<BucketChoice> search(const std::vector<Bucket>& initial, const MeasureFn& measure, int max_depth,
                                 double margin, const StepFn& step) {
  // A NaN or sub-1 margin would make every comparison below false: a threshold where FP8 lost.
  FP8PROJ_CHECK(margin >= 1.0 && margin <= 2.0, "tune: the margin factor must be in [1, 2] (--margin 0-100%), got ",
                margin);
  std::vector<Bucket> buckets = initial;
  std::vector<int64_t> points;
  for (const auto& b : buckets)
    for (int64_t p : sample_points(b)) points.push_back(p);
  for (;;) {
    const std::vector<Measurement>& ms = measure(points);
    std::vector<BucketChoice> choices;
    for (const auto& b : buckets) choices.push_back(choose_bucket(b, ms, margin));
    const std::vector<Bucket> split = buckets_to_split(choices, max_depth, margin, step);
    if (split.empty()) return choices;
    std::vector<Bucket> next;
    points.clear();
    for (size_t i = 0; i < buckets.size(); ++i) {
      const Bucket& b = buckets[i];
      if (std::find(split.begin(), split.end(), b) == split.end()) {
        next.push_back(b);
        continue;
      }
      const int64_t cut = step_in(choices[i], step);
      const auto [lo, hi] = cut ? split_bucket_at(b, cut) : split_bucket(b);
      for (const Bucket& h : {lo, hi}) {
        next.push_back(h);
        for (int64_t p : sample_points(h))
          if (std::none_of(ms.begin(), ms.end(), [&](const Measurement& x) { return x.m == p; })) points.push_back(p);
      }
    }
    buckets = std::move(next);
  }
}

TunedShape make_tuned_shape(int64_t n, int64_t k, const std::vector<BucketChoice>& choices) {
  TunedShape s;
  s.n = n;
  s.k = k;
  int64_t prev = 0;
  for (const auto& c : choices) {
    FP8PROJ_CHECK(c.bucket.lo == prev + 1, "tune ", n, "x", k, ": buckets are not contiguous at M=", c.bucket.lo);
    FP8PROJ_CHECK(c.complete, "tune ", n, "x", k, ": bucket [", c.bucket.lo, ", ", c.bucket.hi,
                  "] has no complete measurement (bf16 and an FP8 candidate at M = ",
                  fmt::format("{}", fmt::join(c.points, ", ")), ")");
    s.buckets.push_back({c.bucket.lo, c.bucket.hi, c.fp8_backend, c.fp8_config, c.bf16_gmean, c.fp8_gmean, HeuristicConfig{}});
    prev = c.bucket.hi;
  }
  s.threshold = select_threshold(choices);
  return s;
}

double estimate_call_us(bool fp8, int64_t m, int64_t n, int64_t k, const CostModel& c) {
  const double M = static_cast<double>(m), N = static_cast<double>(n), K = static_cast<double>(k);
  const double flop = 2.0 * M * N * K;
  if (!fp8)
    return c.launch_us +
           std::max(flop / (c.bf16_tflops * 1e6), (2 * N * K + 2 * M * K + 2 * M * N) / c.hbm_bytes_per_us);
  const double quant = c.launch_us + (3 * M * K + 4 * M * K / 128) / c.hbm_bytes_per_us;
  const double gemm =
      c.launch_us + std::max(flop / (c.fp8_tflops * 1e6), (N * K + M * K + 2 * M * N) / c.hbm_bytes_per_us);
  return quant + gemm;
}

double estimate_timing_us(bool fp8, int64_t m, int64_t n, int64_t k, int warmup, int reps, bool flush,
                          const CostModel& c) {
  return c.per_timing_us + (warmup + reps) * estimate_call_us(fp8, m, n, k, c) + (flush ? reps * c.flush_us : 0.0);
}

std::string threshold_text(int64_t threshold) {
  return threshold == kNeverFp8 ? std::string("never") : std::to_string(threshold);
}

namespace {

std::string m_range(int64_t lo, int64_t hi) { return lo == hi ? std::to_string(lo) : fmt::format("{}–{}", lo, hi); }

std::string candidate_text(const TunedBucket& b) {
  return b.fp8_backend + (b.fp8_config.empty() ? " (heuristic)" : " " + b.fp8_config);
}

// Fixed gate (FP8 when M > reference) against the tuned threshold gate over the buckets that
// overlap the M between the two: time(fixed) / time(tuned) per bucket.
std::string between_text(const TunedShape& s, int64_t reference, std::string& range) {
  const int64_t t = s.threshold;
  if (t == reference) {
    range = "—";
    return "same gate";
  }
  const int64_t lo = std::min(t, reference) + 1;
  const int64_t hi = t == kNeverFp8 ? s.buckets.back().m_hi : std::max(t, reference);
  range = t == kNeverFp8 ? fmt::format("> {}", reference) : m_range(lo, hi);
  std::vector<double> r;
  for (const auto& b : s.buckets)
    if (b.m_hi >= lo && b.m_lo <= hi) r.push_back(t < reference ? b.bf16_us / b.fp8_us : b.fp8_us / b.bf16_us);
  if (r.empty()) return "no bucket measured there";
  const double g = gmean(r);
  const auto [mn, mx] = std::minmax_element(r.begin(), r.end());
  const std::string spread = r.size() > 1 ? fmt::format(" ({:.2f}–{:.2f}× per bucket)", *mn, *mx) : "";
  if (t < reference) return fmt::format("{:.2f}× faster{}: FP8 where M > {} keeps bf16", g, spread, reference);
  // g = FP8 time / bf16 time there: above 1 the fixed gate loses that much; below 1 FP8 was
  // faster on average but not by the 3% margin in every bucket, which the threshold demands.
  if (g >= 1.0)
    return fmt::format("avoids a {:.0f}% loss{}: bf16 where M > {} runs FP8", 100 * (g - 1), spread, reference);
  return fmt::format("gives up {:.0f}%{} (FP8 not 3% faster in every bucket): bf16 where M > {} runs FP8",
                     100 * (1 - g), spread, reference);
}

// Policy all in the decode range (M <= ceiling): buckets where FP8 wins, and the speedup of
// the faster path over bf16 there.
std::string decode_text(const TunedShape& s, int64_t ceiling) {
  int wins = 0, total = 0;
  std::vector<double> r;
  for (const auto& b : s.buckets) {
    if (b.m_lo > ceiling) continue;
    ++total;
    if (b.fp8_wins()) ++wins;
    r.push_back(b.bf16_us / std::min(b.bf16_us, b.fp8_us));
  }
  if (total == 0) return "—";
  return fmt::format("FP8 in {}/{} buckets; {:.2f}× over bf16 (up to {:.2f}×)", wins, total, gmean(r),
                     *std::max_element(r.begin(), r.end()));
}

}  // namespace

std::string summary_markdown(const TuneStamp& st, const std::vector<ShapeSummary>& shapes, int64_t reference,
                             int64_t ceiling, double margin) {
  std::string md = "# Tuned FP8 gate: thresholds per shape\n\n";
  if (st.gpu_name.empty())
    md += fmt::format("Measured on the CPU reference (no GPU: these times say nothing about a GPU), fp8proj {}.\n",
                      st.fp8proj_version);
  else
    md += fmt::format("Measured on {} ({} SMs), driver CUDA {}, runtime {}, cuBLASLt {}, fp8proj {}.\n", st.gpu_name,
                      st.sm_count, st.driver, st.cuda_runtime, st.cublaslt, st.fp8proj_version);
  md += fmt::format(
      "FP8 times include the activation quantization. The threshold is the smallest M from which the FP8 path "
      "wins by at least {:.0f}% in its bucket and every larger one (the gate runs FP8 when M > threshold); the "
      "reference design uses a fixed M > {}. Bucket times are geometric means over the bucket's lower edge, "
      "geometric middle and upper edge.\n\n",
      100 * (margin - 1), reference);
  md += fmt::format(
      "| shape | N×K | tuned threshold | reference | M between | fixed M > {} vs tuned there | policy "
      "`all` at M ≤ {} |\n|---|---|---|---|---|---|---|\n",
      reference, ceiling);
  for (const auto& sh : shapes) {
    std::string range;
    const std::string between = between_text(sh.shape, reference, range);
    md += fmt::format("| {} | {}×{} | {} | {} | {} | {} | {} |\n", sh.label, sh.shape.n, sh.shape.k,
                      threshold_text(sh.shape.threshold), reference, range, between, decode_text(sh.shape, ceiling));
  }
  md += fmt::format(
      "\nUnder the default `prefill` policy the decode ceiling ({}) keeps M ≤ {} on bf16 whatever the threshold, "
      "so a threshold below {} pays only with policy `all` or a lower ceiling. Above the ceiling both policies "
      "follow each bucket's measured verdict (the column `policy all`); the threshold decides beyond the "
      "table's buckets, or everywhere when one is set explicitly.\n",
      ceiling, ceiling, reference);
  for (const auto& sh : shapes) {
    md += fmt::format("\n## {} ({}×{}): threshold {}\n\n", sh.label, sh.shape.n, sh.shape.k,
                      threshold_text(sh.shape.threshold));
    md += "| M | FP8 candidate | bf16 µs | FP8 µs | bf16 / FP8 | policy `all` |\n|---|---|---|---|---|---|\n";
    for (const auto& b : sh.shape.buckets)
      md += fmt::format("| {} | {} | {:.1f} | {:.1f} | {:.2f} | {} |\n", m_range(b.m_lo, b.m_hi), candidate_text(b),
                        b.bf16_us, b.fp8_us, b.bf16_us / b.fp8_us, b.fp8_wins() ? "FP8" : "bf16");
  }
  return md;
}

}  // namespace fp8proj::tune

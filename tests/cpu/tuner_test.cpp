// `fp8proj tune`'s logic without a GPU (include/fp8proj/tuner.hpp): the buckets, the choice
// per bucket, the threshold with its 3% margin, the splits, the search on synthetic timing
// curves, the JSON round trip of what it writes, the summary, and the projection layer
// honouring a table passed through ProjectionOptions::tuned.
#include "fp8proj/tuner.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>

#include "env_guard.hpp"
#include "fp8proj/error.hpp"
#include "fp8proj/projection.hpp"
#include "fp8proj/tune.hpp"
#include "test_util.hpp"

namespace fp8proj {
namespace {

using tune::Bucket;
using tune::BucketChoice;
using tune::Measurement;

TEST(TunerBuckets, PowersOfTwoAfterTheFirst) {
  const auto b = tune::initial_buckets(32768);
  ASSERT_EQ(b.size(), 12u);
  EXPECT_EQ(b[0], (Bucket{1, 16, 0}));
  EXPECT_EQ(b[1], (Bucket{17, 32, 0}));
  EXPECT_EQ(b[4], (Bucket{129, 256, 0}));
  EXPECT_EQ(b.back(), (Bucket{16385, 32768, 0}));
  for (size_t i = 1; i < b.size(); ++i) EXPECT_EQ(b[i].lo, b[i - 1].hi + 1) << "contiguous at " << i;

  EXPECT_EQ(tune::initial_buckets(64).size(), 3u);
  EXPECT_EQ(tune::initial_buckets(100).back(), (Bucket{65, 100, 0}));  // the last one ends at max_m
  EXPECT_EQ(tune::initial_buckets(10), (std::vector<Bucket>{{1, 10, 0}}));
  EXPECT_EQ(tune::initial_buckets(64, 10)[0], (Bucket{1, 16, 0}));  // first edge rounded up to 2^k
  EXPECT_EQ(tune::initial_buckets(64, 1)[0], (Bucket{1, 1, 0}));
  EXPECT_THROW(tune::initial_buckets(0), Error);
}

TEST(TunerBuckets, RepresentativeIsTheGeometricMiddle) {
  EXPECT_EQ(tune::representative_m(1, 16), 4);
  EXPECT_EQ(tune::representative_m(17, 32), 23);
  EXPECT_EQ(tune::representative_m(129, 256), 182);
  EXPECT_EQ(tune::representative_m(16385, 32768), 23171);
  EXPECT_EQ(tune::representative_m(7, 7), 7);
  EXPECT_EQ(tune::sample_points({129, 256, 0}), (std::vector<int64_t>{129, 182, 256}));
  EXPECT_EQ(tune::sample_points({5, 5, 0}), (std::vector<int64_t>{5}));
  EXPECT_EQ(tune::sample_points({5, 6, 0}), (std::vector<int64_t>{5, 6}));
  // Every bucket sees an odd M: [200, 216] is sampled at 209, not 208.
  EXPECT_EQ(tune::sample_points({200, 216, 2}), (std::vector<int64_t>{200, 209, 216}));
  EXPECT_EQ(tune::sample_points({200, 202, 2}), (std::vector<int64_t>{200, 201, 202}));
}

TEST(TunerBuckets, SplitAtTheRepresentative) {
  const auto [lo, hi] = tune::split_bucket({129, 256, 0});
  EXPECT_EQ(lo, (Bucket{129, 182, 1}));
  EXPECT_EQ(hi, (Bucket{183, 256, 1}));
  const auto [a, b] = tune::split_bucket({1, 3, 1});
  EXPECT_EQ(a.hi + 1, b.lo);
  EXPECT_EQ(b.hi, 3);
  EXPECT_EQ(a.depth, 2);
  EXPECT_THROW(tune::split_bucket({4, 5, 0}), Error);
}

// bf16 and FP8 candidates at each M of a bucket, from per-point speedups.
std::vector<Measurement> at_points(const Bucket& b, const std::vector<double>& bf16,
                                   const std::map<std::string, std::vector<double>>& fp8) {
  std::vector<Measurement> ms;
  const auto pts = tune::sample_points(b);
  for (size_t i = 0; i < pts.size(); ++i) {
    ms.push_back({pts[i], false, "", "", bf16[i]});
    for (const auto& [cfg, t] : fp8) ms.push_back({pts[i], true, "sm90_fp8_block", cfg, t[i]});
  }
  return ms;
}

TEST(TunerChoice, MinimaxRegretAcrossTheBucket) {
  const Bucket b{129, 256, 0};
  // "spiky" is the fastest at both edges but 20% off in the middle; "steady" is 2% off
  // everywhere: the bucket's config must hold across it, so "steady" wins.
  const auto ms = at_points(b, {100, 120, 140},
                            {{"spiky", {50, 72, 70}}, {"steady", {51, 61.2, 71.4}}, {"best_mid", {60, 60, 90}}});
  const BucketChoice c = tune::choose_bucket(b, ms);
  ASSERT_TRUE(c.complete);
  EXPECT_EQ(c.fp8_config, "steady");
  EXPECT_NEAR(c.worst_regret, 1.02, 1e-9);
  EXPECT_EQ(c.best_fp8_us, (std::vector<double>{50, 60, 70}));
  EXPECT_TRUE(c.fp8_wins);
  EXPECT_TRUE(c.wins_by_margin);
  EXPECT_NEAR(c.bf16_gmean, std::cbrt(100.0 * 120 * 140), 1e-9);
}

TEST(TunerChoice, CandidatesMustRunAtEveryPoint) {
  const Bucket b{17, 32, 0};
  auto ms = at_points(b, {10, 11, 12}, {{"fast_but_fails", {5, 0, 5}}, {"ok", {8, 8.5, 9}}});
  BucketChoice c = tune::choose_bucket(b, ms);
  EXPECT_EQ(c.fp8_config, "ok") << "a candidate that failed at one point cannot be chosen";
  // A candidate measured at two of the three points only is not complete either.
  ms.push_back({17, true, "cublaslt_fp8_block", "", 1});
  ms.push_back({32, true, "cublaslt_fp8_block", "", 1});
  c = tune::choose_bucket(b, ms);
  EXPECT_EQ(c.fp8_backend, "sm90_fp8_block");
  // No bf16 time: incomplete, and the table refuses it.
  std::vector<Measurement> no_bf16;
  for (const auto& x : ms)
    if (x.fp8) no_bf16.push_back(x);
  EXPECT_FALSE(tune::choose_bucket(b, no_bf16).complete);
  EXPECT_THROW(tune::make_tuned_shape(128, 128, {tune::choose_bucket({1, 16, 0}, no_bf16)}), Error);
}

// Choices for the initial buckets of max_m from one speedup (bf16 / FP8) per bucket, the same
// at every point.
std::vector<BucketChoice> flat_choices(int64_t max_m, const std::vector<double>& speedup) {
  const auto buckets = tune::initial_buckets(max_m);
  EXPECT_EQ(buckets.size(), speedup.size());
  std::vector<BucketChoice> cs;
  for (size_t i = 0; i < buckets.size(); ++i) {
    const size_t np = tune::sample_points(buckets[i]).size();
    cs.push_back(tune::choose_bucket(buckets[i], at_points(buckets[i], std::vector<double>(np, 100.0),
                                                           {{"m128n128_ws2_st5", std::vector<double>(np, 100.0 / speedup[i])}})));
  }
  return cs;
}

TEST(TunerThreshold, PastTheLastLoss) {
  // FP8 wins at small M, loses in the middle, wins again: the threshold is past the last loss.
  // bucket (upper edge):         16    32    64    128   256   512   1k    2k    4k    8k    16k   32k
  const std::vector<double> s = {1.40, 1.35, 1.30, 1.10, 0.90, 0.95, 0.97, 1.20, 1.30, 1.50, 1.60, 1.70};
  const auto cs = flat_choices(32768, s);
  EXPECT_EQ(tune::select_threshold(cs), 1024) << "bucket [1025, 2048] is the first of the final winning run";
  const TunedShape row = tune::make_tuned_shape(4096, 2048, cs);
  EXPECT_EQ(row.threshold, 1024);
  EXPECT_TRUE(row.bucket_for(1)->fp8_wins()) << "policy all still takes FP8 where it wins below the threshold";
  EXPECT_FALSE(row.bucket_for(300)->fp8_wins());
}

TEST(TunerThreshold, ThreePercentMargin) {
  // 2% is not a win for the threshold (but is for policy all's verdict); exactly 3% is.
  auto s = std::vector<double>(12, 1.5);
  s[9] = 1.02;
  auto cs = flat_choices(32768, s);
  EXPECT_EQ(tune::select_threshold(cs), 8192) << "bucket [4097, 8192] wins by 2% only";
  EXPECT_TRUE(cs[9].fp8_wins);
  EXPECT_FALSE(cs[9].wins_by_margin);
  s[9] = 1.03;
  EXPECT_EQ(tune::select_threshold(flat_choices(32768, s)), 0) << "FP8 wins by the margin everywhere: M > 0";
  s[11] = 0.99;
  EXPECT_EQ(tune::select_threshold(flat_choices(32768, s)), tune::kNeverFp8) << "loses at the largest bucket";
  EXPECT_EQ(tune::threshold_text(tune::kNeverFp8), "never");
}

TEST(TunerThreshold, EveryPointOfTheBucketMustWin) {
  const Bucket b{257, 512, 0};
  // The lower edge wins by 1% only: the bucket does not set the threshold.
  const BucketChoice c = tune::choose_bucket(b, at_points(b, {101, 110, 120}, {{"c", {100, 100, 100}}}));
  EXPECT_TRUE(c.fp8_wins);
  EXPECT_FALSE(c.wins_by_margin);
  EXPECT_NEAR(c.min_speedup, 1.01, 1e-9);
  EXPECT_NEAR(c.max_speedup, 1.20, 1e-9);
}

TEST(TunerSplit, MixedVerdictsAndTheBucketBelowTheThreshold) {
  const auto buckets = tune::initial_buckets(1024);  // [1,16] .. [513,1024]: 7 buckets
  std::vector<Measurement> ms;
  auto add = [&](const Bucket& b, std::vector<double> bf16, std::vector<double> fp8) {
    auto m = at_points(b, bf16, {{"c", fp8}});
    ms.insert(ms.end(), m.begin(), m.end());
  };
  add(buckets[0], {10, 10, 10}, {20, 20, 20});  // bf16 everywhere
  add(buckets[1], {10, 10, 10}, {20, 20, 20});
  add(buckets[2], {10, 10, 10}, {9, 11, 12});  // FP8 wins at 33, loses by 10-20% above: mixed
  add(buckets[3], {10, 10, 10}, {20, 20, 20});
  add(buckets[4], {10, 10, 10}, {20, 20, 20});
  add(buckets[5], {10, 10, 10}, {10.2, 9.9, 9.5});  // [257, 512]: only its upper edge wins by 3%
  add(buckets[6], {10, 10, 10}, {9, 9, 9});         // [513, 1024] wins: threshold 512
  std::vector<BucketChoice> cs;
  for (const auto& b : buckets) cs.push_back(tune::choose_bucket(b, ms));
  EXPECT_EQ(tune::select_threshold(cs), 512);
  EXPECT_TRUE(cs[2].verdict_violated);
  EXPECT_TRUE(cs[5].fp8_wins);
  EXPECT_FALSE(cs[5].verdict_violated) << "FP8 verdict, bf16 only 2% faster at 257: within the margin";
  EXPECT_FALSE(cs[5].wins_by_margin);
  const auto split = tune::buckets_to_split(cs, 2);
  EXPECT_EQ(split, (std::vector<Bucket>{buckets[2], buckets[5]}));
  EXPECT_TRUE(tune::buckets_to_split(cs, 0).empty()) << "max depth 0: never split";
}

TEST(TunerSplit, CloseVerdictsAndTrailingConfigurations) {
  const auto buckets = tune::initial_buckets(1024);
  std::vector<Measurement> ms;
  auto add = [&](const Bucket& b, std::vector<double> bf16, std::map<std::string, std::vector<double>> fp8) {
    auto m = at_points(b, bf16, fp8);
    ms.insert(ms.end(), m.begin(), m.end());
  };
  for (int i = 0; i < 6; ++i) add(buckets[i], {10, 10, 10}, {{"c", {20, 20, 20}}});  // bf16, clear
  // [513, 1024]: bf16 chosen (geometric means), FP8 2% faster at the upper edge: within the
  // 3% margin, but close enough that an M between the points may beat it by more.
  add(buckets[6], {10, 10, 10}, {{"c", {10.5, 10.4, 9.8}}});
  std::vector<BucketChoice> cs;
  for (const auto& b : buckets) cs.push_back(tune::choose_bucket(b, ms));
  EXPECT_FALSE(cs[6].fp8_wins);
  EXPECT_FALSE(cs[6].verdict_violated);
  EXPECT_EQ(tune::buckets_to_split(cs, 2), (std::vector<Bucket>{buckets[6]}));

  // A clear FP8 bucket whose best configuration changes inside it: the chosen one (minimax)
  // trails the fastest by 10% at one point, so the halves get their own.
  ms.clear();
  for (int i = 0; i < 6; ++i) add(buckets[i], {10, 10, 10}, {{"c", {20, 20, 20}}});
  add(buckets[6], {20, 20, 20}, {{"a", {10, 11, 12}}, {"b", {12, 11, 10}}});
  cs.clear();
  for (const auto& b : buckets) cs.push_back(tune::choose_bucket(b, ms));
  EXPECT_TRUE(cs[6].wins_by_margin);
  EXPECT_GT(cs[6].worst_regret, 1.03);
  const auto split = tune::buckets_to_split(cs, 2);
  EXPECT_NE(std::find(split.begin(), split.end(), buckets[6]), split.end());
  EXPECT_TRUE(tune::buckets_to_split(cs, 0).empty()) << "max depth 0: never split";
}

// A synthetic GPU: the times of bf16 and two FP8 configs as functions of M.
struct Synthetic {
  std::function<double(int64_t)> bf16, fp8_a, fp8_b;
  std::vector<Measurement> ms;
  std::vector<int64_t> measured;
  const std::vector<Measurement>& operator()(const std::vector<int64_t>& points) {
    for (int64_t m : points) {
      measured.push_back(m);
      ms.push_back({m, false, "", "", bf16(m)});
      ms.push_back({m, true, "sm90_fp8_block", "a", fp8_a(m)});
      ms.push_back({m, true, "sm90_fp8_block", "b", fp8_b(m)});
    }
    return ms;
  }
};

TEST(TunerSearch, RefinesTheCrossover) {
  // bf16 is faster below M = 300, FP8 (config a) 10% faster above; config b is always worse.
  Synthetic gpu;
  gpu.bf16 = [](int64_t m) { return 10.0 + 0.1 * m; };
  gpu.fp8_a = [](int64_t m) { return m < 300 ? 1.1 * (10.0 + 0.1 * m) : 0.9 * (10.0 + 0.1 * m); };
  gpu.fp8_b = [&](int64_t m) { return 1.05 * gpu.fp8_a(m); };
  const auto choices = tune::search(tune::initial_buckets(4096), std::ref(gpu), 2);
  const TunedShape row = tune::make_tuned_shape(2048, 2048, choices);
  // [257, 512] has a mixed verdict: split at 363 into [257, 363] (mixed again, split at 305)
  // and [364, 512].
  EXPECT_GT(row.threshold, 256);
  EXPECT_LE(row.threshold, 305) << "the split moves the threshold towards the crossover at 300";
  for (const auto& b : row.buckets) {
    EXPECT_EQ(b.fp8_config, "a");
    if (b.m_hi < 300) EXPECT_FALSE(b.fp8_wins()) << b.m_lo << "-" << b.m_hi;
    if (b.m_lo >= 300) EXPECT_TRUE(b.fp8_wins()) << b.m_lo << "-" << b.m_hi;
  }
  // Every M is measured once.
  auto sorted = gpu.measured;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(std::adjacent_find(sorted.begin(), sorted.end()), sorted.end());
  // Depth bound: no bucket narrower than a quarter of its initial bucket's split chain.
  for (const auto& c : choices) EXPECT_LE(c.bucket.depth, 2);
}

TEST(TunerSearch, SplitsANearTieAtTheFp8WaveStep) {
  // The H200 case (2048x2048, 128x192 tiles on 132 SMs): FP8 runs one wave up to M = 1536 and
  // two from 1537, a step of ~17%; bf16 grows smoothly. Between 1450 and 1723 the sampled
  // points show a near tie, yet FP8 wins by ~5% just below the step.
  auto waves = [](int64_t m) { return ((m + 127) / 128 * 11 + 131) / 132; };
  Synthetic gpu;
  gpu.bf16 = [](int64_t m) { return 9.7 + 0.0082 * static_cast<double>(m); };
  gpu.fp8_a = [&](int64_t m) { return 2.5 + 18.0 * static_cast<double>(waves(m)) * (0.85 + 0.1 * m / 1536.0); };
  gpu.fp8_b = [&](int64_t m) { return 1.05 * gpu.fp8_a(m); };
  const tune::StepFn step = [&](const tune::BucketChoice& c) -> int64_t {
    for (int64_t m = c.bucket.lo; m < c.bucket.hi; ++m)
      if (waves(m + 1) > waves(m)) return m;
    return 0;
  };
  // The worst ratio of the path the table picks (policy all: the bucket's verdict) to the
  // faster of the two, over every M.
  auto worst = [&](const TunedShape& row) {
    double w = 1.0;
    for (int64_t m = 1; m <= 4096; ++m) {
      const double bf = gpu.bf16(m), f8 = gpu.fp8_a(m);
      const double picked = row.bucket_for(m)->fp8_wins() ? f8 : bf;
      w = std::max(w, picked / std::min(bf, f8));
    }
    return w;
  };
  Synthetic plain = gpu;
  const TunedShape without = tune::make_tuned_shape(2048, 2048, tune::search(tune::initial_buckets(4096), std::ref(plain), 3));
  const auto choices = tune::search(tune::initial_buckets(4096), std::ref(gpu), 3, tune::kDefaultMargin, step);
  const TunedShape with = tune::make_tuned_shape(2048, 2048, choices);
  EXPECT_GT(worst(without), 1.03) << "the scenario must defeat the representative-only splits";
  EXPECT_LE(worst(with), 1.03);
  EXPECT_TRUE(std::any_of(choices.begin(), choices.end(), [](const tune::BucketChoice& c) { return c.bucket.hi == 1536; }))
      << "a bucket ends at the step";
}

TEST(TunerSearch, NothingToSplitWhenTheVerdictHolds) {
  Synthetic gpu;
  gpu.bf16 = [](int64_t m) { return 10.0 + 0.2 * m; };
  gpu.fp8_a = [](int64_t m) { return 7.0 + 0.12 * m; };
  gpu.fp8_b = [](int64_t m) { return 6.0 + 0.15 * m; };  // better at small M, worse at large M
  const auto buckets = tune::initial_buckets(32768);
  const auto choices = tune::search(buckets, std::ref(gpu), 2);
  EXPECT_EQ(choices.size(), buckets.size());
  EXPECT_EQ(gpu.measured.size(), 36u);
  const TunedShape row = tune::make_tuned_shape(2048, 2048, choices);
  EXPECT_EQ(row.threshold, 0);
  EXPECT_EQ(row.bucket_for(1)->fp8_config, "b");
  EXPECT_EQ(row.bucket_for(30000)->fp8_config, "a");
}

TEST(TunerTable, JsonRoundTripOfWhatTuneWrites) {
  const auto cs = flat_choices(32768, {0.9, 0.95, 1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7, 1.8, 1.9});
  TuneTable t;
  t.stamp = {"NVIDIA H200", 132, "13.0", "13.0", "13.1.0", "0.1.0+test"};
  t.shapes.push_back(tune::make_tuned_shape(16384, 2048, cs));
  t.shapes.push_back(tune::make_tuned_shape(6144, 16384, flat_choices(32768, std::vector<double>(12, 0.8))));
  t.shapes.back().buckets[3].fp8_config = "";  // the heuristic
  const std::string path = ::testing::TempDir() + "tuner_rt.json";
  save_tune_table(t, path);
  const TuneTable r = load_tune_table(path);
  ASSERT_EQ(r.shapes.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(r.shapes[i].threshold, t.shapes[i].threshold);
    ASSERT_EQ(r.shapes[i].buckets.size(), t.shapes[i].buckets.size());
    for (size_t j = 0; j < t.shapes[i].buckets.size(); ++j) {
      const auto &a = t.shapes[i].buckets[j], &b = r.shapes[i].buckets[j];
      EXPECT_EQ(a.m_lo, b.m_lo);
      EXPECT_EQ(a.m_hi, b.m_hi);
      EXPECT_EQ(a.fp8_backend, b.fp8_backend);
      EXPECT_EQ(a.fp8_config, b.fp8_config);
      EXPECT_DOUBLE_EQ(a.bf16_us, b.bf16_us);
      EXPECT_DOUBLE_EQ(a.fp8_us, b.fp8_us);
      EXPECT_EQ(a.fp8_wins(), b.fp8_wins());
    }
  }
  EXPECT_EQ(r.shapes[0].threshold, 64);
  EXPECT_EQ(r.shapes[1].threshold, tune::kNeverFp8) << "'never' survives the file";
}

TEST(TunerSummary, ThresholdsNextToTheReference) {
  TuneStamp st{"NVIDIA H200", 132, "13.0", "13.0", "13.1.0", "0.1.0+test"};
  std::vector<tune::ShapeSummary> ss = {
      {"low", tune::make_tuned_shape(4096, 2048, flat_choices(32768, std::vector<double>(12, 1.5)))},
      {"high", tune::make_tuned_shape(
                   6144, 2048, flat_choices(32768, {1.5, 1.5, 1.5, 1.5, 1.5, 1.5, 0.8, 0.9, 1.2, 1.3, 1.3, 1.3}))},
      {"never", tune::make_tuned_shape(2048, 2048, flat_choices(32768, std::vector<double>(12, 0.9)))}};
  const std::string md = tune::summary_markdown(st, ss);
  EXPECT_NE(md.find("| low | 4096×2048 | 0 | 512 | 1–512 | 1.50× faster"), std::string::npos) << md;
  // [513, 1024] 0.8 and [1025, 2048] 0.9 between 512 and the threshold 2048: the fixed gate
  // would lose 25% and 11% there (geometric mean 18%).
  EXPECT_NE(md.find("| high | 6144×2048 | 2048 | 512 | 513–2048 | avoids a 18% loss"), std::string::npos) << md;
  EXPECT_NE(md.find("| never | 2048×2048 | never | 512 | > 512 |"), std::string::npos) << md;
  EXPECT_NE(md.find("NVIDIA H200"), std::string::npos);
  EXPECT_NE(md.find("FP8 in 6/6 buckets"), std::string::npos) << md;
}

TEST(TunerEstimate, GrowsWithMAndReps) {
  const double small = tune::estimate_call_us(true, 16, 16384, 2048);
  const double large = tune::estimate_call_us(true, 32768, 16384, 2048);
  EXPECT_GT(large, 50 * small);
  // M = 32768 of 16384x2048 is 2.2 TFLOP: ~2.2 ms at 1000 TFLOP/s (plus the quantization).
  EXPECT_NEAR(large, 2200 + 150, 300);
  EXPECT_GT(tune::estimate_call_us(false, 32768, 16384, 2048), large);
  EXPECT_GT(tune::estimate_timing_us(true, 16, 16384, 2048, 3, 30, true),
            tune::estimate_timing_us(true, 16, 16384, 2048, 3, 10, true));
}

// ---- the layer honours a table passed through ProjectionOptions::tuned ----

struct CleanEnv {
  testing::EnvGuard a{"FP8PROJ_PREFILL_FP8", nullptr}, b{"FP8PROJ_MIN_FP8_TOKENS", nullptr},
      c{"FP8PROJ_DECODE_CEILING", nullptr}, d{"FP8PROJ_FP8_BACKEND", nullptr};
};

TunedShape layer_row() {
  TunedShape s;
  s.n = 256;
  s.k = 384;
  s.threshold = 64;
  s.buckets = {
      {1, 16, "cpu_reference", "", 10, 12},                     // bf16 faster
      {17, 64, "cpu_reference", "", 20, 15},                    // FP8 faster
      {65, 128, "sm90_fp8_block", "m128n128_ws2_st5", 30, 20},  // not on the host: falls back
      {129, 256, "cpu_reference", "", 40, 30},
      {257, 512, "cpu_reference", "", 50, 40},
  };
  return s;
}

ProjectionOptions layer_options(Fp8Policy policy) {
  ProjectionOptions o;
  o.name = "tuned_proj";
  o.fp8 = true;
  o.policy = policy;
  o.max_tokens = 512;
  o.tuned = layer_row();
  o.apply_env = false;
  return o;
}

TEST(TunedLayer, PolicyAllFollowsEachBucket) {
  CleanEnv clean;
  const auto w = testing::random_bf16(256 * 384, 1, 0.02f);
  ::testing::internal::CaptureStderr();
  ProjectionLayer l(MemorySpace::host, w.data(), 256, 384, layer_options(Fp8Policy::all));
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(l.path_for(1), Path::bf16);
  EXPECT_EQ(l.path_for(16), Path::bf16);
  EXPECT_EQ(l.path_for(17), Path::fp8);
  EXPECT_EQ(l.path_for(100), Path::fp8);
  EXPECT_EQ(l.path_for(512), Path::fp8);
  EXPECT_EQ(l.path_for(513), Path::fp8) << "beyond the buckets: the threshold (64) decides";

  const Explanation e8 = l.explain(8);
  EXPECT_NE(e8.reason.find("bf16 measured faster"), std::string::npos) << e8.to_string();
  EXPECT_NE(e8.reason.find("tuned row 256x384 (ProjectionOptions::tuned) bucket [1, 16]"), std::string::npos)
      << e8.to_string();
  // (Which configuration reaches the plan: selection_test.cpp, with sm90 plans.)
  const Explanation e40 = l.explain(40);
  EXPECT_EQ(e40.backend, "cpu_reference");
  EXPECT_NE(e40.reason.find("bucket [17, 64]"), std::string::npos) << e40.to_string();
  // An unavailable backend: the default one runs, with its heuristic, and the log says so once.
  const Explanation e100 = l.explain(100);
  EXPECT_EQ(e100.backend, "cpu_reference");
  EXPECT_EQ(e100.config.find("m128n128"), std::string::npos) << e100.to_string();
  EXPECT_NE(e100.reason.find("runs on cpu_reference here (the tuned backend is unavailable)"), std::string::npos)
      << e100.to_string();
  EXPECT_NE(log.find("tuned table names FP8 backend 'sm90_fp8_block' for M in [65, 128]"), std::string::npos) << log;
  // A configuration name the bucket's backend does not have is refused when the layer is built.
  ProjectionOptions bad = layer_options(Fp8Policy::all);
  bad.tuned->buckets[0].fp8_config = "cfgA";
  EXPECT_THROW(ProjectionLayer(MemorySpace::host, w.data(), 256, 384, bad), Error);
  ::testing::internal::CaptureStderr();
  ProjectionLayer again(MemorySpace::host, w.data(), 256, 384, layer_options(Fp8Policy::all));
  EXPECT_EQ(::testing::internal::GetCapturedStderr().find("sm90_fp8_block"), std::string::npos) << "logged once";

  // The FP8 path computes the same whichever bucket's plan runs it.
  const int64_t m = 40;
  const auto x = testing::random_bf16(m * 384, 2);
  std::vector<bf16> y(m * 256), ref(m * 256);
  l.forward(x.data(), m, y.data());
  ProjectionOptions plain = layer_options(Fp8Policy::prefill);
  plain.tuned.reset();
  plain.threshold = 0;
  plain.decode_ceiling = 0;
  ProjectionLayer untuned(MemorySpace::host, w.data(), 256, 384, plain);
  untuned.forward(x.data(), m, ref.data());
  EXPECT_EQ(0, std::memcmp(y.data(), ref.data(), y.size() * sizeof(bf16)));
}

TEST(TunedLayer, PrefillFollowsTheBucketsAboveTheCeiling) {
  CleanEnv clean;
  const auto w = testing::random_bf16(256 * 384, 3, 0.02f);
  ProjectionOptions o = layer_options(Fp8Policy::prefill);
  o.decode_ceiling = 0;
  ProjectionLayer l(MemorySpace::host, w.data(), 256, 384, o);
  // Above the ceiling (0 here) prefill follows the bucket verdicts, like policy all.
  EXPECT_EQ(l.path_for(8), Path::bf16) << "bucket [1, 16]: bf16 measured faster";
  EXPECT_EQ(l.path_for(40), Path::fp8) << "bucket [17, 64]: FP8 measured faster";
  EXPECT_EQ(l.path_for(65), Path::fp8);
  EXPECT_EQ(l.path_for(600), Path::fp8) << "beyond the buckets: threshold 64";
  EXPECT_NE(l.explain(40).reason.find("above decode ceiling 0"), std::string::npos) << l.explain(40).to_string();
  EXPECT_NE(l.explain(600).reason.find("threshold 64 (tuned)"), std::string::npos) << l.explain(600).to_string();
  o.decode_ceiling = 128;
  ProjectionLayer c(MemorySpace::host, w.data(), 256, 384, o);
  EXPECT_EQ(c.path_for(40), Path::bf16);
  EXPECT_EQ(c.path_for(100), Path::bf16);
  EXPECT_EQ(c.path_for(129), Path::fp8);
  EXPECT_NE(c.explain(100).reason.find("decode ceiling 128"), std::string::npos);
  // An explicit threshold overrides the table: its buckets no longer decide.
  o.threshold = 256;
  ProjectionLayer t(MemorySpace::host, w.data(), 256, 384, o);
  EXPECT_EQ(t.path_for(256), Path::bf16);
  EXPECT_EQ(t.path_for(257), Path::fp8);
  o.policy = Fp8Policy::all;
  o.decode_ceiling = 0;
  ProjectionLayer ta(MemorySpace::host, w.data(), 256, 384, o);
  EXPECT_EQ(ta.path_for(40), Path::bf16) << "policy all with an explicit threshold 256";
  EXPECT_EQ(ta.path_for(257), Path::fp8);
  o.policy = Fp8Policy::prefill;
  // A table saying FP8 never wins keeps every M on bf16 under prefill.
  o.threshold.reset();
  o.tuned->threshold = tune::kNeverFp8;
  ProjectionLayer nv(MemorySpace::host, w.data(), 256, 384, o);
  EXPECT_EQ(nv.path_for(32768), Path::bf16);
  EXPECT_NE(nv.explain(600).reason.find("threshold never (tuned)"), std::string::npos) << nv.explain(600).to_string();
}

}  // namespace
}  // namespace fp8proj

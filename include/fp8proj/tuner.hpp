// How `fp8proj tune` turns measurements into a tuned table row (tune.hpp), kept apart from
// the timing so it can be tested without a GPU: the M buckets, the points measured in each,
// the candidate chosen per bucket, the bf16/FP8 verdict, the threshold, when a bucket is
// split, the run-time estimate, and the markdown summary.
//
// Buckets. [1, 16], then (2^(i-1), 2^i] up to max_m: 12 buckets for max_m = 32768.
//   - Below 16 tokens both paths stream the weight (bf16 2*N*K bytes, FP8 N*K) and the
//     FP8 kernels' smallest token tile is 16 wide, so time is flat in M there.
//   - Above, GEMM time grows with ceil(M / tile): doubling M doubles the tiles, so each
//     power-of-two bucket sees the same relative change, and its upper edge 2^i is where
//     64- and 128-row tiles fit exactly.
//   - Each bucket is measured at three points: its lower edge (one partial tile more than
//     the bucket below: the worst case for tile quantization), its representative M (the
//     geometric middle, rounded) and its upper edge (the best case). A candidate must run
//     at all three to be chosen; the verdict must hold at all three or the bucket is split.
//
// Choice per bucket (choose_bucket):
//   - candidate: the FP8 (backend, config) whose worst ratio to the fastest FP8 candidate at
//     each point is smallest (minimax regret), ties by the geometric mean of those ratios;
//   - verdict (TunedBucket::fp8_wins, which the gate follows; `prefill` above the ceiling):
//     the geometric means over the points of bf16 and of the chosen FP8 time, which is what
//     the table stores as bf16_us / fp8_us;
//   - wins_by_margin: FP8 is faster by at least the margin (3%) at every point.
// Threshold (select_threshold): the smallest M from which every bucket wins by the margin;
// stored as that M - 1 (the gate runs FP8 when M > threshold); kNeverFp8 when FP8 does not
// win by the margin at the largest bucket.
// Splits (buckets_to_split): a bucket whose verdict is wrong by more than half the margin at
// one of its points (FP8 chosen, bf16 faster there by > 1.5%, or the reverse), whose chosen
// configuration trails the fastest FP8 candidate by more than the margin at one of its points,
// and the bucket just below the threshold when its upper points already win by the margin;
// each split cuts at the representative M, at most max_depth times per initial bucket.
// Steps: an FP8 kernel's time jumps where M needs one more wave of CTAs (on the H200,
// 2048x2048 at 128x192 tiles: 132 tiles up to M = 1536, 143 from 1537: 20.6 -> 23.6 us),
// while cuBLAS bf16 grows smoothly. A near tie (every point within margin^2 either way) that
// straddles such a step can hide a win on one side of it: the bucket is split at the step
// (given by a StepFn), and any bucket that is split and has a step is cut there rather than
// at its representative.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fp8proj/tune.hpp"

namespace fp8proj::tune {

inline constexpr double kDefaultMargin = 1.03;                             // FP8 must be 3% faster to set the threshold
inline constexpr int64_t kDefaultFirstBucketHi = 16;                       // the smallest FP8 token tile
inline constexpr int64_t kNeverFp8 = std::numeric_limits<int64_t>::max();  // threshold: FP8 never wins

struct Bucket {
  int64_t lo = 1, hi = 1;  // lo <= M <= hi
  int depth = 0;           // times split from an initial bucket
  bool operator==(const Bucket&) const = default;
};

// [1, first_hi], then (2^(i-1), 2^i] for 2^i > first_hi, the last one ending at max_m.
// first_hi is rounded up to a power of two; throws on max_m < 1.
std::vector<Bucket> initial_buckets(int64_t max_m, int64_t first_hi = kDefaultFirstBucketHi);
// The geometric middle of [lo, hi], rounded to the nearest integer (lo for a width-1 bucket).
int64_t representative_m(int64_t lo, int64_t hi);
// {lo, representative, hi}, sorted, without duplicates; when all three are even the
// representative moves to its odd neighbour inside the bucket (unaligned M is the worst case
// for some plans).
std::vector<int64_t> sample_points(const Bucket& b);
// [lo, rep] and [rep + 1, hi], one level deeper. Requires hi - lo >= 2.
std::pair<Bucket, Bucket> split_bucket(const Bucket& b);
// [lo, cut] and [cut + 1, hi], one level deeper. Requires lo <= cut < hi.
std::pair<Bucket, Bucket> split_bucket_at(const Bucket& b, int64_t cut);

// One timed call: the bf16 path, or one FP8 candidate (activation quantization included).
struct Measurement {
  int64_t m = 0;
  bool fp8 = false;
  std::string backend, config;  // config "" = the backend's own heuristic
  double us = 0;                // median; <= 0 when the candidate failed at this M
};

struct BucketChoice {
  Bucket bucket;
  std::vector<int64_t> points;
  bool complete = false;  // bf16 and at least one FP8 candidate ran at every point
  std::string fp8_backend, fp8_config;
  std::vector<double> bf16_us, fp8_us, best_fp8_us;  // per point: bf16, chosen, fastest FP8
  double bf16_gmean = 0, fp8_gmean = 0;
  double worst_regret = 0;                  // chosen / fastest FP8, worst point
  double min_speedup = 0, max_speedup = 0;  // bf16 / chosen FP8 over the points
  bool fp8_wins = false;                    // fp8_gmean < bf16_gmean
  bool wins_by_margin = false;              // bf16 >= margin * FP8 at every point
  bool verdict_violated = false;            // the verdict is wrong by more than the margin at a point
};

// Chooses among the measurements whose M is one of the bucket's sample points.
BucketChoice choose_bucket(const Bucket& b, const std::vector<Measurement>& ms, double margin = kDefaultMargin);

// choices sorted by M and contiguous. See the header comment.
int64_t select_threshold(const std::vector<BucketChoice>& choices);
// The M inside [lo, hi - 1] after which the chosen FP8 candidate's time steps up (M + 1 needs
// one more wave), or 0 when there is none or the backend cannot tell.
using StepFn = std::function<int64_t(const BucketChoice&)>;
std::vector<Bucket> buckets_to_split(const std::vector<BucketChoice>& choices, int max_depth,
                                     double margin = kDefaultMargin, const StepFn& step = nullptr);

// The whole search for one shape: measures the initial buckets' points, chooses, splits where
// buckets_to_split says and measures the new points, until nothing is left to split.
// measure(points) times bf16 and every candidate at each M it has not timed yet and returns
// every measurement so far. Returns the final choices, sorted by M.
using MeasureFn = std::function<const std::vector<Measurement>&(const std::vector<int64_t>& points)>;
std::vector<BucketChoice> search(const std::vector<Bucket>& initial, const MeasureFn& measure, int max_depth,
                                 double margin = kDefaultMargin, const StepFn& step = nullptr);

// The table row from the final choices (sorted, contiguous from M = 1); throws if a bucket
// is incomplete.
TunedShape make_tuned_shape(int64_t n, int64_t k, const std::vector<BucketChoice>& choices);

// ---- the candidates: what `fp8proj tune` needs from a backend beyond GemmBackend ----

// A backend's named configurations as the tuner sees them (src/tune/config_space.cpp).
class ConfigSpace {
 public:
  virtual ~ConfigSpace() = default;
  // Configuration names worth measuring for (m, n, k) on this device, besides "" (the
  // backend's heuristic, always a candidate).
  virtual std::vector<std::string> candidates(int64_t m, int64_t n, int64_t k) const = 0;
  // The first M in [lo, hi - 1] at which `config` ("" = the backend's own pick) needs one more
  // wave of CTAs at M + 1 than at M, i.e. where its time steps up; 0 when there is none or the
  // name is not one of the backend's.
  virtual int64_t wave_step(const std::string& config, int64_t lo, int64_t hi, int64_t n, int64_t k) const = 0;
};
// The registry: the ConfigSpace of the backend of that name, nullptr when it has no named
// configurations (cuBLASLt, cpu_reference: only "" is measured).
const ConfigSpace* config_space(std::string_view backend);

// ---- run-time estimate (printed before `fp8proj tune` starts; the ETA recalibrates) ----
struct CostModel {
  double bf16_tflops = 600, fp8_tflops = 1000;  // sustained, H200 (measured: 700-800, 1100-1475)
  double hbm_bytes_per_us = 3.0e6;              // 3 TB/s reached by a small-M GEMM
  double launch_us = 5;                         // per kernel
  double flush_us = 40;                         // the L2 flush before every timed call (2 x 50 MB)
  double per_timing_us = 300;                   // events, synchronisation, host bookkeeping
};
// Device time of one call of the bf16 path or the FP8 path (quantization + GEMM).
// The geometric mean of positive times (a bucket's time over its points); 0 for none.
double gmean(const std::vector<double>& v);

double estimate_call_us(bool fp8, int64_t m, int64_t n, int64_t k, const CostModel& c = {});
// One timing: warm-up + reps calls, each preceded by a flush when flush is set.
double estimate_timing_us(bool fp8, int64_t m, int64_t n, int64_t k, int warmup, int reps, bool flush,
                          const CostModel& c = {});

// ---- the markdown summary ----
struct ShapeSummary {
  std::string label;  // "glm5 q_b_proj TP1"
  TunedShape shape;
};
// Thresholds per shape next to the reference design's fixed M > reference, the speedup the
// tuned gate gains (or the loss it avoids) between the two, and every bucket's choice.
std::string summary_markdown(const TuneStamp& stamp, const std::vector<ShapeSummary>& shapes, int64_t reference = 512,
                             int64_t decode_ceiling = 512, double margin = kDefaultMargin);
// "never", or the number.
std::string threshold_text(int64_t threshold);

}  // namespace fp8proj::tune

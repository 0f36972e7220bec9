#include <algorithm>
#include <chrono>
#include <vector>

#include "fp8proj/error.hpp"
#include "fp8proj/timing.hpp"

namespace fp8proj {

Timing summarize(std::vector<double> us) {
  FP8PROJ_CHECK(!us.empty(), "no timed repetitions");
  std::sort(us.begin(), us.end());
  const size_t n = us.size();
  const double median = n % 2 ? us[n / 2] : 0.5 * (us[n / 2 - 1] + us[n / 2]);
  return {median, us.front(), us.back(), static_cast<int>(n)};
}

Timing time_host(const std::function<void()>& fn, const TimingOptions& o) {
  FP8PROJ_CHECK(o.reps > 0 && o.warmup >= 0, "timing needs reps > 0 and warmup >= 0");
  for (int i = 0; i < o.warmup; ++i) fn();
  std::vector<double> us;
  us.reserve(o.reps);
  for (int i = 0; i < o.reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    const auto t1 = std::chrono::steady_clock::now();
    us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  return summarize(std::move(us));
}

#if !FP8PROJ_WITH_CUDA
Timing time_device(const std::function<void(StreamHandle)>&, StreamHandle, const TimingOptions&) {
  FP8PROJ_FAIL("device timing asked for, but this build has no CUDA");
}
void flush_l2(StreamHandle) { FP8PROJ_FAIL("an L2 flush asked for, but this build has no CUDA"); }
#endif

}  // namespace fp8proj

// parallel_for over [0, count) on the host's cores: contiguous ranges, one per thread,
// so results never depend on the thread count. Small ranges run inline.
#pragma once

#include <algorithm>
#include <cstdint>
#include <exception>
#include <thread>
#include <vector>

namespace fp8proj {

inline int host_threads() {
  static const int n = std::max(1u, std::thread::hardware_concurrency());
  return n;
}

// fn(begin, end) is called on disjoint ranges covering [0, count). `grain` is the smallest
// range worth a thread of its own.
template <typename Fn>
void parallel_for(int64_t count, int64_t grain, Fn&& fn) {
  if (count <= 0) return;
  const int64_t chunks = std::min<int64_t>(host_threads(), std::max<int64_t>(1, count / std::max<int64_t>(grain, 1)));
  if (chunks <= 1) {
    fn(int64_t{0}, count);
    return;
  }
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(chunks);
  threads.reserve(chunks - 1);
  const int64_t step = (count + chunks - 1) / chunks;
  for (int64_t c = 1; c < chunks; ++c) {
    const int64_t b = c * step, e = std::min(count, b + step);
    threads.emplace_back([&, c, b, e] {
      try {
        if (b < e) fn(b, e);
      } catch (...) {
        errors[c] = std::current_exception();
      }
    });
  }
  try {
    fn(int64_t{0}, std::min(count, step));
  } catch (...) {
    errors[0] = std::current_exception();
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace fp8proj

// The floor arithmetic of include/fp8proj/floor.hpp (host code), and the device half's stand-ins
// for builds without CUDA (they say so).
#include "fp8proj/floor.hpp"

#include <algorithm>
#include <cmath>

#include "fp8proj/error.hpp"

namespace fp8proj {

size_t fp8_weight_bytes(int64_t n, int64_t k) {
  FP8PROJ_CHECK(n >= 1 && k >= 1, "fp8_weight_bytes: N and K must be positive, got ", n, " x ", k);
  const int64_t scale_blocks = ceil_div(n, 128) * ceil_div(k, 128);
  return static_cast<size_t>(n) * static_cast<size_t>(k) + static_cast<size_t>(scale_blocks) * sizeof(float);
}

double byte_floor_us(double bytes, double bytes_per_s) {
  FP8PROJ_CHECK(bytes_per_s > 0 && std::isfinite(bytes_per_s), "byte_floor_us: bandwidth must be positive, got ",
                bytes_per_s);
  return bytes / bytes_per_s * 1e6;
}

double floor_ratio(double us, double floor_us) { return us > 0 && floor_us > 0 ? us / floor_us : 0.0; }

double achieved_gbps(double bytes, double us) { return us > 0 ? bytes / (us * 1e-6) / 1e9 : 0.0; }

int rotation_copies(size_t bytes_per_copy, size_t l2_bytes, double factor, int max_copies) {
  FP8PROJ_CHECK(bytes_per_copy > 0, "rotation_copies: a copy of 0 bytes");
  FP8PROJ_CHECK(factor > 0 && std::isfinite(factor), "rotation_copies: factor must be positive, got ", factor);
  FP8PROJ_CHECK(max_copies >= 1, "rotation_copies: max_copies must be at least 1, got ", max_copies);
  const double need = std::ceil(factor * static_cast<double>(l2_bytes) / static_cast<double>(bytes_per_copy));
  return static_cast<int>(std::clamp(need, 1.0, static_cast<double>(max_copies)));
}

int graph_calls(int copies, int min_calls) {
  FP8PROJ_CHECK(copies >= 1 && min_calls >= 1, "graph_calls: copies and min_calls must be at least 1, got ", copies,
                " and ", min_calls);
  return static_cast<int>(ceil_div(min_calls, copies) * copies);
}

#if !FP8PROJ_WITH_CUDA
namespace {
[[noreturn]] void no_cuda(const char* what) { FP8PROJ_FAIL(what, " needs a GPU, but this build has no CUDA"); }
}  // namespace

void launch_empty_kernel(StreamHandle) { no_cuda("the empty kernel"); }
void launch_read_kernel(const void*, size_t, const void*, size_t, uint32_t*, StreamHandle) {
  no_cuda("the read kernel");
}
size_t read_kernel_sink_words() { return 0; }
const ReadBandwidth& measured_read_bandwidth() { no_cuda("measuring the read bandwidth"); }

struct CapturedCalls::Impl {};
CapturedCalls::CapturedCalls(const std::function<void(int, StreamHandle)>&, int) { no_cuda("a CUDA graph"); }
CapturedCalls::~CapturedCalls() = default;
void CapturedCalls::replay(StreamHandle) const { no_cuda("a CUDA graph"); }
int CapturedCalls::calls() const { return 0; }
#endif

}  // namespace fp8proj

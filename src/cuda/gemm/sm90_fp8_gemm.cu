// Launcher of the sm90_fp8_block kernel family: argument checks, TMA descriptors, explicit
// instantiation of the few kernels in kernel_family() (three of them also compiled for the
// target shapes' K, launch_1d2d_for_k), and the launch.
//
// Build (sm_90a only; wgmma and setmaxnreg need the "a" target), one line:
//   nvcc -std=c++20 -O3 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a -Xptxas -v -Iinclude -Isrc
//        -c src/cuda/gemm/sm90_fp8_gemm.cu
// `-Xptxas -v` must report 0 bytes stack frame and 0 spills for every kernel.
#include "cuda/gemm/sm90_fp8_gemm.hpp"

#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <tuple>
#include <type_traits>
#include <vector>

#include "core/cuda_check.hpp"
#include "core/device_fault.hpp"
#include "cuda/common/launch.hpp"
#include "cuda/common/tensor_map.hpp"
#include "cuda/kernels/sm90_fp8_gemm_1d2d.cuh"
#include "cuda/kernels/sm90_fp8_gemm_swapab.cuh"
#include "gemm/sm90_watchdog.hpp"

namespace fp8proj::sm90 {

namespace {

CUtensorMapSwizzle swizzle_of(int bytes) {
  switch (bytes) {
    case 32: return CU_TENSOR_MAP_SWIZZLE_32B;
    case 64: return CU_TENSOR_MAP_SWIZZLE_64B;
    default: return CU_TENSOR_MAP_SWIZZLE_128B;
  }
}

// cudaFuncAttributeMaxDynamicSharedMemorySize once per kernel and device (the attribute is
// per device context). Not a stream operation: safe while a graph is being captured.
template <class KernelPtr>
void ensure_max_smem(KernelPtr kernel, std::atomic<uint64_t>& done_devices) {
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  const uint64_t bit = uint64_t{1} << (dev & 63);
  if (done_devices.load(std::memory_order_acquire) & bit) return;
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(kMaxSmemPerBlock)));
  done_devices.fetch_or(bit, std::memory_order_acq_rel);
}

void check_device_is_sm90() {
  static std::atomic<uint64_t> ok_devices{0};
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  const uint64_t bit = uint64_t{1} << (dev & 63);
  if (ok_devices.load(std::memory_order_acquire) & bit) return;
  int major = 0, minor = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  FP8PROJ_CHECK(major == 9 && minor == 0, "sm90_fp8_block runs only on compute capability 9.0 (H100/H200, built for ",
                "sm_90a); device ", dev, " is ", major, ".", minor);
  ok_devices.fetch_or(bit, std::memory_order_acq_rel);
}

struct Maps {
  CUtensorMap a, sfa, b, d;
};

// rows_a: box rows of the A tile; rows_sfa: of the A-scale box (the tile's rows; more than
// rows_a when each CTA of a cluster loads half of a multicast A tile); rows_b: box rows of
// the B tile; d box {d_cols, d_rows} with swizzle d_swizzle bytes.
Maps make_maps(const Fp8GemmArgs& x, uint32_t rows_a, uint32_t rows_sfa, uint32_t rows_b, uint32_t d_cols,
               uint32_t d_rows, int d_swizzle) {
  const uint64_t m = static_cast<uint64_t>(x.m), n = static_cast<uint64_t>(x.n), k = static_cast<uint64_t>(x.k);
  Maps maps;
  maps.a = make_tensor_map_2d(CU_TENSOR_MAP_DATA_TYPE_UINT8, x.a, k, m, k, 128, rows_a, CU_TENSOR_MAP_SWIZZLE_128B,
                              "A");
  // Scales: logical width M (not a_scale_ld), so padding entries are never read: TMA
  // zero-fills rows >= M. The row stride is the caller's a_scale_ld.
  maps.sfa = make_tensor_map_2d(CU_TENSOR_MAP_DATA_TYPE_FLOAT32, x.a_scales, m, k / 128,
                                static_cast<uint64_t>(x.a_scale_ld) * 4, rows_sfa, 1, CU_TENSOR_MAP_SWIZZLE_NONE,
                                "a_scales");
  maps.b = make_tensor_map_2d(CU_TENSOR_MAP_DATA_TYPE_UINT8, x.b, k, n, k, 128, rows_b, CU_TENSOR_MAP_SWIZZLE_128B,
                              "B");
  maps.d = make_tensor_map_2d(CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, x.d, n, m, n * 2, d_cols, d_rows,
                              swizzle_of(d_swizzle), "D");
  return maps;
}

// Clusters of C CTAs at the kernel's full shared memory: how many fit on the device at once
// (a GPC whose free SM count is odd leaves one SM out of 2-CTA clusters), once per kernel,
// device and shared-memory size class. The persistent grid never asks for more, or the
// clusters past it would run as a second wave.
template <class KernelPtr>
int max_active_clusters(KernelPtr kernel, int cluster, unsigned threads, size_t smem) {
  static std::mutex mu;
  static std::vector<std::tuple<const void*, int, size_t, int>> cache;  // (kernel, device, smem) -> count
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  for (const auto& [k, d, s, n] : cache)
    if (k == reinterpret_cast<const void*>(kernel) && d == dev && s == smem) return n;
  cudaLaunchConfig_t lc{};
  lc.gridDim = dim3(static_cast<unsigned>(cluster), 1, 1);
  lc.blockDim = dim3(threads, 1, 1);
  lc.dynamicSmemBytes = smem;
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = static_cast<unsigned>(cluster);
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  lc.attrs = &attr;
  lc.numAttrs = 1;
  int n = 0;
  CUDA_CHECK(cudaOccupancyMaxActiveClusters(&n, kernel, &lc));
  FP8PROJ_CHECK(n > 0, "sm90 FP8 GEMM: no cluster of ", cluster, " CTAs with ", smem, " B of shared memory fits");
  cache.emplace_back(reinterpret_cast<const void*>(kernel), dev, smem, n);
  return n;
}

template <class T>
void launch_1d2d(const Fp8GemmArgs& x, const Config& cfg, int num_sms, cudaStream_t stream) {
  static_assert(T::kSmemFixed == smem_fixed_bytes(KernelKind::kGemm1d2d, T::BLOCK_M, T::BLOCK_N, T::kStages),
                "kernel shared-memory layout and heuristic disagree");
  static_assert(T::kSfbRows == b_scale_rows(T::BLOCK_N), "B-scale rows: kernel and heuristic disagree");
  // Each kernel exists twice: with the hang watchdog (FP8PROJ_WATCHDOG_MS > 0) and without it.
  WatchdogParams watchdog = watchdog_params();
  const bool watched = watchdog_armed(watchdog);
  static std::atomic<uint64_t> smem_set[2] = {0, 0};
  auto kernel = watched ? kernels::sm90_fp8_gemm_1d2d_kernel<T, true> : kernels::sm90_fp8_gemm_1d2d_kernel<T, false>;
  ensure_max_smem(kernel, smem_set[watched]);

  const Problem p{x.m, x.n, x.k, num_sms};
  const TileGrid g = tile_grid(cfg, p);
  // With a cluster, each producer loads (and multicasts) 1 / kCluster of the shared tile.
  const Maps maps =
      make_maps(x, T::kARowsPerCta, T::BLOCK_M, T::kBRowsPerCta, T::kDSlabCols, T::kDStoreRows, T::kDSwizzle);
  const auto smem = static_cast<size_t>(smem_bytes(cfg, x.k));
  const auto m32 = static_cast<uint32_t>(x.m), n32 = static_cast<uint32_t>(x.n), k32 = static_cast<uint32_t>(x.k);
  const auto group = static_cast<uint32_t>(raster_group_m(cfg, p));
  const uint32_t evict_first = weight_evict_first(cfg, p) ? 1u : 0u;
  watchdog.m = m32;
  watchdog.n = n32;
  watchdog.k = k32;
  unsigned grid = static_cast<unsigned>(g.grid);
  if constexpr (T::kCluster > 1)
    grid = static_cast<unsigned>(
        std::min<int64_t>(g.grid / T::kCluster, max_active_clusters(kernel, T::kCluster, T::kThreads, smem)) *
        T::kCluster);
  // Programmatic dependent launch when FP8PROJ_PDL=1 (cuda/common/launch.hpp).
  gpu::launch_kernel({dim3(grid), dim3(T::kThreads), smem, stream, static_cast<unsigned>(T::kCluster)}, kernel,
                     maps.a, maps.sfa, maps.b, maps.d, x.b_scales, m32, n32, k32, group, evict_first, watchdog);
}

// Large-M kernels that also exist compiled for the K of the target shapes (kernels::FixedK):
// q_b_proj's K = 1536 / 2048 and o_proj's K = 4096 (TP4); same configuration names, picked
// here by k. Not for K = 16384, where the loop overhead is spread over 128 K blocks.
template <class T>
constexpr bool kCompiledPerK = std::is_same_v<T, kernels::Gemm1d2dTraits<256, 128, 2, 3>> ||
                               std::is_same_v<T, kernels::Gemm1d2dTraits<128, 192, 2, 4>> ||
                               std::is_same_v<T, kernels::Gemm1d2dTraits<128, 192, 2, 4, 1, false, true>>;

template <class T>
void launch_1d2d_for_k(const Fp8GemmArgs& x, const Config& cfg, int num_sms, cudaStream_t stream) {
  if constexpr (kCompiledPerK<T>) {
    switch (x.k) {
      case 1536: return launch_1d2d<kernels::FixedK<T, 12>>(x, cfg, num_sms, stream);
      case 2048: return launch_1d2d<kernels::FixedK<T, 16>>(x, cfg, num_sms, stream);
      case 4096: return launch_1d2d<kernels::FixedK<T, 32>>(x, cfg, num_sms, stream);
      default: break;
    }
  }
  launch_1d2d<T>(x, cfg, num_sms, stream);
}

template <class T>
void launch_swapab(const Fp8GemmArgs& x, const Config& cfg, void* workspace, int num_sms, cudaStream_t stream) {
  static_assert(T::kSmemFixed == smem_fixed_bytes(KernelKind::kSwapAB, T::BLOCK_TOK, T::BLOCK_W, T::kStages),
                "kernel shared-memory layout and heuristic disagree");
  static_assert(T::kAltK == swap_ab_k_split(KernelKind::kSwapAB, T::BLOCK_W), "kernel and heuristic disagree on kAltK");
  WatchdogParams watchdog = watchdog_params();
  const bool watched = watchdog_armed(watchdog);
  static std::atomic<uint64_t> smem_set[2] = {0, 0};
  auto kernel = watched ? kernels::sm90_fp8_gemm_swapab_kernel<T, true> : kernels::sm90_fp8_gemm_swapab_kernel<T, false>;
  ensure_max_smem(kernel, smem_set[watched]);

  const Problem p{x.m, x.n, x.k, num_sms};
  const TileGrid g = tile_grid(cfg, p);
  // Swapped roles: the token tile is the A box (BLOCK_TOK rows), the weight tile BLOCK_W rows.
  const Maps maps = make_maps(x, T::BLOCK_TOK, T::BLOCK_TOK, T::BLOCK_W, 64, T::BLOCK_TOK, 128);
  uint32_t* counters = nullptr;
  float* partials = nullptr;
  if (cfg.split_k > 1) {
    counters = static_cast<uint32_t*>(workspace);
    partials = reinterpret_cast<float*>(static_cast<char*>(workspace) + split_counter_bytes(x.n));
  }
  const auto smem = static_cast<size_t>(smem_bytes(cfg, x.k));
  watchdog.m = static_cast<uint32_t>(x.m);
  watchdog.n = static_cast<uint32_t>(x.n);
  watchdog.k = static_cast<uint32_t>(x.k);
  watchdog.split_k = static_cast<uint32_t>(cfg.split_k);
  gpu::launch_kernel({dim3(static_cast<unsigned>(g.grid)), dim3(T::kThreads), smem, stream}, kernel, maps.a,
                     maps.sfa, maps.b, maps.d, x.b_scales, static_cast<uint32_t>(x.m), static_cast<uint32_t>(x.n),
                     static_cast<uint32_t>(x.k), static_cast<uint32_t>(cfg.split_k), counters, partials,
                     reinterpret_cast<uint16_t*>(x.d), watchdog);
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

void check_pointer(const void* p, const char* name) {
  FP8PROJ_CHECK(p != nullptr, "sm90 FP8 GEMM: ", name, " is null");
  FP8PROJ_CHECK(aligned16(p), "sm90 FP8 GEMM: ", name, " must be 16-byte aligned (TMA), got ", p);
}

bool same_kernel(const Config& a, const Config& b) {
  return a.kind == b.kind && a.block_m == b.block_m && a.block_n == b.block_n && a.math_wgs == b.math_wgs &&
         a.stages == b.stages && a.cluster == b.cluster && a.cluster_on_n == b.cluster_on_n && a.carry == b.carry;
}

// The explicit instantiations: exactly kernel_family() (heuristic .cpp); each kernel's
// Config is read off its traits, so a configuration and its kernel cannot disagree.
using namespace kernels;
using Family = std::tuple<
    Gemm1d2dTraits<128, 128, 2, 5>, Gemm1d2dTraits<128, 192, 2, 4>, Gemm1d2dTraits<256, 128, 2, 3>,
    Gemm1d2dTraits<128, 96, 2, 7>, Gemm1d2dTraits<128, 112, 2, 6>, Gemm1d2dTraits<128, 160, 2, 5>,
    // 2-CTA clusters sharing B (along M), then A (along N)
    Gemm1d2dTraits<128, 128, 2, 5, 2>, Gemm1d2dTraits<256, 128, 2, 3, 2>, Gemm1d2dTraits<128, 192, 2, 4, 2>,
    Gemm1d2dTraits<128, 160, 2, 5, 2>, Gemm1d2dTraits<128, 96, 2, 7, 2, true>,
    Gemm1d2dTraits<128, 112, 2, 6, 2, true>, Gemm1d2dTraits<128, 128, 2, 5, 2, true>,
    Gemm1d2dTraits<128, 192, 2, 4, 2, true>,
    // one consumer warpgroup
    Gemm1d2dTraits<64, 128, 1, 8>, Gemm1d2dTraits<64, 32, 1, 15>, Gemm1d2dTraits<64, 48, 1, 14>,
    Gemm1d2dTraits<64, 64, 1, 12>, Gemm1d2dTraits<64, 96, 1, 10>, Gemm1d2dTraits<64, 112, 1, 9>,
    // carrying K block 0 of the next tile across the epilogue
    Gemm1d2dTraits<128, 128, 2, 5, 1, false, true>, Gemm1d2dTraits<128, 160, 2, 5, 1, false, true>,
    Gemm1d2dTraits<128, 192, 2, 4, 1, false, true>, Gemm1d2dTraits<256, 128, 2, 3, 1, false, true>,
    // swap-AB: tokens x 128 weight rows (2 x 64)
    SwapABTraits<16, 11>, SwapABTraits<32, 10>, SwapABTraits<64, 8>, SwapABTraits<128, 5>,
    // swap-AB: tokens x 64 weight rows, K split between the two warpgroups
    SwapABTraits<16, 14, 64>>;

template <class T>
constexpr bool kIsSwapAB = requires { T::BLOCK_TOK; };

// The Config naming kernel T, read off its traits.
template <class T>
Config config_of() {
  if constexpr (kIsSwapAB<T>) {
    return {KernelKind::kSwapAB, T::BLOCK_TOK, T::BLOCK_W, T::kMathWGs, T::kStages};
  } else {
    Config c{KernelKind::kGemm1d2d, T::BLOCK_M, T::BLOCK_N, T::kMathWGs, T::kStages};
    c.cluster = T::kCluster;
    c.cluster_on_n = T::kClusterOnN;
    c.carry = T::kCarry;
    return c;
  }
}

// Launches the kernel of the family that cfg names; false when there is none.
template <class... T>
bool launch_instantiated(std::tuple<T...>*, const Fp8GemmArgs& x, const Config& cfg, void* workspace, int num_sms,
                         cudaStream_t stream) {
  auto try_one = [&]<class U>(U*) {
    if (!same_kernel(cfg, config_of<U>())) return false;
    if constexpr (kIsSwapAB<U>)
      launch_swapab<U>(x, cfg, workspace, num_sms, stream);
    else
      launch_1d2d_for_k<U>(x, cfg, num_sms, stream);
    return true;
  };
  return (try_one(static_cast<T*>(nullptr)) || ...);
}

}  // namespace

void run(const Fp8GemmArgs& x, const Config& cfg, void* workspace, size_t workspace_size, int num_sms,
         cudaStream_t stream) {
  check_device_usable();
  const Problem p{x.m, x.n, x.k, num_sms};
  check_problem(p);
  if (x.m == 0) return;
  check_pointer(x.a, "A");
  check_pointer(x.a_scales, "a_scales");
  check_pointer(x.b, "B");
  check_pointer(x.b_scales, "b_scales");
  check_pointer(x.d, "D");
  FP8PROJ_CHECK(x.a_scale_ld >= x.m && x.a_scale_ld % 4 == 0, "sm90 FP8 GEMM: a_scale_ld must be >= M and a ",
                "multiple of 4 (16-byte rows for TMA), got a_scale_ld=", x.a_scale_ld, " for M=", x.m);
  const std::string why = why_illegal(cfg, p);
  FP8PROJ_CHECK(why.empty(), "sm90 FP8 GEMM: config ", cfg.name(), " cannot run M=", x.m, " N=", x.n, " K=", x.k,
                ": ", why);
  const size_t need = workspace_bytes(cfg, x.m, x.n, x.k);
  if (need > 0) {
    FP8PROJ_CHECK(workspace != nullptr && workspace_size >= need, "sm90 FP8 GEMM: config ", cfg.name(), " needs ",
                  need, " B of zero-initialised workspace, got ", workspace_size, " B at ", workspace);
    FP8PROJ_CHECK(aligned16(workspace), "sm90 FP8 GEMM: workspace must be 16-byte aligned, got ", workspace);
  }
  check_device_is_sm90();

  if (launch_instantiated(static_cast<Family*>(nullptr), x, cfg, workspace, num_sms, stream)) return;
  FP8PROJ_FAIL("sm90 FP8 GEMM: config ", cfg.name(), " is in kernel_family() but has no launcher in ",
               "sm90_fp8_gemm.cu (add its instantiation)");
}

}  // namespace fp8proj::sm90

// How many 2-CTA clusters at 227 KB shared memory / 384 threads run at once on this GPU:
// cudaOccupancyMaxActiveClusters vs a launch of N clusters that records when each CTA starts.
#include <cstdio>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>
__global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(384, 1) probe(unsigned long long* t, unsigned* smid, int spin_ns) {
  extern __shared__ char smem[];
  unsigned long long t0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  if (threadIdx.x == 0) {
    unsigned s; asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
    t[blockIdx.x] = t0; smid[blockIdx.x] = s; smem[0] = 1;
  }
  unsigned long long now = t0;
  while (now - t0 < (unsigned long long)spin_ns) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
}
int main() {
  int smem = 227 * 1024;
  cudaFuncSetAttribute(probe, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  for (int threads : {384, 256}) {
    cudaLaunchConfig_t lc{}; lc.gridDim = dim3(2); lc.blockDim = dim3(threads); lc.dynamicSmemBytes = smem;
    cudaLaunchAttribute a{}; a.id = cudaLaunchAttributeClusterDimension; a.val.clusterDim.x = 2; a.val.clusterDim.y = 1; a.val.clusterDim.z = 1;
    lc.attrs = &a; lc.numAttrs = 1;
    int n = -1; cudaError_t e = cudaOccupancyMaxActiveClusters(&n, (void*)probe, &lc);
    printf("threads %d: cudaOccupancyMaxActiveClusters = %d (%s)\n", threads, n, cudaGetErrorString(e));
  }
  int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  for (int clusters : {62, 64, 65, 66}) {
    unsigned long long* t; unsigned* s; cudaMalloc(&t, 8 * 2 * clusters); cudaMalloc(&s, 4 * 2 * clusters);
    probe<<<2 * clusters, 384, smem>>>(t, s, 200000);  // each CTA spins 200 us
    cudaError_t e = cudaDeviceSynchronize();
    std::vector<unsigned long long> h(2 * clusters); std::vector<unsigned> hs(2 * clusters);
    cudaMemcpy(h.data(), t, 8 * 2 * clusters, cudaMemcpyDeviceToHost); cudaMemcpy(hs.data(), s, 4 * 2 * clusters, cudaMemcpyDeviceToHost);
    auto mn = *std::min_element(h.begin(), h.end());
    int late = 0; unsigned long long mx = 0;
    for (auto v : h) { if (v - mn > 100000) ++late; mx = std::max(mx, v - mn); }
    std::sort(hs.begin(), hs.end()); int distinct = std::unique(hs.begin(), hs.end()) - hs.begin();
    printf("%d clusters (%d CTAs, %d SMs): %s; CTAs starting > 100 us after the first: %d; latest start %.1f us; distinct SMs %d\n",
           clusters, 2 * clusters, sms, cudaGetErrorString(e), late, mx / 1e3, distinct);
    cudaFree(t); cudaFree(s);
  }
}

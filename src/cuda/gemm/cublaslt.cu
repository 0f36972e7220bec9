// Shared cuBLASLt plumbing of the cublaslt_bf16 and cublaslt_fp8_block backends (see cublaslt.hpp).
#include "cuda/gemm/cublaslt.hpp"

#include <iterator>
#include <utility>

#include "core/cuda_check.hpp"

namespace fp8proj::lt {

namespace {

// Names of the tile and cluster enums of cublasLt.h for the values Hopper kernels report; other
// values print as their number.
const char* tile_name(int id) {
  static constexpr const char* kTiles[] = {
      "undefined", "8x8",    "8x16",    "16x8",    "8x32",    "16x16",  "32x8",    "8x64",   "16x32",
      "32x16",     "64x8",   "32x32",   "32x64",   "64x32",   "32x128", "64x64",   "128x32", "64x128",
      "128x64",    "64x256", "128x128", "256x64",  "64x512",  "128x256", "256x128", "512x64", "64x96",
      "96x64",     "96x128", "128x160", "160x128", "192x128", "128x192", "128x96"};
  return id >= 0 && id < static_cast<int>(std::size(kTiles)) ? kTiles[id] : nullptr;
}

const char* cluster_name(int id) {
  static constexpr const char* kClusters[] = {"auto",  "undefined", "1x1x1", "2x1x1", "4x1x1", "1x2x1",
                                              "2x2x1", "4x2x1",     "1x4x1", "2x4x1", "4x4x1"};
  return id >= 0 && id < static_cast<int>(std::size(kClusters)) ? kClusters[id] : nullptr;
}

template <typename T>
T algo_attr(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attr) {
  T value{};
  size_t written = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &value, sizeof(value), &written) != CUBLAS_STATUS_SUCCESS)
    return T{};
  return value;
}

std::string describe_algo(const cublasLtMatmulAlgo_t& algo, size_t workspace) {
  const int id = algo_attr<int>(algo, CUBLASLT_ALGO_CONFIG_ID);
  const int tile = static_cast<int>(algo_attr<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_TILE_ID));
  const int cluster = static_cast<int>(algo_attr<uint16_t>(algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID));
  const int stages = static_cast<int>(algo_attr<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_STAGES_ID));
  const int split_k = algo_attr<int>(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM);
  const char* t = tile_name(tile);
  const char* c = cluster_name(cluster);
  return detail::concat("cuBLASLt algo ", id, ", tile ", t ? t : "", t ? "" : "#", t ? "" : std::to_string(tile),
                        ", cluster ", c ? c : "", c ? "" : "#", c ? "" : std::to_string(cluster), ", stages #", stages,
                        ", split-K ", split_k, ", workspace ", workspace, " B");
}

}  // namespace

cublasLtHandle_t handle() {
  static std::mutex mutex;
  static std::map<int, cublasLtHandle_t> handles;
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mutex);
  cublasLtHandle_t& h = handles[device];
  if (h == nullptr) CUBLAS_CHECK(cublasLtCreate(&h));
  return h;
}

size_t version() { return cublasLtGetVersion(); }

uint32_t alignment(const void* p, int64_t pitch_bytes) {
  const uint64_t bits = reinterpret_cast<uintptr_t>(p) | static_cast<uint64_t>(pitch_bytes) | 256u;
  return static_cast<uint32_t>(bits & (~bits + 1));  // lowest set bit
}

MatmulDesc::MatmulDesc(cublasOperation_t trans_a, cublasOperation_t trans_b) {
  // fp32 accumulation and fp32 alpha/beta for both backends.
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc_, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  set(CUBLASLT_MATMUL_DESC_TRANSA, trans_a);
  set(CUBLASLT_MATMUL_DESC_TRANSB, trans_b);
}

MatmulDesc::~MatmulDesc() {
  if (desc_) cublasLtMatmulDescDestroy(desc_);
}

Layout::Layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld) {
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&layout_, type, static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), ld));
}

Layout::~Layout() {
  if (layout_) cublasLtMatrixLayoutDestroy(layout_);
}

Layout::Layout(Layout&& other) noexcept : layout_(std::exchange(other.layout_, nullptr)) {}

Layout& Layout::operator=(Layout&& other) noexcept {
  if (this != &other) {
    if (layout_) cublasLtMatrixLayoutDestroy(layout_);
    layout_ = std::exchange(other.layout_, nullptr);
  }
  return *this;
}

TnMatmul::TnMatmul(std::string what, cudaDataType_t ab_type, int64_t n, int64_t k, const void* weight)
    : what_(std::move(what)),
      ab_type_(ab_type),
      n_(n),
      k_(k),
      weight_(weight),
      align_a_(alignment(weight, k * (ab_type == CUDA_R_16BF ? 2 : 1))),
      handle_(handle()),
      desc_(CUBLAS_OP_T, CUBLAS_OP_N),
      a_(ab_type, k, n, k) {}

const TnMatmul::Algo& TnMatmul::algo(int64_t m, const void* x, const void* y) const {
  const int64_t elem = ab_type_ == CUDA_R_16BF ? 2 : 1;
  const uint32_t align_b = alignment(x, k_ * elem), align_d = alignment(y, n_ * 2);
  const auto key = std::make_tuple(m, align_b, align_d);
  std::lock_guard<std::mutex> lock(mutex_);
  if (auto it = cache_.find(key); it != cache_.end()) return it->second;

  Algo entry;
  entry.b = Layout(ab_type_, k_, m, k_);
  entry.d = Layout(CUDA_R_16BF, n_, m, n_);
  cublasLtMatmulPreference_t pref = nullptr;
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t workspace = kWorkspaceBytes;
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof(workspace));
  // Without these cuBLASLt assumes 256-byte aligned operands and may pick a kernel that fails on
  // a 16-byte aligned sub-view; the cache key keeps well-aligned calls on the fastest kernels.
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a_, sizeof(uint32_t));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof(uint32_t));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_d, sizeof(uint32_t));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d, sizeof(uint32_t));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(handle_, desc_.get(), a_.get(), entry.b.get(),
                                                               entry.d.get(), entry.d.get(), pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  FP8PROJ_CHECK(status == CUBLAS_STATUS_SUCCESS && found > 0, what_, ": cuBLASLt ", version(),
                " has no algorithm for M=", m, " N=", n_, " K=", k_, " (operand alignment ", align_a_, "/", align_b,
                "/", align_d, " bytes): ", cublasGetStatusString(status));
  entry.algo = result.algo;
  entry.description = describe_algo(result.algo, result.workspaceSize);
  return cache_.emplace(key, std::move(entry)).first->second;
}

void TnMatmul::run(const Algo& algo, const void* x, void* y, void* workspace, cudaStream_t stream) const {
  const float alpha = 1.0f, beta = 0.0f;
  CUBLAS_CHECK(cublasLtMatmul(handle_, desc_.get(), &alpha, weight_, a_.get(), x, algo.b.get(), &beta, y,
                              algo.d.get(), y, algo.d.get(), &algo.algo, workspace, kWorkspaceBytes, stream));
}

std::string TnMatmul::describe(int64_t m) const {
  // The algorithm a 256-byte aligned call (cudaMalloc'd buffers) gets.
  const void* aligned = reinterpret_cast<const void*>(uintptr_t{256});
  return algo(m, aligned, aligned).description;
}

}  // namespace fp8proj::lt

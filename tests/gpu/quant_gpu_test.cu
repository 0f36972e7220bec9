// The GPU quantizers (src/cuda/quant/) against the CPU reference, bit for bit: activation
// quantization, RMSNorm, fused RMSNorm + quantization and weight quantization, on shapes with
// every kind of tail (M odd or below one tile, K not a multiple of the tile width, N and K not
// multiples of 128 for weights), non-finite inputs and bad arguments. Plus the exhaustive check
// that the hardware e4m3 conversion equals float_to_e4m3, and the activation quantizer's
// bandwidth against a device-to-device copy of the same bytes.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "cuda/quant/fp8_group_quant.cuh"
#include "fp8proj/error.hpp"
#include "fp8proj/formats.hpp"
#include "fp8proj/ops.hpp"
#include "fp8proj/quantize.hpp"
#include "fp8proj/timing.hpp"
#include "gpu_test_util.hpp"
#include "quant/silu_exact.hpp"

namespace fp8proj {
namespace {

using testing::bits_of;
using testing::GpuTest;
using testing::poisoned;
using testing::to_device;
using testing::to_host;

constexpr uint32_t kPoisonBits = 0xffffffffu;  // fp32 pattern of a 0xff-poisoned scale

const QuantOps& device_ops() { return quant_ops(MemorySpace::device); }

// A stream of its own, so the ops are exercised on a non-default stream.
class Stream {
 public:
  Stream() { EXPECT_EQ(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking), cudaSuccess); }
  ~Stream() { cudaStreamDestroy(s_); }
  StreamHandle handle() const { return s_; }
  void sync() const { ASSERT_EQ(cudaStreamSynchronize(s_), cudaSuccess); }

 private:
  cudaStream_t s_ = nullptr;
};

// ---- the hardware conversion ---------------------------------------------------------------

struct CvtMismatch {
  uint32_t bits;     // the fp32 input
  uint32_t hw, ref;  // hardware result, reference result
};

// The e4m3 conversion the quantizers use against float_to_e4m3, on finite inputs.
struct E4m3Cvt {
  __device__ bool operator()(uint32_t bits, uint32_t& hw, uint32_t& ref) const {
    const float x = __uint_as_float(bits);
    if (!is_finite_float(x)) return true;
    hw = gpu::e4m3_code(x);
    ref = float_to_e4m3(x);
    return hw == ref;
  }
};

// The bf16 rounding of the RMSNorm kernels against float_to_bf16: equal bits on finite inputs
// (overflow to Inf included), a NaN for a NaN.
struct Bf16Cvt {
  __device__ bool operator()(uint32_t bits, uint32_t& hw, uint32_t& ref) const {
    const float x = __uint_as_float(bits);
    hw = gpu::bf16x2_rn(x, 0.0f) & 0xffffu;
    ref = float_to_bf16(x).bits;
    if (x != x) return (hw & 0x7fffu) > 0x7f80u;
    return hw == ref;
  }
};

template <typename Check>
__global__ void cvt_exhaustive_kernel(Check check, unsigned long long* count, CvtMismatch* examples, int max_examples) {
  const uint64_t stride = uint64_t{gridDim.x} * blockDim.x;
  for (uint64_t i = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; i <= 0xffffffffull; i += stride) {
    uint32_t hw = 0, ref = 0;
    if (check(static_cast<uint32_t>(i), hw, ref)) continue;
    const unsigned long long slot = atomicAdd(count, 1ull);
    if (slot < static_cast<unsigned long long>(max_examples)) examples[slot] = {static_cast<uint32_t>(i), hw, ref};
  }
}

// Runs `check` on all 2^32 fp32 bit patterns (~10 ms on an H200); fails with the first examples.
template <typename Check>
void expect_all_floats(Check check, const char* what) {
  constexpr int kExamples = 16;
  Buffer count(MemorySpace::device, sizeof(unsigned long long));
  Buffer examples(MemorySpace::device, kExamples * sizeof(CvtMismatch));
  fill_bytes(MemorySpace::device, count.data(), count.bytes(), 0);
  cvt_exhaustive_kernel<<<current_device().sm_count * 8, 256>>>(check, count.data<unsigned long long>(),
                                                                 examples.data<CvtMismatch>(), kExamples);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto n = to_host<unsigned long long>(count.data(), 1)[0];
  const auto ex = to_host<CvtMismatch>(examples.data(), kExamples);
  for (unsigned long long i = 0; i < std::min<unsigned long long>(n, kExamples); ++i)
    ADD_FAILURE() << what << ": fp32 bits 0x" << std::hex << ex[i].bits << ": hardware 0x" << ex[i].hw
                  << ", reference 0x" << ex[i].ref;
  EXPECT_EQ(n, 0u) << what << ": fp32 inputs where the hardware conversion differs from the reference";
}

__global__ void cvt_pack_kernel(const float* in, uint32_t* out) {
  out[0] = gpu::e4m3x4(in[0], in[1], in[2], in[3]);
  out[1] = gpu::bf16x2_rn(in[0], in[1]);
}

// The kernels convert with cvt.rn.satfinite.e4m3x2.f32 and cvt.rn.bf16x2.f32; formats.hpp and
// bf16.hpp are the definitions. They must agree on every finite fp32 value (ties, subnormals,
// saturation / overflow, -0). If these fail, the quantizers and RMSNorm are not bit-exact: see
// src/cuda/quant/fp8_group_quant.cuh.
class Fp8Convert : public GpuTest {};
class Bf16Convert : public GpuTest {};

TEST_F(Fp8Convert, HardwareCvtMatchesReferenceOnAllFloats) { expect_all_floats(E4m3Cvt{}, "e4m3"); }

TEST_F(Bf16Convert, HardwareCvtMatchesReferenceOnAllFloats) { expect_all_floats(Bf16Cvt{}, "bf16"); }

TEST_F(Fp8Convert, PacksValueJIntoByteJ) {
  const std::vector<float> in = {1.0f, -2.0f, 0.015625f, 448.0f};
  Buffer d_in = to_device(in), d_out(MemorySpace::device, 2 * sizeof(uint32_t));
  cvt_pack_kernel<<<1, 1>>>(d_in.data<float>(), d_out.data<uint32_t>());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto packed = to_host<uint32_t>(d_out.data(), 2);
  for (int j = 0; j < 4; ++j) EXPECT_EQ((packed[0] >> (8 * j)) & 0xffu, float_to_e4m3(in[j])) << "e4m3 byte " << j;
  EXPECT_EQ(packed[1] & 0xffffu, float_to_bf16(in[0]).bits) << "bf16 low half";
  EXPECT_EQ(packed[1] >> 16, float_to_bf16(in[1]).bits) << "bf16 high half";
}

// ---- activations -----------------------------------------------------------------------------

// Runs the device quantizer (or the fused norm+quantizer) into 0xff-poisoned buffers and checks
// every byte against the CPU result `ref`: values, scales of rows < M bit for bit, the pads
// [M, round_up(M, 4)) equal to 1.0f, and nothing written at or past round_up(M, 4) when the
// caller's scale_ld is larger.
void expect_matches(const HostFp8Activation& ref, const Buffer& values, const Buffer& scales, int64_t scale_ld,
                    const std::vector<bf16>& x, const std::string& what) {
  const int64_t m = ref.m, k = ref.k, groups = k / 128;
  const auto got_v = to_host<uint8_t>(values.data(), static_cast<size_t>(m * k));
  const auto got_s = to_host<float>(scales.data(), static_cast<size_t>(groups * scale_ld));
  int64_t bad_values = 0, bad_scales = 0;
  for (int64_t i = 0; i < m * k; ++i)
    if (got_v[i] != ref.values[i] && bad_values++ < 8)
      ADD_FAILURE() << what << ": value (" << i / k << ", " << i % k << ") of input bf16 0x" << std::hex << x[i].bits
                    << ": GPU 0x" << int(got_v[i]) << ", CPU 0x" << int(ref.values[i]);
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t r = 0; r < scale_ld; ++r) {
      const uint32_t got = bits_of(got_s[g * scale_ld + r]);
      const uint32_t want = r < m ? bits_of(ref.scales[g * ref.scale_ld + r])  // the CPU's scale
                            : r < round_up(m, 4) ? bits_of(1.0f)                 // pad
                                                 : kPoisonBits;                   // not ours to write
      if (got != want && bad_scales++ < 8)
        ADD_FAILURE() << what << ": scale (group " << g << ", row " << r << ") bits 0x" << std::hex << got
                      << ", expected 0x" << want;
    }
  EXPECT_EQ(bad_values, 0) << what << ": e4m3 values differing from the CPU";
  EXPECT_EQ(bad_scales, 0) << what << ": scale entries differing (rows < M: CPU; pads: 1.0f; past the pads: untouched)";
}

using Shape = std::pair<int64_t, int64_t>;
std::string shape_name(const ::testing::TestParamInfo<Shape>& info) {
  return std::to_string(info.param.first) + "x" + std::to_string(info.param.second);
}

// (M, K): M from 1 to 5000, odd and below/around the 32-row tile; K a multiple of 128 but not
// always of the 512-column tile; the model widths 1536, 2048, 7168 and 16384.
const std::vector<Shape> kActivationShapes = {
    {1, 128},   {1, 16384}, {2, 384},   {3, 640},    {4, 128},    {5, 256},  {7, 1536},
    {31, 2048}, {32, 512},  {33, 896},  {100, 7168}, {257, 1152}, {1000, 2048}, {4099, 384}, {5000, 1664},
};

class ActivationQuantGpu : public GpuTest, public ::testing::WithParamInterface<Shape> {};

// Both scale formats: UE8M0 (the layer's default) and fp32 amax/448 (ScaleMode::fp32, the rule
// the FP8-checkpoint path quantizes activations with), each bit-exact with its CPU reference.
TEST_P(ActivationQuantGpu, BitExactWithCpu) {
  const auto [m, k] = GetParam();
  const Stream stream;
  for (const ScaleMode mode : {ScaleMode::ue8m0, ScaleMode::fp32})
    for (int variant = 0; variant < 2; ++variant) {
      // variant 0: wide-range values (subnormals, ties, flush to zero); 1: Gaussian rows.
      const auto x = variant == 0 ? testing::wide_range_bf16(m, k, uint32_t(m * 131 + k))
                                  : testing::normal_rows_bf16(m, k, uint32_t(m * 7 + k));
      HostFp8Activation ref = make_host_fp8_activation(m, k);
      cpu::quantize_activation(x.data(), m, k, ref.out(), mode);

      const int64_t scale_ld = activation_scale_ld(m) + 8 * variant;  // variant 1: a wider caller stride
      Buffer d_x = to_device(x);
      Buffer values = poisoned(static_cast<size_t>(m * k)), scales = poisoned(static_cast<size_t>(k / 128 * scale_ld) * 4);
      const Fp8ActivationOut out{values.data<uint8_t>(), scales.data<float>(), m, k, scale_ld};
      device_ops().quantize_activation(d_x.data<bf16>(), m, k, out, mode, stream.handle());
      stream.sync();
      expect_matches(ref, values, scales, scale_ld, x,
                     std::string(scale_mode_name(mode)) + " scales, variant " + std::to_string(variant));
    }
}

INSTANTIATE_TEST_SUITE_P(Shapes, ActivationQuantGpu, ::testing::ValuesIn(kActivationShapes), shape_name);

// Non-finite inputs: a NaN, +Inf or -Inf anywhere in a group makes that group's scale NaN and all
// its codes 0x7f; the other groups of the row are untouched. One row is entirely NaN.
class ActivationQuantGpuEdge : public GpuTest {};

TEST_F(ActivationQuantGpuEdge, NonFiniteGroups) {
  const int64_t m = 37, k = 1024;
  auto x = testing::normal_rows_bf16(m, k, 99);
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  x[0 * k + 5] = float_to_bf16(nan);
  x[3 * k + 130] = float_to_bf16(inf);
  x[3 * k + 1023] = float_to_bf16(-inf);
  x[36 * k + 777] = bf16::from_bits(0xff81);  // a NaN with sign and payload
  for (int64_t j = 0; j < k; ++j) x[20 * k + j] = float_to_bf16(nan);
  for (const ScaleMode mode : {ScaleMode::ue8m0, ScaleMode::fp32}) {
    HostFp8Activation ref = make_host_fp8_activation(m, k);
    cpu::quantize_activation(x.data(), m, k, ref.out(), mode);
    ASSERT_TRUE(std::isnan(ref.scales[0 * ref.scale_ld + 0]));  // the CPU reference does flag it

    Buffer d_x = to_device(x);
    Buffer values = poisoned(m * k), scales = poisoned(static_cast<size_t>(k / 128 * ref.scale_ld) * 4);
    device_ops().quantize_activation(d_x.data<bf16>(), m, k,
                                     {values.data<uint8_t>(), scales.data<float>(), m, k, ref.scale_ld}, mode, nullptr);
    device_ops().synchronize(nullptr);
    expect_matches(ref, values, scales, ref.scale_ld, x, std::string("non-finite, ") + scale_mode_name(mode));
  }
}

class DeviceQuantOpsArgs : public GpuTest {};

TEST_F(DeviceQuantOpsArgs, ActivationNormAndEmptyBatch) {
  const int64_t m = 8, k = 256;
  Buffer x(MemorySpace::device, m * k * 2), values(MemorySpace::device, m * k + 16),
      scales(MemorySpace::device, (k / 128) * m * 4 + 16);
  const Fp8ActivationOut out{values.data<uint8_t>(), scales.data<float>(), m, k, m};
  const auto& ops = device_ops();
  EXPECT_THROW(ops.quantize_activation(nullptr, m, k, out, nullptr), Error);
  EXPECT_THROW(ops.quantize_activation(x.data<bf16>() + 1, m, k, out, nullptr), Error);  // 2-byte misaligned
  Fp8ActivationOut bad = out;
  bad.values += 8;
  EXPECT_THROW(ops.quantize_activation(x.data<bf16>(), m, k, bad, nullptr), Error);
  bad = out;
  bad.scales += 1;
  EXPECT_THROW(ops.quantize_activation(x.data<bf16>(), m, k, bad, nullptr), Error);
  EXPECT_THROW(ops.quantize_activation(x.data<bf16>(), m, 200, out, nullptr), Error);  // K % 128 != 0
  // M = 0 is a no-op: nothing is read or written, null pointers included.
  EXPECT_NO_THROW(ops.quantize_activation(nullptr, 0, k, {nullptr, nullptr, 0, k, 0}, nullptr));
  EXPECT_NO_THROW(ops.rmsnorm_quantize(nullptr, k, nullptr, 1e-6f, 0, k, {nullptr, nullptr, 0, k, 0}, nullptr));
  EXPECT_NO_THROW(ops.rmsnorm(nullptr, k, nullptr, 1e-6f, 0, k, nullptr, nullptr));
  EXPECT_THROW(ops.rmsnorm(x.data<bf16>(), k, nullptr, 1e-6f, m, k, x.data<bf16>(), nullptr), Error);
  EXPECT_THROW(ops.rmsnorm(x.data<bf16>(), k, x.data<bf16>() + 4, 1e-6f, m, k, x.data<bf16>(), nullptr), Error);
}

// ---- silu(gate) * up, quantized (a gated MLP's down_proj input) -----------------------------------
// (M, K): odd M around the 32-row tile; K the dense intermediate sizes of GLM-5 (12288) and
// DeepSeek-V3 (18432) and widths that are not multiples of the 512-column tile.
const std::vector<Shape> kSiluShapes = {{1, 128}, {5, 256},   {33, 2048}, {100, 7168},
                                        {257, 12288}, {4099, 384}, {3, 18432}, {64, 640}};

class SiluMulQuantGpu : public GpuTest, public ::testing::WithParamInterface<Shape> {};

// Against cpu::silu_mul_quantize, bit for bit (silu_exact: the same exp on both sides), gate and up
// both as the two column halves of one [M, 2K] buffer (a fused gate_up GEMM's output, stride 2K)
// and as separate dense tensors.
TEST_P(SiluMulQuantGpu, MatchesCpu) {
  const auto [m, k] = GetParam();
  auto gu = testing::normal_rows_bf16(m, 2 * k, uint32_t(11 * m + k));
  for (auto& v : gu) v = float_to_bf16(3.0f * bf16_to_float(v));  // silu's curved range: |g| up to ~12
  if (m > 2) {
    gu[1 * 2 * k + 7] = float_to_bf16(std::numeric_limits<float>::quiet_NaN());        // a NaN gate
    gu[2 * 2 * k + k + 200 % k] = float_to_bf16(std::numeric_limits<float>::infinity());  // an Inf up
    gu[2 * 2 * k + 200 % k] = float_to_bf16(1.0f);  // its gate nonzero: silu(1) * Inf = Inf
  }
  std::vector<bf16> gate(static_cast<size_t>(m * k)), up(gate.size());
  for (int64_t r = 0; r < m; ++r) {
    std::copy_n(gu.begin() + r * 2 * k, k, gate.begin() + r * k);
    std::copy_n(gu.begin() + r * 2 * k + k, k, up.begin() + r * k);
  }
  Buffer d_gu = to_device(gu), d_gate = to_device(gate), d_up = to_device(up);
  for (const ScaleMode mode : {ScaleMode::ue8m0, ScaleMode::fp32})
    for (const bool strided : {true, false}) {
      HostFp8Activation ref = make_host_fp8_activation(m, k);
      if (strided)
        cpu::silu_mul_quantize(gu.data(), gu.data() + k, 2 * k, m, k, ref.out(), mode);
      else
        cpu::silu_mul_quantize(gate.data(), up.data(), k, m, k, ref.out(), mode);
      Buffer values = poisoned(static_cast<size_t>(m * k));
      Buffer scales = poisoned(static_cast<size_t>(k / 128 * ref.scale_ld) * 4);
      const Stream stream;
      const Fp8ActivationOut out{values.data<uint8_t>(), scales.data<float>(), m, k, ref.scale_ld};
      if (strided)
        device_ops().silu_mul_quantize(d_gu.data<bf16>(), d_gu.data<bf16>() + k, 2 * k, m, k, out, mode,
                                       stream.handle());
      else
        device_ops().silu_mul_quantize(d_gate.data<bf16>(), d_up.data<bf16>(), k, m, k, out, mode, stream.handle());
      stream.sync();
      const auto got = to_host<uint8_t>(values.data(), static_cast<size_t>(m * k));
      const auto got_s = to_host<uint32_t>(scales.data(), static_cast<size_t>(k / 128 * ref.scale_ld));
      int64_t bad_values = 0, bad_scales = 0, pads = 0;
      for (int64_t i = 0; i < m * k; ++i) bad_values += got[i] != ref.values[i];
      for (int64_t g = 0; g < k / 128; ++g) {
        for (int64_t r = 0; r < m; ++r) {
          uint32_t want;
          std::memcpy(&want, &ref.scales[g * ref.scale_ld + r], 4);
          const uint32_t have = got_s[g * ref.scale_ld + r];
          bad_scales += have != want && !(std::isnan(ref.scales[g * ref.scale_ld + r]) && (have & 0x7fffffffu) > 0x7f800000u);
        }
        for (int64_t r = m; r < round_up(m, 4); ++r) pads += got_s[g * ref.scale_ld + r] != 0x3f800000u;
      }
      const std::string what = std::string(scale_mode_name(mode)) + (strided ? ", strided" : ", dense");
      EXPECT_EQ(bad_values, 0) << what << ": codes differing from the CPU";
      EXPECT_EQ(bad_scales, 0) << what << ": scales differing from the CPU";
      EXPECT_EQ(pads, 0) << what << ": scale pads must be 1.0f";
      if (m > 2) {
        EXPECT_EQ(got[1 * k + 7], 0x7f) << what << ": a NaN gate makes its group NaN";
        EXPECT_EQ(got[2 * k + 200 % k], 0x7f) << what << ": an Inf up makes its group NaN";
      }
    }
}

INSTANTIATE_TEST_SUITE_P(Shapes, SiluMulQuantGpu, ::testing::ValuesIn(kSiluShapes), shape_name);

__global__ void silu_exact_kernel(float* out) {
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  out[i] = detail::silu_exact(bf16_to_float(bf16::from_bits(static_cast<uint16_t>(i))));
}

// silu_exact on the device gives the host's bits for every bf16 gate (the quantizer's codes alone
// could hide a last-bit difference: e4m3 keeps 3 mantissa bits). Then the quantizer itself over
// every bf16 gate (up = 1, so the codes are those of bf16(silu(g))), NaN and Inf gates included.
TEST_F(GpuTest, SiluExactSameBitsAsTheHostForEveryBf16Gate) {
  constexpr int64_t kAll = 65536;
  Buffer d(MemorySpace::device, kAll * 4);
  silu_exact_kernel<<<kAll / 256, 256>>>(d.data<float>());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto dev = to_host<uint32_t>(d.data(), kAll);
  int64_t bad = 0;
  for (int64_t i = 0; i < kAll; ++i) {
    const uint32_t host = float_bits(detail::silu_exact(bf16_to_float(bf16::from_bits(static_cast<uint16_t>(i)))));
    const bool both_nan = (host & 0x7fffffffu) > 0x7f800000u && (dev[i] & 0x7fffffffu) > 0x7f800000u;
    if (dev[i] != host && !both_nan && bad++ < 8)
      ADD_FAILURE() << "gate bits 0x" << std::hex << i << ": device 0x" << dev[i] << ", host 0x" << host;
  }
  EXPECT_EQ(bad, 0);

  const int64_t m = 64, k = 1024;  // m * k = every bf16 pattern once, as gates
  std::vector<bf16> gate(kAll), up(kAll, float_to_bf16(1.0f));
  for (int64_t i = 0; i < kAll; ++i) gate[i] = bf16::from_bits(static_cast<uint16_t>(i));
  const Buffer d_gate = to_device(gate), d_up = to_device(up);
  for (const ScaleMode mode : {ScaleMode::ue8m0, ScaleMode::fp32}) {
    HostFp8Activation ref = make_host_fp8_activation(m, k);
    cpu::silu_mul_quantize(gate.data(), up.data(), k, m, k, ref.out(), mode);
    Buffer values = poisoned(static_cast<size_t>(m * k)), scales = poisoned(static_cast<size_t>(k / 128 * ref.scale_ld) * 4);
    device_ops().silu_mul_quantize(d_gate.data<bf16>(), d_up.data<bf16>(), k, m, k,
                                   {values.data<uint8_t>(), scales.data<float>(), m, k, ref.scale_ld}, mode, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(to_host<uint8_t>(values.data(), static_cast<size_t>(m * k)), ref.values) << scale_mode_name(mode);
    const auto got_s = to_host<uint32_t>(scales.data(), static_cast<size_t>(k / 128 * ref.scale_ld));
    int64_t bad_s = 0;
    for (size_t i = 0; i < got_s.size(); ++i) {
      uint32_t want;
      std::memcpy(&want, &ref.scales[i], 4);
      bad_s += got_s[i] != want && !(std::isnan(ref.scales[i]) && (got_s[i] & 0x7fffffffu) > 0x7f800000u);
    }
    EXPECT_EQ(bad_s, 0) << scale_mode_name(mode);
  }
}

TEST_F(DeviceQuantOpsArgs, SiluMul) {
  const int64_t m = 8, k = 256;
  Buffer x(MemorySpace::device, 2 * m * k * 2), values(MemorySpace::device, m * k + 16),
      scales(MemorySpace::device, (k / 128) * m * 4 + 16);
  const Fp8ActivationOut out{values.data<uint8_t>(), scales.data<float>(), m, k, m};
  const auto& ops = device_ops();
  const bf16* g = x.data<bf16>();
  EXPECT_THROW(ops.silu_mul_quantize(nullptr, g + k, 2 * k, m, k, out, ScaleMode::fp32, nullptr), Error);
  EXPECT_THROW(ops.silu_mul_quantize(g, nullptr, 2 * k, m, k, out, ScaleMode::fp32, nullptr), Error);
  EXPECT_THROW(ops.silu_mul_quantize(g, g + 1, 2 * k, m, k, out, ScaleMode::fp32, nullptr), Error);  // misaligned up
  EXPECT_THROW(ops.silu_mul_quantize(g, g + k, k - 8, m, k, out, ScaleMode::fp32, nullptr), Error);  // stride < K
  EXPECT_THROW(ops.silu_mul_quantize(g, g + k, 2 * k + 4, m, k, out, ScaleMode::fp32, nullptr), Error);  // 8-byte rows
  EXPECT_THROW(ops.silu_mul_quantize(g, g + k, 2 * k, m, 200, out, ScaleMode::fp32, nullptr), Error);   // K % 128
  EXPECT_NO_THROW(ops.silu_mul_quantize(nullptr, nullptr, k, 0, k, {nullptr, nullptr, 0, k, 0}, ScaleMode::fp32,
                                        nullptr));
}

// ---- RMSNorm ---------------------------------------------------------------------------------

std::vector<bf16> norm_weight(int64_t k, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(1.0f, 0.3f);
  std::vector<bf16> w(static_cast<size_t>(k));
  for (auto& v : w) v = float_to_bf16(d(rng));
  return w;
}

// (M, K): K from one chunk per row (8) to the streamed path above 2048 (8 chunks per lane).
const std::vector<Shape> kNormShapes = {{1, 8},     {3, 64},    {8, 136},  {9, 1536},  {100, 2048},
                                        {13, 2056}, {64, 4096}, {5, 16384}, {1000, 512}, {2049, 1536}};

class RmsNormGpu : public GpuTest, public ::testing::WithParamInterface<Shape> {};

// Rows of x are x_stride apart: dense when M % 4 == 0, otherwise a view into wider rows (as the
// q_a columns of fused_qkv_a's output are); the padding holds data that must be ignored.
int64_t norm_row_stride(int64_t m, int64_t k) { return k + 8 * (m % 4); }

TEST_P(RmsNormGpu, BitExactWithCpu) {
  const auto [m, k] = GetParam();
  const int64_t xs = norm_row_stride(m, k);
  auto x = testing::normal_rows_bf16(m, xs, uint32_t(m + 3 * k));
  if (m > 2) {  // a NaN row and an Inf row: NaN payloads differ between CPU and GPU, NaN-ness must not
    x[1 * xs + k / 2] = float_to_bf16(std::numeric_limits<float>::quiet_NaN());
    x[2 * xs] = float_to_bf16(-std::numeric_limits<float>::infinity());
  }
  const auto w = norm_weight(k, uint32_t(k));
  std::vector<bf16> ref(static_cast<size_t>(m * k));
  cpu::rmsnorm(x.data(), xs, w.data(), kRmsNormEps, m, k, ref.data());

  Buffer d_x = to_device(x), d_w = to_device(w), d_y = poisoned(static_cast<size_t>(m * k) * 2);
  const Stream stream;
  device_ops().rmsnorm(d_x.data<bf16>(), xs, d_w.data<bf16>(), kRmsNormEps, m, k, d_y.data<bf16>(), stream.handle());
  stream.sync();
  const auto got = to_host<bf16>(d_y.data(), static_cast<size_t>(m * k));
  int64_t bad = 0;
  for (int64_t i = 0; i < m * k; ++i) {
    const bool both_nan = std::isnan(bf16_to_float(got[i])) && std::isnan(bf16_to_float(ref[i]));
    if (got[i].bits != ref[i].bits && !both_nan && bad++ < 8)
      ADD_FAILURE() << "y(" << i / k << ", " << i % k << "): GPU 0x" << std::hex << got[i].bits << ", CPU 0x"
                    << ref[i].bits;
  }
  EXPECT_EQ(bad, 0) << "bf16 outputs differing from the CPU (x_stride " << xs << ")";
}

INSTANTIATE_TEST_SUITE_P(Shapes, RmsNormGpu, ::testing::ValuesIn(kNormShapes), shape_name);

// (M, K): the q_lora ranks 1536 / 2048, K above the register-cached 2048, odd M; the hidden
// sizes 6144 / 7168 (four warps, two rows per CTA) at M = 1, 5 and 6, whose scale pads lie in a
// CTA of their own (M % 4 = 1 or 2).
const std::vector<Shape> kFusedShapes = {{1, 128},    {2, 1536},  {7, 2048},   {9, 384},
                                         {33, 2048},  {100, 1536}, {31, 4096}, {1000, 2048},
                                         {4097, 1536}, {3, 7168},  {1, 7168},  {5, 6144},
                                         {6, 7168}};

class RmsNormQuantGpu : public GpuTest, public ::testing::WithParamInterface<Shape> {};

TEST_P(RmsNormQuantGpu, BitExactWithCpu) {
  const auto [m, k] = GetParam();
  const int64_t xs = norm_row_stride(m, k);
  auto x = testing::normal_rows_bf16(m, xs, uint32_t(5 * m + k));
  if (m > 2) {
    x[0 * xs + 3] = float_to_bf16(std::numeric_limits<float>::quiet_NaN());  // whole row NaN
    x[2 * xs + k - 1] = float_to_bf16(std::numeric_limits<float>::infinity());  // one NaN group, rest zeros
  }
  const auto w = norm_weight(k, uint32_t(2 * k));
  Buffer d_x = to_device(x), d_w = to_device(w);
  std::vector<bf16> dense(static_cast<size_t>(m * k));  // the input rows, for the failure messages
  for (int64_t r = 0; r < m; ++r) std::copy_n(x.begin() + r * xs, k, dense.begin() + r * k);
  // Both scale formats: UE8M0 (fp8proj's own copies) and fp32 amax/448 (an FP8 checkpoint's
  // FP8Linear takes its input that way).
  for (const ScaleMode mode : {ScaleMode::ue8m0, ScaleMode::fp32}) {
    HostFp8Activation ref = make_host_fp8_activation(m, k);
    cpu::rmsnorm_quantize(x.data(), xs, w.data(), kRmsNormEps, m, k, ref.out(), mode);
    Buffer values = poisoned(static_cast<size_t>(m * k));
    Buffer scales = poisoned(static_cast<size_t>(k / 128 * ref.scale_ld) * 4);
    const Stream stream;
    device_ops().rmsnorm_quantize(d_x.data<bf16>(), xs, d_w.data<bf16>(), kRmsNormEps, m, k,
                                  {values.data<uint8_t>(), scales.data<float>(), m, k, ref.scale_ld}, mode,
                                  stream.handle());
    stream.sync();
    expect_matches(ref, values, scales, ref.scale_ld, dense,
                   std::string("fused, ") + scale_mode_name(mode) + ", x_stride " + std::to_string(xs));
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, RmsNormQuantGpu, ::testing::ValuesIn(kFusedShapes), shape_name);

// ---- weights ---------------------------------------------------------------------------------

// (N, K): partial edge blocks in either dimension, K % 8 != 0 (the element path), one 128x128
// block, a model shape.
const std::vector<Shape> kWeightShapes = {{128, 128}, {1, 1},     {300, 200},  {129, 257},
                                          {256, 640}, {200, 1000}, {1536, 7168}, {3, 4100},
                                          {2624, 1024}, {576, 512}, {2112, 256}};  // fused_qkv_a, kv_a: partial last row block

class WeightQuantGpu : public GpuTest, public ::testing::WithParamInterface<Shape> {};

// Both scale formats of the private copy (ProjectionOptions::weight_scales), and for the fp32 one
// a Gaussian weight too (the wide-range one mostly exercises tiny and huge blocks).
TEST_P(WeightQuantGpu, BitExactWithCpu) {
  const auto [n, k] = GetParam();
  for (const ScaleMode mode : {ScaleMode::ue8m0, ScaleMode::fp32})
    for (int variant = 0; variant < (mode == ScaleMode::fp32 ? 2 : 1); ++variant) {
      auto w = variant == 0 ? testing::wide_range_bf16(n, k, uint32_t(n * 17 + k))
                            : testing::normal_rows_bf16(n, k, uint32_t(n * 5 + k));
      // Non-finite blocks: a NaN in block (0, 0), an Inf in the last block.
      w[0] = float_to_bf16(std::numeric_limits<float>::quiet_NaN());
      if (n * k > 1) w[n * k - 1] = float_to_bf16(-std::numeric_limits<float>::infinity());
      HostFp8Weight ref = make_host_fp8_weight(n, k);
      cpu::quantize_weight(w.data(), n, k, ref.out(), mode);
      const std::string what = std::string(scale_mode_name(mode)) + " scales, variant " + std::to_string(variant);

      Buffer d_w = to_device(w);
      Buffer values = poisoned(static_cast<size_t>(n * k)), scales = poisoned(ref.scales.size() * 4);
      const Stream stream;
      device_ops().quantize_weight(d_w.data<bf16>(), n, k, {values.data<uint8_t>(), scales.data<float>(), n, k}, mode,
                                   stream.handle());
      device_ops().synchronize(stream.handle());
      const auto got_v = to_host<uint8_t>(values.data(), static_cast<size_t>(n * k));
      const auto got_s = to_host<float>(scales.data(), ref.scales.size());
      for (size_t b = 0; b < ref.scales.size(); ++b)
        EXPECT_EQ(bits_of(got_s[b]), bits_of(ref.scales[b])) << what << ": block " << b / ceil_div(k, 128) << ", "
                                                             << b % ceil_div(k, 128);
      int bad = 0;
      for (int64_t i = 0; i < n * k && bad < 8; ++i)
        if (got_v[i] != ref.values[i]) {
          ADD_FAILURE() << what << ": value (" << i / k << ", " << i % k << ") input 0x" << std::hex << w[i].bits
                        << ": GPU 0x" << int(got_v[i]) << ", CPU 0x" << int(ref.values[i]);
          ++bad;
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Shapes, WeightQuantGpu, ::testing::ValuesIn(kWeightShapes), shape_name);

TEST_F(DeviceQuantOpsArgs, Weight) {
  Buffer w(MemorySpace::device, 256 * 256 * 2), values(MemorySpace::device, 256 * 256 + 16),
      scales(MemorySpace::device, 64);
  const Fp8WeightOut out{values.data<uint8_t>(), scales.data<float>(), 256, 256};
  EXPECT_THROW(device_ops().quantize_weight(nullptr, 256, 256, out, nullptr), Error);
  EXPECT_THROW(device_ops().quantize_weight(w.data<bf16>() + 1, 256, 256, out, nullptr), Error);
  EXPECT_THROW(device_ops().quantize_weight(w.data<bf16>(), 256, 128, out, nullptr), Error);  // shape mismatch
}

// ---- bandwidth -------------------------------------------------------------------------------

class QuantBandwidth : public GpuTest {};

// The activation quantizer is a memory-bound pass: read 2 bytes, write 1 byte (+ 4/128 for the
// scale) per element. Compared with a device-to-device copy that moves the same number of bytes
// (a copy of S bytes moves 2S), both timed with the L2 flushed before each call; both scale
// formats (fp32 scales divide every value: still memory-bound, bench/results/fp8-checkpoints/
// quant-division/).
TEST_F(QuantBandwidth, ActivationQuantVsCopy) {
  const int64_t k = 16384;
  for (const int64_t m : {int64_t{4096}, int64_t{8192}}) {
    const int64_t bytes = 2 * m * k + m * k + 4 * m * (k / 128);
    Buffer x(MemorySpace::device, static_cast<size_t>(m * k) * 2);
    fill_normal(MemorySpace::device, x.data<bf16>(), m * k, 42);
    Buffer values(MemorySpace::device, static_cast<size_t>(m * k));
    Buffer scales(MemorySpace::device, static_cast<size_t>(k / 128 * activation_scale_ld(m)) * 4);
    Buffer src(MemorySpace::device, static_cast<size_t>(bytes / 2)), dst(MemorySpace::device, static_cast<size_t>(bytes / 2));
    const Fp8ActivationOut out{values.data<uint8_t>(), scales.data<float>(), m, k, activation_scale_ld(m)};
    TimingOptions opt;
    opt.warmup = 5;
    opt.reps = 50;
    const Stream stream;
    const Timing copy = time_device(
        [&](StreamHandle s) {
          ASSERT_EQ(cudaMemcpyAsync(dst.data(), src.data(), src.bytes(), cudaMemcpyDeviceToDevice,
                                    static_cast<cudaStream_t>(s)),
                    cudaSuccess);
        },
        stream.handle(), opt);
    const double copy_gbs = double(bytes) / copy.median_us * 1e-3;
    for (const ScaleMode mode : {ScaleMode::ue8m0, ScaleMode::fp32}) {
      const Timing quant = time_device(
          [&](StreamHandle s) { device_ops().quantize_activation(x.data<bf16>(), m, k, out, mode, s); },
          stream.handle(), opt);
      const double quant_gbs = double(bytes) / quant.median_us * 1e-3;
      const double ratio = quant_gbs / copy_gbs;
      std::printf("[bandwidth] %s M=%ld K=%ld scales %s: %.1f MB moved; copy %.1f us %.0f GB/s | quantize %.1f us "
                  "%.0f GB/s | ratio %.3f\n",
                  current_device().name.c_str(), long(m), long(k), scale_mode_name(mode), bytes * 1e-6,
                  copy.median_us, copy_gbs, quant.median_us, quant_gbs, ratio);
      RecordProperty(std::string("ratio_") + scale_mode_name(mode) + "_m" + std::to_string(m), std::to_string(ratio));
      EXPECT_GE(ratio, 0.75) << "activation quantization (" << scale_mode_name(mode) << " scales) at M=" << m
                             << " reaches " << quant_gbs << " GB/s against " << copy_gbs << " GB/s for a copy";
    }
  }
}

}  // namespace
}  // namespace fp8proj

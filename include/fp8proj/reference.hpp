// CPU reference GEMMs and the error metrics every numerics check uses.
//
// FP8 operands times power-of-two scales are exact in fp32, so the block-scaled FP8 GEMM
// equals an fp32 GEMM of the dequantized operands: gemm_fp8_block dequantizes and calls a
// BLAS sgemm (OpenBLAS, multithreaded). With arbitrary fp32 scales the dequantized values
// carry one rounding each, the same rounding a GPU kernel's promotion step makes.
#pragma once

#include <cstdint>
#include <vector>

#include "fp8proj/bf16.hpp"
#include "fp8proj/tensor.hpp"

namespace fp8proj::cpu {

// c[m, n] = a[m, k] . b[n, k]^T in fp32 (row-major, BLAS sgemm).
void sgemm_nt(const float* a, const float* b, float* c, int64_t m, int64_t n, int64_t k);

// d = bf16(a . b^T) with fp32 accumulation.
void gemm_bf16(const bf16* a, const bf16* b, bf16* d, int64_t m, int64_t n, int64_t k);
// d = bf16(dequant(a) . dequant(b)^T).
void gemm_fp8_block(const Fp8ActivationView& a, const Fp8WeightView& b, bf16* d);

// The oracle: the fp64 product of fp32 operands, c[m, n] = a[m, k] . b[n, k]^T.
std::vector<double> gemm_f64(const float* a, const float* b, int64_t m, int64_t n, int64_t k);

std::vector<float> to_float(const bf16* x, int64_t count);
std::vector<bf16> to_bf16(const float* x, int64_t count);

}  // namespace fp8proj::cpu

namespace fp8proj {

// Comparison of a bf16 result with an fp64 reference of the same shape.
struct ErrorStats {
  double rel_frobenius = 0;   // ||out - ref|| / ||ref||
  double max_abs = 0;
  int64_t non_finite = 0;     // outputs that are NaN or inf where the reference is finite
  int64_t count = 0;
};
ErrorStats compare(const bf16* out, const double* ref, int64_t count);
// The same against a bf16 reference (e.g. the TP 1 output for a TP R run).
ErrorStats compare(const bf16* out, const bf16* ref, int64_t count);

// Tolerance of an FP8 GEMM against the fp64 product of its dequantized operands: the bf16
// rounding of the output alone is up to 2^-9 = 1.95e-3 relative per element and about
// 1.1e-3 in the Frobenius norm on random data; fp32 accumulation adds far less.
inline constexpr double kFp8GemmRelTol = 2e-3;
// bf16 GEMM against the fp64 product of its bf16 operands: same output rounding.
inline constexpr double kBf16GemmRelTol = 2e-3;

}  // namespace fp8proj

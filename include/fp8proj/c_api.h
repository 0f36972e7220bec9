/* fp8proj's C ABI: the block-scaled FP8 GEMM for callers that are not C++ (an engine's
 * Python through ctypes, another language's FFI). libfp8proj_c.so exports these and nothing
 * else; no C++ exception crosses it.
 *
 *   y[m, n] (bf16) = dequant(x)[m, k] . dequant(w)[n, k]^T
 *
 * Layouts (device memory, all pointers 16-byte aligned) are the library's own and
 * DeepGEMM's SM90 ones, so one set of buffers feeds both:
 *   w_values  e4m3 [n, k] row-major             w_scales fp32 [n/128][k/128] row-major
 *   x_values  e4m3 [m, k] row-major             x_scales fp32 [k/128][x_scale_ld], entry
 *             (kb, i) scales x[i, 128kb .. 128kb+127]; x_scale_ld >= m, a multiple of 4
 *   y         bf16 [m, n] row-major, fully overwritten
 * n and k must be multiples of 128. Scales are any finite positive fp32 values.
 *
 * Every function returns 0 on success and -1 on failure; fp8proj_last_error() then says what
 * was wrong (per thread, until the next failing call). m = 0 is a successful no-op. */
#ifndef FP8PROJ_C_API_H
#define FP8PROJ_C_API_H

#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__)
#define FP8PROJ_C_EXPORT __attribute__((visibility("default")))
#else
#define FP8PROJ_C_EXPORT
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fp8proj_fp8_gemm fp8proj_fp8_gemm;

/* Binds one FP8 weight (the buffers must outlive the handle). backend: NULL or "auto" for the
 * default block-scaled backend of this GPU and shape, or a backend's name ("sm90_fp8_block",
 * "cublaslt_fp8_block"). Per M the plan runs the configuration the tuned table
 * (configs/<gpu>.json, FP8PROJ_TUNE_FILE) names for that M's bucket, else the backend's
 * heuristic -- what `fp8proj bench` times as "gemm". Calls with m <= max_m only. */
FP8PROJ_C_EXPORT int fp8proj_fp8_gemm_create(const void* w_values, const float* w_scales, int64_t n, int64_t k, int64_t max_m,
                            const char* backend, fp8proj_fp8_gemm** out);

/* Enqueues one GEMM on stream (a cudaStream_t; NULL = the legacy default stream). Does not
 * allocate or synchronise, so it can be captured in a CUDA graph. */
FP8PROJ_C_EXPORT int fp8proj_fp8_gemm_run(fp8proj_fp8_gemm* gemm, const void* x_values, const float* x_scales, int64_t x_scale_ld,
                         int64_t m, void* y, void* stream);

/* Writes "<backend>:<configuration>" that a call with m rows runs into buf (NUL-terminated,
 * truncated to size). */
FP8PROJ_C_EXPORT int fp8proj_fp8_gemm_describe(const fp8proj_fp8_gemm* gemm, int64_t m, char* buf, size_t size);

/* NULL is ignored. */
FP8PROJ_C_EXPORT void fp8proj_fp8_gemm_destroy(fp8proj_fp8_gemm* gemm);

/* "<version>+<commit>" of the library, e.g. "0.1.0+d3b4fe6a1b2c". */
FP8PROJ_C_EXPORT const char* fp8proj_version_string(void);

/* The message of this thread's last failure ("" if none). Valid until the next call. */
FP8PROJ_C_EXPORT const char* fp8proj_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* FP8PROJ_C_API_H */

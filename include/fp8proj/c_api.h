/* fp8proj's C ABI: the block-scaled FP8 GEMM for callers that are not C++ (an engine's
 * Python through ctypes, another language's FFI). libfp8proj_c.so exports these and nothing
 * else; no C++ exception crosses it.
 *
 *   y[m, n] (bf16) = dequant(x)[m, k] . dequant(w)[n, k]^T
 *
 * Layouts (device memory, all pointers 16-byte aligned) are the library's own and
 * DeepGEMM's SM90 ones, so one set of buffers feeds both:
 *   w_values  e4m3 [n, k] row-major             w_scales fp32 [ceil(n/128)][k/128] row-major
 *   x_values  e4m3 [m, k] row-major             x_scales fp32 [k/128][x_scale_ld], entry
 *             (kb, i) scales x[i, 128kb .. 128kb+127]; x_scale_ld >= m, a multiple of 4
 *   y         bf16 [m, n] row-major, fully overwritten
 * k must be a multiple of 128 and n a multiple of 16: the last 128-row weight block may be
 * partial, its scale taken over the rows that exist (fused_qkv_a's 2624 / 2112 rows). Scales are
 * any finite positive fp32 values.
 *
 * Every function returns 0 on success and -1 on failure; fp8proj_last_error() then says what
 * was wrong (per thread, until the next failing call). m = 0 is a successful no-op.
 *
 * After a sticky CUDA error (an illegal address, a trap, a hung kernel ended by the watchdog:
 * the CUDA context is unusable) every function that would use the GPU returns -1 at once, m = 0
 * included, with "the CUDA context is unusable after an earlier error: <its text>; restart the
 * process"; fp8proj_device_fault() returns that text. */
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

/* Binds one FP8 weight (the buffers must outlive the handle; each run reads the values and the
 * scales as they are at that run -- the cublaslt_fp8_block backend, where K/128 is not a multiple
 * of 4, copies the scales into its row stride on the stream before each run).
 * backend: NULL or "auto" for the default block-scaled backend of this GPU and shape, or a
 * backend's name ("sm90_fp8_block", "cublaslt_fp8_block"). Per M the plan runs the configuration the tuned table
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

/* ---- quantizers (the kernels the projection layer runs; bit-identical to the CPU reference) ----
 * All pointers are device memory, 16-byte aligned; every call is enqueued on stream without
 * allocating or synchronising (capturable in a CUDA graph). m = 0 is a successful no-op.
 *   x       bf16 [m, k], row r at x + r * x_stride elements (x_stride >= k)
 *   values  e4m3 [m, k] dense row-major
 *   scales  fp32 [k/128][scale_ld] M-major (entry (kb, i) at scales[kb * scale_ld + i]),
 *           scale_ld >= m and a multiple of 4; k a multiple of 128. */

/* 1x128 activation quantization. The kernel reads dense rows: x_stride must equal k. */
FP8PROJ_C_EXPORT int fp8proj_quantize_activation(const void* x, int64_t x_stride, int64_t m, int64_t k, void* values,
                                                 float* scales, int64_t scale_ld, void* stream);

/* quantize_activation(rmsnorm(x) * weight) in one pass; x_stride a multiple of 8 (a view into
 * wider rows, e.g. the q_a columns of fused_qkv_a's output); weight bf16 [k]; eps >= 0. */
FP8PROJ_C_EXPORT int fp8proj_rmsnorm_quantize(const void* x, int64_t x_stride, const void* weight, float eps,
                                              int64_t m, int64_t k, void* values, float* scales, int64_t scale_ld,
                                              void* stream);

/* 128x128 weight quantization: w bf16 [n, k] -> values e4m3 [n, k], scales fp32
 * [ceil(n/128)][ceil(k/128)] row-major (edge blocks partial, with their own amax). */
FP8PROJ_C_EXPORT int fp8proj_quantize_weight(const void* w, int64_t n, int64_t k, void* values, float* scales,
                                             void* stream);

/* ---- scale formats (include/fp8proj/formats.hpp) ----
 * FP8PROJ_SCALES_UE8M0: each group's scale is the power of two at or above amax/448 (what the
 *   functions above write); FP8PROJ_SCALES_FLOAT: the scale is fl(amax/448) itself and the codes
 *   are e4m3(fl(x / scale)) (FP8 checkpoints' form, and SGLang's / vLLM's activation rule).
 * Both are stored as fp32 values and the GEMM takes either. */
#define FP8PROJ_SCALES_UE8M0 0
#define FP8PROJ_SCALES_FLOAT 1

/* fp8proj_quantize_activation / fp8proj_rmsnorm_quantize / fp8proj_quantize_weight with the scale
 * format chosen. */
FP8PROJ_C_EXPORT int fp8proj_quantize_activation_scaled(const void* x, int64_t x_stride, int64_t m, int64_t k,
                                                        int scale_format, void* values, float* scales,
                                                        int64_t scale_ld, void* stream);
FP8PROJ_C_EXPORT int fp8proj_rmsnorm_quantize_scaled(const void* x, int64_t x_stride, const void* weight, float eps,
                                                     int64_t m, int64_t k, int scale_format, void* values,
                                                     float* scales, int64_t scale_ld, void* stream);
FP8PROJ_C_EXPORT int fp8proj_quantize_weight_scaled(const void* w, int64_t n, int64_t k, int scale_format,
                                                    void* values, float* scales, void* stream);

/* A gated MLP's down_proj input in one pass: quantize_activation(bf16(bf16(silu(gate)) * up)),
 * silu(g) = g / (1 + exp(-g)) in fp32 with the two bf16 roundings of PyTorch's bf16
 * act_fn(gate) * up. gate and up bf16 [m, k], row r at gate / up + r * stride elements (stride
 * >= k, a multiple of 8: e.g. the two column halves of one [m, 2k] GEMM output, stride 2k). */
FP8PROJ_C_EXPORT int fp8proj_silu_mul_quantize(const void* gate, const void* up, int64_t stride, int64_t m,
                                               int64_t k, int scale_format, void* values, float* scales,
                                               int64_t scale_ld, void* stream);

/* Bytes of device memory the plan owns beyond the weight (split-K partials and counters). */
FP8PROJ_C_EXPORT int fp8proj_fp8_gemm_workspace_bytes(const fp8proj_fp8_gemm* gemm, size_t* bytes);

/* ---- the gated projection layer (fp8proj::ProjectionLayer, include/fp8proj/projection.hpp) ----
 * y[m, n] = x[m, k] . w[n, k]^T through the M-gate, the tuned table and the backends of the
 * C++ layer: bf16 for decode-sized M, FP8 above the gate when enabled. The handle keeps the
 * bf16 weight pointer (it must outlive the handle) and owns its FP8 copy, made on the device
 * at creation (the one synchronising call), and workspaces for max_tokens rows. */
typedef struct fp8proj_projection fp8proj_projection;

/* Activation scratch several projections can share (their calls must be ordered: one stream),
 * so that a model holds one workspace, not one per layer: e4m3 + scales for max_tokens rows of
 * up to max_k columns, and bf16 rows for the unfused RMSNorm when with_bf16_rows. */
typedef struct fp8proj_workspace fp8proj_workspace;
FP8PROJ_C_EXPORT int fp8proj_workspace_create(int64_t max_tokens, int64_t max_k, int with_bf16_rows,
                                              fp8proj_workspace** out);
FP8PROJ_C_EXPORT int fp8proj_workspace_bytes(const fp8proj_workspace* ws, size_t* bytes);
/* Projections made with it keep it alive; NULL is ignored. */
FP8PROJ_C_EXPORT void fp8proj_workspace_destroy(fp8proj_workspace* ws);

typedef struct fp8proj_projection_options {
  const char* name;        /* shown in logs and explain(); NULL = "projection" */
  int enabled;             /* FP8 opt-in (0/1) */
  const char* policy;      /* "prefill" or "all"; NULL = "prefill" */
  int64_t threshold;       /* FP8 when M > threshold; < 0 = the tuned table, else 512 */
  int64_t decode_ceiling;  /* prefill policy: M <= ceiling stays bf16; < 0 = 512 */
  int64_t max_tokens;      /* workspace rows (a multiple of 4; larger M runs in chunks); <= 0 = 8192 */
  int rmsnorm_input;       /* size the workspace for fp8proj_projection_forward_rmsnorm (0/1) */
  int apply_env;           /* the FP8PROJ_* knobs override these options (0/1) */
  const char* fp8_backend; /* NULL or "auto", or a backend name */
  fp8proj_workspace* workspace; /* NULL = the projection owns one; else max_tokens comes from it */
} fp8proj_projection_options;

/* Fills *options with the defaults above (enabled 0, apply_env 1). */
FP8PROJ_C_EXPORT int fp8proj_projection_options_init(fp8proj_projection_options* options);

/* weight bf16 [n, k] device memory; n, k > 0 (FP8 needs K % 128 == 0 and N % 16 == 0: other shapes stay
 * bf16 and explain() says why). options NULL = the defaults. */
FP8PROJ_C_EXPORT int fp8proj_projection_create(const void* weight, int64_t n, int64_t k,
                                               const fp8proj_projection_options* options, fp8proj_projection** out);

/* fp8proj_projection_create with the scale format of the FP8 copy (FP8PROJ_SCALES_*;
 * fp8proj_projection_create makes UE8M0). With options->apply_env, FP8PROJ_WEIGHT_SCALES
 * overrides it as the other knobs override their options. */
FP8PROJ_C_EXPORT int fp8proj_projection_create_scaled(const void* weight, int64_t n, int64_t k,
                                                      const fp8proj_projection_options* options, int weight_scales,
                                                      fp8proj_projection** out);

/* The scale format of the projection's FP8 copy (FP8PROJ_SCALES_*), after the environment. */
FP8PROJ_C_EXPORT int fp8proj_projection_weight_scales(const fp8proj_projection* proj, int* weight_scales);

/* y = x . w^T, x bf16 [m, k] dense, y bf16 [m, n] dense. */
FP8PROJ_C_EXPORT int fp8proj_projection_forward(fp8proj_projection* proj, const void* x, int64_t m, void* y,
                                                void* stream);

/* y = rmsnorm(x) * norm_weight . w^T with x's rows x_stride elements apart (x_stride >= k, a
 * multiple of 8); needs rmsnorm_input. */
FP8PROJ_C_EXPORT int fp8proj_projection_forward_rmsnorm(fp8proj_projection* proj, const void* x, int64_t x_stride,
                                                        const void* norm_weight, float eps, int64_t m, void* y,
                                                        void* stream);

/* Which path a call with m rows takes: *path = 0 (none, m = 0), 1 (bf16) or 2 (FP8). */
FP8PROJ_C_EXPORT int fp8proj_projection_path(const fp8proj_projection* proj, int64_t m, int* path);

/* The layer's explain(m) ("M=...: fp8 via ... -- reason") into buf, NUL-terminated, truncated
 * to size. */
FP8PROJ_C_EXPORT int fp8proj_projection_explain(const fp8proj_projection* proj, int64_t m, char* buf, size_t size);

/* The same two for a call through fp8proj_projection_forward_rmsnorm (input = 1; 0 is
 * fp8proj_projection_forward): there the norm writes the FP8 input, so a tuned bucket's verdict
 * is the FP8 GEMM alone against bf16 (fp8_gemm_us in the tuned table). Any other input is an error. */
FP8PROJ_C_EXPORT int fp8proj_projection_path_input(const fp8proj_projection* proj, int64_t m, int input, int* path);
FP8PROJ_C_EXPORT int fp8proj_projection_explain_input(const fp8proj_projection* proj, int64_t m, int input, char* buf,
                                                      size_t size);

/* Bytes: the bf16 weight (held by the caller), the FP8 copy's values and scales, and the
 * workspaces the handle owns. Any pointer may be NULL. */
FP8PROJ_C_EXPORT int fp8proj_projection_memory(const fp8proj_projection* proj, size_t* bf16_weight,
                                               size_t* fp8_values, size_t* fp8_scales, size_t* workspace);

/* The projection's id (> 0, never reused in a process): a name for it where a pointer cannot be
 * held safely, e.g. a torch op's int argument. */
FP8PROJ_C_EXPORT int fp8proj_projection_id(const fp8proj_projection* proj, int64_t* id);

/* The live projection with this id (a destroyed one's id fails with a message), the bf16 weight
 * it reads and its shape; weight, n and k may be NULL. Thread-safe. */
FP8PROJ_C_EXPORT int fp8proj_projection_lookup(int64_t id, fp8proj_projection** out, const void** weight, int64_t* n,
                                               int64_t* k);

/* NULL is ignored. */
FP8PROJ_C_EXPORT void fp8proj_projection_destroy(fp8proj_projection* proj);

/* ---- this process's device ----
 * *fp8_ok = 1 when this build has CUDA and the current GPU runs the sm_90a FP8 kernels; buf gets
 * "<gpu name>" then, else the reason there is none (NUL-terminated, truncated to size). */
FP8PROJ_C_EXPORT int fp8proj_device_status(int* fp8_ok, char* buf, size_t size);

/* "<version>+<commit>" of the library, e.g. "0.1.0+d3b4fe6a1b2c". */
FP8PROJ_C_EXPORT const char* fp8proj_version_string(void);

/* The message of this thread's last failure ("" if none). Valid until the next call. */
FP8PROJ_C_EXPORT const char* fp8proj_last_error(void);

/* NULL while the CUDA context is usable; after a sticky CUDA error, the text of the first one
 * (valid for the life of the process). */
FP8PROJ_C_EXPORT const char* fp8proj_device_fault(void);

#ifdef __cplusplus
}
#endif

#endif /* FP8PROJ_C_API_H */

// The MLA attention block (DeepSeek-V2/V3, GLM-5) with its two tagged projections, q_b_proj
// and o_proj, on the gated FP8 path (docs/design.md), and opt-in the other two dense GEMMs,
// fused_qkv_a and kv_b_proj (MlaOptions::fp8_fused_qkv_a / fp8_kv_b_proj). Host (the CPU
// reference) and device.
//
// Per rank (heads split over tp_size ranks; H = heads / tp_size local heads), T tokens:
//
//   x [T, hidden]
//   qkv_a  = fused_qkv_a(x)                     [T, q_lora + kv_lora + rope]  bf16, untagged
//   q      = q_b_proj(rmsnorm(qkv_a[:, :q_lora]))  [T, H*(nope+rope)]  tagged; the norm and the
//            1x128 quantization are one pass on the FP8 path (forward_rmsnorm reads the q_a
//            columns straight out of the qkv_a rows)
//   c_kv   = rmsnorm(qkv_a[:, q_lora : q_lora+kv_lora])   [T, kv_lora]
//   k_rope = rope(qkv_a[:, q_lora+kv_lora :])              [T, rope], one per token (MQA)
//   cache row of the token = [c_kv | k_rope]               [kv_lora + rope] bf16; at decode one
//            kernel normalizes c_kv, ropes k_rope and writes the row (and the q rope part)
//   prefill: kv = kv_b_proj(c_kv) (untagged, bf16), k = [k_nope_h | k_rope], v_h; causal
//            attention per sequence (prefill_attention, attention.hpp)
//   decode:  kv_b_proj absorbed: q_latent_h = q_nope_h . W_UK_h, attention over the latent
//            cache (decode_attention), out_h = out_latent_h . W_UV_h^T
//   y      = o_proj(attn_out)                   [T, hidden]  tagged; on the FP8 path its input is
//            quantized by the prefill attention kernel's epilogue (MlaOptions::fuse_attention_quant)
//            or by the memory-bound QuantOps::quantize_activation pass; in decode by the epilogue of
//            out_h = out_latent_h . W_UV_h^T (MlaOptions::fuse_decode_quant)
//
// RoPE is DeepSeek's interleaved-pair layout: pair i of a rope vector is (x[2i], x[2i+1]),
// rotated by pos * inv_freq[i], in fp32, rounded to bf16 (SGLang's is_neox_style=False for
// these models; GLM-5 is served by the same code). inv_freq = theta^(-2i/rope); with YaRN
// (DeepSeek-V3, V2-Lite: factor 40, original 4096 positions, beta_fast 32, beta_slow 1) the
// frequencies are blended between f and f/factor over the correction range exactly as
// DeepSeek's reference does, and the softmax scale is multiplied by mscale(mscale_all_dim)^2
// (= 1.874 for DeepSeek-V3). GLM-5 uses plain RoPE, theta 1e6.
//
// Tensor parallelism. q_b_proj and kv_b_proj are column-parallel by heads, o_proj is
// row-parallel by K (its input features are the local heads' v): every rank returns o_proj's
// *partial* output. MlaOptions::all_reduce, when set, is called on it right after o_proj (the
// stage MlaStage::all_reduce); at tp_size 1 it is not called and nothing changes. fused_qkv_a,
// the norms and the latent cache are replicated.
//
// Numerics. Every intermediate is bf16 (as in the reference engines); GEMMs accumulate in fp32;
// norms, RoPE and softmax run in fp32. The host block is the CPU reference of the device one: it
// runs the same stages with the same roundings (host ProjectionLayer, host QuantOps, host
// attention), so the two differ only by summation order.
//
// No allocation and no host synchronisation inside prefill() or decode(): workspaces are sized
// at construction for `max_tokens` (prefill) and `max_batch` (decode). decode() reads positions
// and cache starts from device arrays only, so it can be captured in a CUDA graph and replayed
// with new lengths (MlaDecodeGraph).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fp8proj/bf16.hpp"
#include "fp8proj/projection.hpp"
#include "fp8proj/tensor.hpp"
#include "fp8proj/timing.hpp"

namespace fp8proj {

// YaRN as DeepSeek-V2/V3 configure it (config.json "rope_scaling", type "yarn").
struct YarnScaling {
  double factor = 40.0;
  int64_t original_max_position = 4096;
  double beta_fast = 32.0, beta_slow = 1.0;
  double mscale = 1.0, mscale_all_dim = 0.0;
};

struct MlaConfig {
  std::string model = "custom";
  int64_t hidden = 0;
  int heads = 0;               // all ranks together
  int64_t q_lora_rank = 0;     // 0: no q LoRA, a plain q_proj [heads*(nope+rope), hidden]
  int64_t kv_lora_rank = 0;
  int qk_nope_dim = 0, qk_rope_dim = 0, v_head_dim = 0;
  double rope_theta = 10000.0;
  std::optional<YarnScaling> yarn;
  float rms_norm_eps = 1e-6f;
  int tp_size = 1, tp_rank = 0;

  // "glm5", "deepseek-v3", "deepseek-v2-lite" (dimensions in models.hpp).
  static MlaConfig preset(std::string_view model, int tp_size = 1, int tp_rank = 0);
  static std::vector<std::string> preset_names();

  bool has_q_lora() const { return q_lora_rank > 0; }
  int local_heads() const { return heads / tp_size; }
  int qk_head_dim() const { return qk_nope_dim + qk_rope_dim; }
  int64_t q_in_dim() const { return has_q_lora() ? q_lora_rank : hidden; }       // K of q_b_proj / q_proj
  int64_t qkv_a_dim() const { return q_lora_rank + kv_lora_rank + qk_rope_dim; }  // N of fused_qkv_a
  int64_t q_dim() const { return int64_t{local_heads()} * qk_head_dim(); }       // N of q_b_proj (rank)
  int64_t kv_b_dim() const { return int64_t{local_heads()} * (qk_nope_dim + v_head_dim); }
  int64_t o_in_dim() const { return int64_t{local_heads()} * v_head_dim; }        // K of o_proj (rank)
  int64_t cache_width() const { return kv_lora_rank + qk_rope_dim; }             // 576 for V3 / GLM-5
  // qk_head_dim^-0.5, times mscale(factor, mscale_all_dim)^2 with YaRN.
  float softmax_scale() const;
  // [qk_rope_dim / 2] fp32 frequencies (YaRN-blended when configured).
  std::vector<float> rope_inv_freq() const;
  // Factor on cos and sin: mscale(factor, mscale) / mscale(factor, mscale_all_dim) with YaRN
  // (1 for every preset: their two mscales are equal), else 1.
  float rope_mscale() const;
  // Throws fp8proj::Error naming the first unusable field (including what the kernels need:
  // nope and kv_lora multiples of 32, v and rope multiples of 8, tp_size dividing heads).
  void validate() const;
  std::string describe() const;  // "glm5: hidden 6144, 64 heads (64 on rank 0/1), ..."
};

// The block's weights as a checkpoint holds them: host bf16, Hugging Face names and layouts
// (row-major [out_features, in_features]), full (unsharded) shapes. The block copies out its
// rank's shard and keeps its own bf16 copy; ProjectionLayer makes the FP8 copy of the tagged
// ones. The pointers need to live only during the constructor.
struct MlaHostWeights {
  const bf16* q_a_proj = nullptr;            // [q_lora, hidden]                  (q LoRA only)
  const bf16* q_a_layernorm = nullptr;       // [q_lora]                          (q LoRA only)
  const bf16* q_b_proj = nullptr;            // [heads*(nope+rope), q_lora], or q_proj
                                             // [heads*(nope+rope), hidden] without q LoRA
  const bf16* kv_a_proj_with_mqa = nullptr;  // [kv_lora + rope, hidden]
  const bf16* kv_a_layernorm = nullptr;      // [kv_lora]
  const bf16* kv_b_proj = nullptr;           // [heads*(nope+v), kv_lora]
  const bf16* o_proj = nullptr;              // [hidden, heads*v]
};

// The block's stages, in the order they run; a hook sees each one after it is enqueued.
enum class MlaStage : uint8_t {
  qkv_a,       // fused_qkv_a
  q_proj,      // q_a_layernorm + q_b_proj (or q_proj)
  kv_norm,     // kv_a_layernorm; prefill only (decode normalizes the latent in rope_cache)
  kv_b_proj,   // prefill only
  rope_cache,  // RoPE, latent cache write (and k for prefill; kv_a_layernorm for decode)
  absorb_q,    // decode only: q_nope . W_UK
  attention,
  absorb_v,    // decode only: out_latent . W_UV^T
  o_proj,
  all_reduce,  // only when tp_size > 1 and MlaOptions::all_reduce is set
};
const char* to_string(MlaStage stage);
using MlaStageHook = std::function<void(MlaStage stage, StreamHandle stream)>;
// Sums the ranks' partial o_proj outputs in place: y [rows, cols] bf16 in the block's space.
using MlaAllReduce = std::function<void(bf16* y, int64_t rows, int64_t cols, StreamHandle stream)>;

struct MlaOptions {
  std::string name = "self_attn";  // projections are named "<name>.q_b_proj", ...
  // Gating of the tagged projections (q_b_proj, o_proj): fp8, policy, threshold,
  // decode_ceiling, fp8_backend, use_tune_table, tuned, apply_env. The block sets name,
  // max_tokens, rmsnorm_input and workspace itself.
  ProjectionOptions tagged;
  // Opt in: the two dense GEMMs the reference design leaves in bf16 take the same gated FP8 path
  // (the `tagged` options, each with its own tuned row, so their own M crossover):
  //   fused_qkv_a [q_lora + kv_lora + rope, hidden], replicated (N = 2624 GLM-5, 2112
  //     DeepSeek-V3: a partial last 128-row weight block, which the sm90 kernels run);
  //   kv_b_proj [H * (nope + v), kv_lora], prefill only (decode absorbs it into the attention).
  // Off (default): both stay bf16 exactly as before.
  bool fp8_fused_qkv_a = false;
  bool fp8_kv_b_proj = false;
  // Size fused_qkv_a for prefill_residual() / decode_residual() (its bf16 path needs rows of
  // max_tokens x hidden for the norm; the FP8 path none). q LoRA configurations only.
  bool residual_input = false;
  // On o_proj's FP8 path (prefill) the attention kernel can write its input as e4m3 + 1x128
  // scales (needs v_head % 128 == 0: GLM-5 256, DeepSeek-V3 128), the same bits as the separate
  // quantize_activation pass. Off by default: on an H200 (GLM-5, TP 1, 64 x 1024 tokens) the
  // epilogue added 1.50 ms to the attention stage while the separate pass takes 0.75 ms
  // (bench/results/mla-layer/, docs/kernels.md); `fp8proj layer --fuse-attention-quant` A/Bs it.
  bool fuse_attention_quant = false;
  // On o_proj's FP8 path at decode, out_latent . W_UV^T (the absorbed value projection) writes
  // o_proj's input as e4m3 + 1x128 scales in its epilogue, the same bits as the separate
  // quantize_activation pass, one kernel fewer per step (needs v_head % 128 == 0). On an H200
  // the decode step took up to 4 us less at 47 of 48 measured points (DeepSeek-V3, GLM-5, TP 1
  // and 8, C = 16 and 64, six rounds; bench/results/decode/absorb-quant/). On by default; `fp8proj layer
  // --decode-quant fused,separate` A/Bs it.
  bool fuse_decode_quant = true;
  std::string bf16_backend = "auto";  // every projection's bf16 path
  int64_t max_tokens = 8192;          // largest prefill call (tokens of all its sequences)
  int max_batch = 256;                // largest decode call (sequences)
  int64_t cache_capacity = 0;         // latent cache rows; 0: max_tokens
  MlaAllReduce all_reduce;            // tensor-parallel hook (tp_size > 1)
};

// Packed variable-length sequences; sequence b is tokens [offsets[b], offsets[b+1]) at
// positions 0, 1, ... (a fresh prefill: no cached prefix), written to cache rows
// [cache_start[b], cache_start[b] + len_b).
struct MlaPrefillBatch {
  int num_seqs = 0;
  const int32_t* seq_offsets = nullptr;       // [num_seqs + 1], block's memory space (kernels)
  const int32_t* cache_start = nullptr;       // [num_seqs], block's memory space
  // The offsets on the host: validated (0 first, strictly increasing) and used to size the
  // work. For a host block it may be null (seq_offsets is read); a device block needs it.
  const int32_t* host_seq_offsets = nullptr;
};

// One new token per sequence. Token b sits at position positions[b] (= tokens of its sequence
// already cached); it is written to cache row cache_start[b] + positions[b] and attends to
// rows [cache_start[b], cache_start[b] + positions[b]]. Both arrays live in the block's memory
// space and are read only by kernels: a captured graph replays with new values.
struct MlaDecodeBatch {
  int batch = 0;
  const int32_t* positions = nullptr;
  const int32_t* cache_start = nullptr;
  int max_context = 0;  // host-known bound of positions[b] + 1 (fixed for a captured graph)
};

enum class MlaProjection : uint8_t { fused_qkv_a, q_b_proj, kv_b_proj, o_proj };
const char* to_string(MlaProjection which);

// How MlaBlock calls `which`: behind a norm that writes its input, fused with the 1x128
// quantization on the FP8 path (InputLayout::bf16_rmsnorm: q_b_proj after q_a_layernorm when the
// model has a q LoRA; fused_qkv_a after the input norm when the block starts from the residual
// stream), else on bf16 rows. The gate takes the bucket's GEMM-alone verdict for the former.
InputLayout mla_input_layout(const MlaConfig& cfg, MlaProjection which, bool residual_input);

struct MlaProjectionExplanation {
  MlaProjection which = MlaProjection::fused_qkv_a;
  std::string name;  // "q_b_proj" ("q_proj" without q LoRA)
  int64_t n = 0, k = 0;
  bool tagged = false;
  std::string role;  // why it is (not) tagged and where its FP8 input comes from
  Explanation path;  // ProjectionLayer::explain(tokens)
};

struct MlaExplanation {
  int64_t tokens = 0;
  std::string block;  // config and rank
  std::vector<MlaProjectionExplanation> projections;
  std::string to_string() const;
};

struct MlaMemory {
  size_t weights_bf16 = 0;   // this rank's bf16 weights (incl. the transposed W_UK copy)
  size_t fp8_copies = 0;     // FP8 values + scales of the tagged projections
  size_t workspace = 0;      // activations, projection scratch, GEMM plans
  size_t cache = 0;          // latent KV cache
};

class MlaBlock {
 public:
  // Weights given by the caller (see MlaHostWeights).
  MlaBlock(MemorySpace space, const MlaConfig& config, const MlaHostWeights& weights, MlaOptions options = {});
  // Random weights for benchmarks and tests: projections N(0, 0.02^2), norm weights
  // 1 + N(0, 0.05^2); the same seed gives the same full (unsharded) tensors on every rank.
  MlaBlock(MemorySpace space, const MlaConfig& config, uint64_t seed, MlaOptions options = {});
  ~MlaBlock();
  MlaBlock(MlaBlock&&) noexcept;
  MlaBlock& operator=(MlaBlock&&) noexcept;

  // y [T, hidden] = the block over x [T, hidden]; writes the sequences' latent cache rows.
  // T = 0 is a no-op. T <= max_tokens.
  void prefill(const bf16* x, const MlaPrefillBatch& batch, bf16* y, StreamHandle stream = nullptr,
               const MlaStageHook& hook = {});
  // y [B, hidden] for x [B, hidden], one token per sequence. B = 0 is a no-op. B <= max_batch.
  void decode(const bf16* x, const MlaDecodeBatch& batch, bf16* y, StreamHandle stream = nullptr,
              const MlaStageHook& hook = {});

  // The same steps over x = rmsnorm(residual) * norm_weight (the decoder layer's input_layernorm:
  // weight [hidden] in the block's space), the norm done by fused_qkv_a's input pass: fused with
  // its 1x128 quantization on the FP8 path (one read of the residual stream, no bf16 copy of x),
  // a norm into the layer's bf16 rows on the bf16 path -- bit for bit prefill(rmsnorm(residual)).
  // Needs MlaOptions::residual_input and q LoRA (q_proj without it would read x itself).
  void prefill_residual(const bf16* residual, const bf16* norm_weight, float eps, const MlaPrefillBatch& batch, bf16* y,
                        StreamHandle stream = nullptr, const MlaStageHook& hook = {});
  void decode_residual(const bf16* residual, const bf16* norm_weight, float eps, const MlaDecodeBatch& batch, bf16* y,
                       StreamHandle stream = nullptr, const MlaStageHook& hook = {});

  // Which projections are tagged and which path each takes at `tokens`, and why.
  MlaExplanation explain(int64_t tokens) const;
  // The path projection `which` takes at `tokens` as the block calls it: q_b_proj behind
  // q_a_layernorm and, with MlaOptions::residual_input, fused_qkv_a behind the input norm go
  // through ProjectionLayer::forward_rmsnorm (the norm writes their FP8 input), the others
  // through forward().
  Path projection_path(MlaProjection which, int64_t tokens) const;

  const MlaConfig& config() const;
  const MlaOptions& options() const;
  MemorySpace space() const;
  ProjectionLayer& projection(MlaProjection which);
  const ProjectionLayer& projection(MlaProjection which) const;
  // [cache_capacity, cache_width] bf16 in the block's space.
  bf16* cache() const;
  int64_t cache_capacity() const;
  MlaMemory memory() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A decode step captured once in a CUDA graph (device blocks only). replay() re-runs it with
// whatever x, batch.positions and batch.cache_start hold at that moment; the host-side batch
// size and max_context are those of the capture. The block and the buffers must outlive it.
class MlaDecodeGraph {
 public:
  MlaDecodeGraph(MlaBlock& block, const bf16* x, const MlaDecodeBatch& batch, bf16* y);
  // The step of decode_residual(): x is the residual stream, the decoder layer's input_layernorm
  // (norm_weight, eps) runs inside the captured step.
  MlaDecodeGraph(MlaBlock& block, const bf16* residual, const bf16* norm_weight, float eps, const MlaDecodeBatch& batch,
                 bf16* y);
  ~MlaDecodeGraph();
  MlaDecodeGraph(const MlaDecodeGraph&) = delete;
  MlaDecodeGraph& operator=(const MlaDecodeGraph&) = delete;
  void replay(StreamHandle stream = nullptr);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  void capture(MlaBlock& block, const MlaDecodeBatch& batch, const std::function<void(StreamHandle)>& step);
};

// Per-stage times of block forwards, for the layer benchmark. `run(stream, hook)` must call
// prefill() or decode() on `stream` passing `hook`. Device: an event at every stage boundary,
// the L2 flushed before each run (timing.hpp's rule), options.warmup untimed runs, then the
// median over options.reps of each stage and of the whole run; host: the wall clock.
struct MlaStageTimes {
  std::vector<MlaStage> stages;  // in the order they ran
  std::vector<double> us;        // median time of each stage
  double total_us = 0;           // median time of the whole run
  double of(MlaStage stage) const;  // 0 if the stage did not run
};
MlaStageTimes profile_stages(MemorySpace space,
                             const std::function<void(StreamHandle, const MlaStageHook&)>& run,
                             const TimingOptions& options = {});

}  // namespace fp8proj

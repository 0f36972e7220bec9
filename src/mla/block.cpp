// The MLA attention block (include/fp8proj/mla.hpp): one sequence of stages for both memory
// spaces. The GEMMs are ProjectionLayers (the gate picks bf16 or FP8 per call), the norms come
// from QuantOps, attention from attention.hpp, and the small passes (RoPE, cache writes, k
// assembly, absorbed decode projections) from MlaOps (src/mla/mla_ops.hpp).
#include <algorithm>
#include <chrono>
#include <climits>
#include <memory>
#include <string>

#include "core/device_fault.hpp"
#include "fp8proj/attention.hpp"
#include "fp8proj/device.hpp"
#include "fp8proj/error.hpp"
#include "fp8proj/gemm.hpp"
#include "fp8proj/memory.hpp"
#include "fp8proj/mla.hpp"
#include "fp8proj/ops.hpp"
#include "mla/mla_ops.hpp"
#include "mla/weights.hpp"

namespace fp8proj {

const char* to_string(MlaStage stage) {
  switch (stage) {
    case MlaStage::qkv_a: return "qkv_a";
    case MlaStage::q_proj: return "q_proj";
    case MlaStage::kv_norm: return "kv_norm";
    case MlaStage::kv_b_proj: return "kv_b_proj";
    case MlaStage::rope_cache: return "rope_cache";
    case MlaStage::absorb_q: return "absorb_q";
    case MlaStage::attention: return "attention";
    case MlaStage::absorb_v: return "absorb_v";
    case MlaStage::o_proj: return "o_proj";
    case MlaStage::all_reduce: return "all_reduce";
  }
  return "?";
}

InputLayout mla_input_layout(const MlaConfig& cfg, MlaProjection which, bool residual_input) {
  const bool normed = (which == MlaProjection::q_b_proj && cfg.has_q_lora()) ||
                      (which == MlaProjection::fused_qkv_a && residual_input);
  return normed ? InputLayout::bf16_rmsnorm : InputLayout::bf16_rows;
}

const char* to_string(MlaProjection which) {
  switch (which) {
    case MlaProjection::fused_qkv_a: return "fused_qkv_a";
    case MlaProjection::q_b_proj: return "q_b_proj";
    case MlaProjection::kv_b_proj: return "kv_b_proj";
    case MlaProjection::o_proj: return "o_proj";
  }
  return "?";
}

std::string MlaExplanation::to_string() const {
  std::string s = block + "\n";
  for (const auto& p : projections) {
    s += "  " + p.name + " " + std::to_string(p.n) + "x" + std::to_string(p.k) + (p.tagged ? " [tagged]" : " [untagged]") +
         ": " + p.path.to_string() + "\n";
    s += "      " + p.role + "\n";
  }
  return s;
}

namespace {

Buffer alloc_bf16(MemorySpace space, int64_t count) {
  return Buffer(space, static_cast<size_t>(std::max<int64_t>(count, 1)) * sizeof(bf16));
}

}  // namespace

struct MlaBlock::Impl {
  MemorySpace space;
  MlaConfig cfg;
  MlaOptions opt;
  mla::MlaWeights w;
  const QuantOps* qops = nullptr;
  const mla::MlaOps* mops = nullptr;
  std::unique_ptr<ProjectionLayer> fused_qkv_a, q_b, kv_b, o;
  int64_t max_tokens = 0, capacity = 0;
  float softmax_scale = 0;
  mla::RopeDims dims;
  Buffer inv_freq;
  // Activations [max_tokens, ...] (prefill and decode), decode-only [max_batch, ...], cache.
  Buffer qkv_a, q, kv_c, kv, k, attn_out;
  Buffer q_rope, q_latent, out_latent, cache_len;
  Buffer attn_ws;  // decode attention's split-KV scratch (empty when it never splits)
  // o_proj's FP8 input as the prefill attention epilogue writes it (fuse_attention_quant):
  // [max_tokens, H*v] e4m3 + [H*v/128][max_tokens] scales; empty when it cannot be used.
  Buffer attn_q_values, attn_q_scales;
  // o_proj's FP8 input as absorb_v writes it at decode (fuse_decode_quant): [max_batch, H*v]
  // e4m3 + [H*v/128][round_up(max_batch, 4)] scales; empty when it cannot be used.
  Buffer dec_q_values, dec_q_scales;
  Buffer cache;

  void init(MemorySpace sp, const MlaConfig& c, mla::MlaWeights weights, MlaOptions o_in);
  ProjectionLayer& layer(MlaProjection which) const;
  // How project_inputs calls `which`: q_b_proj (with q LoRA) and, from the residual stream,
  // fused_qkv_a behind a norm that writes their input (forward_rmsnorm); the rest forward().
  InputLayout layout(MlaProjection which) const { return mla_input_layout(cfg, which, opt.residual_input); }
  void check_common(const bf16* x, const bf16* y, const char* what) const;
  // The block's input: x itself, or rmsnorm(residual) * norm done inside fused_qkv_a's input pass.
  struct Input {
    const bf16* x = nullptr;
    const bf16* norm = nullptr;  // non-null: x is the residual stream
    float eps = 0;
  };
  Input residual_input(const bf16* residual, const bf16* norm, float eps, const char* what) const;
  // The stages prefill and decode share: fused_qkv_a, q_a_layernorm + q_b_proj (fused with the
  // quantization on the FP8 path) and, with `kv_norm`, kv_a_layernorm. Leaves q in `q` and the
  // normed latent in `kv_c`; without `kv_norm` (decode, where decode_rope normalizes the latent on
  // its way into the cache: one launch fewer per step) kv_c is not written.
  void project_inputs(const Input& in, int64_t tokens, bool kv_norm, StreamHandle stream, const MlaStageHook& hook);
  void prefill(const Input& in, const MlaPrefillBatch& batch, bf16* y, StreamHandle stream, const MlaStageHook& hook);
  void decode(const Input& in, const MlaDecodeBatch& batch, bf16* y, StreamHandle stream, const MlaStageHook& hook);
};

void MlaBlock::Impl::init(MemorySpace sp, const MlaConfig& c, mla::MlaWeights weights, MlaOptions o_in) {
  space = sp;
  cfg = c;
  opt = std::move(o_in);
  w = std::move(weights);
  const std::string& name = opt.name;
  FP8PROJ_CHECK(opt.max_tokens > 0 && opt.max_batch > 0, name, ": max_tokens and max_batch must be positive, got ",
                opt.max_tokens, " and ", opt.max_batch);
  FP8PROJ_CHECK(opt.cache_capacity >= 0, name, ": cache_capacity must be >= 0");
  if (space == MemorySpace::device)
    FP8PROJ_CHECK(gpu_available(), name, ": device MLA block asked for, but ", current_device().why_absent);
  qops = &quant_ops(space);
  mops = &mla::mla_ops(space);
  // One row count serves prefill and decode (a decode batch runs through the same buffers);
  // ProjectionLayer wants a multiple of 4 (the activation scales' row padding).
  max_tokens = round_up(std::max<int64_t>(opt.max_tokens, opt.max_batch), 4);
  capacity = opt.cache_capacity > 0 ? opt.cache_capacity : max_tokens;
  softmax_scale = cfg.softmax_scale();

  const int64_t H = cfg.local_heads();
  ProjectionOptions tagged = opt.tagged;
  tagged.max_tokens = max_tokens;
  tagged.bf16_backend = opt.bf16_backend;
  tagged.workspace = nullptr;  // q_b (K = q_lora, with bf16 rows for the norm) and o (K = H*v) differ
  const bool tagged_fp8 = tagged.apply_env ? tagged.with_env().fp8 : tagged.fp8;

  // Untagged projections never take FP8 and ignore FP8PROJ_PREFILL_FP8.
  auto untagged = [&](const char* suffix) {
    ProjectionOptions u;
    u.name = name + "." + suffix;
    u.fp8 = false;
    u.apply_env = false;
    u.use_tune_table = false;
    u.max_tokens = max_tokens;
    u.bf16_backend = opt.bf16_backend;
    return u;
  };
  // fused_qkv_a and kv_b_proj: gated like the tagged pair when opted in (MlaOptions), else
  // untagged. An untagged shape that could not take FP8 anyway gets the block's flag so that its
  // explain() says "not eligible" rather than only "off"; an eligible one stays plainly off.
  auto optional_tag = [&](bool opted_in, const char* suffix, int64_t n, int64_t k) {
    if (opted_in) {
      ProjectionOptions t = tagged;
      t.name = name + "." + suffix;
      return t;
    }
    ProjectionOptions u = untagged(suffix);
    u.fp8 = tagged_fp8 && !fp8_eligible(n, k);
    return u;
  };
  FP8PROJ_CHECK(!opt.residual_input || cfg.has_q_lora(), name, ": residual_input needs q LoRA (",
                cfg.describe(), "): q_proj would read the normed stream itself");
  ProjectionOptions qkv_opt = optional_tag(opt.fp8_fused_qkv_a, "fused_qkv_a", cfg.qkv_a_dim(), cfg.hidden);
  qkv_opt.rmsnorm_input = opt.residual_input;
  fused_qkv_a =
      std::make_unique<ProjectionLayer>(space, w.fused_qkv_a.data<bf16>(), cfg.qkv_a_dim(), cfg.hidden, qkv_opt);

  ProjectionOptions qb = tagged;
  qb.name = name + (cfg.has_q_lora() ? ".q_b_proj" : ".q_proj");
  qb.rmsnorm_input = cfg.has_q_lora();
  q_b = std::make_unique<ProjectionLayer>(space, w.q_b.data<bf16>(), cfg.q_dim(), cfg.q_in_dim(), qb);

  kv_b = std::make_unique<ProjectionLayer>(space, w.kv_b.data<bf16>(), cfg.kv_b_dim(), cfg.kv_lora_rank,
                                           optional_tag(opt.fp8_kv_b_proj, "kv_b_proj", cfg.kv_b_dim(), cfg.kv_lora_rank));

  ProjectionOptions op = tagged;
  op.name = name + ".o_proj";
  o = std::make_unique<ProjectionLayer>(space, w.o.data<bf16>(), cfg.hidden, cfg.o_in_dim(), op);

  if (opt.fuse_attention_quant && tagged_fp8 && cfg.v_head_dim % 128 == 0 &&
      fp8_eligible(cfg.hidden, cfg.o_in_dim())) {
    attn_q_values = Buffer(space, static_cast<size_t>(max_tokens * cfg.o_in_dim()));
    attn_q_scales = Buffer(space, static_cast<size_t>(cfg.o_in_dim() / 128 * max_tokens) * sizeof(float));
  }
  if (opt.fuse_decode_quant && tagged_fp8 && cfg.v_head_dim % 128 == 0 && fp8_eligible(cfg.hidden, cfg.o_in_dim())) {
    dec_q_values = Buffer(space, static_cast<size_t>(int64_t{opt.max_batch} * cfg.o_in_dim()));
    dec_q_scales = Buffer(space, static_cast<size_t>(cfg.o_in_dim() / 128 * activation_scale_ld(opt.max_batch)) *
                                     sizeof(float));
  }
  const std::vector<float> freq = cfg.rope_inv_freq();
  inv_freq = Buffer(space, freq.size() * sizeof(float));
  copy_bytes(inv_freq.data(), space, freq.data(), MemorySpace::host, inv_freq.bytes());
  dims.heads = static_cast<int>(H);
  dims.nope = cfg.qk_nope_dim;
  dims.rope = cfg.qk_rope_dim;
  dims.kv_lora = cfg.kv_lora_rank;
  dims.inv_freq = inv_freq.data<float>();
  dims.mscale = cfg.rope_mscale();

  const int64_t T = max_tokens, B = opt.max_batch;
  qkv_a = alloc_bf16(space, T * cfg.qkv_a_dim());
  q = alloc_bf16(space, T * cfg.q_dim());
  kv_c = alloc_bf16(space, T * cfg.kv_lora_rank);
  kv = alloc_bf16(space, T * cfg.kv_b_dim());
  k = alloc_bf16(space, T * cfg.q_dim());
  attn_out = alloc_bf16(space, T * cfg.o_in_dim());
  q_rope = alloc_bf16(space, B * H * cfg.qk_rope_dim);
  q_latent = alloc_bf16(space, B * H * cfg.kv_lora_rank);
  out_latent = alloc_bf16(space, B * H * cfg.kv_lora_rank);
  cache_len = Buffer(space, static_cast<size_t>(B) * sizeof(int32_t));
  cache = alloc_bf16(space, capacity * cfg.cache_width());

  // The split-KV scratch for the largest need over every batch size up to max_batch (small
  // batches split more) and the whole cache as context; sized here, outside any graph capture.
  DecodeAttentionArgs probe;
  probe.heads = static_cast<int>(H);
  probe.kv_lora = static_cast<int>(cfg.kv_lora_rank);
  probe.d_rope = cfg.qk_rope_dim;
  probe.max_cache_len = static_cast<int>(std::min<int64_t>(capacity, INT32_MAX));
  size_t ws_bytes = 0;
  for (int b = 1; b <= opt.max_batch; ++b) {
    probe.batch = b;
    ws_bytes = std::max(ws_bytes, decode_attention_workspace_bytes(space, probe));
  }
  if (ws_bytes > 0) attn_ws = Buffer(space, ws_bytes);
}

ProjectionLayer& MlaBlock::Impl::layer(MlaProjection which) const {
  switch (which) {
    case MlaProjection::fused_qkv_a: return *fused_qkv_a;
    case MlaProjection::q_b_proj: return *q_b;
    case MlaProjection::kv_b_proj: return *kv_b;
    case MlaProjection::o_proj: return *o;
  }
  FP8PROJ_FAIL("unknown MLA projection");
}

void MlaBlock::Impl::check_common(const bf16* x, const bf16* y, const char* what) const {
  FP8PROJ_CHECK(x != nullptr && y != nullptr, opt.name, ": ", what, " input x or output y is null");
}

MlaBlock::Impl::Input MlaBlock::Impl::residual_input(const bf16* residual, const bf16* norm, float eps,
                                                     const char* what) const {
  FP8PROJ_CHECK(opt.residual_input, opt.name, ": ", what, " needs MlaOptions::residual_input (it sizes fused_qkv_a's ",
                "input pass for the norm)");
  FP8PROJ_CHECK(norm != nullptr, opt.name, ": ", what, " input_layernorm weight is null");
  return {residual, norm, eps};
}

void MlaBlock::Impl::project_inputs(const Input& in, int64_t tokens, bool kv_norm, StreamHandle stream,
                                    const MlaStageHook& hook) {
  const MlaConfig& c = cfg;
  bf16* qkv = qkv_a.data<bf16>();
  const bf16* x = in.x;
  if (in.norm)
    fused_qkv_a->forward_rmsnorm(x, c.hidden, in.norm, in.eps, tokens, qkv, stream);
  else
    fused_qkv_a->forward(x, tokens, qkv, stream);
  if (hook) hook(MlaStage::qkv_a, stream);
  if (c.has_q_lora())
    q_b->forward_rmsnorm(qkv, c.qkv_a_dim(), w.q_a_norm.data<bf16>(), c.rms_norm_eps, tokens, q.data<bf16>(), stream);
  else
    q_b->forward(x, tokens, q.data<bf16>(), stream);
  if (hook) hook(MlaStage::q_proj, stream);
  if (!kv_norm) return;
  qops->rmsnorm(qkv + c.q_lora_rank, c.qkv_a_dim(), w.kv_a_norm.data<bf16>(), c.rms_norm_eps, tokens, c.kv_lora_rank,
                kv_c.data<bf16>(), stream);
  if (hook) hook(MlaStage::kv_norm, stream);
}

namespace {
void check_space(MemorySpace space, const MlaConfig& config, const MlaOptions& options) {
  config.validate();
  if (space == MemorySpace::device) {
    check_device_usable();
    FP8PROJ_CHECK(gpu_available(), options.name, ": device MLA block asked for, but ", current_device().why_absent);
  }
}

// A device block's calls fail at once after a sticky CUDA error (core/device_fault.hpp), before
// any host work or early return.
void check_usable(MemorySpace space) {
  if (space == MemorySpace::device) check_device_usable();
}
}  // namespace

MlaBlock::MlaBlock(MemorySpace space, const MlaConfig& config, const MlaHostWeights& weights, MlaOptions options)
    : impl_(std::make_unique<Impl>()) {
  check_space(space, config, options);
  impl_->init(space, config, mla::MlaWeights::from_host(space, config, weights), std::move(options));
}

MlaBlock::MlaBlock(MemorySpace space, const MlaConfig& config, uint64_t seed, MlaOptions options)
    : impl_(std::make_unique<Impl>()) {
  check_space(space, config, options);
  impl_->init(space, config, mla::MlaWeights::random(space, config, seed, 0.02f), std::move(options));
}

MlaBlock::~MlaBlock() = default;
MlaBlock::MlaBlock(MlaBlock&&) noexcept = default;
MlaBlock& MlaBlock::operator=(MlaBlock&&) noexcept = default;

void MlaBlock::prefill(const bf16* x, const MlaPrefillBatch& batch, bf16* y, StreamHandle stream,
                       const MlaStageHook& hook) {
  check_usable(impl_->space);
  impl_->prefill(Impl::Input{x}, batch, y, stream, hook);
}

void MlaBlock::prefill_residual(const bf16* residual, const bf16* norm_weight, float eps, const MlaPrefillBatch& batch,
                                bf16* y, StreamHandle stream, const MlaStageHook& hook) {
  check_usable(impl_->space);
  impl_->prefill(impl_->residual_input(residual, norm_weight, eps, "prefill_residual"), batch, y, stream, hook);
}

void MlaBlock::decode(const bf16* x, const MlaDecodeBatch& batch, bf16* y, StreamHandle stream,
                      const MlaStageHook& hook) {
  check_usable(impl_->space);
  impl_->decode(Impl::Input{x}, batch, y, stream, hook);
}

void MlaBlock::decode_residual(const bf16* residual, const bf16* norm_weight, float eps, const MlaDecodeBatch& batch,
                               bf16* y, StreamHandle stream, const MlaStageHook& hook) {
  check_usable(impl_->space);
  impl_->decode(impl_->residual_input(residual, norm_weight, eps, "decode_residual"), batch, y, stream, hook);
}

void MlaBlock::Impl::prefill(const Input& in, const MlaPrefillBatch& batch, bf16* y, StreamHandle stream,
                             const MlaStageHook& hook) {
  Impl& s = *this;
  const bf16* x = in.x;
  const MlaConfig& c = s.cfg;
  const std::string& name = s.opt.name;
  FP8PROJ_CHECK(batch.num_seqs >= 0, name, ": prefill num_seqs must be >= 0, got ", batch.num_seqs);
  if (batch.num_seqs == 0) return;
  const int32_t* offs = batch.host_seq_offsets;
  if (offs == nullptr && s.space == MemorySpace::host) offs = batch.seq_offsets;
  FP8PROJ_CHECK(offs != nullptr, name, ": prefill needs the sequence offsets on the host (host_seq_offsets) to ",
                "validate them and size the work");
  FP8PROJ_CHECK(offs[0] == 0, name, ": seq_offsets[0] must be 0, got ", offs[0]);
  int max_seqlen = 0;
  for (int b = 0; b < batch.num_seqs; ++b) {
    FP8PROJ_CHECK(offs[b + 1] >= offs[b], name, ": seq_offsets must not decrease: offsets[", b + 1, "] = ", offs[b + 1],
                  " < offsets[", b, "] = ", offs[b]);
    max_seqlen = std::max(max_seqlen, offs[b + 1] - offs[b]);
  }
  const int64_t T = offs[batch.num_seqs];
  if (T == 0) return;  // zero tokens: no-op
  for (int b = 0; b < batch.num_seqs; ++b)
    FP8PROJ_CHECK(offs[b + 1] > offs[b], name, ": sequence ", b, " is empty (offsets[", b, "] = offsets[", b + 1,
                  "] = ", offs[b], "); drop it from the batch");
  FP8PROJ_CHECK(T <= s.max_tokens, name, ": prefill of ", T, " tokens exceeds max_tokens ", s.max_tokens,
                " (MlaOptions::max_tokens sizes the workspaces)");
  s.check_common(x, y, "prefill");
  FP8PROJ_CHECK(batch.seq_offsets != nullptr && batch.cache_start != nullptr, name,
                ": prefill seq_offsets or cache_start is null");
  if (s.space == MemorySpace::host)
    for (int b = 0; b < batch.num_seqs; ++b) {
      const int64_t start = batch.cache_start[b], len = offs[b + 1] - offs[b];
      FP8PROJ_CHECK(start >= 0 && start + len <= s.capacity, name, ": sequence ", b, " needs cache rows [", start, ", ",
                    start + len, "), outside the cache's ", s.capacity, " rows");
    }
  auto mark = [&](MlaStage st) {
    if (hook) hook(st, stream);
  };

  const int64_t H = c.local_heads();
  bf16* qkv_a = s.qkv_a.data<bf16>();
  bf16* q = s.q.data<bf16>();
  bf16* kv_c = s.kv_c.data<bf16>();
  bf16* kv = s.kv.data<bf16>();
  bf16* attn_out = s.attn_out.data<bf16>();

  s.project_inputs(in, T, true, stream, hook);
  s.kv_b->forward(kv_c, T, kv, stream);
  mark(MlaStage::kv_b_proj);

  mla::PrefillRopeArgs r;
  r.dims = s.dims;
  r.tokens = T;
  r.num_seqs = batch.num_seqs;
  r.seq_offsets = batch.seq_offsets;
  r.cache_start = batch.cache_start;
  r.q = q;
  r.q_stride = c.q_dim();
  r.k_rope_raw = qkv_a + c.q_lora_rank + c.kv_lora_rank;
  r.k_rope_stride = c.qkv_a_dim();
  r.kv_c = kv_c;
  r.kv = kv;
  r.kv_stride = c.kv_b_dim();
  r.k = s.k.data<bf16>();
  r.cache = s.cache.data<bf16>();
  r.cache_capacity = s.capacity;
  s.mops->prefill_rope(r, stream);
  mark(MlaStage::rope_cache);

  PrefillAttentionArgs a;
  a.q = q;
  a.k = s.k.data<bf16>();
  a.v = kv + H * c.qk_nope_dim;  // the permuted kv_b rows put every head's v after all k_nope
  a.out = attn_out;
  a.q_stride = c.q_dim();
  a.k_stride = c.q_dim();
  a.v_stride = c.kv_b_dim();
  a.seq_offsets = batch.seq_offsets;
  a.num_seqs = batch.num_seqs;
  a.total_tokens = T;
  a.max_seqlen = max_seqlen;
  a.heads = static_cast<int>(H);
  a.d_qk = c.qk_head_dim();
  a.d_v = c.v_head_dim;
  a.softmax_scale = s.softmax_scale;
  // o_proj on its FP8 path: the attention epilogue writes its quantized input.
  const bool fused_o = !s.attn_q_values.empty() && s.o->path_for(T) == Path::fp8;
  const Fp8ActivationOut o_in{s.attn_q_values.data<uint8_t>(), s.attn_q_scales.data<float>(), T, c.o_in_dim(),
                              s.max_tokens};
  if (fused_o) {
    a.out = nullptr;
    a.out_fp8 = o_in;
  }
  prefill_attention(s.space, a, stream);
  mark(MlaStage::attention);

  if (fused_o)
    s.o->forward_quantized(o_in.view(), y, stream);
  else
    s.o->forward(attn_out, T, y, stream);
  mark(MlaStage::o_proj);
  if (c.tp_size > 1 && s.opt.all_reduce) {
    s.opt.all_reduce(y, T, c.hidden, stream);
    mark(MlaStage::all_reduce);
  }
}

void MlaBlock::Impl::decode(const Input& in, const MlaDecodeBatch& batch, bf16* y, StreamHandle stream,
                            const MlaStageHook& hook) {
  Impl& s = *this;
  const bf16* x = in.x;
  const MlaConfig& c = s.cfg;
  const std::string& name = s.opt.name;
  const int B = batch.batch;
  FP8PROJ_CHECK(B >= 0, name, ": decode batch must be >= 0, got ", B);
  if (B == 0) return;
  FP8PROJ_CHECK(B <= s.opt.max_batch, name, ": decode batch ", B, " exceeds max_batch ", s.opt.max_batch);
  s.check_common(x, y, "decode");
  FP8PROJ_CHECK(batch.positions != nullptr && batch.cache_start != nullptr, name,
                ": decode positions or cache_start is null");
  FP8PROJ_CHECK(batch.max_context >= 1 && batch.max_context <= s.capacity, name, ": decode max_context ",
                batch.max_context, " must be in [1, cache capacity ", s.capacity, "]");
  if (s.space == MemorySpace::host)
    for (int b = 0; b < B; ++b) {
      const int64_t pos = batch.positions[b], start = batch.cache_start[b];
      FP8PROJ_CHECK(pos >= 0 && pos + 1 <= batch.max_context, name, ": decode position ", pos, " of row ", b,
                    " is outside [0, max_context ", batch.max_context, ")");
      FP8PROJ_CHECK(start >= 0 && start + pos < s.capacity, name, ": decode row ", b, " writes cache row ",
                    start + pos, ", outside the cache's ", s.capacity, " rows");
    }
  auto mark = [&](MlaStage st) {
    if (hook) hook(st, stream);
  };

  const int64_t H = c.local_heads();
  bf16* qkv_a = s.qkv_a.data<bf16>();
  bf16* q = s.q.data<bf16>();
  bf16* kv_c = s.kv_c.data<bf16>();
  bf16* attn_out = s.attn_out.data<bf16>();

  const bool norm_in_rope = mla::decode_rope_fuses_norm(c.kv_lora_rank);
  s.project_inputs(in, B, !norm_in_rope, stream, hook);

  mla::DecodeRopeArgs r;
  r.dims = s.dims;
  r.batch = B;
  r.positions = batch.positions;
  r.cache_start = batch.cache_start;
  r.cache_len = s.cache_len.data<int32_t>();
  r.q = q;
  r.q_stride = c.q_dim();
  r.k_rope_raw = qkv_a + c.q_lora_rank + c.kv_lora_rank;
  r.k_rope_stride = c.qkv_a_dim();
  if (norm_in_rope) {  // kv_a_layernorm on the way into the cache
    r.kv_c = qkv_a + c.q_lora_rank;
    r.kv_c_stride = c.qkv_a_dim();
    r.kv_norm = s.w.kv_a_norm.data<bf16>();
    r.kv_norm_eps = c.rms_norm_eps;
  } else {
    r.kv_c = kv_c;
    r.kv_c_stride = c.kv_lora_rank;
  }
  r.q_rope = s.q_rope.data<bf16>();
  r.cache = s.cache.data<bf16>();
  r.cache_capacity = s.capacity;
  s.mops->decode_rope(r, stream);
  mark(MlaStage::rope_cache);

  mla::HeadGemmArgs uk;  // q_latent[b, h, :] = q_nope[b, h, :] . W_UK[h]
  uk.x = q;
  uk.x_row_stride = c.q_dim();
  uk.x_head_stride = c.qk_head_dim();
  uk.w = s.w.w_uk_t.data<bf16>();
  uk.y = s.q_latent.data<bf16>();
  uk.y_row_stride = H * c.kv_lora_rank;
  uk.y_head_stride = c.kv_lora_rank;
  uk.rows = B;
  uk.heads = static_cast<int>(H);
  uk.n = static_cast<int>(c.kv_lora_rank);
  uk.k = c.qk_nope_dim;
  s.mops->head_gemm(uk, stream);
  mark(MlaStage::absorb_q);

  DecodeAttentionArgs a;
  a.q_latent = s.q_latent.data<bf16>();
  a.q_rope = s.q_rope.data<bf16>();
  a.cache = s.cache.data<bf16>();
  a.cache_rows = s.capacity;
  a.cache_start = batch.cache_start;
  a.cache_len = s.cache_len.data<int32_t>();
  a.out_latent = s.out_latent.data<bf16>();
  a.batch = B;
  a.heads = static_cast<int>(H);
  a.kv_lora = static_cast<int>(c.kv_lora_rank);
  a.d_rope = c.qk_rope_dim;
  a.max_cache_len = batch.max_context;
  a.softmax_scale = s.softmax_scale;
  a.workspace = s.attn_ws.empty() ? nullptr : s.attn_ws.data();
  a.workspace_bytes = s.attn_ws.bytes();
  decode_attention(s.space, a, stream);
  mark(MlaStage::attention);

  mla::HeadGemmArgs uv;  // attn_out[b, h, :] = out_latent[b, h, :] . W_UV[h]^T
  uv.x = s.out_latent.data<bf16>();
  uv.x_row_stride = H * c.kv_lora_rank;
  uv.x_head_stride = c.kv_lora_rank;
  uv.w = s.w.w_uv(c);
  uv.y = attn_out;
  uv.y_row_stride = c.o_in_dim();
  uv.y_head_stride = c.v_head_dim;
  uv.rows = B;
  uv.heads = static_cast<int>(H);
  uv.n = c.v_head_dim;
  uv.k = static_cast<int>(c.kv_lora_rank);
  // o_proj on its FP8 path: absorb_v's epilogue writes its quantized input.
  const bool fused_o = !s.dec_q_values.empty() && s.o->path_for(B) == Path::fp8;
  const Fp8ActivationOut o_in{s.dec_q_values.data<uint8_t>(), s.dec_q_scales.data<float>(), B, c.o_in_dim(),
                              activation_scale_ld(s.opt.max_batch)};
  if (fused_o) uv.y_fp8 = o_in;
  s.mops->head_gemm(uv, stream);
  mark(MlaStage::absorb_v);

  if (fused_o)
    s.o->forward_quantized(o_in.view(), y, stream);
  else
    s.o->forward(attn_out, B, y, stream);
  mark(MlaStage::o_proj);
  if (c.tp_size > 1 && s.opt.all_reduce) {
    s.opt.all_reduce(y, B, c.hidden, stream);
    mark(MlaStage::all_reduce);
  }
}

Path MlaBlock::projection_path(MlaProjection which, int64_t tokens) const {
  return impl_->layer(which).path_for(tokens, impl_->layout(which));
}

MlaExplanation MlaBlock::explain(int64_t tokens) const {
  const Impl& s = *impl_;
  const MlaConfig& c = s.cfg;
  MlaExplanation e;
  e.tokens = tokens;
  e.block = s.opt.name + " (" + c.describe() + ") at M=" + std::to_string(tokens) + " tokens";
  auto add = [&](MlaProjection which, const std::string& shown, bool tagged, std::string role) {
    const ProjectionLayer& l = s.layer(which);
    e.projections.push_back({which, shown, l.n(), l.k(), tagged, std::move(role), l.explain(tokens, s.layout(which))});
  };
  const std::string rank = c.tp_size > 1 ? "rank " + std::to_string(c.tp_rank) + "/" + std::to_string(c.tp_size) + " " : "";
  const std::string qkv_what = c.has_q_lora() ? "q_a_proj + kv_a_proj_with_mqa in one GEMM" : "kv_a_proj_with_mqa (no q LoRA)";
  const std::string qkv_shape = "N=" + std::to_string(c.qkv_a_dim()) + " x K=" + std::to_string(c.hidden);
  const std::string qkv_rule = fp8_block_shape_reason(c.qkv_a_dim(), c.hidden);
  add(MlaProjection::fused_qkv_a, "fused_qkv_a", s.opt.fp8_fused_qkv_a,
      s.opt.fp8_fused_qkv_a
          ? "tagged (MlaOptions::fp8_fused_qkv_a): " + qkv_what + ", replicated on every rank; " + qkv_shape +
                (c.qkv_a_dim() % 128 ? " (last 128-row weight block partial)" : "") +
                "; FP8 input = x quantized by the memory-bound 1x128 pass"
          : "untagged: " + qkv_what + " in bf16, replicated on every rank" +
                (qkv_rule.empty() ? "; kept bf16 unless MlaOptions::fp8_fused_qkv_a opts it in"
                                  : "; " + qkv_rule + ", so it could not take the FP8 path anyway"));
  if (c.has_q_lora()) {
    add(MlaProjection::q_b_proj, "q_b_proj", true,
        "tagged: " + rank + "column-parallel by heads; FP8 input = q_a_layernorm fused with the 1x128 quantization "
        "(one pass over the q_a columns of fused_qkv_a's output)");
  } else {
    const bool ok = fp8_eligible(c.q_dim(), c.q_in_dim());
    add(MlaProjection::q_b_proj, "q_proj", true,
        "tagged: no q LoRA, so the plain q_proj takes q_b_proj's place; " +
            std::string(ok ? "N=" + std::to_string(c.q_dim()) + ", K=" + std::to_string(c.q_in_dim()) +
                                 " qualify (N % 16, K % 128), so it is gated like q_b_proj"
                           : fp8_block_shape_reason(c.q_dim(), c.q_in_dim()) + ", so it stays bf16") +
            "; FP8 input = x quantized by the memory-bound 1x128 pass");
  }
  add(MlaProjection::kv_b_proj, "kv_b_proj", s.opt.fp8_kv_b_proj,
      std::string(s.opt.fp8_kv_b_proj ? "tagged (MlaOptions::fp8_kv_b_proj): " + rank +
                                            "column-parallel by heads, prefill only; FP8 input = the normed latent "
                                            "quantized by the memory-bound 1x128 pass"
                                      : "untagged (bf16 unless MlaOptions::fp8_kv_b_proj opts it in)") +
          "; prefill expands the latent into k_nope and v; decode absorbs it into the attention (q_nope . W_UK and "
          "out . W_UV^T per head, on the latent cache), so it never runs there");
  add(MlaProjection::o_proj, "o_proj", true,
      "tagged: " + rank + "row-parallel by K (partial output per rank" +
          std::string(c.tp_size > 1 ? ", all-reduced after o_proj)" : ")") +
          (s.attn_q_values.empty()
               ? "; FP8 input = the attention output quantized by the memory-bound quantize_activation pass"
               : "; FP8 input = written by the prefill attention epilogue (e4m3 + 1x128 scales, no separate pass)") +
          (s.dec_q_values.empty() ? "; decode: the quantize_activation pass"
                                  : "; decode: written by out_latent . W_UV^T's epilogue (no separate pass)"));
  return e;
}

const MlaConfig& MlaBlock::config() const { return impl_->cfg; }
const MlaOptions& MlaBlock::options() const { return impl_->opt; }
MemorySpace MlaBlock::space() const { return impl_->space; }
ProjectionLayer& MlaBlock::projection(MlaProjection which) { return impl_->layer(which); }
const ProjectionLayer& MlaBlock::projection(MlaProjection which) const { return impl_->layer(which); }
bf16* MlaBlock::cache() const { return impl_->cache.data<bf16>(); }
int64_t MlaBlock::cache_capacity() const { return impl_->capacity; }

MlaMemory MlaBlock::memory() const {
  const Impl& s = *impl_;
  MlaMemory m;
  m.weights_bf16 = s.w.bytes();
  for (const ProjectionLayer* l : {s.fused_qkv_a.get(), s.q_b.get(), s.kv_b.get(), s.o.get()}) {
    const ProjectionMemory pm = l->memory();
    m.fp8_copies += pm.fp8_values + pm.fp8_scales;
    m.workspace += pm.workspace;
  }
  for (const Buffer* b : {&s.qkv_a, &s.q, &s.kv_c, &s.kv, &s.k, &s.attn_out, &s.q_rope, &s.q_latent, &s.out_latent,
                          &s.cache_len, &s.inv_freq, &s.attn_ws, &s.attn_q_values, &s.attn_q_scales, &s.dec_q_values,
                          &s.dec_q_scales})
    m.workspace += b->bytes();
  m.cache = s.cache.bytes();
  return m;
}

double MlaStageTimes::of(MlaStage stage) const {
  for (size_t i = 0; i < stages.size(); ++i)
    if (stages[i] == stage) return us[i];
  return 0.0;
}

namespace {
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
}  // namespace

#if FP8PROJ_WITH_CUDA
// src/cuda/mla/stage_profile.cu: raw event times, [rep][boundary] in microseconds from the
// start of the rep, and the stage of each boundary.
void profile_stages_device(const std::function<void(StreamHandle, const MlaStageHook&)>& run,
                           const TimingOptions& options, std::vector<MlaStage>& stages,
                           std::vector<std::vector<double>>& marks_us);
#endif

MlaStageTimes profile_stages(MemorySpace space, const std::function<void(StreamHandle, const MlaStageHook&)>& run,
                             const TimingOptions& options) {
  FP8PROJ_CHECK(options.reps > 0 && options.warmup >= 0, "profile_stages needs reps > 0 and warmup >= 0");
  std::vector<MlaStage> stages;
  std::vector<std::vector<double>> marks;  // per rep: time of each stage boundary since the start
  if (space == MemorySpace::host) {
    for (int i = 0; i < options.warmup; ++i) run(nullptr, {});
    for (int r = 0; r < options.reps; ++r) {
      std::vector<MlaStage> seen;
      std::vector<double> t;
      const auto t0 = std::chrono::steady_clock::now();
      run(nullptr, [&](MlaStage s, StreamHandle) {
        seen.push_back(s);
        t.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
      });
      stages = seen;
      marks.push_back(t);
    }
  } else {
#if FP8PROJ_WITH_CUDA
    profile_stages_device(run, options, stages, marks);
#else
    FP8PROJ_FAIL("profile_stages on the device, but this build has no CUDA");
#endif
  }
  MlaStageTimes out;
  out.stages = stages;
  for (size_t i = 0; i < stages.size(); ++i) {
    std::vector<double> d;
    for (const auto& m : marks) {
      FP8PROJ_CHECK(m.size() == stages.size(), "profile_stages: the runs took different stages");
      d.push_back(m[i] - (i ? m[i - 1] : 0.0));
    }
    out.us.push_back(median(d));
  }
  std::vector<double> totals;
  for (const auto& m : marks) totals.push_back(m.empty() ? 0.0 : m.back());
  out.total_us = median(totals);
  return out;
}

#if !FP8PROJ_WITH_CUDA
struct MlaDecodeGraph::Impl {};
MlaDecodeGraph::MlaDecodeGraph(MlaBlock&, const bf16*, const MlaDecodeBatch&, bf16*) {
  FP8PROJ_FAIL("MlaDecodeGraph needs a CUDA build and a GPU");
}
MlaDecodeGraph::MlaDecodeGraph(MlaBlock&, const bf16*, const bf16*, float, const MlaDecodeBatch&, bf16*) {
  FP8PROJ_FAIL("MlaDecodeGraph needs a CUDA build and a GPU");
}
MlaDecodeGraph::~MlaDecodeGraph() = default;
void MlaDecodeGraph::replay(StreamHandle) { FP8PROJ_FAIL("MlaDecodeGraph needs a CUDA build and a GPU"); }
#endif

}  // namespace fp8proj

// One rank's MLA weights (src/mla/weights.hpp): shard, permute and transpose at load.
#include "mla/weights.hpp"

#include <vector>

#include "fp8proj/error.hpp"
#include "fp8proj/random.hpp"
#include "mla/mla_ops.hpp"

namespace fp8proj::mla {

namespace {

// The full (unsharded) tensors, all in one memory space.
struct FullTensors {
  MemorySpace space = MemorySpace::host;
  const bf16 *q_a = nullptr, *q_a_norm = nullptr, *q_b = nullptr, *kv_a = nullptr, *kv_a_norm = nullptr,
             *kv_b = nullptr, *o = nullptr;
};

Buffer alloc(MemorySpace space, int64_t count) { return Buffer(space, static_cast<size_t>(count) * sizeof(bf16)); }

MlaWeights build(MemorySpace space, const MlaConfig& c, const FullTensors& t) {
  c.validate();
  const MlaOps& ops = mla_ops(space);
  const int64_t H = c.local_heads(), h0 = int64_t{c.tp_rank} * H;
  const int64_t hidden = c.hidden, q_lora = c.q_lora_rank, kv_lora = c.kv_lora_rank, rope = c.qk_rope_dim;
  const int64_t nope = c.qk_nope_dim, v = c.v_head_dim, qk = c.qk_head_dim(), q_in = c.q_in_dim();

  MlaWeights w;
  w.fused_qkv_a = alloc(space, c.qkv_a_dim() * hidden);
  bf16* fused = w.fused_qkv_a.data<bf16>();
  if (c.has_q_lora()) ops.copy_2d(fused, hidden, t.q_a, t.space, hidden, q_lora, hidden);
  ops.copy_2d(fused + q_lora * hidden, hidden, t.kv_a, t.space, hidden, kv_lora + rope, hidden);
  if (c.has_q_lora()) {
    w.q_a_norm = alloc(space, q_lora);
    ops.copy_2d(w.q_a_norm.data<bf16>(), q_lora, t.q_a_norm, t.space, q_lora, 1, q_lora);
  }
  w.kv_a_norm = alloc(space, kv_lora);
  ops.copy_2d(w.kv_a_norm.data<bf16>(), kv_lora, t.kv_a_norm, t.space, kv_lora, 1, kv_lora);

  // Column-parallel by heads: the rank's heads are H*qk consecutive rows.
  w.q_b = alloc(space, H * qk * q_in);
  ops.copy_2d(w.q_b.data<bf16>(), q_in, t.q_b + h0 * qk * q_in, t.space, q_in, H * qk, q_in);

  // kv_b_proj head h holds rows [h*(nope+v), (h+1)*(nope+v)): nope rows of W_UK, then v rows
  // of W_UV. Each part of each head is one contiguous run, so one strided copy per part moves
  // all heads: "rows" are heads, a row is nope*kv_lora (or v*kv_lora) elements.
  w.kv_b = alloc(space, H * (nope + v) * kv_lora);
  bf16* kv_b = w.kv_b.data<bf16>();
  const bf16* kv_b_src = t.kv_b + h0 * (nope + v) * kv_lora;
  ops.copy_2d(kv_b, nope * kv_lora, kv_b_src, t.space, (nope + v) * kv_lora, H, nope * kv_lora);
  ops.copy_2d(kv_b + H * nope * kv_lora, v * kv_lora, kv_b_src + nope * kv_lora, t.space, (nope + v) * kv_lora, H,
              v * kv_lora);
  w.w_uk_t = alloc(space, H * kv_lora * nope);
  ops.transpose_heads(kv_b, w.w_uk_t.data<bf16>(), static_cast<int>(H), nope, kv_lora);

  // Row-parallel: the rank's columns of every row.
  w.o = alloc(space, hidden * H * v);
  ops.copy_2d(w.o.data<bf16>(), H * v, t.o + h0 * v, t.space, int64_t{c.heads} * v, hidden, H * v);
  return w;
}

}  // namespace

MlaWeights MlaWeights::from_host(MemorySpace space, const MlaConfig& c, const MlaHostWeights& w) {
  const std::string who = "MLA weights (" + c.model + "): ";
  if (c.has_q_lora()) {
    FP8PROJ_CHECK(w.q_a_proj && w.q_a_layernorm, who, "q_a_proj and q_a_layernorm are required with q_lora_rank ",
                  c.q_lora_rank);
  } else {
    FP8PROJ_CHECK(!w.q_a_proj, who, "q_a_proj given, but the config has no q LoRA (q_lora_rank 0): pass q_proj as "
                  "q_b_proj");
  }
  FP8PROJ_CHECK(w.q_b_proj, who, c.has_q_lora() ? "q_b_proj" : "q_proj (as q_b_proj)", " is null");
  FP8PROJ_CHECK(w.kv_a_proj_with_mqa && w.kv_a_layernorm && w.kv_b_proj && w.o_proj, who,
                "kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj and o_proj are all required");
  FullTensors t;
  t.space = MemorySpace::host;
  t.q_a = w.q_a_proj;
  t.q_a_norm = w.q_a_layernorm;
  t.q_b = w.q_b_proj;
  t.kv_a = w.kv_a_proj_with_mqa;
  t.kv_a_norm = w.kv_a_layernorm;
  t.kv_b = w.kv_b_proj;
  t.o = w.o_proj;
  return build(space, c, t);
}

MlaWeights MlaWeights::random(MemorySpace space, const MlaConfig& c, uint64_t seed, float stddev) {
  c.validate();
  const int64_t heads = c.heads, qk = c.qk_head_dim();
  // Full tensors are generated where they will live (a device fill for device blocks: GLM-5's
  // o_proj alone is 201 MB) and freed once the shards are copied out.
  auto normal = [&](int64_t count, uint64_t stream) {
    Buffer b = alloc(space, count);
    fill_normal(space, b.data<bf16>(), count, seed * 64 + stream, stddev);
    return b;
  };
  auto norm = [&](int64_t count, uint64_t stream) {
    std::vector<float> g(static_cast<size_t>(count));
    fill_normal(MemorySpace::host, g.data(), count, seed * 64 + stream, 0.05f);
    std::vector<bf16> h(g.size());
    for (size_t i = 0; i < g.size(); ++i) h[i] = float_to_bf16(1.0f + g[i]);
    Buffer b = alloc(space, count);
    copy_bytes(b.data(), space, h.data(), MemorySpace::host, b.bytes());
    return b;
  };
  Buffer q_a, q_a_norm;
  if (c.has_q_lora()) {
    q_a = normal(c.q_lora_rank * c.hidden, 1);
    q_a_norm = norm(c.q_lora_rank, 2);
  }
  Buffer q_b = normal(heads * qk * c.q_in_dim(), 3);
  Buffer kv_a = normal((c.kv_lora_rank + c.qk_rope_dim) * c.hidden, 4);
  Buffer kv_a_norm = norm(c.kv_lora_rank, 5);
  Buffer kv_b = normal(heads * (c.qk_nope_dim + c.v_head_dim) * c.kv_lora_rank, 6);
  Buffer o = normal(c.hidden * heads * c.v_head_dim, 7);
  FullTensors t;
  t.space = space;
  t.q_a = q_a.data<bf16>();
  t.q_a_norm = q_a_norm.data<bf16>();
  t.q_b = q_b.data<bf16>();
  t.kv_a = kv_a.data<bf16>();
  t.kv_a_norm = kv_a_norm.data<bf16>();
  t.kv_b = kv_b.data<bf16>();
  t.o = o.data<bf16>();
  return build(space, c, t);
}

size_t MlaWeights::bytes() const {
  return fused_qkv_a.bytes() + q_a_norm.bytes() + q_b.bytes() + kv_a_norm.bytes() + kv_b.bytes() + w_uk_t.bytes() +
         o.bytes();
}

}  // namespace fp8proj::mla

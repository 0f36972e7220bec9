// Host reference attention (see attention_cpu.hpp). Work is split into (sequence, head, 64-row
// chunk) items for parallel_for; each item converts the keys and values it can see to fp32 once.
#include "mla/attention_cpu.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/parallel.hpp"
#include "fp8proj/bf16.hpp"

namespace fp8proj::cpu {

namespace {

constexpr int64_t kRowChunk = 64;

// fp32 dot product with 8 independent partial sums (vectorizes without reassociation flags),
// added in fp64.
double dot(const float* a, const float* b, int n) {
  float acc[8] = {};
  int i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  double sum = 0;
  for (int j = 0; j < 8; ++j) sum += acc[j];
  for (; i < n; ++i) sum += static_cast<double>(a[i]) * b[i];
  return sum;
}

void to_float(const bf16* src, int n, float* dst) {
  for (int i = 0; i < n; ++i) dst[i] = bf16_to_float(src[i]);
}

// out[0, d_v) = softmax(scale * scores) . values, where scores[j] = q . keys[j] for j < n_keys;
// keys are rows of `keys` (stride d_qk floats), values rows of `values` (stride d_v floats).
void attend(const float* q, const float* keys, const float* values, int64_t n_keys, int d_qk, int d_v, float scale,
            std::vector<double>& scores, std::vector<double>& acc, bf16* out) {
  if (n_keys <= 0) {
    for (int d = 0; d < d_v; ++d) out[d] = float_to_bf16(0.0f);
    return;
  }
  scores.resize(static_cast<size_t>(n_keys));
  double mx = -INFINITY;
  for (int64_t j = 0; j < n_keys; ++j) {
    scores[j] = static_cast<double>(scale) * dot(q, keys + j * d_qk, d_qk);
    mx = std::max(mx, scores[j]);
  }
  acc.assign(static_cast<size_t>(d_v), 0.0);
  double sum = 0;
  for (int64_t j = 0; j < n_keys; ++j) {
    const double p = std::exp(scores[j] - mx);
    sum += p;
    const float* v = values + j * d_v;
    for (int d = 0; d < d_v; ++d) acc[d] += p * v[d];
  }
  for (int d = 0; d < d_v; ++d) out[d] = float_to_bf16(static_cast<float>(acc[d] / sum));
}

}  // namespace

void prefill_attention(const PrefillAttentionArgs& a) {
  struct Item {
    int seq, head;
    int64_t row0, row1;  // sequence-local query rows
  };
  std::vector<Item> items;
  for (int b = 0; b < a.num_seqs; ++b) {
    const int64_t len = a.seq_offsets[b + 1] - a.seq_offsets[b];
    for (int h = 0; h < a.heads; ++h)
      for (int64_t r = 0; r < len; r += kRowChunk) items.push_back({b, h, r, std::min(len, r + kRowChunk)});
  }
  parallel_for(static_cast<int64_t>(items.size()), 1, [&](int64_t begin, int64_t end) {
    std::vector<float> q(a.d_qk), keys, values;
    std::vector<double> scores, acc;
    for (int64_t it = begin; it < end; ++it) {
      const Item& item = items[static_cast<size_t>(it)];
      const int64_t t0 = a.seq_offsets[item.seq];
      const int64_t n_keys = item.row1;  // causal: the chunk's last row sees keys [0, row1)
      keys.resize(static_cast<size_t>(n_keys * a.d_qk));
      values.resize(static_cast<size_t>(n_keys * a.d_v));
      for (int64_t j = 0; j < n_keys; ++j) {
        to_float(a.k + (t0 + j) * a.k_stride + int64_t{item.head} * a.d_qk, a.d_qk, keys.data() + j * a.d_qk);
        to_float(a.v + (t0 + j) * a.v_stride + int64_t{item.head} * a.d_v, a.d_v, values.data() + j * a.d_v);
      }
      for (int64_t r = item.row0; r < item.row1; ++r) {
        to_float(a.q + (t0 + r) * a.q_stride + int64_t{item.head} * a.d_qk, a.d_qk, q.data());
        bf16* out = a.out + ((t0 + r) * a.heads + item.head) * a.d_v;
        attend(q.data(), keys.data(), values.data(), r + 1, a.d_qk, a.d_v, a.softmax_scale, scores, acc, out);
      }
    }
  });
}

void decode_attention(const DecodeAttentionArgs& a) {
  const int d_qk = a.kv_lora + a.d_rope;
  // Items of (sequence, group of kHeadChunk heads): a batch of one still uses every core.
  constexpr int kHeadChunk = 8;
  const int64_t chunks = (a.heads + kHeadChunk - 1) / kHeadChunk;
  parallel_for(int64_t{a.batch} * chunks, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> q(d_qk), keys, values;
    std::vector<double> scores, acc;
    for (int64_t it = begin; it < end; ++it) {
      const int64_t b = it / chunks;
      const int h0 = static_cast<int>(it % chunks) * kHeadChunk, h1 = std::min(a.heads, h0 + kHeadChunk);
      const int64_t start = a.cache_start[b], len = std::max(0, a.cache_len[b]);
      // K rows are whole cache rows; V rows are their first kv_lora columns.
      keys.resize(static_cast<size_t>(len * d_qk));
      values.resize(static_cast<size_t>(len * a.kv_lora));
      for (int64_t t = 0; t < len; ++t) {
        to_float(a.cache + (start + t) * d_qk, d_qk, keys.data() + t * d_qk);
        std::copy_n(keys.data() + t * d_qk, a.kv_lora, values.data() + t * a.kv_lora);
      }
      for (int h = h0; h < h1; ++h) {
        const int64_t bh = b * a.heads + h;
        to_float(a.q_latent + bh * a.kv_lora, a.kv_lora, q.data());
        to_float(a.q_rope + bh * a.d_rope, a.d_rope, q.data() + a.kv_lora);
        attend(q.data(), keys.data(), values.data(), len, d_qk, a.kv_lora, a.softmax_scale, scores, acc,
               a.out_latent + bh * a.kv_lora);
      }
    }
  });
}

}  // namespace fp8proj::cpu

// The MLA block in the soak (soak.hpp, MlaDraw / MlaRunner; --paths mla, on the GPU). An
// iteration builds (or reuses) a device block and a host block of one model's attention at
// tensor-parallel rank 0, on the same host-generated weights; fills the cache rows of a random
// decode batch with the same random rows in both; runs, one iteration in three, a short prefill
// on both; then the decode step on the device eagerly and as a captured graph replayed 1-3 times,
// each into a guarded, poisoned output, and on the host once. Half the iterations start from the
// residual stream (the decoder layer's input RMSNorm inside the block's steps, fused with
// fused_qkv_a's quantization on its FP8 path). A server runs exactly this step for weeks: what the
// GEMM iterations cannot see (the block's small kernels, the decode attention, the absorbed
// projections, PDL between them, the graph) is checked here.
#include <algorithm>
#include <cmath>
#include <numeric>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "fp8proj/error.hpp"
#include "fp8proj/random.hpp"
#include "fp8proj/reference.hpp"
#include "soak.hpp"

namespace fp8proj::cli::soak {

namespace {

// A key no GEMM iteration's Rng uses: the MLA coin and draw of iteration i are Rng(seed, i ^ key).
constexpr uint64_t kMlaKey = 0x4D4C41ull << 40;  // "MLA"
// The residual coin's own stream: the draws above it stay what they were for every seed.
constexpr uint64_t kResidualKey = 0x524553ull << 16;  // "RES"

constexpr int kMaxBatch = 32;        // decode sequences (the host attention costs ~1 s at the top)
constexpr int kMaxContext = 2048;    // cache rows per sequence
constexpr int64_t kMaxPrefill = 256;  // prefill tokens (the host GEMMs: ~0.4 GFLOP a token)
constexpr int64_t kCacheRows = int64_t{kMaxBatch} * (kMaxContext + 1) + kMaxPrefill + 64;

const char* const kModels[] = {"glm5", "deepseek-v3"};

// Non-overlapping row ranges of the given sizes in [0, capacity), in a random order with random
// gaps; with `flush_end` the last one ends on the cache's last row (the decode attention's whole
// 64-row blocks then reach past the cache: TMA zero-fill).
std::vector<int32_t> place(Rng& rng, const std::vector<int32_t>& sizes, int64_t capacity, bool flush_end) {
  std::vector<size_t> order(sizes.size());
  std::iota(order.begin(), order.end(), size_t{0});
  for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[static_cast<size_t>(rng.uniform(0, int64_t(i) - 1))]);
  const int64_t used = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
  int64_t slack = capacity - used;
  FP8PROJ_CHECK(slack >= 0, "soak: MLA rows do not fit the cache");
  std::vector<int32_t> start(sizes.size());
  int64_t pos = 0;
  for (size_t j = 0; j < order.size(); ++j) {
    const bool last = j + 1 == order.size();
    const int64_t gap = last && flush_end ? slack : rng.uniform(0, std::min<int64_t>(slack, 300));
    pos += gap;
    slack -= gap;
    start[order[j]] = static_cast<int32_t>(pos);
    pos += sizes[order[j]];
  }
  return start;
}

std::string join(const std::vector<int32_t>& v) { return fmt::format("{}", fmt::join(v, ",")); }

}  // namespace

// ---- the draw ----

bool mla_iteration(const DrawSpace& space, uint64_t seed, uint64_t iteration) {
  if (!space.gpu || !space.mla) return false;
  const bool gemm_paths = space.bf16 || space.fp8 || space.cublaslt || space.rmsnorm || space.quantized;
  return !gemm_paths || Rng(seed, iteration ^ kMlaKey).chance(kMlaShare);
}

MlaDraw draw_mla(const DrawSpace& space, uint64_t seed, uint64_t iteration) {
  Rng rng(seed, ~(iteration ^ kMlaKey));
  MlaDraw d;
  d.seed = seed;
  d.iteration = iteration;
  d.model = kModels[rng.uniform(0, 1)];
  d.tp = rng.chance(0.5) ? 1 : 8;
  // Four block modes (few, so that the cached blocks are reused): bf16; FP8 at every M on the
  // tagged q_b_proj and o_proj; on all four dense GEMMs; the same with o_proj's decode input
  // quantized by the separate pass instead of the absorbed projection's epilogue. FP8 is forced
  // (threshold and decode ceiling 0) because the host block has no tuned table: through the gate
  // the device would run FP8 where the host runs bf16, and the comparison would measure FP8's
  // own error (3.8-5.5e-2 at decode), not a fault.
  const int64_t mode = rng.uniform(0, 3);
  d.fp8 = mode > 0;
  d.forced = true;
  d.all_dense = mode >= 2;
  d.fuse_decode_quant = mode != 3;
  d.residual = Rng(seed, iteration ^ kMlaKey ^ kResidualKey).chance(0.5);
  d.stream = static_cast<int>(rng.uniform(0, space.streams));
  d.replays = static_cast<int>(rng.uniform(1, 3));
  d.data_seed = rng.next();
  if (rng.chance(1.0 / 3)) {  // a short prefill: 1-3 sequences, at most kMaxPrefill tokens
    const int seqs = static_cast<int>(rng.uniform(1, 3));
    int64_t left = rng.log_uniform(1, kMaxPrefill);
    for (int i = 0; i < seqs && left > 0; ++i) {
      const int64_t len = i + 1 == seqs ? left : rng.uniform(1, left);
      d.prefill_lens.push_back(static_cast<int32_t>(len));
      left -= len;
    }
  }
  const int batch = static_cast<int>(rng.log_uniform(1, kMaxBatch));
  std::vector<int32_t> rows;
  for (int b = 0; b < batch; ++b) {
    // Contexts: log-uniform, a third on or next to a 64-row block boundary (the attention's).
    int64_t pos = rng.log_uniform(0, kMaxContext - 1);
    if (rng.chance(1.0 / 3)) pos = std::clamp<int64_t>(pos / 64 * 64 + rng.uniform(-1, 1), 0, kMaxContext - 1);
    d.positions.push_back(static_cast<int32_t>(pos));
    rows.push_back(static_cast<int32_t>(pos + 1));  // the step writes row `pos` too
    d.max_context = std::max(d.max_context, static_cast<int>(pos + 1));
  }
  d.starts = place(rng, rows, kCacheRows, rng.chance(0.5));
  if (!d.prefill_lens.empty()) d.prefill_starts = place(rng, d.prefill_lens, kCacheRows, false);
  return d;
}

std::string MlaDraw::block_key() const {
  return fmt::format("{} TP{} {}{}{}", model, tp, fp8 ? (all_dense ? "fp8 all-dense" : "fp8 q_b+o") : "bf16",
                     fuse_decode_quant ? "" : " separate-quant", residual ? " residual" : "");
}

std::string MlaDraw::variant() const { return block_key(); }

std::string MlaDraw::describe() const {
  return fmt::format(
      "seed {} iteration {}: MLA block {} (rank 0 of {}); prefill {}; decode of {} sequences at positions [{}] "
      "from cache rows [{}] (max context {}), eager then a graph replayed {}x, stream {}",
      seed, iteration, block_key(), tp,
      prefill_lens.empty() ? std::string("none")
                           : fmt::format("lengths [{}] at cache rows [{}]", join(prefill_lens), join(prefill_starts)),
      positions.size(), join(positions), join(starts), max_context, replays, Streams::name(stream));
}

// ---- the blocks ----

struct MlaRunner::Pair {
  std::string key;
  MlaConfig config;
  std::unique_ptr<MlaBlock> host, dev;
  Buffer input_norm;                       // the decoder layer's input RMSNorm weight, on the device
  const bf16* input_norm_host = nullptr;   // the same on the host (the model's Weights)
};

// A model's full (unsharded) weights on the host, N(0, 1/fan_in) so that every projection's
// output is O(1), norm weights 1 + N(0, 0.05^2); element i of tensor j depends on (j, i) only.
// Kept per model: every rank and mode of it shards the same tensors.
struct MlaRunner::Weights {
  std::vector<std::vector<bf16>> t;
  MlaHostWeights view;
  const bf16* input_norm = nullptr;  // [hidden]: the decoder layer's input RMSNorm (residual mode)
};

MlaRunner::MlaRunner(const Streams& streams, std::function<void(const Launch&)> on_launch)
    : streams_(streams), on_launch_(std::move(on_launch)), out_(MemorySpace::device) {}

MlaRunner::~MlaRunner() = default;

std::unique_ptr<MlaRunner::Weights> MlaRunner::make_weights(const MlaConfig& c) {
  auto w = std::make_unique<Weights>();
  w->t.reserve(7);
  auto normal = [&](int64_t rows, int64_t cols, uint64_t stream) {
    std::vector<bf16> v(static_cast<size_t>(rows * cols));
    fill_normal(MemorySpace::host, v.data(), rows * cols, 0x50A4ull * 64 + stream, 1.0f / std::sqrt(float(cols)));
    w->t.push_back(std::move(v));
    return w->t.back().data();
  };
  auto near_one = [&](int64_t n, uint64_t stream) {
    std::vector<float> g(static_cast<size_t>(n));
    fill_normal(MemorySpace::host, g.data(), n, 0x50A4ull * 64 + stream, 0.05f);
    std::vector<bf16> v(g.size());
    for (size_t i = 0; i < g.size(); ++i) v[i] = float_to_bf16(1.0f + g[i]);
    w->t.push_back(std::move(v));
    return w->t.back().data();
  };
  const int64_t heads = c.heads;
  w->view.q_a_proj = normal(c.q_lora_rank, c.hidden, 1);
  w->view.q_a_layernorm = near_one(c.q_lora_rank, 2);
  w->view.q_b_proj = normal(heads * c.qk_head_dim(), c.q_lora_rank, 3);
  w->view.kv_a_proj_with_mqa = normal(c.kv_lora_rank + c.qk_rope_dim, c.hidden, 4);
  w->view.kv_a_layernorm = near_one(c.kv_lora_rank, 5);
  w->view.kv_b_proj = normal(heads * (c.qk_nope_dim + c.v_head_dim), c.kv_lora_rank, 6);
  w->view.o_proj = normal(c.hidden, heads * c.v_head_dim, 7);
  w->input_norm = near_one(c.hidden, 8);
  return w;
}

MlaRunner::Pair& MlaRunner::pair(const MlaDraw& d) {
  const std::string key = d.block_key();
  for (auto it = pairs_.begin(); it != pairs_.end(); ++it)
    if ((*it)->key == key) {
      pairs_.splice(pairs_.begin(), pairs_, it);
      return *pairs_.front();
    }
  while (pairs_.size() >= kMaxPairs) pairs_.pop_back();
  auto p = std::make_unique<Pair>();
  p->key = key;
  p->config = MlaConfig::preset(d.model, d.tp, 0);
  const MlaConfig& c = p->config;
  std::unique_ptr<Weights>& wp = weights_[d.model];
  if (!wp) wp = make_weights(MlaConfig::preset(d.model, 1, 0));
  const MlaHostWeights& w = wp->view;
  MlaOptions o;
  o.tagged.fp8 = d.fp8;
  o.tagged.apply_env = false;
  o.tagged.policy = Fp8Policy::all;
  if (d.forced) {  // (always: see draw_mla)
    o.tagged.threshold = 0;
    o.tagged.decode_ceiling = 0;
  }
  o.fp8_fused_qkv_a = o.fp8_kv_b_proj = d.all_dense;
  o.fuse_decode_quant = d.fuse_decode_quant;
  o.residual_input = d.residual;
  o.max_tokens = kMaxPrefill;
  o.max_batch = kMaxBatch;
  o.cache_capacity = kCacheRows;
  p->host = std::make_unique<MlaBlock>(MemorySpace::host, c, w, o);
  p->dev = std::make_unique<MlaBlock>(MemorySpace::device, c, w, o);
  p->input_norm = Buffer(MemorySpace::device, static_cast<size_t>(c.hidden) * sizeof(bf16));
  copy_bytes(p->input_norm.data(), MemorySpace::device, wp->input_norm, MemorySpace::host, p->input_norm.bytes());
  p->input_norm_host = wp->input_norm;
  pairs_.push_front(std::move(p));
  return *pairs_.front();
}

// ---- one iteration ----

IterationResult MlaRunner::run(const MlaDraw& d) {
  IterationResult r;
  try {
    Pair& p = pair(d);
    MlaBlock& host = *p.host;
    MlaBlock& dev = *p.dev;
    const MlaConfig& c = p.config;
    const int64_t hidden = c.hidden, cw = c.cache_width();
    const int B = static_cast<int>(d.positions.size());
    const StreamHandle s = streams_.get(d.stream);
    r.explains.push_back(dev.explain(B).to_string());
    // The host block is the reference only where it takes the device's paths.
    auto same_paths = [&](int64_t m) {
      for (const MlaProjection which : {MlaProjection::fused_qkv_a, MlaProjection::q_b_proj, MlaProjection::kv_b_proj,
                                        MlaProjection::o_proj}) {
        const Path pd = dev.projection(which).path_for(m), ph = host.projection(which).path_for(m);
        FP8PROJ_CHECK(pd == ph, "soak: at M = ", m, " ", to_string(which), " runs ", to_string(pd),
                      " on the device block and ", to_string(ph), " on the host block: no reference");
      }
    };
    same_paths(B);
    auto launch = [&](const std::string& what, bool graph) {
      Launch l;
      l.path = "mla";
      l.variant = d.variant();
      l.stream = d.stream;
      l.graph = graph;
      l.text = fmt::format("seed {} iteration {}: MLA {} {}; stream {}", d.seed, d.iteration, d.block_key(), what,
                           Streams::name(d.stream));
      on_launch_(l);
    };
    auto to_device_i32 = [](const std::vector<int32_t>& v) {
      Buffer b(MemorySpace::device, v.size() * sizeof(int32_t));
      copy_bytes(b.data(), MemorySpace::device, v.data(), MemorySpace::host, b.bytes());
      return b;
    };
    auto to_device_bf16 = [](const std::vector<bf16>& v) {
      Buffer b(MemorySpace::device, v.size() * sizeof(bf16));
      copy_bytes(b.data(), MemorySpace::device, v.data(), MemorySpace::host, b.bytes());
      return b;
    };
    std::vector<uint16_t> bits, first;
    auto check = [&](int o, const std::vector<bf16>& want, double tol, const std::vector<uint16_t>* equal_to) {
      OutputCheck chk;
      chk.guard = out_.check_guards(o);
      if (chk.guard.before || chk.guard.after)
        chk.problems.push_back(fmt::format("guard bytes changed: {} before, {} after (first at offset {})",
                                           chk.guard.before, chk.guard.after, chk.guard.first));
      out_.fetch(o, bits);
      for (const uint16_t b : bits) {
        chk.unwritten += b == kPoison;
        chk.non_finite += b != kPoison && !std::isfinite(bf16_to_float(bf16::from_bits(b)));
      }
      if (chk.unwritten) chk.problems.push_back(fmt::format("{} elements never written", chk.unwritten));
      if (chk.non_finite) chk.problems.push_back(fmt::format("{} elements not finite", chk.non_finite));
      chk.compared = true;
      static_assert(sizeof(bf16) == sizeof(uint16_t), "an output's bits are its bf16 values");
      chk.rel_err = compare(reinterpret_cast<const bf16*>(bits.data()), want.data(), static_cast<int64_t>(want.size()))
                        .rel_frobenius;
      chk.tol = tol;
      if (!(chk.rel_err <= tol))
        chk.problems.push_back(fmt::format("relative error {:.3e} against the host block, above {:.1e}", chk.rel_err, tol));
      if (equal_to && bits != *equal_to) {
        chk.bits_differ = true;
        chk.problems.push_back("bits differ from the eager step's output");
      }
      r.guard_writes += (chk.guard.before || chk.guard.after) ? 1 : 0;
      r.wrong_outputs += (chk.unwritten || chk.non_finite || !(chk.rel_err <= tol) || chk.bits_differ) ? 1 : 0;
      r.checks.push_back(std::move(chk));
    };
    const double tol = d.fp8 ? kMlaTolFp8 : kMlaTolBf16;
    const float eps = c.rms_norm_eps;  // the input RMSNorm's (residual mode)

    // ---- prefill (both blocks), into its own cache rows ----
    if (!d.prefill_lens.empty()) {
      std::vector<int32_t> offsets{0};
      for (const int32_t l : d.prefill_lens) offsets.push_back(offsets.back() + l);
      const int64_t T = offsets.back();
      same_paths(T);
      std::vector<bf16> x(static_cast<size_t>(T * hidden));
      fill_normal(MemorySpace::host, x.data(), T * hidden, d.data_seed, 1.0f);
      std::vector<bf16> want(x.size());
      const MlaPrefillBatch hb{static_cast<int>(d.prefill_lens.size()), offsets.data(), d.prefill_starts.data(), nullptr};
      if (d.residual)
        host.prefill_residual(x.data(), p.input_norm_host, eps, hb, want.data());
      else
        host.prefill(x.data(), hb, want.data());
      const Buffer dx = to_device_bf16(x), doff = to_device_i32(offsets), dstart = to_device_i32(d.prefill_starts);
      out_.prepare(1, T, hidden);
      device_synchronize();
      launch(fmt::format("prefill of {} tokens{}", T, d.residual ? " from the residual stream" : ""), false);
      const MlaPrefillBatch db{static_cast<int>(d.prefill_lens.size()), doff.data<int32_t>(), dstart.data<int32_t>(),
                               offsets.data()};
      if (d.residual)
        dev.prefill_residual(dx.data<bf16>(), p.input_norm.data<bf16>(), eps, db, out_.out(0), s);
      else
        dev.prefill(dx.data<bf16>(), db, out_.out(0), s);
      synchronize(s);
      r.outputs.push_back(fmt::format("prefill output [{} x {}]", T, hidden));
      check(0, want, tol, nullptr);
    }

    // ---- the decode batch's cache rows: the same random rows in both caches ----
    for (int b = 0; b < B; ++b) {
      const int64_t rows = d.positions[b];  // rows [start, start + pos); the step writes row pos itself
      if (rows == 0) continue;
      std::vector<bf16> v(static_cast<size_t>(rows * cw));
      fill_normal(MemorySpace::host, v.data(), rows * cw, d.data_seed + 1 + static_cast<uint64_t>(b), 1.0f);
      const int64_t at = int64_t{d.starts[b]} * cw;
      std::copy(v.begin(), v.end(), host.cache() + at);
      copy_bytes(dev.cache() + at, MemorySpace::device, v.data(), MemorySpace::host, v.size() * sizeof(bf16));
    }
    std::vector<bf16> x(static_cast<size_t>(B * hidden));
    fill_normal(MemorySpace::host, x.data(), B * hidden, d.data_seed + 1000003, 1.0f);
    std::vector<bf16> want(x.size());
    const MlaDecodeBatch hbatch{B, d.positions.data(), d.starts.data(), d.max_context};
    if (d.residual)
      host.decode_residual(x.data(), p.input_norm_host, eps, hbatch, want.data());
    else
      host.decode(x.data(), hbatch, want.data());
    const Buffer dx = to_device_bf16(x), dpos = to_device_i32(d.positions), dstart = to_device_i32(d.starts);
    const MlaDecodeBatch batch{B, dpos.data<int32_t>(), dstart.data<int32_t>(), d.max_context};
    out_.prepare(2, B, hidden);
    device_synchronize();
    launch(fmt::format("decode of {} sequences, eager", B), false);
    if (d.residual)
      dev.decode_residual(dx.data<bf16>(), p.input_norm.data<bf16>(), eps, batch, out_.out(0), s);
    else
      dev.decode(dx.data<bf16>(), batch, out_.out(0), s);
    synchronize(s);
    r.outputs.push_back(fmt::format("decode output, eager [{} x {}]", B, hidden));
    check(0, want, tol, nullptr);
    first = bits;
    {
      MlaDecodeGraph graph = d.residual
                                 ? MlaDecodeGraph(dev, dx.data<bf16>(), p.input_norm.data<bf16>(), eps, batch, out_.out(1))
                                 : MlaDecodeGraph(dev, dx.data<bf16>(), batch, out_.out(1));
      for (int rep = 0; rep < d.replays; ++rep) {
        out_.poison_async(2, s);  // every replay must write everything (output 0 was checked)
        launch(fmt::format("decode of {} sequences, graph replay {}/{}", B, rep + 1, d.replays), true);
        graph.replay(s);
      }
      synchronize(s);
    }
    r.outputs.push_back(fmt::format("decode output, graph replay [{} x {}]", B, hidden));
    check(1, want, tol, &first);
  } catch (const std::exception& e) {
    r.error = e.what();
    r.context = context_state();
  }
  return r;
}

}  // namespace fp8proj::cli::soak

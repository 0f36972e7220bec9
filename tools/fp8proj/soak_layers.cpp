// The soak's layers (soak.hpp): per weight shape one group of ProjectionLayers sharing one
// ActivationWorkspace, built on first use and reused across iterations, as a server keeps them.
#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "fp8proj/error.hpp"
#include "fp8proj/random.hpp"
#include "fp8proj/reference.hpp"
#include "soak.hpp"

namespace fp8proj::cli::soak {

namespace {

template <typename T>
std::vector<T> download(const void* p, MemorySpace space, size_t count) {
  std::vector<T> out(count);
  copy_bytes(out.data(), MemorySpace::host, p, space, count * sizeof(T));
  return out;
}

// The key of a call's layer in its group.
std::string layer_key(const Call& c) { return c.kind == Kind::config ? "sm90:" + c.config : variant_of(c); }

}  // namespace

LayerGroup::LayerGroup(MemorySpace space, const SoakShape& shape, uint64_t seed, int64_t max_tokens)
    : space_(space), shape_(shape), max_tokens_(max_tokens) {
  const int64_t n = shape.n, k = shape.k;
  // Weights N(0, 0.02^2) as in a trained projection; the same for every run of this seed.
  w_ = Buffer(space, static_cast<size_t>(n * k) * sizeof(bf16));
  fill_normal(space, w_.data<bf16>(), n * k, weight_seed(seed, shape), 0.02f);
  w_host_ = download<bf16>(w_.data(), space, static_cast<size_t>(n * k));
  w_q_ = make_host_fp8_weight(n, k);
  cpu::quantize_weight(w_host_.data(), n, k, w_q_.out());
  // Rows for forward_rmsnorm on the bf16 path too: every layer of the group may take it.
  ws_ = std::make_shared<ActivationWorkspace>(space, max_tokens, round_up(k, 128), true);
}

ProjectionLayer LayerGroup::build(const Call& c) const {
  ProjectionOptions o;
  o.name = fmt::format("{} {}x{} {}", shape_.label, shape_.n, shape_.k, variant_of(c));
  o.max_tokens = max_tokens_;
  o.workspace = ws_;
  o.rmsnorm_input = true;
  o.apply_env = false;  // the soak decides what runs, not FP8PROJ_* knobs
  o.use_tune_table = false;
  if (c.kind != Kind::bf16) {  // FP8 at every M > 0, as `tune --check`'s FP8 variants
    o.fp8 = true;
    o.policy = Fp8Policy::all;
    o.threshold = 0;
    o.decode_ceiling = 0;
  }
  switch (c.kind) {
    case Kind::bf16:
    case Kind::heuristic: break;
    case Kind::tuned: o.use_tune_table = true; break;
    case Kind::cublaslt: o.fp8_backend = "cublaslt_fp8_block"; break;
    case Kind::config: {
      // One bucket over every launch's rows, its verdict FP8, naming the configuration: the
      // selection runs it wherever the plan can (ProjectionLayer::explain says when it cannot).
      TunedShape row;
      row.n = shape_.n;
      row.k = shape_.k;
      row.threshold = 0;
      TunedBucket b;
      b.m_lo = 1;
      b.m_hi = max_tokens_;
      b.fp8_backend = "sm90_fp8_block";
      b.fp8_config = c.config;
      b.bf16_us = 2;
      b.fp8_us = 1;
      row.buckets.push_back(b);
      o.tuned = row;
      break;
    }
  }
  return ProjectionLayer(space_, w_.data<bf16>(), shape_.n, shape_.k, o);
}

void LayerGroup::check_fp8_copy(const ProjectionLayer& l) const {
  const std::optional<Fp8WeightView> w = l.fp8_weight();
  FP8PROJ_CHECK(w.has_value(), l.name(), ": no FP8 weight copy (", l.explain(1).to_string(), ")");
  const auto values = download<uint8_t>(w->values, space_, w_q_.values.size());
  const auto scales = download<float>(w->scales, space_, w_q_.scales.size());
  const auto bad = std::mismatch(values.begin(), values.end(), w_q_.values.begin());
  FP8PROJ_CHECK(bad.first == values.end(), l.name(), ": FP8 weight copy differs from the CPU quantization at byte ",
                bad.first - values.begin());
  FP8PROJ_CHECK(std::memcmp(scales.data(), w_q_.scales.data(), scales.size() * sizeof(float)) == 0, l.name(),
                ": FP8 weight scales differ from the CPU quantization");
}

ProjectionLayer& LayerGroup::layer(const Call& c) {
  const std::string key = layer_key(c);
  auto it = layers_.find(key);
  if (it == layers_.end()) {
    auto l = std::make_unique<ProjectionLayer>(build(c));
    if (c.kind != Kind::bf16) check_fp8_copy(*l);
    it = layers_.emplace(key, std::move(l)).first;
  }
  if (c.kind == Kind::config) {
    // An iteration holds at most 3 calls' layers at once: dropping the least recently used of
    // more than kMaxConfigLayers never drops one it holds.
    static_assert(kMaxConfigLayers > 3);
    config_lru_.remove(key);
    config_lru_.push_front(key);
    if (config_lru_.size() > kMaxConfigLayers) {
      layers_.erase(config_lru_.back());
      config_lru_.pop_back();
    }
  }
  return *it->second;
}

const std::vector<float>& LayerGroup::weight_f32() {
  if (!w_f32_) w_f32_ = cpu::to_float(w_host_.data(), shape_.n * shape_.k);
  return *w_f32_;
}

const std::vector<float>& LayerGroup::weight_dequant() {
  if (!w_deq_) w_deq_ = cpu::dequantize(w_q_.view());
  return *w_deq_;
}

size_t LayerGroup::bytes() const {
  size_t b = w_.bytes() + ws_->bytes();
  for (const auto& [key, l] : layers_) {
    const ProjectionMemory m = l->memory();
    b += m.fp8_values + m.fp8_scales + m.workspace;
  }
  return b;
}

size_t LayerGroup::host_bytes() const {
  size_t b = w_host_.size() * sizeof(bf16) + w_q_.values.size() + w_q_.scales.size() * sizeof(float);
  if (w_f32_) b += w_f32_->size() * sizeof(float);
  if (w_deq_) b += w_deq_->size() * sizeof(float);
  return b;
}

LayerGroup& GroupCache::get(const SoakShape& s, uint64_t seed, int64_t max_tokens) {
  auto it = std::find_if(groups_.begin(), groups_.end(),
                         [&](const Slot& e) { return e.n == s.n && e.k == s.k && e.max_tokens == max_tokens; });
  if (it != groups_.end()) {
    groups_.splice(groups_.begin(), groups_, it);
  } else {
    groups_.push_front({s.n, s.k, max_tokens, std::make_unique<LayerGroup>(space_, s, seed, max_tokens)});
    ++built_;
  }
  // Past the budget, the least recently used go (their memory is freed now, as a server that
  // unloads a model would).
  auto over = [&] {
    size_t dev = 0, host = 0;
    for (const Slot& e : groups_) dev += e.group->bytes(), host += e.group->host_bytes();
    return dev > budget_ || host > host_budget_;
  };
  while (groups_.size() > 1 && over()) groups_.pop_back();
  return *groups_.front().group;
}

}  // namespace fp8proj::cli::soak

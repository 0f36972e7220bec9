#include "fp8proj/error.hpp"
#include "fp8proj/memory.hpp"
#include "fp8proj/projection.hpp"

namespace fp8proj {

struct ActivationWorkspace::Impl {
  MemorySpace space;
  int64_t max_tokens, max_k;
  Buffer values, scales, rows;
};

ActivationWorkspace::ActivationWorkspace(MemorySpace space, int64_t max_tokens, int64_t max_k, bool with_bf16_rows) {
  FP8PROJ_CHECK(max_tokens > 0 && max_tokens % 4 == 0, "workspace max_tokens must be a positive multiple of 4, got ",
                max_tokens);
  FP8PROJ_CHECK(max_k > 0 && max_k % 128 == 0, "workspace max_k must be a positive multiple of 128, got ", max_k);
  impl_ = std::make_unique<Impl>();
  impl_->space = space;
  impl_->max_tokens = max_tokens;
  impl_->max_k = max_k;
  impl_->values = Buffer(space, static_cast<size_t>(max_tokens * max_k));
  impl_->scales = Buffer(space, static_cast<size_t>((max_k / 128) * max_tokens) * sizeof(float));
  if (with_bf16_rows) impl_->rows = Buffer(space, static_cast<size_t>(max_tokens * max_k) * sizeof(bf16));
}

ActivationWorkspace::~ActivationWorkspace() = default;

MemorySpace ActivationWorkspace::space() const { return impl_->space; }
int64_t ActivationWorkspace::max_tokens() const { return impl_->max_tokens; }
int64_t ActivationWorkspace::max_k() const { return impl_->max_k; }
bool ActivationWorkspace::has_bf16_rows() const { return !impl_->rows.empty(); }
size_t ActivationWorkspace::bytes() const {
  return impl_->values.bytes() + impl_->scales.bytes() + impl_->rows.bytes();
}

Fp8ActivationOut ActivationWorkspace::fp8(int64_t m, int64_t k) const {
  FP8PROJ_CHECK(m >= 0 && m <= impl_->max_tokens && k > 0 && k <= impl_->max_k && k % 128 == 0,
                "workspace sized for ", impl_->max_tokens, "x", impl_->max_k, " cannot hold ", m, "x", k);
  // Scales [K/128, round_up(m, 4)] packed at the start of the scale buffer.
  return {impl_->values.data<uint8_t>(), impl_->scales.data<float>(), m, k, activation_scale_ld(m)};
}

bf16* ActivationWorkspace::bf16_rows() const { return impl_->rows.data<bf16>(); }

}  // namespace fp8proj

// A projection holding one rank's shard (include/fp8proj/tp.hpp): a ProjectionLayer over the
// shard, plus the all-reduce of row-parallel partials on the layer's stream.
#include <optional>
#include <string>

#include "core/device_fault.hpp"
#include "fp8proj/error.hpp"
#include "fp8proj/log.hpp"
#include "fp8proj/memory.hpp"
#include "fp8proj/tp.hpp"

namespace fp8proj {

struct ShardedProjection::Impl {
  ShardSpec spec;
  Buffer owned;  // the shard, when it was copied out of a full weight
  std::optional<ProjectionLayer> layer;
  Communicator* comm = nullptr;
  std::string tag;  // "rank 1/2 column 8192x2048"
  std::string refusal;  // why FP8 was asked for but the shard stays bf16 (ShardSpec::fp8_refusal)

  void init(MemorySpace space, const bf16* shard, ProjectionOptions options) {
    const ShardSpec& s = spec;
    FP8PROJ_CHECK(s.n > 0 && s.k > 0 && s.size >= 1 && s.rank >= 0 && s.rank < s.size, options.name,
                  ": invalid shard (", s.describe(), "); make it with column_shard / row_shard");
    if (comm != nullptr) {
      FP8PROJ_CHECK(space == MemorySpace::device, options.name, ": a communicator needs a device layer");
      FP8PROJ_CHECK(comm->rank() == s.rank && comm->size() == s.size, options.name, ": the shard is for rank ", s.rank,
                    "/", s.size, " but the communicator is rank ", comm->rank(), "/", comm->size());
    }
    tag = "rank " + std::to_string(s.rank) + "/" + std::to_string(s.size) + " " + to_string(s.kind) + " " +
          std::to_string(s.n) + "x" + std::to_string(s.k);
    // A shard takes FP8 only when its 128x128 blocks are the full weight's (ShardSpec::fp8_ok:
    // 128-aligned start and size), so that its own FP8 copy is the slice of the full one. The
    // layer alone would accept more (N % 16: a partial last block of its own), e.g. a 192-row
    // TP 8 shard whose second block would be scaled over 64 rows instead of the full weight's
    // 128. Such a shard is kept bf16 here, with the reason.
    const ProjectionOptions resolved = options.apply_env ? options.with_env() : options;
    if (resolved.fp8 && !s.fp8_ok()) {
      refusal = s.fp8_refusal();
      log_once(LogLevel::info, "tp-unaligned:" + options.name, options.name + " stays bf16: " + refusal);
      options = resolved;
      options.fp8 = false;
      options.apply_env = false;
    }
    layer.emplace(space, shard, s.n, s.k, std::move(options));
  }

  // After a sticky CUDA error (core/device_fault.hpp): the communicator is closed, which aborts
  // it on a dead context (no collective of this rank is left for the peers to wait on), and the
  // call fails with the first fault's text.
  void check_usable() {
    if (layer->space() != MemorySpace::device || device_fault() == nullptr) return;
    if (comm != nullptr) comm->close();
    check_device_usable();
  }

  bool needs_reduce(int64_t m) const { return spec.kind == ShardKind::row && spec.size > 1 && m != 0; }

  // Before any work: a forward that cannot finish must not write y first.
  void check_reduce(int64_t m) const {
    if (!needs_reduce(m)) return;
    FP8PROJ_CHECK(comm != nullptr, layer->name(), " (", tag, "): a row-parallel forward sums the ranks' partials and ",
                  "needs a communicator; use forward_partial() to get this rank's partial instead");
  }

  void reduce(bf16* y, int64_t m, StreamHandle stream) {
    if (!needs_reduce(m)) return;
    comm->all_reduce_sum(y, y, m * spec.full_n, stream);
  }
};

ShardedProjection::ShardedProjection(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

ShardedProjection::ShardedProjection(MemorySpace space, const ShardSpec& spec, const bf16* full,
                                     MemorySpace full_space, Communicator* comm, ProjectionOptions options)
    : impl_(std::make_unique<Impl>()) {
  FP8PROJ_CHECK(full != nullptr, options.name, ": full weight pointer is null");
  impl_->spec = spec;
  impl_->comm = comm;
  impl_->owned = Buffer(space, static_cast<size_t>(spec.n * spec.k) * sizeof(bf16));
  copy_shard(impl_->owned.data(), space, full, full_space, spec, sizeof(bf16));
  impl_->init(space, impl_->owned.data<bf16>(), std::move(options));
}

ShardedProjection ShardedProjection::from_shard(MemorySpace space, const ShardSpec& spec, const bf16* shard,
                                                Communicator* comm, ProjectionOptions options) {
  auto impl = std::make_unique<Impl>();
  impl->spec = spec;
  impl->comm = comm;
  impl->init(space, shard, std::move(options));
  return ShardedProjection(std::move(impl));
}

ShardedProjection::~ShardedProjection() = default;
ShardedProjection::ShardedProjection(ShardedProjection&&) noexcept = default;
ShardedProjection& ShardedProjection::operator=(ShardedProjection&&) noexcept = default;

void ShardedProjection::forward(const bf16* x, int64_t m, bf16* y, StreamHandle stream) {
  impl_->check_usable();
  impl_->check_reduce(m);
  impl_->layer->forward(x, m, y, stream);
  impl_->reduce(y, m, stream);
}

void ShardedProjection::forward_partial(const bf16* x, int64_t m, bf16* y, StreamHandle stream) {
  impl_->check_usable();
  impl_->layer->forward(x, m, y, stream);
}

void ShardedProjection::forward_rmsnorm(const bf16* x, int64_t x_stride, const bf16* norm_weight, float eps, int64_t m,
                                        bf16* y, StreamHandle stream) {
  impl_->check_usable();
  FP8PROJ_CHECK(impl_->spec.kind != ShardKind::row, impl_->layer->name(),
                ": forward_rmsnorm on a row shard would normalise a slice of the features; ",
                "normalise the full row before sharding it");
  impl_->layer->forward_rmsnorm(x, x_stride, norm_weight, eps, m, y, stream);
}

Explanation ShardedProjection::explain(int64_t m) const {
  Explanation e = impl_->layer->explain(m);
  e.reason = "[" + impl_->tag + "] " + e.reason;
  if (!impl_->refusal.empty()) e.reason += " (" + impl_->refusal + ")";
  if (impl_->spec.kind == ShardKind::row && impl_->spec.size > 1) e.reason += "; then an all-reduce of the partials";
  return e;
}

Path ShardedProjection::path_for(int64_t m) const { return impl_->layer->path_for(m); }
const ShardSpec& ShardedProjection::spec() const { return impl_->spec; }
ProjectionLayer& ShardedProjection::layer() { return *impl_->layer; }
const ProjectionLayer& ShardedProjection::layer() const { return *impl_->layer; }
Communicator* ShardedProjection::communicator() const { return impl_->comm; }

}  // namespace fp8proj

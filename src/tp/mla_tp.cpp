// The MLA block's side of tensor parallelism (include/fp8proj/tp.hpp): its projections' shards
// from its config, and the all-reduce hook that sums o_proj's partials.
#include "fp8proj/error.hpp"
#include "fp8proj/tp.hpp"

namespace fp8proj {

namespace {
MlaDims dims_of(const MlaConfig& c) {
  return {c.hidden, c.heads, c.q_lora_rank, c.kv_lora_rank, c.qk_nope_dim, c.qk_rope_dim, c.v_head_dim};
}
}  // namespace

ShardSpec q_b_proj_shard(const MlaConfig& c) { return q_b_proj_shard(dims_of(c), c.tp_rank, c.tp_size); }
ShardSpec o_proj_shard(const MlaConfig& c) { return o_proj_shard(dims_of(c), c.tp_rank, c.tp_size); }

MlaAllReduce mla_all_reduce(Communicator& comm) {
  Communicator* c = &comm;
  return [c](bf16* y, int64_t rows, int64_t cols, StreamHandle stream) { c->all_reduce_sum(y, y, rows * cols, stream); };
}

}  // namespace fp8proj

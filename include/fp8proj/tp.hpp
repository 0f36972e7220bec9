// Tensor parallelism (docs/design.md): how the two gated projections of MLA split across
// R ranks, the NCCL communicator that sums the row-parallel partials, and a projection layer
// that holds one rank's shard.
//
//   q_b_proj  W[N, K], N = heads x d_qk   column-parallel: rank r holds rows
//             [r N/R, (r+1) N/R) of W (whole heads), reads the full x[M, K] and writes its
//             own slice y[M, N/R] of the output features. No communication.
//   o_proj    W[N, K], K = heads x d_v    row-parallel: rank r holds columns
//             [r K/R, (r+1) K/R) of W, reads its own slice x[M, K/R] (the attention output of
//             its heads) and writes a partial y_r[M, N]; y = sum_r y_r by an all-reduce.
//
//   Example (GLM-5, R = 2): q_b_proj 16384x2048 -> rank 1 holds rows [8192, 16384), 8192x2048;
//   o_proj 6144x16384 -> rank 1 holds columns [8192, 16384), 6144x8192.
//
// FP8 and block scales. Every rank makes its own FP8 copy from its bf16 shard (ProjectionLayer
// does that), so its 128x128 blocks are the full weight's blocks exactly when the shard's first
// row/column and its extent are multiples of 128. A shard that is not 128-aligned stays bf16
// (said once in the log, shown by explain()). Checkpoint FP8 weights are sliced the same way:
// values and scales together, and only when the scale blocks do not straddle the shard
// boundary — a 576-row shard (4.5 blocks) would need half a scale row, so it is refused and
// the shard is dequantized to bf16 instead. Never is a scale slice rounded to "the nearest"
// block.
//
// Communicators. One NCCL communicator per rank. Two process models:
//   (a) one process drives every GPU of the node: Communicator::create_local(devices) makes
//       all communicators at once (one id, grouped init); each rank is then driven by its own
//       thread (NCCL requires a thread per communicator or group calls).
//   (b) one process per GPU (also across nodes): Communicator::create_from_env() reads the
//       rank from the launcher's variables and the NCCL id from a file or a variable:
//
//   variable                     meaning
//   FP8PROJ_RANK                 global rank (else RANK [torchrun], OMPI_COMM_WORLD_RANK, SLURM_PROCID)
//   FP8PROJ_WORLD_SIZE           number of ranks (else WORLD_SIZE, OMPI_COMM_WORLD_SIZE, SLURM_NTASKS)
//   FP8PROJ_LOCAL_RANK           GPU index on this node (else LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_RANK,
//                                SLURM_LOCALID, else the global rank)
//   FP8PROJ_NCCL_ID_FILE         path: rank 0 writes the id there (atomically), the others wait for it
//                                (use a fresh path per job: a stale file from an earlier job is read
//                                as this job's id and the ranks then time out)
//   FP8PROJ_NCCL_ID              the id as 256 hex digits (made by `fp8proj tp id`); takes precedence
//   FP8PROJ_NCCL_TIMEOUT_S       deadline for init, id-file wait and synchronize() (default 120)
//   FP8PROJ_NCCL_LIBRARY         path of libnccl.so.2 if the default search does not find it
//   FP8PROJ_NCCL_BLOCKING        1: blocking communicators (fallback; init then has no deadline)
//
// NCCL is loaded at run time (dlopen), so the library and the CLI still load, and single-GPU
// work runs, on machines without NCCL; only communicators need it, and say so when it is
// missing. CPU-only builds keep the shard arithmetic and ShardedProjection on the host
// (partials, no communicator); creating a communicator there throws.
//
// Errors never hang silently: init is nonblocking and polled against the deadline; on a
// missing peer, a timeout or an NCCL error the communicator is aborted and an fp8proj::Error
// names the rank and what it waited for. NVLink SHARP (multicast) stays off: where
// NCCL_NVLS_ENABLE is unset it is set to 0 before the first communicator is made.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fp8proj/bf16.hpp"
#include "fp8proj/checkpoint.hpp"
#include "fp8proj/formats.hpp"
#include "fp8proj/mla.hpp"
#include "fp8proj/mla_checkpoint.hpp"
#include "fp8proj/projection.hpp"
#include "fp8proj/tensor.hpp"

namespace fp8proj {

// ---- shard arithmetic (host only; no GPU needed) ----------------------------------------------

enum class ShardKind : uint8_t {
  replicated,  // every rank holds the whole weight (fused_qkv_a, norms, kv_b_proj's replicas)
  column,      // split N (rows of W[N, K], output features): q_b_proj
  row,         // split K (columns of W[N, K], input features): o_proj
};
const char* to_string(ShardKind kind);

struct ShardSpec {
  ShardKind kind = ShardKind::replicated;
  int rank = 0, size = 1;
  int64_t full_n = 0, full_k = 0;      // the unsharded weight W[full_n, full_k]
  int64_t n = 0, k = 0;                // this rank's shard
  int64_t n_offset = 0, k_offset = 0;  // its first row and column in W
  int64_t unit = 1;                    // split granularity (one head's rows or columns)

  // The shard's 128x128 blocks are whole blocks of W: it starts on a block boundary in both
  // dimensions and ends on one or at W's edge. Then checkpoint scales slice with their blocks.
  bool scales_slice_exactly() const;
  // FP8 is possible for this shard: its scales slice exactly and N, K are multiples of 128
  // (the projection layer's eligibility rule, which its FP8 kernels need).
  bool fp8_ok() const;
  // "" when fp8_ok(), else one sentence naming the numbers, e.g. "rank 1/2 column shard
  // 576x1024 starts at row 576, inside 128x128 scale block 4: FP8 needs 128-aligned shards".
  std::string fp8_refusal() const;
  // "rank 1/2 column: rows [8192, 16384) of 16384x2048 -> 8192x2048"
  std::string describe() const;

  int64_t scale_row_offset() const { return n_offset / kScaleBlock; }
  int64_t scale_col_offset() const { return k_offset / kScaleBlock; }
};

// Throw fp8proj::Error unless 0 <= rank < size and the split dimension divides into `size`
// equal whole units (heads): e.g. 64 heads of 256 rows on 3 ranks is refused.
ShardSpec column_shard(int64_t full_n, int64_t full_k, int rank, int size, int64_t unit = 1);
ShardSpec row_shard(int64_t full_n, int64_t full_k, int rank, int size, int64_t unit = 1);
ShardSpec replicated_shard(int64_t full_n, int64_t full_k, int rank, int size);

// The MLA projections' shards from the model dimensions (heads stay whole):
//   q_b_proj: column, N = heads x (qk_nope + qk_rope), K = q_lora_rank (or hidden without q LoRA)
//   o_proj:   row,    N = hidden, K = heads x v_head
ShardSpec q_b_proj_shard(const MlaDims& dims, int rank, int size);
ShardSpec o_proj_shard(const MlaDims& dims, int rank, int size);
// The same for a block's config, at its tp_rank / tp_size (what MlaBlock holds on that rank).
ShardSpec q_b_proj_shard(const MlaConfig& config);
ShardSpec o_proj_shard(const MlaConfig& config);

// Copies this rank's block of a row-major [full_n, full_k] matrix of `elem_bytes`-byte elements
// into a dense [n, k] one. Synchronous (load time); any pair of memory spaces.
void copy_shard(void* dst, MemorySpace dst_space, const void* full, MemorySpace full_space,
                const ShardSpec& spec, size_t elem_bytes);
std::vector<bf16> slice_bf16(const bf16* full, const ShardSpec& spec);  // host to host

// A checkpoint FP8 weight's shard: values [n, k] and scales [ceil(n/128), ceil(k/128)] taken
// with their blocks. Throws (with fp8_refusal()) unless spec.scales_slice_exactly().
HostFp8Weight slice_fp8(const Fp8WeightView& full, const ShardSpec& spec);
// The shard as bf16 from an FP8 weight: each value x its block's scale in fp32, rounded to
// nearest even (as to_bf16() in checkpoint.hpp does) — exact for power-of-two scales.
std::vector<bf16> dequantize_shard(const Fp8WeightView& full, const ShardSpec& spec);

// One rank's shard of a checkpoint projection weight.
struct WeightShard {
  HostWeight weight;  // FP8 (sliced with its scales) or bf16, [spec.n, spec.k]
  std::string note;   // "" or why an FP8 weight became bf16 for this shard
};
// bf16 -> bf16 slice; FP8 -> FP8 slice when the scales slice exactly, else the dequantized
// bf16 slice with `note` saying why (the layer then stays bf16 for this shard).
WeightShard shard_weight(const HostWeight& full, const ShardSpec& spec);

// TP R against TP 1, relative Frobenius difference of the outputs (same path, same data). TP 1
// rounds each output once to bf16: a uniform error of half an ulp, about 1.5e-3 relative rms
// (ulp / sqrt(12) at mid-binade). A row-parallel TP R also rounds every partial and, in NCCL's
// ring, every running sum (R - 1 of them), so the difference is about sqrt(R + 2) roundings:
// 2.6e-3 at R = 2, 4.7e-3 at R = 8 (tests/cpu/tp_shard_test.cpp measures 2.8e-3 and 4.3e-3).
// 1e-2 holds every R <= 8 with a 2x margin, while a mis-sliced shard or a lost partial errs by
// O(1). FP8 shards quantize exactly the full weight's 128x128 blocks and the activations' 1x128
// groups, so the FP8 path meets the same bound.
inline constexpr double kTpRelTol = 1e-2;
// The MLA block at TP R against TP 1. Besides o_proj's partial sums, the block's bf16
// intermediates (q, kv, attention output) may round differently where a GEMM of N/R rows picks
// another kernel or split of K than the N-row one (about 1.5e-3 each where they do); softmax
// and o_proj carry that through. Twice kTpRelTol covers it; a wrong head split or a missing
// all-reduce errs by O(1).
inline constexpr double kTpBlockRelTol = 2e-2;

// ---- launcher environment (host only) ---------------------------------------------------------

// This process's place in a multi-process job, from the variables in the table above.
struct RankEnv {
  int rank = 0, world_size = 1, local_rank = 0;
  std::string source;                  // which variables gave it: "FP8PROJ_RANK", "torchrun (RANK)", ...
  std::optional<std::string> id_file;  // FP8PROJ_NCCL_ID_FILE
  std::optional<std::string> id_hex;   // FP8PROJ_NCCL_ID
};
// nullopt when no launcher variable is set. Throws for malformed or inconsistent values
// (rank >= world size, a world size without a rank, ...), naming the variables.
std::optional<RankEnv> rank_env_from_environment();
// FP8PROJ_NCCL_TIMEOUT_S, default 120 seconds.
double comm_timeout_s();

// An NCCL unique id (ncclUniqueId's 128 bytes), as rank 0 makes it and hands it to the others.
struct CommId {
  std::array<uint8_t, 128> bytes{};
  std::string hex() const;                      // 256 lower-case hex digits
  static CommId from_hex(std::string_view hex);  // throws unless exactly 256 hex digits
};
// Writes the id atomically (a temporary file in the same folder, then rename), so a reader
// never sees half of it.
void write_comm_id_file(const std::string& path, const CommId& id);
// Waits up to timeout_s for the file to appear with a complete id; throws naming the rank,
// the path and the wait when it does not.
CommId read_comm_id_file(const std::string& path, double timeout_s, int rank);

// ---- the communicator (CUDA builds with NCCL at run time) -------------------------------------

enum class CommDtype : uint8_t { bf16, f32, f64, i32 };
enum class CommOp : uint8_t { sum, max, min };

struct CommOptions {
  std::optional<double> timeout_s;  // default: comm_timeout_s()
  std::string name = "tp";          // shown in errors ("tp rank 1/2: ...")
};

class Communicator {
 public:
  // A fresh id (rank 0 calls this and hands the id to the others).
  static CommId new_id();
  // (a) One process, one communicator per GPU: rank i drives devices[i]. Throws if a device
  // repeats or there are more ranks than visible GPUs (naming CUDA_VISIBLE_DEVICES).
  static std::vector<std::unique_ptr<Communicator>> create_local(const std::vector<int>& devices,
                                                                 const CommOptions& options = {});
  // (b) One process per GPU: rank and GPU from rank_env_from_environment(), the id from
  // FP8PROJ_NCCL_ID or FP8PROJ_NCCL_ID_FILE (rank 0 makes and writes it there). Sets the
  // current device to the local rank. Throws if no launcher variables are set, the local rank
  // has no GPU, or no id source is given.
  static std::unique_ptr<Communicator> create_from_env(const CommOptions& options = {});
  // The same with everything explicit (device becomes current).
  static std::unique_ptr<Communicator> create(const CommId& id, int rank, int size, int device,
                                              const CommOptions& options = {});
  // Closes several communicators of one process together, one thread each (finalizing one
  // waits for its peers, so one thread must not finalize them one after the other), and
  // destroys them.
  static void destroy_all(std::vector<std::unique_ptr<Communicator>>& comms);

  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const;
  int size() const;
  int device() const;
  std::string describe() const;  // "tp rank 1/2 on GPU 1 (NCCL 2.28.9)"

  // recv = sum over ranks of send, count bf16 elements, in place when send == recv. Enqueued
  // on `stream` (of this rank's device); no allocation, no host synchronisation once warmed
  // up, so it can be captured in a CUDA graph (capture each rank's stream on its own thread in
  // cudaStreamCaptureModeThreadLocal or Relaxed when one process drives several GPUs).
  void all_reduce_sum(const bf16* send, bf16* recv, int64_t count, StreamHandle stream);
  void all_reduce(const void* send, void* recv, int64_t count, CommDtype dtype, CommOp op,
                  StreamHandle stream);
  // recv[r * count + i] = send_of_rank_r[i].
  void all_gather(const void* send, void* recv, int64_t count, CommDtype dtype, StreamHandle stream);
  // Sets up NCCL's connections with a few all-reduces up to `max_bf16_elements` and waits for
  // them: call once before timing or graph capture (connections are otherwise made lazily,
  // on the first collective that needs them).
  void warm_up(int64_t max_bf16_elements, StreamHandle stream);
  // Waits for `stream` against the deadline, watching NCCL's asynchronous error state. On an
  // error, a timeout or request_abort() it aborts the communicator and throws, naming this
  // rank and `what` ("waiting for o_proj all-reduce").
  void synchronize(StreamHandle stream, std::string_view what);
  // Thread-safe: makes this communicator's next (or current) synchronize() abort and throw.
  // One process driving several ranks calls it on the others when one rank fails.
  void request_abort(std::string reason);
  bool aborted() const;
  // Finalizes (waiting, against the deadline, for the peers to finalize too) and frees the
  // NCCL communicator; aborts it instead after request_abort() or an error. Never throws. The
  // object stays valid (request_abort() from another thread is still safe); the destructor
  // does this if it was not done.
  void close() noexcept;

  struct Impl;  // opaque: src/tp/communicator.cpp

 private:
  explicit Communicator(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// "2.28.9", or "" with *why set when NCCL cannot be loaded (or this build has no CUDA).
std::string nccl_version(std::string* why = nullptr);

// The MLA block's tensor-parallel hook (MlaOptions::all_reduce): sums o_proj's partial outputs
// over the ranks with comm's all-reduce, in place, on the block's stream (graph-capturable).
// comm must outlive the block.
MlaAllReduce mla_all_reduce(Communicator& comm);

// ---- a projection holding one rank's shard ---------------------------------------------------

class ShardedProjection {
 public:
  // Copies this rank's shard out of the full weight [spec.full_n, spec.full_k] (in full_space)
  // into memory the layer owns, in `space`. `comm` (may be null) sums row-parallel partials;
  // it must outlive the layer.
  ShardedProjection(MemorySpace space, const ShardSpec& spec, const bf16* full, MemorySpace full_space,
                    Communicator* comm, ProjectionOptions options = {});
  // A pre-sharded weight [spec.n, spec.k] in `space`, not copied (it must outlive the layer).
  static ShardedProjection from_shard(MemorySpace space, const ShardSpec& spec, const bf16* shard,
                                      Communicator* comm, ProjectionOptions options = {});
  ~ShardedProjection();
  ShardedProjection(ShardedProjection&&) noexcept;
  ShardedProjection& operator=(ShardedProjection&&) noexcept;

  // column:     x[M, full_k] -> y[M, n], output features [n_offset, n_offset + n).
  // row:        x[M, k] (input features [k_offset, k_offset + k)) -> y[M, full_n], the sum over
  //             ranks, all-reduced in place on `stream` (needs a communicator when size > 1).
  // replicated: x[M, full_k] -> y[M, full_n].
  // Graph-capturable as ProjectionLayer::forward and Communicator::all_reduce_sum are.
  void forward(const bf16* x, int64_t m, bf16* y, StreamHandle stream = nullptr);
  // This rank's GEMM only: for row shards y is the partial sum y_r (the caller reduces, e.g.
  // after fusing it with other work); for the others the same as forward().
  void forward_partial(const bf16* x, int64_t m, bf16* y, StreamHandle stream = nullptr);
  // Column / replicated shards: y = rmsnorm(x) . W_shard^T (the norm is over the full K; rows
  // of x are x_stride elements apart, as in ProjectionLayer::forward_rmsnorm).
  void forward_rmsnorm(const bf16* x, int64_t x_stride, const bf16* norm_weight, float eps, int64_t m, bf16* y,
                       StreamHandle stream = nullptr);

  // The layer's explanation, its reason prefixed with the shard ("rank 1/2 column 8192x2048").
  Explanation explain(int64_t m) const;
  Path path_for(int64_t m) const;
  const ShardSpec& spec() const;
  ProjectionLayer& layer();
  const ProjectionLayer& layer() const;
  Communicator* communicator() const;

 private:
  struct Impl;
  explicit ShardedProjection(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace fp8proj

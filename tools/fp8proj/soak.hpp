// `fp8proj soak` (cmd_soak.cpp): a seeded, randomized soak of the library's code paths with
// reference checks and guard regions. The pieces its files share:
//   soak_draw.cpp    what one iteration runs, drawn from (seed, iteration) alone
//   soak_layers.cpp  the layers, cached and reused across iterations as a server would
//   soak_check.cpp   inputs, guarded outputs, the checks against the fp64 oracle
//   soak_run.cpp     one iteration: the calls (eager or a CUDA graph), then the checks
//   soak_device.cpp  streams, CUDA graphs and the device's error state (stubs without CUDA)
//   soak_mla.cpp     the MLA block's iterations (--paths mla): device block against host block
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fp8proj/memory.hpp"
#include "fp8proj/mla.hpp"
#include "fp8proj/projection.hpp"
#include "fp8proj/quantize.hpp"

namespace fp8proj::cli::soak {

// The seed when --seed is not given (docs/robustness.md): a fixed value, so that two runs of
// the same command draw the same work.
inline constexpr uint64_t kDefaultSeed = 1;

// ---- seeded randomness ----------------------------------------------------------------------

// SplitMix64's finalizer: a bijection of 64-bit words whose outputs pass BigCrush as a stream.
uint64_t mix(uint64_t x);

// A small generator for one purpose, seeded by (seed, key): iteration i draws from
// Rng(seed, i) only, so any iteration can be replayed alone.
class Rng {
 public:
  Rng(uint64_t seed, uint64_t key);
  uint64_t next();
  int64_t uniform(int64_t lo, int64_t hi);  // inclusive
  double unit();                            // [0, 1)
  bool chance(double p) { return unit() < p; }
  // exp(uniform(log lo, log(hi + 1))), truncated: every decade is about equally likely.
  int64_t log_uniform(int64_t lo, int64_t hi);

 private:
  uint64_t state_;
};

// ---- what one iteration runs ----------------------------------------------------------------

// The layer entry point an iteration calls.
enum class Entry : uint8_t { forward, rmsnorm, quantized };
// The layer a call runs on; all of one shape share one ActivationWorkspace (as the five
// layers of `tune --check` do).
enum class Kind : uint8_t {
  bf16,       // FP8 off: cuBLASLt bf16 (the CPU reference on the host)
  tuned,      // FP8 at every M, the tuned table's bucket choice (the heuristic without a row)
  heuristic,  // FP8 at every M, no table: the backend's heuristic
  config,     // FP8 at every M, one sm90 configuration forced through a one-bucket tuned row
  cublaslt,   // FP8 at every M on cublaslt_fp8_block
};
const char* to_string(Entry e);
const char* to_string(Kind k);

struct SoakShape {
  int64_t n = 0, k = 0;
  std::string label;  // "deepseek-v3 q_b_proj TP1", "small", "custom", "glm5 ... (scaled)"
};

struct Call {
  Kind kind = Kind::bf16;
  std::string config;  // Kind::config: the configuration's name
  bool flush = false;  // L2 flushed (a write of twice its size) on the stream before the call
};

// The path counts are kept by: bf16, fp8, cublaslt (forward), rmsnorm, quantized.
std::string path_of(Entry e, Kind k);
// What ran, for the per-variant counts: "bf16", "tuned", "heuristic", a configuration name,
// "cublaslt_fp8_block".
std::string variant_of(const Call& c);

struct Draw {
  uint64_t seed = 0, iteration = 0;
  SoakShape shape;
  int64_t m = 0;
  int64_t max_tokens = 0;  // the shape's layers' workspace rows: larger M runs in chunks
  Entry entry = Entry::forward;
  int64_t x_stride = 0;  // elements between input rows (> K: a view into wider rows, rmsnorm)
  float x_stddev = 1;
  int stream = 0;  // 0: the legacy default stream; 1..S: a created stream
  bool graph = false;
  int replays = 1;          // graph: replays of the captured calls
  std::vector<Call> calls;  // back to back on the stream, each into its own guarded output
  int burst = 1;            // the calls (eager) or the replays (graph) this many times over
  bool sync_each = false;   // eager: the stream synchronised after every call, as a timing loop does
  bool twin = false;        // calls[0] once more, eagerly, last: its bits must equal the first's
  int64_t nan_row = -1, nan_col = 0;  // an input element set to NaN (or infinity), row -1: none
  bool nan_inf = false;
  std::vector<int64_t> sample_rows;  // rows checked against the oracle (sorted)
  uint64_t data_seed = 0;
  std::string note;  // e.g. why a forced configuration was not drawn

  int outputs() const { return static_cast<int>(calls.size()) + (twin ? 1 : 0); }
  std::string describe() const;  // one paragraph: everything above
};

// Everything the draw reads, fixed for a run: an iteration's draw depends on this, the seed and
// its index only.
struct DrawSpace {
  bool gpu = false;
  std::vector<SoakShape> model, small;  // the pools (small: the run's own, from the seed)
  double p_model = 0.7;                 // chance of a model shape when both pools are given
  std::vector<int64_t> fixed_m;         // --m: drawn from these only
  int64_t max_m = 0;
  bool chunking = true;  // some shapes' workspaces hold fewer rows than max M (not with --m)
  // Paths allowed (--paths). mla: one iteration in kMlaShare is the MLA block's (GPU only).
  bool bf16 = true, fp8 = true, cublaslt = true, rmsnorm = true, quantized = true, mla = true;
  // FP8 variants allowed (--configs): the tuned layer, the heuristic layer, every configuration
  // of the sm90 family that can run the problem, or the named ones.
  bool tuned = true, heuristic = true, all_configs = true;
  std::vector<std::string> configs;
  int streams = 0;  // created streams (besides the legacy default one)
  bool graphs = false, flush = false;
  int burst = 1;  // --burst
  // The sm90 configurations worth running (m, n, k) (empty without the backend), and whether
  // cublaslt_fp8_block runs (n, k).
  std::function<std::vector<std::string>(int64_t, int64_t, int64_t)> candidates;
  std::function<bool(int64_t, int64_t)> cublaslt_ok;
};

// The model shapes of the tuned table (glm5 and deepseek-v3 dense GEMMs at TP 1/2/4/8), or on
// the CPU the same scaled down so that an iteration takes milliseconds.
std::vector<SoakShape> model_shapes(bool gpu);
// The run's small random legal shapes (N % 16 == 0, K % 128 == 0), drawn from the seed.
std::vector<SoakShape> small_shapes(uint64_t seed, bool gpu);
// A shape's workspace rows: max M (no chunking) or, with `chunking`, for one shape in four a
// third of it, by (seed, shape).
int64_t group_max_tokens(uint64_t seed, const SoakShape& s, int64_t max_m, bool chunking);
uint64_t weight_seed(uint64_t seed, const SoakShape& s);

Draw draw(const DrawSpace& space, uint64_t seed, uint64_t iteration);

// ---- layers ---------------------------------------------------------------------------------

// One weight shape's layers, built on first use and kept: the bf16 weight, one shared
// ActivationWorkspace, a layer per Kind (a forced configuration's layer per name, the least
// recently used dropped past kMaxConfigLayers), and the host data the oracle needs. Every FP8
// layer's weight copy is compared bit for bit with the CPU quantization when it is built.
class LayerGroup {
 public:
  static constexpr size_t kMaxConfigLayers = 8;

  LayerGroup(MemorySpace space, const SoakShape& shape, uint64_t seed, int64_t max_tokens);
  ProjectionLayer& layer(const Call& c);
  const std::vector<float>& weight_f32();      // the bf16 weight, exact in fp32
  const std::vector<float>& weight_dequant();  // its CPU quantization, dequantized
  const bf16* weight() const { return w_.data<bf16>(); }
  size_t bytes() const;       // memory held in the layers' space
  size_t host_bytes() const;  // the oracle's host copies

 private:
  ProjectionLayer build(const Call& c) const;
  void check_fp8_copy(const ProjectionLayer& l) const;

  MemorySpace space_;
  SoakShape shape_;
  int64_t max_tokens_;
  Buffer w_;
  std::vector<bf16> w_host_;
  HostFp8Weight w_q_;
  std::shared_ptr<ActivationWorkspace> ws_;
  std::map<std::string, std::unique_ptr<ProjectionLayer>> layers_;
  std::list<std::string> config_lru_;  // most recent first
  std::optional<std::vector<float>> w_f32_, w_deq_;
};

// Layer groups by shape, the least recently used dropped when their memory (in the layers'
// space, or the oracle's host copies) passes its budget; the one in use always stays.
class GroupCache {
 public:
  GroupCache(MemorySpace space, size_t budget_bytes, size_t host_budget_bytes)
      : space_(space), budget_(budget_bytes), host_budget_(host_budget_bytes) {}
  LayerGroup& get(const SoakShape& s, uint64_t seed, int64_t max_tokens);
  size_t size() const { return groups_.size(); }
  size_t built() const { return built_; }

 private:
  struct Slot {
    int64_t n, k, max_tokens;
    std::unique_ptr<LayerGroup> group;
  };
  MemorySpace space_;
  size_t budget_, host_budget_;
  std::list<Slot> groups_;  // most recent first
  size_t built_ = 0;
};

// ---- inputs, outputs, checks ----------------------------------------------------------------

// A canary byte at offset i of a guard region (position-dependent, so a shifted copy is seen).
inline uint8_t guard_byte(size_t i) { return static_cast<uint8_t>(0xA5u ^ (i * 151u >> 3)); }
inline constexpr size_t kGuardBytes = size_t{64} << 10;  // each side of every output
inline constexpr uint16_t kPoison = 0xFFFF;              // bf16 NaN no kernel writes (theirs: 0x7FFF)

// The iteration's inputs in the layers' space (random, never zeros), and the sampled rows on the
// host for the oracle.
class Inputs {
 public:
  explicit Inputs(MemorySpace space) : space_(space) {}
  void prepare(const Draw& d);
  const bf16* x() const { return x_.data<bf16>(); }
  const bf16* norm_weight() const { return g_.data<bf16>(); }
  Fp8ActivationView quantized() const { return q_.view(); }
  const std::vector<bf16>& rows() const { return rows_; }  // sample_rows x K, dense
  const std::vector<bf16>& norm_host() const { return g_host_; }

 private:
  MemorySpace space_;
  Buffer x_, g_, qv_, qs_;
  Fp8ActivationOut q_;
  std::vector<bf16> rows_, g_host_;
};

// Outputs, each between two guard regions, in one allocation that grows as needed.
class GuardedOutputs {
 public:
  explicit GuardedOutputs(MemorySpace space) : space_(space) {}
  // `count` outputs of m x n bf16: guards filled, outputs poisoned (synchronous).
  void prepare(int count, int64_t m, int64_t n);
  bf16* out(int i) const;
  size_t out_bytes() const { return out_bytes_; }
  // Re-poisons the outputs [0, count) on a stream (between graph replays; capturable).
  void poison_async(int count, StreamHandle stream) const;
  // Guard bytes that differ from the canary (before and after output i), the first offset.
  struct Damage {
    int64_t before = 0, after = 0;
    int64_t first = -1;  // offset from the output's start (negative: before it)
  };
  Damage check_guards(int i) const;
  void fetch(int i, std::vector<uint16_t>& into) const;  // output i's bits (into keeps its capacity)
  // The test seam's corruptions (--inject-fault), written into the buffer itself.
  void poke_guard_after(int i) const;
  void poke_element(int i, int64_t index, uint16_t bits) const;

 private:
  uint8_t* slot(int i) const;
  MemorySpace space_;
  Buffer buf_;
  size_t out_bytes_ = 0, slot_bytes_ = 0;
  int count_ = 0;
  std::vector<uint8_t> canary_;
};

// The fp64 product of the sampled rows' operands as the path sees them: the bf16 operands, or
// the dequantized CPU quantization (RMSNorm first where the entry has it). [rows, N].
std::vector<double> reference_rows(const Draw& d, const Inputs& in, LayerGroup& g, bool fp8);

using Damage = GuardedOutputs::Damage;

// One output's verdict.
struct OutputCheck {
  Damage guard;
  int64_t unwritten = 0;        // still the poison
  int64_t non_finite = 0;       // NaN or infinity outside the planted row
  int64_t nan_row_finite = 0;   // finite outputs in the planted row (must be none)
  double rel_err = 0, tol = 0;  // sampled rows against the oracle
  bool compared = false;        // values compared (M > 0 and a row left after the planted one)
  bool bits_differ = false;     // the twin: bits unlike the first output's
  std::vector<std::string> problems;
  bool ok() const { return problems.empty(); }
  std::string summary() const;
};

// Checks output `i` of call `c`: guards, every element written, finite (the planted row: all NaN
// on the FP8 paths, all non-finite on bf16), the sampled rows within the tolerance of `ref`, and,
// for the twin, bitwise equal to `first`.
OutputCheck check_output(const Draw& d, const GuardedOutputs& out, int i, bool fp8, const std::vector<double>& ref,
                         const std::vector<uint16_t>* first, std::vector<uint16_t>& bits);

// ---- one iteration (soak_run.cpp) ------------------------------------------------------------

// The test seam (--inject-fault KIND:ITER, hidden): after the calls of iteration ITER, the soak
// itself corrupts its first output -- one byte past its end (guard), one sampled value (value),
// or one element re-poisoned (unwritten) -- so that a test can see the checks fail. Nothing in
// the library is touched.
struct Inject {
  std::string kind;  // "" (none), "guard", "value", "unwritten"
  int64_t iteration = -1;
};

// One launch as the failure report lists it.
struct Launch {
  std::string path, variant;  // the counts' keys (path_of, variant_of)
  int stream = 0;
  bool graph = false, flush = false;
  std::string text;  // everything about it, one line
};

struct IterationResult {
  std::vector<std::string> explains;  // per call: the layer's explain(M)
  std::vector<std::string> outputs;   // per output: what wrote it
  std::vector<OutputCheck> checks;    // per output
  std::vector<std::string> notes;     // e.g. a forced configuration that could not run this M
  int config_fallbacks = 0;           // forced configurations the selection could not run
  std::string error;                  // an exception's text (a CUDA error included)
  std::string context;                // after an error on the GPU: context_state()
  int guard_writes = 0;               // outputs with a guard byte changed
  int wrong_outputs = 0;              // outputs unwritten, not finite, wrong or not deterministic
  bool failed() const { return !error.empty() || guard_writes > 0 || wrong_outputs > 0; }
  bool context_dead() const { return context.rfind("dead", 0) == 0; }
};

class Streams;

// ---- the MLA block (soak_mla.cpp) ---------------------------------------------------------------

// The share of iterations that run the MLA block when the path is on (with the GEMM paths): its
// host reference costs about a second, a GEMM iteration's milliseconds.
inline constexpr double kMlaShare = 0.1;

// What an MLA iteration runs, drawn from (seed, iteration) alone like Draw: a block (model,
// tensor-parallel rank 0 of tp, FP8 on or off and how), a short prefill (one iteration in three),
// then a decode step of `positions.size()` sequences over a cache whose rows both blocks share,
// eagerly and captured once (MlaDecodeGraph) and replayed.
struct MlaDraw {
  uint64_t seed = 0, iteration = 0;
  std::string model;  // "glm5", "deepseek-v3"
  int tp = 1;
  bool fp8 = false;
  bool all_dense = false;     // fused_qkv_a and kv_b_proj on the gated FP8 path too
  bool forced = true;         // FP8 at every M (threshold and decode ceiling 0): the host block can follow
  bool fuse_decode_quant = true;
  bool residual = false;      // from the residual stream: the decoder layer's input RMSNorm inside the
                              // step (prefill_residual / decode_residual, MlaDecodeGraph's residual form)
  int stream = 0;
  int replays = 1;            // graph replays (each into the poisoned output)
  std::vector<int32_t> prefill_lens, prefill_starts;  // empty: no prefill
  std::vector<int32_t> positions, starts;             // the decode batch
  int max_context = 0;
  uint64_t data_seed = 0;

  std::string block_key() const;  // the block pair it runs on
  std::string variant() const;    // "deepseek-v3 TP8 fp8 all-dense forced" (the counts' key)
  std::string describe() const;
};

// Whether iteration `iteration` is an MLA one (the draw space allows it and Rng says so), and
// its draw.
bool mla_iteration(const DrawSpace& space, uint64_t seed, uint64_t iteration);
MlaDraw draw_mla(const DrawSpace& space, uint64_t seed, uint64_t iteration);

// Runs MLA iterations: a device block and a host block on the same host-generated weights
// (cached by MlaDraw::block_key, the least recently used of kMaxPairs dropped), the same cache
// rows and inputs; the device outputs guarded and poisoned. Checks: guards, every element
// written and finite, the device output within kMlaTolBf16 / kMlaTolFp8 (relative Frobenius)
// of the host one, and the replayed graph's output bitwise equal to the eager step's.
// Bounds, as the block's GPU tests (mla_gpu_test.cu): bf16, the same roundings on both sides,
// sums in another order and the device attention's bf16 softmax weights; FP8, where inputs to an
// FP8 GEMM that differ by a bf16 ulp land in different e4m3 codes. At the models' dimensions the
// worst seen is 3.3e-3 (bf16) and 2.0e-2 (FP8) over 180 iterations (bench/results/robustness/soak/).
inline constexpr double kMlaTolBf16 = 1e-2, kMlaTolFp8 = 4e-2;
class MlaRunner {
 public:
  static constexpr size_t kMaxPairs = 4;
  MlaRunner(const Streams& streams, std::function<void(const Launch&)> on_launch);
  ~MlaRunner();
  IterationResult run(const MlaDraw& d);

 private:
  struct Pair;
  struct Weights;
  static std::unique_ptr<Weights> make_weights(const MlaConfig& full);
  Pair& pair(const MlaDraw& d);
  const Streams& streams_;
  std::map<std::string, std::unique_ptr<Weights>> weights_;  // by model
  std::function<void(const Launch&)> on_launch_;
  std::list<std::unique_ptr<Pair>> pairs_;  // most recent first
  GuardedOutputs out_;
};

// Runs iterations: the layers (cached), inputs, guarded outputs, the calls on the drawn stream,
// eagerly or as a CUDA graph, and the checks. `on_launch` hears of every launch just before it
// is enqueued (graph replays: each captured call), for the counts and the failure report.
class Runner {
 public:
  Runner(MemorySpace space, const Streams& streams, GroupCache& cache, Inject inject,
         std::function<void(const Launch&)> on_launch);
  IterationResult run(const Draw& d);

 private:
  Launch describe_launch(const Draw& d, size_t call, const std::string& mode) const;
  void enqueue(const Draw& d, size_t call, ProjectionLayer& l, bf16* y, StreamHandle s) const;
  void inject(const Draw& d, IterationResult& r) const;
  void check(const Draw& d, LayerGroup& g, IterationResult& r);

  MemorySpace space_;
  const Streams& streams_;
  GroupCache& cache_;
  Inject inject_;
  std::function<void(const Launch&)> on_launch_;
  Inputs in_;
  GuardedOutputs out_;
  std::vector<std::string> launch_what_;  // per call of the current draw: path via backend [config]
  std::vector<uint16_t> bits_;            // an output's bits on the host
};

// ---- the device (soak_device.cpp) -------------------------------------------------------------

// The created streams: odd ones non-blocking, even ones blocking (synchronised with the legacy
// default stream), as servers use both.
class Streams {
 public:
  explicit Streams(int count);
  ~Streams();
  Streams(const Streams&) = delete;
  Streams& operator=(const Streams&) = delete;
  StreamHandle get(int index) const;  // 0: the legacy default stream
  static std::string name(int index);

 private:
  std::vector<void*> streams_;
};

// A CUDA graph captured on a stream (global capture mode: anything in the calls that is not
// capturable fails the capture), then replayed.
class Graph {
 public:
  Graph() = default;
  ~Graph();
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  void begin(StreamHandle s);
  void end(StreamHandle s);  // instantiates
  void launch(StreamHandle s) const;

 private:
  void* capturing_ = nullptr;  // the stream while capturing
  void* graph_ = nullptr;
  void* exec_ = nullptr;
};

void memset_async(void* p, uint8_t value, size_t bytes, StreamHandle s);
void synchronize(StreamHandle s);
// Waits for all the device's work: the set-up copies (a pageable host-to-device cudaMemcpy can
// return before its data lands) are complete before a call on a non-blocking stream reads them.
void device_synchronize();
// After an error: "alive" when the context still synchronises, else "dead: <the error>".
std::string context_state();

}  // namespace fp8proj::cli::soak

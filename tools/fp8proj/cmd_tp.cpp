// fp8proj tp: tensor parallelism on R GPUs (include/fp8proj/tp.hpp, tp_launch.hpp).
//
//   tp explain  each rank's shards of q_b_proj / o_proj, their FP8 eligibility and paths (host
//               arithmetic; no GPU needed)
//   tp check    TP R == TP 1 within tolerance: the sharded projections (flag off and on) and the
//               MLA block (prefill, decode, and decode replayed from a CUDA graph with the NCCL
//               all-reduce inside)
//   tp bench    the projections per M: TP 1 on one GPU next to TP R per rank (GEMM, all-reduce),
//               flag off (bf16) vs on (gated FP8)
//   tp layer    the MLA block's prefill (C sequences x 1024 tokens): TP 1 next to TP R, per-rank
//               time, all-reduce time, speedup flag on vs off
//   tp id       a fresh NCCL id for FP8PROJ_NCCL_ID
//
// --mode threads (one process, a thread per GPU), procs (this command starts R copies of
// itself, one per GPU, rendezvous through a temporary id file), env (this process is one rank
// of a job started by torchrun / mpirun / srun / procs), auto (env when launched as a rank,
// else threads). Rank 0 prints and writes the results; timings are per rank, taken with
// device events after a barrier (a one-element all-reduce) that lines the ranks up, the L2
// flushed before every timed call, the median of --reps.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>

#include "commands.hpp"
#include "common.hpp"
#include "fp8proj/error.hpp"
#include "fp8proj/reference.hpp"
#include "fp8proj/mla.hpp"
#include "fp8proj/random.hpp"
#include "fp8proj/tp.hpp"
#include "fp8proj/tp_launch.hpp"

#if FP8PROJ_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace fp8proj::cli {

namespace {

// ---- arguments ------------------------------------------------------------------------------

struct TpArgs {
  int tp = 2;
  std::string mode = "auto";
  std::vector<std::string> models = {"glm5"};
  int reps = 20, warmup = 3;
  bool no_flush = false;
  std::string csv, json;
};

void add_common(CLI::App* cmd, TpArgs& a, bool timing) {
  cmd->add_option("--tp", a.tp, "Tensor-parallel size (ranks, one GPU each)")
      ->transform(int_in(1, kMaxCliTp))
      ->capture_default_str();
  cmd->add_option("--mode", a.mode, "Process model: threads, procs, env, auto")
      ->check(CLI::IsMember({"threads", "procs", "env", "auto"}))
      ->capture_default_str();
  cmd->add_option("--model", a.models, "Model(s): glm5, deepseek-v3, deepseek-v2-lite")->capture_default_str();
  if (timing) {
    cmd->add_option("--reps", a.reps, "Timed repetitions per measurement")
        ->transform(int_in(1, kMaxCliReps))
        ->capture_default_str();
    cmd->add_option("--warmup", a.warmup, "Warm-up calls per measurement")
        ->transform(int_in(0, kMaxCliReps))
        ->capture_default_str();
    cmd->add_flag("--no-flush", a.no_flush, "Do not flush L2 before timed calls");
    cmd->add_option("--csv", a.csv, "Write the rows (one per rank) as CSV");
    cmd->add_option("--json", a.json, "Write the rows with the GPU/version stamp as JSON");
  }
}

// The options every multi-GPU subcommand shares, resolved before any rank starts or prints:
// the model list split (list_entries), each model checked at --tp (it must divide the heads).
void resolve_common(TpArgs& a) {
  a.models = parse_models(a.models);
  check_tp_sizes(a.models, {a.tp});
  check_outputs({{"--csv", a.csv}, {"--json", a.json}});
}

LaunchOptions launch_options(const TpArgs& a) {
  LaunchOptions o;
  o.model = parse_process_model(a.mode);
  o.size = a.tp;
  o.name = "tp";
  FP8PROJ_CHECK(a.tp >= 1, "--tp must be >= 1, got ", a.tp);
  return o;
}

// ---- per-rank helpers -----------------------------------------------------------------------

// The values of every rank, rank-major: out[r * mine.size() + i] is rank r's mine[i].
std::vector<double> gather(const RankContext& ctx, const std::vector<double>& mine) {
  const int64_t n = static_cast<int64_t>(mine.size());
  if (n == 0) return {};
  Buffer send(MemorySpace::device, n * sizeof(double)), recv(MemorySpace::device, n * ctx.size * sizeof(double));
  copy_bytes(send.data(), MemorySpace::device, mine.data(), MemorySpace::host, send.bytes());
  ctx.comm->all_gather(send.data(), recv.data(), n, CommDtype::f64, ctx.stream);
  ctx.comm->synchronize(ctx.stream, "gathering the results on every rank");
  std::vector<double> all(static_cast<size_t>(n * ctx.size));
  copy_bytes(all.data(), MemorySpace::host, recv.data(), MemorySpace::device, recv.bytes());
  return all;
}

// Every rank's table of `cols` values per row, gathered: at(r, row, j) is rank r's value,
// worst(row, j) the largest over the ranks.
struct RankTable {
  std::vector<double> all;
  size_t per_rank = 0;
  int ranks = 1, cols = 1;
  double at(int r, size_t row, int j) const { return all[r * per_rank + row * cols + j]; }
  double worst(size_t row, int j) const {
    double w = 0;
    for (int r = 0; r < ranks; ++r) w = std::max(w, at(r, row, j));
    return w;
  }
};

RankTable gather_table(const RankContext& ctx, const std::vector<double>& mine, int cols) {
  return {gather(ctx, mine), mine.size(), ctx.size, cols};
}

std::vector<bf16> download(const RankContext& ctx, const void* device, int64_t count, const char* what) {
  ctx.comm->synchronize(ctx.stream, what);
  std::vector<bf16> h(static_cast<size_t>(count));
  copy_bytes(h.data(), MemorySpace::host, device, MemorySpace::device, h.size() * sizeof(bf16));
  return h;
}

// Waits for whatever load-time work other code queued on the legacy default stream (weight
// fills, FP8 copies) before this rank's non-blocking stream uses it.
void settle_device() {
#if FP8PROJ_WITH_CUDA
  const cudaError_t e = cudaDeviceSynchronize();
  FP8PROJ_CHECK(e == cudaSuccess, "cudaDeviceSynchronize: ", cudaGetErrorString(e));
#endif
}

struct Diff {
  double rel = 0;
  int64_t bad = 0;  // non-finite outputs where the reference is finite
};

Diff compare_bf16(const std::vector<bf16>& out, const std::vector<bf16>& ref) {
  FP8PROJ_CHECK(out.size() == ref.size(), "comparing ", out.size(), " outputs with ", ref.size(), " references");
  const ErrorStats e = compare(out.data(), ref.data(), static_cast<int64_t>(out.size()));
  return {e.rel_frobenius, e.non_finite};
}

// Per-rank device timing: L2 flush, barrier, events around fn, median over reps.
class RankTimer {
 public:
  RankTimer(const RankContext& ctx, const TpArgs& a) : ctx_(ctx), warmup_(a.warmup), reps_(a.reps), flush_(!a.no_flush) {
    FP8PROJ_CHECK(reps_ > 0 && warmup_ >= 0, "--reps must be > 0 and --warmup >= 0");
    barrier_ = Buffer(MemorySpace::device, 16);
    fill_bytes(MemorySpace::device, barrier_.data(), 16, 0);
    if (flush_) flush_buf_ = Buffer(MemorySpace::device, static_cast<size_t>(std::max<int64_t>(current_device().l2_bytes, 50 << 20)) * 2);
  }

  double time(const std::function<void(StreamHandle)>& fn) {
#if FP8PROJ_WITH_CUDA
    auto s = static_cast<cudaStream_t>(ctx_.stream);
    for (int i = 0; i < warmup_; ++i) fn(ctx_.stream);
    ctx_.comm->synchronize(ctx_.stream, "the warm-up calls");
    std::vector<cudaEvent_t> ev(2 * reps_);
    for (auto& e : ev) check(cudaEventCreate(&e));
    for (int i = 0; i < reps_; ++i) {
      if (flush_) check(cudaMemsetAsync(flush_buf_.data(), i & 0xff, flush_buf_.bytes(), s));
      // Line the ranks up, so a collective inside fn measures the transfer, not the skew.
      ctx_.comm->all_reduce(barrier_.data(), barrier_.data(), 1, CommDtype::f32, CommOp::sum, ctx_.stream);
      check(cudaEventRecord(ev[2 * i], s));
      fn(ctx_.stream);
      check(cudaEventRecord(ev[2 * i + 1], s));
    }
    ctx_.comm->synchronize(ctx_.stream, "the timed calls");
    std::vector<double> us(reps_);
    for (int i = 0; i < reps_; ++i) {
      float ms = 0;
      check(cudaEventElapsedTime(&ms, ev[2 * i], ev[2 * i + 1]));
      us[i] = 1000.0 * ms;
    }
    for (auto& e : ev) cudaEventDestroy(e);
    std::sort(us.begin(), us.end());
    return reps_ % 2 ? us[reps_ / 2] : 0.5 * (us[reps_ / 2 - 1] + us[reps_ / 2]);
#else
    (void)fn;
    FP8PROJ_FAIL("device timing needs a CUDA build");
#endif
  }

 private:
#if FP8PROJ_WITH_CUDA
  static void check(cudaError_t e) { FP8PROJ_CHECK(e == cudaSuccess, "CUDA error in tp timing: ", cudaGetErrorString(e)); }
#endif
  const RankContext& ctx_;
  int warmup_, reps_;
  bool flush_;
  Buffer barrier_, flush_buf_;
};

Tensor device_random(int64_t rows, int64_t cols, uint64_t seed, float stddev) {
  return random_bf16(MemorySpace::device, rows, cols, seed, stddev);
}

std::string stamp_line(const RankContext& ctx) {
  return fmt::format("{} ranks ({} process model), {}", ctx.size, to_string(ctx.model), ctx.comm->describe());
}

void print_banner(const RankContext& ctx, const char* what) {
  fmt::print("fp8proj tp {} -- {}\n{}\n", what, space_banner(MemorySpace::device), stamp_line(ctx));
}

ProjectionOptions proj_options(const std::string& name, bool fp8, bool forced, int64_t max_tokens) {
  ProjectionOptions o;
  o.name = name;
  o.fp8 = fp8;
  o.max_tokens = round_up(max_tokens, 4);
  o.apply_env = false;  // what is compared must not depend on the caller's environment
  if (forced) {         // FP8 at every M
    o.threshold = 0;
    o.decode_ceiling = 0;
  }
  return o;
}

// ---- tp explain -----------------------------------------------------------------------------

// The head of the JSON results of `tp bench` and `tp layer`: stamp, TP size, process model,
// NCCL version and how the times were taken (RankTimer).
nlohmann::json result_head(const RankContext& ctx, const TpArgs& a) {
  nlohmann::json j;
  j["stamp"] = result_stamp();
  j["tp"] = ctx.size;
  j["process_model"] = to_string(ctx.model);
  j["nccl"] = nccl_version();
  j["timing"] = {{"reps", a.reps}, {"warmup", a.warmup}, {"l2_flush", !a.no_flush}, {"statistic", "median"},
                 {"barrier", "1-element all-reduce before every timed call"}};
  return j;
}

struct ExplainArgs {
  std::vector<std::string> models = {"glm5"};
  std::string tp = "2";
  std::string m = "1,64,512,513,4096";
  bool fp8 = false;
  std::string policy;
  bool cpu = false;
  bool ranks = true;
};

void run_explain(const ExplainArgs& a) {
  const MemorySpace space = choose_space(a.cpu);
  // Every argument resolved before anything prints, each model checked at each TP size.
  const std::vector<int64_t> ms = parse_m_list(a.m);
  const std::vector<std::string> models = parse_models(a.models);
  const std::vector<int> tps = parse_int_list(a.tp);
  check_tp_sizes(models, tps);
  fmt::print("{}\n", space_banner(space));
  for (const auto& model : models) {
    for (int tp : tps) {
      const MlaConfig c0 = MlaConfig::preset(model, tp, 0);
      fmt::print("\n{} at TP {}: {} heads per rank; fused_qkv_a {}x{} and the norms replicated (bf16), "
                 "kv_b_proj column-parallel by heads (bf16, untagged)\n",
                 model, tp, c0.local_heads(), c0.qkv_a_dim(), c0.hidden);
      for (int r = 0; r < tp; ++r) {
        const MlaConfig c = MlaConfig::preset(model, tp, r);
        for (const ShardSpec& s : {q_b_proj_shard(c), o_proj_shard(c)}) {
          const bool is_q = s.kind == ShardKind::column;
          fmt::print("  {} {}\n", is_q ? (c.has_q_lora() ? "q_b_proj" : "q_proj  ") : "o_proj  ", s.describe());
          if (!s.fp8_ok()) fmt::print("      {}\n", s.fp8_refusal());
          Tensor w = random_bf16(space, s.n, s.k, 1, 0.02f);
          ProjectionOptions o;
          o.name = std::string(model) + (is_q ? ".q_b_proj" : ".o_proj");
          o.fp8 = a.fp8;
          if (a.policy == "all") o.policy = Fp8Policy::all;
          ShardedProjection p = ShardedProjection::from_shard(space, s, w.data(), nullptr, o);
          for (int64_t m : ms) fmt::print("      {}\n", p.explain(m).to_string());
          if (!is_q && tp > 1)
            fmt::print("      then: all-reduce (sum) of the [M, {}] bf16 partials over {} ranks: {:.1f} MiB at M=4096\n",
                       s.full_n, tp, 4096.0 * s.full_n * 2 / 1048576.0);
        }
      }
    }
  }
}

// ---- tp check -------------------------------------------------------------------------------

struct CheckArgs : TpArgs {
  std::string m = "1,64,1024,4096";
  std::string what = "proj,mla";
  int seqs = 2, seq_len = 640;
  int64_t seed = 7;
};

struct CheckRow {
  std::string what;  // "glm5 o_proj fp8 M=1024" ...
  double tol = 0;
};

void check_projections(RankContext& ctx, const CheckArgs& a, std::vector<CheckRow>& rows, std::vector<double>& vals) {
  const std::vector<int64_t> ms = parse_m_list(a.m);
  const int64_t max_m = ms.back();
  for (const auto& model : a.models) {
    const MlaConfig c = MlaConfig::preset(model, ctx.size, ctx.rank);
    for (const ShardSpec& s : {q_b_proj_shard(c), o_proj_shard(c)}) {
      const bool row = s.kind == ShardKind::row;
      const std::string gemm = row ? "o_proj" : "q_b_proj";
      Tensor w = device_random(s.full_n, s.full_k, 100 + (row ? 1 : 0), 0.02f);
      Tensor x = device_random(max_m, s.full_k, 200 + (row ? 1 : 0), 1.0f);
      // This rank's input features of a row shard: columns [k_offset, k_offset + k) of x.
      Buffer xr(MemorySpace::device, static_cast<size_t>(max_m * s.k) * sizeof(bf16));
      copy_shard(xr.data(), MemorySpace::device, x.data(), MemorySpace::device, row_shard(max_m, s.full_k, ctx.rank, ctx.size),
                 sizeof(bf16));
      Buffer y1(MemorySpace::device, static_cast<size_t>(max_m * s.full_n) * sizeof(bf16));
      const int64_t yr_cols = row ? s.full_n : s.n;
      Buffer yr(MemorySpace::device, static_cast<size_t>(max_m * yr_cols) * sizeof(bf16));
      for (const bool fp8 : {false, true}) {
        const std::string name = std::string(model) + "." + gemm;
        ProjectionLayer tp1(MemorySpace::device, w.data(), s.full_n, s.full_k, proj_options(name, fp8, true, max_m));
        ShardedProjection shard(MemorySpace::device, s, w.data(), MemorySpace::device, ctx.comm,
                                proj_options(name, fp8, true, max_m));
        settle_device();
        for (int64_t m : ms) {
          fill_bytes(MemorySpace::device, y1.data(), y1.bytes(), 0xff);  // NaN: unwritten outputs fail
          fill_bytes(MemorySpace::device, yr.data(), yr.bytes(), 0xff);
          tp1.forward(x.data(), m, y1.data<bf16>(), ctx.stream);
          shard.forward(row ? xr.data<bf16>() : x.data(), m, yr.data<bf16>(), ctx.stream);
          const auto ref_full = download(ctx, y1.data(), m * s.full_n, "the TP 1 projection");
          const auto out = download(ctx, yr.data(), m * yr_cols, "the sharded projection");
          std::vector<bf16> ref = ref_full;
          if (!row) {  // rank's output features: columns [n_offset, n_offset + n) of the TP 1 output
            ref.assign(static_cast<size_t>(m * s.n), bf16{});
            for (int64_t i = 0; i < m; ++i)
              std::memcpy(&ref[i * s.n], &ref_full[i * s.full_n + s.n_offset], s.n * sizeof(bf16));
          }
          const Diff d = compare_bf16(out, ref);
          rows.push_back({fmt::format("{} {} {} {}x{} {} M={} [{}]", model, gemm, row ? "row" : "column", s.n, s.k,
                                      fp8 ? "fp8" : "bf16", m, to_string(shard.path_for(m))),
                          kTpRelTol});
          vals.push_back(d.rel);
          vals.push_back(static_cast<double>(d.bad));
        }
      }
    }
  }
}

void check_mla(RankContext& ctx, const CheckArgs& a, std::vector<CheckRow>& rows, std::vector<double>& vals) {
  const int B = a.seqs, L = a.seq_len;
  const int64_t T = int64_t{B} * L, stride = L + 8;  // room for the decoded tokens
  std::vector<int32_t> offsets(B + 1), starts(B), positions(B, L);
  for (int b = 0; b <= B; ++b) offsets[b] = b * L;
  for (int b = 0; b < B; ++b) starts[b] = static_cast<int32_t>(b * stride);
  auto to_dev = [](const std::vector<int32_t>& v) {
    Buffer d(MemorySpace::device, v.size() * sizeof(int32_t));
    copy_bytes(d.data(), MemorySpace::device, v.data(), MemorySpace::host, d.bytes());
    return d;
  };
  Buffer d_off = to_dev(offsets), d_start = to_dev(starts), d_pos = to_dev(positions);
  MlaPrefillBatch pb{B, d_off.data<int32_t>(), d_start.data<int32_t>(), offsets.data()};
  MlaDecodeBatch db{B, d_pos.data<int32_t>(), d_start.data<int32_t>(), L + 1};

  struct Variant {
    const char* name;
    bool fp8;
    Fp8Policy policy;
    bool forced;
  };
  const Variant variants[] = {{"off", false, Fp8Policy::prefill, false},
                              {"on", true, Fp8Policy::prefill, false},      // FP8 prefill, bf16 decode
                              {"on-all", true, Fp8Policy::all, true}};     // FP8 everywhere, decode too
  for (const auto& model : a.models) {
    const MlaConfig c1 = MlaConfig::preset(model, 1, 0), cr = MlaConfig::preset(model, ctx.size, ctx.rank);
    Tensor xp = device_random(T, c1.hidden, 300, 1.0f), xd = device_random(B, c1.hidden, 301, 1.0f);
    Buffer y1(MemorySpace::device, static_cast<size_t>(T * c1.hidden) * sizeof(bf16));
    Buffer yr(MemorySpace::device, y1.bytes()), yg(MemorySpace::device, y1.bytes());
    for (const Variant& v : variants) {
      MlaOptions o;
      o.name = std::string(model) + ".self_attn";
      o.tagged.fp8 = v.fp8;
      o.tagged.policy = v.policy;
      o.tagged.apply_env = false;
      if (v.forced) {
        o.tagged.threshold = 0;
        o.tagged.decode_ceiling = 0;
      }
      o.max_tokens = T;
      o.max_batch = B;
      o.cache_capacity = B * stride;
      MlaBlock b1(MemorySpace::device, c1, static_cast<uint64_t>(a.seed), o);
      o.all_reduce = mla_all_reduce(*ctx.comm);
      MlaBlock br(MemorySpace::device, cr, static_cast<uint64_t>(a.seed), o);
      settle_device();
      const std::string tag = fmt::format("{} MLA flag {}", model, v.name);

      b1.prefill(xp.data(), pb, y1.data<bf16>(), ctx.stream);
      br.prefill(xp.data(), pb, yr.data<bf16>(), ctx.stream);
      {
        const Diff d = compare_bf16(download(ctx, yr.data(), T * c1.hidden, "the TP R prefill"),
                                    download(ctx, y1.data(), T * c1.hidden, "the TP 1 prefill"));
        rows.push_back({fmt::format("{} prefill T={} [q_b {}, o {}]", tag, T,
                                    to_string(br.projection(MlaProjection::q_b_proj).path_for(T)),
                                    to_string(br.projection(MlaProjection::o_proj).path_for(T))),
                        kTpBlockRelTol});
        vals.push_back(d.rel);
        vals.push_back(static_cast<double>(d.bad));
      }
      b1.decode(xd.data(), db, y1.data<bf16>(), ctx.stream);
      br.decode(xd.data(), db, yr.data<bf16>(), ctx.stream);
      const auto eager = download(ctx, yr.data(), int64_t{B} * c1.hidden, "the TP R decode");
      {
        const Diff d = compare_bf16(eager, download(ctx, y1.data(), int64_t{B} * c1.hidden, "the TP 1 decode"));
        rows.push_back({fmt::format("{} decode B={} [q_b {}, o {}]", tag, B,
                                    to_string(br.projection(MlaProjection::q_b_proj).path_for(B)),
                                    to_string(br.projection(MlaProjection::o_proj).path_for(B))),
                        kTpBlockRelTol});
        vals.push_back(d.rel);
        vals.push_back(static_cast<double>(d.bad));
      }
      // The same step captured in a CUDA graph, NCCL all-reduce included, on every rank at once.
      fill_bytes(MemorySpace::device, yg.data(), yg.bytes(), 0xff);
      {
        MlaDecodeGraph graph(br, xd.data(), db, yg.data<bf16>());
        fill_bytes(MemorySpace::device, yg.data(), yg.bytes(), 0xff);
        graph.replay(ctx.stream);
        const Diff d = compare_bf16(download(ctx, yg.data(), int64_t{B} * c1.hidden, "the graph replay"), eager);
        rows.push_back({fmt::format("{} decode B={} CUDA graph replay vs eager (TP R)", tag, B), kTpRelTol});
        vals.push_back(d.rel);
        vals.push_back(static_cast<double>(d.bad));
      }
    }
  }
}

void run_check(const CheckArgs& a) {
  bool failed = false;
  run_ranks(launch_options(a), [&](RankContext& ctx) {
    if (ctx.root()) print_banner(ctx, "check");
    std::vector<CheckRow> rows;
    std::vector<double> vals;  // per row: relative difference, non-finite count
    const std::vector<std::string> what = list_entries({a.what}, "--what");
    const bool proj = std::count(what.begin(), what.end(), "proj") > 0;
    const bool mla = std::count(what.begin(), what.end(), "mla") > 0;
    if (proj) check_projections(ctx, a, rows, vals);
    if (mla) check_mla(ctx, a, rows, vals);
    const RankTable table = gather_table(ctx, vals, 2);  // per row: relative difference, non-finite count
    int failures = 0;
    if (ctx.root())
      fmt::print("\n  {:<70} {:>10} {:>9} {:>5}  per rank (rel. difference vs TP 1)\n", "check", "worst", "tolerance",
                 "bad");
    for (size_t i = 0; i < rows.size(); ++i) {
      double worst = 0, bad = 0;
      std::string per;
      for (int r = 0; r < ctx.size; ++r) {
        const double rel = table.at(r, i, 0), nb = table.at(r, i, 1);
        worst = std::max(worst, rel);
        bad += nb;
        per += fmt::format(" {:.2e}", rel);
      }
      const bool pass = worst <= rows[i].tol && bad == 0;
      failures += pass ? 0 : 1;
      if (ctx.root())
        fmt::print("  {:<70} {:>10.3e} {:>9.1e} {:>5} {} {}\n", rows[i].what, worst, rows[i].tol, bad, pass ? "PASS" : "FAIL", per);
    }
    if (ctx.root())
      fmt::print("\ntp check: {}\n", failures == 0 ? fmt::format("all {} checks pass at TP {}", rows.size(), ctx.size)
                                                   : fmt::format("{} of {} checks FAILED", failures, rows.size()));
    if (failures && ctx.root()) failed = true;
  });
  if (failed) throw Error("tp check failed");
}

// ---- tp bench (projections) -------------------------------------------------------------------

struct BenchArgs : TpArgs {
  std::string m = "1,16,128,512,1024,2048,4096,8192,16384";
  std::string policy = "prefill";
};

void run_bench(const BenchArgs& a) {
  run_ranks(launch_options(a), [&](RankContext& ctx) {
    if (ctx.root()) {
      print_banner(ctx, "bench");
      fmt::print("timing: per rank, device events after a barrier, median of {} after {} warm-up, L2 {}; "
                 "flag off = bf16, flag on = the gated layer (policy {}); TP {} time = the slowest rank\n",
                 a.reps, a.warmup, a.no_flush ? "not flushed" : "flushed before every timed call", a.policy, ctx.size);
    }
    const std::vector<int64_t> ms = parse_m_list(a.m);
    const int64_t max_m = ms.back();
    RankTimer timer(ctx, a);
    struct Row {
      std::string model, gemm;
      int64_t n, k, full_n, full_k, m;
      std::string path_on;
    };
    std::vector<Row> rows;
    std::vector<double> vals;  // per row: tp1 off, tp1 on, tpR off, tpR on, tpR gemm off, tpR gemm on, all-reduce
    constexpr int kVals = 7;
    for (const auto& model : a.models) {
      const MlaConfig c = MlaConfig::preset(model, ctx.size, ctx.rank);
      for (const ShardSpec& s : {q_b_proj_shard(c), o_proj_shard(c)}) {
        const bool row = s.kind == ShardKind::row;
        const std::string gemm = row ? "o_proj" : "q_b_proj";
        Tensor w = device_random(s.full_n, s.full_k, 11, 0.02f);
        Tensor x = device_random(max_m, s.full_k, 12, 1.0f);
        Tensor y = device_random(max_m, s.full_n, 13, 1.0f);
        auto opts = [&](bool on) {
          ProjectionOptions o = proj_options(model + "." + gemm, on, false, max_m);
          o.policy = a.policy == "all" ? Fp8Policy::all : Fp8Policy::prefill;
          o.apply_env = on;  // the gated layer honours FP8PROJ_*, as an engine's would
          return o;
        };
        ProjectionLayer tp1_off(MemorySpace::device, w.data(), s.full_n, s.full_k, opts(false));
        ProjectionLayer tp1_on(MemorySpace::device, w.data(), s.full_n, s.full_k, opts(true));
        ShardedProjection r_off(MemorySpace::device, s, w.data(), MemorySpace::device, ctx.comm, opts(false));
        ShardedProjection r_on(MemorySpace::device, s, w.data(), MemorySpace::device, ctx.comm, opts(true));
        settle_device();
        ctx.comm->warm_up(max_m * s.full_n, ctx.stream);
        bf16* xs = x.data();  // a row shard reads k of the columns; the values do not matter for timing
        for (int64_t m : ms) {
          const double t1_off = timer.time([&](StreamHandle st) { tp1_off.forward(x.data(), m, y.data(), st); });
          const double t1_on = timer.time([&](StreamHandle st) { tp1_on.forward(x.data(), m, y.data(), st); });
          const double tr_off = timer.time([&](StreamHandle st) { r_off.forward(xs, m, y.data(), st); });
          const double tr_on = timer.time([&](StreamHandle st) { r_on.forward(xs, m, y.data(), st); });
          double g_off = tr_off, g_on = tr_on, ar = 0;
          if (row && ctx.size > 1) {
            g_off = timer.time([&](StreamHandle st) { r_off.forward_partial(xs, m, y.data(), st); });
            g_on = timer.time([&](StreamHandle st) { r_on.forward_partial(xs, m, y.data(), st); });
            ar = timer.time([&](StreamHandle st) { ctx.comm->all_reduce_sum(y.data(), y.data(), m * s.full_n, st); });
          }
          rows.push_back({model, gemm, s.n, s.k, s.full_n, s.full_k, m, to_string(r_on.path_for(m))});
          for (double v : {t1_off, t1_on, tr_off, tr_on, g_off, g_on, ar}) vals.push_back(v);
        }
      }
    }
    const RankTable table = gather_table(ctx, vals, kVals);
    if (!ctx.root()) return;
    auto v = [&](int r, size_t row, int j) { return table.at(r, row, j); };
    auto worst = [&](size_t row, int j) { return table.worst(row, j); };
    std::string last;
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      const std::string head = r.model + " " + r.gemm;
      if (head != last) {
        last = head;
        fmt::print("\n{}: TP 1 {}x{} on one GPU | TP {} {}x{} per rank{}\n", head, r.full_n, r.full_k, ctx.size, r.n,
                   r.k, r.gemm == "o_proj" && ctx.size > 1 ? fmt::format(" + all-reduce of [M, {}] bf16", r.full_n) : "");
        fmt::print("  {:>6} | {:>9} {:>9} {:>6} | {:>9} {:>9} {:>6} | {:>9} {:>9} {:>8} | {:>7} {:>7}  {}\n", "M",
                   "TP1 off", "TP1 on", "on x", "TPR off", "TPR on", "on x", "gemm off", "gemm on", "AR us", "TP1/R off",
                   "TP1/R on", "path(on)");
      }
      const double t1o = v(0, i, 0), t1n = v(0, i, 1), tro = worst(i, 2), trn = worst(i, 3);
      fmt::print("  {:>6} | {:>9.1f} {:>9.1f} {:>6.2f} | {:>9.1f} {:>9.1f} {:>6.2f} | {:>9.1f} {:>9.1f} {:>8.1f} | {:>7.2f} "
                 "{:>7.2f}  {}\n",
                 r.m, t1o, t1n, t1o / t1n, tro, trn, tro / trn, worst(i, 4), worst(i, 5), worst(i, 6), t1o / tro,
                 t1n / trn, r.path_on);
    }
    if (!a.csv.empty()) {
      std::string csv = "model,gemm,tp,rank,n,k,m,tp1_off_us,tp1_on_us,tpr_off_us,tpr_on_us,tpr_gemm_off_us,"
                        "tpr_gemm_on_us,allreduce_us,path_on\n";
      for (int rk = 0; rk < ctx.size; ++rk)
        for (size_t i = 0; i < rows.size(); ++i) {
          const Row& r = rows[i];
          csv += fmt::format("{},{},{},{},{},{},{},{:.3f},{:.3f},{:.3f},{:.3f},{:.3f},{:.3f},{:.3f},{}\n", r.model, r.gemm,
                             ctx.size, rk, r.n, r.k, r.m, v(rk, i, 0), v(rk, i, 1), v(rk, i, 2), v(rk, i, 3),
                             v(rk, i, 4), v(rk, i, 5), v(rk, i, 6), r.path_on);
        }
      write_text(a.csv, csv);
    }
    if (!a.json.empty()) {
      nlohmann::json j = result_head(ctx, a);
      for (int rk = 0; rk < ctx.size; ++rk)
        for (size_t i = 0; i < rows.size(); ++i) {
          const Row& r = rows[i];
          j["rows"].push_back({{"model", r.model}, {"gemm", r.gemm}, {"rank", rk}, {"n", r.n}, {"k", r.k}, {"m", r.m},
                               {"tp1_off_us", v(rk, i, 0)}, {"tp1_on_us", v(rk, i, 1)}, {"tpr_off_us", v(rk, i, 2)},
                               {"tpr_on_us", v(rk, i, 3)}, {"tpr_gemm_off_us", v(rk, i, 4)},
                               {"tpr_gemm_on_us", v(rk, i, 5)}, {"allreduce_us", v(rk, i, 6)}, {"path_on", r.path_on}});
        }
      write_text(a.json, j.dump(1) + "\n");
    }
  });
}

// ---- tp layer (the MLA block's prefill) ---------------------------------------------------------

struct LayerArgs : TpArgs {
  std::string seqs = "1,2,4,8,16";
  int seq_len = 1024;
  int64_t seed = 7;
};

void run_layer(const LayerArgs& a) {
  run_ranks(launch_options(a), [&](RankContext& ctx) {
    const std::vector<int> seqs = parse_int_list(a.seqs, "--seqs", 1, 1 << 20);
    const int max_seqs = *std::max_element(seqs.begin(), seqs.end());
    const int64_t max_t = int64_t{max_seqs} * a.seq_len;
    if (ctx.root()) {
      print_banner(ctx, "layer");
      fmt::print("MLA block prefill, C sequences x {} tokens (causal); per rank device events after a barrier, "
                 "median of {} after {} warm-up, L2 {}; TP {} time = the slowest rank; flag on = tagged q_b_proj / "
                 "o_proj gated (prefill policy), off = bf16\n",
                 a.seq_len, a.reps, a.warmup, a.no_flush ? "not flushed" : "flushed", ctx.size);
    }
    RankTimer timer(ctx, a);
    struct Row {
      std::string model;
      int seqs;
      int64_t tokens;
      std::string q_path, o_path;
    };
    std::vector<Row> rows;
    std::vector<double> vals;  // per row: tp1 off, tp1 on, tpR off, tpR on, all-reduce
    constexpr int kVals = 5;
    for (const auto& model : a.models) {
      const MlaConfig c1 = MlaConfig::preset(model, 1, 0), cr = MlaConfig::preset(model, ctx.size, ctx.rank);
      Tensor x = device_random(max_t, c1.hidden, 21, 1.0f);
      Tensor y = device_random(max_t, c1.hidden, 22, 1.0f);
      // Per sequence count: offsets and cache starts on the host and the device.
      std::map<int, std::pair<std::vector<int32_t>, Buffer>> batches;
      for (int c : seqs) {
        std::vector<int32_t> off(c + 1);
        for (int b = 0; b <= c; ++b) off[b] = b * a.seq_len;
        Buffer d(MemorySpace::device, (2 * c + 1) * sizeof(int32_t));  // offsets, then cache starts (= offsets)
        copy_bytes(d.data(), MemorySpace::device, off.data(), MemorySpace::host, off.size() * 4);
        copy_bytes(d.data<int32_t>() + c + 1, MemorySpace::device, off.data(), MemorySpace::host, c * 4);
        batches.emplace(c, std::make_pair(std::move(off), std::move(d)));
      }
      auto batch = [&](int c) {
        auto& [off, d] = batches.at(c);
        return MlaPrefillBatch{c, d.data<int32_t>(), d.data<int32_t>() + c + 1, off.data()};
      };
      std::vector<double> t(seqs.size() * 4, 0), ar(seqs.size(), 0);
      std::vector<std::string> qp(seqs.size()), op(seqs.size());
      for (int variant = 0; variant < 4; ++variant) {  // TP1 off, TP1 on, TPR off, TPR on
        const bool on = variant % 2 == 1, sharded = variant >= 2;
        MlaOptions o;
        o.name = model + ".self_attn";
        o.tagged.fp8 = on;
        o.tagged.apply_env = on;
        o.max_tokens = max_t;
        o.max_batch = 1;
        o.cache_capacity = max_t;
        if (sharded) o.all_reduce = mla_all_reduce(*ctx.comm);
        MlaBlock block(MemorySpace::device, sharded ? cr : c1, static_cast<uint64_t>(a.seed), o);
        settle_device();
        if (sharded) ctx.comm->warm_up(max_t * c1.hidden, ctx.stream);
        for (size_t i = 0; i < seqs.size(); ++i) {
          const MlaPrefillBatch pb = batch(seqs[i]);
          t[i * 4 + variant] = timer.time([&](StreamHandle st) { block.prefill(x.data(), pb, y.data(), st); });
          if (variant == 3) {
            const int64_t tokens = int64_t{seqs[i]} * a.seq_len;
            qp[i] = to_string(block.projection(MlaProjection::q_b_proj).path_for(tokens));
            op[i] = to_string(block.projection(MlaProjection::o_proj).path_for(tokens));
            if (ctx.size > 1)
              ar[i] = timer.time([&](StreamHandle st) { ctx.comm->all_reduce_sum(y.data(), y.data(), tokens * c1.hidden, st); });
          }
        }
      }
      for (size_t i = 0; i < seqs.size(); ++i) {
        rows.push_back({model, seqs[i], int64_t{seqs[i]} * a.seq_len, qp[i], op[i]});
        for (int j = 0; j < 4; ++j) vals.push_back(t[i * 4 + j]);
        vals.push_back(ar[i]);
      }
    }
    const RankTable table = gather_table(ctx, vals, kVals);
    if (!ctx.root()) return;
    auto v = [&](int r, size_t row, int j) { return table.at(r, row, j); };
    auto worst = [&](size_t row, int j) { return table.worst(row, j); };
    std::string last;
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      if (r.model != last) {
        last = r.model;
        fmt::print("\n{} MLA prefill: TP 1 (one GPU) | TP {} per rank (ranks:{})\n", r.model, ctx.size,
                   [&] { std::string s; for (int k = 0; k < ctx.size; ++k) s += " " + std::to_string(k); return s; }());
        fmt::print("  {:>4} {:>6} | {:>9} {:>9} {:>6} | {:>9} {:>9} {:>6} | {:>8} {:>6} | {:>9} {:>9} | {}\n", "seqs",
                   "tokens", "TP1 off", "TP1 on", "on x", "TPR off", "TPR on", "on x", "AR us", "AR %", "TP1/R off",
                   "TP1/R on", "per-rank TPR on us, paths (q_b, o)");
      }
      const double t1o = v(0, i, 0), t1n = v(0, i, 1), tro = worst(i, 2), trn = worst(i, 3), ar = worst(i, 4);
      std::string per;
      for (int k = 0; k < ctx.size; ++k) per += fmt::format(" {:.0f}", v(k, i, 3));
      fmt::print("  {:>4} {:>6} | {:>9.1f} {:>9.1f} {:>6.2f} | {:>9.1f} {:>9.1f} {:>6.2f} | {:>8.1f} {:>5.1f}% | {:>9.2f} "
                 "{:>9.2f} |{}  ({}, {})\n",
                 r.seqs, r.tokens, t1o, t1n, t1o / t1n, tro, trn, tro / trn, ar, trn > 0 ? 100 * ar / trn : 0.0,
                 t1o / tro, t1n / trn, per, r.q_path, r.o_path);
    }
    if (!a.csv.empty()) {
      std::string csv = "model,tp,rank,seqs,seq_len,tokens,tp1_off_us,tp1_on_us,tpr_off_us,tpr_on_us,allreduce_us,"
                        "q_b_path_on,o_path_on\n";
      for (int rk = 0; rk < ctx.size; ++rk)
        for (size_t i = 0; i < rows.size(); ++i) {
          const Row& r = rows[i];
          csv += fmt::format("{},{},{},{},{},{},{:.3f},{:.3f},{:.3f},{:.3f},{:.3f},{},{}\n", r.model, ctx.size, rk, r.seqs,
                             a.seq_len, r.tokens, v(rk, i, 0), v(rk, i, 1), v(rk, i, 2), v(rk, i, 3), v(rk, i, 4),
                             r.q_path, r.o_path);
        }
      write_text(a.csv, csv);
    }
    if (!a.json.empty()) {
      nlohmann::json j = result_head(ctx, a);
      j["what"] = "MLA block prefill, TP 1 next to TP R; per-rank times; TP R = slowest rank";
      for (int rk = 0; rk < ctx.size; ++rk)
        for (size_t i = 0; i < rows.size(); ++i) {
          const Row& r = rows[i];
          j["rows"].push_back({{"model", r.model}, {"rank", rk}, {"seqs", r.seqs}, {"seq_len", a.seq_len},
                               {"tokens", r.tokens}, {"tp1_off_us", v(rk, i, 0)}, {"tp1_on_us", v(rk, i, 1)},
                               {"tpr_off_us", v(rk, i, 2)}, {"tpr_on_us", v(rk, i, 3)}, {"allreduce_us", v(rk, i, 4)},
                               {"q_b_path_on", r.q_path}, {"o_path_on", r.o_path}});
        }
      write_text(a.json, j.dump(1) + "\n");
    }
  });
}

}  // namespace

void register_tp(CLI::App& app) {
  auto* tp = app.add_subcommand("tp", "Tensor parallelism on several GPUs: explain, check, bench, layer, id");
  tp->require_subcommand(1);

  auto ex = std::make_shared<ExplainArgs>();
  auto* e = tp->add_subcommand("explain", "Each rank's shards of q_b_proj / o_proj, their FP8 eligibility and paths");
  e->add_option("--model", ex->models, "Model(s)")->capture_default_str();
  e->add_option("--tp", ex->tp, "Tensor-parallel size(s), e.g. 2,4,8")->capture_default_str();
  e->add_option("--m", ex->m, "Token counts")->capture_default_str();
  e->add_flag("--fp8", ex->fp8, "Opt in to FP8 (FP8PROJ_PREFILL_FP8 still wins)");
  e->add_option("--policy", ex->policy, "prefill (default) or all")->check(CLI::IsMember({"prefill", "all"}));
  e->add_flag("--cpu", ex->cpu, "Build the layers on the host even if a GPU is present");
  e->add_flag("--ranks", ex->ranks, "Show every rank (always on: tp explain is the per-rank view)");
  e->callback([ex] { run_explain(*ex); });

  auto ck = std::make_shared<CheckArgs>();
  auto* c = tp->add_subcommand("check", "TP R equals TP 1 within tolerance: projections and the MLA block");
  add_common(c, *ck, false);
  c->add_option("--m", ck->m, "Token counts for the projection checks")->capture_default_str();
  c->add_option("--what", ck->what, "proj, mla or proj,mla")->capture_default_str();
  c->add_option("--seqs", ck->seqs, "MLA check: sequences")->transform(int_in(1, 1 << 20))->capture_default_str();
  c->add_option("--seq-len", ck->seq_len, "MLA check: tokens per sequence")
      ->transform(int_in(1, 1 << 20))
      ->capture_default_str();
  c->callback([ck] {
    resolve_common(*ck);
    (void)parse_m_list(ck->m);
    for (const std::string& w : list_entries({ck->what}, "--what"))
      FP8PROJ_CHECK(w == "proj" || w == "mla", "--what: ", quote_excerpt(w), " is not proj or mla");
    run_check(*ck);
  });

  auto bn = std::make_shared<BenchArgs>();
  auto* b = tp->add_subcommand("bench", "Projections per M: TP 1 next to TP R per rank, flag off vs on");
  add_common(b, *bn, true);
  b->add_option("--m", bn->m, "Token counts")->capture_default_str();
  b->add_option("--policy", bn->policy, "Gate policy of the flag-on layer: prefill or all")
      ->check(CLI::IsMember({"prefill", "all"}))
      ->capture_default_str();
  b->callback([bn] {
    resolve_common(*bn);
    (void)parse_m_list(bn->m);
    run_bench(*bn);
  });

  auto ly = std::make_shared<LayerArgs>();
  auto* l = tp->add_subcommand("layer", "MLA block prefill: TP 1 next to TP R, per-rank and all-reduce time");
  add_common(l, *ly, true);
  l->add_option("--seqs", ly->seqs, "Sequence counts C (C x seq-len tokens per prefill)")->capture_default_str();
  l->add_option("--seq-len", ly->seq_len, "Tokens per sequence")->transform(int_in(1, 1 << 20))->capture_default_str();
  l->callback([ly] {
    resolve_common(*ly);
    (void)parse_int_list(ly->seqs, "--seqs", 1, 1 << 20);
    run_layer(*ly);
  });

  auto* id = tp->add_subcommand("id", "Print a fresh NCCL id (hex) for FP8PROJ_NCCL_ID");
  id->callback([] { fmt::print("{}\n", Communicator::new_id().hex()); });
}

}  // namespace fp8proj::cli

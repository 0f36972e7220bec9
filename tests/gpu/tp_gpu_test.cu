// Tensor parallelism on several GPUs (include/fp8proj/tp.hpp, tp_launch.hpp): TP R equals TP 1
// within tolerance for the sharded projections (flag off, on gated, on forced) and the MLA block
// (prefill; decode eager; decode replayed from a CUDA graph with the NCCL all-reduce inside, at
// the captured step and the next one), in both process models (threads: one process, a thread
// per GPU; procs: one process per GPU, started by this program, rendezvous through an id file).
// Also: a missing peer, a missing id file and a rank/GPU mismatch end in clear errors within
// the deadline, never in a hang.
//
// Not a gtest program: the procs model re-runs this executable once per rank. Exit status 0:
// all checks passed; 1: a check failed; 77: skipped (fewer than 2 GPUs), with the reason.
//
//   fp8proj_tp_tests [--tp R] [--mode threads|procs|both] [--model glm5]
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <cuda_runtime.h>

#include "fp8proj/device.hpp"
#include "fp8proj/error.hpp"
#include "fp8proj/reference.hpp"
#include "fp8proj/memory.hpp"
#include "fp8proj/mla.hpp"
#include "fp8proj/random.hpp"
#include "fp8proj/tp.hpp"
#include "fp8proj/tp_launch.hpp"

namespace fp8proj {
namespace {

int visible_gpus() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// ---- per-rank checks --------------------------------------------------------------------------

struct Checks {
  int rank = 0;
  int failures = 0;
  void expect(bool ok, const std::string& what) {
    std::printf("[rank %d] %s %s\n", rank, ok ? "PASS" : "FAIL", what.c_str());
    std::fflush(stdout);
    if (!ok) ++failures;
  }
};

Buffer device_normal(int64_t count, uint64_t seed, float stddev) {
  Buffer b(MemorySpace::device, static_cast<size_t>(count) * sizeof(bf16));
  fill_normal(MemorySpace::device, b.data<bf16>(), count, seed, stddev);
  return b;
}

std::vector<bf16> download(const RankContext& ctx, const void* p, int64_t count) {
  ctx.comm->synchronize(ctx.stream, "a test result");
  std::vector<bf16> h(static_cast<size_t>(count));
  copy_bytes(h.data(), MemorySpace::host, p, MemorySpace::device, h.size() * sizeof(bf16));
  return h;
}

struct Diff {
  double rel = 0;
  int64_t bad = 0;
};

// Relative Frobenius difference (fp8proj::compare); an output that is NaN/inf where the
// reference is finite (e.g. never written over the NaN poison) counts as bad and fails the check.
Diff diff(const std::vector<bf16>& out, const std::vector<bf16>& ref) {
  if (out.size() != ref.size()) return {1.0, static_cast<int64_t>(out.size())};
  const ErrorStats e = compare(out.data(), ref.data(), static_cast<int64_t>(out.size()));
  return {e.rel_frobenius, e.non_finite};
}

std::string fmt_diff(const Diff& d) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "rel %.3e, non-finite %lld", d.rel, static_cast<long long>(d.bad));
  return buf;
}

void poison(Buffer& b) { fill_bytes(MemorySpace::device, b.data(), b.bytes(), 0xff); }

void settle() {
  // Load-time work of other code runs on the legacy stream; the rank's stream is non-blocking.
  const cudaError_t e = cudaDeviceSynchronize();
  FP8PROJ_CHECK(e == cudaSuccess, "cudaDeviceSynchronize: ", cudaGetErrorString(e));
}

ProjectionOptions popts(bool fp8, bool forced, int64_t max_m) {
  ProjectionOptions o;
  o.name = "tp_test";
  o.fp8 = fp8;
  o.max_tokens = round_up(max_m, 4);
  o.apply_env = false;
  o.use_tune_table = false;  // the default gate (M > 512), whatever table this GPU ships
  if (forced) {
    o.threshold = 0;
    o.decode_ceiling = 0;
  }
  return o;
}

void check_projections(RankContext& ctx, const std::string& model, Checks& c) {
  const MlaConfig cfg = MlaConfig::preset(model, ctx.size, ctx.rank);
  const std::vector<int64_t> ms = {1, 96, 1040};  // decode, small prefill, prefill past the gate (not 128-aligned)
  const int64_t max_m = 1040;
  for (const ShardSpec& s : {q_b_proj_shard(cfg), o_proj_shard(cfg)}) {
    const bool row = s.kind == ShardKind::row;
    const std::string gemm = row ? "o_proj" : "q_b_proj";
    Buffer w = device_normal(s.full_n * s.full_k, 1000 + row, 0.02f);
    Buffer x = device_normal(max_m * s.full_k, 2000 + row, 1.0f);
    Buffer xr(MemorySpace::device, static_cast<size_t>(max_m * s.k) * sizeof(bf16));
    copy_shard(xr.data(), MemorySpace::device, x.data(), MemorySpace::device, row_shard(max_m, s.full_k, ctx.rank, ctx.size),
               sizeof(bf16));
    const int64_t out_cols = row ? s.full_n : s.n;
    Buffer y1(MemorySpace::device, static_cast<size_t>(max_m * s.full_n) * sizeof(bf16));
    Buffer yr(MemorySpace::device, static_cast<size_t>(max_m * out_cols) * sizeof(bf16));
    struct Variant {
      const char* name;
      bool fp8, forced;
    };
    for (const Variant v : {Variant{"off", false, false}, Variant{"on", true, false}, Variant{"on-forced", true, true}}) {
      ProjectionLayer tp1(MemorySpace::device, w.data<bf16>(), s.full_n, s.full_k, popts(v.fp8, v.forced, max_m));
      ShardedProjection shard(MemorySpace::device, s, w.data<bf16>(), MemorySpace::device, ctx.comm,
                              popts(v.fp8, v.forced, max_m));
      settle();
      const std::string tag = model + " " + gemm + " " + s.describe() + " flag " + v.name;
      if (v.fp8) {
        // The rank's own FP8 copy is bit for bit the slice of the unsharded layer's copy.
        c.expect(shard.layer().has_fp8_copy() && tp1.has_fp8_copy(), tag + ": both layers hold an FP8 copy");
        const Fp8WeightView full = *tp1.fp8_weight(), mine = *shard.layer().fp8_weight();
        HostFp8Weight hf = make_host_fp8_weight(full.n, full.k), hm = make_host_fp8_weight(mine.n, mine.k);
        copy_bytes(hf.values.data(), MemorySpace::host, full.values, MemorySpace::device, hf.values.size());
        copy_bytes(hf.scales.data(), MemorySpace::host, full.scales, MemorySpace::device, hf.scales.size() * 4);
        copy_bytes(hm.values.data(), MemorySpace::host, mine.values, MemorySpace::device, hm.values.size());
        copy_bytes(hm.scales.data(), MemorySpace::host, mine.scales, MemorySpace::device, hm.scales.size() * 4);
        const HostFp8Weight sliced = slice_fp8(hf.view(), s);
        c.expect(sliced.values == hm.values && sliced.scales == hm.scales,
                 tag + ": FP8 copy == slice of the TP 1 copy (values and 128x128 scales)");
      }
      for (int64_t m : ms) {
        const Path want = !v.fp8 ? Path::bf16 : (v.forced || m > 512) ? Path::fp8 : Path::bf16;
        c.expect(shard.path_for(m) == want && tp1.path_for(m) == want,
                 tag + " M=" + std::to_string(m) + ": path " + to_string(shard.path_for(m)));
        poison(y1);
        poison(yr);
        tp1.forward(x.data<bf16>(), m, y1.data<bf16>(), ctx.stream);
        shard.forward(row ? xr.data<bf16>() : x.data<bf16>(), m, yr.data<bf16>(), ctx.stream);
        const auto full = download(ctx, y1.data(), m * s.full_n);
        std::vector<bf16> ref = full;
        if (!row) {
          ref.assign(static_cast<size_t>(m * s.n), bf16{});
          for (int64_t i = 0; i < m; ++i) std::memcpy(&ref[i * s.n], &full[i * s.full_n + s.n_offset], s.n * 2);
        }
        const Diff d = diff(download(ctx, yr.data(), m * out_cols), ref);
        c.expect(d.rel <= kTpRelTol && d.bad == 0, tag + " M=" + std::to_string(m) + " TP R vs TP 1: " + fmt_diff(d));
      }
    }
  }
}

void check_mla(RankContext& ctx, const std::string& model, Checks& c) {
  const int B = 2, L = 320;  // 640 prefill tokens: above the prefill gate (512)
  const int64_t T = int64_t{B} * L, stride = L + 8;
  const MlaConfig c1 = MlaConfig::preset(model, 1, 0), cr = MlaConfig::preset(model, ctx.size, ctx.rank);
  c.expect(cr.q_dim() == q_b_proj_shard(cr).n && cr.o_in_dim() == o_proj_shard(cr).k,
           model + ": the block's shard shapes match tp.hpp's (q_b " + std::to_string(cr.q_dim()) + " rows, o_proj " +
               std::to_string(cr.o_in_dim()) + " columns)");
  std::vector<int32_t> off(B + 1), start(B), pos(B, L);
  for (int b = 0; b <= B; ++b) off[b] = b * L;
  for (int b = 0; b < B; ++b) start[b] = static_cast<int32_t>(b * stride);
  auto dev = [](const std::vector<int32_t>& v) {
    Buffer d(MemorySpace::device, v.size() * 4);
    copy_bytes(d.data(), MemorySpace::device, v.data(), MemorySpace::host, d.bytes());
    return d;
  };
  Buffer d_off = dev(off), d_start = dev(start), d_pos = dev(pos);
  const MlaPrefillBatch pb{B, d_off.data<int32_t>(), d_start.data<int32_t>(), off.data()};
  const MlaDecodeBatch db{B, d_pos.data<int32_t>(), d_start.data<int32_t>(), L + 4};  // bound for 2 steps
  Buffer xp = device_normal(T * c1.hidden, 3000, 1.0f);
  Buffer xd = device_normal(int64_t{B} * c1.hidden, 3001, 1.0f), xd2 = device_normal(int64_t{B} * c1.hidden, 3002, 1.0f);
  const int64_t out = T * c1.hidden, dout = int64_t{B} * c1.hidden;
  Buffer y1(MemorySpace::device, out * 2), yr(MemorySpace::device, out * 2), yg(MemorySpace::device, dout * 2);

  struct Variant {
    const char* name;
    bool fp8;
    Fp8Policy policy;
    bool forced;
  };
  for (const Variant v : {Variant{"off", false, Fp8Policy::prefill, false}, Variant{"on", true, Fp8Policy::prefill, false},
                          Variant{"on-all", true, Fp8Policy::all, true}}) {
    MlaOptions o;
    o.name = model + ".self_attn";
    o.tagged.fp8 = v.fp8;
    o.tagged.policy = v.policy;
    o.tagged.apply_env = false;
    o.tagged.use_tune_table = false;
    if (v.forced) {
      o.tagged.threshold = 0;
      o.tagged.decode_ceiling = 0;
    }
    o.max_tokens = T;
    o.max_batch = B;
    o.cache_capacity = B * stride;
    MlaBlock b1(MemorySpace::device, c1, 11, o);
    o.all_reduce = mla_all_reduce(*ctx.comm);
    MlaBlock br(MemorySpace::device, cr, 11, o);
    settle();
    const std::string tag = model + " MLA TP" + std::to_string(ctx.size) + " flag " + v.name;
    const Path want_prefill = v.fp8 ? Path::fp8 : Path::bf16, want_decode = v.forced ? Path::fp8 : Path::bf16;
    c.expect(br.projection(MlaProjection::o_proj).path_for(T) == want_prefill &&
                 br.projection(MlaProjection::q_b_proj).path_for(T) == want_prefill &&
                 br.projection(MlaProjection::o_proj).path_for(B) == want_decode,
             tag + ": tagged paths prefill " + to_string(want_prefill) + ", decode " + to_string(want_decode));

    poison(y1);
    poison(yr);
    b1.prefill(xp.data<bf16>(), pb, y1.data<bf16>(), ctx.stream);
    br.prefill(xp.data<bf16>(), pb, yr.data<bf16>(), ctx.stream);
    Diff d = diff(download(ctx, yr.data(), out), download(ctx, y1.data(), out));
    c.expect(d.rel <= kTpBlockRelTol && d.bad == 0, tag + " prefill T=" + std::to_string(T) + ": " + fmt_diff(d));

    // Decode step 1 (position L) eagerly on both; step 2 (position L + 1) of TP 1 eagerly.
    b1.decode(xd.data<bf16>(), db, y1.data<bf16>(), ctx.stream);
    br.decode(xd.data<bf16>(), db, yr.data<bf16>(), ctx.stream);
    const auto ref1 = download(ctx, y1.data(), dout), eager = download(ctx, yr.data(), dout);
    d = diff(eager, ref1);
    c.expect(d.rel <= kTpBlockRelTol && d.bad == 0, tag + " decode B=" + std::to_string(B) + " eager: " + fmt_diff(d));

    // TP R step 1 captured in a CUDA graph (its eager warm-up step rewrites the same cache
    // rows), replayed; then step 2 by replaying with new x and positions.
    Buffer xg(MemorySpace::device, dout * 2);
    copy_bytes(xg.data(), MemorySpace::device, xd.data(), MemorySpace::device, xg.bytes());
    poison(yg);
    MlaDecodeGraph graph(br, xg.data<bf16>(), db, yg.data<bf16>());
    poison(yg);
    graph.replay(ctx.stream);
    d = diff(download(ctx, yg.data(), dout), eager);
    c.expect(d.rel <= kTpRelTol && d.bad == 0, tag + " decode graph replay == eager: " + fmt_diff(d));

    std::vector<int32_t> pos2(B, L + 1);
    copy_bytes(d_pos.data(), MemorySpace::device, pos2.data(), MemorySpace::host, d_pos.bytes());
    copy_bytes(xg.data(), MemorySpace::device, xd2.data(), MemorySpace::device, xg.bytes());
    b1.decode(xd2.data<bf16>(), db, y1.data<bf16>(), ctx.stream);
    poison(yg);
    graph.replay(ctx.stream);
    d = diff(download(ctx, yg.data(), dout), download(ctx, y1.data(), dout));
    c.expect(d.rel <= kTpBlockRelTol && d.bad == 0, tag + " decode step 2 from the graph vs TP 1: " + fmt_diff(d));
    copy_bytes(d_pos.data(), MemorySpace::device, pos.data(), MemorySpace::host, d_pos.bytes());
  }
}

void rank_body(RankContext& ctx, const std::string& model) {
  Checks c;
  c.rank = ctx.rank;
  std::printf("[rank %d] %s\n", ctx.rank, ctx.comm->describe().c_str());
  check_projections(ctx, model, c);
  check_mla(ctx, model, c);
  FP8PROJ_CHECK(c.failures == 0, c.failures, " check(s) failed on rank ", ctx.rank, " (", to_string(ctx.model), ")");
}

// ---- error paths: a child process that must fail fast with the right message ------------------

// Role of a child started by error_path(): make the failure happen, print it, exit 3 when the
// message is the expected one.
int run_error_role(const std::string& role) {
  try {
    if (role == "missing-peer" || role == "missing-id") {
      auto comm = Communicator::create_from_env();
      std::printf("unexpected: communicator created: %s\n", comm->describe().c_str());
      return 1;
    }
  } catch (const Error& e) {
    const std::string what = e.what();
    std::printf("error as expected: %s\n", what.c_str());
    if (role == "missing-peer") return contains(what, "rank 0/2") && contains(what, "within") ? 3 : 1;
    if (role == "missing-id") return contains(what, "rank 1") && contains(what, "rank 0") ? 3 : 1;
  }
  return 1;
}

// Runs this program as one rank of a 2-rank job whose peer never comes; it must exit with the
// expected message well before `limit_s` (its deadline is 5 s).
bool error_path(const char* role, int rank, double limit_s) {
  const auto dir = std::filesystem::temp_directory_path() / ("fp8proj_tp_err_" + std::to_string(getpid()) + role);
  std::filesystem::create_directories(dir);
  const pid_t pid = fork();
  if (pid == 0) {
    setenv("FP8PROJ_TP_TEST_ROLE", role, 1);
    setenv("FP8PROJ_RANK", std::to_string(rank).c_str(), 1);
    setenv("FP8PROJ_WORLD_SIZE", "2", 1);
    setenv("FP8PROJ_LOCAL_RANK", "0", 1);
    setenv("FP8PROJ_NCCL_ID_FILE", (dir / "nccl_id").c_str(), 1);
    setenv("FP8PROJ_NCCL_TIMEOUT_S", "5", 1);
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    execl("/proc/self/exe", "fp8proj_tp_tests", static_cast<char*>(nullptr));
    _exit(127);
  }
  const auto t0 = std::chrono::steady_clock::now();
  int st = 0;
  bool exited = false;
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < limit_s) {
    if (waitpid(pid, &st, WNOHANG) == pid) {
      exited = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (!exited) {
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
  }
  std::filesystem::remove_all(dir);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const bool ok = exited && WIFEXITED(st) && WEXITSTATUS(st) == 3;
  std::printf("%s error path '%s' (rank %d of 2, peer absent): %s after %.1f s\n", ok ? "PASS" : "FAIL", role, rank,
              exited ? (ok ? "clear error" : "wrong exit status or message") : "HUNG (killed)", secs);
  return ok;
}

bool mismatch_errors(int gpus) {
  bool ok = true;
  try {
    std::vector<int> too_many(gpus + 1);
    for (int i = 0; i <= gpus; ++i) too_many[i] = i;
    Communicator::create_local(too_many);
    ok = false;
  } catch (const Error& e) {
    ok = ok && contains(e.what(), "sees " + std::to_string(gpus) + " GPU");
    std::printf("  %d ranks on %d GPUs: %s\n", gpus + 1, gpus, e.what());
  }
  try {
    Communicator::create_local({0, 0});
    ok = false;
  } catch (const Error& e) {
    ok = ok && contains(e.what(), "one GPU per rank");
    std::printf("  GPU 0 twice: %s\n", e.what());
  }
  std::printf("%s rank/GPU mismatches are refused with a clear error\n", ok ? "PASS" : "FAIL");
  return ok;
}

}  // namespace
}  // namespace fp8proj

int main(int argc, char** argv) {
  using namespace fp8proj;
  setenv("NCCL_NVLS_ENABLE", "0", 0);  // NVLink multicast stays off on shared machines
  std::string mode = "both", model = "glm5";
  int tp = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--mode") mode = v;
    else if (k == "--model") model = v;
    else if (k == "--tp") tp = std::atoi(v.c_str());
  }
  try {
    if (const char* role = std::getenv("FP8PROJ_TP_TEST_ROLE")) return run_error_role(role);
    auto body = [&](RankContext& ctx) { rank_body(ctx, model); };
    if (launched_as_rank()) {  // one of the processes the procs run below started
      LaunchOptions o;
      o.model = ProcessModel::env;
      o.size = tp;
      run_ranks(o, body);
      return 0;
    }
    const int gpus = visible_gpus();
    if (gpus < 2) {
      std::printf("SKIP: fp8proj_tp_tests needs at least 2 GPUs, this machine has %d (%s)\n", gpus,
                  built_with_cuda() ? "CUDA build" : "no CUDA");
      return 77;
    }
    std::string why;
    if (nccl_version(&why).empty()) {
      std::printf("SKIP: NCCL cannot be loaded: %s\n", why.c_str());
      return 77;
    }
    tp = std::min(tp, gpus);
    std::printf("fp8proj_tp_tests: %d GPUs visible, TP %d, model %s, NCCL %s\n", gpus, tp, model.c_str(),
                nccl_version().c_str());
    bool ok = mismatch_errors(gpus);
    for (const char* m : {"threads", "procs"}) {
      if (mode != "both" && mode != m) continue;
      LaunchOptions o;
      o.model = parse_process_model(m);
      o.size = tp;
      const auto t0 = std::chrono::steady_clock::now();
      try {
        run_ranks(o, body);
        std::printf("PASS process model %s: TP %d == TP 1 (projections, MLA prefill/decode/graph) in %.1f s\n", m, tp,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      } catch (const std::exception& e) {
        std::printf("FAIL process model %s: %s\n", m, e.what());
        ok = false;
      }
      std::fflush(stdout);
    }
    ok = error_path("missing-peer", 0, 60) && ok;
    ok = error_path("missing-id", 1, 60) && ok;
    std::printf("\nfp8proj_tp_tests: %s\n", ok ? "all passed" : "FAILED");
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::printf("FAIL: %s\n", e.what());
    return 1;
  }
}

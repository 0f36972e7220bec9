// run_ranks (include/fp8proj/tp_launch.hpp): one body per tensor-parallel rank, in a thread per
// GPU, in processes this one starts, or as one rank of a job a launcher started.
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string_view>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "fp8proj/error.hpp"
#include "fp8proj/log.hpp"
#include "fp8proj/tp_launch.hpp"

#if FP8PROJ_WITH_CUDA
#include <cuda_runtime.h>

#include "core/cuda_check.hpp"
#endif

namespace fp8proj {

const char* to_string(ProcessModel model) {
  switch (model) {
    case ProcessModel::threads: return "threads";
    case ProcessModel::procs: return "procs";
    case ProcessModel::env: return "env";
  }
  return "?";
}

bool launched_as_rank() {
  const auto e = rank_env_from_environment();
  return e && e->world_size > 1;
}

ProcessModel parse_process_model(std::string_view text) {
  if (text == "threads") return ProcessModel::threads;
  if (text == "procs") return ProcessModel::procs;
  if (text == "env") return ProcessModel::env;
  if (text == "auto") return launched_as_rank() ? ProcessModel::env : ProcessModel::threads;
  FP8PROJ_FAIL("process model '", text, "' is not one of threads, procs, env, auto");
}

#if FP8PROJ_WITH_CUDA

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

struct RankStream {
  cudaStream_t stream = nullptr;
  explicit RankStream(int device) {
    CUDA_CHECK(cudaSetDevice(device));
    // Non-blocking: work that other code queues on the legacy default stream (load-time copies)
    // neither waits for nor is waited for by this rank's collectives.
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  }
  ~RankStream() {
    if (stream) cudaStreamDestroy(stream);
  }
};

void run_env(const LaunchOptions& o, const std::function<void(RankContext&)>& body) {
  const auto e = rank_env_from_environment();
  FP8PROJ_CHECK(e.has_value(), o.name, ": process model 'env' needs the launcher variables (FP8PROJ_RANK and ",
                "FP8PROJ_WORLD_SIZE, or torchrun's RANK and WORLD_SIZE, ...)");
  FP8PROJ_CHECK(o.size <= 0 || o.size == e->world_size, o.name, ": launched as rank ", e->rank, " of ", e->world_size,
                " (", e->source, ") but asked for ", o.size, " ranks; make them agree");
  CommOptions co;
  co.name = o.name;
  auto comm = Communicator::create_from_env(co);
  RankStream rs(comm->device());
  RankContext ctx{comm->rank(), comm->size(), comm->device(), ProcessModel::env, comm.get(), rs.stream};
  try {
    body(ctx);
    comm->synchronize(rs.stream, "the end of this rank's work");
  } catch (const std::exception& ex) {
    // Abort rather than finalize: the peers may wait in a collective this rank never reaches.
    comm->request_abort(ex.what());
    throw Error(o.name + " rank " + std::to_string(ctx.rank) + "/" + std::to_string(ctx.size) + " failed: " + ex.what());
  }
}

void run_threads(const LaunchOptions& o, const std::function<void(RankContext&)>& body) {
  std::vector<int> devices = o.devices;
  if (devices.empty())
    for (int r = 0; r < o.size; ++r) devices.push_back(r);
  FP8PROJ_CHECK(static_cast<int>(devices.size()) == o.size, o.name, ": ", devices.size(), " GPUs given for ", o.size,
                " ranks");
  CommOptions co;
  co.name = o.name;
  auto comms = Communicator::create_local(devices, co);

  std::mutex m;
  std::condition_variable cv;
  int finished = 0;
  std::vector<std::string> errors(o.size);
  Clock::time_point first_failure{};
  bool failed = false;
  std::vector<std::thread> threads;
  for (int r = 0; r < o.size; ++r) {
    threads.emplace_back([&, r] {
      std::string error;
      try {
        RankStream rs(devices[r]);
        RankContext ctx{r, o.size, devices[r], ProcessModel::threads, comms[r].get(), rs.stream};
        body(ctx);
        comms[r]->synchronize(rs.stream, "the end of this rank's work");
      } catch (const std::exception& ex) {
        error = ex.what();
      }
      if (!error.empty()) {
        std::lock_guard<std::mutex> lock(m);
        errors[r] = error;
        if (!failed) {
          failed = true;
          first_failure = Clock::now();
        }
        // The other ranks may be waiting in a collective this one never reaches: make their
        // next synchronize (or finalize) abort instead of waiting for the deadline; and abort
        // this rank's communicator rather than finalize it.
        for (int j = 0; j < o.size; ++j)
          comms[j]->request_abort(j == r ? error : "rank " + std::to_string(r) + " failed: " + error);
      }
      // Each rank closes its own communicator on its own thread: finalizing waits for the
      // peers, which do the same on theirs.
      comms[r]->close();
      std::lock_guard<std::mutex> lock(m);
      ++finished;
      cv.notify_all();
    });
  }
  {
    std::unique_lock<std::mutex> lock(m);
    for (;;) {
      if (finished == o.size) break;
      if (failed && seconds_since(first_failure) > o.grace_s) {
        // A rank blocked outside our polling loops (in a CUDA call waiting for a collective
        // that will never complete) cannot be reached; say so and leave rather than hang.
        std::string msg = o.name + ": rank(s) still running " + std::to_string(static_cast<int>(o.grace_s)) +
                          " s after a failure; exiting the process. Failures:";
        for (int r = 0; r < o.size; ++r)
          if (!errors[r].empty()) msg += "\n  rank " + std::to_string(r) + ": " + errors[r];
        log(LogLevel::error, msg);
        std::fflush(stdout);
        std::_Exit(1);
      }
      cv.wait_for(lock, std::chrono::milliseconds(100));
    }
  }
  for (auto& t : threads) t.join();
  comms.clear();  // closed by their threads
  if (failed) {
    std::string msg = o.name + ": " + std::to_string(o.size) + " ranks in one process (threads), failures:";
    for (int r = 0; r < o.size; ++r)
      if (!errors[r].empty()) msg += "\n  rank " + std::to_string(r) + ": " + errors[r];
    throw Error(msg);
  }
}

std::vector<std::string> own_command_line() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  FP8PROJ_CHECK(in.good(), "cannot read /proc/self/cmdline to start the ranks; pass LaunchOptions::argv");
  std::vector<std::string> args;
  std::string arg;
  while (std::getline(in, arg, '\0')) args.push_back(arg);
  FP8PROJ_CHECK(!args.empty(), "/proc/self/cmdline is empty");
  return args;
}

void run_procs(const LaunchOptions& o) {
  FP8PROJ_CHECK(o.size >= 1, o.name, ": procs needs at least one rank");
  const bool own = o.argv.empty();
  const std::vector<std::string> args = own ? own_command_line() : o.argv;
  // The id file lives in a folder made for this job: a stale id from an earlier job is never read.
  std::string dir_template = (std::filesystem::temp_directory_path() / "fp8proj-tp-XXXXXX").string();
  FP8PROJ_CHECK(mkdtemp(dir_template.data()) != nullptr, o.name, ": cannot create a folder for the NCCL id under ",
                std::filesystem::temp_directory_path().string());
  const std::string dir = dir_template, id_file = dir + "/nccl_id";
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const char* exe = own ? "/proc/self/exe" : args[0].c_str();
  const pid_t parent = getpid();
  std::fflush(stdout);
  std::fflush(stderr);

  // Each rank's environment, built before fork(): between fork and exec the child may only
  // make async-signal-safe calls (no malloc: another thread may hold its lock).
  std::vector<std::vector<std::string>> envs(o.size);
  std::vector<std::vector<char*>> envps(o.size);
  const bool nvls_set = std::getenv("NCCL_NVLS_ENABLE") != nullptr;
  for (int r = 0; r < o.size; ++r) {
    for (char** e = environ; *e; ++e) {
      const std::string_view kv(*e);
      bool ours = false;
      for (const char* k : {"FP8PROJ_RANK=", "FP8PROJ_WORLD_SIZE=", "FP8PROJ_LOCAL_RANK=", "FP8PROJ_NCCL_ID_FILE=",
                            "FP8PROJ_NCCL_ID="})
        ours = ours || kv.starts_with(k);
      if (!ours) envs[r].emplace_back(kv);
    }
    envs[r].push_back("FP8PROJ_RANK=" + std::to_string(r));
    envs[r].push_back("FP8PROJ_WORLD_SIZE=" + std::to_string(o.size));
    envs[r].push_back("FP8PROJ_LOCAL_RANK=" + std::to_string(r));
    envs[r].push_back("FP8PROJ_NCCL_ID_FILE=" + id_file);
    if (!nvls_set) envs[r].push_back("NCCL_NVLS_ENABLE=0");  // NVLink multicast stays off
    for (auto& kv : envs[r]) envps[r].push_back(kv.data());
    envps[r].push_back(nullptr);
  }
  static constexpr char kExecFailed[] = "[fp8proj error] tp: a rank could not execute its command\n";

  std::vector<pid_t> pids(o.size, -1);
  for (int r = 0; r < o.size; ++r) {
    const pid_t pid = fork();
    FP8PROJ_CHECK(pid >= 0, o.name, ": fork() failed for rank ", r);
    if (pid == 0) {
      // Child: die with the launcher (no orphans if it is killed), then become rank r.
      prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (getppid() != parent) _exit(1);
      if (own) {
        execve(exe, argv.data(), envps[r].data());
      } else {
        execvpe(exe, argv.data(), envps[r].data());
      }
      [[maybe_unused]] const ssize_t n = write(2, kExecFailed, sizeof kExecFailed - 1);
      _exit(127);
    }
    pids[r] = pid;
  }

  std::vector<int> status(o.size, 0);
  std::vector<bool> done(o.size, false), stopped(o.size, false);
  int remaining = o.size;
  bool failed = false, sent_kill = false;
  Clock::time_point first_failure{}, term_sent{};
  bool sent_term = false;
  while (remaining > 0) {
    for (int r = 0; r < o.size; ++r) {
      if (done[r]) continue;
      int st = 0;
      const pid_t w = waitpid(pids[r], &st, WNOHANG);
      if (w == 0) continue;
      done[r] = true;
      --remaining;
      status[r] = st;
      const bool ok = w == pids[r] && WIFEXITED(st) && WEXITSTATUS(st) == 0;
      if (!ok && !failed) {
        failed = true;
        first_failure = Clock::now();
      }
    }
    if (remaining == 0) break;
    if (failed && !sent_term && seconds_since(first_failure) > o.grace_s) {
      for (int r = 0; r < o.size; ++r)
        if (!done[r]) {
          log(LogLevel::error, o.name + ": rank " + std::to_string(r) + " (pid " + std::to_string(pids[r]) +
                                   ") still running " + std::to_string(static_cast<int>(o.grace_s)) +
                                   " s after another rank failed; stopping it");
          kill(pids[r], SIGTERM);
          stopped[r] = true;
        }
      sent_term = true;
      term_sent = Clock::now();
    }
    if (sent_term && !sent_kill && seconds_since(term_sent) > 5) {
      for (int r = 0; r < o.size; ++r)
        if (!done[r]) kill(pids[r], SIGKILL);
      sent_kill = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  if (failed) {
    std::string msg = o.name + ": " + std::to_string(o.size) + " ranks in separate processes (procs), outcome:";
    for (int r = 0; r < o.size; ++r) {
      const int st = status[r];
      std::string what = WIFEXITED(st) ? "exited with status " + std::to_string(WEXITSTATUS(st))
                         : WIFSIGNALED(st) ? "ended by signal " + std::to_string(WTERMSIG(st))
                                           : "ended";
      if (stopped[r]) what += " (stopped by the launcher)";
      msg += "\n  rank " + std::to_string(r) + ": " + what;
    }
    msg += "\n(each rank printed its own error above)";
    throw Error(msg);
  }
}

}  // namespace

void run_ranks(const LaunchOptions& options, const std::function<void(RankContext&)>& body) {
  ProcessModel model = options.model;
  if (model == ProcessModel::procs && launched_as_rank()) model = ProcessModel::env;  // we are one of the copies
  switch (model) {
    case ProcessModel::threads: return run_threads(options, body);
    case ProcessModel::procs: return run_procs(options);
    case ProcessModel::env: return run_env(options, body);
  }
}

#else

void run_ranks(const LaunchOptions& options, const std::function<void(RankContext&)>&) {
  FP8PROJ_FAIL(options.name, ": running tensor-parallel ranks needs a CUDA build with NCCL; this build has no CUDA");
}

#endif

}  // namespace fp8proj

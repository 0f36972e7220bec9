// Running a piece of work once per tensor-parallel rank, in either process model of tp.hpp:
//
//   threads  this process drives `size` GPUs, one thread per rank (Communicator::create_local)
//   procs    this process starts `size` copies of a command (by default itself, with the same
//            arguments) with FP8PROJ_RANK, FP8PROJ_WORLD_SIZE, FP8PROJ_LOCAL_RANK and a fresh
//            FP8PROJ_NCCL_ID_FILE set, and waits for them; each copy calls run_ranks() again and,
//            seeing those variables, runs as one rank ("env")
//   env      this process is one rank of a job a launcher started (torchrun, mpirun, srun, or
//            procs above): Communicator::create_from_env
//
// Failures are reported, never hung on: a rank that throws makes the others abort their
// communicators (threads) or be stopped after a grace period (procs), and run_ranks throws an
// fp8proj::Error naming every rank that failed and why. Child processes die with the parent
// (PR_SET_PDEATHSIG), so killing the launcher leaves no orphans.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "fp8proj/tp.hpp"

namespace fp8proj {

enum class ProcessModel : uint8_t { threads, procs, env };
const char* to_string(ProcessModel model);
// "threads" | "procs" | "env" | "auto": env when this process was launched as a rank (see
// launched_as_rank()), else threads.
ProcessModel parse_process_model(std::string_view text);
// True when the launcher variables of a multi-rank job are set (FP8PROJ_RANK, torchrun's RANK,
// ...) with a world size above 1.
bool launched_as_rank();

struct RankContext {
  int rank = 0, size = 1, device = 0;
  ProcessModel model = ProcessModel::threads;
  Communicator* comm = nullptr;  // this rank's communicator
  StreamHandle stream = nullptr; // a non-blocking stream on `device`, made for this rank
  bool root() const { return rank == 0; }
};

struct LaunchOptions {
  ProcessModel model = ProcessModel::threads;
  int size = 2;                   // threads, procs: number of ranks (env: from the environment)
  std::vector<int> devices;       // threads: GPU of each rank (default 0, 1, ...)
  std::vector<std::string> argv;  // procs: the command of each rank (default: this program, same arguments)
  double grace_s = 20;            // after a rank fails, how long the others get to stop by themselves
  std::string name = "tp";
};

// Runs body once per rank (threads, env) or starts the ranks (procs) and returns when all have
// finished; throws if any rank failed. body runs on the rank's device (current on its thread).
void run_ranks(const LaunchOptions& options, const std::function<void(RankContext&)>& body);

}  // namespace fp8proj

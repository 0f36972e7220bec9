// The NCCL communicator of include/fp8proj/tp.hpp.
//
// NCCL is opened with dlopen at the first use, not linked: libnccl.so.2 is a 200+ MB library
// that many machines running the single-GPU parts do not have, and a missing DT_NEEDED entry
// would stop the whole binary from loading. The functions come from the library found first:
//   FP8PROJ_NCCL_LIBRARY (exclusively, when set), libnccl.so.2 on the loader's path, the one
//   CMake found at build time, /usr/local/cuda/lib64, then pip's nvidia-nccl wheels (PyTorch).
// The header (nccl.h) is needed at build time for the types; builds without it, or without
// CUDA, keep the API and throw from it.
//
// Every communicator is nonblocking (ncclConfig_t::blocking = 0, NCCL >= 2.14): NCCL calls
// return at once, possibly with ncclInProgress, and we poll ncclCommGetAsyncError against a
// deadline. That is what lets a missing peer become an error message instead of a hang.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "fp8proj/error.hpp"
#include "fp8proj/log.hpp"
#include "fp8proj/tp.hpp"

#if FP8PROJ_WITH_CUDA && FP8PROJ_WITH_NCCL
#include <dlfcn.h>
#include <glob.h>
#include <nccl.h>

#include <cuda_runtime.h>

#include "core/cuda_check.hpp"
#include "core/device_fault.hpp"
#endif

#ifndef FP8PROJ_NCCL_LIBRARY_HINT
#define FP8PROJ_NCCL_LIBRARY_HINT ""
#endif

namespace fp8proj {

#if FP8PROJ_WITH_CUDA && FP8PROJ_WITH_NCCL

namespace {

// NCCL >= 2.14: ncclCommInitRankConfig, nonblocking communicators, ncclCommFinalize.
// (Collectives inside CUDA graphs need >= 2.9, so this covers that too.)
constexpr int kMinNcclVersion = 21400;

struct NcclApi {
  void* handle = nullptr;
  std::string path, why;
  int version = 0;
  decltype(&ncclGetVersion) GetVersion = nullptr;
  decltype(&ncclGetUniqueId) GetUniqueId = nullptr;
  decltype(&ncclCommInitRankConfig) CommInitRankConfig = nullptr;
  decltype(&ncclCommGetAsyncError) CommGetAsyncError = nullptr;
  decltype(&ncclCommAbort) CommAbort = nullptr;
  decltype(&ncclCommFinalize) CommFinalize = nullptr;
  decltype(&ncclCommDestroy) CommDestroy = nullptr;
  decltype(&ncclAllReduce) AllReduce = nullptr;
  decltype(&ncclAllGather) AllGather = nullptr;
  decltype(&ncclGetErrorString) GetErrorString = nullptr;
  decltype(&ncclGetLastError) GetLastError = nullptr;  // optional (2.13)
  decltype(&ncclGroupStart) GroupStart = nullptr;
  decltype(&ncclGroupEnd) GroupEnd = nullptr;
};

std::vector<std::string> nccl_candidates() {
  if (auto p = std::getenv("FP8PROJ_NCCL_LIBRARY"); p && *p) return {p};
  std::vector<std::string> c = {"libnccl.so.2"};
  if (std::string(FP8PROJ_NCCL_LIBRARY_HINT).size()) c.emplace_back(FP8PROJ_NCCL_LIBRARY_HINT);
  c.emplace_back("/usr/local/cuda/lib64/libnccl.so.2");
  for (const char* pattern : {"/usr/local/lib/python3*/dist-packages/nvidia/nccl/lib/libnccl.so.2",
                              "/usr/local/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so.2",
                              "/usr/lib/python3*/dist-packages/nvidia/nccl/lib/libnccl.so.2",
                              "/opt/conda/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so.2"}) {
    glob_t g{};
    if (glob(pattern, 0, nullptr, &g) == 0)
      for (size_t i = 0; i < g.gl_pathc; ++i) c.emplace_back(g.gl_pathv[i]);
    globfree(&g);
  }
  return c;
}

NcclApi load_nccl() {
  // NVLink SHARP (multicast objects) stays off unless the user asked for it explicitly: on
  // shared machines a program using it can take the host's GPUs out of service.
  setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);
  NcclApi api;
  std::string tried;
  for (const std::string& path : nccl_candidates()) {
    api.handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (api.handle) {
      api.path = path;
      break;
    }
    const char* err = dlerror();
    tried += "\n  " + path + ": " + (err ? err : "not loadable");
  }
  if (!api.handle) {
    api.why = "libnccl.so.2 could not be loaded; set FP8PROJ_NCCL_LIBRARY to its path (e.g. the one in "
              "PyTorch's nvidia/nccl/lib) or add its folder to LD_LIBRARY_PATH. Tried:" + tried;
    return api;
  }
  bool ok = true;
  auto sym = [&](auto& fn, const char* name, bool required = true) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(api.handle, name));
    if (!fn && required) {
      ok = false;
      api.why += std::string(api.why.empty() ? "" : ", ") + name;
    }
  };
  sym(api.GetVersion, "ncclGetVersion");
  sym(api.GetUniqueId, "ncclGetUniqueId");
  sym(api.CommInitRankConfig, "ncclCommInitRankConfig");
  sym(api.CommGetAsyncError, "ncclCommGetAsyncError");
  sym(api.CommAbort, "ncclCommAbort");
  sym(api.CommFinalize, "ncclCommFinalize");
  sym(api.CommDestroy, "ncclCommDestroy");
  sym(api.AllReduce, "ncclAllReduce");
  sym(api.AllGather, "ncclAllGather");
  sym(api.GetErrorString, "ncclGetErrorString");
  sym(api.GetLastError, "ncclGetLastError", false);
  sym(api.GroupStart, "ncclGroupStart");
  sym(api.GroupEnd, "ncclGroupEnd");
  if (ok) api.GetVersion(&api.version);
  if (!ok || api.version < kMinNcclVersion) {
    api.why = api.path + " is NCCL " + std::to_string(api.version) + (ok ? "" : " without " + api.why) +
              "; fp8proj needs NCCL >= 2.14 (nonblocking communicators). Point FP8PROJ_NCCL_LIBRARY at a newer one.";
    dlclose(api.handle);
    api.handle = nullptr;
  }
  return api;
}

const NcclApi& nccl() {
  static const NcclApi api = load_nccl();
  FP8PROJ_CHECK(api.handle != nullptr, "NCCL is not available: ", api.why);
  return api;
}

std::string version_string(int v) {
  // NCCL_VERSION(X, Y, Z) = X * 10000 + Y * 100 + Z from 2.9 on.
  return std::to_string(v / 10000) + "." + std::to_string((v / 100) % 100) + "." + std::to_string(v % 100);
}

ncclDataType_t to_nccl(CommDtype t) {
  switch (t) {
    case CommDtype::bf16: return ncclBfloat16;
    case CommDtype::f32: return ncclFloat32;
    case CommDtype::f64: return ncclFloat64;
    case CommDtype::i32: return ncclInt32;
  }
  return ncclBfloat16;
}

size_t dtype_bytes(CommDtype t) {
  switch (t) {
    case CommDtype::bf16: return 2;
    case CommDtype::f32: return 4;
    case CommDtype::f64: return 8;
    case CommDtype::i32: return 4;
  }
  return 0;
}

ncclRedOp_t to_nccl(CommOp op) {
  switch (op) {
    case CommOp::sum: return ncclSum;
    case CommOp::max: return ncclMax;
    case CommOp::min: return ncclMin;
  }
  return ncclSum;
}

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Polls with a short spin first (a collective's enqueue normally finishes within microseconds),
// then backs off so a long wait does not burn a core.
void backoff(int iteration) {
  if (iteration < 200) {
    std::this_thread::yield();
  } else {
    std::this_thread::sleep_for(std::chrono::microseconds(iteration < 2000 ? 50 : 1000));
  }
}

int visible_devices() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

std::string visible_devices_note() {
  const char* v = std::getenv("CUDA_VISIBLE_DEVICES");
  return v ? std::string(" (CUDA_VISIBLE_DEVICES=") + v + ")" : std::string();
}

// "start at most 2 rank(s) per node", or why there is none to start.
std::string per_node_hint(int visible) {
  if (visible == 0) return "no GPU is usable here (driver missing, or CUDA_VISIBLE_DEVICES empty?)";
  return "start at most " + std::to_string(visible) + " rank(s) per node";
}

// Nonblocking unless FP8PROJ_NCCL_BLOCKING=1: a fallback should some NCCL version misbehave with
// nonblocking communicators (e.g. inside graph capture). Blocking init cannot time out; the
// deadline then covers synchronize() only.
ncclConfig_t nonblocking_config() {
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  const char* b = std::getenv("FP8PROJ_NCCL_BLOCKING");
  cfg.blocking = (b != nullptr && std::string(b) == "1") ? 1 : 0;
  return cfg;
}

}  // namespace

struct Communicator::Impl {
  ncclComm_t comm = nullptr;
  int rank = 0, size = 1, device = 0;
  double timeout_s = 120;
  std::string name = "tp";
  bool finalized = false, broken = false;
  std::atomic<bool> abort_requested{false};
  std::mutex reason_mutex;
  std::string abort_reason;

  std::string who() const {
    return name + " rank " + std::to_string(rank) + "/" + std::to_string(size) + " (GPU " + std::to_string(device) + ")";
  }

  std::string last_error() const {
    const NcclApi& api = nccl();
    const char* s = api.GetLastError ? api.GetLastError(comm) : nullptr;
    return (s && *s) ? std::string(": ") + s : std::string();
  }

  // Aborts the communicator (after printing the message: if the abort itself blocks, the
  // reason is already on the screen) and throws it. An NCCL error may be a dead CUDA context
  // underneath (ncclUnhandledCudaError): then the device-fault latch closes with it too.
  [[noreturn]] void fail(const std::string& message) {
    log(LogLevel::error, message);
    if (const cudaError_t sticky = sticky_cuda_error_now(); sticky != cudaSuccess)
      note_cuda_error(sticky, message + " (" + cuda_error_text(sticky) + ")");
    if (comm != nullptr) nccl().CommAbort(comm);
    broken = true;
    comm = nullptr;
    throw Error(message);
  }

  void check_abort_request(const std::string& what) {
    if (!abort_requested.load(std::memory_order_acquire)) return;
    std::string reason;
    {
      std::lock_guard<std::mutex> lock(reason_mutex);
      reason = abort_reason;
    }
    fail(who() + ": aborted while " + what + ": " + reason);
  }

  // Polls until NCCL's state for this communicator leaves ncclInProgress.
  void wait_ready(const std::string& what, const std::string& hint = "") {
    const auto t0 = Clock::now();
    for (int i = 0;; ++i) {
      ncclResult_t st = ncclSuccess;
      const ncclResult_t q = nccl().CommGetAsyncError(comm, &st);
      if (q != ncclSuccess) st = q;
      if (st == ncclSuccess) return;
      if (st != ncclInProgress)
        fail(who() + ": NCCL error while " + what + ": " + nccl().GetErrorString(st) + last_error() + hint);
      check_abort_request(what);
      if (seconds_since(t0) > timeout_s)
        fail(who() + ": " + what + " did not finish within " + std::to_string(static_cast<int>(timeout_s)) + " s" +
             hint + " (deadline FP8PROJ_NCCL_TIMEOUT_S)");
      backoff(i);
    }
  }

  void check_call(ncclResult_t r, const std::string& what) {
    if (r == ncclSuccess) return;
    if (r == ncclInProgress) return wait_ready(what);
    fail(who() + ": " + what + " failed: " + nccl().GetErrorString(r) + last_error());
  }

  // After a sticky CUDA error (core/device_fault.hpp) the communicator is aborted, not used: a
  // collective enqueued on a dead context never completes, and the peers must not wait on it.
  void check_usable(const char* what) {
    if (const std::string* fault = device_fault()) [[unlikely]] {
      if (comm != nullptr) {
        log(LogLevel::error, who() + ": communicator aborted: the CUDA context is unusable");
        nccl().CommAbort(comm);
        comm = nullptr;
        broken = true;
      }
      throw Error(device_unusable_message(*fault));
    }
    FP8PROJ_CHECK(comm != nullptr && !broken, who(), ": ", what, " on a communicator that was aborted or destroyed");
  }

  void start_finalize() {
    if (abort_requested.load()) broken = true;
    if (comm == nullptr || broken || finalized) return;
    finalized = true;
    const ncclResult_t r = nccl().CommFinalize(comm);
    if (r != ncclSuccess && r != ncclInProgress) broken = true;
  }

  // Never throws (destructors): errors are logged and the communicator aborted.
  void finish_destroy() noexcept {
    if (comm == nullptr) return;
    try {
      // After a failure elsewhere, finalizing would wait for peers that may never come; on a
      // dead context (a sticky CUDA error), for collectives that never complete.
      if (abort_requested.load() || device_fault() != nullptr) broken = true;
      if (!broken) {
        start_finalize();
        wait_ready("finalizing (waiting for the peers to finish their collectives)");
      }
      if (comm != nullptr) {
        if (broken) {
          nccl().CommAbort(comm);
        } else {
          nccl().CommDestroy(comm);
        }
      }
    } catch (...) {
      // fail() has logged the reason and aborted the communicator.
    }
    comm = nullptr;
  }
};

Communicator::Communicator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Communicator::~Communicator() {
  if (impl_) impl_->finish_destroy();
}

CommId Communicator::new_id() {
  const NcclApi& api = nccl();
  ncclUniqueId uid;
  const ncclResult_t r = api.GetUniqueId(&uid);
  FP8PROJ_CHECK(r == ncclSuccess, "ncclGetUniqueId failed: ", api.GetErrorString(r),
                " (it opens a socket on this host: check NCCL_SOCKET_IFNAME if the host has several interfaces)");
  static_assert(sizeof(uid.internal) == sizeof(CommId::bytes), "ncclUniqueId is 128 bytes");
  CommId id;
  std::memcpy(id.bytes.data(), uid.internal, id.bytes.size());
  return id;
}

namespace {
std::unique_ptr<Communicator::Impl> make_impl(int rank, int size, int device, const CommOptions& o) {
  auto impl = std::make_unique<Communicator::Impl>();
  impl->rank = rank;
  impl->size = size;
  impl->device = device;
  impl->timeout_s = o.timeout_s.value_or(comm_timeout_s());
  impl->name = o.name;
  FP8PROJ_CHECK(impl->timeout_s > 0, o.name, ": the communicator timeout must be positive");
  return impl;
}

std::string init_hint(int size) {
  return ": waiting for all " + std::to_string(size) +
         " ranks to join with the same NCCL id; is every rank started, with the same FP8PROJ_NCCL_ID or "
         "FP8PROJ_NCCL_ID_FILE and world size " + std::to_string(size) + "?";
}
}  // namespace

std::unique_ptr<Communicator> Communicator::create(const CommId& id, int rank, int size, int device,
                                                   const CommOptions& options) {
  check_device_usable();
  const NcclApi& api = nccl();
  FP8PROJ_CHECK(size >= 1 && rank >= 0 && rank < size, options.name, ": rank ", rank, " of ", size,
                " is not a valid rank");
  const int visible = visible_devices();
  FP8PROJ_CHECK(device >= 0 && device < visible, options.name, " rank ", rank, "/", size, ": GPU ", device,
                " asked for, but this process sees ", visible, " GPU(s)", visible_devices_note(), "; ",
                per_node_hint(visible), ", or set LOCAL_RANK / FP8PROJ_LOCAL_RANK to a GPU index");
  CUDA_CHECK(cudaSetDevice(device));
  auto impl = make_impl(rank, size, device, options);
  ncclUniqueId uid;
  std::memcpy(uid.internal, id.bytes.data(), id.bytes.size());
  ncclConfig_t cfg = nonblocking_config();
  const ncclResult_t r = api.CommInitRankConfig(&impl->comm, size, uid, rank, &cfg);
  if (r != ncclSuccess && r != ncclInProgress)
    impl->fail(impl->who() + ": ncclCommInitRankConfig failed: " + api.GetErrorString(r) + impl->last_error());
  impl->wait_ready("NCCL init", init_hint(size));
  return std::unique_ptr<Communicator>(new Communicator(std::move(impl)));
}

std::vector<std::unique_ptr<Communicator>> Communicator::create_local(const std::vector<int>& devices,
                                                                      const CommOptions& options) {
  check_device_usable();
  const NcclApi& api = nccl();
  const int n = static_cast<int>(devices.size());
  const int visible = visible_devices();
  FP8PROJ_CHECK(n >= 1, options.name, ": no GPUs given");
  FP8PROJ_CHECK(n <= visible, options.name, ": ", n, " ranks asked for in one process, but it sees ", visible,
                " GPU(s)", visible_devices_note(), "; ",
                visible == 0 ? per_node_hint(0)
                             : "use at most " + std::to_string(visible) + " ranks, or one process per GPU on more nodes");
  for (int i = 0; i < n; ++i) {
    FP8PROJ_CHECK(devices[i] >= 0 && devices[i] < visible, options.name, ": GPU ", devices[i], " (rank ", i,
                  ") does not exist; this process sees ", visible, visible_devices_note());
    for (int j = 0; j < i; ++j)
      FP8PROJ_CHECK(devices[i] != devices[j], options.name, ": GPU ", devices[i], " is given to ranks ", j, " and ", i,
                    "; NCCL needs one GPU per rank");
  }
  int previous = 0;
  CUDA_CHECK(cudaGetDevice(&previous));
  const CommId id = new_id();
  ncclUniqueId uid;
  std::memcpy(uid.internal, id.bytes.data(), id.bytes.size());
  std::vector<std::unique_ptr<Impl>> impls;
  for (int i = 0; i < n; ++i) impls.push_back(make_impl(i, n, devices[i], options));
  // One thread inits all ranks: the calls must be grouped, or the first would wait for the others.
  std::vector<ncclConfig_t> cfgs(n, nonblocking_config());
  ncclResult_t r = api.GroupStart();
  for (int i = 0; i < n && r == ncclSuccess; ++i) {
    CUDA_CHECK(cudaSetDevice(devices[i]));
    r = api.CommInitRankConfig(&impls[i]->comm, n, uid, i, &cfgs[i]);
    if (r == ncclInProgress) r = ncclSuccess;
  }
  const ncclResult_t g = api.GroupEnd();
  CUDA_CHECK(cudaSetDevice(previous));
  if (r == ncclSuccess && g != ncclInProgress) r = g;
  if (r != ncclSuccess) {
    for (auto& impl : impls)
      if (impl->comm) api.CommAbort(impl->comm);
    FP8PROJ_FAIL(options.name, ": creating ", n, " communicators in one process failed: ", api.GetErrorString(r));
  }
  for (auto& impl : impls) impl->wait_ready("NCCL init (one process, " + std::to_string(n) + " GPUs)");
  std::vector<std::unique_ptr<Communicator>> out;
  for (auto& impl : impls) out.push_back(std::unique_ptr<Communicator>(new Communicator(std::move(impl))));
  return out;
}

std::unique_ptr<Communicator> Communicator::create_from_env(const CommOptions& options) {
  check_device_usable();
  const std::optional<RankEnv> e = rank_env_from_environment();
  FP8PROJ_CHECK(e.has_value(), options.name, ": no rank in the environment; set FP8PROJ_RANK and FP8PROJ_WORLD_SIZE ",
                "(or launch with torchrun / mpirun / srun) and FP8PROJ_NCCL_ID_FILE or FP8PROJ_NCCL_ID");
  const double timeout = options.timeout_s.value_or(comm_timeout_s());
  const int visible = visible_devices();
  FP8PROJ_CHECK(e->local_rank < visible, options.name, " rank ", e->rank, "/", e->world_size, ": local rank ",
                e->local_rank, " (from ", e->source, ") has no GPU: this process sees ", visible, " GPU(s)",
                visible_devices_note(), "; ", per_node_hint(visible));
  CommId id;
  if (e->id_hex) {
    id = CommId::from_hex(*e->id_hex);
  } else {
    FP8PROJ_CHECK(e->id_file.has_value(), options.name, " rank ", e->rank, ": no NCCL id: set FP8PROJ_NCCL_ID_FILE ",
                  "to a path every rank can read (rank 0 writes it) or FP8PROJ_NCCL_ID to `fp8proj tp id`'s output");
    if (e->rank == 0) {
      CUDA_CHECK(cudaSetDevice(e->local_rank));  // the id carries rank 0's host address, not its GPU
      id = new_id();
      write_comm_id_file(*e->id_file, id);
    } else {
      id = read_comm_id_file(*e->id_file, timeout, e->rank);
    }
  }
  CommOptions o = options;
  o.timeout_s = timeout;
  return create(id, e->rank, e->world_size, e->local_rank, o);
}

void Communicator::destroy_all(std::vector<std::unique_ptr<Communicator>>& comms) {
  // One thread per communicator: a finalize completes only when its peers finalize too, and a
  // blocking communicator's finalize does not return before that.
  std::vector<std::thread> threads;
  for (auto& c : comms)
    if (c) threads.emplace_back([&c] { c->close(); });
  for (auto& t : threads) t.join();
  comms.clear();
}

void Communicator::close() noexcept { impl_->finish_destroy(); }

int Communicator::rank() const { return impl_->rank; }
int Communicator::size() const { return impl_->size; }
int Communicator::device() const { return impl_->device; }

std::string Communicator::describe() const {
  return impl_->who() + ", NCCL " + version_string(nccl().version) + " from " + nccl().path;
}

void Communicator::all_reduce(const void* send, void* recv, int64_t count, CommDtype dtype, CommOp op,
                              StreamHandle stream) {
  Impl& s = *impl_;
  if (count == 0) return;
  s.check_usable("all_reduce");
  FP8PROJ_CHECK(count > 0 && send != nullptr && recv != nullptr, s.who(), ": all_reduce of ", count,
                " elements with a null buffer");
  s.check_call(nccl().AllReduce(send, recv, static_cast<size_t>(count), to_nccl(dtype), to_nccl(op), s.comm,
                                static_cast<cudaStream_t>(stream)),
               "all-reduce of " + std::to_string(count) + " elements");
}

void Communicator::all_reduce_sum(const bf16* send, bf16* recv, int64_t count, StreamHandle stream) {
  all_reduce(send, recv, count, CommDtype::bf16, CommOp::sum, stream);
}

void Communicator::all_gather(const void* send, void* recv, int64_t count, CommDtype dtype, StreamHandle stream) {
  Impl& s = *impl_;
  if (count == 0) return;
  s.check_usable("all_gather");
  FP8PROJ_CHECK(count > 0 && send != nullptr && recv != nullptr, s.who(), ": all_gather with a null buffer");
  s.check_call(nccl().AllGather(send, recv, static_cast<size_t>(count), to_nccl(dtype), s.comm,
                                static_cast<cudaStream_t>(stream)),
               "all-gather of " + std::to_string(count) + " elements per rank");
}

void Communicator::warm_up(int64_t max_bf16_elements, StreamHandle stream) {
  Impl& s = *impl_;
  s.check_usable("warm_up");
  // Small, medium and the largest size: NCCL picks different algorithms and protocols by size
  // (LL below ~64 KB, LL128 / Simple above), and connects each on its first use.
  const int64_t largest = std::max<int64_t>(max_bf16_elements, 1);
  void* buf = nullptr;
  CUDA_CHECK(cudaSetDevice(s.device));
  CUDA_CHECK(cudaMalloc(&buf, static_cast<size_t>(largest) * 2));
  CUDA_CHECK(cudaMemsetAsync(buf, 0, static_cast<size_t>(largest) * 2, static_cast<cudaStream_t>(stream)));
  try {
    for (int64_t c : {int64_t{1}, std::min<int64_t>(largest, 32768), largest})
      all_reduce_sum(static_cast<bf16*>(buf), static_cast<bf16*>(buf), c, stream);
    synchronize(stream, "the warm-up all-reduces");
  } catch (...) {
    cudaFree(buf);
    throw;
  }
  CUDA_CHECK(cudaFree(buf));
}

void Communicator::synchronize(StreamHandle stream, std::string_view what) {
  Impl& s = *impl_;
  s.check_usable("synchronize");
  const std::string w(what);
  const auto t0 = Clock::now();
  for (int i = 0;; ++i) {
    const cudaError_t q = cudaStreamQuery(static_cast<cudaStream_t>(stream));
    ncclResult_t st = ncclSuccess;
    nccl().CommGetAsyncError(s.comm, &st);
    if (st != ncclSuccess && st != ncclInProgress)
      s.fail(s.who() + ": NCCL error while " + w + ": " + nccl().GetErrorString(st) + s.last_error());
    if (q == cudaSuccess) return;
    if (q != cudaErrorNotReady) {
      const std::string message = s.who() + ": " + cuda_error_text(q) + " while " + w;
      note_cuda_error(q, message);  // a sticky error closes the device-fault latch
      cudaGetLastError();
      s.fail(message);
    }
    s.check_abort_request(w);
    if (seconds_since(t0) > s.timeout_s)
      s.fail(s.who() + ": waited " + std::to_string(static_cast<int>(s.timeout_s)) + " s for " + w +
             "; a peer rank has probably failed or never reached the matching collective (deadline "
             "FP8PROJ_NCCL_TIMEOUT_S)");
    backoff(i);
  }
}

void Communicator::request_abort(std::string reason) {
  {
    std::lock_guard<std::mutex> lock(impl_->reason_mutex);
    impl_->abort_reason = std::move(reason);
  }
  impl_->abort_requested.store(true, std::memory_order_release);
}

bool Communicator::aborted() const { return impl_->broken || impl_->abort_requested.load(); }

std::string nccl_version(std::string* why) {
  try {
    return version_string(nccl().version);
  } catch (const Error& e) {
    if (why) *why = e.what();
    return "";
  }
}

#else  // no CUDA, or no nccl.h at build time

namespace {
[[noreturn]] void no_nccl() {
#if FP8PROJ_WITH_CUDA
  FP8PROJ_FAIL("this build has no NCCL support (nccl.h was not found at configure time; set NCCL_HOME or install "
               "the NCCL headers and reconfigure)");
#else
  FP8PROJ_FAIL("tensor-parallel communicators need a CUDA build with NCCL; this build has no CUDA "
               "(configure with FP8PROJ_CUDA=ON). Shard arithmetic and host shards work without one.");
#endif
}
}  // namespace

struct Communicator::Impl {};
Communicator::Communicator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Communicator::~Communicator() = default;
CommId Communicator::new_id() { no_nccl(); }
std::vector<std::unique_ptr<Communicator>> Communicator::create_local(const std::vector<int>&, const CommOptions&) {
  no_nccl();
}
std::unique_ptr<Communicator> Communicator::create_from_env(const CommOptions&) { no_nccl(); }
std::unique_ptr<Communicator> Communicator::create(const CommId&, int, int, int, const CommOptions&) { no_nccl(); }
void Communicator::destroy_all(std::vector<std::unique_ptr<Communicator>>& comms) { comms.clear(); }
int Communicator::rank() const { no_nccl(); }
int Communicator::size() const { no_nccl(); }
int Communicator::device() const { no_nccl(); }
std::string Communicator::describe() const { no_nccl(); }
void Communicator::all_reduce(const void*, void*, int64_t, CommDtype, CommOp, StreamHandle) { no_nccl(); }
void Communicator::all_reduce_sum(const bf16*, bf16*, int64_t, StreamHandle) { no_nccl(); }
void Communicator::all_gather(const void*, void*, int64_t, CommDtype, StreamHandle) { no_nccl(); }
void Communicator::warm_up(int64_t, StreamHandle) { no_nccl(); }
void Communicator::synchronize(StreamHandle, std::string_view) { no_nccl(); }
void Communicator::request_abort(std::string) {}
bool Communicator::aborted() const { return true; }
void Communicator::close() noexcept {}

std::string nccl_version(std::string* why) {
  try {
    no_nccl();
  } catch (const Error& e) {
    if (why) *why = e.what();
  }
  return "";
}

#endif

}  // namespace fp8proj

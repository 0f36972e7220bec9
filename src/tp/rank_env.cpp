// Where a process sits in a multi-process job (launcher variables), and the hand-over of the
// NCCL unique id through a file or a variable (include/fp8proj/tp.hpp). Host only.
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include "fp8proj/env.hpp"
#include "fp8proj/error.hpp"
#include "fp8proj/tp.hpp"
#include "io/mapped_file.hpp"

namespace fp8proj {

namespace {

struct LauncherVars {
  const char* rank;
  const char* world;
  const char* local;
  const char* source;
};

// In order of precedence: ours, then the launchers that set them for us.
constexpr LauncherVars kLaunchers[] = {
    {"FP8PROJ_RANK", "FP8PROJ_WORLD_SIZE", "FP8PROJ_LOCAL_RANK", "FP8PROJ_RANK"},
    {"RANK", "WORLD_SIZE", "LOCAL_RANK", "torchrun (RANK)"},
    {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "Open MPI (OMPI_COMM_WORLD_RANK)"},
    {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "Slurm (SLURM_PROCID)"},
};

// Larger than any NCCL job; keeps every rank and size an int.
constexpr int64_t kMaxWorldSize = 1 << 20;
constexpr double kMaxCommTimeoutS = 7 * 24 * 3600.0;
// An id file holds 256 hex digits and a newline; anything much larger is not one.
constexpr size_t kMaxIdFileBytes = 4096;

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ' || s.back() == '\t')) s.pop_back();
  size_t i = 0;
  while (i < s.size() && (s[i] == ' ' || s[i] == '\t')) ++i;
  return s.substr(i);
}

}  // namespace

std::optional<RankEnv> rank_env_from_environment() {
  // FP8PROJ_WORLD_SIZE alone is a half-configured launch: say so rather than ignore it.
  FP8PROJ_CHECK(env::get("FP8PROJ_RANK") || !env::get("FP8PROJ_WORLD_SIZE"),
                "FP8PROJ_WORLD_SIZE is set but FP8PROJ_RANK is not: set both (and FP8PROJ_LOCAL_RANK on multi-node jobs)");
  for (const LauncherVars& v : kLaunchers) {
    // Ranks and sizes are ints everywhere after this; refuse what would not fit rather than
    // truncate it (4294967296 would become rank 0).
    const auto rank = env::get_int(v.rank, 0, kMaxWorldSize - 1);
    if (!rank) continue;
    const auto world = env::get_int(v.world, 1, kMaxWorldSize);
    FP8PROJ_CHECK(world.has_value(), v.rank, "=", *rank, " is set but ", v.world, " is not: the world size is unknown");
    FP8PROJ_CHECK(*rank < *world, v.rank, "=", *rank, " must be below ", v.world, "=", *world);
    RankEnv e;
    e.rank = static_cast<int>(*rank);
    e.world_size = static_cast<int>(*world);
    // FP8PROJ_LOCAL_RANK overrides the launcher's; without either, one node is assumed and
    // the GPU index is the global rank.
    auto local = env::get_int("FP8PROJ_LOCAL_RANK", 0, kMaxWorldSize - 1);
    if (!local) local = env::get_int(v.local, 0, kMaxWorldSize - 1);
    e.local_rank = static_cast<int>(local.value_or(*rank));
    e.source = v.source;
    e.id_file = env::get("FP8PROJ_NCCL_ID_FILE");
    e.id_hex = env::get("FP8PROJ_NCCL_ID");
    return e;
  }
  return std::nullopt;
}

double comm_timeout_s() {
  // At least 1 ms, at most a week: a deadline that the clocks can represent.
  return env::get_number("FP8PROJ_NCCL_TIMEOUT_S", 0.001, kMaxCommTimeoutS).value_or(120.0);
}

std::string CommId::hex() const {
  static const char* digits = "0123456789abcdef";
  std::string s;
  s.reserve(2 * bytes.size());
  for (uint8_t b : bytes) {
    s.push_back(digits[b >> 4]);
    s.push_back(digits[b & 15]);
  }
  return s;
}

CommId CommId::from_hex(std::string_view hex) {
  FP8PROJ_CHECK(hex.size() == 2 * sizeof(CommId::bytes), "an NCCL id must be ", 2 * sizeof(CommId::bytes),
                " hex digits, got ", hex.size(), " characters (make one with `fp8proj tp id`)");
  CommId id;
  for (size_t i = 0; i < id.bytes.size(); ++i) {
    const int hi = hex_digit(hex[2 * i]), lo = hex_digit(hex[2 * i + 1]);
    FP8PROJ_CHECK(hi >= 0 && lo >= 0, "the NCCL id has a non-hex character at position ", hi < 0 ? 2 * i : 2 * i + 1);
    id.bytes[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  return id;
}

void write_comm_id_file(const std::string& path, const CommId& id) {
  // Same folder, so rename() is atomic: a reader sees no file or the whole id.
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    FP8PROJ_CHECK(out.good(), "cannot write the NCCL id to '", tmp, "' (FP8PROJ_NCCL_ID_FILE): is its folder writable?");
    out << id.hex() << "\n";
    out.close();
    FP8PROJ_CHECK(out.good(), "writing the NCCL id to '", tmp, "' failed");
  }
  FP8PROJ_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, "cannot move the NCCL id into place at '", path, "'");
}

CommId read_comm_id_file(const std::string& path, double timeout_s, int rank) {
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    struct stat st {};
    // Not there yet: wait. There, but a FIFO, a device or a directory: refuse at once (reading
    // one would block or never end); a regular file is read with a size bound.
    if (::stat(path.c_str(), &st) == 0) {
      const std::string text = trim(io::read_regular_file(path, kMaxIdFileBytes));
      if (text.size() == 2 * sizeof(CommId::bytes)) return CommId::from_hex(text);
      FP8PROJ_CHECK(text.empty(), "rank ", rank, ": '", path, "' (FP8PROJ_NCCL_ID_FILE) does not hold an NCCL id (",
                    text.size(), " characters instead of 256 hex digits)");
    }
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    FP8PROJ_CHECK(waited < timeout_s, "rank ", rank, ": waited ", static_cast<int>(waited), " s for rank 0 to write the ",
                  "NCCL id to '", path, "' (FP8PROJ_NCCL_ID_FILE); is rank 0 running, with the same path on a ",
                  "filesystem every rank sees? (deadline FP8PROJ_NCCL_TIMEOUT_S=", timeout_s, ")");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace fp8proj

// Hostile input: one regression test per class of finding of the fuzzing review (docs/
// robustness.md). Each bad input must give fp8proj::Error with a message naming the problem --
// never a crash, a hang, a silent coercion or a sanitizer report (this file also runs in the
// ASan+UBSan build, tests/sanitize).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "env_guard.hpp"
#include "fp8proj/checkpoint.hpp"
#include "fp8proj/env.hpp"
#include "fp8proj/error.hpp"
#include "fp8proj/numbers.hpp"
#include "fp8proj/projection.hpp"
#include "fp8proj/tp.hpp"
#include "fp8proj/tune.hpp"
#include "io/json_checked.hpp"
#include "io/safetensors.hpp"

namespace fp8proj {
namespace {

namespace fs = std::filesystem;
using testing::EnvGuard;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

#define EXPECT_ERROR_HAS(stmt, text) EXPECT_NE(error_of([&] { stmt; }).find(text), std::string::npos) << error_of([&] { stmt; })

// A fresh folder per test under the gtest temp dir.
fs::path scratch(const std::string& name) {
  const fs::path p = fs::path(::testing::TempDir()) / ("hostile_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

void write_file(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A safetensors file: 8-byte little-endian header length, the header text, the data.
std::string safetensors_bytes(const std::string& header, const std::string& data) {
  std::string s(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(s.data(), &n, 8);
  return s + header + data;
}

std::string floats(const std::vector<float>& v) {
  std::string s(v.size() * 4, '\0');
  std::memcpy(s.data(), v.data(), s.size());
  return s;
}

// ---- 1. deep nesting: bounded parse, bounded message --------------------------------------

TEST(Hostile, DeeplyNestedHeaderIsAnErrorNotAStackOverflow) {
  const fs::path dir = scratch("deep");
  for (const std::string field : {"shape", "data_offsets"}) {
    std::string deep(65000, '[');
    deep += std::string(65000, ']');
    const std::string header = R"({"t": {"dtype": "U8", ")" + field + R"(": )" + deep + R"(, "shape": [1], "data_offsets": [0, 1]}})";
    write_file(dir / "deep.safetensors", safetensors_bytes(header, "x"));
    const std::string e = error_of([&] { Checkpoint c((dir / "deep.safetensors").string()); });
    EXPECT_NE(e.find("nested more than"), std::string::npos) << e;
    EXPECT_LT(e.size(), 1000u);
  }
}

TEST(Hostile, JsonDescriptionIsBounded) {
  const nlohmann::json big = nlohmann::json::parse("[\"" + std::string(1000, 'a') + "\"]");
  EXPECT_LT(io::describe_json(big).size(), 200u);
  nlohmann::json wide = nlohmann::json::array();
  for (int i = 0; i < 100000; ++i) wide.push_back(i);
  EXPECT_EQ(io::describe_json(wide), "an array of 100000 elements");
  EXPECT_EQ(io::describe_json(nlohmann::json::parse("[1, [2]]")), "an array of 2 elements");
  EXPECT_EQ(io::describe_json(nlohmann::json::parse("[1, 2]")), "[1,2]");
  // The depth bound itself: exactly kMaxJsonDepth parses, one more does not.
  const std::string ok = std::string(io::kMaxJsonDepth, '[') + std::string(io::kMaxJsonDepth, ']');
  EXPECT_NO_THROW(io::parse_json(ok, "x"));
  EXPECT_ERROR_HAS(io::parse_json("[" + ok + "]", "x"), "nested more than");
  // Brackets inside strings do not count.
  EXPECT_NO_THROW(io::parse_json("[\"" + std::string(1000, '[') + "\"]", "x"));
}

// ---- 2. tuned table: every problem is an Error from the loader (the layer then logs once and
// uses the defaults; tests/CMakeLists.txt runs `fp8proj info` against each) ------------------

const char* kStamp =
    R"("stamp": {"gpu_name": "X", "sm_count": 1, "driver": "", "cuda_runtime": "", "cublaslt": "", "fp8proj_version": ""})";

std::string table_with(const std::string& stamp, const std::string& bucket_fields) {
  return R"({"format": "fp8proj-tune/1", )" + stamp + R"(, "shapes": [{"n": 128, "k": 128, "threshold": 1, "buckets": [{)" +
         bucket_fields + R"(}]}]})";
}

const char* kBucket = R"("m_lo": 1, "m_hi": 4, "fp8_backend": "a", "fp8_config": "", "bf16_us": 1, "fp8_us": 1)";

TEST(Hostile, TunedTableProblemsAreErrors) {
  const fs::path dir = scratch("table");
  auto rejected = [&](const std::string& text, const std::string& why) {
    write_file(dir / "t.json", text);
    EXPECT_ERROR_HAS(load_tune_table((dir / "t.json").string()), why);
  };
  write_file(dir / "good.json", table_with(kStamp, kBucket));
  EXPECT_NO_THROW(load_tune_table((dir / "good.json").string()));

  rejected(R"({"format": "fp8proj-tune/1", "shapes": []})", "missing field 'stamp'");
  rejected(R"({"format": "fp8proj-tune/1", "stamp": 5, "shapes": []})", "not an object");
  rejected(R"({"format": "fp8proj-tune/1", )" + std::string(kStamp) + R"(, "shapes": 7})", "not an array");
  using namespace std::string_literals;
  rejected("{\"format\": \"fp8proj-tune/1\"\0, \"x\": 1}"s, "NUL byte");
  // 8. values: no bool-as-int, no fraction-as-int, no 1e300 or 2^64, no INT64_MAX overflow.
  std::string st = kStamp;
  rejected(table_with(st.replace(st.find("\"sm_count\": 1"), 13, "\"sm_count\": true"), kBucket), "sm_count");
  st = kStamp;
  rejected(table_with(st.replace(st.find("\"sm_count\": 1"), 13, "\"sm_count\": 12.5"), kBucket), "sm_count");
  rejected(table_with(kStamp, R"("m_lo": 1, "m_hi": 1e300, "fp8_backend": "a", "fp8_config": "", "bf16_us": 1, "fp8_us": 1)"),
           "m_hi");
  rejected(table_with(kStamp, R"("m_lo": 1, "m_hi": 18446744073709551616, "fp8_backend": "a", "fp8_config": "", "bf16_us": 1, "fp8_us": 1)"),
           "m_hi");
  rejected(table_with(kStamp, R"("m_lo": 1, "m_hi": 4, "fp8_backend": "a", "fp8_config": "", "bf16_us": 1e300, "fp8_us": 1)"),
           "bf16_us");
  rejected(table_with(kStamp, R"("m_lo": 1, "m_hi": 4, "fp8_backend": 3, "fp8_config": "", "bf16_us": 1, "fp8_us": 1)"),
           "fp8_backend");
  // A bucket ending at INT64_MAX, then another: m_lo = m_hi + 1 would overflow.
  rejected(R"({"format": "fp8proj-tune/1", )" + std::string(kStamp) +
               R"(, "shapes": [{"n": 128, "k": 128, "threshold": 1, "buckets": [
                 {"m_lo": 1, "m_hi": 9223372036854775807, "fp8_backend": "a", "fp8_config": "", "bf16_us": 1, "fp8_us": 1},
                 {"m_lo": 1, "m_hi": 2, "fp8_backend": "a", "fp8_config": "", "bf16_us": 1, "fp8_us": 1}]}]})",
           "after the one ending");
  // Not regular files: a directory, a FIFO (would block), a device (would never end).
  EXPECT_ERROR_HAS(load_tune_table(dir.string()), "not a regular file");
  ASSERT_EQ(::mkfifo((dir / "fifo").c_str(), 0600), 0);
  EXPECT_ERROR_HAS(load_tune_table((dir / "fifo").string()), "named pipe");
  EXPECT_ERROR_HAS(load_tune_table("/dev/zero"), "not a regular file");
}

// ---- 3. argument checks before any work -----------------------------------------------------

TEST(Hostile, RowParallelForwardChecksTheCommunicatorFirst) {
  const int64_t n = 128, k = 256, m = 4;
  std::vector<bf16> w(n * k, float_to_bf16(0.01f));
  const ShardSpec s = row_shard(n, k, 0, 2);
  ShardedProjection shard(MemorySpace::host, s, w.data(), MemorySpace::host, nullptr, ProjectionOptions{});
  // Buffers far too small for the GEMM: the check must come before it touches them.
  std::vector<bf16> x(1, float_to_bf16(1.0f)), y(1, float_to_bf16(7.0f));
  EXPECT_ERROR_HAS(shard.forward(x.data(), m, y.data()), "needs a communicator");
  EXPECT_EQ(bf16_to_float(y[0]), 7.0f);
}

// ---- 4. FIFOs and devices as checkpoints and NCCL id files: refused at once -------------------

TEST(Hostile, SpecialFilesAreRefusedWithoutBlocking) {
  const fs::path dir = scratch("fifo");
  ASSERT_EQ(::mkfifo((dir / "c.safetensors").c_str(), 0600), 0);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_ERROR_HAS(Checkpoint c((dir / "c.safetensors").string()), "named pipe");
  EXPECT_ERROR_HAS(read_comm_id_file((dir / "c.safetensors").string(), 5.0, 1), "named pipe");
  EXPECT_ERROR_HAS(read_comm_id_file("/dev/zero", 5.0, 1), "not a regular file");
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.0);
  // A missing id file is waited for, up to the timeout.
  const auto t1 = std::chrono::steady_clock::now();
  EXPECT_ERROR_HAS(read_comm_id_file((dir / "absent").string(), 0.2, 1), "waited");
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  EXPECT_GE(waited, 0.2);
  EXPECT_LT(waited, 2.0);
  // An oversized regular file is not read whole.
  write_file(dir / "big", std::string(1 << 20, 'a'));
  EXPECT_ERROR_HAS(read_comm_id_file((dir / "big").string(), 1.0, 1), "more than");
}

// ---- 5. launcher variables: no truncation to int ---------------------------------------------

TEST(Hostile, LauncherVariablesAreRangeChecked) {
  EnvGuard r("FP8PROJ_RANK", "4294967296"), w("FP8PROJ_WORLD_SIZE", "4294967298");
  EXPECT_ERROR_HAS(rank_env_from_environment(), "FP8PROJ_RANK");
  {
    EnvGuard r2("FP8PROJ_RANK", "0"), w2("FP8PROJ_WORLD_SIZE", "99999999999999999999");
    EXPECT_ERROR_HAS(rank_env_from_environment(), "64-bit range");
  }
  {
    EnvGuard r2("FP8PROJ_RANK", "1"), w2("FP8PROJ_WORLD_SIZE", "2"), l("FP8PROJ_LOCAL_RANK", "-1");
    EXPECT_ERROR_HAS(rank_env_from_environment(), "FP8PROJ_LOCAL_RANK");
  }
  {
    EnvGuard r2("FP8PROJ_RANK", "1"), w2("FP8PROJ_WORLD_SIZE", "2");
    const auto e = rank_env_from_environment();
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ(e->rank, 1);
    EXPECT_EQ(e->world_size, 2);
  }
  for (const char* bad : {"nan", "inf", "-1", "0", "1e300", "12s", " 5", "0x10"}) {
    EnvGuard t("FP8PROJ_NCCL_TIMEOUT_S", bad);
    EXPECT_ERROR_HAS(comm_timeout_s(), "FP8PROJ_NCCL_TIMEOUT_S") << bad;
  }
  EnvGuard t("FP8PROJ_NCCL_TIMEOUT_S", "2.5");
  EXPECT_EQ(comm_timeout_s(), 2.5);
}

// ---- 6/7. the one number parser (CLI, environment, tables) ------------------------------------

TEST(Hostile, OneStrictNumberRule) {
  EXPECT_EQ(parse_int("42", "x"), 42);
  EXPECT_EQ(parse_int("-9223372036854775808", "x"), kInt64Min);
  EXPECT_EQ(parse_int("9223372036854775807", "x"), kInt64Max);
  for (const char* bad : {"", " 1", "1 ", "+1", "1.0", "1e3", "0x10", "9223372036854775808", "18446744073709551616",
                          "true", "--1", "1-"})
    EXPECT_ERROR_HAS(parse_int(bad, "--knob"), "--knob=") << bad;
  EXPECT_ERROR_HAS(parse_int("4294967297", "--tp", 1, 1024), "[1, 1024]");
  // Only a well-formed integer is called too large; "-", "1-2-3" and "--1" are malformed.
  EXPECT_ERROR_HAS(parse_int("-99999999999999999999", "x"), "64-bit range");
  for (const char* malformed : {"-", "1-2-3", "--1", "-1-"})
    EXPECT_ERROR_HAS(parse_int(malformed, "x"), "decimal digits only") << malformed;
  EXPECT_ERROR_HAS(parse_int("-1", "--reps", 1, 100), "--reps");
  EXPECT_EQ(parse_number("3.5", "x", 0, 100), 3.5);
  EXPECT_EQ(parse_number("1e2", "x", 0, 100), 100);
  for (const char* bad : {"nan", "NaN", "inf", "-inf", "-100", "1e999", "", "3%", "0x1p3"})
    EXPECT_ERROR_HAS(parse_number(bad, "--margin", 0, 100), "--margin") << bad;
  {
    EnvGuard g("FP8PROJ_MIN_FP8_TOKENS", "99999999999999999999");
    EXPECT_ERROR_HAS(env::min_fp8_tokens(), "FP8PROJ_MIN_FP8_TOKENS");
  }
  {
    EnvGuard g("FP8PROJ_DECODE_CEILING", "12.5");
    EXPECT_ERROR_HAS(env::decode_ceiling(), "FP8PROJ_DECODE_CEILING");
  }
  // Messages quote a bounded, printable excerpt.
  EXPECT_LT(error_of([] { parse_int(std::string(100000, '7') + "\x01", "x"); }).size(), 300u);
}

// ---- 9. FP8 block scales: finite, positive, and 448 x scale finite -----------------------------

TEST(Hostile, HarmfulFp8ScalesAreRejected) {
  const fs::path dir = scratch("scales");
  const std::string header_fmt =
      R"({"w": {"dtype": "F8_E4M3", "shape": [128, 128], "data_offsets": [0, 16384]},
          "w_scale_inv": {"dtype": "F32", "shape": [1, 1], "data_offsets": [16384, 16388]}})";
  auto file_with_scale = [&](float s) {
    write_file(dir / "w.safetensors", safetensors_bytes(header_fmt, std::string(16384, '\x38') + floats({s})));
    return (dir / "w.safetensors").string();
  };
  EXPECT_NO_THROW(Checkpoint(file_with_scale(0.5f)).read_fp8_weight("w"));
  for (float bad : {3e38f, 0.0f, -0.0f, -1.0f, std::numeric_limits<float>::quiet_NaN(),
                    std::numeric_limits<float>::infinity(), 1e36f})
    EXPECT_ERROR_HAS(Checkpoint(file_with_scale(bad)).read_fp8_weight("w"), "finite, positive") << bad;
}

// ---- 10. the reference parser's rules; paths confined; allocation failures named --------------

TEST(Hostile, HeaderRulesMatchTheReference) {
  const fs::path dir = scratch("ref");
  const std::string entry = R"("t": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]})";
  auto open = [&](const std::string& header, const std::string& data) {
    write_file(dir / "f.safetensors", safetensors_bytes(header, data));
    return Checkpoint((dir / "f.safetensors").string()).size();
  };
  // Accepted as the reference accepts them.
  EXPECT_EQ(open("  \n{" + entry + "}", "ab"), 1u);
  EXPECT_EQ(open("{" + entry + ", \"__metadata__\": null}", "ab"), 1u);
  EXPECT_EQ(open("{" + entry + "}    ", "ab"), 1u);
  // A NUL byte would end nlohmann's input: what follows (here a second tensor) would be lost.
  const std::string with_nul = "{" + entry + "}" + std::string(1, '\0') + "\"u\": {}";
  EXPECT_ERROR_HAS(open(with_nul, "ab"), "NUL byte");
  using namespace std::string_literals;
  EXPECT_ERROR_HAS(open("{\"t\": {\"dtype\": \"U8\"\0, \"shape\": [2], \"data_offsets\": [0, 2]}}"s, "ab"), "NUL byte");
}

TEST(Hostile, IndexShardsStayInTheCheckpointFolder) {
  const fs::path root = scratch("index");
  const fs::path ck = root / "ck", outside = root / "outside";
  fs::create_directories(ck);
  fs::create_directories(outside);
  const std::string shard = safetensors_bytes(R"({"t": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}})", "ab");
  write_file(outside / "s.safetensors", shard);
  write_file(ck / "s.safetensors", shard);
  auto index_to = [&](const std::string& name) {
    write_file(ck / "model.safetensors.index.json", R"({"weight_map": {"t": ")" + name + R"("}})");
    return ck.string();
  };
  EXPECT_EQ(Checkpoint(index_to("s.safetensors")).size(), 1u);
  EXPECT_ERROR_HAS(Checkpoint c(index_to((outside / "s.safetensors").string())), "absolute paths");
  EXPECT_ERROR_HAS(Checkpoint c(index_to("../outside/s.safetensors")), "'..'");
  fs::create_directory_symlink(outside, ck / "link");
  EXPECT_ERROR_HAS(Checkpoint c(index_to("link/s.safetensors")), "outside the checkpoint's folder");
  fs::create_symlink(outside / "s.safetensors", ck / "l.safetensors");
  EXPECT_ERROR_HAS(Checkpoint c(index_to("l.safetensors")), "outside the checkpoint's folder");
  // A FIFO as the index.
  fs::remove(ck / "model.safetensors.index.json");
  ASSERT_EQ(::mkfifo((ck / "model.safetensors.index.json").c_str(), 0600), 0);
  EXPECT_ERROR_HAS(Checkpoint c(ck.string()), "named pipe");
}

TEST(Hostile, HugeTensorAllocationIsANamedError) {
  // A sparse file whose header describes 2^38 bf16 values (512 GiB): valid, but no host here
  // holds it. The read must fail with fp8proj::Error naming the tensor, not std::bad_alloc.
  const fs::path dir = scratch("huge");
  const uint64_t bytes = uint64_t(1) << 39;
  const std::string header = R"({"huge": {"dtype": "BF16", "shape": [274877906944], "data_offsets": [0, 549755813888]}})";
  const fs::path p = dir / "huge.safetensors";
  write_file(p, safetensors_bytes(header, ""));
  std::error_code ec;
  fs::resize_file(p, 8 + header.size() + bytes, ec);
  if (ec) GTEST_SKIP() << "this filesystem cannot hold a 512 GiB sparse file: " << ec.message();
  const Checkpoint c(p.string());
  EXPECT_ERROR_HAS(c.read_bf16("huge"), "tensor 'huge'");
  fs::remove(p);
}

}  // namespace
}  // namespace fp8proj

// Tuned tables on disk (JSON, format "fp8proj-tune/1"), stamped with the GPU and versions.
#include <cctype>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>

#include <nlohmann/json.hpp>

#include "fp8proj/device.hpp"
#include "fp8proj/env.hpp"
#include "fp8proj/error.hpp"
#include "fp8proj/log.hpp"
#include "fp8proj/numbers.hpp"
#include "fp8proj/tune.hpp"
#include "io/json_checked.hpp"
#include "io/mapped_file.hpp"
#include "tune/config_dir.hpp"

namespace fp8proj {

using nlohmann::json;

std::vector<std::pair<int64_t, std::string>> tuned_config_by_m(const TunedShape& row,
                                                               const std::vector<std::optional<std::string>>& runs) {
  FP8PROJ_CHECK(runs.size() == row.buckets.size(), "tuned_config_by_m: ", runs.size(), " entries for ",
                row.buckets.size(), " buckets");
  std::vector<std::pair<int64_t, std::string>> out;
  bool tuned = false;
  for (size_t i = 0; i < runs.size(); ++i)
    if (runs[i]) {
      out.emplace_back(row.buckets[i].m_hi, *runs[i]);
      tuned = tuned || !runs[i]->empty();
    }
  if (!tuned) out.clear();
  return out;
}

const TunedBucket* TunedShape::bucket_for(int64_t m) const {
  for (const auto& b : buckets)
    if (m >= b.m_lo && m <= b.m_hi) return &b;
  return nullptr;
}

const TunedShape* TuneTable::find(int64_t n, int64_t k) const {
  for (const auto& s : shapes)
    if (s.n == n && s.k == k) return &s;
  return nullptr;
}

namespace {

// The shipped tables are ~40 KB; a table a thousand times larger is not one.
constexpr size_t kMaxTableBytes = 64u << 20;
// Bounds of the values a table may carry. M and the threshold go up to INT64_MAX (the
// "never FP8" threshold); N and K up to 2^31 (no weight dimension is larger); times are
// microseconds of one GEMM, at most ~11 days.
constexpr int64_t kMaxDim = int64_t(1) << 31;
constexpr double kMaxMicros = 1e12;

const nlohmann::json& member(const json& j, const char* key, const std::string& where) {
  FP8PROJ_CHECK(j.is_object(), where, " is ", io::describe_json(j), ", not an object");
  const auto it = j.find(key);
  FP8PROJ_CHECK(it != j.end(), where, ": missing field '", key, "'");
  return *it;
}

int64_t int_field(const json& j, const char* key, const std::string& where, int64_t lo, int64_t hi) {
  return io::json_int(member(j, key, where), where + ": field '" + key + "'", lo, hi);
}
std::string string_field(const json& j, const char* key, const std::string& where) {
  return io::json_string(member(j, key, where), where + ": field '" + key + "'");
}
double number_field(const json& j, const char* key, const std::string& where, double lo, double hi) {
  return io::json_number(member(j, key, where), where + ": field '" + key + "'", lo, hi);
}

}  // namespace

TuneTable load_tune_table(const std::string& path) {
  // Regular files only (a FIFO or device is refused unopened), read whole with a size bound.
  return parse_tune_table(io::read_regular_file(path, kMaxTableBytes), path);
}

TuneTable parse_tune_table(std::string_view text, const std::string& path) {
  const std::string where = "tuned table '" + path + "'";
  // Nesting bounded, no NUL bytes; then every field checked by type and range.
  const json j = io::parse_json(text, where);
  FP8PROJ_CHECK(string_field(j, "format", where) == kTuneFormat, where, ": format is not ", kTuneFormat);
  TuneTable t;
  t.source = path;
  const std::string sw0 = where + " stamp";
  const json& st = member(j, "stamp", where);
  t.stamp.gpu_name = string_field(st, "gpu_name", sw0);
  t.stamp.sm_count = static_cast<int>(int_field(st, "sm_count", sw0, 0, 1 << 20));
  t.stamp.driver = string_field(st, "driver", sw0);
  t.stamp.cuda_runtime = string_field(st, "cuda_runtime", sw0);
  t.stamp.cublaslt = string_field(st, "cublaslt", sw0);
  t.stamp.fp8proj_version = string_field(st, "fp8proj_version", sw0);
  const json& shapes = member(j, "shapes", where);
  FP8PROJ_CHECK(shapes.is_array(), where, ": field 'shapes' is ", io::describe_json(shapes), ", not an array");
  for (const json& s : shapes) {
    TunedShape shape;
    shape.n = int_field(s, "n", where + " shape", 1, kMaxDim);
    shape.k = int_field(s, "k", where + " shape", 1, kMaxDim);
    const std::string sw = where + " shape " + std::to_string(shape.n) + "x" + std::to_string(shape.k);
    FP8PROJ_CHECK(t.find(shape.n, shape.k) == nullptr, sw, ": listed twice");
    shape.threshold = int_field(s, "threshold", sw, 0, kInt64Max);
    const json& buckets = member(s, "buckets", sw);
    FP8PROJ_CHECK(buckets.is_array(), sw, ": field 'buckets' is ", io::describe_json(buckets), ", not an array");
    int64_t prev_hi = 0;
    for (const json& b : buckets) {
      FP8PROJ_CHECK(prev_hi < kInt64Max, sw, ": a bucket after the one ending at M=", prev_hi);
      TunedBucket bk;
      bk.m_lo = int_field(b, "m_lo", sw, 1, kInt64Max);
      bk.m_hi = int_field(b, "m_hi", sw, 1, kInt64Max);
      bk.fp8_backend = string_field(b, "fp8_backend", sw);
      bk.fp8_config = string_field(b, "fp8_config", sw);
      bk.bf16_us = number_field(b, "bf16_us", sw, -kMaxMicros, kMaxMicros);
      bk.fp8_us = number_field(b, "fp8_us", sw, -kMaxMicros, kMaxMicros);
      FP8PROJ_CHECK(bk.m_lo == prev_hi + 1 && bk.m_hi >= bk.m_lo, sw, ": buckets must be contiguous from M=1, got m_lo=",
                    bk.m_lo, ", m_hi=", bk.m_hi, " after m_hi=", prev_hi);
      FP8PROJ_CHECK(bk.bf16_us > 0 && bk.fp8_us > 0, sw, ": bucket [", bk.m_lo, ", ", bk.m_hi,
                    "] has a non-positive time (bf16_us=", bk.bf16_us, ", fp8_us=", bk.fp8_us, ")");
      if (b.contains("fp8_gemm_us")) {  // optional: tables written before it have none
        bk.fp8_gemm_us = number_field(b, "fp8_gemm_us", sw, -kMaxMicros, kMaxMicros);
        FP8PROJ_CHECK(bk.fp8_gemm_us > 0, sw, ": bucket [", bk.m_lo, ", ", bk.m_hi,
                      "] has a non-positive time (fp8_gemm_us=", bk.fp8_gemm_us, ")");
      }
      try {
        bk.config = parse_gemm_config(bk.fp8_backend, bk.fp8_config);
      } catch (const Error& e) {
        FP8PROJ_FAIL(sw, ": bucket [", bk.m_lo, ", ", bk.m_hi, "]: ", e.what());
      }
      prev_hi = bk.m_hi;
      shape.buckets.push_back(std::move(bk));
    }
    t.shapes.push_back(std::move(shape));
  }
  return t;
}

void save_tune_table(const TuneTable& t, const std::string& path) {
  json j;
  j["format"] = kTuneFormat;
  j["stamp"] = {{"gpu_name", t.stamp.gpu_name},     {"sm_count", t.stamp.sm_count},
                {"driver", t.stamp.driver},         {"cuda_runtime", t.stamp.cuda_runtime},
                {"cublaslt", t.stamp.cublaslt},     {"fp8proj_version", t.stamp.fp8proj_version}};
  j["shapes"] = json::array();
  for (const auto& s : t.shapes) {
    json js = {{"n", s.n}, {"k", s.k}, {"threshold", s.threshold}, {"buckets", json::array()}};
    for (const auto& b : s.buckets) {
      json jb = {{"m_lo", b.m_lo},         {"m_hi", b.m_hi},     {"fp8_backend", b.fp8_backend},
                 {"fp8_config", b.fp8_config}, {"bf16_us", b.bf16_us}, {"fp8_us", b.fp8_us}};
      if (b.fp8_gemm_us > 0) jb["fp8_gemm_us"] = b.fp8_gemm_us;
      js["buckets"].push_back(std::move(jb));
    }
    j["shapes"].push_back(std::move(js));
  }
  std::ofstream out(path);
  FP8PROJ_CHECK(out.good(), "cannot write tuned table '", path, "'");
  out << j.dump(1) << "\n";
  out.close();
  FP8PROJ_CHECK(!out.fail(), "writing tuned table '", path, "' failed (disk full?)");
}

std::string stamp_mismatch(const TuneStamp& stamp, const DeviceInfo& device) {
  if (!device.present) return "no GPU in this process";
  if (stamp.gpu_name != device.name)
    return "table is for '" + stamp.gpu_name + "', this GPU is '" + device.name + "'";
  if (stamp.sm_count != device.sm_count)
    return "table is for " + std::to_string(stamp.sm_count) + " SMs, this GPU has " + std::to_string(device.sm_count);
  return "";
}

TuneStamp current_stamp() {
  const DeviceInfo& d = current_device();
  return {d.name, d.sm_count, d.driver_version, d.runtime_version, d.cublaslt_version, fp8proj_version()};
}

std::string tune_file_name(const std::string& gpu_name) {
  std::string s;
  for (char c : gpu_name) {
    if (std::isalnum(static_cast<unsigned char>(c))) s += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    else if (!s.empty() && s.back() != '-') s += '-';
  }
  while (!s.empty() && s.back() == '-') s.pop_back();
  return s + ".json";
}

const TuneTable* active_tune_table() {
  static std::once_flag once;
  static std::optional<TuneTable> table;
  std::call_once(once, [] {
    const DeviceInfo& dev = current_device();
    std::string path;
    if (auto f = env::tune_file()) {
      path = *f;
    } else {
      if (!dev.present) return;
      std::string looked;
      for (const std::string& dir : tune_table_dirs()) {
        const std::string candidate = (std::filesystem::path(dir) / tune_file_name(dev.name)).string();
        if (std::filesystem::exists(candidate)) {
          path = candidate;
          break;
        }
        looked += (looked.empty() ? "" : ", ") + candidate;
      }
      if (path.empty()) {
        log(LogLevel::info, "no tuned table for " + dev.name + " (looked for " + looked + "); using defaults");
        return;
      }
    }
    try {
      TuneTable t = load_tune_table(path);
      if (const std::string why = stamp_mismatch(t.stamp, dev); !why.empty()) {
        log(LogLevel::warn, "tuned table '" + path + "' rejected: " + why + "; using defaults");
        return;
      }
      if (t.stamp.cublaslt != dev.cublaslt_version || t.stamp.driver != dev.driver_version)
        log(LogLevel::info, "tuned table '" + path + "' was measured with driver " + t.stamp.driver + ", cuBLASLt " +
                                t.stamp.cublaslt + " (now " + dev.driver_version + ", " + dev.cublaslt_version +
                                "); using it");
      table = std::move(t);
    } catch (const std::exception& e) {
      // One rule for every problem with the table (missing, not a regular file, corrupt,
      // wrong types): one log line, then the defaults.
      log(LogLevel::warn, std::string(e.what()) + "; using defaults");
    }
  });
  return table ? &*table : nullptr;
}

}  // namespace fp8proj

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
#include "fp8proj/tune.hpp"
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

template <typename T>
T field(const json& j, const char* key, const std::string& where) {
  FP8PROJ_CHECK(j.is_object() && j.contains(key), where, ": missing field '", key, "'");
  try {
    return j.at(key).get<T>();
  } catch (const json::exception& e) {
    FP8PROJ_FAIL(where, ": field '", key, "' has the wrong type (", e.what(), ")");
  }
}

}  // namespace

TuneTable load_tune_table(const std::string& path) {
  std::ifstream in(path);
  FP8PROJ_CHECK(in.good(), "cannot open tuned table '", path, "'");
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {
    FP8PROJ_FAIL("tuned table '", path, "' is not valid JSON: ", e.what());
  }
  const std::string where = "tuned table '" + path + "'";
  FP8PROJ_CHECK(field<std::string>(j, "format", where) == kTuneFormat, where, ": format is not ", kTuneFormat);
  TuneTable t;
  t.source = path;
  const json& st = j.at("stamp");
  t.stamp.gpu_name = field<std::string>(st, "gpu_name", where + " stamp");
  t.stamp.sm_count = field<int>(st, "sm_count", where + " stamp");
  t.stamp.driver = field<std::string>(st, "driver", where + " stamp");
  t.stamp.cuda_runtime = field<std::string>(st, "cuda_runtime", where + " stamp");
  t.stamp.cublaslt = field<std::string>(st, "cublaslt", where + " stamp");
  t.stamp.fp8proj_version = field<std::string>(st, "fp8proj_version", where + " stamp");
  for (const json& s : field<json>(j, "shapes", where)) {
    TunedShape shape;
    shape.n = field<int64_t>(s, "n", where);
    shape.k = field<int64_t>(s, "k", where);
    const std::string sw = where + " shape " + std::to_string(shape.n) + "x" + std::to_string(shape.k);
    FP8PROJ_CHECK(shape.n > 0 && shape.k > 0, sw, ": N and K must be positive");
    FP8PROJ_CHECK(t.find(shape.n, shape.k) == nullptr, sw, ": listed twice");
    shape.threshold = field<int64_t>(s, "threshold", sw);
    FP8PROJ_CHECK(shape.threshold >= 0, sw, ": threshold must be >= 0");
    int64_t prev_hi = 0;
    for (const json& b : field<json>(s, "buckets", sw)) {
      TunedBucket bk;
      bk.m_lo = field<int64_t>(b, "m_lo", sw);
      bk.m_hi = field<int64_t>(b, "m_hi", sw);
      bk.fp8_backend = field<std::string>(b, "fp8_backend", sw);
      bk.fp8_config = field<std::string>(b, "fp8_config", sw);
      bk.bf16_us = field<double>(b, "bf16_us", sw);
      bk.fp8_us = field<double>(b, "fp8_us", sw);
      FP8PROJ_CHECK(bk.m_lo == prev_hi + 1 && bk.m_hi >= bk.m_lo, sw, ": buckets must be contiguous from M=1, got [",
                    bk.m_lo, ", ", bk.m_hi, "] after ", prev_hi);
      FP8PROJ_CHECK(bk.bf16_us > 0 && bk.fp8_us > 0, sw, ": bucket [", bk.m_lo, ", ", bk.m_hi,
                    "] has a non-positive time");
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
    for (const auto& b : s.buckets)
      js["buckets"].push_back({{"m_lo", b.m_lo},
                               {"m_hi", b.m_hi},
                               {"fp8_backend", b.fp8_backend},
                               {"fp8_config", b.fp8_config},
                               {"bf16_us", b.bf16_us},
                               {"fp8_us", b.fp8_us}});
    j["shapes"].push_back(std::move(js));
  }
  std::ofstream out(path);
  FP8PROJ_CHECK(out.good(), "cannot write tuned table '", path, "'");
  out << j.dump(1) << "\n";
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
    } catch (const Error& e) {
      log(LogLevel::warn, std::string(e.what()) + "; using defaults");
    }
  });
  return table ? &*table : nullptr;
}

}  // namespace fp8proj

// Tuned tables: round trip, strict validation with the file named, stamp matching, and the
// layer falling back to defaults when the table does not apply.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "fp8proj/device.hpp"
#include "fp8proj/error.hpp"
#include "fp8proj/gemm_config.hpp"
#include "fp8proj/tune.hpp"
#include "tune/config_dir.hpp"

namespace fp8proj {
namespace {

std::string temp_path(const char* name) { return ::testing::TempDir() + name; }

TuneTable sample() {
  TuneTable t;
  t.stamp = {"NVIDIA H200", 132, "13.0", "13.0", "13.1.0", "0.1.0+test"};
  TunedShape s;
  s.n = 16384;
  s.k = 2048;
  s.threshold = 96;
  s.buckets = {{1, 16, "sm90_fp8_block", "m64n128_ws1_st8", 10, 12}, {17, 128, "sm90_fp8_block", "m64n128_ws1_st8", 20, 15},
               {129, 32768, "cublaslt_fp8_block", "", 100, 60}};
  s.buckets[0].fp8_gemm_us = 9;  // the GEMM alone wins where quantize + GEMM loses
  t.shapes.push_back(s);
  return t;
}

TEST(TuneTable, RoundTrip) {
  const std::string path = temp_path("tune_rt.json");
  save_tune_table(sample(), path);
  const TuneTable t = load_tune_table(path);
  EXPECT_EQ(t.stamp.gpu_name, "NVIDIA H200");
  ASSERT_NE(t.find(16384, 2048), nullptr);
  EXPECT_EQ(t.find(1, 1), nullptr);
  const TunedShape& s = *t.find(16384, 2048);
  EXPECT_EQ(s.threshold, 96);
  EXPECT_EQ(s.bucket_for(16)->m_hi, 16);
  EXPECT_EQ(s.bucket_for(17)->fp8_config, "m64n128_ws1_st8");
  EXPECT_TRUE(s.bucket_for(64)->fp8_wins());
  EXPECT_FALSE(s.bucket_for(1)->fp8_wins());
  // fp8_gemm_us is optional: kept where measured, 0 (and the one verdict for both) where not.
  EXPECT_EQ(s.bucket_for(1)->fp8_gemm_us, 9);
  EXPECT_TRUE(s.bucket_for(1)->fp8_gemm_wins());
  EXPECT_EQ(s.bucket_for(64)->fp8_gemm_us, 0);
  EXPECT_TRUE(s.bucket_for(64)->fp8_gemm_wins());
  EXPECT_FALSE(s.bucket_for(200)->fp8_gemm_us > 0);
  EXPECT_EQ(s.bucket_for(40000), nullptr);
  // The configuration is parsed once, when the table loads.
  const auto* typed = std::get_if<sm90::Config>(&s.bucket_for(17)->config);
  ASSERT_NE(typed, nullptr);
  EXPECT_EQ(typed->block_m, 64);
  EXPECT_EQ(typed->math_wgs, 1);
  EXPECT_EQ(typed->stages, 8);
  EXPECT_TRUE(is_heuristic(s.bucket_for(200)->config));
}

TEST(TuneTable, ConfigurationNamesAreCheckedWhenTheTableLoads) {
  TuneTable t = sample();
  t.shapes[0].buckets[1].fp8_config = "m64n128";  // not the grammar
  const std::string path = temp_path("tune_badcfg.json");
  save_tune_table(t, path);
  try {
    load_tune_table(path);
    ADD_FAILURE() << "accepted a bad configuration name";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(path), std::string::npos) << what;
    EXPECT_NE(what.find("[17, 128]"), std::string::npos) << what;
    EXPECT_NE(what.find("m64n128"), std::string::npos) << what;
  }
  t.shapes[0].buckets[1].fp8_config = "m96n128_ws2_st5";  // the grammar, but no compiled kernel
  save_tune_table(t, path);
  EXPECT_THROW(load_tune_table(path), Error);
  t = sample();
  t.shapes[0].buckets[2].fp8_config = "m128n128_ws2_st5";  // cublaslt_fp8_block has no named configurations
  save_tune_table(t, path);
  EXPECT_THROW(load_tune_table(path), Error);
  // The grammar in and out, per backend.
  EXPECT_EQ(config_name(parse_gemm_config("sm90_fp8_block", "swapab_m16n128_ws2_st11_sk4")), "swapab_m16n128_ws2_st11_sk4");
  EXPECT_TRUE(is_heuristic(parse_gemm_config("cpu_reference", "")));
  EXPECT_THROW(parse_gemm_config("cpu_reference", "x"), Error);
}

void expect_rejected(const std::string& text, const char* needle) {
  const std::string path = temp_path("tune_bad.json");
  std::ofstream(path) << text;
  try {
    load_tune_table(path);
    ADD_FAILURE() << "accepted: " << text;
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(needle), std::string::npos) << what;
    EXPECT_NE(what.find(path), std::string::npos) << "the message must name the file: " << what;
  }
}

TEST(TuneTable, CorruptFilesAreRejectedClearly) {
  expect_rejected("{not json", "not valid JSON");
  expect_rejected(R"({"format": "other/1"})", "format");
  expect_rejected(R"({"format": "fp8proj-tune/1", "stamp": {}})", "gpu_name");
  const std::string stamp =
      R"("stamp": {"gpu_name": "X", "sm_count": 1, "driver": "", "cuda_runtime": "", "cublaslt": "", "fp8proj_version": ""})";
  expect_rejected(R"({"format": "fp8proj-tune/1", )" + stamp + R"(, "shapes": [{"n": 128, "k": 128, "threshold": "x", "buckets": []}]})",
                  "threshold");
  expect_rejected(R"({"format": "fp8proj-tune/1", )" + stamp +
                      R"(, "shapes": [{"n": 128, "k": 128, "threshold": 1, "buckets": [{"m_lo": 2, "m_hi": 4, "fp8_backend": "a", "fp8_config": "", "bf16_us": 1, "fp8_us": 1}]}]})",
                  "contiguous");
  expect_rejected(R"({"format": "fp8proj-tune/1", )" + stamp +
                      R"(, "shapes": [{"n": 128, "k": 128, "threshold": 1, "buckets": [{"m_lo": 1, "m_hi": 4, "fp8_backend": "a", "fp8_config": "", "bf16_us": -1, "fp8_us": 1}]}]})",
                  "non-positive");
  expect_rejected(R"({"format": "fp8proj-tune/1", )" + stamp +
                      R"(, "shapes": [{"n": 128, "k": 128, "threshold": 1, "buckets": [{"m_lo": 1, "m_hi": 4, "fp8_backend": "a", "fp8_config": "", "bf16_us": 1, "fp8_us": 1, "fp8_gemm_us": 0}]}]})",
                  "fp8_gemm_us");
  expect_rejected(R"({"format": "fp8proj-tune/1", )" + stamp +
                      R"(, "shapes": [{"n": 128, "k": 128, "threshold": 1, "buckets": [{"m_lo": 1, "m_hi": 4, "fp8_backend": "a", "fp8_config": "", "bf16_us": 1, "fp8_us": 1, "fp8_gemm_us": "x"}]}]})",
                  "fp8_gemm_us");
  EXPECT_THROW(load_tune_table(temp_path("does_not_exist.json")), Error);
}

TEST(TuneTable, StampMustMatchTheGpu) {
  DeviceInfo h200;
  h200.present = true;
  h200.name = "NVIDIA H200";
  h200.sm_count = 132;
  EXPECT_EQ(stamp_mismatch(sample().stamp, h200), "");
  DeviceInfo h100 = h200;
  h100.name = "NVIDIA H100 80GB HBM3";
  EXPECT_NE(stamp_mismatch(sample().stamp, h100).find("H100"), std::string::npos);
  DeviceInfo cut = h200;
  cut.sm_count = 114;
  EXPECT_NE(stamp_mismatch(sample().stamp, cut).find("114"), std::string::npos);
  EXPECT_NE(stamp_mismatch(sample().stamp, DeviceInfo{}), "");
}

// The shipped tables are found next to the binaries (build tree: build/share/fp8proj/configs,
// a link to configs/; installed: <prefix>/share/fp8proj/configs), not through a compiled-in
// source path.
TEST(TuneTable, ShippedTablesAreFoundNextToTheBinaries) {
  const std::vector<std::string> dirs = tune_table_dirs();
  ASSERT_FALSE(dirs.empty());
  bool found = false;
  for (const auto& d : dirs) found = found || std::ifstream(d + "/nvidia-h200.json").good();
  EXPECT_TRUE(found) << "looked in " << dirs.front() << " and " << dirs.size() - 1 << " more";
  for (const auto& d : dirs) EXPECT_NE(d.find("share/fp8proj/configs"), std::string::npos) << d;
}

// Every shipped table loads (configuration names and buckets checked), is named after the GPU
// its stamp names (the file a device looks for), covers M from 1 with no gap, and tunes the same
// weight shapes as the others: a GPU with a table is not left on defaults for some projection.
TEST(TuneTable, EveryShippedTableLoadsAndCoversTheSameShapes) {
  std::string dir;
  for (const auto& d : tune_table_dirs())
    if (dir.empty() && std::filesystem::is_directory(d)) dir = d;
  ASSERT_FALSE(dir.empty()) << "no shipped table directory";
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().extension() == ".json") files.push_back(e.path());
  ASSERT_GE(files.size(), 2u) << dir;  // nvidia-h200.json, nvidia-h100-80gb-hbm3.json
  std::set<std::pair<int64_t, int64_t>> first;
  for (const auto& f : files) {
    SCOPED_TRACE(f.string());
    const TuneTable t = load_tune_table(f.string());
    EXPECT_EQ(tune_file_name(t.stamp.gpu_name), f.filename().string());
    EXPECT_GT(t.stamp.sm_count, 0);
    std::set<std::pair<int64_t, int64_t>> shapes;
    for (const TunedShape& s : t.shapes) {
      shapes.insert({s.n, s.k});
      ASSERT_FALSE(s.buckets.empty()) << s.n << "x" << s.k;
      EXPECT_EQ(s.buckets.front().m_lo, 1) << s.n << "x" << s.k;
      for (size_t i = 1; i < s.buckets.size(); ++i)
        EXPECT_EQ(s.buckets[i].m_lo, s.buckets[i - 1].m_hi + 1) << s.n << "x" << s.k << " bucket " << i;
    }
    EXPECT_EQ(shapes.size(), t.shapes.size()) << "a shape listed twice";
    if (first.empty()) first = shapes;
    EXPECT_EQ(shapes, first) << "tunes other shapes than " << files.front();
  }
}

TEST(TuneTable, FileNameFromGpuName) {
  EXPECT_EQ(tune_file_name("NVIDIA H200"), "nvidia-h200.json");
  EXPECT_EQ(tune_file_name("NVIDIA H100 80GB HBM3"), "nvidia-h100-80gb-hbm3.json");
  EXPECT_EQ(tune_file_name("  NVIDIA--H200 "), "nvidia-h200.json");  // as the Python package's _tune_file_name
}

// What one plan is told per M: the buckets it runs, with "" (its heuristic) kept so a bucket
// left to the heuristic does not inherit the next tuned configuration; nothing if none is tuned.
TEST(TuneTable, ConfigByMForOnePlan) {
  const TuneTable table = sample();
  const TunedShape& row = table.shapes[0];
  using Runs = std::vector<std::optional<std::string>>;
  using Out = std::vector<std::pair<int64_t, std::string>>;
  EXPECT_EQ(tuned_config_by_m(row, Runs{"m64n128_ws1_st8", "m64n128_ws1_st8", std::nullopt}),
            (Out{{16, "m64n128_ws1_st8"}, {128, "m64n128_ws1_st8"}}));
  EXPECT_EQ(tuned_config_by_m(row, Runs{"", "m64n128_ws1_st8", std::nullopt}), (Out{{16, ""}, {128, "m64n128_ws1_st8"}}));
  EXPECT_EQ(tuned_config_by_m(row, Runs{"m64n128_ws1_st8", "", ""}), (Out{{16, "m64n128_ws1_st8"}, {128, ""}, {32768, ""}}));
  EXPECT_TRUE(tuned_config_by_m(row, Runs{"", std::nullopt, ""}).empty());
  EXPECT_TRUE(tuned_config_by_m(row, Runs{std::nullopt, std::nullopt, std::nullopt}).empty());
  EXPECT_THROW(tuned_config_by_m(row, Runs{""}), Error);
}

}  // namespace
}  // namespace fp8proj

// The floor arithmetic of include/fp8proj/floor.hpp: weight bytes, the byte floor, ratios and
// the rotation that keeps a graph-replayed GEMM reading from DRAM. The device half (kernels,
// measured bandwidth, captured calls) is tested in tests/gpu/floor_gpu_test.cu.
#include <gtest/gtest.h>

#include "fp8proj/error.hpp"
#include "fp8proj/floor.hpp"
#include "fp8proj/gemm_config.hpp"

namespace fp8proj {
namespace {

TEST(Floor, WeightBytesCountValuesAndBlockScales) {
  // 7168 x 8192: 58,720,256 e4m3 values + 56 x 64 fp32 scales.
  EXPECT_EQ(fp8_weight_bytes(7168, 8192), size_t{58720256} + 56 * 64 * 4);
  // A partial last 128-row block has its own scale row: 2112 = 16.5 blocks -> 17.
  EXPECT_EQ(fp8_weight_bytes(2112, 7168), size_t{2112} * 7168 + 17 * 56 * 4);
  EXPECT_EQ(fp8_weight_bytes(1, 1), size_t{1} + 4);
  EXPECT_THROW(fp8_weight_bytes(0, 128), Error);
  EXPECT_THROW(fp8_weight_bytes(128, -1), Error);
}

TEST(Floor, ByteFloorIsBytesOverBandwidth) {
  // 58.7 MB at 3.5 TB/s: 16.78 us (the figure a 7168 x 8192 weight costs at that bandwidth).
  EXPECT_NEAR(byte_floor_us(58.72e6, 3.5e12), 16.777, 1e-3);
  EXPECT_DOUBLE_EQ(byte_floor_us(0, 1e12), 0.0);
  EXPECT_DOUBLE_EQ(byte_floor_us(4e6, 4e12), 1.0);
  EXPECT_THROW(byte_floor_us(1e6, 0), Error);
  EXPECT_THROW(byte_floor_us(1e6, -1), Error);
}

TEST(Floor, RatiosAndBandwidth) {
  EXPECT_DOUBLE_EQ(floor_ratio(7.4, 0.74), 10.0);
  EXPECT_DOUBLE_EQ(floor_ratio(7.4, 0), 0.0);  // no floor: no ratio, not infinity
  EXPECT_DOUBLE_EQ(floor_ratio(0, 1), 0.0);
  EXPECT_DOUBLE_EQ(achieved_gbps(4e6, 1.0), 4000.0);  // 4 MB in 1 us = 4 TB/s
  EXPECT_DOUBLE_EQ(achieved_gbps(4e6, 0), 0.0);
}

TEST(Floor, RotationCopiesCoverThreeL2Sizes) {
  const size_t l2 = 60 * 1000 * 1000;  // an H200's 60 MB
  // 2.4 MB per copy: 180 MB / 2.4 MB = 75 copies, exactly.
  EXPECT_EQ(rotation_copies(2400000, l2), 75);
  // One byte more per copy still needs 75; one byte less needs 76.
  EXPECT_EQ(rotation_copies(2400001, l2), 75);
  EXPECT_EQ(rotation_copies(2399999, l2), 76);
  // Every result covers the factor: W x bytes >= 3 x L2, and W - 1 copies would not.
  for (size_t bytes : {size_t{1} << 20, size_t{4718592}, size_t{58734592}, size_t{117440512}}) {
    const int w = rotation_copies(bytes, l2, 3.0, 1 << 20);
    EXPECT_GE(double(w) * bytes, 3.0 * l2) << bytes;
    if (w > 1) EXPECT_LT(double(w - 1) * bytes, 3.0 * l2) << bytes;
  }
  // A weight larger than 3 x L2 needs one copy; the cap bounds tiny weights.
  EXPECT_EQ(rotation_copies(size_t{200} << 20, l2), 1);
  EXPECT_EQ(rotation_copies(1024, l2, 3.0, 256), 256);
  EXPECT_EQ(rotation_copies(1024, 0), 1);  // no L2 reported: one copy
  EXPECT_THROW(rotation_copies(0, l2), Error);
  EXPECT_THROW(rotation_copies(1024, l2, 0.0), Error);
  EXPECT_THROW(rotation_copies(1024, l2, 3.0, 0), Error);
}

TEST(Floor, GraphCallsAreWholeRotations) {
  EXPECT_EQ(graph_calls(1, 32), 32);
  EXPECT_EQ(graph_calls(2, 32), 32);
  EXPECT_EQ(graph_calls(3, 32), 33);
  EXPECT_EQ(graph_calls(75, 32), 75);
  EXPECT_EQ(graph_calls(256, 32), 256);
  for (int w = 1; w < 100; ++w) {
    const int r = graph_calls(w, 32);
    EXPECT_EQ(r % w, 0) << w;
    EXPECT_GE(r, 32) << w;
    EXPECT_LT(r - w, 32) << w;  // the smallest such multiple
  }
  EXPECT_THROW(graph_calls(0, 32), Error);
  EXPECT_THROW(graph_calls(4, 0), Error);
}

TEST(Floor, ConfigGridCtas) {
  // swapab 16 x 128 with split-K 4 on 3072 x 1536: 24 weight tiles x 4 splits = 96 CTAs on 132 SMs.
  const GemmConfig swap = sm90::Config::parse("swapab_m16n128_ws2_st11_sk4");
  EXPECT_EQ(config_grid_ctas(swap, 16, 3072, 1536, 132), 96);
  // 1d2d 128 x 128 on 16384 x 2048 at M = 64: 1 x 128 tiles -> 128 CTAs; at M = 4096, capped at the SMs.
  const GemmConfig big = sm90::Config::parse("m128n128_ws2_st5");
  EXPECT_EQ(config_grid_ctas(big, 64, 16384, 2048, 132), 128);
  EXPECT_EQ(config_grid_ctas(big, 4096, 16384, 2048, 132), 132);
  // No configuration named, no problem, or an invalid one: 0.
  EXPECT_EQ(config_grid_ctas(HeuristicConfig{}, 16, 3072, 1536, 132), 0);
  EXPECT_EQ(config_grid_ctas(big, 0, 16384, 2048, 132), 0);
  EXPECT_EQ(config_grid_ctas(big, 16, 16384, 100, 132), 0);
}

}  // namespace
}  // namespace fp8proj

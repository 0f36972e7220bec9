// Tensor-parallel shard arithmetic on the host (include/fp8proj/tp.hpp): shard shapes of the
// models, the 128-alignment rule, FP8 scales slicing with their blocks (and the 576-row shard
// that must refuse FP8 and keep bf16), recombination of sharded results (column-parallel
// concatenation, row-parallel sum) against the unsharded layer, the launcher environment and
// the NCCL id hand-over. No GPU needed.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <unistd.h>

#include "env_guard.hpp"
#include "fp8proj/device.hpp"
#include "fp8proj/error.hpp"
#include "fp8proj/memory.hpp"
#include "fp8proj/models.hpp"
#include "fp8proj/quantize.hpp"
#include "fp8proj/reference.hpp"
#include "fp8proj/tp.hpp"
#include "test_util.hpp"

namespace fp8proj {
namespace {

using testing::EnvGuard;
using testing::random_bf16;

constexpr MlaDims kGlm5{6144, 64, 2048, 512, 192, 64, 256};
constexpr MlaDims kDsv3{7168, 128, 1536, 512, 128, 64, 128};

struct CleanEnv {
  EnvGuard a{"FP8PROJ_PREFILL_FP8", nullptr}, b{"FP8PROJ_MIN_FP8_TOKENS", nullptr},
      c{"FP8PROJ_DECODE_CEILING", nullptr}, d{"FP8PROJ_FP8_BACKEND", nullptr};
};

// Every launcher variable unset, so the developer's shell (or a CI runner under Slurm) cannot
// change the outcome.
struct NoLauncherEnv {
  EnvGuard v[15] = {{"FP8PROJ_RANK", nullptr},
                    {"FP8PROJ_WORLD_SIZE", nullptr},
                    {"FP8PROJ_LOCAL_RANK", nullptr},
                    {"RANK", nullptr},
                    {"WORLD_SIZE", nullptr},
                    {"LOCAL_RANK", nullptr},
                    {"OMPI_COMM_WORLD_RANK", nullptr},
                    {"OMPI_COMM_WORLD_SIZE", nullptr},
                    {"OMPI_COMM_WORLD_LOCAL_RANK", nullptr},
                    {"SLURM_PROCID", nullptr},
                    {"SLURM_NTASKS", nullptr},
                    {"SLURM_LOCALID", nullptr},
                    {"FP8PROJ_NCCL_ID_FILE", nullptr},
                    {"FP8PROJ_NCCL_ID", nullptr},
                    {"FP8PROJ_NCCL_TIMEOUT_S", nullptr}};
};

ProjectionOptions opts(bool fp8, int64_t max_tokens = 256) {
  ProjectionOptions o;
  o.name = "tp_test_proj";
  o.fp8 = fp8;
  o.max_tokens = max_tokens;
  o.apply_env = false;
  if (fp8) {  // FP8 at every M, so small test problems exercise the FP8 path
    o.threshold = 0;
    o.decode_ceiling = 0;
  }
  return o;
}

double rel_diff(const std::vector<bf16>& out, const std::vector<bf16>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    const double o = bf16_to_float(out[i]), r = bf16_to_float(ref[i]);
    num += (o - r) * (o - r);
    den += r * r;
  }
  return std::sqrt(num / den);
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// ---- shapes -----------------------------------------------------------------------------------

TEST(TpShard, ModelShardsMatchTheShapeTable) {
  for (const auto& [model, dims] : {std::pair{"glm5", kGlm5}, std::pair{"deepseek-v3", kDsv3}}) {
    for (int tp : {1, 2, 4, 8}) {
      const auto table = projection_shapes(model, tp);
      for (int r = 0; r < tp; ++r) {
        const ShardSpec q = q_b_proj_shard(dims, r, tp), o = o_proj_shard(dims, r, tp);
        EXPECT_EQ(q.kind, ShardKind::column);
        EXPECT_EQ(q.n, table[0].n) << model << " TP" << tp;
        EXPECT_EQ(q.k, table[0].k);
        EXPECT_EQ(q.n_offset, r * q.n);
        EXPECT_EQ(q.k_offset, 0);
        EXPECT_EQ(q.n % (dims.qk_nope + dims.qk_rope), 0) << "heads stay whole";
        EXPECT_EQ(o.kind, ShardKind::row);
        EXPECT_EQ(o.n, table[1].n);
        EXPECT_EQ(o.k, table[1].k);
        EXPECT_EQ(o.k_offset, r * o.k);
        EXPECT_EQ(o.k % dims.v_head, 0);
        EXPECT_TRUE(q.fp8_ok() && o.fp8_ok()) << q.fp8_refusal() << o.fp8_refusal();
      }
    }
  }
  // GLM-5 at TP 2, worked example of the header.
  const ShardSpec q1 = q_b_proj_shard(kGlm5, 1, 2);
  EXPECT_EQ(q1.describe(), "rank 1/2 column: rows [8192, 16384) of 16384x2048 -> 8192x2048");
  const ShardSpec o1 = o_proj_shard(kGlm5, 1, 2);
  EXPECT_EQ(o1.describe(), "rank 1/2 row: columns [8192, 16384) of 6144x16384 -> 6144x8192");
}

TEST(TpShard, RefusesUnevenSplitsAndBadRanks) {
  try {
    q_b_proj_shard(kGlm5, 0, 3);  // 64 heads on 3 ranks
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_TRUE(has(e.what(), "64 heads")) << e.what();
    EXPECT_TRUE(has(e.what(), "3 ranks")) << e.what();
  }
  EXPECT_THROW(column_shard(1024, 256, 2, 2), Error);   // rank outside [0, size)
  EXPECT_THROW(column_shard(1024, 256, -1, 2), Error);
  EXPECT_THROW(row_shard(1024, 256, 0, 0), Error);      // size 0
  EXPECT_THROW(column_shard(1000, 256, 0, 2, 192), Error);  // N not whole heads
  EXPECT_THROW(column_shard(0, 256, 0, 1), Error);
  const ShardSpec rep = replicated_shard(2624, 6144, 1, 2);  // fused_qkv_a: every rank whole
  EXPECT_EQ(rep.n, 2624);
  EXPECT_EQ(rep.k, 6144);
  EXPECT_FALSE(rep.fp8_ok());  // 2624 = 2048 + 512 + 64 is not 128-aligned
  EXPECT_TRUE(rep.scales_slice_exactly());  // but nothing is sliced
}

// ---- the alignment rule -------------------------------------------------------------------------

TEST(TpShard, AlignmentRule) {
  struct Case {
    ShardSpec s;
    bool fp8_ok, scales_exact;
  };
  const Case cases[] = {
      {column_shard(1152, 1024, 0, 2), false, false},  // 576 rows: ends inside block 4
      {column_shard(1152, 1024, 1, 2), false, false},  // starts at 576, inside block 4
      {column_shard(768, 256, 1, 2), true, true},      // 384 = 3 blocks
      {row_shard(256, 768, 1, 2), true, true},
      {row_shard(256, 1152, 1, 2), false, false},       // 576 columns
      {column_shard(3072, 2048, 3, 16, 192), false, false},  // DeepSeek-V2-Lite q_proj TP16: 192 rows
      {column_shard(3072, 2048, 3, 8, 192), true, true},     // TP8: 384 rows
      {column_shard(600, 256, 0, 1), false, true},  // whole (edge block partial): scales exact, N not aligned
  };
  for (const Case& c : cases) {
    EXPECT_EQ(c.s.fp8_ok(), c.fp8_ok) << c.s.describe();
    EXPECT_EQ(c.s.scales_slice_exactly(), c.scales_exact) << c.s.describe();
    EXPECT_EQ(c.s.fp8_refusal().empty(), c.fp8_ok) << c.s.fp8_refusal();
  }
  const std::string why = column_shard(1152, 1024, 1, 2).fp8_refusal();
  EXPECT_TRUE(has(why, "576")) << why;
  EXPECT_TRUE(has(why, "128")) << why;
  EXPECT_TRUE(has(why, "bf16")) << why;
}

// ---- FP8 scales slice with their blocks -------------------------------------------------------

// Quantizing a shard gives bit for bit the slice of the quantized full weight: each rank's own
// FP8 copy has the full weight's blocks and scales. This is what makes "each rank quantizes its
// own shard" and "slice the checkpoint's FP8 weight" the same thing.
TEST(TpShard, Fp8ScalesSliceWithTheirBlocks) {
  const int64_t n = 768, k = 512;
  auto w = random_bf16(n * k, 21, 0.02f);
  // Give each 128x128 block a different magnitude, so a scale taken from the wrong block shows.
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c)
      w[r * k + c] = float_to_bf16(bf16_to_float(w[r * k + c]) * std::ldexp(1.0f, int((r / 128) * 3 + c / 128) % 9 - 4));
  HostFp8Weight full = make_host_fp8_weight(n, k);
  cpu::quantize_weight(w.data(), n, k, full.out());
  std::vector<ShardSpec> specs;
  for (int size : {1, 2, 3, 6})  // 768 rows: 6 blocks
    for (int r = 0; r < size; ++r) specs.push_back(column_shard(n, k, r, size));
  for (int size : {2, 4})  // 512 columns: 4 blocks
    for (int r = 0; r < size; ++r) specs.push_back(row_shard(n, k, r, size));
  for (const ShardSpec& s : specs) {
    ASSERT_TRUE(s.scales_slice_exactly()) << s.describe();
    const HostFp8Weight sliced = slice_fp8(full.view(), s);
    const std::vector<bf16> ws = slice_bf16(w.data(), s);
    HostFp8Weight own = make_host_fp8_weight(s.n, s.k);
    cpu::quantize_weight(ws.data(), s.n, s.k, own.out());
    EXPECT_EQ(sliced.values, own.values) << s.describe();
    EXPECT_EQ(sliced.scales, own.scales) << s.describe();
    EXPECT_EQ(sliced.scales.size(), size_t(ceil_div(s.n, 128) * ceil_div(s.k, 128)));
  }
}

// The failure peers hit: a 576-row shard (4.5 scale blocks). Slicing the scale grid would give
// rank 1 the scales of blocks that straddle its first row; it must refuse, dequantize with the
// full weight's own blocks, and the layer must stay bf16.
TEST(TpShard, Shard576RowsRefusesFp8AndKeepsBf16) {
  CleanEnv clean;
  const int64_t n = 1152, k = 256;
  auto w = random_bf16(n * k, 22, 0.02f);
  for (int64_t r = 512; r < 640; ++r)  // block row 4 (rows 512..639) much larger than the rest
    for (int64_t c = 0; c < k; ++c) w[r * k + c] = float_to_bf16(bf16_to_float(w[r * k + c]) * 64.0f);
  HostFp8Weight full = make_host_fp8_weight(n, k);
  cpu::quantize_weight(w.data(), n, k, full.out());
  const std::vector<float> deq_full = cpu::dequantize(full.view());

  for (int r = 0; r < 2; ++r) {
    const ShardSpec s = column_shard(n, k, r, 2);
    ASSERT_EQ(s.n, 576);
    EXPECT_FALSE(s.fp8_ok());
    try {
      slice_fp8(full.view(), s);
      FAIL() << "slice_fp8 must refuse " << s.describe();
    } catch (const Error& e) {
      EXPECT_TRUE(has(e.what(), "576")) << e.what();
    }
    const WeightShard ws = shard_weight(HostWeight{full}, s);
    ASSERT_TRUE(std::holds_alternative<HostBf16Weight>(ws.weight)) << "an unaligned FP8 shard must become bf16";
    EXPECT_TRUE(has(ws.note, "576")) << ws.note;
    const auto& b = std::get<HostBf16Weight>(ws.weight);
    ASSERT_EQ(b.n, 576);
    ASSERT_EQ(b.k, k);
    // Every element keeps its full-weight block's scale: equal to the full dequantization.
    for (int64_t i = 0; i < s.n; ++i)
      for (int64_t c = 0; c < k; ++c)
        ASSERT_EQ(bf16_to_float(b.values[i * k + c]),
                  bf16_to_float(float_to_bf16(deq_full[(s.n_offset + i) * k + c])))
            << "rank " << r << " row " << i << " col " << c;

    // The layer over this shard stays bf16 even with FP8 on, and says why.
    ShardedProjection layer = ShardedProjection::from_shard(MemorySpace::host, s, b.values.data(), nullptr, opts(true));
    EXPECT_FALSE(layer.layer().has_fp8_copy());
    EXPECT_EQ(layer.path_for(4096), Path::bf16);
    const std::string why = layer.explain(4096).reason;
    EXPECT_TRUE(has(why, "rank " + std::to_string(r) + "/2")) << why;
    EXPECT_TRUE(has(why, "128")) << why;
  }
  // An aligned split of the same checkpoint weight stays FP8.
  const WeightShard aligned = shard_weight(HostWeight{full}, column_shard(n, k, 1, 3));  // 384 rows
  EXPECT_TRUE(std::holds_alternative<HostFp8Weight>(aligned.weight));
  EXPECT_TRUE(aligned.note.empty());
}

// ---- recombination equals the unsharded result -------------------------------------------------

struct RecombineCase {
  bool fp8;
  int size;
};

class TpRecombine : public ::testing::TestWithParam<RecombineCase> {};

// Column-parallel: concatenating the ranks' output columns gives the unsharded output.
TEST_P(TpRecombine, ColumnParallelConcatenation) {
  CleanEnv clean;
  const auto [fp8, size] = GetParam();
  const int64_t heads = 8, d_qk = 192, n = heads * d_qk, k = 512, m = 96;  // 1536 rows: 768 / 384 / 192 per rank
  const auto w = random_bf16(n * k, 31, 0.02f), x = random_bf16(m * k, 32);
  ProjectionLayer full(MemorySpace::host, w.data(), n, k, opts(fp8));
  ProjectionLayer full_bf16(MemorySpace::host, w.data(), n, k, opts(false));
  // A shard that cannot be FP8 (TP 8: 192 rows) stays bf16 and is compared with the bf16 TP 1.
  const bool expect_fp8 = fp8 && column_shard(n, k, 0, size, d_qk).fp8_ok();
  std::vector<bf16> y_full(m * n);
  (expect_fp8 ? full : full_bf16).forward(x.data(), m, y_full.data());

  std::vector<bf16> y_cat(m * n, bf16::from_bits(0xffff));
  for (int r = 0; r < size; ++r) {
    const ShardSpec s = column_shard(n, k, r, size, d_qk);
    ShardedProjection shard(MemorySpace::host, s, w.data(), MemorySpace::host, nullptr, opts(fp8));
    ASSERT_EQ(shard.path_for(m), expect_fp8 ? Path::fp8 : Path::bf16) << shard.explain(m).to_string();
    if (expect_fp8) {  // the rank's own FP8 copy is the slice of the full layer's copy
      const HostFp8Weight sliced = slice_fp8(*full.fp8_weight(), s);
      const Fp8WeightView own = *shard.layer().fp8_weight();
      EXPECT_EQ(0, std::memcmp(own.values, sliced.values.data(), sliced.values.size())) << s.describe();
      EXPECT_EQ(0, std::memcmp(own.scales, sliced.scales.data(), sliced.scales.size() * 4)) << s.describe();
    }
    std::vector<bf16> y(m * s.n);
    shard.forward(x.data(), m, y.data());
    for (int64_t i = 0; i < m; ++i)
      std::memcpy(&y_cat[i * n + s.n_offset], &y[i * s.n], s.n * sizeof(bf16));
  }
  const double d = rel_diff(y_cat, y_full);
  std::printf("column TP%d %s: rel diff vs TP1 %.2e\n", size, fp8 ? "fp8" : "bf16", d);
  EXPECT_LE(d, kTpRelTol);
}

// Row-parallel: summing the ranks' partials gives the unsharded output. The sum is done as an
// NCCL bf16 ring would: partials in bf16, each step adds in fp32 and rounds to bf16.
TEST_P(TpRecombine, RowParallelSum) {
  CleanEnv clean;
  const auto [fp8, size] = GetParam();
  const int64_t heads = 8, d_v = 128, n = 384, k = heads * d_v, m = 80;
  const auto w = random_bf16(n * k, 41, 0.02f), x = random_bf16(m * k, 42);
  ProjectionLayer full(MemorySpace::host, w.data(), n, k, opts(fp8));
  std::vector<bf16> y_full(m * n);
  full.forward(x.data(), m, y_full.data());

  std::vector<bf16> y_sum(m * n, bf16::from_bits(0));
  for (int r = 0; r < size; ++r) {
    const ShardSpec s = row_shard(n, k, r, size, d_v);
    ShardedProjection shard(MemorySpace::host, s, w.data(), MemorySpace::host, nullptr, opts(fp8));
    ASSERT_EQ(shard.path_for(m), fp8 ? Path::fp8 : Path::bf16) << shard.explain(m).to_string();
    if (size > 1) {  // a row shard of several ranks cannot sum without a communicator
      std::vector<bf16> tmp(m * n);
      EXPECT_THROW(shard.forward(tmp.data(), m, tmp.data()), Error);
    }
    // This rank's input features: columns [k_offset, k_offset + k) of x.
    std::vector<bf16> xr(m * s.k), yr(m * n);
    for (int64_t i = 0; i < m; ++i) std::memcpy(&xr[i * s.k], &x[i * k + s.k_offset], s.k * sizeof(bf16));
    shard.forward_partial(xr.data(), m, yr.data());
    for (size_t i = 0; i < y_sum.size(); ++i)
      y_sum[i] = r == 0 ? yr[i] : float_to_bf16(bf16_to_float(y_sum[i]) + bf16_to_float(yr[i]));
  }
  const double d = rel_diff(y_sum, y_full);
  std::printf("row TP%d %s: rel diff vs TP1 %.2e\n", size, fp8 ? "fp8" : "bf16", d);
  EXPECT_LE(d, kTpRelTol);
  if (size == 1) EXPECT_EQ(0, std::memcmp(y_sum.data(), y_full.data(), y_sum.size() * 2));
}

INSTANTIATE_TEST_SUITE_P(FlagOnOff, TpRecombine,
                         ::testing::Values(RecombineCase{false, 1}, RecombineCase{false, 2}, RecombineCase{false, 4},
                                           RecombineCase{true, 1}, RecombineCase{true, 2}, RecombineCase{true, 4},
                                           RecombineCase{true, 8}),
                         [](const auto& info) {
                           return std::string(info.param.fp8 ? "fp8" : "bf16") + "_tp" + std::to_string(info.param.size);
                         });

// A mis-sliced shard must fail the tolerance by far (the check is not vacuous).
TEST(TpShard, ToleranceCatchesAMisSlice) {
  CleanEnv clean;
  const int64_t n = 256, k = 512, m = 64;
  const auto w = random_bf16(n * k, 51, 0.02f), x = random_bf16(m * k, 52);
  ProjectionLayer full(MemorySpace::host, w.data(), n, k, opts(false));
  std::vector<bf16> y_full(m * n), y_sum(m * n);
  full.forward(x.data(), m, y_full.data());
  for (int r = 0; r < 2; ++r) {
    const ShardSpec s = row_shard(n, k, r, 2);
    ShardedProjection shard(MemorySpace::host, s, w.data(), MemorySpace::host, nullptr, opts(false));
    std::vector<bf16> xr(m * s.k), yr(m * n);
    for (int64_t i = 0; i < m; ++i) std::memcpy(&xr[i * s.k], &x[i * k], s.k * sizeof(bf16));  // always rank 0's columns
    shard.forward_partial(xr.data(), m, yr.data());
    for (size_t i = 0; i < y_sum.size(); ++i)
      y_sum[i] = r == 0 ? yr[i] : float_to_bf16(bf16_to_float(y_sum[i]) + bf16_to_float(yr[i]));
  }
  EXPECT_GT(rel_diff(y_sum, y_full), 100 * kTpRelTol);
}

// ---- the MLA block at TP 2 on the host ---------------------------------------------------------

// Small MLA shaped so that both tagged shards stay FP8-eligible at TP 2: q_b_proj 2 x (96 + 32) =
// 256 rows, o_proj K = 2 x 64 = 128 per rank.
MlaConfig tp_test_config(int tp_size, int tp_rank) {
  MlaConfig c;
  c.model = "tp-test";
  c.hidden = 256;
  c.heads = 4;
  c.q_lora_rank = 128;
  c.kv_lora_rank = 64;
  c.qk_nope_dim = 96;
  c.qk_rope_dim = 32;
  c.v_head_dim = 64;
  c.rope_theta = 10000.0;
  c.tp_size = tp_size;
  c.tp_rank = tp_rank;
  return c;
}

// Each rank's block returns o_proj's partial through the all-reduce hook; summing them as NCCL's
// bf16 all-reduce does gives the TP 1 block's output, in prefill and decode, with FP8 off, on
// (prefill policy) and on everywhere.
TEST(TpMla, HostBlockPartialsSumToTp1) {
  CleanEnv clean;
  const std::vector<int32_t> offsets = {0, 300, 600}, start = {0, 310}, pos = {300, 300};
  const int B = 2;
  const int64_t T = offsets.back();
  struct Variant {
    const char* name;
    bool fp8, forced;
  };
  for (const Variant v : {Variant{"off", false, false}, Variant{"on", true, false}, Variant{"on-all", true, true}}) {
    MlaOptions o;
    o.tagged.fp8 = v.fp8;
    o.tagged.apply_env = false;
    o.tagged.use_tune_table = false;
    if (v.forced) {
      o.tagged.policy = Fp8Policy::all;
      o.tagged.threshold = 0;
      o.tagged.decode_ceiling = 0;
    }
    o.max_tokens = T;
    o.max_batch = B;
    o.cache_capacity = 620;
    const MlaConfig c1 = tp_test_config(1, 0);
    const auto x = random_bf16(T * c1.hidden, 61, 1.0f), xd = random_bf16(B * c1.hidden, 62, 1.0f);
    MlaBlock full(MemorySpace::host, c1, 5, o);
    std::vector<bf16> y1(T * c1.hidden), y1d(B * c1.hidden);
    full.prefill(x.data(), {B, offsets.data(), start.data(), nullptr}, y1.data());
    full.decode(xd.data(), {B, pos.data(), start.data(), 301}, y1d.data());

    std::vector<bf16> sum(y1.size()), sumd(y1d.size());
    for (int r = 0; r < 2; ++r) {
      const MlaConfig cr = tp_test_config(2, r);
      std::vector<bf16>* target = nullptr;
      MlaOptions orank = o;
      orank.all_reduce = [&](bf16* y, int64_t rows, int64_t cols, StreamHandle) {  // NCCL's bf16 sum for 2 ranks
        for (int64_t i = 0; i < rows * cols; ++i)
          (*target)[i] = r == 0 ? y[i] : float_to_bf16(bf16_to_float((*target)[i]) + bf16_to_float(y[i]));
      };
      MlaBlock part(MemorySpace::host, cr, 5, orank);
      EXPECT_EQ(part.projection(MlaProjection::q_b_proj).n(), q_b_proj_shard(cr).n);
      EXPECT_EQ(part.projection(MlaProjection::o_proj).k(), o_proj_shard(cr).k);
      EXPECT_EQ(part.projection(MlaProjection::o_proj).path_for(T), v.fp8 ? Path::fp8 : Path::bf16) << v.name;
      EXPECT_EQ(part.projection(MlaProjection::q_b_proj).path_for(T), v.fp8 ? Path::fp8 : Path::bf16) << v.name;
      std::vector<bf16> y(T * c1.hidden);
      target = &sum;
      part.prefill(x.data(), {B, offsets.data(), start.data(), nullptr}, y.data());
      target = &sumd;
      part.decode(xd.data(), {B, pos.data(), start.data(), 301}, y.data());
    }
    const double dp = rel_diff(sum, y1), dd = rel_diff(sumd, y1d);
    std::printf("MLA host TP 2 vs TP 1, flag %s: prefill %.2e, decode %.2e\n", v.name, dp, dd);
    EXPECT_LE(dp, kTpBlockRelTol) << v.name;
    EXPECT_LE(dd, kTpBlockRelTol) << v.name;
  }
}

// ---- launcher environment and the NCCL id ------------------------------------------------------

TEST(TpEnv, RankFromLauncherVariables) {
  NoLauncherEnv clean;
  EXPECT_FALSE(rank_env_from_environment().has_value());
  {
    EnvGuard a("FP8PROJ_RANK", "1"), b("FP8PROJ_WORLD_SIZE", "2"), f("FP8PROJ_NCCL_ID_FILE", "/tmp/id");
    const auto e = rank_env_from_environment();
    ASSERT_TRUE(e);
    EXPECT_EQ(e->rank, 1);
    EXPECT_EQ(e->world_size, 2);
    EXPECT_EQ(e->local_rank, 1);  // one node assumed
    EXPECT_EQ(*e->id_file, "/tmp/id");
    EXPECT_EQ(e->source, "FP8PROJ_RANK");
  }
  {
    EnvGuard a("RANK", "5"), b("WORLD_SIZE", "8"), c("LOCAL_RANK", "1");  // torchrun, second node
    const auto e = rank_env_from_environment();
    ASSERT_TRUE(e);
    EXPECT_EQ(e->rank, 5);
    EXPECT_EQ(e->world_size, 8);
    EXPECT_EQ(e->local_rank, 1);
    EXPECT_TRUE(has(e->source, "torchrun"));
  }
  {
    EnvGuard a("OMPI_COMM_WORLD_RANK", "3"), b("OMPI_COMM_WORLD_SIZE", "4"), c("OMPI_COMM_WORLD_LOCAL_RANK", "3"),
        d("FP8PROJ_LOCAL_RANK", "0");  // ours overrides the launcher's local rank
    const auto e = rank_env_from_environment();
    ASSERT_TRUE(e);
    EXPECT_EQ(e->rank, 3);
    EXPECT_EQ(e->local_rank, 0);
  }
  {
    EnvGuard a("FP8PROJ_RANK", "2"), b("FP8PROJ_WORLD_SIZE", "2");
    EXPECT_THROW(rank_env_from_environment(), Error);  // rank >= world size
  }
  {
    EnvGuard a("FP8PROJ_WORLD_SIZE", "2");
    EXPECT_THROW(rank_env_from_environment(), Error);  // a world size without a rank
  }
  {
    EnvGuard a("RANK", "0");
    EXPECT_THROW(rank_env_from_environment(), Error);  // a rank without a world size
  }
  {
    EnvGuard a("FP8PROJ_RANK", "one"), b("FP8PROJ_WORLD_SIZE", "2");
    EXPECT_THROW(rank_env_from_environment(), Error);
  }
}

TEST(TpEnv, TimeoutKnob) {
  NoLauncherEnv clean;
  EXPECT_EQ(comm_timeout_s(), 120.0);
  {
    EnvGuard a("FP8PROJ_NCCL_TIMEOUT_S", "2.5");
    EXPECT_EQ(comm_timeout_s(), 2.5);
  }
  {
    EnvGuard a("FP8PROJ_NCCL_TIMEOUT_S", "-1");
    EXPECT_THROW(comm_timeout_s(), Error);
  }
}

TEST(TpEnv, CommIdHexAndFile) {
  CommId id;
  for (size_t i = 0; i < id.bytes.size(); ++i) id.bytes[i] = static_cast<uint8_t>(i * 37 + 11);
  const std::string hex = id.hex();
  EXPECT_EQ(hex.size(), 256u);
  EXPECT_EQ(CommId::from_hex(hex).bytes, id.bytes);
  EXPECT_THROW(CommId::from_hex(hex.substr(2)), Error);
  std::string bad = hex;
  bad[7] = 'g';
  EXPECT_THROW(CommId::from_hex(bad), Error);

  const auto dir = std::filesystem::temp_directory_path() / ("fp8proj_tp_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "nccl_id").string();
  write_comm_id_file(path, id);
  EXPECT_EQ(read_comm_id_file(path, 1.0, 1).bytes, id.bytes);
  // A missing file: the waiting rank gives up at the deadline with a message naming itself,
  // the path and rank 0.
  try {
    read_comm_id_file((dir / "never_written").string(), 0.1, 1);
    FAIL() << "expected a timeout";
  } catch (const Error& e) {
    EXPECT_TRUE(has(e.what(), "rank 1")) << e.what();
    EXPECT_TRUE(has(e.what(), "never_written")) << e.what();
    EXPECT_TRUE(has(e.what(), "rank 0")) << e.what();
  }
  std::filesystem::remove_all(dir);
}

// Without CUDA (or without a GPU), a communicator is a clear error, never a crash or a hang.
TEST(TpComm, UnavailableIsAClearError) {
  if (gpu_available()) GTEST_SKIP() << "a GPU is present: tests/gpu/tp_gpu_test.cu covers communicators";
  NoLauncherEnv clean;
  try {
    Communicator::create_local({0, 1});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_TRUE(has(what, "CUDA") || has(what, "NCCL") || has(what, "GPU")) << what;
  }
  EXPECT_THROW(Communicator::create_from_env(), Error);  // no launcher variables
  std::string why;
  if (!built_with_cuda()) {
    EXPECT_EQ(nccl_version(&why), "");
    EXPECT_TRUE(has(why, "CUDA")) << why;
  }
}

}  // namespace
}  // namespace fp8proj

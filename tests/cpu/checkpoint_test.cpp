// The safetensors reader against files written by an independent implementation
// (tests/fixtures/make_safetensors_fixtures.py: Hugging Face's safetensors writer, numpy and
// ml_dtypes; CTest runs it first). Values are compared bit for bit with the bytes Python wrote
// under expected/; every malformed file must give an fp8proj::Error whose message names the
// file and, where one is at fault, the tensor.
//
// The fixture dimensions (hidden 200, 2 heads, q_lora 136, kv_lora 64, 32/16/24) are not
// multiples of 128, so FP8 scales include partial edge blocks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <sstream>
#include <variant>

#include "fp8proj/checkpoint.hpp"
#include "fp8proj/error.hpp"
#include "fp8proj/mla_checkpoint.hpp"

#ifndef FP8PROJ_CHECKPOINT_FIXTURES
#error "tests/CMakeLists.txt defines FP8PROJ_CHECKPOINT_FIXTURES, the directory the fixture script writes"
#endif

namespace fp8proj {
namespace {

namespace fs = std::filesystem;

// Same numbers as HIDDEN, HEADS, ... in the fixture script.
constexpr MlaDims kDims{.hidden = 200, .heads = 2, .q_lora_rank = 136, .kv_lora_rank = 64,
                        .qk_nope = 32, .qk_rope = 16, .v_head = 24};
constexpr MlaDims kNoLoraDims{.hidden = 200, .heads = 2, .q_lora_rank = 0, .kv_lora_rank = 64,
                              .qk_nope = 32, .qk_rope = 16, .v_head = 24};

std::string fixture(const std::string& relative) { return std::string(FP8PROJ_CHECKPOINT_FIXTURES) + "/" + relative; }

std::string attn(int layer, MlaTensor t) { return mla_tensor_name(layer, t); }

// The raw bytes numpy wrote for `tensor` (its own tofile(), not read through safetensors).
std::vector<uint8_t> expected(const std::string& group, const std::string& tensor) {
  const std::string path = fixture("expected/" + group + "/" + tensor + ".bin");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("missing expected-values file " + path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

::testing::AssertionResult same_bytes(const void* data, size_t size, const std::vector<uint8_t>& want) {
  if (size != want.size()) return ::testing::AssertionFailure() << size << " bytes, expected " << want.size();
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < size; ++i)
    if (p[i] != want[i])
      return ::testing::AssertionFailure() << "first difference at byte " << i << ": " << int(p[i]) << ", expected "
                                           << int(want[i]);
  return ::testing::AssertionSuccess();
}

template <typename T>
::testing::AssertionResult same_bytes(const std::vector<T>& v, const std::vector<uint8_t>& want) {
  return same_bytes(v.data(), v.size() * sizeof(T), want);
}

// Bit for bit, except that a NaN only has to be a NaN: ml_dtypes makes every NaN 0x7fc0/0xffc0,
// bf16.hpp keeps the payload, and no NaN payload is part of our contract.
::testing::AssertionResult same_bf16(const std::vector<bf16>& got, const std::vector<uint8_t>& want) {
  if (got.size() * 2 != want.size())
    return ::testing::AssertionFailure() << got.size() << " values, expected " << want.size() / 2;
  for (size_t i = 0; i < got.size(); ++i) {
    const bf16 w = bf16::from_bits(static_cast<uint16_t>(want[2 * i] | (want[2 * i + 1] << 8)));
    const bool ok = std::isnan(bf16_to_float(w)) ? std::isnan(bf16_to_float(got[i])) : got[i].bits == w.bits;
    if (!ok) {
      std::ostringstream os;
      os << "element " << i << ": 0x" << std::hex << got[i].bits << ", expected 0x" << w.bits;
      return ::testing::AssertionFailure() << os.str();
    }
  }
  return ::testing::AssertionSuccess();
}

void expect_bf16_weight(const HostWeight& w, const std::string& group, const std::string& name, int64_t n, int64_t k) {
  ASSERT_TRUE(std::holds_alternative<HostBf16Weight>(w)) << name << " should load as bf16";
  const auto& b = std::get<HostBf16Weight>(w);
  EXPECT_EQ(b.n, n) << name;
  EXPECT_EQ(b.k, k) << name;
  EXPECT_TRUE(same_bytes(b.values, expected(group, name))) << name;
}

void expect_fp8_weight(const HostWeight& w, const std::string& group, const std::string& name, int64_t n, int64_t k) {
  ASSERT_TRUE(std::holds_alternative<HostFp8Weight>(w)) << name << " should load as FP8";
  const auto& f = std::get<HostFp8Weight>(w);
  EXPECT_EQ(f.n, n) << name;
  EXPECT_EQ(f.k, k) << name;
  EXPECT_TRUE(same_bytes(f.values, expected(group, name))) << name;
  EXPECT_TRUE(same_bytes(f.scales, expected(group, name + "_scale_inv"))) << name << "_scale_inv";
}

// The message of the fp8proj::Error that `f` throws (any other exception fails the test).
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no fp8proj::Error was thrown";
  return "";
}

class CheckpointRead : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(fixture("bf16_layer.safetensors")))
        << "no fixtures in " << FP8PROJ_CHECKPOINT_FIXTURES
        << ": run `ctest -R checkpoint.fixtures` (needs numpy, ml_dtypes, safetensors: scripts/setup-deps.sh)";
  }
};

TEST_F(CheckpointRead, SingleFileHeaderAndLookup) {
  const std::string path = fixture("bf16_layer.safetensors");
  Checkpoint moved(path);
  const Checkpoint ck = std::move(moved);  // the mapping moves with it
  EXPECT_EQ(ck.path(), path);
  ASSERT_EQ(ck.shards().size(), 1u);
  EXPECT_EQ(ck.shards()[0].path, path);
  EXPECT_EQ(ck.shards()[0].tensors, 7u);
  EXPECT_EQ(ck.shards()[0].file_bytes, fs::file_size(path));
  EXPECT_EQ(ck.shards()[0].metadata, (std::map<std::string, std::string>{{"format", "pt"}}));
  EXPECT_EQ(ck.size(), 7u);
  const auto names = ck.names();
  EXPECT_TRUE(std::is_sorted(names.begin(), names.end()));

  const TensorInfo& q_b = ck.info(attn(0, MlaTensor::q_b_proj));
  EXPECT_EQ(q_b.name, attn(0, MlaTensor::q_b_proj));
  EXPECT_EQ(q_b.dtype, DType::bf16);
  EXPECT_EQ(q_b.shape, (std::vector<int64_t>{96, 136}));
  EXPECT_EQ(q_b.shape_string(), "[96, 136]");
  EXPECT_EQ(q_b.file, path);
  EXPECT_EQ(q_b.bytes, 96u * 136u * 2u);
  EXPECT_EQ(&ck.expect(q_b.name, {96, 136}), &q_b);
  EXPECT_EQ(ck.find(q_b.name), &q_b);
  EXPECT_EQ(ck.find("model.layers.0.self_attn.q_b_proj"), nullptr);

  const auto raw = ck.bytes(q_b.name);
  EXPECT_TRUE(same_bytes(raw.data(), raw.size(), expected("bf16_layer", q_b.name)));
}

TEST_F(CheckpointRead, Bf16LayerBitExact) {
  const Checkpoint ck(fixture("bf16_layer.safetensors"));
  const MlaLayerTensors t = load_mla_layer(ck, 0, kDims);
  EXPECT_EQ(t.layer, 0);
  ASSERT_TRUE(t.q_a_proj && t.q_b_proj);
  EXPECT_FALSE(t.q_proj);
  expect_bf16_weight(*t.q_a_proj, "bf16_layer", attn(0, MlaTensor::q_a_proj), 136, 200);
  expect_bf16_weight(*t.q_b_proj, "bf16_layer", attn(0, MlaTensor::q_b_proj), 96, 136);
  expect_bf16_weight(t.kv_a_proj_with_mqa, "bf16_layer", attn(0, MlaTensor::kv_a_proj_with_mqa), 80, 200);
  expect_bf16_weight(t.kv_b_proj, "bf16_layer", attn(0, MlaTensor::kv_b_proj), 112, 64);
  expect_bf16_weight(t.o_proj, "bf16_layer", attn(0, MlaTensor::o_proj), 200, 48);
  EXPECT_TRUE(same_bytes(t.q_a_layernorm, expected("bf16_layer", attn(0, MlaTensor::q_a_layernorm))));
  EXPECT_TRUE(same_bytes(t.kv_a_layernorm, expected("bf16_layer", attn(0, MlaTensor::kv_a_layernorm))));
}

TEST_F(CheckpointRead, Fp8LayerKeepsValuesScalesAndNaNCodes) {
  const Checkpoint ck(fixture("fp8_layer.safetensors"));
  EXPECT_EQ(ck.shards()[0].metadata.at("quant"), "fp8");
  const MlaLayerTensors t = load_mla_layer(ck, 0, kDims);
  ASSERT_TRUE(t.q_a_proj && t.q_b_proj);
  expect_fp8_weight(*t.q_a_proj, "fp8_layer", attn(0, MlaTensor::q_a_proj), 136, 200);
  expect_fp8_weight(*t.q_b_proj, "fp8_layer", attn(0, MlaTensor::q_b_proj), 96, 136);
  expect_fp8_weight(t.kv_a_proj_with_mqa, "fp8_layer", attn(0, MlaTensor::kv_a_proj_with_mqa), 80, 200);
  expect_fp8_weight(t.kv_b_proj, "fp8_layer", attn(0, MlaTensor::kv_b_proj), 112, 64);
  expect_fp8_weight(t.o_proj, "fp8_layer", attn(0, MlaTensor::o_proj), 200, 48);
  EXPECT_TRUE(same_bytes(t.q_a_layernorm, expected("fp8_layer", attn(0, MlaTensor::q_a_layernorm))));
  EXPECT_TRUE(same_bytes(t.kv_a_layernorm, expected("fp8_layer", attn(0, MlaTensor::kv_a_layernorm))));

  // Spelled out, beyond the byte comparison: the layout is [ceil(N/128)][ceil(K/128)] row-major,
  // NaN codes are data, and scales are whatever fp32 the file holds (here an fp32 subnormal).
  const auto& q_a = std::get<HostFp8Weight>(*t.q_a_proj);
  EXPECT_EQ(q_a.scales.size(), 4u);
  const auto& o = std::get<HostFp8Weight>(t.o_proj);
  EXPECT_EQ(o.values[3 * 48 + 5], 0x7f);
  EXPECT_EQ(o.values[150 * 48 + 47], 0xff);
  const auto& q_b = std::get<HostFp8Weight>(*t.q_b_proj);
  EXPECT_EQ(q_b.scales[1], 1e-40f);
}

TEST_F(CheckpointRead, Fp8ToBf16MatchesNumpyDequantization) {
  const Checkpoint ck(fixture("fp8_layer.safetensors"));
  for (MlaTensor m : {MlaTensor::q_b_proj, MlaTensor::o_proj}) {
    const std::string name = attn(0, m);
    const auto shape = mla_tensor_shape(kDims, m);
    const HostBf16Weight w = to_bf16(load_projection_weight(ck, name, shape[0], shape[1]));
    EXPECT_EQ(w.n, shape[0]);
    EXPECT_EQ(w.k, shape[1]);
    EXPECT_TRUE(same_bf16(w.values, expected("fp8_layer", name + ".dequant"))) << name;
  }
  // A bf16 weight passes through unchanged.
  const Checkpoint bf(fixture("bf16_layer.safetensors"));
  const std::string o = attn(0, MlaTensor::o_proj);
  EXPECT_TRUE(same_bytes(to_bf16(load_projection_weight(bf, o, 200, 48)).values, expected("bf16_layer", o)));
}

TEST_F(CheckpointRead, ConvertsF32AndF16ToBf16WithRoundToNearestEven) {
  const Checkpoint ck(fixture("dtypes.safetensors"));
  EXPECT_EQ(ck.info("conv.f32").dtype, DType::f32);
  EXPECT_EQ(ck.info("conv.f16").dtype, DType::f16);
  EXPECT_TRUE(same_bytes(ck.read_bf16("conv.f32"), expected("dtypes", "conv.f32.bf16")));
  EXPECT_TRUE(same_bytes(ck.read_bf16("conv.f16"), expected("dtypes", "conv.f16.bf16")));
  EXPECT_TRUE(same_bytes(ck.read_bf16("conv.bf16"), expected("dtypes", "conv.bf16.bf16")));

  std::vector<bf16> buffer(ck.info("conv.f16").numel());  // into a caller's buffer
  ck.read_bf16("conv.f16", buffer);
  EXPECT_TRUE(same_bytes(buffer, expected("dtypes", "conv.f16.bf16")));
  std::vector<bf16> small(buffer.size() - 1);
  const std::string e = error_of([&] { ck.read_bf16("conv.f16", small); });
  EXPECT_NE(e.find("conv.f16"), std::string::npos) << e;
  EXPECT_NE(e.find("has 304 elements"), std::string::npos) << e;

  const auto scalar = ck.read_bf16("scalar.f32");
  ASSERT_EQ(scalar.size(), 1u);
  EXPECT_EQ(bf16_to_float(scalar[0]), 1.5f);
  EXPECT_TRUE(ck.info("scalar.f32").shape.empty());
  EXPECT_TRUE(ck.read_bf16("empty.bf16").empty());
  EXPECT_EQ(ck.info("empty.bf16").shape, (std::vector<int64_t>{0, 4}));

  const std::string i32 = error_of([&] { ck.read_bf16("int.i32"); });
  EXPECT_NE(i32.find("'int.i32'"), std::string::npos) << i32;
  EXPECT_NE(i32.find(fixture("dtypes.safetensors")), std::string::npos) << i32;
  EXPECT_NE(i32.find("is I32"), std::string::npos) << i32;
}

TEST_F(CheckpointRead, UnpaddedHeaderAndMisalignedTensor) {
  const Checkpoint ck(fixture("unaligned.safetensors"));
  const auto a = ck.bytes("a");
  EXPECT_TRUE(same_bytes(a.data(), a.size(), {1, 2, 3}));
  EXPECT_TRUE(same_bytes(ck.read_bf16("b"), expected("unaligned", "b.bf16")));
}

TEST_F(CheckpointRead, FP8WeightIsNotReadAsBf16) {
  const Checkpoint ck(fixture("fp8_layer.safetensors"));
  const std::string name = attn(0, MlaTensor::o_proj);
  const std::string e = error_of([&] { ck.read_bf16(name); });
  EXPECT_NE(e.find(name), std::string::npos) << e;
  EXPECT_NE(e.find("F8_E4M3"), std::string::npos) << e;
  const std::string f = error_of([&] { ck.read_fp8_weight(attn(0, MlaTensor::q_a_layernorm)); });
  EXPECT_NE(f.find("not an FP8 (F8_E4M3) weight"), std::string::npos) << f;
}

TEST_F(CheckpointRead, ShardedIndexAndItsDirectoryAgree) {
  const std::string dir = fixture("sharded");
  const std::string shard1 = dir + "/model-00001-of-00002.safetensors";
  const std::string shard2 = dir + "/model-00002-of-00002.safetensors";
  for (const std::string& path : {dir + "/model.safetensors.index.json", dir}) {
    SCOPED_TRACE(path);
    const Checkpoint ck(path);
    ASSERT_EQ(ck.shards().size(), 2u);
    EXPECT_EQ(ck.size(), 1u + 5u + 9u);  // embedding, layer 0 (bf16), layer 1 (FP8: + 4 scales)
    EXPECT_EQ(ck.info(attn(1, MlaTensor::q_proj)).file, shard1);
    EXPECT_EQ(ck.info(attn(1, MlaTensor::q_proj) + "_scale_inv").file, shard2);  // scale in the other shard
    EXPECT_TRUE(same_bytes(ck.read_bf16("model.embed_tokens.weight"), expected("sharded", "model.embed_tokens.weight")));

    const MlaLayerTensors l0 = load_mla_layer(ck, 0, kNoLoraDims);
    EXPECT_FALSE(l0.q_a_proj || l0.q_b_proj);
    EXPECT_TRUE(l0.q_a_layernorm.empty());
    ASSERT_TRUE(l0.q_proj);
    expect_bf16_weight(*l0.q_proj, "sharded", attn(0, MlaTensor::q_proj), 96, 200);
    expect_bf16_weight(l0.kv_a_proj_with_mqa, "sharded", attn(0, MlaTensor::kv_a_proj_with_mqa), 80, 200);
    expect_bf16_weight(l0.kv_b_proj, "sharded", attn(0, MlaTensor::kv_b_proj), 112, 64);
    expect_bf16_weight(l0.o_proj, "sharded", attn(0, MlaTensor::o_proj), 200, 48);
    EXPECT_TRUE(same_bytes(l0.kv_a_layernorm, expected("sharded", attn(0, MlaTensor::kv_a_layernorm))));

    const MlaLayerTensors l1 = load_mla_layer(ck, 1, kNoLoraDims);
    ASSERT_TRUE(l1.q_proj);
    expect_fp8_weight(*l1.q_proj, "sharded", attn(1, MlaTensor::q_proj), 96, 200);
    expect_fp8_weight(l1.kv_a_proj_with_mqa, "sharded", attn(1, MlaTensor::kv_a_proj_with_mqa), 80, 200);
    expect_fp8_weight(l1.kv_b_proj, "sharded", attn(1, MlaTensor::kv_b_proj), 112, 64);
    expect_fp8_weight(l1.o_proj, "sharded", attn(1, MlaTensor::o_proj), 200, 48);
    EXPECT_TRUE(same_bytes(l1.kv_a_layernorm, expected("sharded", attn(1, MlaTensor::kv_a_layernorm))));
  }
}

TEST_F(CheckpointRead, DirectoryWithoutIndex) {
  const Checkpoint ck(fixture("noindex"));
  ASSERT_EQ(ck.shards().size(), 2u);
  EXPECT_EQ(ck.size(), 7u);
  const MlaLayerTensors t = load_mla_layer(ck, 0, kDims);
  ASSERT_TRUE(t.q_b_proj);
  expect_bf16_weight(*t.q_b_proj, "noindex", attn(0, MlaTensor::q_b_proj), 96, 136);
  expect_bf16_weight(t.o_proj, "noindex", attn(0, MlaTensor::o_proj), 200, 48);
}

TEST_F(CheckpointRead, MissingTensorListsNearNames) {
  const std::string path = fixture("bf16_layer.safetensors");
  const Checkpoint ck(path);
  const std::string typo = "model.layers.0.self_attn.q_b_proj.weigth";
  const std::string e = error_of([&] { ck.info(typo); });
  EXPECT_NE(e.find("'" + typo + "' is not in checkpoint '" + path + "'"), std::string::npos) << e;
  EXPECT_NE(e.find("closest names: '" + attn(0, MlaTensor::q_b_proj) + "'"), std::string::npos) << e;

  const std::string other = error_of([&] { ck.read_bf16("lm_head.weight"); });
  EXPECT_NE(other.find("no similar names"), std::string::npos) << other;

  const std::string layer = error_of([&] { load_mla_layer(ck, 5, kDims); });  // the file has layer 0 only
  EXPECT_NE(layer.find("model.layers.5.self_attn."), std::string::npos) << layer;
  EXPECT_NE(layer.find("closest names: 'model.layers.0.self_attn."), std::string::npos) << layer;
}

TEST_F(CheckpointRead, QLayoutMismatchSaysWhichDimToChange) {
  const std::string with_lora = error_of([&] { load_mla_layer(Checkpoint(fixture("sharded")), 0, kDims); });
  EXPECT_NE(with_lora.find("q_lora_rank must be 0"), std::string::npos) << with_lora;
  EXPECT_NE(with_lora.find(attn(0, MlaTensor::q_proj)), std::string::npos) << with_lora;
  const std::string without =
      error_of([&] { load_mla_layer(Checkpoint(fixture("bf16_layer.safetensors")), 0, kNoLoraDims); });
  EXPECT_NE(without.find("q_lora_rank must be its rank"), std::string::npos) << without;
}

TEST_F(CheckpointRead, ShapeFromOtherDimsNamesTheRule) {
  MlaDims dims = kDims;
  dims.heads = 4;
  const std::string path = fixture("bf16_layer.safetensors");
  const std::string e = error_of([&] { load_mla_layer(Checkpoint(path), 0, dims); });
  EXPECT_NE(e.find("'" + attn(0, MlaTensor::q_b_proj) + "' in '" + path + "' has shape [96, 136]"), std::string::npos)
      << e;
  EXPECT_NE(e.find("[heads * (qk_nope + qk_rope), q_lora_rank] = [192, 136]"), std::string::npos) << e;
}

// ---- malformed files ------------------------------------------------------------------------

struct BadFile {
  const char* label;
  const char* path;                       // under malformed/; the message must name it
  void (*action)(const std::string& path);
  std::vector<std::string> says;          // more substrings the message must contain
};

// What ctest shows for a case (gtest would print the struct's bytes).
void PrintTo(const BadFile& c, std::ostream* os) { *os << c.path; }

void open_only(const std::string& p) { Checkpoint c(p); }
const std::string kQa = "model.layers.0.self_attn.q_a_proj.weight";
void read_fp8(const std::string& p) { Checkpoint(p).read_fp8_weight(kQa); }
void load_projection(const std::string& p) { load_projection_weight(Checkpoint(p), kQa, 136, 200); }
void load_layer(const std::string& p) { load_mla_layer(Checkpoint(p), 0, kDims); }

const BadFile kBadFiles[] = {
    // The file as a whole.
    {"empty", "empty.safetensors", open_only, {"is 0 bytes, shorter than the 8-byte header length"}},
    {"short", "short.safetensors", open_only, {"is 5 bytes"}},
    {"truncated_header", "truncated_header.safetensors", open_only, {"is larger than the rest of the file", "truncated"}},
    {"header_too_long", "header_too_long.safetensors", open_only, {"header length 1048576 is larger than the rest"}},
    {"header_huge", "header_huge.safetensors", open_only, {"exceeds the format's limit of 100000000 bytes"}},
    {"not_json", "not_json.safetensors", open_only, {"the header is not valid JSON"}},
    {"header_array", "header_array.safetensors", open_only, {"does not start with '{'"}},
    {"bad_metadata", "bad_metadata.safetensors", open_only, {"__metadata__ entry 'n' is not a string"}},
    {"trailing_bytes", "trailing_bytes.safetensors", open_only, {"the last 16 belong to no tensor"}},
    {"duplicate_tensor", "duplicate_tensor.safetensors", open_only, {"tensor 'w' appears twice in the header"}},
    {"duplicate_field", "duplicate_field.safetensors", open_only, {"field 'dtype' appears twice in the entry of 'w'"}},
    // One tensor's entry.
    {"truncated", "truncated.safetensors", open_only, {"tensor 'w'", "reach past the end of the data", "truncated"}},
    {"unknown_dtype", "unknown_dtype.safetensors", open_only, {"tensor 'w'", "unknown dtype 'F7'"}},
    {"missing_field", "missing_field.safetensors", open_only, {"tensor 'w'", "has no 'data_offsets'"}},
    {"negative_dim", "negative_dim.safetensors", open_only, {"tensor 'w'", "shape [-4,12] is not a list of non-negative"}},
    {"shape_overflow", "shape_overflow.safetensors", open_only, {"tensor 'w'", "more elements than any file can hold"}},
    {"offsets_reversed", "offsets_reversed.safetensors", open_only, {"tensor 'w'", "[192, 0) end before they begin"}},
    {"offsets_float", "offsets_float.safetensors", open_only, {"tensor 'w'", "is not a pair of non-negative integers"}},
    {"offsets_size_mismatch", "offsets_size_mismatch.safetensors", open_only,
     {"tensor 'w'", "[0, 188) hold 188 bytes, but F32 [4,12] needs 192"}},
    {"offsets_out_of_bounds", "offsets_out_of_bounds.safetensors", open_only,
     {"tensor 'b'", "[96, 224) reach past the end of the data (192 bytes"}},
    {"offsets_overlap", "offsets_overlap.safetensors", open_only, {"tensors 'a' and 'b' overlap"}},
    {"offsets_hole", "offsets_hole.safetensors", open_only, {"bytes [64, 96) of the data belong to no tensor", "'b'"}},
    // FP8 weights and their scales.
    {"fp8_no_scale", "fp8_no_scale.safetensors", read_fp8, {"FP8 weight '" + kQa + "'", "has no '" + kQa + "_scale_inv'"}},
    {"fp8_scale_shape", "fp8_scale_shape.safetensors", read_fp8,
     {kQa + "_scale_inv", "has shape [1, 2]", "[136, 200] needs one scale per 128x128 block: [2, 2]"}},
    {"fp8_scale_dtype", "fp8_scale_dtype.safetensors", read_fp8, {kQa + "_scale_inv", "is BF16", "must be F32 or F8_E8M0"}},
    {"fp8_scale_nan", "fp8_scale_nan.safetensors", read_fp8, {kQa + "_scale_inv", "holds nan for block (1, 0)"}},
    {"fp8_scale_inf", "fp8_scale_inf.safetensors", read_fp8, {kQa + "_scale_inv", "holds inf for block (1, 0)"}},
    {"fp8_1d", "fp8_1d.safetensors", read_fp8, {kQa, "has shape [200]; it must be 2-D"}},
    {"fp8_no_scale_as_projection", "fp8_no_scale.safetensors", load_projection, {"has no '" + kQa + "_scale_inv'"}},
    {"bf16_with_scale", "bf16_with_scale.safetensors", load_projection, {kQa, "is BF16, yet '" + kQa + "_scale_inv'"}},
    {"wrong_shape_layer", "wrong_shape_layer.safetensors", load_layer,
     {"model.layers.0.self_attn.o_proj.weight", "has shape [200, 40]", "[hidden, heads * v_head] = [200, 48]"}},
    // Directories and indexes.
    {"dup_across_shards", "dup_across_shards", open_only,
     {"'model.embed_tokens.weight' is in two shards", "dup_across_shards/a.safetensors", "dup_across_shards/b.safetensors"}},
    {"index_missing_shard", "index_missing_shard", open_only,
     {"model.safetensors.index.json", "names shard 's2.safetensors' (for tensors such as 'b')", "does not exist"}},
    {"index_wrong_shard", "index_wrong_shard", open_only,
     {"model.safetensors.index.json", "puts tensor 'a' in", "s2.safetensors', but it is in", "s1.safetensors"}},
    {"index_ghost_tensor", "index_ghost_tensor", open_only, {"puts tensor 'ghost' in", "but that shard does not hold it"}},
    {"index_bad_json", "index_bad_json/model.safetensors.index.json", open_only, {"is not valid JSON"}},
    {"index_no_weight_map", "index_no_weight_map", open_only, {"has no \"weight_map\" object"}},
    {"empty_dir", "empty_dir", open_only, {"holds neither model.safetensors.index.json nor any .safetensors file"}},
    {"no_such_path", "no_such_file.safetensors", open_only, {"does not exist"}},
};

class CheckpointMalformed : public ::testing::TestWithParam<BadFile> {};

TEST_P(CheckpointMalformed, ThrowsNamingFileAndTensor) {
  const BadFile& c = GetParam();
  const std::string path = fixture(std::string("malformed/") + c.path);
  if (std::string(c.label) != "no_such_path") {
    ASSERT_TRUE(fs::exists(path)) << "fixture missing: " << path;
  }
  const std::string e = error_of([&] { c.action(path); });
  EXPECT_NE(e.find(path), std::string::npos) << "the message does not name " << path << ":\n" << e;
  for (const auto& s : c.says) EXPECT_NE(e.find(s), std::string::npos) << "missing \"" << s << "\" in:\n" << e;
}

INSTANTIATE_TEST_SUITE_P(CheckpointFiles, CheckpointMalformed, ::testing::ValuesIn(kBadFiles),
                         [](const auto& info) { return std::string(info.param.label); });

// ---- names and shapes (no files) ------------------------------------------------------------

TEST(MlaCheckpointNames, HuggingFaceNamesAndDesignShapes) {
  EXPECT_EQ(mla_tensor_name(3, MlaTensor::q_b_proj), "model.layers.3.self_attn.q_b_proj.weight");
  EXPECT_EQ(mla_tensor_name(61, MlaTensor::kv_a_proj_with_mqa), "model.layers.61.self_attn.kv_a_proj_with_mqa.weight");
  EXPECT_EQ(mla_tensor_name(0, MlaTensor::q_a_layernorm), "model.layers.0.self_attn.q_a_layernorm.weight");
  using S = std::vector<int64_t>;
  // The model shapes at TP 1 (docs/design.md).
  const MlaDims glm5{6144, 64, 2048, 512, 192, 64, 256};
  EXPECT_EQ(mla_tensor_shape(glm5, MlaTensor::q_b_proj), (S{16384, 2048}));
  EXPECT_EQ(mla_tensor_shape(glm5, MlaTensor::o_proj), (S{6144, 16384}));
  EXPECT_EQ(mla_tensor_shape(glm5, MlaTensor::kv_a_proj_with_mqa), (S{576, 6144}));  // 2624 = 2048 + 576 fused
  const MlaDims dsv3{7168, 128, 1536, 512, 128, 64, 128};
  EXPECT_EQ(mla_tensor_shape(dsv3, MlaTensor::q_b_proj), (S{24576, 1536}));
  EXPECT_EQ(mla_tensor_shape(dsv3, MlaTensor::o_proj), (S{7168, 16384}));
  EXPECT_EQ(mla_tensor_shape(dsv3, MlaTensor::kv_b_proj), (S{32768, 512}));
  const MlaDims v2_lite{2048, 16, 0, 512, 128, 64, 128};
  EXPECT_EQ(mla_tensor_shape(v2_lite, MlaTensor::q_proj), (S{3072, 2048}));
  EXPECT_EQ(mla_tensor_shape(v2_lite, MlaTensor::kv_a_layernorm), (S{512}));

  EXPECT_THROW(mla_tensor_shape(MlaDims{}, MlaTensor::o_proj), Error);
  EXPECT_THROW(mla_tensor_name(-1, MlaTensor::o_proj), Error);
}

TEST(MlaCheckpointNames, DTypeSpellings) {
  EXPECT_EQ(dtype_name(DType::f8_e4m3), "F8_E4M3");
  EXPECT_EQ(dtype_name(DType::bf16), "BF16");
  EXPECT_EQ(dtype_bits(DType::f4), 4);
  EXPECT_EQ(dtype_bits(DType::f6_e3m2), 6);
  EXPECT_EQ(dtype_bits(DType::c64), 64);
}

}  // namespace
}  // namespace fp8proj

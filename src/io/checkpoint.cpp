// Checkpoint: the three on-disk layouts (one file, a directory of shards, a Hugging Face
// index), lookups by name, and typed reads into our host layouts.
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <limits>
#include <new>
#include <stdexcept>
#include <set>

#include <nlohmann/json.hpp>

#include "fp8proj/checkpoint.hpp"
#include "fp8proj/error.hpp"
#include "fp8proj/formats.hpp"
#include "fp8proj/numbers.hpp"
#include "io/json_checked.hpp"
#include "io/mapped_file.hpp"
#include "io/safetensors.hpp"

namespace fp8proj {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr std::string_view kIndexName = "model.safetensors.index.json";
constexpr std::string_view kScaleSuffix = "_scale_inv";
// DeepSeek-V3's index is 9 MB (~90k tensors); ten times that is not an index.
constexpr size_t kMaxIndexBytes = 100'000'000;
// The largest block scale whose every dequantized E4M3 value (|code| <= 448) is finite in fp32.
constexpr float kMaxBlockScale = std::numeric_limits<float>::max() / 448.0f;

// `bytes` bytes for tensor `name`, or an fp8proj::Error saying so: a header may describe a
// tensor larger than this host's memory (a sparse file is enough), and std::bad_alloc from the
// vector would name nothing.
template <typename Make>
auto allocate_for(std::string_view name, const std::string& file, uint64_t bytes, Make make) {
  // More than the host's physical memory cannot succeed; refusing it up front does not depend
  // on how the allocator fails (overcommit, or a sanitizer's allocator that aborts).
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  if (pages > 0 && page > 0)
    FP8PROJ_CHECK(bytes <= uint64_t(pages) * uint64_t(page), "tensor '", name, "' in '", file, "': reading it needs ",
                  bytes, " bytes of host memory, more than this host has (", uint64_t(pages) * uint64_t(page), ")");
  try {
    return make();
  } catch (const std::bad_alloc&) {
    FP8PROJ_FAIL("tensor '", name, "' in '", file, "': cannot allocate ", bytes, " bytes of host memory to read it");
  } catch (const std::length_error&) {
    FP8PROJ_FAIL("tensor '", name, "' in '", file, "': ", bytes, " bytes is more than this host can hold");
  }
}

// IEEE binary16 -> binary32, exact (every half is a float). Only checkpoint reading needs
// half precision, so it lives here rather than next to the bf16 and e4m3 formats.
float f16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  if (exp == 0x1f) return bits_float(sign | 0x7f800000u | (man << 13));  // inf, NaN (payload kept)
  if (exp == 0) {  // zero or subnormal: man * 2^-24, exact in fp32
    const float mag = static_cast<float>(man) * 0x1p-24f;
    return sign ? -mag : mag;
  }
  return bits_float(sign | ((exp + 112u) << 23) | (man << 13));  // rebias 15 -> 127
}

// Levenshtein distance, abandoned (returning limit + 1) as soon as it must exceed `limit`:
// a missing-name error compares against every name of the checkpoint (~90k for DeepSeek-V3),
// and the cut-off keeps that under 0.1 s (75 ms measured for 94k names).
size_t edit_distance(std::string_view a, std::string_view b, size_t limit, std::vector<size_t>& row) {
  if ((a.size() > b.size() ? a.size() - b.size() : b.size() - a.size()) > limit) return limit + 1;
  row.resize(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    size_t row_min = row[0];
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({above + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1] ? 1 : 0)});
      diagonal = above;
      row_min = std::min(row_min, row[j]);
    }
    if (row_min > limit) return limit + 1;
  }
  return row.back();
}

std::string join_quoted(const std::vector<std::string>& names) {
  std::string s;
  for (const auto& n : names) s += (s.empty() ? "'" : ", '") + n + "'";
  return s;
}

}  // namespace

struct Checkpoint::Impl {
  std::string path;
  std::vector<std::unique_ptr<io::SafetensorsFile>> files;
  std::vector<ShardInfo> shards;
  std::map<std::string, const io::TensorRecord*, std::less<>> by_name;

  void add_file(const std::string& file) {
    auto f = std::make_unique<io::SafetensorsFile>(file);
    for (const io::TensorRecord& r : f->tensors()) {
      const auto [it, inserted] = by_name.emplace(r.info.name, &r);
      FP8PROJ_CHECK(inserted, "checkpoint '", path, "': tensor '", r.info.name, "' is in two shards, '",
                    it->second->info.file, "' and '", file, "'");
    }
    shards.push_back(f->shard());
    files.push_back(std::move(f));
  }

  void open_directory(const fs::path& dir) {
    std::error_code ec;
    if (fs::exists(dir / kIndexName, ec)) {
      open_index(dir / kIndexName);
      return;
    }
    std::vector<std::string> found;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
      if (it->path().extension() == ".safetensors") found.push_back(it->path().string());
    FP8PROJ_CHECK(!ec, "cannot list checkpoint directory '", dir.string(), "': ", ec.message());
    FP8PROJ_CHECK(!found.empty(), "checkpoint directory '", dir.string(), "' holds neither ", kIndexName,
                  " nor any .safetensors file");
    std::sort(found.begin(), found.end());  // shard order is not meaningful, but keep it stable
    for (const auto& f : found) add_file(f);
  }

  // The Hugging Face sharded layout: {"metadata": {...}, "weight_map": {tensor: shard file}}.
  // The shards' own headers are the authority on what they hold; the index must agree with them.
  void open_index(const fs::path& index) {
    const std::string where = "checkpoint index '" + index.string() + "'";
    const json j = io::parse_json(io::read_regular_file(index.string(), kMaxIndexBytes), where);
    FP8PROJ_CHECK(j.is_object() && j.contains("weight_map") && j.at("weight_map").is_object(), where,
                  " has no \"weight_map\" object");
    const json& weight_map = j.at("weight_map");
    FP8PROJ_CHECK(!weight_map.empty(), where, ": the weight_map is empty");
    std::set<std::string> shard_names;  // sorted: model-00001-of-000NN first
    for (const auto& [tensor, shard] : weight_map.items()) {
      FP8PROJ_CHECK(shard.is_string(), where, ": the weight_map entry of '", tensor, "' is not a file name");
      shard_names.insert(shard.get<std::string>());
    }
    const fs::path dir = index.parent_path();
    std::error_code ec;
    const fs::path real_dir = fs::weakly_canonical(dir.empty() ? fs::path(".") : dir, ec);
    FP8PROJ_CHECK(!ec, "cannot resolve the folder of ", where, ": ", ec.message());
    for (const auto& name : shard_names) {
      // Shards live in the index's folder: a name is a plain relative path, and once
      // symbolic links are resolved it still lies inside that folder.
      const fs::path rel(name);
      bool dotdot = false;
      for (const auto& part : rel) dotdot = dotdot || part == "..";
      FP8PROJ_CHECK(!name.empty() && !rel.is_absolute() && !rel.has_root_path() && !dotdot, where,
                    " names shard ", quote_excerpt(name), ", which is not a file name inside the checkpoint's folder ",
                    "(absolute paths and '..' are refused)");
      const fs::path file = dir / name;
      const fs::path real = fs::weakly_canonical(file, ec);
      FP8PROJ_CHECK(!ec, where, ": cannot resolve shard '", name, "': ", ec.message());
      const auto [d_end, r_it] = std::mismatch(real_dir.begin(), real_dir.end(), real.begin(), real.end());
      FP8PROJ_CHECK(d_end == real_dir.end() && r_it != real.end(), where, " names shard '", name,
                    "', which resolves to '", real.string(), "', outside the checkpoint's folder '",
                    real_dir.string(), "'");
      FP8PROJ_CHECK(fs::exists(file, ec), where, " names shard '", name, "' (for tensors such as '",
                    first_tensor_of(weight_map, name), "'), but '", file.string(), "' does not exist");
      add_file(file.string());
    }
    for (const auto& [tensor, shard] : weight_map.items()) {
      const std::string expected = (dir / shard.get<std::string>()).string();
      const auto it = by_name.find(tensor);
      FP8PROJ_CHECK(it != by_name.end(), where, " puts tensor '", tensor, "' in '", expected,
                    "', but that shard does not hold it");
      FP8PROJ_CHECK(it->second->info.file == expected, where, " puts tensor '", tensor, "' in '", expected,
                    "', but it is in '", it->second->info.file, "'");
    }
  }

  static std::string first_tensor_of(const json& weight_map, const std::string& shard) {
    for (const auto& [tensor, s] : weight_map.items())
      if (s == shard) return tensor;
    return "";
  }

  // Up to `count` names nearest to `wanted`, closest first; names further than a third of
  // its length are not suggestions but noise (another model's checkpoint, say).
  std::vector<std::string> near_names(std::string_view wanted, size_t count = 5) const {
    std::vector<std::pair<size_t, const std::string*>> best;  // sorted by distance
    std::vector<size_t> row;
    size_t limit = std::max<size_t>(2, wanted.size() / 3);
    for (const auto& [name, record] : by_name) {
      const size_t d = edit_distance(wanted, name, limit, row);
      if (d > limit) continue;
      best.insert(std::upper_bound(best.begin(), best.end(), d,
                                   [](size_t v, const auto& e) { return v < e.first; }),
                  {d, &name});
      if (best.size() > count) best.pop_back();
      if (best.size() == count) limit = best.back().first;
    }
    std::vector<std::string> out;
    for (const auto& [d, name] : best) out.push_back(*name);
    return out;
  }

  const io::TensorRecord& record(std::string_view name) const {
    const auto it = by_name.find(name);
    if (it != by_name.end()) return *it->second;
    const std::vector<std::string> near = near_names(name);
    FP8PROJ_FAIL("tensor '", name, "' is not in checkpoint '", path, "' (", by_name.size(), " tensors in ",
                 files.size(), " file", files.size() == 1 ? "" : "s", "); ",
                 near.empty() ? std::string("no similar names") : "closest names: " + join_quoted(near));
  }
};

Checkpoint::Checkpoint(const std::string& path) : impl_(std::make_unique<Impl>()) {
  impl_->path = path;
  const fs::path p(path);
  std::error_code ec;
  const fs::file_status st = fs::status(p, ec);
  FP8PROJ_CHECK(fs::exists(st), "checkpoint path '", path, "' does not exist",
                ec && ec != std::errc::no_such_file_or_directory ? " or cannot be accessed: " + ec.message() : "");
  if (fs::is_directory(st))
    impl_->open_directory(p);
  else if (p.extension() == ".json")
    impl_->open_index(p);
  else
    impl_->add_file(path);
}

Checkpoint::~Checkpoint() = default;
Checkpoint::Checkpoint(Checkpoint&&) noexcept = default;
Checkpoint& Checkpoint::operator=(Checkpoint&&) noexcept = default;

const std::string& Checkpoint::path() const { return impl_->path; }
const std::vector<ShardInfo>& Checkpoint::shards() const { return impl_->shards; }
size_t Checkpoint::size() const { return impl_->by_name.size(); }

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  out.reserve(impl_->by_name.size());
  for (const auto& [name, record] : impl_->by_name) out.push_back(name);
  return out;
}

const TensorInfo* Checkpoint::find(std::string_view name) const {
  const auto it = impl_->by_name.find(name);
  return it == impl_->by_name.end() ? nullptr : &it->second->info;
}

const TensorInfo& Checkpoint::info(std::string_view name) const { return impl_->record(name).info; }

const TensorInfo& Checkpoint::expect(std::string_view name, const std::vector<int64_t>& shape) const {
  const TensorInfo& t = info(name);
  FP8PROJ_CHECK(t.shape == shape, "tensor '", name, "' in '", t.file, "' has shape ", t.shape_string(),
                ", expected ", io::format_shape(shape));
  return t;
}

std::span<const std::byte> Checkpoint::bytes(std::string_view name) const { return impl_->record(name).data; }

void Checkpoint::read_bf16(std::string_view name, std::span<bf16> out) const {
  const io::TensorRecord& r = impl_->record(name);
  const TensorInfo& t = r.info;
  FP8PROJ_CHECK(out.size() == static_cast<size_t>(t.numel()), "read_bf16: tensor '", name, "' in '", t.file,
                "' has ", t.numel(), " elements, the buffer ", out.size());
  const std::byte* src = r.data.data();
  switch (t.dtype) {
    case DType::bf16:
      if (!out.empty()) std::memcpy(out.data(), src, r.data.size());
      return;
    case DType::f32:
      for (size_t i = 0; i < out.size(); ++i) {
        uint32_t u;
        std::memcpy(&u, src + 4 * i, 4);  // tensors are only byte-aligned in the file
        out[i] = float_to_bf16(bits_float(u));
      }
      return;
    case DType::f16:
      for (size_t i = 0; i < out.size(); ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        out[i] = float_to_bf16(f16_to_float(h));  // exact widening, then one rounding
      }
      return;
    case DType::f8_e4m3:
      FP8PROJ_FAIL("tensor '", name, "' in '", t.file, "' is F8_E4M3, an FP8 weight: read it with its scales "
                   "(read_fp8_weight or load_projection_weight), not as bf16");
    default:
      FP8PROJ_FAIL("tensor '", name, "' in '", t.file, "' is ", dtype_name(t.dtype),
                   "; only BF16, F16 and F32 tensors can be read as bf16");
  }
}

std::vector<bf16> Checkpoint::read_bf16(std::string_view name) const {
  const TensorInfo& t = info(name);
  std::vector<bf16> out = allocate_for(name, t.file, uint64_t(t.numel()) * sizeof(bf16),
                                       [&] { return std::vector<bf16>(static_cast<size_t>(t.numel())); });
  read_bf16(name, out);
  return out;
}

HostFp8Weight Checkpoint::read_fp8_weight(std::string_view name) const {
  const io::TensorRecord& w = impl_->record(name);
  const TensorInfo& t = w.info;
  FP8PROJ_CHECK(t.dtype == DType::f8_e4m3, "tensor '", name, "' in '", t.file, "' is ", dtype_name(t.dtype),
                ", not an FP8 (F8_E4M3) weight");
  FP8PROJ_CHECK(t.shape.size() == 2 && t.shape[0] > 0 && t.shape[1] > 0, "FP8 weight '", name, "' in '", t.file,
                "' has shape ", t.shape_string(), "; it must be 2-D [N, K] and not empty");
  const int64_t n = t.shape[0], k = t.shape[1];

  const std::string scale_name = std::string(name) + std::string(kScaleSuffix);
  const auto it = impl_->by_name.find(scale_name);
  if (it == impl_->by_name.end()) {
    const std::vector<std::string> near = impl_->near_names(scale_name);
    FP8PROJ_FAIL("FP8 weight '", name, "' in '", t.file, "' has no '", scale_name,
                 "' (the fp32 scale of each 128x128 block) anywhere in checkpoint '", impl_->path, "'",
                 near.empty() ? std::string() : "; closest names: " + join_quoted(near));
  }
  const io::TensorRecord& s = *it->second;
  // F32 (DeepSeek-V3's amax/448) or F8_E8M0 (UE8M0: one byte e per block, the power of two
  // 2^(e-127), as transformers' scale_fmt "ue8m0" stores it), both widened to fp32 exactly.
  FP8PROJ_CHECK(s.info.dtype == DType::f32 || s.info.dtype == DType::f8_e8m0, "'", scale_name, "' in '",
                s.info.file, "' is ", dtype_name(s.info.dtype),
                "; the block scales of an FP8 weight must be F32 or F8_E8M0");
  const bool ue8m0 = s.info.dtype == DType::f8_e8m0;
  const std::vector<int64_t> scale_shape = {ceil_div(n, kScaleBlock), ceil_div(k, kScaleBlock)};
  FP8PROJ_CHECK(s.info.shape == scale_shape, "'", scale_name, "' in '", s.info.file, "' has shape ",
                s.info.shape_string(), ", but weight '", name, "' ", t.shape_string(),
                " needs one scale per 128x128 block: ", io::format_shape(scale_shape));

  // Checked before anything is allocated: a scale that is not finite turns its 128x128 block
  // into NaN, 0 into zeros, a negative one flips every sign, and one above FLT_MAX / 448 makes
  // the block's large codes infinite.
  const std::byte* scale_bytes = s.data.data();
  auto scale_at = [&](int64_t i) {
    if (ue8m0) return ue8m0_to_float(static_cast<uint8_t>(scale_bytes[i]));  // 255 is NaN: refused below
    float v;
    std::memcpy(&v, scale_bytes + 4 * i, 4);
    return v;
  };
  for (int64_t i = 0; i < scale_shape[0] * scale_shape[1]; ++i) {
    const float v = scale_at(i);
    FP8PROJ_CHECK(is_finite_float(v) && v > 0.0f && v <= kMaxBlockScale, "'", scale_name, "' in '", s.info.file,
                  "' holds ", v, " for block (", i / scale_shape[1], ", ", i % scale_shape[1], ") of '", name,
                  "'; a block scale must be finite, positive and at most ", kMaxBlockScale,
                  " (so that 448 x scale is finite)");
  }
  HostFp8Weight out = allocate_for(name, t.file, w.data.size() + s.data.size(), [&] { return make_host_fp8_weight(n, k); });
  std::memcpy(out.values.data(), w.data.data(), w.data.size());
  if (ue8m0) {
    for (size_t i = 0; i < out.scales.size(); ++i) out.scales[i] = scale_at(static_cast<int64_t>(i));
  } else {
    std::memcpy(out.scales.data(), s.data.data(), s.data.size());
  }
  return out;
}

HostWeight load_projection_weight(const Checkpoint& checkpoint, std::string_view name, int64_t n, int64_t k) {
  FP8PROJ_CHECK(n > 0 && k > 0, "load_projection_weight('", name, "'): N and K must be positive, got ", n, ", ", k);
  const TensorInfo& t = checkpoint.expect(name, {n, k});
  if (t.dtype == DType::f8_e4m3) return checkpoint.read_fp8_weight(name);
  const std::string scale_name = std::string(name) + std::string(kScaleSuffix);
  FP8PROJ_CHECK(!checkpoint.find(scale_name), "tensor '", name, "' in '", t.file, "' is ", dtype_name(t.dtype),
                ", yet '", scale_name, "' exists: block scales belong to F8_E4M3 weights, so one of the "
                "two is wrong");
  return HostBf16Weight{checkpoint.read_bf16(name), n, k};
}

HostBf16Weight to_bf16(HostWeight weight) {
  if (auto* b = std::get_if<HostBf16Weight>(&weight)) return std::move(*b);
  const HostFp8Weight& f = std::get<HostFp8Weight>(weight);
  const std::vector<float> x = cpu::dequantize(f.view());
  HostBf16Weight out{std::vector<bf16>(x.size()), f.n, f.k};
  std::transform(x.begin(), x.end(), out.values.begin(), [](float v) { return float_to_bf16(v); });
  return out;
}

}  // namespace fp8proj

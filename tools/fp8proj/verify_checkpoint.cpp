// fp8proj verify --checkpoint DIR: what FP8 costs on a Hugging Face MLA checkpoint.
//
// Reads config.json (hidden_size, num_attention_heads, q_lora_rank, kv_lora_rank,
// qk_nope_head_dim, qk_rope_head_dim, v_head_dim, num_hidden_layers) and loads every layer's
// attention tensors through the checkpoint loader (load_mla_layer: shapes checked against the
// config; bf16/f16/f32, or FP8 with weight_scale_inv, sharded or not). Per projection:
//   - eligible: fp8_eligible (gemm.hpp: K a multiple of 128, N of 16; a partial last 128-row block);
//   - tagged: on the gated FP8 path in fp8proj's MLA block (q_b_proj or q_proj, and o_proj);
//   - weights: a bf16 projection is quantized into the private FP8 copy (--weight-scales, UE8M0 by
//     default), whose bytes are reported; an FP8 projection (e4m3 + weight_scale_inv) is used as
//     stored -- no copy, no re-quantization, the way fp8proj runs FP8 checkpoints (Python:
//     fp8proj.fp8_linear) -- and its activations take fp32 amax/448 scales, as there;
//   - weight error: ||dequant(quant(W)) - W|| / ||W|| for a copy (W as the block uses it, bf16);
//     none for a stored FP8 weight, which is the model's weight;
//   - GEMM error on random activations of the model's scale: x = N(0, 1) times the RMSNorm
//     weight that feeds the projection (input_layernorm for q_a / kv_a, q_a_layernorm for q_b,
//     kv_a_layernorm for kv_b); o_proj's input is attention output, a convex mix of v, so
//     N(0, rms(v)^2) with v = kv_b_proj's value rows applied to kv_b's own input. Every FP8
//     backend of this machine (the CPU reference; the GPU's where present) against the fp64
//     product of the bf16 operands (what FP8 costs) and of its dequantized operands (whether
//     the kernel is right: that one is judged, with kFp8GemmRelTol), beside the bf16 GEMM's own
//     error (the floor). For a stored FP8 weight "the bf16 operands" are the activations and the
//     dequantized weight (what dequantize=True computes with), so the first error is the
//     activation quantization's alone and the second the kernel's alone.
//   - the Frobenius norm of the dequantized weight the GEMM ran (gemm_weight_norm in the JSON),
//     so that a test can tell the stored operand from a re-quantized one.
#include "verify_checkpoint.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common.hpp"
#include "fp8proj/checkpoint.hpp"
#include "fp8proj/error.hpp"
#include "fp8proj/gemm.hpp"
#include "fp8proj/mla_checkpoint.hpp"
#include "fp8proj/quantize.hpp"
#include "fp8proj/random.hpp"
#include "fp8proj/reference.hpp"

namespace fp8proj::cli {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct ModelConfig {
  MlaDims dims;
  int64_t layers = 0;
  std::string model_type, quantization;
};

int64_t get_int(const json& j, const char* key, const std::string& where) {
  FP8PROJ_CHECK(j.contains(key) && j.at(key).is_number_integer(), where, " has no integer \"", key,
                "\": is this an MLA (DeepSeek-V2/V3, GLM-5) checkpoint?");
  return j.at(key).get<int64_t>();
}

ModelConfig read_config(const fs::path& dir) {
  const fs::path file = dir / "config.json";
  const std::string where = fmt::format("'{}'", file.string());
  std::ifstream in(file);
  FP8PROJ_CHECK(in.good(), "cannot open ", where, ": a Hugging Face checkpoint directory holds its config.json "
                "beside the weights, and the MLA dimensions come from it");
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {
    FP8PROJ_FAIL(where, " is not valid JSON (", e.what(), ")");
  }
  ModelConfig c;
  c.dims.hidden = get_int(j, "hidden_size", where);
  c.dims.heads = get_int(j, "num_attention_heads", where);
  c.dims.q_lora_rank = j.contains("q_lora_rank") && !j.at("q_lora_rank").is_null() ? get_int(j, "q_lora_rank", where) : 0;
  c.dims.kv_lora_rank = get_int(j, "kv_lora_rank", where);
  c.dims.qk_nope = get_int(j, "qk_nope_head_dim", where);
  c.dims.qk_rope = get_int(j, "qk_rope_head_dim", where);
  c.dims.v_head = get_int(j, "v_head_dim", where);
  c.layers = get_int(j, "num_hidden_layers", where);
  FP8PROJ_CHECK(c.layers > 0, where, ": num_hidden_layers must be positive, got ", c.layers);
  c.model_type = j.value("model_type", std::string("?"));
  if (j.contains("quantization_config") && j.at("quantization_config").is_object()) {
    const json& q = j.at("quantization_config");
    c.quantization = q.value("quant_method", std::string("?"));
    if (q.contains("weight_block_size")) c.quantization = fmt::format("{} {}", c.quantization, q.at("weight_block_size").dump());
  }
  return c;
}

std::vector<int> parse_layers(const std::string& text, int64_t count) {
  std::vector<int> out;
  if (text.empty() || text == "all") {
    for (int i = 0; i < count; ++i) out.push_back(i);
    return out;
  }
  for (int v : parse_int_list(text, "--layers", 0, INT32_MAX)) {
    FP8PROJ_CHECK(v >= 0 && v < count, "--layers: layer ", v, " is outside 0..", count - 1,
                  " (num_hidden_layers = ", count, ")");
    out.push_back(v);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

double rel_frobenius(const float* a, const float* ref, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    const double d = double(a[i]) - double(ref[i]);
    num += d * d;
    den += double(ref[i]) * double(ref[i]);
  }
  return den > 0 ? std::sqrt(num / den) : (num > 0 ? INFINITY : 0.0);
}

std::vector<float> normal_activations(int64_t m, int64_t k, uint64_t seed, const std::vector<bf16>& gamma,
                                      float stddev) {
  std::vector<float> x(static_cast<size_t>(m * k));
  fill_normal(MemorySpace::host, x.data(), m * k, seed, stddev);
  if (!gamma.empty())
    for (int64_t r = 0; r < m; ++r)
      for (int64_t c = 0; c < k; ++c) x[r * k + c] *= bf16_to_float(gamma[c]);
  return x;
}

std::vector<float> rounded(const std::vector<float>& x) {  // through bf16, as a model's activations are
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = bf16_to_float(float_to_bf16(x[i]));
  return out;
}

struct Projection {
  MlaTensor tensor;
  const HostWeight* weight;
  const std::vector<bf16>* gamma;  // the RMSNorm weight that feeds it; nullptr: none
  bool tagged;
};

struct GemmRow {
  std::string backend;
  double fp8_vs_exact = 0, fp8_vs_dequant = 0, bf16_vs_exact = 0;
  bool pass = true;
};

struct Result {
  int layer;
  std::string proj, dtype, why_ineligible;
  int64_t n, k;
  bool eligible, tagged;
  bool stored_fp8 = false;  // the checkpoint's e4m3 + weight_scale_inv, used as stored
  std::string scale_dtype = "";  // of a stored weight_scale_inv: F32 or F8_E8M0
  size_t bf16_bytes = 0, fp8_bytes = 0;
  double gemm_weight_norm = 0;  // ||dequant(the FP8 weight the GEMM ran)||_F
  std::optional<double> weight_err = std::nullopt, act_err = std::nullopt;
  double act_scale = 0;
  std::vector<GemmRow> gemm = {};
};

size_t fp8_copy_bytes(int64_t n, int64_t k) {
  return static_cast<size_t>(n * k) + static_cast<size_t>(ceil_div(n, 128) * ceil_div(k, 128)) * sizeof(float);
}

// The GEMM errors of one projection on activations x [m, k] (already bf16-representable): the
// FP8 GEMM on x quantized with `act_mode` and the FP8 weight qw, against the fp64 products of
// x . wf^T (wf: the weight as the model holds it, bf16 or the stored FP8 dequantized) and of the
// dequantized operands; w: the bf16 weight of the bf16 path (the floor).
std::vector<GemmRow> gemm_errors(const std::vector<bf16>& w, const HostFp8Weight& qw, const std::vector<float>& wf,
                                 const std::vector<float>& xf, int64_t m, ScaleMode act_mode) {
  const int64_t n = qw.n, k = qw.k;
  std::vector<bf16> x(xf.size());
  for (size_t i = 0; i < xf.size(); ++i) x[i] = float_to_bf16(xf[i]);
  HostFp8Activation qx = make_host_fp8_activation(m, k);
  cpu::quantize_activation(x.data(), m, k, qx.out(), act_mode);
  const std::vector<float> xq = cpu::dequantize(qx.view()), wq = cpu::dequantize(qw.view());
  const std::vector<double> exact = cpu::gemm_f64(xf.data(), wf.data(), m, n, k);
  const std::vector<double> exact_q = cpu::gemm_f64(xq.data(), wq.data(), m, n, k);
  const size_t count = static_cast<size_t>(m * n);

  // The bf16 GEMM's error is the floor FP8 is compared with: the CPU reference's (fp32
  // accumulation, one bf16 rounding), the same contract every bf16 backend meets.
  std::vector<bf16> yb(count);
  cpu::gemm_bf16(x.data(), w.data(), yb.data(), m, n, k);
  const double bf16_err = compare(yb.data(), exact.data(), static_cast<int64_t>(count)).rel_frobenius;

  std::vector<GemmRow> rows;
  for (const GemmBackend* be : available_backends()) {
    if (be->kind() != GemmKind::fp8_block || !be->unsupported_reason(n, k).empty()) continue;
    const MemorySpace sp = be->space();
    Buffer y(sp, count * sizeof(bf16));
    fill_bytes(sp, y.data(), y.bytes(), 0xff);  // NaN: an unwritten output fails
    Buffer dxv = to_space(sp, qx.values.data(), qx.values.size());
    Buffer dxs = to_space(sp, qx.scales.data(), qx.scales.size());
    Buffer dwv = to_space(sp, qw.values.data(), qw.values.size());
    Buffer dws = to_space(sp, qw.scales.data(), qw.scales.size());
    GemmPlanOptions po;
    po.max_m = m;
    auto plan = be->plan_fp8({dwv.data<uint8_t>(), dws.data<float>(), n, k}, po);
    plan->run({dxv.data<uint8_t>(), dxs.data<float>(), m, k, qx.scale_ld}, y.data<bf16>(), nullptr);
    const auto out = to_host<bf16>(y, count);
    const ErrorStats vs_q = compare(out.data(), exact_q.data(), static_cast<int64_t>(count));
    const ErrorStats vs_x = compare(out.data(), exact.data(), static_cast<int64_t>(count));
    rows.push_back({std::string(be->name()), vs_x.rel_frobenius, vs_q.rel_frobenius, bf16_err,
                    vs_q.rel_frobenius <= kFp8GemmRelTol && vs_q.non_finite == 0});
  }
  return rows;
}

std::string human_bytes(double b) {
  if (b >= 1e9) return fmt::format("{:.2f} GB", b / 1e9);
  if (b >= 1e6) return fmt::format("{:.2f} MB", b / 1e6);
  return fmt::format("{:.1f} kB", b / 1e3);
}

}  // namespace

void run_verify_checkpoint(const VerifyCheckpointArgs& a) {
  const fs::path path(a.checkpoint);
  const fs::path dir = fs::is_directory(path) ? path : path.parent_path();
  const ModelConfig cfg = read_config(dir);
  const Checkpoint ck(a.checkpoint);
  const MlaDims& d = cfg.dims;
  FP8PROJ_CHECK(a.m > 0, "--m must be positive, got ", a.m);
  const std::vector<int> layers = parse_layers(a.layers, cfg.layers);  // before anything prints
  check_outputs({{"--json", a.json}, {"--csv", a.csv}}, {{"--checkpoint", a.checkpoint}});

  fmt::print("{}\n", space_banner(choose_space(false)));
  fmt::print("checkpoint {}: {} tensors in {} file{}; model_type {}, {} layer{}{}\n", a.checkpoint, ck.size(),
             ck.shards().size(), ck.shards().size() == 1 ? "" : "s", cfg.model_type, cfg.layers,
             cfg.layers == 1 ? "" : "s",
             cfg.quantization.empty() ? "" : ", quantization " + cfg.quantization);
  fmt::print("MLA: hidden {}, heads {}, q_lora_rank {}, kv_lora_rank {}, qk_nope {}, qk_rope {}, v_head {}\n",
             d.hidden, d.heads, d.q_lora_rank, d.kv_lora_rank, d.qk_nope, d.qk_rope, d.v_head);
  fmt::print("GEMM error on M = {} random rows of the model's scale (seed {})\n\n", a.m, a.seed);

  std::vector<Result> results;
  int failures = 0;
  fmt::print("{:>5} {:<19} {:>6} {:>6} {:<7} {:<9} {:<6} {:>10} {:>9} {:>9} {:>8}  {:<14} {:>10} {:>10} {:>9}\n",
             "layer", "projection", "N", "K", "dtype", "eligible", "tagged", "FP8 copy", "W error", "x error",
             "x scale", "backend", "FP8 GEMM", "vs dequant", "bf16 GEMM");
  for (const int layer : layers) {
    const MlaLayerTensors t = load_mla_layer(ck, layer, d);
    const std::string norm_name = "model.layers." + std::to_string(layer) + ".input_layernorm.weight";
    const std::vector<bf16> input_norm = ck.find(norm_name) ? ck.read_bf16(norm_name) : std::vector<bf16>{};
    std::vector<Projection> projs;
    if (t.q_proj) {
      projs.push_back({MlaTensor::q_proj, &*t.q_proj, &input_norm, true});
    } else {
      projs.push_back({MlaTensor::q_a_proj, &*t.q_a_proj, &input_norm, false});
      projs.push_back({MlaTensor::q_b_proj, &*t.q_b_proj, &t.q_a_layernorm, true});
    }
    projs.push_back({MlaTensor::kv_a_proj_with_mqa, &t.kv_a_proj_with_mqa, &input_norm, false});
    projs.push_back({MlaTensor::kv_b_proj, &t.kv_b_proj, &t.kv_a_layernorm, false});
    projs.push_back({MlaTensor::o_proj, &t.o_proj, nullptr, true});

    // o_proj's input scale: rms of v = kv_b_proj's value rows applied to its own input.
    const HostBf16Weight kv_b = to_bf16(t.kv_b_proj);
    float v_rms = 1.0f;
    {
      const int64_t rows = std::min<int64_t>(a.m, 64), kvk = kv_b.k;
      const std::vector<float> c = rounded(normal_activations(rows, kvk, a.seed + 1000 + layer, t.kv_a_layernorm, 1.0f));
      const std::vector<float> wf = cpu::to_float(kv_b.values.data(), kv_b.n * kvk);
      std::vector<float> y(static_cast<size_t>(rows * kv_b.n));
      cpu::sgemm_nt(c.data(), wf.data(), y.data(), rows, kv_b.n, kvk);
      double ss = 0;
      int64_t cnt = 0;
      const int64_t per_head = d.qk_nope + d.v_head;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t col = 0; col < kv_b.n; ++col)
          if (col % per_head >= d.qk_nope) {
            ss += double(y[r * kv_b.n + col]) * y[r * kv_b.n + col];
            ++cnt;
          }
      if (cnt > 0 && ss > 0) v_rms = static_cast<float>(std::sqrt(ss / double(cnt)));
    }

    for (size_t pi = 0; pi < projs.size(); ++pi) {
      const Projection& p = projs[pi];
      const std::string name(mla_module_name(p.tensor));
      const bool is_o = p.tensor == MlaTensor::o_proj;
      const HostFp8Weight* stored = std::get_if<HostFp8Weight>(p.weight);
      const HostBf16Weight w = to_bf16(*p.weight);  // the bf16 path's weight (dequantize=True for FP8)
      Result r{layer, name, std::string(dtype_name(ck.info(mla_tensor_name(layer, p.tensor)).dtype)), "", w.n, w.k,
               false, p.tagged};
      r.stored_fp8 = stored != nullptr;
      if (stored)
        r.scale_dtype = std::string(dtype_name(ck.info(mla_tensor_name(layer, p.tensor) + "_scale_inv").dtype));
      r.bf16_bytes = static_cast<size_t>(w.n * w.k) * sizeof(bf16);
      r.eligible = fp8_eligible(w.n, w.k);
      if (!r.eligible) r.why_ineligible = fp8_block_shape_reason(w.n, w.k);
      r.fp8_bytes = r.stored_fp8 ? 0 : fp8_copy_bytes(w.n, w.k);  // a stored FP8 weight needs no copy
      // Activations: UE8M0 groups beside a private copy (the layer's path), fp32 amax/448 beside a
      // stored FP8 weight (the FP8-checkpoint path).
      const ScaleMode act_mode = r.stored_fp8 ? ScaleMode::fp32 : ScaleMode::ue8m0;
      if (w.k % 128 == 0) {  // the 1x128 activation groups need K % 128 == 0; any N quantizes
        HostFp8Weight q;
        std::vector<float> wf;
        if (stored) {
          q = *stored;
          wf = cpu::dequantize(q.view());
        } else {
          q = make_host_fp8_weight(w.n, w.k);
          cpu::quantize_weight(w.values.data(), w.n, w.k, q.out(), a.weight_scales);
          wf = cpu::to_float(w.values.data(), w.n * w.k);
          const std::vector<float> wq = cpu::dequantize(q.view());
          r.weight_err = rel_frobenius(wq.data(), wf.data(), wf.size());
        }
        {
          const std::vector<float> wq = stored ? wf : cpu::dequantize(q.view());
          double ss = 0;
          for (float v : wq) ss += double(v) * v;
          r.gemm_weight_norm = std::sqrt(ss);
        }

        r.act_scale = is_o ? v_rms : 1.0f;
        const std::vector<bf16> none;
        const std::vector<float> x = rounded(normal_activations(
            a.m, w.k, a.seed + 17 * layer + pi, p.gamma ? *p.gamma : none, r.act_scale));
        HostFp8Activation qx = make_host_fp8_activation(a.m, w.k);
        cpu::quantize_activation(x.data(), a.m, w.k, qx.out(), act_mode);
        const std::vector<float> xq = cpu::dequantize(qx.view());
        r.act_err = rel_frobenius(xq.data(), x.data(), x.size());
        r.gemm = gemm_errors(w.values, q, wf, x, a.m, act_mode);
      }
      for (const GemmRow& g : r.gemm)
        if (!g.pass) ++failures;

      const std::string w_err = r.weight_err ? fmt::format("{:.3e}", *r.weight_err) : "-";
      const std::string x_err = r.act_err ? fmt::format("{:.3e}", *r.act_err) : "-";
      const std::string copy = !r.eligible ? "-" : r.stored_fp8 ? "as stored" : human_bytes(double(r.fp8_bytes));
      const std::string head = fmt::format("{:>5} {:<19} {:>6} {:>6} {:<7} {:<9} {:<6} {:>10} {:>9} {:>9} {:>8.3g}",
                                           layer, name, w.n, w.k, r.dtype, r.eligible ? "yes" : "no",
                                           r.tagged ? "yes" : "no", copy, w_err, x_err, r.act_scale);
      if (r.gemm.empty()) {
        fmt::print("{}  {}\n", head,
                   r.eligible ? "no FP8 backend here" : "not eligible (" + r.why_ineligible + ")");
      } else {
        for (size_t gi = 0; gi < r.gemm.size(); ++gi) {
          const GemmRow& g = r.gemm[gi];
          fmt::print("{}  {:<14} {:>10.3e} {:>10.3e} {:>9.3e}{}\n", gi == 0 ? head : std::string(head.size(), ' '),
                     g.backend, g.fp8_vs_exact, g.fp8_vs_dequant, g.bf16_vs_exact, g.pass ? "" : "  FAIL");
        }
        if (!r.eligible)
          fmt::print("{:>5} {:<19} not eligible for fp8proj's FP8 GEMMs ({}); errors shown for reference\n", "",
                     "", r.why_ineligible);
      }
      results.push_back(std::move(r));
    }
  }

  // Totals: the memory of the FP8 copies next to the bf16 weights of the attention projections.
  size_t bf16_all = 0, tagged_fp8 = 0, eligible_fp8 = 0;
  int n_tagged = 0, n_eligible = 0, n_all = 0, n_stored = 0;
  for (const Result& r : results) {
    bf16_all += r.bf16_bytes;
    ++n_all;
    n_stored += r.stored_fp8;
    if (r.eligible) {
      eligible_fp8 += r.fp8_bytes;
      ++n_eligible;
      if (r.tagged) {
        tagged_fp8 += r.fp8_bytes;
        ++n_tagged;
      }
    }
  }
  fmt::print("\n{} layer{}: {} attention projections, {} eligible, {} tagged and eligible\n", layers.size(),
             layers.size() == 1 ? "" : "s", n_all, n_eligible, n_tagged);
  fmt::print("bf16 attention projection weights {}; FP8 copies of the tagged ones add {} ({:.1f}% of that); "
             "of every eligible one {} ({:.1f}%)\n",
             human_bytes(double(bf16_all)), human_bytes(double(tagged_fp8)),
             bf16_all ? 100.0 * double(tagged_fp8) / double(bf16_all) : 0.0, human_bytes(double(eligible_fp8)),
             bf16_all ? 100.0 * double(eligible_fp8) / double(bf16_all) : 0.0);
  fmt::print("W error: ||dequant(quant(W)) - W|| / ||W||; x error: the same for the random activations; FP8 GEMM: "
             "against the fp64 product of the bf16 operands; vs dequant: against the fp64 product of the "
             "dequantized operands (tolerance {:.1e}); bf16 GEMM: the bf16 path's own error (the floor)\n",
             kFp8GemmRelTol);
  if (n_stored > 0)
    fmt::print("{} projection{} stored as FP8 (e4m3 + weight_scale_inv): used as stored, no copy and no "
               "re-quantization (no W error), activations quantized with fp32 amax/448 scales as fp8proj runs FP8 "
               "checkpoints; their 'vs dequant' column is the kernel's error alone, their 'FP8 GEMM' column the "
               "activation quantization's alone (against the dequantized weight), 'bf16 GEMM' the bf16 path on the "
               "dequantized weight (dequantize=True)\n",
               n_stored, n_stored == 1 ? "" : "s");

  if (!a.json.empty() || !a.csv.empty()) {
    json rows = json::array();
    std::ostringstream csv;
    csv << "layer,projection,n,k,dtype,eligible,tagged,fp8_copy_bytes,weight_rel_err,act_rel_err,act_scale,backend,"
           "fp8_gemm_rel_err,fp8_vs_dequant_rel_err,bf16_gemm_rel_err,weight_source\n";
    for (const Result& r : results) {
      json jr = {{"layer", r.layer}, {"projection", r.proj}, {"n", r.n}, {"k", r.k}, {"dtype", r.dtype},
                 {"eligible", r.eligible}, {"tagged", r.tagged}, {"fp8_copy_bytes", r.fp8_bytes},
                 {"bf16_bytes", r.bf16_bytes}, {"act_scale", r.act_scale},
                 {"weight_source", r.stored_fp8 ? "fp8_checkpoint" : "bf16_quantized"},
                 {"weight_scales", r.stored_fp8 ? "stored " + r.scale_dtype : scale_mode_name(a.weight_scales)},
                 {"activation_scales", scale_mode_name(r.stored_fp8 ? ScaleMode::fp32 : ScaleMode::ue8m0)},
                 {"gemm_weight_norm", r.gemm_weight_norm}};
      if (r.weight_err) jr["weight_rel_err"] = *r.weight_err;
      if (r.act_err) jr["act_rel_err"] = *r.act_err;
      if (!r.eligible) jr["why_ineligible"] = r.why_ineligible;
      json g = json::array();
      for (const GemmRow& x : r.gemm)
        g.push_back({{"backend", x.backend}, {"fp8_gemm_rel_err", x.fp8_vs_exact},
                     {"fp8_vs_dequant_rel_err", x.fp8_vs_dequant}, {"bf16_gemm_rel_err", x.bf16_vs_exact},
                     {"pass", x.pass}});
      jr["gemm"] = g;
      rows.push_back(jr);
      const std::string base = fmt::format("{},{},{},{},{},{},{},{},{},{},{}", r.layer, r.proj, r.n, r.k, r.dtype,
                                           r.eligible ? 1 : 0, r.tagged ? 1 : 0, r.fp8_bytes,
                                           r.weight_err ? fmt::format("{:.6e}", *r.weight_err) : "",
                                           r.act_err ? fmt::format("{:.6e}", *r.act_err) : "", r.act_scale);
      const char* source = r.stored_fp8 ? "fp8_checkpoint" : "bf16_quantized";
      if (r.gemm.empty()) csv << base << ",,,,," << source << "\n";
      for (const GemmRow& x : r.gemm)
        csv << base << fmt::format(",{},{:.6e},{:.6e},{:.6e},{}\n", x.backend, x.fp8_vs_exact, x.fp8_vs_dequant,
                                   x.bf16_vs_exact, source);
    }
    if (!a.json.empty()) {
      json j = {{"stamp", result_stamp()}, {"checkpoint", a.checkpoint}, {"m", a.m}, {"seed", a.seed},
                {"weight_scales", scale_mode_name(a.weight_scales)},
                {"dims", {{"hidden", d.hidden}, {"heads", d.heads}, {"q_lora_rank", d.q_lora_rank},
                          {"kv_lora_rank", d.kv_lora_rank}, {"qk_nope", d.qk_nope}, {"qk_rope", d.qk_rope},
                          {"v_head", d.v_head}, {"layers", cfg.layers}}},
                {"totals", {{"bf16_bytes", bf16_all}, {"tagged_fp8_bytes", tagged_fp8},
                            {"eligible_fp8_bytes", eligible_fp8}}},
                {"rows", rows}};
      write_text(a.json, j.dump(2) + "\n");
    }
    if (!a.csv.empty()) write_text(a.csv, csv.str());
  }
  fmt::print("\n{}\n", failures == 0 ? "verify --checkpoint: every FP8 GEMM meets the numerics contract"
                                     : fmt::format("verify --checkpoint: {} FP8 GEMM(s) FAILED", failures));
  if (failures) throw Error("verify --checkpoint failed");
}

}  // namespace fp8proj::cli

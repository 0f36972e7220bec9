// fp8proj verify: every available backend against the fp64 oracle, on random data with the
// output poisoned (0xff bytes = NaN) before each run, so unwritten elements fail. Also:
// device quantizers bit-exact with the CPU ones, and NaN rows staying NaN. With --checkpoint:
// the same backends on a model's own weights (verify_checkpoint.cpp).
#include <cmath>
#include <cstring>
#include <sstream>

#include <fmt/format.h>

#include "commands.hpp"
#include "common.hpp"
#include "fp8proj/error.hpp"
#include "fp8proj/gemm.hpp"
#include "fp8proj/ops.hpp"
#include "fp8proj/quantize.hpp"
#include "fp8proj/random.hpp"
#include "fp8proj/reference.hpp"
#include "verify_checkpoint.hpp"

namespace fp8proj::cli {

namespace {

struct Case {
  int64_t m, n, k;
};

struct VerifyArgs {
  std::vector<std::string> cases;
  uint64_t seed = 7;
  std::vector<ScaleMode> weight_scales = {ScaleMode::ue8m0};
};

struct Row {
  std::string backend, what;
  Case c;
  double err;
  double tol;
  int64_t bad;
  bool pass;
};

int failures = 0;

void print_row(const Row& r) {
  fmt::print("  {:<20} {:<30} {:>6} {:>6} {:>6}  {:>10.3e} {:>9.1e} {:>8}  {}\n", r.backend, r.what, r.c.m, r.c.n,
             r.c.k, r.err, r.tol, r.bad, r.pass ? "PASS" : "FAIL");
  if (!r.pass) ++failures;
}

// One problem through every backend; the FP8 ones on a weight quantized with `mode`'s scales (the
// bf16 ones run once, with the first mode).
void verify_case(const Case& c, uint64_t seed, ScaleMode mode, bool with_bf16) {
  // Host data: activations N(0, 1), weights N(0, 0.02^2) as in a trained projection.
  std::vector<bf16> x(c.m * c.k), w(c.n * c.k);
  fill_normal(MemorySpace::host, x.data(), c.m * c.k, seed, 1.0f);
  fill_normal(MemorySpace::host, w.data(), c.n * c.k, seed + 1, 0.02f);
  HostFp8Activation qx = make_host_fp8_activation(c.m, c.k);
  HostFp8Weight qw = make_host_fp8_weight(c.n, c.k);
  cpu::quantize_activation(x.data(), c.m, c.k, qx.out());
  cpu::quantize_weight(w.data(), c.n, c.k, qw.out(), mode);
  const std::string tag = fmt::format("fp8[w {}]", scale_mode_name(mode));
  const std::vector<float> xf = cpu::to_float(x.data(), c.m * c.k), wf = cpu::to_float(w.data(), c.n * c.k);
  const std::vector<float> xq = cpu::dequantize(qx.view()), wq = cpu::dequantize(qw.view());
  const std::vector<double> ref_bf16 = cpu::gemm_f64(xf.data(), wf.data(), c.m, c.n, c.k);
  const std::vector<double> ref_q = cpu::gemm_f64(xq.data(), wq.data(), c.m, c.n, c.k);
  const size_t out_count = static_cast<size_t>(c.m * c.n);

  for (const GemmBackend* be : available_backends()) {
    if (!be->unsupported_reason(c.n, c.k).empty()) continue;
    const MemorySpace sp = be->space();
    Buffer y(sp, out_count * sizeof(bf16));
    fill_bytes(sp, y.data(), y.bytes(), 0xff);
    GemmPlanOptions po;
    po.max_m = c.m;
    if (be->kind() == GemmKind::bf16) {
      if (!with_bf16) continue;
      Buffer dx = to_space(sp, x.data(), x.size()), dw = to_space(sp, w.data(), w.size());
      auto plan = be->plan_bf16(dw.data<bf16>(), c.n, c.k, po);
      plan->run(dx.data<bf16>(), c.m, y.data<bf16>(), nullptr);
      const auto out = to_host<bf16>(y, out_count);
      const ErrorStats e = compare(out.data(), ref_bf16.data(), out_count);
      print_row({std::string(be->name()), "bf16 vs fp64(bf16 operands)", c, e.rel_frobenius, kBf16GemmRelTol,
                 e.non_finite, e.rel_frobenius <= kBf16GemmRelTol && e.non_finite == 0});
    } else {
      Buffer dxv = to_space(sp, qx.values.data(), qx.values.size());
      Buffer dxs = to_space(sp, qx.scales.data(), qx.scales.size());
      Buffer dwv = to_space(sp, qw.values.data(), qw.values.size());
      Buffer dws = to_space(sp, qw.scales.data(), qw.scales.size());
      auto plan = be->plan_fp8({dwv.data<uint8_t>(), dws.data<float>(), c.n, c.k}, po);
      plan->run({dxv.data<uint8_t>(), dxs.data<float>(), c.m, c.k, qx.scale_ld}, y.data<bf16>(), nullptr);
      const auto out = to_host<bf16>(y, out_count);
      const ErrorStats e = compare(out.data(), ref_q.data(), out_count);
      print_row({std::string(be->name()), tag + " vs fp64(dequant)", c, e.rel_frobenius, kFp8GemmRelTol,
                 e.non_finite, e.rel_frobenius <= kFp8GemmRelTol && e.non_finite == 0});
      // The quantization's own error, reported rather than judged (about 3.7% on Gaussian data).
      const ErrorStats q = compare(out.data(), ref_bf16.data(), out_count);
      fmt::print("  {:<20} {:<30} {:>6} {:>6} {:>6}  {:>10.3e}  (quantization error vs bf16 GEMM, reported)\n",
                 be->name(), tag + " vs fp64(bf16)", c.m, c.n, c.k, q.rel_frobenius);
    }
  }
}

void verify_device_quantizers(uint64_t seed, const std::vector<ScaleMode>& modes) {
  if (!gpu_available()) {
    fmt::print("  device quantizers: skipped (no GPU: {})\n", current_device().why_absent);
    return;
  }
  const QuantOps& dev = quant_ops(MemorySpace::device);
  const int64_t m = 333, k = 2048, n = 300;
  std::vector<bf16> x(m * k), w(n * k), g(k);
  fill_normal(MemorySpace::host, x.data(), m * k, seed + 10, 3.0f);
  fill_normal(MemorySpace::host, w.data(), n * k, seed + 11, 0.02f);
  fill_normal(MemorySpace::host, g.data(), k, seed + 12, 1.0f);
  x[5 * k + 17] = float_to_bf16(NAN);  // a NaN row must quantize to a NaN group
  Buffer dx = to_space(MemorySpace::device, x.data(), x.size());
  Buffer dw = to_space(MemorySpace::device, w.data(), w.size());
  Buffer dg = to_space(MemorySpace::device, g.data(), g.size());

  auto check = [&](const char* what, bool same) {
    print_row({"device quant ops", what, {m, n, k}, same ? 0.0 : 1.0, 0.0, same ? 0 : 1, same});
  };
  {
    HostFp8Activation ref = make_host_fp8_activation(m, k);
    cpu::quantize_activation(x.data(), m, k, ref.out());
    Buffer v(MemorySpace::device, ref.values.size()), s(MemorySpace::device, ref.scales.size() * 4);
    dev.quantize_activation(dx.data<bf16>(), m, k, {v.data<uint8_t>(), s.data<float>(), m, k, ref.scale_ld}, nullptr);
    dev.synchronize(nullptr);
    const auto hv = to_host<uint8_t>(v, ref.values.size());
    const auto hs = to_host<float>(s, ref.scales.size());
    bool same = hv == ref.values;
    for (int64_t gi = 0; gi < k / 128; ++gi)
      for (int64_t r = 0; r < m; ++r) {
        const float a = hs[gi * ref.scale_ld + r], b = ref.scales[gi * ref.scale_ld + r];
        same = same && (std::memcmp(&a, &b, 4) == 0 || (std::isnan(a) && std::isnan(b)));
      }
    check("activation quant == CPU (bits)", same);
  }
  {
    HostFp8Activation ref = make_host_fp8_activation(m, k);
    cpu::rmsnorm_quantize(x.data(), k, g.data(), kRmsNormEps, m, k, ref.out());
    Buffer v(MemorySpace::device, ref.values.size()), s(MemorySpace::device, ref.scales.size() * 4);
    dev.rmsnorm_quantize(dx.data<bf16>(), k, dg.data<bf16>(), kRmsNormEps, m, k,
                         {v.data<uint8_t>(), s.data<float>(), m, k, ref.scale_ld}, nullptr);
    dev.synchronize(nullptr);
    check("rmsnorm+quant == CPU (bits)", to_host<uint8_t>(v, ref.values.size()) == ref.values);
  }
  for (const ScaleMode mode : modes) {
    HostFp8Weight ref = make_host_fp8_weight(n, k);
    cpu::quantize_weight(w.data(), n, k, ref.out(), mode);
    Buffer v(MemorySpace::device, ref.values.size()), s(MemorySpace::device, ref.scales.size() * 4);
    dev.quantize_weight(dw.data<bf16>(), n, k, {v.data<uint8_t>(), s.data<float>(), n, k}, mode, nullptr);
    dev.synchronize(nullptr);
    check(mode == ScaleMode::ue8m0 ? "weight quant == CPU (bits)" : "weight quant [float] == CPU",
          to_host<uint8_t>(v, ref.values.size()) == ref.values && to_host<float>(s, ref.scales.size()) == ref.scales);
  }
}

// "MxNxK" -> a case every backend verify runs can take: M, N, K in [1, 2^16]; N and K under the
// block-scaled FP8 rule (fp8_block_shape_reason, gemm.hpp), since every case is quantized; M x N x K
// and each of M x N, N x K, M x K bounded (the fp64 oracle runs on the host: at the bounds two
// GEMMs of 2^36 multiply-adds and 2^28 doubles each).
Case parse_case(const std::string& s) {
  const size_t x1 = s.find('x'), x2 = x1 == std::string::npos ? x1 : s.find('x', x1 + 1);
  FP8PROJ_CHECK(x2 != std::string::npos, "--case ", quote_excerpt(s), " must look like MxNxK, e.g. 300x2048x1536");
  const int64_t m = parse_int(s.substr(0, x1), "--case M", 1, kMaxVerifyDim);
  const int64_t n = parse_int(s.substr(x1 + 1, x2 - x1 - 1), "--case N", 1, kMaxVerifyDim);
  const int64_t k = parse_int(s.substr(x2 + 1), "--case K", 1, kMaxVerifyDim);
  const std::string why = fp8_block_shape_reason(n, k);
  FP8PROJ_CHECK(why.empty(), "--case ", s, ": ", why, "; verify quantizes every case for the FP8 backends");
  FP8PROJ_CHECK(m * n * k <= kMaxVerifyWork && m * n <= kMaxVerifyElements && n * k <= kMaxVerifyElements &&
                    m * k <= kMaxVerifyElements,
                "--case ", s, " is too large for the host's fp64 oracle: M x N x K must be at most 2^36 (it is ",
                m * n * k, ") and M x N, N x K, M x K at most 2^28 each");
  return {m, n, k};
}

void run_verify(const VerifyArgs& a) {
  // The cases are checked before anything prints: one the kernels cannot take fails here, not
  // in the middle of the table.
  std::vector<Case> cases = {{1, 256, 384}, {17, 384, 256}, {64, 1024, 512}, {300, 2048, 1536}, {129, 6144, 2048}};
  if (!a.cases.empty()) {
    cases.clear();
    for (const std::string& s : list_entries(a.cases, "--case")) cases.push_back(parse_case(s));
  }
  fmt::print("{}\n", space_banner(choose_space(false)));
  fmt::print("\n  {:<20} {:<30} {:>6} {:>6} {:>6}  {:>10} {:>9} {:>8}\n", "backend", "check", "M", "N", "K",
             "rel error", "tolerance", "bad", "");
  for (const Case& c : cases)
    for (size_t i = 0; i < a.weight_scales.size(); ++i) verify_case(c, a.seed, a.weight_scales[i], i == 0);
  verify_device_quantizers(a.seed, a.weight_scales);
  fmt::print("\n{}\n", failures == 0 ? "verify: all checks meet the numerics contract"
                                     : fmt::format("verify: {} check(s) FAILED", failures));
  if (failures) throw Error("verify failed");
}

}  // namespace

void register_verify(CLI::App& app) {
  auto args = std::make_shared<VerifyArgs>();
  auto ck = std::make_shared<VerifyCheckpointArgs>();
  auto* cmd = app.add_subcommand("verify", "Numerics of every available backend against the fp64 oracle");
  auto* case_opt = cmd->add_option("--case", args->cases,
                                   "MxNxK problem(s) instead of the default set, e.g. 300x2048x1536,1x256x384; N a "
                                   "multiple of 16, K of 128");
  cmd->add_option("--seed", args->seed, "Random seed, 0 .. 2^63-1")
      ->transform(int_in(0, kMaxCliSeed))
      ->capture_default_str();
  auto* checkpoint = cmd->add_option("--checkpoint", ck->checkpoint,
                                     "Hugging Face MLA checkpoint (directory with config.json): per layer, "
                                     "eligibility, tagging, FP8 copy memory, weight and GEMM error")
                         ->excludes(case_opt);
  cmd->add_option("--layers", ck->layers, "With --checkpoint: 'all' or a list such as 0,3,7")
      ->capture_default_str()
      ->needs(checkpoint);
  cmd->add_option("--m", ck->m, "With --checkpoint: activation rows of the GEMM check")
      ->transform(int_in(1, kMaxVerifyDim))
      ->capture_default_str()
      ->needs(checkpoint);
  cmd->add_option("--json", ck->json, "With --checkpoint: write the results as JSON")->needs(checkpoint);
  cmd->add_option("--csv", ck->csv, "With --checkpoint: write the results as CSV")->needs(checkpoint);
  auto scales = std::make_shared<std::string>("ue8m0");
  cmd->add_option("--weight-scales", *scales,
                  "Scale format(s) of the FP8 weight made from bf16: ue8m0, float, or ue8m0,float (with "
                  "--checkpoint one of them; an FP8 checkpoint's own scales are used as stored)")
      ->capture_default_str();
  cmd->callback([args, ck, scales] {
    args->weight_scales = parse_scale_modes(*scales, "--weight-scales");
    FP8PROJ_CHECK(ck->checkpoint.empty() || args->weight_scales.size() == 1,
                  "--weight-scales with --checkpoint takes one format, got '", *scales, "'");
    ck->weight_scales = args->weight_scales.front();
    if (ck->checkpoint.empty()) {
      run_verify(*args);
      return;
    }
    ck->seed = args->seed;
    run_verify_checkpoint(*ck);
  });
}

}  // namespace fp8proj::cli

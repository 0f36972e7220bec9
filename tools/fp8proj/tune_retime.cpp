// Re-timing a tuned row with its own configurations: bf16, FP8 quantize + GEMM and the FP8 GEMM
// alone per bucket, in the same interleaved rounds (tune_retime.hpp).
#include "tune_retime.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>

#include "common.hpp"
#include "fp8proj/error.hpp"
#include "fp8proj/ops.hpp"
#include "fp8proj/projection.hpp"
#include "fp8proj/tuner.hpp"

namespace fp8proj::cli {

std::unique_ptr<ProjectionLayer> forced_fp8_layer(MemorySpace space, const bf16* weight, int64_t n, int64_t k,
                                                  ProjectionOptions o, const std::string& backend,
                                                  const std::string& config, int64_t rows_cap) {
  o.fp8 = true;
  o.threshold = 0;
  o.decode_ceiling = 0;
  o.fp8_backend = backend;
  TunedShape one;
  one.n = n;
  one.k = k;
  one.threshold = 0;
  one.buckets = {{1, rows_cap, backend, config, 1.0, 1.0, HeuristicConfig{}}};  // names parsed by the layer
  o.tuned = one;
  auto layer = std::make_unique<ProjectionLayer>(space, weight, n, k, o);
  FP8PROJ_CHECK(layer->has_fp8_copy(), o.name, ": no FP8 path (", layer->explain(1).reason, ")");
  return layer;
}

TunedShape retime_row(MemorySpace space, const TunedShape& row, int64_t max_m, const TimingOptions& topt,
                      const std::string& label) {
  int64_t rows_cap = 0;
  for (const TunedBucket& b : row.buckets)
    if (max_m <= 0 || b.m_hi <= max_m) rows_cap = std::max(rows_cap, b.m_hi);
  TunedShape out = row;
  if (rows_cap == 0) return out;
  rows_cap = (rows_cap + 3) / 4 * 4;
  const Tensor w = random_bf16(space, row.n, row.k, 11, 0.02f);
  const Tensor x = random_bf16(space, rows_cap, row.k, 12, 1.0f);
  const Tensor y = random_bf16(space, rows_cap, row.n, 13, 1.0f);
  // The layers' own quantization writes into `ws`; the GEMM-alone calls read `pre`, quantized once.
  auto ws = std::make_shared<ActivationWorkspace>(space, rows_cap, (row.k + 127) / 128 * 128, false);
  const ActivationWorkspace pre(space, rows_cap, (row.k + 127) / 128 * 128, false);
  ProjectionOptions base;
  base.max_tokens = rows_cap;
  base.workspace = ws;
  base.use_tune_table = false;  // the bucket's configuration, forced below
  base.apply_env = false;       // FP8PROJ_* must not change what is measured
  ProjectionOptions bo = base;
  bo.name = label + " bf16";
  ProjectionLayer bf16_layer(space, w.data(), row.n, row.k, bo);

  // One layer per (backend, configuration): FP8 at every M with exactly that configuration.
  std::map<std::pair<std::string, std::string>, std::unique_ptr<ProjectionLayer>> fp8_layers;
  auto fp8_layer = [&](const TunedBucket& b) -> ProjectionLayer& {
    const auto key = std::make_pair(b.fp8_backend, b.fp8_config);
    if (auto it = fp8_layers.find(key); it != fp8_layers.end()) return *it->second;
    ProjectionOptions o = base;
    o.name = label + " " + b.fp8_backend + (b.fp8_config.empty() ? " (heuristic)" : " " + b.fp8_config);
    return *(fp8_layers[key] = forced_fp8_layer(space, w.data(), row.n, row.k, o, b.fp8_backend, b.fp8_config, rows_cap));
  };

  for (TunedBucket& b : out.buckets) {
    if (max_m > 0 && b.m_hi > max_m) continue;
    ProjectionLayer& f = fp8_layer(b);
    std::vector<double> t_bf16, t_fp8, t_gemm;
    for (int64_t m : tune::sample_points({b.m_lo, b.m_hi})) {
      quant_ops(space).quantize_activation(x.data(), m, row.k, pre.fp8(m, row.k), nullptr);
      quant_ops(space).synchronize(nullptr);
      const Fp8ActivationView qv = pre.fp8(m, row.k).view();
      using Fn = std::function<void(StreamHandle)>;
      const std::vector<Fn> fns = {[&](StreamHandle st) { bf16_layer.forward(x.data(), m, y.data(), st); },
                                   [&](StreamHandle st) { f.forward(x.data(), m, y.data(), st); },
                                   [&](StreamHandle st) { f.forward_quantized(qv, y.data(), st); }};
      const std::string at = fmt::format(" M={}", m);
      const std::vector<double> t =
          time_interleaved(space, fns, topt, {bf16_layer.name() + at, f.name() + at, f.name() + " (GEMM alone)" + at});
      FP8PROJ_CHECK(t[0] > 0 && t[1] > 0 && t[2] > 0, label, " M=", m, ": a call was not timed");
      t_bf16.push_back(t[0]);
      t_fp8.push_back(t[1]);
      t_gemm.push_back(t[2]);
    }
    b.bf16_us = tune::gmean(t_bf16);
    b.fp8_us = tune::gmean(t_fp8);
    b.fp8_gemm_us = tune::gmean(t_gemm);
  }
  return out;
}

void run_retime(const RetimeArgs& a) {
  const MemorySpace space = choose_space(false);
  FP8PROJ_CHECK(space == MemorySpace::device,
                "tune --retime measures the GPU the table is for; without one there is nothing to measure "
                "(a CPU time says nothing about a GPU's)");
  check_outputs({{"--out", a.out}, {"--md", a.md}}, {{"--retime", a.table}});
  const TuneTable table = load_tune_table(a.table);
  const std::string why = stamp_mismatch(table.stamp, current_device());
  FP8PROJ_CHECK(why.empty() || a.force, "tuned table '", a.table, "' does not match this GPU: ", why,
                " (--force re-times it anyway)");
  TimingOptions topt;
  topt.warmup = a.warmup >= 0 ? a.warmup : 3;
  topt.reps = a.reps > 0 ? a.reps : 30;
  topt.flush_l2 = !a.no_flush;
  fmt::print("fp8proj tune --retime {} -- {}\n", a.table, space_banner(space));
  fmt::print("buckets with M <= {}: bf16, FP8 quantize + GEMM and the FP8 GEMM alone with each bucket's own "
             "configuration, interleaved call by call, median of {} after {} warm-up, L2 {}\n",
             a.max_m > 0 ? std::to_string(a.max_m) : std::string("any"), topt.reps, topt.warmup,
             topt.flush_l2 ? "flushed before every timed call" : "not flushed");
  std::fflush(stdout);

  TuneTable out = table;
  const TuneStamp now = current_stamp();
  out.stamp.fp8proj_version = table.stamp.fp8proj_version + "; re-timed" +
                              (a.max_m > 0 ? " M <= " + std::to_string(a.max_m) : std::string()) + " by " +
                              now.fp8proj_version;
  std::string md =
      "| shape | M | configuration | bf16 us | FP8 us (was) | GEMM alone us | verdict from bf16 rows (was) | "
      "verdict behind a fused producer |\n|---|---|---|---|---|---|---|---|\n";
  int changed = 0, gemm_flips = 0, timed = 0;
  for (TunedShape& s : out.shapes) {
    const std::string label = fmt::format("{}x{}", s.n, s.k);
    const TunedShape old = s;
    s = retime_row(space, s, a.max_m, topt, label);
    for (size_t i = 0; i < s.buckets.size(); ++i) {
      const TunedBucket &b = s.buckets[i], &ob = old.buckets[i];
      if (a.max_m > 0 && b.m_hi > a.max_m) continue;
      ++timed;
      const char* v = b.fp8_wins() ? "FP8" : "bf16";
      const char* ov = ob.fp8_wins() ? "FP8" : "bf16";
      const char* gv = b.fp8_gemm_wins() ? "FP8" : "bf16";
      changed += b.fp8_wins() != ob.fp8_wins();
      gemm_flips += b.fp8_gemm_wins() != b.fp8_wins();
      const std::string cfg = b.fp8_backend + (b.fp8_config.empty() ? " (heuristic)" : " " + b.fp8_config);
      fmt::print("  {:>11} [{:>5}, {:>5}] {:<44} bf16 {:7.2f}  fp8 {:7.2f} (was {:7.2f})  gemm {:7.2f}  {} (was {}), "
                 "fused producer {}\n",
                 label, b.m_lo, b.m_hi, cfg, b.bf16_us, b.fp8_us, ob.fp8_us, b.fp8_gemm_us, v, ov, gv);
      md += fmt::format("| {} | {}-{} | {} | {:.2f} | {:.2f} ({:.2f}) | {:.2f} | {} ({}) | {} |\n", label, b.m_lo,
                        b.m_hi, cfg, b.bf16_us, b.fp8_us, ob.fp8_us, b.fp8_gemm_us, v, ov, gv);
    }
    save_tune_table(out, a.out);  // after every shape: an interrupted run keeps what it measured
    std::fflush(stdout);
  }
  fmt::print("re-timed {} buckets: {} verdicts from bf16 rows changed; behind a fused producer (the GEMM alone) "
             "{} buckets take the other path than from bf16 rows\nwrote {}\n",
             timed, changed, gemm_flips, a.out);
  if (!a.md.empty()) write_text(a.md, md);
}

}  // namespace fp8proj::cli

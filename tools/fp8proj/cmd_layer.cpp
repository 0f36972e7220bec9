// fp8proj layer: the feature where it lives -- a whole MLA attention block (include/fp8proj/mla.hpp)
// with the FP8 flag off and on.
//   prefill: C sequences x L tokens (C = 4 .. 64, L = 1024 as in the reference design's serving
//     tables): block time off / on and the speedup, the share of q_b_proj + o_proj in each (from
//     per-stage events inside the block), the activation quantization passes timed on their own
//     (o_proj's input through quantize_activation, q_a through the fused norm+quantize, against
//     the plain norm the bf16 path runs) and their share of the FP8 block, attention TFLOP/s;
//   decode: one step for C sequences at context L, captured in a CUDA graph and replayed, off
//     and on (under the prefill policy the flag must not change it), beside its byte floor: the
//     weights it reads (each projection's FP8 copy where it runs FP8, else bf16; kv_b_proj's
//     absorbed halves in bf16) plus the latent cache rows, at this GPU's measured read bandwidth.
//     --decode-layers N also times N layers' steps back to back in one graph (own weights and
//     caches each, no L2 flush): the L2 each step meets is the one the layer before left, as in
//     a model, where the flush's dirty lines are not (see docs/decode.md).
// TP sizes run the per-rank work of rank 0 on one GPU (heads / tp local heads; o_proj's
// partial output, no all-reduce). Timed as timing.hpp says: device events, L2 flushed before
// every timed call, median of many, flag off and on interleaved call by call. Without a GPU it runs the CPU reference at a tiny size
// (DeepSeek-V2-Lite, one sequence of 64 tokens) and says so.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>

#include "commands.hpp"
#include "common.hpp"
#include "fp8proj/error.hpp"
#include "fp8proj/floor.hpp"
#include "fp8proj/mla.hpp"
#include "fp8proj/ops.hpp"
#include "fp8proj/projection.hpp"
#include "fp8proj/quantize.hpp"
#include "fp8proj/reference.hpp"
#include "fp8proj/timing.hpp"
#include "fp8proj/tune.hpp"

namespace fp8proj::cli {

namespace {

struct LayerArgs {
  std::string model;
  std::string tp;
  std::string seqs;
  int seqlen = 0;
  std::string policy = "prefill";
  bool all_dense = false;  // also fused_qkv_a and kv_b_proj on the gated FP8 path
  bool residual = false;   // prefill and decode from the residual stream: input RMSNorm inside fused_qkv_a's input pass
  int reps = 0;
  bool no_flush = false;
  bool no_decode = false;
  bool no_prefill = false;
  bool fuse_attention_quant = false;
  bool cpu = false;
  std::string weight_scales = "ue8m0";  // the flag-on blocks' FP8 copies: one block per format
  std::string decode_quant = "fused";   // o_proj's decode input: absorb_v's epilogue and/or the separate pass
  int decode_layers = 1;                // > 1: the decode step also over this many layers back to back
  std::string csv, json, md;
};

struct PrefillRow {
  std::string model;
  int tp = 1, seqs = 0, seqlen = 0;
  int64_t tokens = 0;
  double off_us = 0, on_us = 0;
  MlaStageTimes off_stages, on_stages;
  double o_quant_us = 0, qa_normquant_us = 0, qa_norm_us = 0;
  double attn_tflops = 0;
  std::string q_path, o_path, fp8_backend;
  std::string qkv_path, kv_b_path;
  ScaleMode weight_scales = ScaleMode::ue8m0;  // of the flag-on block's FP8 copies
  bool fused_decode_quant = true;              // MlaOptions::fuse_decode_quant of the flag-on block
  int variant = 0;                             // which flag-on block (0: the first)
};

struct DecodeRow {
  std::string model;
  int tp = 1, seqs = 0, context = 0;
  double off_us = 0, on_us = 0;
  std::string q_path, o_path, qkv_path;
  std::string why_bf16;  // under policy all: the gate's reason for each decode projection left in bf16
  bool graph = false;
  double rel_err = 0;        // flag-on step's output against the flag-off (bf16) step's
  bool bit_identical = false;
  ScaleMode weight_scales = ScaleMode::ue8m0;
  bool fused_decode_quant = true;
  int variant = 0;
  // Bytes the step must read: weights flag off / on, and the cache rows; floors at the measured
  // read bandwidth (0 on the CPU reference).
  size_t weight_bytes_off = 0, weight_bytes_on = 0, cache_bytes = 0;
  double floor_off_us = 0, floor_on_us = 0, weight_floor_on_us = 0;
  // Where the step's time goes: the same step eager, an event at every stage boundary (the sum
  // includes the launch gaps that graph replay hides).
  MlaStageTimes off_stages, on_stages;
  // --decode-layers N > 1: per-layer time of N layers' steps back to back (one graph replay / N;
  // eager on the CPU), no L2 flush; 0 where not run.
  int layers = 1;
  double layers_off_us = 0, layers_on_us = 0;
};

// Weight bytes one decode step of `block` reads at batch c: fused_qkv_a, q_b_proj and o_proj from
// the copy their path reads (FP8 values + scales, else bf16), kv_b_proj's bf16 halves absorbed
// into the attention (W_UK, W_UV: its whole bf16 weight).
size_t decode_weight_bytes(const MlaBlock& block, int64_t c) {
  size_t bytes = block.projection(MlaProjection::kv_b_proj).memory().bf16_weight;
  for (MlaProjection p : {MlaProjection::fused_qkv_a, MlaProjection::q_b_proj, MlaProjection::o_proj}) {
    const ProjectionMemory m = block.projection(p).memory();
    bytes += block.projection_path(p, c) == Path::fp8 ? m.fp8_values + m.fp8_scales : m.bf16_weight;
  }
  return bytes;
}

// An int32 array in a memory space.
Buffer int_array(MemorySpace space, const std::vector<int32_t>& v) {
  Buffer b(space, std::max<size_t>(v.size(), 1) * sizeof(int32_t));
  copy_bytes(b.data(), space, v.data(), MemorySpace::host, v.size() * sizeof(int32_t));
  return b;
}

// Causal attention over C sequences of L tokens: 2 x H x (L (L + 1) / 2) x (d_qk + d_v) flops.
double attention_flops(const MlaConfig& c, int seqs, int len) {
  return 2.0 * c.local_heads() * seqs * (double(len) * (len + 1) / 2) * (c.qk_head_dim() + c.v_head_dim);
}

// A flag-on block's name in the tables: its weight scale format, "+sep" where o_proj's decode
// input comes from the separate quantization pass instead of absorb_v's epilogue.
template <class Row>
std::string variant_label(const Row& r) {
  return std::string(scale_mode_name(r.weight_scales)) + (r.fused_decode_quant ? "" : "+sep");
}

// One line per C and flag (one flag-off line per C, one flag-on line per flag-on block) of the
// rows of this TP size: each shown stage's time and the total, times `unit` (us -> ms: 1e-3),
// with `decimals` places. Rows: PrefillRow or DecodeRow.
template <class Row>
void print_stage_table(const std::vector<Row>& rows, int tp, const std::vector<MlaStage>& shown, double unit,
                       int decimals) {
  std::string head = fmt::format("  {:>4} {:>10}", "C", "flag");
  for (MlaStage s : shown) head += fmt::format(" {:>10}", to_string(s));
  fmt::print("{} {:>10}\n", head, "total");
  for (const Row& r : rows) {
    if (r.tp != tp) continue;
    for (int on_flag = 0; on_flag < 2; ++on_flag) {
      if (!on_flag && r.variant != 0) continue;
      const MlaStageTimes& st = on_flag ? r.on_stages : r.off_stages;
      std::string line = fmt::format("  {:>4} {:>10}", r.seqs, on_flag ? "on " + variant_label(r) : "off");
      for (MlaStage s : shown) line += fmt::format(" {:>10.{}f}", st.of(s) * unit, decimals);
      fmt::print("{} {:>10.{}f}\n", line, st.total_us * unit, decimals);
    }
  }
}

// Per-stage times of several blocks, interleaved run by run (as time_interleaved does for whole
// calls): flag-off and flag-on stages see the same clock under the H200's power cap. Each stage
// is the median over options.reps runs of that block, the total likewise.
std::vector<MlaStageTimes> profile_stages_interleaved(
    MemorySpace space, const std::vector<std::function<void(StreamHandle, const MlaStageHook&)>>& runs,
    const TimingOptions& options) {
  TimingOptions one = options;
  one.reps = 1;
  std::vector<std::vector<MlaStageTimes>> samples(runs.size());
  for (int r = 0; r < std::max(1, options.reps); ++r) {
    one.warmup = r == 0 ? options.warmup : 0;
    for (size_t i = 0; i < runs.size(); ++i) samples[i].push_back(profile_stages(space, runs[i], one));
  }
  std::vector<MlaStageTimes> out(runs.size());
  for (size_t i = 0; i < runs.size(); ++i) {
    MlaStageTimes& o = out[i];
    o.stages = samples[i].front().stages;
    for (size_t k = 0; k < o.stages.size(); ++k) {
      std::vector<double> d;
      for (const MlaStageTimes& t : samples[i]) {
        FP8PROJ_CHECK(t.stages == o.stages, "layer: the timed runs of one block took different stages");
        d.push_back(t.us[k]);
      }
      o.us.push_back(summarize(std::move(d)).median_us);
    }
    std::vector<double> totals;
    for (const MlaStageTimes& t : samples[i]) totals.push_back(t.total_us);
    o.total_us = summarize(std::move(totals)).median_us;
  }
  return out;
}

std::string pct(double part, double whole) { return whole > 0 ? fmt::format("{:.1f}%", 100 * part / whole) : "-"; }

void run_layer(const LayerArgs& a) {
  const MemorySpace space = choose_space(a.cpu);
  const bool gpu = space == MemorySpace::device;
  // Every argument resolved before anything prints; the model and each TP size are checked
  // against each other here (the TP size must divide the heads), not after the first block ran.
  const std::string model = !a.model.empty() ? a.model : (gpu ? "glm5" : "deepseek-v2-lite");
  FP8PROJ_CHECK(model.find(',') == std::string::npos, "--model: layer runs one model, got ", quote_excerpt(model));
  (void)parse_models({model});
  const std::vector<int> tps = parse_int_list(!a.tp.empty() ? a.tp : (gpu ? "1,4" : "1"));
  check_tp_sizes({model}, tps);
  std::vector<int> seqs = parse_int_list(!a.seqs.empty() ? a.seqs : (gpu ? "4,8,16,32,64" : "1"), "--seqs", 1, 1 << 20);
  std::sort(seqs.begin(), seqs.end());
  const int L = a.seqlen > 0 ? a.seqlen : (gpu ? 1024 : 64);
  // One flag-on block per scale format of its FP8 copies, all timed in the same interleaved rounds.
  // And per --decode-quant choice: o_proj's decode input from absorb_v's epilogue and/or the
  // separate pass.
  const std::vector<ScaleMode> modes = parse_scale_modes(a.weight_scales);
  const std::vector<bool> decode_quants = parse_decode_quants(a.decode_quant);
  struct Variant {
    ScaleMode mode;
    bool fused_decode_quant;
  };
  std::vector<Variant> variants;
  for (const ScaleMode m : modes)
    for (const bool f : decode_quants) variants.push_back({m, f});
  FP8PROJ_CHECK(seqs.front() >= 1 && L >= 1, "--seqs and --seqlen must be positive");
  check_outputs({{"--csv", a.csv}, {"--json", a.json}, {"--md", a.md}});
  fmt::print("fp8proj layer -- {}\n", space_banner(space));
  if (!gpu)
    fmt::print("No GPU: the CPU reference block at a tiny size ({}, {} x {} tokens); times say nothing about a "
               "GPU, the tables show what the command reports.\n",
               model, seqs.back(), L);
  TimingOptions topt;
  topt.reps = a.reps > 0 ? a.reps : (gpu ? 20 : 1);
  topt.warmup = gpu ? 3 : 0;
  topt.flush_l2 = gpu && !a.no_flush;
  TimingOptions sopt = topt;  // the per-stage profile: fewer runs, the same rules
  sopt.reps = std::max(1, std::min(topt.reps, 10));
  // Which table gates the blocks. Without one (no file for this GPU in the build's configs/, or
  // FP8PROJ_TUNE_FILE unset on a machine where that path does not exist) the default threshold
  // (FP8 above M = 512) applies under either policy, so a decode step stays bf16 even under
  // `all` -- say so up front rather than leave it to the path column.
  if (gpu) {
    const TuneTable* table = active_tune_table();
    fmt::print("tuned table: {}\n", table ? table->source
                                            : std::string("none (FP8PROJ_TUNE_FILE unset and no table for this GPU in "
                                                          "the build's configs/): FP8 only above M = 512, decode "
                                                          "batches stay bf16 under either policy"));
  }
  // The two blocks are exactly "off" and "on": FP8PROJ_PREFILL_FP8 (which `explain` honours) does
  // not pick the policy here, --policy does.
  if (std::getenv("FP8PROJ_PREFILL_FP8"))
    fmt::print("note: FP8PROJ_PREFILL_FP8 is ignored by this command; the flag-on block runs policy {} (--policy){}\n",
               a.policy, a.all_dense ? " with every dense GEMM tagged" : "");
  fmt::print("timing: median of {} after {} warm-up, L2 {}, flag off and on interleaved call by call; speedup = "
             "flag-off time / flag-on time\n", topt.reps,
             topt.warmup, topt.flush_l2 ? "flushed before every timed call" : "not flushed");
  const double read_bw = gpu ? measured_read_bandwidth().bytes_per_s : 0;  // bytes/s, once per process

  const int c_max = seqs.back();
  const int64_t t_max = int64_t{c_max} * L;
  const int64_t stride = round_up(L + 1, 64);  // cache rows per sequence: the prefill + one decode token
  std::vector<PrefillRow> prows;
  std::vector<DecodeRow> drows;
  for (int tp : tps) {
    const MlaConfig cfg = MlaConfig::preset(model, tp, 0);
    MlaOptions base;
    base.name = model + ".layers.0.self_attn";
    base.max_tokens = t_max;
    base.max_batch = c_max;
    base.cache_capacity = int64_t{c_max} * stride;
    base.tagged.apply_env = false;  // the two blocks are exactly "off" and "on"
    base.fuse_attention_quant = a.fuse_attention_quant;
    base.tagged.use_tune_table = true;
    MlaOptions on_opt = base, off_opt = base;
    on_opt.tagged.fp8 = true;
    on_opt.tagged.policy = a.policy == "all" ? Fp8Policy::all : Fp8Policy::prefill;
    off_opt.tagged.fp8 = false;
    on_opt.fp8_fused_qkv_a = on_opt.fp8_kv_b_proj = a.all_dense;
    on_opt.residual_input = off_opt.residual_input = a.residual;
    // One seed: every block holds the same weights.
    MlaBlock off(space, cfg, 2024, off_opt);
    std::vector<std::unique_ptr<MlaBlock>> ons;
    for (const Variant& v : variants) {
      MlaOptions o = on_opt;
      o.tagged.weight_scales = v.mode;
      o.fuse_decode_quant = v.fused_decode_quant;
      ons.push_back(std::make_unique<MlaBlock>(space, cfg, 2024, o));
    }
    MlaBlock& on = *ons.front();
    // --decode-layers: layers 1 .. N-1 of each path, their own weights (seeds) and caches (filled
    // from the flag-off prefill's), workspaces for decode only. Layer 0 is the block above.
    std::vector<std::unique_ptr<MlaBlock>> layers_off;
    std::vector<std::vector<std::unique_ptr<MlaBlock>>> layers_on(ons.size());
    if (a.decode_layers > 1 && !a.no_decode) {
      // What the other layers take (weights, FP8 copies and a cache each; decode workspaces are
      // small): said up front, and refused where it cannot fit beside the two blocks above.
      auto held = [](const MlaMemory& m) { return double(m.weights_bf16 + m.fp8_copies + m.cache); };
      double more = held(off.memory());
      for (const auto& b : ons) more += held(b->memory());
      more *= a.decode_layers - 1;
      fmt::print("--decode-layers {}: {} more blocks, ~{:.1f} GiB\n", a.decode_layers,
                 (a.decode_layers - 1) * (1 + ons.size()), more / (1 << 30));
      if (gpu)
        FP8PROJ_CHECK(more < 0.8 * double(current_device().global_mem_bytes), "--decode-layers ", a.decode_layers,
                      " needs ~", more / (1 << 30), " GiB more for its other layers' blocks, above 80% of this GPU's ",
                      current_device().global_mem_bytes / double(1 << 30), " GiB: fewer layers, sequences or variants");
    }
    if (a.decode_layers > 1 && !a.no_decode)
      for (int l = 1; l < a.decode_layers; ++l) {
        MlaOptions o = off_opt;
        o.max_tokens = c_max;
        layers_off.push_back(std::make_unique<MlaBlock>(space, cfg, 2024 + l, o));
        for (size_t i = 0; i < variants.size(); ++i) {
          MlaOptions oi = on_opt;
          oi.max_tokens = c_max;
          oi.tagged.weight_scales = variants[i].mode;
          oi.fuse_decode_quant = variants[i].fused_decode_quant;
          layers_on[i].push_back(std::make_unique<MlaBlock>(space, cfg, 2024 + l, oi));
        }
      }
    const MlaMemory mem = on.memory();
    fmt::print("\n== {} TP{} (rank 0: {} local heads; q_b_proj {}x{}, o_proj {}x{}; FP8 copies +{:.1f} MiB over "
               "{:.1f} MiB of bf16 weights; workspace {:.1f} MiB)\n",
               model, tp, cfg.local_heads(), cfg.q_dim(), cfg.q_in_dim(), cfg.hidden, cfg.o_in_dim(),
               mem.fp8_copies / 1048576.0, mem.weights_bf16 / 1048576.0, mem.workspace / 1048576.0);
    fmt::print("{}", on.explain(int64_t{seqs.front()} * L).to_string());

    // Inputs sized for the largest batch; smaller batches use their first rows.
    Tensor x = random_bf16(space, t_max, cfg.hidden, 7, 1.0f);
    Tensor y = random_bf16(space, t_max, cfg.hidden, 8, 1.0f);
    Tensor y_dec = random_bf16(space, c_max, cfg.hidden, 12, 1.0f);  // the flag-on decode step's output
    // The decoder layer's input_layernorm weight for --residual: 1 + N(0, 0.05^2).
    Buffer input_norm(space, static_cast<size_t>(cfg.hidden) * sizeof(bf16));
    {
      std::vector<bf16> g(static_cast<size_t>(cfg.hidden));
      for (size_t i = 0; i < g.size(); ++i) g[i] = float_to_bf16(1.0f + 0.05f * std::sin(0.7f * static_cast<float>(i)));
      copy_bytes(input_norm.data(), space, g.data(), MemorySpace::host, input_norm.bytes());
    }
    // Stand-ins for the activations the quantizers see inside the block: the attention output
    // [T, H*v] (o_proj's input) and fused_qkv_a's output rows (q_a = their first q_lora columns).
    Tensor attn = random_bf16(space, t_max, cfg.o_in_dim(), 9, 0.5f);
    Tensor qkv = random_bf16(space, t_max, cfg.qkv_a_dim(), 10, 1.5f);
    Tensor norm_w = random_bf16(space, 1, std::max<int64_t>(cfg.q_lora_rank, 8), 11, 0.1f);
    // Quantizer outputs: o_proj's input (K = H*v) and q_b_proj's (K = q_lora, with bf16 rows for
    // the plain norm of the bf16 path).
    ActivationWorkspace ws_o(space, round_up(t_max, 4), round_up(std::max(cfg.o_in_dim(), cfg.hidden), 128), false);
    ActivationWorkspace ws_q(space, round_up(t_max, 4), round_up(cfg.q_in_dim(), 128), true);
    const QuantOps& ops = quant_ops(space);

    if (a.no_prefill) {
      fmt::print("\nprefill: not timed (--no-prefill; one untimed prefill of {} tokens per sequence fills the caches)\n", L);
    } else {
      fmt::print("\nprefill, C sequences x {} tokens (block time; q_b+o = share of q_b_proj + o_proj stages; w scl = "
                 "scale format of the flag-on block's FP8 weight copies)\n", L);
      fmt::print("  {:>4} {:>7} {:>9} {:>10} {:>10} {:>8} {:>9} {:>9} {:>10} {:>10} {:>10} {:>8} {:>9}  {}\n", "C",
                 "tokens", "w scl", "off ms", "on ms", "speedup", "q_b+o off", "q_b+o on", "o-quant us", "qa-nq us",
                 "qa-norm us", "quant %", "attn TF/s", "path qkv_a/q_b/kv_b/o");
    }
    for (int c : seqs) {
      const int64_t T = int64_t{c} * L;
      std::vector<int32_t> offsets(c + 1), start(c), pos(c, L);
      for (int b = 0; b <= c; ++b) offsets[b] = static_cast<int32_t>(int64_t{b} * L);
      for (int b = 0; b < c; ++b) start[b] = static_cast<int32_t>(b * stride);
      const Buffer d_off = int_array(space, offsets), d_start = int_array(space, start), d_pos = int_array(space, pos);
      const MlaPrefillBatch batch{c, d_off.data<int32_t>(), d_start.data<int32_t>(), offsets.data()};

      PrefillRow r;
      r.model = model;
      r.tp = tp;
      r.seqs = c;
      r.seqlen = L;
      r.tokens = T;
      r.q_path = to_string(on.projection_path(MlaProjection::q_b_proj, T));
      r.o_path = to_string(on.projection_path(MlaProjection::o_proj, T));
      r.fp8_backend = on.projection(MlaProjection::o_proj).explain(T).backend;
      r.qkv_path = to_string(on.projection_path(MlaProjection::fused_qkv_a, T));
      r.kv_b_path = to_string(on.projection_path(MlaProjection::kv_b_proj, T));
      // --residual: x is the residual stream and both blocks start with the input RMSNorm, the
      // flag-on one fused with fused_qkv_a's 1x128 quantization (prefill_residual).
      auto prefill_of = [&](MlaBlock& blk) {
        return [&](StreamHandle s) {
          if (a.residual)
            blk.prefill_residual(x.data(), input_norm.data<bf16>(), cfg.rms_norm_eps, batch, y.data(), s);
          else
            blk.prefill(x.data(), batch, y.data(), s);
        };
      };
      if (a.no_prefill) {  // one untimed prefill writes the caches the decode step reads
        prefill_of(off)(nullptr);
        ops.synchronize(nullptr);
      } else {
        // Off and on interleaved call by call: the H200's clock settles under its power cap
        // within a fraction of a second of sustained load, and blocks of calls per variant would
        // give the later block another clock.
        std::vector<std::function<void(StreamHandle)>> runs = {prefill_of(off)};
        for (auto& b : ons) runs.push_back(prefill_of(*b));
        const std::vector<double> pre = time_interleaved(space, runs, topt);
        r.off_us = pre[0];
        auto staged = [&](MlaBlock& blk) {
          return [&](StreamHandle s, const MlaStageHook& h) {
            if (a.residual)
              blk.prefill_residual(x.data(), input_norm.data<bf16>(), cfg.rms_norm_eps, batch, y.data(), s, h);
            else
              blk.prefill(x.data(), batch, y.data(), s, h);
          };
        };
        std::vector<std::function<void(StreamHandle, const MlaStageHook&)>> staged_runs = {staged(off)};
        for (auto& b : ons) staged_runs.push_back(staged(*b));
        const std::vector<MlaStageTimes> st = profile_stages_interleaved(space, staged_runs, sopt);
        r.off_stages = st[0];
        r.o_quant_us = time_or_host(
            space,
            [&](StreamHandle s) {
              ops.quantize_activation(attn.data(), T, cfg.o_in_dim(), ws_o.fp8(T, cfg.o_in_dim()), s);
            },
            topt);
        if (cfg.has_q_lora()) {
          const int64_t k = cfg.q_lora_rank;
          r.qa_normquant_us = time_or_host(
              space,
              [&](StreamHandle s) {
                ops.rmsnorm_quantize(qkv.data(), cfg.qkv_a_dim(), norm_w.data(), cfg.rms_norm_eps, T, k,
                                     ws_q.fp8(T, k), s);
              },
              topt);
          r.qa_norm_us = time_or_host(
              space,
              [&](StreamHandle s) {
                ops.rmsnorm(qkv.data(), cfg.qkv_a_dim(), norm_w.data(), cfg.rms_norm_eps, T, k, ws_q.bf16_rows(), s);
              },
              topt);
        } else {  // no q LoRA: q_proj's input x goes through the plain quantizer
          r.qa_normquant_us = time_or_host(
              space,
              [&](StreamHandle s) { ops.quantize_activation(x.data(), T, cfg.hidden, ws_o.fp8(T, cfg.hidden), s); },
              topt);
        }
        for (size_t i = 0; i < ons.size(); ++i) {
          PrefillRow ri = r;
          ri.weight_scales = variants[i].mode;
          ri.fused_decode_quant = variants[i].fused_decode_quant;
          ri.variant = static_cast<int>(i);
          ri.on_us = pre[1 + i];
          ri.on_stages = st[1 + i];
          const double attn_us = ri.on_stages.of(MlaStage::attention);
          ri.attn_tflops = attn_us > 0 ? attention_flops(cfg, c, L) / (attn_us * 1e-6) / 1e12 : 0;
          const double qbo_off = ri.off_stages.of(MlaStage::q_proj) + ri.off_stages.of(MlaStage::o_proj);
          const double qbo_on = ri.on_stages.of(MlaStage::q_proj) + ri.on_stages.of(MlaStage::o_proj);
          const double quant = ri.o_quant_us + ri.qa_normquant_us;
          fmt::print("  {:>4} {:>7} {:>9} {:>10.3f} {:>10.3f} {:>8.3f} {:>9} {:>9} {:>10.1f} {:>10.1f} {:>10.1f} {:>8} "
                     "{:>9.0f}  {}/{}/{}/{}\n",
                     c, T, variant_label(ri), ri.off_us / 1e3, ri.on_us / 1e3, ri.off_us / ri.on_us,
                     pct(qbo_off, ri.off_stages.total_us), pct(qbo_on, ri.on_stages.total_us), ri.o_quant_us,
                     ri.qa_normquant_us, ri.qa_norm_us, pct(quant, ri.on_us), ri.attn_tflops, ri.qkv_path, ri.q_path,
                     ri.kv_b_path, ri.o_path);
          prows.push_back(std::move(ri));
        }
      }

      if (!a.no_decode) {
        DecodeRow d;
        d.model = model;
        d.tp = tp;
        d.seqs = c;
        d.context = L + 1;
        d.q_path = to_string(on.projection_path(MlaProjection::q_b_proj, c));
        d.o_path = to_string(on.projection_path(MlaProjection::o_proj, c));
        d.qkv_path = to_string(on.projection_path(MlaProjection::fused_qkv_a, c));
        d.weight_bytes_off = decode_weight_bytes(off, c);
        d.weight_bytes_on = decode_weight_bytes(on, c);
        d.cache_bytes = static_cast<size_t>(c) * static_cast<size_t>(L + 1) * static_cast<size_t>(cfg.cache_width()) *
                        sizeof(bf16);
        if (gpu) {
          d.floor_off_us = byte_floor_us(double(d.weight_bytes_off + d.cache_bytes), read_bw);
          d.floor_on_us = byte_floor_us(double(d.weight_bytes_on + d.cache_bytes), read_bw);
          d.weight_floor_on_us = byte_floor_us(double(d.weight_bytes_on), read_bw);
        }
        if (a.policy == "all")  // the decode step's own projections (kv_b_proj is absorbed there)
          for (const MlaProjectionExplanation& pe : on.explain(c).projections)
            if (pe.which != MlaProjection::kv_b_proj && on.projection(pe.which).options().fp8 &&
                pe.path.path != Path::fp8)
              d.why_bf16 += fmt::format("      {} at M={} stays bf16: {}\n", to_string(pe.which), c, pe.path.reason);
        // The caches hold every sequence's L tokens (the prefills above); the step decodes token L.
        // Both steps read the flag-off prefill's cache, so that the comparison is of the decode
        // step alone: with fused_qkv_a on FP8 the flag-on prefill writes other latents, and
        // policy prefill promises a bf16 decode step, not a bf16 prefill.
        ops.synchronize(nullptr);
        const size_t cache_bytes = static_cast<size_t>(base.cache_capacity) * static_cast<size_t>(cfg.cache_width()) *
                                   sizeof(bf16);
        for (auto& b : ons) copy_bytes(b->cache(), space, off.cache(), space, cache_bytes);
        for (auto& b : layers_off) copy_bytes(b->cache(), space, off.cache(), space, cache_bytes);
        for (auto& path : layers_on)
          for (auto& b : path) copy_bytes(b->cache(), space, off.cache(), space, cache_bytes);
        const MlaDecodeBatch db{c, d_pos.data<int32_t>(), d_start.data<int32_t>(), L + 1};
        // Separate outputs: each flag-on step is compared with the flag-off one (the error FP8
        // costs under `all`; bit identity under `prefill`, which must leave decode bf16).
        std::vector<Tensor> y_on;
        y_on.push_back(std::move(y_dec));
        for (size_t i = 1; i < ons.size(); ++i) y_on.push_back(random_bf16(space, c_max, cfg.hidden, 12 + i, 1.0f));
        // --residual: the step starts from the residual stream, the decoder layer's input RMSNorm
        // inside it on both paths (decode_residual), as prefill above.
        auto decode_of = [&](MlaBlock& blk, bf16* out) {
          return [&blk, out, &x, &db, &input_norm, &cfg, &a](StreamHandle s, const MlaStageHook& h) {
            if (a.residual)
              blk.decode_residual(x.data(), input_norm.data<bf16>(), cfg.rms_norm_eps, db, out, s, h);
            else
              blk.decode(x.data(), db, out, s, h);
          };
        };
        std::vector<std::function<void(StreamHandle, const MlaStageHook&)>> staged_steps = {decode_of(off, y.data())};
        for (size_t i = 0; i < ons.size(); ++i) staged_steps.push_back(decode_of(*ons[i], y_on[i].data()));
        std::vector<double> t;
        if (gpu) {
          auto graph_of = [&](MlaBlock& blk, bf16* out) {
            return a.residual
                       ? std::make_unique<MlaDecodeGraph>(blk, x.data(), input_norm.data<bf16>(), cfg.rms_norm_eps, db, out)
                       : std::make_unique<MlaDecodeGraph>(blk, x.data(), db, out);
          };
          std::vector<std::unique_ptr<MlaDecodeGraph>> graphs;
          graphs.push_back(graph_of(off, y.data()));
          for (size_t i = 0; i < ons.size(); ++i) graphs.push_back(graph_of(*ons[i], y_on[i].data()));
          std::vector<std::function<void(StreamHandle)>> replays;
          for (auto& g : graphs) replays.push_back([gp = g.get()](StreamHandle s) { gp->replay(s); });
          t = time_interleaved(space, replays, topt);
          d.graph = true;
        } else {
          std::vector<std::function<void(StreamHandle)>> steps;
          for (auto& st : staged_steps) steps.push_back([&st](StreamHandle s) { st(s, {}); });
          t = time_interleaved(space, steps, topt);
        }
        // --decode-layers: each path's N layers, step after step (one graph on the GPU), no flush:
        // the L2 a step meets is what the layer before it left (its weights' clean lines, its
        // activations), as in a model; the flush above leaves 2 x L2 of dirty lines instead.
        std::vector<double> t_layers;
        if (a.decode_layers > 1) {
          std::vector<std::vector<MlaBlock*>> paths(1 + ons.size());
          paths[0].push_back(&off);
          for (auto& b : layers_off) paths[0].push_back(b.get());
          for (size_t i = 0; i < ons.size(); ++i) {
            paths[1 + i].push_back(ons[i].get());
            for (auto& b : layers_on[i]) paths[1 + i].push_back(b.get());
          }
          std::vector<bf16*> outs = {y.data()};
          for (auto& yo : y_on) outs.push_back(yo.data());
          std::vector<std::unique_ptr<CapturedCalls>> graphs;
          std::vector<std::function<void(StreamHandle)>> runs;
          for (size_t p = 0; p < paths.size(); ++p) {
            std::vector<std::function<void(StreamHandle, const MlaStageHook&)>> steps;
            for (MlaBlock* blk : paths[p]) steps.push_back(decode_of(*blk, outs[p]));
            auto call = [steps](int i, StreamHandle s) { steps[static_cast<size_t>(i) % steps.size()](s, {}); };
            if (gpu) {
              graphs.push_back(std::make_unique<CapturedCalls>(call, a.decode_layers));
              runs.push_back([g = graphs.back().get()](StreamHandle s) { g->replay(s); });
            } else {
              runs.push_back([call, n = a.decode_layers](StreamHandle s) {
                for (int i = 0; i < n; ++i) call(i, s);
              });
            }
          }
          TimingOptions lopt = topt;
          lopt.flush_l2 = false;
          t_layers = time_interleaved(space, runs, lopt);
          for (double& v : t_layers) v /= a.decode_layers;
        }
        const std::vector<MlaStageTimes> dst = profile_stages_interleaved(space, staged_steps, sopt);
        d.off_stages = dst[0];
        ops.synchronize(nullptr);
        const size_t count = static_cast<size_t>(c) * static_cast<size_t>(cfg.hidden);
        std::vector<bf16> h_off(count), h_on(count);
        copy_bytes(h_off.data(), MemorySpace::host, y.data(), space, count * sizeof(bf16));
        d.off_us = t[0];
        if (!t_layers.empty()) {
          d.layers = a.decode_layers;
          d.layers_off_us = t_layers[0];
        }
        for (size_t i = 0; i < ons.size(); ++i) {
          DecodeRow di = d;
          di.weight_scales = variants[i].mode;
          di.fused_decode_quant = variants[i].fused_decode_quant;
          di.variant = static_cast<int>(i);
          di.on_us = t[1 + i];
          if (!t_layers.empty()) di.layers_on_us = t_layers[1 + i];
          di.on_stages = dst[1 + i];
          copy_bytes(h_on.data(), MemorySpace::host, y_on[i].data(), space, count * sizeof(bf16));
          di.bit_identical = std::memcmp(h_off.data(), h_on.data(), count * sizeof(bf16)) == 0;
          di.rel_err = compare(h_on.data(), h_off.data(), static_cast<int64_t>(count)).rel_frobenius;
          drows.push_back(di);
        }
        y_dec = std::move(y_on.front());
      }
    }

    if (!a.no_prefill) {
      fmt::print("\nprefill stages (ms; median per stage over {} runs, flag off and on interleaved run by run, events "
                 "between stages)\n", sopt.reps);
      const std::vector<MlaStage> shown = {MlaStage::qkv_a,      MlaStage::q_proj,    MlaStage::kv_norm,
                                           MlaStage::kv_b_proj,  MlaStage::rope_cache, MlaStage::attention,
                                           MlaStage::o_proj};
      print_stage_table(prows, tp, shown, 1e-3, 3);
    }
    if (!a.no_decode) {
      fmt::print("\ndecode step, C sequences at context {} ({}; policy {})\n", L + 1,
                 gpu ? "one CUDA graph replay" : "eager, CPU", a.policy);
      if (gpu)
        fmt::print("  floor = bytes the step reads (w: flag-on weights, FP8 copies where the path is FP8, else bf16, "
                   "kv_b_proj's absorbed halves bf16; kv: latent cache rows) / {:.0f} GB/s measured read bandwidth; "
                   "w flr = weights alone; x flr = on us / floor\n",
                   read_bw / 1e9);
      else
        fmt::print("  floor: n/a (CPU reference)\n");
      fmt::print("  {:>4} {:>9} {:>10} {:>10} {:>8} {:>8} {:>10} {:>9} {:>8} {:>8} {:>9} {:>9} {:>8}  {}\n", "C",
                 "w scl", "off us", "on us", "on/off", "speedup", "err vs off", "bitwise", "w MB", "kv MB", "w flr us",
                 "floor us", "x flr", "path qkv_a/q_b/o (flag on)");
      auto us_or_na = [gpu](double v, const char* spec) {
        return gpu ? fmt::format(fmt::runtime(spec), v) : std::string("n/a");
      };
      for (const DecodeRow& d : drows)
        if (d.tp == tp)
          fmt::print("  {:>4} {:>9} {:>10.1f} {:>10.1f} {:>8.3f} {:>8.3f} {:>10.2e} {:>9} {:>8.1f} {:>8.1f} {:>9} {:>9} "
                     "{:>8}  {}/{}/{}\n",
                     d.seqs, variant_label(d), d.off_us, d.on_us, d.on_us / d.off_us,
                     d.off_us / d.on_us, d.rel_err, d.bit_identical ? "equal" : "differs", d.weight_bytes_on / 1e6,
                     d.cache_bytes / 1e6, us_or_na(d.weight_floor_on_us, "{:.1f}"), us_or_na(d.floor_on_us, "{:.1f}"),
                     us_or_na(floor_ratio(d.on_us, d.floor_on_us), "{:.2f}"), d.qkv_path, d.q_path, d.o_path);
      for (const DecodeRow& d : drows)
        if (d.tp == tp) fmt::print("{}", d.why_bf16);
      if (a.decode_layers > 1) {
        fmt::print("\ndecode step over {} layers back to back, time per layer ({}; each layer its own weights and "
                   "cache{}); speedup of the single flushed step above beside it\n",
                   a.decode_layers, gpu ? "one CUDA graph replay" : "eager, CPU",
                   gpu ? ", no L2 flush: a step meets the L2 the layer before left" : "");
        fmt::print("  {:>4} {:>9} {:>10} {:>10} {:>8}   {:>13}\n", "C", "w scl", "off us", "on us", "speedup",
                   "one, flushed");
        for (const DecodeRow& d : drows)
          if (d.tp == tp)
            fmt::print("  {:>4} {:>9} {:>10.1f} {:>10.1f} {:>8.3f}   {:>13.3f}\n", d.seqs, variant_label(d),
                       d.layers_off_us, d.layers_on_us, d.layers_off_us / d.layers_on_us, d.off_us / d.on_us);
      }
      // all_reduce never runs here: the command times rank 0's share without a communicator.
      // kv_a_layernorm runs inside rope_cache at decode (mla.hpp, MlaStage).
      const std::vector<MlaStage> dshown = {MlaStage::qkv_a,     MlaStage::q_proj,   MlaStage::rope_cache,
                                            MlaStage::absorb_q,  MlaStage::attention, MlaStage::absorb_v,
                                            MlaStage::o_proj};
      fmt::print("\ndecode stages (us; the same step eager, median per stage over {} runs, flag off and on interleaved "
                 "run by run, events between stages: the total includes launch gaps a graph replay hides)\n",
                 sopt.reps);
      print_stage_table(drows, tp, dshown, 1.0, 1);
    }
  }

  if (!a.csv.empty()) {
    std::string csv =
        "kind,model,tp,seqs,seqlen,tokens,off_us,on_us,speedup,qb_o_share_off,qb_o_share_on,o_quant_us,"
        "qa_normquant_us,qa_norm_us,attn_tflops,q_path,o_path,fp8_backend,qkv_path,kv_b_path,decode_rel_err,"
        "decode_bitwise,weight_scales,decode_weight_bytes_off,decode_weight_bytes_on,decode_cache_bytes,"
        "decode_floor_off_us,decode_floor_on_us,decode_on_floor_ratio,decode_quant,decode_layers,layers_off_us,"
        "layers_on_us\n";
    for (const PrefillRow& r : prows) {
      const double so = r.off_stages.total_us, sn = r.on_stages.total_us;
      csv += fmt::format("prefill,{},{},{},{},{},{:.3f},{:.3f},{:.4f},{:.4f},{:.4f},{:.3f},{:.3f},{:.3f},{:.1f},{},{},{},{},{},,,{},,,,,,,,,,\n",
                         r.model, r.tp, r.seqs, r.seqlen, r.tokens, r.off_us, r.on_us, r.off_us / r.on_us,
                         so > 0 ? (r.off_stages.of(MlaStage::q_proj) + r.off_stages.of(MlaStage::o_proj)) / so : 0.0,
                         sn > 0 ? (r.on_stages.of(MlaStage::q_proj) + r.on_stages.of(MlaStage::o_proj)) / sn : 0.0,
                         r.o_quant_us, r.qa_normquant_us, r.qa_norm_us, r.attn_tflops, r.q_path, r.o_path,
                         r.fp8_backend, r.qkv_path, r.kv_b_path, scale_mode_name(r.weight_scales));
    }
    for (const DecodeRow& d : drows)
      csv += fmt::format("decode,{},{},{},{},{},{:.3f},{:.3f},{:.4f},,,,,,,{},{},,{},,{:.3e},{},{},{},{},{},{:.3f},{:.3f},{:.4f},{},"
                         "{},{:.3f},{:.3f}\n",
                         d.model, d.tp, d.seqs, d.context, d.seqs, d.off_us, d.on_us, d.off_us / d.on_us, d.q_path,
                         d.o_path, d.qkv_path, d.rel_err, d.bit_identical ? 1 : 0, scale_mode_name(d.weight_scales),
                         d.weight_bytes_off, d.weight_bytes_on, d.cache_bytes, d.floor_off_us, d.floor_on_us,
                         floor_ratio(d.on_us, d.floor_on_us), d.fused_decode_quant ? "fused" : "separate", d.layers,
                         d.layers_off_us, d.layers_on_us);
    write_text(a.csv, csv);
  }
  if (!a.json.empty()) {
    nlohmann::json j;
    j["stamp"] = result_stamp();
    j["timing"] = {{"reps", topt.reps}, {"stage_reps", sopt.reps}, {"warmup", topt.warmup},
                   {"l2_flush", topt.flush_l2}, {"statistic", "median"}};
    j["space"] = gpu ? "device" : "host (CPU reference)";
    if (gpu) j["read_bandwidth_bytes_per_s"] = read_bw;
    j["policy"] = a.policy;
    j["all_dense_tagged"] = a.all_dense;
    j["residual_input"] = a.residual;
    j["prefill"] = nlohmann::json::array();  // empty with --no-prefill
    j["decode"] = nlohmann::json::array();   // empty with --no-decode
    auto stages_json = [](const MlaStageTimes& st) {
      nlohmann::json s = nlohmann::json::object();
      for (size_t i = 0; i < st.stages.size(); ++i) s[to_string(st.stages[i])] = st.us[i];
      s["total"] = st.total_us;
      return s;
    };
    for (const PrefillRow& r : prows)
      j["prefill"].push_back({{"model", r.model}, {"tp", r.tp}, {"seqs", r.seqs}, {"seqlen", r.seqlen},
                              {"tokens", r.tokens}, {"off_us", r.off_us}, {"on_us", r.on_us},
                              {"speedup", r.off_us / r.on_us}, {"stages_off_us", stages_json(r.off_stages)},
                              {"stages_on_us", stages_json(r.on_stages)}, {"o_quant_us", r.o_quant_us},
                              {"qa_normquant_us", r.qa_normquant_us}, {"qa_norm_us", r.qa_norm_us},
                              {"attn_tflops", r.attn_tflops}, {"q_path", r.q_path}, {"o_path", r.o_path},
                              {"fp8_backend", r.fp8_backend}, {"qkv_path", r.qkv_path}, {"kv_b_path", r.kv_b_path},
                              {"weight_scales", scale_mode_name(r.weight_scales)}});
    for (const DecodeRow& d : drows)
      j["decode"].push_back({{"model", d.model}, {"tp", d.tp}, {"seqs", d.seqs}, {"context", d.context},
                             {"off_us", d.off_us}, {"on_us", d.on_us}, {"cuda_graph", d.graph},
                             {"q_path", d.q_path}, {"o_path", d.o_path}, {"qkv_path", d.qkv_path},
                             {"rel_err_vs_off", d.rel_err}, {"bit_identical", d.bit_identical},
                             {"weight_scales", scale_mode_name(d.weight_scales)},
                             {"decode_quant", d.fused_decode_quant ? "fused" : "separate"},
                             {"weight_bytes_off", d.weight_bytes_off}, {"weight_bytes_on", d.weight_bytes_on},
                             {"cache_bytes", d.cache_bytes}, {"floor_off_us", d.floor_off_us},
                             {"floor_on_us", d.floor_on_us}, {"on_floor_ratio", floor_ratio(d.on_us, d.floor_on_us)},
                             {"stages_off_us", stages_json(d.off_stages)}, {"stages_on_us", stages_json(d.on_stages)},
                             {"decode_layers", d.layers}, {"layers_off_us", d.layers_off_us},
                             {"layers_on_us", d.layers_on_us}});
    write_text(a.json, j.dump(1) + "\n");
  }
  if (!a.md.empty()) {
    const nlohmann::json st = result_stamp();
    std::string md = fmt::format("# MLA block, {} ({}), flag off vs on\n\n{} {} ({} SMs), CUDA runtime {}, cuBLASLt {}, "
                                 "fp8proj {}, {}. Median of {} runs, L2 flushed: {}.\n\n",
                                 model, gpu ? "GPU" : "CPU reference", st["gpu"].get<std::string>(),
                                 st["arch"].get<std::string>(), st["sm_count"].get<int>(),
                                 st["cuda_runtime"].get<std::string>(), st["cublaslt"].get<std::string>(),
                                 st["fp8proj"].get<std::string>(), st["time_utc"].get<std::string>(), topt.reps,
                                 topt.flush_l2 ? "yes" : "no");
    md += "| TP | C x L | weight scales | off ms | on ms | speedup | q_b+o share off | q_b+o share on | act. quant % of "
          "on | attn TF/s |\n";
    md += "|---|---|---|---|---|---|---|---|---|---|\n";
    for (const PrefillRow& r : prows)
      md += fmt::format("| {} | {} x {} | {} | {:.3f} | {:.3f} | {:.2f} | {} | {} | {} | {:.0f} |\n", r.tp, r.seqs,
                        r.seqlen, scale_mode_name(r.weight_scales), r.off_us / 1e3, r.on_us / 1e3, r.off_us / r.on_us,
                        pct(r.off_stages.of(MlaStage::q_proj) + r.off_stages.of(MlaStage::o_proj), r.off_stages.total_us),
                        pct(r.on_stages.of(MlaStage::q_proj) + r.on_stages.of(MlaStage::o_proj), r.on_stages.total_us),
                        pct(r.o_quant_us + r.qa_normquant_us, r.on_us), r.attn_tflops);
    if (!drows.empty()) {
      md += fmt::format("\nDecode step (policy {}):\n\n| TP | C | weight scales | decode off us | decode on us | speedup "
                        "| error vs off | bitwise | byte floor us | on / floor | path qkv_a/q_b/o |\n"
                        "|---|---|---|---|---|---|---|---|---|---|---|\n",
                        a.policy);
      for (const DecodeRow& d : drows)
        md += fmt::format("| {} | {} | {} | {:.1f} | {:.1f} | {:.3f} | {:.2e} | {} | {} | {} | {}/{}/{} |\n", d.tp,
                          d.seqs, variant_label(d), d.off_us, d.on_us, d.off_us / d.on_us, d.rel_err,
                          d.bit_identical ? "equal" : "differs",
                          d.floor_on_us > 0 ? fmt::format("{:.1f}", d.floor_on_us) : std::string("n/a"),
                          d.floor_on_us > 0 ? fmt::format("{:.2f}", d.on_us / d.floor_on_us) : std::string("n/a"),
                          d.qkv_path, d.q_path, d.o_path);
    }
    write_text(a.md, md);
  }
}

}  // namespace

void register_layer(CLI::App& app) {
  auto args = std::make_shared<LayerArgs>();
  auto* cmd = app.add_subcommand("layer", "A whole MLA attention block, FP8 flag off vs on: prefill and decode");
  cmd->add_option("--model", args->model, "glm5, deepseek-v3 or deepseek-v2-lite (GPU default glm5; CPU default "
                                          "deepseek-v2-lite)");
  cmd->add_option("--tp", args->tp, "Tensor-parallel size(s): rank 0's share of the work, e.g. 1,4 (GPU default 1,4)");
  cmd->add_option("--seqs", args->seqs, "Sequences per batch C, e.g. 4,8,16,32,64 (GPU default; CPU 1)");
  cmd->add_option("--seqlen", args->seqlen, "Tokens per sequence L (GPU default 1024; CPU 64); decode context L+1")
      ->transform(int_in(1, 1 << 20));
  cmd->add_option("--policy", args->policy, "Gate policy of the flag-on block: prefill or all")
      ->check(CLI::IsMember({"prefill", "all"}))
      ->capture_default_str();
  cmd->add_flag("--fp8-all-dense", args->all_dense,
                "Flag on also tags fused_qkv_a and kv_b_proj (MlaOptions::fp8_fused_qkv_a / fp8_kv_b_proj): every "
                "dense GEMM of the block on the gated FP8 path");
  cmd->add_flag("--residual", args->residual,
                "Prefill and decode from the residual stream (MlaBlock::prefill_residual / decode_residual): both "
                "blocks run the decoder layer's input RMSNorm, the flag-on one fused with fused_qkv_a's 1x128 "
                "quantization when that is on its FP8 path");
  cmd->add_option("--reps", args->reps, "Timed repetitions (GPU default 20, CPU 1)")
      ->transform(int_in(1, kMaxCliReps));
  cmd->add_flag("--no-flush", args->no_flush, "Do not flush L2 before timed calls");
  auto* no_decode = cmd->add_flag("--no-decode", args->no_decode, "Skip the decode step");
  cmd->add_flag("--no-prefill", args->no_prefill,
                "Time the decode step only: one untimed prefill writes the caches it reads (no prefill rows)")
      ->excludes(no_decode);
  cmd->add_flag("--fuse-attention-quant", args->fuse_attention_quant,
                "The flag-on block's prefill attention writes o_proj's FP8 input in its epilogue "
                "(MlaOptions::fuse_attention_quant) instead of the separate 1x128 pass");
  cmd->add_flag("--cpu", args->cpu, "Use the CPU reference even if a GPU is present");
  cmd->add_option("--weight-scales", args->weight_scales,
                  "Scale format(s) of the flag-on block's FP8 weight copies: ue8m0, float, or ue8m0,float (one "
                  "flag-on block per format, all timed in the same interleaved rounds)")
      ->capture_default_str();
  cmd->add_option("--decode-quant", args->decode_quant,
                  "Where the flag-on block quantizes o_proj's input at decode: fused (out_latent . W_UV^T's "
                  "epilogue writes it, MlaOptions::fuse_decode_quant), separate (the 1x128 pass), or fused,separate "
                  "(one flag-on block each, timed in the same interleaved rounds; rows of the second say +sep)")
      ->capture_default_str();
  cmd->add_option("--decode-layers", args->decode_layers,
                  "Also time the decode step over N layers back to back: N blocks per path, each with its own "
                  "weights and cache, in one CUDA graph, no L2 flush (a step meets the L2 the layer before left, as "
                  "in a model); reported per layer beside the flushed step. 1: not run")
      ->transform(int_in(1, 16))
      ->capture_default_str();
  cmd->add_option("--csv", args->csv, "Write the rows as CSV");
  cmd->add_option("--json", args->json, "Write the rows (with per-stage times) as JSON with the GPU/version stamp");
  cmd->add_option("--md", args->md, "Write a markdown summary");
  cmd->callback([args] { run_layer(*args); });
}

}  // namespace fp8proj::cli

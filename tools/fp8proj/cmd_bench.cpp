// fp8proj bench: per shape and M, the bf16 time, the FP8 path's time (activation
// quantization included), the FP8 GEMM alone, their ratios to bf16, TFLOP/s, and the path
// the gate picks with the time of that gated call; at M <= 64 also the weight-byte floor (FP8
// weight bytes / this GPU's measured read bandwidth, floor.hpp) and each FP8 time's ratio to it.
// Measured as timing.hpp says (device
// events, L2 flushed before every timed call, median of many). Without a GPU it runs the
// CPU reference at small sizes and says so.
#include <fmt/format.h>

#include <fstream>
#include <memory>

#include "commands.hpp"
#include "common.hpp"
#include "fp8proj/error.hpp"
#include "fp8proj/floor.hpp"
#include "fp8proj/ops.hpp"
#include "fp8proj/projection.hpp"
#include "fp8proj/quantize.hpp"
#include "fp8proj/timing.hpp"

namespace fp8proj::cli {

namespace {

struct BenchArgs {
  std::vector<std::string> models;
  std::string tp;
  std::string m;
  std::vector<std::string> shapes;
  std::string policy = "prefill";
  int reps = 0;
  bool no_flush = false;
  bool cpu = false;
  std::string weight_scales = "ue8m0";
  std::string csv, json;
};

struct Row {
  ProjectionShape shape;
  int64_t m;
  double bf16_us, fp8_us, gemm_us, gated_us;
  std::string path, fp8_backend;
  ScaleMode weight_scales = ScaleMode::ue8m0;  // of the FP8 copy the fp8 and gemm columns ran
  double floor_us = 0;  // weight-byte floor of that copy at M <= kFloorMaxM on the GPU, else 0
};

// The small-M rows that show the weight-byte floor: decode batches, where the GEMM is bound by
// its weight bytes (docs/decode.md).
constexpr int64_t kFloorMaxM = 64;

double tflops(int64_t m, int64_t n, int64_t k, double us) { return 2.0 * m * n * k / (us * 1e-6) / 1e12; }

void run_bench(const BenchArgs& a) {
  const MemorySpace space = choose_space(a.cpu);
  const bool gpu = space == MemorySpace::device;
  // Every argument resolved before anything prints: a bad one fails before any work. An option
  // left out has its default; one given empty was refused by the parser (refuse_blank_values).
  // Any N x K runs: bf16 takes every shape, and a shape outside the FP8 rule
  // (fp8_block_shape_reason) is measured in bf16 with the rule's reason printed.
  std::vector<ProjectionShape> shapes;
  if (!a.shapes.empty()) {
    shapes = parse_shapes(a.shapes);
  } else {
    const std::vector<std::string> models =
        !a.models.empty() ? parse_models(a.models)
                          : (gpu ? std::vector<std::string>{"glm5", "deepseek-v3"} : std::vector<std::string>{"glm5"});
    const std::vector<int> tps = parse_int_list(!a.tp.empty() ? a.tp : (gpu ? "1,4" : "8"));
    check_tp_sizes(models, tps);
    for (const auto& model : models)
      for (int t : tps)
        for (auto& s : projection_shapes(model, t)) shapes.push_back(s);
  }
  const std::vector<int64_t> ms =
      parse_m_list(!a.m.empty() ? a.m : (gpu ? "1,16,64,128,256,512,1024,2048,4096,8192,16384,32768" : "1,16,128,1024"));
  // One FP8 layer per scale format of its copy, all timed in the same interleaved rounds.
  const std::vector<ScaleMode> modes = parse_scale_modes(a.weight_scales);
  check_outputs({{"--csv", a.csv}, {"--json", a.json}});
  fmt::print("fp8proj bench -- {}\n", space_banner(space));
  TimingOptions topt;
  topt.reps = a.reps > 0 ? a.reps : (gpu ? 45 : 3);
  topt.warmup = gpu ? 5 : 1;
  topt.flush_l2 = gpu && !a.no_flush;
  fmt::print("timing: median of {} calls per variant, interleaved call by call, after {} warm-up, L2 {}; "
             "ratio = bf16 time / FP8 time\n",
             topt.reps, topt.warmup, topt.flush_l2 ? "flushed before every timed call" : "not flushed");
  double read_bw = 0;  // bytes/s, measured once per process
  if (gpu) {
    const ReadBandwidth& bw = measured_read_bandwidth();
    read_bw = bw.bytes_per_s;
    fmt::print("weight-byte floor (M <= {}): FP8 weight bytes (values + scales) / {:.0f} GB/s, this GPU's read "
               "bandwidth (a read kernel over {:.1f} GiB, best of {}); x flr = time / floor\n",
               kFloorMaxM, read_bw / 1e9, bw.bytes / double(1 << 30), bw.runs);
  } else {
    fmt::print("weight-byte floor: n/a (CPU reference)\n");
  }

  const int64_t max_m = ms.back();
  std::vector<Row> rows;
  for (const ProjectionShape& s : shapes) {
    Tensor w = random_bf16(space, s.n, s.k, 11, 0.02f);
    Tensor x = random_bf16(space, max_m, s.k, 12, 1.0f);
    Tensor y = random_bf16(space, max_m, s.n, 13, 1.0f);
    auto shared_ws = std::make_shared<ActivationWorkspace>(space, round_up(max_m, 4), round_up(s.k, 128), false);

    ProjectionOptions base;
    base.max_tokens = round_up(max_m, 4);
    base.workspace = shared_ws;
    base.use_tune_table = true;
    // The reference layers ignore FP8PROJ_* (the environment must not switch what they
    // measure); the gated layer honours it, as an engine's would.
    base.apply_env = false;
    ProjectionOptions bf16_only = base;
    bf16_only.name = s.label() + " bf16";
    ProjectionOptions gated = base;
    gated.apply_env = true;
    gated.name = s.label();
    gated.fp8 = true;
    gated.policy = a.policy == "all" ? Fp8Policy::all : Fp8Policy::prefill;

    ProjectionLayer l_bf16(space, w.data(), s.n, s.k, bf16_only);
    std::vector<std::unique_ptr<ProjectionLayer>> l_fp8;
    for (const ScaleMode mode : modes) {
      ProjectionOptions fp8_always = base;  // FP8 at every M: threshold and ceiling 0
      fp8_always.name = s.label() + " fp8";
      fp8_always.fp8 = true;
      fp8_always.threshold = 0;
      fp8_always.decode_ceiling = 0;
      fp8_always.weight_scales = mode;
      l_fp8.push_back(std::make_unique<ProjectionLayer>(space, w.data(), s.n, s.k, fp8_always));
    }
    ProjectionLayer l_gate(space, w.data(), s.n, s.k, gated);
    const bool fp8_ok = l_fp8[0]->has_fp8_copy() && l_fp8[0]->path_for(1) == Path::fp8;
    const std::string fp8_backend = fp8_ok ? l_fp8[0]->explain(ms.back()).backend : "none";
    const ProjectionMemory mem = l_gate.memory();
    fmt::print("\n{}  [FP8 backend {}; gate: policy {}, weight scales {}, FP8 copy +{:.1f}% of the bf16 weight]\n",
               s.label(), fp8_backend, to_string(l_gate.options().policy),
               scale_mode_name(l_gate.options().weight_scales), 100 * mem.fp8_overhead());
    if (!fp8_ok) fmt::print("  FP8 path unavailable: {}\n", l_fp8[0]->explain(max_m).reason);
    fmt::print("  {:>6} {:>6} {:>10} {:>10} {:>10} {:>8} {:>8} {:>9} {:>9} {:>9} {:>10} {:>8} {:>9} {:>9}  {}\n", "M",
               "w scl", "bf16 us", "fp8 us", "gemm us", "fp8 x", "gemm x", "bf16 TF/s", "fp8 TF/s", "gemm TF/s",
               "gated us", "floor us", "fp8 x flr", "gemm x flr", "gate");

    for (int64_t m : ms) {
      // The GEMM-only variants read activations quantized once up front, in the layout the
      // FP8 path's own quantization writes.
      Fp8ActivationView qv{};
      if (fp8_ok) {
        quant_ops(space).quantize_activation(x.data(), m, s.k, shared_ws->fp8(m, s.k), nullptr);
        quant_ops(space).synchronize(nullptr);
        qv = shared_ws->fp8(m, s.k).view();
      }
      using Fn = std::function<void(StreamHandle)>;
      // bf16, gated, then (fp8 path, gemm alone) per scale format: one interleaved round.
      std::vector<Fn> fns = {[&](StreamHandle st) { l_bf16.forward(x.data(), m, y.data(), st); },
                             [&](StreamHandle st) { l_gate.forward(x.data(), m, y.data(), st); }};
      for (auto& l : l_fp8) {
        ProjectionLayer* lp = l.get();
        fns.push_back(fp8_ok ? Fn([&, lp](StreamHandle st) { lp->forward(x.data(), m, y.data(), st); }) : Fn());
        fns.push_back(fp8_ok ? Fn([&, lp](StreamHandle st) { lp->forward_quantized(qv, y.data(), st); }) : Fn());
      }
      // A failing call names its layer and kernel (time_interleaved).
      auto label = [m](const ProjectionLayer& l, const char* what) {
        const Explanation e = l.explain(m);
        return fmt::format("{}{} M={}: {} {}", l.name(), what, m, e.backend, e.config);
      };
      std::vector<std::string> labels = {label(l_bf16, ""), label(l_gate, " (gated)")};
      for (auto& l : l_fp8) {
        labels.push_back(label(*l, ""));
        labels.push_back(label(*l, " (GEMM alone)"));
      }
      const std::vector<double> t = time_interleaved(space, fns, topt, labels);
      for (size_t i = 0; i < modes.size(); ++i) {
        Row r{s, m, t[0], t[2 + 2 * i], t[3 + 2 * i], t[1], to_string(l_gate.path_for(m)), fp8_backend, modes[i]};
        const ProjectionMemory fm = l_fp8[i]->memory();
        if (gpu && fp8_ok && m <= kFloorMaxM)
          r.floor_us = byte_floor_us(double(fm.fp8_values + fm.fp8_scales), read_bw);
        // The floor columns: the number at small M on the GPU, "n/a" on the CPU reference.
        auto flr = [&](double v) {
          if (r.floor_us > 0) return v > 0 ? fmt::format("{:.2f}", v / r.floor_us) : std::string("-");
          return !gpu && m <= kFloorMaxM ? std::string("n/a") : std::string("-");
        };
        const std::string floor_text = r.floor_us > 0 ? fmt::format("{:.2f}", r.floor_us) : flr(0);
        auto ratio = [&](double v) { return v > 0 ? fmt::format("{:.2f}", r.bf16_us / v) : std::string("-"); };
        auto tf = [&](double v) { return v > 0 ? fmt::format("{:.3g}", tflops(m, s.n, s.k, v)) : std::string("-"); };
        fmt::print("  {:>6} {:>6} {:>10.1f} {:>10.1f} {:>10.1f} {:>8} {:>8} {:>9} {:>9} {:>9} {:>10.1f} {:>8} {:>9} {:>9}  {}\n",
                   m, scale_mode_name(r.weight_scales), r.bf16_us, r.fp8_us, r.gemm_us, ratio(r.fp8_us),
                   ratio(r.gemm_us), tf(r.bf16_us), tf(r.fp8_us), tf(r.gemm_us), r.gated_us, floor_text,
                   flr(r.fp8_us), flr(r.gemm_us), r.path);
        rows.push_back(r);
      }
    }
  }

  if (!a.csv.empty()) {
    std::string csv = "model,gemm,tp,n,k,m,bf16_us,fp8_us,fp8_gemm_us,speedup,gemm_speedup,bf16_tflops,fp8_tflops,"
                      "gemm_tflops,gated_us,path,fp8_backend,weight_scales,floor_us,fp8_floor_ratio,gemm_floor_ratio\n";
    for (const Row& r : rows)
      csv += fmt::format("{},{},{},{},{},{},{:.3f},{:.3f},{:.3f},{:.4f},{:.4f},{:.1f},{:.1f},{:.1f},{:.3f},{},{},{},{:.3f},{:.4f},"
                         "{:.4f}\n",
                         r.shape.model, r.shape.gemm, r.shape.tp, r.shape.n, r.shape.k, r.m, r.bf16_us, r.fp8_us,
                         r.gemm_us, r.fp8_us > 0 ? r.bf16_us / r.fp8_us : 0.0,
                         r.gemm_us > 0 ? r.bf16_us / r.gemm_us : 0.0, tflops(r.m, r.shape.n, r.shape.k, r.bf16_us),
                         r.fp8_us > 0 ? tflops(r.m, r.shape.n, r.shape.k, r.fp8_us) : 0.0,
                         r.gemm_us > 0 ? tflops(r.m, r.shape.n, r.shape.k, r.gemm_us) : 0.0, r.gated_us, r.path,
                         r.fp8_backend, scale_mode_name(r.weight_scales), r.floor_us, floor_ratio(r.fp8_us, r.floor_us),
                         floor_ratio(r.gemm_us, r.floor_us));
    write_text(a.csv, csv);
  }
  if (!a.json.empty()) {
    nlohmann::json j;
    j["stamp"] = result_stamp();
    j["timing"] = {{"reps", topt.reps}, {"warmup", topt.warmup}, {"l2_flush", topt.flush_l2}, {"statistic", "median"}};
    j["space"] = gpu ? "device" : "host (CPU reference)";
    if (gpu) j["read_bandwidth_bytes_per_s"] = read_bw;
    for (const Row& r : rows)
      j["rows"].push_back({{"model", r.shape.model}, {"gemm", r.shape.gemm}, {"tp", r.shape.tp}, {"n", r.shape.n},
                           {"k", r.shape.k}, {"m", r.m}, {"bf16_us", r.bf16_us}, {"fp8_us", r.fp8_us},
                           {"fp8_gemm_us", r.gemm_us}, {"gated_us", r.gated_us}, {"path", r.path},
                           {"fp8_backend", r.fp8_backend}, {"weight_scales", scale_mode_name(r.weight_scales)},
                           {"floor_us", r.floor_us}, {"fp8_floor_ratio", floor_ratio(r.fp8_us, r.floor_us)},
                           {"gemm_floor_ratio", floor_ratio(r.gemm_us, r.floor_us)}});
    write_text(a.json, j.dump(1) + "\n");
  }
}

}  // namespace

void register_bench(CLI::App& app) {
  auto args = std::make_shared<BenchArgs>();
  auto* cmd = app.add_subcommand("bench", "bf16 vs FP8 per M for the model shapes (GPU if present, else CPU)");
  auto* model = cmd->add_option("--model", args->models,
                                "Model(s): glm5, deepseek-v3, deepseek-v2-lite (GPU default: glm5,deepseek-v3; CPU "
                                "default: glm5)");
  auto* tp = cmd->add_option("--tp", args->tp, "Tensor-parallel size(s), e.g. 1,4 (GPU default 1,4; CPU default 8)");
  cmd->add_option("--m", args->m, "Token counts: '1,16,64' or '1-32768' (powers of two)");
  cmd->add_option("--shape", args->shapes, "Explicit NxK shape(s) instead of models")->excludes(model)->excludes(tp);
  cmd->add_option("--policy", args->policy, "Gate policy for the 'gated' column: prefill or all")
      ->check(CLI::IsMember({"prefill", "all"}))
      ->capture_default_str();
  cmd->add_option("--reps", args->reps, "Timed repetitions (GPU default 45, CPU 3)")
      ->transform(int_in(1, kMaxCliReps));
  cmd->add_flag("--no-flush", args->no_flush, "Do not flush L2 before timed calls (flatters bf16 at small M)");
  cmd->add_flag("--cpu", args->cpu, "Use the CPU reference even if a GPU is present");
  cmd->add_option("--weight-scales", args->weight_scales,
                  "Scale format(s) of the fp8/gemm columns' FP8 weight copy: ue8m0, float, or ue8m0,float (both "
                  "timed in the same interleaved rounds; the gated column follows FP8PROJ_WEIGHT_SCALES)")
      ->capture_default_str();
  cmd->add_option("--csv", args->csv, "Write the rows as CSV");
  cmd->add_option("--json", args->json, "Write the rows as JSON with the GPU/version stamp");
  cmd->callback([args] { run_bench(*args); });
}

}  // namespace fp8proj::cli

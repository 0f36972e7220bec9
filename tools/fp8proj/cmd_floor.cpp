// fp8proj floor: where a small-M FP8 GEMM's time goes (docs/decode.md). Per shape N x K and
// token count M, on the GPU:
//   call, eager   the GEMM as a user calls it (activation quantization + GEMM through the
//                 projection layer, FP8 at every M with the tuned table's configuration: what
//                 `fp8proj bench` times as "fp8 us"), L2 flushed before each call;
//   call, graph   the same call captured R times back to back in one CUDA graph, rotating over
//                 W distinct FP8 weight copies (W x weight bytes >= 3 x L2), replay time / R;
//   the floors    an empty kernel and a pure read of the weight's bytes (values + scales), each
//                 eager (flushed) and in graph replay over the same W copies; the weight-byte
//                 floor = weight bytes / the read bandwidth measured over >= 1 GiB;
//   the launch    the configuration the layer runs (explain's name), its CTAs, the SMs busy,
//                 and the path the gate takes under policy `all`;
//   derived       achieved weight bandwidth, time / floor, fixed cost = graph time - floor, and
//                 the same GEMM at K = 128 in graph replay (per N): an estimate of prologue +
//                 epilogue, since its weight bytes cost almost nothing.
// Device events, warm-up, the median of --reps calls per variant interleaved call by call.
// Without a GPU it validates its arguments and stops with one line saying nothing was measured.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <tuple>

#include "commands.hpp"
#include "common.hpp"
#include "fp8proj/error.hpp"
#include "fp8proj/floor.hpp"
#include "fp8proj/gemm.hpp"
#include "fp8proj/gemm_config.hpp"
#include "fp8proj/ops.hpp"
#include "fp8proj/projection.hpp"
#include "fp8proj/timing.hpp"
#include "tune_common.hpp"

namespace fp8proj::cli {

namespace {

// M is a decode batch here; 16384 rows keep x and y of the largest shape (K or N = 24576) under
// 1 GiB each.
constexpr int64_t kMaxFloorM = 16384;
// Rotation copies: at most 256 for a shape (every shipped weight, 1.8 MB and up, reaches 3 x a
// 60 MB L2 within 100) and 64 for the K = 128 estimate: where that cap binds (3 x L2 / 64, under
// 3 MB per copy) the weight costs under 1 us to read even from DRAM, so a partly L2-resident
// rotation moves the estimate by less than that.
constexpr int kMaxCopies = 256;
constexpr int kMaxCopiesK128 = 64;
// Calls per graph: at least 32, so that the graph launch's own cost (one per replay) is spread.
constexpr int kMinGraphCalls = 32;
constexpr double kL2Factor = 3.0;

struct FloorArgs {
  std::vector<std::string> models;
  std::string tp;
  std::string m;
  std::vector<std::string> shapes;
  int reps = 0;
  bool launch_once = false;
  std::string csv, json;
};

struct ShapeFloor {  // per shape: the floors, independent of M
  ProjectionShape shape;
  std::string label;
  size_t weight_bytes = 0;
  int copies = 0, calls = 0;
  double floor_us = 0;
  double empty_eager_us = 0, empty_graph_us = 0, read_eager_us = 0, read_graph_us = 0;
};

struct Row {
  size_t shape = 0;  // index into the ShapeFloors
  int64_t m = 0;
  std::string config, gate_path;
  int64_t ctas = 0, sms_busy = 0;
  double eager_us = 0, graph_us = 0, k128_graph_us = 0;
  int k128_copies = 0;
};

// The layers a rotation calls: one per weight copy, all from one bf16 weight, each with its own
// FP8 copy, FP8 at every M with the tuned table's configuration per M bucket (bench's "fp8"
// layer), sharing one activation workspace.
std::vector<std::unique_ptr<ProjectionLayer>> rotation_layers(const Tensor& w, int64_t n, int64_t k, int copies,
                                                              int64_t max_m, const std::string& name) {
  auto ws = std::make_shared<ActivationWorkspace>(MemorySpace::device, round_up(max_m, 4), round_up(k, 128), false);
  ProjectionOptions o;
  o.name = name;
  o.fp8 = true;
  o.policy = Fp8Policy::all;
  o.threshold = 0;
  o.decode_ceiling = 0;
  o.max_tokens = round_up(max_m, 4);
  o.workspace = ws;
  o.use_tune_table = true;
  o.apply_env = false;  // FP8PROJ_* must not switch what is measured
  std::vector<std::unique_ptr<ProjectionLayer>> out;
  for (int i = 0; i < copies; ++i) {
    out.push_back(std::make_unique<ProjectionLayer>(MemorySpace::device, w.data(), n, k, o));
    FP8PROJ_CHECK(out.back()->has_fp8_copy() && out.back()->path_for(1) == Path::fp8, name,
                  ": no FP8 path here: ", out.back()->explain(1).reason);
  }
  return out;
}

// R calls of `layers` in one graph, call i on copy i % W.
std::unique_ptr<CapturedCalls> capture_rotation(std::vector<std::unique_ptr<ProjectionLayer>>& layers, int calls,
                                                const bf16* x, int64_t m, bf16* y) {
  return std::make_unique<CapturedCalls>(
      [&layers, x, m, y](int i, StreamHandle s) {
        layers[static_cast<size_t>(i) % layers.size()]->forward(x, m, y, s);
      },
      calls);
}

std::string fmt_x(double v) { return v > 0 ? fmt::format("{:.2f}", v) : std::string("-"); }

std::string shape_name(const ProjectionShape& s) {
  const std::string label = shape_label(s.n, s.k);
  return label == "custom" ? fmt::format("custom {}x{}", s.n, s.k) : label;
}

// --launch-once: each kernel of the measurement launched once per shape and M, untimed, in a
// fixed order written to --csv (the manifest scripts/floor_table.py pairs with a profiler's
// rows): per shape the weight read and the empty kernel, then per M the call (activation
// quantization, GEMM) and the K = 128 call of the same N (once per N and M). No rotation, no
// graph, no bandwidth measurement: under Nsight Compute every matched launch is replayed, and
// its own cache control flushes before each.
void run_launch_once(const std::vector<ProjectionShape>& shapes, const std::vector<int64_t>& ms,
                     const std::string& manifest) {
  fmt::print("fp8proj floor --launch-once -- {}\n", space_banner(MemorySpace::device));
  const int64_t max_m = ms.back();
  Buffer sink(MemorySpace::device, read_kernel_sink_words() * sizeof(uint32_t));
  std::string csv = "seq,label,n,k,m,role,kernel\n";
  int seq = 0;
  auto note = [&](const std::string& label, int64_t n, int64_t k, int64_t m, const char* role, const char* kernel) {
    csv += fmt::format("{},{},{},{},{},{},{}\n", seq++, csv_escape(label), n, k, m, role, kernel);
  };
  std::map<std::pair<int64_t, int64_t>, bool> k128_done;
  for (const ProjectionShape& s : shapes) {
    const std::string label = shape_name(s);
    Tensor w = random_bf16(MemorySpace::device, s.n, s.k, 11, 0.02f);
    Tensor w128 = random_bf16(MemorySpace::device, s.n, 128, 14, 0.02f);
    Tensor x = random_bf16(MemorySpace::device, max_m, s.k, 12, 1.0f);
    Tensor y = random_bf16(MemorySpace::device, max_m, s.n, 13, 1.0f);
    auto layer = rotation_layers(w, s.n, s.k, 1, max_m, label + " fp8");
    auto layer128 = rotation_layers(w128, s.n, 128, 1, max_m, fmt::format("{}x128 fp8", s.n));
    const Fp8WeightView v = *layer[0]->fp8_weight();
    const size_t scale_bytes = fp8_weight_bytes(s.n, s.k) - static_cast<size_t>(s.n * s.k);
    launch_read_kernel(v.values, static_cast<size_t>(s.n * s.k), v.scales, scale_bytes, sink.data<uint32_t>(),
                       nullptr);
    note(label, s.n, s.k, 0, "read", "floor_read_kernel");
    launch_empty_kernel(nullptr);
    note(label, s.n, s.k, 0, "empty", "floor_empty_kernel");
    for (int64_t m : ms) {
      layer[0]->forward(x.data(), m, y.data(), nullptr);
      note(label, s.n, s.k, m, "quant", "activation_quant");
      note(label, s.n, s.k, m, "gemm", "sm90_fp8_gemm");
      if (!k128_done[{s.n, m}]) {
        k128_done[{s.n, m}] = true;
        layer128[0]->forward(x.data(), m, y.data(), nullptr);
        note(label, s.n, 128, m, "quant_k128", "activation_quant");
        note(label, s.n, 128, m, "gemm_k128", "sm90_fp8_gemm");
      }
    }
    quant_ops(MemorySpace::device).synchronize(nullptr);
    fmt::print("  {}: {} launches so far\n", label, seq);
  }
  if (!manifest.empty()) write_text(manifest, csv);
  fmt::print("{} launches; manifest {}\n", seq, manifest.empty() ? std::string("not written (no --csv)") : manifest);
}

void run_floor(const FloorArgs& a) {
  // Every argument resolved before anything prints or runs.
  std::vector<ProjectionShape> shapes;
  if (!a.shapes.empty()) {
    shapes = parse_shapes(a.shapes);
    for (const ProjectionShape& s : shapes) {
      const std::string why = fp8_block_shape_reason(s.n, s.k);
      FP8PROJ_CHECK(why.empty(), "--shape ", s.n, "x", s.k, ": ", why, "; floor measures the block-scaled FP8 path");
    }
  } else {
    const std::vector<std::string> models =
        !a.models.empty() ? parse_models(a.models) : std::vector<std::string>{"glm5", "deepseek-v3"};
    const std::vector<int> tps = parse_int_list(!a.tp.empty() ? a.tp : "1,2,4,8");
    check_tp_sizes(models, tps);
    // Every distinct dense GEMM shape of the block (the shipped table's rows), the first name kept.
    for (const auto& model : models)
      for (int t : tps)
        for (const ProjectionShape& s : dense_gemm_shapes(model, t))
          if (std::none_of(shapes.begin(), shapes.end(),
                           [&](const ProjectionShape& o) { return o.n == s.n && o.k == s.k; }))
            shapes.push_back(s);
  }
  const std::vector<int64_t> ms = parse_m_list(!a.m.empty() ? a.m : "1,4,16,32,64");
  FP8PROJ_CHECK(ms.back() <= kMaxFloorM, "--m ", ms.back(), " is above ", kMaxFloorM,
                ": floor measures decode-sized batches (use bench for prefill)");
  FP8PROJ_CHECK(!a.launch_once || (a.json.empty() && a.reps == 0),
                "--launch-once times nothing: --json and --reps do not apply (--csv names its launch manifest)");
  check_outputs({{"--csv", a.csv}, {"--json", a.json}});
  // Measured on the GPU only: a CPU time would say nothing about where a GPU's time goes.
  const DeviceInfo& dev = current_device();
  FP8PROJ_CHECK(gpu_available(), "fp8proj floor measures on a GPU and there is none (",
                dev.present ? "not usable" : dev.why_absent, "); nothing was measured");
  FP8PROJ_CHECK(dev.is_sm90(), "fp8proj floor measures the sm_90 FP8 GEMM; this GPU is ", dev.arch(),
                "; nothing was measured");

  if (a.launch_once) return run_launch_once(shapes, ms, a.csv);

  fmt::print("fp8proj floor -- {}\n", space_banner(MemorySpace::device));
  TimingOptions topt;
  topt.reps = a.reps > 0 ? a.reps : 50;
  topt.warmup = 5;
  topt.flush_l2 = true;
  const ReadBandwidth& bw = measured_read_bandwidth();
  const auto l2 = static_cast<size_t>(dev.l2_bytes);
  fmt::print("read bandwidth: {:.0f} GB/s (the read kernel over {:.2f} GiB, best of {}); weight-byte floor = FP8 "
             "weight bytes (values + scales) / that\n",
             bw.bytes_per_s / 1e9, bw.bytes / double(1 << 30), bw.runs);
  fmt::print("timing: median of {} per variant, interleaved call by call, after {} warm-up, L2 flushed before each "
             "timed call or replay; graph = replay time / R calls over W weight copies (W x bytes >= {:.0f} x L2, "
             "W <= {})\n",
             topt.reps, topt.warmup, kL2Factor, kMaxCopies);
  fmt::print("columns: eager/graph = the call (activation quantization + GEMM); x flr = time / weight-byte floor; "
             "fixed = graph - floor (time the bytes do not explain); K=128 = the same GEMM at K = 128 in graph replay, "
             "an estimate of prologue + epilogue; gate = path under policy all\n");
  std::fflush(stdout);

  const int sms = dev.sm_count;
  const int64_t max_m = ms.back();
  Buffer sink(MemorySpace::device, read_kernel_sink_words() * sizeof(uint32_t));
  std::vector<ShapeFloor> floors;
  std::vector<Row> rows;
  std::map<std::pair<int64_t, int64_t>, std::pair<double, int>> k128;  // (N, M) -> (graph us, copies)
  for (const ProjectionShape& s : shapes) {
    ShapeFloor f;
    f.shape = s;
    f.label = shape_name(s);
    f.weight_bytes = fp8_weight_bytes(s.n, s.k);
    f.copies = rotation_copies(f.weight_bytes, l2, kL2Factor, kMaxCopies);
    f.calls = graph_calls(f.copies, kMinGraphCalls);
    f.floor_us = byte_floor_us(double(f.weight_bytes), bw.bytes_per_s);

    Tensor w = random_bf16(MemorySpace::device, s.n, s.k, 11, 0.02f);
    Tensor x = random_bf16(MemorySpace::device, max_m, s.k, 12, 1.0f);
    Tensor y = random_bf16(MemorySpace::device, max_m, s.n, 13, 1.0f);
    auto layers = rotation_layers(w, s.n, s.k, f.copies, max_m, f.label + " fp8");
    ProjectionOptions go;  // the gate as an engine runs it under policy all (path column only)
    go.name = f.label;
    go.fp8 = true;
    go.policy = Fp8Policy::all;
    go.max_tokens = round_up(max_m, 4);
    go.apply_env = false;
    ProjectionLayer gate(MemorySpace::device, w.data(), s.n, s.k, go);
    const size_t held = layers[0]->memory().fp8_values + layers[0]->memory().fp8_scales;
    FP8PROJ_CHECK(held == f.weight_bytes, f.label, ": the FP8 copy holds ", held, " B, the floor counts ",
                  f.weight_bytes, " B");

    // The floors: empty kernel and the weight read, eager and in graph replay over the W copies.
    std::vector<Fp8WeightView> copies;
    for (auto& l : layers) copies.push_back(*l->fp8_weight());
    const size_t scale_bytes = f.weight_bytes - static_cast<size_t>(s.n * s.k);
    auto read = [&, scale_bytes](const Fp8WeightView& v, StreamHandle st) {
      launch_read_kernel(v.values, static_cast<size_t>(v.n * v.k), v.scales, scale_bytes, sink.data<uint32_t>(), st);
    };
    CapturedCalls empty_graph([](int, StreamHandle st) { launch_empty_kernel(st); }, f.calls);
    CapturedCalls read_graph([&](int i, StreamHandle st) { read(copies[static_cast<size_t>(i) % copies.size()], st); },
                             f.calls);
    const std::vector<double> t0 = time_interleaved(
        MemorySpace::device,
        {[](StreamHandle st) { launch_empty_kernel(st); }, [&](StreamHandle st) { empty_graph.replay(st); },
         [&](StreamHandle st) { read(copies[0], st); }, [&](StreamHandle st) { read_graph.replay(st); }},
        topt);
    f.empty_eager_us = t0[0];
    f.empty_graph_us = t0[1] / f.calls;
    f.read_eager_us = t0[2];
    f.read_graph_us = t0[3] / f.calls;

    // The K = 128 companion of this N, unless an earlier shape measured it.
    const bool need_k128 = std::any_of(ms.begin(), ms.end(), [&](int64_t m) { return !k128.count({s.n, m}); });
    std::unique_ptr<Tensor> w128;
    std::vector<std::unique_ptr<ProjectionLayer>> layers128;
    int copies128 = 0, calls128 = 0;
    if (need_k128) {
      copies128 = rotation_copies(fp8_weight_bytes(s.n, 128), l2, kL2Factor, kMaxCopiesK128);
      calls128 = graph_calls(copies128, kMinGraphCalls);
      w128 = std::make_unique<Tensor>(random_bf16(MemorySpace::device, s.n, 128, 14, 0.02f));
      layers128 = rotation_layers(*w128, s.n, 128, copies128, max_m, fmt::format("{}x128 fp8", s.n));
    }

    fmt::print("\n{} ({}x{}): FP8 weight {:.2f} MB; W = {} copies ({:.1f} x L2), R = {} calls per replay\n", f.label,
               s.n, s.k, f.weight_bytes / 1e6, f.copies, double(f.copies) * f.weight_bytes / double(l2), f.calls);
    fmt::print("  floor {:.2f} us | read kernel: eager {:.2f} us, graph {:.2f} us ({:.0f} GB/s) | empty kernel: eager "
               "{:.2f} us, graph {:.2f} us\n",
               f.floor_us, f.read_eager_us, f.read_graph_us, achieved_gbps(double(f.weight_bytes), f.read_graph_us),
               f.empty_eager_us, f.empty_graph_us);
    fmt::print("  {:>5} {:<28} {:>5} {:>4} {:>9} {:>9} {:>7} {:>7} {:>8} {:>8} {:>8} {:>8}  {}\n", "M", "config", "CTAs",
               "SMs", "eager us", "graph us", "e x flr", "g x flr", "e GB/s", "g GB/s", "fixed us", "K=128 us", "gate");
    for (int64_t m : ms) {
      Row r;
      r.shape = floors.size();
      r.m = m;
      const Selection sel = layers[0]->select({m, s.n, s.k, InputLayout::bf16_rows});
      r.config = layers[0]->explain(m).config;
      r.ctas = config_grid_ctas(sel.config, sel.rows, s.n, s.k, sms);
      r.sms_busy = std::min<int64_t>(r.ctas, sms);
      r.gate_path = to_string(gate.path_for(m));
      auto graph = capture_rotation(layers, f.calls, x.data(), m, y.data());
      std::vector<std::function<void(StreamHandle)>> fns = {
          [&](StreamHandle st) { layers[0]->forward(x.data(), m, y.data(), st); },
          [&](StreamHandle st) { graph->replay(st); }};
      std::unique_ptr<CapturedCalls> graph128;
      if (!k128.count({s.n, m})) {
        graph128 = capture_rotation(layers128, calls128, x.data(), m, y.data());
        fns.push_back([&](StreamHandle st) { graph128->replay(st); });
      }
      const std::vector<double> t = time_interleaved(MemorySpace::device, fns, topt);
      r.eager_us = t[0];
      r.graph_us = t[1] / f.calls;
      if (graph128) k128[{s.n, m}] = {t[2] / calls128, copies128};
      std::tie(r.k128_graph_us, r.k128_copies) = k128[{s.n, m}];
      const double bytes = double(f.weight_bytes);
      fmt::print("  {:>5} {:<28} {:>5} {:>4} {:>9.2f} {:>9.2f} {:>7} {:>7} {:>8.0f} {:>8.0f} {:>8.2f} {:>8.2f}  {}\n", m,
                 r.config, r.ctas > 0 ? std::to_string(r.ctas) : "-", r.ctas > 0 ? std::to_string(r.sms_busy) : "-",
                 r.eager_us, r.graph_us, fmt_x(floor_ratio(r.eager_us, f.floor_us)),
                 fmt_x(floor_ratio(r.graph_us, f.floor_us)), achieved_gbps(bytes, r.eager_us),
                 achieved_gbps(bytes, r.graph_us), r.graph_us - f.floor_us, r.k128_graph_us, r.gate_path);
      rows.push_back(r);
    }
    floors.push_back(f);
    std::fflush(stdout);
  }

  // Summary: graph replay against the bound the GEMM cannot beat, max(weight-byte floor, the
  // replayed empty kernel).
  double log_sum = 0, worst = 0, fixed_sum = 0;
  int within2 = 0;
  const Row* worst_row = nullptr;
  std::vector<double> fixed;
  for (const Row& r : rows) {
    const ShapeFloor& f = floors[r.shape];
    const double ratio = r.graph_us / std::max(f.floor_us, f.empty_graph_us);
    log_sum += std::log(ratio);
    within2 += ratio <= 2.0;
    if (ratio > worst) worst = ratio, worst_row = &r;
    fixed.push_back(r.graph_us - f.floor_us);
    fixed_sum += fixed.back();
  }
  std::sort(fixed.begin(), fixed.end());
  const double geo = std::exp(log_sum / double(rows.size()));
  fmt::print("\nsummary: {} shapes x {} M = {} points; graph-replay call / max(weight-byte floor, replayed empty "
             "kernel): geo-mean {:.2f}x, worst {:.2f}x ({} M={}), {} of {} within 2x; fixed cost (graph - floor) "
             "median {:.2f} us; read bandwidth {:.0f} GB/s\n",
             floors.size(), ms.size(), rows.size(), geo, worst, floors[worst_row->shape].label, worst_row->m, within2,
             rows.size(), fixed[fixed.size() / 2], bw.bytes_per_s / 1e9);

  auto row_fields = [&](const Row& r) {
    const ShapeFloor& f = floors[r.shape];
    const double bytes = double(f.weight_bytes);
    return nlohmann::json{{"label", f.label},
                          {"model", f.shape.model},
                          {"gemm", f.shape.gemm},
                          {"tp", f.shape.tp},
                          {"n", f.shape.n},
                          {"k", f.shape.k},
                          {"m", r.m},
                          {"weight_bytes", f.weight_bytes},
                          {"copies", f.copies},
                          {"calls_per_graph", f.calls},
                          {"rotation_l2_ratio", double(f.copies) * bytes / double(l2)},
                          {"floor_us", f.floor_us},
                          {"empty_eager_us", f.empty_eager_us},
                          {"empty_graph_us", f.empty_graph_us},
                          {"read_eager_us", f.read_eager_us},
                          {"read_graph_us", f.read_graph_us},
                          {"call_eager_us", r.eager_us},
                          {"call_graph_us", r.graph_us},
                          {"eager_gbps", achieved_gbps(bytes, r.eager_us)},
                          {"graph_gbps", achieved_gbps(bytes, r.graph_us)},
                          {"eager_floor_ratio", floor_ratio(r.eager_us, f.floor_us)},
                          {"graph_floor_ratio", floor_ratio(r.graph_us, f.floor_us)},
                          {"fixed_us", r.graph_us - f.floor_us},
                          {"k128_graph_us", r.k128_graph_us},
                          {"k128_copies", r.k128_copies},
                          {"config", r.config},
                          {"ctas", r.ctas},
                          {"sms_busy", r.sms_busy},
                          {"sm_count", sms},
                          {"gate_path", r.gate_path}};
  };
  if (!a.csv.empty()) {
    const std::vector<std::string> cols = {
        "label",          "model",           "gemm",          "tp",          "n",
        "k",              "m",               "weight_bytes",  "copies",      "calls_per_graph",
        "rotation_l2_ratio", "floor_us",     "empty_eager_us", "empty_graph_us", "read_eager_us",
        "read_graph_us",  "call_eager_us",   "call_graph_us", "eager_gbps",  "graph_gbps",
        "eager_floor_ratio", "graph_floor_ratio", "fixed_us", "k128_graph_us", "k128_copies",
        "config",         "ctas",            "sms_busy",      "sm_count",    "gate_path"};
    std::string csv;
    for (size_t i = 0; i < cols.size(); ++i) {
      if (i) csv += ',';
      csv += cols[i];
    }
    csv += '\n';
    for (const Row& r : rows) {
      const nlohmann::json j = row_fields(r);
      for (size_t i = 0; i < cols.size(); ++i) {
        const nlohmann::json& v = j.at(cols[i]);
        if (i) csv += ',';
        if (v.is_string())
          csv += csv_escape(v.get<std::string>());
        else if (v.is_number_float())
          csv += fmt::format("{:.4f}", v.get<double>());
        else
          csv += v.dump();
      }
      csv += "\n";
    }
    write_text(a.csv, csv);
  }
  if (!a.json.empty()) {
    nlohmann::json j;
    j["stamp"] = result_stamp();
    j["timing"] = {{"reps", topt.reps},          {"warmup", topt.warmup},       {"l2_flush", topt.flush_l2},
                   {"statistic", "median"},      {"l2_factor", kL2Factor},      {"max_copies", kMaxCopies},
                   {"max_copies_k128", kMaxCopiesK128}, {"min_graph_calls", kMinGraphCalls}};
    j["read_bandwidth"] = {{"bytes_per_s", bw.bytes_per_s}, {"bytes", bw.bytes}, {"runs", bw.runs},
                           {"best_us", bw.best_us}};
    j["l2_bytes"] = l2;
    j["summary"] = {{"points", rows.size()},       {"geomean_vs_bound", geo}, {"worst_vs_bound", worst},
                    {"within_2x", within2},        {"median_fixed_us", fixed[fixed.size() / 2]},
                    {"mean_fixed_us", fixed_sum / double(rows.size())}};
    for (const Row& r : rows) j["rows"].push_back(row_fields(r));
    write_text(a.json, j.dump(1) + "\n");
  }
}

}  // namespace

void register_floor(CLI::App& app) {
  auto args = std::make_shared<FloorArgs>();
  auto* cmd = app.add_subcommand(
      "floor",
      "Where a small-M FP8 GEMM's time goes (GPU only): the call eager and in CUDA-graph replay over enough weight "
      "copies to defeat L2, beside an empty kernel, a pure read of the weight's bytes and the weight-byte floor "
      "(bytes / measured read bandwidth); config, CTAs, SMs busy; fixed cost = graph time - floor; the same GEMM at "
      "K = 128 in graph replay estimates prologue + epilogue (docs/decode.md)");
  auto* model = cmd->add_option("--model", args->models,
                                "Model(s): glm5, deepseek-v3, deepseek-v2-lite (default glm5,deepseek-v3); every "
                                "distinct dense GEMM shape of the block (q_b_proj, o_proj, fused_qkv_a, kv_b_proj)");
  auto* tp = cmd->add_option("--tp", args->tp, "Tensor-parallel size(s) (default 1,2,4,8)");
  cmd->add_option("--shape", args->shapes, "Explicit NxK shape(s) instead of models (N % 16 == 0, K % 128 == 0)")
      ->excludes(model)
      ->excludes(tp);
  cmd->add_option("--m", args->m, fmt::format("Token counts, e.g. '1,16,64' (default 1,4,16,32,64; at most {})",
                                              kMaxFloorM));
  cmd->add_option("--reps", args->reps, "Timed calls (or replays) per variant (default 50)")
      ->transform(int_in(1, kMaxCliReps));
  cmd->add_flag("--launch-once", args->launch_once,
                "For a profiler (Nsight Compute): launch each kernel once per shape and M (weight read, empty kernel, "
                "activation quantization + GEMM, the K = 128 call), untimed, no graphs; --csv writes the launch "
                "manifest scripts/floor_table.py pairs with the profiler's rows");
  cmd->add_option("--csv", args->csv, "Write one row per shape and M as CSV (scripts/floor_table.py reads it)");
  cmd->add_option("--json", args->json,
                  "Write the rows, the read bandwidth and the summary as JSON with the GPU stamp");
  cmd->callback([args] { run_floor(*args); });
}

}  // namespace fp8proj::cli

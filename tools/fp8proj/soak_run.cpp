// One soak iteration (soak.hpp, Runner): the drawn calls on the drawn stream, eagerly or
// captured in a CUDA graph and replayed, each into its own guarded, poisoned output; then the
// checks. Any exception (a CUDA error included) ends the iteration as a failure, with the
// context's state after it.
#include <algorithm>
#include <optional>

#include <fmt/format.h>

#include "fp8proj/error.hpp"
#include "fp8proj/timing.hpp"
#include "soak.hpp"

namespace fp8proj::cli::soak {

Runner::Runner(MemorySpace space, const Streams& streams, GroupCache& cache, Inject inject,
               std::function<void(const Launch&)> on_launch)
    : space_(space),
      streams_(streams),
      cache_(cache),
      inject_(std::move(inject)),
      on_launch_(std::move(on_launch)),
      in_(space),
      out_(space) {}

Launch Runner::describe_launch(const Draw& d, size_t call, const std::string& mode) const {
  const Call& c = d.calls[call];
  Launch l;
  l.path = path_of(d.entry, c.kind);
  l.variant = variant_of(c);
  l.stream = d.stream;
  l.graph = d.graph && mode.rfind("graph", 0) == 0;
  l.flush = c.flush;
  l.text = fmt::format("seed {} iteration {} call {}: {} {}x{} M={}{} {} on the {} layer: {}; stream {}; {}; {}",
                       d.seed, d.iteration, call, d.shape.label, d.shape.n, d.shape.k, d.m,
                       d.m > d.max_tokens ? fmt::format(" (chunks of {})", d.max_tokens) : "", to_string(d.entry),
                       to_string(c.kind), launch_what_[call], Streams::name(d.stream), mode,
                       c.flush ? "L2 flushed before" : "no flush");
  return l;
}

void Runner::enqueue(const Draw& d, size_t call, ProjectionLayer& l, bf16* y, StreamHandle s) const {
  if (d.calls[call].flush) flush_l2(s);
  switch (d.entry) {
    case Entry::forward: l.forward(in_.x(), d.m, y, s); break;
    case Entry::rmsnorm: l.forward_rmsnorm(in_.x(), d.x_stride, in_.norm_weight(), kRmsNormEps, d.m, y, s); break;
    case Entry::quantized: l.forward_quantized(in_.quantized(), y, s); break;
  }
}

IterationResult Runner::run(const Draw& d) {
  IterationResult r;
  try {
    LayerGroup& g = cache_.get(d.shape, d.seed, d.max_tokens);
    std::vector<ProjectionLayer*> layers;
    launch_what_.clear();
    for (size_t i = 0; i < d.calls.size(); ++i) {
      ProjectionLayer& l = g.layer(d.calls[i]);
      layers.push_back(&l);
      const Explanation e = l.explain(d.m);
      r.explains.push_back(e.to_string());
      launch_what_.push_back(e.backend.empty() ? to_string(e.path)
                                               : fmt::format("{} via {}{}", to_string(e.path), e.backend,
                                                             e.config.empty() ? "" : " [" + e.config + "]"));
      if (d.calls[i].kind == Kind::config && d.m > 0 && e.config != d.calls[i].config && ++r.config_fallbacks)
        r.notes.push_back(fmt::format("call {}: {} cannot run these rows; {} ran instead", i, d.calls[i].config,
                                      e.config));
    }
    in_.prepare(d);
    out_.prepare(d.outputs(), d.m, d.shape.n);
    for (int o = 0; o < d.outputs(); ++o) {
      const size_t c = o < static_cast<int>(d.calls.size()) ? static_cast<size_t>(o) : 0;
      r.outputs.push_back(fmt::format("output {}: call {}{} ({})", o, c, o == static_cast<int>(d.calls.size()) ? " again (twin)" : "",
                                      launch_what_[c]));
    }

    if (space_ == MemorySpace::device) device_synchronize();
    const StreamHandle s = streams_.get(d.stream);
    if (d.graph) {
      Graph graph;
      graph.begin(s);
      for (size_t i = 0; i < d.calls.size(); ++i) enqueue(d, i, *layers[i], out_.out(static_cast<int>(i)), s);
      graph.end(s);
      const int replays = d.replays * d.burst;
      for (int rep = 0; rep < replays; ++rep) {
        out_.poison_async(static_cast<int>(d.calls.size()), s);  // every replay must write everything
        for (size_t i = 0; i < d.calls.size(); ++i)
          on_launch_(describe_launch(d, i, fmt::format("graph replay {}/{}", rep + 1, replays)));
        graph.launch(s);
      }
    } else {
      for (int b = 0; b < d.burst; ++b)
        for (size_t i = 0; i < d.calls.size(); ++i) {
          on_launch_(describe_launch(d, i, d.burst > 1 ? fmt::format("eager {}/{}", b + 1, d.burst) : "eager"));
          enqueue(d, i, *layers[i], out_.out(static_cast<int>(i)), s);
          if (d.sync_each && space_ == MemorySpace::device) synchronize(s);
        }
    }
    if (d.twin) {
      on_launch_(describe_launch(d, 0, "eager (twin of call 0)"));
      enqueue(d, 0, *layers[0], out_.out(static_cast<int>(d.calls.size())), s);
    }
    if (space_ == MemorySpace::device) synchronize(s);
    inject(d, r);
    check(d, g, r);
  } catch (const std::exception& e) {
    r.error = e.what();
    if (space_ == MemorySpace::device) r.context = context_state();
  }
  return r;
}

void Runner::inject(const Draw& d, IterationResult& r) const {
  if (inject_.kind.empty() || inject_.iteration != static_cast<int64_t>(d.iteration)) return;
  if (d.m == 0) {
    r.notes.push_back("--inject-fault: M = 0, no output to corrupt");
    return;
  }
  const int64_t n = d.shape.n;
  if (inject_.kind == "guard") {
    out_.poke_guard_after(0);
  } else if (inject_.kind == "unwritten") {
    out_.poke_element(0, d.m * n - 1, kPoison);
  } else {  // value: 29952 (bf16 0x46EA) in a sampled row, where outputs are O(1)
    const auto row = std::find_if(d.sample_rows.begin(), d.sample_rows.end(), [&](int64_t i) { return i != d.nan_row; });
    if (row == d.sample_rows.end()) {
      r.notes.push_back("--inject-fault value: no sampled row to corrupt");
      return;
    }
    out_.poke_element(0, *row * n, 0x46EA);
  }
  r.notes.push_back("--inject-fault " + inject_.kind + ": output 0 corrupted by the soak after the calls");
}

void Runner::check(const Draw& d, LayerGroup& g, IterationResult& r) {
  std::optional<std::vector<double>> ref[2];  // bf16, FP8: computed when an output needs it
  std::vector<uint16_t>& bits = bits_;  // reused: an output is up to 2 GB
  std::vector<uint16_t> first;
  for (int o = 0; o < d.outputs(); ++o) {
    const bool twin = o == static_cast<int>(d.calls.size());
    const Call& c = d.calls[twin ? 0 : o];
    const bool fp8 = c.kind != Kind::bf16;
    if (!ref[fp8]) ref[fp8] = reference_rows(d, in_, g, fp8);
    OutputCheck chk = check_output(d, out_, o, fp8, *ref[fp8], twin ? &first : nullptr, bits);
    if (o == 0 && d.twin) first.swap(bits);  // kept for the twin; bits is refilled next
    const bool values_wrong = chk.compared && !(chk.rel_err <= chk.tol);
    r.guard_writes += (chk.guard.before || chk.guard.after) ? 1 : 0;
    r.wrong_outputs += (chk.unwritten || chk.non_finite || chk.nan_row_finite || values_wrong || chk.bits_differ) ? 1 : 0;
    r.checks.push_back(std::move(chk));
  }
}

}  // namespace fp8proj::cli::soak

// What one soak iteration runs (soak.hpp): drawn from Rng(seed, iteration) and the run's fixed
// DrawSpace only, so `fp8proj soak --replay SEED:ITER` draws exactly the same work.
#include <algorithm>
#include <cmath>
#include <set>

#include <fmt/format.h>

#include "fp8proj/error.hpp"
#include "fp8proj/models.hpp"
#include "soak.hpp"
#include "tune_common.hpp"

namespace fp8proj::cli::soak {

// ---- randomness ----

uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

Rng::Rng(uint64_t seed, uint64_t key) : state_(mix(seed) ^ mix(~key)) {}

uint64_t Rng::next() {
  state_ += 0x9E3779B97F4A7C15ull;
  return mix(state_);
}

int64_t Rng::uniform(int64_t lo, int64_t hi) {
  FP8PROJ_CHECK(lo <= hi, "Rng::uniform: empty range [", lo, ", ", hi, "]");
  const auto span = static_cast<uint64_t>(hi - lo) + 1;  // 0 only for the full range, never asked
  return lo + static_cast<int64_t>(next() % span);
}

double Rng::unit() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

int64_t Rng::log_uniform(int64_t lo, int64_t hi) {
  const double v = std::exp(std::log(double(lo)) + unit() * (std::log(double(hi) + 1) - std::log(double(lo))));
  return std::clamp(static_cast<int64_t>(v), lo, hi);
}

// Keys of the draws that are not iterations (iterations count up from 0 and never get there).
constexpr uint64_t kSmallShapesKey = ~uint64_t{0};
constexpr uint64_t kGroupKey = ~uint64_t{0} - 1;

// ---- names ----

const char* to_string(Entry e) {
  switch (e) {
    case Entry::forward: return "forward";
    case Entry::rmsnorm: return "forward_rmsnorm";
    case Entry::quantized: return "forward_quantized";
  }
  return "?";
}

const char* to_string(Kind k) {
  switch (k) {
    case Kind::bf16: return "bf16";
    case Kind::tuned: return "fp8 tuned";
    case Kind::heuristic: return "fp8 heuristic";
    case Kind::config: return "fp8 forced";
    case Kind::cublaslt: return "cublaslt_fp8_block";
  }
  return "?";
}

std::string path_of(Entry e, Kind k) {
  if (e == Entry::rmsnorm) return "rmsnorm";
  if (e == Entry::quantized) return "quantized";
  return k == Kind::bf16 ? "bf16" : k == Kind::cublaslt ? "cublaslt" : "fp8";
}

std::string variant_of(const Call& c) {
  switch (c.kind) {
    case Kind::bf16: return "bf16";
    case Kind::tuned: return "tuned";
    case Kind::heuristic: return "heuristic";
    case Kind::config: return c.config;
    case Kind::cublaslt: return "cublaslt_fp8_block";
  }
  return "?";
}

// ---- shapes ----

std::vector<SoakShape> model_shapes(bool gpu) {
  std::vector<SoakShape> out;
  std::set<std::pair<int64_t, int64_t>> seen;
  for (const char* model : {"glm5", "deepseek-v3"})
    for (int tp : {1, 2, 4, 8})
      for (const ProjectionShape& s : dense_gemm_shapes(model, tp)) {
        SoakShape t{s.n, s.k, fmt::format("{} {} TP{}", s.model, s.gemm, s.tp)};  // the first of a shared shape
        if (!gpu) {
          // The CPU reference at small sizes: about N/32 x K/16 (N a multiple of 16, K of 128),
          // at most 1024 x 1024, so that an iteration takes milliseconds on 2 cores.
          t.n = std::clamp<int64_t>(round_up(s.n / 32, 16), 16, 1024);
          t.k = std::clamp<int64_t>(round_up(s.k / 16, 128), 128, 1024);
          t.label += fmt::format(" (scaled from {}x{})", s.n, s.k);
        }
        if (seen.insert({t.n, t.k}).second) out.push_back(t);
      }
  return out;
}

std::vector<SoakShape> small_shapes(uint64_t seed, bool gpu) {
  Rng r(seed, kSmallShapesKey);
  std::vector<SoakShape> out;
  for (int i = 0; i < 16; ++i) {
    SoakShape s;
    s.n = 16 * (gpu ? r.log_uniform(1, 256) : r.uniform(1, 48));
    s.k = 128 * (gpu ? r.log_uniform(1, 32) : r.uniform(1, 6));
    s.label = "small";
    out.push_back(s);
  }
  return out;
}

int64_t group_max_tokens(uint64_t seed, const SoakShape& s, int64_t max_m, bool chunking) {
  Rng r(seed ^ mix(static_cast<uint64_t>(s.n) << 32 ^ static_cast<uint64_t>(s.k)), kGroupKey);
  const int64_t whole = round_up(std::max<int64_t>(max_m, 4), 4);
  // One shape in four runs large M in chunks (ProjectionLayer's max_tokens): the chunk loop and
  // its shorter last launch are code paths too.
  return chunking && r.chance(0.25) ? round_up(std::max<int64_t>(max_m / 3, 4), 4) : whole;
}

uint64_t weight_seed(uint64_t seed, const SoakShape& s) {
  return mix(seed ^ mix(static_cast<uint64_t>(s.n) * 1000003u + static_cast<uint64_t>(s.k)));
}

// ---- the draw ----

namespace {

// M: partial last tiles of the kernels' tile heights (t * B + r, r small or B - 1), M spread
// log-uniformly over [1, max M], and now and then M = 0.
int64_t draw_m(Rng& r, const DrawSpace& s) {
  if (!s.fixed_m.empty()) return s.fixed_m[r.uniform(0, static_cast<int64_t>(s.fixed_m.size()) - 1)];
  const double u = r.unit();
  if (u < 0.03) return 0;
  const int64_t base = r.log_uniform(1, s.max_m);
  if (u < 0.55) {
    static constexpr int64_t kTile[] = {16, 32, 64, 128, 256};
    const int64_t b = kTile[r.uniform(0, 4)];
    const int64_t rest = r.chance(0.15) ? b - 1 : r.uniform(0, 7);  // 0: the last tile exactly full
    return std::clamp<int64_t>(base / b * b + rest, 1, s.max_m);
  }
  return base;
}

struct Option {
  Kind kind;
  std::string config;
  double weight;
};

// The FP8 layers a call may run on for this problem, `total` weight shared among them: the tuned
// layer 35%, the heuristic 15%, the forced configurations 50% (each the same).
void add_fp8_variants(const DrawSpace& s, int64_t rows, int64_t n, int64_t k, double total, std::vector<Option>& out,
                      std::string& note) {
  std::vector<std::string> configs;
  if (s.candidates && rows > 0) {
    const std::vector<std::string> legal = s.candidates(rows, n, k);
    if (s.all_configs) configs = legal;
    for (const std::string& c : s.configs)
      if (std::find(legal.begin(), legal.end(), c) != legal.end() &&
          std::find(configs.begin(), configs.end(), c) == configs.end())
        configs.push_back(c);
    if (!s.configs.empty() && configs.empty() && !s.all_configs)
      note = fmt::format("none of --configs runs M={} N={} K={}; the heuristic runs instead", rows, n, k);
  } else if (s.candidates && !s.configs.empty()) {
    configs = s.configs;  // M = 0: nothing runs, any name is as good
  }
  const bool heuristic = s.heuristic || !note.empty();
  const double w_tuned = s.tuned ? 0.35 : 0, w_heur = heuristic ? 0.15 : 0, w_cfg = configs.empty() ? 0 : 0.5;
  const double sum = w_tuned + w_heur + w_cfg;
  if (sum == 0) return;
  if (w_tuned > 0) out.push_back({Kind::tuned, "", total * w_tuned / sum});
  if (w_heur > 0) out.push_back({Kind::heuristic, "", total * w_heur / sum});
  for (const std::string& c : configs) out.push_back({Kind::config, c, total * w_cfg / sum / double(configs.size())});
}

std::vector<Option> options_for(const DrawSpace& s, Entry e, int64_t rows, int64_t n, int64_t k, std::string& note) {
  std::vector<Option> out;
  const bool cublaslt = s.cublaslt && s.cublaslt_ok && s.cublaslt_ok(n, k);
  switch (e) {
    case Entry::forward:
      if (s.bf16) out.push_back({Kind::bf16, "", 2});
      if (s.fp8) add_fp8_variants(s, rows, n, k, 6, out, note);
      if (cublaslt) out.push_back({Kind::cublaslt, "", 1});
      break;
    case Entry::rmsnorm:  // the fused RMSNorm + quantize on FP8 layers; RMSNorm, then bf16, on bf16
      if (s.bf16) out.push_back({Kind::bf16, "", 1});
      add_fp8_variants(s, rows, n, k, 4, out, note);
      if (cublaslt) out.push_back({Kind::cublaslt, "", 0.5});
      break;
    case Entry::quantized:
      add_fp8_variants(s, rows, n, k, 4, out, note);
      if (cublaslt) out.push_back({Kind::cublaslt, "", 0.5});
      break;
  }
  return out;
}

template <class T>
const T& pick_weighted(Rng& r, const std::vector<T>& options) {
  double sum = 0;
  for (const T& o : options) sum += o.weight;
  double u = r.unit() * sum;
  for (const T& o : options) {
    if (u < o.weight) return o;
    u -= o.weight;
  }
  return options.back();
}

std::vector<int64_t> draw_sample_rows(Rng& r, int64_t m, int64_t n) {
  std::vector<int64_t> rows;
  // Every row while the host check stays cheap; else the first, the last and 8 others.
  if (m * n <= 32768 || m <= 10) {
    for (int64_t i = 0; i < m; ++i) rows.push_back(i);
    return rows;
  }
  std::set<int64_t> set = {0, m - 1};
  while (set.size() < 10) set.insert(r.uniform(1, m - 2));
  return {set.begin(), set.end()};
}

}  // namespace

Draw draw(const DrawSpace& s, uint64_t seed, uint64_t iteration) {
  Rng r(seed, iteration);
  Draw d;
  d.seed = seed;
  d.iteration = iteration;
  const bool model = !s.model.empty() && (s.small.empty() || r.chance(s.p_model));
  const std::vector<SoakShape>& pool = model ? s.model : s.small;
  FP8PROJ_CHECK(!pool.empty(), "soak: no shape to draw from");
  d.shape = pool[r.uniform(0, static_cast<int64_t>(pool.size()) - 1)];
  const int64_t n = d.shape.n, k = d.shape.k;
  d.m = draw_m(r, s);
  d.max_tokens = group_max_tokens(seed, d.shape, s.max_m, s.chunking);
  const int64_t rows = std::min(d.m, d.max_tokens);  // a launch's rows (the configuration's M)

  // The entry: forward 60%, forward_rmsnorm 20%, forward_quantized 20%, among those with a layer.
  struct EntryOption {
    Entry e;
    double weight;
  };
  std::vector<EntryOption> entries;
  std::string note;
  for (const EntryOption& eo : {EntryOption{Entry::forward, 0.6}, {Entry::rmsnorm, 0.2}, {Entry::quantized, 0.2}}) {
    const bool allowed = eo.e == Entry::forward   ? (s.bf16 || s.fp8 || s.cublaslt)
                         : eo.e == Entry::rmsnorm ? s.rmsnorm
                                                  : s.quantized;
    std::string why;
    if (allowed && !options_for(s, eo.e, rows, n, k, why).empty()) entries.push_back(eo);
  }
  FP8PROJ_CHECK(!entries.empty(), "soak: --paths and --configs leave nothing to run at ", n, "x", k, " M=", d.m);
  d.entry = pick_weighted(r, entries).e;
  const std::vector<Option> options = options_for(s, d.entry, rows, n, k, note);
  d.note = note;

  static constexpr float kStddev[] = {1, 1, 1, 0.05f, 20};  // 1x128 scales from 2^-13 to 2^-4
  d.x_stddev = kStddev[r.uniform(0, 4)];
  d.x_stride = d.entry == Entry::rmsnorm && r.chance(0.5) ? k + 8 * r.uniform(1, 8) : k;
  d.stream = s.streams > 0 ? static_cast<int>(r.uniform(0, s.streams)) : 0;
  d.graph = s.graphs && d.stream != 0 && d.m > 0 && r.chance(0.3);  // no capture on the legacy stream
  d.replays = d.graph ? static_cast<int>(r.uniform(1, 3)) : 1;
  const int64_t count = r.uniform(1, 3);
  for (int64_t i = 0; i < count; ++i) {
    const Option& o = pick_weighted(r, options);
    d.calls.push_back({o.kind, o.config, s.flush && r.chance(0.5)});
  }
  d.burst = s.burst;
  d.sync_each = !d.graph && r.chance(0.5);
  d.twin = r.chance(0.5);
  if (d.m > 0 && r.chance(0.06)) {  // a NaN (or an infinity) in one input row
    d.nan_row = r.uniform(0, d.m - 1);
    d.nan_col = r.uniform(0, k - 1);
    d.nan_inf = r.chance(0.33);
  }
  d.sample_rows = draw_sample_rows(r, d.m, n);
  d.data_seed = r.next();
  return d;
}

std::string Draw::describe() const {
  std::string calls_text;
  for (size_t i = 0; i < calls.size(); ++i)
    calls_text += fmt::format("{}{}: {}{}{}", i ? "; " : "", i, to_string(calls[i].kind),
                              calls[i].kind == Kind::config ? " " + calls[i].config : "",
                              calls[i].flush ? ", L2 flushed before" : "");
  std::string nan = "none";
  if (nan_row >= 0) nan = fmt::format("{} at row {}, column {}", nan_inf ? "+inf" : "NaN", nan_row, nan_col);
  return fmt::format(
      "seed {} iteration {}: {} {}x{} M={} (workspace rows {}{}), {} x_stride={} x~N(0,{}^2); stream {}; {}; "
      "calls [{}]{}; planted: {}; rows checked against the oracle: {}{}",
      seed, iteration, shape.label, shape.n, shape.k, m, max_tokens, m > max_tokens ? ", chunked" : "",
      to_string(entry), x_stride, x_stddev, Streams::name(stream),
      graph ? fmt::format("CUDA graph, replayed {}x", replays * burst)
            : fmt::format("eager{}{}", burst > 1 ? fmt::format(", {}x over", burst) : "",
                          sync_each ? ", synchronised after each call" : ""),
      calls_text,
      twin ? "; twin of call 0 (eager, last)" : "", nan, sample_rows.size(),
      note.empty() ? "" : "; note: " + note);
}

}  // namespace fp8proj::cli::soak

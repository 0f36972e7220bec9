// fp8proj explain: for each dense GEMM of a model's MLA block at a TP size (q_b_proj, o_proj,
// and fused_qkv_a / kv_b_proj, which the block runs in FP8 when opted in), which path and
// backend would run at each M and why, and what the FP8 copy costs in memory.
#include <fmt/format.h>

#include "commands.hpp"
#include "common.hpp"
#include "fp8proj/mla.hpp"
#include "fp8proj/projection.hpp"

namespace fp8proj::cli {

namespace {
struct ExplainArgs {
  std::vector<std::string> models = {"glm5"};
  std::string tp = "1";
  std::string m = "1,64,512,513,4096,32768";
  std::vector<std::string> shapes;
  bool fp8 = false;
  std::string policy;
  bool cpu = false;
};

// The input the MLA block gives a model's projection (a block starting from its input, not the
// residual stream); bf16 rows for an explicit --shape (gemm "gemm", no projection of the block).
InputLayout block_input(const ProjectionShape& s) {
  for (MlaProjection which : {MlaProjection::fused_qkv_a, MlaProjection::q_b_proj, MlaProjection::kv_b_proj,
                              MlaProjection::o_proj})
    if (s.gemm == to_string(which)) return mla_input_layout(MlaConfig::preset(s.model, s.tp), which, false);
  return InputLayout::bf16_rows;
}

void run_explain(const ExplainArgs& a) {
  const MemorySpace space = choose_space(a.cpu);
  // Every argument resolved before anything prints. Any N x K is explained: one outside the
  // FP8 rule (fp8_block_shape_reason) takes bf16, and the explanation gives the rule's reason.
  std::vector<ProjectionShape> shapes;
  if (!a.shapes.empty()) {
    shapes = parse_shapes(a.shapes);
  } else {
    const std::vector<std::string> models = parse_models(a.models);
    const std::vector<int> tps = parse_int_list(a.tp);
    check_tp_sizes(models, tps);
    for (const auto& model : models)
      for (int tp : tps)
        for (auto& s : dense_gemm_shapes(model, tp)) shapes.push_back(s);  // fused_qkv_a, kv_b_proj too
  }
  const std::vector<int64_t> ms = parse_m_list(a.m);
  fmt::print("{}\n", space_banner(space));
  for (const auto& s : shapes) {
    Tensor w = random_bf16(space, s.n, s.k, 1, 0.02f);
    ProjectionOptions o;
    o.name = s.label();
    o.fp8 = a.fp8;
    if (a.policy == "all") o.policy = Fp8Policy::all;
    ProjectionLayer layer(space, w.data(), s.n, s.k, o);
    const ProjectionMemory mem = layer.memory();
    fmt::print("\n{}  (FP8 {}, policy {})\n", s.label(), layer.options().fp8 ? "on" : "off",
               to_string(layer.options().policy));
    fmt::print("  memory: bf16 weight {:.1f} MiB, FP8 copy {:.1f} MiB + scales {:.1f} KiB (+{:.1f}%), "
               "workspace {:.1f} MiB\n",
               mem.bf16_weight / 1048576.0, mem.fp8_values / 1048576.0, mem.fp8_scales / 1024.0,
               100.0 * mem.fp8_overhead(), mem.workspace / 1048576.0);
    // As the MLA block calls it (mla_input_layout): behind a norm that writes its FP8 input, the
    // gate follows the bucket's GEMM-alone time. Where that verdict differs from the one on bf16
    // rows (e.g. a module called on bf16 activations), both are shown.
    const bool behind_norm = block_input(s) == InputLayout::bf16_rmsnorm;
    if (behind_norm) fmt::print("  as the MLA block calls it: behind q_a_layernorm, which writes its FP8 input\n");
    for (int64_t m : ms) {
      const Explanation rows = layer.explain(m);
      if (!behind_norm) {
        fmt::print("  {}\n", rows.to_string());
        continue;
      }
      const Explanation normed = layer.explain(m, InputLayout::bf16_rmsnorm);
      fmt::print("  {}\n", normed.to_string());
      if (normed.path != rows.path) fmt::print("    on bf16 rows instead: {}\n", rows.to_string());
    }
  }
}
}  // namespace

void register_explain(CLI::App& app) {
  auto args = std::make_shared<ExplainArgs>();
  auto* cmd = app.add_subcommand("explain", "Which path each projection takes at each M, and why");
  auto* model = cmd->add_option("--model", args->models, "Model(s): glm5, deepseek-v3, deepseek-v2-lite")
                    ->capture_default_str();
  auto* tp = cmd->add_option("--tp", args->tp, "Tensor-parallel size(s), e.g. 1,4")->capture_default_str();
  cmd->add_option("--m", args->m, "Token counts: list '1,64,512' or range '1-32768'")->capture_default_str();
  cmd->add_option("--shape", args->shapes, "Explicit NxK shape(s) instead of a model")->excludes(model)->excludes(tp);
  cmd->add_flag("--fp8", args->fp8, "Opt in to FP8 (as FP8PROJ_PREFILL_FP8=1 would; the variable still wins)");
  cmd->add_option("--policy", args->policy, "prefill (default) or all")->check(CLI::IsMember({"prefill", "all"}));
  cmd->add_flag("--cpu", args->cpu, "Use the CPU reference even if a GPU is present");
  cmd->callback([args] { run_explain(*args); });
}

}  // namespace fp8proj::cli

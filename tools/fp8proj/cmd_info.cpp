// fp8proj info: the GPU, its architecture, the backends and why any is missing, the tuned
// table in use, and the environment knobs as this process sees them.
#include <cstdlib>

#include <fmt/format.h>

#include "commands.hpp"
#include "common.hpp"
#include "fp8proj/env.hpp"
#include "fp8proj/selection.hpp"
#include "fp8proj/gemm.hpp"
#include "fp8proj/tune.hpp"

namespace fp8proj::cli {

void register_info(CLI::App& app) {
  auto* cmd = app.add_subcommand("info", "GPU, architecture, backends, tuned table in use");
  cmd->callback([] {
    const DeviceInfo& d = current_device();
    fmt::print("fp8proj {} (CUDA in this build: {})\n", fp8proj_version(), built_with_cuda() ? "yes" : "no");
    if (d.present) {
      fmt::print("GPU {}: {} ({}), {} SMs, L2 {} MB, {} GB, SM clock {} MHz, memory clock {} MHz\n", d.index, d.name,
                 d.arch(), d.sm_count, d.l2_bytes >> 20, d.global_mem_bytes >> 30, d.sm_clock_khz / 1000,
                 d.mem_clock_khz / 1000);
      fmt::print("driver CUDA {}, runtime {}, cuBLASLt {}\n", d.driver_version, d.runtime_version,
                 d.cublaslt_version);
      fmt::print("FP8 kernels (sm_90a): {}\n", d.is_sm90() ? "supported" : "not for this architecture");
    } else {
      fmt::print("GPU: none ({})\n", d.why_absent);
    }
    fmt::print("\nbackends:\n");
    for (const auto& [name, why] : backend_status())
      fmt::print("  {:<20} {}\n", name, why.empty() ? "available" : "unavailable: " + why);
    fmt::print("\ntuned table: ");
    if (const TuneTable* t = active_tune_table())
      fmt::print("{} ({} shapes, measured on {} with fp8proj {})\n", t->source, t->shapes.size(), t->stamp.gpu_name,
                 t->stamp.fp8proj_version);
    else
      fmt::print("none (thresholds default to {})\n", kDefaultThreshold);
    fmt::print("\nenvironment:\n");
    for (const char* k : {"FP8PROJ_PREFILL_FP8", "FP8PROJ_MIN_FP8_TOKENS", "FP8PROJ_DECODE_CEILING",
                          "FP8PROJ_FP8_BACKEND", "FP8PROJ_WEIGHT_SCALES", "FP8PROJ_TUNE_FILE", "FP8PROJ_LOG_LEVEL",
                          "FP8PROJ_RANK", "FP8PROJ_WORLD_SIZE", "FP8PROJ_LOCAL_RANK", "FP8PROJ_NCCL_ID_FILE", "FP8PROJ_NCCL_ID",
                          "FP8PROJ_NCCL_TIMEOUT_S", "FP8PROJ_NCCL_BLOCKING", "FP8PROJ_NCCL_LIBRARY"})
      fmt::print("  {:<24} {}\n", k, env::get(k).value_or("(unset)"));
    // The two kernel-launch knobs with the default they fall back to.
    fmt::print("  {:<24} {}\n", "FP8PROJ_PDL",
               env::get("FP8PROJ_PDL").value_or(env::kDefaultPdl ? "(unset: 1, on)" : "(unset: 0, off)"));
    fmt::print("  {:<24} {}\n", "FP8PROJ_WATCHDOG_MS",
               env::get("FP8PROJ_WATCHDOG_MS").value_or(fmt::format("(unset: {})", env::kDefaultWatchdogMs)));
  });
}

}  // namespace fp8proj::cli

// fp8proj: does block-scaled FP8 pay for the MLA projections on this GPU, from which M on,
// and at what cost in memory and accuracy?
#include <cstdio>
#include <exception>

#include "commands.hpp"
#include "common.hpp"
#include "fp8proj/device.hpp"

int main(int argc, char** argv) {
  CLI::App app{"fp8proj " + fp8proj::fp8proj_version() +
               " -- gated block-scaled FP8 for the MLA projections (q_b_proj, o_proj)"};
  app.require_subcommand(1);
  fp8proj::cli::register_info(app);
  fp8proj::cli::register_bench(app);
  fp8proj::cli::register_verify(app);
  fp8proj::cli::register_explain(app);
  fp8proj::cli::register_tune(app);
  fp8proj::cli::register_tp(app);
  fp8proj::cli::register_layer(app);
  fp8proj::cli::register_soak(app);
  fp8proj::cli::register_floor(app);
  fp8proj::cli::refuse_blank_values(app);
  try {
    fp8proj::cli::refuse_empty_assignments(argc, argv);
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  // Output that could not be written (stdout on a full disk, /dev/full, a closed pipe) is a
  // failure, not a silent success.
  if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
    std::fprintf(stderr, "fp8proj: writing the output failed\n");
    return 1;
  }
  return 0;
}

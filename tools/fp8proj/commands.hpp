// Each subcommand registers itself on the app; the callback runs it.
#pragma once

#include <CLI/CLI.hpp>

namespace fp8proj::cli {

void register_info(CLI::App& app);
void register_bench(CLI::App& app);
void register_verify(CLI::App& app);
void register_explain(CLI::App& app);
void register_tune(CLI::App& app);
void register_tp(CLI::App& app);
void register_layer(CLI::App& app);
void register_soak(CLI::App& app);
void register_floor(CLI::App& app);

}  // namespace fp8proj::cli

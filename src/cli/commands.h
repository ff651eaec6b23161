#pragma once
// Each file in cli/ registers its subcommands on the app; main.cpp calls every register_*.
#include <CLI/CLI.hpp>
#include <string>

namespace ms::cli {

void register_model_commands(CLI::App& app);  // logits, generate, inspect
void register_tokenize_commands(CLI::App& app);  // tokenize, detokenize
void register_text_commands(CLI::App& app);  // run, chat
void register_expert_commands(CLI::App& app);  // simulate, profile
void register_convert_commands(CLI::App& app);  // convert
void register_synth_commands(CLI::App& app);  // synth
void register_serve_commands(CLI::App& app);  // serve
void register_bench_commands(CLI::App& app);  // bench

// --out and the routed experts' --expert-bits/--expert-group: what convert and synth both write.
void add_engine_output_options(CLI::App* cmd, std::string& out, int& expert_bits, int& expert_group);

}  // namespace ms::cli

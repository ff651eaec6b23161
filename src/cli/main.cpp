// moestream: run Mixture-of-Experts models larger than memory.
#include <cstdio>
#include <exception>

#include "cli/commands.h"
#include "util/error.h"

int main(int argc, char** argv) {
  CLI::App app{"moestream: Mixture-of-Experts inference that streams experts from disk"};
  // At most one command; "none" is checked after parsing so that an unknown command is
  // reported by name rather than as a missing one.
  app.require_subcommand(0, 1);
  app.set_help_all_flag("--help-all", "Help for every command");
  ms::cli::register_model_commands(app);
  ms::cli::register_tokenize_commands(app);
  ms::cli::register_text_commands(app);
  ms::cli::register_expert_commands(app);
  ms::cli::register_convert_commands(app);
  ms::cli::register_synth_commands(app);
  ms::cli::register_serve_commands(app);
  ms::cli::register_bench_commands(app);
  try {
    app.parse(argc, argv);
    if (app.get_subcommands().empty()) {
      std::fprintf(stderr, "moestream: a command is required (see --help)\n");
      return 2;
    }
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // Wrong arguments: one line saying why, exit status 2.
    std::fprintf(stderr, "moestream: %s (see --help)\n", e.what());
    return 2;
  } catch (const ms::Error& e) {
    std::fprintf(stderr, "moestream: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moestream: internal error: %s\n", e.what());
    return 1;
  }
  return 0;
}

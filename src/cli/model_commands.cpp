#include "cli/commands.h"

namespace ms::cli {
void register_model_commands(CLI::App&) {}
}  // namespace ms::cli

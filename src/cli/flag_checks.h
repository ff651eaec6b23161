#pragma once
// Validators for the commands' flags: a nonsense value is refused while the arguments are
// parsed (exit 2, one line naming the flag), before any model is loaded. CLI11's own Range and
// PositiveNumber let NaN through (every comparison with it is false); these do not.
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace ms::cli {

// A finite real number in [lo, hi], or (lo, hi] with open_low.
CLI::Validator real_in(double lo, double hi, bool open_low = false);
// A whole number in [lo, hi], written in decimal without a fraction or exponent.
CLI::Validator int_in(long long lo, long long hi);
// A size parse_bytes reads ("8G", "512M", "1000000"): at least one byte.
CLI::Validator byte_size();
// Text that `parse` (a function that throws ms::Error naming the text) accepts.
CLI::Validator parses_with(void (*parse)(const std::string&), const char* what);
// Anything but the empty string.
CLI::Validator non_empty();
// KEY<sep>BITS[,KEY<sep>BITS...] with each KEY one of `keys` (none given: a layer number or
// "mtp") and BITS an expert width convert writes (2, 3, 4, 8, 16).
CLI::Validator bits_list(char sep, const std::vector<std::string>& keys = {});

}  // namespace ms::cli

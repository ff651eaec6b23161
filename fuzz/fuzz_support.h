#pragma once
// What the fuzz targets share. The loaders read paths, so each input is written to a scratch
// directory of the process's own (in tmpfs where there is one) before it is loaded.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <exception>

namespace ms::fuzz {

// A directory unique to this process, created at the first call and removed at exit.
const std::string& scratch_dir();

// Writes the bytes to scratch_dir()/name and returns that path.
std::string write_scratch(const std::string& name, const uint8_t* data, size_t size);

// The file of the source tree at `relative` (e.g. "models/pycoder-moe-q4/config.json").
std::string source_path(const std::string& relative);

// The deepest nesting of arrays and objects in JSON text (strings skipped), without parsing.
size_t json_depth(std::string_view text);

// An input refused with ms::Error, the expected outcome: printed when MOESTREAM_FUZZ_PRINT is
// set (to see why the inputs of a replay are refused), ignored otherwise.
void refused(const std::exception& e);

// A loader accepted input it should have refused: reports `what` and aborts, so libFuzzer
// keeps the input as a finding like any crash.
[[noreturn]] void accepted_invalid(std::string_view what);

}  // namespace ms::fuzz

#!/usr/bin/env bash
# Builds and runs every test. Reference data comes from $MOESTREAM_SHARED (default ../shared).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
ctest --test-dir build --output-on-failure -j"$(nproc)" "$@"
# The whole suite (no ctest arguments) is followed by the fuzz targets and their regression
# replay (docs/TESTING.md); MOESTREAM_FUZZ_SECONDS=0 leaves them out.
seconds=${MOESTREAM_FUZZ_SECONDS:-30}
if (($# == 0)) && ((seconds > 0)); then
  bash scripts/fuzz.sh "$seconds"
fi

#!/usr/bin/env bash
# Builds and runs every test. Reference data comes from $MOESTREAM_SHARED (default ../shared).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
ctest --test-dir build --output-on-failure -j"$(nproc)" "$@"

#!/usr/bin/env bash
# Installs the build and test dependencies (Debian 12 packages) that are missing.
set -euo pipefail
pkgs=(cmake ninja-build g++ pkg-config nlohmann-json3-dev libboost-dev libcpp-httplib-dev liburing-dev libpcre2-dev
      libutf8proc-dev libhwy-dev libfmt-dev libcli11-dev libxxhash-dev libgtest-dev libbenchmark-dev
      clang-14 libclang-rt-14-dev  # clang-14 and its libFuzzer runtime: the fuzz targets (scripts/fuzz.sh)
      python3-numpy python3-yaml  # the test data generators (tests/data; gguf-py imports yaml)
      chromium)  # the dashboard's browser test (tests/server/node/dashboard_browser.mjs)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The npm clients of the server's client tests (tests/server/node: openai, @anthropic-ai/sdk,
# the AI SDK, LangChain), pinned by its lock file.
if command -v npm >/dev/null 2>&1; then
  here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
  (cd "$here/tests/server/node" && npm ci --no-audit --no-fund)
fi

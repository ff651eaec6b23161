#!/usr/bin/env bash
# MTP self-speculative decoding on the CPU (not a test): decode tok/s of pycoder-moe-q4 with
# every expert resident and with 32 and 16 slots a layer, plain and with MTP drafts at K = 1, 2, 3 and
# auto (`moestream bench`: medians, --draft auto's measurements kept across the repeats as a
# server's session keeps them), then the experts read per token at 16 slots (`generate --stats`);
# with SYNTH=<engine dir of an 80B synth made with --mtp> the same plain / auto pair on it (a
# random head: auto must stay at plain's speed). Needs a quiet machine.
#
#   [SYNTH=<dir>] bench/mtp_bench.sh
#
# Environment: MOESTREAM (default build/moestream), TOKENS (256), REPEAT (5).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${MOESTREAM:-$ROOT/build/moestream}
MODEL=$ROOT/models/pycoder-moe-q4
TOKENS=${TOKENS:-256}
REPEAT=${REPEAT:-5}
DRAFTS=("off" "mtp --draft 1" "mtp --draft 2" "mtp --draft 3" "mtp --draft auto")

for slots in "" "--expert-slots 32" "--expert-slots 16"; do
  for spec in "${DRAFTS[@]}"; do
    echo "== pycoder-moe-q4 ${slots:-all resident}, --speculative $spec"
    # shellcheck disable=SC2086
    "$BIN" bench --model "$MODEL" $slots --prompt 0 --tokens "$TOKENS" --repeat "$REPEAT" --no-preload \
      --speculative $spec | grep -E "^tg|speculative|measured"
  done
done
for spec in "${DRAFTS[@]}"; do
  echo "== pycoder-moe-q4 16 slots, experts read, --speculative $spec"
  # shellcheck disable=SC2086
  "$BIN" generate --model "$MODEL" --expert-slots 16 --ids 563,279,1002,14,220 --max-tokens "$TOKENS" --ignore-eos \
    --stats --speculative $spec 2>&1 >/dev/null | grep -E "^ +total|decode|speculative"
done
if [[ -n ${SYNTH:-} ]]; then
  for spec in "off" "mtp --draft auto" "off" "mtp --draft auto"; do
    echo "== $SYNTH, every expert resident, --speculative $spec"
    # shellcheck disable=SC2086
    "$BIN" bench --model "$SYNTH" --prompt 0 --tokens 64 --repeat 3 --speculative $spec | grep -E "^tg|speculative|measured"
  done
fi

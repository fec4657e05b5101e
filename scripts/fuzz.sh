#!/usr/bin/env bash
# Coverage-guided fuzzing with cargo-fuzz (libFuzzer) on the machine's stable toolchain
# (no sanitizer: the instrumentation needs no nightly flags then).
#   bash scripts/fuzz.sh                 # every target, 30 s each
#   bash scripts/fuzz.sh tx_decode 600   # one target, 10 minutes
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
targets=${1:-"jsonrpc_parse tx_decode config_parse"}
seconds=${2:-30}
for target in $targets; do
  echo "== $target, ${seconds}s"
  cargo fuzz run --sanitizer none -O "$target" -- -max_total_time="$seconds" 2>&1 | grep -E "^Done|DONE|SUMMARY|panicked" | tail -2
done

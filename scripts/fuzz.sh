#!/usr/bin/env bash
# Coverage-guided fuzzing with libFuzzer on the machine's stable toolchain. The targets are built
# with the flags `cargo fuzz build --sanitizer none` uses (so neither nightly nor cargo-fuzz is
# needed), then each runs from its corpus (fuzz/corpus, grown by each run) and the committed seeds
# (fuzz/seeds). A crash fails the script and leaves its input in fuzz/artifacts/TARGET/.
#   bash scripts/fuzz.sh                 # every target, 30 s each
#   bash scripts/fuzz.sh tx_decode 600   # one target, 10 minutes
#   bash scripts/fuzz.sh all 5           # every target, 5 s each, open-ended (random seed, growing corpus)
#   bash scripts/fuzz.sh all fixed       # the test command: the committed seeds, then a fixed number
#                                        # of runs with seed 1 from them alone; the same inputs each time
#                                        # for the same build, so an unrelated change cannot turn it red
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
all="jsonrpc_parse tx_decode config_parse quic_intake access_credentials multicall_answers"
targets=${1:-all}
[ "$targets" = all ] && targets=$all
seconds=${2:-30}
# Runs per target in the fixed mode: a few seconds each here (quic_intake drives real QUIC round trips).
fixed_runs() {
  case $1 in
    quic_intake) echo 200 ;;
    config_parse) echo 20000 ;;
    access_credentials) echo 200000 ;;
    *) echo 500000 ;;
  esac
}
triple=$(rustc -vV | sed -n 's/^host: //p')
flags="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4"
flags+=" -Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table"
flags+=" -Cllvm-args=-sanitizer-coverage-trace-compares -Cllvm-args=-simplifycfg-branch-fold-threshold=0"
flags+=" -Cllvm-args=-sanitizer-coverage-stack-depth -Cdebug-assertions --cfg fuzzing"
# --target keeps the instrumentation out of build scripts and proc macros, as cargo-fuzz does.
RUSTFLAGS="$flags" cargo build --locked --release --target "$triple" \
  --config 'profile.release.debug="line-tables-only"' --bins -q
for target in $targets; do
  mkdir -p "corpus/$target" "artifacts/$target" "seeds/$target"
  log=$(mktemp)
  if [ "$seconds" = fixed ]; then
    # A fresh corpus from the seeds alone, a fixed seed and count: deterministic for one build.
    corpus_dir=$(mktemp -d)
    budget=(-runs="$(fixed_runs "$target")" -seed=1)
  else
    corpus_dir="corpus/$target"
    budget=(-max_total_time="$seconds")
  fi
  if ! "${CARGO_TARGET_DIR:-target}/$triple/release/$target" "$corpus_dir" "seeds/$target" "${budget[@]}" \
      -artifact_prefix="artifacts/$target/" -print_final_stats=1 >"$log" 2>&1; then
    grep -m1 -A1 'panicked at' "$log" || true  # the message; the backtrace below can be long
    tail -40 "$log"
    echo "== $target: FAILED (the input is in fuzz/artifacts/$target/)"
    exit 1
  fi
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  edges=$(grep -oE 'cov: [0-9]+' "$log" | tail -1 | cut -d' ' -f2)
  corpus=$(find "$corpus_dir" -type f | wc -l)
  how=$([ "$seconds" = fixed ] && echo "fixed, seed 1" || echo "${seconds}s")
  echo "== $target, $how: ${runs:-?} runs, ${edges:-?} edges covered, corpus $corpus inputs, no crash"
  rm -f "$log"
  if [ "$seconds" = fixed ]; then rm -rf "$corpus_dir"; fi
done

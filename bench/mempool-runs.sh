#!/usr/bin/env bash
# The mempool's in-process bench (crates/sluice-mempool/benches/mempool.rs) run RUNS times on the
# work tree as it is: one row per run (the median over its rounds of batched intake / two-thread
# ceiling, the same by CPU, each with its lowest and highest round), then the median of the
# runs' medians. On a shared 2-core machine a run's median moves from run to run by a few
# hundredths, with 21 rounds as with 9 (docs/mempool.md, "Many runs"): a verdict on the intake
# goal reads the median of several runs, not one.
#   RUNS=9 bash bench/mempool-runs.sh
# MEMPOOL_NONCES and MEMPOOL_ROUNDS pass through to the bench.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-5}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

exe=$(cargo bench -q -p sluice-mempool --bench mempool --no-run --message-format=json | python3 -c '
import json, sys
exes = [m["executable"] for m in map(json.loads, sys.stdin)
        if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "mempool"]
print(exes[-1])')

echo "| run | batched / ceiling, median (lowest–highest) | by CPU, median (lowest–highest) |"
echo "|---:|---:|---:|"
for run in $(seq "$RUNS"); do
  "$exe" --bench >"$work/$run.out" 2>/dev/null
  python3 - "$work/$run.out" "$run" <<'PY'
import re, sys
out = open(sys.argv[1]).read()
cell = lambda label: re.search(r"\| " + re.escape(label) + r", median of \d+ rounds[^|]*\| ([^|]+)\|", out).group(1).strip()
print(f"| {sys.argv[2]} | {cell('batched / the ceiling')} | {cell('the ceiling / whole intake by CPU')} |")
PY
done
python3 - "$work" "$RUNS" <<'PY'
import re, statistics, sys
work, runs = sys.argv[1], int(sys.argv[2])
for label in ("batched / the ceiling", "the ceiling / whole intake by CPU"):
    medians = [float(re.search(r"\| " + re.escape(label) + r", median of \d+ rounds[^|]*\| ([0-9.]+)×",
                               open(f"{work}/{run}.out").read()).group(1)) for run in range(1, runs + 1)]
    print(f"{label}: median of the runs' medians {statistics.median(medians):.2f}× "
          f"(runs {min(medians):.2f}–{max(medians):.2f}; {sum(m >= 0.90 for m in medians)} of {runs} at 0.90 or more)")
PY
shape=$(grep -o '^signing .*' "$work/1.out" | tr -d '…')
rounds=$(grep -o 'median of [0-9]* rounds' "$work/1.out" | head -1)
echo "machine: $(nproc) cores, $(uname -m); each run: ${shape#signing }, the $rounds; runs one after the other"

#!/usr/bin/env bash
# The mempool's in-process bench (crates/sluice-mempool/benches/mempool.rs) for two versions side by
# side: each version's bench binary is built once, then the two run in turn, RUNS times each
# (MEMPOOL_ROUNDS rounds per run), so that the machine's drift, which on a shared 2-core machine
# is larger than most changes, falls on both alike. Prints one row per run: the median of
# batched intake / two-thread ceiling, the same by CPU, and the writer's and the async workers'
# CPU per transaction over the rounds; then the median of the runs' medians for each version.
#   RUNS=3 MEMPOOL_ROUNDS=5 bash bench/mempool-ab.sh BASE [NEW]
# BASE and NEW are git revisions (from 7bf8e6e on: the bench in rounds); without NEW, the work
# tree as it is (uncommitted changes included) is the new side.
# With BENCH=REV, both versions run REV's bench (benches/mempool.rs), so that what changed in
# the bench itself does not count as a change of the code it measures (NEW is then needed).
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: bash bench/mempool-ab.sh BASE [NEW]" >&2; exit 2; }
[ -z "${BENCH:-}" ] || [ $# -ge 2 ] || { echo "BENCH=REV needs NEW: the work tree is not changed" >&2; exit 2; }
RUNS=${RUNS:-3}
export MEMPOOL_ROUNDS=${MEMPOOL_ROUNDS:-5}
top=$PWD
work=$(mktemp -d)
trees=()
cleanup() {
  for t in "${trees[@]}"; do git -C "$top" worktree remove --force "$t" >/dev/null 2>&1 || true; done
  rm -rf "$work"
  git -C "$top" worktree prune
}
trap cleanup EXIT

# build SOURCE_DIR OUT: builds the bench in SOURCE_DIR (sharing this checkout's target directory,
# so dependencies are built once) and copies the binary to OUT.
# The workspace's sources are touched first. Cargo names a workspace crate's build by its path
# inside the workspace, so both trees share one build of each crate, and it rebuilds only for
# sources newer than that build: without the touch, the second tree built here, whose files
# were last changed before the first tree was built, got the first tree's crates.
build() {
  local exe
  if [ -n "${BENCH:-}" ]; then
    git -C "$top" show "$BENCH:crates/sluice-mempool/benches/mempool.rs" >"$1/crates/sluice-mempool/benches/mempool.rs"
  fi
  find "$1/crates" -name '*.rs' -exec touch {} +
  exe=$(cd "$1" && CARGO_TARGET_DIR="$top/target" cargo bench -q -p sluice-mempool --bench mempool --no-run \
    --message-format=json | python3 -c '
import json, sys
exes = [m["executable"] for m in map(json.loads, sys.stdin)
        if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "mempool"]
print(exes[-1])')
  cp "$exe" "$2"
}

# checkout REV: a detached worktree of REV, its path in $tree.
checkout() {
  tree="$work/tree-$1"
  git worktree add -q --detach "$tree" "$1" >&2
  trees+=("$tree")
}

echo "building the bench at $1 and at ${2:-the work tree}${BENCH:+, both with the bench of $BENCH}…" >&2
checkout "$1"
build "$tree" "$work/base"
if [ $# -ge 2 ]; then checkout "$2"; else tree=$top; fi
build "$tree" "$work/new"
if cmp -s "$work/base" "$work/new"; then
  echo "note: the two builds are the same binary (the revisions differ in nothing the bench runs)" >&2
fi

# summary OUT ERR: "wall | by CPU | writer range | async range" of one run.
summary() {
  python3 - "$1" "$2" <<'PY'
import re, sys
out, err = open(sys.argv[1]).read(), open(sys.argv[2]).read()
def median_row(*labels):
    for label in labels:
        m = re.search(r"\| " + re.escape(label) + r", median of \d+ rounds[^|]*\| ([0-9.]+)×", out)
        if m:
            return m.group(1)
    return "?"
def cpu(group):
    values = [float(v) for v in re.findall(group + r" ([0-9.]+)", err)]
    return f"{min(values):.1f}–{max(values):.1f}" if values else "?"
print(" | ".join([median_row("batched / the ceiling"), median_row("the ceiling / whole intake by CPU", "decode + recover alone / whole intake by CPU"),
                  cpu("mempool-writer"), cpu("tokio-rt-worker")]))
PY
}

echo "| run | version | batched / ceiling, median | by CPU, median | writer µs per tx | async workers µs per tx |"
echo "|---:|---|---:|---:|---:|---:|"
for run in $(seq "$RUNS"); do
  for side in base new; do
    "$work/$side" --bench >"$work/$side.$run.out" 2>"$work/$side.$run.err"
    label=$([ "$side" = base ] && echo "$1" || echo "${2:-work tree}")
    echo "| $run | $label | $(summary "$work/$side.$run.out" "$work/$side.$run.err") |"
  done
done
python3 - "$work" "$RUNS" "$1" "${2:-work tree}" <<'PY'
import re, statistics, sys
work, runs, names = sys.argv[1], int(sys.argv[2]), {"base": sys.argv[3], "new": sys.argv[4]}
print()
for side in ("base", "new"):
    medians = []
    for run in range(1, runs + 1):
        m = re.search(r"\| batched / the ceiling, median of \d+ rounds[^|]*\| ([0-9.]+)×", open(f"{work}/{side}.{run}.out").read())
        if m:
            medians.append(float(m.group(1)))
    if medians:
        print(f"{names[side]}: median of the runs' medians {statistics.median(medians):.2f}× ({', '.join(f'{v:.2f}' for v in medians)})")
PY
echo "machine: $(nproc) cores, $(uname -m); each run signs its transactions, then the rounds; versions alternate${BENCH:+; both run the bench of $BENCH}"

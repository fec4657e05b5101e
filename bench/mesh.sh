#!/usr/bin/env bash
# The peer mesh: N nodes in one process (QUIC on loopback, memory pools), transactions injected
# at random nodes; delivered / lost / redundant / failed, streams, propagation latency,
# send-to-verdict times, CPU and memory per node. One row per node count and rate.
#   NODES="50 100 200 500" RATES="10 20" TXS=200 bash bench/mesh.sh
#   EXTRA="--max-batch 1 --max-in-flight 256" bash bench/mesh.sh     # one transaction per stream
set -euo pipefail
cd "$(dirname "$0")/.."
NODES=${NODES:-"50 100 200 500"}
RATES=${RATES:-"20"}
TXS=${TXS:-200}
DEGREE=${DEGREE:-3}
EXTRA=${EXTRA:-}
cargo build --release -q -p sluice --features sluice-bench/stand-ins  # the memory pool
echo "Command per row: sluice bench mesh --nodes N --degree $DEGREE --txs $TXS --rate R $EXTRA"
echo
header=--header
for n in $NODES; do
  for rate in $RATES; do
    # shellcheck disable=SC2086
    target/release/sluice bench mesh --nodes "$n" --degree "$DEGREE" --txs "$TXS" --rate "$rate" $EXTRA $header \
      --log error 2>/dev/null
    header=
  done
done
echo
echo "machine: $(nproc) cores, $(uname -m); all nodes in one process"

#!/usr/bin/env bash
# The peer mesh: N nodes in one process (QUIC on loopback, memory pools), transactions injected
# at random nodes; delivered / lost / redundant, propagation latency, CPU and memory per node.
#   NODES="50 100 200" TXS=1000 RATE=500 bash bench/mesh.sh
set -euo pipefail
cd "$(dirname "$0")/.."
NODES=${NODES:-"50 100 200"}
TXS=${TXS:-1000}
RATE=${RATE:-500}
DEGREE=${DEGREE:-3}
cargo build --release -q -p sluice
echo "Command per row: sluice bench mesh --nodes N --degree $DEGREE --txs $TXS --rate $RATE"
echo
header=--header
for n in $NODES; do
  ulimit -n 65536 2>/dev/null || true
  target/release/sluice bench mesh --nodes "$n" --degree "$DEGREE" --txs "$TXS" --rate "$RATE" $header --log warn 2>/dev/null
  header=
done
echo
echo "machine: $(nproc) cores, $(uname -m); all nodes in one process"

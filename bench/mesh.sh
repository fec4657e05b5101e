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
echo "$(target/release/sluice bench mesh --help >/dev/null && echo '| nodes | links | txs | delivered | lost | redundant | failed | first relay p50 / p99 ms | everyone p50 / p99 ms | ack ms | CPU s/s per node | MiB per node |')"
echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
for n in $NODES; do
  ulimit -n 65536 2>/dev/null || true
  target/release/sluice bench mesh --nodes "$n" --degree "$DEGREE" --txs "$TXS" --rate "$RATE" --log warn 2>/dev/null
done
echo
echo "machine: $(nproc) cores, $(uname -m); all nodes in one process"

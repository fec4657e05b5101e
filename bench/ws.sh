#!/usr/bin/env bash
# Subscription fan-out: CLIENTS WebSocket clients (default 10,000), each on newHeads and a logs
# filter, one block with one log per second (BLOCKS blocks), first through a bare fan-out
# (sluice-baseline fanout: one upstream subscription per kind, each event written to every
# client from its own task, nothing else: the machine's own limit), then through sluice in front
# of the same anvil. Prints `sluice bench ws`'s summary for each: head latency from a direct
# subscriber's receipt to every client and to the last one, notifications per second, memory per
# client, upstream sockets.
#   CLIENTS=10000 BLOCKS=20 bash bench/ws.sh
source "$(dirname "$0")/lib.sh"
CLIENTS=${CLIENTS:-10000}
BLOCKS=${BLOCKS:-20}
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
cargo build --release -q -p sluice-bench --bin sluice-baseline
start_anvil
anvil_ws=${ANVIL_URL/http:/ws:}
port=$(free_port)
target/release/sluice-baseline --listen "127.0.0.1:$port" fanout --node "$anvil_ws" >/dev/null &
baseline_pid=$!
pids+=("$baseline_pid")
start_sluice SLUICE SLUICE_LIMITS__MAX_CONNECTIONS=$((CLIENTS + 100))
sluice_pid=${pids[-1]}
echo "machine: $(nproc) cores, $(uname -m); the clients, the server under test and anvil on the same machine"
echo "== bare fan-out (sluice-baseline fanout)"
target/release/sluice bench ws "ws://127.0.0.1:$port" --reference "$anvil_ws" --clients "$CLIENTS" \
  --blocks "$BLOCKS" --mine "$ANVIL_URL" --pid "$baseline_pid" "$@"
kill "$baseline_pid"
echo "== sluice"
target/release/sluice bench ws "${SLUICE/http:/ws:}" --reference "$anvil_ws" --clients "$CLIENTS" \
  --blocks "$BLOCKS" --mine "$ANVIL_URL" --pid "$sluice_pid" --metrics "$SLUICE" "$@"

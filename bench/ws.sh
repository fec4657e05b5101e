#!/usr/bin/env bash
# Subscription fan-out: CLIENTS WebSocket clients (default 10,000), each on newHeads and a logs
# filter, through sluice in front of anvil; one block with one log per second (BLOCKS blocks).
# Prints `sluice bench ws`'s summary: head fan-out latency from the block's arrival at a direct
# subscriber to the last client, notifications per second, memory per client, upstream sockets.
#   CLIENTS=10000 BLOCKS=20 bash bench/ws.sh
source "$(dirname "$0")/lib.sh"
CLIENTS=${CLIENTS:-10000}
BLOCKS=${BLOCKS:-20}
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
start_anvil
start_sluice SLUICE SLUICE_LIMITS__MAX_CONNECTIONS=$((CLIENTS + 100))
sluice_pid=${pids[-1]}
ws_url=${SLUICE/http:/ws:}
anvil_ws=${ANVIL_URL/http:/ws:}
echo "machine: $(nproc) cores, $(uname -m); sluice, anvil and the clients on the same machine"
target/release/sluice bench ws "$ws_url" --reference "$anvil_ws" --clients "$CLIENTS" --blocks "$BLOCKS" \
  --mine "$ANVIL_URL" --pid "$sluice_pid" --metrics "$SLUICE" "$@"

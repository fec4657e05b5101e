#!/usr/bin/env bash
# The terms of the memory sizing formula (docs/operations.md#memory), each measured as sluice's
# resident memory (VmRSS) on this machine, release build, default configuration:
#   idle       one network in front of anvil, 10 s after start;
#   network    each network beyond the first: three networks (three anvils, chain ids 31337 to
#              31339) against one, 10 s after start;
#   ws client  `sluice bench ws --pid`: resident memory per client holding a newHeads and a
#              logs subscription, CLIENTS clients;
#   pooled tx  TXS signed transfers held in the mempool (anvil does not mine), resident growth
#              per transaction held.
# The cache term is the memory tier's own test (cargo test -p sluice-cache --test memory_bound).
#   [CLIENTS=1000] [TXS=5000] bash bench/memory.sh
source "$(dirname "$0")/lib.sh"
CLIENTS=${CLIENTS:-1000}
TXS=${TXS:-5000}

rss_kib() { awk '/^VmRSS/ {print $2}' "/proc/$1/status"; }
metric_value() { curl -sf "$1/metrics" | awk -v s="$2" 'index($0, s) == 1 {print $NF; exit}'; }

# serve VAR PIDVAR ANVIL_URL: sluice in front of ANVIL_URL, default configuration.
serve() {
  local port; port=$(free_port)
  SLUICE_LOG=warn SLUICE_MEMPOOL__JOURNAL="$work/$1.journal" target/release/sluice serve \
    --listen "127.0.0.1:$port" --upstream "$3" >/dev/null 2>&1 &
  pids+=($!)
  printf -v "$2" '%s' "$!"
  printf -v "$1" 'http://127.0.0.1:%s' "$port"
  for _ in $(seq 100); do curl -sf -o /dev/null "http://127.0.0.1:$port/ready" && return; sleep 0.1; done
  echo "sluice did not start" >&2; exit 1
}

# Idle, and WebSocket clients (anvil mines a block per transaction the bench sends).
start_anvil
serve SLUICE SLUICE_PID "$ANVIL_URL"
sleep 10
idle=$(rss_kib "$SLUICE_PID")
ws_out=$(target/release/sluice bench ws "${SLUICE/http/ws}" --reference "${ANVIL_URL/http/ws}" --clients "$CLIENTS" \
  --blocks 3 --mine "$ANVIL_URL" --pid "$SLUICE_PID" --metrics "$SLUICE" --json 2>/dev/null)
per_client=$(python3 -c 'import json,sys; r=json.loads(sys.stdin.read()); k = r.get("kib_per_client"); print("?" if k is None else f"{k:.1f}")' <<<"$ws_out" 2>/dev/null || echo "?")

# Three networks, each in front of its own anvil.
{
  echo "[mempool]"
  echo "journal = \"$work/three.journal\""
  for id in 31337 31338 31339; do
    port=$(free_port)
    "$ANVIL" --host 127.0.0.1 --port "$port" --silent --chain-id "$id" &
    pids+=($!)
    for _ in $(seq 100); do rpc "http://127.0.0.1:$port" eth_chainId '[]' >/dev/null 2>&1 && break; sleep 0.1; done
    echo "[[networks]]"
    echo "id = \"n$id\""
    echo "chain_id = $id"
    echo "[[networks.upstreams]]"
    echo "url = \"http://127.0.0.1:$port\""
  done
} >"$work/three.toml"
port=$(free_port)
SLUICE_LOG=warn target/release/sluice serve --listen "127.0.0.1:$port" --config "$work/three.toml" >/dev/null 2>&1 &
THREE_PID=$!; pids+=($!)
for _ in $(seq 100); do curl -sf -o /dev/null "http://127.0.0.1:$port/ready" && break; sleep 0.1; done
sleep 10
three=$(rss_kib "$THREE_PID")
kill "$THREE_PID"

# Pooled transactions: anvil without mining, so that every transaction stays in the pool.
port=$(free_port)
"$ANVIL" --host 127.0.0.1 --port "$port" --silent --no-mining &
pids+=($!)
QUIET="http://127.0.0.1:$port"
for _ in $(seq 100); do rpc "$QUIET" eth_chainId '[]' >/dev/null 2>&1 && break; sleep 0.1; done
serve POOLED POOLED_PID "$QUIET"
sleep 5
before=$(rss_kib "$POOLED_PID")
senders=$(( (TXS + 15) / 16 ))
target/release/sluice bench ingest "$POOLED" --rate 1000 --duration "$(( TXS / 1000 ))s" --senders "$senders" --fund >/dev/null 2>&1
sleep 3
after=$(rss_kib "$POOLED_PID")
pending=$(metric_value "$POOLED" 'sluice_mempool_pending{')
python3 - "$idle" "$per_client" "$before" "$after" "${pending:-0}" "$CLIENTS" "$three" <<'PY'
import sys
idle, per_client, before, after, pending, clients, three = sys.argv[1:]
idle, before, after, pending, three = int(idle), int(before), int(after), float(pending), int(three)
print("| term | measured |")
print("|---|---|")
print(f"| idle, one network, default configuration | {idle / 1024:.1f} MiB |")
print(f"| each network beyond the first (three: {three / 1024:.1f} MiB) | {(three - idle) / 2 / 1024:.1f} MiB |")
print(f"| per WebSocket client (newHeads + logs), {clients} clients | {per_client} KiB |")
per_tx = (after - before) * 1024 / pending if pending else float("nan")
print(f"| per pooled transaction ({pending:.0f} held) | {per_tx:,.0f} bytes |")
PY

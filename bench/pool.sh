#!/usr/bin/env bash
# The upstream pool: its own added latency, and client errors and p99 while an upstream is
# killed under constant-rate load. Uses `sluice bench rpc --json`; cache off throughout.
#   DURATION=10s RATE=1000 bash bench/pool.sh
source "$(dirname "$0")/lib.sh"
RATE=${RATE:-1000}
secs=${DURATION%s}
BENCH=target/release/sluice
BODY_PARAMS='["0xf39fd6e51aad88f6f4ce6ab8827279cfffb92266","0x0"]'

serve() {  # serve VAR UPSTREAM…: sluice (cache off) in front of the upstreams, sets VAR
  local var=$1 port args=(); shift
  port=$(free_port)
  for u in "$@"; do args+=(--upstream "$u"); done
  # Each instance its own journal: a journal is held by one process at a time.
  env SLUICE_LOG=error SLUICE_CACHE__ENABLED=false SLUICE_POOL__BREAKER_COOLDOWN=1s SLUICE_MEMPOOL__JOURNAL="$work/$var.journal" \
    "$BENCH" serve --listen "127.0.0.1:$port" "${args[@]}" >/dev/null &
  pids+=($!)
  printf -v "$var" 'http://127.0.0.1:%s' "$port"
  for _ in $(seq 100); do curl -sf -o /dev/null "http://127.0.0.1:$port/ready" && return; sleep 0.1; done
  echo "sluice did not start" >&2; exit 1
}

field() { python3 -c "import json,sys; d=json.load(open('$1')); print($2)"; }

start_anvil; A=$ANVIL_URL
serve SINGLE "$A"
serve POOL2 "$A" "$A"   # the same healthy node twice: a pool, with nothing to fail over
"$BENCH" bench rpc "$POOL2" -c 10 -d "$DURATION" --method eth_getBalance --params "$BODY_PARAMS" --compare "$SINGLE" --rounds 3 --json > "$work/pool_vs_single.json"
"$BENCH" bench rpc "$SINGLE" -c 10 -d "$DURATION" --method eth_getBalance --params "$BODY_PARAMS" --compare "$A" --rounds 3 --json > "$work/single_vs_direct.json"

echo "### Added latency of the pool (one healthy node, c=10, cache off)"
echo
echo "| path (rows in pairs from one alternating run each) | req/s | p50 µs | p99 µs |"
echo "|---|---:|---:|---:|"
for row in "anvil directly:single_vs_direct:b" "sluice, one upstream:single_vs_direct:a" "sluice, one upstream:pool_vs_single:b" "sluice, pool of two members:pool_vs_single:a"; do
  IFS=: read -r label file side <<<"$row"
  echo "| $label | $(field "$work/$file.json" "round(d['$side']['req_per_sec'])") | $(field "$work/$file.json" "d['$side']['latency_us']['p50']") | $(field "$work/$file.json" "d['$side']['latency_us']['p99']") |"
done
echo
echo "Pool minus one upstream, same run: p50 $(field "$work/pool_vs_single.json" "d['a']['latency_us']['p50'] - d['b']['latency_us']['p50']") µs, p99 $(field "$work/pool_vs_single.json" "d['a']['latency_us']['p99'] - d['b']['latency_us']['p99']") µs."
echo

# Kill one of two upstreams a third of the way through a constant-rate run.
start_anvil; B=$ANVIL_URL
start_anvil; VICTIM=$ANVIL_URL; victim_pid=${pids[-1]}
serve POOL "$VICTIM" "$B"
"$BENCH" bench rpc "$POOL" --rate "$RATE" -d "$DURATION" --method eth_getBalance --params "$BODY_PARAMS" --json > "$work/steady.json"
( sleep "$(python3 -c "print($secs/3)")"; kill "$victim_pid" ) &
"$BENCH" bench rpc "$POOL" --rate "$RATE" -d "$DURATION" --method eth_getBalance --params "$BODY_PARAMS" --json > "$work/kill.json"

echo "### One of two upstreams killed at a third of a ${DURATION} run at ${RATE} req/s"
echo
echo "| run | requests | client errors | p50 µs | p99 µs | max µs |"
echo "|---|---:|---:|---:|---:|---:|"
for run in steady kill; do
  f="$work/$run.json"
  label=$([ "$run" = steady ] && echo "both upstreams up" || echo "upstream killed mid-run")
  echo "| $label | $(field "$f" "d['requests']") | $(field "$f" "d['requests'] - d['ok']") | $(field "$f" "d['latency_us']['p50']") | $(field "$f" "d['latency_us']['p99']") | $(field "$f" "d['latency_us']['max']") |"
done
echo
echo "machine: $(nproc) cores, $(uname -m); sluice bench rpc, $DURATION per run; anvil $("$ANVIL" --version | head -1 | cut -d' ' -f3); generator, sluice and anvil on the same machine"

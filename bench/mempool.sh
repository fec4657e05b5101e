#!/usr/bin/env bash
# The Lotus scenario, side by side in one run: pool reads (eth_getTransactionCount pending +
# eth_getTransactionByHash, half each, over pooled transactions) at concurrency 10 and 256,
# alone and while `sluice bench ingest` sends signed transactions at a fixed rate.
#   DURATION=8s RATE=20000 CONCURRENCY="10 256" bash bench/mempool.sh
# sluice's relay is off and its limits raised: this measures sluice's pool, not anvil's.
source "$(dirname "$0")/lib.sh"
RATE=${RATE:-20000}
CONCURRENCY=${CONCURRENCY:-"10 256"}
secs=${DURATION%s}
start_anvil
rpc "$ANVIL_URL" evm_setAutomine '[false]' >/dev/null
start_sluice SLUICE SLUICE_MEMPOOL__RELAY=false SLUICE_MEMPOOL__JOURNAL="$work/mempool.journal" \
  SLUICE_MEMPOOL__GLOBAL_SLOTS=10000000 SLUICE_MEMPOOL__GLOBAL_QUEUE=10000000 SLUICE_MEMPOOL__ACCOUNT_QUEUE=100000
bench() { target/release/sluice bench "$@"; }
# 2,000 pooled transactions to read.
bench ingest "$SLUICE" --rate 2000 -d 1s --senders 1000 --fund --mix-out "$work/read.toml" --json >/dev/null
field() { python3 -c "import json,sys; d=json.load(open('$1')); print($2)"; }
echo "| readers | ingest offered | accepted tx/s | refused or not sent | reads/s | read p50 / p99 µs |"
echo "|---:|---:|---:|---|---:|---:|"
run=1
for c in $CONCURRENCY; do
  bench rpc "$SLUICE" --mix "$work/read.toml" -c "$c" -d "$DURATION" --json >"$work/alone.json"
  echo "| $c | none | – | – | $(field "$work/alone.json" "round(d['req_per_sec'])") | $(field "$work/alone.json" "f\"{d['latency_us']['p50']} / {d['latency_us']['p99']}\"") |"
  # The ingest signs everything first; reads start once it is sending, and stop before it does.
  bench ingest "$SLUICE" --rate "$RATE" -d "$((secs + 3))s" --senders 2000 --first-sender $((run * 100000)) --fund \
    --json >"$work/ingest.json" 2>"$work/ingest.log" &
  ingest=$!
  until grep -q '^sending' "$work/ingest.log"; do sleep 0.2; done
  sleep 1
  bench rpc "$SLUICE" --mix "$work/read.toml" -c "$c" -d "$DURATION" --json >"$work/busy.json"
  wait "$ingest"
  echo "| $c | $RATE tx/s | $(field "$work/ingest.json" "round(d['ok'] / d['seconds'])") | $(field "$work/ingest.json" "', '.join(f'{k}: {v}' for k, v in d['errors'].items()) or 'none'") | $(field "$work/busy.json" "round(d['req_per_sec'])") | $(field "$work/busy.json" "f\"{d['latency_us']['p50']} / {d['latency_us']['p99']}\"") |"
  run=$((run + 1))
done
echo
echo "pool after: $(rpc "$SLUICE" txpool_status '[]')"
machine_line
echo "work: $work"

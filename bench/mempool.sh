#!/usr/bin/env bash
# The Lotus scenario, side by side in one run: pool reads (eth_getTransactionCount pending +
# eth_getTransactionByHash, half each, over pooled transactions) at concurrency 10 and 256,
# alone and while `sluice bench ingest` sends signed transactions at a fixed rate.
#   DURATION=8s RATE=20000 CONCURRENCY="10 256" bash bench/mempool.sh
# sluice's relay is off and its limits raised: this measures sluice's pool, not anvil's.
# INGEST_NICE=N runs the ingest generator at that niceness (19: it gets the CPU last), to see how
# much of the readers' tail comes from the generator sharing the cores. With SCHED=1 (needs
# `perf`), the scheduling delay (from wake-up to running) of the threads of sluice and of the
# readers' generator is recorded for 1.5 s during each read run, alone and busy, and summarised
# per thread name.
source "$(dirname "$0")/lib.sh"
RATE=${RATE:-20000}
CONCURRENCY=${CONCURRENCY:-"10 256"}
secs=${DURATION%s}
start_anvil
rpc "$ANVIL_URL" evm_setAutomine '[false]' >/dev/null
start_sluice SLUICE SLUICE_MEMPOOL__RELAY=false SLUICE_MEMPOOL__JOURNAL="$work/mempool.journal" \
  SLUICE_MEMPOOL__GLOBAL_SLOTS=10000000 SLUICE_MEMPOOL__GLOBAL_QUEUE=10000000 SLUICE_MEMPOOL__ACCOUNT_QUEUE=100000
sluice_pid=${pids[-1]}
bench() { target/release/sluice bench "$@"; }
[ -z "${SCHED:-}" ] || need_perf
sched_delays() {  # sched_delays PID: scheduling delay per thread name of process PID, from a perf sched recording
  perf sched timehist -i "$work/sched.data" 2>/dev/null | awk -v pid="$1" 'NR > 3 && $3 ~ "/" pid "\\]$" {print $3, $5}' |
    python3 -c "
import sys, collections
delays = collections.defaultdict(list)
for line in sys.stdin:
    name, delay = line.split()
    delays[name.split('[')[0]].append(float(delay))
for name, v in sorted(delays.items()):
    v.sort()
    print(f'  {name}: {len(v)} wake-ups, scheduling delay p50 {v[len(v) // 2]:.3f} ms, p99 {v[int(len(v) * 0.99)]:.3f} ms, max {v[-1]:.3f} ms')
"
}
# 2,000 pooled transactions to read.
bench ingest "$SLUICE" --rate 2000 -d 1s --senders 1000 --fund --mix-out "$work/read.toml" --json >/dev/null
field() { python3 -c "import json,sys; d=json.load(open('$1')); print($2)"; }
reads() {  # reads CONCURRENCY NAME: one read run into $work/NAME.json (and its scheduling delays)
  target/release/sluice bench rpc "$SLUICE" --mix "$work/read.toml" -c "$1" -d "$DURATION" --json >"$work/$2.json" &
  local run=$!
  if [ -n "${SCHED:-}" ]; then
    sleep 1
    perf sched record -q -o "$work/sched.data" -- sleep 1.5 >/dev/null 2>&1
    { echo " sluice:"; sched_delays "$sluice_pid"; echo " the readers' generator:"; sched_delays "$run"; } >"$work/sched-$2-$1.txt"
  fi
  wait "$run"
}
errors() { field "$1" "', '.join(f'{k}: {v}' for k, v in d['errors'].items()) or 'none'"; }
echo "| readers | ingest offered | accepted tx/s | refused or not sent | reads/s | read p50 / p99 µs | reads failed |"
echo "|---:|---:|---:|---|---:|---:|---|"
run=1
for c in $CONCURRENCY; do
  reads "$c" alone
  echo "| $c | none | – | – | $(field "$work/alone.json" "round(d['req_per_sec'])") | $(field "$work/alone.json" "f\"{d['latency_us']['p50']} / {d['latency_us']['p99']}\"") | $(errors "$work/alone.json") |"
  # The ingest signs everything first; reads start once it is sending, and stop before it does.
  nice -n "${INGEST_NICE:-0}" target/release/sluice bench ingest "$SLUICE" --rate "$RATE" -d "$((secs + 3))s" --senders 2000 --first-sender $((run * 100000)) --fund \
    --json >"$work/ingest.json" 2>"$work/ingest.log" &
  ingest=$!
  until grep -q '^sending' "$work/ingest.log"; do sleep 0.2; done
  sleep 1
  reads "$c" busy
  wait "$ingest"
  echo "| $c | $RATE tx/s | $(field "$work/ingest.json" "round(d['ok'] / d['seconds'])") | $(errors "$work/ingest.json") | $(field "$work/busy.json" "round(d['req_per_sec'])") | $(field "$work/busy.json" "f\"{d['latency_us']['p50']} / {d['latency_us']['p99']}\"") | $(errors "$work/busy.json") |"
  run=$((run + 1))
done
if [ -n "${SCHED:-}" ]; then
  echo
  for c in $CONCURRENCY; do
    for kind in alone busy; do
      echo "scheduling delays, reads $kind at concurrency $c:"
      cat "$work/sched-$kind-$c.txt"
    done
  done
fi
echo
echo "pool after: $(rpc "$SLUICE" txpool_status '[]')"
machine_line
echo "work: $work"

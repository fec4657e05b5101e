#!/usr/bin/env bash
# Soak: sluice's resident memory (VmRSS, sampled every 10 s) under mixed traffic for DURATION,
# against the estimate `sluice config validate` prints and against the goal of issue 60:
#   RSS ≤ idle + 1.2 × memory_bytes + the other terms (the client connections open, at the
#   measured cost of a WebSocket client, and the pooled transactions), and flat: the last
#   quarter's mean within 5 % of the second quarter's.
# Traffic, all at once, for DURATION, against anvil mining a block a second (200 blocks
# mined first):
#   * `sluice bench rpc --rate RATE`: distinct misses — eth_getBalance of random addresses at
#     `latest` and at random old blocks, eth_call and eth_getStorageAt to random addresses;
#   * WebSocket churn: WS clients connect, subscribe to newHeads and logs, wait two blocks,
#     leave; again and again (`sluice bench ws`);
#   * mempool intake: signed transfers at 20/s from 64 funded senders (`sluice bench ingest`).
# Keyed callers are not part of it (their maps are bounded and measured on their own:
# docs/operations.md#what-grows-with-traffic-and-its-bound).
#   [MEMORY=32MiB] [DURATION=10m] [RATE=2000] [WS=200] bash bench/soak.sh
source "$(dirname "$0")/lib.sh"
MEMORY=${MEMORY:-32MiB}
DURATION=${DURATION:-10m}
RATE=${RATE:-2000}
WS=${WS:-200}
seconds=$(python3 -c "import re,sys; m=re.fullmatch(r'(\d+)(s|m)', sys.argv[1]); print(int(m[1]) * (60 if m[2]=='m' else 1))" "$DURATION")
bytes=$(python3 -c "import re,sys; m=re.fullmatch(r'(\d+)MiB', sys.argv[1]); print(int(m[1]) << 20)" "$MEMORY")

rss_kib() { awk '/^VmRSS/ {print $2}' "/proc/$1/status"; }
metric_value() { curl -sf "$1/metrics" | awk -v s="$2" 'index($0, s) == 1 {print $NF; exit}'; }

port=$(free_port)
"$ANVIL" --host 127.0.0.1 --port "$port" --silent --block-time 1 &
pids+=($!)
ANVIL_URL="http://127.0.0.1:$port"
for _ in $(seq 100); do rpc "$ANVIL_URL" eth_chainId '[]' >/dev/null 2>&1 && break; sleep 0.1; done
rpc "$ANVIL_URL" anvil_mine '["0xc8"]' >/dev/null

cat >"$work/soak.toml" <<TOML
[cache]
memory_bytes = $bytes
[mempool]
journal = "$work/soak.journal"
[[upstreams]]
url = "$ANVIL_URL"
ws_url = "ws://127.0.0.1:$port"
TOML
estimate=$(target/release/sluice config validate "$work/soak.toml" 2>/dev/null | awk '/in all/ {print $1}' | head -1)

cat >"$work/mix.toml" <<'TOML'
[vars]
anyone = { random = 20 }
slot = { random = 32 }
old = { from = 0, to = 200 }

[[call]]
method = "eth_getBalance"
params = ["{anyone}", "latest"]
weight = 40

[[call]]
method = "eth_getBalance"
params = ["{anyone}", "{old}"]
weight = 30

[[call]]
method = "eth_call"
params = [{ to = "{anyone}", data = "0x70a08231" }, "latest"]
weight = 20

[[call]]
method = "eth_getStorageAt"
params = ["{anyone}", "{slot}", "{old}"]
weight = 10
TOML

port=$(free_port)
SLUICE="http://127.0.0.1:$port"
SLUICE_LOG=warn target/release/sluice serve --listen "127.0.0.1:$port" --config "$work/soak.toml" >/dev/null 2>&1 &
SLUICE_PID=$!; pids+=($!)
for _ in $(seq 100); do curl -sf -o /dev/null "$SLUICE/ready" && break; sleep 0.1; done
sleep 10
idle=$(rss_kib "$SLUICE_PID")

end=$(( $(date +%s) + seconds ))
target/release/sluice bench rpc "$SLUICE" --rate "$RATE" --duration "${seconds}s" --mix "$work/mix.toml" --json \
  >"$work/rpc.json" 2>/dev/null &
load=$!
target/release/sluice bench ingest "$SLUICE" --rate 20 --duration "${seconds}s" --senders 64 --fund \
  >/dev/null 2>&1 &
ingest=$!
(
  while [ "$(date +%s)" -lt "$end" ]; do
    target/release/sluice bench ws "${SLUICE/http/ws}" --reference "ws://127.0.0.1:$port" --clients "$WS" \
      --blocks 2 >/dev/null 2>&1 || sleep 1
  done
) &
churn=$!
pids+=("$load" "$ingest" "$churn")

: >"$work/rss.csv"
while [ "$(date +%s)" -lt "$end" ]; do
  sleep 10
  conns=$(ss -tn state established "( sport = :${SLUICE##*:} )" | tail -n +2 | wc -l)
  echo "$(( seconds - (end - $(date +%s)) )) $(rss_kib "$SLUICE_PID") $conns" >>"$work/rss.csv"
done
wait "$load" || true
wait "$ingest" || true
wait "$churn" || true
cache=$(metric_value "$SLUICE" 'sluice_cache_bytes{')
pending=$(metric_value "$SLUICE" 'sluice_mempool_pending{')
queued=$(metric_value "$SLUICE" 'sluice_mempool_queued{')

python3 - "$idle" "$bytes" "${estimate:-0}" "$WS" "${pending:-0}" "${queued:-0}" "${cache:-0}" "$RATE" "$DURATION" \
  "$work/rss.csv" "$work/rpc.json" <<'PY'
import json, sys
idle, memory, estimate, ws, pending, queued, cache, rate, duration, csv, rpc = sys.argv[1:]
idle, memory, ws = int(idle) * 1024, int(memory), int(ws)
pooled = float(pending) + float(queued)
samples = [tuple(map(int, line.split())) for line in open(csv) if line.strip()]
rss = [kib * 1024 for _, kib, _ in samples]
conns = sum(c for _, _, c in samples) / len(samples)
mib = lambda b: f"{b / 2**20:.1f} MiB"
# The other terms at their measured cost (docs/operations.md#memory): 17 KiB a connection (a
# WebSocket client's), 2,100 bytes a pooled transaction.
goal = idle + 1.2 * memory + conns * 17 * 1024 + pooled * 2100
q = max(len(rss) // 4, 1)
second, last = rss[q:2 * q], rss[-q:]
mean = lambda xs: sum(xs) / len(xs)
growth = (mean(last) - mean(second)) / mean(second) * 100
try:
    r = json.load(open(rpc))
    served = f"{r['ok'] / r['seconds']:.0f} req/s answered, {sum(r['errors'].values())} errors"
except Exception:
    served = "?"
print(f"memory_bytes {mib(memory)}, {duration} at {rate} req/s offered ({served}), {ws} WebSocket clients churning, 20 tx/s intake")
print("| | resident |")
print("|---|---:|")
print(f"| idle (10 s after start) | {mib(idle)} |")
print(f"| highest | {mib(max(rss))} |")
print(f"| mean of the second quarter / of the last quarter | {mib(mean(second))} / {mib(mean(last))} ({growth:+.1f} %) |")
print(f"| at the end | {mib(rss[-1])} |")
print(f"| goal: idle + 1.2 × memory_bytes + {conns:.0f} connections + {pooled:.0f} pooled | {mib(goal)} |")
print(f"| the estimate `sluice config validate` prints | {estimate} MiB |")
print(f"| the cache's own count at the end | {mib(float(cache))} |")
ok = max(rss) <= goal and growth <= 5
print(f"goal {'met' if ok else 'NOT met'}: highest {mib(max(rss))} against {mib(goal)}, growth {growth:+.1f} %")
print("samples (s, MiB, connections):", " ".join(f"{s}:{kib / 1024:.0f}:{c}" for s, kib, c in samples))
PY

#!/usr/bin/env bash
# The peer mesh through real mempools: NODES sluice processes in a line (each dials the one before
# it), each with its own mempool (full validation: decode, sender recovery, state from anvil,
# journal) in front of one non-mining anvil. `sluice bench ingest` sends TXS signed transfers to
# the first node at RATE/s; the row is how long until every pool holds every transaction, the
# mesh's failed messages, and each process's memory.
#   NODES=5 TXS=1000 RATE=200 bash bench/mesh-mempools.sh
source "$(dirname "$0")/lib.sh"
NODES=${NODES:-5}
TXS=${TXS:-1000}
RATE=${RATE:-200}
SETTLE=${SETTLE:-60}

port=$(free_port)
"$ANVIL" --host 127.0.0.1 --port "$port" --silent --no-mining &
pids+=($!)
ANVIL_URL="http://127.0.0.1:$port"
for _ in $(seq 100); do rpc "$ANVIL_URL" eth_chainId '[]' >/dev/null 2>&1 && break; sleep 0.1; done

urls=() procs=() previous=""
for i in $(seq "$NODES"); do
  http=$(free_port)
  udp=$(python3 -c 'import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  peers="[]"; [ -n "$previous" ] && peers="[\"$previous\"]"
  env SLUICE_LOG=warn SLUICE_MEMPOOL__JOURNAL="$work/$i.journal" SLUICE_MEMPOOL__RELAY=false \
    SLUICE_MESH__LISTEN="[\"/ip4/127.0.0.1/udp/$udp/quic-v1\"]" SLUICE_MESH__PEERS="$peers" \
    SLUICE_MESH__KEY="$work/$i.key" \
    target/release/sluice serve --listen "127.0.0.1:$http" --upstream "$ANVIL_URL" >"$work/$i.out" &
  pids+=($!) procs+=($!)
  urls+=("http://127.0.0.1:$http")
  for _ in $(seq 100); do curl -sf -o /dev/null "http://127.0.0.1:$http/ready" && break; sleep 0.1; done
  previous=$(sed -n 's/^sluice mesh peer .* on \([^ ]*\).*/\1/p' "$work/$i.out" | head -1)
  [ -n "$previous" ] || { echo "node $i printed no mesh address" >&2; cat "$work/$i.out" >&2; exit 1; }
done
# Every link up before the clock starts.
for url in "${urls[@]:1}"; do
  for _ in $(seq 100); do
    curl -sf "$url/status" | python3 -c 'import json,sys; p=json.load(sys.stdin)["mesh"]["peers"]; sys.exit(0 if p and all(x["connected"] for x in p) else 1)' && break
    sleep 0.1
  done
done

pending() { rpc "$1" txpool_status '[]' | python3 -c 'import json,sys; print(int(json.load(sys.stdin)["result"]["pending"],16))'; }
start=$(date +%s.%N)
secs=$(python3 -c "print(f'{$TXS/$RATE:.3f}s')")
target/release/sluice bench ingest "${urls[0]}" --rate "$RATE" -d "$secs" --senders 20 --fund --json >"$work/ingest.json"
sent=$(date +%s.%N)
ok=$(python3 -c "import json; print(json.load(open('$work/ingest.json'))['ok'])")
deadline=$(( $(date +%s) + SETTLE ))
for url in "${urls[@]}"; do
  while [ "$(pending "$url")" -lt "$ok" ] && [ "$(date +%s)" -lt "$deadline" ]; do sleep 0.05; done
done
everyone=$(date +%s.%N)
held=() rss=() failed=0
for i in "${!urls[@]}"; do
  held+=("$(pending "${urls[$i]}")")
  rss+=("$(awk '/VmRSS/ {printf "%.0f", $2/1024}' "/proc/${procs[$i]}/status")")
  f=$(curl -sf "${urls[$i]}/status" | python3 -c 'import json,sys; m=json.load(sys.stdin)["mesh"]; print(sum(p["counts"]["failed"] for p in m["peers"]) + m["inbound"]["failed"])')
  failed=$((failed + f))
done
echo "| nodes (line) | txs sent / acknowledged | held by each pool | ingest s | until every pool holds all, s from the first send | failed mesh messages | RSS per process MiB |"
echo "|---:|---:|---|---:|---:|---:|---|"
python3 - "$NODES" "$TXS" "$ok" "$start" "$sent" "$everyone" "$failed" "${held[*]}" "${rss[*]}" <<'PY'
import sys
n, txs, ok, start, sent, everyone, failed, held, rss = sys.argv[1:]
print(f"| {n} | {txs} / {ok} | {' / '.join(held.split())} | {float(sent)-float(start):.2f} | "
      f"{float(everyone)-float(start):.2f} | {failed} | {' / '.join(rss.split())} |")
PY
echo
echo "machine: $(nproc) cores, $(uname -m); anvil $("$ANVIL" --version | head -1 | cut -d' ' -f3) (no mining), relay off; generator, sluice processes and anvil on the same machine"

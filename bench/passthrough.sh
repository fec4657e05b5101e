#!/usr/bin/env bash
# Pass-through throughput and latency: wrk against anvil directly and through sluice, same run,
# alternating, on loopback. Prints a Markdown table. Bounded: each cell runs $DURATION.
#   bash bench/passthrough.sh            # defaults: 10s per cell, concurrency 10 and 64
#   DURATION=5s CONCURRENCY="10 64 256" bash bench/passthrough.sh
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-10s}
CONCURRENCY=${CONCURRENCY:-"10 64"}

bash scripts/install-tools.sh >/dev/null
command -v wrk >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk >/dev/null; }
cargo build --release -q -p sluice

work=$(mktemp -d)
cleanup() { kill "${pids[@]}" 2>/dev/null || true; rm -rf "$work"; }
pids=()
trap cleanup EXIT

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
anvil_port=$(port)
sluice_port=$(port)
.tools/node_modules/@foundry-rs/anvil-linux-amd64/bin/anvil --host 127.0.0.1 --port "$anvil_port" --silent &
pids+=($!)
SLUICE_LOG=warn target/release/sluice serve --listen "127.0.0.1:$sluice_port" --upstream "http://127.0.0.1:$anvil_port" >"$work/sluice.out" &
pids+=($!)
for _ in $(seq 100); do
  curl -sf -o /dev/null "http://127.0.0.1:$sluice_port/ready" && break
  sleep 0.1
done

lua() {  # a wrk script that POSTs one JSON-RPC body and reports percentiles in microseconds
  cat >"$work/$1.lua" <<LUA
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '$2'
done = function(summary, latency, requests)
  io.write(string.format("RESULT %.0f %.0f %.0f %.0f %d\n", summary.requests / (summary.duration / 1e6),
    latency:percentile(50), latency:percentile(99), latency.max, summary.errors.status + summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout))
end
LUA
}
lua chainid '{"jsonrpc":"2.0","id":1,"method":"eth_chainId","params":[]}'
lua block '{"jsonrpc":"2.0","id":1,"method":"eth_getBlockByNumber","params":["0x0",true]}'

run() { wrk -t2 -c"$1" -d"$DURATION" --latency -s "$work/$2.lua" "$3" | grep '^RESULT' | cut -d' ' -f2-; }

echo "| method | concurrency | direct req/s | sluice req/s | ratio | direct p50 / p99 µs | sluice p50 / p99 µs | errors |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|"
for method in chainid block; do
  for c in $CONCURRENCY; do
    read -r d_rps d_p50 d_p99 _ d_err < <(run "$c" "$method" "http://127.0.0.1:$anvil_port/")
    read -r s_rps s_p50 s_p99 _ s_err < <(run "$c" "$method" "http://127.0.0.1:$sluice_port/")
    ratio=$(python3 -c "print(f'{$s_rps/$d_rps:.2f}')")
    name=$([ "$method" = chainid ] && echo eth_chainId || echo 'eth_getBlockByNumber(0x0,true)')
    echo "| $name | $c | $d_rps | $s_rps | $ratio | $d_p50 / $d_p99 | $s_p50 / $s_p99 | $((d_err + s_err)) |"
  done
done
echo
echo "machine: $(nproc) cores, $(uname -m); wrk -t2, $DURATION per cell; anvil $(.tools/node_modules/@foundry-rs/anvil-linux-amd64/bin/anvil --version | head -1 | cut -d' ' -f3); load generator on the same machine"

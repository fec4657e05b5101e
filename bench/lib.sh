# Shared set-up for the bench scripts (sourced): tools, a release build, anvil and sluice on
# free loopback ports, wrk runs that print "RESULT req/s p50µs p99µs maxµs errors".
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
DURATION=${DURATION:-10s}
ANVIL=.tools/node_modules/@foundry-rs/anvil-linux-amd64/bin/anvil

bash scripts/install-tools.sh >/dev/null
command -v wrk >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk >/dev/null; }
# STAND_INS=1: with the benchmark stand-ins (counting intake, memory pool), never in a release.
cargo build --release -q -p sluice ${STAND_INS:+--features sluice-bench/stand-ins}

work=$(mktemp -d)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; [ -n "${KEEP_WORK:-}" ] || rm -rf "$work"; }
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

start_anvil() {  # sets ANVIL_URL
  local port; port=$(free_port)
  "$ANVIL" --host 127.0.0.1 --port "$port" --silent &
  pids+=($!)
  ANVIL_URL="http://127.0.0.1:$port"
  for _ in $(seq 100); do rpc "$ANVIL_URL" eth_chainId '[]' >/dev/null 2>&1 && return; sleep 0.1; done
  echo "anvil did not start" >&2; exit 1
}

start_sluice() {  # start_sluice VAR [ENV=VALUE …]: starts sluice in front of anvil, sets VAR to its URL
  local var=$1 port; shift
  port=$(free_port)
  env SLUICE_LOG=warn SLUICE_MEMPOOL__JOURNAL="$work/$var.journal" "$@" "${SLUICE_BIN:-target/release/sluice}" serve --listen "127.0.0.1:$port" --upstream "$ANVIL_URL" >/dev/null &
  pids+=($!)
  printf -v "$var" 'http://127.0.0.1:%s' "$port"
  for _ in $(seq 100); do curl -sf -o /dev/null "http://127.0.0.1:$port/ready" && return; sleep 0.1; done
  echo "sluice did not start" >&2; exit 1
}

mine_big_block() {  # a block with 200 full transactions, mined together; sets BIG to its number
  rpc "$ANVIL_URL" evm_setAutomine '[false]' >/dev/null
  for _ in $(seq 200); do
    rpc "$ANVIL_URL" eth_sendTransaction \
      '[{"from":"0xf39fd6e51aad88f6f4ce6ab8827279cfffb92266","to":"0x70997970c51812dc3a010c7d01b50e0d17dc79c8","value":"0x1"}]' >/dev/null
  done
  rpc "$ANVIL_URL" evm_mine '[]' >/dev/null
  rpc "$ANVIL_URL" evm_setAutomine '[true]' >/dev/null
  BIG=$(rpc "$ANVIL_URL" eth_blockNumber '[]' | python3 -c 'import json,sys; print(json.load(sys.stdin)["result"])')
}

need_perf() {  # installs perf when missing (the PERF=1 / ALLOCS=1 options of the CPU scripts)
  command -v perf >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq linux-perf >/dev/null; }
}

start_baseline() {  # start_baseline VAR ARGS…: a bare baseline server (sluice-baseline ARGS…), sets VAR to its URL
  local port var=$1; shift; port=$(free_port)
  cargo build --release -q -p sluice-bench --bin sluice-baseline
  target/release/sluice-baseline --listen "127.0.0.1:$port" "$@" >/dev/null &
  pids+=($!)
  printf -v "$var" 'http://127.0.0.1:%s' "$port"
  for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$port/" -d '{}' && return; sleep 0.1; done
  echo "the bare baseline ($*) did not start" >&2; exit 1
}

start_forwarder() {  # start_forwarder VAR [FLAG…]: the bare forwarder (sluice-baseline) to anvil, sets VAR to its URL
  local var=$1; shift
  start_baseline "$var" forward --to "$ANVIL_URL" "$@"
}

rpc() { curl -sf "$1" -H 'content-type: application/json' -d "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"$2\",\"params\":$3}"; }

lua() {  # lua NAME BODY [API_KEY]: a wrk script POSTing BODY (with x-api-key when given)
  local key_header=""
  [ -n "${3:-}" ] && key_header="wrk.headers[\"x-api-key\"] = \"$3\""
  cat >"$work/$1.lua" <<LUA
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
$key_header
wrk.body = '$2'
done = function(summary, latency, requests)
  io.write(string.format("RESULT %.0f %.0f %.0f %.0f %d\n", summary.requests / (summary.duration / 1e6),
    latency:percentile(50), latency:percentile(99), latency.max, summary.errors.status + summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout))
end
LUA
}

wrk_run() { wrk -t2 -c"$1" -d"$DURATION" --latency -s "$work/$2.lua" "$3/" | grep '^RESULT' | cut -d' ' -f2-; }
# wrk1 CONCURRENCY SCRIPT URL: the same with one wrk thread, so that the generator takes one core at most.
wrk1() { wrk -t1 -c"$1" -d"$DURATION" --latency -s "$work/$2.lua" "$3/" | grep '^RESULT' | cut -d' ' -f2-; }

table_header() {
  echo "| method | concurrency | direct req/s | sluice req/s | ratio | direct p50 / p99 µs | sluice p50 / p99 µs | errors direct / sluice |"
  echo "|---|---:|---:|---:|---:|---:|---:|---:|"
}

compare_row() {  # compare_row LABEL CONCURRENCY SCRIPT DIRECT_URL SLUICE_URL
  local d_rps d_p50 d_p99 d_err s_rps s_p50 s_p99 s_err ratio
  read -r d_rps d_p50 d_p99 _ d_err < <(wrk_run "$2" "$3" "$4")
  read -r s_rps s_p50 s_p99 _ s_err < <(wrk_run "$2" "$3" "$5")
  ratio=$(python3 -c "print(f'{$s_rps/$d_rps:.2f}')")
  echo "| $1 | $2 | $d_rps | $s_rps | $ratio | $d_p50 / $d_p99 | $s_p50 / $s_p99 | $d_err / $s_err |"
}

machine_line() {
  echo "machine: $(nproc) cores, $(uname -m); wrk -t2, $DURATION per cell; anvil $("$ANVIL" --version | head -1 | cut -d' ' -f3); load generator, sluice and anvil on the same machine"
}

#!/usr/bin/env bash
# User-space instructions per request, counted by valgrind's callgrind: sluice beside the bare
# forwarder (pass-through eth_chainId, cache and coalescing off) and beside the bare
# fixed-body server (cached eth_blockNumber). Instruction counts do not move with whatever else
# the machine runs, so two builds can be told apart by a few hundred instructions per request,
# where req/s and CPU time on a noisy 2-core machine move by several percent from run to run.
# Kernel work (the socket calls, the same number per request for sluice and the forwarder) is
# not counted: bench/cpu.sh measures it. Each server runs alone under callgrind (which runs one
# thread at a time), loaded by wrk -c4 for a warm-up, then counted over a second run.
# valgrind makes the clock reads (vDSO calls, user space when run natively) system calls: they
# are not counted here. With KEEP_DUMPS=DIR the dumps are kept there, named by the row and the
# requests counted, for `callgrind_annotate`.
#   [WARM=3s] [COUNT=4s] [BEFORE_BIN=PATH] [KEEP_DUMPS=DIR] bash bench/instructions.sh
source "$(dirname "$0")/lib.sh"
WARM=${WARM:-3s}
COUNT=${COUNT:-4s}
command -v valgrind >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind >/dev/null; }
cargo build --release -q -p sluice-bench --bin sluice-baseline

start_anvil
lua chainid '{"jsonrpc":"2.0","id":1,"method":"eth_chainId","params":[]}'
lua number '{"jsonrpc":"2.0","id":1,"method":"eth_blockNumber","params":[]}'
rpc "$ANVIL_URL" eth_blockNumber '[]' >"$work/answer"

# counted NAME SCRIPT -- COMMAND…: starts COMMAND under callgrind on a free port (the command's
# `PORT` word is replaced), counts SCRIPT's requests, prints a row and sets LAST to the count.
counted() {
  local name=$1 script=$2 port pid n ir out; shift 3
  port=$(free_port)
  valgrind --tool=callgrind --trace-children=yes --callgrind-out-file="$work/cg.%p" "${@/PORT/$port}" >/dev/null 2>&1 &
  pid=$!; pids+=("$pid")
  # Ready once it answers a call (slowly: callgrind runs it some 50 times slower).
  for _ in $(seq 600); do rpc "http://127.0.0.1:$port" eth_chainId '[]' 2>/dev/null | grep -q result && break; sleep 0.1; done
  wrk -t1 -c4 -d"$WARM" -s "$work/$script.lua" "http://127.0.0.1:$port/" >/dev/null
  callgrind_control -z "$pid" >/dev/null
  out=$(wrk -t1 -c4 -d"$COUNT" -s "$work/$script.lua" "http://127.0.0.1:$port/")
  rm -f "$work"/cg."$pid"*
  callgrind_control -d "$pid" >/dev/null
  for _ in $(seq 100); do ls "$work"/cg."$pid".* >/dev/null 2>&1 && break; sleep 0.1; done
  sleep 0.5
  n=$(echo "$out" | awk '/requests in/ {print $1}')
  local dump; dump=$(ls -t "$work"/cg."$pid".* | head -1)
  ir=$(awk '/^(summary|totals):/ {v=$2} END {print v}' "$dump")
  [ -z "${KEEP_DUMPS:-}" ] || { mkdir -p "$KEEP_DUMPS"; cp "$dump" "$KEEP_DUMPS/${name//[^a-zA-Z0-9]/_}.$n.callgrind"; }
  kill "$pid"; wait "$pid" 2>/dev/null || true
  LAST=$(( ir / n ))
  echo "$name $n $LAST"
}

sluice_cmd() {  # sluice_cmd BIN [ENV=VALUE …]
  local bin=$1; shift
  echo env SLUICE_LOG=warn SLUICE_MEMPOOL__JOURNAL="$work/journal.$RANDOM" "$@" "$bin" serve --listen 127.0.0.1:PORT --upstream "$ANVIL_URL"
}

table() {  # table TITLE BASELINE_ROW ROW…
  local title=$1 base=$2; shift 2
  echo "| $title | requests counted | instructions per request | / ${base%% *} |"
  echo "|---|---:|---:|---:|"
  local base_ir; base_ir=$(echo "$base" | awk '{print $NF}')
  for row in "$base" "$@"; do
    echo "$row" | awk -v b="$base_ir" '{ir=$NF; n=$(NF-1); $NF=""; $(NF-1)=""; sub(/ +$/, ""); printf "| %s | %d | %d | %.2f |\n", $0, n, ir, ir / b}'
  done
  echo
}

pass=()
base=$(counted "bare forwarder" chainid -- target/release/sluice-baseline --listen 127.0.0.1:PORT forward --to "$ANVIL_URL")
# shellcheck disable=SC2046
pass+=("$(counted "sluice, cache off" chainid -- $(sluice_cmd target/release/sluice SLUICE_CACHE__ENABLED=false SLUICE_CACHE__COALESCE=false))")
if [ -n "${BEFORE_BIN:-}" ]; then
  # shellcheck disable=SC2046
  pass+=("$(counted "sluice (BEFORE_BIN), cache off" chainid -- $(sluice_cmd "$BEFORE_BIN" SLUICE_CACHE__ENABLED=false SLUICE_CACHE__COALESCE=false))")
fi
table "pass-through eth_chainId (callgrind, wrk -c4)" "$base" "${pass[@]}"

cached=()
base=$(counted "bare server" number -- target/release/sluice-baseline --listen 127.0.0.1:PORT fixed --body-file "$work/answer")
# shellcheck disable=SC2046
cached+=("$(counted "sluice" number -- $(sluice_cmd target/release/sluice))")
if [ -n "${BEFORE_BIN:-}" ]; then
  # shellcheck disable=SC2046
  cached+=("$(counted "sluice (BEFORE_BIN)" number -- $(sluice_cmd "$BEFORE_BIN"))")
fi
table "cached eth_blockNumber (callgrind, wrk -c4)" "$base" "${cached[@]}"
echo "machine: $(nproc) cores, $(uname -m); valgrind $(valgrind --version | sed 's/valgrind-//'); user-space instructions only"

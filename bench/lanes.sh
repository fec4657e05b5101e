#!/usr/bin/env bash
# Lanes against the shared runtime: sluice with its default lanes (one thread per core, each
# serving its own connections and keeping its own node connections) beside the same build with
# one lane and with `[limits] lanes = 0` (connections on tokio's work-stealing runtime), and the
# bare baselines (the forwarder; for cached answers the server answering the same bytes), both
# as they are (tokio's default runtime) and held to one thread (TOKIO_WORKER_THREADS=1: every
# call on one thread, as a lane does it). Rows alternate targets; each cell is the median of
# ROUNDS runs.
#   DURATION=4s ROUNDS=5 bash bench/lanes.sh
source "$(dirname "$0")/lib.sh"
ROUNDS=${ROUNDS:-5}

start_anvil
start_forwarder FORWARD
# (An assignment before a shell function reaches the programs the function starts.)
TOKIO_WORKER_THREADS=1 start_forwarder FORWARD_ONE
start_sluice PASS_LANES SLUICE_CACHE__ENABLED=false SLUICE_CACHE__COALESCE=false
start_sluice PASS_ONE SLUICE_CACHE__ENABLED=false SLUICE_CACHE__COALESCE=false SLUICE_LIMITS__LANES=1
start_sluice PASS_SHARED SLUICE_CACHE__ENABLED=false SLUICE_CACHE__COALESCE=false SLUICE_LIMITS__LANES=0
start_sluice CACHED_LANES
start_sluice CACHED_ONE SLUICE_LIMITS__LANES=1
start_sluice CACHED_SHARED SLUICE_LIMITS__LANES=0
lua chainid '{"jsonrpc":"2.0","id":1,"method":"eth_chainId","params":[]}'
lua number '{"jsonrpc":"2.0","id":1,"method":"eth_blockNumber","params":[]}'
# The bare server answers the very bytes sluice answers from its cache.
curl -sf "$CACHED_LANES" -H 'content-type: application/json' -d '{"jsonrpc":"2.0","id":1,"method":"eth_blockNumber","params":[]}' -o "$work/number.answer"
start_baseline FIXED fixed --body-file "$work/number.answer"
TOKIO_WORKER_THREADS=1 start_baseline FIXED_ONE fixed --body-file "$work/number.answer"

median() { sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : int((a[NR/2]+a[NR/2+1])/2)}'; }

block() {  # block LABEL CONCURRENCY SCRIPT NAME=URL…: ROUNDS alternating runs, one row per target
  local label=$1 c=$2 script=$3; shift 3
  local target name
  for _ in $(seq "$ROUNDS"); do
    for target in "$@"; do
      name=${target%%=*}
      wrk1 "$c" "$script" "${target#*=}" >>"$work/$label.$name"
    done
  done
  for target in "$@"; do
    name=${target%%=*}
    echo "| $label | $c | ${name//_/ } | $(cut -d' ' -f1 "$work/$label.$name" | median) | $(cut -d' ' -f2 "$work/$label.$name" | median) | $(cut -d' ' -f3 "$work/$label.$name" | median) |"
  done
}

echo "| case | c | server | req/s | p50 µs | p99 µs |"
echo "|---|---:|---|---:|---:|---:|"
block "pass-through eth_chainId" 64 chainid forwarder="$FORWARD" forwarder_on_one_thread="$FORWARD_ONE" sluice="$PASS_LANES" sluice_with_one_lane="$PASS_ONE" sluice_on_the_shared_runtime="$PASS_SHARED"
block "pass-through eth_chainId, one caller" 1 chainid forwarder="$FORWARD" forwarder_on_one_thread="$FORWARD_ONE" sluice="$PASS_LANES" sluice_on_the_shared_runtime="$PASS_SHARED"
block "cached eth_blockNumber" 64 number bare_server="$FIXED" bare_server_on_one_thread="$FIXED_ONE" sluice="$CACHED_LANES" sluice_with_one_lane="$CACHED_ONE" sluice_on_the_shared_runtime="$CACHED_SHARED"
echo
echo "machine: $(nproc) cores ($(nproc) lanes by default); wrk -t1, $DURATION per run, median of $ROUNDS alternating runs; cache and coalescing off for pass-through; generator, servers and anvil on the same machine"

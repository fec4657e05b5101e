#!/usr/bin/env bash
# What an idle sluice costs a metered provider: the upstream calls it makes by itself, with no
# client at all, counted by a counting relay (`sluice-baseline count`, each call of a batch
# counted, as a provider's meter counts them) in front of one anvil mining a block every T
# seconds. Per block time and member kind (a member with a WebSocket, whose newHeads sluice
# follows; an HTTP-only member), and per binary: BEFORE_BIN (an older build, when given) and
# this tree's, side by side in one run. Start-up (first head, window backfill, range search,
# the pace learned from three blocks) is over after SETTLE seconds (at least three blocks and
# four seconds) and reported apart; the window is WINDOW seconds (at least ten
# blocks). REPLICAS=3 runs three sluice processes on the same relay (each follows alone
# today: issue 56's one-follower lease is not built yet).
#   [BLOCK_TIMES="1 2 12"] [WINDOW=60] [SETTLE=8] [REPLICAS=1] [BEFORE_BIN=PATH] bash bench/idle.sh
source "$(dirname "$0")/lib.sh"
BLOCK_TIMES=${BLOCK_TIMES:-1 2 12}
WINDOW=${WINDOW:-60}
SETTLE=${SETTLE:-8}
REPLICAS=${REPLICAS:-1}
cargo build --release -q -p sluice-bench --bin sluice-baseline

count() { curl -sf "$1/count" | python3 -c 'import json,sys; print(json.load(sys.stdin)["calls"])'; }
methods() { curl -sf "$1/count" | python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)["methods"], separators=(",", ":")))'; }
head_of() { rpc "$1" eth_blockNumber '[]' | python3 -c 'import json,sys; print(int(json.load(sys.stdin)["result"], 16))'; }

# measure BIN KIND T: one row.
measure() {
  local bin=$1 kind=$2 t=$3 port relay wsport started=() i n0 n1 b0 b1 window
  port=$(free_port)
  "$ANVIL" --host 127.0.0.1 --port "$port" --silent --block-time "$t" &
  local anvil_pid=$!; pids+=("$anvil_pid")
  for _ in $(seq 100); do rpc "http://127.0.0.1:$port" eth_chainId '[]' >/dev/null 2>&1 && break; sleep 0.1; done
  wsport=$(free_port)
  target/release/sluice-baseline --listen "127.0.0.1:$wsport" count --to "http://127.0.0.1:$port" >/dev/null &
  local relay_pid=$!; pids+=("$relay_pid")
  relay="http://127.0.0.1:$wsport"
  for _ in $(seq 100); do curl -sf -o /dev/null "$relay/count" && break; sleep 0.1; done
  {
    echo "[[upstreams]]"
    echo "url = \"$relay\""
    # The relay speaks HTTP only: an HTTP-only member's derived WebSocket never connects.
    [ "$kind" = ws ] && echo "ws_url = \"ws://127.0.0.1:$port\""
    echo "[mempool]"
    echo "journal = \"$work/journal-$kind-$t-$RANDOM\""
  } >"$work/idle.toml"
  for i in $(seq "$REPLICAS"); do
    local sport; sport=$(free_port)
    SLUICE_LOG=error "$bin" serve --listen "127.0.0.1:$sport" --config "$work/idle.toml" >/dev/null 2>&1 &
    started+=($!); pids+=($!)
  done
  # Start-up, then the window. On this fresh chain the pace is learned from three heads seen
  # live (on a chain with history, at once from the window's timestamps): start-up lasts that long.
  local settle=$SETTLE
  [ "$settle" -lt $((3 * t + 4)) ] && settle=$((3 * t + 4))
  sleep "$settle"
  n0=$(count "$relay"); b0=$(head_of "http://127.0.0.1:$port")
  window=$WINDOW
  [ "$window" -lt $((10 * t)) ] && window=$((10 * t))
  sleep "$window"
  n1=$(count "$relay"); b1=$(head_of "http://127.0.0.1:$port")
  local blocks=$((b1 - b0)) calls=$((n1 - n0))
  python3 - "$bin" "$kind" "$t" "$calls" "$blocks" "$n0" "$REPLICAS" <<'PY'
import sys
bin_, kind, t, calls, blocks, start, replicas = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7])
per_block = calls / blocks if blocks else float("nan")
per_day = per_block * 86400 / t
print(f"| {bin_} | {kind} | {t} s | {replicas} | {blocks} | {calls} | {per_block:.2f} | {per_day:,.0f} | {start} |")
PY
  echo "    methods since start: $(methods "$relay")" >&2
  kill "${started[@]}" "$relay_pid" "$anvil_pid" 2>/dev/null || true
  wait "${started[@]}" "$relay_pid" "$anvil_pid" 2>/dev/null || true
}

echo "| binary | member | block time | replicas | blocks | calls | calls per block | calls per day | start-up calls |"
echo "|---|---|---|---|---|---|---|---|---|"
for t in $BLOCK_TIMES; do
  for kind in ws http; do
    [ -n "${BEFORE_BIN:-}" ] && measure "$BEFORE_BIN" "$kind" "$t"
    measure target/release/sluice "$kind" "$t"
  done
done

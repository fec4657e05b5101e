#!/usr/bin/env bash
# Integrity checks and consensus (docs/upstreams.md):
#   * the integrity checks' cost when every member agrees: sluice with them on against sluice
#     with them off, same pool (one anvil twice), pass-through and cached, rows alternating;
#   * consensus 2-of-3 against one member: p50 and p99 latency, upstream calls per client call.
#   DURATION=10s ROUNDS=2 bash bench/integrity.sh
source "$(dirname "$0")/lib.sh"
ROUNDS=${ROUNDS:-2}
BENCH=target/release/sluice

serve_toml() {  # serve_toml VAR TOML: sluice with this configuration, sets VAR to its URL
  local var=$1 port; port=$(free_port)
  printf 'listen = "127.0.0.1:%s"\n[mempool]\nenabled = false\n%s\n' "$port" "$2" > "$work/$var.toml"
  SLUICE_LOG=error "$BENCH" serve --config "$work/$var.toml" >/dev/null &
  pids+=($!)
  printf -v "$var" 'http://127.0.0.1:%s' "$port"
  for _ in $(seq 100); do curl -sf -o /dev/null "http://127.0.0.1:$port/ready" && return; sleep 0.1; done
  echo "sluice did not start" >&2; exit 1
}

upstream_calls() {  # upstream_calls URL: sluice_upstream_calls_total, all members
  curl -sf "$1/metrics" | awk '/^sluice_upstream_calls_total/ { s += $2 } END { print s + 0 }'
}

start_anvil; A=$ANVIL_URL
twice="[[upstreams]]
url = \"$A\"
[[upstreams]]
url = \"$A\""
off="[pool.integrity]
highest_head = false
retry_nulls = false
logs_need_head = false"
# Pass-through: cache and coalescing off, every call reaches a member.
serve_toml PASS_ON "[cache]
enabled = false
coalesce = false
$twice"
serve_toml PASS_OFF "[cache]
enabled = false
coalesce = false
$off
$twice"
serve_toml CACHED_ON "$twice"
serve_toml CACHED_OFF "$off
$twice"

lua balance '{"jsonrpc":"2.0","id":1,"method":"eth_getBalance","params":["0xf39fd6e51aad88f6f4ce6ab8827279cfffb92266","0x0"]}'
lua latest '{"jsonrpc":"2.0","id":1,"method":"eth_getBlockByNumber","params":["latest",false]}'
lua number '{"jsonrpc":"2.0","id":1,"method":"eth_blockNumber","params":[]}'

row() {  # row LABEL SCRIPT OFF_URL ON_URL: best of ROUNDS alternating runs each, c=64
  local best_off=0 best_on=0 rps errors
  for _ in $(seq "$ROUNDS"); do
    read -r rps _ _ _ errors < <(wrk1 64 "$2" "$3"); [ "$rps" -gt "$best_off" ] && best_off=$rps
    [ "$errors" = 0 ] || { echo "errors: $errors" >&2; exit 1; }
    read -r rps _ _ _ errors < <(wrk1 64 "$2" "$4"); [ "$rps" -gt "$best_on" ] && best_on=$rps
    [ "$errors" = 0 ] || { echo "errors: $errors" >&2; exit 1; }
  done
  echo "| $1 | $best_off | $best_on | $(python3 -c "print(f'{$best_on/$best_off:.3f}')") |"
}

# Every answer is a result (not a JSON-RPC error, which wrk would count as a success).
for u in "$PASS_ON" "$CACHED_ON"; do
  for body in balance latest number; do
    b=$(python3 -c "import re; print(re.search(r\"wrk.body = '(.*)'\", open('$work/$body.lua').read()).group(1))")
    curl -sf "$u" -H 'content-type: application/json' -d "$b" | grep -q '"result"' || { echo "$body: no result" >&2; exit 1; }
  done
done

echo "### Integrity checks when every member agrees (c=64, pool of two members on one anvil)"
echo
echo "| case | checks off req/s | checks on req/s | on / off |"
echo "|---|---:|---:|---:|"
row "pass-through eth_getBalance" balance "$PASS_OFF" "$PASS_ON"
row "pass-through eth_getBlockByNumber(latest) (checked: not behind the best head)" latest "$PASS_OFF" "$PASS_ON"
row "cached eth_blockNumber" number "$CACHED_OFF" "$CACHED_ON"
echo

# Consensus: three anvils (one chain each; block 0's state is the same on all) against one.
start_anvil; B=$ANVIL_URL
start_anvil; C=$ANVIL_URL
serve_toml ONE "[cache]
enabled = false
coalesce = false
[[upstreams]]
url = \"$A\""
serve_toml VOTE "[cache]
enabled = false
coalesce = false
[[pool.consensus]]
methods = [\"eth_getBalance\"]
ask = 3
agree = 2
[[upstreams]]
url = \"$A\"
[[upstreams]]
url = \"$B\"
[[upstreams]]
url = \"$C\""
PARAMS='["0xf39fd6e51aad88f6f4ce6ab8827279cfffb92266","0x0"]'
curl -sf "$VOTE" -H 'content-type: application/json' \
  -d "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"eth_getBalance\",\"params\":$PARAMS}" | grep -q '"result"' \
  || { echo "consensus: no agreement" >&2; exit 1; }
"$BENCH" bench rpc "$VOTE" -c 10 -d "$DURATION" --method eth_getBalance --params "$PARAMS" --compare "$ONE" --rounds 3 --json > "$work/vote.json"
before=$(upstream_calls "$VOTE")
"$BENCH" bench rpc "$VOTE" -c 10 -d "$DURATION" --method eth_getBalance --params "$PARAMS" --json > "$work/vote_calls.json"
after=$(upstream_calls "$VOTE")
field() { python3 -c "import json,sys; d=json.load(open('$1')); print($2)"; }
echo "### Consensus 2-of-3 against one member (eth_getBalance, c=10, cache off)"
echo
echo "| path | req/s | p50 µs | p99 µs |"
echo "|---|---:|---:|---:|"
echo "| one member | $(field "$work/vote.json" "round(d['b']['req_per_sec'])") | $(field "$work/vote.json" "d['b']['latency_us']['p50']") | $(field "$work/vote.json" "d['b']['latency_us']['p99']") |"
echo "| consensus, ask 3, agree 2 | $(field "$work/vote.json" "round(d['a']['req_per_sec'])") | $(field "$work/vote.json" "d['a']['latency_us']['p50']") | $(field "$work/vote.json" "d['a']['latency_us']['p99']") |"
echo
echo "Upstream calls per client call under consensus: $(python3 -c "print(f'{($after - $before) / $(field "$work/vote_calls.json" "d['requests']"):.2f}')") (sluice_upstream_calls_total over the client requests of one ${DURATION} run, coalescing off; the head prober's calls included; $(field "$work/vote_calls.json" "d['requests'] - d['ok']") client errors)."
echo
echo "machine: $(nproc) cores, $(uname -m); wrk -t1 and sluice bench rpc on the same machine as sluice and anvil; $DURATION per run"

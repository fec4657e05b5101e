#!/usr/bin/env bash
# Verified reads (docs/verify.md): sluice with [verify] on against sluice with it off, same
# anvil, side by side in one run (sluice bench rpc --compare, rounds alternating):
#   * a miss (cache and coalescing off): every eth_getBalance reaches the node; verified, it
#     is an eth_getProof checked against the block's header (checked once per block);
#   * a hit (cache on): the same call again at an unchanged head;
# with anvil itself beside them (the machine's limit for a miss), upstream calls and sluice's
# CPU time per client call.
#   DURATION=10s bash bench/verify.sh
source "$(dirname "$0")/lib.sh"
BENCH=target/release/sluice
declare -A PID

serve_toml() {  # serve_toml VAR TOML: sluice with this configuration, sets VAR to its URL and PID[VAR]
  local var=$1 port; port=$(free_port)
  printf 'listen = "127.0.0.1:%s"\n[mempool]\nenabled = false\n%s\n[[upstreams]]\nurl = "%s"\n' \
    "$port" "$2" "$ANVIL_URL" > "$work/$var.toml"
  SLUICE_LOG=error "$BENCH" serve --config "$work/$var.toml" >/dev/null &
  pids+=($!)
  PID[$var]=$!
  printf -v "$var" 'http://127.0.0.1:%s' "$port"
  for _ in $(seq 100); do curl -sf -o /dev/null "http://127.0.0.1:$port/ready" && return; sleep 0.1; done
  echo "sluice did not start" >&2; exit 1
}

upstream_calls() {  # upstream_calls URL: sluice_upstream_calls_total, all members and origins
  curl -sf "$1/metrics" | awk '/^sluice_upstream_calls_total/ { s += $2 } END { print s + 0 }'
}

cpu_ticks() {  # cpu_ticks PID: user + system clock ticks the process used so far
  awk '{ print $14 + $15 }' "/proc/$1/stat"
}

start_anvil
# An account with a balance, code and storage at a mined block.
ACCOUNT=0x00000000000000000000000000000000000c0de1
rpc "$ANVIL_URL" anvil_setBalance "[\"$ACCOUNT\",\"0x1bc16d674ec80000\"]" >/dev/null
rpc "$ANVIL_URL" anvil_setCode "[\"$ACCOUNT\",\"0x6000600055\"]" >/dev/null
rpc "$ANVIL_URL" anvil_mine '["0x2"]' >/dev/null

miss="[cache]
enabled = false
coalesce = false"
serve_toml PLAIN_MISS "$miss"
serve_toml VERIFIED_MISS "$miss
[verify]
enabled = true"
serve_toml PLAIN_HIT ""
serve_toml VERIFIED_HIT "[verify]
enabled = true"

PARAMS="[\"$ACCOUNT\",\"latest\"]"
truth=$(rpc "$ANVIL_URL" eth_getBalance "$PARAMS")
for u in "$PLAIN_MISS" "$VERIFIED_MISS" "$PLAIN_HIT" "$VERIFIED_HIT"; do
  [ "$(rpc "$u" eth_getBalance "$PARAMS")" = "$truth" ] || { echo "$u: not anvil's answer" >&2; exit 1; }
done
# The verified step answered (not passed through): counted.
curl -sf "$VERIFIED_MISS/metrics" | grep -q '^sluice_verified_total{.*eth_getBalance.*} [1-9]' \
  || { echo "the verified sluice did not verify" >&2; exit 1; }

field() { python3 -c "import json,sys; d=json.load(open('$1')); print($2)"; }
cell() { echo "$(field "$1" "round(d['$2']['req_per_sec'])") | $(field "$1" "d['$2']['latency_us']['p50']") | $(field "$1" "d['$2']['latency_us']['p99']")"; }

# Side by side: a = verified, b = unverified, three rounds alternating.
"$BENCH" bench rpc "$VERIFIED_MISS" -c 10 -d "$DURATION" --method eth_getBalance --params "$PARAMS" \
  --compare "$PLAIN_MISS" --rounds 3 --json > "$work/miss.json"
"$BENCH" bench rpc "$VERIFIED_HIT" -c 64 -d "$DURATION" --method eth_getBalance --params "$PARAMS" \
  --compare "$PLAIN_HIT" --rounds 3 --json > "$work/hit.json"
"$BENCH" bench rpc "$ANVIL_URL" -c 10 -d "$DURATION" --method eth_getBalance --params "$PARAMS" --json > "$work/anvil.json"

per_call() {  # per_call VAR CONCURRENCY: one more run; "upstream calls / client call, CPU ms / 1000 calls"
  local url=${!1} before ticks json="$work/$1.calls.json"
  before=$(upstream_calls "$url"); ticks=$(cpu_ticks "${PID[$1]}")
  "$BENCH" bench rpc "$url" -c "$2" -d "$DURATION" --method eth_getBalance --params "$PARAMS" --json > "$json"
  python3 -c "
n = $(field "$json" "d['ok']")
calls = $(upstream_calls "$url") - $before
cpu_ms = ($(cpu_ticks "${PID[$1]}") - $ticks) * 1000 / $(getconf CLK_TCK)
print(f'{calls / n:.3f} | {cpu_ms * 1000 / n:.1f}')"
}

echo "### Verified reads: eth_getBalance verified against unverified (one anvil, side by side)"
echo
echo "| case | path | req/s | p50 µs | p99 µs | upstream calls / client call | sluice CPU ms / 1000 calls |"
echo "|---|---|---:|---:|---:|---:|---:|"
echo "| miss (cache off), c=10 | anvil direct (the machine's limit) | $(field "$work/anvil.json" "round(d['req_per_sec'])") | $(field "$work/anvil.json" "d['latency_us']['p50']") | $(field "$work/anvil.json" "d['latency_us']['p99']") | | |"
echo "| miss (cache off), c=10 | unverified | $(cell "$work/miss.json" b) | $(per_call PLAIN_MISS 10) |"
echo "| miss (cache off), c=10 | verified | $(cell "$work/miss.json" a) | $(per_call VERIFIED_MISS 10) |"
echo "| hit (cache on), c=64 | unverified | $(cell "$work/hit.json" b) | $(per_call PLAIN_HIT 64) |"
echo "| hit (cache on), c=64 | verified | $(cell "$work/hit.json" a) | $(per_call VERIFIED_HIT 64) |"
echo
echo "Verified / unverified: miss p50 $(python3 -c "print(f\"{$(field "$work/miss.json" "d['a']['latency_us']['p50']") / $(field "$work/miss.json" "d['b']['latency_us']['p50']"):.2f}\")")×, hit req/s $(python3 -c "print(f\"{$(field "$work/hit.json" "d['a']['req_per_sec']") / $(field "$work/hit.json" "d['b']['req_per_sec']"):.2f}\")")×."
echo
echo "Upstream calls include sluice's own (head following, probes). CPU: sluice's user + system time over one more run of each row. The load generator (sluice bench rpc) runs on the same $(nproc) cores as sluice and anvil: for the hit rows it is the limit."
echo "machine: $(nproc) cores, $(uname -m); $DURATION per run; anvil $("$ANVIL" --version | head -1 | cut -d' ' -f3)"

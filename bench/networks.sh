#!/usr/bin/env bash
# Several networks in one sluice: cached throughput and memory with 4 networks configured against
# 1, side by side in one run. Four anvils (chain ids 31337…31340); sluice ONE serves the first as
# its only network, sluice FOUR serves all four ([[networks]] eth1…eth4).
#   * cached eth_blockNumber and eth_getBalance on one network's path;
#   * the same spread over the four paths in turn (ONE: all on its one path);
#   * resident memory of each, idle after start, and after the load.
# Besides req/s (best of ROUNDS), each row gives each sluice's own CPU time per request over all
# its rounds: the cost of a request, less sensitive than throughput to what else the machine runs.
# wrk -t1 is the generator; rows alternate ONE and FOUR and keep the best of ROUNDS each.
#   DURATION=10s ROUNDS=3 bash bench/networks.sh
source "$(dirname "$0")/lib.sh"
ROUNDS=${ROUNDS:-3}

anvils=()
for chain in 31337 31338 31339 31340; do
  start_anvil
  rpc "$ANVIL_URL" anvil_setChainId "[$chain]" >/dev/null
  anvils+=("$ANVIL_URL")
done

start_with_config() {  # start_with_config VAR FILE: sluice serve --config FILE; sets VAR to its URL
  local var=$1 port; port=$(free_port)
  env SLUICE_LOG=warn SLUICE_MEMPOOL__JOURNAL="$work/$var.journal" target/release/sluice serve \
    --listen "127.0.0.1:$port" --config "$2" >/dev/null &
  pids+=($!)
  printf -v "$var" 'http://127.0.0.1:%s' "$port"
  for _ in $(seq 100); do curl -sf -o /dev/null "http://127.0.0.1:$port/ready" && return; sleep 0.1; done
  echo "sluice did not start" >&2; exit 1
}

printf '[[upstreams]]\nurl = "%s"\n' "${anvils[0]}" >"$work/one.toml"
: >"$work/four.toml"
for i in 0 1 2 3; do
  printf '[[networks]]\nid = "eth%d"\nchain_id = %d\ndefault = %s\n[[networks.upstreams]]\nurl = "%s"\n' \
    $((i + 1)) $((31337 + i)) "$([ $i = 0 ] && echo true || echo false)" "${anvils[$i]}" >>"$work/four.toml"
done
start_with_config ONE "$work/one.toml"
start_with_config FOUR "$work/four.toml"
pid_of() { ss -ltnp "sport = :${1##*:}" | grep -o 'pid=[0-9]*' | head -1 | cut -d= -f2; }
rss_mib() { awk '/VmRSS/ {printf "%.1f", $2 / 1024}' "/proc/$(pid_of "$1")/status"; }
sleep 2
idle_one=$(rss_mib "$ONE"); idle_four=$(rss_mib "$FOUR")

# wrk scripts: one path, or the four paths in turn.
script() {  # script NAME BODY PATHS…
  local name=$1 body=$2; shift 2
  local list; list=$(printf '"%s",' "$@")
  cat >"$work/$name.lua" <<LUA
local paths = {${list%,}}
local n = 0
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '$body'
request = function()
  n = n + 1
  return wrk.format(nil, paths[(n % #paths) + 1])
end
done = function(summary, latency, requests)
  io.write(string.format("RESULT %.0f %.0f %.0f %.0f %d\n", summary.requests / (summary.duration / 1e6),
    latency:percentile(50), latency:percentile(99), latency.max, summary.errors.status + summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout))
end
LUA
}
number='{"jsonrpc":"2.0","id":1,"method":"eth_blockNumber","params":[]}'
balance='{"jsonrpc":"2.0","id":1,"method":"eth_getBalance","params":["0xf39fd6e51aad88f6f4ce6ab8827279cfffb92266","0x0"]}'
script one-number "$number" /
script one-balance "$balance" /
script four-number-one "$number" /eth1
script four-balance-one "$balance" /eth1
script four-number-all "$number" /eth1 /eth2 /eth3 /eth4
script four-balance-all "$balance" /eth1 /eth2 /eth3 /eth4
# Warm the caches of every network.
for p in / /eth1 /eth2 /eth3 /eth4; do
  for u in "$ONE" "$FOUR"; do curl -s -o /dev/null "$u$p" -H 'content-type: application/json' -d "$balance"; done
done

wrk64() { wrk -t1 -c64 -d"$DURATION" --latency -s "$work/$1.lua" "$2" | grep '^RESULT' | cut -d' ' -f2-; }
seconds=${DURATION%s}
ticks() { awk '{print $14 + $15}' "/proc/$(pid_of "$1")/stat"; }   # CPU time used, in clock ticks
row() {  # row LABEL ONE_SCRIPT FOUR_SCRIPT: best req/s of ROUNDS; CPU µs per request over all rounds
  local best_1=0 best_4=0 p50_1="" p50_4="" rps p50 t0 cpu_1=0 cpu_4=0 reqs_1=0 reqs_4=0
  local hz; hz=$(getconf CLK_TCK)
  for _ in $(seq "$ROUNDS"); do
    t0=$(ticks "$ONE"); read -r rps p50 _ _ _ < <(wrk64 "$2" "$ONE")
    cpu_1=$((cpu_1 + $(ticks "$ONE") - t0)); reqs_1=$((reqs_1 + rps * seconds))
    if [ "$rps" -gt "$best_1" ]; then best_1=$rps; p50_1=$p50; fi
    t0=$(ticks "$FOUR"); read -r rps p50 _ _ _ < <(wrk64 "$3" "$FOUR")
    cpu_4=$((cpu_4 + $(ticks "$FOUR") - t0)); reqs_4=$((reqs_4 + rps * seconds))
    if [ "$rps" -gt "$best_4" ]; then best_4=$rps; p50_4=$p50; fi
  done
  python3 -c "
import sys
b1, b4, c1, c4 = $best_1, $best_4, $cpu_1 / $hz * 1e6 / $reqs_1, $cpu_4 / $hz * 1e6 / $reqs_4
print(f'| {sys.argv[1]} | {b1} | {b4} | {b4 / b1:.2f} | $p50_1 | $p50_4 | {c1:.1f} | {c4:.1f} |')" "$1"
}

echo "| cached call, c=64 | 1 network req/s | 4 networks req/s | 4 / 1 | 1 network p50 µs | 4 networks p50 µs | 1 network CPU µs/req | 4 networks CPU µs/req |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|"
row "eth_blockNumber, one network's path" one-number four-number-one
row "eth_getBalance, one network's path" one-balance four-balance-one
row "eth_blockNumber, spread over the 4 paths" one-number four-number-all
row "eth_getBalance, spread over the 4 paths" one-balance four-balance-all
echo
echo "| resident memory | 1 network MiB | 4 networks MiB |"
echo "|---|---:|---:|"
echo "| idle, after start | $idle_one | $idle_four |"
echo "| after the load above | $(rss_mib "$ONE") | $(rss_mib "$FOUR") |"
echo
echo "machine: $(nproc) cores, $(uname -m); wrk -t1, $DURATION per run, best of $ROUNDS alternating runs; anvil $("$ANVIL" --version | head -1 | cut -d' ' -f3); generator, both sluices and four anvils on the same machine"

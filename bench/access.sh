#!/usr/bin/env bash
# The cost of access control per request, side by side in one run: wrk against sluice with no
# access control, with keys + a per-second and daily quota in memory, and the same quota shared
# through a real redis-server. eth_chainId is answered by sluice itself, so the difference is
# the cost of identifying the key and charging the quota.
#   DURATION=10s CONCURRENCY="10 64" bash bench/access.sh
source "$(dirname "$0")/lib.sh"
CONCURRENCY=${CONCURRENCY:-"10 64"}
start_anvil
redis_port=$(free_port)
redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no >/dev/null &
pids+=($!)
for _ in $(seq 50); do redis-cli -p "$redis_port" ping >/dev/null 2>&1 && break; sleep 0.1; done
quota=(SLUICE_ACCESS__KEYS__BENCH=t SLUICE_ACCESS__TIERS__T__PER_SECOND=100000000 SLUICE_ACCESS__TIERS__T__PER_DAY=100000000000)
start_sluice OFF
start_sluice MEMORY "${quota[@]}"
start_sluice REDIS "${quota[@]}" SLUICE_ACCESS__REDIS_URL="redis://127.0.0.1:$redis_port"
lua keyed '{"jsonrpc":"2.0","id":1,"method":"eth_chainId","params":[]}' bench
rpc_keyed() { curl -sf "$1" -H 'content-type: application/json' -H 'x-api-key: bench' -d '{"jsonrpc":"2.0","id":1,"method":"eth_chainId","params":[]}'; }
for url in "$MEMORY" "$REDIS"; do rpc_keyed "$url" | grep -q 0x7a69 || { echo "keyed call failed on $url" >&2; exit 1; }; done
echo "| access control | concurrency | req/s | p50 / p99 µs | errors | req/s vs off |"
echo "|---|---:|---:|---:|---:|---:|"
for c in $CONCURRENCY; do
  read -r off_rps off_p50 off_p99 _ off_err < <(wrk_run "$c" keyed "$OFF")
  echo "| off | $c | $off_rps | $off_p50 / $off_p99 | $off_err | 1.00 |"
  for mode in MEMORY REDIS; do
    read -r rps p50 p99 _ err < <(wrk_run "$c" keyed "${!mode}")
    echo "| keys + quota, ${mode,,} | $c | $rps | $p50 / $p99 | $err | $(python3 -c "print(f'{$rps/$off_rps:.2f}')") |"
  done
done
echo
machine_line

#!/usr/bin/env bash
# The cost of access control per request, side by side in one run: wrk against sluice with no
# access control, with keys + a per-second and daily quota in memory, the same quota shared
# through a real redis-server, a JSON Web Token (HS256) instead of a key, and a key behind 33
# CIDR address rules. eth_chainId is answered by sluice itself, so the difference is the cost
# of identifying the caller and charging the quota. The token rides in x-api-key (sluice reads
# a token there as in Authorization: Bearer) so that every instance gets the same wrk script.
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
secret=bench-secret-0123456789
token=$(python3 - "$secret" <<'PY'
import base64, hashlib, hmac, json, sys, time
b64 = lambda b: base64.urlsafe_b64encode(b).rstrip(b"=").decode()
head = b64(json.dumps({"alg": "HS256", "typ": "JWT", "kid": "hs"}).encode())
body = b64(json.dumps({"sub": "bench", "tier": "t", "exp": int(time.time()) + 3600}).encode())
sig = b64(hmac.new(sys.argv[1].encode(), f"{head}.{body}".encode(), hashlib.sha256).digest())
print(f"{head}.{body}.{sig}")
PY
)
start_sluice JWT "${quota[@]}" "SLUICE_ACCESS__JWT__KEYS=[{kid=\"hs\",algorithm=\"HS256\",secret=\"$secret\"}]"
allow=$(python3 -c 'print("[" + ",".join(f"\"10.1.{i}.0/24\"" for i in range(16)) + ",\"127.0.0.0/8\"]")')
deny=$(python3 -c 'print("[" + ",".join(f"\"10.2.{i}.0/24\"" for i in range(16)) + "]")')
start_sluice RULES "${quota[@]}" "SLUICE_ACCESS__ALLOW_IPS=$allow" "SLUICE_ACCESS__DENY_IPS=$deny"
lua keyed '{"jsonrpc":"2.0","id":1,"method":"eth_chainId","params":[]}' bench
lua token '{"jsonrpc":"2.0","id":1,"method":"eth_chainId","params":[]}' "$token"
rpc_as() { curl -sf "$1" -H 'content-type: application/json' -H "x-api-key: $2" -d '{"jsonrpc":"2.0","id":1,"method":"eth_chainId","params":[]}'; }
for url in "$MEMORY" "$REDIS" "$RULES"; do rpc_as "$url" bench | grep -q 0x7a69 || { echo "keyed call failed on $url" >&2; exit 1; }; done
rpc_as "$JWT" "$token" | grep -q 0x7a69 || { echo "token call failed on $JWT" >&2; exit 1; }
echo "| access control | concurrency | req/s | p50 / p99 µs | errors | req/s vs off |"
echo "|---|---:|---:|---:|---:|---:|"
row() {  # row LABEL CONCURRENCY SCRIPT URL OFF_RPS
  local rps p50 p99 err
  read -r rps p50 p99 _ err < <(wrk_run "$2" "$3" "$4")
  echo "| $1 | $2 | $rps | $p50 / $p99 | $err | $(python3 -c "print(f'{$rps/$5:.2f}')") |"
}
for c in $CONCURRENCY; do
  read -r off_rps off_p50 off_p99 _ off_err < <(wrk_run "$c" keyed "$OFF")
  echo "| off | $c | $off_rps | $off_p50 / $off_p99 | $off_err | 1.00 |"
  row "keys + quota, memory" "$c" keyed "$MEMORY" "$off_rps"
  row "keys + quota, redis" "$c" keyed "$REDIS" "$off_rps"
  row "JWT HS256 + quota, memory" "$c" token "$JWT" "$off_rps"
  row "key + quota + 33 CIDR rules" "$c" keyed "$RULES" "$off_rps"
done
echo
machine_line

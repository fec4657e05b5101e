#!/usr/bin/env bash
# Cached answers: wrk against anvil directly and through sluice (cache on), same run; then
# upstream calls for N concurrent identical misses with and without coalescing.
#   DURATION=10s CONCURRENCY="10 64 256" MISSES=256 bash bench/cache.sh
source "$(dirname "$0")/lib.sh"
CONCURRENCY=${CONCURRENCY:-"10 64 256"}
MISSES=${MISSES:-256}
start_anvil
# Block 1 holds 200 transfers (a heavy answer for the node to build); then 128 more blocks so
# blocks 0x1 and 0x10 are finalized.
rpc "$ANVIL_URL" evm_setAutomine '[false]' >/dev/null
for i in $(seq 200); do
  rpc "$ANVIL_URL" eth_sendTransaction "[{\"from\":\"0xf39fd6e51aad88f6f4ce6ab8827279cfffb92266\",\"to\":\"0x$(printf '%040x' "$i")\",\"value\":\"0x1\"}]" >/dev/null
done
rpc "$ANVIL_URL" evm_mine '[]' >/dev/null
rpc "$ANVIL_URL" evm_setAutomine '[true]' >/dev/null
rpc "$ANVIL_URL" anvil_mine '["0x80"]' >/dev/null
start_sluice SLUICE
start_sluice NO_COALESCE SLUICE_CACHE__COALESCE=false
for url in "$SLUICE" "$NO_COALESCE"; do   # wait for the head tracker (eth_blockNumber answered locally)
  for _ in $(seq 100); do
    curl -s -D - "$url" -H 'content-type: application/json' -d '{"jsonrpc":"2.0","id":1,"method":"eth_blockNumber"}' | grep -q 'served-by: local' && break
    sleep 0.1
  done
done
lua blocknumber '{"jsonrpc":"2.0","id":1,"method":"eth_blockNumber","params":[]}'
lua chainid '{"jsonrpc":"2.0","id":1,"method":"eth_chainId","params":[]}'
lua block '{"jsonrpc":"2.0","id":1,"method":"eth_getBlockByNumber","params":["0x10",true]}'
lua heavy '{"jsonrpc":"2.0","id":1,"method":"eth_getBlockByNumber","params":["0x1",true]}'
rpc "$SLUICE" eth_getBlockByNumber '["0x10",true]' >/dev/null   # warm
rpc "$SLUICE" eth_getBlockByNumber '["0x1",true]' >/dev/null
table_header
for c in $CONCURRENCY; do compare_row eth_blockNumber "$c" blocknumber "$ANVIL_URL" "$SLUICE"; done
for c in $CONCURRENCY; do compare_row eth_chainId "$c" chainid "$ANVIL_URL" "$SLUICE"; done
for c in $CONCURRENCY; do compare_row 'eth_getBlockByNumber(finalized, empty block, true)' "$c" block "$ANVIL_URL" "$SLUICE"; done
for c in $CONCURRENCY; do compare_row 'eth_getBlockByNumber(finalized, 200 txs, true)' "$c" heavy "$ANVIL_URL" "$SLUICE"; done
echo
machine_line
echo
echo "| $MISSES concurrent identical misses, one cold finalized block per round, 5 rounds | upstream calls per round |"
echo "|---|---:|"
for mode in coalescing:"$SLUICE" no-coalescing:"$NO_COALESCE"; do
  python3 - "${mode#*:}" "$MISSES" "${mode%%:*}" <<'PY'
# Opens N keep-alive connections first, then writes the same request on all of them at once, so
# the requests really are concurrent; counts upstream fetches with sluice_cache_misses_total.
import re, socket, sys, urllib.request
url, n, label = sys.argv[1], int(sys.argv[2]), sys.argv[3]
host, port = url.split("//")[1].split(":")
def metric(name):
    text = urllib.request.urlopen(url + "/metrics").read().decode()
    m = re.search(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0
calls = []
for block in range(0x30, 0x35):
    body = '{"jsonrpc":"2.0","id":1,"method":"eth_getBlockByNumber","params":["0x%x",true]}' % block
    request = (f"POST / HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
               f"content-length: {len(body)}\r\n\r\n{body}").encode()
    sockets = [socket.create_connection((host, int(port))) for _ in range(n)]
    before = metric("sluice_cache_misses_total")
    for s in sockets:
        s.sendall(request)
    for s in sockets:
        assert s.recv(65536).startswith(b"HTTP/1.1 200")
        s.close()
    calls.append(int(metric("sluice_cache_misses_total") - before))
print(f"| {label} | {' / '.join(map(str, calls))} |")
PY
done

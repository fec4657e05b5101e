#!/usr/bin/env bash
# The cost of OpenTelemetry traces, side by side in one run: wrk against sluice with traces off,
# on (every request sampled) and on at 1 %, each exporting to a local OTLP/HTTP sink (a Python
# stand-in that answers 200 and counts bytes, named as such). With BEFORE_BIN=path/to/sluice
# (a build of the commit before traces existed), that binary runs beside them: "off" against
# "before" is the cost of the disabled span callsites. Two calls: a cache hit (block 0) and a
# call the cache passes to anvil (a pending nonce, mempool off), which crosses every layer.
#   DURATION=10s CONCURRENCY=32 BEFORE_BIN=/tmp/oldtarget/release/sluice bash bench/telemetry.sh
source "$(dirname "$0")/lib.sh"
CONCURRENCY=${CONCURRENCY:-32}
start_anvil
sink_port=$(free_port)
python3 - "$sink_port" "$work/sink.count" <<'PY' &
import http.server, sys
port, out = int(sys.argv[1]), sys.argv[2]
total = {"posts": 0, "bytes": 0}
class Sink(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        n = int(self.headers.get("content-length", 0)); self.rfile.read(n)
        total["posts"] += 1; total["bytes"] += n
        open(out, "w").write(f"{total['posts']} {total['bytes']}\n")
        self.send_response(200); self.send_header("content-length", "0"); self.end_headers()
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(("127.0.0.1", port), Sink).serve_forever()
PY
pids+=($!)
common=(SLUICE_MEMPOOL__ENABLED=false)
otlp=(SLUICE_TELEMETRY__OTLP_ENDPOINT="http://127.0.0.1:$sink_port")
if [ -n "${BEFORE_BIN:-}" ]; then SLUICE_BIN=$BEFORE_BIN start_sluice BEFORE "${common[@]}"; fi
start_sluice OFF "${common[@]}"
start_sluice ON "${common[@]}" "${otlp[@]}"
start_sluice SAMPLED "${common[@]}" "${otlp[@]}" SLUICE_TELEMETRY__SAMPLE_RATIO=0.01
lua hit '{"jsonrpc":"2.0","id":1,"method":"eth_getBlockByNumber","params":["0x0",false]}'
lua pass '{"jsonrpc":"2.0","id":1,"method":"eth_getTransactionCount","params":["0xf39fd6e51aad88f6f4ce6ab8827279cfffb92266","pending"]}'
echo "| traces | call | concurrency | req/s | p50 / p99 µs | errors | req/s vs off |"
echo "|---|---|---:|---:|---:|---:|---:|"
for c in $CONCURRENCY; do
  for call in hit pass; do
    read -r off_rps off_p50 off_p99 _ off_err < <(wrk_run "$c" "$call" "$OFF")
    if [ -n "${BEFORE_BIN:-}" ]; then
      read -r rps p50 p99 _ err < <(wrk_run "$c" "$call" "$BEFORE")
      echo "| before traces existed | $call | $c | $rps | $p50 / $p99 | $err | $(python3 -c "print(f'{$rps/$off_rps:.2f}')") |"
    fi
    echo "| off | $call | $c | $off_rps | $off_p50 / $off_p99 | $off_err | 1.00 |"
    for name in ON SAMPLED; do
      read -r rps p50 p99 _ err < <(wrk_run "$c" "$call" "${!name}")
      label=$([ "$name" = ON ] && echo "on, every request" || echo "on, 1 % sampled")
      echo "| $label | $call | $c | $rps | $p50 / $p99 | $err | $(python3 -c "print(f'{$rps/$off_rps:.2f}')") |"
    done
  done
done
echo
echo "OTLP sink received (posts bytes): $(cat "$work/sink.count" 2>/dev/null || echo '0 0')"
machine_line

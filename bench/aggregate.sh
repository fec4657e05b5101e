#!/usr/bin/env bash
# The dapp page-load model: pages of 20 eth_calls (each its own HTTP request) at a constant
# rate, against anvil directly, sluice with aggregation off and sluice with Multicall3
# aggregation on, in alternating rounds in one run. Reports upstream calls per page (from
# sluice's own sluice_upstream_calls_total; probes and the head watcher included) and page
# latency (until a page's last answer, from its scheduled start).
#   DURATION=10s PAGES=200 CALLS=20 ROUNDS=2 bash bench/aggregate.sh
source "$(dirname "$0")/lib.sh"
PAGES=${PAGES:-200}
CALLS=${CALLS:-20}
ROUNDS=${ROUNDS:-2}
MULTICALL3=0xca11bde05977b3631167028862be2a173976ca11
CORPUS=0x00000000000000000000000000000000c0ffee00
start_anvil
rpc "$ANVIL_URL" evm_setIntervalMining '[1]' >/dev/null   # a chain that moves: a block a second

# The test contracts (a Multicall3-compatible aggregate3 and the corpus), compiled with solc-js.
node crates/sluice/tests/contracts/compile.js .tools/node_modules/solc \
  crates/sluice/tests/contracts/Aggregator.sol crates/sluice/tests/contracts/Corpus.sol >"$work/code.json"
code() { python3 -c "import json,sys; print('0x' + json.load(open('$work/code.json'))[sys.argv[1]])" "$1"; }
rpc "$ANVIL_URL" anvil_setCode "[\"$MULTICALL3\",\"$(code Aggregator)\"]" >/dev/null
rpc "$ANVIL_URL" anvil_setCode "[\"$CORPUS\",\"$(code Corpus)\"]" >/dev/null

# A page's reads: 2,000 different calls (view functions of one contract), drawn at random, so
# most are cache misses as on a busy dapp, some repeat.
python3 - "$work/mix.toml" "$CORPUS" <<'PY'
import sys
out, corpus = sys.argv[1], sys.argv[2]
echo, balance, number = "0x6279e43c", "0xe3d670d7", "0x8381f58a"  # selectors (cast sig)
data = [echo + format(i, "064x") for i in range(1800)]
data += [balance + format(0x1000 + i, "064x") for i in range(199)]
data.append(number)
with open(out, "w") as f:
    f.write("[vars]\ndata = [%s]\n" % ", ".join('"%s"' % d for d in data))
    f.write('[[call]]\nmethod = "eth_call"\nparams = [{ to = "%s", data = "{data}" }, "latest"]\n' % corpus)
PY
start_sluice OFF
start_sluice ON SLUICE_AGGREGATE__ETH_CALL=true
upstream_calls() { curl -s "$1/metrics" | awk '/^sluice_upstream_calls_total/ {s += $NF} END {printf "%d", s}'; }

run() {  # run URL: one round; prints "pages ok p50_us p99_us errors cpu"
  "${SLUICE_BIN:-target/release/sluice}" bench rpc "$1" --rate "$PAGES" --page "$CALLS" -d "$DURATION" \
    --mix "$work/mix.toml" --timeout 5s --json |
    python3 -c 'import json,sys; s=json.load(sys.stdin); c=s["generator"]["cpu_cores"]; print(s["requests"], s["ok"], s["latency_us"]["p50"], s["latency_us"]["p99"], s["requests"]-s["ok"], "?" if c is None else f"{c:.2f}")'
}

declare -A pages calls p50s p99s errs cpus
for name in DIRECT OFF ON; do pages[$name]=0; calls[$name]=0; p50s[$name]=""; p99s[$name]=""; errs[$name]=0; cpus[$name]=""; done
for round in $(seq "$ROUNDS"); do
  for name in DIRECT OFF ON; do
    case $name in DIRECT) url=$ANVIL_URL ;; OFF) url=$OFF ;; ON) url=$ON ;; esac
    before=0; [ "$name" = DIRECT ] || before=$(upstream_calls "$url")
    read -r n ok p50 p99 err cpu < <(run "$url")
    after=0; [ "$name" = DIRECT ] || after=$(upstream_calls "$url")
    pages[$name]=$(( ${pages[$name]} + n )); calls[$name]=$(( ${calls[$name]} + after - before ))
    p50s[$name]+="$p50 "; p99s[$name]+="$p99 "; errs[$name]=$(( ${errs[$name]} + err )); cpus[$name]+="$cpu "
  done
done

echo "| target | pages | upstream calls per page | page p50 ms (per round) | page p99 ms (per round) | failed pages | generator CPU cores (per round) |"
echo "|---|---:|---:|---:|---:|---:|---:|"
for name in DIRECT OFF ON; do
  case $name in DIRECT) label="anvil directly" ;; OFF) label="sluice, aggregation off" ;; ON) label="sluice, aggregation on" ;; esac
  per_page=$( [ "$name" = DIRECT ] && echo "$CALLS (by construction)" || python3 -c "print(f'{${calls[$name]}/${pages[$name]}:.2f}')")
  ms() { python3 -c "import sys; print(' / '.join(f'{int(x)/1000:.1f}' for x in sys.argv[1:]))" $1; }
  echo "| $label | ${pages[$name]} | $per_page | $(ms "${p50s[$name]}") | $(ms "${p99s[$name]}") | ${errs[$name]} | $(echo ${cpus[$name]} | sed 's/ / \/ /g') |"
done
echo
slow_share() {  # upstream exchanges over 100 ms, from sluice's own histogram
  curl -s "$1/metrics" | awk '/^sluice_upstream_call_duration_seconds_bucket/ && /le="0.1"/ {fast += $NF}
    /^sluice_upstream_call_duration_seconds_count/ {all += $NF} END {printf "%d of %d (%.1f %%)", all - fast, all, all ? 100 * (all - fast) / all : 0}'
}
echo "upstream exchanges over 100 ms (sluice_upstream_call_duration_seconds): aggregation off $(slow_share "$OFF"), on $(slow_share "$ON")"
echo "aggregated calls: $(curl -s "$ON/metrics" | grep '^sluice_aggregate_calls_total' | sed 's/sluice_aggregate_calls_total//' | tr '\n' ' ')"
echo "machine: $(nproc) cores; $PAGES pages/s of $CALLS eth_calls for $DURATION per round, $ROUNDS rounds; anvil $("$ANVIL" --version | head -1 | cut -d' ' -f3) mining a block a second; generator, sluice and anvil on the same machine"

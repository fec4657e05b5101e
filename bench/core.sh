#!/usr/bin/env bash
# The request path's own cost, against the machine's limits measured in the same run:
#   * pass-through (cache and coalescing off) against a bare hyper forwarder to the same anvil;
#   * cached answers (eth_blockNumber; a block with 200 full transactions) against a bare server
#     answering the very same bytes.
# wrk is the generator (light; -t1 so that it takes one core at most). Rows alternate targets;
# each gives the best run of each side and the median of the rounds' ratios (each round runs the
# two back to back). A control row puts sluice against a second sluice of the same build and
# configuration: its distance from 1.00 is how far this run's noise alone moves a ratio.
#   DURATION=10s ROUNDS=2 bash bench/core.sh
source "$(dirname "$0")/lib.sh"
ROUNDS=${ROUNDS:-2}
start_anvil
mine_big_block

start_sluice PASS SLUICE_CACHE__ENABLED=false SLUICE_CACHE__COALESCE=false
start_sluice CACHED
start_sluice TWIN
start_baseline FORWARD forward --to "$ANVIL_URL"

lua chainid '{"jsonrpc":"2.0","id":1,"method":"eth_chainId","params":[]}'
lua balance '{"jsonrpc":"2.0","id":1,"method":"eth_getBalance","params":["0xf39fd6e51aad88f6f4ce6ab8827279cfffb92266","0x0"]}'
lua number '{"jsonrpc":"2.0","id":1,"method":"eth_blockNumber","params":[]}'
lua block "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"eth_getBlockByNumber\",\"params\":[\"$BIG\",true]}"

# The bare servers answer exactly the bytes sluice answers from its cache.
for name in number block; do
  body=$(python3 -c "import re,sys; print(re.search(r\"wrk.body = '(.*)'\", open('$work/$name.lua').read()).group(1))")
  for _ in 1 2; do curl -sf "$CACHED" -H 'content-type: application/json' -d "$body" -o "$work/$name.answer"; done
done
start_baseline FIXED_SMALL fixed --body-file "$work/number.answer"
start_baseline FIXED_LARGE fixed --body-file "$work/block.answer"
large_bytes=$(stat -c %s "$work/block.answer")

row() {  # row LABEL CONCURRENCY SCRIPT BASELINE_URL SLUICE_URL: ROUNDS alternating runs of each
  local best_b=0 best_s=0 b_p50="" s_p50="" rps p50 p99 b ratios=()
  for _ in $(seq "$ROUNDS"); do
    read -r rps p50 p99 _ _ < <(wrk1 "$2" "$3" "$4")
    b=$rps
    if [ "$rps" -gt "$best_b" ]; then best_b=$rps; b_p50=$p50; fi
    read -r rps p50 p99 _ _ < <(wrk1 "$2" "$3" "$5")
    if [ "$rps" -gt "$best_s" ]; then best_s=$rps; s_p50=$p50; fi
    ratios+=("$rps/$b")
  done
  ratio=$(python3 -c "print(f'{$best_s/$best_b:.2f}')")
  median=$(python3 -c "import statistics; print(f'{statistics.median([${ratios[*]/%/,}]):.2f}')")
  echo "| $1 | $2 | $best_b | $best_s | $ratio | $median | $b_p50 | $s_p50 |"
}

echo "| case | c | baseline req/s (best) | sluice req/s (best) | sluice / baseline, best | sluice / baseline, median of rounds | baseline p50 µs | sluice p50 µs |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|"
row "pass-through eth_chainId vs bare forwarder" 64 chainid "$FORWARD" "$PASS"
row "pass-through eth_getBalance vs bare forwarder" 64 balance "$FORWARD" "$PASS"
row "pass-through eth_chainId vs bare forwarder" 1 chainid "$FORWARD" "$PASS"
row "cached eth_blockNumber vs bare server, same bytes" 64 number "$FIXED_SMALL" "$CACHED"
row "control: cached eth_blockNumber vs a second sluice (same build, A/A)" 64 number "$TWIN" "$CACHED"
row "cached block of 200 txs ($large_bytes bytes) vs bare server, same bytes" 64 block "$FIXED_LARGE" "$CACHED"
echo
echo "machine: $(nproc) cores, $(uname -m); wrk -t1, $DURATION per run, best of and median over $ROUNDS alternating runs; anvil $("$ANVIL" --version | head -1 | cut -d' ' -f3); generator, sluice, baseline and anvil on the same machine"

#!/usr/bin/env bash
# Pass-through (cache off): wrk against anvil directly and through sluice, same run, alternating.
#   DURATION=10s CONCURRENCY="10 64" bash bench/passthrough.sh
source "$(dirname "$0")/lib.sh"
CONCURRENCY=${CONCURRENCY:-"10 64"}
start_anvil
start_sluice SLUICE SLUICE_CACHE__ENABLED=false
lua chainid '{"jsonrpc":"2.0","id":1,"method":"eth_chainId","params":[]}'
lua block '{"jsonrpc":"2.0","id":1,"method":"eth_getBlockByNumber","params":["0x0",true]}'
table_header
for c in $CONCURRENCY; do compare_row eth_chainId "$c" chainid "$ANVIL_URL" "$SLUICE"; done
for c in $CONCURRENCY; do compare_row 'eth_getBlockByNumber(0x0,true)' "$c" block "$ANVIL_URL" "$SLUICE"; done
echo
machine_line

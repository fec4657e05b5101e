#!/usr/bin/env bash
# Server CPU per request, sluice beside the bare fixed-body server answering the same bytes:
# the sharpest measure of the request path's own cost on a noisy 2-core machine, where req/s
# moves with whatever else runs. For each wrk run (-t1, cached eth_blockNumber), the server's
# user + system CPU time (/proc/PID/stat) over the requests it answered. Rows alternate targets.
# With PERF=1 (needs `perf`), each server is also sampled during one more run and the split of
# its CPU between the kernel, the C library and its own code is printed.
# With BEFORE_BIN=PATH, a second sluice (another build) runs beside the first.
# With BLOCK=1, a third table does the same for a large cached answer (a block with 200 full
# transactions) beside a bare server answering its bytes.
# A second table does the same for pass-through calls (eth_chainId, cache and coalescing off)
# beside the bare forwarder to the same anvil (and the same forwarder through hyper-util's
# general client), with anvil's own CPU per request beside them.
# With SLEEPS=1 (needs `perf`), each cached-path server's recvfrom, writev, epoll_wait and
# sched_yield calls and context switches per request are counted during one more run.
# With ALLOCS=1 (needs `perf`; a uprobe on mimalloc's allocation entry, or the C library's
# malloc in a binary without it), each server's allocation calls per request are counted during
# one more run of each kind.
#   DURATION=4s ROUNDS=3 [PERF=1] [SLEEPS=1] [ALLOCS=1] [BLOCK=1] [BEFORE_BIN=…] bash bench/cpu.sh
source "$(dirname "$0")/lib.sh"
ROUNDS=${ROUNDS:-3}
C=${C:-64}
cargo build --release -q -p sluice-bench --bin sluice-baseline
[ -z "${PERF:-}${ALLOCS:-}${SLEEPS:-}" ] || need_perf

start_anvil
anvil_pid=${pids[-1]}
[ -z "${BLOCK:-}" ] || mine_big_block
declare -A pid_of
start_sluice CACHED
targets=("sluice:$CACHED"); pid_of[sluice]=${pids[-1]}
start_sluice PASS SLUICE_CACHE__ENABLED=false SLUICE_CACHE__COALESCE=false
passes=("sluice, cache off:$PASS"); pid_of["sluice, cache off"]=${pids[-1]}
if [ -n "${BEFORE_BIN:-}" ]; then
  SLUICE_BIN=$BEFORE_BIN start_sluice BEFORE
  targets+=("sluice (BEFORE_BIN):$BEFORE"); pid_of["sluice (BEFORE_BIN)"]=${pids[-1]}
  SLUICE_BIN=$BEFORE_BIN start_sluice BEFORE_PASS SLUICE_CACHE__ENABLED=false SLUICE_CACHE__COALESCE=false
  passes+=("sluice (BEFORE_BIN), cache off:$BEFORE_PASS"); pid_of["sluice (BEFORE_BIN), cache off"]=${pids[-1]}
fi
lua chainid '{"jsonrpc":"2.0","id":1,"method":"eth_chainId","params":[]}'
lua number '{"jsonrpc":"2.0","id":1,"method":"eth_blockNumber","params":[]}'
for _ in 1 2; do curl -sf "$CACHED" -H 'content-type: application/json' \
  -d '{"jsonrpc":"2.0","id":1,"method":"eth_blockNumber","params":[]}' -o "$work/answer"; done
port=$(free_port)
target/release/sluice-baseline --listen "127.0.0.1:$port" fixed --body-file "$work/answer" >/dev/null &
pids+=($!); pid_of["bare server"]=$!
BARE="http://127.0.0.1:$port"
for _ in $(seq 100); do curl -s -o /dev/null "$BARE/" -d '{}' && break; sleep 0.1; done
blocks=()
if [ -n "${BLOCK:-}" ]; then
  lua block "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"eth_getBlockByNumber\",\"params\":[\"$BIG\",true]}"
  for url in "${targets[@]#*:}"; do
    for _ in 1 2; do rpc "$url" eth_getBlockByNumber "[\"$BIG\",true]" >"$work/block.answer"; done
  done
  port=$(free_port)
  target/release/sluice-baseline --listen "127.0.0.1:$port" fixed --body-file "$work/block.answer" >/dev/null &
  pids+=($!); pid_of["bare server, block"]=$!
  for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$port/" -d '{}' && break; sleep 0.1; done
  blocks=("bare server, block:http://127.0.0.1:$port" "${targets[@]}")
fi
targets=("bare server:$BARE" "${targets[@]}")

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# measure TABLE SCRIPT FIRST_ROW TARGET…: rounds of wrk runs, rows alternating; prints a table
# of req/s and CPU per request against FIRST_ROW (the machine's own limit for this kind).
measure() {
  local title=$1 script=$2 baseline=$3; shift 3
  local -A rps_sum cpu_sum anvil_sum
  local t name url pid before after a_before a_after out n rps
  for _ in $(seq "$ROUNDS"); do
    for t in "$@"; do
      name=${t%%:http*}; url=${t#*:}; pid=${pid_of[$name]}
      before=$(cpu_ticks "$pid"); a_before=$(cpu_ticks "$anvil_pid")
      out=$(wrk -t1 -c"$C" -d"$DURATION" -s "$work/$script.lua" "$url/")
      after=$(cpu_ticks "$pid"); a_after=$(cpu_ticks "$anvil_pid")
      n=$(echo "$out" | awk '/requests in/ {print $1}')
      rps=$(echo "$out" | awk '/Requests\/sec/ {print $2}')
      rps_sum[$name]=$(python3 -c "print(${rps_sum[$name]:-0} + $rps)")
      cpu_sum[$name]=$(python3 -c "print(${cpu_sum[$name]:-0} + ($after - $before) * 1e6 / $(getconf CLK_TCK) / $n)")
      anvil_sum[$name]=$(python3 -c "print(${anvil_sum[$name]:-0} + ($a_after - $a_before) * 1e6 / $(getconf CLK_TCK) / $n)")
    done
  done
  echo "| $title | req/s (mean of $ROUNDS) | server CPU µs per request (mean of $ROUNDS) | req/s / $baseline | CPU / $baseline | anvil CPU µs per request |"
  echo "|---|---:|---:|---:|---:|---:|"
  for t in "$@"; do
    name=${t%%:http*}
    python3 -c "
r, c, a = ${rps_sum[$name]} / $ROUNDS, ${cpu_sum[$name]} / $ROUNDS, ${anvil_sum[$name]} / $ROUNDS
br, bc = ${rps_sum[$baseline]} / $ROUNDS, ${cpu_sum[$baseline]} / $ROUNDS
print(f'| $name | {r:.0f} | {c:.2f} | {r / br:.2f} | {c / bc:.2f} | {a:.2f} |')"
  done
  echo
}

start_forwarder FORWARD
pid_of["bare forwarder"]=${pids[-1]}
# The same forwarder through hyper-util's general client, whose pool costs more per request
# than the keep-alive connections sluice and the bare forwarder share.
start_forwarder FORWARD_GENERAL --general-client
pid_of["bare forwarder, general client"]=${pids[-1]}
passes=("bare forwarder:$FORWARD" "bare forwarder, general client:$FORWARD_GENERAL" "${passes[@]}")

measure "cached eth_blockNumber, c=$C" number "bare server" "${targets[@]}"
measure "pass-through eth_chainId, c=$C" chainid "bare forwarder" "${passes[@]}"
[ -z "${BLOCK:-}" ] || measure "cached block of 200 txs ($(stat -c %s "$work/block.answer") bytes), c=$C" block \
  "bare server, block" "${blocks[@]}"

if [ -n "${ALLOCS:-}" ]; then
  # Allocation calls: mimalloc's entry for Rust allocations (`mi_malloc_aligned`) in a binary
  # built with it, else the C library's malloc.
  libc=$(ldd target/release/sluice | awk '/libc.so/ {print $3}')
  echo "| allocation calls per request (perf uprobe, one ${DURATION} run each) | allocator | calls per request |"
  echo "|---|---|---:|"
  for t in "${targets[@]}" "${passes[@]}"; do
    name=${t%%:http*}; url=${t#*:}; pid=${pid_of[$name]}
    script=number; [[ " ${passes[*]} " == *"$t"* ]] && script=chainid
    exe=$(readlink -f "/proc/$pid/exe")
    perf probe -q -d 'allocs:*' >/dev/null 2>&1 || true
    if perf probe -q -x "$exe" -a 'allocs:calls=mi_malloc_aligned' >/dev/null 2>&1; then
      allocator=mimalloc
    else
      perf probe -q -x "$libc" -a 'allocs:calls=malloc' >/dev/null 2>&1
      allocator="C library"
    fi
    perf stat -x, -e allocs:calls -p "$pid" -o "$work/allocs" -- sleep "${DURATION%s}" &
    counting=$!
    out=$(wrk -t1 -c"$C" -d"$DURATION" -s "$work/$script.lua" "$url/")
    wait "$counting"
    n=$(echo "$out" | awk '/requests in/ {print $1}')
    calls=$(awk -F, '/allocs:calls/ {print $1}' "$work/allocs")
    python3 -c "print(f'| $name ($script) | $allocator | {$calls / $n:.1f} |')"
  done
  perf probe -q -d 'allocs:*' >/dev/null 2>&1 || true
  echo
fi

if [ -n "${SLEEPS:-}" ]; then
  # How often each cached-path server sleeps and is woken: its epoll_wait and sched_yield calls
  # and context switches per request, beside the one read and one write every request costs.
  events=(syscalls:sys_enter_recvfrom syscalls:sys_enter_writev syscalls:sys_enter_epoll_wait
    syscalls:sys_enter_sched_yield context-switches)
  echo "| per request (perf stat, one ${DURATION} run each) | recvfrom | writev | epoll_wait | sched_yield | context switches |"
  echo "|---|---:|---:|---:|---:|---:|"
  for t in "${targets[@]}"; do
    name=${t%%:http*}; url=${t#*:}; pid=${pid_of[$name]}
    args=(); for e in "${events[@]}"; do args+=(-e "$e"); done
    perf stat -x, "${args[@]}" -p "$pid" -o "$work/sleeps" -- sleep "${DURATION%s}" &
    counting=$!
    out=$(wrk -t1 -c"$C" -d"$DURATION" -s "$work/number.lua" "$url/")
    wait "$counting"
    n=$(echo "$out" | awk '/requests in/ {print $1}')
    row="| $name"
    for e in "${events[@]}"; do
      count=$(awk -F, -v e="$e" '$3 == e {print $1}' "$work/sleeps")
      row+=" | $(python3 -c "print(f'{${count:-0} / $n:.3f}')")"
    done
    echo "$row |"
  done
  echo
fi

if [ -n "${PERF:-}" ]; then
  echo "| where the server's CPU goes (perf, cpu-clock samples) | kernel | C library | its own code |"
  echo "|---|---:|---:|---:|"
  for t in "${targets[@]}"; do
    name=${t%%:http*}; url=${t#*:}; pid=${pid_of[$name]}
    wrk -t1 -c"$C" -d5s -s "$work/number.lua" "$url/" >/dev/null &
    load=$!
    sleep 1
    perf record -q -e cpu-clock -F 2000 -p "$pid" -o "$work/perf.data" -- sleep 3 >/dev/null 2>&1
    wait "$load"
    perf report -i "$work/perf.data" --no-children --sort dso --stdio 2>/dev/null | python3 -c "
import re, sys
share = {'kernel': 0.0, 'libc': 0.0, 'own': 0.0}
for line in sys.stdin:
    m = re.match(r'\s+([\d.]+)%\s+(\S+)', line)
    if not m: continue
    p, dso = float(m.group(1)), m.group(2)
    key = 'kernel' if 'kernel' in dso else 'libc' if dso.startswith('lib') else 'own'
    share[key] += p
print(f\"| $name | {share['kernel']:.1f} % | {share['libc']:.1f} % | {share['own']:.1f} % |\")"
    cp "$work/perf.data" "$work/perf-${name// /-}.data"
  done
  echo
  echo "sluice's busiest user-space functions (self time, % of its CPU samples):"
  echo
  perf report -i "$work/perf-sluice.data" --no-children --sort symbol --stdio 2>/dev/null \
    | grep -E '^ +[0-9.]+% +\[\.\]' | sed -E 's/ +- +- *$//; s/ +$//; s/^ +/    /' | head -25 || true
  echo
fi
echo "machine: $(nproc) cores, $(uname -m); wrk -t1 -c$C, $DURATION per run, $ROUNDS rounds alternating; generator and servers on the same machine"

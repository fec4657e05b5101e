#!/usr/bin/env bash
# Where pass-through CPU goes on the whole machine, sluice beside the bare forwarder to the same
# anvil: for each wrk run (-t1, eth_chainId, cache and coalescing off), per request answered,
# the proxy's and anvil's CPU time, the machine's busy CPU time (all processes, /proc/stat) and
# its context switches (/proc/stat `ctxt`) and TCP segments sent (/proc/net/snmp `OutSegs`).
# On a saturated 2-core machine req/s follows the busy time per request; a stage that is slower makes the others sleep and wake more often, and each
# switch costs them CPU of their own. Rows alternate targets.
# With PERF=1 (needs `perf`), one more run of each records the machine's context switches for
# 2 s and prints, per request, how often each process's threads went to sleep (switched out
# waiting, not preempted).
#   DURATION=4s ROUNDS=3 [PERF=1] bash bench/sched.sh
source "$(dirname "$0")/lib.sh"
ROUNDS=${ROUNDS:-3}
C=${C:-64}
[ -z "${PERF:-}" ] || need_perf

start_anvil
anvil_pid=${pids[-1]}
start_sluice PASS SLUICE_CACHE__ENABLED=false SLUICE_CACHE__COALESCE=false
sluice_pid=${pids[-1]}
start_forwarder FORWARDER
forwarder_pid=${pids[-1]}
lua chainid '{"jsonrpc":"2.0","id":1,"method":"eth_chainId","params":[]}'

ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
busy() { awk '/^cpu / {print $2 + $3 + $4 + $7 + $8}' /proc/stat; }
switches() { awk '/^ctxt/ {print $2}' /proc/stat; }
segments() { awk '/^Tcp:/ {n++; if (n == 2) print $12}' /proc/net/snmp; }

declare -A sum
for _ in $(seq "$ROUNDS"); do
  for row in "bare forwarder|$FORWARDER|$forwarder_pid" "sluice, cache off|$PASS|$sluice_pid"; do
    IFS="|" read -r name url pid <<<"$row"
    p0=$(ticks "$pid"); a0=$(ticks "$anvil_pid"); b0=$(busy); s0=$(switches); g0=$(segments)
    out=$(wrk -t1 -c"$C" -d"$DURATION" -s "$work/chainid.lua" "$url/")
    p1=$(ticks "$pid"); a1=$(ticks "$anvil_pid"); b1=$(busy); s1=$(switches); g1=$(segments)
    n=$(echo "$out" | awk '/requests in/ {print $1}')
    rps=$(echo "$out" | awk '/Requests\/sec/ {print $2}')
    tick=$(python3 -c "print(1e6 / $(getconf CLK_TCK) / $n)")
    for field in "rps $rps" "proxy $(python3 -c "print(($p1 - $p0) * $tick)")" \
      "anvil $(python3 -c "print(($a1 - $a0) * $tick)")" "busy $(python3 -c "print(($b1 - $b0) * $tick)")" \
      "switches $(python3 -c "print(($s1 - $s0) / $n)")" "segments $(python3 -c "print(($g1 - $g0) / $n)")"; do
      read -r key value <<<"$field"
      sum["$name/$key"]=$(python3 -c "print(${sum["$name/$key"]:-0} + $value)")
    done
  done
done
echo "| pass-through eth_chainId, c=$C (mean of $ROUNDS) | req/s | proxy CPU µs/req | anvil CPU µs/req | machine busy CPU µs/req | context switches/req (machine) | TCP segments/req (machine) |"
echo "|---|---:|---:|---:|---:|---:|---:|"
for name in "bare forwarder" "sluice, cache off"; do
  python3 -c "
m = {k: v / $ROUNDS for k, v in dict(rps=${sum["$name/rps"]}, proxy=${sum["$name/proxy"]}, anvil=${sum["$name/anvil"]}, busy=${sum["$name/busy"]}, switches=${sum["$name/switches"]}, segments=${sum["$name/segments"]}).items()}
print(f\"| $name | {m['rps']:.0f} | {m['proxy']:.1f} | {m['anvil']:.1f} | {m['busy']:.1f} | {m['switches']:.2f} | {m['segments']:.2f} |\")"
done
echo
echo "machine: $(nproc) cores, $(uname -m); wrk -t1 -c$C, $DURATION per run, $ROUNDS rounds alternating; generator, proxies and anvil on the same machine"

[ -n "${PERF:-}" ] || exit 0
echo
echo "| sleeps per request (perf sched:sched_switch, 2 s of one run) | sluice-baseline / sluice | anvil | wrk |"
echo "|---|---:|---:|---:|"
for row in "bare forwarder|$FORWARDER|$forwarder_pid" "sluice, cache off|$PASS|$sluice_pid"; do
  IFS="|" read -r name url pid <<<"$row"
  (sleep 1; perf record -q -a -e sched:sched_switch -o "$work/sched.data" -- sleep 2 >/dev/null 2>&1) &
  recorder=$!
  out=$(wrk -t1 -c"$C" -d4s -s "$work/chainid.lua" "$url/")
  wait "$recorder"
  rps=$(echo "$out" | awk '/Requests\/sec/ {print $2}')
  # A thread that switched out in state S went to sleep waiting; R was preempted.
  perf script -i "$work/sched.data" -F pid,trace 2>/dev/null | awk -v proxy="$pid" -v anvil="$anvil_pid" -v rps="$rps" -v name="$name" '
    / prev_state=S / { if ($1 == proxy) p++; else if ($1 == anvil) a++; else if ($0 ~ /prev_comm=wrk /) w++ }
    END { printf "| %s | %.2f | %.2f | %.2f |\n", name, p / (2 * rps), a / (2 * rps), w / (2 * rps) }'
done

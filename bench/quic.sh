#!/usr/bin/env bash
# The QUIC ingress, in one run:
#  1. one client offering RATE tx/s through emulated RTTs, with and without RTT scaling
#     (`sluice bench quic rtt`, in-process ingress in front of the counting intake);
#  2. many clients on loopback into the counting intake: open loop at LOAD_RATES, then saturating
#     (`sluice bench quic load`);
#  3. signed transfers over QUIC into a real sluice's mempool in front of anvil (full validation,
#     bidirectional streams, each answer counted).
#   DURATION=5s RATE=10000 LOAD_RATES="50000 80000" bash bench/quic.sh
STAND_INS=1  # sections 1 and 2 run into the counting intake
source "$(dirname "$0")/lib.sh"
RATE=${RATE:-10000}
LOAD_RATES=${LOAD_RATES:-"50000 80000"}
bench() { target/release/sluice bench "$@"; }

echo "### One client through an emulated RTT"
echo
bench quic rtt --rate "$RATE" -d "$DURATION" 2>/dev/null
echo
echo "### Many clients into the counting intake (no validation)"
echo
for r in $LOAD_RATES; do echo "- $(bench quic load --clients 8 --rate "$r" -d "$DURATION")"; done
echo "- $(bench quic load --clients 8 -d "$DURATION")"
echo
echo "### Signed transfers into sluice's mempool (full validation)"
echo
start_anvil
rpc "$ANVIL_URL" evm_setAutomine '[false]' >/dev/null
quic_port=$(free_port)
start_sluice SLUICE SLUICE_MEMPOOL__RELAY=false SLUICE_INGRESS__LISTEN="127.0.0.1:$quic_port" \
  SLUICE_INGRESS__KEY="$work/ingress.key" SLUICE_INGRESS__CAPACITY=1000000 \
  SLUICE_MEMPOOL__GLOBAL_SLOTS=10000000 SLUICE_MEMPOOL__GLOBAL_QUEUE=10000000 SLUICE_MEMPOOL__ACCOUNT_QUEUE=100000
for c in 4 16; do
  echo "- $(bench quic load --target "127.0.0.1:$quic_port" --rpc "$ANVIL_URL" --clients "$c" --streams 64 \
    --txs 40000 --first-sender $((c * 10000)) -d "$DURATION")"
done
echo
machine_line

#!/usr/bin/env bash
# Runs sluice in front of a local anvil devnet on http://127.0.0.1:8545 (Ctrl-C stops both).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-tools.sh
exec cargo run --release -p sluice -- dev "$@"

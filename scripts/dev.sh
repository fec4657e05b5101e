#!/usr/bin/env bash
# Runs sluice in front of a local anvil devnet on http://127.0.0.1:8545 (Ctrl-C stops both);
# its status page is http://127.0.0.1:8545/ in a browser on this machine.
# Needs Rust (cargo) and npm, and no root: it installs only anvil, into the project's .tools/,
# and builds the `quickstart` profile (thin LTO; packages and benchmarks use `release`).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v cargo >/dev/null 2>&1; then
  echo "dev.sh: cargo is missing: install Rust (https://rustup.rs), then run this again" >&2
  exit 1
fi
bash scripts/install-tools.sh --dev
exec cargo run --profile quickstart -q -p sluice -- dev "$@"

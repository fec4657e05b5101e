#!/usr/bin/env bash
# The whole test suite: installs missing tools, then runs every test in the workspace against
# real processes (anvil, cast, redis-server) on loopback, then each fuzz target for a few seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-tools.sh
cargo test --workspace --all-targets "$@"
# Every libFuzzer target, briefly (seconds each): no crash from its seeds and what it finds.
bash scripts/fuzz.sh all 5

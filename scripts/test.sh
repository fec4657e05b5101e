#!/usr/bin/env bash
# The whole test suite: installs missing tools, then runs every test in the workspace against
# real processes (anvil, cast, redis-server) on loopback, then each fuzz target for a few seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-tools.sh
cargo test --workspace --all-targets "$@"
# The quickstart from a fresh clone as a user without root (crates/sluice/tests/quickstart.rs):
# minutes of building from nothing, so on its own, after the others.
cargo test -p sluice --test quickstart -- --ignored
# Every libFuzzer target from its committed seeds, then a fixed number of runs with a fixed seed:
# the same inputs on every run of the same build (open-ended fuzzing: scripts/fuzz.sh TARGET SECONDS).
bash scripts/fuzz.sh all fixed

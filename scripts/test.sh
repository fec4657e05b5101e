#!/usr/bin/env bash
# The whole test suite: installs missing tools, then runs every test in the workspace against
# real processes (anvil, cast) on loopback.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-tools.sh
cargo test --workspace --all-targets "$@"

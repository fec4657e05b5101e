#!/usr/bin/env bash
# Installs what sluice's tests need, only when missing:
#   - anvil and cast (pinned Foundry npm packages), solc, viem and playwright-core into the
#     git-ignored .tools/ folder;
#   - cargo-deb (pinned) into cargo's bin folder;
#   - node/npm, redis-server, prometheus (with promtool) and chromium from Debian when the
#     machine has none (needs root, as on CI).
# With --dev, only what `sluice dev` needs (scripts/dev.sh): anvil into .tools/, with npm, no root.
set -euo pipefail
cd "$(dirname "$0")/.."

FOUNDRY_VERSION=1.7.1
TOOLS=.tools
ANVIL="$TOOLS/node_modules/@foundry-rs/anvil-linux-amd64/bin/anvil"
CAST="$TOOLS/node_modules/@foundry-rs/cast-linux-amd64/bin/cast"
# solc (solc-js), for the contracts the aggregation tests compile (crates/sluice/tests/contracts/).
SOLC_VERSION=0.8.37
SOLCJS="$TOOLS/node_modules/solc/solc.js"
# viem, for the test that runs a dapp's own send / wait / read flow through sluice (tests/js/).
VIEM_VERSION=2.58.8
# playwright-core (no browser download), driving Debian's chromium in the status page's test.
PLAYWRIGHT_VERSION=1.65.1

npm_prefix_install() {  # exactly the packages given, into .tools/
  mkdir -p "$TOOLS"
  # One npm call for all of them: `npm install --no-save` removes what it is not given.
  npm install --prefix "$TOOLS" --no-save --no-audit --no-fund --loglevel=error "$@"
}

apt_install() {
  if [ "$(id -u)" != 0 ]; then
    echo "install-tools: need root to apt-get install $*" >&2
    exit 1
  fi
  if [ -z "${APT_UPDATED:-}" ]; then
    apt-get update -qq
    APT_UPDATED=1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

if [ "${1:-}" = --dev ]; then
  if ! command -v npm >/dev/null 2>&1; then
    echo "dev.sh: npm is missing: it fetches anvil, the local devnet (install Node.js and npm, e.g. apt-get install npm)" >&2
    exit 1
  fi
  installed_version() { "$1" --version 2>/dev/null | grep -o "$FOUNDRY_VERSION" | head -n1; }
  if [ ! -x "$ANVIL" ] || [ "$(installed_version "$ANVIL")" != "$FOUNDRY_VERSION" ]; then
    echo "dev.sh: installing anvil $FOUNDRY_VERSION into $TOOLS/"
    keep=()
    for pkg in @foundry-rs/cast-linux-amd64 solc viem playwright-core; do
      [ -f "$TOOLS/node_modules/$pkg/package.json" ] && keep+=("$pkg@$(node -p "require('./$TOOLS/node_modules/$pkg/package.json').version")")
    done
    npm_prefix_install "@foundry-rs/anvil-linux-amd64@$FOUNDRY_VERSION" "${keep[@]}"
  fi
  exit 0
fi

command -v npm >/dev/null 2>&1 || apt_install nodejs npm
command -v redis-server >/dev/null 2>&1 || apt_install redis-server
# Prometheus and promtool, for the tests of the dashboard and rules in deploy/ (not its exporters).
# The package may start its own server on :9090; the tests start theirs on free loopback ports.
if ! command -v promtool >/dev/null 2>&1; then
  apt_install --no-install-recommends prometheus
  { service prometheus stop || pkill -x prometheus; } >/dev/null 2>&1 || true
fi

# cargo-deb, pinned, for the Debian package and its test (crates/sluice/tests/package.rs).
CARGO_DEB_VERSION=3.8.0
if ! cargo deb --version 2>/dev/null | grep -q "$CARGO_DEB_VERSION"; then
  echo "install-tools: installing cargo-deb $CARGO_DEB_VERSION"
  cargo install cargo-deb --version "$CARGO_DEB_VERSION" --locked --no-default-features --quiet
fi
command -v adduser >/dev/null 2>&1 || apt_install adduser
# A real browser for the status page's test (crates/sluice/tests/status_page.rs).
command -v chromium >/dev/null 2>&1 || apt_install --no-install-recommends chromium

installed_version() { "$1" --version 2>/dev/null | grep -o "$FOUNDRY_VERSION" | head -n1; }
package_version() { node -e "console.log(require('./$TOOLS/node_modules/$1/package.json').version)" 2>/dev/null; }
if [ ! -x "$ANVIL" ] || [ ! -x "$CAST" ] || [ "$(installed_version "$ANVIL")" != "$FOUNDRY_VERSION" ] \
  || [ ! -f "$SOLCJS" ] || [ "$(package_version solc)" != "$SOLC_VERSION" ] \
  || [ "$(package_version viem)" != "$VIEM_VERSION" ] \
  || [ "$(package_version playwright-core)" != "$PLAYWRIGHT_VERSION" ]; then
  echo "install-tools: installing anvil and cast $FOUNDRY_VERSION, solc $SOLC_VERSION, viem $VIEM_VERSION and playwright-core $PLAYWRIGHT_VERSION into $TOOLS/"
  npm_prefix_install \
    "@foundry-rs/anvil-linux-amd64@$FOUNDRY_VERSION" "@foundry-rs/cast-linux-amd64@$FOUNDRY_VERSION" \
    "solc@$SOLC_VERSION" "viem@$VIEM_VERSION" "playwright-core@$PLAYWRIGHT_VERSION"
fi
"$ANVIL" --version | head -n1

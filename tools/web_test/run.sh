#!/usr/bin/env bash
# The web page's browser tests in one command: builds `memwall`, installs playwright-core (pinned
# in package-lock.json; it downloads no browser), and runs test.mjs against `memwall web` in
# Debian's chromium (`apt-get install -y chromium`; CHROMIUM=/path overrides /usr/bin/chromium).
# Screenshots land in tools/web_test/screenshots/. With --readme, the README's screenshot
# (docs/web.png) is replaced by the fresh one.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
chromium=${CHROMIUM:-/usr/bin/chromium}
if [ ! -x "$chromium" ]; then
  echo "error: no chromium at $chromium" >&2
  echo "hint: apt-get install -y chromium (Debian's), or set CHROMIUM=/path/to/chromium" >&2
  exit 2
fi
(cd "$root" && cargo build --locked -p memwall-cli --bin memwall)
cd "$here"
if [ ! -d node_modules/playwright-core ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  npm ci --no-audit --no-fund
fi
MEMWALL_BIN="$root/target/debug/memwall" CHROMIUM="$chromium" node --test --test-concurrency=1 test.mjs
if [ "${1:-}" = "--readme" ]; then
  cp screenshots/readme.png "$root/docs/web.png"
  echo "docs/web.png updated"
fi

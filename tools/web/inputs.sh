#!/usr/bin/env bash
# Lists, one per line and sorted bytewise, the files the page's WebAssembly is built from: the
# workspace manifests and lock, the data the catalogue embeds, and the manifest, build script and
# sources of every crate compiled into it. crates/memwall-wasm/tests/fresh.rs lists the same.
set -euo pipefail
cd "$(dirname "$0")/../.."
{
  echo Cargo.toml
  echo Cargo.lock
  echo tools/web/build.sh
  find data -type f
  for c in memwall-core memwall-formats memwall-catalog memwall-cli memwall-wasm; do
    echo "crates/$c/Cargo.toml"
    [ -f "crates/$c/build.rs" ] && echo "crates/$c/build.rs"
    find "crates/$c/src" -type f
  done
} | grep -vx 'crates/memwall-cli/src/web.rs' | LC_ALL=C sort

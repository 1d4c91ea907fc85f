#!/usr/bin/env bash
# Builds the web page's WebAssembly into web/pkg/ (memwall_wasm_bg.wasm + its JS glue) from
# crates/memwall-wasm, and records what it was built from in web/pkg/INPUTS.sha256 and what came
# out in web/pkg/OUTPUTS.sha256 (`cargo test -p memwall-wasm` checks both). Run it after any
# change to the crates the page runs (core, formats, catalog, cli, wasm), data/, Cargo.toml or
# Cargo.lock, and commit web/pkg/.
#
# Needs: the wasm32-unknown-unknown target (`rustup target add wasm32-unknown-unknown`) and
# wasm-bindgen-cli at the version of the wasm-bindgen crate in Cargo.lock
# (`cargo install wasm-bindgen-cli --version X`; this script prints X when it is missing).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD

want=$(awk '/^name = "wasm-bindgen"$/ { getline; gsub(/version = |"/, ""); print; exit }' Cargo.lock)
have=$(wasm-bindgen --version 2>/dev/null | awk '{ print $2 }' || true)
if [ "$have" != "$want" ]; then
  echo "error: wasm-bindgen-cli $want is needed (found: ${have:-none})" >&2
  echo "hint: cargo install wasm-bindgen-cli --version $want" >&2
  exit 2
fi
if command -v rustup > /dev/null; then
  rustup target add wasm32-unknown-unknown > /dev/null
fi

# no absolute path of this machine in the module (panic locations name source files)
export RUSTFLAGS="--remap-path-prefix=$root=memwall --remap-path-prefix=${CARGO_HOME:-$HOME/.cargo}=cargo"
cargo build --locked -p memwall-wasm --target wasm32-unknown-unknown --profile wasm
wasm-bindgen --target web --no-typescript --remove-name-section --remove-producers-section --out-dir web/pkg \
  target/wasm32-unknown-unknown/wasm/memwall_wasm.wasm

bash tools/web/inputs.sh | xargs -d '\n' sha256sum > web/pkg/INPUTS.sha256
(cd web/pkg && sha256sum memwall_wasm.js memwall_wasm_bg.wasm) > web/pkg/OUTPUTS.sha256
rustc --version > web/pkg/BUILT-WITH.txt
wasm-bindgen --version >> web/pkg/BUILT-WITH.txt
ls -l web/pkg

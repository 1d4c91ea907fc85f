#!/usr/bin/env bash
# One command to fuzz memwall's parsers and estimators on the stable toolchain:
#   fuzz/run.sh TARGET [SECONDS] [extra libFuzzer flags]
# TARGET is a name in fuzz/fuzz_targets/ (ls it); SECONDS defaults to 60. Installs cargo-fuzz
# if missing. Findings land in fuzz/artifacts/TARGET/; the corpus grows in a scratch copy so the
# committed seed corpus stays small (merge new finds with `-merge=1` by hand when worth keeping).
set -euo pipefail
cd "$(dirname "$0")"
target=${1:?usage: fuzz/run.sh TARGET [SECONDS] [libFuzzer flags]}
secs=${2:-60}
shift $(( $# >= 2 ? 2 : 1 ))
command -v cargo-fuzz >/dev/null 2>&1 || cargo install cargo-fuzz --locked --version 0.13.2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -r "corpus/$target/." "$work/" 2>/dev/null || true
# --sanitizer none: coverage-guided libFuzzer without ASan, which needs nightly; memwall
# forbids unsafe code, and overflow-checks are on in this profile, so panics are what we hunt.
cargo fuzz run --sanitizer none -O "$target" "$work" -- \
    -max_total_time="$secs" -max_len=262144 -timeout=10 -print_final_stats=1 "$@"

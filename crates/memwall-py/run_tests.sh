#!/usr/bin/env bash
# The Python tests: a fresh venv, the memwall wheel built into it by pip (maturin from PyPI,
# pinned in pyproject.toml) with pytest and mypy (pinned), then pytest against the CLI built here.
#
#   bash crates/memwall-py/run_tests.sh [pytest args]
#
# Environment:
#   PYTHON               interpreter the venv is made from (default python3, >= 3.9)
#   MEMWALL_PY_VENV      where the venv goes (default target/memwall-py-venv; recreated)
#   MEMWALL_PY_PROFILE   cargo profile of the wheel (default dev: reuses what `cargo test`
#                        built; `pip install ./crates/memwall-py` itself builds release)
#   MEMWALL_TRANSFORMERS_PYTHON  an interpreter with transformers and torch for the tests with
#                        the real classes (default /work/venvs/truth/bin/python; skipped if absent)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
cd "$repo"
python="${PYTHON:-python3}"
venv="${MEMWALL_PY_VENV:-$repo/target/memwall-py-venv}"
profile="${MEMWALL_PY_PROFILE:-dev}"
start=$SECONDS

rm -rf "$venv"
"$python" -m venv "$venv"
MATURIN_PEP517_ARGS="--profile $profile" \
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$here" pytest==8.4.2 mypy==1.18.2
echo "memwall-py: wheel ($profile) built and installed in $((SECONDS - start)) s"

# the CLI the tests compare with
cargo build --quiet --locked -p memwall-cli
export MEMWALL_BIN="$repo/target/debug/memwall"

cd "$here"
"$venv/bin/python" -m pytest tests -q -p no:cacheprovider "$@"
echo "memwall-py: done in $((SECONDS - start)) s"

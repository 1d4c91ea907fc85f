#!/usr/bin/env bash
# Validates every emitter's files with the engines' own parsers and writes REPORT.md.
# Two venvs (vLLM pins an older torch and transformers than the training stack):
#   python3.12 -m venv $VENVS/emit-engines && $VENVS/emit-engines/bin/pip install -r tools/emit_check/requirements-engines.txt
#   python3.12 -m venv $VENVS/emit-vllm && $VENVS/emit-vllm/bin/pip install --no-deps -r tools/emit_check/requirements-vllm.txt
# Usage: tools/emit_check/run.sh [VENVS]   (default /work/venvs)
set -euo pipefail
cd "$(dirname "$0")/../.."
VENVS=${1:-/work/venvs}
SEEDS=$(mktemp -d)
cargo run -q -p memwall-cli --example emit_seeds -- "$SEEDS"
# ninja (a pip package of the venv) must be on PATH for DeepSpeed's op loader
PATH="$VENVS/emit-engines/bin:$PATH" "$VENVS/emit-engines/bin/python" tools/emit_check/check.py "$SEEDS" --engines hf --out "$SEEDS/hf.json" || true
"$VENVS/emit-vllm/bin/python" tools/emit_check/check.py "$SEEDS" --engines vllm --out "$SEEDS/vllm.json" || true
python3 tools/emit_check/report.py tools/emit_check/REPORT.md "$SEEDS/manifest.json" "$SEEDS/hf.json" "$SEEDS/vllm.json"

"""Merges check.py's JSON results into REPORT.md (which engine versions accepted which files)."""
import json
import sys
from pathlib import Path

out, manifest_path, *results = sys.argv[1:]
manifest = json.loads(Path(manifest_path).read_text())
runs = [json.loads(Path(r).read_text()) for r in results]
lines = [
    "# emit_check report",
    "",
    "Every file memwall's emitters write for the seed configurations, loaded with the engine's own",
    "parser. Written by `tools/emit_check/run.sh` (see README.md there); do not edit by hand.",
    "",
    "## Engine versions",
    "",
]
for r in runs:
    lines.append(f"- venv `{r['engines']}`: " + ", ".join(f"{k} {v}" for k, v in r["versions"].items()))
lines += ["", "## Seeds", ""]
for seed, m in manifest.items():
    lines.append(f"- `{seed}`: `{m['command']}` — {m['estimate']}")
lines += ["", "## Results", "", "| seed | kind | file | result | what the parser read |", "|---|---|---|---|---|"]
total = bad = 0
for r in runs:
    for row in r["results"]:
        total += 1
        bad += not row["accepted"]
        msg = row["message"].replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {row['seed']} | {row['kind']} | {row['file']} | {'accepted' if row['accepted'] else 'REFUSED'} | {msg} |")
lines += ["", f"{total - bad} accepted, {bad} refused.", ""]
Path(out).write_text("\n".join(lines))
print(f"{total - bad} passed, {bad} failed")

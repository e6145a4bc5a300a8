"""Mean and spread over seeds of every finished run (``runs.jsonl``) of the probe comparisons named, as Markdown,
with each pretraining's last held-out metrics. Probes run on the training split only, so these are DEV accuracies.

    .venv/bin/python benchmarks/probes/summarize.py runs/probe36/ft-a runs/probe36/ft-b ...
"""

import json
import statistics
import sys
from pathlib import Path


def cell(values: list[float]) -> str:
    if not values:
        return ""
    if len(values) == 1:
        return f"{values[0]:.3f} (1 seed)"
    return f"{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f}"


print("| probe | pretrained model (last held-out MLM/PLM/LM accuracy / constant / steps) | approach | "
      "dev acc 10/class | dev acc 50/class | dev acc 200/class |")
print("|---|---|---|---:|---:|---:|")
for folder in map(Path, sys.argv[1:]):
    pretrained = {}
    for run in sorted((folder / "pretrained").glob("*/metrics.jsonl")):
        evals = [r for r in map(json.loads, run.read_text().splitlines()) if "eval_loss" in r]
        if evals:
            last = evals[-1]
            # the objective's own held-out accuracy: MLM, PLM (XLNet) or causal LM (GPT; no constant logged)
            kind = next((k for k in ("mlm", "plm", "lm") if f"eval_{k}_accuracy" in last), "mlm")
            acc = last.get(f"eval_{kind}_accuracy", float("nan"))
            const = last.get(f"eval_{kind}_constant_accuracy", float("nan"))
            pretrained[run.parent.name] = f"{run.parent.name} ({acc:.3f} / {const:.3f} / {last['step']})"
    config = json.loads((folder / "compare-config.json").read_text())
    models = {a["name"]: a["model"] for a in config["approach"]}
    runs = [json.loads(line)["result"] for line in (folder / "runs.jsonl").read_text().splitlines() if line.strip()]
    for name in dict.fromkeys(r["approach"] for r in runs):
        mine = [r for r in runs if r["approach"] == name]
        source = models.get(name, "")
        source = pretrained.get(source[1:], source) if isinstance(source, str) and source.startswith("@") else "-"
        cells = [cell([r["accuracy"] for r in mine if r["per_class"] == size]) for size in (10, 50, 200)]
        print(f"| {folder.name} | {source} | {name} | " + " | ".join(cells) + " |")

"""Held-out MLM loss and accuracy against training time for pretraining runs on the same data (issue 36): one PNG
with a line per run (its own mask rate), and a Markdown table of every evaluation.

    .venv/bin/python benchmarks/probes/issue36_curves.py OUT.png LABEL=RUN_FOLDER [LABEL=RUN_FOLDER ...]

The time of an evaluation is the training time (``elapsed_s``) logged at its step, interpolated between the logged
steps; evaluation time itself is not counted.
"""

import json
import sys
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure


def evaluations(run: Path) -> list[dict]:
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    train = [r for r in lines if "elapsed_s" in r and "step" in r]
    steps = np.array([0] + [r["step"] for r in train], dtype=float)
    seconds = np.array([0.0] + [r["elapsed_s"] for r in train])
    out = []
    for r in lines:
        if "eval_loss_mlm" in r:
            out.append({**r, "minutes": float(np.interp(r["step"], steps, seconds)) / 60})
    return out


def main() -> None:
    png, pairs = Path(sys.argv[1]), [a.split("=", 1) for a in sys.argv[2:]]
    fig = Figure(figsize=(10, 4), dpi=120, layout="constrained")
    FigureCanvasAgg(fig)
    loss_ax, acc_ax = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    print("| run | step | training minutes | held-out MLM loss | MLM accuracy | best constant guess | token cosine |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for label, folder in pairs:
        evals = evaluations(Path(folder))
        minutes = [e["minutes"] for e in evals]
        loss_ax.plot(minutes, [e["eval_loss_mlm"] for e in evals], marker="o", label=label)
        line = acc_ax.plot(minutes, [e["eval_mlm_accuracy"] for e in evals], marker="o", label=label)[0]
        acc_ax.plot(minutes, [e["eval_mlm_constant_accuracy"] for e in evals], ls=":", color=line.get_color())
        for e in evals:
            print(f"| {label} | {e['step']} | {e['minutes']:.2f} | {e['eval_loss_mlm']:.3f} | "
                  f"{e['eval_mlm_accuracy']:.3f} | {e['eval_mlm_constant_accuracy']:.3f} | "
                  f"{e.get('eval_token_cosine', float('nan')):.2f} |")
    loss_ax.set(xlabel="training minutes", ylabel="held-out MLM loss (own mask rate)")
    acc_ax.set(xlabel="training minutes", ylabel="MLM accuracy (dotted: constant guess)")
    for ax in (loss_ax, acc_ax):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("bert-mini pretrained on BBC's training articles: the 2018 recipe and the small-budget one",
                 fontsize=10)
    fig.savefig(png)


if __name__ == "__main__":
    main()

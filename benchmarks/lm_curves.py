"""Held-out language-model perplexity against training time, read from pretraining runs' ``metrics.jsonl``.

Every ``lmforge pretrain`` run logs training lines (with ``elapsed_s``) and, every ``eval_every`` steps, an
evaluation line on the held-out documents (``eval_ppl_lm``; a biLM also logs each direction,
``eval_forward_ppl`` / ``eval_backward_ppl``). This script pairs each evaluation with the training time that
preceded it and prints one Markdown table per run, and draws all runs' curves in one PNG (against the tokens
seen, and against the logged time, which includes any time the machine was shared).

Perplexities of two runs are comparable only when they share the tokenizer and the held-out documents (the
``[[pretrain]]`` tables of one ``lmforge compare`` do: one vocabulary, one split of the training texts).

Run: ``.venv/bin/python benchmarks/lm_curves.py RUN_DIR [RUN_DIR ...] [--png benchmarks/results/lm-perplexity.png]``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from common import fmt, markdown_table, reproduce_command

HERE = Path(__file__).resolve().parent


def read_curve(run: Path) -> list[dict[str, Any]]:
    """Evaluation points of one run: step, training minutes before it, and the perplexities it logged."""
    path = run / "metrics.jsonl"
    if not path.is_file():
        raise SystemExit(f"{run}: no metrics.jsonl (a folder made by `lmforge pretrain` or a compare [[pretrain]])")
    points, elapsed, tokens = [], 0.0, 0
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            raise SystemExit(f"{path} line {n}: not JSON") from None
        if "elapsed_s" in record:
            elapsed, tokens = record["elapsed_s"], record.get("tokens", tokens)
        if "eval_ppl_lm" in record:
            points.append({"step": record["step"], "minutes": elapsed / 60, "tokens": tokens,
                           "ppl": record["eval_ppl_lm"],
                           "forward": record.get("eval_forward_ppl"), "backward": record.get("eval_backward_ppl")})
    if not points:
        raise SystemExit(f"{path}: no held-out perplexity logged (eval_ppl_lm); was eval_every set?")
    return points


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", type=Path, help="pretraining run folders")
    p.add_argument("--png", type=Path, default=HERE / "results" / "lm-perplexity.png")
    args = p.parse_args(argv)
    curves = {run: read_curve(run) for run in args.runs}
    print(f"```bash\n{reproduce_command(__file__, list(argv if argv is not None else sys.argv[1:]))}\n```\n")
    for run, points in curves.items():
        config = json.loads((run / "run_config.json").read_text(encoding="utf-8")) \
            if (run / "run_config.json").is_file() else {}
        print(f"**{run.name}** ({config.get('preset', '?')}, objective "
              f"{config.get('data', {}).get('objective', '?')}):\n")
        bidirectional = points[0]["forward"] is not None
        header = ["step", "tokens (M)", "training min", "held-out ppl"] + (["forward ppl", "backward ppl"]
                                                                           if bidirectional else [])
        rows = [[str(q["step"]), fmt(q["tokens"] / 1e6, 1), fmt(q["minutes"], 1), fmt(q["ppl"], 1)]
                + ([fmt(q["forward"], 1), fmt(q["backward"], 1)] if bidirectional else []) for q in points]
        print(markdown_table(header, rows) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for ax, x_key, x_label in ((axes[0], "tokens", "training tokens (millions)"),
                               (axes[1], "minutes", "training time as logged (minutes)")):
        for run, points in curves.items():
            x = [q[x_key] / (1e6 if x_key == "tokens" else 1) for q in points]
            if points[0]["forward"] is not None:
                ax.plot(x, [q["forward"] for q in points], marker="o", label=f"{run.name}: forward LM")
                ax.plot(x, [q["backward"] for q in points], marker="o", ls="--", label=f"{run.name}: backward LM")
            else:
                ax.plot(x, [q["ppl"] for q in points], marker="o", label=f"{run.name}")
        ax.set_xlabel(x_label)
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("held-out perplexity (word pieces)")
    axes[0].legend()
    fig.tight_layout()
    args.png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.png, dpi=120)
    root = HERE.parent.resolve()
    png = args.png.resolve()
    print(f"Curves: {png.relative_to(root) if png.is_relative_to(root) else args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

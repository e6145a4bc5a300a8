"""The comparison's results: ``compare.csv`` (one row per run), ``compare.md`` (mean and standard deviation of
accuracy and macro-F1 per approach and size, the wall time of each approach), ``compare.json`` and
``learning_curve.png``."""

from __future__ import annotations

import csv
import io
import json
import statistics
from pathlib import Path
from typing import Any

from lmforge.errors import LmforgeError
from lmforge.recipes.compare.config import FAMILIES, CompareConfig

CSV_COLUMNS = ["approach", "family", "per_class", "size", "seed", "accuracy", "f1", "seconds", "steps"]
GRID_COLUMNS = ["dev_accuracy", "chosen"]  # added when an approach chose its settings on the dev split


def _point(point: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}" for k, v in point.items()) or "(none)"


def chosen_lines(config: CompareConfig, results: list[dict[str, Any]], n_dev: int) -> list[str]:
    """What each approach with a ``grid`` chose on the dev split, per size: the settings and the seeds that chose
    them, and the chosen runs' dev accuracy."""
    lines = []
    for approach in config.approach:
        mine = [r for r in results if r["approach"] == approach.name and "chosen" in r]
        if not mine:
            continue
        parts = []
        for size in config.sizes:
            runs = [r for r in mine if r["per_class"] == size]
            if not runs:
                continue
            picks: dict[str, list[int]] = {}
            for r in runs:
                picks.setdefault(_point(r["chosen"]), []).append(r["seed"])
            shown = "; ".join(f"{p} (seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))})"
                              for p, seeds in picks.items())
            parts.append(f"{size or 'all'}/class: {shown}; dev accuracy {_summary([r['dev_accuracy'] for r in runs])}")
        grid = ", ".join(f"{k} in {v}" for k, v in approach.grid.items())
        lines.append(f"- {approach.name} (grid: {grid}): " + " | ".join(parts))
    if not lines:
        return []
    return ["", f"Settings chosen on the dev split ({n_dev} examples carved from the training split, never trained "
            "on); each seed chose its own, and only the chosen model was scored on the test split:", *lines]


def _summary(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f}"


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


def markdown_table(config: CompareConfig, results: list[dict[str, Any]], vector_seconds: dict[str, float],
                   n_test: int, pretrain_seconds: dict[str, float] | None = None, n_dev: int = 0) -> str:
    """``compare.md``: one row per approach, accuracy then macro-F1 per size, and what was trained once."""
    sizes = config.sizes
    head = [f"{s or 'all'}/class" for s in sizes]
    lines = [f"Test accuracy and macro-F1 on {n_test} held-out examples (mean ± standard deviation over seeds "
             f"{', '.join(map(str, config.seeds))}).", "",
             "| approach | family | " + " | ".join(f"acc {h}" for h in head) + " | "
             + " | ".join(f"F1 {h}" for h in head) + " | seconds per run |",
             "|---|---|" + "---:|" * (2 * len(sizes) + 1)]
    for approach in config.approach:
        mine = [r for r in results if r["approach"] == approach.name]
        cells = []
        for metric in ("accuracy", "f1"):
            for size in sizes:
                values = [r[metric] for r in mine if r["per_class"] == size]
                cells.append(_summary(values) if values else "")
        seconds = statistics.mean(r["seconds"] for r in mine) if mine else 0.0
        name = approach.name
        timed = pretrain_seconds or {}
        mine_pretrained = [m[1:] for m in approach.models()
                           if m.startswith("@") and config.spec(m[1:]) is not None and m[1:] in timed]
        if mine_pretrained:  # an ensemble's members were each pretrained: their times add up
            name += f" (pretrained here: {_duration(sum(timed[m] for m in mine_pretrained))})"
        lines.append(f"| {name} | {FAMILIES[approach.family]} | " + " | ".join(cells) + f" | {seconds:.0f} |")
    if pretrain_seconds:
        lines += ["", "Pretrained by lmforge once, on the training texts only, before the runs: " + "; ".join(
            f"{s.name} ({s.preset}, objective {s.objective}) {_duration(pretrain_seconds[s.name])}"
            for s in config.pretrain if s.name in pretrain_seconds) + "."]
    lines += chosen_lines(config, results, n_dev)
    if vector_seconds:
        lines += ["", "Static vectors trained once on the training texts: "
                  + ", ".join(f"{k} {v:.0f} s" for k, v in vector_seconds.items()) + "."]
    return "\n".join(lines) + "\n"


_FAMILY_LINES = {"scratch": ":", "static": "-.", "frozen": "--", "finetune": "-"}  # a family's lines look alike


def _classes_in(results: list[dict[str, Any]]) -> int:
    """The number of classes, read back from the runs of a per-class size (``size`` = per_class x classes when every
    class has that many training examples; a smaller class only lowers it, so the largest ratio is taken)."""
    ratios = [round(r["size"] / r["per_class"]) for r in results if r.get("per_class")]
    return max(ratios, default=1) or 1


def learning_curve_figure(config: CompareConfig, results: list[dict[str, Any]], *, n_classes: int | None = None):
    """Test accuracy against training examples per class (log scale), as the table counts them: one line per
    approach that has results (mean over seeds, the standard deviation as error bars), the families present named
    in the title and each legend entry; ``sizes = 0`` ("all") sits at the mean count per class of the full training
    split, its tick labelled "all".

    Args:
        n_classes: the number of classes (read back from the results when not given).

    Returns:
        A matplotlib Figure on the Agg canvas (pyplot's global state is untouched).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import NullFormatter, NullLocator

    n_classes = n_classes or _classes_in(results)
    fig = Figure(figsize=(8, 5), dpi=120, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    ticks: dict[float, str] = {}
    families: list[str] = []
    for approach in config.approach:
        xs, means, errs = [], [], []
        for size in config.sizes:
            runs = [r for r in results if r["approach"] == approach.name and r["per_class"] == size]
            if not runs:
                continue
            x = size if size else statistics.mean(r["size"] for r in runs) / n_classes
            ticks[x] = str(size) if size else f"all\n({x:.0f})"
            xs.append(x)
            values = [r["accuracy"] for r in runs]
            means.append(statistics.mean(values))
            errs.append(statistics.stdev(values) if len(values) > 1 else 0.0)
        if not xs:  # no run of this approach finished: no line and no legend entry
            continue
        if approach.family not in families:
            families.append(approach.family)
        letter = FAMILIES[approach.family].split()[0]
        ax.errorbar(xs, means, yerr=errs, marker="o", capsize=3, ls=_FAMILY_LINES[approach.family],
                    label=f"{letter} {approach.name}")
    if not families:
        raise LmforgeError("no finished run to draw a learning curve from")
    ax.set_xscale("log")
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xticks(sorted(ticks), [ticks[x] for x in sorted(ticks)])
    ax.set_xlabel("training examples per class (log scale)")
    ax.set_ylabel("test accuracy")
    ordered = [FAMILIES[f] for f in FAMILIES if f in families]
    ax.set_title("Learning curves: " + ", ".join(ordered), fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def plot_learning_curve(config: CompareConfig, results: list[dict[str, Any]], path: Path, *,
                        n_classes: int | None = None) -> None:
    """Write ``learning_curve_figure`` as a PNG, atomically."""
    from lmforge.utils.io import atomic_write_bytes

    fig = learning_curve_figure(config, results, n_classes=n_classes)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    atomic_write_bytes(path, buffer.getvalue())


def write_results(config: CompareConfig, out: Path, results: list[dict[str, Any]], *, n_test: int, n_classes: int,
                  vector_seconds: dict[str, float], pretrain_seconds: dict[str, float],
                  n_dev: int = 0) -> dict[str, Path]:
    """Write the CSV, the Markdown table, the learning curve and ``compare.json`` into ``out``; returns the paths
    of the first three (``csv``, ``md``, ``png``)."""
    from lmforge.utils.io import atomic_write_text

    buffer = io.StringIO()
    tuned = any("chosen" in r for r in results)
    writer = csv.DictWriter(buffer, CSV_COLUMNS + GRID_COLUMNS if tuned else CSV_COLUMNS, extrasaction="ignore")
    writer.writeheader()
    writer.writerows({**r, "chosen": json.dumps(r["chosen"], sort_keys=True)} if "chosen" in r else r
                     for r in results)
    atomic_write_text(out / "compare.csv", buffer.getvalue())
    atomic_write_text(out / "compare.md", markdown_table(config, results, vector_seconds, n_test, pretrain_seconds,
                                                        n_dev))
    plot_learning_curve(config, results, out / "learning_curve.png", n_classes=n_classes)
    atomic_write_text(out / "compare.json", json.dumps({"results": results, "vector_seconds": vector_seconds,
                                                        "pretrain_seconds": pretrain_seconds}, indent=2) + "\n")
    return {"csv": out / "compare.csv", "md": out / "compare.md", "png": out / "learning_curve.png"}

"""The in-context learning curve: accuracy against the number of demonstrations K (Brown et al. 2020, figure 1.2
style), with the spread over demonstration draws as error bars and the chance / majority baselines."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lmforge.errors import LmforgeError
from lmforge.viz.plots import _new_figure, save_png

__all__ = ["fewshot_figure", "plot_fewshot"]


def fewshot_figure(rows: Sequence[dict[str, Any]], *, chance: float | None = None, majority: float | None = None,
                   title: str | None = None):
    """Accuracy (mean over draws, error bars +- one std) against K.

    K runs along a symmetric-log x axis (0, 1, 4, 16, 64 spread evenly while 0 stays drawable), with a tick at
    every K measured.

    Args:
        rows: ``FewShotReport.rows`` (``shots``, ``accuracy_mean``, ``accuracy_std``).
        chance: 1 / number of labels (a dashed line), or None.
        majority: the accuracy of the most common label (a dotted line), or None.

    Returns:
        The matplotlib Figure on the Agg canvas.

    Raises:
        LmforgeError: no rows.
    """
    if not rows:
        raise LmforgeError("no few-shot results to plot")
    ordered = sorted(rows, key=lambda r: r["shots"])
    ks = [r["shots"] for r in ordered]
    means = [r["accuracy_mean"] for r in ordered]
    stds = [r["accuracy_std"] for r in ordered]
    fig = _new_figure(6.0, 4.0, constrained=True)
    ax = fig.add_subplot(1, 1, 1)
    ax.errorbar(ks, means, yerr=stds, fmt="o-", capsize=4, color="tab:blue", label="accuracy (mean ± std)")
    if chance is not None:
        ax.axhline(chance, ls="--", color="tab:gray", lw=1, label=f"chance {chance:.3f}")
    if majority is not None:
        ax.axhline(majority, ls=":", color="tab:red", lw=1, label=f"majority {majority:.3f}")
    if max(ks) > 1:
        ax.set_xscale("symlog", linthresh=1.0)
    ax.set_xticks(ks)
    ax.set_xticklabels([str(k) for k in ks])
    ax.set_xlabel("demonstrations in the prompt (K)")
    ax.set_ylabel("accuracy")
    ax.set_ylim(-0.02, 1.02)  # points at 0 or 1 stay visible
    ax.grid(alpha=0.3)
    ax.set_title(title or "in-context learning", fontsize=10)
    ax.legend(loc="best", fontsize=8)
    return fig


def plot_fewshot(rows: Sequence[dict[str, Any]], path: str | Path, *, chance: float | None = None,
                 majority: float | None = None, title: str | None = None) -> Path:
    """Write ``fewshot_figure(rows, ...)`` as a PNG, atomically; returns the path."""
    return save_png(fewshot_figure(rows, chance=chance, majority=majority, title=title), path)

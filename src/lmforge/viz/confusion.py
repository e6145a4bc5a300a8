"""The confusion-matrix PNG of ``lmforge evaluate``: gold classes down, predicted classes across, counts in the cells.

Cells are coloured by the share of their row (the gold class's items that went there, 0 to 1 on a fixed scale with
a colour bar), so a small class that is always missed is as visible as a large one; the count is written in each
cell. The figure is built on the Agg canvas (no pyplot: the caller's backend and global state are untouched).
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path

from lmforge.errors import LmforgeError
from lmforge.utils.io import atomic_write_bytes

__all__ = ["confusion_figure", "plot_confusion"]

COUNT_LIMIT = 30  # counts are written in the cells up to this many classes (beyond, the text would not fit)


def confusion_figure(labels: Sequence[str], matrix: Sequence[Sequence[int]], *, title: str = "Confusion matrix",
                     rows: str = "gold", columns: str = "predicted"):
    """A heat map of ``matrix`` (``matrix[i][j]``: items of gold ``labels[i]`` predicted as ``labels[j]``).

    Args:
        labels: the class names, the order of rows and columns.
        matrix: the counts, len(labels) x len(labels).
        title: the figure's title.
        rows: the y axis title (what the rows are).
        columns: the x axis title.

    Returns:
        The Figure (its first axes is the heat map, its last the colour bar).
    """
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    counts = np.asarray(matrix, dtype=np.int64)
    n = len(labels)
    if n == 0 or counts.shape != (n, n):
        raise LmforgeError(f"a confusion matrix needs {n} x {n} counts for {n} labels; got shape {counts.shape}")
    totals = counts.sum(axis=1, keepdims=True)
    share = np.divide(counts, np.maximum(totals, 1), dtype=np.float64)  # a row with no gold item stays 0
    side = min(22.0, max(4.5, 0.45 * n + 2.5))
    fig = Figure(figsize=(side + 1.2, side), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    image = ax.imshow(share, cmap="Blues", vmin=0.0, vmax=1.0, aspect="equal", interpolation="nearest")
    bar = fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    bar.set_label("share of the gold row")
    size = 9 if n <= 12 else 7
    ax.set_xticks(range(n), [str(label) for label in labels], rotation=45, ha="right", fontsize=size)
    ax.set_yticks(range(n), [str(label) for label in labels], fontsize=size)
    ax.set_xlabel(columns)
    ax.set_ylabel(rows)
    ax.set_title(f"{title} ({int(counts.sum())} items)")
    if n <= COUNT_LIMIT:
        for i in range(n):
            for j in range(n):
                if counts[i, j]:
                    ax.text(j, i, str(int(counts[i, j])), ha="center", va="center", fontsize=size,
                            color="white" if share[i, j] > 0.5 else "black")
    return fig


def plot_confusion(labels: Sequence[str], matrix: Sequence[Sequence[int]], path: str | Path, **options) -> Path:
    """Draw :func:`confusion_figure` and write it as a PNG, atomically; returns the path."""
    buffer = io.BytesIO()
    confusion_figure(labels, matrix, **options).savefig(buffer, format="png")
    atomic_write_bytes(path, buffer.getvalue())
    return Path(path)

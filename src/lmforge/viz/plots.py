"""PNG pictures: attention grids (layers x heads), the sinusoidal position table, training curves.

Every ``*_figure`` function returns a matplotlib ``Figure`` on the Agg canvas (no pyplot, so the caller's backend
and global state are untouched); every ``plot_*`` function draws it and writes the PNG atomically.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from lmforge.errors import LmforgeError
from lmforge.utils.io import atomic_write_bytes
from lmforge.viz.attention import AttentionSet

__all__ = ["LABEL_LIMIT", "attention_grid_figure", "plot_attention_grid", "plot_positions", "plot_training",
           "positions_figure", "training_figure"]

LABEL_LIMIT = 40  # attention grids label the token axes up to this many tokens
_SEGMENT_COLOURS = ("#1b1b1b", "#c2410c")  # segment A, segment B (as the HTML viewer)


def _new_figure(width: float, height: float, *, constrained: bool = False, dpi: int = 100):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=dpi, layout="constrained" if constrained else None)
    FigureCanvasAgg(fig)
    return fig


def save_png(fig, path: str | Path) -> Path:
    """Draw ``fig`` and write it as a PNG, atomically."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    path = Path(path)
    atomic_write_bytes(path, buffer.getvalue())
    return path


# ------------------------------------------------------------------------------------------------ attention
def attention_grid_figure(attn: AttentionSet, *, label_limit: int = LABEL_LIMIT):
    """One small heat map per (map, layer, head): a row per layer (maps stacked top to bottom, e.g. encoder self,
    decoder self, cross), a column per head.

    Token tick labels are drawn when a map has at most ``label_limit`` rows and columns (segment B in orange);
    longer inputs get bare heat maps. Colours run from 0 to the largest weight of each heat map.

    Returns:
        The Figure; ``len(fig.axes)`` is rows x columns (unused cells are blank axes turned off).
    """
    if not attn.maps:
        raise LmforgeError("no attention maps to plot")
    n_rows = sum(len(m.layers) for m in attn.maps)
    n_cols = max(len(m.heads) for m in attn.maps)
    longest = max(max(len(m.rows), len(m.cols)) for m in attn.maps)
    labelled = longest <= label_limit
    cell = max(2.2, 0.13 * longest + 0.9) if labelled else 2.0
    fig = _new_figure(n_cols * cell + 0.4, n_rows * cell + 0.6, constrained=labelled)
    axes = fig.subplots(n_rows, n_cols, squeeze=False)
    fig.suptitle(attn.title, fontsize=10)
    row = 0
    for m in attn.maps:
        for li, layer in enumerate(m.layers):
            for col in range(n_cols):
                ax = axes[row, col]
                if col >= len(m.heads):
                    ax.axis("off")
                    continue
                w = m.weights[li, col]
                ax.imshow(w, cmap="Blues", vmin=0.0, vmax=max(float(w.max()), 1e-12),
                          interpolation="nearest" if labelled else "antialiased", aspect="auto")
                ax.set_title(f"{m.name}\nlayer {layer}, head {m.heads[col]}", fontsize=7)
                if labelled:
                    _token_ticks(ax, m.rows, m.row_segments, m.cols, m.col_segments)
                else:
                    ax.set_xticks([])
                    ax.set_yticks([])
            row += 1
    if not labelled:
        fig.subplots_adjust(left=0.02, right=0.98, bottom=0.02, top=1 - 0.9 / (n_rows * cell + 0.6),
                            wspace=0.08, hspace=0.35)
    return fig


def _token_ticks(ax, rows: Sequence[str], row_seg: Sequence[int], cols: Sequence[str],
                 col_seg: Sequence[int]) -> None:
    size = 7 if max(len(rows), len(cols)) <= 20 else 5
    ax.set_xticks(range(len(cols)), cols, rotation=90, fontsize=size)
    ax.set_yticks(range(len(rows)), rows, fontsize=size)
    for label, seg in zip(ax.get_xticklabels(), col_seg, strict=True):
        label.set_color(_SEGMENT_COLOURS[min(int(seg), 1)])
    for label, seg in zip(ax.get_yticklabels(), row_seg, strict=True):
        label.set_color(_SEGMENT_COLOURS[min(int(seg), 1)])
    ax.tick_params(length=0, pad=1)


def plot_attention_grid(attn: AttentionSet, path: str | Path, *, label_limit: int = LABEL_LIMIT) -> Path:
    """Write ``attention_grid_figure(attn)`` as a PNG; returns the path."""
    return save_png(attention_grid_figure(attn, label_limit=label_limit), path)


# ------------------------------------------------------------------------------------------------ positions
def positions_figure(d_model: int, length: int, *, base: float = 10000.0):
    """The sinusoidal position table of Vaswani et al. 2017 (section 3.5) as a heat map (position x dimension),
    with the curves of four dimensions below it: low dimensions oscillate fast, high ones slowly.

    Args:
        d_model: D, the embedding width (the table's columns).
        length: number of positions (the table's rows).
        base: the wavelength base (10000 in the paper).
    """
    from lmforge.nn.positional import SinusoidalPositional

    if not isinstance(d_model, int) or not isinstance(length, int) or d_model < 2 or length < 1:
        raise LmforgeError(f"positions need d_model >= 2 and length >= 1; got d_model={d_model}, length={length}")
    if d_model * length > 50_000_000:
        raise LmforgeError(f"a {length} x {d_model} table is too large to draw; lower --length or --d-model")
    if base <= 1:
        raise LmforgeError(f"the wavelength base must be > 1; got {base}")
    pe = SinusoidalPositional(d_model, length, base=base).pe.numpy()  # (length, D)
    fig = _new_figure(9, 7.5, constrained=True)
    grid = fig.add_gridspec(2, 1, height_ratios=(3, 1.4))
    ax = fig.add_subplot(grid[0])
    image = ax.imshow(pe, cmap="RdBu", vmin=-1, vmax=1, aspect="auto", interpolation="nearest")
    ax.set_xlabel("embedding dimension")
    ax.set_ylabel("position")
    ax.set_title(f"Sinusoidal positional encoding, d_model = {d_model}, {length} positions\n"
                 f"PE(pos, 2i) = sin(pos / {base:g}^(2i/d)),  PE(pos, 2i+1) = cos(pos / {base:g}^(2i/d))",
                 fontsize=10)
    fig.colorbar(image, ax=ax, fraction=0.04, pad=0.02)
    curves = fig.add_subplot(grid[1])
    dims = sorted({0, 2 * (d_model // 16), 2 * (d_model // 8), 2 * (d_model // 4)} & set(range(d_model)))
    positions = np.arange(length)
    for dim in dims:
        curves.plot(positions, pe[:, dim], label=f"dim {dim}")
    curves.set_xlabel("position")
    curves.set_ylabel("value")
    curves.set_ylim(-1.1, 1.1)
    curves.legend(loc="upper right", fontsize=8, ncol=len(dims))
    curves.grid(alpha=0.3)
    return fig


def plot_positions(d_model: int, length: int, path: str | Path, *, base: float = 10000.0) -> Path:
    """Write ``positions_figure(d_model, length)`` as a PNG; returns the path."""
    return save_png(positions_figure(d_model, length, base=base), path)


# ------------------------------------------------------------------------------------------------ training
def _finite(records: list[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    pairs = [(r["step"], r[key]) for r in records
             if isinstance(r.get(key), int | float) and isinstance(r.get("step"), int | float)
             and math.isfinite(r[key])]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def training_figure(records: list[dict[str, Any]], *, title: str | None = None):
    """Curves of a run's ``metrics.jsonl`` records (``lmforge.training.logging``) against the step.

    Panels: the loss (training loss, its terms ``loss_<term>`` when there are several, evaluation loss and its
    terms), the learning rate, then one small panel per evaluation metric (every other numeric ``eval_*`` key).

    Raises:
        LmforgeError: no record has a loss or an evaluation value.
    """
    train_keys = sorted({k for r in records for k in r if k.startswith("loss_")})
    eval_loss_keys = sorted({k for r in records for k in r if k.startswith("eval_loss_")})
    metric_keys = sorted({k for r in records for k in r
                          if k.startswith("eval_") and k != "eval_loss" and not k.startswith("eval_loss_")
                          and isinstance(r[k], int | float)})
    have_loss = any(_finite(records, k)[0] for k in ("loss", "eval_loss"))
    if not have_loss and not any(_finite(records, k)[0] for k in metric_keys):
        raise LmforgeError("the records hold no loss and no evaluation metric to plot")
    have_lr = bool(_finite(records, "lr")[0])
    metric_rows = math.ceil(len(metric_keys) / 2)
    rows = 1 + have_lr + metric_rows
    fig = _new_figure(10, 3.0 + 2.0 * have_lr + 2.3 * metric_rows, constrained=True)
    heights = [3.0] + [2.0] * have_lr + [2.3] * metric_rows
    grid = fig.add_gridspec(rows, 2, height_ratios=heights)
    ax = fig.add_subplot(grid[0, :])
    steps, values = _finite(records, "loss")
    ax.plot(steps, values, color="tab:blue", label="train loss")
    if len(train_keys) > 1:
        for key in train_keys:
            ax.plot(*_finite(records, key), lw=0.8, alpha=0.7, label=f"train {key}")
    steps, values = _finite(records, "eval_loss")
    if steps:
        ax.plot(steps, values, "o-", color="tab:orange", label="eval loss")
    if len(eval_loss_keys) > 1:
        for key in eval_loss_keys:
            ax.plot(*_finite(records, key), "o--", ms=3, lw=0.8, label=key)
    ax.set_ylabel("loss")
    ax.set_title(title or "training", fontsize=10)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper right", fontsize=8)
    shared = ax
    if have_lr:
        lr_ax = fig.add_subplot(grid[1, :], sharex=shared)
        lr_ax.plot(*_finite(records, "lr"), color="tab:green")
        lr_ax.set_ylabel("learning rate")
        lr_ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
        lr_ax.grid(alpha=0.3)
    for i, key in enumerate(metric_keys):
        m_ax = fig.add_subplot(grid[1 + have_lr + i // 2, i % 2], sharex=shared)
        m_ax.plot(*_finite(records, key), "o-", ms=3, color="tab:purple")
        m_ax.set_title(key, fontsize=9)
        m_ax.grid(alpha=0.3)
    for a in fig.axes:
        a.set_xlabel("step")
    return fig


def plot_training(records: list[dict[str, Any]], path: str | Path, *, title: str | None = None) -> Path:
    """Write ``training_figure(records)`` as a PNG; returns the path."""
    return save_png(training_figure(records, title=title), path)

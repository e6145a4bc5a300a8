"""PNG pictures: attention grids (layers x heads), the sinusoidal position table, training curves.

Every ``*_figure`` function returns a matplotlib ``Figure`` on the Agg canvas (no pyplot, so the caller's backend
and global state are untouched); every ``plot_*`` function draws it and writes the PNG atomically.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from lmforge.choices import ATTENTION_SCALES
from lmforge.errors import LmforgeError
from lmforge.utils.io import atomic_write_bytes

if TYPE_CHECKING:  # only annotations: drawing training curves needs neither PyTorch nor the model code
    from lmforge.viz.attention import AttentionSet

__all__ = ["LABEL_LIMIT", "TrainingCurves", "attention_grid_figure", "is_training_record", "plot_attention_grid",
           "plot_positions", "plot_training", "positions_figure", "training_curves", "training_figure"]

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
_SCALE_LABELS = {"absolute": "attention weight (0 to 1, every heat map)",
                 "relative": "weight / the heat map's largest weight"}


def attention_grid_figure(attn: AttentionSet, *, label_limit: int = LABEL_LIMIT, scale: str = "absolute"):
    """One small heat map per (map, layer, head): a row per layer (maps stacked top to bottom, e.g. encoder self,
    decoder self, cross), a column per head; query tokens down the rows, key tokens across the columns.

    Token tick labels are drawn when a map has at most ``label_limit`` rows and columns (segment B in orange);
    longer inputs get bare heat maps. One colour bar on the right reads every heat map.

    Args:
        scale: ``"absolute"`` colours every weight on one 0-1 scale, so near-uniform attention (1/C per key) stays
            pale and heat maps compare with each other; ``"relative"`` divides each heat map by its own largest
            weight, which shows the pattern of a diffuse head but paints uniform attention dark everywhere.

    Returns:
        The Figure; its first rows x columns axes are the heat maps (unused cells are blank axes turned off), the
        last one the colour bar.
    """
    if not attn.maps:
        raise LmforgeError("no attention maps to plot")
    if scale not in ATTENTION_SCALES:
        raise LmforgeError(f"attention scale {scale!r} is not one of {', '.join(ATTENTION_SCALES)}")
    n_rows = sum(len(m.layers) for m in attn.maps)
    n_cols = max(len(m.heads) for m in attn.maps)
    longest = max(max(len(m.rows), len(m.cols)) for m in attn.maps)
    labelled = longest <= label_limit
    cell = max(2.2, 0.13 * longest + 0.9) if labelled else 2.0
    height = n_rows * cell + 0.6
    fig = _new_figure(n_cols * cell + 1.4, height, constrained=labelled)
    axes = fig.subplots(n_rows, n_cols, squeeze=False)
    fig.suptitle(attn.title, fontsize=10)
    image = None
    row = 0
    for m in attn.maps:
        for li, layer in enumerate(m.layers):
            for col in range(n_cols):
                ax = axes[row, col]
                if col >= len(m.heads):
                    ax.axis("off")
                    continue
                w = m.weights[li, col]
                if scale == "relative":
                    w = w / max(float(w.max()), 1e-12)
                image = ax.imshow(w, cmap="Blues", vmin=0.0, vmax=1.0,
                                  interpolation="nearest" if labelled else "antialiased", aspect="auto")
                ax.set_title(f"{m.name}\nlayer {layer}, head {m.heads[col]}", fontsize=7)
                if labelled:
                    _token_ticks(ax, m.rows, m.row_segments, m.cols, m.col_segments)
                else:
                    ax.set_xticks([])
                    ax.set_yticks([])
                ax.set_xlabel("key", fontsize=7, labelpad=2)
                if col == 0:
                    ax.set_ylabel("query", fontsize=7, labelpad=2)
            row += 1
    if labelled:
        bar = fig.colorbar(image, ax=axes[:, -1].tolist(), fraction=0.05, pad=0.02, aspect=30)
    else:  # many axes: fixed margins (constrained layout is slow there), the bar in the last inch on the right
        width = n_cols * cell + 1.4
        fig.subplots_adjust(left=0.3 / width, right=1 - 1.1 / width, bottom=0.03, top=1 - 0.9 / height,
                            wspace=0.08, hspace=0.45)
        bar = fig.colorbar(image, cax=fig.add_axes((1 - 0.8 / width, 0.15, 0.15 / width, 0.7)))
    bar.set_label(_SCALE_LABELS[scale], fontsize=8)
    bar.ax.tick_params(labelsize=7)
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


def plot_attention_grid(attn: AttentionSet, path: str | Path, *, label_limit: int = LABEL_LIMIT,
                        scale: str = "absolute") -> Path:
    """Write ``attention_grid_figure(attn)`` as a PNG; returns the path."""
    return save_png(attention_grid_figure(attn, label_limit=label_limit, scale=scale), path)


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
LR_KEYS = ("lr", "lr_end")  # the Trainer's learning rate; the static-vector recipes' rate at the end of each epoch
_MARKERS_UP_TO = 40  # a series of more points gets markers on about this many of them
_VALUES_UP_TO = 3  # a series of at most this many points gets its values written beside the markers


@dataclass
class TrainingCurves:
    """Which keys of a run's records are drawn where (``training_curves``).

    Attributes:
        x: the x axis, ``"step"`` (the Trainer) or ``"epoch"`` (records without steps: static vectors).
        train: training-loss keys, ``loss`` first, then ``loss_<term>`` when the objective has several terms.
        dev_loss: ``eval_loss``, then ``eval_loss_<term>`` when there are several terms.
        lr: the learning-rate key, or None.
        metrics: every other numeric key of the evaluation records, in the order the run logged them: ``eval_*``
            from eval data (``eval_mlm_accuracy``, ``eval_ppl_mlm``) and a task evaluator's plain names
            (``accuracy``, ``f1``, ``exact_match``, ``rougeL``...).
        train_metrics: for a metric, the training records' key of the same quantity (``eval_mlm_accuracy`` ->
            ``mlm_accuracy``), drawn faintly in its panel.
    """

    x: str
    train: list[str]
    dev_loss: list[str]
    lr: str | None
    metrics: list[str]
    train_metrics: dict[str, str]

    @property
    def empty(self) -> bool:
        return not (self.train or self.dev_loss or self.metrics)


def is_training_record(record: dict[str, Any]) -> bool:
    """Training lines carry the loss and the learning rate; evaluation lines carry neither (only ``step`` and the
    evaluation's values)."""
    return "loss" in record or any(key in record for key in LR_KEYS)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _series(records: list[dict[str, Any]], key: str, x: str) -> tuple[list[float], list[float]]:
    """(x values, values) of the records that hold finite numbers under both keys."""
    pairs = [(r[x], r[key]) for r in records if _number(r.get(key)) and _number(r.get(x))]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def training_curves(records: list[dict[str, Any]]) -> TrainingCurves:
    """Sort the keys of ``metrics.jsonl`` records into training loss, dev loss, learning rate and dev metrics;
    only keys with at least one finite value count (a series with nothing to draw gets no line or panel)."""
    x = "step" if any(_number(r.get("step")) for r in records) else "epoch"
    train_records = [r for r in records if is_training_record(r)]
    eval_records = [r for r in records if not is_training_record(r)]

    def keys(rows: list[dict[str, Any]]) -> list[str]:
        seen: dict[str, None] = {}
        for r in rows:
            seen.update((k, None) for k, v in r.items() if _number(v))
        return [k for k in seen if _series(rows, k, x)[0]]

    train_keys, eval_keys = keys(train_records), keys(eval_records)
    terms = sorted(k for k in train_keys if k.startswith("loss_"))
    dev_terms = sorted(k for k in eval_keys if k.startswith("eval_loss_"))
    train = (["loss"] if "loss" in train_keys else []) + (terms if len(terms) > 1 else [])
    dev_loss = (["eval_loss"] if "eval_loss" in eval_keys else []) + (dev_terms if len(dev_terms) > 1 else [])
    metrics = [k for k in eval_keys if k not in ("step", "epoch", "eval_loss") and not k.startswith("eval_loss_")]
    train_metrics = {k: k[len("eval_"):] for k in metrics if k.startswith("eval_") and k[len("eval_"):] in train_keys}
    lr = next((k for k in LR_KEYS if k in train_keys), None)
    return TrainingCurves(x, train, dev_loss, lr, metrics, train_metrics)


def _draw(ax, xs: list[float], ys: list[float], *, label: str | None = None, **style: Any) -> None:
    """A line with markers (on about ``_MARKERS_UP_TO`` of its points), its values written when it has few."""
    style.setdefault("marker", "o")
    style.setdefault("ms", 4)
    ax.plot(xs, ys, label=label, markevery=max(1, len(xs) // _MARKERS_UP_TO), **style)
    if len(xs) <= _VALUES_UP_TO:
        for x, y in zip(xs, ys, strict=True):
            ax.annotate(f"{y:.4g}", (x, y), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=7,
                        color=style.get("color"))


def training_figure(records: list[dict[str, Any]], *, title: str | None = None):
    """Curves of a run's ``metrics.jsonl`` records (``lmforge.training.logging``) against the step.

    The top panel holds the training loss (and its terms when the objective has several), the dev loss, and the
    learning rate on a secondary axis drawn beneath the losses; below it, one panel per dev metric (every
    numeric value of the evaluation records: ``eval_*`` from eval data and a task evaluator's ``accuracy``,
    ``f1``, ``rougeL``...). Every line has markers, so a run with a single logged point still shows it; a series
    with nothing finite gets no line, and a run without dev metrics no metric panels. A non-finite training loss
    is marked by a red line at its first step.

    Raises:
        LmforgeError: no record holds a finite loss or evaluation value.
    """
    from matplotlib.ticker import MaxNLocator

    curves = training_curves(records)
    if curves.empty:
        raise LmforgeError("the records hold no loss and no evaluation metric to plot")
    x = curves.x
    n_metrics = len(curves.metrics)
    columns = min(3, n_metrics) or 1
    metric_rows = math.ceil(n_metrics / columns)
    has_loss = bool(curves.train or curves.dev_loss)
    heights = [3.4] * has_loss + [2.4] * metric_rows
    fig = _new_figure(10, sum(heights) + 0.5 * bool(title), constrained=True)
    grid = fig.add_gridspec(len(heights), columns, height_ratios=heights)
    if title:
        fig.suptitle(title, fontsize=11)
    xmax = max((v for r in records if _number(v := r.get(x))), default=1.0)
    shared = None
    if has_loss:
        shared = ax = fig.add_subplot(grid[0, :])
        _loss_panel(ax, records, curves)
    for i, key in enumerate(curves.metrics):
        m_ax = fig.add_subplot(grid[has_loss + i // columns, i % columns], sharex=shared)
        shared = shared or m_ax
        train_key = curves.train_metrics.get(key)
        name = key[len("eval_"):] if key.startswith("eval_") else key
        if train_key:
            m_ax.plot(*_series([r for r in records if is_training_record(r)], train_key, x), color="tab:blue",
                      lw=0.9, alpha=0.5, label=f"train {train_key}")
        _draw(m_ax, *_series([r for r in records if not is_training_record(r)], key, x), color="tab:purple",
              lw=1.5, label=f"dev {name}" if train_key else None)
        m_ax.set_title(f"dev {name}", fontsize=9)
        m_ax.grid(alpha=0.3)
        m_ax.margins(y=0.25)
        if train_key:
            m_ax.legend(fontsize=7, loc="best")
    for a in fig.axes:
        if a.get_label() == "lr":
            continue
        a.set_xlabel(x)
        a.set_xlim(0, xmax * 1.05 + 0.5)
        a.xaxis.set_major_locator(MaxNLocator(nbins=10 if a is fig.axes[0] and has_loss else 5, integer=True))
    return fig


def _loss_panel(ax, records: list[dict[str, Any]], curves: TrainingCurves) -> None:
    """Training and dev losses with markers, the learning rate beneath them on a second y axis."""
    x = curves.x
    train = [r for r in records if is_training_record(r)]
    evals = [r for r in records if not is_training_record(r)]
    term_colours = ("tab:cyan", "tab:olive", "tab:brown", "tab:pink", "tab:gray")
    terms = sorted({k[len("loss_"):] for k in curves.train if k != "loss"}
                   | {k[len("eval_loss_"):] for k in curves.dev_loss if k != "eval_loss"})
    colour = {term: term_colours[i % len(term_colours)] for i, term in enumerate(terms)}
    for key in curves.train:  # the loss solid and bold, its terms thin; dev values dashed, a term in its colour
        main = key == "loss"
        _draw(ax, *_series(train, key, x), color="tab:blue" if main else colour[key[len("loss_"):]],
              lw=1.8 if main else 0.9, alpha=1.0 if main else 0.8, ms=4 if main else 2.5,
              label="train loss" if main else f"train {key}", zorder=3)
    for key in curves.dev_loss:
        main = key == "eval_loss"
        _draw(ax, *_series(evals, key, x), color="tab:orange" if main else colour[key[len("eval_loss_"):]],
              lw=1.8 if main else 0.9, ls="--", ms=5 if main else 3,
              label="dev loss" if main else f"dev {key[len('eval_'):]}", zorder=4)
    bad = [r[x] for r in train if _number(r.get(x)) and isinstance(r.get("loss"), int | float)
           and not math.isfinite(r["loss"])]
    if bad:
        ax.axvline(min(bad), color="tab:red", ls=":", lw=1.5, label=f"loss not finite from {x} {min(bad):g}")
    ax.set_ylabel("loss")
    ax.set_title("loss", fontsize=9)
    ax.grid(alpha=0.3)
    ax.margins(y=0.15)
    handles, labels = ax.get_legend_handles_labels()
    if curves.lr:
        lr_ax = ax.twinx()
        lr_ax.set_label("lr")
        lr_x, lr_values = _series(train, curves.lr, x)
        lr_ax.plot(lr_x, lr_values, color="0.6", lw=1.0, ls=":", marker=".", ms=4,
                   markevery=max(1, len(lr_x) // _MARKERS_UP_TO), label="learning rate")
        lr_ax.set_ylabel("learning rate", color="0.4")
        lr_ax.tick_params(axis="y", colors="0.4", labelsize=8)
        lr_ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
        lr_ax.set_ylim(bottom=0)
        # the losses are drawn above the learning rate: their axes in front, with a transparent background
        ax.set_zorder(lr_ax.get_zorder() + 1)
        ax.patch.set_visible(False)
        more_handles, more_labels = lr_ax.get_legend_handles_labels()
        handles, labels = handles + more_handles, labels + more_labels
    if handles:
        ax.legend(handles, labels, loc="best", fontsize=8, framealpha=0.85)


def plot_training(records: list[dict[str, Any]], path: str | Path, *, title: str | None = None) -> Path:
    """Write ``training_figure(records)`` as a PNG; returns the path."""
    return save_png(training_figure(records, title=title), path)

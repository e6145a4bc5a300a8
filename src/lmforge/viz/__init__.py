"""Look inside models: attention weights (PNG grids and a self-contained HTML viewer), positional encodings,
training curves, few-shot accuracy curves, and induction heads (``lmforge.viz.induction``: which heads attend from a
token to the one after its previous occurrence, Olsson et al. 2022).

``collect_attention`` (``lmforge.viz.attention``) runs a model on one input and returns plain arrays;
``write_attention_html`` (``lmforge.viz.html``) and the ``plot_*`` functions (``lmforge.viz.plots``) draw them.
Imports are lazy so that ``import lmforge.viz`` loads neither PyTorch nor matplotlib.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "AttentionMap": "lmforge.viz.attention",
    "AttentionSet": "lmforge.viz.attention",
    "collect_attention": "lmforge.viz.attention",
    "attention_html": "lmforge.viz.html",
    "write_attention_html": "lmforge.viz.html",
    "read_attention_html": "lmforge.viz.html",
    "attention_grid_figure": "lmforge.viz.plots",
    "plot_attention_grid": "lmforge.viz.plots",
    "positions_figure": "lmforge.viz.plots",
    "plot_positions": "lmforge.viz.plots",
    "training_figure": "lmforge.viz.plots",
    "plot_training": "lmforge.viz.plots",
    "fewshot_figure": "lmforge.viz.fewshot_plot",
    "plot_fewshot": "lmforge.viz.fewshot_plot",
    "HeadScores": "lmforge.viz.induction",
    "head_scores": "lmforge.viz.induction",
    "induction_scores": "lmforge.viz.induction",
    "previous_token_scores": "lmforge.viz.induction",
    "write_prompt_attention": "lmforge.viz.induction",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'lmforge.viz' has no attribute {name!r}")


__all__ = list(_WHERE)

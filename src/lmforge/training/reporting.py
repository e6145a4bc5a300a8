"""What a training run reports besides its metrics log: the loss-curve plot, the evaluation log lines, the final
``eval_results.json`` and the model card (``README.md``). Rank 0 alone reports; the Trainer calls these there.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import time
from pathlib import Path
from typing import Any

from lmforge.training.logging import CURVE_NAME, METRICS_NAME, plot_loss_curve, read_metrics
from lmforge.utils.io import atomic_write_text
from lmforge.utils.model_card import write_model_card

log = logging.getLogger("lmforge")

PLOT_INTERVAL_S = 30.0  # drawing takes about 0.3 s: during the run, redraw at most this often
RESULTS_NAME = "eval_results.json"


class Reporter:
    """Reports of one run folder.

    Args:
        out_dir: the run folder, holding ``metrics.jsonl``.
    """

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = out_dir
        self._last_plot = -math.inf

    def plot(self, force: bool = False) -> None:
        """Redraw ``loss_curve.png`` from ``metrics.jsonl`` (at most every ``PLOT_INTERVAL_S`` unless ``force``).

        Without matplotlib nothing is drawn: a plot is a convenience, never a reason to fail a run.
        """
        now = time.perf_counter()
        if not force and now - self._last_plot < PLOT_INTERVAL_S:
            return
        self._last_plot = now
        with contextlib.suppress(ImportError):
            plot_loss_curve(read_metrics(self.out_dir / METRICS_NAME), self.out_dir / CURVE_NAME)

    def evaluation(self, record: dict[str, Any]) -> None:
        """Log an evaluation record and redraw the plot."""
        log.info("step %d: %s", record["step"], ", ".join(f"{k} {v:.4g}" for k, v in record.items() if k != "step"))
        self.plot()

    def finish(self, results: dict[str, Any]) -> None:
        """After the final model is written: ``eval_results.json`` (when there are results), the plot and the
        model card (last: it reads the folder's other files)."""
        if results:
            atomic_write_text(self.out_dir / RESULTS_NAME, json.dumps(results, indent=2) + "\n")
        self.plot(force=True)
        write_model_card(self.out_dir)  # README.md: what was trained, on what, how, the metrics and plots
        log.info("saved the final model in %s", self.out_dir)

    def last_train_record(self, step: int) -> dict[str, Any]:
        """The last training record of ``metrics.jsonl`` (a resumed run that had nothing left to train logs none
        itself); ``{"step": step}`` when there is none."""
        train = [r for r in read_metrics(self.out_dir / METRICS_NAME) if "loss" in r]
        return train[-1] if train else {"step": step}

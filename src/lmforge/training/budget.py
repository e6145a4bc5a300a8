"""The limit of a run: ``max_steps``, or a time or token budget (``TrainConfig.budget``) whose elapsed fraction sets
the lr of every update (``lmforge.training.optim.lr_multiplier_at``) and ends the run after the update that reaches
it.

The fraction after each update lives in the run's ``Progress`` (``budget_fraction``; saved in checkpoints only for a
budgeted run), so a token budget resumes bit-identically and a time budget with the time that remains. Token budgets
count the global tokens (all processes); time budgets average the processes' training seconds in the step's
all-reduce, so that every process uses the same fraction.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from lmforge.config import TrainConfig
from lmforge.errors import LmforgeError
from lmforge.training.optim import lr_multiplier_at
from lmforge.training.state import Progress

ELAPSED_KEY = "trainer/elapsed"  # a time budget's clock reading in the step's all-reduce


class RunLimit:
    """When the run ends and, with a budget, the lr factor of each update.

    Args:
        config: the run's TrainConfig (``max_steps``, ``budget``, the schedule).
        progress: the run's ``Progress``, which holds the step and the budget fraction.
    """

    def __init__(self, config: TrainConfig, progress: Progress) -> None:
        self.config, self.progress = config, progress
        self.budget = config.budget_spec()  # None: max_steps limits the run
        self.factor = 0.0  # the lr factor of the latest update of a budgeted run (what the scheduler reports)

    @property
    def active(self) -> bool:
        return self.budget is not None

    def scheduler_factor(self) -> Any:
        """What ``build_scheduler`` takes: the budget's factor of the latest update, or None for a step schedule."""
        return (lambda: self.factor) if self.active else None

    def restored(self, path: Path) -> None:
        """After a checkpoint's components are loaded: a budgeted run continues its schedule where it was.

        Raises:
            LmforgeError: the checkpoint is of a run without a budget.
        """
        if not self.active:
            return
        if self.progress.budget_fraction is None:
            raise LmforgeError(f"cannot resume from {path}: it was trained without a budget; a budget run needs its "
                               "own --out folder (or --overwrite)")
        self.factor = lr_multiplier_at(self.progress.budget_fraction, self.config)

    def start(self) -> str | None:
        """At the start of ``fit``: the line to log (None without a budget)."""
        if not self.active:
            return None
        self.progress.budget_fraction = self.progress.budget_fraction or 0.0
        cap = f", at most {self.config.max_steps} steps" if self.config.max_steps is not None else ""
        return (f"budget: {self.budget.describe()} ({self.config.budget}); the lr schedule follows the elapsed "
                f"fraction{cap}")

    def finished(self) -> bool:
        """``max_steps`` reached (when set), or the latest update reached the budget."""
        if self.config.max_steps is not None and self.progress.step >= self.config.max_steps:
            return True
        return self.active and (self.progress.budget_fraction or 0.0) >= 1.0

    def accumulation(self, full: int) -> int:
        """The micro-batches per process of the next update: ``full`` (``batch_size`` / (micro x processes)), or
        during ``batch_ramp`` ``max(1, ceil(full * p / batch_ramp))`` with p the run's progress before the update (the
        completed share of ``max_steps``, or of the budget): the batch grows linearly from one micro-batch per process
        to the full batch (Cramming's batch-size ramp), the same on every process and on resume."""
        ramp = self.config.batch_ramp
        if ramp <= 0.0 or full <= 1:
            return full
        return max(1, min(full, math.ceil(full * self.fraction() / ramp)))

    def fraction(self) -> float:
        """The run's progress before the next update, in [0, 1]: the completed share of the budget, or of
        ``max_steps`` for a step-limited run. Read from ``Progress`` alone, so the same on every process and after a
        resume (what the batch ramp and an objective's own schedule, such as ELECTRA's sampling temperature, follow)."""
        if self.active:
            return min(1.0, self.progress.budget_fraction or 0.0)
        total = self.config.max_steps
        return min(1.0, self.progress.step / total) if total else 0.0

    def before_update(self, full: int, objective: Any) -> int:
        """Before each update: the run's progress to an objective with a schedule of its own (its
        ``set_progress(fraction)``, e.g. ELECTRA's sampling temperature), and the update's micro-batch count
        (``accumulation``: a batch ramp grows it)."""
        if (follow := getattr(objective, "set_progress", None)) is not None:
            follow(self.fraction())
        return self.accumulation(full)

    def bar(self) -> dict[str, Any]:
        """tqdm's ``total``, ``initial`` and ``desc``: steps, or a budget's percent."""
        if not self.active:
            return dict(total=self.config.max_steps, initial=self.progress.step, desc="train")
        return dict(total=100.0, initial=self.percent(), desc="train (budget %)")

    def percent(self) -> float:
        return round(100 * min(self.progress.budget_fraction or 0.0, 1.0), 2)

    def advance(self, shown: float) -> float:
        """How far the progress bar moves after an update (it shows ``shown``): one step, or the budget's percent."""
        return self.percent() - shown if self.active else 1

    def votes(self, elapsed_s: float) -> dict[str, float]:
        """What this process adds to the step's all-reduce: its training seconds, for a time budget."""
        return {ELAPSED_KEY: elapsed_s} if self.active and self.budget.kind == "time" else {}

    def set_lr(self, optimizer: torch.optim.Optimizer, base_lrs: list[float], totals: dict[str, float],
               world_size: int) -> None:
        """Every group's lr for this update (its base lr times the budget schedule's factor at the fraction the
        update ends at), and that fraction into ``Progress``; nothing without a budget.

        Args:
            totals: the step's all-reduced sums (``tokens``: this update's global tokens; the elapsed seconds).
        """
        if not self.active:
            return
        done = self.progress.tokens + int(totals["tokens"]) if self.budget.kind == "tokens" else \
            totals[ELAPSED_KEY] / world_size
        fraction = done / self.budget.amount
        self.factor = lr_multiplier_at(fraction, self.config, before=self.progress.budget_fraction or 0.0)
        for group, base in zip(optimizer.param_groups, base_lrs, strict=True):
            group["lr"] = base * self.factor
        self.progress.budget_fraction = fraction

    def annotate(self, record: dict[str, Any]) -> dict[str, Any]:
        """A logged record, with ``budget_fraction`` for a budgeted run."""
        if self.active:
            record["budget_fraction"] = self.progress.budget_fraction
        return record

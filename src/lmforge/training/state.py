"""The Trainer's resumable parts, each ``Stateful``: it gives its own state (``state_dict``) and takes it back
(``load_state_dict``), so a checkpoint is a table of components rather than a hand-mirrored dict of keys.

A checkpoint (``trainer_state.pt``, format version 2) holds ``{"components": {name: state}, "data": [per rank],
"rng": [per rank], ...}``: the optimizer, the scheduler, the run's ``Progress`` and the ``BestTracker`` are saved by
rank 0; every rank's data position and RNG state are gathered. Version-1 checkpoints (one flat dict) are read by
``migrate_state``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from lmforge.errors import LmforgeError


class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def new_window() -> dict[str, Any]:
    """Sums over the current logging window (reset after every log line)."""
    return {"steps": 0, "loss": 0.0, "grad_norm": 0.0, "terms": {}, "metrics": {}}


@dataclass
class Progress:
    """Where the run is: optimizer steps, epochs of the training data, tokens seen, training time, the last
    evaluation, the sums of the current logging window, and for a run with a budget the fraction of it elapsed
    after the latest update (``budget_fraction``; None without a budget, and then not saved: step-limited
    checkpoints keep their keys)."""

    step: int = 0
    epoch: int = 0
    tokens: int = 0
    elapsed_s: float = 0.0
    last_eval: dict[str, float] = field(default_factory=dict)
    window: dict[str, Any] = field(default_factory=new_window)
    budget_fraction: float | None = None

    def state_dict(self) -> dict[str, Any]:
        state = {"step": self.step, "epoch": self.epoch, "tokens": self.tokens, "elapsed_s": self.elapsed_s,
                 "last_eval": dict(self.last_eval), "window": self.window}
        if self.budget_fraction is not None:
            state["budget_fraction"] = self.budget_fraction
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step, self.epoch, self.tokens = int(state["step"]), int(state["epoch"]), int(state["tokens"])
        self.elapsed_s, self.last_eval = float(state["elapsed_s"]), dict(state["last_eval"])
        self.window = state["window"]
        fraction = state.get("budget_fraction")
        self.budget_fraction = None if fraction is None else float(fraction)


class BestTracker:
    """The best evaluation so far by one metric (``"f1"``, or ``"-eval_loss"`` to minimise): ``value`` (signed so
    that larger is better), ``step`` and the whole ``record``; ``None`` before the first evaluation."""

    def __init__(self, select: str | None) -> None:
        self.select = select
        self.best: dict[str, Any] | None = None

    def offer(self, record: dict[str, Any], step: int) -> bool:
        """Keep ``record`` if it improves on the best (ties keep the earlier one); True when it does."""
        if self.select is None:
            return False
        name, sign = (self.select[1:], -1.0) if self.select.startswith("-") else (self.select, 1.0)
        if name not in record:
            raise LmforgeError(f"cannot select the best model by {name!r}: the evaluation reports "
                               f"{', '.join(k for k in record if k != 'step')}")
        value = sign * float(record[name])
        if self.best is not None and not value > self.best["value"]:
            return False
        self.best = {"value": value, "step": step, "record": dict(record)}
        return True

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best = state.get("best")


_PROGRESS_KEYS = ("step", "epoch", "tokens", "elapsed_s", "last_eval", "window")


def migrate_state(state: dict[str, Any]) -> dict[str, Any]:
    """A version-1 trainer state (flat keys) in the version-2 layout (``components``); version 2 unchanged."""
    if "components" in state:
        return state
    components = {"optimizer": state["optimizer"], "scheduler": state["scheduler"],
                  "progress": {k: state[k] for k in _PROGRESS_KEYS}, "best": {"best": state.get("best")}}
    kept = {k: v for k, v in state.items()
            if k not in (*_PROGRESS_KEYS, "optimizer", "scheduler", "best")}
    return {**kept, "components": components}

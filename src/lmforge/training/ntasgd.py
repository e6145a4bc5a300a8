"""NT-ASGD, the non-monotonically triggered averaged SGD of Merity et al. 2018 ("Regularizing and Optimizing LSTM
Language Models", section 3, Algorithm 1): ``--train.optimizer=nt_asgd``.

**Before the trigger** it is plain SGD at a constant learning rate: w_k = w_{k-1} - lr * (g_k + wd * w_{k-1}) (L2
weight decay added to the gradient, as ``torch.optim.SGD`` and Merity et al.'s code; lmforge's decay groups: matrices
only). The lr is still multiplied by the run's schedule: use ``--train.schedule=constant --train.warmup_steps=0``
for the paper's constant rate.

**The trigger** (Algorithm 1; ``main.py`` of salesforce/awd-lstm-lm) is checked at every evaluation until it fires:
with ``logs`` the validation losses of the t earlier evaluations and n = ``train.nonmono`` (the paper's
non-monotone interval, 5), the evaluation whose loss v satisfies

    t > n  and  v > min(logs[0 : t - n])

(worse than the best loss of every evaluation before the last n) triggers the averaging; v is then appended to logs.

**After the trigger** the steps are the same SGD steps, and the optimizer keeps the average of the iterates: after
the k-th update since the trigger, a_k = a_{k-1} + (w_k - a_{k-1}) / k, so a_k = (w_1 + ... + w_k) / k, the weights
after every update since the trigger. That is ``torch.optim.ASGD(t0=0, lambd=0)``'s ``ax``, which Merity et al.'s
code switches to; their Algorithm 1 also counts w_0, the weights at the trigger: one term among thousands.

**Evaluation uses the average**: inside ``averaged_weights(optimizer)`` the model holds a_k; the Trainer evaluates
and keeps the best model inside ``evaluating(optimizer, record)`` (which then offers the record's ``eval_loss`` to
the trigger) and saves the final model inside ``averaged_weights``; training continues from the iterate w_k. A
checkpoint stores w_k as the model's weights and a_k, k, the trigger step and the logs in the optimizer's state, so
``--resume auto`` continues exactly. Before the trigger ``averaged_weights`` changes nothing.

Shape legend: every average a has its parameter's shape.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from lmforge.errors import LmforgeError

__all__ = ["NTASGD", "averaged_weights", "evaluating", "observe_evaluation"]

log = logging.getLogger("lmforge")

# The loss the trigger watches (the Trainer's eval record: the objective's held-out loss, lower is better).
TRIGGER_METRIC = "eval_loss"


class NTASGD(torch.optim.SGD):
    """SGD that starts averaging its iterates when the validation loss stops improving (see the module docstring).

    Args:
        params: parameters or parameter groups, as ``torch.optim.SGD``.
        lr: the learning rate (the paper's 30 for its word-level models, with gradient clipping at 0.25).
        weight_decay: L2 decay added to the gradient (the paper's 1.2e-6).
        nonmono: n, the non-monotone interval (the paper's 5).

    Attributes:
        logs: the validation losses observed before the trigger.
        trigger_step: the number of updates done when the averaging started (None before).
        averaged: k, the number of updates averaged since the trigger.
    """

    def __init__(self, params: Iterable[Any], lr: float, weight_decay: float = 0.0, nonmono: int = 5) -> None:
        if nonmono < 1:
            raise LmforgeError(f"nonmono={nonmono} must be >= 1 (the paper's non-monotone interval is 5)")
        super().__init__(params, lr=lr, weight_decay=weight_decay)
        self.nonmono = nonmono
        self.logs: list[float] = []
        self.trigger_step: int | None = None
        self.averaged = 0

    @property
    def triggered(self) -> bool:
        return self.trigger_step is not None

    def observe(self, loss: float, step: int) -> bool:
        """Offer one evaluation's validation loss, after ``step`` updates; returns True when it triggers the
        averaging (from the next update on). After the trigger, losses are ignored."""
        if self.triggered:
            return False
        t, n = len(self.logs), self.nonmono
        fire = t > n and loss > min(self.logs[:t - n])
        self.logs.append(float(loss))
        if fire:
            self.trigger_step = step
        return fire

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        """One SGD update; after the trigger, the average takes in the new iterate: a += (w - a) / k."""
        loss = super().step(closure)
        if self.triggered:
            self.averaged += 1
            k = self.averaged
            for p in self._params():
                state = self.state[p]
                if k == 1 or "average" not in state:
                    state["average"] = p.detach().clone()
                else:
                    state["average"].add_(p.detach() - state["average"], alpha=1.0 / k)
        return loss

    def _params(self) -> Iterator[torch.Tensor]:
        for group in self.param_groups:
            yield from group["params"]

    @contextlib.contextmanager
    def swapped_in(self) -> Iterator[None]:
        """The averaged weights in the parameters for the block, the iterate put back afterwards (nothing to do
        before the first averaged update)."""
        if not self.averaged:
            yield
            return
        kept = []
        with torch.no_grad():
            for p in self._params():
                average = self.state[p].get("average")
                if average is not None:
                    kept.append((p, p.detach().clone()))
                    p.copy_(average)
        try:
            yield
        finally:
            with torch.no_grad():
                for p, iterate in kept:
                    p.copy_(iterate)

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["nt_asgd"] = {"logs": list(self.logs), "trigger_step": self.trigger_step, "averaged": self.averaged,
                            "nonmono": self.nonmono}
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """As ``torch.optim.SGD``'s, with the trigger's state; refuses another optimizer's state."""
        extra = state_dict.get("nt_asgd")
        if extra is None:
            raise LmforgeError("this optimizer state is not NT-ASGD's (it has no trigger state): it was saved by "
                               "another optimizer (train.optimizer)")
        super().load_state_dict({k: v for k, v in state_dict.items() if k != "nt_asgd"})
        self.logs = [float(v) for v in extra["logs"]]
        self.trigger_step = None if extra["trigger_step"] is None else int(extra["trigger_step"])
        self.averaged = int(extra["averaged"])


def averaged_weights(optimizer: Any) -> contextlib.AbstractContextManager[None]:
    """The context the Trainer evaluates and saves its final model in: NT-ASGD's averaged weights swapped into the
    model (``NTASGD.swapped_in``); nothing for any other optimizer."""
    return optimizer.swapped_in() if isinstance(optimizer, NTASGD) else contextlib.nullcontext()


@contextlib.contextmanager
def evaluating(optimizer: Any, record: dict[str, Any]) -> Iterator[None]:
    """The Trainer's hook around one evaluation: inside, NT-ASGD's averaged weights are in the model
    (``averaged_weights``) while ``record`` is filled; on leaving, the record goes to the trigger
    (``observe_evaluation``). Nothing for any other optimizer."""
    with averaged_weights(optimizer):
        yield
    observe_evaluation(optimizer, record)


def observe_evaluation(optimizer: Any, record: dict[str, Any]) -> None:
    """Offer an evaluation record's ``eval_loss`` to NT-ASGD's trigger (nothing for any other optimizer).

    Raises:
        LmforgeError: NT-ASGD with an evaluation that reports no held-out loss (no eval data).
    """
    if not isinstance(optimizer, NTASGD):
        return
    if TRIGGER_METRIC not in record:
        raise LmforgeError("optimizer nt_asgd triggers its averaging on the held-out loss (eval_loss), which this "
                           "run does not report: give the run eval data (pretraining: data.eval_fraction > 0) and "
                           "an evaluation cadence (--eval-every N)")
    if optimizer.observe(float(record[TRIGGER_METRIC]), int(record.get("step", 0))):
        log.info(
            "step %s: eval_loss %.4f is worse than the best before the last %d evaluations (%.4f): NT-ASGD starts "
            "averaging the weights", record.get("step"), record[TRIGGER_METRIC], optimizer.nonmono,
            min(optimizer.logs[:-1 - optimizer.nonmono]))

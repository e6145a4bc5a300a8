"""Gradual unfreezing (Howard & Ruder 2018, ULMFiT section 3.2): the model's layer groups are unfrozen one by one,
last first, so that fine-tuning does not wash away what the lower layers learned during language modelling.

ULMFiT: "We first unfreeze the last layer and fine-tune all unfrozen layers for one epoch. We then unfreeze the next
lower frozen layer and repeat, until we fine-tune all layers until convergence at the last iteration."

``GradualUnfreezing`` is a Trainer step callback: before optimizer update ``s`` (0-based count of completed updates)
it makes the last ``min(G, s // steps_per_stage + 1)`` of the G groups trainable (``requires_grad``) and every
other group frozen. It is a pure function of the step, so a resumed run unfreezes exactly as the uninterrupted one
(the checkpoint holds the groups and the stage length, and a resume with others is refused).

Groups come from ``layer_groups``: the embeddings, each layer ``layers.{i}``, then everything above (the task head,
the LM bias, a pooler) -- the groups of ``lmforge.training.freeze.depth_of``, which discriminative learning rates
(``TaskConfig.layer_decay``) use as well.

The optimizer must hold every parameter from the start (build it before the first ``before_step``): a frozen
parameter then simply has no gradient, and AdamW skips it (no update, no weight decay, no moment change).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from lmforge.errors import LmforgeError
from lmforge.training.freeze import _deepest_use, _n_layers

__all__ = ["GradualUnfreezing", "layer_groups"]


def layer_groups(model: nn.Module) -> list[list[str]]:
    """The parameter names of ``model`` (a ``TaskModel`` or a backbone) by layer group, lowest first: embeddings,
    ``layers.0`` ... ``layers.{L-1}``, then the rest (head, pooler, norms above the layers). Empty groups are left
    out."""
    n_layers = _n_layers(getattr(model, "backbone", model))
    deepest = _deepest_use(model, n_layers, strip="backbone.")  # a layer shared by all (ALBERT) joins the top one
    groups: list[list[str]] = [[] for _ in range(n_layers + 2)]
    for name, param in model.named_parameters():
        depth = n_layers + 1 if name.startswith("head.") else deepest[id(param)]
        groups[depth].append(name)
    return [g for g in groups if g]


class GradualUnfreezing:
    """Unfreeze one more layer group (last first) every ``steps_per_stage`` optimizer updates.

    Args:
        model: the module being trained (its parameters are switched in place).
        steps_per_stage: updates per stage (ULMFiT: one epoch).
        groups: parameter names per group, lowest first (default: ``layer_groups(model)``).
    """

    def __init__(self, model: nn.Module, steps_per_stage: int, groups: list[list[str]] | None = None) -> None:
        if steps_per_stage < 1:
            raise LmforgeError(f"gradual unfreezing needs steps_per_stage >= 1, got {steps_per_stage}")
        self.model = model
        self.steps_per_stage = int(steps_per_stage)
        self.groups = groups if groups is not None else layer_groups(model)
        self._params = dict(model.named_parameters())
        missing = [n for g in self.groups for n in g if n not in self._params]
        if missing:
            raise LmforgeError(f"gradual unfreezing: no parameter named {missing[0]!r} in the model")

    def trainable_groups(self, step: int) -> int:
        """How many groups (counted from the top) train at update ``step`` (0-based completed updates)."""
        return min(len(self.groups), step // self.steps_per_stage + 1)

    def before_step(self, step: int) -> None:
        """Set ``requires_grad`` for the update that follows ``step`` completed ones."""
        first_trainable = len(self.groups) - self.trainable_groups(step)
        for i, names in enumerate(self.groups):
            for name in names:
                self._params[name].requires_grad_(i >= first_trainable)

    def state_dict(self) -> dict[str, Any]:
        return {"steps_per_stage": self.steps_per_stage, "groups": [list(g) for g in self.groups]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if int(state.get("steps_per_stage", -1)) != self.steps_per_stage or state.get("groups") != self.groups:
            raise LmforgeError(f"the checkpoint unfroze {len(state.get('groups') or [])} layer groups every "
                               f"{state.get('steps_per_stage')} steps, this run {len(self.groups)} every "
                               f"{self.steps_per_stage}: resume with the same data, batch size and model")

"""The objective contract shared by every training job.

An objective is a callable ``objective(model, batch) -> ObjectiveOutput`` plus ``objective.counts(batch)``:

- ``losses``: for each loss term, the SUM of per-item losses (a scalar with grad) and the number of items.
  The Trainer divides each sum by the term's count over the whole optimizer step (all accumulation
  micro-batches and all processes), so gradient accumulation equals one large batch exactly.
- ``metrics``: ``name -> (sum, count)`` pairs, reported as sum / count (e.g. accuracy).
- ``counts(batch)``: each loss term's item count, read from the batch without a forward pass.
"""

from __future__ import annotations

from typing import NamedTuple

from torch import Tensor, nn


class ObjectiveOutput(NamedTuple):
    losses: dict[str, tuple[Tensor, Tensor | int]]
    metrics: dict[str, tuple[Tensor | float, Tensor | int]]


def unwrapped(model: nn.Module) -> nn.Module:
    """The model under DistributedDataParallel (``module``) and ``torch.compile`` (``_orig_mod``) wrappers: what an
    objective reads attributes of (its config, its output projection). The same walk as
    ``lmforge.training.distributed.unwrap_model``, which this layer may not import."""
    while True:
        inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
        if not isinstance(inner, nn.Module):
            return model
        model = inner

"""The objective contract shared by every training job.

An objective is a callable ``objective(model, batch) -> ObjectiveOutput`` plus ``objective.counts(batch)``:

- ``losses``: for each loss term, the SUM of per-item losses (a scalar with grad) and the number of items.
  The Trainer divides each sum by the term's count over the whole optimizer step (all accumulation
  micro-batches and all processes), so gradient accumulation equals one large batch exactly.
- ``metrics``: ``name -> (sum, count)`` pairs, reported as sum / count (e.g. accuracy).
- ``counts(batch)``: each loss term's item count, read from the batch without a forward pass.
"""

from __future__ import annotations

from typing import Any, NamedTuple

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


class SegmentMemory:
    """The per-layer memory an objective carries from batch to batch of a stream (Transformer-XL's, XLNet's with
    ``reuse_len``): one memory for training and one for evaluation (the Trainer evaluates between training steps),
    and the training one in every checkpoint (``state_dict``), so a resumed run continues with the memory the
    interrupted one had. Subclasses fill ``self._mems[model.training]`` with L detached tensors (B, M, D)."""

    def __init__(self) -> None:
        self._mems: dict[bool, tuple[Tensor, ...]] = {}  # model.training -> the memory the last batch left

    def state_dict(self) -> dict[str, Any]:
        """The training memory (L tensors (B, M, D) on the CPU, or None): what a checkpoint keeps."""
        mems = self._mems.get(True)
        return {"train_memory": None if mems is None else [m.detach().cpu() for m in mems]}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """Restore the training memory ``state_dict`` gave (moved to the batches' device on first use)."""
        mems = (state or {}).get("train_memory")
        self._mems.pop(True, None)
        if mems is not None:
            self._mems[True] = tuple(mems)

    def memory(self, training: bool) -> tuple[Tensor, ...] | None:
        """The memory the next training (or evaluation) batch would attend to: L tensors (B, M, D), or None."""
        return self._mems.get(training)

    def _memory_for(self, training: bool, batch: dict[str, Tensor]) -> tuple[Tensor, ...] | None:
        """The memory this batch attends to: none on a batch that starts a pass (``reset``) or whose number of rows
        differs; moved to the batch's device (a restored memory, or a model moved between devices)."""
        mems = self._mems.get(training)
        input_ids = batch["input_ids"]
        reset = batch.get("reset")
        if mems is None or (reset is not None and bool(reset.any())) or mems[0].shape[0] != input_ids.shape[0]:
            return None
        return tuple(m if m.device == input_ids.device else m.to(input_ids.device) for m in mems)

"""The AWD-LSTM language-modelling objective (Merity et al. 2018; ULMFiT stages (a) and (b), Howard & Ruder 2018):
next-token cross-entropy with stateful truncated BPTT.

Batches come from ``lmforge.data.lm_stream.LMStreamData``: consecutive windows of the same rows of one contiguous
stream. The objective keeps the LSTM state each call ends with (detached: the gradient is truncated at the window's
start) and starts the next call from it; a batch whose ``reset`` is set, or whose number of rows differs, starts
from zeros. Training and evaluation keep separate states (the Trainer evaluates between training steps).

Loss term ``lm`` (sum of the token cross-entropies, number of tokens): the Trainer reports ``eval_ppl_lm``, the
perplexity on the held-out documents. Metric ``lm_accuracy``: next-token accuracy.

Not implemented (named deviation): Merity et al.'s activation regularisation (AR, alpha = 2) and temporal
activation regularisation (TAR, beta = 1).
"""

from __future__ import annotations

from typing import Any

import torch.nn.functional as F
from torch import Tensor, nn

from lmforge.objectives.base import ObjectiveOutput

IGNORE = -100


class AWDLMObjective:
    """``objective(model, batch)`` for an ``AWDLSTM`` (see the module docstring)."""

    def __init__(self) -> None:
        self._states: dict[bool, Any] = {}  # model.training -> the state the last window ended with

    def counts(self, batch: dict[str, Tensor]) -> dict[str, int]:
        return {"lm": int((batch["labels"] != IGNORE).sum())}

    def __call__(self, model: nn.Module, batch: dict[str, Tensor]) -> ObjectiveOutput:
        input_ids, labels = batch["input_ids"], batch["labels"]  # (B, L)
        B = input_ids.shape[0]
        key = bool(model.training)
        state = self._states.get(key)
        reset = batch.get("reset")
        if state is None or (reset is not None and bool(reset.any())) or state[0][0].shape[1] != B:
            state = None
        out = model(input_ids, state=state)
        self._states[key] = [(h.detach(), c.detach()) for h, c in out.state]  # truncated BPTT
        logits = out.logits  # (B, L, V)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE, reduction="sum")
        valid = labels != IGNORE
        correct = ((logits.detach().argmax(-1) == labels) & valid).sum()
        n = int(valid.sum())
        return ObjectiveOutput({"lm": (loss, n)}, {"lm_accuracy": (correct, n)})

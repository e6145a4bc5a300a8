"""The AWD-LSTM language-modelling objective (Merity et al. 2018; ULMFiT stages (a) and (b), Howard & Ruder 2018):
next-token cross-entropy with stateful truncated BPTT.

Batches come from ``lmforge.data.lm_stream.LMStreamData``: consecutive windows of the same rows of one contiguous
stream. The objective keeps the LSTM state each call ends with (detached: the gradient is truncated at the window's
start) and starts the next call from it; a batch whose ``reset`` is set, or whose number of rows differs, starts
from zeros. Training and evaluation keep separate states (the Trainer evaluates between training steps).

Backward language model (``ModelConfig.reverse``, ULMFiT's backward LM): the model reads each window right to left
and its logits at position k score token k - 1, so the targets must be the previous tokens and the windows must come
from the end of the stream to its start (so that the carried state, which stops at a window's first token, meets
the text to its left). That is the data's job: ``LMStreamData(reverse=True)`` (the pretraining recipe sets it from
the model's config) gives such windows, in text order, marked ``backward``; this objective is unchanged for them
(same loss, same state carrying) and only refuses a mismatch between the model's direction and the batches'.

Loss term ``lm`` (sum of the token cross-entropies, number of tokens): the Trainer reports ``eval_ppl_lm``, the
perplexity on the held-out documents. Metric ``lm_accuracy``: next-token accuracy.

Not implemented (named deviation): Merity et al.'s activation regularisation (AR, alpha = 2) and temporal
activation regularisation (TAR, beta = 1).
"""

from __future__ import annotations

from typing import Any

import torch.nn.functional as F
from torch import Tensor, nn

from lmforge.errors import LmforgeError
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
        _check_direction(model, batch)
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


def _check_direction(model: nn.Module, batch: dict[str, Tensor]) -> None:
    """A backward model (config.reverse) needs backward windows (labels = the previous tokens), a forward one
    forward windows: the other way round, the targets would be the tokens the model has already read."""
    config = getattr(getattr(model, "module", model), "config", None)  # DistributedDataParallel wraps the model
    model_backward = bool(getattr(config, "reverse", False))
    flag = batch.get("backward")
    data_backward = flag is not None and bool(flag.any())
    if model_backward != data_backward:
        if model_backward:
            raise LmforgeError("the model is a backward LM (model.reverse=true) but the batches are forward windows "
                               "(labels = the next tokens); build the stream data with LMStreamData(reverse=True)")
        raise LmforgeError("the batches are a backward LM's windows (labels = the previous tokens) but the model "
                           "reads left to right (model.reverse=false); use LMStreamData(reverse=False) or a model "
                           "with reverse=true")

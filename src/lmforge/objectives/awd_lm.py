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

Regularisers (Merity et al. 2018, section 4.6), in training only and off by default (``AWDLMLoss.ar_alpha``,
``tar_beta``; theirs and fastai's 2 and 1): term ``ar`` = alpha x the mean over tokens and units of the last layer's
output after output dropout, squared; term ``tar`` = beta x the mean over consecutive real positions and units of
(h_t - h_{t-1})^2 on the raw last-layer output (a window's first position has no predecessor in it). Evaluation
returns ``lm`` alone, so ``eval_loss`` and ``eval_ppl_lm`` are the language model's. Off by default as measured: on
BBC News, awd-lstm-small with the comparison's 5,000 steps (``configs/compare-bbc-dev.toml``) reached held-out
perplexity 141.9 with alpha 2, beta 1 and 138.5 without, its classifiers level on dev (BENCHMARKS.md, "Issue 38:
AWD-LSTM").
"""

from __future__ import annotations

from typing import Any

import torch.nn.functional as F
from torch import Tensor, nn

from lmforge.errors import LmforgeError
from lmforge.objectives.base import ObjectiveOutput
from lmforge.objectives.options import AWDLMLoss  # noqa: F401  (its loss options, for importers)

IGNORE = -100


class AWDLMObjective:
    """``objective(model, batch)`` for an ``AWDLSTM`` (see the module docstring)."""

    def __init__(self, ar_alpha: float = 0.0, tar_beta: float = 0.0) -> None:
        self._states: dict[bool, Any] = {}  # model.training -> the state the last window ended with
        self.ar_alpha, self.tar_beta = ar_alpha, tar_beta

    def counts(self, batch: dict[str, Tensor]) -> dict[str, int]:
        valid = batch["labels"] != IGNORE
        counts = {"lm": int(valid.sum())}
        if self.ar_alpha > 0:
            counts["ar"] = counts["lm"]
        if self.tar_beta > 0:
            counts["tar"] = int((valid[:, 1:] & valid[:, :-1]).sum())
        return counts

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
        losses = {"lm": (loss, n)}
        if model.training:  # regularisers of training only: evaluation reports the language model's loss alone
            if self.ar_alpha > 0:  # alpha * mean over (token, unit) of the dropped output squared
                ar = out.dropped_output.float().pow(2).mean(-1)[valid].sum()
                losses["ar"] = (self.ar_alpha * ar, n)
            if self.tar_beta > 0:  # beta * mean over (step, unit) of (h_t - h_{t-1})^2 on the raw output
                raw = out.last_hidden_state.float()
                pairs = valid[:, 1:] & valid[:, :-1]
                tar = (raw[:, 1:] - raw[:, :-1]).pow(2).mean(-1)[pairs].sum()
                losses["tar"] = (self.tar_beta * tar, int(pairs.sum()))
        return ObjectiveOutput(losses, {"lm_accuracy": (correct, n)})


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

"""The biLM objective (ELMo, Peters et al. 2018, section 3.1): maximise the log-likelihood of both directions,

    sum_k [ log p(t_k | t_1..t_{k-1}) + log p(t_k | t_{k+1}..t_N) ]

on contiguous blocks of the corpus (plan ``"causal"``: the documents joined by [SEP] and cut into blocks of
``seq_len + 1`` tokens, so a block may end inside one document and start inside the next; every block starts from zero
LSTM states). The batch is the causal-LM batch (``input_ids`` = block[:-1], ``labels`` = block[1:]); the biLM reads
the whole block ``[input_ids[:, 0], labels]`` so each direction predicts ``seq_len`` tokens.

One loss term ``lm`` = the mean of the forward and backward per-token NLLs (its ``eval_ppl_lm`` is the geometric mean
of the two perplexities); the metrics ``forward_nll`` and ``backward_nll`` give each direction's per-token NLL, which
the Trainer also reports as ``forward_ppl`` / ``backward_ppl`` (exp of the NLL), in training and evaluation.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from lmforge.objectives.base import ObjectiveOutput

IGNORE = -100


def _block(batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
    """The whole blocks (B, T + 1) and their mask (1 = real) from a causal-LM batch."""
    labels = batch["labels"]
    first_real = batch.get("attention_mask", torch.ones_like(labels))[:, :1]
    tokens = torch.cat([batch["input_ids"][:, :1], labels.clamp(min=0)], dim=1)
    mask = torch.cat([first_real.bool(), labels != IGNORE], dim=1)
    return tokens, mask


class BiLMObjective:
    """``objective(model, batch)`` for a ``BiLM`` (see the module docstring)."""

    def counts(self, batch: dict[str, Tensor]) -> dict[str, int]:
        return {"lm": int((batch["labels"] != IGNORE).sum())}

    def __call__(self, model: nn.Module, batch: dict[str, Tensor]) -> ObjectiveOutput:
        tokens, mask = _block(batch)
        out = model(tokens, attention_mask=mask, lm_loss=True)
        n = out.n_predictions
        return ObjectiveOutput({"lm": ((out.forward_nll + out.backward_nll) / 2, n)},
                               {"forward_nll": (out.forward_nll.detach(), n),
                                "backward_nll": (out.backward_nll.detach(), n)})

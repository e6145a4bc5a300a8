"""Masked-language-model objectives: BERT (MLM + NSP), ALBERT (MLM + SOP), RoBERTa (MLM only) and SpanBERT
(MLM + SBO).

Batches follow ``lmforge.data.pretraining``: ``input_ids``, ``attention_mask``, ``token_type_ids``,
``mlm_labels`` (-100 where nothing is predicted), and ``nsp_labels`` / ``sbo_left``, ``sbo_right``,
``sbo_offset`` when the objective uses them. The vocabulary projection runs only at the masked positions
(the head gathers them first): in a small BERT it is most of the compute.

Losses (Devlin et al., 2019; Joshi et al., 2020): the MLM loss is the mean cross-entropy over masked tokens,
the NSP (or SOP) loss the mean over sequences, the SBO loss the mean over span tokens that have an SBO target
(``sbo_left >= 0``: every span token except the pieces of a long span past the head's position table, see
``lmforge.data.masking``); the total is their sum.
"""

from __future__ import annotations

import functools
import inspect

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmforge.objectives.base import ObjectiveOutput

IGNORE = -100


def _sum_ce(logits: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
    """Summed cross-entropy (in fp32 even under bf16 autocast) and the number of correct argmax predictions."""
    logits = logits.float()
    loss = F.cross_entropy(logits, targets, reduction="sum")
    correct = (logits.argmax(-1) == targets).sum()
    return loss, correct


def constant_guess_hits(targets: Tensor) -> Tensor:
    """How many of ``targets`` (N,) the best constant guess gets right: the count of their most frequent token. Over
    ``N`` it is the accuracy of always predicting that token, the plateau an MLM sits on before it reads context (a
    unigram model's accuracy on these very targets, an upper bound for any constant guess)."""
    if targets.numel() == 0:
        return targets.new_zeros(())
    return torch.bincount(targets).max()


def token_cosine(states: Tensor, attention_mask: Tensor | None) -> tuple[Tensor, int]:
    """(sum, count) of the cosine similarity of every pair of distinct real-token states in a batch: their mean is the
    anisotropy of the representation (Ethayarajh 2019): near 1 when every token gets nearly the same vector (a
    collapsed encoder), lower when states carry the token and its context.

    With unit vectors u_i and their sum s, the pairs' cosines add up to (|s|^2 - N), over N (N - 1) ordered pairs.

    Args:
        states: (B, T, D) the final token states; attention_mask: (B, T), 1 = real token (None: all real).
    """
    with torch.no_grad():
        flat = states.detach().float().reshape(-1, states.shape[-1])  # (B*T, D)
        if attention_mask is not None:
            flat = flat[attention_mask.reshape(-1).bool()]  # (N, D) real tokens
        n = flat.shape[0]
        if n < 2:
            return flat.new_zeros(()), 0
        units = F.normalize(flat, dim=-1)
        total = units.sum(0).pow(2).sum() - n  # sum over i != j of u_i . u_j
        return total, n * (n - 1)


def _takes_rows_only(model: nn.Module) -> bool:
    """Whether ``model`` (or the module a DDP / FSDP / compile wrapper holds) takes ``rows_only`` (``TaskModel``)."""
    while True:
        inner = getattr(model, "_orig_mod", None) or getattr(model, "module", None)
        if not isinstance(inner, nn.Module):
            break
        model = inner
    return _forward_takes_rows_only(type(model))


@functools.cache
def _forward_takes_rows_only(cls: type) -> bool:
    """Read once per class, not on every training step."""
    return "rows_only" in inspect.signature(cls.forward).parameters


class MaskedLMObjective:
    """MLM, optionally with next-sentence prediction (BERT) or the span boundary objective (SpanBERT).

    Args:
        nsp: add the sentence-pair loss (needs ``nsp_labels``; the model's head must return ``nsp_logits``).
        sbo: add the SBO loss (needs the ``sbo_*`` tensors; the head must be ``SpanBertHeads``).
        pair_task: what the pair labels mean, the name of the loss term and metric: ``"nsp"`` (BERT: is B the next
            segment) or ``"sop"`` (ALBERT: are the two segments in order); the same two-way classifier reads the
            pooled output either way.
        rows_only: in training, have the model compute its last layer at the positions the head reads alone
            (``TaskModel.forward(rows_only=True)``: exact, fewer FLOPs); training records then have no
            ``token_cosine`` (evaluation computes every position and keeps it). False: every position always.
    """

    # the Trainer logs this term's summed item count (the masked tokens) as ``predicted_tokens``
    predicted_tokens_term = "mlm"

    def __init__(self, nsp: bool = False, sbo: bool = False, pair_task: str = "nsp", rows_only: bool = True) -> None:
        self.nsp = nsp
        self.sbo = sbo
        self.pair = pair_task
        self.rows_only = rows_only

    def counts(self, batch: dict[str, Tensor]) -> dict[str, int]:
        n = int((batch["mlm_labels"] != IGNORE).sum())
        out = {"mlm": n}
        if self.nsp:
            out[self.pair] = int(batch["nsp_labels"].numel())
        if self.sbo:
            out["sbo"] = int(((batch["mlm_labels"] != IGNORE) & (batch["sbo_left"] >= 0)).sum())
        return out

    def __call__(self, model: nn.Module, batch: dict[str, Tensor]) -> ObjectiveOutput:
        labels = batch["mlm_labels"]
        selected = labels != IGNORE  # (B, T)
        head_inputs: dict[str, Tensor] = {"masked_positions": selected}
        if self.sbo:
            head_inputs.update(sbo_left=batch["sbo_left"], sbo_right=batch["sbo_right"],
                               sbo_offset=batch["sbo_offset"])
        options = {}
        if model.training and self.rows_only and _takes_rows_only(model):
            # training reads the logits only: the encoder's last layer computes the positions the head reads alone
            # (TaskModel.forward(rows_only=True)); evaluation keeps every position for the token-state cosine
            options["rows_only"] = True
        out = model(batch["input_ids"], attention_mask=batch.get("attention_mask"),
                    token_type_ids=batch.get("token_type_ids"), **head_inputs, **options)
        targets = labels[selected]  # (N,)
        n = targets.numel()
        mlm_loss, mlm_correct = _sum_ce(out.mlm_logits, targets)
        losses = {"mlm": (mlm_loss, n)}
        # the accuracy beside its plateau (the best constant guess) and the anisotropy of the token states: whether
        # a run has left the plateau where it predicts the most frequent token everywhere (lmforge.recipes.pretrain)
        metrics = {"mlm_accuracy": (mlm_correct, n), "mlm_constant_accuracy": (constant_guess_hits(targets), n)}
        if getattr(out, "token_states", None) is not None:
            metrics["token_cosine"] = token_cosine(out.token_states, batch.get("attention_mask"))
        if self.nsp:
            nsp_targets = batch["nsp_labels"]
            nsp_loss, nsp_correct = _sum_ce(out.nsp_logits, nsp_targets)
            losses[self.pair] = (nsp_loss, nsp_targets.numel())
            metrics[f"{self.pair}_accuracy"] = (nsp_correct, nsp_targets.numel())
        if self.sbo:
            sbo_targets = labels[selected & (batch["sbo_left"] >= 0)]  # (N_sbo,)
            n_sbo = sbo_targets.numel()
            sbo_loss, sbo_correct = _sum_ce(out.sbo_logits, sbo_targets)
            losses["sbo"] = (sbo_loss, n_sbo)
            metrics["sbo_accuracy"] = (sbo_correct, n_sbo)
        return ObjectiveOutput(losses, metrics)

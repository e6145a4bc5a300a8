"""BERT's extractive question-answering head (Devlin et al. 2019, sections 4.2 and 4.3; SQuAD v1.1 and v2.0).

Shape legend: B batch (one row per window of a context, see ``lmforge.data.qa_features``), T sequence length,
D model dim.

    last_hidden_state (B, T, D) ──► Linear(D, 2) ──► start_logits (B, T), end_logits (B, T)

A span (i, j) of the context scores ``start_logits[i] + end_logits[j]``; the [CLS] position (0) stands for "no
answer in this window" (SQuAD v2.0's null answer, and the label of every window that does not hold the answer).
Featurization and span decoding live in ``lmforge.data.qa_features``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmforge.config import ModelConfig
from lmforge.errors import LmforgeError
from lmforge.nn.kernels.packed_dropout import Dropout

__all__ = ["QAOutput", "QuestionAnsweringHead", "build_qa_head"]


class QAOutput(NamedTuple):
    """What ``QuestionAnsweringHead.forward`` returns.

    Attributes:
        start_logits: (B, T) span-start scores; positions outside ``context_mask`` hold the dtype's most
            negative finite value, so they never win an argmax or a softmax.
        end_logits: (B, T) span-end scores, masked the same way.
        loss_sum: with labels, ``sum over the batch of (CE(start) + CE(end)) / 2`` (a scalar with grad);
            else None.
        loss_count: with labels, the number of windows B (the items ``loss_sum`` adds up); else 0.
    """

    start_logits: Tensor
    end_logits: Tensor
    loss_sum: Tensor | None = None
    loss_count: int = 0


class QuestionAnsweringHead(nn.Module):
    """Span-extraction head of BERT for SQuAD (Devlin et al. 2019, "BERT: Pre-training of Deep Bidirectional
    Transformers for Language Understanding", section 4.2): a start vector S and an end vector E (one
    ``Linear(D, 2)``, with biases as in Google's released ``run_squad.py``) dotted with every token's final hidden
    state.

    Training loss is the mean of the start and end cross-entropies over the positions that ``context_mask``
    allows. Windows without the answer (and unanswerable questions, v2.0 / section 4.3) are labelled (0, 0), the
    [CLS] position. Masking the question, [SEP] and padding positions is a choice beyond the paper (BERT's
    released code scores them and discards them only at decoding); it keeps probability mass and the argmax
    on positions that can be an answer.

    State-dict keys: ``qa_outputs.weight`` (2, D), ``qa_outputs.bias`` (2,); row 0 is the start, row 1 the end.
    """

    def __init__(self, d_model: int, *, dropout: float = 0.0, init_std: float = 0.02) -> None:
        """
        Args:
            d_model: D.
            dropout: dropout on the hidden states before the projection (BERT uses none here: 0.0).
            init_std: standard deviation of the weight's normal initialisation (BERT 0.02); the bias starts at 0.
        """
        super().__init__()
        if d_model < 1:
            raise LmforgeError(f"QuestionAnsweringHead needs d_model >= 1, got {d_model}")
        if not 0.0 <= dropout < 1.0:
            raise LmforgeError(f"the QA head's dropout must be in [0, 1), got {dropout}")
        self.dropout = Dropout(dropout)
        self.qa_outputs = nn.Linear(d_model, 2)
        nn.init.normal_(self.qa_outputs.weight, std=init_std)
        nn.init.zeros_(self.qa_outputs.bias)

    def forward(self, encoder_output: Any, start_positions: Tensor | None = None,
                end_positions: Tensor | None = None, context_mask: Tensor | None = None) -> QAOutput:
        """
        Args:
            encoder_output: an ``EncoderOutput`` (uses ``last_hidden_state`` (B, T, D)).
            start_positions: (B,) gold start token index per window (0 = [CLS], no answer here); with
                ``end_positions``, the loss is computed.
            end_positions: (B,) gold end token index (inclusive).
            context_mask: (B, T) bool (or 0/1), True where an answer may start or end: this window's context
                tokens and the [CLS] position. None allows every position.

        Returns:
            QAOutput(start_logits (B, T), end_logits (B, T), loss_sum, loss_count).

        Raises:
            LmforgeError: shapes disagree, only one of the label tensors is given, or a label points outside
                the sequence or at a masked position.
        """
        hidden = encoder_output.last_hidden_state  # (B, T, D)
        B, T = hidden.shape[:2]
        logits = self.qa_outputs(self.dropout(hidden))  # (B, T, 2)
        start_logits, end_logits = logits[..., 0], logits[..., 1]  # (B, T) each
        allowed = None
        if context_mask is not None:
            if tuple(context_mask.shape) != (B, T):
                raise LmforgeError(f"context_mask must be (batch={B}, length={T}); got {tuple(context_mask.shape)}")
            allowed = context_mask.to(device=hidden.device, dtype=torch.bool)  # (B, T)
            lowest = torch.finfo(start_logits.dtype).min
            start_logits = start_logits.masked_fill(~allowed, lowest)  # (B, T)
            end_logits = end_logits.masked_fill(~allowed, lowest)  # (B, T)
        if start_positions is None and end_positions is None:
            return QAOutput(start_logits, end_logits)
        if start_positions is None or end_positions is None:
            raise LmforgeError("pass both start_positions and end_positions (or neither) to the QA head")
        starts = _check_positions(start_positions, "start_positions", B, T, allowed)  # (B,)
        ends = _check_positions(end_positions, "end_positions", B, T, allowed)  # (B,)
        # Cross-entropy in float32 even under autocast: the masked entries are the dtype's minimum.
        loss_sum = (F.cross_entropy(start_logits.float(), starts, reduction="sum")
                    + F.cross_entropy(end_logits.float(), ends, reduction="sum")) / 2
        return QAOutput(start_logits, end_logits, loss_sum, B)

    def extra_repr(self) -> str:
        return f"d_model={self.qa_outputs.in_features}"


def _check_positions(positions: Tensor, name: str, B: int, T: int, allowed: Tensor | None) -> Tensor:
    """Validate (B,) label positions against the sequence length and the context mask (one host sync)."""
    if tuple(positions.shape) != (B,):
        raise LmforgeError(f"{name} must be (batch={B},); got {tuple(positions.shape)}")
    if positions.is_floating_point() or positions.dtype == torch.bool:
        raise LmforgeError(f"{name} must be integer token indices; got dtype {positions.dtype}")
    positions = positions.to(device=allowed.device if allowed is not None else positions.device, dtype=torch.long)
    if B == 0:
        return positions
    lo, hi = torch.aminmax(positions)
    if int(lo) < 0 or int(hi) >= T:
        raise LmforgeError(f"{name} hold indices from {int(lo)} to {int(hi)}; they must lie in [0, {T})")
    if allowed is not None:
        ok = allowed.gather(1, positions[:, None]).squeeze(1)  # (B,)
        if not bool(ok.all()):
            row = int((~ok).nonzero()[0, 0])
            raise LmforgeError(f"{name}[{row}] = {int(positions[row])} is outside context_mask (not a context "
                               "token nor [CLS]); label windows without the answer (0, 0) and set "
                               "context_mask True at [CLS]")
    return positions


def build_qa_head(config: ModelConfig, backbone: nn.Module, dropout: float = 0.0) -> QuestionAnsweringHead:
    """The ``{"type": "qa", "dropout": 0.0}`` builder of ``lmforge.heads.build_head``: a span head of width
    ``config.d_model`` initialised with ``config.init_std`` (``backbone`` is not needed)."""
    return QuestionAnsweringHead(config.d_model, dropout=dropout, init_std=config.init_std)

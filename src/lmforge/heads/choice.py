"""Multiple choice: one score per option, a softmax over a question's options (GPT-1's RACE / Story Cloze setting,
Radford et al. 2018, section 3.3; BERT's SWAG head, Devlin et al. 2019, section 4.4).

Every option of a question is its own row: ``[START] context [DELIM] option [EXTRACT]`` on a GPT,
``[CLS] context [SEP] option [SEP]`` on BERT. The head scores each row's pooled vector with one linear unit; the
scores of a question's options (``doc_index`` maps rows to questions) are its logits, padded with -inf where a
question has fewer options than the longest, and the loss is the cross-entropy against the right option.

Shapes: R rows (options of all questions), B questions, K the most options of a question, D model dim.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmforge.config import ModelConfig
from lmforge.errors import LmforgeError
from lmforge.heads.classification import hidden_layer
from lmforge.nn.kernels.packed_dropout import Dropout


class ChoiceOutput(NamedTuple):
    """``logits`` (B, K) per question, -inf where it has no option k; ``loss_sum`` over questions, ``loss_count``."""

    logits: Tensor
    loss_sum: Tensor | None = None
    loss_count: Tensor | None = None


class MultipleChoiceHead(nn.Module):
    """Dropout and a linear unit over each option's pooled vector; softmax over each question's options.

    Args:
        d_model: the backbone's pooled width D.
        dropout: on the pooled vector.
        init_std: weights from N(0, init_std^2), bias 0 (None: PyTorch's default).
        hidden: a dense D -> D layer with this activation before the scorer (``SequenceClassificationHead``'s
            ``hidden``: DistilBERT's ReLU pre-classifier, ELECTRA's and XLNet's sequence summaries).
    """

    def __init__(self, d_model: int, *, dropout: float = 0.1, init_std: float | None = 0.02,
                 hidden: str | None = None) -> None:
        super().__init__()
        self.dropout = Dropout(dropout)
        self.dense, self.hidden_activation = hidden_layer(d_model, hidden, init_std)
        self.scorer = nn.Linear(d_model, 1)
        if init_std is not None:
            nn.init.normal_(self.scorer.weight, std=init_std)
            nn.init.zeros_(self.scorer.bias)

    def forward(self, out, doc_index: Tensor, option_index: Tensor, labels: Tensor | None = None) -> ChoiceOutput:
        """``out.pooled_output`` (R, D); ``doc_index`` (R,) each row's question; ``option_index`` (R,) its option
        number in that question; ``labels`` (B,) the right option of each question."""
        pooled = out.pooled_output
        if self.dense is not None:
            pooled = self.hidden_activation(self.dense(self.dropout(pooled)))
        scores = self.scorer(self.dropout(pooled)).squeeze(-1)  # (R,)
        n_docs, width = int(doc_index.max()) + 1, int(option_index.max()) + 1
        logits = scores.new_full((n_docs, width), float("-inf"))
        logits = logits.index_put((doc_index, option_index), scores)  # (B, K)
        if labels is None:
            return ChoiceOutput(logits)
        loss = F.cross_entropy(logits.float(), labels, reduction="sum")
        return ChoiceOutput(logits, loss, torch.tensor(labels.shape[0]))


def build_choice_head(config: ModelConfig, backbone: nn.Module, *, dropout: float | None = None,
                      hidden: str | None = None) -> MultipleChoiceHead:
    """The head for ``backbone`` (it must have a pooled output: BERT's [CLS], a GPT's extract token)."""
    from lmforge.models import architecture, architectures_with

    family = architecture(config.arch)
    if not family.has_pooled_output or family.concat_pooling:
        pooled = ", ".join(n for n in architectures_with("has_pooled_output") if not architecture(n).concat_pooling)
        raise LmforgeError(f"multiple choice scores one pooled vector per option, which a {config.arch} backbone "
                           f"does not offer; use one of {pooled}")
    return MultipleChoiceHead(config.d_model, dropout=config.dropout if dropout is None else dropout,
                              init_std=config.init_std if family.uses_init_std else None, hidden=hidden)

"""Sequence classification and regression on the pooled [CLS] representation (Devlin et al., 2019, section 4.1).

One text, or a sentence pair told apart by segment ids, is classified from the encoder's ``pooled_output``
(``tanh(W h_[CLS] + b)``, BERT's pooler; on a GPT the state of the final [EXTRACT] token, Radford et al. 2018):
``logits = W_c dropout(pooled)``. Regression (e.g. STS-B) is the same head
with one output and a squared-error loss.

Long texts split into windows (``--long-text chunks``) are classified as one document: every window is a row of
the batch, ``doc_index`` (R,) maps each row to its document, and the document's logits are the mean of its
windows' logits. The loss is taken on the document logits, so training and prediction see the same pooling.

The AWD-LSTM (ULMFiT, Howard & Ruder 2018) is classified from its concat pooling [h_T; max; mean] (3D) by
``ConcatPoolingClassifierHead``: BN -> dropout -> linear -> ReLU, then BN -> dropout -> linear (the family's
``concat_pooling`` capability chooses it).

Shapes: R rows (windows), B documents, D model dim, C classes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmforge.choices import SEQUENCE_POOLINGS
from lmforge.config import ModelConfig
from lmforge.errors import LmforgeError
from lmforge.nn.kernels.packed_dropout import Dropout


class SequenceClassificationOutput(NamedTuple):
    """``logits`` (B, C) per document (C = 1 for regression); ``loss_sum`` summed over documents, ``loss_count``."""

    logits: Tensor
    loss_sum: Tensor | None = None
    loss_count: Tensor | None = None


class SequenceClassificationHead(nn.Module):
    """Dropout and a linear layer over the pooled [CLS] vector; cross-entropy, or squared error for regression.

    Args:
        d_model: the encoder's hidden size D.
        labels: the class names (C = len(labels)); ignored for regression.
        regression: one output trained with the squared error (sum over documents, averaged by the Trainer).
        dropout: on the pooled vector (BERT fine-tuning: 0.1).
        init_std: the classifier's weights are drawn from N(0, init_std^2) and its bias starts at zero, as
            google-research/bert initialises its classification layer (0.02); None keeps PyTorch's default
            (uniform), which the RNN classifier uses.
        combine_windows: how the rows of one document are combined: "mean_logits" (the windows of a long text)
            or "sum_states" (the representations are added before the classifier: GPT-1's similarity, one row
            per order of the pair).
        pooling: "cls" classifies the backbone's ``pooled_output`` (BERT's pooler over h_[CLS]); "mean" the mean of
            the final states over the real tokens (Reimers and Gurevych 2019), which an encoder pretrained by MLM
            alone has trained at every position, where its [CLS] state and pooler never received a gradient.
        hidden: put a dense D -> D layer with this activation ("tanh", "relu", "gelu") between the pooled vector
            and the classifier, with dropout before each: the classification heads of RoBERTa (tanh over <s>),
            ELECTRA (GELU), DistilBERT (ReLU) and XLNet (tanh over its last token), whose encoders have no pooler.
            None: the classifier reads the pooled vector (BERT, whose pooler is that layer).
        bias: the classifier has a bias (GPT-2's ``score`` layer has none).
    """

    def __init__(self, d_model: int, labels: list[str], *, regression: bool = False, dropout: float = 0.1,
                 init_std: float | None = 0.02, combine_windows: str = "mean_logits", pooling: str = "cls",
                 hidden: str | None = None, bias: bool = True) -> None:
        super().__init__()
        if combine_windows not in ("mean_logits", "sum_states"):
            raise LmforgeError(f"combine_windows={combine_windows!r} is not one of mean_logits, sum_states")
        if pooling not in SEQUENCE_POOLINGS:
            raise LmforgeError(f"pooling={pooling!r} is not one of {', '.join(SEQUENCE_POOLINGS)}")
        self.combine_windows, self.pooling = combine_windows, pooling
        self.wants_attention_mask = pooling == "mean"  # TaskModel hands the head the attention mask
        if not regression and len(labels) < 2:
            raise LmforgeError(f"classification needs at least 2 labels, got {labels}; for a numeric target use "
                               "float labels (regression)")
        self.labels, self.regression = list(labels), regression
        # TaskModel: an encoder may compute its last layer at [CLS] alone when only its pooled output is read
        self.reads_pooled_only = pooling == "cls"
        self.dropout = Dropout(dropout)
        self.dense, self.hidden_activation = hidden_layer(d_model, hidden, init_std)
        self.classifier = nn.Linear(d_model, 1 if regression else len(labels), bias=bias)
        if init_std is not None:
            nn.init.normal_(self.classifier.weight, std=init_std)
            if bias:
                nn.init.zeros_(self.classifier.bias)

    def forward(self, out, labels: Tensor | None = None, doc_index: Tensor | None = None,
                attention_mask: Tensor | None = None) -> SequenceClassificationOutput:
        """``out``: the backbone's output (``pooled_output`` (R, D), or ``last_hidden_state`` (R, T, D) with pooling
        "mean"); ``labels`` (B,) class ids or float targets; ``doc_index`` (R,) the document of each row (default: one
        row per document); ``attention_mask`` (R, T) 1 = real token (pooling "mean"; None: every position)."""
        pooled = out.pooled_output if self.pooling == "cls" else mean_states(out.last_hidden_state, attention_mask)
        if doc_index is not None and self.combine_windows == "sum_states":
            pooled, doc_index = sum_rows(pooled, doc_index), None  # (B, D)
        if self.dense is not None:
            pooled = self.hidden_activation(self.dense(self.dropout(pooled)))
        logits = self.classifier(self.dropout(pooled))  # (R, C)
        if doc_index is not None:
            logits = pool_rows(logits, doc_index)  # (B, C)
        if labels is None:
            return SequenceClassificationOutput(logits)
        if self.regression:
            loss = F.mse_loss(logits.squeeze(-1).float(), labels.float(), reduction="sum")
        else:
            loss = F.cross_entropy(logits.float(), labels, reduction="sum")
        return SequenceClassificationOutput(logits, loss, torch.tensor(labels.shape[0]))


class ConcatPoolingClassifierHead(SequenceClassificationHead):
    """ULMFiT's classifier (Howard & Ruder 2018, section 3.3) over concat pooling h_c = [h_T; max; mean] (3D): two
    linear blocks with batch normalisation and dropout, BN -> dropout -> linear -> ReLU, then BN -> dropout -> linear.

    Sizes and dropouts follow fastai's text classifier: 50 hidden units, dropout ``output_p`` (0.4) before the first
    linear layer and 0.1 before the second. The final layer is ``classifier`` (as in the one-layer head), so code that
    reads ``head.classifier`` sees the class scores' layer. Losses, regression and ``doc_index`` as the parent.

    Args:
        d_pooled: the pooled width (3 D).
        labels, regression: as ``SequenceClassificationHead``.
        dropout: before the first linear layer (ULMFiT / fastai: the encoder's ``output_p``).
        d_inner: the hidden width (50).
        inner_dropout: before the last linear layer (0.1).
    """

    def __init__(self, d_pooled: int, labels: list[str], *, regression: bool = False, dropout: float = 0.4,
                 d_inner: int = 50, inner_dropout: float = 0.1) -> None:
        super().__init__(d_inner, labels, regression=regression, dropout=inner_dropout, init_std=None)
        self.block = nn.Sequential(nn.BatchNorm1d(d_pooled), Dropout(dropout), nn.Linear(d_pooled, d_inner),
                                   nn.ReLU(), nn.BatchNorm1d(d_inner))

    def forward(self, out, labels: Tensor | None = None, doc_index: Tensor | None = None
                ) -> SequenceClassificationOutput:
        # second block's dropout and linear layer are the parent's (self.dropout, self.classifier)
        x = out.pooled_output  # (R, 3D)
        if self.training and x.shape[0] == 1:  # the last batch of an epoch may hold one document: batch norm cannot
            norms = [m for m in self.block if isinstance(m, nn.BatchNorm1d)]  # estimate a variance from one row,
            for m in norms:  # so that batch uses the running statistics
                m.eval()
            try:
                x = self.block(x)
            finally:
                for m in norms:
                    m.train()
        else:
            x = self.block(x)  # (R, d_inner)
        return super().forward(out._replace(pooled_output=x), labels, doc_index)


# the activations a head's hidden layer may have (``hidden=``): the ones the classification heads of Hugging Face's
# families use
HIDDEN_ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {"tanh": torch.tanh, "relu": F.relu, "gelu": F.gelu}


def hidden_layer(d_model: int, hidden: str | None, init_std: float | None
                 ) -> tuple[nn.Linear | None, Callable[[Tensor], Tensor] | None]:
    """The dense D -> D layer and activation of a head with ``hidden`` set, else (None, None).

    Raises:
        LmforgeError: an activation not in ``HIDDEN_ACTIVATIONS`` (named, with the valid ones).
    """
    if hidden is None:
        return None, None
    if hidden not in HIDDEN_ACTIVATIONS:
        raise LmforgeError(f"hidden={hidden!r} is not one of {', '.join(HIDDEN_ACTIVATIONS)} (or none)")
    dense = nn.Linear(d_model, d_model)
    if init_std is not None:
        nn.init.normal_(dense.weight, std=init_std)
        nn.init.zeros_(dense.bias)
    return dense, HIDDEN_ACTIVATIONS[hidden]


def sum_rows(rows: Tensor, doc_index: Tensor) -> Tensor:
    """Sum of the rows of each document: (R, C) with ``doc_index`` (R,) in 0..B-1 -> (B, C)."""
    return rows.new_zeros(int(doc_index.max()) + 1, rows.shape[-1]).index_add(0, doc_index, rows)


def pool_rows(row_logits: Tensor, doc_index: Tensor) -> Tensor:
    """Mean of the rows of each document: (R, C) with ``doc_index`` (R,) in 0..B-1 -> (B, C)."""
    sums = sum_rows(row_logits, doc_index)
    counts = torch.bincount(doc_index, minlength=sums.shape[0]).clamp(min=1).to(row_logits.dtype)
    return sums / counts[:, None]


def mean_states(hidden: Tensor, attention_mask: Tensor | None) -> Tensor:
    """(R, D): the mean of ``hidden`` (R, T, D) over the positions where ``attention_mask`` (R, T) is 1."""
    if attention_mask is None:
        return hidden.mean(dim=1)
    weights = attention_mask.to(hidden.dtype).unsqueeze(-1)  # (R, T, 1)
    return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)


def build_sequence_head(config: ModelConfig, backbone: nn.Module, *, labels: list[str], regression: bool = False,
                        dropout: float | None = None, combine_windows: str = "mean_logits", pooling: str = "cls",
                        hidden: str | None = None, bias: bool = True) -> SequenceClassificationHead:
    """The head for ``backbone`` (of family ``config.arch``), initialised as the family initialises its own weights.

    Raises:
        LmforgeError: the family has no pooled output to classify.
    """
    from lmforge.models import architecture, architectures_with

    family = architecture(config.arch)
    if not family.has_pooled_output:
        pooled = architectures_with("has_pooled_output")
        choices = ", ".join(f"{name} ({architecture(name).presets})" for name in pooled)
        raise LmforgeError(f"sequence classification reads the pooled [CLS] vector, which a {config.arch} backbone "
                           f"does not have; use a family that has one: {choices} (a BERT checkpoint is an "
                           "encoder)")
    if family.concat_pooling:  # ULMFiT: [h_T; max; mean] under two batch-normed linear blocks
        if pooling != "cls":
            raise LmforgeError(f"--task.pooling={pooling}: an AWD-LSTM is classified from its concat pooling [h_T; "
                               "max; mean] (ULMFiT), which already holds the mean; leave pooling at cls")
        if combine_windows != "mean_logits":
            raise LmforgeError("symmetric pairs add two representations, which ULMFiT's batch-normed classifier "
                               "does not take; leave --task.symmetric off for an AWD-LSTM")
        if hidden is not None or not bias:
            raise LmforgeError("an AWD-LSTM's classifier is ULMFiT's two batch-normed blocks; hidden= and bias= "
                               "shape the Transformer heads only")
        return ConcatPoolingClassifierHead(backbone.pooled_dim, labels, regression=regression,
                                           dropout=config.output_p if dropout is None else dropout)
    # BERT draws its classifier from N(0, init_std) like the rest of the model; a family with another scheme (the
    # RNN's uniform init) keeps PyTorch's default for the classifier.
    return SequenceClassificationHead(config.d_model, labels, regression=regression,
                                      dropout=config.dropout if dropout is None else dropout,
                                      init_std=config.init_std if family.uses_init_std else None,
                                      combine_windows=combine_windows, pooling=pooling, hidden=hidden, bias=bias)

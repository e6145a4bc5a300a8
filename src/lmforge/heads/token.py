"""Token classification (tagging: NER, chunking, POS) over an encoder, with a softmax or a CRF output layer.

Shape legend: B batch, T sub-word sequence length, W words (the most in the batch), D model dim, L labels.

Alignment (Devlin et al. 2019, section 5.3, "we use the representation of the first sub-token as the input to
the token-level classifier"): a sentence is a list of words; each word becomes one or more sub-words (a word
that yields none gets ``[UNK]``, so every word has a position; see ``lmforge.data.token_features``).
``word_index[b, t]`` is the word that sub-word t belongs to, or -1 for [CLS], [SEP] and padding.

* ``subwords="first"``: only the first sub-word of each word carries its label; the others are ignored.
  ``subwords="all"``: every sub-word is trained with its word's label (unchanged, B-X included, for every scheme).
  A continuation piece of a B-X word is *not* relabelled I-X: predictions are always made per word, never per
  sub-word, and relabelling would make ``word_pooling="mean"`` pick I-X for a B-X word of three or more pieces.
* ``word_pooling="first"``: a word's scores are those of its first sub-word. ``"mean"``: the average of its
  sub-words' probability distributions (softmax; ``word_logits`` are then log-probabilities) or of their
  emissions (CRF). With a softmax, ``"mean"`` needs ``subwords="all"`` (otherwise it averages untrained pieces).

Losses (each head returns a sum and a count; the caller divides the sums by the counts of the whole batch):
* softmax: cross-entropy summed over the labelled positions (first sub-words, or all sub-words), count = those
  positions — a per-token mean.
* CRF (Lample et al. 2016): the NLL of each sentence's word sequence (word emissions from the pooling rule,
  so training and decoding see the same scores), summed over sentences; count = the number of words, not of
  sentences. With zero transitions this equals the softmax loss, so one learning rate suits both, and the loss
  scale does not grow with sentence length (a per-sentence mean, the other convention, does).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmforge.choices import TAG_SCHEMES
from lmforge.config import ModelConfig
from lmforge.errors import LmforgeError
from lmforge.nn.crf import LinearChainCRF
from lmforge.nn.kernels.packed_dropout import Dropout
from lmforge.nn.pooling import WORD_POOLINGS, pool_words

__all__ = [
    "SCHEMES",
    "SUBWORD_MODES",
    "WORD_POOLINGS",
    "TokenClassificationHead",
    "TokenClassificationOutput",
    "build_token_head",
    "pool_words",
]

SUBWORD_MODES = ("first", "all")
SCHEMES = (*TAG_SCHEMES, "IO")  # the CRF is constrained for BIO and BIOES, free for the others
IGNORE_INDEX = -100


class TokenClassificationOutput(NamedTuple):
    """What ``TokenClassificationHead.forward`` returns.

    Attributes:
        word_logits: (B, W, L) word scores by the pooling rule (log-probabilities for softmax + "mean"); the CRF's
            emissions when ``crf=True``.
        word_mask: (B, W) bool, True for the words of each sentence (a prefix).
        subword_logits: (B, T, L) the classifier's scores of every position.
        loss_sum: scalar fp32 loss summed over the counted items, when labels were given; else None.
        loss_count: scalar long tensor, the number of counted items (labelled tokens or words); else None.
    """

    word_logits: Tensor
    word_mask: Tensor
    subword_logits: Tensor
    loss_sum: Tensor | None = None
    loss_count: Tensor | None = None


class TokenClassificationHead(nn.Module):
    """A linear tagger over the encoder's hidden states, optionally with a linear-chain CRF on the word
    sequence: BERT's NER fine-tuning (Devlin et al. 2019, section 5.3) and the CRF layer of Lample et al. (2016).

    ``logits = Linear(dropout(h))`` per sub-word; word scores by ``word_pooling``; the loss and the decoding are
    described in the module docstring. State-dict keys: ``classifier.*``, plus ``crf.{start,transitions,end}``
    when ``crf=True`` (the CRF is part of the model; its constraints are rebuilt from the options, not saved).
    """

    def __init__(self, d_model: int, labels: Sequence[str], *, dropout: float = 0.1, crf: bool = False,
                 allowed: tuple[Sequence[bool], Sequence[Sequence[bool]], Sequence[bool]] | None = None,
                 subwords: str = "first", word_pooling: str = "first", init_std: float = 0.02) -> None:
        """
        Args:
            d_model: D.
            labels: the L label names; id i is ``labels[i]``.
            dropout: on the hidden states before the classifier.
            crf: put a linear-chain CRF over the word sequence.
            allowed: with ``crf``, the constraint masks ``(start (L,), transitions (L, L) [from][to], end (L,))``,
                True = allowed; None = unconstrained.
            subwords: "first" or "all", which sub-words are trained (softmax only).
            word_pooling: "first" or "mean", how word scores are made from sub-word scores.
            init_std: standard deviation of the classifier weight's normal initialisation.
        """
        super().__init__()
        self.labels = _check_labels(labels)
        if subwords not in SUBWORD_MODES:
            raise LmforgeError(f"unknown subwords={subwords!r}; choose one of {', '.join(SUBWORD_MODES)}")
        if word_pooling not in WORD_POOLINGS:
            raise LmforgeError(f"unknown word_pooling={word_pooling!r}; choose one of {', '.join(WORD_POOLINGS)}")
        if crf and subwords != "first":
            raise LmforgeError("crf=True trains the word sequence, not sub-words: use subwords='first' (and "
                               "word_pooling='mean' to let every sub-word shape the word's emissions)")
        if not crf and word_pooling == "mean" and subwords != "all":
            raise LmforgeError("word_pooling='mean' averages every sub-word of a word, but subwords='first' trains "
                               "only the first one; use subwords='all' with it, or word_pooling='first'")
        if not crf and allowed is not None:
            raise LmforgeError("transition constraints (allowed=) need crf=True")
        if not 0.0 <= dropout < 1.0:
            raise LmforgeError(f"dropout must be in [0, 1); got {dropout}")
        self.subwords, self.word_pooling = subwords, word_pooling
        self.dropout = Dropout(dropout)
        self.classifier = nn.Linear(d_model, len(self.labels))
        nn.init.normal_(self.classifier.weight, std=init_std)
        nn.init.zeros_(self.classifier.bias)
        self.crf: LinearChainCRF | None = None
        if crf:
            start, trans, end = allowed if allowed is not None else (None, None, None)
            self.crf = LinearChainCRF(len(self.labels), allowed_start=start, allowed_transitions=trans,
                                      allowed_end=end)

    def forward(self, out: Any, word_index: Tensor, labels: Tensor | None = None,
                subword_labels: Tensor | None = None) -> TokenClassificationOutput:
        """
        Args:
            out: the backbone's output (uses ``last_hidden_state`` (B, T, D)).
            word_index: (B, T) long, word of each sub-word, -1 for [CLS]/[SEP]/padding.
            labels: (B, W) word label ids, -100 at padding; needed for the loss unless ``subwords="all"``.
            subword_labels: (B, T) sub-word label ids, -100 where not trained; the loss of ``subwords="all"``.

        Returns:
            TokenClassificationOutput(word_logits (B, W, L), word_mask (B, W), subword_logits (B, T, L), loss_sum,
            loss_count).
        """
        hidden = out.last_hidden_state  # (B, T, D)
        subword_logits = self.classifier(self.dropout(hidden))  # (B, T, L)
        if labels is not None:
            if labels.dim() != 2 or labels.shape[0] != hidden.shape[0]:
                raise LmforgeError(f"labels must be (batch={hidden.shape[0]}, words); got {tuple(labels.shape)}")
            n_words = labels.shape[1]
        else:
            n_words = int(word_index.max()) + 1 if word_index.numel() else 0  # 0 when all are -1
        word_logits, word_mask = self._word_scores(subword_logits, word_index, n_words)

        loss_sum = loss_count = None
        if self.crf is not None:
            if labels is not None:
                loss_sum = self.crf.nll(word_logits, labels, word_mask).sum()
                loss_count = word_mask.sum()
        elif self.subwords == "all":
            if subword_labels is not None:
                if tuple(subword_labels.shape) != tuple(subword_logits.shape[:2]):
                    raise LmforgeError(f"subword_labels must be (batch, length) = {tuple(subword_logits.shape[:2])} "
                                       f"like input_ids; got {tuple(subword_labels.shape)}")
                loss_sum, loss_count = _cross_entropy_sum(subword_logits, subword_labels)
            elif labels is not None:
                raise LmforgeError("subwords='all' trains every sub-word: pass subword_labels (B, T), e.g. from "
                                   "featurize_tagging(..., subwords='all')")
        elif labels is not None:
            loss_sum, loss_count = _cross_entropy_sum(word_logits, labels.masked_fill(~word_mask, IGNORE_INDEX))
        return TokenClassificationOutput(word_logits, word_mask, subword_logits, loss_sum, loss_count)

    def _word_scores(self, subword_logits: Tensor, word_index: Tensor, n_words: int) -> tuple[Tensor, Tensor]:
        if self.crf is None and self.word_pooling == "mean":
            # Average the distributions, not the logits: a word is as likely X as its pieces are on average.
            probs, word_mask = pool_words(subword_logits.float().softmax(-1), word_index, n_words, "mean")
            return probs.clamp(min=torch.finfo(probs.dtype).tiny).log(), word_mask  # (B, W, L) log-probabilities
        return pool_words(subword_logits, word_index, n_words, self.word_pooling)

    @torch.no_grad()
    def decode(self, output: TokenClassificationOutput) -> list[list[int]]:
        """Word label ids per sentence: argmax of ``word_logits``, or Viterbi under the constraints with a CRF.

        Args:
            output: what ``forward`` returned.

        Returns:
            B lists, one label id per word of the sentence.
        """
        if self.crf is not None:
            return self.crf.viterbi(output.word_logits, output.word_mask)
        best = output.word_logits.argmax(-1).tolist()  # (B, W)
        lengths = output.word_mask.sum(1).tolist()
        return [row[:n] for row, n in zip(best, lengths, strict=True)]

    def extra_repr(self) -> str:
        return (f"labels={len(self.labels)}, crf={self.crf is not None}, subwords={self.subwords!r}, "
                f"word_pooling={self.word_pooling!r}")


def _cross_entropy_sum(logits: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
    """Summed cross-entropy over the targets that are not -100, and their count."""
    L = logits.shape[-1]
    bad = (targets != IGNORE_INDEX) & ((targets < 0) | (targets >= L))
    if bool(bad.any()):
        raise LmforgeError(f"label id {int(targets[bad][0])} is outside [0, {L}) for a head with {L} labels")
    loss = F.cross_entropy(logits.reshape(-1, L).float(), targets.reshape(-1), ignore_index=IGNORE_INDEX,
                           reduction="sum")
    return loss, (targets != IGNORE_INDEX).sum()


def _check_labels(labels: Sequence[str]) -> list[str]:
    if isinstance(labels, str) or not labels or not all(isinstance(x, str) for x in labels):
        raise LmforgeError(f"labels must be a non-empty list of label names; got {labels!r}")
    labels = list(labels)
    repeated = sorted({x for x in labels if labels.count(x) > 1})
    if repeated:
        raise LmforgeError(f"labels repeat {', '.join(repeated)}; each label must appear once")
    return labels


def _scheme_constraints(labels: Sequence[str], scheme: str) -> tuple[list[bool], list[list[bool]], list[bool]] | None:
    """Allowed (start, transitions [from][to], end) of a tag scheme, or None for a scheme without constraints.

    BIO (IOB2): I-X only after B-X or I-X, never first. BIOES: B-X and I-X are followed by I-X or E-X; O, E-*
    and S-* by O, B-* or S-*; a sequence starts in O, B-* or S-* and ends in O, E-* or S-*. The rules live in
    ``lmforge.data.schemes``; IOB1 and IO leave the CRF free.
    """
    from lmforge.data.schemes import allowed_transitions

    name = scheme.upper()
    if name not in SCHEMES:
        raise LmforgeError(f"unknown tag scheme {scheme!r}; choose one of {', '.join(SCHEMES)}")
    if name not in ("BIO", "BIOES"):
        return None
    return allowed_transitions(labels, name)


def build_token_head(config: ModelConfig, backbone: nn.Module, *, labels: Sequence[str], crf: bool = False,
                     scheme: str = "BIO", subwords: str = "first", word_pooling: str = "first",
                     dropout: float | None = None) -> TokenClassificationHead:
    """The ``{"type": "token", "labels": [...], ...}`` builder of ``lmforge.heads.build_head``.

    Args:
        config: uses d_model, dropout (unless ``dropout`` is given) and init_std.
        backbone: unused (the head reads hidden states only).
        labels: label names, id order.
        crf: add a CRF; with scheme "BIO" or "BIOES" it is constrained to valid tag sequences.
        scheme: the labels' tag scheme, one of ``SCHEMES`` (only used with ``crf``).
        subwords, word_pooling: see ``TokenClassificationHead``.
        dropout: default ``config.dropout``.
    """
    allowed = _scheme_constraints(_check_labels(labels), scheme) if crf else None
    return TokenClassificationHead(config.d_model, labels, dropout=config.dropout if dropout is None else dropout,
                                   crf=crf, allowed=allowed, subwords=subwords, word_pooling=word_pooling,
                                   init_std=config.init_std)

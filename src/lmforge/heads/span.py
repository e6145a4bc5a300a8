"""Span classification (span-based NER) over an encoder: every span of up to ``max_span_width`` words is
represented and classified into one of the labels or "none".

Shape legend: B batch, T sub-word length, W words (the most in the batch), S spans, D model dim, E endpoint
dim, K labels, C = K + 1 classes.

Spans are word index pairs (i, j) with j INCLUSIVE inside this module; the readers and ``decode`` use
(start, end EXCLUSIVE, label). They are enumerated end-major (by j, then i) — ``enumerate_spans`` — so the
enumeration of n words is a prefix of the enumeration of n + 1 words and a batch shares one span table, each
sentence using a prefix of it. Class 0 is "none" (not an entity); class k + 1 is ``labels[k]``.

Span representations (``features``): "lecture" = [s_i; e_j; g_ij] (start vector, end vector, pooled span vector),
"width" = the same plus a learned width embedding (Lee et al.'s phi). Decoding (``decoding``): "flat" keeps
non-overlapping spans, "nested" keeps spans that nest or are disjoint, never two that cross.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmforge.choices import SPAN_POOLINGS
from lmforge.config import ModelConfig
from lmforge.data.spans import count_spans, enumerate_spans
from lmforge.errors import LmforgeError
from lmforge.nn.feedforward import ACTIVATIONS
from lmforge.nn.kernels.packed_dropout import Dropout
from lmforge.nn.scores import masked_softmax

SPAN_FEATURES = ("lecture", "width")
SPAN_DECODINGS = ("flat", "nested")

__all__ = [
    "SPAN_DECODINGS",
    "SPAN_FEATURES",
    "SPAN_POOLINGS",
    "SpanClassificationHead",
    "SpanClassificationOutput",
    "attention_pool",
    "build_span_head",
    "count_spans",
    "enumerate_spans",
    "mean_pool",
    "select_spans",
]

IGNORE_INDEX = -100


class SpanClassificationOutput(NamedTuple):
    """What ``SpanClassificationHead.forward`` returns.

    Attributes:
        span_logits: (B, S, C) class scores; class 0 = none, class k + 1 = ``labels[k]``.
        span_mask: (B, S) bool, True for the spans of each sentence (a prefix of the shared table).
        spans: (B, S, 2) long (i, j) word indices, j inclusive.
        loss_sum: scalar fp32 cross-entropy summed over the labelled real spans, when labels were given.
        loss_count: scalar long tensor, the number of those spans.
    """

    span_logits: Tensor
    span_mask: Tensor
    spans: Tensor
    loss_sum: Tensor | None = None
    loss_count: Tensor | None = None


def mean_pool(h: Tensor, spans: Tensor) -> Tensor:
    """Mean of the word vectors h_i .. h_j of every span, by cumulative sums (one subtraction per span).

    Args:
        h: (B, W, D) word vectors.
        spans: (S, 2) long (i, j), j inclusive, j < W.

    Returns:
        (B, S, D).
    """
    i, j = spans[:, 0], spans[:, 1]  # (S,)
    sums = F.pad(h.float().cumsum(dim=1), (0, 0, 1, 0))  # (B, W + 1, D); sums[:, k] = h_0 + .. + h_{k-1}
    width = (j - i + 1).to(sums.dtype).unsqueeze(1)  # (S, 1)
    return ((sums[:, j + 1] - sums[:, i]) / width).to(h.dtype)  # (B, S, D)


def attention_pool(h: Tensor, scores: Tensor, spans: Tensor, max_span_width: int) -> tuple[Tensor, Tensor]:
    """Lee et al. (2017)'s head-finding attention: a softmax of per-word scores over the words of each span,
    and the weighted sum of their vectors.

    Args:
        h: (B, W, D) word vectors.
        scores: (B, W) a score per word (w . h_k).
        spans: (S, 2) long (i, j), j inclusive, j - i < max_span_width.
        max_span_width: the most words a span has.

    Returns:
        (B, S, D) pooled vectors and the (B, S, W) weights (zero outside each span, summing to 1 inside).
    """
    B, W, _ = h.shape
    S = spans.shape[0]
    offsets = torch.arange(max_span_width, device=h.device)  # (M,)
    index = spans[:, :1] + offsets  # (S, M) the words i, i + 1, .. of each span
    inside = index <= spans[:, 1:]  # (S, M)
    index = index.clamp(max=max(W - 1, 0))
    local = masked_softmax(scores[:, index], inside)  # (B, S, M) softmax over the span's words only
    # Scatter into a dense (B, S, W) matrix and multiply, rather than gathering (B, S, M, D) word vectors:
    # the same result with M times less memory for the gathered copies.
    weights = h.new_zeros(B, S, W).scatter_add_(2, index.expand(B, S, max_span_width), local.to(h.dtype))
    return torch.bmm(weights, h), weights  # (B, S, D), (B, S, W)


def _crosses(a: tuple[int, int], b: tuple[int, int]) -> bool:
    """Whether inclusive word ranges a and b overlap without one containing the other."""
    return a[0] < b[0] <= a[1] < b[1] or b[0] < a[0] <= b[1] < a[1]


def select_spans(spans: Sequence[tuple[int, int]], scores: Sequence[float],
                 decoding: str = "flat") -> list[int]:
    """Greedy span selection by descending score: the indices of the kept spans.

    From the highest score down (ties: earlier start, then shorter span first), a span is kept when it fits with
    every span kept so far: with ``decoding="flat"`` it must share no word with them; with ``"nested"`` it may
    also contain or lie inside a kept span, and only a span that CROSSES a kept one (they overlap, neither
    contains the other) is dropped, so of a crossing pair the higher score stays.

    Args:
        spans: (i, j) word ranges, j INCLUSIVE, all distinct.
        scores: one per span.
        decoding: "flat" or "nested".

    Returns:
        Indices into ``spans`` of the kept ones, in the order they were kept.
    """
    if decoding not in SPAN_DECODINGS:
        raise LmforgeError(f"unknown span decoding {decoding!r}; choose one of {', '.join(SPAN_DECODINGS)}")
    order = sorted(range(len(spans)), key=lambda k: (-scores[k], spans[k][0], spans[k][1]))
    kept: list[int] = []
    if decoding == "flat":
        taken: set[int] = set()
        for k in order:
            i, j = spans[k]
            if taken.isdisjoint(range(i, j + 1)):
                taken.update(range(i, j + 1))
                kept.append(k)
        return kept
    for k in order:
        if not any(_crosses(spans[k], spans[m]) for m in kept):
            kept.append(k)
    return kept


class SpanClassificationHead(nn.Module):
    """Span classifier with the span representations of Lee et al. (2017), "End-to-end Neural Coreference
    Resolution" (EMNLP), section 4, used for NER as span classification.

    A word is represented by the hidden state of its first sub-word, h_w. Span (i, j) is

        x_ij = [FFNN_s(h_i); FFNN_e(h_j); g_ij; phi(j - i)]     (features="width", the default)
        x_ij = [FFNN_s(h_i); FFNN_e(h_j); g_ij]                (features="lecture", the lecture's [s_i; e_j; g_ij])

    with FFNN_s, FFNN_e one-layer projections to E dims (activation ``activation``), g_ij the mean of
    h_i .. h_j (``pooling="mean"``) or Lee et al.'s attention over them (``pooling="attention"``: a learned
    scorer w . h_k, softmax over k in i..j, weighted sum of h_k), and phi a learned width embedding (Lee et al.'s
    feature; ``d_width`` dims). The classifier is Linear -> activation -> dropout -> Linear into C = K + 1
    classes, class 0 = none.

    Deviations from Lee et al.: endpoints are projected (FFNN_s, FFNN_e, as start/end projections in later span
    NER models) rather than concatenated raw, and the attention scorer is linear in h_k (no hidden layer).

    ``decode`` keeps flat (non-overlapping) spans, or with ``decoding="nested"`` spans that nest without
    crossing (see ``select_spans``).

    State-dict keys: ``start_proj.*``, ``end_proj.*``, ``width.weight`` (only with features="width"),
    ``hidden.*``, ``output.*``, and ``scorer.*`` with attention pooling.
    """

    def __init__(self, d_model: int, labels: Sequence[str], *, max_span_width: int = 8, d_endpoint: int | None = None,
                 d_width: int = 20, pooling: str = "mean", features: str = "width", decoding: str = "flat",
                 dropout: float = 0.1, activation: str = "gelu", init_std: float = 0.02) -> None:
        """
        Args:
            d_model: D.
            labels: the K label names (span types, without a "none" entry).
            max_span_width: the widest span in words.
            d_endpoint: E, default min(d_model, 128).
            d_width: width-embedding dims (Lee et al. use 20).
            pooling: "mean" or "attention", how g_ij is made.
            features: "width" ([s_i; e_j; g_ij; phi(j - i)]) or "lecture" ([s_i; e_j; g_ij], no width embedding).
            decoding: what ``decode`` returns by default: "flat" or "nested" spans.
            dropout: on the word vectors and the classifier's hidden layer.
            activation: name in ``lmforge.nn.feedforward.ACTIVATIONS``.
            init_std: standard deviation of the weights' normal initialisation.
        """
        super().__init__()
        if isinstance(labels, str) or not labels or not all(isinstance(x, str) for x in labels) \
                or len(set(labels)) != len(labels):
            raise LmforgeError(f"labels must be a non-empty list of distinct span type names; got {labels!r}")
        if max_span_width < 1:
            raise LmforgeError(f"max_span_width must be >= 1, got {max_span_width}")
        if pooling not in SPAN_POOLINGS:
            raise LmforgeError(f"unknown span pooling {pooling!r}; choose one of {', '.join(SPAN_POOLINGS)}")
        if features not in SPAN_FEATURES:
            raise LmforgeError(f"unknown span features {features!r}; choose one of {', '.join(SPAN_FEATURES)}")
        if decoding not in SPAN_DECODINGS:
            raise LmforgeError(f"unknown span decoding {decoding!r}; choose one of {', '.join(SPAN_DECODINGS)}")
        if activation not in ACTIVATIONS:
            raise LmforgeError(f"unknown activation {activation!r}; choose one of {', '.join(ACTIVATIONS)}")
        if not 0.0 <= dropout < 1.0:
            raise LmforgeError(f"dropout must be in [0, 1); got {dropout}")
        E = min(d_model, 128) if d_endpoint is None else d_endpoint
        if E < 1 or d_width < 1:
            raise LmforgeError(f"d_endpoint and d_width must be >= 1; got {E} and {d_width}")
        self.labels = list(labels)
        self.max_span_width, self.pooling = max_span_width, pooling
        self.features, self.decoding = features, decoding
        self.activation = ACTIVATIONS[activation]
        self.dropout = Dropout(dropout)
        self.start_proj = nn.Linear(d_model, E)
        self.end_proj = nn.Linear(d_model, E)
        self.width = nn.Embedding(max_span_width, d_width) if features == "width" else None
        self.scorer = nn.Linear(d_model, 1) if pooling == "attention" else None
        self.hidden = nn.Linear(2 * E + d_model + (d_width if features == "width" else 0), d_model)
        self.output = nn.Linear(d_model, len(self.labels) + 1)
        for module in self.modules():
            if isinstance(module, nn.Linear | nn.Embedding):
                nn.init.normal_(module.weight, std=init_std)
            if isinstance(module, nn.Linear):
                nn.init.zeros_(module.bias)

    def forward(self, out: Any, word_starts: Tensor, word_mask: Tensor,
                span_labels: Tensor | None = None) -> SpanClassificationOutput:
        """
        Args:
            out: the backbone's output (uses ``last_hidden_state`` (B, T, D)).
            word_starts: (B, W) long, position of each word's first sub-word (0 at padding).
            word_mask: (B, W) bool, True for real words (a prefix of each row).
            span_labels: (B, S) class ids over ``enumerate_spans(n_words_b, max_span_width)`` (0 = none),
                -100 at padding; S = ``count_spans(max n_words, max_span_width)``.

        Returns:
            SpanClassificationOutput(span_logits (B, S, C), span_mask (B, S), spans (B, S, 2), loss_sum,
            loss_count).
        """
        hidden = out.last_hidden_state  # (B, T, D)
        B, T, D = hidden.shape
        self._check(word_starts, word_mask, B, T)
        W = word_starts.shape[1]
        h = self.dropout(hidden.gather(1, word_starts.unsqueeze(2).expand(B, W, D)))  # (B, W, D) first sub-words
        n_words = word_mask.sum(1)  # (B,)
        M = self.max_span_width
        S = count_spans(int(n_words.max()) if B else 0, M)
        spans = torch.tensor(enumerate_spans(int(n_words.max()) if B else 0, M), dtype=torch.long,
                             device=hidden.device).reshape(S, 2)  # (S, 2)
        m = n_words.clamp(max=M)
        span_mask = torch.arange(S, device=hidden.device) < (m * n_words - m * (m - 1) // 2).unsqueeze(1)  # (B, S)
        i, j = spans[:, 0], spans[:, 1]  # (S,)

        if self.scorer is None:
            g = mean_pool(h, spans)  # (B, S, D)
        else:
            g, _ = attention_pool(h, self.scorer(h).squeeze(2), spans, M)  # (B, S, D)
        parts = [self.activation(self.start_proj(h))[:, i],  # (B, S, E)
                 self.activation(self.end_proj(h))[:, j],  # (B, S, E)
                 g]  # (B, S, D)
        if self.width is not None:
            parts.append(self.width(j - i).expand(B, S, -1))  # (B, S, d_width)
        x = torch.cat(parts, dim=-1)  # (B, S, 2E + D [+ d_width])
        logits = self.output(self.dropout(self.activation(self.hidden(x))))  # (B, S, C)

        loss_sum = loss_count = None
        if span_labels is not None:
            if tuple(span_labels.shape) != (B, S):
                raise LmforgeError(f"span_labels must be (batch={B}, spans={S}), one column per span of "
                                   f"enumerate_spans(max n_words, {M}); got {tuple(span_labels.shape)} (build them "
                                   "with featurize_spans and collate_spans)")
            targets = span_labels.masked_fill(~span_mask, IGNORE_INDEX)
            C = logits.shape[-1]
            bad = (targets != IGNORE_INDEX) & ((targets < 0) | (targets >= C))
            if bool(bad.any()):
                raise LmforgeError(f"span label {int(targets[bad][0])} is outside [0, {C}) (0 = none, k + 1 = "
                                   f"labels[k] for {C - 1} labels)")
            loss_sum = F.cross_entropy(logits.reshape(-1, C).float(), targets.reshape(-1), ignore_index=IGNORE_INDEX,
                                       reduction="sum")
            loss_count = (targets != IGNORE_INDEX).sum()
        return SpanClassificationOutput(logits, span_mask, spans.expand(B, S, 2), loss_sum, loss_count)

    @staticmethod
    def _check(word_starts: Tensor, word_mask: Tensor, B: int, T: int) -> None:
        if word_starts.dim() != 2 or word_starts.shape[0] != B or word_starts.is_floating_point():
            raise LmforgeError(f"word_starts must be (batch={B}, words) integer positions; got "
                               f"{tuple(word_starts.shape)} {word_starts.dtype}")
        if word_mask.shape != word_starts.shape or word_mask.dtype != torch.bool:
            raise LmforgeError(f"word_mask must be a bool tensor shaped like word_starts {tuple(word_starts.shape)}; "
                               f"got {tuple(word_mask.shape)} {word_mask.dtype}")
        if word_starts.numel() and (int(word_starts.min()) < 0 or int(word_starts.max()) >= T):
            raise LmforgeError(f"word_starts must be positions in [0, {T}); got values from {int(word_starts.min())} "
                               f"to {int(word_starts.max())}")
        if word_mask.shape[1] > 1 and bool((word_mask[:, 1:] & ~word_mask[:, :-1]).any()):
            raise LmforgeError("word_mask must mark a prefix of each row as real words")

    @torch.no_grad()
    def decode(self, output: SpanClassificationOutput,
               decoding: str | None = None) -> list[list[tuple[int, int, str]]]:
        """Spans per sentence, greedily by probability.

        Every span whose best class is not "none" is a candidate, scored by that class's probability; from the
        highest score down (ties: earlier start, then shorter span first), a candidate is kept unless, with
        "flat" decoding, it overlaps a kept span (nested entities are never returned) or, with "nested"
        decoding, it crosses a kept span (overlaps it without either containing the other); see
        ``select_spans``.

        Args:
            output: what ``forward`` returned.
            decoding: "flat" or "nested"; default the head's ``decoding``.

        Returns:
            B lists of (start, end EXCLUSIVE, label), sorted by start.
        """
        decoding = self.decoding if decoding is None else decoding
        probs, best = output.span_logits.float().softmax(-1).max(-1)  # (B, S), (B, S)
        candidate = output.span_mask & (best != 0)
        result = []
        for b in range(best.shape[0]):
            picks = candidate[b].nonzero().squeeze(1).tolist()
            spans = [tuple(s) for s in output.spans[b, picks].tolist()]
            score, cls = probs[b, picks].tolist(), best[b, picks].tolist()
            kept = select_spans(spans, score, decoding)
            result.append(sorted((spans[k][0], spans[k][1] + 1, self.labels[cls[k] - 1]) for k in kept))
        return result

    def extra_repr(self) -> str:
        return (f"labels={len(self.labels)}, max_span_width={self.max_span_width}, pooling={self.pooling!r}, "
                f"features={self.features!r}, decoding={self.decoding!r}")


def build_span_head(config: ModelConfig, backbone: nn.Module, *, labels: Sequence[str], max_span_width: int = 8,
                    pooling: str = "mean", d_endpoint: int | None = None, features: str = "width",
                    decoding: str = "flat", dropout: float | None = None) -> SpanClassificationHead:
    """The ``{"type": "span_classification", "labels": [...], ...}`` builder of ``lmforge.heads.build_head``.

    Args:
        config: uses d_model, dropout (unless ``dropout`` is given), activation and init_std.
        backbone: unused (the head reads hidden states only).
        labels: span type names (class k + 1 = labels[k]; class 0 = none).
        max_span_width, pooling, d_endpoint, features, decoding: see ``SpanClassificationHead``; a saved head
            without ``features`` / ``decoding`` (folders from before these options) is "width" / "flat".
        dropout: default ``config.dropout``.
    """
    return SpanClassificationHead(config.d_model, labels, max_span_width=max_span_width, d_endpoint=d_endpoint,
                                  pooling=pooling, features=features, decoding=decoding,
                                  dropout=config.dropout if dropout is None else dropout,
                                  activation=config.activation, init_std=config.init_std)

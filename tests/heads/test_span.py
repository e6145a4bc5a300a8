"""Span classification head: enumeration, pooling, greedy flat and nested decoding, span features, padding
invariance, training."""

from __future__ import annotations

from typing import NamedTuple

import pytest
import torch

from lmforge.config import ModelConfig
from lmforge.data.token_features import collate_spans, featurize_spans
from lmforge.errors import LmforgeError
from lmforge.heads.base import TaskModel
from lmforge.heads.span import (
    SpanClassificationHead,
    SpanClassificationOutput,
    attention_pool,
    build_span_head,
    count_spans,
    enumerate_spans,
    mean_pool,
    select_spans,
)
from lmforge.models.encoder import Encoder
from lmforge.tokenizers import WordPieceTokenizer

B, W, D = 3, 7, 12
LABELS = ["PER", "LOC"]


class Out(NamedTuple):
    last_hidden_state: torch.Tensor


@pytest.mark.parametrize("n,width", [(0, 3), (1, 3), (5, 1), (5, 3), (7, 8), (9, 4)])
def test_enumeration_width_limit_count_and_prefix(n: int, width: int) -> None:
    spans = enumerate_spans(n, width)
    brute = {(i, j) for i in range(n) for j in range(i, n) if j - i + 1 <= width}
    assert set(spans) == brute and len(spans) == len(brute) == count_spans(n, width)
    assert spans == sorted(spans, key=lambda s: (s[1], s[0]))
    assert enumerate_spans(n + 1, width)[:len(spans)] == spans  # a batch shares one table


def test_mean_pool_equals_a_loop() -> None:
    h = torch.randn(B, W, D)
    spans = torch.tensor(enumerate_spans(W, 4))
    pooled = mean_pool(h, spans)
    for s, (i, j) in enumerate(spans.tolist()):
        torch.testing.assert_close(pooled[:, s], h[:, i:j + 1].mean(1))


def test_attention_pool_weights_stay_inside_each_span() -> None:
    g = torch.Generator().manual_seed(0)
    h, scores = torch.randn(B, W, D, generator=g), torch.randn(B, W, generator=g) * 3
    spans = torch.tensor(enumerate_spans(W, 3))
    pooled, weights = attention_pool(h, scores, spans, 3)
    for s, (i, j) in enumerate(spans.tolist()):
        inside = torch.zeros(W, dtype=torch.bool)
        inside[i:j + 1] = True
        torch.testing.assert_close(weights[:, s].sum(-1), torch.ones(B))
        assert float(weights[:, s, ~inside].abs().sum()) == 0.0
        want = scores[:, i:j + 1].softmax(-1)  # Lee et al.: softmax over the span's words only
        torch.testing.assert_close(weights[:, s, i:j + 1], want)
        torch.testing.assert_close(pooled[:, s], (want.unsqueeze(2) * h[:, i:j + 1]).sum(1))
    # Changing words outside a span does not change its vector.
    h2, scores2 = h.clone(), scores.clone()
    h2[:, 4:] += 100
    scores2[:, 4:] -= 50
    s = enumerate_spans(W, 3).index((1, 3))
    torch.testing.assert_close(attention_pool(h2, scores2, spans, 3)[0][:, s], pooled[:, s])


def output_from(probabilities: dict[tuple[int, int], tuple[int, float]], n_words: int,
                width: int = 3) -> SpanClassificationOutput:
    """One sentence whose span (i, j) has class c with probability p; every other span is "none"."""
    spans = enumerate_spans(n_words, width)
    probs = torch.full((1, len(spans), len(LABELS) + 1), 0.01)
    probs[0, :, 0] = 0.98
    for (i, j), (c, p) in probabilities.items():
        k = spans.index((i, j))
        probs[0, k] = (1 - p) / len(LABELS)
        probs[0, k, c] = p
    mask = torch.ones(1, len(spans), dtype=torch.bool)
    return SpanClassificationOutput(probs.log(), mask, torch.tensor(spans).unsqueeze(0))


def test_greedy_decoding_prefers_higher_scores_and_never_overlaps() -> None:
    head = SpanClassificationHead(D, LABELS, max_span_width=3)
    out = output_from({(0, 1): (1, 0.6), (1, 2): (2, 0.9), (3, 3): (1, 0.5), (3, 5): (2, 0.7), (5, 5): (1, 0.4),
                       (6, 6): (2, 0.8)}, n_words=7)
    # (1,2) beats the overlapping (0,1); (3,5) beats (3,3) and (5,5); (6,6) is free. Ends are exclusive.
    assert head.decode(out) == [[(1, 3, "LOC"), (3, 6, "LOC"), (6, 7, "LOC")]]
    out = output_from({(0, 1): (1, 0.95), (1, 2): (2, 0.9)}, n_words=4)
    assert head.decode(out) == [[(0, 2, "PER")]]


def test_greedy_decoding_random_outputs_are_flat() -> None:
    head = SpanClassificationHead(D, LABELS, max_span_width=4)
    g = torch.Generator().manual_seed(1)
    spans = enumerate_spans(9, 4)
    for _ in range(20):
        logits = torch.randn(2, len(spans), 3, generator=g) * 3
        mask = torch.arange(len(spans)) < torch.tensor([[len(spans)], [count_spans(5, 4)]])
        out = SpanClassificationOutput(logits, mask, torch.tensor(spans).expand(2, -1, -1))
        for row, n in zip(head.decode(out), [9, 5], strict=True):
            covered = [w for start, end, _ in row for w in range(start, end)]
            assert len(covered) == len(set(covered)) and all(w < n for w in covered)
            assert row == sorted(row)


def test_nested_decoding_keeps_spans_that_nest() -> None:
    # "[[New York] University]": ORG (0..2) holds LOC (0..1); a PER elsewhere; (2,3) crosses the ORG.
    head = SpanClassificationHead(D, LABELS + ["ORG"], max_span_width=3, decoding="nested")
    probabilities = {(0, 2): (3, 0.9), (0, 1): (2, 0.8), (1, 1): (2, 0.6), (4, 4): (1, 0.7), (2, 3): (2, 0.5)}
    spans = enumerate_spans(6, 3)
    probs = torch.full((1, len(spans), 4), 0.01)
    probs[0, :, 0] = 0.97
    for (i, j), (c, p) in probabilities.items():
        k = spans.index((i, j))
        probs[0, k] = (1 - p) / 3
        probs[0, k, c] = p
    out = SpanClassificationOutput(probs.log(), torch.ones(1, len(spans), dtype=torch.bool),
                                   torch.tensor(spans).unsqueeze(0))
    # nested: ORG, the LOC inside it and the LOC inside that; the crossing (2,3) loses to the higher ORG
    assert head.decode(out) == [[(0, 2, "LOC"), (0, 3, "ORG"), (1, 2, "LOC"), (4, 5, "PER")]]
    # flat (the same output): only the best of the overlapping group
    assert head.decode(out, "flat") == [[(0, 3, "ORG"), (4, 5, "PER")]]


def test_nested_decoding_resolves_a_crossing_pair_by_score() -> None:
    head = SpanClassificationHead(D, LABELS, max_span_width=3, decoding="nested")
    # (0,1) and (1,2) cross: the higher score stays, whichever it is; (1,1) nests in both and stays
    out = output_from({(0, 1): (1, 0.6), (1, 2): (2, 0.9), (1, 1): (1, 0.5)}, n_words=4)
    assert head.decode(out) == [[(1, 2, "PER"), (1, 3, "LOC")]]
    out = output_from({(0, 1): (1, 0.95), (1, 2): (2, 0.9), (1, 1): (1, 0.5)}, n_words=4)
    assert head.decode(out) == [[(0, 2, "PER"), (1, 2, "PER")]]
    # a crossing span loses to the kept one even when it would nest with a third
    assert select_spans([(0, 2), (2, 4), (3, 4)], [0.9, 0.8, 0.7], "nested") == [0, 2]
    assert select_spans([(0, 2), (2, 4), (3, 4)], [0.9, 0.8, 0.7], "flat") == [0, 2]
    with pytest.raises(LmforgeError, match="unknown span decoding"):
        select_spans([(0, 0)], [1.0], "overlapping")


def test_flat_decoding_is_unchanged_and_the_default() -> None:
    out = output_from({(0, 1): (1, 0.6), (1, 2): (2, 0.9), (3, 3): (1, 0.5), (3, 5): (2, 0.7), (5, 5): (1, 0.4),
                       (6, 6): (2, 0.8)}, n_words=7)
    flat = [[(1, 3, "LOC"), (3, 6, "LOC"), (6, 7, "LOC")]]
    assert SpanClassificationHead(D, LABELS, max_span_width=3).decode(out) == flat
    assert SpanClassificationHead(D, LABELS, max_span_width=3, decoding="nested").decode(out, "flat") == flat
    # nested keeps (3,3) and (5,5) inside (3,5); (0,1) crosses (1,2) and stays out
    assert SpanClassificationHead(D, LABELS, max_span_width=3).decode(out, "nested") == [
        [(1, 3, "LOC"), (3, 4, "PER"), (3, 6, "LOC"), (5, 6, "PER"), (6, 7, "LOC")]]


def test_nested_decoding_random_outputs_never_cross_and_drop_only_crossing_spans() -> None:
    head = SpanClassificationHead(D, LABELS, max_span_width=4, decoding="nested")
    g = torch.Generator().manual_seed(2)
    spans = enumerate_spans(9, 4)
    for _ in range(20):
        logits = torch.randn(2, len(spans), 3, generator=g) * 3
        mask = torch.arange(len(spans)) < torch.tensor([[len(spans)], [count_spans(5, 4)]])
        out = SpanClassificationOutput(logits, mask, torch.tensor(spans).expand(2, -1, -1))
        probs, best = logits.softmax(-1).max(-1)
        for b, (row, n) in enumerate(zip(head.decode(out), [9, 5], strict=True)):
            assert row == sorted(row) and all(end <= n for _, end, _ in row)
            kept = [(s, e - 1) for s, e, _ in row]
            for a in kept:
                for c in kept:
                    assert not (a[0] < c[0] <= a[1] < c[1])  # no crossing pair
            for k in (mask[b] & (best[b] != 0)).nonzero().squeeze(1).tolist():
                if spans[k] not in kept:  # a dropped candidate crosses a kept span scored at least as high
                    assert any((a[0] < spans[k][0] <= a[1] < spans[k][1] or spans[k][0] < a[0] <= spans[k][1] < a[1])
                               and float(probs[b, spans.index(a)]) >= float(probs[b, k]) for a in kept)


@pytest.mark.parametrize("features", ["width", "lecture"])
def test_span_features_choose_the_representation(features: str) -> None:
    torch.manual_seed(0)
    head = SpanClassificationHead(D, LABELS, max_span_width=3, d_endpoint=5, d_width=4, features=features,
                                  dropout=0.0)
    keys = set(head.state_dict())
    assert ("width.weight" in keys) == (features == "width")
    assert keys - {"width.weight"} == {"start_proj.weight", "start_proj.bias", "end_proj.weight", "end_proj.bias",
                                       "hidden.weight", "hidden.bias", "output.weight", "output.bias"}
    # [s_i; e_j; g_ij] (+ phi(j - i)): 2E + D (+ d_width) inputs to the classifier
    assert head.hidden.in_features == 2 * 5 + D + (4 if features == "width" else 0)
    hidden, starts = torch.randn(1, 6, D), torch.tensor([[1, 2, 3, 4]])
    out = head(Out(hidden), starts, starts > 0, torch.zeros(1, count_spans(4, 3), dtype=torch.long))
    out.loss_sum.backward()
    assert all(p.grad is not None for p in head.parameters())
    with pytest.raises(LmforgeError, match="unknown span features"):
        SpanClassificationHead(D, LABELS, features="lee")


def test_a_head_spec_without_features_builds_the_width_head() -> None:
    from lmforge.heads import build_head

    config = ModelConfig(vocab_size=len(VOCAB), d_model=D, n_heads=2, n_layers=1, d_ff=24, max_seq_len=16)
    old = build_head({"type": "span_classification", "labels": LABELS, "max_span_width": 3}, config, None)
    assert old.features == "width" and old.decoding == "flat"
    torch.manual_seed(0)
    width = build_head({"type": "span_classification", "labels": LABELS, "max_span_width": 3, "features": "width",
                        "decoding": "nested"}, config, None)
    torch.manual_seed(0)
    lecture = build_head({"type": "span_classification", "labels": LABELS, "max_span_width": 3,
                          "features": "lecture"}, config, None)
    assert set(width.state_dict()) == set(old.state_dict())
    assert set(lecture.state_dict()) == set(old.state_dict()) - {"width.weight"}
    assert width.decoding == "nested" and lecture.features == "lecture"


@pytest.mark.parametrize("pooling", ["mean", "attention"])
def test_forward_shapes_loss_and_padding_invariance(pooling: str) -> None:
    torch.manual_seed(0)
    head = SpanClassificationHead(D, LABELS, max_span_width=3, pooling=pooling, d_endpoint=5, dropout=0.0).eval()
    hidden = torch.randn(2, 9, D)
    word_starts = torch.tensor([[1, 2, 4, 5, 6, 7], [1, 3, 4, 0, 0, 0]])
    word_mask = word_starts > 0
    S = count_spans(6, 3)
    span_labels = torch.randint(0, 3, (2, S))
    span_labels[1, count_spans(3, 3):] = -100
    with torch.no_grad():
        out = head(Out(hidden), word_starts, word_mask, span_labels)
        alone = head(Out(hidden[1:, :5]), word_starts[1:, :3], word_mask[1:, :3])
    assert out.span_logits.shape == (2, S, 3) and out.spans.shape == (2, S, 2)
    assert out.span_mask.sum(1).tolist() == [S, count_spans(3, 3)]
    assert int(out.loss_count) == S + count_spans(3, 3)
    want = torch.nn.functional.cross_entropy(out.span_logits[out.span_mask], span_labels[out.span_mask],
                                             reduction="sum")
    assert float(out.loss_sum) == pytest.approx(float(want), rel=1e-5)
    torch.testing.assert_close(alone.span_logits[0], out.span_logits[1, :count_spans(3, 3)])
    assert ("scorer.weight" in head.state_dict()) == (pooling == "attention")


def test_errors() -> None:
    head = SpanClassificationHead(D, LABELS, max_span_width=2)
    hidden, starts = torch.randn(1, 5, D), torch.tensor([[1, 2, 3]])
    with pytest.raises(LmforgeError, match="span_labels must be"):
        head(Out(hidden), starts, starts > 0, torch.zeros(1, 4, dtype=torch.long))
    with pytest.raises(LmforgeError, match="word_starts must be positions"):
        head(Out(hidden), torch.tensor([[1, 2, 9]]), starts > 0)
    with pytest.raises(LmforgeError, match="span label 3 is outside"):
        head(Out(hidden), starts, starts > 0, torch.full((1, count_spans(3, 2)), 3))
    with pytest.raises(LmforgeError, match="unknown span pooling"):
        SpanClassificationHead(D, LABELS, pooling="max")
    with pytest.raises(LmforgeError, match="distinct"):
        SpanClassificationHead(D, ["PER", "PER"])


# ---------------------------------------------------------------------------------------------- training
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "john", "smith", "mary", "jo", "##nes", "went", "to",
         "lon", "##don", "par", "##is", "new", "york", "visited", "and", "the", "city", "of", "."]
TRAIN = [
    (["John", "Smith", "went", "to", "London"], [(0, 2, "PER"), (4, 5, "LOC")]),
    (["Mary", "Jones", "visited", "New", "York"], [(0, 2, "PER"), (3, 5, "LOC")]),
    (["Mary", "went", "to", "the", "city", "of", "Paris"], [(0, 1, "PER"), (6, 7, "LOC")]),
    (["London", "and", "Paris", "."], [(0, 1, "LOC"), (2, 3, "LOC")]),
    (["John", "visited", "Mary", "Jones", "."], [(0, 1, "PER"), (2, 4, "PER")]),
    (["Jones", "went", "to", "New", "York"], [(0, 1, "PER"), (3, 5, "LOC")]),
]


@pytest.mark.parametrize(("pooling", "features"), [("mean", "width"), ("attention", "width"), ("mean", "lecture")])
def test_tiny_model_learns_a_toy_span_task(pooling: str, features: str) -> None:
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=len(VOCAB), d_model=12, n_heads=2, n_layers=2, d_ff=37, max_seq_len=32,
                         dropout=0.0, attention_dropout=0.0)
    model = TaskModel(Encoder(config), build_span_head(config, None, labels=LABELS, max_span_width=3,
                                                       pooling=pooling, features=features))
    features, _, too_wide = featurize_spans(TRAIN, WordPieceTokenizer(VOCAB), {"PER": 0, "LOC": 1}, 32, 3)
    assert too_wide == 0
    batch = collate_spans(features, 0)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(100):
        out = model(**batch)
        optimizer.zero_grad()
        (out.loss_sum / out.loss_count).backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        assert model.head.decode(model(**batch)) == [sorted(spans) for _, spans in TRAIN]

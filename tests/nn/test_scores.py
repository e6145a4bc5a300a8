"""Scoring functions against their formulas, computed independently with loops and hand-set weights."""

from __future__ import annotations

import math

import pytest
import torch

from lmforge.errors import LmforgeError
from lmforge.nn import (
    SCORES,
    AdditiveScore,
    CosineScore,
    DotScore,
    GeneralScore,
    LocationScore,
    ScaledDotScore,
    make_score,
    math_attention,
)

Q = [[1.0, 2.0, -1.0], [0.5, 0.0, 2.0]]  # 2 queries, width 3
K = [[1.0, 0.0, 1.0], [-2.0, 1.0, 0.5], [0.0, 3.0, -1.0], [1.0, 1.0, 1.0]]  # 4 keys, width 3


def _dot(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


def _t(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


def test_thinking_machines_scaled_dot_product():
    # The lecture's example: q.k1 = 112, q.k2 = 96, d_k = 64 -> scaled 14 and 12 -> softmax 0.88 / 0.12.
    q = torch.full((1, 64), 2.0, dtype=torch.float64)
    k = torch.stack([torch.full((64,), 112 / 128), torch.full((64,), 96 / 128)]).double()  # (2, 64)
    assert (q @ k.T).tolist() == [[112.0, 96.0]]
    scores = ScaledDotScore()(q, k)
    assert scores.tolist() == [[14.0, 12.0]]
    weights = scores.softmax(-1)
    assert weights[0, 0].item() == pytest.approx(0.88, abs=0.005)
    assert weights[0, 1].item() == pytest.approx(0.12, abs=0.005)
    assert weights[0, 0].item() == pytest.approx(1 / (1 + math.exp(-2)), rel=1e-12)
    # The same numbers through the attention kernel: output = 0.8808 v1 + 0.1192 v2.
    v = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    out = math_attention(q[None, None], k[None, None], v[None, None], None, 0.0, False, None)
    torch.testing.assert_close(out[0, 0, 0], weights[0])


def test_dot_score():
    got = DotScore()(_t(Q), _t(K))
    expected = [[_dot(q, k) for k in K] for q in Q]
    torch.testing.assert_close(got, _t(expected))


def test_scaled_dot_score():
    got = ScaledDotScore()(_t(Q), _t(K))
    expected = [[_dot(q, k) / math.sqrt(3) for k in K] for q in Q]
    torch.testing.assert_close(got, _t(expected))


def test_general_score():
    # W (Dq=3, Dk=2): score = sum_ij q_i W_ij k_j.
    W = [[1.0, -1.0], [0.5, 2.0], [0.0, 3.0]]
    keys = [[1.0, 2.0], [-1.0, 0.5], [2.0, 0.0]]
    score = GeneralScore(3, 2).double()
    with torch.no_grad():
        score.weight.copy_(_t(W))
    expected = [[sum(q[i] * W[i][j] * k[j] for i in range(3) for j in range(2)) for k in keys] for q in Q]
    torch.testing.assert_close(score(_t(Q), _t(keys)), _t(expected))


def test_additive_score_with_different_widths_and_lengths():
    # Dq=3, Dk=2, A=2: score = v . tanh(Wq q + Wk k).
    Wq = [[1.0, 0.0, -1.0], [0.5, 0.5, 0.5]]
    Wk = [[2.0, -1.0], [0.0, 1.0]]
    v = [1.5, -0.5]
    keys = [[1.0, 2.0], [-1.0, 0.5], [2.0, 0.0]]
    score = AdditiveScore(3, 2, 2).double()
    with torch.no_grad():
        score.query_proj.weight.copy_(_t(Wq))
        score.key_proj.weight.copy_(_t(Wk))
        score.v.weight.copy_(_t([v]))
    expected = []
    for q in Q:
        row = []
        for k in keys:
            hidden = [math.tanh(_dot(Wq[a], q) + _dot(Wk[a], k)) for a in range(2)]
            row.append(_dot(v, hidden))
        expected.append(row)
    got = score(_t(Q), _t(keys))
    assert got.shape == (2, 3)
    torch.testing.assert_close(got, _t(expected))
    # Batched leading dims broadcast the same way.
    got_b = score(_t(Q).expand(4, 2, 3), _t(keys).expand(4, 3, 2))
    torch.testing.assert_close(got_b, _t(expected).expand(4, 2, 3))


def test_cosine_score():
    got = CosineScore()(_t(Q), _t(K))
    expected = [[_dot(q, k) / math.sqrt(_dot(q, q) * _dot(k, k)) for k in K] for q in Q]
    torch.testing.assert_close(got, _t(expected))
    torch.testing.assert_close(CosineScore(scale=5.0)(_t(Q), _t(K)), 5.0 * _t(expected))


def test_location_score_depends_only_on_the_query():
    # W_a (L=5, Dq=3); scores for Tk=4 keys are the first 4 entries of W_a q.
    W = [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [1.0, 1.0, 1.0], [2.0, 2.0, 2.0]]
    score = LocationScore(3, max_len=5).double()
    with torch.no_grad():
        score.proj.weight.copy_(_t(W))
    got = score(_t(Q), _t(K))
    expected = [[_dot(W[s], q) for s in range(4)] for q in Q]
    torch.testing.assert_close(got, _t(expected))
    torch.testing.assert_close(score(_t(Q), torch.zeros(4, 3, dtype=torch.float64)), got)  # keys' values unused
    with pytest.raises(LmforgeError, match=r"max_len=5.*6"):
        score(_t(Q), torch.zeros(6, 3, dtype=torch.float64))


def test_make_score_builds_every_entry():
    dims = {"d_q": 3, "d_k": 3, "d_attn": 4, "max_len": 4}
    for name in SCORES:
        s = make_score(name, **dims)
        assert isinstance(s, SCORES[name])
        assert s(torch.randn(2, 3), torch.randn(4, 3)).shape == (2, 4)


def test_make_score_errors_name_the_problem():
    with pytest.raises(LmforgeError, match=r"'bilinear'.*additive, dot, scaled_dot, general, cosine, location"):
        make_score("bilinear")
    with pytest.raises(LmforgeError, match="d_attn"):
        make_score("additive", d_q=3, d_k=3)
    with pytest.raises(LmforgeError, match=r"3 and 4"):
        DotScore()(torch.randn(2, 3), torch.randn(5, 4))

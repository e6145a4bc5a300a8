"""The lectures' generic Attention: soft/hard, global/local-m/local-p."""

from __future__ import annotations

import math

import pytest
import torch

from lmforge.errors import LmforgeError
from lmforge.nn import Attention, make_score


def _qkv(seed: int, B: int = 3, Tq: int = 5, Tk: int = 7, D: int = 4, Dv: int = 6):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Tq, D, generator=g, dtype=torch.float64)
    k = torch.randn(B, Tk, D, generator=g, dtype=torch.float64)
    v = torch.randn(B, Tk, Dv, generator=g, dtype=torch.float64)
    return q, k, v


def test_soft_global_attention_is_softmax_weighted_average():
    q, k, v = _qkv(0)
    am = torch.tensor([[1] * 7, [1] * 5 + [0] * 2, [1] * 3 + [0] * 4])
    res = Attention("dot")(q, k, v, attention_mask=am, need_weights=True)
    for b in range(3):
        n = int(am[b].sum())
        for t in range(5):
            scores = [float(q[b, t] @ k[b, s]) for s in range(n)]
            z = sum(math.exp(x) for x in scores)
            w = [math.exp(x) / z for x in scores] + [0.0] * (7 - n)
            torch.testing.assert_close(res.weights[b, t], torch.tensor(w, dtype=torch.float64))
            torch.testing.assert_close(res.output[b, t], sum(w[s] * v[b, s] for s in range(7)))
    assert Attention("dot")(q, k, v).weights is None  # only on request


def test_values_default_to_keys():
    q, k, _ = _qkv(1)
    attn = Attention("scaled_dot")
    torch.testing.assert_close(attn(q, k).output, attn(q, k, k).output)


def test_hard_attention_at_eval_is_one_hot_at_argmax():
    q, k, v = _qkv(2)
    soft = Attention("dot")(q, k, v, need_weights=True).weights
    hard = Attention("dot", hard=True).eval()
    res = hard(q, k, v, need_weights=True)
    idx = soft.argmax(-1)  # (B, Tq)
    expected = torch.nn.functional.one_hot(idx, 7).double()
    torch.testing.assert_close(res.weights, expected)
    torch.testing.assert_close(res.output, torch.gather(v, 1, idx[..., None].expand(3, 5, 6)))


def test_hard_attention_training_samples_with_straight_through_gradient():
    torch.manual_seed(3)
    q, k, v = _qkv(3)
    score = make_score("general", d_q=4, d_k=4).double()
    attn = Attention(score, hard=True).train()
    q.requires_grad_(True)
    res = attn(q, k, v, need_weights=True, generator=torch.Generator().manual_seed(0))
    w = res.weights.detach()
    assert torch.equal(w.sum(-1), torch.ones(3, 5, dtype=torch.float64))
    assert torch.equal(w, (w == 1).double())  # one-hot values
    again = attn(q, k, v, need_weights=True, generator=torch.Generator().manual_seed(0)).weights
    assert torch.equal(again.detach(), w)  # the generator makes sampling reproducible
    res.output.pow(2).sum().backward()
    for grad in (q.grad, score.weight.grad):
        assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0


def test_hard_attention_samples_follow_the_soft_weights():
    # One query, keys with weights ~ (0.7, 0.2, 0.1): sample frequencies match within tolerance.
    logits = torch.log(torch.tensor([[[0.7, 0.2, 0.1]]], dtype=torch.float64))  # (1, 1, 3)
    q = torch.ones(1, 1, 1, dtype=torch.float64)
    k = logits.transpose(-2, -1)  # (1, 3, 1): dot score = logits
    attn = Attention("dot", hard=True).train()
    g = torch.Generator().manual_seed(0)
    counts = torch.zeros(3, dtype=torch.float64)
    for _ in range(2000):
        counts += attn(q, k, need_weights=True, generator=g).weights.detach()[0, 0]
    torch.testing.assert_close(counts / 2000, torch.tensor([0.7, 0.2, 0.1], dtype=torch.float64), atol=0.03, rtol=0)


@pytest.mark.parametrize("D", [0, 1, 2])
def test_local_monotonic_window_zero_outside_and_renormalised_inside(D):
    q, k, v = _qkv(4, Tq=5, Tk=7)
    res = Attention("dot", window=D)(q, k, v, need_weights=True)
    w = res.weights
    for b in range(3):
        for t in range(5):  # p_t = t
            inside = [s for s in range(7) if abs(s - t) <= D]
            outside = [s for s in range(7) if s not in inside]
            assert torch.equal(w[b, t, outside], torch.zeros(len(outside), dtype=torch.float64))
            scores = torch.stack([q[b, t] @ k[b, s] for s in inside])
            torch.testing.assert_close(w[b, t, inside], scores.softmax(-1))
    # Explicit positions (e.g. one decoding step at t = 6).
    step = Attention("dot", window=1)(q[:, :1], k, v, positions=6, need_weights=True).weights
    assert torch.equal(step[..., :5], torch.zeros(3, 1, 5, dtype=torch.float64))
    torch.testing.assert_close(step.sum(-1), torch.ones(3, 1, dtype=torch.float64))


def test_local_predictive_window_and_gaussian():
    torch.manual_seed(5)
    D = 2
    q, k, v = _qkv(5, Tq=4, Tk=9)
    am = torch.tensor([[1] * 9, [1] * 6 + [0] * 3, [1] * 4 + [0] * 5])
    attn = Attention("dot", window=D, alignment="predictive", d_query=4, d_align=5).double()
    res = attn(q, k, v, attention_mask=am, need_weights=True)
    w = res.weights
    Wp, vp = attn.predictor[0].weight, attn.predictor[2].weight
    for b in range(3):
        S = int(am[b].sum())
        for t in range(4):
            p = S * torch.sigmoid(vp @ torch.tanh(Wp @ q[b, t])).item()
            mid = min(max(round(p), 0), S - 1)
            inside = [s for s in range(S) if abs(s - mid) <= D]
            outside = [s for s in range(9) if s not in inside]
            assert torch.equal(w[b, t, outside].detach(), torch.zeros(len(outside), dtype=torch.float64))
            soft = torch.stack([q[b, t] @ k[b, s] for s in inside]).softmax(-1)
            gauss = torch.tensor([math.exp(-((s - p) ** 2) / (2 * (D / 2) ** 2)) for s in inside], dtype=torch.float64)
            torch.testing.assert_close(w[b, t, inside], soft * gauss)
    res.output.sum().backward()
    assert Wp.grad is not None and torch.isfinite(Wp.grad).all() and Wp.grad.abs().sum() > 0


def test_fully_masked_generic_rows_are_zero():
    q, k, v = _qkv(6)
    am = torch.zeros(3, 7, dtype=torch.long)
    res = Attention("dot", hard=True).eval()(q, k, v, attention_mask=am, need_weights=True)
    assert torch.equal(res.output, torch.zeros_like(res.output))
    assert torch.equal(res.weights, torch.zeros_like(res.weights))


def test_generic_attention_bad_options():
    with pytest.raises(LmforgeError, match="window=-1"):
        Attention(window=-1)
    with pytest.raises(LmforgeError, match="'sideways'"):
        Attention(window=1, alignment="sideways")
    with pytest.raises(LmforgeError, match="d_query"):
        Attention(window=1, alignment="predictive")
    with pytest.raises(LmforgeError, match="window"):
        Attention(alignment="predictive", d_query=4)
    with pytest.raises(LmforgeError, match="'softmax'"):
        Attention("softmax")

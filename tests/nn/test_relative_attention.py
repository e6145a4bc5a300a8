"""Relative positional attention (Transformer-XL / XLNet): encodings, rel_shift, slow reference, memory, two
streams, Hugging Face parity, errors."""

from __future__ import annotations

import math

import pytest
import torch

from lmforge.errors import LmforgeError
from lmforge.nn.relative import RelativeMultiHeadAttention, rel_shift, relative_positions_encoding

B, T, M, D, H = 2, 3, 2, 8, 2
K = M + T
DH = D // H


def _module(seed: int = 0, **kw) -> RelativeMultiHeadAttention:
    torch.manual_seed(seed)
    m = RelativeMultiHeadAttention(D, H, segments=True, **kw).double().eval()
    with torch.no_grad():  # a non-trivial LayerNorm, so the reference checks it too
        m.layer_norm.weight.normal_(1.0, 0.2)
        m.layer_norm.bias.normal_(0.0, 0.2)
    return m


def _encoding(T_: int, K_: int, bidirectional: bool) -> torch.Tensor:
    return relative_positions_encoding(T_, K_, D, bidirectional=bidirectional, dtype=torch.float64)


# ------------------------------------------------------------------------------------------------------------------
# Encodings and rel_shift.
# ------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bidirectional", [True, False])
def test_encoding_rows_follow_the_formula(bidirectional):
    R = relative_positions_encoding(3, 5, 6, bidirectional=bidirectional, dtype=torch.float64)
    distances = list(range(5, -3, -1)) if bidirectional else list(range(5, -1, -1))
    assert R.shape == (len(distances), 6)
    for row, p in enumerate(distances):
        for i in range(3):
            f = 10000 ** (-2 * i / 6)
            assert R[row, i].item() == pytest.approx(math.sin(p * f), abs=1e-12)
            assert R[row, 3 + i].item() == pytest.approx(math.cos(p * f), abs=1e-12)


def test_encoding_clamps_distances():
    R = relative_positions_encoding(4, 6, 8, bidirectional=True, clamp_len=2, dtype=torch.float64)
    ref = relative_positions_encoding(1, 2, 8, bidirectional=True, dtype=torch.float64)  # distances 2, 1, 0
    assert torch.equal(R[0], ref[0]) and torch.equal(R[3], ref[0])  # distances 6 and 3 -> 2
    minus_two = relative_positions_encoding(3, 3, 8, bidirectional=True, dtype=torch.float64)[-1]  # distance -2
    assert torch.equal(R[-1], minus_two)  # distance -3 -> -2


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize(("T_", "M_"), [(1, 0), (4, 0), (3, 2), (2, 5)])
def test_rel_shift_equals_naive_indexing(bidirectional, T_, M_):
    K_ = M_ + T_
    R_ = K_ + T_ if bidirectional else K_ + 1
    x = torch.randn(2, 3, T_, R_)
    y = rel_shift(x, K_)
    assert y.shape == (2, 3, T_, K_)
    for i in range(T_):
        for j in range(K_):
            d = M_ + i - j  # query's absolute position minus key's
            if not bidirectional and d < 0:
                continue  # no encoding row for a later key: such keys are masked (causal)
            assert torch.equal(y[..., i, j], x[..., i, K_ - d])  # row c encodes distance K - c


def test_rel_shift_rejects_too_few_positions():
    with pytest.raises(LmforgeError, match="more relative positions than keys"):
        rel_shift(torch.zeros(1, 1, 2, 4), 4)


# ------------------------------------------------------------------------------------------------------------------
# The full attention against a slow reference.
# ------------------------------------------------------------------------------------------------------------------


def _enc(p: int) -> torch.Tensor:
    f = [10000 ** (-2 * i / D) for i in range(D // 2)]
    return torch.tensor([math.sin(p * x) for x in f] + [math.cos(p * x) for x in f], dtype=torch.float64)


def _reference(m, h, mems, allowed, diff_seg, q_in=None):
    """Explicit loops over b, head, i, j of the paper's score; q_in overrides the queries' inputs (query stream)."""
    cat = torch.cat([mems, h], 1)
    q_in = h if q_in is None else q_in
    out = torch.zeros(B, T, D, dtype=torch.float64)
    for b in range(B):
        for n in range(H):
            for i in range(T):
                q = q_in[b, i] @ m.q[:, n]  # (Dh,)
                scores = torch.full((K,), -math.inf, dtype=torch.float64)
                for j in range(K):
                    if not allowed[b, i, j]:
                        continue
                    k = cat[b, j] @ m.k[:, n]
                    r = _enc(M + i - j) @ m.r[:, n]
                    s = m.seg_embed[int(diff_seg[b, i, j]), n]
                    scores[j] = ((q + m.r_w_bias[n]) @ k + (q + m.r_r_bias[n]) @ r + (q + m.r_s_bias[n]) @ s)
                    scores[j] /= math.sqrt(DH)
                w = torch.softmax(scores, 0) if bool(allowed[b, i].any()) else torch.zeros(K, dtype=torch.float64)
                vec = sum(w[j] * (cat[b, j] @ m.v[:, n]) for j in range(K))
                out[b, i] += m.o[:, n] @ vec  # (D, Dh) @ (Dh,)
    return torch.nn.functional.layer_norm(out + q_in, (D,), m.layer_norm.weight, m.layer_norm.bias, 1e-12)


def _not_self() -> torch.Tensor:
    """(B, T, K) query i may attend every key but its own position M + i (XLNet's query stream, loosely)."""
    allowed = torch.ones(B, T, K, dtype=torch.bool)
    allowed[:, range(T), [M + i for i in range(T)]] = False
    return allowed


def _inputs(seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(B, T, D, generator=g, dtype=torch.float64)
    mems = torch.randn(B, M, D, generator=g, dtype=torch.float64)
    seg_ids = torch.tensor([[0, 0, 0, 1, 1], [0, 0, 1, 1, 1]])  # (B, K): memory then h
    diff_seg = seg_ids[:, M:, None] != seg_ids[:, None, :]  # (B, T, K)
    return h, mems, diff_seg


@pytest.mark.parametrize("bidirectional", [True, False])
def test_attention_matches_slow_reference_with_padding_and_causal_masks(bidirectional):
    m = _module()
    h, mems, diff_seg = _inputs()
    allowed = torch.ones(B, T, K, dtype=torch.bool)
    allowed[1, :, -1] = False  # row 1: the last position is padding
    if not bidirectional:
        allowed &= torch.ones(T, K, dtype=torch.bool).tril(M)  # causal: query i sees keys 0 .. M + i
    r = _encoding(T, K, bidirectional)
    with torch.no_grad():
        got = m(h, r, mems=mems, attn_mask=allowed, seg_mat=diff_seg, need_weights=True)
        want = _reference(m, h, mems, allowed, diff_seg)
    torch.testing.assert_close(got.output_h, want, rtol=1e-10, atol=1e-10)
    assert got.output_g is None and got.weights_g is None
    assert got.weights_h.shape == (B, H, T, K)
    assert bool((got.weights_h.masked_select(~allowed[:, None].expand(B, H, T, K)) == 0).all())


def test_fully_masked_query_gets_zero_weights():
    m = _module()
    h, mems, diff_seg = _inputs()
    allowed = torch.ones(B, T, K, dtype=torch.bool)
    allowed[0, 1] = False
    with torch.no_grad():
        got = m(h, _encoding(T, K, True), mems=mems, attn_mask=allowed, seg_mat=diff_seg, need_weights=True)
        want = _reference(m, h, mems, allowed, diff_seg)
    assert bool((got.weights_h[0, :, 1] == 0).all()) and bool(torch.isfinite(got.output_h).all())
    torch.testing.assert_close(got.output_h, want, rtol=1e-10, atol=1e-10)


def test_query_stream_matches_slow_reference():
    m = _module()
    h, mems, diff_seg = _inputs()
    g = torch.randn(B, T, D, dtype=torch.float64)
    allowed_g = _not_self()  # not its own position
    with torch.no_grad():
        got = m(h, _encoding(T, K, True), mems=mems, seg_mat=diff_seg, g=g, attn_mask_g=allowed_g)
        want = _reference(m, h, mems, allowed_g, diff_seg, q_in=g)
    torch.testing.assert_close(got.output_g, want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize(("bidirectional", "norm_first"), [(True, False), (False, False), (True, True)])
def test_query_stream_on_its_predicted_positions_equals_the_stream_at_all_positions(bidirectional, norm_first,
                                                                                     monkeypatch):
    """Issue 39: with a one-hot target_mapping the query stream attends from its N predicted positions only; its
    outputs and gradients equal the all-T computation (forced by disabling the one-hot path), a padding row too."""
    from lmforge.nn import relative

    m = _module(norm_first=norm_first)
    h, mems, diff_seg = _inputs()
    r = _encoding(T, K, bidirectional)
    allowed = _not_self()
    if not bidirectional:
        allowed &= torch.ones(T, K, dtype=torch.bool).tril(M)
    mapping = torch.zeros(B, 3, T, dtype=torch.float64)
    mapping[0, 0, 2], mapping[0, 1, 0], mapping[1, 0, 1] = 1.0, 1.0, 1.0  # row 1 of batch 1 and rows 2: padding
    g = torch.randn(B, 3, D, dtype=torch.float64)

    def run():
        gg = g.clone().requires_grad_(True)
        out = m(h, r, mems=mems, attn_mask=allowed, seg_mat=diff_seg, g=gg, attn_mask_g=allowed,
                target_mapping=mapping)
        (out.output_g.square().sum() + out.output_h.sum()).backward()
        grads = [p.grad.clone() for p in m.parameters()]
        m.zero_grad()
        return out.output_g.detach(), gg.grad, grads

    fast = run()
    assert relative._one_hot_rows(mapping) is not None
    monkeypatch.setattr(relative, "_one_hot_rows", lambda mapping: None)
    slow = run()
    torch.testing.assert_close(fast[0], slow[0], rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(fast[1], slow[1], rtol=1e-10, atol=1e-10)
    for a, b in zip(fast[2], slow[2], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)
    assert relative._one_hot_rows(mapping * 0.5) is None  # a row that mixes positions takes the all-T path


# ------------------------------------------------------------------------------------------------------------------
# Memory and the two streams.
# ------------------------------------------------------------------------------------------------------------------


def test_no_gradient_reaches_the_memory():
    m = _module()
    h, mems, _ = _inputs()
    h.requires_grad_(True)
    mems.requires_grad_(True)  # even if the caller forgets to detach
    out = m(h, _encoding(T, K, True), mems=mems).output_h
    out.square().sum().backward()
    assert mems.grad is None
    assert h.grad is not None and bool(h.grad.abs().sum() > 0)
    assert m.k.grad is not None


def test_query_stream_does_not_see_its_own_content():
    m = _module()
    h, mems, _ = _inputs()
    g = torch.randn(B, T, D, dtype=torch.float64)
    allowed_g = _not_self()  # query i may not see key M + i
    r = _encoding(T, K, True)
    i = 1
    h2 = h.clone()
    h2[:, i] += 1.0
    with torch.no_grad():
        a = m(h, r, mems=mems, g=g, attn_mask_g=allowed_g)
        b = m(h2, r, mems=mems, g=g, attn_mask_g=allowed_g)
    assert torch.equal(a.output_g[:, i], b.output_g[:, i])  # the query stream at i never saw h_i
    assert not torch.allclose(a.output_g[:, 0], b.output_g[:, 0])  # others do
    assert not torch.allclose(a.output_h[:, i], b.output_h[:, i])  # the content stream sees itself


# ------------------------------------------------------------------------------------------------------------------
# Parity with Hugging Face's XLNetRelativeAttention and XLNetModel.relative_positional_encoding.
# ------------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hf():
    pytest.importorskip("transformers")
    from transformers import XLNetConfig
    from transformers.models.xlnet import modeling_xlnet

    config = XLNetConfig(vocab_size=11, d_model=16, n_layer=1, n_head=2, d_head=8, d_inner=32)
    return config, modeling_xlnet


@pytest.mark.parametrize(("attn_type", "clamp_len"), [("bi", -1), ("uni", -1), ("bi", 3)])
def test_encoding_matches_hf(hf, attn_type, clamp_len):
    config, modeling = hf
    config.attn_type, config.clamp_len = attn_type, clamp_len
    model = modeling.XLNetModel(config)
    want = model.relative_positional_encoding(4, 7)[:, 0]  # (R, 1, D) -> (R, D)
    got = relative_positions_encoding(4, 7, 16, bidirectional=attn_type == "bi",
                                      clamp_len=clamp_len if clamp_len > 0 else None)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    x = torch.randn(2, 2, 4, want.shape[0])
    assert torch.equal(rel_shift(x, 7), modeling.XLNetRelativeAttention.rel_shift_bnij(x, klen=7))


@pytest.mark.parametrize("mapped", [True, False])
def test_two_streams_match_hf(hf, mapped):
    config, modeling = hf
    config.attn_type, config.clamp_len = "bi", -1
    torch.manual_seed(0)
    theirs = modeling.XLNetRelativeAttention(config).eval()
    with torch.no_grad():
        for p in theirs.parameters():
            p.normal_(0.0, 0.3)
    ours = RelativeMultiHeadAttention(16, 2, segments=True, layer_norm_eps=config.layer_norm_eps).eval()
    ours.load_state_dict(theirs.state_dict())  # same names and shapes: conversion is a copy

    b, t, mlen, d = 2, 5, 3, 16
    klen = mlen + t
    h, mems = torch.randn(b, t, d), torch.randn(b, mlen, d)
    # Permutation masks as XLNet builds them: each row's factorisation order; the query stream sees the tokens
    # earlier in the order, the content stream also itself; the memory is visible to all.
    rank = torch.stack([torch.randperm(t) for _ in range(b)])  # (B, T) place of each position in the order
    blocked = rank[:, None, :] >= rank[:, :, None]  # (B, T, T) query i may not see j
    see_g = torch.cat([torch.ones(b, t, mlen, dtype=torch.bool), ~blocked], -1)  # (B, T, K)
    see_h = see_g | torch.cat([torch.zeros(t, mlen, dtype=torch.bool), torch.eye(t, dtype=torch.bool)], -1)
    tt = torch.tensor([[0, 0, 1, 1, 1], [0, 1, 1, 1, 1]])
    cat_ids = torch.cat([torch.zeros(b, mlen, dtype=torch.long), tt], 1)
    diff_seg = tt[:, :, None] != cat_ids[:, None, :]  # (B, T, K)
    if mapped:  # predict the last 2 positions of each order
        n = 2
        targets = torch.stack([torch.argsort(rank[i])[-n:] for i in range(b)])  # (B, N)
        target_mapping = torch.nn.functional.one_hot(targets, t).float()  # (B, N, T)
    else:
        n, target_mapping = t, None
    g = torch.randn(b, n, d)
    r = relative_positions_encoding(t, klen, d, bidirectional=True)

    with torch.no_grad():
        got = ours(h, r, mems=mems, attn_mask=see_h, seg_mat=diff_seg, g=g, attn_mask_g=see_g,
                   target_mapping=target_mapping, need_weights=True)
        want_h, want_g, (prob_h, prob_g) = theirs(
            h.transpose(0, 1), g.transpose(0, 1),
            attn_mask_h=(~see_h).permute(1, 2, 0)[..., None].float(),  # (T, K, B, 1), 1 = may not attend
            attn_mask_g=(~see_g).permute(1, 2, 0)[..., None].float(),
            r=r[:, None].expand(-1, b, -1), seg_mat=torch.nn.functional.one_hot(
                diff_seg.permute(1, 2, 0).long(), 2).float(),  # (T, K, B, 2)
            mems=mems.transpose(0, 1),
            target_mapping=None if target_mapping is None else target_mapping.permute(1, 2, 0),  # (N, T, B)
            output_attentions=True)
    torch.testing.assert_close(got.output_h, want_h.transpose(0, 1), rtol=0, atol=1e-5)
    torch.testing.assert_close(got.output_g, want_g.transpose(0, 1), rtol=0, atol=1e-5)
    torch.testing.assert_close(got.weights_h, prob_h.permute(2, 3, 0, 1), rtol=0, atol=1e-6)
    torch.testing.assert_close(got.weights_g, prob_g.permute(2, 3, 0, 1), rtol=0, atol=1e-6)


# ------------------------------------------------------------------------------------------------------------------
# Bad input.
# ------------------------------------------------------------------------------------------------------------------


def _call(m, **kw):
    h, mems, _ = _inputs()
    return m(h, _encoding(T, K, True), **{"mems": mems, **kw})


@pytest.mark.parametrize(("kw", "match"), [
    ({"attn_mask": torch.ones(B, T, T, dtype=torch.bool)}, r"attn_mask must be \(batch=2 or 1, queries=3, keys"),
    ({"attn_mask": torch.ones(B, T, K)}, "attn_mask must be bool"),
    ({"mems": torch.zeros(B, M, D + 1, dtype=torch.float64)}, r"mems must be \(batch=2, memory length, d_model=8\)"),
    ({"target_mapping": torch.ones(B, 1, T)}, "pass g as well"),
    ({"attn_mask_g": torch.ones(B, T, K, dtype=torch.bool)}, "pass g as well"),
    ({"g": torch.zeros(B, T + 1, D, dtype=torch.float64)}, r"g must be \(batch=2, length=3"),
    ({"g": torch.zeros(B, 2, D, dtype=torch.float64), "target_mapping": torch.zeros(B, 3, T)},
     r"g must be \(batch=2, predictions=3"),
    ({"seg_mat": torch.ones(B, T, K)}, "seg_mat must be bool or integer"),
])
def test_bad_input_raises(kw, match):
    with pytest.raises(LmforgeError, match=match):
        _call(_module(), **kw)


def test_bad_positions_and_segments_raise():
    h, mems, diff_seg = _inputs()
    m = _module()
    with pytest.raises(LmforgeError, match=r"r must be .* R = keys \+ queries = 8"):
        m(h, _encoding(T, K - 1, True), mems=mems)
    plain = RelativeMultiHeadAttention(D, H).double()
    assert not hasattr(plain, "seg_embed")
    with pytest.raises(LmforgeError, match="segments=True"):
        plain(h, _encoding(T, K, True), mems=mems, seg_mat=diff_seg)
    with pytest.raises(LmforgeError, match="even d_model"):
        relative_positions_encoding(2, 3, 7, bidirectional=True)
    with pytest.raises(LmforgeError, match="positive multiple"):
        RelativeMultiHeadAttention(10, 3)

"""Mask helpers: polarity, shapes, dtype, and the fully-masked-row rule (zeros, never NaN)."""

from __future__ import annotations

import pytest
import torch

from lmforge.errors import LmforgeError
from lmforge.nn import (
    KERNELS,
    MultiHeadAttention,
    attention_weights,
    combine_masks,
    guard_empty_rows,
    make_causal_mask,
    masked_softmax,
    padding_to_key_mask,
    to_additive_mask,
)


def test_causal_mask_square_is_lower_triangular():
    m = make_causal_mask(5)
    assert m.dtype == torch.bool and m.shape == (5, 5)
    for i in range(5):
        for j in range(5):
            assert bool(m[i, j]) == (j <= i)


@pytest.mark.parametrize("T,S", [(1, 1), (1, 6), (3, 7), (7, 7), (0, 4)])
def test_causal_mask_queries_are_last_T_of_S(T, S):
    m = make_causal_mask(T, S)
    assert m.shape == (T, S)
    for i in range(T):
        for j in range(S):
            assert bool(m[i, j]) == (j <= S - T + i)


def test_causal_mask_rejects_more_queries_than_keys():
    with pytest.raises(LmforgeError, match=r"T=5, S=3"):
        make_causal_mask(5, 3)


def test_padding_to_key_mask_polarity_and_shape():
    am = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1]])
    expected = am.bool()[:, None, None, :]
    for variant in (am, am.bool(), am.float(), am.to(torch.int32)):
        km = padding_to_key_mask(variant)
        assert km.dtype == torch.bool and km.shape == (3, 1, 1, 3)
        assert torch.equal(km, expected)


def test_padding_to_key_mask_rejects_additive_masks_and_bad_rank():
    with pytest.raises(LmforgeError, match="other than 0 and 1"):
        padding_to_key_mask(torch.tensor([[0.0, -10000.0]]))
    with pytest.raises(LmforgeError, match=r"\(3,\)"):
        padding_to_key_mask(torch.ones(3))


def test_combine_masks_broadcasts_and_skips_none():
    pad = padding_to_key_mask(torch.tensor([[1, 1, 0], [1, 1, 1]]))  # (2, 1, 1, 3)
    causal = make_causal_mask(3)  # (3, 3)
    both = combine_masks(None, pad, causal)
    assert both.shape == (2, 1, 3, 3)
    for b in range(2):
        for i in range(3):
            for j in range(3):
                assert bool(both[b, 0, i, j]) == (bool(pad[b, 0, 0, j]) and j <= i)
    assert combine_masks(None, None) is None
    with pytest.raises(LmforgeError, match="bool"):
        combine_masks(causal, causal.float())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_to_additive_mask_values(dtype):
    m = torch.tensor([[True, False], [False, True]])
    add = to_additive_mask(m, dtype)
    assert add.dtype == dtype
    assert add[0, 0] == 0 and add[1, 1] == 0
    assert add[0, 1] == torch.finfo(dtype).min and add[1, 0] == torch.finfo(dtype).min
    with pytest.raises(LmforgeError, match="bool"):
        to_additive_mask(m.float())


def test_additive_mask_gives_the_same_softmax_as_masked_softmax():
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(3, 7, 7, generator=g)
    mask = make_causal_mask(7).expand(3, 7, 7)
    expected = masked_softmax(scores, mask)
    got = (scores + to_additive_mask(mask, scores.dtype)).softmax(-1)
    torch.testing.assert_close(got, expected)


def test_guard_empty_rows():
    m = torch.tensor([[True, False], [False, False]])
    safe, valid = guard_empty_rows(m)
    assert torch.equal(safe, torch.tensor([[True, False], [True, True]]))
    assert torch.equal(valid, torch.tensor([[True], [False]]))


@pytest.mark.parametrize("kernel", sorted(KERNELS))
def test_fully_masked_rows_give_zeros_not_nan(kernel):
    # Left padding (2 pads) under a causal mask: the two padded queries can attend nothing.
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 5, 4) for _ in range(3))
    mask = padding_to_key_mask(torch.tensor([[0, 0, 1, 1, 1]]))
    out = KERNELS[kernel](q, k, v, mask, 0.0, True, None)
    assert not torch.isnan(out).any()
    assert torch.equal(out[:, :, :2], torch.zeros_like(out[:, :, :2]))
    w = attention_weights(q, k, mask, True)
    assert torch.equal(w[:, :, :2], torch.zeros_like(w[:, :, :2]))
    torch.testing.assert_close(w[:, :, 2:].sum(-1), torch.ones(1, 2, 3))
    # An all-padding sequence (every row empty), without causality.
    empty = padding_to_key_mask(torch.zeros(1, 5, dtype=torch.long))
    out = KERNELS[kernel](q, k, v, empty, 0.0, False, None)
    assert torch.equal(out, torch.zeros_like(out))


def test_fully_masked_rows_in_multihead_attention_output_only_the_bias():
    torch.manual_seed(0)
    mha = MultiHeadAttention(12, 3, kernel="sdpa").eval()
    x = torch.randn(1, 5, 12)
    res = mha(x, attention_mask=torch.tensor([[0, 0, 1, 1, 1]]), causal=True, need_weights=True)
    assert not torch.isnan(res.output).any()
    torch.testing.assert_close(res.output[0, :2], mha.out_proj.bias.expand(2, 12))
    assert torch.equal(res.weights[0, :, :2], torch.zeros(3, 2, 5))

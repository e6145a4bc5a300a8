"""Sinusoidal, learned and rotary positions."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lmforge.errors import LmforgeError
from lmforge.nn import LearnedPositional, RotaryEmbedding, SinusoidalPositional


@pytest.mark.parametrize("d_model", [12, 7])
def test_sinusoidal_values_match_the_formula(d_model):
    pe = SinusoidalPositional(d_model, max_len=50, base=10000)
    table = pe(torch.zeros(1, 50, d_model))[0]
    for pos in (0, 1, 7, 49):
        for i in range(d_model // 2 + d_model % 2):
            angle = pos / 10000 ** (2 * i / d_model)
            assert table[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            if 2 * i + 1 < d_model:
                assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


def test_sinusoidal_adds_to_input_with_offset_or_position_ids():
    pe = SinusoidalPositional(12, max_len=20)
    x = torch.randn(3, 7, 12)
    table = pe(torch.zeros(1, 20, 12))[0]
    torch.testing.assert_close(pe(x), x + table[:7])
    torch.testing.assert_close(pe(x, offset=5), x + table[5:12])
    ids = torch.tensor([[0, 0, 0, 1, 2, 3, 4]] * 3)  # e.g. left padding
    torch.testing.assert_close(pe(x, positions=ids), x + table[ids])


def test_sinusoidal_table_is_not_in_the_state_dict():
    pe = SinusoidalPositional(12, max_len=20)
    assert pe.state_dict() == {}
    assert pe.pe.shape == (20, 12)


def test_learned_positional_names_and_behaviour():
    torch.manual_seed(0)
    lp = LearnedPositional(max_len=20, d_model=12)
    assert list(lp.state_dict()) == ["weight"] and lp.weight.shape == (20, 12)
    assert 0.01 < lp.weight.std().item() < 0.03  # N(0, 0.02) as BERT / GPT-2
    x = torch.randn(3, 7, 12)
    torch.testing.assert_close(lp(x, offset=2), x + lp.weight[2:9])
    ids = torch.tensor([1, 1, 2, 3, 4, 5, 6])
    torch.testing.assert_close(lp(x, positions=ids), x + lp.weight[ids])
    lp(x).sum().backward()
    assert lp.weight.grad is not None


@pytest.mark.parametrize(
    "module", [SinusoidalPositional(12, max_len=8), LearnedPositional(max_len=8, d_model=12)], ids=["sin", "learned"]
)
def test_absolute_positions_beyond_max_len(module):
    with pytest.raises(LmforgeError, match=r"length 9.*max_len=8"):
        module(torch.zeros(1, 9, 12))
    with pytest.raises(LmforgeError, match=r"length 3, offset 6.*max_len=8"):
        module(torch.zeros(1, 3, 12), offset=6)
    with pytest.raises(LmforgeError, match=r"\[0, 8\].*max_len=8"):
        module(torch.zeros(1, 3, 12), positions=torch.tensor([0, 8, 1]))


def test_rotary_beyond_max_len_and_bad_width():
    rot = RotaryEmbedding(4, max_len=8)
    with pytest.raises(LmforgeError, match=r"length 2, offset 7.*max_len=8"):
        rot(torch.zeros(1, 1, 2, 4), offset=7)
    with pytest.raises(LmforgeError, match="d_head=5"):
        RotaryEmbedding(5, max_len=8)
    with pytest.raises(LmforgeError, match=r"d_head=4.*width 6"):
        rot(torch.zeros(1, 1, 2, 6))


def test_rotary_preserves_norms_and_is_a_rotation_of_pairs():
    torch.manual_seed(0)
    rot = RotaryEmbedding(6, max_len=40).double()
    x = torch.randn(3, 2, 40, 6, dtype=torch.float64)
    y = rot(x)
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1))
    torch.testing.assert_close(y[..., 0, :], x[..., 0, :])  # position 0 is the identity
    # Pair (i, i + 3) at position m is rotated by m * 10000^(-2i/6).
    m, i = 5, 1
    theta = m * 10000 ** (-2 * i / 6)
    a, b = x[0, 0, m, i].item(), x[0, 0, m, i + 3].item()
    assert y[0, 0, m, i].item() == pytest.approx(a * math.cos(theta) - b * math.sin(theta), abs=1e-6)
    assert y[0, 0, m, i + 3].item() == pytest.approx(a * math.sin(theta) + b * math.cos(theta), abs=1e-6)


@settings(max_examples=25, deadline=None)
@given(m=st.integers(0, 20), n=st.integers(0, 20), c=st.integers(0, 19), seed=st.integers(0, 2**16))
def test_rotary_scores_depend_only_on_relative_position(m, n, c, seed):
    g = torch.Generator().manual_seed(seed)
    rot = RotaryEmbedding(8, max_len=40).double()
    q, k = torch.randn(8, generator=g, dtype=torch.float64), torch.randn(8, generator=g, dtype=torch.float64)

    def at(v: torch.Tensor, pos: int) -> torch.Tensor:
        return rot(v.view(1, 1, 1, 8), offset=pos).view(8)

    assert (at(q, m) @ at(k, n)).item() == pytest.approx((at(q, m + c) @ at(k, n + c)).item(), abs=1e-5)


def test_rotary_offset_equals_slice_of_full_sequence():
    torch.manual_seed(1)
    rot = RotaryEmbedding(4, max_len=16)
    x = torch.randn(2, 3, 10, 4)
    full = rot(x)
    torch.testing.assert_close(rot(x[:, :, 6:], offset=6), full[:, :, 6:])
    assert rot.state_dict() == {}

"""Encoder and decoder layers: residual formulas, causality, padding invariance, KV cache, names."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lmforge.errors import LmforgeError
from lmforge.nn import DecoderLayer, EncoderLayer, LayerCache, RotaryEmbedding

B, T, S, D, H, F = 3, 7, 5, 12, 3, 37
KW = {"dropout": 0.1, "activation": "gelu"}


def _x(seed: int, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@pytest.mark.parametrize("cls", [EncoderLayer, DecoderLayer])
def test_norm_first_does_not_change_state_dict_keys(cls):
    post, pre = cls(D, H, F, norm_first=False), cls(D, H, F, norm_first=True)
    assert list(post.state_dict()) == list(pre.state_dict())
    pre.load_state_dict(post.state_dict())  # checkpoints move between modes


def test_parameter_names():
    keys = set(DecoderLayer(D, H, F).state_dict())
    for sub in ("self_attn", "cross_attn"):
        for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
            assert f"{sub}.{proj}.weight" in keys and f"{sub}.{proj}.bias" in keys
    for norm in ("self_attn_norm", "cross_attn_norm", "ffn_norm"):
        assert f"{norm}.weight" in keys and f"{norm}.bias" in keys
    assert {"ffn.fc1.weight", "ffn.fc2.weight"} <= keys
    assert not any(k.startswith("cross_attn") for k in DecoderLayer(D, H, F, cross_attention=False).state_dict())
    assert set(EncoderLayer(D, H, F).state_dict()) == {k for k in keys if not k.startswith("cross_attn")}


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_layer_residual_formula(norm_first):
    torch.manual_seed(0)
    layer = EncoderLayer(D, H, F, norm_first=norm_first, layer_norm_eps=1e-12).double().eval()
    x = _x(1, B, T, D)

    def attn(h: torch.Tensor) -> torch.Tensor:
        return layer.self_attn(h).output

    if norm_first:  # GPT-2: x + sublayer(LN(x))
        h = x + attn(layer.self_attn_norm(x))
        expected = h + layer.ffn(layer.ffn_norm(h))
    else:  # Vaswani / BERT: LN(x + sublayer(x))
        h = layer.self_attn_norm(x + attn(x))
        expected = layer.ffn_norm(h + layer.ffn(h))
    torch.testing.assert_close(layer(x).hidden, expected)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("cross", [False, True])
def test_decoder_stack_is_causal(norm_first, cross):
    torch.manual_seed(1)
    stack = [DecoderLayer(D, H, F, norm_first=norm_first, cross_attention=cross, **KW).double().eval()
             for _ in range(2)]
    memory = _x(2, B, S, D) if cross else None

    def run(x: torch.Tensor) -> torch.Tensor:
        for layer in stack:
            x = layer(x, memory, causal=True).hidden
        return x

    x = _x(3, B, T, D)
    ref = run(x)
    for t in range(T):
        changed = x.clone()
        changed[:, t:] = _x(10 + t, B, T - t, D) * 5
        out = run(changed)
        torch.testing.assert_close(out[:, :t], ref[:, :t], atol=1e-12, rtol=0)
        assert not torch.allclose(out[:, t], ref[:, t])


@settings(max_examples=20, deadline=None)
@given(
    lengths=st.lists(st.integers(1, T), min_size=B, max_size=B),
    extra=st.integers(1, 4),
    norm_first=st.booleans(),
    kernel=st.sampled_from(["math", "sdpa"]),
    seed=st.integers(0, 2**16),
)
def test_encoder_padding_invariance(lengths, extra, norm_first, kernel, seed):
    # Each sequence alone (no padding) equals its rows in a right-padded batch.
    torch.manual_seed(seed)
    layer = EncoderLayer(D, H, F, norm_first=norm_first, kernel=kernel, **KW).double().eval()
    total = max(lengths) + extra
    x = _x(seed, B, total, D) * 3
    am = torch.tensor([[1] * n + [0] * (total - n) for n in lengths])
    out = layer(x, attention_mask=am).hidden
    for b, n in enumerate(lengths):
        alone = layer(x[b : b + 1, :n]).hidden
        torch.testing.assert_close(out[b : b + 1, :n], alone, atol=1e-10, rtol=0)


def test_decoder_padding_invariance_in_memory_and_target():
    torch.manual_seed(4)
    layer = DecoderLayer(D, H, F, **KW).double().eval()
    x, mem = _x(5, 1, T, D), _x(6, 1, S, D)
    ref = layer(x, mem).hidden
    xp, memp = torch.cat([x, _x(7, 1, 2, D)], 1), torch.cat([mem, _x(8, 1, 3, D)], 1)
    out = layer(xp, memp, attention_mask=torch.tensor([[1] * T + [0] * 2]),
                memory_mask=torch.tensor([[1] * S + [0] * 3])).hidden
    torch.testing.assert_close(out[:, :T], ref, atol=1e-10, rtol=0)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("rotary", [False, True])
@pytest.mark.parametrize("chunks", [[1] * T, [4, 1, 2]])
def test_decoder_stack_cached_equals_full(norm_first, rotary, chunks):
    torch.manual_seed(5)
    rot = RotaryEmbedding(D // H, 32) if rotary else None
    stack = [DecoderLayer(D, H, F, norm_first=norm_first, rotary=rot, **KW).double().eval() for _ in range(2)]
    x, mem = _x(9, B, T, D), _x(10, B, S, D)
    mem_mask = torch.tensor([[1] * S, [1] * 3 + [0] * 2, [1] * 4 + [0]])
    full = x
    for layer in stack:
        full = layer(full, mem, memory_mask=mem_mask).hidden
    caches = [LayerCache() for _ in stack]
    outs, start = [], 0
    for n in chunks:
        h = x[:, start : start + n]
        for layer, cache in zip(stack, caches, strict=True):
            res = layer(h, mem, memory_mask=mem_mask, cache=cache)
            assert res.cache is cache
            h = res.hidden
        outs.append(h)
        start += n
    torch.testing.assert_close(torch.cat(outs, 1), full, atol=1e-10, rtol=0)
    assert all(c.self_attn.length == T and c.cross_attn.length == S for c in caches)


def test_layers_return_weights_on_request():
    torch.manual_seed(6)
    enc = EncoderLayer(D, H, F).eval()
    dec = DecoderLayer(D, H, F).eval()
    x, mem = torch.randn(B, T, D), torch.randn(B, S, D)
    am = torch.tensor([[1] * T, [1] * 4 + [0] * 3, [1] * 2 + [0] * 5])
    e = enc(x, attention_mask=am, need_weights=True)
    assert e.self_attn_weights.shape == (B, H, T, T) and e.cross_attn_weights is None
    torch.testing.assert_close(e.self_attn_weights.sum(-1), torch.ones(B, H, T))
    assert enc(x).self_attn_weights is None
    d = dec(x, mem, need_weights=True)
    assert d.self_attn_weights.shape == (B, H, T, T) and d.cross_attn_weights.shape == (B, H, T, S)
    assert torch.equal(d.self_attn_weights[..., 0, 1:], torch.zeros(B, H, T - 1))  # causal by default
    torch.testing.assert_close(d.cross_attn_weights.sum(-1), torch.ones(B, H, T))


def test_layer_bad_arguments():
    with pytest.raises(LmforgeError, match=r"d_model=12.*n_heads=5"):
        EncoderLayer(D, 5, F)
    with pytest.raises(LmforgeError, match="'tanh'"):
        EncoderLayer(D, H, F, activation="tanh")
    with pytest.raises(LmforgeError, match="memory"):
        DecoderLayer(D, H, F)(torch.randn(1, 2, D))
    with pytest.raises(LmforgeError, match="memory"):
        DecoderLayer(D, H, F, cross_attention=False)(torch.randn(1, 2, D), torch.randn(1, 2, D))
    with pytest.raises(LmforgeError, match="1.0"):
        DecoderLayer(D, H, F, dropout=1.0)

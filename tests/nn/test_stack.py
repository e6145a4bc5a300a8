"""``lmforge.nn.run_layers``, the one loop over a stack of layers: against the loop written out (packing, hidden
states, attention weights), a decoder stack with a cache against the full pass, and the one-position last layer."""

from __future__ import annotations

import pytest
import torch

from lmforge.errors import LmforgeError
from lmforge.nn import DecoderLayer, EncoderLayer, StackCache, run_layers
from lmforge.nn.kernels.packing import Packing

B, T, D, H, L = 3, 7, 16, 2, 3


def _encoder_layers() -> torch.nn.ModuleList:
    torch.manual_seed(0)
    return torch.nn.ModuleList(EncoderLayer(D, H, 32, dropout=0.0, norm_first=True) for _ in range(L)).eval()


def _decoder_layers(cross: bool) -> torch.nn.ModuleList:
    torch.manual_seed(1)
    return torch.nn.ModuleList(DecoderLayer(D, H, 32, dropout=0.0, norm_first=True, cross_attention=cross)
                               for _ in range(L)).eval()


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(B, T, D, generator=torch.Generator().manual_seed(2))
    key_mask = torch.tensor([[1] * 7, [1] * 2 + [0] * 5, [1] * 4 + [0] * 3], dtype=torch.bool)
    return x, key_mask


@pytest.mark.parametrize("packed", [False, True])
def test_the_encoder_stack_equals_the_loop_written_out(packed):
    layers, norm = _encoder_layers(), torch.nn.LayerNorm(D)
    x, key_mask = _batch()
    packing = Packing.from_mask(key_mask) if packed else None
    wanted = {0, 2}
    with torch.no_grad():
        out = run_layers(layers, x, final_norm=norm, packing=packing, weights_of=wanted, hidden_states=True,
                         attentions=True, attention_mask=key_mask)
        h = x if packing is None else packing.pack(x)
        states, weights = [x], []
        for i, layer in enumerate(layers):
            step = layer(h, attention_mask=key_mask, need_weights=i in wanted, packing=packing)
            h = step.hidden
            states.append(h if packing is None else packing.unpack(h))
            weights.append(step.self_attn_weights)
        h = norm(h)
        h = h if packing is None else packing.unpack(h)
    torch.testing.assert_close(out.hidden, h, rtol=0, atol=0)
    assert out.hidden_states is not None and len(out.hidden_states) == L + 1
    for got, want in zip(out.hidden_states[:-1], states[:-1], strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert out.hidden_states[-1] is out.hidden  # the last entry is the normed output
    assert out.attentions is not None and [w is None for w in out.attentions] == [False, True, False]
    for got, want in zip(out.attentions, weights, strict=True):
        if want is not None:
            torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert out.cross_attentions is None
    if packed:  # zeros at padding
        assert float(out.hidden[~key_mask].abs().max()) == 0.0


def test_the_first_position_alone_equals_the_full_stack_there():
    layers = _encoder_layers()
    x, key_mask = _batch()
    with torch.no_grad():
        full = run_layers(layers, x, packing=Packing.from_mask(key_mask), attention_mask=key_mask).hidden
        alone = run_layers(layers, x, packing=Packing.from_mask(key_mask), alone="first_only",
                           attention_mask=key_mask).hidden
    assert alone.shape == (B, 1, D)
    torch.testing.assert_close(alone, full[:, :1], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("cross", [False, True])
def test_a_cached_decoder_stack_equals_the_full_pass(cross):
    layers = _decoder_layers(cross)
    x, _ = _batch()
    extra = {}
    if cross:
        extra = dict(memory=torch.randn(B, 5, D, generator=torch.Generator().manual_seed(3)),
                     memory_mask=torch.tensor([[1] * 5, [1] * 3 + [0] * 2, [1] * 5], dtype=torch.bool))
    every = frozenset(range(L))
    with torch.no_grad():
        full = run_layers(layers, x, weights_of=every, attentions=True, cross_attentions=cross, causal=True,
                          **extra)
        cache = StackCache(L)
        first = run_layers(layers, x[:, :4], cache=cache, causal=True, **extra).hidden
        rest = run_layers(layers, x[:, 4:], cache=cache, causal=True, **extra).hidden
        last = run_layers(layers, x, alone="last_only", causal=True).hidden if not cross else None
    torch.testing.assert_close(torch.cat([first, rest], 1), full.hidden, rtol=1e-5, atol=1e-6)
    assert cache.length == T
    assert full.attentions is not None and all(w.shape == (B, H, T, T) for w in full.attentions)
    if cross:
        assert full.cross_attentions is not None and all(w.shape == (B, H, T, 5) for w in full.cross_attentions)
    else:
        assert full.cross_attentions is None
        torch.testing.assert_close(last, full.hidden[:, -1:], rtol=1e-5, atol=1e-6)


def test_one_position_alone_is_refused_with_hidden_states_weights_or_a_cache():
    layers = _encoder_layers()
    x, key_mask = _batch()
    for options in (dict(hidden_states=True), dict(attentions=True)):
        with pytest.raises(LmforgeError, match="first_only"):
            run_layers(layers, x, alone="first_only", attention_mask=key_mask, **options)
    with pytest.raises(LmforgeError, match="last_only"):
        run_layers(_decoder_layers(False), x, alone="last_only", cache=StackCache(L), causal=True)

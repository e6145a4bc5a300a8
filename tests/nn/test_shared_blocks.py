"""The blocks the model families share instead of keeping near-copies: ``key_padding_mask`` and
``positions_from_mask`` (``lmforge.nn.masks``), ``build_positional`` (``lmforge.nn.positional``) and
``StackCache`` (``lmforge.nn.layers``)."""

from __future__ import annotations

import pytest
import torch

from lmforge.choices import POSITIONALS
from lmforge.errors import LmforgeError
from lmforge.nn import (
    LearnedPositional,
    RotaryEmbedding,
    SinusoidalPositional,
    StackCache,
    build_positional,
    key_padding_mask,
    padding_to_key_mask,
    positions_from_mask,
)


# ---------------------------------------------------------------------------------------------- key_padding_mask
@pytest.mark.parametrize("mask", [
    torch.tensor([[1, 1, 0], [0, 1, 1]]),
    torch.tensor([[1.0, 1.0, 0.0], [0.0, 1.0, 1.0]]),
    torch.tensor([[True, True, False], [False, True, True]]),
], ids=["int", "float", "bool"])
def test_key_padding_mask_is_the_bool_row_of_padding_to_key_mask(mask: torch.Tensor) -> None:
    out = key_padding_mask(mask, batch=2, length=3)
    assert out.dtype == torch.bool and out.shape == (2, 3)
    assert torch.equal(out, padding_to_key_mask(mask)[:, 0, 0, :])
    assert torch.equal(key_padding_mask(mask), out)  # no expected shape: any (B, S)


def test_key_padding_mask_refuses_with_the_callers_words() -> None:
    with pytest.raises(LmforgeError, match=r"^src_mask must be \(batch=2, length=4\) with 1 = real token, 0 = "
                                           r"padding; got shape \(2, 3\)$"):
        key_padding_mask(torch.ones(2, 3), batch=2, length=4, name="src_mask")
    with pytest.raises(LmforgeError, match=r"^attention_mask must be \(batch=2, cached \+ new = 1 \+ 2 = 3\)"):
        key_padding_mask(torch.ones(3, 3), batch=2, length=3, length_label="cached + new = 1 + 2 = 3")
    with pytest.raises(LmforgeError, match=r"must be \(batch=B, length=S\) .*got shape \(6,\)"):
        key_padding_mask(torch.ones(6))
    with pytest.raises(LmforgeError, match=r"got shape list$"):
        key_padding_mask([[1, 1]], batch=1, length=2)
    with pytest.raises(LmforgeError, match="values other than 0 and 1"):
        key_padding_mask(torch.tensor([[0.0, -1e4]]))
    with pytest.raises(LmforgeError, match="must be bool, integer or float"):
        key_padding_mask(torch.ones(1, 2, dtype=torch.complex64))


def test_positions_from_mask_skip_left_padding() -> None:
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    assert positions_from_mask(mask, 5).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4], [0, 1, 2, 2, 2]]
    assert positions_from_mask(mask.bool(), 2).tolist() == [[1, 2], [3, 4], [2, 2]]  # the last T of S


# ---------------------------------------------------------------------------------------------- build_positional
def test_build_positional_gives_one_module_and_says_where_it_goes() -> None:
    learned = build_positional("learned", d_model=8, d_head=4, max_len=10)
    assert isinstance(learned.table, LearnedPositional) and learned.rotary is None
    assert learned.table.weight.shape == (10, 8)
    sinus = build_positional("sinusoidal", d_model=8, d_head=4, max_len=10)
    assert isinstance(sinus.table, SinusoidalPositional) and sinus.rotary is None
    assert torch.equal(sinus.table.pe, SinusoidalPositional(8, 10).pe)
    rotary = build_positional("rotary", d_model=8, d_head=4, max_len=10)
    assert rotary.table is None and isinstance(rotary.rotary, RotaryEmbedding)
    assert (rotary.rotary.d_head, rotary.rotary.max_len) == (4, 10)


def test_build_positional_knows_every_configurable_kind_and_refuses_others() -> None:
    for kind in POSITIONALS:
        parts = build_positional(kind, d_model=8, d_head=4, max_len=4)
        assert (parts.table is None) != (parts.rotary is None)
    with pytest.raises(LmforgeError, match=r"unknown positional encoding 'alibi'; choose one of learned, "
                                           r"sinusoidal, rotary"):
        build_positional("alibi", d_model=8, d_head=4, max_len=4)


# ---------------------------------------------------------------------------------------------- StackCache
def test_stack_cache_prepares_lazily_and_checks_layers_and_batch() -> None:
    cache = StackCache()
    assert cache.length == 0 and cache.batch_size is None and repr(cache) == "StackCache(layers=0, length=0)"
    assert cache.prepare(3, 2) == 0 and len(cache.layers) == 3
    k = torch.randn(2, 1, 4, 5)  # (B, H, P, Dh)
    for layer in cache.layers:
        layer.self_attn.append(k, k)
    assert cache.prepare(3, 2) == 4 and cache.batch_size == 2
    with pytest.raises(LmforgeError, match=r"^cache has 3 layers but the model has 2 decoder layers$"):
        cache.prepare(2, 2)
    with pytest.raises(LmforgeError, match=r"^cache holds batch size 2 but ids has 1 rows; reorder the cache "
                                           r"\(cache.reorder\(index\)\) and the memory when the batch changes$"):
        cache.prepare(3, 1, rows="ids", also_reorder=" and the memory")
    cache.reorder(torch.tensor([1]))
    assert cache.batch_size == 1 and cache.prepare(3, 1) == 4


def test_stack_cache_batch_size_reads_the_cross_attention_before_any_self_attention() -> None:
    cache = StackCache(1)
    memory_keys = torch.randn(3, 1, 7, 2)
    cache.layers[0].cross_attn.append(memory_keys, memory_keys)
    assert cache.length == 0 and cache.batch_size == 3

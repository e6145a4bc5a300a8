"""MultiHeadAttention: kernels agree, masks, padding invariance, KV cache, captured weights, errors."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lmforge.errors import LmforgeError
from lmforge.nn import (
    KERNELS,
    KVCache,
    MultiHeadAttention,
    RotaryEmbedding,
    make_causal_mask,
    math_attention,
    padding_to_key_mask,
    sdpa_attention,
)

B, T, D, H = 3, 7, 12, 3
FAST = settings(max_examples=25, deadline=None)


def _pair(seed: int, dtype: torch.dtype = torch.float64, **kw) -> tuple[MultiHeadAttention, MultiHeadAttention]:
    """Two modules with identical weights, one per kernel, in eval mode."""
    torch.manual_seed(seed)
    m = MultiHeadAttention(D, H, kernel="math", **kw).to(dtype).eval()
    s = MultiHeadAttention(D, H, kernel="sdpa", **kw).to(dtype).eval()
    s.load_state_dict(m.state_dict())
    return m, s


def _mask_from_lengths(lengths: list[int], total: int, left: bool) -> torch.Tensor:
    rows = [[0] * (total - n) + [1] * n if left else [1] * n + [0] * (total - n) for n in lengths]
    return torch.tensor(rows)


def _tol(dtype: torch.dtype) -> dict[str, float]:
    """Math vs SDPA kernel, one attention layer, values of order 1: the two sum in different orders, which depend
    on the CPU's instruction set (ATEN_CPU_CAPABILITY, x86-64 or ARM). Relative plus absolute: about 100 ulps in
    float32 (1.2e-5); float64 keeps its former 1e-6, still billions of ulps below any real bug's effect."""
    if dtype == torch.float32:
        tol = 100 * torch.finfo(torch.float32).eps
        return {"rtol": tol, "atol": tol}
    return {"rtol": 1e-6, "atol": 1e-6}


# ---------------------------------------------------------------------------------------------------------------
# math kernel == sdpa kernel
# ---------------------------------------------------------------------------------------------------------------


@FAST
@given(
    lengths=st.lists(st.integers(0, T), min_size=B, max_size=B),
    use_padding=st.booleans(),
    causal=st.booleans(),
    left=st.booleans(),
    dtype=st.sampled_from([torch.float64, torch.float32]),
    seed=st.integers(0, 2**16),
)
def test_math_kernel_equals_sdpa_kernel_in_self_attention(lengths, use_padding, causal, left, dtype, seed):
    m, s = _pair(seed, dtype)
    x = torch.randn(B, T, D, dtype=dtype)
    am = _mask_from_lengths(lengths, T, left) if use_padding else None
    out_m = m(x, attention_mask=am, causal=causal).output
    out_s = s(x, attention_mask=am, causal=causal).output
    assert not torch.isnan(out_s).any()
    torch.testing.assert_close(out_m, out_s, **_tol(dtype))


@FAST
@given(
    T_=st.integers(1, 5),
    extra=st.integers(0, 4),
    causal=st.booleans(),
    per_head=st.booleans(),
    dtype=st.sampled_from([torch.float64, torch.float32]),
    seed=st.integers(0, 2**16),
)
def test_kernels_agree_on_raw_masks(T_, extra, causal, per_head, dtype, seed):
    # Direct kernel calls: T queries over S = T + extra keys (cached decoding shape), arbitrary bool masks.
    g = torch.Generator().manual_seed(seed)
    S = T_ + extra
    q = torch.randn(B, H, T_, 4, generator=g, dtype=dtype)
    k = torch.randn(B, H, S, 4, generator=g, dtype=dtype)
    v = torch.randn(B, H, S, 4, generator=g, dtype=dtype)
    shape = (B, H, T_, S) if per_head else (B, 1, 1, S)
    mask = torch.rand(shape, generator=g) < 0.7
    for m in (None, mask):
        a = math_attention(q, k, v, m, 0.0, causal, None)
        b = sdpa_attention(q, k, v, m, 0.0, causal, None)
        torch.testing.assert_close(a, b, **_tol(dtype))
        torch.testing.assert_close(a, math_attention(q, k, v, m, 0.0, causal, 1 / math.sqrt(4)), **_tol(dtype))
        a = math_attention(q, k, v, m, 0.0, causal, 0.3)  # a non-default scale reaches both kernels
        torch.testing.assert_close(a, sdpa_attention(q, k, v, m, 0.0, causal, 0.3), **_tol(dtype))


def test_kernels_agree_in_cross_attention_with_other_width():
    m, s = _pair(0, d_kv=5)
    x, mem = torch.randn(B, 4, D, dtype=torch.float64), torch.randn(B, 9, 5, dtype=torch.float64)
    am = _mask_from_lengths([9, 6, 1], 9, left=False)
    out = s(x, mem, attention_mask=am).output
    assert out.shape == (B, 4, D)
    torch.testing.assert_close(m(x, mem, attention_mask=am).output, out, atol=1e-6, rtol=0)


# ---------------------------------------------------------------------------------------------------------------
# Padding invariance
# ---------------------------------------------------------------------------------------------------------------


@FAST
@given(
    n_pad=st.integers(1, 5),
    where=st.data(),
    kernel=st.sampled_from(sorted(KERNELS)),
    seed=st.integers(0, 2**16),
)
def test_padding_anywhere_never_changes_real_outputs(n_pad, where, kernel, seed):
    torch.manual_seed(seed)
    mha = MultiHeadAttention(D, H, kernel=kernel).double().eval()
    x = torch.randn(B, T, D, dtype=torch.float64)
    ref = mha(x).output
    # Insert n_pad random vectors at random positions; attention without positions is order-free over keys.
    slots = sorted(where.draw(st.lists(st.integers(0, T + n_pad - 1), min_size=n_pad, max_size=n_pad, unique=True)))
    real = [i for i in range(T + n_pad) if i not in slots]
    xp = torch.randn(B, T + n_pad, D, dtype=torch.float64) * 100
    xp[:, real] = x
    am = torch.ones(B, T + n_pad, dtype=torch.long)
    am[:, slots] = 0
    torch.testing.assert_close(mha(xp, attention_mask=am).output[:, real], ref, atol=1e-10, rtol=0)


@pytest.mark.parametrize("kernel", sorted(KERNELS))
@pytest.mark.parametrize("rotary", [False, True])
def test_left_padding_with_causal_mask_changes_nothing(kernel, rotary):
    # Rotary scores depend on relative positions only, so a left shift is invisible to it as well.
    torch.manual_seed(1)
    rot = RotaryEmbedding(D // H, 32) if rotary else None
    mha = MultiHeadAttention(D, H, kernel=kernel, rotary=rot).double().eval()
    x = torch.randn(B, T, D, dtype=torch.float64)
    ref = mha(x, causal=True).output
    xp = torch.cat([torch.randn(B, 3, D, dtype=torch.float64), x], dim=1)
    am = torch.cat([torch.zeros(B, 3, dtype=torch.long), torch.ones(B, T, dtype=torch.long)], dim=1)
    # Rotary tables are float32 (like every reference implementation), so shifted positions agree to ~1e-8 only.
    atol = 1e-7 if rotary else 1e-10
    torch.testing.assert_close(mha(xp, attention_mask=am, causal=True).output[:, 3:], ref, atol=atol, rtol=0)


# ---------------------------------------------------------------------------------------------------------------
# KV cache
# ---------------------------------------------------------------------------------------------------------------


def _decode(mha: MultiHeadAttention, x: torch.Tensor, chunks: list[int], am: torch.Tensor | None = None):
    cache, outs, start = KVCache(), [], 0
    for n in chunks:
        mask = None if am is None else am[:, : start + n]  # covers cached + new keys
        res = mha(x[:, start : start + n], attention_mask=mask, causal=True, cache=cache)
        assert res.cache is cache and cache.length == start + n
        outs.append(res.output)
        start += n
    return torch.cat(outs, dim=1)


@pytest.mark.parametrize("kernel", sorted(KERNELS))
@pytest.mark.parametrize("rotary", [False, True])
@pytest.mark.parametrize("chunks", [[1] * T, [3, 1, 3], [2, 5], [T]])
def test_cached_self_attention_equals_full_recompute(kernel, rotary, chunks):
    torch.manual_seed(2)
    rot = RotaryEmbedding(D // H, 16) if rotary else None
    mha = MultiHeadAttention(D, H, kernel=kernel, rotary=rot).double().eval()
    x = torch.randn(B, T, D, dtype=torch.float64)
    full = mha(x, causal=True).output
    torch.testing.assert_close(_decode(mha, x, chunks), full, atol=1e-10, rtol=0)
    # With a left-padded prompt, the mask grows with the cache.
    am = _mask_from_lengths([7, 5, 2], T, left=True)
    full = mha(x, attention_mask=am, causal=True).output
    torch.testing.assert_close(_decode(mha, x, chunks, am), full, atol=1e-10, rtol=0)


@FAST
@given(chunks=st.lists(st.integers(1, 3), min_size=1, max_size=5), seed=st.integers(0, 2**16))
def test_cached_decoding_with_any_chunking(chunks, seed):
    torch.manual_seed(seed)
    n = sum(chunks)
    mha = MultiHeadAttention(D, H, rotary=RotaryEmbedding(D // H, 16)).double().eval()
    x = torch.randn(2, n, D, dtype=torch.float64)
    torch.testing.assert_close(_decode(mha, x, chunks), mha(x, causal=True).output, atol=1e-10, rtol=0)


@pytest.mark.parametrize("kernel", sorted(KERNELS))
def test_cross_attention_cache_projects_memory_once(kernel):
    torch.manual_seed(3)
    mha = MultiHeadAttention(D, H, kernel=kernel, d_kv=8).double().eval()
    x, mem = torch.randn(B, T, D, dtype=torch.float64), torch.randn(B, 5, 8, dtype=torch.float64)
    mem_mask = _mask_from_lengths([5, 3, 4], 5, left=False)
    full = mha(x, mem, attention_mask=mem_mask).output
    calls = []
    hook = mha.k_proj.register_forward_hook(lambda *_: calls.append(1))
    cache, outs = KVCache(), []
    for t in range(T):
        outs.append(mha(x[:, t : t + 1], mem, attention_mask=mem_mask, cache=cache).output)
        assert cache.length == 5
    hook.remove()
    assert len(calls) == 1
    torch.testing.assert_close(torch.cat(outs, dim=1), full, atol=1e-10, rtol=0)


def test_cache_reorder_selects_batch_rows():
    cache = KVCache()
    k = torch.arange(3.0)[:, None, None, None].expand(3, 2, 4, 5)
    cache.append(k, k + 10)
    cache.reorder(torch.tensor([2, 2, 0]))
    assert cache.key[:, 0, 0, 0].tolist() == [2.0, 2.0, 0.0]
    assert cache.value[:, 0, 0, 0].tolist() == [12.0, 12.0, 10.0]


def test_cache_grows_by_doubling_and_matches_concatenation():
    g = torch.Generator().manual_seed(0)
    cache, keys, values, buffers = KVCache(), [], [], set()
    for step in range(40):
        T = 5 if step == 0 else 1  # a prompt, then one token per step
        k, v = torch.randn(2, 3, T, 4, generator=g), torch.randn(2, 3, T, 4, generator=g)
        keys.append(k)
        values.append(v)
        all_k, all_v = cache.append(k, v)
        assert torch.equal(all_k, torch.cat(keys, 2)) and torch.equal(all_v, torch.cat(values, 2))
        assert torch.equal(cache.key, all_k) and cache.length == all_k.shape[2] <= cache.capacity
        buffers.add(cache._key.data_ptr())
    assert cache.capacity == 64 and len(buffers) <= 4  # 5 -> 16 -> 32 -> 64: three copies, not forty


def test_cache_reorder_is_lazy_composes_and_a_reserve_is_one_allocation():
    """Reorders between steps are recorded and composed, and made at the next append or read (each layer gathers
    just before it attends); a reserved cache is made once for the whole generation and never grows."""
    g = torch.Generator().manual_seed(2)
    cache = KVCache()
    cache.reserve = 12
    k = torch.randn(4, 2, 5, 3, generator=g)
    cache.append(k, -k)
    assert cache.capacity == 12
    first = cache._key.data_ptr()
    a, b = torch.tensor([1, 1, 3, 0]), torch.tensor([2, 0, 0, 3])
    cache.reorder(a)
    cache.reorder(b)
    assert cache._key.data_ptr() == first  # nothing gathered yet
    expected = k.index_select(0, a).index_select(0, b)
    new = torch.randn(4, 2, 1, 3, generator=g)
    all_k, all_v = cache.append(new, -new)  # the gather happens here, once, for both reorders
    assert torch.equal(all_k, torch.cat([expected, new], 2)) and torch.equal(all_v, -all_k)
    for _ in range(6):
        all_k, _ = cache.append(new, new)
    assert cache.length == 12 and cache.capacity == 12  # 5 + 7 positions: the reserve, no growth
    cache.reorder(torch.tensor([0]))
    assert cache.key.shape == (1, 2, 12, 3) and torch.equal(cache.key, all_k[:1])  # a read makes it too


def test_cache_reorder_is_index_select_and_allocates_nothing_once_warm():
    g = torch.Generator().manual_seed(1)
    cache = KVCache()
    k = torch.randn(4, 2, 6, 3, generator=g)
    cache.append(k, k * 2)
    expected = k
    seen = set()
    for _ in range(6):
        index = torch.randint(0, 4, (4,), generator=g)
        cache.reorder(index)
        expected = expected.index_select(0, index)
        assert torch.equal(cache.key, expected) and torch.equal(cache.value, expected * 2)
        seen.add(cache._key.data_ptr())
    assert len(seen) == 2  # two buffers, swapped
    new = torch.randn(4, 2, 1, 3, generator=g)
    all_k, _ = cache.append(new, new)
    assert torch.equal(all_k, torch.cat([expected, new], 2))
    cache.reorder(torch.tensor([3, 1]))  # fewer rows (finished beams dropped)
    assert torch.equal(cache.key, torch.cat([expected, new], 2)[[3, 1]]) and cache.key.shape[0] == 2
    with pytest.raises(LmforgeError, match="the cache holds 2 rows but 4 were appended"):
        cache.append(new, new)


# ---------------------------------------------------------------------------------------------------------------
# Captured attention weights
# ---------------------------------------------------------------------------------------------------------------


def _reference_weights(mha: MultiHeadAttention, x: torch.Tensor, am: torch.Tensor, causal: bool) -> torch.Tensor:
    """Weights computed from the module's parameters with explicit formulas."""
    dh = D // H
    q = (x @ mha.q_proj.weight.T + mha.q_proj.bias).view(B, T, H, dh).transpose(1, 2)
    k = (x @ mha.k_proj.weight.T + mha.k_proj.bias).view(B, T, H, dh).transpose(1, 2)
    scores = q @ k.transpose(-2, -1) / math.sqrt(dh)
    allowed = padding_to_key_mask(am) & (make_causal_mask(T) if causal else True)
    scores = scores.masked_fill(~allowed, -math.inf)
    return scores.softmax(-1)


@pytest.mark.parametrize("causal", [False, True])
def test_captured_weights_from_the_sdpa_kernel(causal):
    m, s = _pair(4)
    x = torch.randn(B, T, D, dtype=torch.float64)
    am = _mask_from_lengths([7, 4, 2], T, left=False)
    fast = s(x, attention_mask=am, causal=causal)
    assert fast.weights is None
    res = s(x, attention_mask=am, causal=causal, need_weights=True)
    assert res.weights is not None and res.weights.shape == (B, H, T, T)
    torch.testing.assert_close(res.weights.sum(-1), torch.ones(B, H, T, dtype=torch.float64))
    torch.testing.assert_close(res.weights, m(x, attention_mask=am, causal=causal, need_weights=True).weights)
    torch.testing.assert_close(res.weights, _reference_weights(s, x, am, causal))
    torch.testing.assert_close(res.output, fast.output, atol=1e-6, rtol=0)
    assert torch.equal(res.weights[1, :, :, 4:], torch.zeros(H, T, 3, dtype=torch.float64))


def test_attention_dropout_only_in_training():
    torch.manual_seed(5)
    mha = MultiHeadAttention(D, H, dropout=0.5)
    ref = MultiHeadAttention(D, H, dropout=0.0)
    ref.load_state_dict(mha.state_dict())
    x = torch.randn(B, T, D)
    mha.eval(), ref.eval()
    torch.testing.assert_close(mha(x).output, ref(x).output)
    mha.train()
    assert not torch.allclose(mha(x).output, ref(x).output)
    w = mha(x, need_weights=True).weights  # pre-dropout probabilities
    torch.testing.assert_close(w.sum(-1), torch.ones(B, H, T))


# ---------------------------------------------------------------------------------------------------------------
# Errors a user can cause
# ---------------------------------------------------------------------------------------------------------------


def test_bad_arguments_raise_lmforge_error():
    with pytest.raises(LmforgeError, match=r"d_model=10.*n_heads=3"):
        MultiHeadAttention(10, 3)
    with pytest.raises(LmforgeError, match=r"'flash'.*math, sdpa"):
        MultiHeadAttention(D, H, kernel="flash")
    with pytest.raises(LmforgeError, match="1.5"):
        MultiHeadAttention(D, H, dropout=1.5)
    mha = MultiHeadAttention(D, H)
    x = torch.randn(B, T, D)
    with pytest.raises(LmforgeError, match=r"\(3, 5\)"):
        mha(x, attention_mask=torch.ones(B, 5))
    with pytest.raises(LmforgeError, match="bool"):
        mha(x, attn_mask=torch.zeros(T, T))
    with pytest.raises(LmforgeError, match="d_model=12"):
        mha(torch.randn(B, T, 8))
    with pytest.raises(LmforgeError, match=r"T=7, S=4"):
        mha(x, torch.randn(B, 4, D), causal=True)
    with pytest.raises(LmforgeError, match=r"max_len=8"):
        MultiHeadAttention(D, H, rotary=RotaryEmbedding(4, 8))(torch.randn(1, 9, D))


@pytest.mark.parametrize("bias", [True, False])
def test_cached_decoding_fuses_qkv_per_cache_and_equals_three_products(bias):
    """While decoding with a cache (no autograd) the q/k/v products run as one GEMM over weights concatenated once
    per cache (issue 22, item 3): the outputs equal the three separate products; a new cache after a weight change
    (an optimizer step of any kind, a load) uses the new weights; the state dict keeps its three projections;
    without a cache, with autograd, or with a hooked projection, the three modules run as they are."""
    torch.manual_seed(0)
    attn = MultiHeadAttention(16, 4, bias=bias).eval()
    x = torch.randn(2, 5, 16)

    def decode(fuse: bool) -> tuple[torch.Tensor, KVCache]:
        attn.fuse_projections = fuse
        cache = KVCache()
        with torch.no_grad():
            outs = [attn(x[:, :3], causal=True, cache=cache).output]
            outs += [attn(x[:, t:t + 1], causal=True, cache=cache).output for t in (3, 4)]
        attn.fuse_projections = True
        return torch.cat(outs, dim=1), cache

    fused, cache = decode(True)
    separate, plain_cache = decode(False)
    torch.testing.assert_close(fused, separate, rtol=1e-6, atol=1e-6)
    assert cache.projection is not None and cache.projection[0].shape == (48, 16)
    assert plain_cache.projection is None
    assert sorted({key.split(".")[0] for key in attn.state_dict()}) == ["k_proj", "out_proj", "q_proj", "v_proj"]

    with torch.no_grad():  # an update that moves no version counter (as fused AdamW's kernel): a new cache sees it
        attn.k_proj.weight.data.mul_(2.0)
    after, _ = decode(True)
    torch.testing.assert_close(after, decode(False)[0], rtol=1e-6, atol=1e-6)
    assert not torch.allclose(after, fused)

    calls = []
    handle = attn.v_proj.register_forward_hook(lambda module, args, out: calls.append(out.shape))
    decode(True)
    handle.remove()
    assert len(calls) == 3  # a hooked projection runs itself, at every step

    attn.train()  # autograd: no cache fusion, gradients reach the three projections
    attn(x, causal=True, cache=KVCache()).output.sum().backward()
    assert all(p.grad is not None for p in (attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight))

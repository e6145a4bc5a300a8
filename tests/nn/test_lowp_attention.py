"""``lmforge.nn.kernels.lowp_attention``: attention without dropout for bf16 operands on a CPU (issue 39).

Exact against its written-out reference in fp64 (every chunking, masks with padding, causal, per-head and empty rows);
in bf16 as close to the exact fp64 attention as torch's own flash kernel is; and what ``sdpa_attention`` dispatches."""

from __future__ import annotations

import importlib

import pytest
import torch
import torch.nn.functional as F

from lmforge.nn import attention
from lmforge.nn.attention import sdpa_attention
from lmforge.nn.kernels.lowp_attention import lowp_attention, plain_lowp_attention

lowp = importlib.import_module("lmforge.nn.kernels.lowp_attention")  # the package attribute is the function


def _qkv(B: int, H: int, T: int, Dh: int, dtype: torch.dtype, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, T, Dh, generator=g, dtype=torch.float64).to(dtype).requires_grad_() for _ in range(3)]


def _masks(B: int, H: int, T: int) -> dict[str, torch.Tensor | None]:
    padding = torch.ones(B, 1, 1, T, dtype=torch.bool)
    padding[1, ..., T // 2:] = False
    padding[-1] = False  # a sequence of padding only: every query row without a key
    per_head = torch.rand(B, H, T, T, generator=torch.Generator().manual_seed(5)) > 0.4
    return {"none": None, "padding": padding, "causal": torch.ones(T, T, dtype=torch.bool).tril(),
            "padding and causal": padding & torch.ones(T, T, dtype=torch.bool).tril(), "per head": per_head}


@pytest.mark.parametrize("chunk", [None, 1, 2, 3, 6, 12])
@pytest.mark.parametrize("kind", ["none", "padding", "causal", "padding and causal", "per head"])
def test_every_chunking_equals_the_written_out_reference_in_fp64(kind, chunk):
    B, H, T, Dh = 4, 6, 7, 5
    q, k, v = _qkv(B, H, T, Dh, torch.float64)
    mask = _masks(B, H, T)[kind]
    cotangent = torch.randn(B, H, T, Dh, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    results = []
    for fn in (lambda: lowp_attention(q, k, v, mask, chunk=chunk), lambda: plain_lowp_attention(q, k, v, mask)):
        out = fn()
        results.append((out, *torch.autograd.grad(out, (q, k, v), cotangent)))
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    if kind == "padding":  # the padding-only sequence gives zeros, as torch's math path does
        assert float(results[0][0][-1].detach().abs().max()) == 0.0


def test_a_chunk_neither_a_multiple_nor_a_divisor_of_the_heads_is_refused():
    q, k, v = _qkv(2, 6, 4, 3, torch.float64)
    with pytest.raises(ValueError, match="multiple or divisor of 6"):
        lowp_attention(q, k, v, torch.ones(2, 1, 1, 4, dtype=torch.bool), chunk=4)


@pytest.mark.parametrize("kind", ["none", "padding and causal"])
def test_bf16_is_as_close_to_exact_attention_as_torchs_flash_kernel(kind):
    """The scores and softmax in fp32: within 10% of the flash kernel's own bf16 error (output and gradients), and
    closer than bf16 scores (what a bf16 q @ k^T under autocast gives) would be."""
    B, H, T, Dh = 4, 4, 32, 16
    q64, k64, v64 = _qkv(B, H, T, Dh, torch.float64, seed=2)
    with torch.no_grad():
        q64.mul_(3.0), k64.mul_(3.0)  # scores of a trained model's size: where bf16 scores lose accuracy
    mask = _masks(B, H, T)[kind]
    if mask is not None:
        mask = mask[:, :, :, :].clone()
        mask[-1] = True  # no empty rows: the flash kernel gives NaN there
    cotangent = torch.randn(B, H, T, Dh, dtype=torch.float64, generator=torch.Generator().manual_seed(3))

    def run(fn, dtype):
        x = [t.detach().to(dtype).requires_grad_() for t in (q64, k64, v64)]
        out = fn(*x)
        return [t.double() for t in (out, *torch.autograd.grad(out, x, cotangent.to(dtype)))]

    exact = run(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, attn_mask=mask), torch.float64)
    flash = run(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, attn_mask=mask), torch.bfloat16)
    ours = run(lambda a, b, c: lowp_attention(a, b, c, mask), torch.bfloat16)
    bf16_scores = run(lambda a, b, c: torch.softmax(
        (a @ b.transpose(-1, -2)).float().mul(Dh ** -0.5).masked_fill(~mask, -1e30) if mask is not None
        else (a @ b.transpose(-1, -2)).float().mul(Dh ** -0.5), -1).to(a.dtype) @ c, torch.bfloat16)

    def error(got):
        return [float((g - e).norm() / e.norm()) for g, e in zip(got, exact, strict=True)]

    for ours_err, flash_err, coarse_err in zip(error(ours), error(flash), error(bf16_scores), strict=True):
        assert ours_err <= 1.1 * flash_err
        assert ours_err < coarse_err


def test_sdpa_attention_takes_it_for_bf16_on_a_cpu_within_the_measured_sizes(monkeypatch):
    calls = []
    real = attention.lowp_attention
    monkeypatch.setattr(attention, "lowp_attention", lambda *a, **kw: calls.append(a[0].dtype) or real(*a, **kw))
    q, k, v = _qkv(2, 2, 6, 4, torch.bfloat16, seed=4)
    out = sdpa_attention(q, k, v, None, 0.0, True, None)
    assert calls == [torch.bfloat16] and out.dtype == torch.bfloat16
    torch.testing.assert_close(out, plain_lowp_attention(q, k, v, torch.ones(6, 6, dtype=torch.bool).tril()))
    sdpa_attention(*(t.float() for t in (q, k, v)), None, 0.0, True, None)  # fp32: torch's kernel
    sdpa_attention(*(t.float() for t in (q, k, v)), None, 0.1, True, None)  # fp32 with dropout: dropout_attention
    assert calls == [torch.bfloat16]
    sdpa_attention(q, k, v, None, 0.1, False, None)  # bf16 with dropout: here too
    assert calls == [torch.bfloat16] * 2
    monkeypatch.setattr(lowp, "LOWP_MAX_TRAIN_SCORES", 35)  # beyond the measured range: torch's kernels
    sdpa_attention(q, k, v, None, 0.0, False, None)
    sdpa_attention(q, k, v, None, 0.1, False, None)  # the fp32 dropout kernel on fp32 copies
    assert calls == [torch.bfloat16] * 2
    with torch.no_grad():  # without gradients the larger limit applies
        sdpa_attention(q, k, v, None, 0.0, False, None)
    assert calls == [torch.bfloat16] * 3


@pytest.mark.parametrize(("p", "limit"), [(0.0, None), (0.2, None), (0.2, 0)])
def test_under_autocast_the_backward_may_run_inside_the_region(p, limit, monkeypatch):
    """bf16 attention (this kernel; with ``limit`` 0 and dropout, ``dropout_attention`` on fp32 copies) returns bf16,
    and its backward gives the same gradients whether or not it is called inside the autocast region."""
    if limit is not None:
        monkeypatch.setattr(lowp, "LOWP_MAX_TRAIN_SCORES", limit)
    q, k, v = _qkv(2, 3, 8, 4, torch.bfloat16, seed=6)
    mask = torch.ones(2, 1, 1, 8, dtype=torch.bool)
    mask[0, ..., 5:] = False
    grads = []
    for inside in (False, True):
        torch.manual_seed(7)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = sdpa_attention(q, k, v, mask, p, False, None)
            if inside:
                grads.append(torch.autograd.grad(out.float().sum(), (q, k, v)))
        if not inside:
            grads.append(torch.autograd.grad(out.float().sum(), (q, k, v)))
        assert out.dtype == torch.bfloat16
    for a, b in zip(*grads, strict=True):
        assert torch.equal(a, b) and a.dtype == torch.bfloat16
    if p == 0.0:
        with torch.no_grad():  # inference keeps no weights and gives the same output
            torch.testing.assert_close(sdpa_attention(q, k, v, mask, 0.0, False, None), out.detach())


@pytest.mark.parametrize("chunk", [None, 2, 6])
def test_dropout_equals_the_reference_from_the_same_generator_state(chunk):
    """Each chunk draws its part of the packed mask in turn: with an even (T, S) per row the words split as in one
    draw, so from the same seed the output and gradients equal the written-out reference's (fp64: exactly)."""
    B, H, T, Dh = 3, 6, 4, 5
    q, k, v = _qkv(B, H, T, Dh, torch.float64, seed=7)
    mask = _masks(B, H, T)["padding and causal"]
    cotangent = torch.randn(B, H, T, Dh, dtype=torch.float64, generator=torch.Generator().manual_seed(8))
    results = []
    for fn in (lambda: lowp_attention(q, k, v, mask, chunk=chunk, dropout_p=0.3),
               lambda: plain_lowp_attention(q, k, v, mask, dropout_p=0.3)):
        torch.manual_seed(11)
        out = fn()
        results.append((out, *torch.autograd.grad(out, (q, k, v), cotangent)))
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    assert float((results[0][0] - plain_lowp_attention(q, k, v, mask)).abs().max()) > 0.01  # it did drop


def test_bf16_dropout_averages_to_attention_without_it_and_refuses_p_of_one():
    q, k, v = _qkv(2, 2, 6, 4, torch.bfloat16, seed=9)
    torch.manual_seed(3)
    with torch.no_grad():
        mean = torch.stack([lowp_attention(q, k, v, None, dropout_p=0.2).float() for _ in range(3000)]).mean(0)
        torch.testing.assert_close(mean, lowp_attention(q, k, v, None).float(), rtol=0.0, atol=0.05)
    with pytest.raises(ValueError, match=r"dropout_p must be in \[0, 1\)"):
        lowp_attention(q, k, v, None, dropout_p=1.0)

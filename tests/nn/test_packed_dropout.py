"""The packed-mask dropout (lmforge.nn.kernels.packed_dropout, lmforge.nn.kernels.dropout_attention): its
distribution, its gradients, its attention against the written-out math with the same mask, and the fall-backs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lmforge.nn.attention import attention_weights, make_causal_mask, sdpa_attention
from lmforge.nn.kernels.dropout_attention import dropout_attention
from lmforge.nn.kernels.packed_dropout import Dropout, dropout, keep_mask, uses_packed_masks


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_the_mask_keeps_each_element_with_probability_one_minus_p(p):
    torch.manual_seed(0)
    keep = keep_mask((400, 1001), p)  # an odd count: the last 64-bit word is used for one lane only
    n = keep.numel()
    rate = keep.float().mean().item()
    assert abs(rate - (1 - p)) < 5 * (p * (1 - p) / n) ** 0.5  # within 5 standard errors
    # both lanes of a word are uniform and independent: the even and odd elements keep at the same rate, and
    # neighbours agree as often as independent draws would
    flat = keep.flatten().float()
    assert abs(flat[0::2].mean() - flat[1::2].mean()) < 5 * (2 * p * (1 - p) / (n / 2)) ** 0.5
    both = (flat[0:-1:2] * flat[1::2]).mean().item()
    assert abs(both - (1 - p) ** 2) < 5 * ((1 - p) ** 2 * (1 - (1 - p) ** 2) / (n / 2)) ** 0.5


def test_the_mask_follows_the_seed_and_not_the_thread_count():
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        torch.manual_seed(7)
        one = keep_mask((64, 333), 0.2)
        torch.set_num_threads(2)
        torch.manual_seed(7)
        two = keep_mask((64, 333), 0.2)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, two)
    assert not torch.equal(one, keep_mask((64, 333), 0.2))  # the next draw differs


def test_dropout_scales_kept_elements_and_its_gradient_uses_the_same_mask():
    torch.manual_seed(0)
    x = torch.randn(50, 70, dtype=torch.float64, requires_grad=True)
    torch.manual_seed(3)
    y = dropout(x, 0.25)
    torch.manual_seed(3)
    keep = keep_mask(x.shape, 0.25)
    scale = 2**32 / (2**32 - round(0.25 * 2**32))
    torch.testing.assert_close(y, x * keep * scale)
    g = torch.randn_like(y)
    y.backward(g)
    torch.testing.assert_close(x.grad, g * keep * scale)
    assert abs(y.detach().mean().item() - x.detach().mean().item()) < 0.1  # unbiased in expectation


def test_evaluation_p0_and_p1_behave_as_torch():
    x = torch.randn(8, 9)
    assert dropout(x, 0.3, training=False) is x and dropout(x, 0.0) is x
    assert torch.equal(dropout(x, 1.0), torch.zeros_like(x))
    layer = Dropout(0.3)
    assert isinstance(layer, torch.nn.Dropout) and layer.state_dict() == {}
    assert torch.equal(layer.eval()(x), x)
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        keep_mask((3,), 1.5)


@pytest.mark.parametrize("kind", ["none", "causal", "padding", "per-head", "empty row", "one padded row"])
def test_dropout_attention_equals_the_written_out_math_with_the_same_mask(kind):
    torch.manual_seed(0)
    B, H, T, Dh = (1 if kind == "one padded row" else 2), 3, 6, 4
    q, k, v = (torch.randn(B, H, T, Dh, dtype=torch.float64, requires_grad=True) for _ in range(3))
    mask = {"none": lambda: None, "causal": lambda: make_causal_mask(T, T).view(1, 1, T, T),
            "padding": lambda: torch.tensor([[1] * 6, [1] * 4 + [0] * 2], dtype=torch.bool).view(B, 1, 1, T),
            "per-head": lambda: torch.rand(B, H, T, T) > 0.4,
            "empty row": lambda: torch.tensor([[0] * 6, [1] * 3 + [0] * 3], dtype=torch.bool).view(B, 1, 1, T),
            "one padded row": lambda: torch.tensor([[1] * 4 + [0] * 2], dtype=torch.bool).view(1, 1, 1, T)}[kind]()
    torch.manual_seed(5)
    out = dropout_attention(q, k, v, mask, 0.3)
    torch.manual_seed(5)
    keep = keep_mask((B * H, T, T), 0.3).view(B, H, T, T)
    scale = 2**32 / (2**32 - round(0.3 * 2**32))
    ref = (attention_weights(q, k, mask) * keep * scale) @ v
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    g = torch.randn_like(out)
    for a, b in zip(torch.autograd.grad(out, (q, k, v), g), torch.autograd.grad(ref, (q, k, v), g), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)
    if kind == "empty row":
        assert float(out.detach()[0].abs().max()) == 0.0


def test_sdpa_attention_takes_the_packed_path_only_for_cpu_dropout_in_fp32():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 5, 4) for _ in range(3))
    torch.manual_seed(1)
    ours = sdpa_attention(q, k, v, None, 0.2, True, None)
    torch.manual_seed(1)
    ref = dropout_attention(q, k, v, make_causal_mask(5, 5).view(1, 1, 5, 5), 0.2)
    torch.testing.assert_close(ours, ref)
    torch.testing.assert_close(sdpa_attention(q, k, v, None, 0.0, True, None),
                               F.scaled_dot_product_attention(q, k, v, is_causal=True))
    # expected output of dropout: the mean over many draws approaches attention without dropout
    torch.manual_seed(2)
    mean = torch.stack([sdpa_attention(q, k, v, None, 0.2, False, None) for _ in range(3000)]).mean(0)
    torch.testing.assert_close(mean, F.scaled_dot_product_attention(q, k, v), rtol=0.0, atol=0.05)


@pytest.mark.parametrize("chunk", [3, 6])
def test_attention_in_chunks_of_rows_equals_one_pass_on_the_same_masks(chunk):
    """Chunks (a multiple of the heads) draw their parts of the mask in turn: with an even (T, S) the words are the
    same as one draw's, so the outputs and gradients equal the unchunked call's."""
    torch.manual_seed(0)
    B, H, T, Dh = 4, 3, 6, 4
    q, k, v = (torch.randn(B, H, T, Dh, dtype=torch.float64, requires_grad=True) for _ in range(3))
    mask = torch.tensor([[1] * 6, [1] * 5 + [0], [1] * 2 + [0] * 4, [1] * 6], dtype=torch.bool).view(B, 1, 1, T)
    g = torch.randn(B, H, T, Dh, dtype=torch.float64)
    results = []
    for c in (B * H, chunk):
        torch.manual_seed(9)
        out = dropout_attention(q, k, v, mask, 0.2, chunk=c)
        results.append((out, *torch.autograd.grad(out, (q, k, v), g)))
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_draws_the_packed_mask_and_scales_in_fp32(dtype):
    """bf16 / fp16 (autocast): the packed draw, a 0/1 mask, and the scale applied as a number (fp32 arithmetic,
    rounded once, as torch's dropout): kept elements are x / (1 - p) rounded, not x times a rounded 1.109."""
    p = 0.1
    x = torch.randn(300, 257, generator=torch.Generator().manual_seed(1)).to(dtype).requires_grad_()
    torch.manual_seed(0)
    y = dropout(x, p)
    torch.manual_seed(0)
    keep = keep_mask(x.shape, p)  # the same draws from the same state
    scale = 2**32 / (2**32 - round(p * 2**32))
    want = (x.detach().float() * keep * scale).to(dtype)  # one rounding of the exact product
    assert y.dtype == dtype and torch.equal(y, want)
    assert 0.88 < keep.float().mean() < 0.92
    g = torch.randn(x.shape, generator=torch.Generator().manual_seed(2)).to(dtype)
    (grad,) = torch.autograd.grad(y, x, g)
    assert torch.equal(grad, (g.float() * keep * scale).to(dtype))
    ones = dropout(torch.ones(200, 500, dtype=dtype), p)
    torch.testing.assert_close(ones[ones != 0].float().mean(), torch.tensor(1 / 0.9).to(dtype).float())


def test_other_devices_fall_back_to_torch_dropout():
    x = torch.ones(3, 4, device="meta")
    assert not uses_packed_masks(x)
    assert dropout(x, 0.1).shape == x.shape

"""Every CPU speed kernel of ``lmforge.nn.kernels.KERNEL_TABLE`` against its plain reference on small random inputs:
the same forward values and, where the kernel has a backward, the same gradients (random kernels from the same
generator state). A kernel added to the table without a case here fails ``test_every_kernel_has_a_case``."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import pytest
import torch

from lmforge.nn import kernels
from lmforge.nn.kernels import KERNEL_TABLE

Case = tuple[tuple[Any, ...], list[torch.Tensor], bool]  # (arguments, inputs to differentiate, in no_grad mode)


def _leaf(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)).requires_grad_()


def _packed_dropout() -> Case:
    x = _leaf(5, 7, seed=0)  # 35 elements: the last 64-bit word gives one lane only
    return (x, 0.3), [x], False


def _dropout_attention() -> Case:
    q, k, v = (_leaf(2, 3, 4, 6, seed=s) for s in (1, 2, 3))  # (B, H, T = S, Dh): an even (T, S) per row
    mask = torch.tensor([[1] * 4, [1] * 3 + [0]], dtype=torch.bool).view(2, 1, 1, 4)  # padding in the second row
    return (q, k, v, mask, 0.25), [q, k, v], False


def _lowp_attention() -> Case:
    q, k, v = (_leaf(3, 2, 5, 4, seed=s) for s in (12, 13, 14))  # (B, H, T, Dh)
    mask = torch.ones(3, 1, 5, 5, dtype=torch.bool).tril()  # causal, with a sequence of padding only
    mask[2] = False
    return (q, k, v, mask), [q, k, v], False


def _few_rows() -> Case:
    g = torch.Generator().manual_seed(4)
    x, weight = torch.randn(3, 8, generator=g), torch.randn(50, 8, generator=g)  # inference only: no gradient
    return (x, weight), [], True


def _packing() -> Case:
    torch.manual_seed(5)
    layer = torch.nn.Linear(6, 5).double()
    x = _leaf(3, 7, 6, seed=6)
    key_mask = torch.tensor([[1] * 7, [1] * 2 + [0] * 5, [1] * 5 + [0] * 2], dtype=torch.bool)
    return (lambda h: torch.tanh(layer(h)), x, key_mask), [x, layer.weight, layer.bias], False


def _linear_ce() -> Case:
    hidden, weight = _leaf(10, 8, seed=7), _leaf(13, 8, seed=8)
    labels = torch.randint(0, 13, (10,), generator=torch.Generator().manual_seed(9))
    labels[[2, 9]] = -100  # rows without a target
    return (hidden, weight, labels), [hidden, weight], False


def _tied_embedding() -> Case:
    weight = _leaf(11, 6, seed=10)
    ids = torch.randint(0, 11, (2, 5), generator=torch.Generator().manual_seed(11))
    return (ids, weight), [weight], False


CASES: dict[str, Callable[[], Case]] = {
    "packed_dropout": _packed_dropout,
    "dropout_attention": _dropout_attention,
    "lowp_attention": _lowp_attention,
    "few_rows": _few_rows,
    "packing": _packing,
    "linear_ce": _linear_ce,
    "tied_embedding": _tied_embedding,
}


def _run(fn: Callable[..., Any], args: tuple[Any, ...], inputs: list[torch.Tensor],
         no_grad: bool) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(outputs, gradients of the outputs against fixed random cotangents with respect to ``inputs``)."""
    torch.manual_seed(1234)  # the random kernels draw from the default generator: the same masks for both
    with torch.set_grad_enabled(not no_grad):
        result = fn(*args)
    outputs = list(result) if isinstance(result, tuple) else [result]
    differentiable = [o for o in outputs if o.requires_grad]
    if not inputs or not differentiable:
        return outputs, []
    g = torch.Generator().manual_seed(99)
    cotangents = [torch.randn(o.shape, dtype=o.dtype, generator=g) for o in differentiable]
    return outputs, list(torch.autograd.grad(differentiable, inputs, cotangents))


def test_every_kernel_has_a_case():
    assert set(KERNEL_TABLE) == set(CASES)
    for entry in KERNEL_TABLE.values():
        assert callable(entry.fast) and callable(entry.reference) and entry.fast is not entry.reference
        assert entry.description and "\n" not in entry.description


@pytest.mark.parametrize("name", sorted(KERNEL_TABLE))
def test_the_fast_kernel_equals_its_reference(name):
    entry = KERNEL_TABLE[name]
    args, inputs, no_grad = CASES[name]()
    fast_out, fast_grads = _run(entry.fast, args, inputs, no_grad)
    ref_out, ref_grads = _run(entry.reference, args, inputs, no_grad)
    assert len(fast_out) == len(ref_out)
    for a, b in zip(fast_out, ref_out, strict=True):
        assert a.shape == b.shape
        if a.is_floating_point():
            torch.testing.assert_close(a, b.to(a.dtype), rtol=1e-5, atol=1e-6)
        else:
            assert torch.equal(a, b)
    if not no_grad:
        assert fast_grads, f"{name}: no gradient to compare"
    assert len(fast_grads) == len(ref_grads)
    for a, b in zip(fast_grads, ref_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("old, new", [
    ("lmforge.nn.packed_dropout", "lmforge.nn.kernels.packed_dropout"),
    ("lmforge.nn.packed_dropout", "lmforge.nn.kernels.dropout_attention"),
    ("lmforge.nn.few_rows", "lmforge.nn.kernels.few_rows"),
    ("lmforge.nn.packing", "lmforge.nn.kernels.packing"),
    ("lmforge.nn.linear_ce", "lmforge.nn.kernels.linear_ce"),
    ("lmforge.nn.tied_embedding", "lmforge.nn.kernels.tied_embedding"),
])
def test_the_old_module_paths_re_export_the_kernels(old, new):
    old_module, new_module = importlib.import_module(old), importlib.import_module(new)
    for name in old_module.__all__:
        if hasattr(new_module, name):
            assert getattr(old_module, name) is getattr(new_module, name), name
    assert any(hasattr(new_module, name) for name in old_module.__all__)
    assert kernels.KERNEL_TABLE is KERNEL_TABLE

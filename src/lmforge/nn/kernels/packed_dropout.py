"""Dropout with a cheaper mask on a CPU: 32-bit random lanes packed two to a 64-bit draw (issue 22, item 2).

Shape legend: masks have the shape of the tensor they drop from (any shape); n elements in all.

``F.dropout`` on a CPU draws its mask with ``bernoulli_``, one random number per element, and that draw is most of a
dropout's cost (85% of a forward + backward on a (16, 6, 128, 128) tensor here) and runs on one thread. Here the mask
comes from ``random_`` over full-range int64 words, each read as two independent uniform 32-bit integers, compared
with a threshold: an element is dropped when its lane falls among the lowest ``round(p 2^32)`` of the 2^32 values.
So the drop probability is ``p`` rounded to a multiple of 2^-32 (torch's own CPU ``bernoulli_`` resolves it no finer)
and kept elements are scaled by the exact inverse of the keep probability, so the expectation is unchanged. The
comparison writes the mask straight in the tensor's dtype, already scaled, so forward and backward are one
multiplication each.

Measured on 2 AVX-512 cores, forward + backward: 1.9x ``F.dropout`` on (16, 128, 192), 2.4-2.5x on (16, 6, 128, 128),
(32, 128, 384) and (32, 12, 128, 128).

The attention weights' dropout, with the same masks, is ``lmforge.nn.kernels.dropout_attention``.

The draws come from torch's default CPU generator (or the one passed), so a seed fixes the masks and a resumed run
that restores the generator's state draws the same ones; ``random_`` is serial on a CPU, so the masks do not depend
on the thread count. Under ``torch.compile`` the words come from ``torch.randint_like`` (the same numbers, no graph
break; ``--compile`` keeps inductor on the eager random stream), so compiled and eager training draw the same masks.
In bf16 or fp16 (autocast) the mask holds 0 or 1 and the scale is a separate multiplication by the Python number,
which PyTorch computes in fp32 and rounds once, as its own dropout does (a scale stored in a bf16 mask would be
rounded, 1/0.9 to 1.109, a bias of every kept element): one more pass than in fp32, still 2.3x ``F.dropout``'s
``bernoulli_`` draw on (8, 128, 768). On other devices (whose own dropout kernels are fast) everything falls back to
PyTorch's own dropout, whose random stream differs from this one.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmforge.nn.capture import capturing

__all__ = ["Dropout", "dropout", "keep_mask", "plain_dropout", "scaled_keep_mask", "scales_in_mask",
           "uses_packed_masks"]

_LANES = 2**32


def _threshold(p: float) -> tuple[int, float]:
    """(int32 threshold: keep when lane >= it, scale of kept elements) for drop probability ``p`` in (0, 1)."""
    dropped = round(p * _LANES)
    return dropped - _LANES // 2, _LANES / (_LANES - dropped)


def _lanes(n: int, device: torch.device | str, generator: torch.Generator | None) -> Tensor:
    """(n,) uniform int32: the two halves of (n + 1) // 2 full-range int64 draws."""
    if capturing() and generator is None:  # the same numbers out of place (TorchDynamo breaks
        # the graph at random_; randint_like, unlike randint, also takes symbolic sizes)
        words = torch.randint_like(torch.empty((n + 1) // 2, dtype=torch.int64, device=device), -(2**63), 2**63 - 1)
    else:
        words = torch.empty((n + 1) // 2, dtype=torch.int64, device=device)
        words.random_(-(2**63), 2**63 - 1, generator=generator)
    return words.view(torch.int32)[:n]


def _check(p: float) -> None:
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"the drop probability must be in [0, 1]; got {p}")


def keep_mask(shape: torch.Size | tuple[int, ...], p: float, device: torch.device | str = "cpu",
              generator: torch.Generator | None = None) -> Tensor:
    """A bool mask of ``shape``, True (kept) with probability 1 - p (p rounded to a multiple of 2^-32): the draws of
    ``scaled_keep_mask`` with the same arguments.

    Args:
        shape: the mask's shape.
        p: the drop probability, in [0, 1].
        device: where to draw it.
        generator: the random generator (default: torch's default for the device).
    """
    return scaled_keep_mask(shape, p, torch.float32, device, generator) > 0


def scaled_keep_mask(shape: torch.Size | tuple[int, ...], p: float, dtype: torch.dtype,
                     device: torch.device | str = "cpu", generator: torch.Generator | None = None) -> Tensor:
    """``keep_mask`` as ``dtype`` values: 1 / (1 - p) where kept, 0 where dropped (the same draws), the factor a
    dropout multiplies by. Written straight from the comparison, which is several times cheaper than multiplying
    by a bool mask (a hidden conversion) or ``where``, and lets backward be one multiplication."""
    return _mask_values(shape, p, dtype, device, generator, scaled=True)


def _mask_values(shape: torch.Size | tuple[int, ...], p: float, dtype: torch.dtype, device: torch.device | str,
                 generator: torch.Generator | None, *, scaled: bool) -> Tensor:
    """The mask as ``dtype`` values: kept = 1 / (1 - p) (``scaled``) or 1, dropped = 0."""
    _check(p)
    n = math.prod(shape)
    if p == 0.0 or p == 1.0 or n == 0:  # (at p = 0 the scale is 1)
        return torch.full(tuple(shape), 1.0 if p < 1.0 else 0.0, dtype=dtype, device=device)
    threshold, scale = _threshold(p)
    mask = torch.ge(_lanes(n, device, generator), threshold, out=torch.empty(n, dtype=dtype, device=device))
    return (mask.mul_(scale) if scaled else mask).view(tuple(shape))


def scales_in_mask(x: Tensor) -> bool:
    """Whether the scale 1 / (1 - p) may be stored in a mask of ``x``'s dtype: fp32 or fp64 (in bf16 or fp16 it
    would be rounded, e.g. 1/0.9 to 1.109 in bf16, a bias of every kept element)."""
    return x.dtype in (torch.float32, torch.float64)


def uses_packed_masks(x: Tensor) -> bool:
    """Whether ``dropout`` draws its own mask for ``x``: a floating-point CPU tensor."""
    return x.device.type == "cpu" and (scales_in_mask(x) or x.dtype in (torch.bfloat16, torch.float16))


class _PackedDropout(torch.autograd.Function):
    """fp32/fp64: x times the scaled mask (forward and backward one multiplication each). bf16/fp16: x times the 0/1
    mask, then times the scale as a Python number (computed in fp32 and rounded once, as torch's dropout)."""

    @staticmethod
    def forward(ctx, x: Tensor, p: float) -> Tensor:  # type: ignore[override]
        exact = scales_in_mask(x)
        mask = _mask_values(x.shape, p, x.dtype, x.device, None, scaled=exact)
        ctx.save_for_backward(mask)
        ctx.scale = None if exact else _threshold(p)[1]
        return x * mask if exact else (x * mask).mul_(ctx.scale)

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        (mask,) = ctx.saved_tensors
        return (grad * mask if ctx.scale is None else (grad * mask).mul_(ctx.scale)), None


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """``F.dropout(x, p, training)`` with the packed mask on a CPU (see the module docstring)."""
    if not training or p == 0.0:
        return x
    if p == 1.0 or not uses_packed_masks(x):
        return F.dropout(x, p, training)
    return _PackedDropout.apply(x, p)


class Dropout(nn.Dropout):
    """``nn.Dropout`` (same arguments, same state) whose CPU mask is drawn as ``dropout`` draws it."""

    def forward(self, x: Tensor) -> Tensor:
        if self.inplace or not self.training:
            return super().forward(x)
        return dropout(x, self.p, True)


def plain_dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """The reference of ``dropout``, written out: ``x`` times the bool ``keep_mask`` drawn from torch's default
    generator, times the exact inverse of the keep probability (p rounded to a multiple of 2^-32). From the same
    generator state it equals ``dropout`` on an fp32 or fp64 CPU tensor, forward and backward, by autograd."""
    if not training or p == 0.0:
        return x
    if p == 1.0:
        return x * 0.0
    keep = keep_mask(x.shape, p, x.device)
    return x * keep.to(x.dtype) * (_LANES / (_LANES - round(p * _LANES)))

"""``x @ W^T`` for a few rows against a wide matrix: the vocabulary projection of a decoding step.

Shape legend: M rows (live sequences of a decoding step), D state width, V vocabulary; N rows of an out buffer.

A decoding step projects one row per live sequence (1 for greedy search on one prompt, beams x prompts for beam
search) onto the whole vocabulary: ``F.linear(x, W)`` with x (M, D), M = 1..16, and W (V, D), V up to 50,257. On a
CPU the BLAS call ``F.linear`` makes for such a short, wide product is far from the cost of reading W once, while the
same product taken as ``W @ x^T`` (the matrix on the left, untransposed) runs at memory speed; for M = 1 that path
degenerates to a matrix-vector product that is as slow again, so the row is doubled. Measured on an AVX-512 CPU with
torch 2.13 (MKL), gpt-mini's head (50,257 x 192), one thread: M = 1: 3.3 ms with ``F.linear``, 1.5 ms as ``W @ x^T``
with the row doubled; M = 2: 5.5 against 1.5 ms; M = 4: 4.1 against 1.8 ms; M = 8: 4.9 against 3.4 ms; from M = 12
on the two are even.

Which is faster depends on the BLAS and the CPU, so ``project_rows`` does not assume it: the first time it meets a
(rows, V, D, dtype, threads) combination it times each form a few times and keeps the faster for the rest of the
process. The forms compute the same dot products (fp32 sums, in orders that may differ in the last bits), so a choice
never changes more than rounding. Only for inference (no gradient), on a CPU, and for at most ``MAX_ROWS`` rows;
everything else is ``F.linear``.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from lmforge.nn.capture import capturing

__all__ = ["FORMS", "MAX_ROWS", "plain_project_rows", "project_rows"]

MAX_ROWS = 16
_TRIALS = 3
_CHOICE: dict[tuple[int, int, int, torch.dtype, int], str] = {}


def _linear(x: Tensor, weight: Tensor) -> Tensor:
    return F.linear(x, weight)


def _left(x: Tensor, weight: Tensor) -> Tensor:
    """W @ x^T, transposed back; a single row is doubled (a matrix-vector product is the slow case again)."""
    if x.shape[0] == 1:
        return torch.mm(weight, torch.cat((x, x)).t())[:, :1].t().contiguous()
    return torch.mm(weight, x.t()).t().contiguous()


def _left4(x: Tensor, weight: Tensor) -> Tensor:
    """W @ x^T with the rows padded to four (some BLAS kernels are fastest there), transposed back."""
    rows = x.shape[0]
    padded = torch.cat((x, x.new_zeros((4 - rows, x.shape[1]))))
    return torch.mm(weight, padded.t())[:, :rows].t().contiguous()


FORMS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {"linear": _linear, "left": _left, "left4": _left4}


def _time(form: Callable[[Tensor, Tensor], Tensor], x: Tensor, weight: Tensor) -> float:
    form(x, weight)  # warm-up
    best = float("inf")
    for _ in range(_TRIALS):
        start = time.perf_counter()
        form(x, weight)
        best = min(best, time.perf_counter() - start)
    return best


def _choose(x: Tensor, weight: Tensor) -> str:
    key = (x.shape[0], weight.shape[0], weight.shape[1], x.dtype, torch.get_num_threads())
    choice = _CHOICE.get(key)
    if choice is None:
        names = ["linear", "left"] + (["left4"] if x.shape[0] < 4 else [])
        choice = min(names, key=lambda name: _time(FORMS[name], x, weight))
        _CHOICE[key] = choice
    return choice


def project_rows(x: Tensor, weight: Tensor, out: Tensor | None = None) -> Tensor:
    """``F.linear(x, weight)`` for (..., D) states and a (V, D) weight, faster for a few rows on a CPU at inference.

    Args:
        x: (..., D).
        weight: (V, D).
        out: (N, V) for a 2-D ``x`` of N rows, without gradients: where the plain product is taken, it is written
            there (a decoding loop reuses one buffer instead of a fresh (N, V) tensor per step, which glibc maps
            afresh); the few-row forms return their own small tensor. None: a new tensor.

    Returns:
        (..., V): ``out`` itself, or a new tensor.
    """
    grad = torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)
    if (x.dim() != 2 or x.shape[0] > MAX_ROWS or x.shape[0] == 0 or x.device.type != "cpu"
            or weight.dim() != 2 or x.shape[1] != weight.shape[1]
            or x.dtype != weight.dtype or not x.is_floating_point() or capturing() or grad):
        if (out is not None and not grad and x.dim() == 2 and weight.dim() == 2
                and out.shape == (x.shape[0], weight.shape[0]) and out.dtype == x.dtype == weight.dtype
                and out.device == x.device and not capturing()):
            return torch.mm(x, weight.t(), out=out)  # (N, V), what F.linear computes
        return F.linear(x, weight)
    return FORMS[_choose(x, weight)](x, weight)


def plain_project_rows(x: Tensor, weight: Tensor, out: Tensor | None = None) -> Tensor:
    """The reference of ``project_rows``: ``F.linear(x, weight)`` (``out`` is ignored)."""
    return F.linear(x, weight)

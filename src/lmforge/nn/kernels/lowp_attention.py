"""Attention for bf16 operands on a CPU: the scores, the softmax and any dropout mask in fp32, in row chunks.

Shape legend: B batch, H heads, T queries, S keys, Dh head dim; N = B x H rows of (T, S) weights.

Under bf16 autocast, ``scaled_dot_product_attention`` on a CPU runs its flash kernel in bf16, whose backward is slow:
forward + backward 16.9 ms at bert-mini's pretraining shape (32, 4, 64, 64), against 9.8 ms for the same kernel in
fp32 (one thread, AMD EPYC with AVX512_BF16). ``lowp_attention`` computes what that kernel computes, to the same
precision: q k^T and softmax in fp32 (on fp32 copies of one chunk of rows at a time), the weights times v in the
operands' dtype (as autocast would), and a backward that takes softmax's row sums from the (T, Dh) output (flash
attention's identity sum_j dP_ij P_ij = dO_i . O_i) with dP, dq and dk in fp32. The rows go through in chunks whose
fp32 (T, S) scores, weights and gradient stay near the core's level-2 cache. Forward + backward: 2.1-2.8x the bf16
flash kernel at T = S = 64 and 128, 1.2x at 256; forward alone (inference) 1.3-1.4x
(``benchmarks/bench_lowp_attention.py``).

With dropout on the weights (``dropout_p``) each chunk draws its part of ``lmforge.nn.kernels.packed_dropout``'s mask
in fp32, as ``lmforge.nn.kernels.dropout_attention`` does; against that kernel on fp32 copies of q, k and v (the
earlier bf16 path) 1.23x forward + backward at (8, 12, 128, 64), (16, 4, 128, 64) and (32, 4, 64, 64).

``lmforge.nn.attention.sdpa_attention`` calls it for bf16 operands on a CPU, with or without dropout, outside
``torch.compile`` and export, up to the sizes where it was measured to pay (``lowp_pays``). The kernel takes any
floating dtype; fp16 on a CPU was not measured and keeps torch's kernels.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lmforge.nn.kernels.dropout_attention import attention_bias, autocast_off
from lmforge.nn.kernels.packed_dropout import scaled_keep_mask
from lmforge.utils.hardware import l2_cache_bytes

__all__ = ["LOWP_CACHE_MULTIPLE", "LOWP_MAX_SCORES", "LOWP_MAX_TRAIN_SCORES", "LOW_PRECISION", "lowp_attention",
           "lowp_pays", "plain_lowp_attention"]

LOW_PRECISION = (torch.bfloat16,)  # the operand dtypes sdpa_attention sends here (measured)
# the largest (T x S) scores per row for which the chunks beat torch's bf16 flash kernel (measured, one thread, AMD
# EPYC): with gradients 1.95-2.76x at T = S <= 128, 1.15x at 256, level at 512, 0.77x at 1,024 (the flash kernel
# never holds the (T, S) weights); forward alone 1.31-1.42x from 64 to 512
LOWP_MAX_TRAIN_SCORES = 256 * 256
LOWP_MAX_SCORES = 512 * 512
LOWP_CACHE_MULTIPLE = 2  # one chunk's fp32 (T, S) scores, weights and gradient: about this many level-2 caches
_L2_BYTES = l2_cache_bytes()  # read once (sysfs)


def lowp_pays(q: Tensor, T: int, S: int) -> bool:
    """Whether ``lowp_attention`` beats torch's kernels for queries ``q`` (``LOW_PRECISION`` on a CPU), ``T`` of
    them over ``S`` keys, with gradients or without."""
    if q.device.type != "cpu" or q.dtype not in LOW_PRECISION:
        return False
    grad = torch.is_grad_enabled() and q.requires_grad
    return T * S <= (LOWP_MAX_TRAIN_SCORES if grad else LOWP_MAX_SCORES)


def _chunk_rows(rows: int, T: int, S: int, heads: int) -> int:
    """Rows of (N, T, S) per chunk: whose three fp32 (T, S) tensors fit ``LOWP_CACHE_MULTIPLE`` level-2 caches; a
    multiple of ``heads`` (the rows that share one sequence's bias), or a divisor of it when one sequence's rows are
    already too many."""
    fit = max(1, LOWP_CACHE_MULTIPLE * _L2_BYTES // (3 * T * S * 4))
    if fit >= heads:
        return min(rows, fit // heads * heads)
    return max(d for d in range(1, heads + 1) if heads % d == 0 and d <= fit)


def _add_bias(scores: Tensor, bias: Tensor, a: int, b: int, heads: int) -> None:
    """Add the rows [a, b)'s part of ``bias`` ((1 | B | N, 1, T|1, S)) to their (b - a, T, S) ``scores``, in place."""
    T, S = scores.shape[-2:]
    if bias.shape[0] == 1:
        scores.add_(bias[0])
    elif b - a <= heads and a // heads == (b - 1) // heads:  # a chunk within one sequence's heads
        scores.add_(bias[a // heads])
    else:
        scores.view((b - a) // heads, heads, T, S).add_(bias[a // heads:b // heads])


class _LowpAttention(torch.autograd.Function):
    """softmax(q k^T scale + bias) v on (N, T, Dh) operands, the scores in fp32, in chunks of rows."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None,  # type: ignore[override]
                row_valid: Tensor | None, scale: float, heads: int, chunk: int, keep: bool, p: float) -> Tensor:
        N, T, Dh = q.shape
        S = k.shape[1]
        acc = torch.promote_types(q.dtype, torch.float32)
        out = q.new_empty((N, T, Dh))
        probs = torch.empty((N, T, S), dtype=acc, device=q.device) if keep else None
        masks = torch.empty((N, T, S), dtype=acc, device=q.device) if keep and p > 0.0 else None
        for a in range(0, N, chunk):
            b = min(N, a + chunk)
            scores = torch.bmm(q[a:b].to(acc) * scale, k[a:b].to(acc).transpose(1, 2))  # (n, T, S)
            if bias is not None:
                _add_bias(scores, bias, a, b, heads)
            weights = torch.softmax(scores, dim=-1, out=probs[a:b]) if probs is not None else scores.softmax(-1)
            del scores
            if row_valid is not None:  # rows with no key to attend to: zero weights
                weights.mul_(row_valid[a:b])
            if p > 0.0:  # dropout on the weights: this chunk's part of the packed mask, 0 or 1 / (1 - p)
                drop = scaled_keep_mask((b - a, T, S), p, acc, q.device)
                if masks is not None:
                    masks[a:b] = drop
                weights = weights * drop
            torch.bmm(weights.to(v.dtype), v[a:b], out=out[a:b])
        if keep:
            ctx.save_for_backward(q, k, v, probs, masks, out)
        ctx.scale, ctx.chunk = scale, chunk
        return out

    @staticmethod
    @autocast_off
    def backward(ctx, dout: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        q, k, v, probs, masks, out = ctx.saved_tensors
        acc = probs.dtype
        dout = dout.contiguous()
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        for a in range(0, q.shape[0], ctx.chunk):
            b = min(q.shape[0], a + ctx.chunk)
            weights = probs[a:b]  # (n, T, S) fp32
            dropped = weights if masks is None else weights * masks[a:b]  # what multiplied v
            torch.bmm(dropped.to(v.dtype).transpose(1, 2), dout[a:b], out=dv[a:b])  # (n, S, Dh), as the forward
            d32 = dout[a:b].to(acc)
            dweights = torch.bmm(d32, v[a:b].to(acc).transpose(1, 2))  # (n, T, S)
            if masks is not None:
                dweights.mul_(masks[a:b])  # the gradient of the weights before dropout
            rows = (d32 * out[a:b].to(acc)).sum(-1, keepdim=True)  # (n, T, 1) = sum_j dP_ij P_ij (dropout folded in)
            dscores = dweights.sub_(rows).mul_(weights)  # softmax's backward; zero where a weight is zero
            dq[a:b] = torch.bmm(dscores, k[a:b].to(acc)).mul_(ctx.scale)
            dk[a:b] = torch.bmm(dscores.transpose(1, 2), q[a:b].to(acc)).mul_(ctx.scale)
        return dq, dk, dv, None, None, None, None, None, None, None


def lowp_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float | None = None,
                   chunk: int | None = None, dropout_p: float = 0.0) -> Tensor:
    """softmax(q k^T * scale, masked) v for low-precision operands: the scores and the softmax in fp32, the weights
    times v in the operands' dtype; rows with no key to attend to give zeros (see the module docstring).

    Args:
        q: (B, H, T, Dh); k, v: (B, H, S, Dh), one floating dtype.
        mask: bool broadcastable to (B, H, T, S), True = may attend (a causal mask folded in); or None.
        scale: score multiplier, default 1 / sqrt(Dh).
        chunk: (B*H) rows per chunk (default: sized to the level-2 cache); a multiple or a divisor of the heads a
            per-sequence mask is shared by.
        dropout_p: dropout on the weights (training), in [0, 1): ``lmforge.nn.kernels.packed_dropout``'s mask in
            fp32, each chunk of rows drawing its part in turn (as ``dropout_attention``).

    Returns:
        (B, H, T, Dh) in the operands' dtype.
    """
    B, H, T, Dh = q.shape
    S = k.shape[-2]
    scale = Dh ** -0.5 if scale is None else scale
    acc = torch.promote_types(q.dtype, torch.float32)
    bias, row_valid, heads = attention_bias(mask, B, H, T, S, acc, q.device)
    if chunk is not None and (chunk < 1 or (chunk % heads and heads % chunk)):
        raise ValueError(f"chunk must be a positive multiple or divisor of {heads} (batch x head) rows; got {chunk}")
    chunk = _chunk_rows(B * H, T, S, heads) if chunk is None else chunk
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1); got {dropout_p}")
    keep = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    with torch.autocast(q.device.type, enabled=False):  # the fp32 products stay fp32 under autocast
        out = _LowpAttention.apply(q.reshape(B * H, T, Dh), k.reshape(B * H, S, Dh), v.reshape(B * H, S, Dh),
                                   bias, row_valid, scale, heads, chunk, keep, float(dropout_p))
    return out.view(B, H, T, Dh)


def plain_lowp_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float | None = None,
                         dropout_p: float = 0.0) -> Tensor:
    """The reference of ``lowp_attention``, written out for autograd: softmax of the fp32 (fp64 for fp64 operands)
    scores (fully masked rows 0), times the scaled keep mask of (B x H, T, S) with dropout, cast to the operands'
    dtype, times v. From the same generator state it equals ``lowp_attention`` whenever that draws its mask in one
    chunk, or in chunks of an even number of elements (as ``plain_dropout_attention``).

    Args and Returns: as ``lowp_attention`` (without ``chunk``).
    """
    acc = torch.promote_types(q.dtype, torch.float32)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = (q.to(acc) * scale) @ k.to(acc).transpose(-2, -1)  # (B, H, T, S)
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(acc).min)
    weights = scores.softmax(dim=-1)
    if mask is not None:
        weights = weights.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)
    if dropout_p > 0.0:
        B, H, T, S = weights.shape
        weights = weights * scaled_keep_mask((B * H, T, S), dropout_p, acc, q.device).view(B, H, T, S)
    return weights.to(v.dtype) @ v  # (B, H, T, Dh)

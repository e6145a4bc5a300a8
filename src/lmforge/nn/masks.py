"""Attention masks: the ONE place that fixes mask polarity and dtype.

Shape legend: B batch, T target (query) length, S source (key) length, H heads.

Conventions followed by everything in ``lmforge.nn``:

- ``attention_mask`` at API boundaries is (B, S) with **1 = real token, 0 = padding** (bool, integer or 0./1.
  float). It masks keys; padded queries still produce an output, which callers ignore.
- Internally a mask is a **bool** tensor broadcastable to (B, H, T, S) with **True = this query may attend this
  key** (the polarity of the bool ``attn_mask`` of ``torch.nn.functional.scaled_dot_product_attention``).
- Additive float masks (0 = keep, ``torch.finfo(dtype).min`` = drop) are produced only by ``to_additive_mask``,
  for code that needs them (e.g. Hugging Face style kernels). We use ``finfo.min`` rather than ``-inf`` so that
  ``min - min = 0`` can never turn into ``-inf - -inf = NaN``.
- **Fully masked rows** (a query that may attend no key: a left-padding query under a causal mask, or a sequence
  that is all padding) produce **zero weights and a zero output**, never NaN and never a uniform average. A
  query with nothing to look at contributes nothing; its output is padding that callers ignore anyway.
  ``guard_empty_rows`` implements this for every kernel.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lmforge.errors import LmforgeError

__all__ = [
    "combine_masks",
    "guard_empty_rows",
    "key_padding_mask",
    "make_causal_mask",
    "padding_to_key_mask",
    "positions_from_mask",
    "to_additive_mask",
]


def make_causal_mask(T: int, S: int | None = None, *, device: torch.device | str | None = None) -> Tensor:
    """Causal (look-back) mask for a block of T queries over S keys.

    The queries are the **last** T of the S positions (bottom-right alignment), which is what cached decoding
    needs: query i sits at absolute position ``S - T + i`` and may attend keys ``0 .. S - T + i``. With S == T this
    is the usual lower-triangular mask.

    Args:
        T: number of queries.
        S: number of keys (default T); must be >= T.
        device: where to build the mask.

    Returns:
        (T, S) bool, True = may attend.
    """
    S = T if S is None else S
    if T < 0 or S < T:
        raise LmforgeError(
            f"a causal mask needs 0 <= T <= S (the queries are the last T of S positions); got T={T}, S={S}")
    return torch.ones(T, S, dtype=torch.bool, device=device).tril(diagonal=S - T)  # (T, S)


def padding_to_key_mask(attention_mask: Tensor) -> Tensor:
    """Turn a boundary ``attention_mask`` (1 = real token, 0 = padding) into a bool key mask.

    Args:
        attention_mask: (B, S) bool, integer, or float holding only 0 and 1.

    Returns:
        (B, 1, 1, S) bool, True = real key (may be attended), broadcastable over heads and queries.
    """
    if attention_mask.dim() != 2:
        raise LmforgeError(
            f"attention_mask must be (batch, length) with 1 = real token, 0 = padding; got shape "
            f"{tuple(attention_mask.shape)}")
    if attention_mask.dtype == torch.bool:
        keep = attention_mask
    else:
        if attention_mask.is_floating_point() and bool(((attention_mask != 0) & (attention_mask != 1)).any()):
            # An additive mask (0 / -10000 / -inf) passed where a 1/0 mask belongs would silently invert meaning.
            raise LmforgeError(
                "attention_mask holds values other than 0 and 1 (an additive mask?); pass 1 = real token, "
                "0 = padding")
        keep = attention_mask != 0
    return keep[:, None, None, :]  # (B, 1, 1, S)


def key_padding_mask(attention_mask: object, *, batch: int | None = None, length: int | None = None,
                     name: str = "attention_mask", length_label: str | None = None) -> Tensor:
    """Check a boundary mask (1 = real token, 0 = padding) and turn it into a (B, S) bool mask, True = real token.

    Every model takes its padding masks through here, so that a mask of the wrong shape, a complex mask or an
    additive mask (0 / -10000) is rejected with the same words everywhere, and the (B, S) bool layout that the
    layers and ``StackedRNN`` take is built in one place.

    Args:
        attention_mask: (B, S) bool, integer, or float holding only 0 and 1.
        batch: B the mask must have (the rows of the ids it goes with); None = any.
        length: S the mask must have; None = any.
        name: the argument's name in the caller's signature, for the message (e.g. "src_mask").
        length_label: how the message describes S (default ``f"length={length}"``), e.g. "source length=7" or
            "cached + new = 2 + 1 = 3" where S is not simply the length of the ids.

    Returns:
        (B, S) bool, True = real token.
    """
    want = (batch, length)
    got = tuple(attention_mask.shape) if isinstance(attention_mask, Tensor) else type(attention_mask).__name__
    if (not isinstance(attention_mask, Tensor) or attention_mask.dim() != 2
            or any(w is not None and w != g for w, g in zip(want, attention_mask.shape, strict=True))):
        where = f"batch={'B' if batch is None else batch}, "
        where += length_label or f"length={'S' if length is None else length}"
        raise LmforgeError(f"{name} must be ({where}) with 1 = real token, 0 = padding; got shape {got}")
    if attention_mask.is_complex():
        raise LmforgeError(f"{name} must be bool, integer or float (1 = real token, 0 = padding); got dtype "
                           f"{attention_mask.dtype}")
    return padding_to_key_mask(attention_mask)[:, 0, 0, :]  # (B, S) bool; rejects additive masks


def positions_from_mask(attention_mask: Tensor, T: int) -> Tensor:
    """Position ids of the last T of S positions, counting real tokens only.

    Why: a left-padded row must get the positions of the same row unpadded (so batched generation equals
    generating each prompt alone); padding gets 0 (before the first real token) or repeats (after the last), which
    is harmless because nothing attends to it.

    Args:
        attention_mask: (B, S), 1 (or True) = real token.
        T: number of new positions (the last T of the S).

    Returns:
        (B, T) long.
    """
    return ((attention_mask != 0).long().cumsum(-1) - 1).clamp(min=0)[:, -T:]  # (B, T)


def combine_masks(*masks: Tensor | None) -> Tensor | None:
    """AND together bool masks (True = may attend) with broadcasting; ``None`` entries mean "no constraint".

    Args:
        *masks: bool tensors broadcastable to a common shape, e.g. (B, 1, 1, S) padding and (T, S) causal.

    Returns:
        The broadcast conjunction, or None when every input is None.
    """
    out: Tensor | None = None
    for m in masks:
        if m is None:
            continue
        if m.dtype != torch.bool:
            raise LmforgeError(f"masks must be bool (True = may attend); got dtype {m.dtype}")
        out = m if out is None else out & m
    return out


def to_additive_mask(mask: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """Bool mask (True = may attend) -> additive float mask (0 = keep, ``finfo(dtype).min`` = drop).

    Args:
        mask: bool, any shape.
        dtype: floating dtype of the result (use the dtype of the scores it is added to).

    Returns:
        Float tensor of the same shape as ``mask``.
    """
    if mask.dtype != torch.bool:
        raise LmforgeError(f"to_additive_mask expects a bool mask (True = may attend); got dtype {mask.dtype}")
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)


def guard_empty_rows(mask: Tensor) -> tuple[Tensor, Tensor]:
    """Make a mask safe for softmax and say which query rows had at least one key.

    Args:
        mask: bool (..., T, S), True = may attend.

    Returns:
        ``(safe_mask, row_valid)``: ``safe_mask`` equals ``mask`` except that fully masked rows are opened (all True)
        so no kernel can produce NaN; ``row_valid`` is (..., T, 1) bool. Callers zero the weights/outputs of rows
        where ``row_valid`` is False (the module docstring explains why zeros).
    """
    row_valid = mask.any(dim=-1, keepdim=True)  # (..., T, 1)
    return mask | ~row_valid, row_valid

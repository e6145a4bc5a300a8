"""Unpadding: run the token-wise parts of an encoder layer on the real tokens of a padded batch only.

Shape legend: B batch, T padded length, N real tokens in the batch (N <= B x T), D width.

In a padded batch of sequences whose lengths vary (16..128 tokens at batch 32: on average 56% of the positions are
real), every projection, feed-forward network, LayerNorm and dropout of an encoder spends the rest of its time on
padding. Those operations are token-wise, so they give the same result on the packed (N, D) rows of the real
tokens; only attention mixes positions, and it runs on the padded (B, T) layout with the key mask, as before. So an
encoder layer under a ``Packing`` keeps its hidden state packed, and its self-attention scatters the projected
queries, keys and values into the padded layout, attends, and gathers the output back before the output
projection (``MultiHeadAttention.forward(packing=...)``). The scatter and the gather move 4 x N x D numbers per
layer; the GEMMs they spare move and multiply far more.

What changes for a caller: nothing at the real positions (the same function, up to float rounding of a different
GEMM shape). The outputs at padded positions, which callers ignore (``lmforge.nn.masks``), are zeros instead of the
values a padded query happened to produce. Dropout draws its masks for N rows instead of B x T, so a training run
with packing is a different (equally distributed) random draw than one without; runs resume exactly either way.

``Packing.decide`` returns None (run padded) when the batch has no padding or its real share is above
``PACK_ABOVE``: there the gather and scatter cost more than the padding they skip. An exported graph
(``lmforge.persistence.onnx``) cannot choose per batch, and always packs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from lmforge.nn.capture import one_graph

__all__ = ["PACK_ABOVE", "Packing", "ReadRows", "packed_tokenwise", "padded_tokenwise"]

# Pack only when at most this share of the positions is real (measured: at 0.9 real the saving and the gather and
# scatter cost about the same for a 6-layer 384-wide encoder on CPU).
PACK_ABOVE = 0.9


@dataclass(frozen=True)
class Packing:
    """Where the real tokens of a (B, T) padded batch are.

    Attributes:
        index: (N,) int64 flat positions ``b * T + t`` of the real tokens, in order.
        key_mask: (B, T) bool, True = real token (the attention's key mask).
        batch, length: B and T.
    """

    index: Tensor
    key_mask: Tensor
    batch: int
    length: int

    @classmethod
    def from_mask(cls, key_mask: Tensor) -> Packing:
        """From a (B, T) bool mask, True = real token."""
        B, T = key_mask.shape
        return cls(key_mask.reshape(-1).nonzero().squeeze(1), key_mask, B, T)

    @classmethod
    def decide(cls, key_mask: Tensor | None, *, enabled: bool = True) -> Packing | None:
        """A packing for ``key_mask`` when it is worth it (see the module docstring), else None."""
        # compiled training: unpadding's data-dependent size breaks the graph, but computing only the real tokens is
        # worth more than one graph without freezing (BENCHMARKS, issue 39)
        if not enabled or key_mask is None:
            return None
        if one_graph():  # one graph for every batch (exported, compiled inference): N is a graph-time size (ONNX
            return cls.from_mask(key_mask)  # NonZero), and the graph always packs: 2% slower on a batch without
            # padding, 1.7x faster at half padding (ONNX Runtime)
        packing = cls.from_mask(key_mask)
        if packing.index.numel() > PACK_ABOVE * key_mask.numel() or packing.index.numel() == 0:
            return None
        return packing

    @property
    def tokens(self) -> int:
        """N."""
        return self.index.numel()

    def pack(self, x: Tensor) -> Tensor:
        """(B, T, ...) -> (N, ...): the rows of the real tokens."""
        return x.reshape(self.batch * self.length, *x.shape[2:]).index_select(0, self.index)

    def unpack(self, x: Tensor) -> Tensor:
        """(N, ...) -> (B, T, ...): the rows back in place, zeros at the padded positions (differentiable)."""
        out = x.new_zeros((self.batch * self.length, *x.shape[1:]))
        return out.index_copy(0, self.index, x).view(self.batch, self.length, *x.shape[1:])


@dataclass(frozen=True)
class ReadRows:
    """The (batch, position) rows read after an encoder's last layer, which then computes those rows alone.

    In masked-LM pretraining only the masked positions (and [CLS] for NSP / SOP) are read after the encoder, so its
    last layer needs queries, the attention output projection, residuals, norms and feed-forward at those R rows
    only; keys and values still come from every position, so the rows are exact. R = ``mask.sum()``, in row-major
    order (the order of ``hidden[mask]``). Their queries attend in a (B, M) layout, M the most rows of any sequence
    (``to_slots`` / ``from_slots``): the score matrix is (B, H, M, T) instead of (B, H, T, T).

    Attributes:
        mask: (B, T) bool, True = read.
        source: (R,) int64 row of each read position in the layer input: ``b * T + t`` of the flattened (B, T)
            layout, or its packed row under a ``Packing`` (the position must then be a real token).
        positions: (R,) int64 t of each row (rotary queries).
        slots: (R,) int64 ``b * M + j``, j the row's rank among its sequence's rows.
        width: M (at least 1).
    """

    mask: Tensor
    source: Tensor
    positions: Tensor
    slots: Tensor
    width: int

    @classmethod
    def build(cls, mask: Tensor, packing: Packing | None = None) -> ReadRows:
        """From a (B, T) bool mask (no read position may be padding under ``packing``)."""
        B, T = mask.shape
        flat = mask.reshape(-1).nonzero().squeeze(1)  # (R,) b * T + t
        width = max(int(mask.sum(1).max()), 1) if B else 1
        rank = (mask.cumsum(1) - 1).reshape(-1).index_select(0, flat)  # (R,) j
        slots = torch.div(flat, T, rounding_mode="floor") * width + rank  # (R,)
        source = flat
        if packing is not None:  # the packed row of each flat position
            inverse = torch.full((B * T,), -1, dtype=torch.long, device=mask.device)
            inverse[packing.index] = torch.arange(packing.tokens, device=mask.device)
            source = inverse.index_select(0, flat)
        return cls(mask, source, flat % T, slots, width)

    @property
    def rows(self) -> int:
        """R."""
        return self.source.numel()

    def take(self, x: Tensor) -> Tensor:
        """(B, T, ...) or packed (N, ...) -> (R, ...): the read rows of a layer input."""
        if x.dim() >= 3 and x.shape[:2] == self.mask.shape:
            x = x.reshape(-1, *x.shape[2:])
        return x.index_select(0, self.source)

    def to_slots(self, x: Tensor) -> Tensor:
        """(R, ...) -> (B, M, ...): each row in its sequence's slot, zeros in the unused slots."""
        B = self.mask.shape[0]
        out = x.new_zeros((B * self.width, *x.shape[1:]))
        return out.index_copy(0, self.slots, x).view(B, self.width, *x.shape[1:])

    def from_slots(self, x: Tensor) -> Tensor:
        """(B, M, ...) -> (R, ...): the inverse of ``to_slots``."""
        return x.reshape(-1, *x.shape[2:]).index_select(0, self.slots)


def packed_tokenwise(fn: Callable[[Tensor], Tensor], x: Tensor, key_mask: Tensor) -> Tensor:
    """A token-wise ``fn`` on the real tokens only: pack, apply, unpack (what an encoder layer does around its
    projections, feed-forward network, norms and dropout under a ``Packing``).

    Args:
        fn: (..., D) -> (..., D'), acting on each row alone.
        x: (B, T, D) a padded batch.
        key_mask: (B, T) bool, True = real token.

    Returns:
        (B, T, D'): ``fn``'s rows at the real tokens, zeros at padding.
    """
    packing = Packing.from_mask(key_mask)
    return packing.unpack(fn(packing.pack(x)))  # (B, T, D')


def padded_tokenwise(fn: Callable[[Tensor], Tensor], x: Tensor, key_mask: Tensor) -> Tensor:
    """The reference of ``packed_tokenwise``: ``fn`` on every position of the padded batch, zeros written at
    padding."""
    return fn(x).masked_fill(~key_mask.unsqueeze(-1), 0.0)  # (B, T, D')

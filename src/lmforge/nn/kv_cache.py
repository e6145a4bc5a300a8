"""The key/value cache of incremental decoding: one per attention module per layer.

Shape legend: B batch (rows), H heads, S cached positions, T new positions, Dh head dim, D model dim.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lmforge.errors import LmforgeError
from lmforge.nn.capture import exporting

__all__ = ["KVCache"]


class KVCache:
    """Projected keys and values of one attention module, for incremental decoding.

    Self-attention appends the new steps' keys/values (after rotary) on every call; cross-attention fills the
    cache once with the projected encoder output and reuses it afterwards. One cache per attention module per
    layer. Mutated in place and also returned in ``AttentionOutput.cache``.

    Storage: a buffer with room for more positions than are filled, doubled when full, so that a step writes its
    new position into place instead of copying every cached one (``torch.cat`` per step and layer, as Hugging
    Face's ``DynamicCache``, copies the whole cache each time: quadratic in the length). ``reorder`` (beam search)
    gathers the filled positions into a second buffer kept for that purpose and swaps the two, allocating nothing
    after the first calls. Keys that carry a gradient (a forward pass with autograd on) are concatenated and
    gathered out of place instead, as before, so that backpropagating through a cached pass still works; so are
    keys while ``torch.export`` records the model (the ONNX decoder graph, whose cache is its inputs and outputs).

    Attributes:
        key, value: (B, H, S, Dh) views of the filled positions, or None while empty.
        projection: a self-attention module's q/k/v weights concatenated for this generation, or None.
    """

    def __init__(self) -> None:
        self._key: Tensor | None = None  # (B, H, capacity, Dh)
        self._value: Tensor | None = None
        self._spare: tuple[Tensor, Tensor] | None = None  # reorder's target, same shape
        self._pending: Tensor | None = None  # rows to select at the next use (reorder is lazy, see reorder)
        self._length = 0
        # positions the buffers are first made for, when the caller knows the final length (generation: prompt +
        # new tokens): one allocation and no growth copies, and no doubling's unused half to stream through
        self.reserve = 0
        # the attention module's q/k/v weights side by side (weight (3D, D), bias (3D,) or None), for this
        # generation only (MultiHeadAttention._project_qkv)
        self.projection: tuple[Tensor, Tensor | None] | None = None

    @property
    def key(self) -> Tensor | None:
        self._select_pending()
        return None if self._key is None else self._key[:, :, :self._length]

    @property
    def value(self) -> Tensor | None:
        self._select_pending()
        return None if self._value is None else self._value[:, :, :self._length]

    @property
    def length(self) -> int:
        """S, number of cached positions (0 while empty)."""
        return self._length

    @property
    def capacity(self) -> int:
        """Positions the buffers hold before they grow."""
        return 0 if self._key is None else self._key.shape[-2]

    def append(self, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        """Add T new positions.

        Args:
            key, value: (B, H, T, Dh).

        Returns:
            All cached keys and values, (B, H, S + T, Dh) each (views of the buffers: valid until the next call).
        """
        self._select_pending()
        S, T = self._length, key.shape[-2]
        if exporting() or (torch.is_grad_enabled() and (key.requires_grad or value.requires_grad)):
            # in autograd's graph: concatenate (in-place writes into a buffer would break the backward pass);
            # exported (lmforge.persistence.onnx_decoder): the past keys/values are graph inputs and the
            # concatenation its outputs, rather than a buffer whose growth test would bake one capacity into the graph
            self._key = key if self._key is None else torch.cat((self.key, key), dim=-2)
            self._value = value if self._value is None else torch.cat((self.value, value), dim=-2)
            self._length, self._spare = S + T, None
            return self._key, self._value
        if self._key is None or self._value is None:  # exactly T (or the reserve): a cross-attention cache never grows
            room = max(T, self.reserve)
            self._key = key.new_empty(_with_room(key.shape, room))
            self._value = value.new_empty(_with_room(value.shape, room))
        elif S + T > self.capacity or self._key.shape[0] != key.shape[0]:
            if self._key.shape[0] != key.shape[0]:
                raise LmforgeError(f"the cache holds {self._key.shape[0]} rows but {key.shape[0]} were appended; "
                                   "reorder() the cache to the new batch first")
            room = max(S + T, 2 * self.capacity, 16)  # doubling: O(log n) copies over n steps
            grown_k = key.new_empty(_with_room(key.shape, room))
            grown_v = value.new_empty(_with_room(value.shape, room))
            grown_k[:, :, :S] = self._key[:, :, :S]
            grown_v[:, :, :S] = self._value[:, :, :S]
            self._key, self._value, self._spare = grown_k, grown_v, None
        self._key[:, :, S:S + T] = key
        self._value[:, :, S:S + T] = value
        self._length = S + T
        return self._key[:, :, :S + T], self._value[:, :, :S + T]

    def reorder(self, index: Tensor) -> None:
        """Select batch rows (beam search): ``index`` (B',) of rows to keep, in order.

        Lazy outside autograd: the selection is recorded (composed with one still pending) and made at the next
        ``append`` or read, that is just before this layer attends over the rows. Beam search reorders every
        layer's cache at once between steps; gathering them all there would leave each layer's keys and values
        cold in the CPU's caches by the time its attention reads them (measured: the attention kernel 2-3x slower
        per call than on freshly written keys).
        """
        if self._key is None or self._value is None:
            return
        if self._key.requires_grad or self._value.requires_grad:  # in autograd's graph: out-of-place, at once
            self._select_pending()
            self._key, self._value = self.key.index_select(0, index), self.value.index_select(0, index)
            self._spare = None
            return
        self._pending = index if self._pending is None else self._pending.index_select(0, index)

    def _select_pending(self) -> None:
        """Make the pending row selection: gather the filled positions into the spare buffers and swap."""
        index, self._pending = self._pending, None
        if index is None or self._key is None or self._value is None:
            return
        S, rows = self._length, index.shape[0]
        spare = self._spare
        if spare is None or spare[0].shape[0] != rows or spare[0].shape[-2] != self.capacity:
            spare = (self._key.new_empty((rows, *self._key.shape[1:])),
                     self._value.new_empty((rows, *self._value.shape[1:])))
        torch.index_select(self._key[:, :, :S], 0, index, out=spare[0][:, :, :S])
        torch.index_select(self._value[:, :, :S], 0, index, out=spare[1][:, :, :S])
        self._spare = (self._key, self._value) if self._key.shape[0] == rows else None
        self._key, self._value = spare

    def __repr__(self) -> str:
        return f"KVCache(length={self.length}, capacity={self.capacity})"



def _with_room(shape: torch.Size, positions: int) -> tuple[int, ...]:
    """The buffer shape (B, H, positions, Dh) for keys or values of ``shape`` (B, H, T, Dh)."""
    return (shape[0], shape[1], positions, shape[3])

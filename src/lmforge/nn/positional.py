"""Position information: sinusoidal and learned tables (added to embeddings), rotary (applied inside attention).

Shape legend: B batch, T length, H heads, Dh head dim, D model dim, L max_len.

The tables are added to token embeddings by the model; scaling the token embeddings by sqrt(D) (Vaswani et al.)
and dropout after the sum are the model's business, not done here.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor, nn

from lmforge.choices import POSITIONALS
from lmforge.errors import LmforgeError
from lmforge.nn.capture import capturing

__all__ = ["LearnedPositional", "Positions", "RotaryEmbedding", "SinusoidalPositional", "build_positional"]


def _check_span(offset: int, length: int, max_len: int, what: str) -> None:
    if offset < 0:
        raise LmforgeError(f"{what}: position offset must be >= 0; got {offset}")
    if offset + length > max_len:
        raise LmforgeError(
            f"{what}: positions up to {offset + length - 1} (length {length}, offset {offset}) exceed "
            f"max_len={max_len}; raise max_len or shorten the input")


def _check_positions(positions: Tensor, max_len: int, what: str) -> None:
    # One device sync; only paid by callers that pass explicit position ids (skipped under torch.compile, where the
    # data-dependent branch would split the graph; the positions come from lmforge's own masks there).
    if capturing():
        return
    lo, hi = int(positions.min()), int(positions.max())
    if lo < 0 or hi >= max_len:
        raise LmforgeError(f"{what}: position ids span [{lo}, {hi}] but must lie in [0, max_len={max_len})")


class AbsolutePositional(nn.Module):
    """Absolute positions added to the embeddings: subclasses give ``rows(index, dtype)`` of their (L, D) table."""

    max_len: int

    def rows(self, index: slice | Tensor, dtype: torch.dtype) -> Tensor:
        raise NotImplementedError

    def forward(self, x: Tensor, offset: int = 0, positions: Tensor | None = None) -> Tensor:
        """Add the positions' rows to ``x``.

        Args:
            x: (B, T, D) embeddings.
            offset: first position (the KV-cache length during incremental decoding).
            positions: optional (B, T) or (T,) integer position ids; overrides ``offset``.

        Returns:
            (B, T, D) ``x + P``.
        """
        T = x.shape[-2]
        name = type(self).__name__
        if positions is None:
            _check_span(offset, T, self.max_len, name)
            return x + self.rows(slice(offset, offset + T), x.dtype)  # (B, T, D)
        _check_positions(positions, self.max_len, name)
        return x + self.rows(positions, x.dtype)  # (B, T, D)


class SinusoidalPositional(AbsolutePositional):
    """Fixed sinusoidal positions, Vaswani et al. 2017, "Attention Is All You Need", section 3.5.

    PE(pos, 2i) = sin(pos / base^(2i / D)),  PE(pos, 2i + 1) = cos(pos / base^(2i / D)).

    The table is a non-persistent buffer: it is not in the state dict (checkpoints do not change) and is
    rebuilt from the constructor arguments. An odd D is allowed (the last column is a sine).
    """

    pe: Tensor

    def __init__(self, d_model: int, max_len: int, base: float = 10000.0) -> None:
        """
        Args:
            d_model: D, width of the embeddings the table is added to.
            max_len: L, number of positions in the table.
            base: wavelength base (10000 in the paper).
        """
        super().__init__()
        if d_model <= 0 or max_len <= 0:
            raise LmforgeError(f"SinusoidalPositional needs d_model > 0 and max_len > 0; got {d_model}, {max_len}")
        self.d_model, self.max_len, self.base = d_model, max_len, base
        # Built in float64 for exact angles at large positions, stored in float32.
        pos = torch.arange(max_len, dtype=torch.float64)[:, None]  # (L, 1)
        two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # (ceil(D/2),)
        angle = pos / base ** (two_i / d_model)  # (L, ceil(D/2))
        pe = torch.zeros(max_len, d_model, dtype=torch.float64)
        pe[:, 0::2] = torch.sin(angle)
        pe[:, 1::2] = torch.cos(angle[:, : d_model // 2])
        self.register_buffer("pe", pe.float(), persistent=False)  # (L, D)

    def rows(self, index: slice | Tensor, dtype: torch.dtype) -> Tensor:
        return self.pe[index].to(dtype)  # the fixed table, in the embeddings' dtype

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, max_len={self.max_len}, base={self.base}"


class LearnedPositional(AbsolutePositional):
    """Learned absolute positions (Devlin et al. 2019 BERT; Radford et al. 2019 GPT-2): one trained row per position.

    The single parameter is called ``weight`` (shape (L, D)), so the state-dict key is ``<name>.weight`` exactly
    like Hugging Face's ``embeddings.position_embeddings.weight`` (BERT) and ``wpe.weight`` (GPT-2): importing is a
    prefix rename. Initialised N(0, 0.02) as in BERT and GPT-2 (torch's nn.Embedding default is N(0, 1)).
    """

    def __init__(self, max_len: int, d_model: int) -> None:
        """
        Args:
            max_len: L, number of positions.
            d_model: D, embedding width.
        """
        super().__init__()
        if d_model <= 0 or max_len <= 0:
            raise LmforgeError(f"LearnedPositional needs max_len > 0 and d_model > 0; got {max_len}, {d_model}")
        self.max_len, self.d_model = max_len, d_model
        self.weight = nn.Parameter(torch.empty(max_len, d_model))
        nn.init.normal_(self.weight, std=0.02)

    def rows(self, index: slice | Tensor, dtype: torch.dtype) -> Tensor:
        return self.weight[index]  # a parameter: autocast handles its dtype

    def extra_repr(self) -> str:
        return f"max_len={self.max_len}, d_model={self.d_model}"


class RotaryEmbedding(nn.Module):
    """Rotary position embedding, Su et al. 2021, "RoFormer: Enhanced Transformer with Rotary Position Embedding".

    Each pair of head dimensions is rotated by the angle ``pos * theta_i`` with ``theta_i = base^(-2i / Dh)``, so
    that ``rot(q, m) . rot(k, n)`` depends on q, k and ``m - n`` only.

    Deviation: RoFormer pairs adjacent dimensions (2i, 2i + 1); we pair dimension i with i + Dh/2 (the
    "rotate half" layout of GPT-NeoX and LLaMA, hence of most Hugging Face checkpoints). The two are the same
    function up to a fixed permutation of the q/k projection rows, which the interop layer applies.

    Applied by ``MultiHeadAttention`` to q and k after projection, in self-attention only. The cos/sin tables are
    non-persistent buffers (absent from the state dict); casting the module to bf16 casts them too, so prefer
    autocast to ``.bfloat16()`` for long contexts.
    """

    cos: Tensor
    sin: Tensor

    def __init__(self, d_head: int, max_len: int, base: float = 10000.0) -> None:
        """
        Args:
            d_head: Dh, must be even.
            max_len: L, number of positions (prompt plus generated tokens).
            base: wavelength base (10000 in the paper).
        """
        super().__init__()
        if d_head <= 0 or d_head % 2:
            raise LmforgeError(f"RotaryEmbedding needs an even d_head > 0; got d_head={d_head}")
        if max_len <= 0:
            raise LmforgeError(f"RotaryEmbedding needs max_len > 0; got {max_len}")
        self.d_head, self.max_len, self.base = d_head, max_len, base
        inv_freq = base ** (-torch.arange(0, d_head, 2, dtype=torch.float64) / d_head)  # (Dh/2,)
        angle = torch.arange(max_len, dtype=torch.float64)[:, None] * inv_freq  # (L, Dh/2)
        self.register_buffer("cos", torch.cos(angle).float(), persistent=False)  # (L, Dh/2)
        self.register_buffer("sin", torch.sin(angle).float(), persistent=False)  # (L, Dh/2)

    def forward(self, x: Tensor, offset: int = 0, positions: Tensor | None = None) -> Tensor:
        """Rotate queries or keys by their positions ``offset .. offset + T - 1``, or by ``positions``.

        Args:
            x: (B, H, T, Dh) (any leading dims) projected queries or keys.
            offset: position of the first of the T rows (the KV-cache length when decoding).
            positions: (T,) int64 the position of each row instead (the rows an encoder's last layer computes
                alone, ``lmforge.nn.kernels.packing.ReadRows``); each must be below max_len.

        Returns:
            Tensor of the same shape and dtype.
        """
        T, d = x.shape[-2], x.shape[-1]
        if d != self.d_head:
            raise LmforgeError(f"RotaryEmbedding was built for d_head={self.d_head} but got vectors of width {d}")
        if positions is not None:
            cos = self.cos.index_select(0, positions).to(x.dtype)  # (T, Dh/2)
            sin = self.sin.index_select(0, positions).to(x.dtype)  # (T, Dh/2)
        else:
            _check_span(offset, T, self.max_len, "RotaryEmbedding")
            cos = self.cos[offset : offset + T].to(x.dtype)  # (T, Dh/2)
            sin = self.sin[offset : offset + T].to(x.dtype)  # (T, Dh/2)
        x1, x2 = x[..., : d // 2], x[..., d // 2 :]  # (B, H, T, Dh/2) each
        return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)  # (B, H, T, Dh)

    def extra_repr(self) -> str:
        return f"d_head={self.d_head}, max_len={self.max_len}, base={self.base}"



class Positions(NamedTuple):
    """What ``build_positional`` returns: exactly one of the two is set.

    Attributes:
        table: a ``LearnedPositional`` or ``SinusoidalPositional`` the model adds to its token embeddings, or None.
        rotary: a ``RotaryEmbedding`` the model hands to every self-attention, or None.
    """

    table: LearnedPositional | SinusoidalPositional | None
    rotary: RotaryEmbedding | None


def build_positional(kind: str, *, d_model: int, d_head: int, max_len: int) -> Positions:
    """The position encoding of a Transformer, by name: the one place that maps ``positional`` to a module.

    Why: the encoder, the decoder and the encoder-decoder each chose among the three kinds with their own
    ``if``/``elif`` chain; a new kind (or a fixed default, such as the sinusoidal base) now changes here only.
    The result says where the module goes, because that differs by kind: a table is added to the embeddings, the
    rotary embedding acts inside attention.

    Args:
        kind: one of ``lmforge.choices.POSITIONALS``: "learned" (BERT, GPT-2), "sinusoidal" (Vaswani et al.
            2017) or "rotary" (Su et al. 2021).
        d_model: D, the embedding width (tables).
        d_head: Dh, the attention head width (rotary; must then be even).
        max_len: L, the number of positions.

    Returns:
        ``Positions(table, rotary)``: the table with no rotary, or the rotary embedding with no table.
    """
    if kind == "learned":
        return Positions(LearnedPositional(max_len, d_model), None)
    if kind == "sinusoidal":
        return Positions(SinusoidalPositional(d_model, max_len), None)
    if kind == "rotary":
        return Positions(None, RotaryEmbedding(d_head, max_len))
    raise LmforgeError(f"unknown positional encoding {kind!r}; choose one of {', '.join(POSITIONALS)}")

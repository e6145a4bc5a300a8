"""Transformer encoder and decoder layers with post-LN (Vaswani, BERT) or pre-LN (GPT-2) residual blocks.

Shape legend: B batch, T target length, S source (memory) length, H heads, D model dim.

Residual block, one per sublayer:
    norm_first=False (post-LN, Vaswani et al. 2017, BERT):  x = LN(x + Dropout(sublayer(x)))
    norm_first=True  (pre-LN, GPT-2, Xiong et al. 2020):     x = x + Dropout(sublayer(LN(x)))
Parameter names are the same in both modes. A pre-LN stack needs one final LayerNorm after the last layer
(GPT-2's ``ln_f``); that belongs to the model, not to the layer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from torch import Tensor, nn

from lmforge.errors import LmforgeError
from lmforge.nn.attention import MultiHeadAttention
from lmforge.nn.feedforward import FeedForward
from lmforge.nn.kernels.packed_dropout import Dropout
from lmforge.nn.kernels.packing import Packing, ReadRows
from lmforge.nn.kv_cache import KVCache

__all__ = ["DecoderLayer", "EncoderLayer", "LayerCache", "LayerOutput", "StackCache"]


@dataclass
class LayerCache:
    """KV caches of one decoder layer: its self-attention and (if any) its cross-attention."""

    self_attn: KVCache = field(default_factory=KVCache)
    cross_attn: KVCache = field(default_factory=KVCache)

    def reorder(self, index: Tensor) -> None:
        """Select batch rows (beam search): ``index`` (B',) of rows to keep, in order."""
        self.self_attn.reorder(index)
        self.cross_attn.reorder(index)


class StackCache:
    """Key/value caches of every layer of a decoder stack: the state of incremental decoding.

    Shape legend: B batch, P cached (past) positions, L decoder layers.

    One implementation for every model that decodes with ``DecoderLayer`` (the decoder-only ``Decoder`` and the
    ``EncoderDecoder``): they had near-copies of it. The models subclass it only to keep their own public names
    (``DecoderCache``, ``Seq2SeqCache``), which their ``forward`` checks so that a cache is never handed to a
    model of another family. A decoder-only stack never fills ``cross_attn``; that costs nothing.

    Make one with ``model.new_cache()`` (or the class with no argument: the model adds the per-layer caches on first
    use through ``prepare``) and pass the same object to every call; it is extended in place.

    Attributes:
        layers: one ``LayerCache`` per layer (self-attention keys/values, growing by the new positions on every
            call, and cross-attention keys/values, projected from the memory once).
    """

    def __init__(self, n_layers: int = 0) -> None:
        self.layers: list[LayerCache] = [LayerCache() for _ in range(n_layers)]

    def reserve(self, positions: int) -> None:
        """Make each layer's self-attention buffers for ``positions`` (the prompt plus every new token) at their
        first use, instead of growing them by doubling (``KVCache.reserve``)."""
        for layer in self.layers:
            layer.self_attn.reserve = positions

    @property
    def length(self) -> int:
        """P, number of cached positions (padding included; 0 while empty)."""
        return self.layers[0].self_attn.length if self.layers else 0

    @property
    def batch_size(self) -> int | None:
        """B of the cached keys, or None while empty."""
        if not self.layers:
            return None
        for kv in (self.layers[0].self_attn, self.layers[0].cross_attn):
            if kv.key is not None:
                return kv.key.shape[0]
        return None

    def reorder(self, index: Tensor) -> None:
        """Select batch rows, e.g. the surviving beams: ``index`` (B',) long, rows to keep in order (repeats allowed).

        Reorders the cross-attention keys/values too; the caller reorders what it keeps beside the cache (the
        ``attention_mask``, the memory and its mask) the same way (``x.index_select(0, index)``).
        """
        for layer in self.layers:
            layer.reorder(index)

    def prepare(self, n_layers: int, batch_size: int, *, rows: str = "input_ids", also_reorder: str = "") -> int:
        """Make the cache ready for a stack of ``n_layers`` and a batch of ``batch_size`` rows; return P.

        Args:
            n_layers: L of the model the cache is used with (an empty cache gets L layer caches now).
            batch_size: B of the new ids.
            rows: the name of the ids, for the message.
            also_reorder: what else the caller must reorder with the cache, for the message (e.g. " and the
                memory").

        Returns:
            P, the number of cached positions before this call.
        """
        if not self.layers:
            self.layers = [LayerCache() for _ in range(n_layers)]
        if len(self.layers) != n_layers:
            raise LmforgeError(f"cache has {len(self.layers)} layers but the model has {n_layers} decoder layers")
        cached_batch = self.batch_size
        if cached_batch is not None and cached_batch != batch_size:
            raise LmforgeError(
                f"cache holds batch size {cached_batch} but {rows} has {batch_size} rows; reorder the cache "
                f"(cache.reorder(index)){also_reorder} when the batch changes")
        return self.length

    def __repr__(self) -> str:
        return f"{type(self).__name__}(layers={len(self.layers)}, length={self.length})"


class LayerOutput(NamedTuple):
    """What the layers return.

    Attributes:
        hidden: (B, T, D).
        self_attn_weights: (B, H, T, T_keys) when requested, else None.
        cross_attn_weights: (B, H, T, S) when requested and the layer has cross-attention, else None.
        cache: the LayerCache passed in (now extended), or None.
    """

    hidden: Tensor
    self_attn_weights: Tensor | None = None
    cross_attn_weights: Tensor | None = None
    cache: LayerCache | None = None


def _check_dropout(dropout: float) -> None:
    if not 0.0 <= dropout < 1.0:
        raise LmforgeError(f"dropout must be in [0, 1); got {dropout}")


class EncoderLayer(nn.Module):
    """Transformer encoder layer, Vaswani et al. 2017, section 3.1: self-attention, then feed-forward.

    ``dropout`` acts on each sublayer output and ``attention_dropout`` (default: ``dropout``) on the attention
    weights, as in BERT and GPT-2 (the paper mentions only the former). The feed-forward hidden layer has no
    dropout (as in the paper, BERT and GPT-2).
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_ff: int,
        *,
        dropout: float = 0.1,
        attention_dropout: float | None = None,
        activation: str = "gelu",
        norm_first: bool = False,
        layer_norm_eps: float = 1e-5,
        bias: bool = True,
        kernel: str = "sdpa",
        rotary: nn.Module | None = None,
        gated_ffn: bool = False,
    ) -> None:
        """
        Args:
            d_model: D.
            n_heads: H (must divide D).
            d_ff: feed-forward hidden width.
            dropout: residual (sublayer output) dropout.
            attention_dropout: attention-weight dropout; None uses ``dropout``.
            activation: feed-forward activation name (``lmforge.nn.feedforward.ACTIVATIONS``).
            norm_first: pre-LN (True) or post-LN (False).
            layer_norm_eps: LayerNorm epsilon (BERT 1e-12, GPT-2 1e-5).
            bias: biases in attention and feed-forward projections.
            kernel: attention kernel name (``KERNELS``).
            rotary: optional rotary embedding for the self-attention.
            gated_ffn: the gated feed-forward (``FeedForward(gated=True)``: GEGLU with GELU).
        """
        super().__init__()
        _check_dropout(dropout)
        attention_dropout = dropout if attention_dropout is None else attention_dropout
        _check_dropout(attention_dropout)
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, n_heads, attention_dropout, bias=bias, kernel=kernel,
                                            rotary=rotary)
        self.self_attn_norm = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.ffn = FeedForward(d_model, d_ff, activation=activation, bias=bias, gated=gated_ffn)
        self.ffn_norm = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.dropout = Dropout(dropout)

    def forward(
        self, x: Tensor, *, attention_mask: Tensor | None = None, need_weights: bool = False,
        packing: Packing | None = None, first_only: bool = False, rows: ReadRows | None = None,
    ) -> LayerOutput:
        """
        Args:
            x: (B, T, D), or (N, D) the real tokens' rows with ``packing``.
            attention_mask: (B, T), 1 = real token, 0 = padding.
            need_weights: also return the self-attention weights.
            packing: run on the packed real tokens (``lmforge.nn.kernels.packing``): norms, dropout and the feed-forward
                are token-wise, self-attention unpacks for the attention itself.
            first_only: compute the output at the first position only ((B, T, D) input, no packing): its query
                attends to every position's keys and values as in the full layer, and nothing else is computed
                for the other positions (a last layer read only through [CLS]).
            rows: compute the output at these rows only (``ReadRows``, built with the same ``packing``), e.g. the
                masked positions of an MLM: their queries attend to every position's keys and values as in the
                full layer, and nothing else is computed for the other positions. No weights.

        Returns:
            LayerOutput(hidden (B, T, D), (N, D), (B, 1, D) with ``first_only``, or (R, D) with ``rows``;
            self_attn_weights (B, H, T, T) or None).
        """
        post = not self.norm_first

        h = x if post else self.self_attn_norm(x)
        if rows is not None:  # keys and values from every position, queries and the rest at the rows only
            if need_weights or first_only:
                raise LmforgeError("rows takes neither attention weights nor first_only")
            out = self.self_attn.attend_rows(h, rows, attention_mask=attention_mask, packing=packing)  # (R, D)
            x = rows.take(x) + self.dropout(out)  # (R, D)
            x = self.self_attn_norm(x) if post else x
            h = x if post else self.ffn_norm(x)
            x = x + self.dropout(self.ffn(h))  # (R, D)
            return LayerOutput(self.ffn_norm(x) if post else x)
        if first_only:  # keys and values from every position (the module's own projections), the query from one
            if packing is not None or need_weights or x.dim() != 3 or self.self_attn.rotary is not None:
                raise LmforgeError("first_only takes a (batch, length, d_model) input, without packing, weights or "
                                   "rotary positions")
            a = self.self_attn(h[:, :1], h, attention_mask=attention_mask)
            x = x[:, :1]  # (B, 1, D)
        else:
            a = self.self_attn(h, attention_mask=attention_mask, need_weights=need_weights, packing=packing)
        x = x + self.dropout(a.output)  # (B, T, D)
        x = self.self_attn_norm(x) if post else x

        h = x if post else self.ffn_norm(x)
        x = x + self.dropout(self.ffn(h))  # (B, T, D)
        x = self.ffn_norm(x) if post else x
        return LayerOutput(x, a.weights)


class DecoderLayer(nn.Module):
    """Transformer decoder layer, Vaswani et al. 2017, section 3.1: masked self-attention, cross-attention over
    the encoder output (``memory``), feed-forward.

    With ``cross_attention=False`` it is the GPT block (Radford et al. 2018, 2019): masked self-attention and
    feed-forward only. Dropout as in ``EncoderLayer``. In pre-LN mode the memory is used as given (the encoder's
    final LayerNorm has already normalised it).
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_ff: int,
        *,
        dropout: float = 0.1,
        attention_dropout: float | None = None,
        activation: str = "gelu",
        norm_first: bool = False,
        layer_norm_eps: float = 1e-5,
        bias: bool = True,
        kernel: str = "sdpa",
        rotary: nn.Module | None = None,
        gated_ffn: bool = False,
        cross_attention: bool = True,
        d_memory: int | None = None,
    ) -> None:
        """
        Args:
            d_model, n_heads, d_ff, dropout, attention_dropout, activation, norm_first, layer_norm_eps, bias, kernel,
            rotary, gated_ffn:
                as in ``EncoderLayer`` (rotary acts on the self-attention only).
            cross_attention: include the cross-attention sublayer (False for decoder-only models).
            d_memory: width of the encoder output, when it differs from D.
        """
        super().__init__()
        _check_dropout(dropout)
        attention_dropout = dropout if attention_dropout is None else attention_dropout
        _check_dropout(attention_dropout)
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, n_heads, attention_dropout, bias=bias, kernel=kernel,
                                            rotary=rotary)
        self.self_attn_norm = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.cross_attn: MultiHeadAttention | None = None
        self.cross_attn_norm: nn.LayerNorm | None = None
        if cross_attention:
            self.cross_attn = MultiHeadAttention(d_model, n_heads, attention_dropout, bias=bias, kernel=kernel,
                                                 d_kv=d_memory)
            self.cross_attn_norm = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.ffn = FeedForward(d_model, d_ff, activation=activation, bias=bias, gated=gated_ffn)
        self.ffn_norm = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.dropout = Dropout(dropout)

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        *,
        attention_mask: Tensor | None = None,
        memory_mask: Tensor | None = None,
        causal: bool = True,
        cache: LayerCache | None = None,
        need_weights: bool = False,
        last_only: bool = False,
    ) -> LayerOutput:
        """
        Args:
            x: (B, T, D) decoder input (the T new positions when decoding with a cache).
            memory: (B, S, d_memory) encoder output; required iff the layer has cross-attention.
            attention_mask: (B, T_keys), 1 = real token, over the self-attention keys: cached positions plus
                the T new ones when a cache is used.
            memory_mask: (B, S), 1 = real source token.
            causal: mask future positions in the self-attention.
            cache: a LayerCache to read and extend (incremental decoding).
            need_weights: also return attention weights.
            last_only: compute the output at the last position only (causal self-attention without a cache,
                cross-attention, weights or rotary positions): its query attends to every position's keys and
                values as in the full layer (the last causal row allows them all), and nothing else is computed
                for the other positions (a last layer read only at its last position, as in generation).

        Returns:
            LayerOutput(hidden (B, T, D), or (B, 1, D) with ``last_only``; self weights (B, H, T, T_keys) or None,
            cross weights (B, H, T, S) or None, cache).
        """
        if (memory is None) != (self.cross_attn is None):
            raise LmforgeError(
                "DecoderLayer: pass memory (the encoder output) exactly when the layer has cross-attention; "
                f"cross_attention={self.cross_attn is not None}, memory given={memory is not None}")
        self_cache = None if cache is None else cache.self_attn
        cross_cache = None if cache is None else cache.cross_attn
        post = not self.norm_first

        h = x if post else self.self_attn_norm(x)
        if last_only:  # keys and values from every position (the module's own projections), the query from one
            if (not causal or cache is not None or self.cross_attn is not None or need_weights
                    or self.self_attn.rotary is not None):
                raise LmforgeError("last_only takes causal self-attention without a cache, cross-attention, "
                                   "weights or rotary positions")
            a = self.self_attn(h[:, -1:], h, attention_mask=attention_mask)
            x = x[:, -1:]  # (B, 1, D)
        else:
            a = self.self_attn(h, attention_mask=attention_mask, causal=causal, cache=self_cache,
                               need_weights=need_weights)
        x = x + self.dropout(a.output)  # (B, T, D)
        x = self.self_attn_norm(x) if post else x

        cross_weights = None
        if self.cross_attn is not None and self.cross_attn_norm is not None:
            h = x if post else self.cross_attn_norm(x)
            c = self.cross_attn(h, memory, attention_mask=memory_mask, cache=cross_cache, need_weights=need_weights)
            x = x + self.dropout(c.output)  # (B, T, D)
            x = self.cross_attn_norm(x) if post else x
            cross_weights = c.weights

        h = x if post else self.ffn_norm(x)
        x = x + self.dropout(self.ffn(h))  # (B, T, D)
        x = self.ffn_norm(x) if post else x
        return LayerOutput(x, a.weights, cross_weights, cache)

"""One loop over a stack of Transformer layers (``EncoderLayer`` or ``DecoderLayer``), shared by the models.

Shape legend: B batch, T length (the new positions with a cache), N real tokens of a packed batch, D model dim,
H heads, S self-attention keys (cached + new), S_m memory (source) length, L layers.

BERT's ``Encoder``, the encoder-decoder's encoder and decoder stacks, its ``SourceEncoder`` and GPT's ``Decoder``
each had their own copy of this loop. What they share, as options of ``run_layers``:

- unpadding (``packing``, ``lmforge.nn.kernels.packing``): the layers run on the packed (N, D) rows of the real
  tokens, the final norm too, and the output is unpacked at the end (zeros at padding);
- hidden states: the stack's input, then every layer's output (unpacked), the last entry replaced by the final
  (normed) output, as Hugging Face returns them;
- attention weights: every layer's self-attention weights, computed (the math path) for the layers in
  ``weights_of`` and None for the others; and a decoder's cross-attention weights;
- a key/value cache: layer i reads and extends ``cache.layers[i]`` (``lmforge.nn.StackCache``);
- one position out of the last layer (``alone``): when only [CLS] (an encoder's ``first_only``) or the last
  position (a decoder's ``last_only``) is read after the stack, the last layer computes that position alone,
  attending to every position's keys and values as the full layer would;
- some rows out of the last layer (``rows``, ``EncoderLayer`` stacks): when only those (batch, position) rows are
  read after the stack (an MLM's masked positions and [CLS]), the last layer computes them alone, the same way.

Layer sharing (ALBERT, Lan et al. 2020) needs nothing here: a shared layer is one module at several indices of
``layers``, run once per index. (No model checkpoints its layers' activations, so neither does the loop.)
"""

from __future__ import annotations

from collections.abc import Container, Sequence
from typing import Any, NamedTuple

from torch import Tensor, nn

from lmforge.errors import LmforgeError
from lmforge.nn.kernels.packing import Packing, ReadRows
from lmforge.nn.layers import StackCache

__all__ = ["StackOutput", "run_layers"]


class StackOutput(NamedTuple):
    """What ``run_layers`` returns.

    Attributes:
        hidden: (B, T, D) the last layer's output after ``final_norm``, unpacked; (B, 1, D) with ``alone``;
            (R, D) with ``rows``.
        hidden_states: with ``hidden_states=True``, L + 1 tensors (B, T, D): the input, then each layer's output,
            the last one replaced by ``hidden``; else None.
        attentions: with ``attentions=True``, L entries: (B, H, T, S) self-attention weights for the layers in
            ``weights_of``, None for the others; else None.
        cross_attentions: with ``cross_attentions=True``, L entries: (B, H, T, S_m) cross-attention weights (decoder
            layers with cross-attention) for the layers in ``weights_of``, None for the others; else None.
    """

    hidden: Tensor
    hidden_states: tuple[Tensor, ...] | None = None
    attentions: tuple[Tensor | None, ...] | None = None
    cross_attentions: tuple[Tensor | None, ...] | None = None


def run_layers(
    layers: Sequence[nn.Module],
    x: Tensor,
    *,
    final_norm: nn.Module | None = None,
    packing: Packing | None = None,
    cache: StackCache | None = None,
    weights_of: Container[int] = frozenset(),
    hidden_states: bool = False,
    attentions: bool = False,
    cross_attentions: bool = False,
    alone: str | None = None,
    rows: ReadRows | None = None,
    **inputs: Any,
) -> StackOutput:
    """Run ``x`` through ``layers`` in turn, then ``final_norm``.

    Args:
        layers: the stack (an ``nn.ModuleList`` of ``EncoderLayer`` or ``DecoderLayer``).
        x: (B, T, D) the stack's input (embeddings).
        final_norm: a pre-LN stack's closing LayerNorm (applied to the packed rows under ``packing``); None or an
            ``nn.Identity`` for none.
        packing: run on the real tokens only (``EncoderLayer`` stacks); None: every position.
        cache: the stack's key/value caches (``DecoderLayer`` stacks); layer i gets ``cache.layers[i]``.
        weights_of: indices of the layers whose attention weights are computed and returned.
        hidden_states: collect the hidden states.
        attentions: collect each layer's self-attention weights (None for layers outside ``weights_of``).
        cross_attentions: collect each layer's cross-attention weights.
        alone: the keyword that makes the last layer compute one position ("first_only" for ``EncoderLayer``,
            "last_only" for ``DecoderLayer``); None: the whole sequence. Not with hidden states, weights or a cache.
        rows: the rows the last layer computes (``ReadRows``, built with ``packing``); the output is then (R, D),
            after ``final_norm``, never unpacked. Not with hidden states, weights, a cache or ``alone``.
        **inputs: passed to every layer as they are (``attention_mask``; a decoder's ``memory``, ``memory_mask``,
            ``causal``).

    Returns:
        StackOutput(hidden (B, T, D), (B, 1, D) or (R, D), hidden_states, attentions, cross_attentions).
    """
    if rows is not None and (alone is not None or hidden_states or attentions or cross_attentions
                             or cache is not None):
        raise LmforgeError("rows (some rows out of the last layer) cannot be combined with one position (alone), "
                           "hidden states, attention weights or a cache")
    if alone is not None and (hidden_states or attentions or cross_attentions or cache is not None):
        raise LmforgeError(f"{alone} (one position out of the last layer) cannot be combined with hidden states, "
                           "attention weights or a cache")
    states = [x] if hidden_states else None
    self_weights: list[Tensor | None] | None = [] if attentions else None
    cross_weights: list[Tensor | None] | None = [] if cross_attentions else None
    if packing is not None:
        x = packing.pack(x)  # (N, D)
    last = len(layers) - 1
    for i, layer in enumerate(layers):
        if alone is not None and i == last:  # only one position is read after the last layer
            if packing is not None:
                x, packing = packing.unpack(x), None  # (B, T, D): keys and values at every position
            x = layer(x, **inputs, **{alone: True}).hidden  # (B, 1, D)
            break
        if rows is not None and i == last:  # only these rows are read after the last layer
            x = layer(x, rows=rows, packing=packing, **inputs).hidden  # (R, D)
            x = x if final_norm is None else final_norm(x)
            return StackOutput(x)
        kwargs = inputs
        if packing is not None or cache is not None:
            kwargs = dict(inputs)
            if packing is not None:
                kwargs["packing"] = packing
            if cache is not None:
                kwargs["cache"] = cache.layers[i]
        out = layer(x, need_weights=i in weights_of, **kwargs)
        x = out.hidden  # (B, T, D), or (N, D) packed
        if states is not None:
            states.append(x if packing is None else packing.unpack(x))
        if self_weights is not None:
            self_weights.append(out.self_attn_weights)  # (B, H, T, S) or None
        if cross_weights is not None:
            cross_weights.append(out.cross_attn_weights)  # (B, H, T, S_m) or None
    if final_norm is not None:
        x = final_norm(x)  # (B, T, D), (B, 1, D) or (N, D)
    if packing is not None:
        x = packing.unpack(x)  # (B, T, D), zeros at padding
    if states is not None:
        states[-1] = x  # the last entry is always the stack's output (normed in pre-LN mode)
    return StackOutput(x, None if states is None else tuple(states),
                       None if self_weights is None else tuple(self_weights),
                       None if cross_weights is None else tuple(cross_weights))

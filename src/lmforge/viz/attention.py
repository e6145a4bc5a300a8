"""Collect the attention weights of a model for one input, as plain arrays ready to draw.

Shape legend: L layers kept, H heads kept, R query (row) tokens, C key (column) tokens, S source length,
T target length.

What is collected, per model family (``config.arch``):

    encoder (BERT)          encoder self-attention                  rows = cols = [CLS] A [SEP] (B [SEP])
    decoder (GPT)           causal self-attention                   rows = cols = the text's pieces
    seq2seq (Transformer)   encoder self-attention                  rows = cols = source pieces
                            decoder (causal) self-attention         rows = cols = target inputs [CLS] y
                            cross-attention                         rows = target inputs, cols = source pieces
    rnn_seq2seq             cross-attention (1 layer, 1 head)       rows = target inputs, cols = source pieces
    rnn (classifier)        attention pooling (1 query, 1 head)     rows = ["[pool]"], cols = the tokens

The Transformer weights come from the models' ``output_attentions`` path, which runs the plain-math kernel for
the requested layers, so the weights are exactly those the forward pass used (fused kernels return none).
Source and target are tokenised as ``lmforge train-seq2seq`` does: source pieces without special tokens, decoder
inputs ``[CLS] y`` (teacher forcing; row i is the position that predicts target piece i + 1).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from lmforge.errors import LmforgeError
from lmforge.models import ARCHITECTURES, architecture, architectures_with

log = logging.getLogger("lmforge")

__all__ = ["AttentionMap", "AttentionSet", "collect_attention", "resolve_indices"]


@dataclass
class AttentionMap:
    """The weights of one kind of attention (e.g. the cross-attention) for one input.

    Attributes:
        name: what it is, e.g. "encoder self-attention", "cross-attention".
        rows: R query tokens (word pieces), top to bottom.
        cols: C key tokens, left to right.
        layers: the L model layer indices kept (0-based, in the model's numbering).
        heads: the H head indices kept.
        weights: (L, H, R, C) float32; each row sums to 1 over the keys it may see.
        row_segments / col_segments: segment of each token (0 = A, 1 = B of a text pair).
    """

    name: str
    rows: list[str]
    cols: list[str]
    layers: list[int]
    heads: list[int]
    weights: np.ndarray
    row_segments: list[int] = field(default_factory=list)
    col_segments: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        want = (len(self.layers), len(self.heads), len(self.rows), len(self.cols))
        if tuple(self.weights.shape) != want:
            raise LmforgeError(f"attention map {self.name!r}: weights of shape {tuple(self.weights.shape)} do not fit "
                               f"{want[0]} layers x {want[1]} heads x {want[2]} rows x {want[3]} columns")
        self.row_segments = self.row_segments or [0] * want[2]
        self.col_segments = self.col_segments or [0] * want[3]


@dataclass
class AttentionSet:
    """Every attention map of a model for one input (one map for an encoder; three for an encoder-decoder)."""

    title: str
    maps: list[AttentionMap]


def resolve_indices(wanted: Sequence[int] | None, n: int, what: str) -> list[int]:
    """Normalise user indices (negative ones count from the end) against ``n`` items; None means all.

    Raises:
        LmforgeError: an index outside [-n, n); the message names ``what`` (e.g. "decoder layer").
    """
    if wanted is None:
        return list(range(n))
    out: list[int] = []
    for i in wanted:
        if isinstance(i, bool) or not isinstance(i, int) or not -n <= i < n:
            raise LmforgeError(f"{what} {i!r} does not exist: valid indices are 0..{n - 1} (or -{n}..-1)")
        if i % n not in out:
            out.append(i % n)
    if not out:
        raise LmforgeError(f"no {what} selected; give at least one index")
    return out


def collect_attention(model: nn.Module, tokenizer: Any, text: str, pair: str | None = None, *,
                      layers: Sequence[int] | None = None, heads: Sequence[int] | None = None,
                      max_length: int | None = None) -> AttentionSet:
    """Run ``model`` on one input and return its attention weights.

    Args:
        model: an ``Encoder``, ``Decoder``, ``EncoderDecoder``, ``RNNSeq2Seq`` or ``RNNEncoder`` backbone (a
            ``TaskModel``'s backbone is used when given a TaskModel).
        tokenizer: the model's ``WordPieceTokenizer``.
        text: the input; for encoder-decoders the source.
        pair: the second text of a pair (encoder: segment B; decoder: appended after a [SEP]); for encoder-decoders
            the target, which the decoder reads as ``[CLS] y`` (required there).
        layers: layer indices to keep (negative count from the end), default all; RNN maps have one layer.
        heads: head indices to keep, default all; RNN maps have one head.
        max_length: truncate longer inputs to this many tokens (default and upper bound: the model's
            ``max_seq_len`` for Transformers).

    Returns:
        An AttentionSet with one map per kind of attention.

    Raises:
        LmforgeError: an unknown model type, a missing target text for an encoder-decoder, an empty input, a
            layer or head index that does not exist.
    """
    model = getattr(model, "backbone", model)
    config = getattr(model, "config", None)
    arch = getattr(config, "arch", None)
    family = architecture(arch) if arch in ARCHITECTURES else None
    if family is None or not family.returns_attention:
        raise LmforgeError(f"cannot collect attention from a {type(model).__name__} (arch {arch!r}); supported "
                           f"architectures: {', '.join(architectures_with('returns_attention'))}")
    if max_length is not None and max_length < 1:
        raise LmforgeError(f"max_length must be >= 1; got {max_length}")
    was_training = model.training
    model.eval()  # no dropout on the weights we show
    try:
        with torch.no_grad():
            maps = _COLLECTORS[arch](model, tokenizer, text, pair, layers, heads, max_length)
    finally:
        model.train(was_training)
    c = config
    if family.recurrent:
        size = f"{c.rnn_cell.upper()}, d_model {c.d_model}, {c.attention} attention"
    elif family.has_encoder_decoder:
        size = (f"{c.n_layers} encoder + {len(model.decoder_layers)} decoder layers, {c.n_heads} heads, "
                f"d_model {c.d_model}")
    else:
        size = f"{c.n_layers} layers, {c.n_heads} heads, d_model {c.d_model}"
    return AttentionSet(f"{type(model).__name__} ({size})", maps)


# ------------------------------------------------------------------------------------------------ per family
def _limit(config: Any, max_length: int | None) -> int | None:
    """The tokens kept per input: ``max_length`` (None: no limit of the user's), never more than the positions a
    position-limited family has."""
    limit = config.max_seq_len if architecture(config.arch).position_limited else None
    if max_length is not None:
        limit = max_length if limit is None else min(limit, max_length)
    return limit


def _tokens(tokenizer: Any, ids: Sequence[int]) -> list[str]:
    return list(tokenizer.convert_ids_to_tokens(list(ids)))


def _stack(per_layer: Sequence[Tensor | None], layers: list[int], heads: list[int]) -> np.ndarray:
    """Layer tensors (1, H_all, R, C) -> (L, H, R, C) float32 numpy for the kept layers and heads."""
    picked = []
    for layer in layers:
        w = per_layer[layer]
        assert w is not None, f"layer {layer} returned no attention weights"
        picked.append(w[0, heads].float())  # (H, R, C)
    return torch.stack(picked).cpu().numpy()


def _pieces(tokenizer: Any, text: str, what: str) -> list[int]:
    if not isinstance(text, str):
        raise LmforgeError(f"the {what} must be a string; got {type(text).__name__}")
    ids = tokenizer.encode_ids(text)
    if not ids:
        raise LmforgeError(f"the {what} {text!r} has no tokens; give some text")
    return ids


def _cut(ids: list[int], limit: int | None, what: str) -> list[int]:
    if limit is not None and len(ids) > limit:
        log.warning("the %s has %d tokens; kept the first %d", what, len(ids), limit)
        return ids[:limit]
    return ids


def _encoder(model, tokenizer, text, pair, layers, heads, max_length) -> list[AttentionMap]:
    config = model.config
    enc = tokenizer(text, pair, truncation=True, max_length=_limit(config, max_length))
    ids = torch.tensor([enc["input_ids"]])  # (1, T)
    types = torch.tensor([enc["token_type_ids"]])  # (1, T)
    keep_layers = resolve_indices(layers, config.n_layers, "layer")
    keep_heads = resolve_indices(heads, config.n_heads, "head")
    out = model(ids, token_type_ids=types, output_attentions=keep_layers)
    tokens = _tokens(tokenizer, enc["input_ids"])
    segments = list(enc["token_type_ids"])
    return [AttentionMap("encoder self-attention", tokens, tokens, keep_layers, keep_heads,
                         _stack(out.attentions, keep_layers, keep_heads), segments, segments)]


def _one_sequence(model, tokenizer, text, pair, layers, heads, max_length):
    """A left-to-right model's input: the text (and ``pair`` after a [SEP], as segment 1) cut to the model's limit;
    returns (ids, segments, kept layers, kept heads)."""
    config = model.config
    ids = _pieces(tokenizer, text, "text")
    segments = [0] * len(ids)
    if pair is not None:
        second = _pieces(tokenizer, pair, "pair text")
        ids = [*ids, tokenizer.sep_id, *second]
        segments += [0] + [1] * len(second)
    ids = _cut(ids, _limit(config, max_length), "input")
    return (ids, segments[:len(ids)], resolve_indices(layers, config.n_layers, "layer"),
            resolve_indices(heads, config.n_heads, "head"))


def _decoder(model, tokenizer, text, pair, layers, heads, max_length) -> list[AttentionMap]:
    ids, segments, keep_layers, keep_heads = _one_sequence(model, tokenizer, text, pair, layers, heads, max_length)
    out = model(torch.tensor([ids]), output_attentions=keep_layers, return_logits=False)
    tokens = _tokens(tokenizer, ids)
    return [AttentionMap("decoder causal self-attention", tokens, tokens, keep_layers, keep_heads,
                         _stack(out.attentions, keep_layers, keep_heads), segments, segments)]


def _xlnet(model, tokenizer, text, pair, layers, heads, max_length) -> list[AttentionMap]:
    ids, segments, keep_layers, keep_heads = _one_sequence(model, tokenizer, text, pair, layers, heads, max_length)
    out = model(torch.tensor([ids]), token_type_ids=torch.tensor([segments]), output_attentions=True)
    tokens = _tokens(tokenizer, ids)
    return [AttentionMap(f"XLNet content-stream self-attention ({model.config.attn_type})", tokens, tokens,
                         keep_layers, keep_heads, _stack(out.attentions, keep_layers, keep_heads), segments, segments)]


def _source_target(model, tokenizer, text, pair, max_length) -> tuple[list[int], list[int]]:
    if pair is None:
        raise LmforgeError("an encoder-decoder needs the target text too: pass it as the pair (--pair TEXT); the "
                           "decoder reads [CLS] + its pieces, as in training")
    limit = _limit(model.config, max_length)
    src = _cut(_pieces(tokenizer, text, "source text"), limit, "source")
    tgt = _cut([tokenizer.cls_id, *_pieces(tokenizer, pair, "target text")], limit, "target")
    return src, tgt


def _encoder_decoder(model, tokenizer, text, pair, layers, heads, max_length) -> list[AttentionMap]:
    config = model.config
    src, tgt = _source_target(model, tokenizer, text, pair, max_length)
    src_ids, tgt_ids = torch.tensor([src]), torch.tensor([tgt])  # (1, S), (1, T)
    n_dec = len(model.decoder_layers)
    enc_layers = resolve_indices(layers, config.n_layers, "encoder layer")
    dec_layers = resolve_indices(layers, n_dec, "decoder layer")
    keep_heads = resolve_indices(heads, config.n_heads, "head")
    memory, enc_weights = _encode_with_weights(model, src_ids)
    out = model.decode(tgt_ids, memory, output_attentions=True, return_logits=False)
    src_tok, tgt_tok = _tokens(tokenizer, src), _tokens(tokenizer, tgt)
    return [
        AttentionMap("encoder self-attention", src_tok, src_tok, enc_layers, keep_heads,
                     _stack(enc_weights, enc_layers, keep_heads)),
        AttentionMap("decoder causal self-attention", tgt_tok, tgt_tok, dec_layers, keep_heads,
                     _stack(out.self_attentions, dec_layers, keep_heads)),
        AttentionMap("cross-attention", tgt_tok, src_tok, dec_layers, keep_heads,
                     _stack(out.cross_attentions, dec_layers, keep_heads)),
    ]


def _encode_with_weights(model, src_ids: Tensor) -> tuple[Tensor, list[Tensor]]:
    """``EncoderDecoder.encode`` step by step, keeping every layer's self-attention weights (B = 1, no padding).

    ``encode`` has no ``output_attentions``; this repeats its few lines with ``need_weights=True`` (the math path).
    The tests check that the memory equals ``model.encode``, so a change there cannot slip by unnoticed.
    """
    B, S = model._check_ids(src_ids, "src_ids")
    model._check_length(S, 0, "source")
    x = model._embed(model.src_embed, model.src_position, src_ids, 0, None)  # (1, S, D)
    weights = []
    for layer in model.encoder_layers:
        out = layer(x, attention_mask=None, need_weights=True)
        x = out.hidden  # (1, S, D)
        weights.append(out.self_attn_weights)  # (1, H, S, S)
    memory = x if model.encoder_norm is None else model.encoder_norm(x)
    return memory, weights


def _rnn_seq2seq(model, tokenizer, text, pair, layers, heads, max_length) -> list[AttentionMap]:
    src, tgt = _source_target(model, tokenizer, text, pair, max_length)
    src_ids, tgt_ids = torch.tensor([src]), torch.tensor([tgt])  # (1, S), (1, T)
    keep_layers = resolve_indices(layers, 1, "layer (the RNN's cross-attention has one)")
    keep_heads = resolve_indices(heads, 1, "head (the RNN's cross-attention has one)")
    out = model(src_ids, tgt_ids, torch.ones_like(src_ids), torch.ones_like(tgt_ids), output_attentions=True)
    weights = out.attentions[0].float().cpu().numpy()[None, None]  # (T, S) of the one row -> (1, 1, T, S)
    return [AttentionMap("cross-attention", _tokens(tokenizer, tgt), _tokens(tokenizer, src), keep_layers,
                         keep_heads, weights)]


def _rnn_encoder(model, tokenizer, text, pair, layers, heads, max_length) -> list[AttentionMap]:
    enc = tokenizer(text, pair, truncation=max_length is not None, max_length=max_length)
    ids = torch.tensor([enc["input_ids"]])  # (1, T)
    keep_layers = resolve_indices(layers, 1, "layer (attention pooling has one)")
    keep_heads = resolve_indices(heads, 1, "head (attention pooling has one)")
    out = model(ids, output_attentions=True)
    weights = out.attentions[0].float().cpu().numpy()  # (1, 1, 1, T)
    return [AttentionMap("attention pooling", ["[pool]"], _tokens(tokenizer, enc["input_ids"]), keep_layers,
                         keep_heads, weights, [0], list(enc["token_type_ids"]))]


# The collectors read each family's own modules (``decoder_layers``, ``src_embed``, the pooling weights...), so this
# table is keyed on the concrete family; which families qualify is the registry's ``returns_attention``.
_COLLECTORS = {"encoder": _encoder, "decoder": _decoder, "seq2seq": _encoder_decoder,
               "seq2seq_encoder": _encoder,  # an encoder-decoder's encoder alone reads its input as BERT does
               "rnn": _rnn_encoder,
               "rnn_seq2seq": _rnn_seq2seq, "elmo": _rnn_encoder,  # ELMo's task BiLSTM pools like the RNN encoder
               "xlnet": _xlnet}

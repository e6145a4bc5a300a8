"""GPT: a decoder-only Transformer language model (Radford et al. 2018, 2019).

Shape legend: B batch, T new (query) length, P cached (past) length, S = P + T key length, L layers, H heads,
D model dim, V vocab.

The forward pass, top to bottom:
    x = Dropout(TokenEmbedding(ids) [* sqrt(D)] + Positions(position_ids))     (B, T, D)
    x = DecoderLayer_l(x, causal, padding mask, cache_l)   for l = 1..L       (B, T, D)
    h = FinalNorm(x)                       (pre-LN only: GPT-2's ln_f)          (B, T, D)
    logits = h W_E^T  (tied)  or  h W_head^T  (untied)                        (B, T, V)

``attention_mask`` is (B, S) with 1 = real token, 0 = padding; with a cache, S counts the cached positions plus
the T new ones. Position ids are derived from it (cumsum - 1, clamped at 0), so a LEFT-padded prompt gets the
positions of the unpadded prompt and batched generation equals generating each prompt alone.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import torch
from torch import Tensor, nn

from lmforge.config import ModelConfig
from lmforge.errors import LmforgeError
from lmforge.models import PretrainedMixin
from lmforge.models.outputs import DecoderOutput
from lmforge.nn import (
    DecoderLayer,
    RotaryEmbedding,
    StackCache,
    build_positional,
    check_input_ids,
    key_padding_mask,
    positions_from_mask,
    select_layers,
)
from lmforge.nn.capture import capturing, one_graph
from lmforge.nn.init import normal_init
from lmforge.nn.kernels.few_rows import project_rows
from lmforge.nn.kernels.packed_dropout import Dropout
from lmforge.nn.kernels.tied_embedding import embed_tokens
from lmforge.nn.stack import run_layers

__all__ = ["Decoder", "DecoderCache", "DecoderOutput"]


class DecoderCache(StackCache):
    """Key/value caches of every layer of a ``Decoder``: the state of incremental decoding.

    Make one with ``model.new_cache()`` (or ``DecoderCache()``: the model adds the per-layer caches on first use)
    and pass the same object to every ``forward`` call; it is extended in place. Everything it does is
    ``lmforge.nn.StackCache``'s (shared with ``Seq2SeqCache``); the subclass keeps the public name, and ``forward``
    accepts no other family's cache.

    Attributes:
        layers: one ``lmforge.nn.LayerCache`` per layer (only its ``self_attn`` part is used).
    """


def check_total_length(cfg: ModelConfig, past: int, new: int) -> int:
    """The total length S = cached ``past`` + ``new`` positions of a decoder of config ``cfg``; raise when it
    exceeds the model's positions. ``Decoder.forward``'s check, and the ONNX Runtime stand-in's
    (``lmforge.persistence.onnx_decoder``)."""
    total = past + new
    if total > cfg.max_seq_len:
        raise LmforgeError(f"total length {total} (cached {past} + new {new}) exceeds max_seq_len={cfg.max_seq_len}; "
                           "shorten the input or use a model with more positions")
    return total


class Decoder(PretrainedMixin, nn.Module):
    """GPT language model: Radford et al. 2018, "Improving Language Understanding by Generative Pre-Training", and
    Radford et al. 2019, "Language Models are Unsupervised Multitask Learners" (GPT-2).

    Token embedding plus learned positions (or sinusoidal / rotary, from ``config.positional``), dropout, a stack of
    masked self-attention blocks (``nn.DecoderLayer`` without cross-attention; pre-LN with a final LayerNorm when
    ``config.norm_first``, as GPT-2; post-LN as GPT-1 otherwise), and an LM head tied to the token embedding
    (``config.tie_embeddings``) or a separate bias-free ``lm_head``.

    Initialisation as GPT-2: every weight N(0, init_std), biases 0, LayerNorm (1, 0); the two residual output
    projections of each block (attention ``out_proj``, feed-forward ``fc2``) N(0, init_std / sqrt(2 L)).

    ``config.dropout`` acts on the embeddings and the residual branches, ``config.attention_dropout`` on the
    attention weights (GPT-2's embd_pdrop / resid_pdrop and attn_pdrop).

    State-dict keys: ``token_embedding.weight``, ``position_embedding.weight`` (learned positions only),
    ``layers.{l}.{self_attn.{q,k,v,out}_proj, self_attn_norm, ffn.fc1, ffn.fc2, ffn_norm}.{weight,bias}``,
    ``final_norm.{weight,bias}`` (pre-LN only), ``lm_head.weight`` (untied only).
    """

    def __init__(self, config: ModelConfig) -> None:
        """
        Args:
            config: a ``ModelConfig`` with ``arch="decoder"`` (e.g. the ``gpt-nano`` .. ``gpt2-small`` presets).
        """
        super().__init__()
        if config.arch != "decoder":
            raise LmforgeError(f"Decoder needs a config with arch='decoder'; got arch={config.arch!r}")
        assert config.d_ff is not None
        self.config = config
        D, L = config.d_model, config.n_layers
        self.token_embedding = nn.Embedding(config.vocab_size, D)
        # A table added to the embeddings, or (rotary) relative positions inside every self-attention.
        positions = build_positional(config.positional, d_model=D, d_head=config.d_head, max_len=config.max_seq_len)
        self.position_embedding: nn.Module | None = positions.table
        self.rotary: RotaryEmbedding | None = positions.rotary
        self.dropout = Dropout(config.dropout)
        self.layers = nn.ModuleList(
            DecoderLayer(D, config.n_heads, config.d_ff, dropout=config.dropout,
                         attention_dropout=config.attention_dropout, activation=config.activation,
                         norm_first=config.norm_first, layer_norm_eps=config.layer_norm_eps, kernel=config.kernel,
                         rotary=self.rotary, cross_attention=False, bias=config.bias,
                         gated_ffn=config.ffn == "gated")
            for _ in range(L))
        self.final_norm = nn.LayerNorm(D, eps=config.layer_norm_eps) if config.norm_first else None
        self.lm_head = None if config.tie_embeddings else nn.Linear(D, config.vocab_size, bias=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """GPT-2 initialisation (see the class docstring)."""
        std = self.config.init_std
        for module in self.modules():
            normal_init(module, std)
        # GPT-2: residual projections scaled by 1/sqrt(2 L), so the residual stream's variance does not grow with
        # depth (two residual additions per layer).
        resid_std = std / math.sqrt(2 * self.config.n_layers)
        for layer in self.layers:
            nn.init.normal_(layer.self_attn.out_proj.weight, std=resid_std)
            nn.init.normal_(layer.ffn.fc2.weight, std=resid_std)

    @property
    def output_weight(self) -> Tensor:
        """(V, D) the LM-head matrix: the token embedding when tied, else ``lm_head.weight``."""
        return self.token_embedding.weight if self.lm_head is None else self.lm_head.weight

    def get_input_embeddings(self) -> nn.Embedding:
        return self.token_embedding

    def resize_token_embeddings(self, vocab_size: int) -> list[int]:
        """Grow the vocabulary to ``vocab_size`` rows (tokens added for fine-tuning, e.g. GPT-1's start, delimiter
        and extract tokens); the old rows are kept, new rows drawn from N(0, init_std) (the caller may set them),
        a separate LM head grows too, and ``config.vocab_size`` follows. Returns the new row ids.

        Raises:
            LmforgeError: ``vocab_size`` is smaller than the current vocabulary.
        """
        old = self.config.vocab_size
        if vocab_size < old:
            raise LmforgeError(f"cannot shrink the vocabulary from {old} to {vocab_size} rows")
        if vocab_size == old:
            return []
        std, weight = self.config.init_std, self.token_embedding.weight
        grown = nn.Embedding(vocab_size, weight.shape[1], device=weight.device, dtype=weight.dtype)
        with torch.no_grad():
            nn.init.normal_(grown.weight, std=std)
            grown.weight[:old] = weight
        self.token_embedding = grown
        if self.lm_head is not None:
            head = nn.Linear(weight.shape[1], vocab_size, bias=False, device=weight.device, dtype=weight.dtype)
            with torch.no_grad():
                nn.init.normal_(head.weight, std=std)
                head.weight[:old] = self.lm_head.weight
            self.lm_head = head
        self.config = replace(self.config, vocab_size=vocab_size)
        return list(range(old, vocab_size))

    def new_cache(self) -> DecoderCache:
        """An empty cache with one LayerCache per layer."""
        return DecoderCache(len(self.layers))

    def lm_logits(self, hidden: Tensor, out: Tensor | None = None) -> Tensor:
        """Project hidden states to vocabulary scores, e.g. only the last position during generation.

        Args:
            hidden: (..., D), e.g. ``last_hidden_state[:, -1]``.
            out: an (N, V) buffer the scores of an (N, D) ``hidden`` may be written into, without gradients
                (``lmforge.nn.kernels.few_rows.project_rows``); the returned tensor is then that buffer or a new one.

        Returns:
            (..., V).
        """
        return project_rows(hidden, self.output_weight, out=out)  # (..., V); F.linear, faster for a step's rows

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
        cache: DecoderCache | None = None,
        output_hidden_states: bool = False,
        output_attentions: bool | Sequence[int] = False,
        return_logits: bool = True,
        last_only: bool = False,
    ) -> DecoderOutput:
        """Run the T new tokens through the model, attending to the cached positions too.

        Args:
            input_ids: (B, T) token ids in [0, V).
            attention_mask: (B, S) 1 = real token, 0 = padding, S = cache length + T (the whole sequence so far:
                the caller appends a 1 per generated token). None = no padding anywhere so far.
            position_ids: (B, T) or (T,) explicit positions; default from ``attention_mask`` (cumsum - 1, so left
                padding is skipped) or cache length + 0..T-1. Not accepted with rotary positions, which are relative
                and take their offset from the cache (a constant shift per row does not change rotary scores).
            cache: a DecoderCache to read and extend (incremental decoding); None for a single full pass.
            output_hidden_states: also return the hidden states of every layer.
            output_attentions: True (all layers) or layer indices whose attention weights to capture; those layers
                run the math path so the weights are exactly those used.
            return_logits: False skips the vocabulary projection (logits None).
            last_only: return the last position only (logits (B, 1, V), last_hidden_state (B, 1, D); the pooled output
                is then position T - 1 in every row, the last real token under left padding, as in generation).
                Without a cache, hidden states, attention weights or rotary positions, the last layer computes
                that position alone (``DecoderLayer(last_only=True)``): the same values, a sixth less work for a
                six-layer model; otherwise the full pass is sliced.

        Returns:
            DecoderOutput(logits (B, T, V), last_hidden_state (B, T, D), cache, hidden_states, attentions).
        """
        B, T = check_input_ids(input_ids, vocab_size=self.config.vocab_size)
        past = self._prepare_cache(cache, B)
        S = check_total_length(self.config, past, T)
        last = None  # (B,) each row's last real new token (the extract token), when there is padding
        if attention_mask is not None:
            # (formatting the sizes into the label would specialise a compiled graph on them: plain text there)
            label = "cached + new" if capturing() else f"cached + new = {past} + {T} = {S}"
            attention_mask = key_padding_mask(attention_mask, batch=B, length=S, length_label=label)  # (B, S) bool
            if position_ids is None and self.rotary is None:
                position_ids = positions_from_mask(attention_mask, T)  # (B, T)
            new = attention_mask[:, past:]  # (B, T)
            last = (new * torch.arange(1, T + 1, device=new.device)).argmax(-1)  # (B,) last True; 0 if none
            # compiled training too: a graph break, but the plain causal kernel is faster; exported or compiled for
            # inference: one graph, mask kept (lmforge.nn.capture.one_graph)
            if not one_graph() and bool(attention_mask.all()):
                attention_mask = None  # no padding: lets the kernel take its plain causal path
        if position_ids is not None and self.rotary is not None:
            raise LmforgeError(
                "position_ids cannot be given with positional='rotary': rotary positions are relative and offset by "
                "the cache length (left padding shifts a whole row, which leaves rotary scores unchanged)")

        x = embed_tokens(self.token_embedding, input_ids)  # (B, T, D)
        if self.config.scale_embeddings:
            x = x * math.sqrt(self.config.d_model)
        if self.position_embedding is not None:
            x = self.position_embedding(x, offset=past, positions=position_ids)  # (B, T, D)
        x = self.dropout(x)

        capture = select_layers(output_attentions, len(self.layers))  # a bool is never an index
        attentions = output_attentions is not False
        last_layer_alone = (last_only and cache is None and not output_hidden_states and not attentions
                            and self.rotary is None)
        # hidden states: the embeddings, the outputs of layers 1..L-1, and the final (normed) output
        out = run_layers(self.layers, x, final_norm=self.final_norm, cache=cache, weights_of=capture,
                         hidden_states=output_hidden_states, attentions=attentions,
                         alone="last_only" if last_layer_alone else None, attention_mask=attention_mask, causal=True)
        x = out.hidden  # (B, T, D), or (B, 1, D) when the last layer computed the last position alone
        if last_only:
            x = x[:, -1:]  # (B, 1, D); already so when the last layer computed it alone
            last = None
        logits = self.lm_logits(x) if return_logits else None  # (B, T, V)
        pooled = x[:, -1] if last is None else x[torch.arange(B, device=x.device), last]  # (B, D)
        return DecoderOutput(logits, x, cache, out.hidden_states, out.attentions, pooled)

    def _prepare_cache(self, cache: DecoderCache | None, B: int) -> int:
        if cache is None:
            return 0
        if not isinstance(cache, DecoderCache):
            raise LmforgeError(f"cache must be a DecoderCache (model.new_cache()); got {type(cache).__name__}")
        return cache.prepare(len(self.layers), B, rows="input_ids")

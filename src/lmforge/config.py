"""Typed configuration: dataclasses that validate themselves, strict TOML loading, dotted overrides, presets.

Every run and every checkpoint stores its resolved configuration as plain JSON (``to_dict``) and reads it
back strictly (``from_dict``): an unknown key is an error that lists the valid ones, so a typo never
silently falls back to a default.

Presets are partial overrides applied to ``ModelConfig``'s defaults; code never branches on a preset's name.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import math
import tomllib
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from lmforge.choices import (
    ACTIVATIONS,
    ARCHITECTURES,
    DECODER_ORDERS,
    HARD_ATTENTION_ESTIMATORS,
    INPUT_FORMATS,
    KERNELS,
    LAYER_SHARINGS,
    LOCAL_ALIGNMENTS,
    LONG_TEXT,
    MASKINGS,
    NON_TRANSFORMER_ARCHITECTURES,
    OPTIMIZERS,
    PARALLELS,
    POSITIONALS,
    PRECISIONS,
    RECURRENT_ARCHITECTURES,
    RNN_CELLS,
    RNN_SEQ2SEQ_ATTENTIONS,
    SCHEDULES,
    SPAN_POOLINGS,
    TAG_SCHEMES,
    TASKS,
    TOKEN_ENCODERS,
    WORD_POOLINGS,
    XLNET_ATTN_TYPES,
)
from lmforge.errors import InputFileError, LmforgeError

T = TypeVar("T")



# Hard limits on single sizes, far above any real model (GPT-3 has 96 layers, d_model 12,288, d_ff 49,152): a typo or a
# crafted file fails here, at once, instead of in the allocator. What fits in memory is checked when a model is built.
MAX_SIZE = {"vocab_size": 1 << 24, "d_model": 1 << 16, "n_heads": 1 << 10, "n_layers": 1 << 10, "d_ff": 1 << 18,
            "max_seq_len": 1 << 20}


@dataclass
class ModelConfig:
    """The shape and options of a Transformer model (BERT encoder, GPT decoder, or encoder-decoder).

    ``d_ff`` defaults to ``4 * d_model``; ``d_head`` is ``d_model // n_heads``. For ``seq2seq``,
    ``n_layers`` counts encoder layers and ``n_decoder_layers`` decoder layers (default: the same).
    """

    arch: str = "encoder"
    vocab_size: int = 30522
    d_model: int = 768
    n_heads: int = 12
    n_layers: int = 12
    d_ff: int | None = None
    max_seq_len: int = 512
    dropout: float = 0.1
    attention_dropout: float = 0.1
    activation: str = "gelu"
    norm_first: bool = False
    layer_norm_eps: float = 1e-12
    positional: str = "learned"
    type_vocab_size: int = 2
    tie_embeddings: bool = True
    n_decoder_layers: int | None = None
    share_embeddings: bool = True
    scale_embeddings: bool = False
    kernel: str = "sdpa"
    pad_token_id: int = 0
    init_std: float = 0.02
    # encoder only. ALBERT (Lan et al. 2020): embedding_size E < d_model factorises the token embedding into (V, E)
    # and a projection E -> d_model (None: E = d_model, BERT); share_layers ties the layers' weights (LAYER_SHARINGS).
    # DistilBERT (Sanh et al. 2019): pooler=False drops the pooler (pooled_output is then the raw h_[CLS]), and
    # type_vocab_size=0 drops the segment embedding (token_type_ids are then ignored).
    embedding_size: int | None = None
    share_layers: str = "none"
    pooler: bool = True
    # RNN models (arch "rnn": a classifier backbone with attention pooling; "rnn_seq2seq": an attentional
    # encoder-decoder). d_model is the embedding and state width; n_layers counts stacked RNN layers.
    rnn_cell: str = "gru"
    bidirectional: bool = True
    attention: str = "general"
    attention_window: int | None = None
    input_feeding: bool = True
    # rnn_seq2seq only (the defaults are the model as it was before these options existed): attention "none" is in
    # the choices of ``attention``; local-m or local-p; Luong's or Bahdanau's decoder order; hard attention and its
    # gradient estimator (REINFORCE: moving-average reward baseline, optional entropy bonus)
    attention_alignment: str = "monotonic"
    decoder_order: str = "luong"
    hard_attention: bool = False
    hard_attention_estimator: str = "straight_through"
    reinforce_baseline_decay: float = 0.9
    reinforce_entropy: float = 0.0
    # bilm / elmo (ELMo, Peters et al. 2018; lmforge.models.elmo). d_model is the LSTMP projection (each direction's
    # output) and the token representation width; d_cell the LSTM cell width (None: d_model); the token layer is a
    # character CNN (d_char, char_filters = [[width, n_filters], ...], n_highway, max_chars_per_token) or an
    # embedding table; softmax_samples > 0 trains with a sampled softmax of that many negatives (0: full softmax).
    # elmo (fine-tuning on a frozen biLM): layer-normalise the layers before the scalar mix; task BiLSTM layers.
    token_encoder: str = "chars"
    d_cell: int | None = None
    d_char: int = 16
    char_filters: list[list[int]] = dataclasses.field(
        default_factory=lambda: [[1, 32], [2, 32], [3, 64], [4, 128], [5, 256], [6, 512], [7, 1024]])
    n_highway: int = 2
    max_chars_per_token: int = 50
    softmax_samples: int = 0
    elmo_layer_norm: bool = False
    elmo_rnn_layers: int = 1
    elmo_token_dim: int = 0  # > 0: a trainable token embedding of this width beside ELMo_k (the paper's [x_k; ELMo_k])
    # awd_lstm (AWD-LSTM, Merity et al. 2018; ULMFiT, Howard & Ruder 2018; lmforge.models.awd_lstm): d_model is the
    # embedding width (= the last LSTM layer's, tied), d_hidden the inner layers' width; the five dropouts (embedding
    # rows, variational on the input / between layers / on the output, DropConnect on W_hh) default to fastai's
    # AWD-LSTM classifier config; bptt: the window of BPT3C; bpt3c_grad_len: a document's last tokens that get
    # gradients; reverse: a backward model (each row's real tokens read right to left; ULMFiT's forward + backward
    # ensemble)
    d_hidden: int = 1150
    embed_p: float = 0.05
    input_p: float = 0.4
    hidden_p: float = 0.3
    weight_p: float = 0.5
    output_p: float = 0.4
    bptt: int = 70
    bpt3c_grad_len: int = 1440
    reverse: bool = False
    # xlnet (XLNet, Yang et al. 2019; lmforge.models.xlnet): attn_type "bi" (permutation masks decide who sees whom)
    # or "uni" (causal, Transformer-XL); mem_len: the states each layer keeps as memory for the next segment (None:
    # all of them); clamp_len: relative distances beyond it use its encoding (None: no clamping); same_length ("uni"
    # only): every query sees the same number of keys; lm_stream: the stream whose states predict the next token in
    # generation, "query" (XLNet's PLM trains it) or "content" (Transformer-XL's causal LM, objective txl)
    attn_type: str = "bi"
    mem_len: int | None = None
    clamp_len: int | None = None
    same_length: bool = False
    lm_stream: str = "query"
    # ELECTRA (Clark et al. 2020; objective electra, lmforge.heads.electra): the generator's width as a fraction of
    # this model's (d_model, n_heads and d_ff each scaled; same depth; embeddings shared with this model, which is the
    # discriminator); None: 1/4. Only pretraining reads it: fine-tuning and export use the discriminator alone.
    generator_size: float | None = None

    def __post_init__(self) -> None:
        if self.d_ff is None:
            self.d_ff = 4 * self.d_model
        if self.n_decoder_layers is None and self.arch == "seq2seq":
            self.n_decoder_layers = self.n_layers
        self.validate()

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    def validate(self) -> None:
        """Raise ``LmforgeError`` naming every offending value."""
        problems = []
        for name, choices in (("arch", ARCHITECTURES), ("positional", POSITIONALS),
                              ("activation", ACTIVATIONS), ("kernel", KERNELS), ("rnn_cell", RNN_CELLS),
                              ("attention", RNN_SEQ2SEQ_ATTENTIONS), ("attention_alignment", LOCAL_ALIGNMENTS),
                              ("decoder_order", DECODER_ORDERS),
                              ("hard_attention_estimator", HARD_ATTENTION_ESTIMATORS)):
            if getattr(self, name) not in choices:
                problems.append(f"{name}={getattr(self, name)!r} is not one of {', '.join(choices)}")
        recurrent = self.arch in RECURRENT_ARCHITECTURES
        transformer = self.arch not in NON_TRANSFORMER_ARCHITECTURES
        sizes = ("vocab_size", "d_model", "n_layers", "max_seq_len") + (("n_heads", "d_ff") if transformer else ())
        for name in sizes:
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                problems.append(f"{name}={value!r} must be a positive integer")
            elif value > MAX_SIZE[name]:
                problems.append(f"{name}={value} is beyond any model lmforge can build (at most {MAX_SIZE[name]:,})")
        if self.n_decoder_layers is not None and not 0 <= self.n_decoder_layers <= MAX_SIZE["n_layers"]:
            problems.append(f"n_decoder_layers={self.n_decoder_layers} must be in [0, {MAX_SIZE['n_layers']:,}]")
        if not problems and transformer and self.d_model % self.n_heads:
            problems.append(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}; choose "
                            f"n_heads among the divisors of {self.d_model}")
        for name in ("dropout", "attention_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                problems.append(f"{name}={getattr(self, name)} must be in [0, 1)")
        if not 0.0 <= self.init_std < 10.0:  # also refuses NaN
            problems.append(f"init_std={self.init_std} must be in [0, 10)")
        if not 0.0 < self.layer_norm_eps < 1.0:
            problems.append(f"layer_norm_eps={self.layer_norm_eps} must be in (0, 1)")
        if (transformer and self.positional == "rotary" and isinstance(self.n_heads, int) and self.n_heads > 0
                and self.d_model % self.n_heads == 0 and self.d_head % 2):
            problems.append(f"rotary positions need an even head size; d_model/n_heads = {self.d_head}")
        if not isinstance(self.type_vocab_size, int) or self.type_vocab_size < 0:
            problems.append(f"type_vocab_size={self.type_vocab_size!r} must be an integer >= 0 (0: no segment "
                            "embedding)")
        problems += self._compact_encoder_problems()
        if self.attention_window is not None and self.attention_window < 0:
            problems.append(f"attention_window={self.attention_window} must be >= 0 (None = global attention)")
        problems += self._rnn_attention_problems()
        problems += self._bilm_problems()
        problems += self._awd_lstm_problems()
        problems += self._xlnet_problems()
        problems += self._electra_problems()
        if recurrent and self.bidirectional and self.d_model % 2:
            problems.append(f"a bidirectional RNN splits d_model={self.d_model} between two directions; use an "
                            "even d_model")
        if not 0 <= self.pad_token_id < max(self.vocab_size, 1):
            problems.append(f"pad_token_id={self.pad_token_id} is outside the vocabulary (size {self.vocab_size})")
        if problems:
            raise LmforgeError("invalid model config: " + "; ".join(problems))

    def _compact_encoder_problems(self) -> list[str]:
        """ALBERT's and DistilBERT's options: encoder only, and sizes that fit."""
        problems = []
        if self.share_layers not in LAYER_SHARINGS:
            problems.append(f"share_layers={self.share_layers!r} is not one of {', '.join(LAYER_SHARINGS)}")
        E = self.embedding_size
        if E is not None and (not isinstance(E, int) or not 1 <= E <= MAX_SIZE["d_model"]):
            problems.append(f"embedding_size={E!r} must be an integer in [1, {MAX_SIZE['d_model']:,}] (None: d_model)")
        if self.arch != "encoder":
            changed = [f"{name}={getattr(self, name)!r}" for name, default in
                       (("embedding_size", None), ("share_layers", "none"), ("pooler", True))
                       if getattr(self, name) != default]
            if changed:
                problems.append(f"{', '.join(changed)} apply to arch='encoder' only (ALBERT / DistilBERT options), "
                                f"not arch={self.arch!r}; remove them")
        return problems

    @property
    def d_embedding(self) -> int:
        """The token embedding's width: ``embedding_size`` (ALBERT's E) or ``d_model``."""
        return self.d_model if self.embedding_size is None else self.embedding_size

    def _bilm_problems(self) -> list[str]:
        """The biLM's token-layer and LSTMP sizes (checked for every family: their defaults are valid)."""
        problems = []
        if self.token_encoder not in TOKEN_ENCODERS:
            problems.append(f"token_encoder={self.token_encoder!r} is not one of {', '.join(TOKEN_ENCODERS)}")
        for name in ("d_char", "n_highway", "max_chars_per_token", "softmax_samples", "elmo_rnn_layers",
                     "elmo_token_dim"):
            value, low = getattr(self, name), 1 if name in ("d_char", "elmo_rnn_layers") else 0
            if not isinstance(value, int) or not low <= value <= MAX_SIZE["d_ff"]:
                problems.append(f"{name}={value!r} must be an integer in [{low}, {MAX_SIZE['d_ff']:,}]")
        if self.d_cell is not None and not 1 <= self.d_cell <= MAX_SIZE["d_ff"]:
            problems.append(f"d_cell={self.d_cell} must be in [1, {MAX_SIZE['d_ff']:,}] (None: d_model)")
        filters = self.char_filters
        if not filters or not all(isinstance(f, list | tuple) and len(f) == 2 and all(
                isinstance(x, int) and 1 <= x <= MAX_SIZE["d_ff"] for x in f) for f in filters):
            problems.append(f"char_filters={filters!r:.80} must be a non-empty list of [width, n_filters] pairs of "
                            "positive integers")
        elif isinstance(self.max_chars_per_token, int) and self.max_chars_per_token < max(3, *(w for w, _ in filters)):
            problems.append(f"max_chars_per_token={self.max_chars_per_token} must be >= 3 (begin, one character, "
                            f"end) and >= the widest char filter ({max(w for w, _ in filters)})")
        return problems

    def _awd_lstm_problems(self) -> list[str]:
        """The AWD-LSTM's sizes and dropouts (checked for every family: their defaults are valid)."""
        problems = []
        for name in ("d_hidden", "bptt", "bpt3c_grad_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or not 1 <= value <= MAX_SIZE["d_ff"]:
                problems.append(f"{name}={value!r} must be an integer in [1, {MAX_SIZE['d_ff']:,}]")
        for name in ("embed_p", "input_p", "hidden_p", "weight_p", "output_p"):
            if not 0.0 <= getattr(self, name) < 1.0:  # also refuses NaN
                problems.append(f"{name}={getattr(self, name)} must be in [0, 1)")
        if self.reverse and self.arch != "awd_lstm":
            problems.append(f"reverse=true (a backward language model) applies to arch='awd_lstm' only, not "
                            f"arch={self.arch!r}; unset reverse")
        return problems

    def _xlnet_problems(self) -> list[str]:
        """XLNet's options: their values, and XLNet only (checked for every family: their defaults are valid)."""
        problems = []
        if self.attn_type not in XLNET_ATTN_TYPES:
            problems.append(f"attn_type={self.attn_type!r} is not one of {', '.join(XLNET_ATTN_TYPES)}")
        limit = MAX_SIZE["max_seq_len"]
        for name, what in (("mem_len", "None keeps every state"), ("clamp_len", "None: no clamping")):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                      or not 1 <= value <= limit):
                problems.append(f"{name}={value!r} must be an integer in [1, {limit:,}] or None ({what})")
        if self.lm_stream not in ("query", "content"):
            problems.append(f"lm_stream={self.lm_stream!r} is not one of query, content")
        if self.same_length and self.attn_type != "uni":
            problems.append("same_length=true shapes the causal mask of attn_type='uni'; with attn_type="
                            f"{self.attn_type!r} it would do nothing: unset it")
        if self.arch == "xlnet":
            if isinstance(self.d_model, int) and self.d_model % 2:
                problems.append(f"XLNet's relative position encodings pair sines and cosines: d_model={self.d_model} "
                                "must be even")
        else:
            changed = [f"{name}={getattr(self, name)!r}" for name, default in
                       (("attn_type", "bi"), ("mem_len", None), ("clamp_len", None), ("same_length", False),
                        ("lm_stream", "query"))
                       if getattr(self, name) != default]
            if changed:
                problems.append(f"{', '.join(changed)} apply to arch='xlnet' only, not arch={self.arch!r}; remove "
                                "them")
        return problems

    def _electra_problems(self) -> list[str]:
        """ELECTRA's generator size: a fraction in (0, 1], for an encoder (checked for every family: None is valid)."""
        g = self.generator_size
        if g is None:
            return []
        if isinstance(g, bool) or not isinstance(g, int | float) or not 0.0 < g <= 1.0:  # also refuses NaN
            return [f"generator_size={g!r} must be a fraction in (0, 1] of the discriminator's width (ELECTRA: 1/4 "
                    "for small, 1/3 for base), or unset for 1/4"]
        if self.arch != "encoder":
            return [f"generator_size={g!r} applies to arch='encoder' only (ELECTRA's generator), not "
                    f"arch={self.arch!r}; remove it"]
        return []

    def _rnn_attention_problems(self) -> list[str]:
        """The attention options of the RNN encoder-decoder that contradict each other or the family."""
        problems = []
        if self.attention_alignment == "predictive" and (self.attention_window is None or self.attention_window < 1):
            problems.append(f"attention_alignment='predictive' is local-p attention and needs attention_window >= 1 "
                            f"(its Gaussian has sigma = D/2); got attention_window={self.attention_window}")
        if self.attention == "none":
            if self.arch == "rnn":
                problems.append("attention='none' leaves attention pooling nothing to pool with; choose a score")
            if self.attention_window is not None:
                problems.append(f"attention='none' has no attention to make local; unset attention_window "
                                f"(got {self.attention_window})")
            if self.hard_attention:
                problems.append("attention='none' has no attention to make hard; unset hard_attention")
        if self.arch == "rnn" and (self.hard_attention or self.decoder_order != "luong"):
            problems.append("hard_attention and decoder_order apply to the RNN encoder-decoder (arch='rnn_seq2seq'); "
                            "attention pooling (arch='rnn') is soft and has no decoder")
        if not 0.0 <= self.reinforce_baseline_decay < 1.0:  # also refuses NaN
            problems.append(f"reinforce_baseline_decay={self.reinforce_baseline_decay} must be in [0, 1)")
        if not 0.0 <= self.reinforce_entropy < math.inf:
            problems.append(f"reinforce_entropy={self.reinforce_entropy} must be a finite number >= 0 (0 = no bonus)")
        return problems


# Partial overrides of ModelConfig. BERT sizes are those of Google's released BERTs (L, H, A); GPT sizes follow
# minGPT's small models and GPT-2 small; Transformer sizes follow Vaswani et al. (2017), Table 3.
PRESETS: dict[str, dict[str, Any]] = {
    "bert-tiny": dict(arch="encoder", n_layers=2, d_model=128, n_heads=2),
    "bert-mini": dict(arch="encoder", n_layers=4, d_model=256, n_heads=4),
    "bert-small": dict(arch="encoder", n_layers=4, d_model=512, n_heads=8),
    "bert-medium": dict(arch="encoder", n_layers=8, d_model=512, n_heads=8),
    "bert-base": dict(arch="encoder", n_layers=12, d_model=768, n_heads=12),
    "bert-large": dict(arch="encoder", n_layers=24, d_model=1024, n_heads=16),
    # ALBERT (Lan et al. 2020, Table 1; the v2 configs: no dropout, tanh-approximated GELU, 30k vocabulary):
    # factorised embeddings of size E = 128 and every layer sharing one set of weights. albert-mini is bert-mini's
    # shape made the same way (with dropout, for small corpora), to train here.
    "albert-mini": dict(arch="encoder", n_layers=4, d_model=256, n_heads=4, embedding_size=128, share_layers="all",
                        activation="gelu_tanh"),
    "albert-base": dict(arch="encoder", n_layers=12, d_model=768, n_heads=12, embedding_size=128,
                        share_layers="all", activation="gelu_tanh", dropout=0.0, attention_dropout=0.0,
                        vocab_size=30000),
    "albert-large": dict(arch="encoder", n_layers=24, d_model=1024, n_heads=16, embedding_size=128,
                         share_layers="all", activation="gelu_tanh", dropout=0.0, attention_dropout=0.0,
                         vocab_size=30000),
    "albert-xlarge": dict(arch="encoder", n_layers=24, d_model=2048, n_heads=16, embedding_size=128,
                          share_layers="all", activation="gelu_tanh", dropout=0.0, attention_dropout=0.0,
                          vocab_size=30000),
    "albert-xxlarge": dict(arch="encoder", n_layers=12, d_model=4096, n_heads=64, embedding_size=128,
                           share_layers="all", activation="gelu_tanh", dropout=0.0, attention_dropout=0.0,
                           vocab_size=30000),
    # DistilBERT (Sanh et al. 2019): BERT-base halved in depth, no segment embedding, no pooler
    "distilbert-base": dict(arch="encoder", n_layers=6, d_model=768, n_heads=12, type_vocab_size=0, pooler=False),
    "gpt-nano": dict(arch="decoder", n_layers=3, d_model=48, n_heads=3, norm_first=True, layer_norm_eps=1e-5,
                     activation="gelu_tanh", max_seq_len=1024, type_vocab_size=0),
    "gpt-micro": dict(arch="decoder", n_layers=4, d_model=128, n_heads=4, norm_first=True, layer_norm_eps=1e-5,
                      activation="gelu_tanh", max_seq_len=1024, type_vocab_size=0),
    "gpt-mini": dict(arch="decoder", n_layers=6, d_model=192, n_heads=6, norm_first=True, layer_norm_eps=1e-5,
                     activation="gelu_tanh", max_seq_len=1024, type_vocab_size=0),
    "gpt2-small": dict(arch="decoder", n_layers=12, d_model=768, n_heads=12, norm_first=True,
                       layer_norm_eps=1e-5, activation="gelu_tanh", max_seq_len=1024, vocab_size=50257,
                       type_vocab_size=0),
    "transformer-base": dict(arch="seq2seq", n_layers=6, n_decoder_layers=6, d_model=512, n_heads=8, d_ff=2048,
                             positional="sinusoidal", activation="relu", layer_norm_eps=1e-6,
                             scale_embeddings=True, type_vocab_size=0, max_seq_len=1024),
    "transformer-big": dict(arch="seq2seq", n_layers=6, n_decoder_layers=6, d_model=1024, n_heads=16,
                            d_ff=4096, dropout=0.3, positional="sinusoidal", activation="relu",
                            layer_norm_eps=1e-6, scale_embeddings=True, type_vocab_size=0, max_seq_len=1024),
    # the lectures' RNN models: a BiGRU classifier with attention pooling, and Luong et al.'s (2015) attentional
    # encoder-decoder (bidirectional GRU encoder, "general" score, input feeding)
    "rnn-attn": dict(arch="rnn", n_layers=1, d_model=256, dropout=0.1, type_vocab_size=0),
    # the AWD-LSTM language model: "awd-lstm" at the sizes of Merity et al. (2018) and ULMFiT (emb 400, hidden 1150,
    # 3 layers); "awd-lstm-small" trains on a 2-core laptop in minutes (same dropouts)
    "awd-lstm": dict(arch="awd_lstm", d_model=400, d_hidden=1150, n_layers=3, bidirectional=False,
                     max_seq_len=1 << 20, type_vocab_size=0),
    "awd-lstm-small": dict(arch="awd_lstm", d_model=128, d_hidden=256, n_layers=3, bidirectional=False,
                           max_seq_len=1 << 20, type_vocab_size=0),
    "rnn-seq2seq": dict(arch="rnn_seq2seq", n_layers=1, d_model=256, dropout=0.1, type_vocab_size=0,
                        attention="general", input_feeding=True),
    # ELMo's biLM (Peters et al. 2018, section 3.4 and the released options file): 2 LSTMP layers of 4096 cells
    # projected to 512, residual between them; a char CNN with filters (width, count) summing to 2048, 2 highway
    # layers, 16-dim characters, 50 characters per token. elmo-small trains on a laptop CPU in minutes.
    "elmo-original": dict(arch="bilm", n_layers=2, d_model=512, d_cell=4096, dropout=0.1, rnn_cell="lstm",
                          type_vocab_size=0, max_seq_len=1024, token_encoder="chars", d_char=16, n_highway=2,
                          max_chars_per_token=50,
                          char_filters=[[1, 32], [2, 32], [3, 64], [4, 128], [5, 256], [6, 512], [7, 1024]]),
    "elmo-small": dict(arch="bilm", n_layers=2, d_model=128, d_cell=256, dropout=0.1, rnn_cell="lstm",
                       type_vocab_size=0, max_seq_len=1024, token_encoder="chars", d_char=16, n_highway=1,
                       max_chars_per_token=20, char_filters=[[1, 16], [2, 32], [3, 64], [4, 64], [5, 80]]),
    # XLNet (Yang et al. 2019; the released xlnet-*-cased configs: 32k SentencePiece vocabulary, d_inner 4 D, GELU,
    # dropout 0.1, attn_type "bi", no clamping); xlnet-tiny trains on a laptop
    "xlnet-tiny": dict(arch="xlnet", n_layers=4, d_model=128, n_heads=4, d_ff=512, vocab_size=32000,
                       max_seq_len=512, pad_token_id=5),
    "xlnet-base": dict(arch="xlnet", n_layers=12, d_model=768, n_heads=12, d_ff=3072, vocab_size=32000,
                       max_seq_len=512, pad_token_id=5),
    "xlnet-large": dict(arch="xlnet", n_layers=24, d_model=1024, n_heads=16, d_ff=4096, vocab_size=32000,
                        max_seq_len=512, pad_token_id=5),
    # Transformer-XL language models (Dai et al. 2019; objective txl) on the XLNet family: causal attention
    # (attn_type "uni"), relative positions, a memory of mem_len states per layer, ReLU feed-forward as the original
    # code, no same_length in training. transformer-xl-base has the sizes of their WikiText-103 base model (16 layers,
    # d_model 410, 10 heads, d_inner 2100, segment and memory 150, dropout 0.1, no attention dropout) with a full tied
    # softmax in place of the adaptive one; transformer-xl-tiny trains on a laptop
    "transformer-xl-tiny": dict(arch="xlnet", n_layers=4, d_model=128, n_heads=4, d_ff=512, vocab_size=32000,
                                max_seq_len=512, attn_type="uni", mem_len=64, same_length=False, activation="relu",
                                lm_stream="content"),
    "transformer-xl-base": dict(arch="xlnet", n_layers=16, d_model=410, n_heads=10, d_ff=2100, vocab_size=32000,
                                max_seq_len=512, attn_type="uni", mem_len=150, same_length=False, activation="relu",
                                dropout=0.1, attention_dropout=0.0, lm_stream="content"),
    # ELECTRA discriminators (Clark et al. 2020, Table 6; objective electra): post-LN BERT encoders without a pooler;
    # generator_size scales the generator's d_model, n_heads and d_ff (small: 1/4 -> 64 wide, 1 head, d_ff 256; base:
    # 1/3 -> 256, 4 heads, 1024). electra-small factorises the embedding (E = 128 < d_model 256); in electra-base
    # E = d_model = 768 and only the generator projects it (768 -> 256). electra-tiny trains on a laptop in minutes.
    "electra-tiny": dict(arch="encoder", n_layers=2, d_model=128, n_heads=2, d_ff=512, embedding_size=64,
                         pooler=False, generator_size=0.25),
    "electra-small": dict(arch="encoder", n_layers=12, d_model=256, n_heads=4, d_ff=1024, embedding_size=128,
                          pooler=False, generator_size=0.25),
    "electra-base": dict(arch="encoder", n_layers=12, d_model=768, n_heads=12, d_ff=3072, pooler=False,
                         generator_size=1 / 3),
    # BART (Lewis et al. 2020; objective denoise): the encoder-decoder with BERT's choices, post-LN, GELU, learned
    # positions, no embedding scaling, one embedding matrix for the source, the target and the output. bart-base is
    # the paper's base size (6 + 6 layers, d_model 768, 12 heads, d_ff 3072, 1024 positions, GPT-2's 50,265 BPE
    # tokens). Deviation: BART also layer-normalises the embeddings of both stacks (layernorm_embedding), which
    # lmforge's EncoderDecoder has no option for. bart-tiny (2 + 2 layers, d_model 128) trains on a laptop in minutes.
    "bart-tiny": dict(arch="seq2seq", n_layers=2, n_decoder_layers=2, d_model=128, n_heads=4, d_ff=512,
                      positional="learned", activation="gelu", layer_norm_eps=1e-5, type_vocab_size=0,
                      max_seq_len=512),
    "bart-base": dict(arch="seq2seq", n_layers=6, n_decoder_layers=6, d_model=768, n_heads=12, d_ff=3072,
                      positional="learned", activation="gelu", layer_norm_eps=1e-5, type_vocab_size=0,
                      max_seq_len=1024, vocab_size=50265),
}


def model_config_from_preset(name: str, **overrides: Any) -> ModelConfig:
    """A ``ModelConfig`` from a named preset, with keyword overrides (e.g. ``vocab_size``)."""
    if name not in PRESETS:
        raise LmforgeError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
    values = {**PRESETS[name], **overrides}
    return from_dict(ModelConfig, values, where=f"preset {name!r}")


# ---------------------------------------------------------------------------------------------- generic machinery
def to_dict(obj: Any) -> dict[str, Any]:
    """A dataclass (nested ones included) as plain JSON/TOML-ready values."""
    return dataclasses.asdict(obj)


def _field_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _coerce(value: Any, annotation: Any, where: str) -> Any:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(annotation)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, where)
            except LmforgeError as err:
                errors.append(str(err))
        raise LmforgeError(errors[0] if errors else f"{where}: bad value {value!r}")
    if dataclasses.is_dataclass(annotation):
        if not isinstance(value, dict):
            raise LmforgeError(f"{where}: expected a table of settings, got {value!r}")
        return from_dict(annotation, value, where=where)
    if origin in (list, tuple, collections.abc.Sequence):
        if not isinstance(value, list | tuple):
            raise LmforgeError(f"{where}: expected a list, got {value!r}")
        (item,) = typing.get_args(annotation)[:1] or (Any,)
        return [_coerce(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
    if annotation is Any:
        return value
    if annotation is bool:
        if isinstance(value, bool):
            return value
        raise LmforgeError(f"{where}: expected true or false, got {value!r}")
    if annotation is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise LmforgeError(f"{where}: expected an integer, got {value!r}")
    if annotation is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        raise LmforgeError(f"{where}: expected a number, got {value!r}")
    if annotation is str:
        if isinstance(value, str):
            return value
        raise LmforgeError(f"{where}: expected a string, got {value!r}")
    if origin is dict:
        if isinstance(value, dict):
            return dict(value)
        raise LmforgeError(f"{where}: expected a table, got {value!r}")
    return value


def coerce(value: Any, annotation: Any, where: str) -> Any:
    """``value`` checked and converted to the type ``annotation`` (a dataclass, list, optional, literal ...), with
    errors naming ``where``: the one conversion used by configs, head options and Hugging Face configs."""
    return _coerce(value, annotation, where)


def from_dict(cls: type[T], values: dict[str, Any], where: str = "config") -> T:
    """Build dataclass ``cls`` from ``values`` strictly: unknown keys and wrong types are errors."""
    hints = _field_types(cls)
    names = [f.name for f in dataclasses.fields(cls) if f.init]  # type: ignore[arg-type]
    unknown = [k for k in values if k not in names]
    if unknown:
        raise LmforgeError(f"{where}: unknown key(s) {', '.join(map(repr, unknown))}; valid keys are "
                           f"{', '.join(names)}")
    kwargs = {k: _coerce(v, hints[k], f"{where}.{k}") for k, v in values.items()}
    return cls(**kwargs)


def load_toml(path: str | Path) -> dict[str, Any]:
    """Read a TOML file; errors name the file and the line."""
    path = Path(path)
    if not path.is_file():
        raise InputFileError(f"{path}: {'a folder, not a TOML file' if path.is_dir() else 'config file not found'}")
    try:
        return tomllib.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as err:
        raise InputFileError(f"{path}: not UTF-8 text (bad byte at offset {err.start}); a config file is TOML "
                             "saved as UTF-8") from None
    except tomllib.TOMLDecodeError as err:
        raise InputFileError(f"{path}: not valid TOML ({err})") from err
    except RecursionError:  # tomllib recurses into nested arrays and inline tables
        raise InputFileError(f"{path}: not valid TOML (nested too deeply)") from None


def parse_override(text: str) -> tuple[list[str], Any]:
    """``section.key=value`` -> (["section", "key"], value); the value is read as TOML, else as a string."""
    if "=" not in text:
        raise LmforgeError(f"override {text!r} must look like section.key=value")
    key, raw = text.split("=", 1)
    path = [p for p in key.strip().lstrip("-").split(".") if p]
    if not path:
        raise LmforgeError(f"override {text!r} has no key before '='")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return path, value


def toml_literal(value: Any) -> str:
    """``value`` written as a TOML literal, for building ``key=value`` overrides from plain flags."""
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return str(value).lower() if isinstance(value, bool) else repr(value)


def apply_overrides(values: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Set dotted keys in a nested dict (a copy); the dataclass check later rejects unknown keys."""
    out = _deep_copy(values)
    for text in overrides:
        path, value = parse_override(text)
        node = out
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise LmforgeError(f"override {text!r}: {part!r} is a value, not a section")
            node = child
        node[path[-1]] = value
    return out


def _deep_copy(values: dict[str, Any]) -> dict[str, Any]:
    return {k: _deep_copy(v) if isinstance(v, dict) else v for k, v in values.items()}




@dataclass
class TrainConfig:
    """How the Trainer optimises: batch, schedule, precision, evaluation, logging and checkpoints.

    ``batch_size`` is the global number of sequences per optimizer step; each process runs micro-batches of
    ``micro_batch_size`` (default: the whole share of one process) and accumulates
    ``batch_size / (micro_batch_size * world_size)`` of them.
    """

    max_steps: int | None = None  # None: derived by the recipe (epochs x batches per epoch; pretraining: 1000)
    batch_size: int = 32
    micro_batch_size: int | None = None
    optimizer: str = "adamw"  # OPTIMIZERS; "lamb": LAMB (You et al. 2020) for large batches (lmforge.training.optim)
    lr: float = 1e-4
    weight_decay: float = 0.01
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-6
    schedule: str = "linear"
    warmup_steps: int | None = None
    warmup_ratio: float = 0.01
    min_lr_ratio: float = 0.0
    stlr_cut_frac: float = 0.1  # schedule slanted_triangular (ULMFiT eq. 3): the fraction of steps that increase
    stlr_ratio: float = 32.0  # ... and how much smaller the lowest lr is than the peak
    max_grad_norm: float = 1.0
    # fp32; bf16 (autocast); auto: bf16 only where the device runs it natively and measurably faster for this model
    # (lmforge.training.precision), decided once per run and kept on resume
    precision: str = "fp32"
    # torch.compile the model the objective calls (lmforge.utils.compiling); checkpoints come from the plain module,
    # and a run may resume with compile switched on or off
    compile: bool = False
    eval_every: int | None = None  # None: derived by the recipe (fine-tuning: every epoch; else 0 = off)
    eval_batches: int = 20
    log_every: int = 10
    # Checkpoints: every save_every steps (0 = none by steps) and every save_minutes minutes of training (0 = none by
    # time), whichever comes first, and always at the end and on SIGTERM / SIGINT. None: the recipe's choice
    # (fine-tuning, seq2seq: every epoch), else the default cadence of DEFAULT_SAVE_EVERY steps or
    # DEFAULT_SAVE_MINUTES minutes, whose checkpoints are skipped while writing would take over 1/20 of the training
    # time (lmforge.training.trainer).
    save_every: int | None = None
    save_minutes: float | None = None
    keep_last: int = 2
    seed: int = 0
    tensorboard: bool = False
    # fine-tuning and seq2seq batches: each epoch's random order is cut into groups of 50 micro-batches sorted by
    # length inside, so a batch holds inputs of similar length (less padding; transformers' group_by_length)
    group_by_length: bool = False
    device: str = "auto"
    # several processes (torchrun): ddp replicates the model, fsdp shards parameters, gradients and optimizer state
    # (FSDP2; lmforge.training.distributed); ignored in a single process
    parallel: str = "ddp"

    def __post_init__(self) -> None:
        problems = []
        if self.parallel not in PARALLELS:
            problems.append(f"parallel={self.parallel!r} is not one of {', '.join(PARALLELS)}")
        if self.optimizer not in OPTIMIZERS:
            problems.append(f"optimizer={self.optimizer!r} is not one of {', '.join(OPTIMIZERS)}")
        if self.schedule not in SCHEDULES:
            problems.append(f"schedule={self.schedule!r} is not one of {', '.join(SCHEDULES)}")
        if self.precision not in PRECISIONS:
            problems.append(f"precision={self.precision!r} is not one of {', '.join(PRECISIONS)}")
        for name in ("max_steps", "batch_size", "log_every", "eval_batches"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                problems.append(f"{name}={getattr(self, name)} must be >= 1")
        if self.micro_batch_size is not None and self.micro_batch_size < 1:
            problems.append(f"micro_batch_size={self.micro_batch_size} must be >= 1")
        for name in ("eval_every", "save_every", "keep_last"):
            if getattr(self, name) is not None and getattr(self, name) < 0:
                problems.append(f"{name}={getattr(self, name)} must be >= 0 (0 = off / keep all)")
        if not 0 <= self.seed < 2**32:
            problems.append(f"seed={self.seed} must be in [0, 2**32)")
        for name in ("lr", "weight_decay", "beta1", "beta2", "eps", "warmup_ratio", "min_lr_ratio", "max_grad_norm"):
            if not math.isfinite(getattr(self, name)):
                problems.append(f"{name}={getattr(self, name)} must be a finite number")
        if self.save_minutes is not None and not 0 <= self.save_minutes < math.inf:
            problems.append(f"save_minutes={self.save_minutes} must be a finite number >= 0 (0 = no time-based "
                            "checkpoints)")
        if problems:  # the range checks below would pass NaN
            raise LmforgeError("invalid train config: " + "; ".join(problems))
        if self.lr <= 0:
            problems.append(f"lr={self.lr} must be positive")
        if self.weight_decay < 0:
            problems.append(f"weight_decay={self.weight_decay} must be >= 0 (0 = none)")
        for name in ("beta1", "beta2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                problems.append(f"{name}={getattr(self, name)} must be in [0, 1)")
        if self.eps <= 0:
            problems.append(f"eps={self.eps} must be positive")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            problems.append(f"min_lr_ratio={self.min_lr_ratio} must be in [0, 1]")
        if not 0.0 < self.stlr_cut_frac < 1.0:
            problems.append(f"stlr_cut_frac={self.stlr_cut_frac} must be in (0, 1)")
        if not 1.0 <= self.stlr_ratio < math.inf:
            problems.append(f"stlr_ratio={self.stlr_ratio} must be a finite number >= 1")
        if self.max_grad_norm < 0:
            problems.append(f"max_grad_norm={self.max_grad_norm} must be >= 0 (0 = no clipping)")
        if self.warmup_steps is not None and self.warmup_steps < 0:
            problems.append(f"warmup_steps={self.warmup_steps} must be >= 0")
        if not 0.0 <= self.warmup_ratio < 1.0:
            problems.append(f"warmup_ratio={self.warmup_ratio} must be in [0, 1)")
        if problems:
            raise LmforgeError("invalid train config: " + "; ".join(problems))

    def warmup(self) -> int:
        """Warm-up steps: ``warmup_steps`` when given, else ``warmup_ratio * max_steps`` (which must be set)."""
        return self.warmup_steps if self.warmup_steps is not None else int(self.warmup_ratio * self.max_steps)


# The default checkpoint cadence (TrainConfig.save_every / save_minutes = None): whichever comes first.
DEFAULT_SAVE_EVERY = 500
DEFAULT_SAVE_MINUTES = 10.0


@dataclass
class DataConfig:
    """Pretraining data: prepared shards, instance creation and masking (google-research/bert, SpanBERT)."""

    path: str = ""
    objective: str = "mlm+nsp"
    seq_len: int = 128
    short_seq_prob: float = 0.1
    nsp_prob: float = 0.5  # the share of negative pairs: a random B (NSP) or the two segments swapped (SOP)
    masking: str = "token"
    mask_prob: float = 0.15
    max_predictions: int | None = None  # None: round(mask_prob * seq_len), the budget following the length
    nsp_balance: str = "exact"  # exact: 50/50 by construction; bert: google-research/bert's draw (about 56/44)
    mask_token_ratio: float = 0.8
    random_token_ratio: float = 0.1
    span_p: float = 0.2
    max_span_len: int = 10
    max_ngram: int = 3  # masking "ngram" (ALBERT): the longest n-gram in words
    static: bool = False
    dupe_factor: int = 5
    eval_fraction: float = 0.02
    variable_bptt: bool = True  # plan "stream" (AWD-LSTM): window lengths drawn around seq_len (Merity et al. 2018)
    # objective awd_lm: activation regularisation (alpha * mean of the dropped last-layer outputs squared) and
    # temporal AR (beta * mean of the squared step-to-step change of the raw outputs), Merity et al. 2018 section 4.6;
    # their and fastai's values are 2 and 1. 0 = off (the default: the committed ULMFiT runs trained without them).
    ar_alpha: float = 0.0
    tar_beta: float = 0.0
    # objective plm (XLNet, lmforge.data.permutation): about 1/partial_k of the tokens are predicted, in spans of up
    # to plm_max_span words; num_predict is the number of prediction rows per sequence (None: ceil(seq_len / partial_k))
    partial_k: float = 6.0
    plm_max_span: int = 5
    num_predict: int | None = None
    # objective txl (Transformer-XL, lmforge.objectives.txl): the memory kept per layer while evaluating (None: the
    # model's mem_len, the training one); Dai et al. 2019 evaluate with a longer memory than they train with (WT103
    # base: 150 in training, 640 in evaluation). An option of the run's evaluation, not of the model: the saved model
    # keeps its training mem_len, and generation keeps every token anyway.
    eval_mem_len: int | None = None
    # objective electra (Clark et al. 2020): lambda, the weight of the discriminator's replaced-token-detection loss in
    # L = L_MLM(generator) + lambda * L_disc (the paper's 50)
    rtd_weight: float = 50.0
    # objective denoise (BART, Lewis et al. 2020; lmforge.data.corruption): how the encoder's input is corrupted, each
    # a share of the tokens (permute_sentences: of the sentences; rotate_prob: a probability per example); 0 = off.
    # The defaults are BART's final mix: text infilling of 30% of the tokens in Poisson(3) spans + every sentence
    # shuffled. Each step acts on the tokens the earlier ones left (order: lmforge.data.corruption.Corruption).
    infill_rate: float = 0.3
    poisson_lambda: float = 3.0
    permute_sentences: float = 1.0
    rotate_prob: float = 0.0
    token_mask_rate: float = 0.0
    substitute_rate: float = 0.0
    delete_rate: float = 0.0
    # objective clm (plan "causal", lmforge.data.instances.DocAlignedBlocks): every row starts at a document start
    # ([SEP] + the document + [SEP], cut into rows of at most seq_len + 1 tokens; a document's last row is shorter and
    # padded) instead of windows of the [SEP]-joined stream, where a document may start mid-row after the previous
    # document's tokens. Costs the padding; a 2-layer GPT found its induction head sooner this way on short documents.
    doc_aligned: bool = False

    def __post_init__(self) -> None:
        problems = []
        if not isinstance(self.objective, str) or not self.objective:  # the name is checked by the objective
            problems.append(f"objective={self.objective!r} must be a name")  # registry (lmforge.objectives)
        if self.masking not in MASKINGS:
            problems.append(f"masking={self.masking!r} is not one of {', '.join(MASKINGS)}")
        if self.seq_len < 8:
            problems.append(f"seq_len={self.seq_len} must be >= 8")
        for name in ("short_seq_prob", "nsp_prob", "mask_prob", "mask_token_ratio", "random_token_ratio",
                     "eval_fraction"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                problems.append(f"{name}={getattr(self, name)} must be in [0, 1]")
        for name in ("ar_alpha", "tar_beta"):
            if not 0.0 <= getattr(self, name) < float("inf"):  # also refuses NaN
                problems.append(f"{name}={getattr(self, name)} must be a number >= 0 (Merity et al.: 2 and 1)")
        if self.mask_token_ratio + self.random_token_ratio > 1.0:
            problems.append(f"mask_token_ratio + random_token_ratio = "
                            f"{self.mask_token_ratio + self.random_token_ratio} exceeds 1")
        if not 0.0 < self.span_p <= 1.0:
            problems.append(f"span_p={self.span_p} must be in (0, 1]")
        if self.nsp_balance not in ("exact", "bert"):
            problems.append(f"nsp_balance={self.nsp_balance!r} is not one of exact, bert")
        if self.max_span_len < 1 or self.max_ngram < 1 or \
                (self.max_predictions is not None and self.max_predictions < 1) or \
                self.dupe_factor < 1:
            problems.append("max_span_len, max_ngram, max_predictions and dupe_factor must be >= 1")
        problems += self._plm_problems()
        problems += self._denoise_problems()
        if not 0.0 <= self.rtd_weight < float("inf"):  # also refuses NaN
            problems.append(f"rtd_weight={self.rtd_weight} must be a finite number >= 0 (ELECTRA's lambda: 50)")
        if self.eval_mem_len is not None and (isinstance(self.eval_mem_len, bool) or not isinstance(
                self.eval_mem_len, int) or not 1 <= self.eval_mem_len <= MAX_SIZE["max_seq_len"]):
            problems.append(f"eval_mem_len={self.eval_mem_len!r} must be an integer in [1, "
                            f"{MAX_SIZE['max_seq_len']:,}] (the memory kept per layer while evaluating objective txl), "
                            "or unset for the model's mem_len")
        if not isinstance(self.doc_aligned, bool):
            problems.append(f"doc_aligned={self.doc_aligned!r} must be true or false")
        elif self.doc_aligned and self.objective != "clm":
            problems.append(f"doc_aligned=true applies to objective clm only (rows cut per document), not "
                            f"objective={self.objective!r}")
        if problems:
            raise LmforgeError("invalid data config: " + "; ".join(problems))

    def _plm_problems(self) -> list[str]:
        """The PLM options (objective plm); checked for every objective (their defaults are valid)."""
        problems = []
        if not 1.0 <= self.partial_k <= self.seq_len:  # also refuses NaN
            problems.append(f"partial_k={self.partial_k} must be in [1, seq_len={self.seq_len}]: about 1/partial_k of "
                            "the tokens are predicted (XLNet 6; 1 predicts every token)")
        if isinstance(self.plm_max_span, bool) or not isinstance(self.plm_max_span, int) or self.plm_max_span < 1:
            problems.append(f"plm_max_span={self.plm_max_span!r} must be an integer >= 1 (XLNet 5)")
        if self.num_predict is not None and (isinstance(self.num_predict, bool) or not isinstance(self.num_predict, int)
                                             or not 1 <= self.num_predict <= self.seq_len):
            problems.append(f"num_predict={self.num_predict!r} must be an integer in [1, seq_len={self.seq_len}] (the "
                            "prediction rows per sequence cannot outnumber its tokens), or unset for "
                            "ceil(seq_len / partial_k)")
        return problems

    def _denoise_problems(self) -> list[str]:
        """The corruption options (objective denoise); checked for every objective (their defaults are valid)."""
        problems = [f"{name}={getattr(self, name)} must be in [0, 1] (0 = off)" for name in
                    ("infill_rate", "permute_sentences", "rotate_prob", "token_mask_rate", "substitute_rate",
                     "delete_rate") if not 0.0 <= getattr(self, name) <= 1.0]  # also refuses NaN
        if not 0.0 < self.poisson_lambda <= 64.0:
            problems.append(f"poisson_lambda={self.poisson_lambda} must be in (0, 64]: the mean length of an infilled "
                            "span (BART 3)")
        return problems


SCHEMES = ("auto", *TAG_SCHEMES)  # auto: detected from the training tags


@dataclass
class TaskConfig:
    """A fine-tuning task: what the head predicts and how examples become model inputs.

    ``freeze``: ``none``, ``all`` (the whole backbone: feature extraction), ``embeddings``, or
    ``all-but-last:K`` (only the last K layers, the final norm and the pooler train). ``head_lr`` gives the head
    its own peak learning rate (default: the run's lr); ``layer_decay`` < 1 scales layer l of L by
    ``layer_decay ** (L + 1 - l)`` (embeddings l = 0; the head and pooler keep 1; ULMFiT's discriminative fine-tuning
    is ``layer_decay = 1/2.6``). ``gradual_unfreezing`` (ULMFiT): the first epoch trains only the last layer group
    (the head), each further epoch one more group, last first (``lmforge.training.unfreeze``). ``init_embeddings``: a
    word2vec-format vectors file whose rows replace the token embeddings of the tokens they name (static
    embeddings as the initialisation of a model trained from scratch; ``freeze = "embeddings"`` keeps them).
    """

    task: str = "sequence"
    max_length: int = 128
    text_column: str = "text"
    text_pair_column: str = "text_pair"
    label_column: str = "label"
    long_text: str = "truncate"
    head_tokens: int | None = None
    max_chunks: int = 8
    crf: bool = False
    scheme: str = "auto"
    subwords: str = "first"
    word_pooling: str = "first"
    max_span_width: int = 8
    span_pooling: str = "mean"
    doc_stride: int = 128
    max_query_length: int = 64
    max_answer_length: int = 30
    n_best: int = 20
    null_threshold: float = 0.0
    version_2: bool | None = None
    freeze: str = "none"
    head_lr: float | None = None
    layer_decay: float = 1.0
    gradual_unfreezing: bool = False  # ULMFiT: epoch 1 trains the head only, each epoch unfreezes one more layer
    epochs: float = 3.0
    dropout: float | None = None
    metric: str | None = None
    init_embeddings: str = ""
    span_features: str = "width"  # span task: "lecture" = [s_i; e_j; g_ij], "width" adds a width embedding
    span_decoding: str = "flat"  # span task: "flat" (non-overlapping) or "nested" (nesting spans, never crossing)
    # GPT-1 fine-tuning (Radford et al. 2018): input transformations, the auxiliary LM loss, similarity in both orders
    input_format: str = "auto"  # "bert": [CLS] a [SEP] b [SEP]; "gpt": [START] a [DELIM] b [EXTRACT]; auto: by family
    lm_weight: float | None = None  # L = L_task + lm_weight * L_LM on a GPT backbone (None: 0.5 there, else off)
    symmetric: bool = False  # pair task: encode (a, b) and (b, a), add the two representations (similarity)
    allow_causal: bool = False  # token / span tasks on a left-context-only backbone (refused by default)
    choices_column: str = "choices"  # choice task: the column (JSON list) holding the options

    def __post_init__(self) -> None:
        problems = []
        for name, choices in (("task", TASKS), ("long_text", LONG_TEXT), ("word_pooling", WORD_POOLINGS),
                              ("span_pooling", SPAN_POOLINGS), ("scheme", SCHEMES), ("subwords", ("first", "all")),
                              ("span_features", ("lecture", "width")), ("span_decoding", ("flat", "nested")),
                              ("input_format", INPUT_FORMATS)):
            if getattr(self, name) not in choices:
                problems.append(f"{name}={getattr(self, name)!r} is not one of {', '.join(choices)}")
        if self.max_length < 8:
            problems.append(f"max_length={self.max_length} must be >= 8")
        if self.task == "pair" and self.long_text != "truncate":
            problems.append(f"long_text={self.long_text!r} applies to single texts (--task sequence); a pair is "
                            "cut longest-first to max_length, so leave long_text at 'truncate'")
        for name in ("max_chunks", "max_span_width", "doc_stride", "max_query_length", "max_answer_length",
                     "n_best"):
            if getattr(self, name) < 1:
                problems.append(f"{name}={getattr(self, name)} must be >= 1")
        if self.head_tokens is not None and not 0 <= self.head_tokens <= self.max_length - 2:
            problems.append(f"head_tokens={self.head_tokens} must be in [0, max_length - 2]")
        if not 0.0 < self.layer_decay <= 1.0:
            problems.append(f"layer_decay={self.layer_decay} must be in (0, 1]")
        if self.head_lr is not None and not (self.head_lr > 0 and math.isfinite(self.head_lr)):
            problems.append(f"head_lr={self.head_lr} must be positive")
        if not self.epochs > 0 or not math.isfinite(self.epochs):  # NaN fails every comparison
            problems.append(f"epochs={self.epochs} must be a positive number")
        if self.lm_weight is not None and not (self.lm_weight >= 0 and math.isfinite(self.lm_weight)):
            problems.append(f"lm_weight={self.lm_weight} must be a finite number >= 0 (0 turns the auxiliary LM loss "
                            "off)")
        if self.symmetric and self.task != "pair":
            problems.append("symmetric=true encodes a PAIR in both orders (similarity tasks); it needs task='pair'")
        if self.gradual_unfreezing and self.freeze != "none":
            problems.append(f"gradual_unfreezing unfreezes layer groups epoch by epoch; it cannot be combined with "
                            f"freeze={self.freeze!r} (leave freeze at 'none')")
        if not _valid_freeze(self.freeze):
            problems.append(f"freeze={self.freeze!r} is not one of none, all, embeddings, all-but-last:K (K >= 0)")
        if problems:
            raise LmforgeError("invalid task config: " + "; ".join(problems))


def _valid_freeze(mode: str) -> bool:
    if mode in ("none", "all", "embeddings"):
        return True
    prefix = "all-but-last:"
    return mode.startswith(prefix) and mode[len(prefix):].isdigit()

"""BERT: a bidirectional Transformer encoder (Devlin et al. 2019).

Shape legend: B batch, T sequence length, D model dim (d_model), H heads, V vocabulary size, L layers,
G segment (token type) vocabulary size.

    input_ids (B, T) ──► token + position + segment embeddings ─► LayerNorm ─► dropout      (B, T, E)
                     ──► projection E -> D (ALBERT's factorised embedding; absent when E = D)   (B, T, D)
                     ──► L x EncoderLayer (self-attention, feed-forward; post-LN or pre-LN) (B, T, D)
                     ──► final LayerNorm (pre-LN only)                     = last_hidden_state (B, T, D)
                     ──► pooler: tanh(W h_[CLS] + b)                       = pooled_output     (B, D)

E is the embedding width: ``config.embedding_size`` (ALBERT, Lan et al. 2020) or D (BERT).

Compact variants are options of this one family, not copies of it:
    ALBERT      embedding_size=E < D, share_layers="all" (or "attention" / "ffn": only that sublayer shared)
    DistilBERT  type_vocab_size=0 (no segment embedding), pooler=False (pooled_output = h_[CLS]), fewer layers

Masks follow ``lmforge.nn.masks``: ``attention_mask`` (B, T) with 1 = real token, 0 = padding.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from lmforge.config import ModelConfig
from lmforge.errors import LmforgeError
from lmforge.models import PretrainedMixin
from lmforge.models.outputs import EncoderOutput, EncoderRowsOutput
from lmforge.nn.capture import one_graph
from lmforge.nn.init import normal_init
from lmforge.nn.inputs import check_id_range, check_input_ids, check_integer_tensor, select_layers
from lmforge.nn.kernels.packed_dropout import Dropout
from lmforge.nn.kernels.packing import Packing, ReadRows
from lmforge.nn.kernels.tied_embedding import embed_tokens
from lmforge.nn.layers import EncoderLayer
from lmforge.nn.masks import key_padding_mask
from lmforge.nn.positional import LearnedPositional, Positions, SinusoidalPositional, build_positional
from lmforge.nn.stack import run_layers

__all__ = ["Encoder", "EncoderEmbeddings", "EncoderOutput", "EncoderRowsOutput", "Pooler", "build_encoder_layers",
           "check_encoder_inputs", "init_bert_weights"]


def init_bert_weights(module: nn.Module, std: float) -> None:
    """BERT's initialisation of one module: weights N(0, std), biases 0, LayerNorm weight 1 and bias 0.

    Meant for ``model.apply(lambda m: init_bert_weights(m, std))``. Deviation from Hugging Face: the padding row
    of the token embedding is not zeroed (nor is it in Google's BERT); padded positions never reach a loss.
    """
    normal_init(module, std)


class EncoderEmbeddings(nn.Module):
    """BERT's input representation (Devlin et al. 2019, section 3, figure 2): token + segment + position
    embeddings, then LayerNorm and dropout.

    Positions: ``"learned"`` (BERT) or ``"sinusoidal"`` tables are added here; with ``"rotary"`` nothing is added
    (the rotation happens inside attention) and ``positions`` is None.

    ALBERT's factorised embedding (Lan et al. 2020, section 3.1): the tables are E = ``embedding_size`` wide and
    ``projection`` (E -> D, after the dropout, as ALBERT's ``embedding_hidden_mapping_in``) lifts them to D; the
    parameters go from V x D to V x E + E x D. DistilBERT's ``type_vocab_size=0``: no segment table (``segments``
    is None) and any ``token_type_ids`` are ignored.
    """

    def __init__(self, config: ModelConfig, positions: Positions | None = None) -> None:
        """
        Args:
            config: uses vocab_size, d_model, max_seq_len, positional, type_vocab_size, layer_norm_eps, dropout.
            positions: what ``lmforge.nn.build_positional`` built for ``config`` (the ``Encoder`` passes its own,
                whose rotary part goes to the layers); None builds it here.
        """
        super().__init__()
        E = config.d_embedding
        self.tokens = nn.Embedding(config.vocab_size, E)
        if positions is None:
            positions = build_positional(config.positional, d_model=E, d_head=config.d_head,
                                         max_len=config.max_seq_len)
        self.positions: LearnedPositional | SinusoidalPositional | None = positions.table
        self.segments = nn.Embedding(config.type_vocab_size, E) if config.type_vocab_size else None
        self.norm = nn.LayerNorm(E, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.dropout)
        self.projection = nn.Linear(E, config.d_model) if E != config.d_model else None

    def forward(self, input_ids: Tensor, token_type_ids: Tensor | None = None,
                position_ids: Tensor | None = None) -> Tensor:
        """
        Args:
            input_ids: (B, T) token ids (already checked by ``Encoder``).
            token_type_ids: (B, T) segment ids, default all 0 (segment A).
            position_ids: (B, T) or (T,) positions, default 0 .. T - 1.

        Returns:
            (B, T, D) embeddings.
        """
        x = embed_tokens(self.tokens, input_ids)  # (B, T, E)
        if self.segments is None:
            pass  # DistilBERT: no segment embedding
        elif token_type_ids is None:
            x = x + self.segments.weight[0]  # (B, T, E) all segment A: a broadcast add, no gather
        else:
            x = x + self.segments(token_type_ids)  # (B, T, E)
        if self.positions is not None:
            x = self.positions(x, positions=position_ids)  # (B, T, E) adds the position rows
        x = self.dropout(self.norm(x))  # (B, T, E)
        return x if self.projection is None else self.projection(x)  # (B, T, D)


class Pooler(nn.Module):
    """BERT's pooler (Devlin et al. 2019, section 3): ``tanh(W h_[CLS] + b)`` on the first token's state."""

    def __init__(self, d_model: int) -> None:
        """
        Args:
            d_model: D.
        """
        super().__init__()
        self.dense = nn.Linear(d_model, d_model)

    def forward(self, hidden: Tensor) -> Tensor:
        """
        Args:
            hidden: (B, T, D) last hidden states.

        Returns:
            (B, D) pooled output.
        """
        return torch.tanh(self.dense(hidden[:, 0]))  # (B, D)


def build_encoder_layers(config: ModelConfig, rotary: nn.Module | None) -> nn.ModuleList:
    """The encoder's ``n_layers`` layers, with ALBERT's cross-layer sharing (Lan et al. 2020, section 3.1).

    ``share_layers``: ``"none"`` (BERT) builds L independent layers; ``"all"`` one layer used L times (the list
    holds the same module at every index, so its gradient sums the contributions of every use); ``"attention"``
    / ``"ffn"`` L layers whose self-attention projections / feed-forward are one shared module, each layer keeping
    its own LayerNorms (the paper's ablations, Table 4; ALBERT's released code shares all or nothing).
    """

    def new_layer() -> EncoderLayer:
        return EncoderLayer(
            config.d_model, config.n_heads, config.d_ff, dropout=config.dropout,
            attention_dropout=config.attention_dropout, activation=config.activation,
            norm_first=config.norm_first, layer_norm_eps=config.layer_norm_eps, kernel=config.kernel,
            rotary=rotary, bias=config.bias, gated_ffn=config.ffn == "gated")

    first = new_layer()
    if config.share_layers == "all":
        return nn.ModuleList([first] * config.n_layers)
    layers = [first]
    for _ in range(config.n_layers - 1):
        layer = new_layer()
        if config.share_layers == "attention":
            layer.self_attn = first.self_attn
        elif config.share_layers == "ffn":
            layer.ffn = first.ffn
        layers.append(layer)
    return nn.ModuleList(layers)


class Encoder(PretrainedMixin, nn.Module):
    """BERT encoder, Devlin et al. 2019, "BERT: Pre-training of Deep Bidirectional Transformers for Language
    Understanding" (NAACL): embeddings, ``n_layers`` Transformer encoder layers (Vaswani et al. 2017), pooler.

    ``norm_first=False`` is BERT's post-LN block; ``norm_first=True`` is the pre-LN block (Xiong et al. 2020) and
    adds a final LayerNorm after the last layer (``final_norm``; an Identity without parameters in post-LN mode).

    Deviations and choices, all named:
        - ``config.positional``: "learned" (BERT), "sinusoidal" (Vaswani et al.) or "rotary" (Su et al. 2021; one
          ``RotaryEmbedding`` shared by every layer's self-attention, no position table, no ``position_ids``).
        - Attention-probability dropout is ``config.attention_dropout`` and residual/embedding dropout
          ``config.dropout`` (BERT's attention_probs_dropout_prob and hidden_dropout_prob).
        - Fully padded sequences give finite (meaningless) outputs, never NaN (``lmforge.nn.masks``).
        - Unpadding (``unpad``, on by default; not part of the config or the checkpoint): when a batch is padded
          enough (``lmforge.nn.kernels.packing``), the layers run on the real tokens only and the outputs at padded
          positions are zeros; ``model.unpad = False`` computes every position as before.

    State-dict keys: ``embeddings.{tokens,positions,segments,norm,projection}.*`` (segments / projection only when
    the model has them),
    ``layers.{i}.{self_attn.{q,k,v,out}_proj, self_attn_norm, ffn.fc1, ffn.fc2, ffn_norm}.*``,
    ``final_norm.*`` (pre-LN only), ``pooler.dense.*`` (with a pooler). None depend on the kernel or the output flags.
    Shared layers (ALBERT) appear under every index that uses them, as aliases of one tensor (saved once).
    """

    def __init__(self, config: ModelConfig) -> None:
        """
        Args:
            config: a ``ModelConfig`` (``arch`` is not checked, so a seq2seq config's encoder side works too).
        """
        super().__init__()
        self.config = config
        positions = build_positional(config.positional, d_model=config.d_embedding, d_head=config.d_head,
                                     max_len=config.max_seq_len)
        rotary = positions.rotary  # one RotaryEmbedding shared by every layer, or None
        self.embeddings = EncoderEmbeddings(config, positions)
        self.layers = build_encoder_layers(config, rotary)
        self.final_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps) if config.norm_first \
            else nn.Identity()
        self.pooler = Pooler(config.d_model) if config.pooler else None
        self.unpad = True  # run the layers on the real tokens of a padded batch (lmforge.nn.kernels.packing)
        self.apply(lambda m: init_bert_weights(m, config.init_std))

    def get_input_embeddings(self) -> nn.Embedding:
        """The token embedding (V, E); output heads tie their un-embedding to its ``weight``."""
        return self.embeddings.tokens

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        position_ids: Tensor | None = None,
        output_hidden_states: bool = False,
        output_attentions: bool | Sequence[int] = False,
        pooled_only: bool = False,
        read_rows: Tensor | None = None,
    ) -> EncoderOutput | EncoderRowsOutput:
        """Encode a batch of token sequences.

        Args:
            input_ids: (B, T) integer token ids in [0, vocab_size).
            attention_mask: (B, T) with 1 = real token, 0 = padding (bool, integer or 0./1. float); default all
                real. Padding is masked as a key; padded positions still get (ignorable) outputs.
            token_type_ids: (B, T) segment ids in [0, type_vocab_size); default all 0.
            position_ids: (B, T) or (T,) positions in [0, max_seq_len); default 0 .. T - 1. Not with rotary.
            output_hidden_states: also return the embeddings output and every layer's output.
            output_attentions: True for every layer's attention weights, or a sequence of layer indices (negative
                counts from the end); only those layers run the weight-capturing (math) path.
            pooled_only: the caller reads ``pooled_output`` only (sequence classification): the last layer then
                computes the first position alone (its query still attends to every position), and
                ``last_hidden_state`` is that position, (B, 1, D). The pooled output is the full pass's. Ignored
                with hidden states or attention weights asked for, or rotary positions.
            read_rows: (B, T) bool, the only positions the caller reads after the encoder (an MLM's masked positions,
                and position 0 for the pooled output); each must be a real token. The last layer then computes
                those rows alone (``lmforge.nn.kernels.packing.ReadRows``: their queries attend to every position,
                exact), and the output is an ``EncoderRowsOutput``: ``last_hidden_state`` (R, D), the rows in
                row-major order (``hidden[read_rows]``), and ``read_rows`` this mask; ``pooled_output`` is computed
                when every sequence reads position 0, else None. With hidden states or attention weights asked
                for, every position is computed and the rows are picked from it (the same result). Takes
                precedence over ``pooled_only``.

        Returns:
            EncoderOutput(last_hidden_state (B, T, D) (or (B, 1, D), see ``pooled_only``), pooled_output (B, D),
            hidden_states, attentions); with ``read_rows`` an ``EncoderRowsOutput``.

        Raises:
            LmforgeError: bad input (shape, dtype, an id outside its vocabulary, a sequence longer than
                max_seq_len); the message names the value and the limit.
        """
        key_mask = check_encoder_inputs(self.config, input_ids, attention_mask, token_type_ids,
                                        position_ids)  # (B, T) bool | None
        wanted = select_layers(output_attentions, len(self.layers))  # layers whose weights are returned; no bools

        x = self.embeddings(input_ids, token_type_ids, position_ids)  # (B, T, D)
        attentions = output_attentions is not False
        # unpadded unless attention weights are asked for (looking inside: every query row as the model computes it)
        packing = Packing.decide(key_mask, enabled=self.unpad and not attentions)
        # only [CLS] is read after the last layer: it computes that position alone
        first_only = (pooled_only and read_rows is None and not output_hidden_states and not attentions
                      and self.config.positional != "rotary")
        rows = None
        if read_rows is not None:
            self._check_read_rows(read_rows, key_mask, input_ids.shape)
            if not output_hidden_states and not attentions:  # only these rows are read after the last layer
                rows = ReadRows.build(read_rows, packing)
        # the layers run on the real tokens only under a packing (lmforge.nn.kernels.packing); the final norm is an
        # Identity in post-LN mode
        out = run_layers(self.layers, x, final_norm=self.final_norm, packing=packing, weights_of=wanted,
                         hidden_states=output_hidden_states, attentions=attentions,
                         alone="first_only" if first_only else None, rows=rows, attention_mask=key_mask)
        x = out.hidden  # (B, T, D), (B, 1, D) with first_only, or (R, D) with rows
        if read_rows is None:
            pooled = self.pooler(x) if self.pooler is not None else x[:, 0]  # (B, D); DistilBERT: the raw h_[CLS]
            return EncoderOutput(x, pooled, out.hidden_states, out.attentions)
        x = x if rows is not None else x[read_rows]  # (R, D)
        pooled = None
        if bool(read_rows[:, 0].all()):  # each sequence's position 0 is its first row
            counts = read_rows.sum(1)  # (B,)
            first = x.index_select(0, counts.cumsum(0) - counts)[:, None]  # (B, 1, D)
            pooled = self.pooler(first) if self.pooler is not None else first[:, 0]  # (B, D)
        return EncoderRowsOutput(x, pooled, out.hidden_states, out.attentions, read_rows)

    @staticmethod
    def _check_read_rows(read_rows: Tensor, key_mask: Tensor | None, shape: torch.Size) -> None:
        if read_rows.dtype != torch.bool or read_rows.shape != shape:
            raise LmforgeError(f"read_rows must be a (batch, length) = {tuple(shape)} bool mask; got "
                               f"{tuple(read_rows.shape)} {read_rows.dtype}")
        if key_mask is not None and bool((read_rows & ~key_mask).any()):
            raise LmforgeError("read_rows marks a padded position; only real tokens can be read")

    def extra_repr(self) -> str:
        c = self.config
        extra = "".join(f", {k}={getattr(c, k)!r}" for k, default in
                        (("embedding_size", None), ("share_layers", "none"), ("pooler", True), ("type_vocab_size", 2))
                        if getattr(c, k) != default)
        return (f"n_layers={c.n_layers}, d_model={c.d_model}, n_heads={c.n_heads}, d_ff={c.d_ff}, "
                f"norm_first={c.norm_first}, positional={c.positional!r}{extra}")


def check_encoder_inputs(cfg: ModelConfig, input_ids: Tensor, attention_mask: Tensor | None,
                         token_type_ids: Tensor | None, position_ids: Tensor | None) -> Tensor | None:
    """Raise on a bad input to an encoder of config ``cfg``; return the (B, T) bool key mask, or None when nothing
    is padded. ``Encoder.forward``'s checks, and the ONNX Runtime stand-in's (``lmforge.persistence.onnx``).

    The key mask is built once per forward pass, not per layer; None lets the SDPA kernel take its unmasked
    fast path.
    """
    B, T = check_input_ids(input_ids, vocab_size=cfg.vocab_size)
    if T > cfg.max_seq_len:
        raise LmforgeError(f"sequence length {T} exceeds max_seq_len={cfg.max_seq_len}; truncate the input "
                           f"(e.g. tokenizer truncation=True, max_length={cfg.max_seq_len})")
    if token_type_ids is not None and cfg.type_vocab_size:
        check_integer_tensor(token_type_ids, "token_type_ids")
        if token_type_ids.shape != input_ids.shape:
            raise LmforgeError(f"token_type_ids must have the shape of input_ids {(B, T)}; got "
                               f"{tuple(token_type_ids.shape)}")
        check_id_range(token_type_ids, cfg.type_vocab_size, name="token_type_ids", what="token type id",
                       limit=f"type_vocab_size={cfg.type_vocab_size}")
    key_mask = None
    if attention_mask is not None:
        key_mask = key_padding_mask(attention_mask, batch=B, length=T)  # (B, T) bool
        # compiled training too: a graph break, but the unmasked kernel is much faster; exported or compiled for
        # inference: one graph, mask kept (lmforge.nn.capture.one_graph)
        if not one_graph() and bool(key_mask.all()):
            key_mask = None
    if position_ids is not None:
        if cfg.positional == "rotary":
            raise LmforgeError("position_ids cannot be given with rotary positions (they are always "
                               "0 .. T - 1); leave position_ids=None")
        check_integer_tensor(position_ids, "position_ids")
        if tuple(position_ids.shape) not in ((B, T), (T,)):
            raise LmforgeError(f"position_ids must be (batch={B}, length={T}) or (length={T},); got "
                               f"{tuple(position_ids.shape)}")
        check_id_range(position_ids, cfg.max_seq_len, name="position_ids", what="position id",
                       limit=f"max_seq_len={cfg.max_seq_len}")
    return key_mask

"""The Transformer encoder-decoder (Vaswani et al. 2017) for sequence-to-sequence tasks.

Shape legend: B batch, S source length, T new target (query) length, P cached target length, L_e / L_d encoder /
decoder layers, H heads, D model dim, V vocab.

The forward pass, top to bottom:
    encode:  m = Dropout(E_src(src) [* sqrt(D)] + PE)  -> L_e x EncoderLayer(src padding mask)
                 [-> encoder_norm, pre-LN only]                                              memory (B, S, D)
    decode:  y = Dropout(E_tgt(tgt) [* sqrt(D)] + PE)  -> L_d x DecoderLayer(causal + tgt padding mask,
                 cross-attention to memory with the src padding mask)
                 [-> decoder_norm, pre-LN only]  -> y E_tgt^T (tied) or lm_head(y)           logits (B, T, V)

``SourceEncoder`` is the encoder stack alone (family ``seq2seq_encoder``): what fine-tuning puts task heads on when
given an encoder-decoder folder (a BART-style model pretrained with ``lmforge pretrain --objective denoise``).

Masks at this boundary are (B, length) with 1 = real token, 0 = padding: ``src_mask`` (B, S) over the source,
``tgt_mask`` (B, P + T) over the whole target so far (cached positions plus the new ones).

This is a model file: it imports ``lmforge.nn`` and the shared output records (``lmforge.models.outputs``), never
another model file.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch.nn.functional as F
from torch import Tensor, nn

from lmforge.config import ModelConfig
from lmforge.errors import LmforgeError
from lmforge.models import PretrainedMixin
from lmforge.models.outputs import DecodeOutput, Seq2SeqOutput, SourceEncoderOutput
from lmforge.nn import (
    DecoderLayer,
    EncoderLayer,
    LearnedPositional,
    RotaryEmbedding,
    StackCache,
    build_positional,
    check_flag,
    check_input_ids,
    key_padding_mask,
    positions_from_mask,
    select_layers,
)
from lmforge.nn.kernels.packed_dropout import Dropout
from lmforge.nn.kernels.packing import Packing
from lmforge.nn.stack import StackOutput, run_layers

__all__ = ["DecodeOutput", "EncoderDecoder", "Seq2SeqCache", "Seq2SeqOutput", "SourceEncoder", "SourceEncoderOutput"]


class Seq2SeqCache(StackCache):
    """Key/value caches of every decoder layer of an ``EncoderDecoder``: the state of incremental decoding.

    Each ``LayerCache`` holds the growing self-attention keys/values and the cross-attention keys/values, which
    are projected from the memory once, on the first ``decode`` call, and reused afterwards. Everything it does is
    ``lmforge.nn.StackCache``'s (shared with ``DecoderCache``); the subclass keeps the public name, and ``decode``
    accepts no other family's cache. ``reorder`` reorders the cross-attention keys/values too; the caller reorders
    ``memory``, ``src_mask`` and ``tgt_mask`` the same way.

    Attributes:
        layers: one ``lmforge.nn.LayerCache`` per decoder layer.
    """


class _SourceStack(nn.Module):
    """What ``EncoderDecoder`` and ``SourceEncoder`` share, on the same attribute names (``config``, ``dropout``,
    ``rotary``, ``encoder_layers``, ``encoder_norm``, ``unpad``, set by each ``__init__``): the initialisation
    (described in ``EncoderDecoder``'s docstring), the embedding of ids, the boundary masks, the length check, and
    the encoder stack itself."""

    config: ModelConfig
    dropout: Dropout
    rotary: RotaryEmbedding | None
    encoder_layers: nn.ModuleList
    encoder_norm: nn.LayerNorm | None

    def reset_parameters(self) -> None:
        """Initialise as described in ``EncoderDecoder``'s docstring."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding | LearnedPositional):
                nn.init.normal_(module.weight, std=self.config.d_model**-0.5)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)

    def _embed(self, table: nn.Embedding, position: nn.Module | None, ids: Tensor, offset: int,
               positions: Tensor | None) -> Tensor:
        x = table(ids)  # (B, T, D)
        if self.config.scale_embeddings:
            x = x * math.sqrt(self.config.d_model)  # section 3.4
        if position is not None:
            x = position(x, offset=offset, positions=positions)  # (B, T, D)
        return self.dropout(x)

    def _mask_and_positions(self, mask: Tensor | None, B: int, S: int, past: int, name: str,
                            T: int | None = None) -> tuple[Tensor | None, Tensor | None]:
        # Validate a (B, S) boundary mask; derive the positions of the last T tokens; drop an all-ones mask so the
        # kernels take their unmasked path.
        if mask is None:
            return None, None
        extra = f" (cached {past} + new {S - past})" if past else ""
        mask = key_padding_mask(mask, batch=B, length=S, name=name, length_label=f"length={S}{extra}")  # (B, S)
        positions = None if self.rotary is not None else positions_from_mask(mask, S if T is None else T)
        return (None if bool(mask.all()) else mask), positions

    def _check_length(self, T: int, past: int, side: str) -> None:
        Lmax = self.config.max_seq_len
        if past + T > Lmax:
            detail = f"(cached {past} + new {T}) " if past else ""
            raise LmforgeError(
                f"{side} length {past + T} {detail}exceeds max_seq_len={Lmax}; shorten the input or use a model "
                "with more positions")

    def _run_encoder(self, x: Tensor, mask: Tensor | None, *, weights_of: frozenset[int] = frozenset(),
                     hidden_states: bool = False, attentions: bool = False) -> StackOutput:
        """The encoder layers and (pre-LN) ``encoder_norm`` on the (B, S, D) embeddings ``x`` with the (B, S) key
        mask: on the real tokens only (``lmforge.nn.kernels.packing``) when ``unpad`` and no attention weights are
        asked for; the output has zeros at padded positions then."""
        packing = Packing.decide(mask, enabled=getattr(self, "unpad", True) and not attentions)
        return run_layers(self.encoder_layers, x, final_norm=self.encoder_norm, packing=packing,
                          weights_of=weights_of, hidden_states=hidden_states, attentions=attentions,
                          attention_mask=mask)


class EncoderDecoder(PretrainedMixin, _SourceStack):
    """The Transformer, Vaswani et al. 2017, "Attention Is All You Need".

    An encoder stack (``n_layers`` x ``nn.EncoderLayer``) and a decoder stack (``n_decoder_layers`` x
    ``nn.DecoderLayer`` with cross-attention); token embeddings multiplied by sqrt(D) (section 3.4,
    ``config.scale_embeddings``), sinusoidal positions (section 3.5; ``config.positional`` may also choose
    learned tables or rotary), dropout on the sum of embeddings and positions in both stacks (section 5.4),
    post-LN residual blocks (``config.norm_first=False``, as the paper; with pre-LN a final LayerNorm closes each
    stack). With ``config.share_embeddings`` the source and target share one embedding matrix (the paper's
    shared source-target BPE vocabulary); with ``config.tie_embeddings`` the pre-softmax projection is the target
    embedding (section 3.4).

    Initialisation (the paper states none): linear weights Xavier-uniform with zero biases, embeddings
    N(0, D^-1/2), so that embeddings scaled by sqrt(D) have unit variance and tied logits stay O(1) (the choice of
    tensor2tensor and fairseq). ``config.dropout`` acts on embeddings and residual branches,
    ``config.attention_dropout`` on attention weights (the paper applies only the former; tensor2tensor both).

    State-dict keys: ``embedding.weight`` (shared) or ``src_embedding.weight`` and ``tgt_embedding.weight``;
    ``src_position.weight`` / ``tgt_position.weight`` (learned positions only); ``encoder_layers.{l}.*``,
    ``decoder_layers.{l}.*`` (names of ``nn.EncoderLayer`` / ``nn.DecoderLayer``); ``encoder_norm.*`` and
    ``decoder_norm.*`` (pre-LN only); ``lm_head.weight`` (untied only).
    """

    def __init__(self, config: ModelConfig) -> None:
        """
        Args:
            config: a ``ModelConfig`` with ``arch="seq2seq"`` (e.g. the ``transformer-base`` preset).
        """
        super().__init__()
        if config.arch != "seq2seq":
            raise LmforgeError(f"EncoderDecoder needs a config with arch='seq2seq'; got arch={config.arch!r}")
        assert config.d_ff is not None
        self.config = config
        D, V, Lmax = config.d_model, config.vocab_size, config.max_seq_len
        n_dec = config.n_decoder_layers if config.n_decoder_layers is not None else config.n_layers
        if config.share_embeddings:
            self.embedding = nn.Embedding(V, D)
            self._src_table, self._tgt_table = "embedding", "embedding"
        else:
            self.src_embedding = nn.Embedding(V, D)
            self.tgt_embedding = nn.Embedding(V, D)
            self._src_table, self._tgt_table = "src_embedding", "tgt_embedding"
        sizes = dict(d_model=D, d_head=config.d_head, max_len=Lmax)
        src = build_positional(config.positional, **sizes)
        self.src_position: nn.Module | None = src.table
        self.rotary: RotaryEmbedding | None = src.rotary
        # A learned table is trained per side; a sinusoidal one (no parameters) serves both; rotary adds none.
        self.tgt_position: nn.Module | None = (build_positional(config.positional, **sizes).table
                                               if isinstance(src.table, LearnedPositional) else src.table)
        self.dropout = Dropout(config.dropout)
        common = dict(dropout=config.dropout, attention_dropout=config.attention_dropout,
                      activation=config.activation, norm_first=config.norm_first,
                      layer_norm_eps=config.layer_norm_eps, kernel=config.kernel, rotary=self.rotary,
                      bias=config.bias, gated_ffn=config.ffn == "gated")
        self.encoder_layers = nn.ModuleList(
            EncoderLayer(D, config.n_heads, config.d_ff, **common) for _ in range(config.n_layers))
        self.decoder_layers = nn.ModuleList(
            DecoderLayer(D, config.n_heads, config.d_ff, cross_attention=True, **common) for _ in range(n_dec))
        self.encoder_norm = nn.LayerNorm(D, eps=config.layer_norm_eps) if config.norm_first else None
        self.unpad = True  # the encoder layers run on the real source tokens of a padded batch (nn.kernels.packing)
        self.decoder_norm = nn.LayerNorm(D, eps=config.layer_norm_eps) if config.norm_first else None
        self.lm_head = None if config.tie_embeddings else nn.Linear(D, V, bias=False)
        self.reset_parameters()

    @property
    def src_embed(self) -> nn.Embedding:
        """The source embedding table (the shared one with ``share_embeddings``)."""
        return getattr(self, self._src_table)

    @property
    def tgt_embed(self) -> nn.Embedding:
        """The target embedding table (the shared one with ``share_embeddings``)."""
        return getattr(self, self._tgt_table)

    @property
    def output_weight(self) -> Tensor:
        """(V, D) the pre-softmax projection: the target embedding when tied, else ``lm_head.weight``."""
        return self.tgt_embed.weight if self.lm_head is None else self.lm_head.weight

    def new_cache(self) -> Seq2SeqCache:
        """An empty cache with one LayerCache per decoder layer."""
        return Seq2SeqCache(len(self.decoder_layers))

    def lm_logits(self, hidden: Tensor) -> Tensor:
        """(..., D) decoder states -> (..., V) vocabulary scores."""
        return F.linear(hidden, self.output_weight)  # (..., V)

    # ---------------------------------------------------------------------------------------------------- encoder
    def encode(self, src_ids: Tensor, src_mask: Tensor | None = None) -> Tensor:
        """Encode the source.

        Args:
            src_ids: (B, S) source token ids in [0, V).
            src_mask: (B, S) 1 = real token, 0 = padding (left or right); None = no padding.

        Returns:
            memory (B, S, D). Rows at padded positions are zeros (the layers ran on the real tokens only,
            ``lmforge.nn.kernels.packing``; ``unpad = False``: values that nothing attends to).
        """
        B, S = check_input_ids(src_ids, vocab_size=self.config.vocab_size, name="src_ids")
        self._check_length(S, 0, "source")
        src_mask, positions = self._mask_and_positions(src_mask, B, S, 0, "src_mask")
        x = self._embed(self.src_embed, self.src_position, src_ids, 0, positions)  # (B, S, D)
        return self._run_encoder(x, src_mask).hidden  # (B, S, D)

    # ---------------------------------------------------------------------------------------------------- decoder
    def decode(
        self,
        tgt_ids: Tensor,
        memory: Tensor,
        src_mask: Tensor | None = None,
        tgt_mask: Tensor | None = None,
        cache: Seq2SeqCache | None = None,
        output_attentions: bool = False,
        return_logits: bool = True,
    ) -> DecodeOutput:
        """Decode T new target tokens against the memory (all at once for teacher forcing, or step by step with a
        cache).

        Args:
            tgt_ids: (B, T) target token ids in [0, V) (shifted right: the first is the start token).
            memory: (B, S, D) the output of ``encode``. Pass it on every call; with a filled cache its keys/values
                are not projected again.
            src_mask: (B, S) 1 = real source token.
            tgt_mask: (B, P + T) 1 = real target token over the cached and the new positions; None = no padding.
            cache: a Seq2SeqCache to read and extend (incremental decoding), e.g. ``model.new_cache()``.
            output_attentions: also return self- and cross-attention weights of every decoder layer.
            return_logits: False skips the vocabulary projection (logits None).

        Returns:
            DecodeOutput(logits (B, T, V), last_hidden_state (B, T, D), cache, self_attentions, cross_attentions).
        """
        check_flag(output_attentions, "output_attentions")
        B, T = check_input_ids(tgt_ids, vocab_size=self.config.vocab_size, name="tgt_ids")
        past = self._prepare_cache(cache, B)
        self._check_length(T, past, "target")
        if not isinstance(memory, Tensor) or memory.dim() != 3 or memory.shape[0] != B \
                or memory.shape[-1] != self.config.d_model:
            shape = tuple(memory.shape) if isinstance(memory, Tensor) else type(memory).__name__
            raise LmforgeError(
                f"memory must be the encoder output (batch={B}, source length, d_model={self.config.d_model}); "
                f"got {shape}")
        S = memory.shape[1]
        if src_mask is not None:
            src_mask = key_padding_mask(src_mask, batch=B, length=S, name="src_mask",
                                        length_label=f"source length={S}")  # (B, S) bool
        tgt_mask, positions = self._mask_and_positions(tgt_mask, B, past + T, past, "tgt_mask", T)
        y = self._embed(self.tgt_embed, self.tgt_position, tgt_ids, past, positions)  # (B, T, D)
        out = run_layers(self.decoder_layers, y, final_norm=self.decoder_norm, cache=cache,
                         weights_of=range(len(self.decoder_layers)) if output_attentions else frozenset(),
                         attentions=output_attentions, cross_attentions=output_attentions,
                         memory=memory, attention_mask=tgt_mask, memory_mask=src_mask, causal=True)
        y = out.hidden  # (B, T, D)
        logits = self.lm_logits(y) if return_logits else None  # (B, T, V)
        # with output_attentions: (B, H, T, P + T) self- and (B, H, T, S) cross-attention weights per layer
        return DecodeOutput(logits, y, cache, out.attentions, out.cross_attentions)

    def forward(
        self,
        src_ids: Tensor,
        tgt_ids: Tensor,
        src_mask: Tensor | None = None,
        tgt_mask: Tensor | None = None,
        output_attentions: bool = False,
    ) -> Seq2SeqOutput:
        """Teacher forcing: encode the source, decode the whole (shifted) target at once.

        Args:
            src_ids: (B, S); tgt_ids: (B, T) token ids.
            src_mask: (B, S), tgt_mask: (B, T); 1 = real token, 0 = padding.
            output_attentions: also return decoder self- and cross-attention weights.

        Returns:
            Seq2SeqOutput(logits (B, T, V), last_hidden_state (B, T, D), memory (B, S, D), self_attentions,
            cross_attentions).
        """
        memory = self.encode(src_ids, src_mask)  # (B, S, D)
        out = self.decode(tgt_ids, memory, src_mask, tgt_mask, output_attentions=output_attentions)
        assert out.logits is not None
        return Seq2SeqOutput(out.logits, out.last_hidden_state, memory, out.self_attentions, out.cross_attentions)

    # ---------------------------------------------------------------------------------------------------- helpers
    def _check_ids(self, ids: Tensor, name: str) -> tuple[int, int]:
        # Kept for lmforge.viz.attention, which re-runs encode step by step.
        return check_input_ids(ids, vocab_size=self.config.vocab_size, name=name)

    def _prepare_cache(self, cache: Seq2SeqCache | None, B: int) -> int:
        if cache is None:
            return 0
        if not isinstance(cache, Seq2SeqCache):
            raise LmforgeError(f"cache must be a Seq2SeqCache (model.new_cache()); got {type(cache).__name__}")
        return cache.prepare(len(self.decoder_layers), B, rows="tgt_ids", also_reorder=" and the memory")


# --------------------------------------------------------------------------------------------- the encoder alone
class SourceEncoder(PretrainedMixin, _SourceStack):
    """The encoder stack of an ``EncoderDecoder``, alone: a text encoder for fine-tuning heads and embeddings.

    BART (Lewis et al. 2020, section 3) fine-tunes classification by feeding the text to both stacks and reading
    the decoder's final token; here the encoder alone carries the task, as T5's encoder does in Sentence-T5
    (Ni et al. 2022), so a task model is half the size and reads the whole text in both directions. Built from a
    trained model by ``SourceEncoder.wrap(encoder_decoder)``, which copies the source embedding, the source
    positions, the encoder layers and (pre-LN) the final encoder LayerNorm; the decoder is dropped.

    ``pooled_output`` is the mean of the final states over the real tokens. Deviation: BERT's pooler reads [CLS],
    whose state a denoising objective never trains to summarise the text (there is no next-sentence task); the
    mean is the representation Sentence-T5 found best for an encoder trained without one. ``token_type_ids`` are
    accepted and ignored (the encoder-decoder has no segment embedding).

    State-dict keys: ``embedding.weight``, ``src_position.weight`` (learned positions only), ``encoder_layers.{l}.*``
    and ``encoder_norm.*`` (pre-LN only): ``EncoderDecoder``'s names for the same modules.
    """

    def __init__(self, config: ModelConfig) -> None:
        """
        Args:
            config: a ``ModelConfig`` with ``arch="seq2seq_encoder"``; the decoder's fields are ignored.
        """
        super().__init__()
        if config.arch != "seq2seq_encoder":
            raise LmforgeError(f"SourceEncoder needs a config with arch='seq2seq_encoder'; got arch={config.arch!r} "
                               "(build one from an encoder-decoder with SourceEncoder.wrap)")
        assert config.d_ff is not None
        self.config = config
        D = config.d_model
        self.embedding = nn.Embedding(config.vocab_size, D)
        src = build_positional(config.positional, d_model=D, d_head=config.d_head, max_len=config.max_seq_len)
        self.src_position: nn.Module | None = src.table
        self.rotary: RotaryEmbedding | None = src.rotary
        self.dropout = Dropout(config.dropout)
        self.encoder_layers = nn.ModuleList(
            EncoderLayer(D, config.n_heads, config.d_ff, dropout=config.dropout,
                         attention_dropout=config.attention_dropout, activation=config.activation,
                         norm_first=config.norm_first, layer_norm_eps=config.layer_norm_eps, kernel=config.kernel,
                         rotary=self.rotary, bias=config.bias, gated_ffn=config.ffn == "gated")
            for _ in range(config.n_layers))
        self.encoder_norm = nn.LayerNorm(D, eps=config.layer_norm_eps) if config.norm_first else None
        self.unpad = True  # the encoder layers run on the real source tokens of a padded batch (nn.kernels.packing)
        self.reset_parameters()

    @classmethod
    def wrap(cls, model: EncoderDecoder, **options: object) -> SourceEncoder:
        """The encoder of ``model`` (its weights copied), with ``options`` overriding config fields (dropouts)."""
        from lmforge.config import from_dict, to_dict

        if not isinstance(model, EncoderDecoder):
            raise LmforgeError(f"SourceEncoder.wrap takes an EncoderDecoder; got {type(model).__name__}")
        config = from_dict(ModelConfig, {**to_dict(model.config), **options, "arch": "seq2seq_encoder"},
                           where="the encoder of an encoder-decoder")
        encoder = cls(config)
        state = {"embedding.weight": model.src_embed.weight}
        state.update({k: v for k, v in model.state_dict().items()
                      if k.startswith(("src_position.", "encoder_layers.", "encoder_norm."))})
        encoder.load_state_dict(state)
        return encoder

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embedding

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None,
                output_hidden_states: bool = False,
                output_attentions: bool | Sequence[int] = False) -> SourceEncoderOutput:
        """
        Args:
            input_ids: (B, T) token ids in [0, V).
            attention_mask: (B, T) 1 = real token, 0 = padding (left or right); default all real.
            token_type_ids: accepted and ignored.
            output_hidden_states: also return the embeddings output and every layer's output.
            output_attentions: True for every layer's attention weights, or a sequence of layer indices.

        Returns:
            SourceEncoderOutput(last_hidden_state (B, T, D), pooled_output (B, D), hidden_states, attentions).
        """
        check_flag(output_hidden_states, "output_hidden_states")
        B, T = check_input_ids(input_ids, vocab_size=self.config.vocab_size)
        self._check_length(T, 0, "input")
        wanted = select_layers(output_attentions, len(self.encoder_layers))
        mask, positions = self._mask_and_positions(attention_mask, B, T, 0, "attention_mask")  # (B, T) | None
        x = self._embed(self.embedding, self.src_position, input_ids, 0, positions)  # (B, T, D)
        # unpadded as EncoderDecoder.encode (the same numbers), unless attention weights are asked for
        out = self._run_encoder(x, mask, weights_of=wanted, hidden_states=output_hidden_states,
                                attentions=output_attentions is not False)
        x = out.hidden  # (B, T, D)
        if mask is None:
            pooled = x.mean(1)  # (B, D)
        else:
            weights = mask.to(x.dtype).unsqueeze(-1)  # (B, T, 1)
            pooled = (x * weights).sum(1) / weights.sum(1).clamp(min=1.0)  # (B, D)
        return SourceEncoderOutput(x, pooled, out.hidden_states, out.attentions)

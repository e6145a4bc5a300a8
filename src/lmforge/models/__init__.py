"""One readable file per model family: ``Encoder`` (BERT), ``Decoder`` (GPT), ``EncoderDecoder`` (Transformer),
``RNNEncoder`` (BiRNN + attention pooling), ``RNNSeq2Seq`` (attentional RNN encoder-decoder) and ``BiLM`` /
``ELMoEncoder`` (ELMo's biLM, and its frozen scalar mix under a task BiLSTM), ``AWDLSTM`` (the AWD-LSTM language model,
ULMFiT's encoder), ``XLNet`` (the permutation language model on Transformer-XL).

Imports are lazy so that importing one family never imports the others, and importing this package imports no
PyTorch at all (the command line lists and checks families before any model code is needed).

Each family (``config.arch``) has one ``Architecture`` record in ``_REGISTRY``: where its class lives and what it
can do. Code that behaves differently per family asks a capability (``architecture(config.arch).generates``)
rather than comparing family names, so a new family is one record here, not an edit in every caller.
``ARCHITECTURES[arch]`` still gives the class itself.

Every model class (and ``lmforge.heads.TaskModel``) mixes in ``PretrainedMixin``: ``Encoder.from_pretrained(path)``
and ``model.save_pretrained(path)``, as in Hugging Face transformers. ``lmforge.from_pretrained(path)`` (the
persistence layer, ``lmforge.persistence``) loads whatever model a folder holds, head included; the names
``save_pretrained``, ``load_pretrained``, ``from_pretrained`` and ``load_backbone`` here are deprecated aliases of
those (resolved through the package root, so that this package never imports the layers above it).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, TypeVar

_M = TypeVar("_M", bound="PretrainedMixin")

_WHERE = {
    "Encoder": "lmforge.models.encoder",
    "EncoderOutput": "lmforge.models.outputs",
    "Decoder": "lmforge.models.decoder",
    "DecoderOutput": "lmforge.models.outputs",
    "EncoderDecoder": "lmforge.models.seq2seq",
    "SourceEncoder": "lmforge.models.seq2seq",
    "RNNEncoder": "lmforge.models.rnn_encoder",
    "RNNSeq2Seq": "lmforge.models.rnn_seq2seq",
    "AWDLSTM": "lmforge.models.awd_lstm",
    "BiLM": "lmforge.models.elmo",
    "XLNet": "lmforge.models.xlnet",
    "XLNetOutput": "lmforge.models.outputs",
    "ELMoEncoder": "lmforge.models.elmo",
}
# moved to lmforge.persistence (the layer above heads and tasks): deprecated here, kept for one release
_MOVED = ("save_pretrained", "load_pretrained", "from_pretrained", "load_backbone")


class PretrainedMixin:
    """Hugging Face-shaped persistence for a model class: ``Encoder.from_pretrained(path)`` returns the callable
    module with ``.config`` (its ``ModelConfig``) and ``.tokenizer`` (or None) attached, ``model.save_pretrained(
    path)`` writes it back (weights, config and the attached tokenizer).

    Pure Python, so that importing this package stays torch-free; the work is done by ``lmforge.models.loading``
    and ``lmforge.utils.model_folder`` (imported when called), which check the folder completely before anything is
    built. A model class loads the backbone of any folder (a head is dropped, as ``BertModel.from_pretrained``
    does); ``lmforge.heads.TaskModel`` overrides ``from_pretrained`` to rebuild the head.
    """

    @classmethod
    def from_pretrained(cls: type[_M], path: str | Path) -> _M:
        """The model saved in ``path`` (an lmforge folder, or a Hugging Face one), as this class.

        Raises:
            LmforgeError: the folder holds another kind of model (the message names the class that loads it), or
                anything ``lmforge.models.loading.load_folder`` refuses.
        """
        from lmforge.models.loading import as_module, load_folder

        return as_module(load_folder(path), path, expect=cls)

    def save_pretrained(self, path: str | Path, *, tokenizer: Any | None = None, overwrite: bool = False) -> Path:
        """Write this model into the folder ``path``: ``config.json``, ``model.safetensors`` and the tokenizer
        (``tokenizer``, else the one ``from_pretrained`` attached). A new folder is built under a temporary name
        and renamed when complete; an existing model there is refused unless ``overwrite``.

        Returns:
            the folder.
        """
        from lmforge.utils.model_folder import save_pretrained

        return save_pretrained(self, path, tokenizer=tokenizer if tokenizer is not None else
                               getattr(self, "tokenizer", None), overwrite=overwrite)


@dataclass(frozen=True)
class Architecture:
    """One model family (a ``config.arch`` value): where its class is, and the capabilities callers ask about.

    Attributes:
        name: the ``config.arch`` value.
        module: the module that defines the class (imported only by ``load``).
        class_name: the class built from a ``ModelConfig`` of this family.
        description: one line for listings and error messages.
        presets: a hint of the presets of this family, as error messages suggest them (e.g. "bert-*").
        encodes_text: a text encoder: ``forward(input_ids, attention_mask, output_hidden_states=True)`` returns
            per-token ``last_hidden_state`` and ``hidden_states`` (B, T, D), what fine-tuning heads and the
            server's ``/embed`` read. A decoder is one too (GPT-1 fine-tuning), with left context only.
        has_pooled_output: the output also has ``pooled_output`` (B, D), one vector per text (BERT's pooler over
            [CLS]; a decoder's or XLNet's last real token): what sequence classification reads.
        left_context_only: every position's state has read only the tokens before it (a causal decoder, a
            one-way LSTM), so a per-token label cannot use what follows the token: token tagging is refused
            unless asked for (``--task.allow_causal``). Whole-text tasks read the last token, which has read all.
        gpt_inputs: fine-tuned as GPT-1 (Radford et al. 2018, Figure 1): inputs are ``[START] text [EXTRACT]`` /
            ``[START] a [DELIM] b [EXTRACT]`` (tokens added when missing), the task reads the extract token's state,
            and the language-model loss on the task's text can be kept as an auxiliary objective (``lm_weight``):
            ``forward`` takes ``return_logits`` and returns ``logits`` (B, T, V).
        generates: ``lmforge.generation.adapter_for`` has an adapter for it, so it writes text token by token.
        has_encoder_decoder: the input is a source read by an encoder, and a separate decoder writes the output
            from a start token (``bos_id``); the prompt is not part of the output.
        is_causal_lm: a decoder-only language model: the output continues the prompt in the same sequence, so
            prompt and new tokens share one context window, and a prompt starts with [SEP] (the end-of-document
            token its training stream puts before each document).
        position_limited: reads at most ``config.max_seq_len`` positions per sequence (a position table, or a
            length check); longer inputs must be cut. False: the recurrent families read any length (except with
            the 'location' attention score, whose limit the model itself checks).
        recurrent: an RNN: its size is set by ``rnn_cell``, ``bidirectional`` and ``attention`` rather than by
            attention heads and Transformer layers.
        returns_attention: ``forward(..., output_attentions=...)`` returns attention weights, which
            ``lmforge.viz.attention`` draws.
        uses_init_std: its weights are drawn from N(0, ``config.init_std``) (BERT, GPT-2), so task heads put on it
            are initialised the same way; False: the family's own scheme (Xavier, uniform), and heads keep
            PyTorch's default.
        hf_export: the Hugging Face layout ``lmforge convert --to-hf`` writes it as ("bert", "gpt2"), or None.
        reads_characters: its token layer may spell each vocabulary entry (a character CNN): the model has
            ``set_vocabulary(tokens)``, which the pretraining recipe calls with the tokenizer's vocabulary (the
            spelling table is then a buffer saved with the weights).
        finetune_as: fine-tuning does not put heads on this family directly but on the family named here, built
            by its class's ``wrap(backbone, **options)`` (ELMo: the biLM is frozen under a scalar mix and a task
            BiLSTM); None: heads go on the backbone itself.
        concat_pooling: ``pooled_output`` is ULMFiT's concat pooling [h_T; maxpool; meanpool] (B, 3D; the backbone's
            ``pooled_dim``), and the sequence head is ULMFiT's two batch-normed linear blocks (Howard & Ruder 2018).
        summary_activation: new sequence and multiple-choice heads put a dense layer with this activation over
            ``pooled_output`` (the heads' ``hidden=``): XLNet's sequence summary, a tanh projection of the last
            token (XLNet's released classifier and Hugging Face's ``XLNetForSequenceClassification``); None: the
            classifier reads ``pooled_output`` itself.
    """

    name: str
    module: str
    class_name: str
    description: str
    presets: str
    encodes_text: bool = False
    has_pooled_output: bool = False
    left_context_only: bool = False
    gpt_inputs: bool = False
    generates: bool = False
    has_encoder_decoder: bool = False
    is_causal_lm: bool = False
    position_limited: bool = False
    recurrent: bool = False
    returns_attention: bool = False
    uses_init_std: bool = False
    hf_export: str | None = None
    reads_characters: bool = False
    finetune_as: str | None = None
    concat_pooling: bool = False
    summary_activation: str | None = None

    def load(self) -> type:
        """The model class (its module is imported now)."""
        return getattr(importlib.import_module(self.module), self.class_name)

    @property
    def config_class(self) -> type:
        """The family's config class (``lmforge.config.families``): what ``ModelConfig(arch=self.name)`` builds."""
        from lmforge.config import family_class

        return family_class(self.name)


# Everything of a record that is not a capability: asking ``architectures_with`` about these is a mistake.
_DESCRIPTIVE = ("name", "module", "class_name", "description", "presets")
CAPABILITIES: tuple[str, ...] = tuple(f.name for f in fields(Architecture) if f.name not in _DESCRIPTIVE)

# In the order of lmforge.choices.ARCHITECTURES (a test holds them equal).
_REGISTRY: dict[str, Architecture] = {a.name: a for a in (
    Architecture("encoder", "lmforge.models.encoder", "Encoder", "BERT-style Transformer encoder with a pooler",
                 presets="bert-*", encodes_text=True, has_pooled_output=True, position_limited=True,
                 returns_attention=True, uses_init_std=True, hf_export="bert"),
    Architecture("decoder", "lmforge.models.decoder", "Decoder", "GPT-style causal Transformer language model",
                 presets="gpt-*", encodes_text=True, has_pooled_output=True, left_context_only=True, gpt_inputs=True,
                 generates=True, is_causal_lm=True, position_limited=True, returns_attention=True, uses_init_std=True,
                 hf_export="gpt2"),
    Architecture("seq2seq", "lmforge.models.seq2seq", "EncoderDecoder", "Transformer encoder-decoder",
                 presets="transformer-*", generates=True, has_encoder_decoder=True, position_limited=True,
                 returns_attention=True, finetune_as="seq2seq_encoder"),
    # the encoder stack of an encoder-decoder alone (a BART-style denoiser's encoder under task heads): built by
    # SourceEncoder.wrap from a seq2seq folder; its pooled output is the mean over the real tokens
    Architecture("seq2seq_encoder", "lmforge.models.seq2seq", "SourceEncoder",
                 "the encoder of a Transformer encoder-decoder, alone (fine-tuning heads, embeddings)",
                 presets="transformer-*, bart-* (an encoder-decoder folder)", encodes_text=True,
                 has_pooled_output=True, position_limited=True, returns_attention=True),
    Architecture("rnn", "lmforge.models.rnn_encoder", "RNNEncoder",
                 "bidirectional RNN encoder with attention pooling (a classifier backbone)",
                 presets="rnn-attn", encodes_text=True, has_pooled_output=True, recurrent=True,
                 returns_attention=True),
    Architecture("rnn_seq2seq", "lmforge.models.rnn_seq2seq", "RNNSeq2Seq", "attentional RNN encoder-decoder",
                 presets="rnn-seq2seq", generates=True, has_encoder_decoder=True, recurrent=True,
                 returns_attention=True),
    Architecture("bilm", "lmforge.models.elmo", "BiLM",
                 "ELMo's bidirectional LSTM language model (char-CNN or embedding tokens, LSTMP layers)",
                 presets="elmo-*", encodes_text=True, generates=True, is_causal_lm=True, reads_characters=True,
                 finetune_as="elmo"),
    Architecture("elmo", "lmforge.models.elmo", "ELMoEncoder",
                 "a frozen biLM's scalar mix under a task BiLSTM with attention pooling (ELMo fine-tuning)",
                 presets="elmo-* (a pretrained biLM folder)", encodes_text=True, has_pooled_output=True,
                 recurrent=True, returns_attention=True),
    Architecture("awd_lstm", "lmforge.models.awd_lstm", "AWDLSTM",
                 "AWD-LSTM language model (weight-dropped LSTM) and ULMFiT document encoder",
                 presets="awd-lstm*", encodes_text=True, has_pooled_output=True, left_context_only=True,
                 generates=True, is_causal_lm=True, concat_pooling=True),
    # XLNet: fine-tuned through its last real token's state (pooled_output, XLNet's "last" summary); generates left
    # to right with its memory (XLNet.forward_lm: attn_type "uni" as Transformer-XL, "bi" through a dummy token
    # predicted by the query stream); relative positions, so no length limit.
    Architecture("xlnet", "lmforge.models.xlnet", "XLNet",
                 "XLNet permutation language model (relative positions, memory, two-stream attention)",
                 presets="xlnet-*", encodes_text=True, has_pooled_output=True, generates=True, is_causal_lm=True,
                 returns_attention=True, uses_init_std=True, hf_export="xlnet", summary_activation="tanh"),
)}


def _unknown(name: object) -> Exception:
    from lmforge.errors import LmforgeError  # here, so that importing this package stays minimal

    return LmforgeError(f"unknown architecture {name!r}; choose one of {', '.join(_REGISTRY)}")


def architecture(name: str) -> Architecture:
    """The record of the family ``name`` (a ``config.arch`` value).

    Raises:
        LmforgeError: an unknown name; the message lists the known ones.
    """
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):  # TypeError: an unhashable value read from a config file
        raise _unknown(name) from None


def architectures_with(capability: str) -> list[str]:
    """The names of the families that have ``capability`` (a true value), in registry order, e.g. for messages
    such as "generation needs one of decoder, seq2seq, rnn_seq2seq".

    Raises:
        LmforgeError: ``capability`` is not one of ``CAPABILITIES`` (a typo would otherwise give an empty list).
    """
    if capability not in CAPABILITIES:
        from lmforge.errors import LmforgeError

        raise LmforgeError(f"unknown architecture capability {capability!r}; choose one of {', '.join(CAPABILITIES)}")
    return [name for name, record in _REGISTRY.items() if getattr(record, capability)]


class _Architectures:
    """``ARCHITECTURES[arch]`` -> the model class (imported on first use); iterating gives the family names."""

    def __getitem__(self, arch: str) -> type:
        return architecture(arch).load()

    def __iter__(self) -> Iterator[str]:
        return iter(_REGISTRY)

    def __contains__(self, arch: object) -> bool:
        try:
            return arch in _REGISTRY
        except TypeError:  # unhashable
            return False

    def __len__(self) -> int:
        return len(_REGISTRY)


ARCHITECTURES = _Architectures()


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    if name in _MOVED:
        import warnings

        import lmforge

        warnings.warn(f"lmforge.models.{name} moved to lmforge.persistence.{name} (also lmforge.{name}); the old "
                      "name goes in the next release", DeprecationWarning, stacklevel=2)
        return getattr(lmforge, name)
    raise AttributeError(f"module 'lmforge.models' has no attribute {name!r}")


__all__ = ["ARCHITECTURES", "CAPABILITIES", "Architecture", "PretrainedMixin", "architecture", "architectures_with",
           *_WHERE]  # the deprecated _MOVED names resolve on access but are not advertised

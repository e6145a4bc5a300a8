"""What the model families return: the output records shared across ``lmforge.models``.

Shape legend: B batch, T sequence (or new target) length, S source length, P cached target length, D model dim,
H heads, V vocabulary, L layers (L_e encoder layers of an encoder-decoder), M XLNet memory length, K = M + T keys
of XLNet's attention, N XLNet prediction targets.

One module for them so that no model file imports another: every text encoder returns ``EncoderOutput``'s fields
(heads, pipelines and feature extraction read one shape of result), and each family's file imports its records
from here. The family modules still re-export their own (``lmforge.models.encoder.EncoderOutput`` and so on).
Cache fields are annotated with ``lmforge.nn.StackCache``, the base of ``DecoderCache`` and ``Seq2SeqCache``.
"""

from __future__ import annotations

from typing import NamedTuple

from torch import Tensor

from lmforge.nn.layers import StackCache
from lmforge.nn.reinforce import SampledAlignments

__all__ = [
    "BiLMOutput",
    "DecodeOutput",
    "DecoderOutput",
    "EncoderOutput",
    "EncoderRowsOutput",
    "ForwardLMOutput",
    "LSTMState",
    "RNNSeq2SeqOutput",
    "Seq2SeqOutput",
    "SourceEncoderOutput",
    "StreamLMOutput",
    "XLNetLMOutput",
    "XLNetOutput",
]


class EncoderOutput(NamedTuple):
    """What ``Encoder.forward`` returns.

    Attributes:
        last_hidden_state: (B, T, D) output of the last layer (after the final LayerNorm in pre-LN mode).
        pooled_output: (B, D) ``tanh(dense(h_[CLS]))``, the sentence representation BERT's NSP head uses (with
            ``pooler=False``, DistilBERT: ``h_[CLS]`` itself).
        hidden_states: with ``output_hidden_states=True``, L + 1 tensors (B, T, D): the embeddings output, then
            each layer's output (the last one equals ``last_hidden_state``); else None.
        attentions: with ``output_attentions``, L entries: (B, H, T, T) weights for each requested layer and None
            for the others; else None.
    """

    last_hidden_state: Tensor
    pooled_output: Tensor
    hidden_states: tuple[Tensor, ...] | None = None
    attentions: tuple[Tensor | None, ...] | None = None


class EncoderRowsOutput(NamedTuple):
    """What ``Encoder.forward(read_rows=...)`` returns: ``EncoderOutput``'s fields at some rows only.

    Attributes:
        last_hidden_state: (R, D) the rows of ``read_rows`` in row-major order (``hidden[read_rows]``).
        pooled_output: (B, D) when every sequence reads position 0, else None.
        hidden_states, attentions: as ``EncoderOutput``'s (every position is then computed).
        read_rows: (B, T) bool, the rows asked for.
    """

    last_hidden_state: Tensor
    pooled_output: Tensor | None
    hidden_states: tuple[Tensor, ...] | None
    attentions: tuple[Tensor | None, ...] | None
    read_rows: Tensor


class SourceEncoderOutput(NamedTuple):
    """What ``SourceEncoder.forward`` returns (the fields of ``EncoderOutput``).

    Attributes:
        last_hidden_state: (B, T, D) the encoder's output (after ``encoder_norm`` in pre-LN mode): the memory the
            decoder would attend to.
        pooled_output: (B, D) the mean of ``last_hidden_state`` over the real tokens (see ``SourceEncoder``).
        hidden_states: with ``output_hidden_states``, L_e + 1 tensors (B, T, D): the embeddings output, then each
            layer's (the last one equals ``last_hidden_state``); else None.
        attentions: with ``output_attentions``, L_e entries, (B, H, T, T) for each requested layer, else None.
    """

    last_hidden_state: Tensor
    pooled_output: Tensor
    hidden_states: tuple[Tensor, ...] | None = None
    attentions: tuple[Tensor | None, ...] | None = None


class DecoderOutput(NamedTuple):
    """What ``Decoder.forward`` returns.

    Attributes:
        logits: (B, T, V) next-token scores, or None with ``return_logits=False``.
        last_hidden_state: (B, T, D) after the final LayerNorm (pre-LN) or the last layer (post-LN).
        cache: the DecoderCache passed in (now extended), or None.
        hidden_states: with ``output_hidden_states``, L + 1 tensors (B, T, D): the embeddings (after dropout), the
            outputs of layers 1..L-1, and ``last_hidden_state`` (as Hugging Face: the last entry is normalised).
        attentions: with ``output_attentions``, L entries: (B, H, T, S) weights for the requested layers, None for
            the others.
        pooled_output: (B, D) ``last_hidden_state`` at each row's LAST real token (GPT-1's extract token, Radford
            et al. 2018, section 3.3: the only position that has read the whole input). Found from the attention
            mask, so right and left padding give the same vector.
    """

    logits: Tensor | None
    last_hidden_state: Tensor
    cache: StackCache | None = None
    hidden_states: tuple[Tensor, ...] | None = None
    attentions: tuple[Tensor | None, ...] | None = None
    pooled_output: Tensor | None = None


class DecodeOutput(NamedTuple):
    """What ``EncoderDecoder.decode`` returns.

    Attributes:
        logits: (B, T, V), or None with ``return_logits=False``.
        last_hidden_state: (B, T, D) decoder output (after ``decoder_norm`` in pre-LN mode).
        cache: the Seq2SeqCache passed in (now extended), or None.
        self_attentions: with ``output_attentions``, one (B, H, T, P + T) tensor per decoder layer.
        cross_attentions: with ``output_attentions``, one (B, H, T, S) tensor per decoder layer.
    """

    logits: Tensor | None
    last_hidden_state: Tensor
    cache: StackCache | None = None
    self_attentions: tuple[Tensor, ...] | None = None
    cross_attentions: tuple[Tensor, ...] | None = None


class Seq2SeqOutput(NamedTuple):
    """What ``EncoderDecoder.forward`` (teacher forcing) returns.

    Attributes:
        logits: (B, T, V) scores of the next target token at every target position.
        last_hidden_state: (B, T, D) decoder output.
        memory: (B, S, D) encoder output.
        self_attentions, cross_attentions: as in ``DecodeOutput``.
    """

    logits: Tensor
    last_hidden_state: Tensor
    memory: Tensor
    self_attentions: tuple[Tensor, ...] | None = None
    cross_attentions: tuple[Tensor, ...] | None = None


class RNNSeq2SeqOutput(NamedTuple):
    """What ``RNNSeq2Seq.forward`` (teacher forcing) returns.

    Attributes:
        logits: (B, T, V) scores of the next target token at every target position.
        last_hidden_state: (B, T, D) the attentional vectors h~_t (before the output dropout).
        memory: (B, S, D) the encoder states, in the layout of ``src_ids`` (0 at padded positions).
        attentions: with ``output_attentions``, (B, T, S) the attention weights a_t over the source positions of
            ``src_ids``; else None.
        alignment_samples: hard attention trained by REINFORCE, in training mode: the log-probabilities and
            entropies of the sampled source positions, for ``lmforge.nn.reinforce.reinforce_loss`` (the objective
            adds that surrogate once it knows each example's reward); else None.
    """

    logits: Tensor
    last_hidden_state: Tensor
    memory: Tensor
    attentions: Tensor | None = None
    alignment_samples: SampledAlignments | None = None


class XLNetOutput(NamedTuple):
    """What ``XLNet.forward`` returns. Its first four fields are ``EncoderOutput``'s, so fine-tuning heads, the
    server's ``/embed`` and the attention views read it as they read a BERT encoder's output.

    Attributes:
        last_hidden_state: (B, T, D) the content stream after the last layer (and the output dropout).
        pooled_output: (B, D) the sequence summary: ``last_hidden_state`` at each row's LAST real token (the last
            position whose ``attention_mask`` is 1; position T - 1 without a mask), what the sequence and pair
            heads read. XLNet summarises a text by its last token (Hugging Face's ``summary_type="last"``); XLNet's
            own tokenizer ends a text with ``[SEP] [CLS]``, lmforge's puts ``[CLS]`` first and pads on the right, so the
            last real token (here [SEP]) is the one that, with ``attn_type="uni"`` too, has read the whole text.
            No projection: the state itself (as an encoder with ``pooler=False``), see ``XLNet``.
        hidden_states: with ``output_hidden_states``, L + 1 content-stream tensors (B, T, D): the embeddings (after
            dropout), then each layer's output (the last one is ``last_hidden_state`` before the output dropout).
        attentions: with ``output_attentions``, L content-stream weights (B, H, T, K) (the query stream's are not
            returned).
        query_state: (B, N, D) the query stream after the last layer, with a ``target_mapping``; else None.
        mems: with ``use_mems``, L tensors (B, M', D): the new memory of each layer (its input states), detached;
            else None.
        logits: with ``return_logits``, the LM head's vocabulary scores of the stream it names: (B, T, V) for
            "content", (B, N, V) for "query", or (n, V) for the n rows ``logits_rows`` selects; else None.
    """

    last_hidden_state: Tensor
    pooled_output: Tensor
    hidden_states: tuple[Tensor, ...] | None = None
    attentions: tuple[Tensor, ...] | None = None
    query_state: Tensor | None = None
    mems: tuple[Tensor, ...] | None = None
    logits: Tensor | None = None


class XLNetLMOutput(NamedTuple):
    """What ``XLNet.forward_lm`` returns.

    Attributes:
        last_hidden_state: (B, T, D) row t is the state that predicts token t + 1 from tokens 0..t (and the
            memory): ``lm_logits`` of it are next-token scores.
        mems: L tensors (B, M + T, D), detached: the memory given, then the content-stream inputs of each layer at
            the T tokens; pass them (and ``mems_mask``) with the next tokens.
    """

    last_hidden_state: Tensor
    mems: tuple[Tensor, ...]


#: a unidirectional LSTM stack's recurrent state: per layer (h (1, B, D), c (1, B, Dc)).
LSTMState = list[tuple[Tensor, Tensor]]


class BiLMOutput(NamedTuple):
    """What ``BiLM.forward`` returns: the fields of ``EncoderOutput`` (so embedding and fine-tuning code reads it the
    same way), then the language-model sums.

    Attributes:
        last_hidden_state: (B, T, 2D) the top layer [f_L; b_L], 0 at padding.
        pooled_output: None (a biLM has no sentence vector).
        hidden_states: with ``output_hidden_states``, the L + 1 layers (B, T, 2D): [x; x], then [f_j; b_j].
        attentions: None (``ELMoEncoder``: the pooling weights when asked).
        forward_nll, backward_nll: with ``lm_loss``, each direction's NLL summed over its targets (fp32 scalars).
        n_predictions: with ``lm_loss``, the number of targets of each direction (the same for both).
    """

    last_hidden_state: Tensor
    pooled_output: Tensor | None = None
    hidden_states: tuple[Tensor, ...] | None = None
    attentions: tuple[Tensor, ...] | None = None
    forward_nll: Tensor | None = None
    backward_nll: Tensor | None = None
    n_predictions: Tensor | None = None


class ForwardLMOutput(NamedTuple):
    """What ``BiLM.forward_lm`` returns.

    Attributes:
        last_hidden_state: (B, T, D) the forward LM's top layer f_L, 0 at padding.
        state: the forward LSTMs' state after each row's last real token: per layer (h (1, B, D), c (1, B, Dc)).
        hidden_states: with ``output_hidden_states``, the L + 1 layers (B, T, D): x, then f_1 .. f_L.
    """

    last_hidden_state: Tensor
    state: LSTMState
    hidden_states: tuple[Tensor, ...] | None = None


class StreamLMOutput(NamedTuple):
    """What ``BiLM.stream_lm`` returns.

    Attributes:
        forward_nll, backward_nll: each direction's NLL summed over its window's targets (fp32 scalars).
        n_predictions: the number of targets of each direction (B x T).
        state: the state each direction ends its window with, ``{"forward": LSTMState, "backward": LSTMState}``
            (per layer (h (1, B, D), c (1, B, Dc))): the start of the next windows.
    """

    forward_nll: Tensor
    backward_nll: Tensor
    n_predictions: Tensor
    state: dict[str, LSTMState]

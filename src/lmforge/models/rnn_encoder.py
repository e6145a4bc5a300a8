"""A (bi)directional RNN encoder with attention pooling: the lectures' first use case of attention, a sentence
classifier backbone (``--model rnn-attn`` for ``lmforge finetune --task sequence``).

Shape legend: B batch, T sequence length, D model dim (d_model), V vocabulary size, L stacked RNN layers.

    input_ids (B, T) ──► token embeddings ─► dropout                                         (B, T, D)
                     ──► L x (bi)GRU/LSTM, packed (padding never enters the recurrence)
                                                                   = last_hidden_state        (B, T, D)
                     ──► attention pooling: keys = values = the states, query = a learned u
                                                                   = pooled_output            (B, D)

Masks follow ``lmforge.nn.masks``: ``attention_mask`` (B, T) with 1 = real token, 0 = padding (anywhere).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from lmforge.config import ModelConfig
from lmforge.errors import LmforgeError
from lmforge.models import PretrainedMixin

# Every encoder returns the same output type, so the heads, pipelines and feature extraction read one shape of
# result; it lives in the shared module of output records, so no model file imports another.
from lmforge.models.outputs import EncoderOutput
from lmforge.nn.inputs import check_flag, check_input_ids
from lmforge.nn.masks import key_padding_mask
from lmforge.nn.rnn import AttentionPooling, StackedRNN

__all__ = ["RNNEncoder"]


class RNNEncoder(PretrainedMixin, nn.Module):
    """A bidirectional RNN encoder (Schuster & Paliwal 1997; GRU: Cho et al. 2014, LSTM: Hochreiter & Schmidhuber
    1997) with attention pooling (Yang et al. 2016, "Hierarchical Attention Networks for Document Classification",
    the word-level attention; scores of Bahdanau et al. 2015 and Luong et al. 2015).

    Config fields used: ``vocab_size``, ``d_model`` (embedding width and state width: each direction gets
    d_model / 2 when ``bidirectional``), ``n_layers``, ``rnn_cell`` ('gru' | 'lstm'), ``bidirectional``,
    ``attention`` (the pooling score), ``dropout`` (on the embeddings and between RNN layers), ``pad_token_id``
    (the embedding's padding row), ``max_seq_len`` (only with the 'location' score: the positions it can weigh).
    Not used: the Transformer fields (heads, d_ff, positions, segments: an RNN knows the order by itself;
    ``token_type_ids`` are accepted and ignored) and ``input_feeding``; ``attention_window`` must stay unset.

    Choices, all named:
        - ``pooled_output`` is the attention-pooled vector itself (no dense + tanh on top, unlike BERT's pooler);
          the attention-pooling module is called ``pooler`` because it is what the pooled representation comes
          from (and what the sequence head looks for).
        - The 'location' score (a = softmax(W_a u)) gets a constant query here, so it learns a content-independent
          weighting of positions (renormalised over each row's real tokens): allowed, but the content scores are
          the meaningful ones.
        - Initialisation: every parameter U(-0.1, 0.1), as Luong et al. 2015 (section 4.1); the padding row of the
          embedding is then zeroed (and, as ``padding_idx``, never trained).

    State-dict keys: ``embeddings.weight``, ``layers.{l}.weight_{ih,hh}_l0[_reverse]`` and biases (one
    ``nn.GRU``/``nn.LSTM`` per layer, so layer-wise freezing and learning-rate decay see ``layers.{l}``),
    ``pooler.query``, ``pooler.attention.score.*`` (for scores with parameters).
    """

    def __init__(self, config: ModelConfig) -> None:
        """
        Args:
            config: a ``ModelConfig``, e.g. the ``rnn-attn`` preset (``arch`` is not checked).
        """
        super().__init__()
        if config.attention_window is not None:
            raise LmforgeError(f"attention_window={config.attention_window} has no meaning for attention pooling (one "
                               "query, no decoding step to centre a window on); leave it unset for arch 'rnn'")
        self.config = config
        D = config.d_model
        self.embeddings = nn.Embedding(config.vocab_size, D, padding_idx=config.pad_token_id)
        self.dropout = nn.Dropout(config.dropout)
        self.layers = StackedRNN(config.rnn_cell, D, D, n_layers=config.n_layers, bidirectional=config.bidirectional,
                                 dropout=config.dropout)
        self.pooler = AttentionPooling(D, config.attention, max_len=config.max_seq_len)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """U(-0.1, 0.1) everywhere (Luong et al. 2015), then a zero padding row."""
        for p in self.parameters():
            nn.init.uniform_(p, -0.1, 0.1)
        with torch.no_grad():
            self.embeddings.weight[self.config.pad_token_id].zero_()

    def get_input_embeddings(self) -> nn.Embedding:
        """The token embedding (V, D)."""
        return self.embeddings

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
    ) -> EncoderOutput:
        """Encode a batch of token sequences and pool each into one vector.

        Args:
            input_ids: (B, T) integer token ids in [0, vocab_size).
            attention_mask: (B, T) with 1 = real token, 0 = padding (bool, integer or 0./1. float; padding may sit
                anywhere, it is skipped); default all real.
            token_type_ids: accepted and ignored (the fine-tuning collate passes segment ids to every backbone).
            output_hidden_states: also return the embeddings output and every RNN layer's output.
            output_attentions: also return the pooling weights.

        Returns:
            EncoderOutput(last_hidden_state (B, T, D) (0 at padded positions), pooled_output (B, D),
            hidden_states: L + 1 tensors (B, T, D) (embeddings output, then each layer's output) or None,
            attentions: a 1-tuple with the pooling weights (B, 1, 1, T) (the (B, H, Tq, Tk) layout of the
            Transformer encoders, with one head and one query) or None).

        Raises:
            LmforgeError: bad input (shape, dtype, an id outside the vocabulary, a mask of another shape, a sequence
                longer than max_seq_len with the 'location' score).
        """
        mask = self._check_inputs(input_ids, attention_mask)  # (B, T) bool or None
        check_flag(output_attentions, "output_attentions")
        x = self.dropout(self.embeddings(input_ids))  # (B, T, D)
        rnn = self.layers(x, mask, output_all_layers=output_hidden_states)
        h = rnn.states  # (B, T, D), 0 at padding
        pooled, weights = self.pooler(h, mask)  # (B, D), (B, T)
        hidden_states = (x, *rnn.layer_states) if rnn.layer_states is not None else None
        attentions = (weights[:, None, None, :],) if output_attentions else None  # (B, 1, 1, T)
        return EncoderOutput(h, pooled, hidden_states, attentions)

    def _check_inputs(self, input_ids: Tensor, attention_mask: Tensor | None) -> Tensor | None:
        """Raise on a bad input; return the (B, T) bool mask (True = real token), or None."""
        cfg = self.config
        B, T = check_input_ids(input_ids, vocab_size=cfg.vocab_size)
        if cfg.attention == "location" and T > cfg.max_seq_len:
            raise LmforgeError(f"sequence length {T} exceeds max_seq_len={cfg.max_seq_len}, the positions the "
                               "'location' score can weigh; truncate the input or use a content score")
        return None if attention_mask is None else key_padding_mask(attention_mask, batch=B, length=T)

    def extra_repr(self) -> str:
        c = self.config
        return (f"rnn_cell={c.rnn_cell!r}, bidirectional={c.bidirectional}, n_layers={c.n_layers}, "
                f"d_model={c.d_model}, attention={c.attention!r}")

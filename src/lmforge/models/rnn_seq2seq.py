"""The attentional RNN encoder-decoder of Bahdanau et al. 2015 and Luong et al. 2015.

Shape legend: B batch, S source length, T target length, D model dim (d_model), V vocab, L stacked RNN layers.

The forward pass, top to bottom (Luong et al. 2015, "Effective Approaches to Attention-based Neural Machine
Translation", sections 3 and 3.3; Bahdanau et al. 2015 for the bidirectional encoder and the additive score):

    encode:  x = Dropout(E src)  -> L x biGRU/biLSTM (packed)                        memory h̄_s  (B, S, D)
             h_0 = tanh(W_b [->h_S; <-h_1] + b_b)  per layer (the "bridge"; ->h_S alone if unidirectional)
                                                                                      state        (L, B, D)
    step t:  input  = [Dropout(E y_{t-1}); h~_{t-1}]     (input feeding, h~_0 = 0; else E y only)  (B, 2D)
             h_t    = RNN_dec(input, h_{t-1})             (L layers; the top one is the query)      (B, D)
             a_t    = masked softmax_s score(h_t, h̄_s)   (global, or local-m inside |s - t| <= D_w) (B, S)
             c_t    = sum_s a_t(s) h̄_s                                                              (B, D)
             h~_t   = tanh(W_c [c_t; h_t])               (Luong eq. 5)                              (B, D)
             logits = W_o Dropout(h~_t)                  (W_o = E when tied)                        (B, V)

Masks at this boundary are (B, length) with 1 = real token, 0 = padding. Source padding may sit anywhere (the
real tokens are moved to the front before encoding, so source positions count real tokens); targets are right-
padded (an RNN decoder is causal, so padding after a target's end cannot change the steps before it).

This is a model file: it imports ``lmforge.nn`` only, never another file in ``lmforge.models``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmforge.config import ModelConfig
from lmforge.errors import LmforgeError
from lmforge.nn.attention import Attention
from lmforge.nn.inputs import check_flag, check_input_ids
from lmforge.nn.masks import key_padding_mask
from lmforge.nn.rnn import StackedRNN, compact_padding, make_rnn, make_state_score

__all__ = ["RNNSeq2Seq", "RNNSeq2SeqOutput", "RNNState"]


class RNNState(NamedTuple):
    """Everything one decoding step needs: the decoder's recurrent state and what it attends to.

    Attributes:
        hidden: (L, B, D) decoder hidden state h_{t-1} of every layer.
        cell: (L, B, D) LSTM memory cells, or None for a GRU.
        feed: (B, D) the previous attentional vector h~_{t-1} (zeros before the first step); fed back into the
            next input when ``config.input_feeding`` (Luong et al. 2015, section 3.3).
        memory: (B, S, D) encoder states h̄_s (the keys and values), real tokens first in each row.
        src_mask: (B, S) bool, True = real source token (right-padded layout), or None when nothing is padded.
        step: t, the number of target tokens decoded so far (the local-m centre p_t of the next step).
    """

    hidden: Tensor
    cell: Tensor | None
    feed: Tensor
    memory: Tensor
    src_mask: Tensor | None
    step: int = 0


class RNNSeq2SeqOutput(NamedTuple):
    """What ``RNNSeq2Seq.forward`` (teacher forcing) returns.

    Attributes:
        logits: (B, T, V) scores of the next target token at every target position.
        last_hidden_state: (B, T, D) the attentional vectors h~_t (before the output dropout).
        memory: (B, S, D) the encoder states, in the layout of ``src_ids`` (0 at padded positions).
        attentions: with ``output_attentions``, (B, T, S) the attention weights a_t over the source positions of
            ``src_ids``; else None.
    """

    logits: Tensor
    last_hidden_state: Tensor
    memory: Tensor
    attentions: Tensor | None = None


class RNNSeq2Seq(nn.Module):
    """Attentional RNN encoder-decoder: Luong et al. 2015, "Effective Approaches to Attention-based Neural Machine
    Translation" (EMNLP), with the bidirectional encoder and additive score of Bahdanau et al. 2015, "Neural
    Machine Translation by Jointly Learning to Align and Translate" (ICLR).

    Config fields used: ``vocab_size``, ``d_model`` (embedding, encoder output and decoder widths), ``n_layers``
    (encoder and decoder layers alike), ``rnn_cell`` ('gru' | 'lstm'), ``bidirectional`` (the encoder),
    ``attention`` (additive | dot | general | scaled_dot | cosine | location), ``attention_window`` (None =
    global attention, D_w = local-m), ``input_feeding``, ``share_embeddings``, ``tie_embeddings``, ``dropout``,
    ``pad_token_id``, ``max_seq_len`` (only with the 'location' score: the longest source it can address).

    Choices and deviations, all named:
        - Attention follows Luong's order: the decoder first updates h_t, then attends with h_t as the query and
          predicts from h~_t = tanh(W_c [c_t; h_t]). Bahdanau's order (query s_{i-1}, context fed into the RNN) is
          not implemented; his additive score is available as ``attention='additive'``.
        - The initial decoder state is a "bridge" from the encoder: h_0 = tanh(W_b [->h_S; <-h_1] + b_b) for every
          layer (one W_b shared by the layers), and for an LSTM c_0 = W_c' [->c_S; <-c_1] + b (a cell is not
          squashed). Bahdanau et al. use tanh(W_s <-h_1) (the backward state only, one layer); Luong et al. copy
          the last encoder states of a unidirectional stack.
        - Local attention is local-m (Luong section 3.2, monotonic alignment p_t = t, 0-based, clipped to each
          source's last real token): window |s - p_t| <= D_w. Local-p (predicted p_t with a Gaussian) exists in
          ``lmforge.nn.Attention`` (alignment='predictive') but ModelConfig has no field to choose it.
        - The 'location' score softmax(W_a h_t) has max_seq_len outputs, of which the first S are used (see
          ``lmforge.nn.LocationScore``), so sources are limited to max_seq_len tokens with that score only.
        - The 'cosine' score has strength sqrt(D), not 1 (see ``lmforge.nn.rnn.make_state_score``: bounded RNN
          states could not sharpen the attention otherwise); the additive score's hidden width is D.
        - Dropout (``config.dropout``) on the embeddings, between stacked RNN layers, and on h~_t before the
          output projection (Zaremba et al. 2014's non-recurrent connections); h~_t is fed back undropped.
        - The output projection has no bias and is the target embedding when ``tie_embeddings`` (Press & Wolf
          2017); the padding row stays zero, so padding always scores 0.
        - Initialisation: every parameter U(-0.1, 0.1) (Luong et al. section 4.1), then zero padding rows.

    State-dict keys: ``embedding.weight`` (shared) or ``src_embedding.weight`` and ``tgt_embedding.weight``;
    ``encoder.{l}.*`` (one ``nn.GRU``/``nn.LSTM`` per layer, ``_reverse`` for the backward direction);
    ``bridge.*``, ``bridge_cell.*`` (LSTM only); ``decoder.*`` (one multi-layer ``nn.GRU``/``nn.LSTM``);
    ``attention.score.*`` (scores with parameters); ``combine.weight`` (W_c); ``lm_head.weight`` (untied only).
    """

    def __init__(self, config: ModelConfig) -> None:
        """
        Args:
            config: a ``ModelConfig`` with ``arch="rnn_seq2seq"`` (e.g. the ``rnn-seq2seq`` preset).
        """
        super().__init__()
        if config.arch != "rnn_seq2seq":
            raise LmforgeError(f"RNNSeq2Seq needs a config with arch='rnn_seq2seq'; got arch={config.arch!r}")
        if config.n_decoder_layers is not None and config.n_decoder_layers != config.n_layers:
            raise LmforgeError(f"RNNSeq2Seq uses n_layers={config.n_layers} for the encoder and the decoder (the "
                               f"bridge maps layer to layer); leave n_decoder_layers unset, got "
                               f"{config.n_decoder_layers}")
        self.config = config
        D, V, L = config.d_model, config.vocab_size, config.n_layers
        pad = config.pad_token_id
        if config.share_embeddings:
            self.embedding = nn.Embedding(V, D, padding_idx=pad)
            self._src_table, self._tgt_table = "embedding", "embedding"
        else:
            self.src_embedding = nn.Embedding(V, D, padding_idx=pad)
            self.tgt_embedding = nn.Embedding(V, D, padding_idx=pad)
            self._src_table, self._tgt_table = "src_embedding", "tgt_embedding"
        self.dropout = nn.Dropout(config.dropout)
        self.encoder = StackedRNN(config.rnn_cell, D, D, n_layers=L, bidirectional=config.bidirectional,
                                  dropout=config.dropout)
        self.bridge = nn.Linear(D, D)
        self.bridge_cell = nn.Linear(D, D) if config.rnn_cell == "lstm" else None
        d_input = 2 * D if config.input_feeding else D  # [E y_{t-1}; h~_{t-1}] with input feeding
        self.decoder = make_rnn(config.rnn_cell, d_input, D, n_layers=L, dropout=config.dropout)
        score = make_state_score(config.attention, D, max_len=config.max_seq_len)  # cosine: strength sqrt(D)
        self.attention = Attention(score, window=config.attention_window)  # local-m when a window is set
        self.combine = nn.Linear(2 * D, D, bias=False)  # W_c of h~_t = tanh(W_c [c_t; h_t])
        self.lm_head = None if config.tie_embeddings else nn.Linear(D, V, bias=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """U(-0.1, 0.1) everywhere (Luong et al. 2015, section 4.1), then zero padding rows."""
        for p in self.parameters():
            nn.init.uniform_(p, -0.1, 0.1)
        with torch.no_grad():
            for table in {self.src_embed, self.tgt_embed}:
                table.weight[self.config.pad_token_id].zero_()

    # ---------------------------------------------------------------------------------------------- embeddings
    @property
    def src_embed(self) -> nn.Embedding:
        """The source embedding table (the shared one with ``share_embeddings``)."""
        return getattr(self, self._src_table)

    @property
    def tgt_embed(self) -> nn.Embedding:
        """The target embedding table (the shared one with ``share_embeddings``)."""
        return getattr(self, self._tgt_table)

    def get_input_embeddings(self) -> nn.Embedding:
        """The source embedding (the shared table with ``share_embeddings``)."""
        return self.src_embed

    @property
    def output_weight(self) -> Tensor:
        """(V, D) the pre-softmax projection W_o: the target embedding when tied, else ``lm_head.weight``."""
        return self.tgt_embed.weight if self.lm_head is None else self.lm_head.weight

    def lm_logits(self, hidden: Tensor) -> Tensor:
        """(..., D) attentional vectors h~ -> (..., V) vocabulary scores (no dropout here)."""
        return F.linear(hidden, self.output_weight)  # (..., V)

    # ---------------------------------------------------------------------------------------------- encoder
    def encode(self, src_ids: Tensor, src_mask: Tensor | None = None) -> RNNState:
        """Encode the source and build the initial decoding state.

        Args:
            src_ids: (B, S) source token ids in [0, V).
            src_mask: (B, S) 1 = real token, 0 = padding (anywhere); None = no padding.

        Returns:
            RNNState(hidden (L, B, D), cell (L, B, D) | None, feed zeros (B, D), memory (B, S, D), src_mask,
            step 0); the memory holds each row's real tokens first.
        """
        return self._encode(src_ids, src_mask)[0]

    def _encode(self, src_ids: Tensor, src_mask: Tensor | None) -> tuple[RNNState, Tensor | None]:
        # Also returns the gather order that moved real tokens to the front (None when nothing moved), so that
        # forward can report memory and attention weights in the layout of src_ids.
        B, S = check_input_ids(src_ids, vocab_size=self.config.vocab_size, name="src_ids")
        if self.config.attention == "location" and S > self.config.max_seq_len:
            raise LmforgeError(f"source length {S} exceeds max_seq_len={self.config.max_seq_len}, the positions the "
                               "'location' score can address; shorten the source or use a content score")
        mask, order = None, None
        if src_mask is not None:
            mask = key_padding_mask(src_mask, batch=B, length=S, name="src_mask")  # (B, S) bool
            order, lengths = compact_padding(mask)
            if order is not None:  # positions must count real tokens for local-m and the location score
                src_ids = src_ids.gather(1, order)
                mask = torch.arange(S, device=mask.device) < lengths.unsqueeze(-1)  # (B, S) right-padded
            if bool(mask.all()):
                mask = None
        x = self.dropout(self.src_embed(src_ids))  # (B, S, D)
        enc = self.encoder(x, mask)  # states (B, S, D), finals (L, B, D)
        hidden = torch.tanh(self.bridge(enc.hidden))  # (L, B, D) h_0 per layer
        cell = None
        if self.bridge_cell is not None:
            assert enc.cell is not None
            cell = self.bridge_cell(enc.cell)  # (L, B, D) c_0 per layer
        feed = enc.states.new_zeros(B, self.config.d_model)  # h~_0 = 0
        return RNNState(hidden, cell, feed, enc.states, mask, 0), order

    # ---------------------------------------------------------------------------------------------- decoder
    def decode_step(self, prev_ids: Tensor, state: RNNState) -> tuple[Tensor, RNNState]:
        """One decoding step: read y_{t-1}, update the state, attend, predict y_t.

        Args:
            prev_ids: (B,) the previous target tokens (the start token at the first step).
            state: from ``encode`` or the previous ``decode_step`` (not modified).

        Returns:
            ``(logits (B, V), new state)`` with ``step`` advanced by one.
        """
        if not isinstance(state, RNNState):
            raise LmforgeError(f"state must be an RNNState (from encode or decode_step); got {type(state).__name__}")
        B = state.feed.shape[0]
        if not isinstance(prev_ids, Tensor) or tuple(prev_ids.shape) != (B,):
            shape = tuple(prev_ids.shape) if isinstance(prev_ids, Tensor) else type(prev_ids).__name__
            raise LmforgeError(f"prev_ids must be (batch={B},) token ids, one per row of the state; got {shape} "
                               "(reorder the state with reorder_state when the batch changes)")
        check_input_ids(prev_ids.unsqueeze(-1), vocab_size=self.config.vocab_size, name="prev_ids")
        y = self.dropout(self.tgt_embed(prev_ids))  # (B, D)
        h_tilde, _, state = self._step(y, state)
        return self.lm_logits(self.dropout(h_tilde)), state  # (B, V)

    def _step(self, y: Tensor, state: RNNState) -> tuple[Tensor, Tensor, RNNState]:
        # y: (B, D) embedded previous token -> h~_t (B, D), weights (B, S), the next state.
        inp = torch.cat((y, state.feed), dim=-1) if self.config.input_feeding else y  # (B, 2D) | (B, D)
        hx = state.hidden if state.cell is None else (state.hidden, state.cell)
        out, hx = self.decoder(inp.unsqueeze(1), hx)  # (B, 1, D): the top layer's h_t
        hidden, cell = hx if isinstance(hx, tuple) else (hx, None)
        h_tilde, weights = self._attend(out, state.memory, state.src_mask, state.step)  # (B, 1, D), (B, 1, S)
        h_tilde = h_tilde.squeeze(1)
        return h_tilde, weights.squeeze(1), RNNState(hidden, cell, h_tilde, state.memory, state.src_mask,
                                                    state.step + 1)

    def _attend(self, h: Tensor, memory: Tensor, src_mask: Tensor | None, first_step: int) -> tuple[Tensor, Tensor]:
        # h: (B, T, D) decoder states of steps first_step .. first_step + T - 1 -> h~ (B, T, D), weights (B, T, S).
        T = h.shape[1]
        positions = torch.arange(first_step, first_step + T, device=h.device)  # (T,) local-m centres p_t = t
        out = self.attention(h, memory, attention_mask=src_mask, positions=positions, need_weights=True)
        assert out.weights is not None
        h_tilde = torch.tanh(self.combine(torch.cat((out.output, h), dim=-1)))  # (B, T, D) Luong eq. 5
        return h_tilde, out.weights

    def reorder_state(self, state: RNNState, index: Tensor) -> RNNState:
        """Select batch rows of a state (beam search).

        Args:
            state: an RNNState with B rows.
            index: (B',) long, the rows to keep, in order (repeats allowed).

        Returns:
            The RNNState of those rows.
        """
        if not isinstance(index, Tensor) or index.dim() != 1:
            raise LmforgeError(f"index must be a 1-D tensor of row numbers; got {getattr(index, 'shape', index)}")
        index = index.to(device=state.feed.device, dtype=torch.long)
        return RNNState(
            state.hidden.index_select(1, index),
            None if state.cell is None else state.cell.index_select(1, index),
            state.feed.index_select(0, index),
            state.memory.index_select(0, index),
            None if state.src_mask is None else state.src_mask.index_select(0, index),
            state.step)

    def forward(
        self,
        src_ids: Tensor,
        tgt_ids: Tensor,
        src_mask: Tensor | None = None,
        tgt_mask: Tensor | None = None,
        output_attentions: bool = False,
    ) -> RNNSeq2SeqOutput:
        """Teacher forcing: encode the source, decode the whole (shifted) target; equals ``decode_step`` T times.

        Args:
            src_ids: (B, S) source token ids.
            tgt_ids: (B, T) decoder inputs: the target shifted right, starting with the start token.
            src_mask: (B, S) 1 = real token, 0 = padding (anywhere).
            tgt_mask: (B, T) 1 = real token; must be right-padded. Only checked: positions after a target's end
                cannot change the ones before it (the decoder is causal), and their logits are ignored by the loss.
            output_attentions: also return the attention weights (B, T, S).

        Returns:
            RNNSeq2SeqOutput(logits (B, T, V), last_hidden_state (B, T, D), memory (B, S, D), attentions).
        """
        check_flag(output_attentions, "output_attentions")
        state, order = self._encode(src_ids, src_mask)
        B, T = check_input_ids(tgt_ids, vocab_size=self.config.vocab_size, name="tgt_ids")
        if B != state.feed.shape[0]:
            raise LmforgeError(f"tgt_ids has {B} rows but src_ids {state.feed.shape[0]}")
        if tgt_mask is not None:
            mask = key_padding_mask(tgt_mask, batch=B, length=T, name="tgt_mask")  # (B, T) bool
            if compact_padding(mask)[0] is not None:
                raise LmforgeError("tgt_mask must be right-padded (1s then 0s in every row): an RNN decoder reads the "
                                   "target left to right from the start token")
        y = self.dropout(self.tgt_embed(tgt_ids))  # (B, T, D)
        if self.config.input_feeding:  # h~_{t-1} enters step t: one step at a time (Luong section 3.3)
            steps, weights = [], []
            for t in range(T):
                h_tilde_t, w_t, state = self._step(y[:, t], state)
                steps.append(h_tilde_t)
                weights.append(w_t)
            h_tilde, w = torch.stack(steps, dim=1), torch.stack(weights, dim=1)  # (B, T, D), (B, T, S)
        else:  # no feedback: the decoder RNN runs over the whole target at once, then attention for every step
            hx = state.hidden if state.cell is None else (state.hidden, state.cell)
            out, _ = self.decoder(y, hx)  # (B, T, D)
            h_tilde, w = self._attend(out, state.memory, state.src_mask, 0)  # (B, T, D), (B, T, S)
        logits = self.lm_logits(self.dropout(h_tilde))  # (B, T, V)
        memory = state.memory
        if order is not None:  # back to the layout of src_ids
            memory = torch.zeros_like(memory).scatter_(1, order.unsqueeze(-1).expand_as(memory), memory)
            w = torch.zeros_like(w).scatter_(-1, order.unsqueeze(1).expand_as(w), w)
        return RNNSeq2SeqOutput(logits, h_tilde, memory, w if output_attentions else None)

    def extra_repr(self) -> str:
        c = self.config
        where = "global" if c.attention_window is None else f"local-m, window={c.attention_window}"
        return (f"rnn_cell={c.rnn_cell!r}, n_layers={c.n_layers}, d_model={c.d_model}, "
                f"attention={c.attention!r} ({where}), input_feeding={c.input_feeding}")

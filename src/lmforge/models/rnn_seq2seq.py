"""The RNN encoder-decoder: attentional (Bahdanau et al. 2015, Luong et al. 2015) or with one fixed context vector
(Cho et al. 2014, Sutskever et al. 2014).

Shape legend: B batch, S source length, T target length, D model dim (d_model), V vocab, L stacked RNN layers.

The forward pass, top to bottom (Luong et al. 2015, "Effective Approaches to Attention-based Neural Machine
Translation", sections 3 and 3.3; Bahdanau et al. 2015 for the bidirectional encoder, the additive score and the
other decoder order; Cho et al. 2014 for the model without attention):

    encode:  x = Dropout(E src)  -> L x biGRU/biLSTM (packed)                        memory h̄_s  (B, S, D)
             h_0 = tanh(W_b [->h_S; <-h_1] + b_b)  per layer (the "bridge"; ->h_S alone if unidirectional)
                                                                                      state        (L, B, D)
    attend:  a_t    = masked softmax_s score(q, h̄_s)     global; local-m: |s - t| <= D_w; local-p: |s - p_t| <= D_w
                      (local-p: p_t = S_b sigmoid(v_p^T tanh(W_p q)), a_t *= exp(-(s - p_t)^2 / (2 (D_w/2)^2)))
             hard:  a_t = one_hot(sample ~ a_t) in training (argmax at inference)                   (B, S)
             c_t    = sum_s a_t(s) h̄_s                                                              (B, D)

    decoder_order = "luong" (default), step t:
             input  = [Dropout(E y_{t-1}); h~_{t-1}]     (input feeding, h~_0 = 0; else E y only)  (B, 2D)
             h_t    = RNN_dec(input, h_{t-1})             (L layers; the top one is the query q)    (B, D)
             c_t    = attend(q = h_t)                                                                (B, D)
             h~_t   = tanh(W_c [c_t; h_t])               (Luong eq. 5)                              (B, D)
    decoder_order = "bahdanau", step i:
             c_i    = attend(q = s_{i-1})                 (the top layer's previous state; s_0 = h_0)(B, D)
             s_i    = RNN_dec([Dropout(E y_{i-1}); c_i], s_{i-1})                                    (B, D)
             h~_i   = tanh(W_c [c_i; s_i; Dropout(E y_{i-1})])   (the readout g(y_{i-1}, s_i, c_i))  (B, D)
    attention = "none": c = h_0 of the top layer, the same at every step (no attend):
             input_feeding (default): c takes the place of c_t above: input [E y_{t-1}; c], h~_t = tanh(W_c [c; h_t])
                                      (Cho et al. 2014: c enters every step and the output)
             input_feeding = false:   input E y_{t-1}, h~_t = h_t (Sutskever et al. 2014: c only through h_0)

             logits = W_o Dropout(h~_t)                  (W_o = E when tied)                        (B, V)

Masks at this boundary are (B, length) with 1 = real token, 0 = padding. Source padding may sit anywhere (the
real tokens are moved to the front before encoding, so source positions count real tokens); targets are right-
padded (an RNN decoder is causal, so padding after a target's end cannot change the steps before it).

This is a model file: it imports ``lmforge.nn`` and the shared output records (``lmforge.models.outputs``), never
another model file.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmforge.config import ModelConfig
from lmforge.errors import LmforgeError
from lmforge.models import PretrainedMixin
from lmforge.models.outputs import RNNSeq2SeqOutput
from lmforge.nn.generic_attention import Attention
from lmforge.nn.inputs import check_flag, check_input_ids
from lmforge.nn.masks import key_padding_mask
from lmforge.nn.reinforce import RewardBaseline, SampledAlignments
from lmforge.nn.rnn import StackedRNN, compact_padding, make_rnn, make_state_score

__all__ = ["RNNSeq2Seq", "RNNSeq2SeqOutput", "RNNState"]


class RNNState(NamedTuple):
    """Everything one decoding step needs: the decoder's recurrent state and what it attends to.

    Attributes:
        hidden: (L, B, D) decoder hidden state h_{t-1} of every layer.
        cell: (L, B, D) LSTM memory cells, or None for a GRU.
        feed: (B, D) the previous attentional vector h~_{t-1} (zeros before the first step); fed back into the
            next input when ``config.input_feeding`` in Luong's order (Luong et al. 2015, section 3.3). With
            ``attention='none'`` it is the fixed context vector c instead (zeros in the Sutskever variant).
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


class _Attended(NamedTuple):
    """What the attention of one or more steps gives (internal)."""

    context: Tensor  # (B, T, D) c_t
    weights: Tensor | None  # (B, T, S), None without attention
    log_probs: Tensor | None = None  # (B, T) REINFORCE: log pi_t(sampled position), training only
    entropy: Tensor | None = None  # (B, T) with log_probs


class RNNSeq2Seq(PretrainedMixin, nn.Module):
    """RNN encoder-decoder: Luong et al. 2015, "Effective Approaches to Attention-based Neural Machine Translation"
    (EMNLP), with the bidirectional encoder, additive score and decoder order of Bahdanau et al. 2015, "Neural
    Machine Translation by Jointly Learning to Align and Translate" (ICLR); without attention, Cho et al. 2014,
    "Learning Phrase Representations using RNN Encoder-Decoder for Statistical Machine Translation" (EMNLP) and
    Sutskever et al. 2014, "Sequence to Sequence Learning with Neural Networks" (NeurIPS).

    Config fields used: ``vocab_size``, ``d_model`` (embedding, encoder output and decoder widths), ``n_layers``
    (encoder and decoder layers alike), ``rnn_cell`` ('gru' | 'lstm'), ``bidirectional`` (the encoder),
    ``attention`` (additive | dot | general | scaled_dot | cosine | location | none), ``attention_window`` (None =
    global attention, D_w = local), ``attention_alignment`` ('monotonic' = local-m | 'predictive' = local-p),
    ``decoder_order`` ('luong' | 'bahdanau'), ``hard_attention`` with ``hard_attention_estimator``
    ('straight_through' | 'reinforce'), ``reinforce_baseline_decay`` and ``reinforce_entropy``, ``input_feeding``,
    ``share_embeddings``, ``tie_embeddings``, ``dropout``, ``pad_token_id``, ``max_seq_len`` (only with the
    'location' score: the longest source it can address).

    Choices and deviations, all named:
        - Luong's order (default): the decoder first updates h_t, then attends with h_t as the query and predicts
          from h~_t = tanh(W_c [c_t; h_t]). Bahdanau's order (``decoder_order='bahdanau'``): the query is the
          previous state s_{i-1}, the context enters the RNN with the embedding, and the readout is
          tanh(W_c [c_i; s_i; E y_{i-1}]) -- the inputs of the paper's g(y_{i-1}, s_i, c_i) (section 3.1), with one
          tanh layer instead of its maxout deep output (appendix A.2.2, which also reads s_{i-1}, not s_i).
          ``input_feeding`` has no effect there: the RNN input is [E y; c_i] by construction.
        - ``attention='none'``: no attention; the only context is c = h_0 of the top decoder layer, the bridged final
          encoder states. With ``input_feeding`` (the default) c is fed to every step, the lectures' "fixed context
          vector" and Cho et al.'s design: the RNN input is [E y_{t-1}; c] (the slot of h~_{t-1}) and the output
          h~_t = tanh(W_c [c; h_t]) (Cho et al. read out g(h_t, y_{t-1}, c) with a maxout; with Bahdanau's order
          the readout does take E y_{t-1}). Why this default: with c at every step the decoder need not carry the
          whole source in its state (Cho et al. section 2.2). With ``input_feeding=false`` (Luong's order) it is
          Sutskever et al.'s: c only initialises the decoder, and h~_t = h_t (no W_c); Sutskever's reversed source
          and 4-layer LSTM are not reproduced (a bidirectional encoder sees both ends).
        - The initial decoder state is a "bridge" from the encoder: h_0 = tanh(W_b [->h_S; <-h_1] + b_b) for every
          layer (one W_b shared by the layers), and for an LSTM c_0 = W_c' [->c_S; <-c_1] + b (a cell is not
          squashed). Bahdanau et al. use tanh(W_s <-h_1) (the backward state only, one layer); Luong et al. copy
          the last encoder states of a unidirectional stack.
        - Local attention (Luong section 3.2): local-m (monotonic alignment p_t = t, 0-based, clipped to each
          source's last real token), window |s - p_t| <= D_w; local-p (``attention_alignment='predictive'``):
          p_t = S_b sigmoid(v_p^T tanh(W_p q)) with S_b each row's number of real source tokens, the weights times
          exp(-(s - p_t)^2 / (2 sigma^2)), sigma = D_w / 2, not renormalised (as in the paper); see
          ``lmforge.nn.Attention``.
        - Hard attention (Xu et al. 2015): one source position, sampled from a_t in training, the argmax at
          inference (decode_step and eval-mode forward). Its gradient: straight-through (biased, the default), or
          REINFORCE: the forward pass returns the samples' log-probabilities and the objective adds the
          score-function surrogate with reward R = log p(y | sampled positions, x) = -(the example's target NLL),
          a moving-average baseline (``reinforce_baseline_decay``) and an entropy bonus (``reinforce_entropy``);
          see ``lmforge.nn.reinforce.reinforce_loss`` and ``lmforge.objectives.seq2seq``.
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
    ``attention.score.*`` (scores with parameters), ``attention.predictor.*`` (local-p); ``combine.weight`` (W_c:
    (D, 2D), (D, 3D) in Bahdanau's order, absent in the Sutskever variant); ``reward_baseline.*`` (REINFORCE);
    ``lm_head.weight`` (untied only).
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
        self._bahdanau = config.decoder_order == "bahdanau"
        # the RNN input is [E y; something]: h~_{t-1} (Luong, input feeding), c_i (Bahdanau) or the fixed c (none)
        self._wide_input = self._bahdanau or config.input_feeding
        self._fixed_context = config.attention == "none" and self._wide_input  # Cho et al.: c at every step
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
        self.decoder = make_rnn(config.rnn_cell, 2 * D if self._wide_input else D, D, n_layers=L,
                                dropout=config.dropout)
        self.attention: Attention | None = None
        if config.attention != "none":
            score = make_state_score(config.attention, D, max_len=config.max_seq_len)  # cosine: strength sqrt(D)
            self.attention = Attention(score, window=config.attention_window, alignment=config.attention_alignment,
                                       d_query=D, hard=config.hard_attention,
                                       estimator=config.hard_attention_estimator)
        sutskever = config.attention == "none" and not self._fixed_context
        # W_c of h~_t = tanh(W_c [c_t; h_t]) (Bahdanau's order: [c_i; s_i; E y_{i-1}]); none for Sutskever's h~_t = h_t
        self.combine = None if sutskever else nn.Linear((3 if self._bahdanau else 2) * D, D, bias=False)
        self.reward_baseline = None
        if config.hard_attention and config.hard_attention_estimator == "reinforce":
            self.reward_baseline = RewardBaseline(config.reinforce_baseline_decay)
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
            RNNState(hidden (L, B, D), cell (L, B, D) | None, feed (B, D): zeros, or c with attention='none',
            memory (B, S, D), src_mask, step 0); the memory holds each row's real tokens first.
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
            if order is not None:  # positions must count real tokens for local attention and the location score
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
        # h~_0 = 0; attention='none' with c at every step: the fixed context c = h_0 of the top layer
        feed = hidden[-1] if self._fixed_context else enc.states.new_zeros(B, self.config.d_model)  # (B, D)
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

    def _step(self, y: Tensor, state: RNNState) -> tuple[Tensor, _Attended, RNNState]:
        # y: (B, D) embedded previous token -> h~_t (B, D), what attention gave (T = 1), the next state.
        hx = state.hidden if state.cell is None else (state.hidden, state.cell)
        if self._bahdanau:  # attend with s_{i-1}, then feed c_i into the RNN
            att = self._attend(state.hidden[-1].unsqueeze(1), state, state.step)  # context (B, 1, D)
            inp = torch.cat((y, att.context.squeeze(1)), dim=-1)  # (B, 2D) [E y_{i-1}; c_i]
            out, hx = self.decoder(inp.unsqueeze(1), hx)  # (B, 1, D): s_i
        else:  # Luong: step the RNN, then attend with h_t
            inp = torch.cat((y, state.feed), dim=-1) if self._wide_input else y  # (B, 2D) | (B, D)
            out, hx = self.decoder(inp.unsqueeze(1), hx)  # (B, 1, D): the top layer's h_t
            att = self._attend(out, state, state.step)  # context (B, 1, D)
        hidden, cell = hx if isinstance(hx, tuple) else (hx, None)
        h_tilde = self._readout(att.context, out, y.unsqueeze(1)).squeeze(1)  # (B, D)
        feed = h_tilde if self.attention is not None else state.feed  # none: c stays
        return h_tilde, att, RNNState(hidden, cell, feed, state.memory, state.src_mask, state.step + 1)

    def _attend(self, query: Tensor, state: RNNState, first_step: int) -> _Attended:
        # query: (B, T, D) the decoder states of steps first_step .. first_step + T - 1 -> contexts (B, T, D).
        if self.attention is None:  # the fixed context c (zeros and unused in the Sutskever variant)
            return _Attended(state.feed.unsqueeze(1).expand_as(query), None)
        T = query.shape[1]
        positions = torch.arange(first_step, first_step + T, device=query.device)  # (T,) local-m centres p_t = t
        out = self.attention(query, state.memory, attention_mask=state.src_mask, positions=positions,
                             need_weights=True)
        assert out.weights is not None
        return _Attended(out.output, out.weights, out.log_probs, out.entropy)

    def _readout(self, context: Tensor, h: Tensor, y: Tensor) -> Tensor:
        # context c_t, decoder state h_t, embedded previous token (all (B, T, D)) -> h~_t (B, T, D).
        if self.combine is None:  # Sutskever: predict from the decoder state itself
            return h
        parts = (context, h, y) if self._bahdanau else (context, h)
        return torch.tanh(self.combine(torch.cat(parts, dim=-1)))  # Luong eq. 5 | Bahdanau's readout

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
            output_attentions: also return the attention weights (B, T, S); an error with attention='none'.

        Returns:
            RNNSeq2SeqOutput(logits (B, T, V), last_hidden_state (B, T, D), memory (B, S, D), attentions,
            alignment_samples).
        """
        check_flag(output_attentions, "output_attentions")
        if output_attentions and self.attention is None:
            raise LmforgeError("this model has attention='none': there are no attention weights to return or draw "
                               "(the decoder reads one fixed context vector)")
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
        if self.attention is not None and self._wide_input:  # h~_{t-1} or c_i enters step t: one step at a time
            steps, atts = [], []
            for t in range(T):
                h_tilde_t, att_t, state = self._step(y[:, t], state)
                steps.append(h_tilde_t)
                atts.append(att_t)
            h_tilde = torch.stack(steps, dim=1)  # (B, T, D)
            att = _Attended(*(None if part[0] is None else torch.cat(part, dim=1)  # (B, T, ...) per field
                              for part in zip(*atts, strict=True)))
        else:  # the RNN input does not depend on earlier outputs: one RNN call over the whole target
            hx = state.hidden if state.cell is None else (state.hidden, state.cell)
            inp = torch.cat((y, state.feed.unsqueeze(1).expand_as(y)), dim=-1) if self._fixed_context else y
            out, _ = self.decoder(inp, hx)  # (B, T, D)
            att = self._attend(out, state, 0)  # contexts (B, T, D), weights (B, T, S)
            h_tilde = self._readout(att.context, out, y)  # (B, T, D)
        logits = self.lm_logits(self.dropout(h_tilde))  # (B, T, V)
        memory, w = state.memory, att.weights
        if order is not None:  # back to the layout of src_ids
            memory = torch.zeros_like(memory).scatter_(1, order.unsqueeze(-1).expand_as(memory), memory)
            if w is not None:
                w = torch.zeros_like(w).scatter_(-1, order.unsqueeze(1).expand_as(w), w)
        samples = None
        if att.log_probs is not None and att.entropy is not None:  # REINFORCE, in training
            assert self.reward_baseline is not None
            samples = SampledAlignments(att.log_probs, att.entropy, self.reward_baseline,
                                        self.config.reinforce_entropy)
        return RNNSeq2SeqOutput(logits, h_tilde, memory, w if output_attentions else None, samples)

    def extra_repr(self) -> str:
        c = self.config
        if c.attention == "none":
            return (f"rnn_cell={c.rnn_cell!r}, n_layers={c.n_layers}, d_model={c.d_model}, attention='none' "
                    f"({'fixed context at every step' if self._fixed_context else 'context in h_0 only'}), "
                    f"decoder_order={c.decoder_order!r}")
        where = "global" if c.attention_window is None else \
            f"local-{c.attention_alignment[0]}, window={c.attention_window}"
        hard = f", hard ({c.hard_attention_estimator})" if c.hard_attention else ""
        return (f"rnn_cell={c.rnn_cell!r}, n_layers={c.n_layers}, d_model={c.d_model}, "
                f"attention={c.attention!r} ({where}{hard}), input_feeding={c.input_feeding}, "
                f"decoder_order={c.decoder_order!r}")

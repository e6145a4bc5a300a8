"""ELMo: a bidirectional LSTM language model (``BiLM``, arch "bilm") and the task encoder that fine-tunes on its frozen
layers (``ELMoEncoder``, arch "elmo").

Peters et al. 2018, "Deep contextualized word representations" (NAACL); the biLM follows Jozefowicz et al. 2016,
"Exploring the Limits of Language Modeling" (char-CNN inputs, LSTM with projection) as ELMo does.

Shape legend: B batch, T tokens, C characters per token, D projection width (d_model), Dc LSTM cell width (d_cell),
V vocabulary, L LSTM layers.

``BiLM``::

    input_ids (B, T) ──► token layer x_k: char CNN over the spelled token (chars[input_ids]: (B, T, C)) + highway
                         + projection, or an embedding table                                   (B, T, D)
       forward LM:   L x LSTMP (cells Dc, projection D), left to right, residual from layer 2 on   f_{k,j} (B, T, D)
       backward LM:  L x LSTMP, right to left (each row's real tokens reversed), residual likewise  b_{k,j} (B, T, D)
       layers (what ELMo mixes): h_{k,0} = [x_k; x_k], h_{k,j} = [f_{k,j}; b_{k,j}]            L + 1 x (B, T, 2D)
       language models: p(t_{k+1} | t_1..t_k)  = softmax(W f_{k,L} + b)
                        p(t_{k-1} | t_k..t_N)  = softmax(W b_{k,L} + b)     one token layer, ONE softmax (W, b)
                                                                           shared by the two directions

So the forward state at k depends on tokens <= k only and the backward state on tokens >= k only: the two LMs never
see the token they predict. The loss (``lm_loss=True``) is the summed negative log-likelihood of each direction over
the real targets (the objective averages the two, section 3.1's joint log-likelihood); the full softmax, or with
``softmax_samples`` > 0 a sampled softmax during training (Jean et al. 2015; negatives shared by the batch,
accidental hits removed; evaluation always uses the full softmax). The negatives are drawn as bilm-tf draws them
(``softmax_sampler="log_uniform"``): tokens ranked by their frequency in the training corpus (``set_token_counts``;
rank r = 0 the most frequent), rank r with probability Q(r) = log((r + 2) / (r + 1)) / log(V + 1), and every logit
corrected by - log(K Q) (the expected count of its token among K draws with replacement; TensorFlow's sampler draws
without replacement, whose expected count differs slightly for the most frequent tokens). ``"uniform"``: every token
alike, where the correction is the same for all and cancels.

Tokens (``input_unit``): ``"word"`` (the presets'; ELMo and bilm-tf read whole words): the tokenizer is a
word-level vocabulary (``lmforge tokenizer train --algorithm words``: BERT's basic splitting on whitespace and
punctuation and its lower-casing, the most frequent words of the training corpus, every other word [UNK]), so each
token is a word, the char CNN spells whole words (the spelling table ``token_chars`` holds every vocabulary word)
and the softmax is over words; ``set_vocabulary`` refuses a vocabulary with ``##`` pieces. ``"piece"`` (a folder
without the key): the tokenizer's word pieces, each spelled with its ``##``.

Clipping (``cell_clip``, ``proj_clip``; the presets': 3 and 3, bilm-tf's): each LSTMP layer clips its cell c_t and
its projected output h_t to [-clip, clip] at every step, which PyTorch's fused ``nn.LSTM`` cannot do, so the layers
are then ``lmforge.nn.lstmp.ClippedLSTMP`` (the same parameter names and shapes, a loop over the steps); without
clipping (None or 0, a folder without the keys) they are ``nn.LSTM``.

``BiLM.stream_lm`` (``forward(..., stream=...)``) trains on consecutive windows of a stream, each direction carrying
its state from window to window (bilm-tf's stateful training): the forward LM reads its window left to right and
continues with the text to the right; the backward LM reads ITS window right to left and continues with the text to
the left, so the two read different windows of the same rows, from opposite ends (``lmforge.data.lm_stream``,
``bidirectional``; ``lmforge.objectives.bilm`` keeps the states, detached, and checkpoints them).

``BiLM.forward_lm`` runs the forward LM alone, its LSTM state carried from call to call (``lm_logits``,
``reorder_state``): what generation continues a prompt with (``lmforge generate`` on a biLM folder).

``ELMoEncoder`` (fine-tuning, section 3.3): the biLM frozen (no gradient, eval mode), its L + 1 layers mixed by a
learned ``ScalarMix`` (ELMo_k = gamma sum_j s_j h_{k,j}), then a task BiLSTM (width D) over [x_k; ELMo_k] and
attention pooling: the token head reads its states, the sequence head the pooled vector. x_k is the task's own
trainable token vector (``elmo_token_dim`` E wide); a new encoder (``wrap``) has E = d_model, the width of the
biLM's own token layer; ``elmo_token_dim=0`` reads ELMo_k alone (what a folder without the key does).

Deviations, named: a word outside the vocabulary (the corpus's frequent words) is [UNK] on input, where bilm-tf's
char CNN spells any word (the shards hold ids, not characters; a larger vocabulary spells more, with
``softmax_samples`` to keep the softmax cheap); the stream is documents joined by [SEP] (bilm-tf: <S> sentences </S>).
The output records (``BiLMOutput``, ``ForwardLMOutput``, ``StreamLMOutput``) live in ``lmforge.models.outputs``, the
sampled softmax in ``lmforge.nn.sampled_softmax``.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from lmforge.config import ModelConfig, from_dict, to_dict
from lmforge.errors import LmforgeError
from lmforge.models import PretrainedMixin
from lmforge.models.outputs import BiLMOutput, ForwardLMOutput, LSTMState, StreamLMOutput
from lmforge.nn.char_cnn import CharCNN, spell_tokens
from lmforge.nn.inputs import check_flag, check_input_ids
from lmforge.nn.lstmp import ClippedLSTMP, lstmp_layer
from lmforge.nn.masks import key_padding_mask
from lmforge.nn.rnn import AttentionPooling, StackedRNN, check_lstm_state, compact_padding, reorder_lstm_state
from lmforge.nn.sampled_softmax import log_uniform_log_q, log_uniform_ranks, sampled_softmax_nll
from lmforge.nn.scalar_mix import ScalarMix

__all__ = ["BiLM", "BiLMOutput", "ELMoEncoder", "ForwardLMOutput", "LSTMState", "StreamLMOutput", "log_uniform_log_q",
           "log_uniform_ranks", "sampled_softmax_nll"]

# PyTorch's CPU build warns on every LSTMP call that oneDNN has no projection kernel and its own kernel runs instead:
# nothing a user can act on, printed in the middle of progress bars
warnings.filterwarnings("ignore", message="LSTM with projections is not supported with oneDNN")


class BiLM(PretrainedMixin, nn.Module):
    """ELMo's biLM (Peters et al. 2018, section 3.1; Jozefowicz et al. 2016): see the module docstring.

    Config fields used: ``vocab_size``, ``d_model`` (D), ``d_cell`` (Dc, >= D; None = D: no projection),
    ``n_layers`` (L), ``dropout`` (on every LSTM layer's input and on the top states before the softmax),
    ``token_encoder``, ``d_char``, ``char_filters``, ``n_highway``, ``max_chars_per_token``, ``pad_token_id``,
    ``softmax_samples``. The LSTM is always an LSTM (``rnn_cell`` is the task BiLSTM's cell under ``ELMoEncoder``).

    State-dict keys: ``embeddings.*`` (the char CNN, or ``embeddings.weight`` (V, D)), ``token_chars`` (V, C) int16
    (chars only: the spelling of every vocabulary entry, filled by ``set_vocabulary``),
    ``layers.{l}.forward_lstm.*`` and ``layers.{l}.backward_lstm.*`` (one ``nn.LSTM`` each), ``softmax.weight``
    (V, D) / ``softmax.bias`` (V,).
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        D, V = config.d_model, config.vocab_size
        d_cell = config.d_cell or D
        if d_cell < D:
            raise LmforgeError(f"d_cell={d_cell} is narrower than the projection d_model={D}; an LSTMP projects its "
                               "cell down, so use d_cell >= d_model")
        self.chars = config.token_encoder == "chars"
        if self.chars:
            self.embeddings: nn.Module = CharCNN(config.d_char, config.char_filters, config.n_highway, D)
            self.register_buffer("token_chars", torch.zeros(V, config.max_chars_per_token, dtype=torch.int16))
        else:
            self.embeddings = nn.Embedding(V, D, padding_idx=config.pad_token_id)
        clips = {"cell_clip": config.cell_clip, "proj_clip": config.proj_clip}
        self.layers = nn.ModuleList(nn.ModuleDict({"forward_lstm": lstmp_layer(D, d_cell, D, **clips),
                                                   "backward_lstm": lstmp_layer(D, d_cell, D, **clips)})
                                    for _ in range(config.n_layers))
        self.dropout = nn.Dropout(config.dropout)
        self.softmax = nn.Linear(D, V)  # shared by both directions
        # the sampled softmax's frequency ranking (rank -> token id and back): not saved, the recipe sets it from the
        # training corpus (set_token_counts); id order until then
        self.register_buffer("frequency_order", torch.arange(V), persistent=False)
        self.register_buffer("frequency_rank", torch.arange(V), persistent=False)

    def set_vocabulary(self, tokens: Sequence[str]) -> None:
        """Spell the vocabulary for the char CNN (a no-op for an embedding table); called by the pretraining recipe
        with the tokenizer's entries in id order. The spelling is a buffer, saved with the weights.

        Raises:
            LmforgeError: more tokens than ``vocab_size``; word pieces (``##`` entries) for ``input_unit="word"``.
        """
        if len(tokens) > self.config.vocab_size:
            raise LmforgeError(f"{len(tokens)} tokens do not fit a vocabulary of {self.config.vocab_size}")
        pieces = [t for t in tokens if t.startswith("##")]
        if self.config.input_unit == "word" and pieces:
            raise LmforgeError(
                f"input_unit='word': the biLM reads whole words, but the tokenizer has {len(pieces)} word pieces "
                f"(e.g. {pieces[0]!r}); prepare the corpus with a word-level tokenizer (`lmforge tokenizer train "
                "--algorithm words --vocab-size N --min-frequency 3`, then `lmforge data prepare --tokenizer` it), or "
                "read the pieces with --model.input_unit=piece")
        if self.chars:
            table = spell_tokens(tokens, self.config.max_chars_per_token)
            with torch.no_grad():
                self.token_chars.zero_()
                self.token_chars[:len(tokens)] = table.to(self.token_chars.device)

    def set_token_counts(self, counts: Any) -> None:
        """Rank the vocabulary by ``counts`` (V,) (occurrences in the training corpus; ties by id) for the
        log-uniform sampled softmax; called by the pretraining recipe."""
        counts = torch.as_tensor(counts, dtype=torch.float64).flatten()
        if counts.numel() > self.config.vocab_size:
            raise LmforgeError(f"{counts.numel()} token counts do not fit a vocabulary of {self.config.vocab_size}")
        full = torch.zeros(self.config.vocab_size, dtype=torch.float64)
        full[:counts.numel()] = counts
        order = torch.sort(-full, stable=True).indices
        self.frequency_order.copy_(order)
        self.frequency_rank[order] = torch.arange(order.numel(), device=self.frequency_rank.device)

    def get_input_embeddings(self) -> nn.Module:
        """The token layer (an ``nn.Embedding`` (V, D) only with ``token_encoder="embedding"``)."""
        return self.embeddings

    def token_representation(self, input_ids: Tensor) -> Tensor:
        """x_k: (B, T) ids -> (B, T, D), context-free."""
        if not self.chars:
            return self.embeddings(input_ids)
        # the char CNN runs once per distinct token of the batch (the same vectors, a fraction of the work)
        unique, inverse = torch.unique(input_ids, return_inverse=True)  # (U,), (B, T)
        vectors = self.embeddings(self.token_chars[unique].unsqueeze(0)).squeeze(0)  # chars (1, U, C) -> (U, D)
        return vectors[inverse]  # (B, T, D)

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None,
                output_hidden_states: bool = False, lm_loss: bool = False,
                output_attentions: bool = False, *, stream: dict[str, Any] | None = None) -> BiLMOutput:
        """Run both language models over a padded batch (with ``stream``: ``stream_lm``, see there).

        Args:
            input_ids: (B, T) token ids in [0, vocab_size).
            attention_mask: (B, T) 1 = real token, 0 = padding (anywhere: the real tokens of a row are read in their
                order); default all real.
            token_type_ids: accepted and ignored (the fine-tuning collate passes segment ids to every backbone).
            output_hidden_states: also return the L + 1 layers ELMo mixes.
            lm_loss: also return each direction's summed NLL of its next (forward) / previous (backward) real token.
            output_attentions: accepted for the common encoder interface; a biLM has no attention (None).
            stream: ``{"labels", "backward_input_ids", "backward_labels", "state"}``: return
                ``stream_lm(input_ids, **stream)`` (a ``StreamLMOutput``) instead; through ``forward`` so that a
                DistributedDataParallel wrapper sees the call.

        Returns:
            ``BiLMOutput`` (see there).
        """
        if stream is not None:
            return self.stream_lm(input_ids, **stream)
        check_flag(output_hidden_states, "output_hidden_states")
        check_flag(output_attentions, "output_attentions")
        B, T = check_input_ids(input_ids, vocab_size=self.config.vocab_size)
        mask = torch.ones(B, T, dtype=torch.bool, device=input_ids.device) if attention_mask is None \
            else key_padding_mask(attention_mask, batch=B, length=T)  # (B, T) True = real
        order, lengths = compact_padding(mask)
        if order is not None:  # real tokens first: the backward LM then starts at each row's last real token
            input_ids = input_ids.gather(1, order)
        real = torch.arange(T, device=input_ids.device) < lengths.unsqueeze(-1)  # (B, T) right-padded layout
        x = self.token_representation(input_ids)  # (B, T, D)
        forward_states, backward_states = self._run(x, lengths)  # L x (B, T, D) each
        out: dict[str, object] = {}
        if lm_loss:
            f_top, b_top = self.dropout(forward_states[-1]), self.dropout(backward_states[-1])
            pairs = real[:, 1:] & real[:, :-1]  # (B, T-1): t and t+1 both real
            out["forward_nll"] = self._nll(f_top[:, :-1][pairs], input_ids[:, 1:][pairs])  # state k -> token k+1
            out["backward_nll"] = self._nll(b_top[:, 1:][pairs], input_ids[:, :-1][pairs])  # state k+1 -> token k
            out["n_predictions"] = pairs.sum()
        keep = real.unsqueeze(-1).to(x.dtype)  # (B, T, 1)
        layers = [torch.cat([x, x], -1) * keep] + [torch.cat([f, b], -1) * keep
                                                    for f, b in zip(forward_states, backward_states, strict=True)]
        if order is not None:  # back to the input layout
            layers = [torch.zeros_like(h).scatter_(1, order.unsqueeze(-1).expand_as(h), h) for h in layers]
        return BiLMOutput(layers[-1], None, tuple(layers) if output_hidden_states else None, None, **out)

    def _run(self, x: Tensor, lengths: Tensor) -> tuple[list[Tensor], list[Tensor]]:
        """The L forward and L backward layers over right-padded inputs (B, T, D); residual from layer 2 on."""
        T = x.shape[1]
        position = torch.arange(T, device=x.device).expand(x.shape[0], T)  # (B, T)
        # reversal of each row's real tokens (padding stays put): the backward LM reads right to left
        reverse = torch.where(position < lengths.unsqueeze(-1), lengths.unsqueeze(-1) - 1 - position, position)
        index = reverse.unsqueeze(-1).expand_as(x)
        f_in, b_in = x, x.gather(1, index)
        forward_states, backward_states = [], []
        for i, layer in enumerate(self.layers):
            f_out, _ = layer["forward_lstm"](self.dropout(f_in))  # (B, T, D), h_t from x_1..x_t
            b_out, _ = layer["backward_lstm"](self.dropout(b_in))  # (B, T, D), in reversed order
            if i > 0:  # residual connections between LSTM layers (Peters et al. 2018, section 3.4)
                f_out, b_out = f_out + f_in, b_out + b_in
            forward_states.append(f_out)
            backward_states.append(b_out.gather(1, index))  # the reversal is its own inverse
            f_in, b_in = f_out, b_out
        return forward_states, backward_states

    def _nll(self, h: Tensor, targets: Tensor) -> Tensor:
        """Summed NLL of ``targets`` (N,) from states ``h`` (N, D) under the shared softmax (sampled in training when
        ``softmax_samples`` > 0)."""
        k = self.config.softmax_samples
        if not (self.training and k > 0):
            return F.cross_entropy(self.softmax(h).float(), targets, reduction="sum")
        V = self.config.vocab_size
        if self.config.softmax_sampler == "uniform":  # the log Q correction is the same for every class and cancels
            negatives = torch.randint(V, (k,), device=h.device)  # (K,) shared
            return sampled_softmax_nll(h, self.softmax.weight, self.softmax.bias, targets, negatives)
        ranks = log_uniform_ranks(k, V, device=h.device)  # (K,)
        negatives = self.frequency_order[ranks]
        log_expected = lambda r: math.log(k) + log_uniform_log_q(r, V)  # noqa: E731
        return sampled_softmax_nll(h, self.softmax.weight, self.softmax.bias, targets, negatives,
                                   log_expected(self.frequency_rank[targets]), log_expected(ranks))

    # ------------------------------------------------------------------------------- consecutive stream windows
    def stream_lm(self, input_ids: Tensor, labels: Tensor, backward_input_ids: Tensor, backward_labels: Tensor,
                  state: dict[str, Any] | None = None) -> StreamLMOutput:
        """Both language models on consecutive windows of a stream, each carrying its LSTM state from the previous
        window (bilm-tf's stateful training; the pretraining objective keeps the state between calls).

        The two directions read DIFFERENT windows (``lmforge.data.lm_stream``, ``bidirectional``): the forward LM
        reads its stream left to right, so its next window is the text right of this one; the backward LM reads
        right to left, so its next window must be the text LEFT of this one, where its state (which ended on the
        window's first token) continues. Both windows are given in text order; every position is real.

        Args:
            input_ids, labels: (B, T) the forward window and its next tokens (labels[:, t] follows input_ids[:, t]).
            backward_input_ids, backward_labels: (B, T) the backward window, in text order, and its previous tokens
                (backward_labels[:, t] precedes backward_input_ids[:, t]).
            state: a previous call's ``state`` (each row continues its own text), or None for zero states.

        Returns:
            ``StreamLMOutput``: each direction's summed NLL, the number of targets, and the state to carry.
        """
        B, T = check_input_ids(input_ids, vocab_size=self.config.vocab_size)
        for name, t in (("labels", labels), ("backward_input_ids", backward_input_ids),
                        ("backward_labels", backward_labels)):
            if tuple(t.shape) != (B, T):
                raise LmforgeError(f"{name} has shape {tuple(t.shape)}; stream_lm needs (B, T) = {(B, T)} like "
                                   "input_ids")
        state = state or {}
        f_state = self._check_lm_state(state.get("forward"), B, "forward_lstm")
        b_state = self._check_lm_state(state.get("backward"), B, "backward_lstm")
        # one token layer for both windows (the backward one in its reading order, right to left)
        x = self.token_representation(torch.cat([input_ids, backward_input_ids.flip(1)]))  # (2B, T, D)
        f_top, f_state = self._direction("forward_lstm", x[:B], f_state)  # (B, T, D)
        b_top, b_state = self._direction("backward_lstm", x[B:], b_state)  # reading order
        b_top = b_top.flip(1)  # text order: b_top[:, t] has read backward_input_ids[:, t:]
        forward_nll = self._nll(self.dropout(f_top).flatten(0, 1), labels.flatten())
        backward_nll = self._nll(self.dropout(b_top).flatten(0, 1), backward_labels.flatten())
        n = torch.tensor(B * T, device=input_ids.device)
        return StreamLMOutput(forward_nll, backward_nll, n, {"forward": f_state, "backward": b_state})

    def _direction(self, direction: str, x: Tensor, state: LSTMState | None) -> tuple[Tensor, LSTMState]:
        """One direction's L layers over (B, T, D) inputs in its reading order, from ``state``: the top states and
        each layer's final (h, c). Dropout on each layer's input, residual from layer 2 on (as in ``_run``)."""
        h_in, new_state = x, []
        for i, layer in enumerate(self.layers):
            out, hc = layer[direction](self.dropout(h_in), None if state is None else state[i])
            if i > 0:
                out = out + h_in
            new_state.append(hc)
            h_in = out
        return h_in, new_state

    # ------------------------------------------------------------------------------------- the forward LM alone
    def forward_lm(self, input_ids: Tensor, attention_mask: Tensor | None = None, state: LSTMState | None = None,
                   output_hidden_states: bool = False) -> ForwardLMOutput:
        """Run the forward (left-to-right) language model alone, carrying its LSTM state: what generation steps.

        The states are those of ``forward`` (the first D columns of each layer [f_j; b_j]; residual from layer 2
        on, dropout on each layer's input when training); the backward LM does not run.

        Args:
            input_ids: (B, T) token ids.
            attention_mask: (B, T) 1 = real token, 0 = padding (anywhere: the real tokens of a row are read in their
                order); default all real. A row without real tokens keeps its state.
            state: the ``state`` of a previous call (the text so far); None = zero states (a new text).
            output_hidden_states: also return the L + 1 layers x, f_1 .. f_L.

        Returns:
            ``ForwardLMOutput``: the top states (B, T, D), 0 at padding, and each layer's (h, c) after each row's own
            last real token; ``lm_logits`` of a state gives the scores of the next token.
        """
        check_flag(output_hidden_states, "output_hidden_states")
        B, T = check_input_ids(input_ids, vocab_size=self.config.vocab_size)
        mask = torch.ones(B, T, dtype=torch.bool, device=input_ids.device) if attention_mask is None \
            else key_padding_mask(attention_mask, batch=B, length=T)  # (B, T) True = real
        state = self._check_lm_state(state, B)
        order, lengths = compact_padding(mask)
        if order is not None:  # real tokens first: each row's LSTM then stops at its own last token
            input_ids = input_ids.gather(1, order)
        real = torch.arange(T, device=input_ids.device) < lengths.unsqueeze(-1)  # (B, T) right-padded layout
        x = self.token_representation(input_ids)  # (B, T, D)
        ragged = not bool(real.all())
        layers, new_state = [x], []
        f_in = x
        for i, layer in enumerate(self.layers):
            hx = None if state is None else state[i]
            f_out, hc = self._run_forward_lstm(layer["forward_lstm"], self.dropout(f_in), lengths, hx, ragged)
            if i > 0:  # residual, as in _run
                f_out = f_out + f_in
            layers.append(f_out)
            new_state.append(hc)
            f_in = f_out
        keep = real.unsqueeze(-1).to(x.dtype)  # (B, T, 1)
        layers = [h * keep for h in layers]
        if order is not None:  # back to the input layout
            layers = [torch.zeros_like(h).scatter_(1, order.unsqueeze(-1).expand_as(h), h) for h in layers]
        return ForwardLMOutput(layers[-1], new_state, tuple(layers) if output_hidden_states else None)

    @staticmethod
    def _run_forward_lstm(lstm: nn.Module, x: Tensor, lengths: Tensor, hx: tuple[Tensor, Tensor] | None,
                          ragged: bool) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """One forward LSTM over right-padded ``x`` (B, T, D_in); the (h, c) after each row's last real token (a
        row of length 0 keeps ``hx``)."""
        if not ragged:
            out, (h, c) = lstm(x, hx)
            return out, (h, c)
        if isinstance(lstm, ClippedLSTMP):  # masks its own steps: a row of length 0 keeps hx
            return lstm(x, hx, lengths)
        B, T = x.shape[:2]
        rows = (lengths > 0).nonzero().flatten()  # pack_padded_sequence refuses empty rows
        if hx is None:
            width = lstm.proj_size or lstm.hidden_size
            hx = (x.new_zeros(1, B, width), x.new_zeros(1, B, lstm.hidden_size))
        packed = pack_padded_sequence(x[rows], lengths[rows].cpu(), batch_first=True, enforce_sorted=False)
        sub, (h, c) = lstm(packed, (hx[0][:, rows].contiguous(), hx[1][:, rows].contiguous()))
        sub, _ = pad_packed_sequence(sub, batch_first=True, total_length=T)  # (b, T, D), 0 at padding
        out = x.new_zeros(B, T, sub.shape[-1]).index_copy(0, rows, sub)
        return out, (hx[0].index_copy(1, rows, h), hx[1].index_copy(1, rows, c))

    def _check_lm_state(self, state: Any, B: int, direction: str = "forward_lstm") -> LSTMState | None:
        if state is None:
            return None
        lstms = [layer[direction] for layer in self.layers]
        return check_lstm_state(state, [((1, B, m.proj_size or m.hidden_size), (1, B, m.hidden_size)) for m in lstms])

    def lm_logits(self, h: Tensor) -> Tensor:
        """Next-token scores (..., V) from forward states h (..., D) (or previous-token scores from backward states):
        the softmax the two directions share."""
        return self.softmax(h)

    @staticmethod
    def reorder_state(state: LSTMState, index: Tensor) -> LSTMState:
        """Keep rows ``index`` (B',) of a ``forward_lm`` state, in that order (beam search, expanding prompts)."""
        return reorder_lstm_state(state, index)

    def extra_repr(self) -> str:
        c = self.config
        return (f"token_encoder={c.token_encoder!r}, n_layers={c.n_layers}, d_model={c.d_model}, "
                f"d_cell={c.d_cell or c.d_model}")


class ELMoEncoder(PretrainedMixin, nn.Module):
    """A task encoder on a frozen biLM (Peters et al. 2018, section 3.3): ELMo_k = ScalarMix(biLM layers), a task
    BiLSTM over it and attention pooling (Yang et al. 2016) for one vector per text.

    Config: the biLM's (arch "elmo" instead of "bilm"), plus ``elmo_layer_norm`` (normalise each layer before the
    mix), ``elmo_token_dim`` (E > 0: the task's own trainable token embedding, concatenated with ELMo_k as in the
    paper's [x_k; ELMo_k]; 0: the task RNN reads ELMo_k alone), ``elmo_rnn_layers``, ``rnn_cell`` /
    ``bidirectional`` (the task RNN: width D, D/2 per direction), ``attention`` (the pooling score) and ``dropout``
    (on the task RNN's input and between its layers).

    The biLM never trains: it runs without gradients and stays in eval mode (no dropout) whatever ``train()`` says,
    so its weights get no gradient and the optimizer leaves them as they are. The scalar mix (``mix.weights``,
    ``mix.gamma``), the task RNN and the pooler train with the head.

    State-dict keys: ``bilm.*`` (the frozen biLM, saved with the task model), ``mix.weights``, ``mix.gamma``,
    ``token_embeddings.weight`` (V, E; only with ``elmo_token_dim`` > 0), ``layers.{l}.*`` (the task BiLSTM),
    ``pooler.*``.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.bilm = BiLM(dataclasses.replace(config, arch="bilm"))
        self.bilm.requires_grad_(False)
        D = config.d_model
        self.mix = ScalarMix(config.n_layers + 1, layer_norm=config.elmo_layer_norm)
        E = config.elmo_token_dim
        # the task's own context-free token vector x_k beside ELMo_k (section 3.3: [x_k; ELMo_k]); trained
        self.token_embeddings = nn.Embedding(config.vocab_size, E, padding_idx=config.pad_token_id) if E else None
        self.dropout = nn.Dropout(config.dropout)
        self.layers = StackedRNN(config.rnn_cell, 2 * D + E, D, n_layers=config.elmo_rnn_layers,
                                 bidirectional=config.bidirectional, dropout=config.dropout)
        self.pooler = AttentionPooling(D, config.attention, max_len=config.max_seq_len)
        self.bilm.eval()

    @classmethod
    def wrap(cls, bilm: BiLM, **options: object) -> ELMoEncoder:
        """An encoder over the pretrained ``bilm`` (its weights copied), with ``options`` overriding config fields
        (e.g. ``elmo_layer_norm=True``).

        A new encoder has the paper's task input [x_k; ELMo_k] unless ``options`` say otherwise: ``elmo_token_dim``
        defaults to the biLM's ``d_model``, the width of its own context-free token layer x_k (128 for elmo-small,
        512 for elmo-original), so the task vector is as wide as the representation it stands beside the mix for;
        ``elmo_token_dim=0`` reads ELMo_k alone. (A saved ``elmo`` folder keeps its own value; one without the key
        loads with 0, as it was trained.)"""
        options = {"elmo_token_dim": bilm.config.d_model, **options}
        config = from_dict(ModelConfig, {**to_dict(bilm.config), **options, "arch": "elmo"}, where="ELMo options")
        encoder = cls(config)
        encoder.bilm.load_state_dict(bilm.state_dict())
        return encoder

    def train(self, mode: bool = True) -> ELMoEncoder:
        super().train(mode)
        self.bilm.eval()  # frozen features: no dropout in the biLM
        return self

    def get_input_embeddings(self) -> nn.Module:
        return self.bilm.get_input_embeddings()

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None,
                output_hidden_states: bool = False, output_attentions: bool = False):
        """
        Args:
            input_ids: (B, T) token ids.
            attention_mask: (B, T) 1 = real token, 0 = padding; default all real.
            token_type_ids: accepted and ignored.
            output_hidden_states: also return ELMo_k and every task RNN layer's output.
            output_attentions: also return the pooling weights (B, 1, 1, T).

        Returns:
            ``EncoderOutput``-shaped ``BiLMOutput``: last_hidden_state (B, T, D) the task BiLSTM's states,
            pooled_output (B, D), hidden_states (the task RNN's input: ELMo_k (B, T, 2D), or [x_k; ELMo_k]
            (B, T, E + 2D) with ``elmo_token_dim``, then the task RNN layers (B, T, D)) or None,
            attentions or None.
        """
        check_flag(output_attentions, "output_attentions")
        B, T = check_input_ids(input_ids, vocab_size=self.config.vocab_size)
        mask = None if attention_mask is None else key_padding_mask(attention_mask, batch=B, length=T)
        with torch.no_grad():
            layers = self.bilm(input_ids, mask, output_hidden_states=True).hidden_states  # L + 1 x (B, T, 2D)
        elmo = self.mix(layers, mask)  # (B, T, 2D)
        if self.token_embeddings is not None:
            elmo = torch.cat([self.token_embeddings(input_ids), elmo], dim=-1)  # (B, T, E + 2D)
        elmo = self.dropout(elmo)
        rnn = self.layers(elmo, mask, output_all_layers=output_hidden_states)
        pooled, weights = self.pooler(rnn.states, mask)  # (B, D), (B, T)
        hidden = (elmo, *rnn.layer_states) if rnn.layer_states is not None else None
        attentions = (weights[:, None, None, :],) if output_attentions else None
        return BiLMOutput(rnn.states, pooled, hidden, attentions)

    def extra_repr(self) -> str:
        return f"elmo_layer_norm={self.config.elmo_layer_norm}, elmo_rnn_layers={self.config.elmo_rnn_layers}"

"""The AWD-LSTM language model (Merity et al. 2018, "Regularizing and Optimizing LSTM Language Models") and ULMFiT's
use of it as a document encoder (Howard & Ruder 2018, "Universal Language Model Fine-tuning for Text
Classification"): ``--preset awd-lstm-small`` / ``awd-lstm``, ``config.arch = "awd_lstm"``.

Shape legend: B batch, T time steps, D embedding width (d_model; also the last layer's width, for the tied
decoder), H inner LSTM width (d_hidden), L layers, V vocabulary size, W the BPTT window (config.bptt).

    input_ids (B, T) ──► embedding, whole rows dropped (embed_p)                                  (B, T, D)
                     ──► variational dropout (input_p, one mask per row for all time steps)
                     ──► L weight-dropped LSTM layers D -> H -> ... -> H -> D (DropConnect on W_hh, weight_p),
                         variational dropout (hidden_p) between layers
                                                               = last_hidden_state (raw last layer) (B, T, D)
      language model ──► variational dropout (output_p) ──► tied decoder E^T + b   = logits        (B, T, V)
      classifier     ──► concat pooling [h_T; maxpool(H); meanpool(H)] over the real positions
                                                               = pooled_output                     (B, 3D)

One forward pass serves the language model (``logits``, computed when first read, so that the classifier never
builds a (B, T, V) tensor) and the classifier (``pooled_output``). Every dropout mask is drawn once per call.

Long inputs: BPT3C (ULMFiT section 3.3, "backpropagation through time for text classification"). The sequence is
read in windows of W tokens, the LSTM state carried from window to window. Windows that end before the last
``bpt3c_grad_len`` tokens run without a graph (their outputs still enter the pooling, as constants); the state
leaves them detached. The windows covering the last ``bpt3c_grad_len`` tokens keep their graph and the state flows
between them undetached, so the gradient reaches every pooled output of those windows and the recurrence among
them. Memory is therefore bounded by ``bpt3c_grad_len`` whatever the document's length (fastai's ``max_len``,
1440 = 20 x 72 tokens), and the forward values are exactly those of one pass over the whole document. A language
model batch (data.seq_len <= bpt3c_grad_len) is one graph: identical to an unwindowed pass.

State: ``state`` is a list of L pairs (h, c), each (1, B, width of the layer); ``None`` = zeros. The output's
``state`` is where each row stopped (after its last real token), so a language model can be trained with stateful
truncated BPTT (``lmforge.objectives.awd_lm`` carries it, detached, between consecutive windows) and generation
continues from it.

Masks follow ``lmforge.nn.masks``: ``attention_mask`` (B, T), 1 = real token, 0 = padding; padding must be on the
right (each row's real tokens first), as the fine-tuning collate and the stream data make it.

Backward model (``config.reverse = True``; ULMFiT sections 3.4 and 4, "bidirectional language model": a forward and
a backward model, each fine-tuned into a classifier, their predictions averaged): the same network reads each row's
real tokens right to left; the padding stays on the right, so callers pass text in its natural order with the same
masks. Inside, the ids are permuted into reading order (row i: x[n_i - 1], ..., x[0], then its padding), the stack
runs as above, and every per-position output is put back at its input position: ``last_hidden_state[:, k]`` has
read tokens k..n-1 (those >= k) and nothing before k, and ``logits[:, k]`` scores token k - 1, the previous one.
Concat pooling is taken in reading order, so its h_T is the state after the whole row (at input position 0); max
and mean do not depend on the order. ``state`` is where each row stopped, after its first token: the state that
continues the reading into the text to its left. BPT3C windows follow the reading order (the gradient reaches a
long document's first tokens, which are read last), as fastai's backward models on flipped text. A backward LM is
trained on the stream read right to left (``LMStreamData`` with ``reverse``, labels = the previous tokens), and
generation refuses it (it would write text backwards).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from lmforge.config import ModelConfig
from lmforge.errors import LmforgeError
from lmforge.models import PretrainedMixin

# As models/rnn_encoder.py: every text encoder returns the same output type, so heads and pipelines read one shape.
from lmforge.models.outputs import EncoderOutput
from lmforge.nn.dropouts import WeightDropLSTM, embedding_dropout, locked_mask
from lmforge.nn.inputs import check_flag, check_input_ids
from lmforge.nn.masks import key_padding_mask
from lmforge.nn.pooling import concat_pool
from lmforge.nn.rnn import check_lstm_state, reorder_lstm_state

__all__ = ["AWDLSTM", "AWDLSTMOutput", "LSTMState"]

LSTMState = list[tuple[Tensor, Tensor]]

# The embedding's initial range (``config.init_range``; every other weight is drawn as Merity et al.'s code and fastai
# draw it: the LSTM keeps PyTorch's U(-1/sqrt(H), 1/sqrt(H)) for weights and biases, the decoder bias is 0).
# Merity et al. and fastai (``AWD_LSTM.initrange``) draw U(-0.1, 0.1); lmforge's default is U(-1, 1) for Adam, and the
# paper's 0.1 (``--model.init_range=0.1``) goes with the paper's optimizer (SGD / NT-ASGD, lr 30, clipping 0.25).
# Why (issue 38; BENCHMARKS.md, "Issue 38: AWD-LSTM"): with a 0.1 embedding the input-dependent part of every
# gradient is about 10x weaker (the logits depend on the input through E^T J E_x: the scale squared), while the part
# that fits the unigram distribution through a constant LSTM output (logits E_v . h, h the same at every step) is not.
# SGD moves each weight in proportion to its gradient, so the LSTM hardly moves while the decoder bias learns the
# unigram, and then learns to read its input. Adam moves every weight by about lr per step whatever the size of its
# gradient, and the dominant direction for the LSTM's weights is the unigram one: within 20 steps its gates saturate
# on that constant output (toy LM: mean |h| 0.96, its variation over time 0.11, against 0.66 and 0.57 with U(-1, 1)),
# dh/dx vanishes and the input is never read. A plain PyTorch AWD-LSTM (none of lmforge's code) stalls the same way;
# dropout, clipping, Adam's eps and betas (fastai's 0.99 / 1e-5 included) and the rare rows of the embedding do not
# matter; freezing the LSTM for the first 40 Adam steps, or SGD at lr 30, escapes (benchmarks/bench_awd_init.py).
# On BBC News, awd-lstm-small with U(-0.1, 0.1) and AdamW (lr 3e-3, STLR) was still at the unigram loss after 1,000
# steps (held-out 6.99, the accuracy of always guessing the most frequent token); with U(-1, 1), 5.80 (perplexity
# 329); with U(-0.1, 0.1) and NT-ASGD at lr 30, 5.72 (305).


class AWDLSTMOutput(EncoderOutput):
    """An ``EncoderOutput`` (``last_hidden_state`` (B, T, D), ``pooled_output`` (B, 3D), ``hidden_states``,
    ``attentions`` = None) that also carries ``state`` (where each row stopped) and the language model's ``logits``
    (B, T, V), computed on first access (output dropout in training, then the tied decoder)."""

    # No __slots__: the instance keeps ``state`` and the decoder beside the tuple's fields.

    @property
    def logits(self) -> Tensor:
        cached = self.__dict__.get("_logits")
        if cached is None:
            dropped, cached = self.__dict__["_decode"](self.last_hidden_state)
            self.__dict__.update(_logits=cached, _dropped=dropped)
        return cached

    @property
    def dropped_output(self) -> Tensor:
        """(B, T, D) the last layer's output after output dropout: what the decoder reads (and what Merity et al.'s
        activation regularisation penalises)."""
        self.logits  # noqa: B018 -- computes both on first access
        return self.__dict__["_dropped"]

    @property
    def state(self) -> LSTMState:
        return self.__dict__["_state"]


class AWDLSTM(PretrainedMixin, nn.Module):
    """The ASGD weight-dropped LSTM language model (Merity et al. 2018), the backbone of ULMFiT (Howard & Ruder 2018).

    Config fields used: ``vocab_size``, ``d_model`` (D: embedding width, the last layer's width), ``d_hidden`` (H),
    ``n_layers`` (L >= 1), ``embed_p``, ``input_p``, ``hidden_p``, ``weight_p``, ``output_p`` (fastai's AWD-LSTM
    classifier defaults 0.05, 0.4, 0.3, 0.5, 0.4), ``bptt`` and ``bpt3c_grad_len`` (BPT3C), ``pad_token_id`` (a
    zero embedding row), ``reverse`` (a backward model: each row read right to left). The embedding is always tied
    to the decoder (Inan et al. 2017; Press & Wolf 2017), as in the paper; ``tie_embeddings=False`` is refused. Not
    used: the Transformer fields, ``rnn_cell`` (always LSTM), ``bidirectional`` (a backward LM is this model with
    ``reverse=True``: see the module docstring), ``dropout``.

    Initialisation (new models only; a loaded folder keeps its weights): embedding U(-init_range, init_range) with a
    zero padding row (default 1.0 for Adam; the paper's 0.1 for SGD / NT-ASGD: see the comment above
    ``AWDLSTMOutput`` for why), decoder bias 0, LSTM PyTorch's default U(-1/sqrt(H), 1/sqrt(H)).

    State-dict keys: ``embeddings.weight`` (V, D), ``layers.{l}.rnn.{weight,bias}_{ih,hh}_l0``, ``lm_bias`` (V,); the
    layer groups of discriminative fine-tuning and gradual unfreezing are ``embeddings``, ``layers.{l}``, and what
    sits above (``lm_bias``, a task head).
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        if not config.tie_embeddings:
            raise LmforgeError("the AWD-LSTM always ties its decoder to the embedding (its last layer has the "
                               "embedding's width); set tie_embeddings=true")
        self.config = config
        D, H, L = config.d_model, config.d_hidden, config.n_layers
        self.embeddings = nn.Embedding(config.vocab_size, D, padding_idx=config.pad_token_id)
        widths = [D] + [H] * (L - 1) + [D]
        self.layers = nn.ModuleList(WeightDropLSTM(widths[i], widths[i + 1], config.weight_p) for i in range(L))
        self.lm_bias = nn.Parameter(torch.zeros(config.vocab_size))
        with torch.no_grad():
            nn.init.uniform_(self.embeddings.weight, -config.init_range, config.init_range)
            self.embeddings.weight[config.pad_token_id].zero_()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embeddings

    def get_output_embeddings(self) -> nn.Embedding:
        return self.embeddings  # tied

    @property
    def pooled_dim(self) -> int:
        """The width of ``pooled_output``: 3 D (concat pooling)."""
        return 3 * self.config.d_model

    # ------------------------------------------------------------------------------------------ the forward pass
    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        *,
        state: LSTMState | None = None,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
    ) -> AWDLSTMOutput:
        """Run the LSTM stack over a batch (see the module docstring).

        Args:
            input_ids: (B, T) token ids in [0, vocab_size).
            attention_mask: (B, T), 1 = real token, 0 = padding on the right; None = all real.
            token_type_ids: accepted and ignored (the fine-tuning collate passes segment ids to every backbone).
            state: the LSTM state to start from (a previous output's ``state``); None = zeros.
            output_hidden_states: also return the embedding output and every layer's output (inner layers are H
                wide).
            output_attentions: accepted for the common interface; an LSTM has no attention weights (None).

        Returns:
            ``AWDLSTMOutput``: last_hidden_state (B, T, D) (0 at padding), pooled_output (B, 3D), hidden_states or
            None, attentions None, ``state``, ``logits`` (B, T, V) on access. With ``config.reverse`` the outputs
            stay at their input positions and each has read the tokens at and after it (module docstring).

        Raises:
            LmforgeError: bad ids or mask, padding on the left or inside a row, a state of the wrong shape.
        """
        cfg = self.config
        B, T = check_input_ids(input_ids, vocab_size=cfg.vocab_size)
        check_flag(output_hidden_states, "output_hidden_states")
        check_flag(output_attentions, "output_attentions")
        mask, lengths = self._lengths(attention_mask, B, T)
        state = self._check_state(state, B, input_ids.device)
        order = self._reading_order(lengths, B, T, input_ids.device) if cfg.reverse else None
        if order is not None:  # a backward LM: each row's real tokens right to left, padding still on the right
            input_ids = input_ids.gather(1, order)
        # every mask drawn once for the whole call (all windows): the same dropped words, units and connections
        embedding = embedding_dropout(self.embeddings.weight, cfg.embed_p, self.training)  # (V, D)
        first = next(self.parameters())
        drop_in = locked_mask(B, cfg.d_model, cfg.input_p, self.training, first)  # (B, 1, D) or None
        drop_hidden = [locked_mask(B, layer.rnn.hidden_size, cfg.hidden_p, self.training, first)
                       for layer in self.layers[:-1]]
        weights = [layer.dropped_weight() for layer in self.layers]
        # BPT3C: windows of W tokens; those ending before the last bpt3c_grad_len tokens run without a graph
        W = cfg.bptt
        grad_from = max(0, T - cfg.bpt3c_grad_len) if torch.is_grad_enabled() else 0
        pieces: list[list[Tensor]] = []
        for s in range(0, T, W):
            e = min(s + W, T)
            no_graph = e <= grad_from
            with torch.no_grad() if no_graph else contextlib.nullcontext():
                n = None if lengths is None else (lengths - s).clamp(0, e - s)  # (B,) real tokens in the window
                x = F.embedding(input_ids[:, s:e], embedding, cfg.pad_token_id)  # (B, w, D)
                outs, state = self._window(x, n, state, drop_in, drop_hidden, weights)
            pieces.append(outs)
        layer_outputs = [torch.cat([p[i] for p in pieces], dim=1) for i in range(len(pieces[0]))]
        h = layer_outputs[-1]  # (B, T, D) the raw last layer
        pooled = concat_pool(h, mask)  # (B, 3D); reversed: h_T in reading order, the state after the first token
        if order is not None:  # back to the input's positions (the reading order is its own inverse)
            layer_outputs = [o.gather(1, order[:, :, None].expand_as(o)) for o in layer_outputs]
            h = layer_outputs[-1]
        hidden_states = tuple(layer_outputs) if output_hidden_states else None
        out = AWDLSTMOutput(h, pooled, hidden_states, None)
        out.__dict__.update(_state=state, _decode=self._dropped_and_logits)
        return out

    def _window(self, x: Tensor, n: Tensor | None, state: LSTMState | None, drop_in: Tensor | None,
                drop_hidden: list[Tensor | None], weights: list[Tensor | None]) -> tuple[list[Tensor], LSTMState]:
        """One BPTT window: x (B, w, D), n (B,) real tokens per row (None = all). Returns the embedding output and
        each layer's output (each (B, w, width), 0 past a row's end), and the new state."""
        B, w, _ = x.shape
        if drop_in is not None:
            x = x * drop_in
        outputs = [x]
        new_state: LSTMState = []
        active = None if n is None or bool((n == w).all()) else (n > 0).nonzero().flatten()  # rows with tokens
        for i, layer in enumerate(self.layers):
            hx = None if state is None else state[i]
            if active is None:
                y, hx_new = layer(x, hx, weights[i])  # (B, w, width)
            else:
                y, hx_new = self._run_ragged(layer, x, n, active, hx, weights[i])
            new_state.append(hx_new)
            if i < len(self.layers) - 1 and drop_hidden[i] is not None:
                x = y * drop_hidden[i]
            else:
                x = y
            outputs.append(y)
        return outputs, new_state

    @staticmethod
    def _run_ragged(layer: WeightDropLSTM, x: Tensor, n: Tensor, active: Tensor, hx: tuple[Tensor, Tensor] | None,
                    weight: Tensor | None) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """Run the rows that have tokens in this window, each for its own length (packed: padding never enters the
        recurrence); the other rows keep their state."""
        B, w, _ = x.shape
        width = layer.rnn.hidden_size
        if hx is None:
            hx = (x.new_zeros(1, B, width), x.new_zeros(1, B, width))
        y = x.new_zeros(B, w, width)
        if len(active) == 0:
            return y, hx
        packed = pack_padded_sequence(x[active], n[active].cpu(), batch_first=True, enforce_sorted=False)
        sub = (hx[0][:, active], hx[1][:, active])
        out, (h, c) = layer(packed, sub, weight)
        out, _ = pad_packed_sequence(out, batch_first=True, total_length=w)  # (b, w, width)
        y = y.index_copy(0, active, out)
        return y, (hx[0].index_copy(1, active, h), hx[1].index_copy(1, active, c))

    def lm_logits(self, h: Tensor) -> Tensor:
        """Next-token scores from last-layer states: output dropout (variational over (B, T, D) in training), then the
        tied decoder. h (..., D) -> (..., V)."""
        return self._dropped_and_logits(h)[1]

    def _dropped_and_logits(self, h: Tensor) -> tuple[Tensor, Tensor]:
        """(h after output dropout, its logits) (see ``lm_logits``)."""
        if h.dim() == 3:
            mask = locked_mask(h.shape[0], h.shape[-1], self.config.output_p, self.training, h)
            if mask is not None:
                h = h * mask
        return h, F.linear(h, self.embeddings.weight, self.lm_bias)

    # ------------------------------------------------------------------------------------------ state and checks
    @staticmethod
    def _reading_order(lengths: Tensor | None, B: int, T: int, device: torch.device) -> Tensor:
        """(B, T): the input position read at each step of a backward model: a row's real tokens last to first,
        then its padding where it was. The permutation is its own inverse."""
        position = torch.arange(T, device=device).expand(B, T)
        if lengths is None:
            return position.flip(1)
        n = lengths[:, None]
        return torch.where(position < n, n - 1 - position, position)

    def _lengths(self, attention_mask: Tensor | None, B: int, T: int) -> tuple[Tensor | None, Tensor | None]:
        """(mask (B, T) bool, lengths (B,)) or (None, None) without padding; refuses padding that is not on the
        right."""
        if attention_mask is None:
            return None, None
        mask = key_padding_mask(attention_mask, batch=B, length=T)
        lengths = mask.sum(1)
        if bool((lengths == 0).any()):
            raise LmforgeError("a row of input_ids is all padding (attention_mask all 0); every row needs a token")
        prefix = torch.arange(T, device=mask.device)[None, :] < lengths[:, None]
        if not torch.equal(prefix, mask):
            raise LmforgeError("the AWD-LSTM reads padding on the right only (each row's real tokens first, as "
                               "attention_mask 1 1 1 0 0); move the padding to the end of the rows")
        if bool(mask.all()):
            return None, None
        return mask, lengths

    def _check_state(self, state: Any, B: int, device: torch.device) -> LSTMState | None:
        if state is None:
            return None
        return check_lstm_state(state, [((1, B, layer.rnn.hidden_size),) * 2 for layer in self.layers])

    @staticmethod
    def detach_state(state: LSTMState) -> LSTMState:
        """The state without its graph: truncated BPTT between consecutive windows."""
        return [(h.detach(), c.detach()) for h, c in state]

    @staticmethod
    def reorder_state(state: LSTMState, index: Tensor) -> LSTMState:
        """Keep rows ``index`` (B',) in that order (beam search, expanding prompts into samples)."""
        return reorder_lstm_state(state, index)

    def extra_repr(self) -> str:
        c = self.config
        return (f"vocab_size={c.vocab_size}, d_model={c.d_model}, d_hidden={c.d_hidden}, n_layers={c.n_layers}, "
                f"dropouts(embed={c.embed_p}, input={c.input_p}, hidden={c.hidden_p}, weight={c.weight_p}, "
                f"output={c.output_p}), bptt={c.bptt}")

"""Recurrent blocks: a stacked (bi)directional GRU/LSTM over padded batches, and attention pooling.

Shape legend: B batch, T sequence length, Din input width, D output width (d_model), Dh hidden width per
direction (D, or D / 2 when bidirectional), L stacked layers.

Masks follow ``lmforge.nn.masks``: ``attention_mask`` (B, T) with 1 = real token, 0 = padding (bool, integer or
0./1. float). Padding may sit anywhere: the real tokens of each row are read in their order and the padding is
skipped (``pack_padded_sequence``), so a padded batch gives exactly the outputs of its rows run one by one.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

from lmforge.errors import LmforgeError
from lmforge.nn.generic_attention import Attention
from lmforge.nn.masks import key_padding_mask
from lmforge.nn.scores import CosineScore, make_score

__all__ = ["CELLS", "AttentionPooling", "RNNOutput", "StackedRNN", "check_lstm_state", "compact_padding", "make_rnn",
           "make_state_score", "reorder_lstm_state"]

CELLS: dict[str, type[nn.RNNBase]] = {"gru": nn.GRU, "lstm": nn.LSTM}


def make_rnn(cell: str, d_input: int, d_hidden: int, *, n_layers: int = 1, bidirectional: bool = False,
             dropout: float = 0.0) -> nn.RNNBase:
    """A batch-first ``nn.GRU`` or ``nn.LSTM`` by name.

    Args:
        cell: 'gru' (Cho et al. 2014) or 'lstm' (Hochreiter & Schmidhuber 1997).
        d_input: Din.
        d_hidden: hidden width per direction.
        n_layers: stacked layers inside the one module.
        bidirectional: also run right to left.
        dropout: between stacked layers (not after the last), as ``nn.GRU``'s own argument.

    Returns:
        The module (batch_first=True).
    """
    if cell not in CELLS:
        raise LmforgeError(f"unknown RNN cell {cell!r}; choose one of {', '.join(CELLS)}")
    return CELLS[cell](d_input, d_hidden, num_layers=n_layers, bidirectional=bidirectional,
                       dropout=dropout if n_layers > 1 else 0.0, batch_first=True)


def make_state_score(name: str, d_model: int, *, max_len: int | None = None) -> nn.Module:
    """A scoring function between RNN states of width D (queries and keys alike), by name.

    As ``lmforge.nn.scores.make_score`` with d_q = d_k = D and the additive hidden width A = D, except for
    'cosine': its strength is beta = sqrt(D) instead of 1. Why: RNN states are bounded (|h_i| <= 1), so with
    beta = 1 the scores stay in [-1, 1] and the softmax can never concentrate (a toy reversal task stalled below
    100% for 500 steps); sqrt(D) makes cosine the norm-free version of the scaled dot product (for states of
    unit-variance entries, q . k / sqrt(D) ~ cos(q, k) sqrt(D)). Graves et al. (2014) emit beta from the controller.

    Args:
        name: one of ``lmforge.nn.scores.SCORES``.
        d_model: D.
        max_len: longest source ('location').

    Returns:
        A module with ``forward(q, k) -> (..., Tq, Tk)``.
    """
    if name == "cosine":
        return CosineScore(scale=math.sqrt(d_model))
    return make_score(name, d_q=d_model, d_k=d_model, d_attn=d_model, max_len=max_len)


def check_lstm_state(state: Any, shapes: list[tuple[tuple[int, ...], tuple[int, ...]]]) -> list[tuple[Tensor, Tensor]]:
    """A stack of LSTMs' carried state, checked: one (h, c) pair per layer, of the ``shapes`` given (per layer
    (h shape, c shape)); as a list of tuples.

    Raises:
        LmforgeError: another number of layers, or tensors of other shapes (the state of another batch or model).
    """
    if not isinstance(state, list | tuple) or len(state) != len(shapes):
        raise LmforgeError(f"state must be a list of {len(shapes)} (h, c) pairs, one per LSTM layer (the .state of a "
                           "previous call)")
    for pair, want in zip(state, shapes, strict=True):
        got = [tuple(getattr(t, "shape", ())) for t in pair] if isinstance(pair, list | tuple) else pair
        if not isinstance(pair, list | tuple) or len(pair) != 2 or got != list(want):
            raise LmforgeError(f"state tensors must be (h, c) of shapes {list(want)}; got {got}: the state belongs to "
                               "another batch size or model")
    return [(h, c) for h, c in state]


def reorder_lstm_state(state: list[tuple[Tensor, Tensor]], index: Tensor) -> list[tuple[Tensor, Tensor]]:
    """Keep rows ``index`` (B',) of a per-layer (h (1, B, .), c (1, B, .)) state, in that order (beam search,
    expanding prompts into samples)."""
    return [(h.index_select(1, index), c.index_select(1, index)) for h, c in state]


def compact_padding(mask: Tensor) -> tuple[Tensor | None, Tensor]:
    """Where each row's real tokens go when moved to the front, keeping their order.

    Args:
        mask: (B, T) bool, True = real token.

    Returns:
        ``(order, lengths)``: ``order`` (B, T) long such that ``x.gather(1, order)`` puts the real tokens first
        (None when every row is already right-padded: nothing to move); ``lengths`` (B,) long real-token counts.
    """
    lengths = mask.sum(-1)  # (B,)
    prefix = torch.arange(mask.shape[-1], device=mask.device) < lengths.unsqueeze(-1)  # (B, T) right-padded layout
    if bool((prefix == mask).all()):
        return None, lengths
    # A stable sort on "is padding" keeps the real tokens (and the padding) in their order.
    order = torch.sort((~mask).to(torch.uint8), dim=-1, stable=True).indices  # (B, T)
    return order, lengths


class RNNOutput(NamedTuple):
    """What ``StackedRNN.forward`` returns.

    Attributes:
        states: (B, T, D) the last layer's output at every position (both directions concatenated); exactly 0
            at padded positions.
        hidden: (L, B, D) each layer's final state: [forward state after the last real token; backward state
            after the first real token] when bidirectional.
        cell: (L, B, D) the LSTM memory cells in the same layout, or None for a GRU.
        layer_states: with ``output_all_layers``, the L per-layer outputs (B, T, D) (the last is ``states``).
    """

    states: Tensor
    hidden: Tensor
    cell: Tensor | None = None
    layer_states: tuple[Tensor, ...] | None = None


class StackedRNN(nn.ModuleList):
    """L stacked (bi)directional GRU/LSTM layers over padded batches: the bidirectional RNN encoder of Schuster &
    Paliwal 1997, used by Bahdanau et al. 2015 ("annotations" h_j = [->h_j; <-h_j]) and Luong et al. 2015.

    Each entry is a one-layer ``nn.GRU``/``nn.LSTM`` so that parameters are named ``{l}.weight_ih_l0`` (and
    ``{l}.weight_ih_l0_reverse``): a model holding this list as ``layers`` gets the ``layers.{l}.*`` names that
    layer-wise freezing and learning-rate decay read. Dropout acts between layers, not after the last one (like
    ``nn.GRU``'s own ``dropout``). Sequences are packed (``pack_padded_sequence``), so padding never enters the
    recurrence and the backward direction starts at each row's last real token.

    Rows without any real token are run on one padding token (packing needs length >= 1); their outputs are
    zeroed and their final states are meaningless but finite.
    """

    def __init__(self, cell: str, d_input: int, d_model: int, *, n_layers: int = 1, bidirectional: bool = True,
                 dropout: float = 0.0) -> None:
        """
        Args:
            cell: 'gru' or 'lstm'.
            d_input: Din, width of the inputs.
            d_model: D, output width; each direction gets D / 2 when bidirectional (D must then be even).
            n_layers: L.
            bidirectional: run each layer in both directions.
            dropout: on the inputs of layers 2..L.
        """
        if bidirectional and d_model % 2:
            raise LmforgeError(f"a bidirectional RNN splits d_model={d_model} between two directions; use an even "
                               "d_model")
        if n_layers < 1:
            raise LmforgeError(f"an RNN needs n_layers >= 1; got {n_layers}")
        d_hidden = d_model // 2 if bidirectional else d_model
        super().__init__(make_rnn(cell, d_input if i == 0 else d_model, d_hidden, bidirectional=bidirectional)
                         for i in range(n_layers))
        # A plain float, not an nn.Dropout: every submodule of a ModuleList is one of its entries.
        self.cell, self.d_model, self.bidirectional, self.dropout = cell, d_model, bidirectional, dropout

    def forward(self, x: Tensor, attention_mask: Tensor | None = None, output_all_layers: bool = False
                ) -> RNNOutput:
        """Run the stack over a padded batch.

        Args:
            x: (B, T, Din) inputs.
            attention_mask: (B, T) 1 = real token, 0 = padding (anywhere); None = all real.
            output_all_layers: also return every layer's output.

        Returns:
            RNNOutput(states (B, T, D), hidden (L, B, D), cell (L, B, D) | None, layer_states). States start at
            zero, as in the papers.
        """
        if x.dim() != 3:
            raise LmforgeError(f"RNN inputs must be (batch, length, width); got {tuple(x.shape)}")
        B, T, _ = x.shape
        mask = None if attention_mask is None else key_padding_mask(attention_mask, batch=B, length=T)  # (B, T)
        order, lengths = (None, torch.full((B,), T, dtype=torch.long)) if mask is None else compact_padding(mask)
        if order is not None:
            x = x.gather(1, order.unsqueeze(-1).expand_as(x))  # (B, T, Din) real tokens first
        # Packing wants CPU lengths >= 1; an empty row runs on one (padding) token and is zeroed below.
        packed = pack_padded_sequence(x, lengths.clamp(min=1).cpu(), batch_first=True,
                                      enforce_sorted=False)
        finals, cells, per_layer = [], [], []
        for i, rnn in enumerate(self):
            if i > 0:  # dropout between layers, on the packed data (padding never exists in packed form)
                data = F.dropout(packed.data, self.dropout, self.training)
                packed = PackedSequence(data, packed.batch_sizes, packed.sorted_indices,
                                        packed.unsorted_indices)
            packed, state = rnn(packed)
            h, c = state if isinstance(state, tuple) else (state, None)  # (dirs, B, Dh) each
            finals.append(self._join(h))
            if c is not None:
                cells.append(self._join(c))
            if output_all_layers and i < len(self) - 1:
                per_layer.append(self._unpack(packed, T, order, mask))
        states = self._unpack(packed, T, order, mask)  # (B, T, D)
        hidden = torch.stack(finals)  # (L, B, D)
        cell = torch.stack(cells) if cells else None
        return RNNOutput(states, hidden, cell, (*per_layer, states) if output_all_layers else None)

    def _join(self, h: Tensor) -> Tensor:
        # (dirs, B, Dh) -> (B, D): [forward final; backward final] (nn.GRU returns them in batch order).
        return torch.cat(tuple(h), dim=-1) if self.bidirectional else h[0]

    @staticmethod
    def _unpack(packed: PackedSequence, T: int, order: Tensor | None, mask: Tensor | None) -> Tensor:
        y, _ = pad_packed_sequence(packed, batch_first=True, total_length=T)  # (B, T, D), zeros after each length
        if order is not None:  # back to the input layout: y[b, j] belongs at position order[b, j]
            y = torch.zeros_like(y).scatter_(1, order.unsqueeze(-1).expand_as(y), y)
        if mask is not None:
            y = y * mask.unsqueeze(-1).to(y.dtype)  # empty rows were run on one padding token: zero them
        return y

    def extra_repr(self) -> str:
        return (f"cell={self.cell!r}, d_model={self.d_model}, bidirectional={self.bidirectional}, "
                f"dropout={self.dropout}")


class AttentionPooling(nn.Module):
    """Attention pooling of a sequence into one vector with a trainable query: Yang et al. 2016, "Hierarchical
    Attention Networks for Document Classification" (the word-level context vector u_w); the lectures' use case
    of attention for classification.

    pooled = sum_t a_t h_t, a = masked softmax_t score(u, h_t), with keys = values = the states h_t and the query
    u a learned D-vector. With the 'additive' score this is exactly Yang et al.'s u_w^T tanh(W h_t + b) (the
    query term W_q u is a learned bias); 'dot', 'scaled_dot', 'general' and 'cosine' score u against h_t
    directly ('cosine' with strength sqrt(D), see ``make_state_score``). 'location' (Luong et al. 2015,
    a = softmax(W_a u)) ignores the content: with a constant query it is a learned weighting of the positions
    0 .. max_len - 1 (renormalised over each row's real tokens). Positions count real tokens (padding anywhere is
    skipped), so a row gets the same weights alone or inside a padded batch, whatever the score.
    """

    def __init__(self, d_model: int, score: str = "dot", *, max_len: int | None = None) -> None:
        """
        Args:
            d_model: D, width of the states (and of the query).
            score: a name in ``lmforge.nn.scores.SCORES``.
            max_len: longest sequence (needed by 'location').
        """
        super().__init__()
        if score == "location" and max_len is None:
            raise LmforgeError("attention pooling with the 'location' score needs max_len (the longest sequence)")
        self.query = nn.Parameter(torch.empty(d_model))  # u: (D,)
        nn.init.uniform_(self.query, -0.1, 0.1)  # not zero: the cosine score has no gradient at u = 0
        self.attention = Attention(make_state_score(score, d_model, max_len=max_len))
        self.score_name = score

    def forward(self, states: Tensor, attention_mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """
        Args:
            states: (B, T, D) keys and values.
            attention_mask: (B, T) 1 = real token, 0 = padding; None = all real.

        Returns:
            ``(pooled (B, D), weights (B, T))``; the weights of a row sum to 1 over its real tokens (a row without
            any gets zero weights and a zero vector).
        """
        B, T, D = states.shape
        mask, order = None, None
        if attention_mask is not None:
            mask = key_padding_mask(attention_mask, batch=B, length=T)  # (B, T) bool
            order, lengths = compact_padding(mask)
            if order is not None:  # real tokens first, so that 'location' positions count real tokens
                states = states.gather(1, order.unsqueeze(-1).expand_as(states))
                mask = torch.arange(T, device=mask.device) < lengths.unsqueeze(-1)  # (B, T) right-padded
        query = self.query.to(states.dtype).expand(B, 1, D)  # (B, 1, D)
        out = self.attention(query, states, attention_mask=mask, need_weights=True)
        assert out.weights is not None
        weights = out.weights.squeeze(1)  # (B, T)
        if order is not None:  # back to the input layout
            weights = torch.zeros_like(weights).scatter_(1, order, weights)
        return out.output.squeeze(1), weights  # (B, D), (B, T)

    def extra_repr(self) -> str:
        return f"d_model={self.query.shape[0]}, score={self.score_name!r}"

"""The dropouts of the AWD-LSTM (Merity et al. 2018, "Regularizing and Optimizing LSTM Language Models", section 4):
embedding dropout, variational ("locked") dropout and the weight-dropped LSTM (DropConnect on the recurrent matrix).

Shape legend: B batch, T time steps, D feature width, V vocabulary size, H hidden width.

Every mask is drawn ONCE per forward call and then reused, which is what makes these dropouts differ from
``nn.Dropout``:

- ``embedding_dropout``: a (V, 1) mask over the embedding matrix, so a dropped word loses its whole vector at every
  position of the batch (Gal & Ghahramani 2016); kept rows are scaled by 1 / (1 - p).
- ``locked_mask`` / ``LockedDropout``: a (B, 1, D) mask broadcast over time, so each sequence loses the same units
  at every time step (variational dropout, Gal & Ghahramani 2016); scaled by 1 / (1 - p).
- ``WeightDropLSTM``: one ``nn.LSTM`` layer whose hidden-to-hidden matrix W_hh is replaced, for the call, by
  ``dropout(W_hh)`` (DropConnect, Wan et al. 2013): the same dropped connections at every time step and every row
  of the batch. The layer runs through ``torch.func.functional_call``, so PyTorch's fused LSTM kernel still does the
  recurrence (on 2 CPU cores a 400 -> 1150 layer over 32 x 70 tokens took 5.0 s forward + backward with the dropped
  matrix, 4.6 s without it; a Python loop over time steps took 10.7 s).

All are the identity in eval mode (or with p = 0): evaluation is deterministic.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call

__all__ = ["LockedDropout", "WeightDropLSTM", "embedding_dropout", "locked_mask"]


def embedding_dropout(weight: Tensor, p: float, training: bool) -> Tensor:
    """The embedding matrix with whole rows (words) dropped with probability ``p``, the others scaled by 1/(1-p).

    Args:
        weight: (V, D) the embedding matrix.
        p: the probability of dropping a word.
        training: drop only in training; otherwise ``weight`` is returned unchanged.

    Returns:
        (V, D) the matrix to look the batch up in (one mask for the whole batch, as Merity et al.'s code).
    """
    if not training or p == 0.0:
        return weight
    keep = weight.new_empty((weight.shape[0], 1)).bernoulli_(1.0 - p) / (1.0 - p)  # (V, 1)
    return weight * keep


def locked_mask(batch: int, width: int, p: float, training: bool, like: Tensor) -> Tensor | None:
    """A variational dropout mask (B, 1, D), scaled by 1/(1-p), to multiply a (B, T, D) sequence with; None when
    nothing is dropped (eval mode or p = 0)."""
    if not training or p == 0.0:
        return None
    return like.new_empty((batch, 1, width)).bernoulli_(1.0 - p) / (1.0 - p)


class LockedDropout(nn.Module):
    """Variational dropout over (B, T, D): one mask per sequence and unit, the same at every time step.

    Args:
        p: the drop probability.
    """

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        """x (B, T, D) -> x * mask (B, 1, D) in training; x unchanged in eval mode."""
        mask = locked_mask(x.shape[0], x.shape[-1], self.p, self.training, x)
        return x if mask is None else x * mask

    def extra_repr(self) -> str:
        return f"p={self.p}"


class WeightDropLSTM(nn.Module):
    """One LSTM layer with DropConnect on its hidden-to-hidden matrix (Merity et al. 2018, section 2).

    State-dict keys are those of the ``nn.LSTM`` it wraps, under ``rnn.``: ``rnn.weight_ih_l0`` (4H, Din),
    ``rnn.weight_hh_l0`` (4H, H), ``rnn.bias_ih_l0``, ``rnn.bias_hh_l0`` (4H,).

    Args:
        d_input: Din.
        d_hidden: H.
        weight_p: the probability of dropping each entry of W_hh (training only).
    """

    def __init__(self, d_input: int, d_hidden: int, weight_p: float) -> None:
        super().__init__()
        self.rnn = nn.LSTM(d_input, d_hidden, batch_first=True)
        self.weight_p = weight_p

    def dropped_weight(self) -> Tensor | None:
        """W_hh with DropConnect applied (draw once per forward call and pass to every ``forward`` of that call);
        None in eval mode or with weight_p = 0 (the plain matrix is used)."""
        if not self.training or self.weight_p == 0.0:
            return None
        return F.dropout(self.rnn.weight_hh_l0, self.weight_p, training=True)

    def forward(self, x: Tensor | nn.utils.rnn.PackedSequence, state: tuple[Tensor, Tensor] | None = None,
                weight_hh: Tensor | None = None) -> tuple[Tensor | nn.utils.rnn.PackedSequence, tuple[Tensor, Tensor]]:
        """Run the layer.

        Args:
            x: (B, T, Din), or a ``PackedSequence`` of such rows.
            state: (h, c), each (1, B, H); None = zeros.
            weight_hh: the (4H, H) matrix to use instead of W_hh (``dropped_weight()``); None = W_hh itself.

        Returns:
            (outputs (B, T, H) or packed, (h, c) each (1, B, H)).
        """
        if weight_hh is None:
            return self.rnn(x, state)
        return functional_call(self.rnn, {"weight_hh_l0": weight_hh}, (x, state))

    def extra_repr(self) -> str:
        return f"weight_p={self.weight_p}"


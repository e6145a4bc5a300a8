"""The generic attention of the RNN lectures: queries, keys, values; soft or hard; global or local.

Shape legend: ``...`` any leading dims, Tq / Tk query / key counts, Dq / Dk / Dv query / key / value widths.

Masks follow ``lmforge.nn.masks``: bool, True = may attend; ``attention_mask`` (..., Tk) with 1 = real key,
0 = padding. Fully masked query rows get zero weights and a zero output (never NaN). The scoring functions are in
``lmforge.nn.scores``; the REINFORCE surrogate that trains hard attention with ``estimator="reinforce"`` is in
``lmforge.nn.reinforce``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmforge.choices import HARD_ATTENTION_ESTIMATORS, LOCAL_ALIGNMENTS
from lmforge.errors import LmforgeError
from lmforge.nn.masks import combine_masks
from lmforge.nn.scores import AttentionOutput, make_score, masked_softmax

__all__ = ["Attention"]


class Attention(nn.Module):
    """Generic attention over a set of keys/values: Bahdanau et al. 2015, Luong et al. 2015, Xu et al. 2015.

    weights = softmax over keys of score(query, key) (masked); context = weights @ values.

    - soft (default): the weights as they are.
    - hard (Xu et al. 2015, "Show, Attend and Tell"): one key is chosen, the argmax at eval, a sample from the
      weights in training. Its gradient, by ``estimator``: "straight_through" (default; one_hot + w - w.detach(): the
      value of the sample, the gradient of the soft weights; biased), or "reinforce" (Williams 1992, the paper's
      estimator): the sample carries no gradient, and the output's ``log_probs`` / ``entropy`` feed
      ``reinforce_loss``, the score-function surrogate, once the caller knows the reward.
    - global (``window=None``): all keys.
    - local (Luong et al. 2015, section 3.2), ``window=D``: only keys in [p_t - D, p_t + D].
      "monotonic" (local-m): p_t is given (default: the query's index t). "predictive" (local-p):
      p_t = S * sigmoid(v_p^T tanh(W_p h_t)) with S the source length, and the weights are multiplied by
      exp(-(s - p_t)^2 / (2 sigma^2)), sigma = D / 2.
      Deviations: positions are 0-based; the window is centred on round(p_t) clipped to [0, S - 1], so it always
      holds 2D + 1 positions (fewer at the edges) even for a real-valued or out-of-range p_t; as in the paper, local-p
      weights are NOT renormalised after the Gaussian (they sum to < 1). S is the number of real keys per row
      given by ``attention_mask`` (padding is assumed to be on the right).
    """

    def __init__(
        self,
        score: nn.Module | str = "scaled_dot",
        *,
        hard: bool = False,
        window: int | None = None,
        alignment: str = "monotonic",
        d_query: int | None = None,
        d_align: int | None = None,
        estimator: str = "straight_through",
    ) -> None:
        """
        Args:
            score: a scoring module (``make_score``) or the name of a parameter-free one ('dot', 'scaled_dot',
                'cosine').
            hard: hard (one key) instead of soft attention.
            window: D for local attention; None = global.
            alignment: 'monotonic' (local-m) or 'predictive' (local-p); only with ``window``.
            d_query: Dq, needed by 'predictive' (the W_p input width).
            d_align: hidden width of the local-p predictor (default Dq).
            estimator: hard attention's gradient, 'straight_through' or 'reinforce'.
        """
        super().__init__()
        self.score = make_score(score) if isinstance(score, str) else score
        if window is not None and window < 0:
            raise LmforgeError(f"local attention window D must be >= 0; got window={window}")
        if alignment not in LOCAL_ALIGNMENTS:
            raise LmforgeError(f"unknown local alignment {alignment!r}; choose one of {', '.join(LOCAL_ALIGNMENTS)}")
        if estimator not in HARD_ATTENTION_ESTIMATORS:
            raise LmforgeError(f"unknown hard attention estimator {estimator!r}; choose one of "
                               f"{', '.join(HARD_ATTENTION_ESTIMATORS)}")
        self.hard, self.window, self.alignment, self.estimator = hard, window, alignment, estimator
        self.predictor: nn.Sequential | None = None
        if alignment == "predictive":
            if window is None:
                raise LmforgeError("alignment='predictive' is local-p attention and needs a window D (window=...)")
            if window < 1:
                raise LmforgeError(f"local-p needs window D >= 1 (its Gaussian has sigma = D/2); got window={window}")
            if d_query is None:
                raise LmforgeError("alignment='predictive' needs d_query, the width of the query h_t")
            d_align = d_query if d_align is None else d_align
            # p_t = S * sigmoid(v_p^T tanh(W_p h_t)); no biases, as in the paper.
            self.predictor = nn.Sequential(
                nn.Linear(d_query, d_align, bias=False), nn.Tanh(), nn.Linear(d_align, 1, bias=False))

    def forward(
        self,
        query: Tensor,
        keys: Tensor,
        values: Tensor | None = None,
        *,
        attention_mask: Tensor | None = None,
        mask: Tensor | None = None,
        positions: Tensor | int | None = None,
        need_weights: bool = False,
        generator: torch.Generator | None = None,
    ) -> AttentionOutput:
        """Attend from each query to the keys and average the values.

        Args:
            query: (..., Tq, Dq); use Tq = 1 for a single decoder state.
            keys: (..., Tk, Dk).
            values: (..., Tk, Dv); default ``keys`` (the usual case in RNN encoder-decoders).
            attention_mask: (..., Tk), 1 = real key, 0 = padding.
            mask: bool broadcastable to (..., Tq, Tk), True = may attend.
            positions: local-m centres p_t, an int or (..., Tq) / (Tq,) tensor; default the query index t.
            need_weights: also return the weights.
            generator: random generator for hard attention's sampling in training.

        Returns:
            AttentionOutput(output (..., Tq, Dv), weights (..., Tq, Tk) or None, None, log_probs (..., Tq) and
            entropy (..., Tq) with hard attention trained by REINFORCE, else None).
        """
        values = keys if values is None else values
        Tq, Tk = query.shape[-2], keys.shape[-2]
        scores = self.score(query, keys)  # (..., Tq, Tk)
        key_mask = None
        if attention_mask is not None:
            if attention_mask.shape[-1] != Tk:
                raise LmforgeError(f"attention_mask covers {attention_mask.shape[-1]} keys but there are {Tk}")
            key_mask = (attention_mask != 0).unsqueeze(-2)  # (..., 1, Tk)
        mask = combine_masks(key_mask, mask)
        centre = None
        if self.window is not None:
            src_len = attention_mask.sum(-1, keepdim=True).to(scores.dtype) if attention_mask is not None else Tk
            centre = self._centres(query, positions, src_len, Tq)  # (..., Tq) real-valued p_t
            # Window membership: |s - round(p_t)| <= D, centre clipped into [0, S - 1].
            s = torch.arange(Tk, device=scores.device, dtype=scores.dtype)  # (Tk,)
            last = torch.as_tensor(src_len, dtype=scores.dtype, device=scores.device) - 1
            mid = torch.minimum(centre.round().clamp(min=0), last)
            in_window = (s - mid.unsqueeze(-1)).abs() <= self.window  # (..., Tq, Tk)
            mask = combine_masks(mask, in_window)
        weights = masked_softmax(scores, mask)  # (..., Tq, Tk)
        if self.alignment == "predictive":
            assert centre is not None and self.window is not None
            sigma = self.window / 2
            s = torch.arange(Tk, device=scores.device, dtype=scores.dtype)
            weights = weights * torch.exp(-((s - centre.unsqueeze(-1)) ** 2) / (2 * sigma**2))  # (..., Tq, Tk)
        log_probs = entropy = None
        if self.hard and self.training and self.estimator == "reinforce":
            weights, log_probs, entropy = self._sample_for_reinforce(weights, generator)
        elif self.hard:
            weights = self._harden(weights, generator)
        context = weights @ values  # (..., Tq, Dv)
        return AttentionOutput(context, weights if need_weights else None, None, log_probs, entropy)

    def _centres(self, query: Tensor, positions: Tensor | int | None, src_len: Tensor | int, Tq: int) -> Tensor:
        if self.predictor is not None:
            return src_len * torch.sigmoid(self.predictor(query).squeeze(-1))  # (..., Tq)
        if positions is None:
            return torch.arange(Tq, device=query.device, dtype=query.dtype)  # (Tq,) p_t = t
        return torch.as_tensor(positions, device=query.device).to(query.dtype)

    def _harden(self, weights: Tensor, generator: torch.Generator | None) -> Tensor:
        Tk = weights.shape[-1]
        flat = weights.reshape(-1, Tk)  # (N, Tk)
        row_valid = flat.detach().sum(-1, keepdim=True) > 0  # (N, 1) fully masked rows stay zero
        if self.training:
            probs = flat.detach().masked_fill(~row_valid, 1.0)  # multinomial needs a positive row
            index = torch.multinomial(probs, 1, generator=generator).squeeze(-1)  # (N,)
        else:
            index = flat.detach().argmax(-1)  # (N,)
        one_hot = F.one_hot(index, Tk).to(weights.dtype) * row_valid  # (N, Tk)
        one_hot = one_hot.view_as(weights)
        # Straight-through: the value is exactly one_hot (the bracket is exactly 0), the gradient that of weights.
        return one_hot + (weights - weights.detach())

    @staticmethod
    def _sample_for_reinforce(weights: Tensor, generator: torch.Generator | None) -> tuple[Tensor, Tensor, Tensor]:
        # weights (..., Tq, Tk) -> one-hot sample (no gradient), log pi(sample) (..., Tq), entropy of pi (..., Tq).
        # pi is the weights renormalised: local-p's Gaussian-scaled weights sum to < 1.
        total = weights.sum(-1, keepdim=True)  # (..., Tq, 1)
        row_valid = total.detach() > 0  # fully masked rows choose nothing
        probs = weights / total.masked_fill(~row_valid, 1.0)  # (..., Tq, Tk) pi
        flat = probs.detach().reshape(-1, probs.shape[-1]).masked_fill(~row_valid.reshape(-1, 1), 1.0)
        index = torch.multinomial(flat, 1, generator=generator).view(*probs.shape[:-1], 1)  # (..., Tq, 1)
        one_hot = torch.zeros_like(probs).scatter_(-1, index, 1.0) * row_valid  # (..., Tq, Tk)
        # clamp: log 0 would give 0 * -inf = NaN in the entropy (and its gradient) of keys outside the mask
        log_pi = probs.clamp_min(torch.finfo(probs.dtype).tiny).log()  # (..., Tq, Tk)
        log_probs = log_pi.gather(-1, index).squeeze(-1) * row_valid.squeeze(-1)  # (..., Tq)
        entropy = -(probs * log_pi).sum(-1)  # (..., Tq)
        return one_hot, log_probs, entropy

    def extra_repr(self) -> str:
        kind = f"hard ({self.estimator})" if self.hard else "soft"
        where = "global" if self.window is None else f"local-{self.alignment[0]}, window={self.window}"
        return f"{kind}, {where}"

"""Attention: scoring functions, the generic (lecture) Attention, kernels, KV cache and MultiHeadAttention.

Shape legend: B batch, T target (query) length, S source (key) length, H heads, Dh head dim, D model dim.
For the generic ``Attention`` and the scoring functions: ``...`` any leading dims, Tq / Tk query / key counts,
Dq / Dk / Dv query / key / value widths, A hidden width of the additive score, L max source length.

Masks follow ``lmforge.nn.masks``: bool, True = may attend; ``attention_mask`` (B, S) with 1 = real token,
0 = padding. Fully masked query rows get zero weights and a zero output (never NaN).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmforge.choices import HARD_ATTENTION_ESTIMATORS, LOCAL_ALIGNMENTS
from lmforge.errors import LmforgeError
from lmforge.nn.masks import combine_masks, guard_empty_rows, make_causal_mask, padding_to_key_mask
from lmforge.nn.packed_dropout import dropout, dropout_attention, uses_packed_masks
from lmforge.nn.packing import Packing

__all__ = [
    "KERNELS",
    "SCORES",
    "AdditiveScore",
    "Attention",
    "AttentionOutput",
    "CosineScore",
    "DotScore",
    "GeneralScore",
    "KVCache",
    "LocationScore",
    "MultiHeadAttention",
    "RewardBaseline",
    "SampledAlignments",
    "ScaledDotScore",
    "attention_weights",
    "make_score",
    "masked_softmax",
    "math_attention",
    "reinforce_loss",
    "sdpa_attention",
]


class AttentionOutput(NamedTuple):
    """What every attention module returns.

    Attributes:
        output: context vectors, (B, T, D) for MultiHeadAttention, (..., Tq, Dv) for Attention.
        weights: attention probabilities (B, H, T, S) / (..., Tq, Tk) when requested (``need_weights=True``),
            else None. Taken before attention dropout.
        cache: the KVCache passed in (now extended), or None.
        log_probs: hard attention trained by REINFORCE, in training only: (..., Tq) log pi(s) of the key s sampled
            for each query (0 for a fully masked query); else None.
        entropy: with ``log_probs``, (..., Tq) the entropy of each query's distribution pi over the keys.
    """

    output: Tensor
    weights: Tensor | None = None
    cache: KVCache | None = None
    log_probs: Tensor | None = None
    entropy: Tensor | None = None


# --------------------------------------------------------------------------------------------------------------
# Scoring functions: score(q, k) -> (..., Tq, Tk), higher = more attention.
# --------------------------------------------------------------------------------------------------------------


def _same_width(q: Tensor, k: Tensor, name: str) -> None:
    if q.shape[-1] != k.shape[-1]:
        raise LmforgeError(
            f"the {name!r} score needs queries and keys of the same width; got {q.shape[-1]} and {k.shape[-1]} "
            "(use 'general' or 'additive' for different widths)")


class DotScore(nn.Module):
    """Dot-product score, Luong et al. 2015, "Effective Approaches to Attention-based NMT": score = q . k."""

    def forward(self, q: Tensor, k: Tensor) -> Tensor:
        """
        Args:
            q: (..., Tq, Dk) queries.
            k: (..., Tk, Dk) keys.

        Returns:
            (..., Tq, Tk) scores.
        """
        _same_width(q, k, "dot")
        return q @ k.transpose(-2, -1)  # (..., Tq, Tk)


class ScaledDotScore(nn.Module):
    """Scaled dot product, Vaswani et al. 2017, "Attention Is All You Need": score = q . k / sqrt(Dk)."""

    def forward(self, q: Tensor, k: Tensor) -> Tensor:
        """
        Args:
            q: (..., Tq, Dk) queries.
            k: (..., Tk, Dk) keys.

        Returns:
            (..., Tq, Tk) scores.
        """
        _same_width(q, k, "scaled_dot")
        return (q @ k.transpose(-2, -1)) / math.sqrt(k.shape[-1])  # (..., Tq, Tk)


class GeneralScore(nn.Module):
    """Bilinear score, Luong et al. 2015 "general": score = q^T W k with W of shape (Dq, Dk)."""

    def __init__(self, d_q: int, d_k: int) -> None:
        """
        Args:
            d_q: Dq, query width.
            d_k: Dk, key width.
        """
        super().__init__()
        self.weight = nn.Parameter(torch.empty(d_q, d_k))  # W: (Dq, Dk)
        nn.init.xavier_uniform_(self.weight)

    def forward(self, q: Tensor, k: Tensor) -> Tensor:
        """
        Args:
            q: (..., Tq, Dq) queries.
            k: (..., Tk, Dk) keys.

        Returns:
            (..., Tq, Tk) scores.
        """
        return (q @ self.weight) @ k.transpose(-2, -1)  # (..., Tq, Dk) @ (..., Dk, Tk) -> (..., Tq, Tk)


class AdditiveScore(nn.Module):
    """Additive (concat) score, Bahdanau et al. 2015, "NMT by Jointly Learning to Align and Translate".

    score(q, k) = v^T tanh(W [k; q]), computed as v^T tanh(W_q q + W_k k) (the same thing: W = [W_k W_q]), so queries
    and keys may have different widths and counts. No biases, as in the paper.
    """

    def __init__(self, d_q: int, d_k: int, d_attn: int) -> None:
        """
        Args:
            d_q: Dq, query width (the decoder state s_{i-1} in the paper).
            d_k: Dk, key width (the annotation h_j).
            d_attn: A, hidden width of the alignment MLP.
        """
        super().__init__()
        self.query_proj = nn.Linear(d_q, d_attn, bias=False)  # W_q
        self.key_proj = nn.Linear(d_k, d_attn, bias=False)  # W_k
        self.v = nn.Linear(d_attn, 1, bias=False)  # v^T

    def forward(self, q: Tensor, k: Tensor) -> Tensor:
        """
        Args:
            q: (..., Tq, Dq) queries.
            k: (..., Tk, Dk) keys.

        Returns:
            (..., Tq, Tk) scores.
        """
        h = self.query_proj(q).unsqueeze(-2) + self.key_proj(k).unsqueeze(-3)  # (..., Tq, Tk, A)
        return self.v(torch.tanh(h)).squeeze(-1)  # (..., Tq, Tk)


class CosineScore(nn.Module):
    """Cosine similarity, Graves et al. 2014, "Neural Turing Machines" (content addressing): beta * cos(q, k).

    Deviation: the key strength beta is a constructor constant (``scale``), not emitted by a controller.
    With beta = 1 the scores lie in [-1, 1] and the softmax is close to uniform; raise ``scale`` to sharpen.
    """

    def __init__(self, scale: float = 1.0, eps: float = 1e-8) -> None:
        """
        Args:
            scale: beta, multiplies the cosine.
            eps: floor on the norms (zero vectors score 0).
        """
        super().__init__()
        self.scale, self.eps = scale, eps

    def forward(self, q: Tensor, k: Tensor) -> Tensor:
        """
        Args:
            q: (..., Tq, Dk) queries.
            k: (..., Tk, Dk) keys.

        Returns:
            (..., Tq, Tk) scores.
        """
        _same_width(q, k, "cosine")
        qn = F.normalize(q, dim=-1, eps=self.eps)
        kn = F.normalize(k, dim=-1, eps=self.eps)
        return self.scale * (qn @ kn.transpose(-2, -1))  # (..., Tq, Tk)


class LocationScore(nn.Module):
    """Location-based score, Luong et al. 2015: a_t = softmax(W_a h_t); depends only on the query.

    Deviation: the paper's output has a fixed length; we take the first Tk of the L = ``max_len`` outputs so a
    batch of shorter sources works (padding is then masked as usual).
    """

    def __init__(self, d_q: int, max_len: int) -> None:
        """
        Args:
            d_q: Dq, query width.
            max_len: L, the longest source this score can address.
        """
        super().__init__()
        self.max_len = max_len
        self.proj = nn.Linear(d_q, max_len, bias=False)  # W_a: (L, Dq)

    def forward(self, q: Tensor, k: Tensor) -> Tensor:
        """
        Args:
            q: (..., Tq, Dq) queries.
            k: (..., Tk, Dk) keys; only Tk is used.

        Returns:
            (..., Tq, Tk) scores.
        """
        Tk = k.shape[-2]
        if Tk > self.max_len:
            raise LmforgeError(f"the 'location' score was built for max_len={self.max_len} source positions; got {Tk}")
        return self.proj(q)[..., :Tk]  # (..., Tq, Tk)


SCORES: dict[str, type[nn.Module]] = {
    "additive": AdditiveScore,
    "dot": DotScore,
    "scaled_dot": ScaledDotScore,
    "general": GeneralScore,
    "cosine": CosineScore,
    "location": LocationScore,
}

_SCORE_ARGS: dict[str, tuple[str, ...]] = {
    "additive": ("d_q", "d_k", "d_attn"),
    "dot": (),
    "scaled_dot": (),
    "general": ("d_q", "d_k"),
    "cosine": (),
    "location": ("d_q", "max_len"),
}


def make_score(
    name: str,
    *,
    d_q: int | None = None,
    d_k: int | None = None,
    d_attn: int | None = None,
    max_len: int | None = None,
) -> nn.Module:
    """Build a scoring function by name.

    Args:
        name: one of ``SCORES``.
        d_q: query width ('additive', 'general', 'location').
        d_k: key width ('additive', 'general').
        d_attn: hidden width ('additive').
        max_len: longest source ('location').

    Returns:
        A module with ``forward(q, k) -> (..., Tq, Tk)``.
    """
    if name not in SCORES:
        raise LmforgeError(f"unknown attention score {name!r}; choose one of {', '.join(SCORES)}")
    given = {"d_q": d_q, "d_k": d_k, "d_attn": d_attn, "max_len": max_len}
    needed = _SCORE_ARGS[name]
    missing = [a for a in needed if given[a] is None]
    if missing:
        raise LmforgeError(f"the {name!r} score needs {', '.join(missing)}")
    return SCORES[name](**{a: given[a] for a in needed})


# --------------------------------------------------------------------------------------------------------------
# Softmax with masks, kernels.
# --------------------------------------------------------------------------------------------------------------


def masked_softmax(scores: Tensor, mask: Tensor | None) -> Tensor:
    """Softmax over the last dim restricted to ``mask``; fully masked rows give all-zero weights.

    Args:
        scores: (..., T, S).
        mask: bool broadcastable to scores, True = may attend; or None.

    Returns:
        (..., T, S) weights; each row sums to 1, or to 0 when the row is fully masked.
    """
    if mask is None:
        return scores.softmax(dim=-1)
    # finfo.min, not -inf: a fully masked row becomes uniform (never NaN) and is zeroed below.
    weights = scores.masked_fill(~mask, torch.finfo(scores.dtype).min).softmax(dim=-1)  # (..., T, S)
    row_valid = mask.any(dim=-1, keepdim=True)  # (..., T, 1)
    return weights.masked_fill(~row_valid, 0.0)


def _fold_causal(mask: Tensor | None, is_causal: bool, T: int, S: int, device: torch.device) -> Tensor | None:
    if not is_causal:
        return mask
    return combine_masks(mask, make_causal_mask(T, S, device=device))  # (..., T, S)


def attention_weights(
    q: Tensor, k: Tensor, mask: Tensor | None = None, is_causal: bool = False, scale: float | None = None
) -> Tensor:
    """Scaled dot-product attention probabilities (the readable reference).

    Args:
        q: (B, H, T, Dh) queries.
        k: (B, H, S, Dh) keys.
        mask: bool broadcastable to (B, H, T, S), True = may attend; or None.
        is_causal: also apply the causal mask; queries are the last T of the S positions (see make_causal_mask).
        scale: score multiplier, default 1 / sqrt(Dh).

    Returns:
        (B, H, T, S) weights (rows sum to 1; fully masked rows are 0).
    """
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = (q @ k.transpose(-2, -1)) * scale  # (B, H, T, S)
    mask = _fold_causal(mask, is_causal, q.shape[-2], k.shape[-2], q.device)
    return masked_softmax(scores, mask)  # (B, H, T, S)


def math_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, dropout_p: float, is_causal: bool, scale: float | None
) -> Tensor:
    """Reference kernel: softmax(q k^T * scale + mask) v, written out.

    Args:
        q: (B, H, T, Dh); k, v: (B, H, S, Dh).
        mask: bool broadcastable to (B, H, T, S), True = may attend; or None.
        dropout_p: dropout on the weights (pass 0 at eval).
        is_causal: add the bottom-right-aligned causal mask.
        scale: score multiplier, default 1 / sqrt(Dh).

    Returns:
        (B, H, T, Dh).
    """
    weights = attention_weights(q, k, mask, is_causal, scale)  # (B, H, T, S)
    if dropout_p > 0.0:
        weights = dropout(weights, dropout_p)
    return weights @ v  # (B, H, T, Dh)


def sdpa_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, dropout_p: float, is_causal: bool, scale: float | None
) -> Tensor:
    """Fast kernel: ``torch.nn.functional.scaled_dot_product_attention`` with the same semantics as math_attention.

    Differences from calling torch directly, all to match the reference: ``is_causal`` is bottom-right aligned
    (torch's is top-left, wrong for cached decoding when T < S), and fully masked rows give zeros on every torch
    version.

    Args and Returns: as ``math_attention``.
    """
    T, S = q.shape[-2], k.shape[-2]
    if is_causal and T == 1:  # one new query (a cached decoding step): its bottom-right causal row allows every key
        is_causal = False
    if dropout_p > 0.0 and uses_packed_masks(q):
        # torch's CPU SDPA has no fused kernel with dropout: its math path, with a mask a third as costly
        return dropout_attention(q, k, v, _fold_causal(mask, is_causal, T, S, q.device), dropout_p, scale)
    if mask is None and (not is_causal or T == S):
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=is_causal, scale=scale)
    mask = _fold_causal(mask, is_causal, T, S, q.device)
    assert mask is not None
    safe_mask, row_valid = guard_empty_rows(mask)  # (B|1, H|1, T, S), (B|1, H|1, T, 1)
    if bool(row_valid.all()):  # the usual case (right padding, no empty rows): skip two full-size copies
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=scale)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=safe_mask, dropout_p=dropout_p, scale=scale)
    return out.masked_fill(~row_valid, 0.0)  # (B, H, T, Dh)


Kernel = Callable[[Tensor, Tensor, Tensor, Tensor | None, float, bool, float | None], Tensor]

KERNELS: dict[str, Kernel] = {"math": math_attention, "sdpa": sdpa_attention}


# --------------------------------------------------------------------------------------------------------------
# The generic attention of the lectures: queries, keys, values; soft/hard; global/local.
# --------------------------------------------------------------------------------------------------------------


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


class RewardBaseline(nn.Module):
    """The moving-average reward baseline of REINFORCE (Williams 1992, "Simple statistical gradient-following
    algorithms"; Xu et al. 2015, section 4.1, for hard attention): b <- decay * b + (1 - decay) * mean(R).

    The first batch sets b to its mean reward (a baseline of 0 would make every early advantage hugely negative).
    Buffers ``value`` (b) and ``count`` (batches seen) are saved with the model, so a resumed run goes on exactly.
    """

    def __init__(self, decay: float = 0.9) -> None:
        """
        Args:
            decay: in [0, 1); 0 = the last batch's mean reward.
        """
        super().__init__()
        if not 0.0 <= decay < 1.0:
            raise LmforgeError(f"the reward baseline's decay must be in [0, 1); got {decay}")
        self.decay = decay
        self.register_buffer("value", torch.zeros((), dtype=torch.float64))
        self.register_buffer("count", torch.zeros((), dtype=torch.long))

    @torch.no_grad()
    def update(self, rewards: Tensor) -> None:
        """Fold in one batch of rewards (N,) (an empty batch changes nothing)."""
        if rewards.numel() == 0:
            return
        mean = rewards.detach().to(self.value.dtype).mean()
        self.value.copy_(mean if int(self.count) == 0 else self.decay * self.value + (1 - self.decay) * mean)
        self.count += 1

    def extra_repr(self) -> str:
        return f"decay={self.decay}"


class SampledAlignments(NamedTuple):
    """Hard attention choices sampled for REINFORCE during one teacher-forced pass (what ``reinforce_loss`` needs).

    Attributes:
        log_probs: (B, T) log pi_t(s_t) of the source position sampled at each target step (with grad).
        entropy: (B, T) the entropy of each step's attention distribution pi_t (with grad).
        baseline: the model's RewardBaseline (updated by ``reinforce_loss``).
        entropy_weight: beta of the entropy bonus (0 = none).
    """

    log_probs: Tensor
    entropy: Tensor
    baseline: RewardBaseline
    entropy_weight: float = 0.0


def reinforce_loss(samples: SampledAlignments, rewards: Tensor, mask: Tensor | None = None) -> Tensor:
    """The score-function (REINFORCE) surrogate of hard attention, summed over examples; updates the baseline.

    For example b with reward R_b (e.g. log p(y | sampled alignments, x), the negated target NLL) and baseline
    beta_0: loss_b = -(R_b - beta_0) * sum_t log pi_t(s_t) - beta * sum_t H(pi_t). Its gradient is the REINFORCE
    estimate of -grad E[R] (the advantage is a constant) plus the entropy bonus (Xu et al. 2015, eq. 12 without
    their 0.5 chance of using the soft expectation). The baseline is updated after use, with these rewards.

    Args:
        samples: from a model's forward pass in training.
        rewards: (B,) one reward per example (no gradient is taken through it).
        mask: (B, T) True / 1 = a real target step whose choice counts; None = all.

    Returns:
        A scalar: the surrogate summed over the B examples (its value is not a loss to report).
    """
    log_probs, entropy = samples.log_probs, samples.entropy  # (B, T) each
    if mask is not None:
        keep = mask.to(torch.bool)
        log_probs, entropy = log_probs * keep, entropy * keep
    rewards = rewards.detach().to(log_probs.dtype)  # (B,)
    advantage = rewards - samples.baseline.value.to(log_probs.dtype)  # (B,)
    surrogate = -(advantage * log_probs.sum(-1)) - samples.entropy_weight * entropy.sum(-1)  # (B,)
    samples.baseline.update(rewards)
    return surrogate.sum()


# --------------------------------------------------------------------------------------------------------------
# Key/value cache and multi-head attention.
# --------------------------------------------------------------------------------------------------------------


class KVCache:
    """Projected keys and values of one attention module, for incremental decoding.

    Self-attention appends the new steps' keys/values (after rotary) on every call; cross-attention fills the
    cache once with the projected encoder output and reuses it afterwards. One cache per attention module per
    layer. Mutated in place and also returned in ``AttentionOutput.cache``.

    Storage: a buffer with room for more positions than are filled, doubled when full, so that a step writes its
    new position into place instead of copying every cached one (``torch.cat`` per step and layer, as Hugging
    Face's ``DynamicCache``, copies the whole cache each time: quadratic in the length). ``reorder`` (beam search)
    gathers the filled positions into a second buffer kept for that purpose and swaps the two, allocating nothing
    after the first calls. Keys that carry a gradient (a forward pass with autograd on) are concatenated and
    gathered out of place instead, as before, so that backpropagating through a cached pass still works.

    Attributes:
        key, value: (B, H, S, Dh) views of the filled positions, or None while empty.
        projection: a self-attention module's q/k/v weights concatenated for this generation, or None.
    """

    def __init__(self) -> None:
        self._key: Tensor | None = None  # (B, H, capacity, Dh)
        self._value: Tensor | None = None
        self._spare: tuple[Tensor, Tensor] | None = None  # reorder's target, same shape
        self._pending: Tensor | None = None  # rows to select at the next use (reorder is lazy, see reorder)
        self._length = 0
        # positions the buffers are first made for, when the caller knows the final length (generation: prompt +
        # new tokens): one allocation and no growth copies, and no doubling's unused half to stream through
        self.reserve = 0
        # the attention module's q/k/v weights side by side (weight (3D, D), bias (3D,) or None), for this
        # generation only (MultiHeadAttention._project_qkv)
        self.projection: tuple[Tensor, Tensor | None] | None = None

    @property
    def key(self) -> Tensor | None:
        self._select_pending()
        return None if self._key is None else self._key[:, :, :self._length]

    @property
    def value(self) -> Tensor | None:
        self._select_pending()
        return None if self._value is None else self._value[:, :, :self._length]

    @property
    def length(self) -> int:
        """S, number of cached positions (0 while empty)."""
        return self._length

    @property
    def capacity(self) -> int:
        """Positions the buffers hold before they grow."""
        return 0 if self._key is None else self._key.shape[-2]

    def append(self, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        """Add T new positions.

        Args:
            key, value: (B, H, T, Dh).

        Returns:
            All cached keys and values, (B, H, S + T, Dh) each (views of the buffers: valid until the next call).
        """
        self._select_pending()
        S, T = self._length, key.shape[-2]
        if torch.is_grad_enabled() and (key.requires_grad or value.requires_grad):
            # in autograd's graph: concatenate (in-place writes into a buffer would break the backward pass)
            self._key = key if self._key is None else torch.cat((self.key, key), dim=-2)
            self._value = value if self._value is None else torch.cat((self.value, value), dim=-2)
            self._length, self._spare = S + T, None
            return self._key, self._value
        if self._key is None or self._value is None:  # exactly T (or the reserve): a cross-attention cache never grows
            room = max(T, self.reserve)
            self._key = key.new_empty(_with_room(key.shape, room))
            self._value = value.new_empty(_with_room(value.shape, room))
        elif S + T > self.capacity or self._key.shape[0] != key.shape[0]:
            if self._key.shape[0] != key.shape[0]:
                raise LmforgeError(f"the cache holds {self._key.shape[0]} rows but {key.shape[0]} were appended; "
                                   "reorder() the cache to the new batch first")
            room = max(S + T, 2 * self.capacity, 16)  # doubling: O(log n) copies over n steps
            grown_k = key.new_empty(_with_room(key.shape, room))
            grown_v = value.new_empty(_with_room(value.shape, room))
            grown_k[:, :, :S] = self._key[:, :, :S]
            grown_v[:, :, :S] = self._value[:, :, :S]
            self._key, self._value, self._spare = grown_k, grown_v, None
        self._key[:, :, S:S + T] = key
        self._value[:, :, S:S + T] = value
        self._length = S + T
        return self._key[:, :, :S + T], self._value[:, :, :S + T]

    def reorder(self, index: Tensor) -> None:
        """Select batch rows (beam search): ``index`` (B',) of rows to keep, in order.

        Lazy outside autograd: the selection is recorded (composed with one still pending) and made at the next
        ``append`` or read, that is just before this layer attends over the rows. Beam search reorders every
        layer's cache at once between steps; gathering them all there would leave each layer's keys and values
        cold in the CPU's caches by the time its attention reads them (measured: the attention kernel 2-3x slower
        per call than on freshly written keys).
        """
        if self._key is None or self._value is None:
            return
        if self._key.requires_grad or self._value.requires_grad:  # in autograd's graph: out-of-place, at once
            self._select_pending()
            self._key, self._value = self.key.index_select(0, index), self.value.index_select(0, index)
            self._spare = None
            return
        self._pending = index if self._pending is None else self._pending.index_select(0, index)

    def _select_pending(self) -> None:
        """Make the pending row selection: gather the filled positions into the spare buffers and swap."""
        index, self._pending = self._pending, None
        if index is None or self._key is None or self._value is None:
            return
        S, rows = self._length, index.shape[0]
        spare = self._spare
        if spare is None or spare[0].shape[0] != rows or spare[0].shape[-2] != self.capacity:
            spare = (self._key.new_empty((rows, *self._key.shape[1:])),
                     self._value.new_empty((rows, *self._value.shape[1:])))
        torch.index_select(self._key[:, :, :S], 0, index, out=spare[0][:, :, :S])
        torch.index_select(self._value[:, :, :S], 0, index, out=spare[1][:, :, :S])
        self._spare = (self._key, self._value) if self._key.shape[0] == rows else None
        self._key, self._value = spare

    def __repr__(self) -> str:
        return f"KVCache(length={self.length}, capacity={self.capacity})"


def _plain_linears(modules: tuple[nn.Module, ...]) -> bool:
    """Every module is an ``nn.Linear`` itself (not a subclass or wrapper) with no hooks or parametrization, so its
    output is exactly ``F.linear(x, weight, bias)`` and its weights may be concatenated with others'."""
    return all(type(m) is nn.Linear and not m._forward_hooks and not m._forward_pre_hooks
               and "parametrizations" not in m._modules for m in modules)


def _with_room(shape: torch.Size, positions: int) -> tuple[int, ...]:
    """The buffer shape (B, H, positions, Dh) for keys or values of ``shape`` (B, H, T, Dh)."""
    return (shape[0], shape[1], positions, shape[3])


class MultiHeadAttention(nn.Module):
    """Multi-head attention, Vaswani et al. 2017, "Attention Is All You Need", section 3.2.2.

    MultiHead(Q, K, V) = Concat(head_1..head_H) W_O, head_i = Attention(Q W_Q_i, K W_K_i, V W_V_i), with
    scaled dot-product attention computed by a kernel from ``KERNELS`` (all share one signature; "math" is the
    reference and the test oracle of "sdpa").

    Separate ``q_proj``, ``k_proj``, ``v_proj``, ``out_proj`` with biases, as in BERT (GPT-2's fused ``c_attn`` is
    split by the interop layer). Self-attention when ``key_value`` is None, cross-attention otherwise.
    Rotary embeddings, when injected, are applied to q and k in self-attention only, at positions offset by the
    cache length. Attention dropout acts on the weights, in training only.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        kernel: str = "sdpa",
        d_kv: int | None = None,
        rotary: nn.Module | None = None,
    ) -> None:
        """
        Args:
            d_model: D, width of queries and of the output.
            n_heads: H; must divide D (Dh = D / H).
            dropout: attention-weight dropout probability.
            bias: biases on the four projections.
            kernel: name in ``KERNELS``.
            d_kv: width of the key/value input for cross-attention from another width (default D).
            rotary: e.g. ``RotaryEmbedding(d_head, max_len)``; called as ``rotary(x, offset)`` on (B, H, T, Dh).
        """
        super().__init__()
        if n_heads <= 0 or d_model <= 0 or d_model % n_heads:
            raise LmforgeError(
                f"d_model={d_model} must be a positive multiple of n_heads={n_heads} (each head gets d_model / "
                "n_heads dimensions)")
        if kernel not in KERNELS:
            raise LmforgeError(f"unknown attention kernel {kernel!r}; choose one of {', '.join(KERNELS)}")
        if not 0.0 <= dropout < 1.0:
            raise LmforgeError(f"attention dropout must be in [0, 1); got {dropout}")
        self.d_model, self.n_heads, self.d_head = d_model, n_heads, d_model // n_heads
        self.d_kv = d_model if d_kv is None else d_kv
        self.dropout, self.kernel_name = dropout, kernel
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(self.d_kv, d_model, bias=bias)
        self.v_proj = nn.Linear(self.d_kv, d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        self.rotary = rotary
        self.fuse_projections = True  # one q/k/v product when decoding with a cache (see _project_qkv)

    def _project_qkv(self, x: Tensor, cache: KVCache | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """The self-attention projections x W_Q, x W_K, x W_V, each (..., D).

        Incremental decoding (a ``cache``, no autograd) runs one product with the three weights side by side: one
        GEMM instead of three, two fewer calls per layer and step. The concatenated weight is built at the cache's
        first call and lives in the cache, so it is dropped with it at the end of one generation: the weights cannot
        change meanwhile, and no copy outlives them (an optimizer step, fused or not, never meets a stale one).
        Projections that are not plain ``nn.Linear`` modules without hooks (a wrapper, a parametrization) always run
        as they are. The parameters and their state-dict keys stay the three separate projections.
        """
        projections = (self.q_proj, self.k_proj, self.v_proj)
        if cache is None or not self.fuse_projections or (
                torch.is_grad_enabled() and any(p.weight.requires_grad for p in projections)):
            return self.q_proj(x), self.k_proj(x), self.v_proj(x)
        if cache.projection is None:  # the first step of a generation: may these three be fused at all?
            if not _plain_linears(projections):
                return self.q_proj(x), self.k_proj(x), self.v_proj(x)
            with torch.no_grad():
                weight = torch.cat([proj.weight for proj in projections])  # (3D, D)
                bias = None if self.q_proj.bias is None else torch.cat([proj.bias for proj in projections])
            cache.projection = (weight, bias)
        return F.linear(x, *cache.projection).split(self.d_model, dim=-1)

    def _split_heads(self, x: Tensor) -> Tensor:
        B, T, _ = x.shape
        return x.view(B, T, self.n_heads, self.d_head).transpose(1, 2)  # (B, H, T, Dh)

    def forward(
        self,
        query: Tensor,
        key_value: Tensor | None = None,
        *,
        attention_mask: Tensor | None = None,
        causal: bool = False,
        attn_mask: Tensor | None = None,
        cache: KVCache | None = None,
        need_weights: bool = False,
        packing: Packing | None = None,
    ) -> AttentionOutput:
        """Attend from ``query`` to itself (self-attention) or to ``key_value`` (cross-attention).

        Args:
            query: (B, T, D).
            key_value: (B, S, d_kv) for cross-attention; None for self-attention. With a filled cross-attention
                cache it is not projected again (pass the encoder output anyway).
            attention_mask: (B, S) 1 = real key, 0 = padding. S counts all keys: with a self-attention cache,
                the cached positions plus the T new ones.
            causal: queries attend only to keys at or before their position; the queries are the last T of
                the S positions (cached decoding).
            attn_mask: extra bool mask broadcastable to (B, H, T, S), True = may attend.
            cache: a KVCache to read and extend (incremental decoding).
            need_weights: also return the (B, H, T, S) weights; this call then runs the math path (whatever the
                kernel) so the weights are exactly those used.
            packing: self-attention without a cache on a packed batch (``lmforge.nn.packing``): ``query`` is the
                (N, D) rows of the real tokens; the projections run on them, attention on the padded layout.

        Returns:
            AttentionOutput(output (B, T, D), or (N, D) with ``packing``; weights (B, H, T, S) or None; cache).
        """
        if packing is not None:
            return self._packed_self_attention(query, packing, attention_mask, attn_mask, need_weights)
        if query.dim() != 3 or query.shape[-1] != self.d_model:
            raise LmforgeError(f"query must be (batch, length, d_model={self.d_model}); got {tuple(query.shape)}")
        B, T, _ = query.shape
        if key_value is None:  # self-attention: new keys/values come from the query sequence
            q, k, v = (self._split_heads(x) for x in self._project_qkv(query, cache))  # (B, H, T, Dh) each
            if self.rotary is not None:
                offset = 0 if cache is None else cache.length
                q, k = self.rotary(q, offset), self.rotary(k, offset)
            if cache is not None:
                k, v = cache.append(k, v)  # (B, H, S, Dh), S = cached + T
        elif cache is not None and cache.key is not None and cache.value is not None:
            q = self._split_heads(self.q_proj(query))  # (B, H, T, Dh)
            k, v = cache.key, cache.value  # cross-attention: encoder keys/values projected once
        else:
            if key_value.dim() != 3 or key_value.shape[-1] != self.d_kv:
                raise LmforgeError(
                    f"key_value must be (batch, length, d_kv={self.d_kv}); got {tuple(key_value.shape)}")
            q = self._split_heads(self.q_proj(query))  # (B, H, T, Dh)
            k = self._split_heads(self.k_proj(key_value))  # (B, H, S, Dh)
            v = self._split_heads(self.v_proj(key_value))  # (B, H, S, Dh)
            if cache is not None:
                cache.append(k, v)
        S = k.shape[-2]
        mask = attn_mask
        if mask is not None and mask.dtype != torch.bool:
            raise LmforgeError(f"attn_mask must be bool (True = may attend); got dtype {mask.dtype}")
        if attention_mask is not None:
            if tuple(attention_mask.shape) != (B, S):
                raise LmforgeError(
                    f"attention_mask must be (batch={B}, keys={S}) with 1 = real token; got "
                    f"{tuple(attention_mask.shape)}")
            mask = combine_masks(padding_to_key_mask(attention_mask), mask)  # (B, 1|H, 1|T, S)
        if causal and S < T:
            raise LmforgeError(f"causal attention needs at least as many keys as queries; got T={T}, S={S}")
        dropout_p = self.dropout if self.training else 0.0
        scale = self.d_head**-0.5
        weights = None
        if need_weights:  # the math path, so the returned weights are the ones used
            weights = attention_weights(q, k, mask, causal, scale)  # (B, H, T, S)
            out = (dropout(weights, dropout_p) if dropout_p > 0.0 else weights) @ v  # (B, H, T, Dh)
        else:
            out = KERNELS[self.kernel_name](q, k, v, mask, dropout_p, causal, scale)  # (B, H, T, Dh)
        out = out.transpose(1, 2).reshape(B, T, self.d_model)  # (B, T, D)
        return AttentionOutput(self.out_proj(out), weights, cache)

    def _packed_self_attention(self, query: Tensor, packing: Packing, attention_mask: Tensor | None,
                               attn_mask: Tensor | None, need_weights: bool) -> AttentionOutput:
        """``forward`` on packed rows: project the N real tokens, attend in the (B, T) layout, gather, project."""
        if query.dim() != 2 or query.shape != (packing.tokens, self.d_model):
            raise LmforgeError(f"a packed query must be (real tokens={packing.tokens}, d_model={self.d_model}); got "
                               f"{tuple(query.shape)}")
        q, k, v = (self._split_heads(packing.unpack(x))  # (B, H, T, Dh) each, zeros at padding
                   for x in self._project_qkv(query))
        if self.rotary is not None:
            q, k = self.rotary(q, 0), self.rotary(k, 0)
        mask = combine_masks(padding_to_key_mask(packing.key_mask if attention_mask is None else attention_mask),
                             attn_mask)  # (B, 1|H, 1|T, T)
        dropout_p = self.dropout if self.training else 0.0
        scale = self.d_head**-0.5
        weights = None
        if need_weights:
            weights = attention_weights(q, k, mask, False, scale)  # (B, H, T, T)
            out = (dropout(weights, dropout_p) if dropout_p > 0.0 else weights) @ v
        else:
            out = KERNELS[self.kernel_name](q, k, v, mask, dropout_p, False, scale)  # (B, H, T, Dh)
        out = packing.pack(out.transpose(1, 2))  # (N, H, Dh): the real queries only
        return AttentionOutput(self.out_proj(out.reshape(packing.tokens, self.d_model)), weights, None)

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, n_heads={self.n_heads}, d_kv={self.d_kv}, dropout={self.dropout}, "
                f"kernel={self.kernel_name!r}")

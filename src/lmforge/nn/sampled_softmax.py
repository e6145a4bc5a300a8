"""The sampled softmax of a large output vocabulary (Jean et al. 2015) with bilm-tf's log-uniform proposal: ELMo's
biLM (``lmforge.models.elmo``) trains its word softmax with it (``softmax_samples``, ``softmax_sampler``).

Shape legend: N targets, K shared negatives, D hidden width, V vocabulary.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

__all__ = ["log_uniform_log_q", "log_uniform_ranks", "sampled_softmax_nll"]


def log_uniform_ranks(k: int, vocab_size: int, *, device: Any = None, generator: Any = None) -> Tensor:
    """K frequency ranks drawn with replacement from the log-uniform (Zipfian) distribution over [0, V):
    P(r) = log((r + 2) / (r + 1)) / log(V + 1), by inverting its CDF (r = floor(exp(u log(V + 1))) - 1)."""
    u = torch.rand(k, device=device, generator=generator, dtype=torch.float64)
    ranks = torch.exp(u * math.log(vocab_size + 1)).floor().long() - 1
    return ranks.clamp_(0, vocab_size - 1)


def log_uniform_log_q(ranks: Tensor, vocab_size: int) -> Tensor:
    """log P(r) of the log-uniform distribution over [0, V) (``log_uniform_ranks``)."""
    r = ranks.double()
    return (torch.log((r + 2) / (r + 1)) / math.log(vocab_size + 1)).log().float()


def sampled_softmax_nll(h: Tensor, weight: Tensor, bias: Tensor, targets: Tensor, negatives: Tensor,
                        true_log_expected: Tensor | None = None, sampled_log_expected: Tensor | None = None) -> Tensor:
    """Summed NLL of ``targets`` (N,) among themselves and the shared ``negatives`` (K,) (Jean et al. 2015): logits
    ``h W^T + b`` of the target and of each negative, each minus the log of its expected count under the proposal
    (None: a uniform proposal, where the correction cancels), a negative equal to the row's target removed."""
    true = (h * weight[targets]).sum(-1, keepdim=True) + bias[targets].unsqueeze(-1)  # (N, 1)
    sampled = h @ weight[negatives].T + bias[negatives]  # (N, K)
    if true_log_expected is not None:
        true = true - true_log_expected.unsqueeze(-1).to(true.dtype)
        sampled = sampled - sampled_log_expected.unsqueeze(0).to(sampled.dtype)
    sampled = sampled.masked_fill(negatives.unsqueeze(0) == targets.unsqueeze(-1), float("-inf"))
    return -torch.log_softmax(torch.cat([true, sampled], -1).float(), -1)[:, 0].sum()

"""REINFORCE for hard attention: the moving-average reward baseline and the score-function surrogate loss.

Shape legend: B batch, T target steps, N examples in a batch of rewards.

``lmforge.nn.generic_attention.Attention(hard=True, estimator="reinforce")`` samples one key per query in training
and returns the samples' log-probabilities and entropies; a model collects them over its target steps into
``SampledAlignments``, and the objective turns them into ``reinforce_loss`` once the reward is known.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor, nn

from lmforge.errors import LmforgeError

__all__ = ["RewardBaseline", "SampledAlignments", "reinforce_loss"]


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

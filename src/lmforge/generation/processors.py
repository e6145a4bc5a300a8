"""Logits processors: functions of the next-token scores and the context, applied in a fixed order.

Shape legend: N rows (inputs x beams or samples), V vocab, L context length.

Every processor is called as ``processor(logits (N, V), context (N, L), context_mask (N, L)) -> logits (N, V)``,
where the context is what the row has seen so far: for a decoder-only model the prompt (left padding has mask 0)
followed by the generated tokens; for an encoder-decoder only the generated target tokens (not the source, not the
start token). Processors never modify their input in place.

Order: the scoring processors (``build_processors``), for every strategy, then the sampling warpers
(``build_warpers``), for strategy "sample" only:
    1. RepetitionPenalty   (repetition_penalty != 1)
    2. NoRepeatNGram       (no_repeat_ngram_size > 0)
    3. Temperature         (temperature != 1)
    4. TopK                (top_k > 0)
    5. TopP                (top_p < 1)
Penalties come first so that temperature rescales the penalised scores, and top-k before top-p as in most
implementations (Hugging Face, fairseq): top-p then renormalises over the k survivors. The scores and
log-probabilities that ``generate`` reports are those after 1-2: the warpers choose how to sample, they do not
change how a hypothesis is scored (so top-k = 1 sampling reports exactly what greedy search reports).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from lmforge.generation.config import GenerationConfig

__all__ = ["LogitsProcessor", "NoRepeatNGram", "RepetitionPenalty", "Temperature", "TopK", "TopP",
           "apply_processors", "build_processors",
           "build_warpers"]

LogitsProcessor = Callable[[Tensor, Tensor, Tensor], Tensor]


class RepetitionPenalty:
    """CTRL's repetition penalty: Keskar et al. 2019, "CTRL: A Conditional Transformer Language Model for
    Controllable Generation", section 4.1.

    For every token already in the context, a positive logit is divided by ``penalty`` and a negative one
    multiplied by it, so penalty > 1 always makes the token less likely. (The paper divides the logit before the
    softmax; dividing a negative logit would raise it, hence the sign rule, as in the authors' code and Hugging
    Face.) The context includes the real prompt tokens of a decoder-only model, as CTRL's own code does; padding
    never counts. A token counts once however often it occurred.
    """

    def __init__(self, penalty: float) -> None:
        self.penalty = float(penalty)

    def __call__(self, logits: Tensor, context: Tensor, context_mask: Tensor) -> Tensor:
        if context.shape[1] == 0:
            return logits
        seen = seen_tokens(logits.shape[1], context, context_mask)  # (N, V) bool
        penalised = torch.where(logits > 0, logits / self.penalty, logits * self.penalty)
        return torch.where(seen, penalised, logits)


class NoRepeatNGram:
    """Forbid any n-gram from occurring twice in a row's context: Paulus et al. 2018, "A Deep Reinforced Model for
    Abstractive Summarization" (section 2.5, trigram avoidance at test time).

    The last n - 1 context tokens are the prefix of the next n-gram; every token that followed the same n - 1
    tokens earlier gets score -inf. n = 1 forbids every token already in the context. N-grams touching padding
    are ignored.
    """

    def __init__(self, n: int) -> None:
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        self.n = int(n)

    def __call__(self, logits: Tensor, context: Tensor, context_mask: Tensor) -> Tensor:
        n = self.n
        N, L = context.shape
        if L < n:  # no complete n-gram yet (and the prefix of n = 1 is empty, so L == 0 bans nothing)
            return logits
        real = context_mask != 0
        grams = context.unfold(1, n, 1)  # (N, L - n + 1, n)
        valid = real.unfold(1, n, 1).all(-1)  # (N, L - n + 1)
        if n > 1:
            prefix = context[:, L - n + 1:]  # (N, n - 1): the last n - 1 tokens
            prefix_real = real[:, L - n + 1:].all(-1, keepdim=True)  # (N, 1)
            # The n-gram starting at the last n - 1 positions cannot be complete; unfold already stops before it.
            valid = valid & prefix_real & (grams[..., :-1] == prefix[:, None, :]).all(-1)
        banned = torch.zeros(N, logits.shape[1], dtype=torch.int32, device=logits.device)
        banned.scatter_add_(1, grams[..., -1], valid.to(torch.int32))  # duplicates add up; 0 = allowed
        return logits.masked_fill(banned > 0, float("-inf"))


class Temperature:
    """Divide the logits by ``t``: t < 1 sharpens the distribution, t > 1 flattens it (Ackley et al. 1985's
    Boltzmann temperature)."""

    def __init__(self, t: float) -> None:
        self.t = float(t)

    def __call__(self, logits: Tensor, context: Tensor, context_mask: Tensor) -> Tensor:
        return logits / self.t


class TopK:
    """Keep the ``k`` highest-scoring tokens, -inf elsewhere: Fan et al. 2018, "Hierarchical Neural Story
    Generation". Ties at the k-th score are all kept."""

    def __init__(self, k: int) -> None:
        self.k = int(k)

    def __call__(self, logits: Tensor, context: Tensor, context_mask: Tensor) -> Tensor:
        if self.k >= logits.shape[1]:
            return logits
        kth = logits.topk(self.k, dim=1).values[:, -1:]  # (N, 1)
        return logits.masked_fill(logits < kth, float("-inf"))


class TopP:
    """Nucleus sampling: Holtzman et al. 2020, "The Curious Case of Neural Text Degeneration".

    Keep the smallest set of most likely tokens whose probabilities sum to at least ``p`` (always at least the
    most likely token), -inf elsewhere.
    """

    def __init__(self, p: float) -> None:
        self.p = float(p)

    def __call__(self, logits: Tensor, context: Tensor, context_mask: Tensor) -> Tensor:
        if self.p >= 1.0:
            return logits
        sorted_logits, order = logits.sort(dim=1, descending=True)  # (N, V)
        probs = sorted_logits.softmax(dim=1)
        before = probs.cumsum(dim=1) - probs  # mass of the strictly more likely tokens
        drop_sorted = before >= self.p  # the first token always has before = 0 < p
        drop = torch.zeros_like(drop_sorted).scatter_(1, order, drop_sorted)
        return logits.masked_fill(drop, float("-inf"))


def seen_tokens(vocab_size: int, context: Tensor, context_mask: Tensor) -> Tensor:
    """(N, V) bool: which tokens occur at real (mask 1) positions of each context row."""
    counts = torch.zeros(context.shape[0], vocab_size, dtype=torch.int32, device=context.device)
    counts.scatter_add_(1, context, (context_mask != 0).to(torch.int32))
    return counts > 0


def build_processors(config: GenerationConfig) -> list[LogitsProcessor]:
    """The scoring processors ``config`` asks for (1-2 of the module docstring), for every strategy."""
    out: list[LogitsProcessor] = []
    if config.repetition_penalty != 1.0:
        out.append(RepetitionPenalty(config.repetition_penalty))
    if config.no_repeat_ngram_size > 0:
        out.append(NoRepeatNGram(config.no_repeat_ngram_size))
    return out


def build_warpers(config: GenerationConfig) -> list[LogitsProcessor]:
    """The sampling warpers ``config`` asks for (3-5 of the module docstring; empty unless strategy "sample")."""
    out: list[LogitsProcessor] = []
    if config.strategy == "sample":
        if config.temperature != 1.0:
            out.append(Temperature(config.temperature))
        if config.top_k > 0:
            out.append(TopK(config.top_k))
        if config.top_p < 1.0:
            out.append(TopP(config.top_p))
    return out


def apply_processors(processors: list[LogitsProcessor], logits: Tensor, context: Tensor,
                     context_mask: Tensor) -> Tensor:
    """Run ``processors`` in order on (N, V) logits."""
    for processor in processors:
        logits = processor(logits, context, context_mask)
    return logits

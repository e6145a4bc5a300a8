"""The loss options of the pretraining objectives that have any: one dataclass per objective, named by its registry
entry (``lmforge.objectives.registry``: ``loss_options``), filled from the run's ``[loss]`` table or ``--loss.X``
flags, and strict like every config (an unknown key lists the valid ones).

They are the objective's settings, not the data's: the weights of the terms of a loss and how it is evaluated.
"""

from __future__ import annotations

from dataclasses import dataclass

from lmforge.config import MAX_SIZE
from lmforge.errors import LmforgeError


@dataclass
class AWDLMLoss:
    """The loss options of objective awd_lm (``--loss.ar_alpha``, ``--loss.tar_beta``): activation regularisation
    (alpha x the mean of the dropped last-layer outputs squared) and temporal AR (beta x the mean of the squared
    step-to-step change of the raw outputs), Merity et al. 2018 section 4.6; theirs and fastai's values are 2 and 1.
    0 = off (the default: the committed ULMFiT runs trained without them)."""

    ar_alpha: float = 0.0
    tar_beta: float = 0.0

    def __post_init__(self) -> None:
        bad = [f"{name}={getattr(self, name)} must be a number >= 0 (Merity et al.: 2 and 1)"
               for name in ("ar_alpha", "tar_beta") if not 0.0 <= getattr(self, name) < float("inf")]  # refuses NaN
        if bad:
            raise LmforgeError("invalid loss options: " + "; ".join(bad))


@dataclass
class BiLMLoss:
    """The loss options of objective bilm (``--loss.carry_states``): carry each direction's LSTM state from one
    stream window to the next (bilm-tf's stateful training; the default), or start every window from zeros."""

    carry_states: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.carry_states, bool):
            raise LmforgeError(f"invalid loss options: carry_states={self.carry_states!r} must be true or false")


def _positive_finite(name: str, value: float, meaning: str) -> None:
    """Refuse a loss option that is not a finite number > 0 (booleans and NaN included), naming it and its meaning."""
    if isinstance(value, bool) or not 0.0 < value < float("inf"):
        raise LmforgeError(f"invalid loss options: {name}={value!r} must be a finite number > 0 ({meaning})")


@dataclass
class ElectraLoss:
    """The loss options of objective electra.

    - ``rtd_weight`` (``--loss.rtd_weight``): lambda, the weight of the discriminator's replaced-token-detection loss
      in L = L_MLM(generator) + lambda x L_disc (the paper's 50).
    - ``temperature``, ``temperature_end`` and ``temperature_until`` (``--loss.temperature``): the generator's
      samples are drawn from softmax(logits / tau) with tau moving from ``temperature`` at the start of the run to
      ``temperature_end`` (1: the paper's) at the share ``temperature_until`` of it (the budget's elapsed fraction,
      or of ``max_steps``), geometrically, then staying there: with q = min(p / temperature_until, 1),
      tau(p) = temperature ** (1 - q) * temperature_end ** q. A temperature above 1 flattens the generator's
      distribution, so its replacements are easier to tell from the text: a curriculum from easy to the paper's
      task (Dong et al. 2023, "Fast-ELECTRA", smooth the auxiliary model's output by a descending temperature
      schedule); an end above 1 keeps the task easier than the paper's to the end (on BBC at a few CPU-minutes it
      fine-tuned worse than ending at 1: BENCHMARKS.md, issue 36 round 13). 1, 1 (the defaults) is the paper's
      sampling throughout. Evaluation always samples at 1, so held-out metrics measure the paper's task.
    """

    rtd_weight: float = 50.0
    temperature: float = 1.0
    temperature_until: float = 1.0
    temperature_end: float = 1.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.rtd_weight < float("inf"):  # also refuses NaN
            raise LmforgeError(f"invalid loss options: rtd_weight={self.rtd_weight} must be a finite number >= 0 "
                               "(ELECTRA's lambda: 50)")
        _positive_finite("temperature", self.temperature,
                         "the generator's sampling temperature at the start of the run; 1: the paper's")
        if isinstance(self.temperature_until, bool) or not 0.0 < self.temperature_until <= 1.0:
            raise LmforgeError(f"invalid loss options: temperature_until={self.temperature_until!r} must be in (0, 1] "
                               "(the share of the run over which the sampling temperature reaches temperature_end)")
        _positive_finite("temperature_end", self.temperature_end,
                         "the generator's sampling temperature at the end of the schedule; 1: the paper's")

    @property
    def scheduled(self) -> bool:
        """Whether the sampling temperature differs from the paper's 1 at any point of the run."""
        return self.temperature != 1.0 or self.temperature_end != 1.0

    def temperature_at(self, fraction: float) -> float:
        """tau at the run's progress ``fraction`` in [0, 1] (see the class docstring)."""
        if not self.scheduled:
            return 1.0
        if fraction >= self.temperature_until:
            return float(self.temperature_end)
        q = max(0.0, fraction) / self.temperature_until
        return float(self.temperature ** (1.0 - q) * self.temperature_end ** q)


@dataclass
class TXLLoss:
    """The loss options of objective txl (``--loss.eval_mem_len``): the memory kept per layer while evaluating (None:
    the model's ``mem_len``, the training one); Dai et al. 2019 evaluate with a longer memory than they train with
    (WT103 base: 150 in training, 640 in evaluation). An option of the run's evaluation, not of the model: the saved
    model keeps its training ``mem_len``, and generation keeps every token anyway."""

    eval_mem_len: int | None = None

    def __post_init__(self) -> None:
        limit = MAX_SIZE["max_seq_len"]
        value = self.eval_mem_len
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= limit):
            raise LmforgeError(f"invalid loss options: eval_mem_len={value!r} must be an integer in [1, {limit:,}] "
                               "(the memory kept per layer while evaluating objective txl), or unset for the model's "
                               "mem_len")

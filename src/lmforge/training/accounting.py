"""The Trainer's bookkeeping: loss and metric sums over micro-batches, processes and logging windows, the records
made from them, the clock behind ``tokens_per_s`` / ``elapsed_s``, and the checks of what an objective returns.

Sums are kept as ``[sum, count]`` pairs (tensors stay on their device until the step's one all-reduce, so adding
them never synchronises); a record reports ``sum / count``. See ``lmforge.training.trainer`` for the contract.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch
from torch import Tensor

from lmforge.config import TrainConfig
from lmforge.errors import LmforgeError
from lmforge.training import distributed as dist

PERPLEXITY_TERMS = ("lm", "clm", "mlm", "plm")
# a metric named ``<x>_nll`` (a per-token negative log-likelihood) is also reported as ``<x>_ppl`` = exp of it
NLL_SUFFIX, PPL_SUFFIX = "_nll", "_ppl"
LOSS_PREFIX = "loss/"  # loss terms among the summed names ("loss/<term>"); other names are metrics


def batch_tokens(batch: dict[str, Any]) -> int:
    """Real tokens of a batch: ``attention_mask``, else source + target masks (seq2seq), else ``input_ids``."""
    mask = batch.get("attention_mask")
    if isinstance(mask, Tensor):
        return int(mask.sum())
    pair = [batch.get(k) for k in ("src_mask", "tgt_mask")]
    if any(isinstance(m, Tensor) for m in pair):
        return sum(int(m.sum()) for m in pair if isinstance(m, Tensor))
    ids = batch.get("input_ids")
    return ids.numel() if isinstance(ids, Tensor) else 0


def upcast(loss: Tensor) -> Tensor:
    """A half-precision loss in fp32, so that dividing and adding the terms loses nothing."""
    return loss.float() if loss.dtype in (torch.float16, torch.bfloat16) else loss


def _number(value: Tensor | float | int) -> Tensor | float:
    return value.detach().double() if isinstance(value, Tensor) else float(value)


def add_pairs(target: dict[str, list[Any]], pairs: dict[str, tuple[Any, Any]]) -> None:
    """``target[name] += (sum, count)`` for every pair (tensors stay on their device: no synchronisation)."""
    for name, (total, count) in pairs.items():
        pair = target.setdefault(name, [0.0, 0.0])
        pair[0] += _number(total)
        pair[1] += _number(count)


def perplexities(record: dict[str, Any]) -> dict[str, float]:
    """``<x>_ppl`` = exp(``<x>_nll``) for every per-token NLL metric of ``record``."""
    return {k[:-len(NLL_SUFFIX)] + PPL_SUFFIX: math.exp(min(v, 700.0)) for k, v in record.items()
            if k.endswith(NLL_SUFFIX) and isinstance(v, float)}


def global_sums(values: dict[str, Any], info: dist.DistInfo, device: torch.device) -> dict[str, float]:
    """Each value (number or scalar tensor) summed over all processes, in one all-reduce."""
    keys = sorted(values)
    packed = torch.stack([torch.as_tensor(values[k], dtype=torch.float64, device=device) for k in keys]) \
        if keys else torch.zeros(0, dtype=torch.float64, device=device)
    return dict(zip(keys, dist.all_reduce_sum(packed, info).tolist(), strict=True))


def packed_sums(sums: dict[str, list[Any]]) -> dict[str, Any]:
    """A step's ``[sum, count]`` pairs flattened for ``global_sums``: ``<name>/sum`` for all, ``<name>/count`` for
    metrics (a loss term's count is already known, from ``objective.counts``)."""
    return {**{f"{k}/sum": v[0] for k, v in sums.items()},
            **{f"{k}/count": v[1] for k, v in sums.items() if not k.startswith(LOSS_PREFIX)}}


class RunClock:
    """Training time and throughput: ``elapsed`` (this session plus the time trained before a resume) and the
    tokens per second of the current logging window."""

    def __init__(self) -> None:
        self.start(0.0)

    def start(self, elapsed_before: float) -> None:
        """Start timing now, after ``elapsed_before`` seconds trained in earlier sessions."""
        self.t0 = self.t_window = time.perf_counter()
        self.window_tokens, self.elapsed_before = 0, elapsed_before

    def elapsed(self) -> float:
        """Seconds trained so far, earlier sessions included."""
        return self.elapsed_before + time.perf_counter() - self.t0

    def tokens_per_s(self) -> float:
        """Tokens per second since the logging window began."""
        return self.window_tokens / max(time.perf_counter() - self.t_window, 1e-9)

    def new_window(self) -> None:
        """Begin the next logging window."""
        self.t_window, self.window_tokens = time.perf_counter(), 0


def add_step(window: dict[str, Any], *, loss: float, grad_norm: float, terms: dict[str, float],
             metrics: dict[str, tuple[float, float]], predicted_tokens: int | None) -> None:
    """Add one optimizer step to the logging window (``lmforge.training.state.new_window``).

    Args:
        window: the window's sums, changed in place.
        loss: the step's loss (the sum of its terms).
        grad_norm: the gradient norm before clipping.
        terms: each loss term's value.
        metrics: each metric's (sum, count) over the global batch.
        predicted_tokens: the items of the objective's ``predicted_tokens_term`` (None: it names none).
    """
    window["steps"] += 1
    window["loss"] += loss
    window["grad_norm"] += grad_norm
    for t, v in terms.items():
        window["terms"][t] = window["terms"].get(t, 0.0) + v
    if predicted_tokens is not None:
        window["predicted_tokens"] = window.get("predicted_tokens", 0) + predicted_tokens
    add_pairs(window["metrics"], metrics)


def window_record(window: dict[str, Any], *, step: int, epoch: int, lr: float, tokens: int, tokens_per_s: float,
                  elapsed_s: float) -> dict[str, Any]:
    """The training record (a line of ``metrics.jsonl``) of a logging window: its means and the run's counters."""
    n = max(window["steps"], 1)
    record: dict[str, Any] = {"step": step, "epoch": epoch, "loss": window["loss"] / n}
    record.update({f"loss_{t}": v / n for t, v in sorted(window["terms"].items())})
    record.update({name: s / c if c else 0.0 for name, (s, c) in sorted(window["metrics"].items())})
    record.update(perplexities(record))
    record.update({"lr": lr, "grad_norm": window["grad_norm"] / n, "tokens_per_s": tokens_per_s, "tokens": tokens,
                   "elapsed_s": elapsed_s})
    if "predicted_tokens" in window:  # this interval's predicted (e.g. masked) tokens, next to the running tokens
        record["predicted_tokens"] = int(window["predicted_tokens"])
    return record


def eval_result(names: list[str], totals: dict[str, float],
                weights: dict[str, float] | None = None) -> dict[str, float]:
    """The evaluation record from the global sums: ``eval_loss`` (the sum of the terms), ``eval_loss_<term>``,
    ``eval_ppl_<term>`` for language-model terms, ``eval_<metric>`` and the perplexities of NLL metrics.

    Args:
        names: every summed name (``loss/<term>`` and metric names), the same on every process.
        totals: ``<name>/sum`` and ``<name>/count`` summed over all processes.
        weights: the weight an objective applied to a term (its ``term_weights``, e.g. distillation's alpha_mlm =
            2): the term's perplexity is that of the unweighted loss, exp(loss / weight).
    """
    result: dict[str, float] = {"eval_loss": 0.0}
    for name in names:
        total, count = totals[f"{name}/sum"], totals[f"{name}/count"]
        if name.startswith(LOSS_PREFIX):
            term = name[len(LOSS_PREFIX):]
            result[f"eval_loss_{term}"] = total / max(count, 1.0)
            result["eval_loss"] += result[f"eval_loss_{term}"]
            if term in PERPLEXITY_TERMS:
                weight = (weights or {}).get(term, 1.0)
                result[f"eval_ppl_{term}"] = math.exp(min(result[f"eval_loss_{term}"] / weight, 700.0))
        else:
            result[f"eval_{name}"] = total / count if count else 0.0
    result.update(perplexities(result))
    return result


def check_output(objective: Any, losses: dict[str, Any], batch: dict[str, Any], terms: list[str]) -> None:
    """First step only: the objective's losses and counts must describe the same terms and item numbers."""
    if sorted(losses) != terms:
        raise LmforgeError(f"the objective returned loss terms {sorted(losses)} but its counts() gave "
                           f"{terms}; they must name the same terms")
    expected = objective.counts(batch)
    for t in terms:
        got = int(losses[t][1])
        if got != int(expected[t]):
            raise LmforgeError(f"loss term {t!r}: objective(model, batch) summed over {got} items but "
                               f"objective.counts(batch) says {int(expected[t])}; they must agree")


def check_same_names(names: list[str], info: dist.DistInfo) -> None:
    """First step only: every process must report the same loss terms and metrics (they are summed by position)."""
    everyone = dist.gather_objects(names, info)
    if any(theirs != everyone[0] for theirs in everyone):
        raise LmforgeError(f"processes disagree on the loss terms / metrics: {everyone}; every process must "
                           "report the same names")


def diverged_message(config: TrainConfig, precision: str, step: int, loss: float, grad_norm: float, lr: float) -> str:
    """A non-finite loss or gradient norm at ``step``: what happened, the likely cause and the options to change."""
    what = f"the loss is {loss}" if not math.isfinite(loss) else f"the gradient norm is {grad_norm}"
    fixes = [f"lower the learning rate (--lr or --train.lr; now {config.lr:g})",
             f"lengthen the warm-up (--train.warmup_ratio, now {config.warmup_ratio:g}, or --train.warmup_steps)"]
    if config.max_grad_norm <= 0:
        fixes.append("clip the gradients (--train.max_grad_norm=1.0)")
    if precision == "bf16":
        fixes.append("train in fp32 (--precision fp32)")
    return (f"training diverged: {what} at step {step} (lr {lr:.3g}). It stopped without updating the "
            "weights or saving; the last checkpoint, if any, is intact. Likely cause: too large a step for "
            f"this model and data; {', or '.join(fixes)}, then start again (or --resume auto from the last "
            "checkpoint)")

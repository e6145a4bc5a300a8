"""AdamW with decoupled weight decay (Loshchilov & Hutter, 2019), LAMB (You et al., 2020) or NT-ASGD (Merity et al.
2018: SGD, then the average of its iterates; ``lmforge.training.ntasgd``), and the learning-rate schedules of the
papers.

Weight decay applies to matrices (linear and embedding weights) only: biases, LayerNorm parameters and every other
parameter with fewer than two dimensions are excluded, as in BERT (google-research/bert ``optimization.py``) and
GPT-2 training code. With LAMB the same parameters are also excluded from the layer-wise trust ratio, as in ALBERT's
``lamb_optimizer.py`` (``exclude_from_layer_adaptation`` defaults to ``exclude_from_weight_decay``).

Schedules are pure functions of the step (``lr_multiplier``); ``build_scheduler`` wraps one in a ``LambdaLR``. Steps
count optimizer updates from 1: update ``s`` uses ``lr * lr_multiplier(s, config)``. A run with a time or token
budget (``TrainConfig.budget``) follows the same shapes on the elapsed fraction of its budget instead
(``lr_multiplier_at``); the Trainer sets that lr before every update.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from lmforge.config import TrainConfig
from lmforge.errors import LmforgeError
from lmforge.training.ntasgd import NTASGD

NORM_TYPES: tuple[type, ...] = tuple(
    t for t in (nn.LayerNorm, nn.GroupNorm, getattr(nn, "RMSNorm", None), nn.modules.batchnorm._BatchNorm) if t)


def decay_parameter_names(model: nn.Module) -> tuple[list[str], list[str]]:
    """Names of the trainable parameters that get weight decay, and of those that do not.

    No decay: any parameter with fewer than 2 dimensions (biases, norm scales), any parameter named ``*bias``, and
    every parameter of a normalisation module. A tied parameter appears once (under its first name).
    """
    in_norm = set()
    for module_name, module in model.named_modules():
        if isinstance(module, NORM_TYPES):
            in_norm.update(f"{module_name}.{n}" if module_name else n for n, _ in module.named_parameters())
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        if param.ndim < 2 or name.endswith("bias") or name in in_norm:
            no_decay.append(name)
        else:
            decay.append(name)
    return decay, no_decay


class Lamb(torch.optim.Optimizer):
    """LAMB, Algorithm 2 of You et al. 2020 ("Large Batch Optimization for Deep Learning: Training BERT in 76
    minutes"), with φ the identity (no clipping of the weight norm), as in ALBERT's released ``lamb_optimizer.py``.

    For every parameter tensor w with gradient g, at its own step t (counted from 1, like AdamW's):

    - m = β1 m + (1 - β1) g;  v = β2 v + (1 - β2) g²  (Adam's moments, zero at start)
    - with ``bias_correction``: m̂ = m / (1 - β1^t), v̂ = v / (1 - β2^t); without: m̂ = m, v̂ = v
    - u = m̂ / (sqrt(v̂) + eps) + weight_decay · w
    - r = ||w|| / ||u|| when both norms are > 0, else 1; and r = 1 in a group with ``adapt=False``
    - w = w - lr · r · u

    **Bias correction**: on by default, as in the paper's Algorithm 2 (and NVIDIA's and TF-Addons' LAMB);
    ``bias_correction=False`` gives the released BERT/ALBERT TensorFlow optimizer, which has none. In an adapted
    group the correction is one scalar per tensor, which the trust ratio cancels except for its weight against
    ``eps`` and ``weight_decay``; it matters where LAMB is Adam, in the ``adapt=False`` groups (biases, LayerNorm):
    without it their steps are (1 - β1^t) / sqrt(1 - β2^t) times Adam's: with β = 0.9, 0.999, 3.2 at t = 1, 6.6 at
    t = 12, still 1.26 at t = 1000. We follow the paper, so that those parameters move as with AdamW.

    Group options: ``lr``, ``betas``, ``eps``, ``weight_decay``, ``adapt`` (apply the trust ratio) and
    ``bias_correction``. Parameters whose gradient is ``None`` are skipped (no moment, step or decay change, as
    AdamW); sparse gradients are refused. The state (``step``, ``exp_avg``, ``exp_avg_sq`` per parameter) saves and
    loads with ``state_dict`` / ``load_state_dict``.
    """

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-6, weight_decay: float = 0.0, adapt: bool = True,
                 bias_correction: bool = True) -> None:
        if not 0.0 <= lr:
            raise ValueError(f"invalid learning rate {lr}")
        if not 0.0 < eps:
            raise ValueError(f"invalid eps {eps}: must be positive")
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError(f"invalid betas {betas}: each must be in [0, 1)")
        if not 0.0 <= weight_decay:
            raise ValueError(f"invalid weight_decay {weight_decay}")
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, adapt=adapt,
                        bias_correction=bias_correction)
        super().__init__(params, defaults)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """As ``torch.optim.Optimizer``'s, refusing the state of another optimizer (AdamW's groups lack ``adapt``)."""
        missing = {key for group in state_dict.get("param_groups", []) for key in ("adapt", "bias_correction")
                   if key not in group}
        if missing:
            raise LmforgeError(f"this optimizer state is not LAMB's (its groups lack {', '.join(sorted(missing))}): "
                               "it was saved by another optimizer (train.optimizer)")
        super().load_state_dict(state_dict)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        """One update of every parameter that has a gradient; ``closure`` re-evaluates the loss (optional)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            lr, eps, decay = group["lr"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad
                if grad.is_sparse:
                    raise RuntimeError("Lamb does not support sparse gradients")
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                t, exp_avg, exp_avg_sq = state["step"], state["exp_avg"], state["exp_avg_sq"]
                exp_avg.mul_(beta1).add_(grad, alpha=1.0 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1.0 - beta2)
                if group["bias_correction"]:
                    denom = (exp_avg_sq / (1.0 - beta2 ** t)).sqrt_().add_(eps)
                    update = (exp_avg / (1.0 - beta1 ** t)).div_(denom)
                else:
                    update = exp_avg / exp_avg_sq.sqrt().add_(eps)
                if decay:
                    update.add_(p, alpha=decay)
                if group["adapt"]:
                    # a 0-dim tensor: no host synchronisation on an accelerator
                    w_norm, u_norm = torch.linalg.vector_norm(p), torch.linalg.vector_norm(update)
                    ratio = torch.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm, torch.ones_like(w_norm))
                    update.mul_(ratio)
                p.add_(update, alpha=-lr)
        return loss


# the optimizer of each name in lmforge.choices.OPTIMIZERS
OPTIMIZER_CLASSES: dict[str, type[torch.optim.Optimizer]] = {"adamw": torch.optim.AdamW, "lamb": Lamb,
                                                             "nt_asgd": NTASGD}


def build_optimizer(model: nn.Module, config: TrainConfig,
                    lr_scales: dict[str, float] | None = None) -> torch.optim.Optimizer:
    """``config.optimizer`` (AdamW, ``Lamb`` or ``NTASGD``) over the trainable parameters, grouped by weight decay (on
    / off) and learning-rate multiplier. With LAMB the no-decay groups also skip the trust ratio (``adapt=False``).
    NT-ASGD takes ``lr``, ``weight_decay`` (as L2) and ``nonmono``; the betas and eps are Adam's and unused.

    Args:
        model: the plain (unwrapped) module, already on its device.
        config: ``optimizer``, ``lr``, ``beta1``, ``beta2``, ``eps``, ``weight_decay``.
        lr_scales: parameter name -> multiplier of ``config.lr`` (a separate head lr, layer-wise decay; see
            ``lmforge.training.freeze.lr_scales``); missing names get 1. The schedule multiplies every group's
            own peak lr.
    """
    params = dict(model.named_parameters())
    decay, no_decay = decay_parameter_names(model)
    scales = lr_scales or {}
    grouped: dict[tuple[bool, float], list[nn.Parameter]] = {}
    for names, decays in ((decay, True), (no_decay, False)):
        for n in names:
            grouped.setdefault((decays, float(scales.get(n, 1.0))), []).append(params[n])
    if not grouped:
        raise LmforgeError("no trainable parameter: everything is frozen (check --freeze)")
    # the first group is a decayed one at scale 1 when there is one: the Trainer logs param_groups[0]["lr"]
    order = sorted(grouped, key=lambda key: (key[1] != 1.0, not key[0], -key[1]))
    groups = [{"params": grouped[key], "weight_decay": config.weight_decay if key[0] else 0.0,
               "lr": config.lr * key[1]} for key in order]
    options = dict(lr=config.lr, betas=(config.beta1, config.beta2), eps=config.eps)
    if config.optimizer not in OPTIMIZER_CLASSES:  # TrainConfig validates it; internal invariant
        raise LmforgeError(f"unknown optimizer {config.optimizer!r}; choose one of {', '.join(OPTIMIZER_CLASSES)}")
    if config.optimizer == "nt_asgd":
        if config.parallel == "fsdp":
            raise LmforgeError("optimizer nt_asgd keeps a whole copy of the averaged weights, which FSDP would have "
                               "to shard: use parallel=ddp (or one process) with nt_asgd")
        return NTASGD(groups, lr=config.lr, weight_decay=config.weight_decay, nonmono=config.nonmono)
    if config.optimizer == "lamb":
        for group, key in zip(groups, order, strict=True):
            group["adapt"] = key[0]
        return Lamb(groups, **options)
    # The fused kernel updates each tensor in one pass: on our 2-core CPUs a bert-mini-sized AdamW step took 40 ms
    # fused against 457 ms with the default per-tensor loop (foreach: 360 ms). Same update rule.
    try:
        return torch.optim.AdamW(groups, fused=True, **options)
    except (RuntimeError, TypeError, ValueError):  # a device or dtype the fused kernel does not support
        return torch.optim.AdamW(groups, **options)


def lr_multiplier(step: int, config: TrainConfig) -> float:
    """Factor applied to ``config.lr`` at optimizer update ``step`` (1-based).

    With W = ``config.warmup()``, N = ``max_steps`` and r = ``min_lr_ratio``:

    - warm-up (linear, cosine, constant, inverse_sqrt): ``step / W`` for ``step <= W`` (the peak at update W);
    - ``linear``: then ``r + (1 - r) * (1 - p)`` with progress p = (step - W - 1) / (N - W);
    - ``cosine``: ``r + (1 - r) * (1 + cos(pi p)) / 2``;
    - ``constant``: 1;
    - ``inverse_sqrt`` (Vaswani et al., 2017, section 5.3, normalised to peak 1): ``min(step / W, sqrt(W / step))``,
      floored at r; with W = 0, ``1 / sqrt(step)``.
    - ``slanted_triangular`` (ULMFiT's STLR, Howard & Ruder 2018, eq. 3; no separate warm-up, ``min_lr_ratio`` unused):
      with T = N, cut = floor(T * cut_frac), t = step,
      ``p = t / cut`` for t < cut, else ``1 - (t - cut) / (cut * (1 / cut_frac - 1))``, and the factor
      ``(1 + p (ratio - 1)) / ratio`` (``cut_frac = stlr_cut_frac`` 0.1, ``ratio = stlr_ratio`` 32): a short linear
      rise from 1/ratio to the peak at update ``cut``, then a long linear decay back to about 1/ratio at update T;
      floored at 1/ratio past T (and for cut = 0, where the rise is skipped).

    The decay counts completed updates (as Hugging Face's schedules do), so no update runs at lr 0: the first one
    uses ``lr / W`` (or the peak without warm-up), the last one ``r + (1 - r) / (N - W)`` for ``linear``, and the
    factor would reach r at update N + 1. Past N the linear and cosine factors stay at r.
    """
    step = max(step, 1)
    if config.schedule == "slanted_triangular":
        return slanted_triangular(step, config.max_steps, config.stlr_cut_frac, config.stlr_ratio)
    warmup, total, floor = config.warmup(), config.max_steps, config.min_lr_ratio
    if config.schedule == "inverse_sqrt":
        return max(floor, min(step / warmup, math.sqrt(warmup / step)) if warmup else 1.0 / math.sqrt(step))
    if step <= warmup:
        return step / warmup
    if config.schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup - 1) / max(1, total - warmup))
    if config.schedule == "linear":
        return floor + (1.0 - floor) * (1.0 - progress)
    if config.schedule == "cosine":
        return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"unknown schedule {config.schedule!r}")  # TrainConfig validates it; internal invariant


def slanted_triangular(t: int, total: int, cut_frac: float = 0.1, ratio: float = 32.0) -> float:
    """STLR's factor of the peak lr at iteration ``t`` of ``total`` (Howard & Ruder 2018, eq. 3; see
    ``lr_multiplier``)."""
    cut = math.floor(total * cut_frac)
    if t < cut:
        p = t / cut
    elif cut == 0:
        p = max(0.0, 1.0 - t / max(total, 1))
    else:
        p = max(0.0, 1.0 - (t - cut) / (cut * (1.0 / cut_frac - 1.0)))
    return (1.0 + p * (ratio - 1.0)) / ratio


def lr_multiplier_at(fraction: float, config: TrainConfig, before: float | None = None) -> float:
    """Factor applied to ``config.lr`` by an update of a budgeted run (``TrainConfig.budget``), the same shapes as
    ``lr_multiplier`` on the elapsed fraction of the budget instead of the step.

    ``fraction`` (a) is the fraction of the budget elapsed after this update (token budget: the tokens so far with
    this update's, over the budget; time budget: the training seconds at this update, over the budget), ``before``
    (b) the fraction after the previous update (0 for the first; default: a). With w = ``warmup_ratio`` and
    r = ``min_lr_ratio``:

    - warm-up (linear, cosine, constant, inverse_sqrt): ``a / w`` for ``a <= w`` (no warm-up when w = 0);
    - ``linear``: then ``r + (1 - r) * (1 - p)`` with progress p = clamp((b - w) / (1 - w), 0, 1);
    - ``cosine``: ``r + (1 - r) * (1 + cos(pi p)) / 2``;
    - ``constant``: 1;
    - ``inverse_sqrt``: ``min(a / w, sqrt(w / a))`` floored at r (w must be > 0: TrainConfig checks it);
    - ``slanted_triangular`` (no separate warm-up, ``min_lr_ratio`` unused), with c = ``stlr_cut_frac`` and
      ratio = ``stlr_ratio``: ``p = a / c`` for a < c, else ``max(0, 1 - (a - c) / (1 - c))``, and the factor
      ``(1 + p (ratio - 1)) / ratio``.

    As in ``lr_multiplier``, the warm-up counts the update itself (a) and the decay the updates completed before it
    (b), so no update runs at lr 0: the first one is at ``a / w``, the last one (the first with a >= 1) at the
    decay's value at its b < 1. A token budget of exactly N updates' tokens (a = s / N, b = (s - 1) / N, w = W / N)
    gives ``lr_multiplier``'s factors for N steps.
    """
    a = max(0.0, fraction)
    b = a if before is None else max(0.0, before)
    if config.schedule == "slanted_triangular":
        cut = config.stlr_cut_frac
        p = a / cut if a < cut else max(0.0, 1.0 - (a - cut) / (1.0 - cut))
        return (1.0 + p * (config.stlr_ratio - 1.0)) / config.stlr_ratio
    warmup, floor = config.warmup_ratio, config.min_lr_ratio
    if config.schedule == "inverse_sqrt":
        return max(floor, min(a / warmup, math.sqrt(warmup / a)) if a > 0 else 0.0)
    if a <= warmup:
        return a / warmup
    if config.schedule == "constant":
        return 1.0
    progress = min(1.0, max(0.0, (b - warmup) / (1.0 - warmup)))
    if config.schedule == "linear":
        return floor + (1.0 - floor) * (1.0 - progress)
    if config.schedule == "cosine":
        return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"unknown schedule {config.schedule!r}")  # TrainConfig validates it; internal invariant


def build_scheduler(optimizer: torch.optim.Optimizer, config: TrainConfig,
                    budget_factor: Callable[[], float] | None = None) -> LambdaLR:
    """A ``LambdaLR`` whose lr before the s-th ``scheduler.step()`` call is ``lr * lr_multiplier(s + 1)``.

    Call ``scheduler.step()`` once after every ``optimizer.step()``. A budgeted run passes ``budget_factor``, the
    factor (``lr_multiplier_at``) of its latest update, which the scheduler then reports instead of a step's.
    """

    def factor(completed: int) -> float:  # LambdaLR passes the number of completed updates
        if budget_factor is not None:
            return budget_factor()
        return lr_multiplier(completed + 1, config)

    return LambdaLR(optimizer, factor)

"""Where and how the Trainer runs its model: the device, the batch split, the precision, FSDP sharding, DDP and
``torch.compile`` (``ModelPlacement``), gradient clipping, the schedule on resume, and evaluation mode.

**Compile** (``config.compile``, ``--compile``): in ``fit`` the module the objective calls is compiled with
``torch.compile`` after DDP wrapped it (``lmforge.utils.compiling``), and evaluation calls a compiled plain module;
the optimizer, checkpoints, the best and the final model read the plain module, so no saved key carries the
wrapper's ``_orig_mod.``. ``compile`` may change on resume: dropout draws the same numbers either way.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from lmforge.config import ModelConfig, TrainConfig
from lmforge.errors import LmforgeError
from lmforge.training import checkpoint as ckpt
from lmforge.training import distributed as dist
from lmforge.training.logging import allocator_hint, cpu_bf16_hint, tune_glibc_malloc
from lmforge.training.precision import resolve_precision
from lmforge.training.state import Stateful
from lmforge.utils.compiling import check_compile, compile_backend, compile_module, is_compiled

log = logging.getLogger("lmforge")


def resolve_device(name: str, info: dist.DistInfo) -> torch.device:
    """The torch device for ``TrainConfig.device``: "auto" = this process's GPU when CUDA is available, else the
    CPU; "cuda" = this process's GPU (``local_rank``).

    Raises:
        LmforgeError: not a torch device, or CUDA asked for where there is none.
    """
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        name = f"cuda:{info.local_rank}"
    try:
        device = torch.device(name)
    except RuntimeError as err:
        raise LmforgeError(f"device={name!r} is not a torch device; use auto, cpu, cuda or cuda:N") from err
    if device.type == "cuda" and not torch.cuda.is_available():
        raise LmforgeError(f"device={name!r} but CUDA is not available; use device=auto or cpu")
    return device


def settled(config: TrainConfig) -> TrainConfig:
    """``config`` with nothing left to derive: ``max_steps`` must be set (a recipe derives it from epochs) unless a
    ``budget`` limits the run; unset ``eval_every`` means off. Unset ``save_every`` / ``save_minutes`` stay None: the
    default cadence."""
    if config.max_steps is None and not config.budget:
        raise LmforgeError("train.max_steps is not set: give it (--max-steps / --train.max_steps) or a budget "
                           "(--budget / --train.budget), or let a recipe derive it from epochs")
    if config.eval_every is None:
        config = dataclasses.replace(config, eval_every=0)
    return config


def split_batch(config: TrainConfig, world_size: int) -> tuple[int, int]:
    """(micro_batch_size, accumulation steps) with batch_size = micro * accumulation * world_size."""
    micro = config.micro_batch_size or config.batch_size // world_size
    if micro < 1 or config.batch_size % (micro * world_size):
        raise LmforgeError(
            f"batch_size={config.batch_size} is not divisible by micro_batch_size={config.micro_batch_size or micro}"
            f" x world_size={world_size} (= {micro * world_size}); choose a batch_size that is a multiple of "
            "micro_batch_size times the number of processes")
    return micro, config.batch_size // (micro * world_size)


def find_model_config(model: nn.Module) -> ModelConfig | None:
    """``model.config`` or ``model.backbone.config`` (a TaskModel), when it is a ModelConfig."""
    for candidate in (model, getattr(model, "backbone", None)):
        if isinstance(getattr(candidate, "config", None), ModelConfig):
            return candidate.config
    return None


def choose_precision(requested: str, saved: Any, model_config: ModelConfig | None, device: torch.device,
                     decide: Callable[[Callable[[], Any]], Any], announce: bool) -> str:
    """The precision to train in, "fp32" or "bf16" (``lmforge.training.precision``).

    Args:
        requested: ``TrainConfig.precision`` ("fp32", "bf16" or "auto").
        saved: the precision saved in the checkpoint this run resumes from (kept: a resumed run trains as it began).
        model_config: sizes the CPU measurement of "auto".
        device: the training device.
        decide: runs its argument on rank 0 and gives every rank the answer (all ranks must agree).
        announce: log the decision (rank 0).
    """
    if saved in ("fp32", "bf16"):
        if requested == "auto" and announce:
            log.info("precision auto: %s, as decided when this run started (saved in its checkpoint)", saved)
        return saved
    width = model_config.d_model if model_config is not None else 256
    d_ff = model_config.d_ff if model_config is not None else None
    choice = decide(lambda: resolve_precision(requested, device, d_model=width, d_ff=d_ff))
    if requested == "auto" and announce:
        log.info("precision %s (%s)", choice.precision, choice.reason)
    return choice.precision


def log_cpu_hints(device: torch.device, precision: str) -> None:
    """On a CPU: the allocator hint, and a warning when bf16 would be emulated (rank 0 calls this)."""
    if device.type != "cpu":
        return
    for level, hint in ((logging.INFO, allocator_hint()),
                        (logging.WARNING, cpu_bf16_hint() if precision == "bf16" else None)):
        if hint:
            log.log(level, hint)


def apply_schedule(optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LambdaLR) -> None:
    """After resuming, set every group's lr to what THIS run's schedule gives at the restored step.

    The optimizer state carries the lr the checkpointed run's schedule had set; when ``max_steps`` grew on resume
    (a longer decay) that lr is stale, and the first step after resuming would use it (0 at the old run's end).
    With an unchanged schedule this recomputes the same number, so exact resumption is untouched.
    """
    for group, base, factor in zip(optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas, strict=True):
        group["lr"] = base * factor(scheduler.last_epoch)
    scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]


@contextlib.contextmanager
def evaluation_mode(model: nn.Module) -> Iterator[None]:
    """Eval mode for the block; the training mode and the global RNG state are put back afterwards, so that
    evaluating never changes the training run's random stream."""
    rng = ckpt.capture_rng()
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)
        ckpt.restore_rng(rng)


class ModelPlacement:
    """The model in the roles the Trainer needs, on its device.

    ``model`` is the plain module that the optimizer, checkpoints and saved models read; ``forward`` is what the
    objective calls during training (DDP-wrapped, then compiled, by ``prepare_for_fit``); ``eval_model`` is what
    evaluation calls (the plain module, compiled under ``--compile``).

    Args:
        model: a plain module, or a compiled / DDP-wrapped one; moved to ``device``.
        device: the training device.
        info: the process group.
        fsdp: ``parallel = "fsdp"``: shard the model over the processes (now: before the optimizer sees it).
        compile: ``TrainConfig.compile``; checked here, so that it fails before any work where it cannot work.
    """

    def __init__(self, model: nn.Module, device: torch.device, info: dist.DistInfo, *, fsdp: bool,
                 compile: bool) -> None:
        self.device, self.dist, self.compile = device, info, compile
        self.model = dist.unwrap_model(model).to(device)
        self.forward = model.to(device)
        if compile:
            check_compile(device)
        self._eval_model: nn.Module | None = None
        # FSDP2: the tied parameter names, which gathered states must restore (None: not sharded)
        self.tied = self._shard() if fsdp else None

    def _shard(self) -> dict[str, str] | None:
        """Shard the model over the processes (None in a single process: nothing to shard)."""
        if not self.dist.distributed:
            log.warning("parallel=fsdp in a single process: nothing to shard, training the whole model here")
            return None
        if self.forward is not self.model:
            raise LmforgeError("parallel=fsdp shards the model itself; pass the plain module, not a compiled or "
                               "DDP-wrapped one")
        return dist.shard_model(self.model, self.dist)

    @property
    def sharded(self) -> bool:
        """Whether FSDP shards the model (then every rank takes part in gathering and clipping)."""
        return self.tied is not None

    @property
    def eval_model(self) -> nn.Module:
        """What evaluation calls."""
        return self._eval_model if self._eval_model is not None else self.model

    def gathered_state(self) -> dict[str, Tensor] | None:
        """A sharded model's full state dict (rank 0; every rank must call this), None when not sharded."""
        return dist.gather_model_state(self.model, self.tied) if self.tied is not None else None

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> Stateful:
        """The optimizer as a checkpoint component: a sharded model's full state is gathered from every rank."""
        return optimizer if self.tied is None else dist.GatheredOptimizerState(self.model, optimizer)

    def load_weights(self, path: Path) -> None:
        """Load a checkpoint's weights into the plain module (sharding them back under FSDP)."""
        if self.sharded:
            dist.load_model_state(self.model, ckpt.read_model_state(path))
        else:
            ckpt.load_model(self.model, path)

    def prepare_for_fit(self) -> None:
        """DDP-wrap the forward module (a sharded model synchronises itself), then compile under ``--compile``:
        ``torch.compile(DDP(model))``, as PyTorch documents for DDP."""
        if self.device.type == "cpu" and (line := tune_glibc_malloc()) and self.dist.is_main:
            log.info(line)  # every rank tunes its own process
        if not self.sharded:
            self.forward = dist.wrap_model(self.forward, self.dist, self.device)
        self._eval_model = self.model
        if not self.compile:
            return
        inner = getattr(self.forward, "module", self.forward)  # under DDP
        if not (is_compiled(self.forward) or is_compiled(inner)):  # a model the caller compiled stays as is
            self.forward = compile_module(self.forward, self.device)
        wrapped = getattr(self.forward, "_orig_mod", None)
        # one process: evaluation shares the compiled module (its eval-mode graph is one more cache entry)
        self._eval_model = self.forward if wrapped is self.model else compile_module(self.model, self.device)
        if self.dist.is_main:
            log.info("--compile: torch.compile, %s backend; the first steps (and evaluations) include compiling",
                     compile_backend())

    def clip_gradients(self, max_norm: float) -> float:
        """Clip the gradients to ``max_norm`` (0: no clipping) and return their norm before clipping.

        Raises:
            LmforgeError: no parameter received a gradient (the objective did not call the model).
        """
        params = [p for p in self.model.parameters() if p.grad is not None]
        if not params:
            raise LmforgeError("no parameter received a gradient; does the objective call model(...) and return "
                               "losses that depend on it?")
        if self.sharded:  # DTensor gradients: the norm is a partial sum until gathered
            norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm > 0 else math.inf)
            return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
        if max_norm > 0:
            return float(torch.nn.utils.clip_grad_norm_(params, max_norm))
        norms = torch.stack([torch.linalg.vector_norm(p.grad.detach().float()) for p in params])
        return float(torch.linalg.vector_norm(norms))

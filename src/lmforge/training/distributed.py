"""Data-parallel training across processes: the ONLY file in lmforge that imports ``torch.distributed``.

Everything is driven by the environment that ``torchrun`` sets (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
MASTER_PORT). Without those variables every helper here is a cheap single-process no-op.

One machine, N processes::

    torchrun --nproc-per-node N -m lmforge pretrain ...

Several machines (run the same command on every node, R = 0 .. nnodes-1; HOST:PORT is reachable from all nodes,
e.g. node 0's address; the checkpoint folder must be on a file system that every node sees)::

    torchrun --nnodes 2 --node-rank R --rdzv-backend c10d --rdzv-endpoint HOST:PORT --nproc-per-node N \\
        -m lmforge pretrain ...

The backend is gloo on CPU and nccl on CUDA (each process uses the GPU ``cuda:LOCAL_RANK``).

Two ways to spread the model (``TrainConfig.parallel``):

- ``ddp`` (default): every process holds the whole model; gradients are all-reduced (``DistributedDataParallel``).
- ``fsdp``: FSDP2 (``torch.distributed.fsdp.fully_shard``): each process holds 1/N of every parameter, gradient and
  optimizer state; each layer of every ``*layers`` stack is one unit, gathered just before it runs and freed after,
  the rest of the model (embeddings, heads) is the root unit. For models that do not fit one device. Checkpoints
  and saved models are gathered: the same files as a ``ddp`` or single-process run (``gather_model_state``,
  ``gather_optimizer_state``), so a checkpoint resumes exactly and a saved model loads anywhere.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from lmforge.errors import LmforgeError

ENV_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits: global ``rank`` in [0, world_size), ``local_rank`` on its machine."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        """Rank 0 logs, plots and writes checkpoints."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def _env_int(name: str) -> int:
    try:
        return int(os.environ[name])
    except ValueError as err:
        raise LmforgeError(f"environment variable {name}={os.environ[name]!r} must be an integer "
                           "(it is set by torchrun)") from err


def init_distributed(backend: str | None = None) -> DistInfo:
    """Join the process group that ``torchrun`` describes in the environment; single process when it does not.

    Calling it again (or after the caller initialised ``torch.distributed`` itself) returns the same DistInfo.

    Args:
        backend: "gloo" or "nccl"; default nccl when CUDA is available, else gloo.

    Returns:
        DistInfo(rank, world_size, local_rank).
    """
    if dist.is_available() and dist.is_initialized():
        local = _env_int("LOCAL_RANK") if "LOCAL_RANK" in os.environ else dist.get_rank()
        return DistInfo(dist.get_rank(), dist.get_world_size(), local)
    if "WORLD_SIZE" not in os.environ or _env_int("WORLD_SIZE") <= 1:
        return DistInfo()
    missing = [name for name in ENV_VARS if name not in os.environ]
    if missing:
        raise LmforgeError(f"WORLD_SIZE={os.environ['WORLD_SIZE']} but {', '.join(missing)} not set; launch "
                           "distributed runs with torchrun (e.g. torchrun --nproc-per-node 2 -m lmforge ...)")
    info = DistInfo(_env_int("RANK"), _env_int("WORLD_SIZE"), _env_int("LOCAL_RANK"))
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(info.local_rank)
    dist.init_process_group(backend=backend, rank=info.rank, world_size=info.world_size)
    return info


def cleanup_distributed(wait: bool = True) -> None:
    """Leave the process group; with ``wait``, after a barrier, so no rank exits while another still talks to it
    (not after an error: the other processes may never reach the barrier)."""
    if dist.is_available() and dist.is_initialized():
        if wait:
            dist.barrier()
        dist.destroy_process_group()


def barrier(info: DistInfo) -> None:
    if info.distributed:
        dist.barrier()


def all_reduce_sum(tensor: torch.Tensor, info: DistInfo) -> torch.Tensor:
    """Sum ``tensor`` over all ranks, in place; returned for chaining."""
    if info.distributed:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def gather_objects(obj: Any, info: DistInfo) -> list[Any]:
    """Every rank's ``obj`` (picklable) as a list indexed by rank, on every rank."""
    if not info.distributed:
        return [obj]
    out: list[Any] = [None] * info.world_size
    dist.all_gather_object(out, obj)
    return out


def broadcast_object(obj: Any, info: DistInfo) -> Any:
    """Rank 0's ``obj`` on every rank."""
    if not info.distributed:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def wrap_model(model: nn.Module, info: DistInfo, device: torch.device) -> nn.Module:
    """``DistributedDataParallel(model)`` when there are several processes, else ``model`` itself.

    ``find_unused_parameters=True`` because pretraining models routinely hold parameters an objective does not use
    (BERT's pooler under an MLM-only objective); it costs one walk over the autograd graph per step.
    """
    if not info.distributed:
        return model
    device_ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids, find_unused_parameters=True)


def unwrap_model(model: nn.Module) -> nn.Module:
    """The plain module under DistributedDataParallel and ``torch.compile`` wrappers (the one to save)."""
    while True:
        if isinstance(model, DistributedDataParallel):
            model = model.module
        elif hasattr(model, "_orig_mod"):  # torch.compile's OptimizedModule
            model = model._orig_mod
        else:
            return model


@contextlib.contextmanager
def maybe_no_sync(model: nn.Module, skip_sync: bool) -> Iterator[None]:
    """Inside, DDP does not all-reduce gradients, nor FSDP reduce-scatter them (accumulation micro-steps but the
    last). ``model`` may be a ``torch.compile`` wrapper of either."""
    model = getattr(model, "_orig_mod", model)
    if skip_sync and isinstance(model, DistributedDataParallel):
        with model.no_sync():
            yield
    elif skip_sync and is_sharded(model):
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)
    else:
        yield


# ------------------------------------------------------------------------------------------------------- FSDP2
def is_sharded(model: nn.Module) -> bool:
    """``model`` was sharded by ``shard_model`` (FSDP2)."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def shard_model(model: nn.Module, info: DistInfo) -> dict[str, str]:
    """Shard ``model`` in place with FSDP2: each layer of every ``ModuleList`` whose name ends in ``layers`` is one
    unit, then the root. Call it before building the optimizer (the parameters become DTensors).

    Returns:
        The model's tied parameters, ``{alias: kept name}`` (as ``lmforge.utils.model_folder.dedupe_tied``), which a
        gathered state dict no longer shows by identity; ``gather_model_state`` restores them.

    Raises:
        LmforgeError: not several processes, or this torch has no ``fully_shard``.
    """
    if not info.distributed:
        raise LmforgeError("parallel=fsdp shards the model over processes; launch with torchrun --nproc-per-node N "
                           "(N >= 2), or use the default parallel=ddp")
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError as err:  # torch < 2.6
        raise LmforgeError(f"parallel=fsdp needs torch.distributed.fsdp.fully_shard (torch >= 2.6); this torch is "
                           f"{torch.__version__}: upgrade it or use parallel=ddp") from err
    from lmforge.utils.model_folder import dedupe_tied

    _, tied = dedupe_tied(model.state_dict())
    for name, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and name.split(".")[-1].endswith("layers"):
            for layer in module:
                fully_shard(layer)
    fully_shard(model)
    return tied


def gather_model_state(model: nn.Module, tied: dict[str, str]) -> dict[str, torch.Tensor]:
    """The full state dict of a sharded model on rank 0 (on the CPU; tied names alias one tensor again), ``{}`` on
    the other ranks. Every rank must call it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if state:
        for alias, kept in tied.items():
            if kept in state:
                state[alias] = state[kept]
    return state


def load_model_state(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load a full state dict (every rank passes the same one) into a sharded model."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True))


class GatheredOptimizerState:
    """The optimizer of a sharded model as a checkpoint component: ``state_dict()`` gathers the full state (keyed by
    parameter names; every rank must call it, rank 0 gets it, the others ``{}``), ``load_state_dict`` shards a full
    one back."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model, self.optimizer = model, optimizer

    def state_dict(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        return get_optimizer_state_dict(self.model, self.optimizer,
                                        options=StateDictOptions(full_state_dict=True, cpu_offload=True))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        set_optimizer_state_dict(self.model, self.optimizer, state, options=StateDictOptions(full_state_dict=True))


def all_min(value: int, info: DistInfo, device: torch.device) -> int:
    """The smallest ``value`` over all processes (``device``: where the backend reduces, cuda for nccl)."""
    if not info.distributed:
        return value
    box = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(box, op=dist.ReduceOp.MIN)
    return int(box.item())

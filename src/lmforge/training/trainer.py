"""One small, task-agnostic training loop for every lmforge job (BERT, GPT, seq2seq, fine-tuning, word2vec).

The contract
------------
**Objective**: ``objective(model, batch) -> ObjectiveOutput`` and ``objective.counts(batch) -> {term: items}``.
Each loss term is returned as (SUM of per-item losses, number of items), e.g. ``{"mlm": (CE summed over masked
tokens, masked tokens), "nsp": (CE summed over sequences, batch size)}``; ``counts`` gives the same item numbers
from the batch alone, without a forward pass; both name the same terms on every call and in every process. The
objective must call ``model(...)`` (the whole module, which may be wrapped in DistributedDataParallel) rather than
its submodules. Any ``(losses, metrics)`` pair is accepted in place of an ``ObjectiveOutput``.

**Loss normalisation**: for every optimizer step the Trainer first draws all accumulation micro-batches, adds
their ``counts`` and sums them over all processes (N_k for term k), then backpropagates
``world_size * sum_k loss_sum_k / N_k`` per micro-batch (DDP averages gradients over processes). The gradient is
therefore exactly that of the mean over the whole global batch, however the items fall into micro-batches or
processes: accumulating 4 x 8 equals one batch of 32 (the bug of transformers PR #34191 cannot happen). The
reported loss is ``sum_k loss_k`` with ``loss_k = (sum of loss_sum_k over the global batch) / N_k``.

**Metrics**: ``ObjectiveOutput.metrics`` maps a name to (sum, count); the Trainer adds sums and counts over
micro-batches, processes and logging window and reports ``sum / count`` under that name (so name them for what the
ratio is, e.g. ``mlm_accuracy`` = (correct predictions, predictions)). An objective may name the loss term whose
item count is the number of predicted tokens (``predicted_tokens_term = "mlm"`` for masked LM); each log line then
has ``predicted_tokens``, that term's items summed over the logging interval (all processes), next to ``tokens``.

**Evaluation** (every ``eval_every`` steps and at the end): up to ``eval_batches`` micro-batches of the eval data per
process, in eval mode without gradients; reports ``eval_loss``, ``eval_loss_<term>``, ``eval_ppl_<term>`` =
exp(loss) for terms named ``lm``, ``clm`` or ``mlm``, and ``eval_<metric>`` (a metric ``<x>_nll``, a per-token NLL
such as the biLM's ``forward_nll``, is also reported as ``<x>_ppl`` = its exp, in training records too). The global
RNG state is restored afterwards, so evaluating never changes the training run. ``eval_data.batches`` must give the
same batches on every call (its position is not checkpointed).

**Data**: ``train_data.batches(micro_batch_size)`` yields dicts of tensors (already this process's shard); when the
iterator ends, ``batches`` is called again for the next epoch. ``state_dict()`` describes the position after the
batches yielded so far and holds only tensors, numbers, strings, lists and dicts; after ``load_state_dict(state)``
a new ``batches`` iterator continues from there. Tokens for ``tokens_per_s`` are ``attention_mask.sum()`` of each
batch (``src_mask.sum() + tgt_mask.sum()`` for seq2seq batches), or ``input_ids.numel()`` without a mask, summed
over processes.

**Randomness**: a fresh run seeds torch, numpy and ``random`` with ``config.seed + rank`` when ``fit`` starts (dropout
differs between processes); seed before building the model for a reproducible initialisation. Data objects keep
their own generators, saved in their ``state_dict``.

**Run folder** (``out_dir``): ``metrics.jsonl``, ``loss_curve.png``, ``run_config.json``, ``checkpoints/step-<N>/``
(see ``lmforge.training.checkpoint``), and at the end the final model (``config.json``, ``model.safetensors``,
tokenizer files: the folder loads with ``load_pretrained``) and ``eval_results.json``.

**Checkpoints** are written every ``save_every`` steps and every ``save_minutes`` minutes, whichever comes first,
at the end, and when the process receives SIGTERM or SIGINT: the step under way finishes, a checkpoint is written, and
``fit`` raises ``TrainingInterrupted`` (a ``KeyboardInterrupt``; the CLI exits with 128 + the signal number: 143 for
SIGTERM, 130 for Ctrl-C); a second signal stops at once. Left unset (None), the cadence is the default one:
``DEFAULT_SAVE_EVERY`` steps or ``DEFAULT_SAVE_MINUTES`` minutes, and a default-cadence checkpoint is skipped while
less than ``SAVE_COST_FACTOR`` times the duration of the last write has passed since it, so that writing never
takes more than about 1/20 of the training time (a large model on a fast GPU). Under several processes, rank 0's
decision and any process's signal travel with the all-reduce that every step already makes, so all processes
save at the same step. ``resume="auto"`` then continues from the newest checkpoint: the default recovery.

**Compile** (``config.compile``, ``--compile``): in ``fit`` the module the objective calls is compiled with
``torch.compile`` after DDP wrapped it (``lmforge.utils.compiling``), and evaluation calls a compiled plain module;
the optimizer, checkpoints, the best and the final model read the plain module, so no saved key carries the
wrapper's ``_orig_mod.``. ``compile`` may change on resume: dropout draws the same numbers either way.

**Resume** (``resume="auto"`` | ``"never"`` | a checkpoint or run folder): restores weights, optimizer, scheduler,
step, data position and every RNG state, so the continued run is identical to an uninterrupted one; lines that the
interrupted run logged after its checkpoint are dropped from metrics.jsonl. Only ``RESUMABLE_CHANGES`` may differ
from the checkpoint's TrainConfig (the model config must be equal, and so must the number of processes). An
``out_dir`` that already holds a run is refused unless ``resume`` continues it or ``overwrite=True``, which renames
the old folder to ``<out_dir>.old-<timestamp>`` (nothing is deleted) and starts afresh (details:
``lmforge.training.checkpoint.plan_run_dir`` / ``prepare_run_dir``). The constructor only checks the folder and
reads the checkpoint; ``fit`` changes the folder. What a checkpoint restores is the Trainer's ``Stateful``
components (optimizer, scheduler, progress, best-model tracker; ``lmforge.training.state``), each with its own
``state_dict``, plus every rank's data position and RNG state.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import logging
import math
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from lmforge.config import DEFAULT_SAVE_EVERY, DEFAULT_SAVE_MINUTES, ModelConfig, TrainConfig, to_dict
from lmforge.errors import LmforgeError
from lmforge.objectives.base import ObjectiveOutput  # the contract's type lives with the objectives
from lmforge.training import checkpoint as ckpt
from lmforge.training import distributed as dist
from lmforge.training.logging import (
    CURVE_NAME,
    METRICS_NAME,
    MetricsLog,
    allocator_hint,
    cpu_bf16_hint,
    plot_loss_curve,
    read_metrics,
    require_tensorboard,
)
from lmforge.training.optim import build_optimizer, build_scheduler
from lmforge.training.state import BestTracker, Progress, Stateful, new_window
from lmforge.utils.compiling import check_compile, compile_backend, compile_errors, compile_module, is_compiled
from lmforge.utils.io import atomic_write_text
from lmforge.utils.model_card import write_model_card

log = logging.getLogger("lmforge")

# TrainConfig fields that may differ between a checkpoint and the run resuming it. Changing max_steps stretches or
# shortens the linear/cosine schedule (and warm-up, when given as warmup_ratio) from the resumed step on.
RESUMABLE_CHANGES = ("max_steps", "log_every", "eval_every", "eval_batches", "save_every", "save_minutes",
                     "keep_last", "tensorboard", "device", "compile")
PERPLEXITY_TERMS = ("lm", "clm", "mlm", "plm")
# a metric named ``<x>_nll`` (a per-token negative log-likelihood) is also reported as ``<x>_ppl`` = exp of it
NLL_SUFFIX, PPL_SUFFIX = "_nll", "_ppl"
PLOT_INTERVAL_S = 30.0
# a default-cadence checkpoint waits until this many times the last write's duration has passed since it
SAVE_COST_FACTOR = 20.0
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class TrainingInterrupted(KeyboardInterrupt):
    """``fit`` stopped on SIGTERM or SIGINT, after writing a checkpoint (``checkpoint``; None when a second signal
    stopped it at once). ``exit_code`` is the shell's convention, 128 + the signal number."""

    def __init__(self, signum: int, checkpoint: Path | None, out_dir: Path) -> None:
        self.signum, self.checkpoint, self.exit_code = signum, checkpoint, 128 + signum
        name = signal.Signals(signum).name
        saved = f"saved {checkpoint}" if checkpoint else "stopped at once (second signal), nothing saved after the " \
            "last checkpoint"
        super().__init__(f"training interrupted by {name}: {saved}; continue with --resume auto (--out {out_dir})")


class Objective(Protocol):
    def __call__(self, model: nn.Module, batch: dict[str, Tensor]) -> ObjectiveOutput: ...

    def counts(self, batch: dict[str, Tensor]) -> dict[str, int]: ...


class TrainData(Protocol):
    def batches(self, micro_batch_size: int) -> Iterator[dict[str, Tensor]]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def resolve_device(name: str, info: dist.DistInfo) -> torch.device:
    """"auto" = this process's GPU when CUDA is available, else the CPU."""
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


def _settled(config: TrainConfig) -> TrainConfig:
    """``config`` with nothing left to derive: ``max_steps`` must be set (a recipe derives it from epochs); unset
    ``eval_every`` means off. Unset ``save_every`` / ``save_minutes`` stay None: the default cadence."""
    if config.max_steps is None:
        raise LmforgeError("train.max_steps is not set: give it (--max-steps / --train.max_steps), or let a recipe "
                           "derive it from epochs")
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


def _find_model_config(model: nn.Module) -> ModelConfig | None:
    for candidate in (model, getattr(model, "backbone", None)):
        if isinstance(getattr(candidate, "config", None), ModelConfig):
            return candidate.config
    return None


def _upcast(loss: Tensor) -> Tensor:
    return loss.float() if loss.dtype in (torch.float16, torch.bfloat16) else loss


def _number(value: Tensor | float | int) -> Tensor | float:
    return value.detach().double() if isinstance(value, Tensor) else float(value)


def _add_pairs(target: dict[str, list[Any]], pairs: dict[str, tuple[Any, Any]]) -> None:
    """``target[name] += (sum, count)`` for every pair (tensors stay on their device: no synchronisation)."""
    for name, (total, count) in pairs.items():
        pair = target.setdefault(name, [0.0, 0.0])
        pair[0] += _number(total)
        pair[1] += _number(count)


def _perplexities(record: dict[str, Any]) -> dict[str, float]:
    """``<x>_ppl`` = exp(``<x>_nll``) for every per-token NLL metric of ``record``."""
    return {k[:-len(NLL_SUFFIX)] + PPL_SUFFIX: math.exp(min(v, 700.0)) for k, v in record.items()
            if k.endswith(NLL_SUFFIX) and isinstance(v, float)}


class Trainer:
    """Train ``model`` on ``objective`` over ``train_data`` as ``config`` says, recording into ``out_dir``.

    Args:
        model: a plain module (or a torch.compile'd one); moved to the configured device.
        objective: see the module docstring.
        train_data: see the module docstring; already sharded for this process.
        config: the TrainConfig.
        out_dir: the run folder.
        eval_data: anything with ``batches(micro_batch_size)`` giving a finite iterator.
        model_config: saved as the checkpoints' config.json (default: ``model.config`` or ``model.backbone.config``).
        head: the head description of a TaskModel (see ``save_pretrained``).
        tokenizer: saved beside the model (anything with ``save_pretrained(dir, overwrite=)``).
        run_config: the resolved configuration of the whole run, written to ``run_config.json``.
        resume: "never", "auto" (the latest complete checkpoint under ``out_dir/checkpoints``, if any), or a path.
        overwrite: start afresh in an ``out_dir`` that holds a run (renamed to ``<out_dir>.old-<timestamp>``).
        progress: show a progress bar (rank 0).
        evaluator: ``evaluator(model) -> {metric: value}``, called in eval mode without gradients at every
            evaluation (on every process, which must all return the same numbers), e.g. a fine-tuning task's
            dev-set accuracy or F1 computed over the whole dev set; merged into the eval record under its own names.
        select: keep the best model by this eval metric (``"f1"``; ``"-eval_loss"`` to minimise): whenever an
            evaluation improves on it, the model is saved to ``out_dir/best``; at the end the final model and
            ``eval_results.json`` in ``out_dir`` are those of the best evaluation.
        callbacks: name -> a component with ``before_step(step)`` (called before every optimizer update with the
            number of completed updates, e.g. ``lmforge.training.unfreeze.GradualUnfreezing``) and
            ``state_dict`` / ``load_state_dict``: saved in checkpoints beside the optimizer and restored on resume.
        run_kind: what this run is (e.g. "pretrain awd_lm from scratch", "finetune sequence"); saved in checkpoints,
            and resuming from a checkpoint of another kind is refused with a message naming both.

    Raises:
        LmforgeError: a batch split that does not divide, an ``out_dir`` holding another run, a checkpoint whose
            settings differ.
    """

    def __init__(self, model: nn.Module, objective: Objective, train_data: TrainData, config: TrainConfig,
                 out_dir: str | Path, *, eval_data: Any = None, model_config: ModelConfig | None = None,
                 head: dict[str, Any] | None = None, tokenizer: Any = None, run_config: dict[str, Any] | None = None,
                 resume: str | Path = "never", overwrite: bool = False, progress: bool = True,
                 evaluator: Callable[[nn.Module], dict[str, float]] | None = None, select: str | None = None,
                 lr_scales: dict[str, float] | None = None, callbacks: dict[str, Any] | None = None,
                 run_kind: str | None = None) -> None:
        self.dist = dist.init_distributed()
        self.config = config = _settled(config)
        self.out_dir = Path(out_dir)
        self.objective, self.train_data, self.eval_data = objective, train_data, eval_data
        self.tokenizer, self.run_config, self.progress = tokenizer, run_config, progress
        self.evaluator, self.select = evaluator, select
        self.tracker = BestTracker(select)  # the best evaluation so far
        self.callbacks, self.run_kind = dict(callbacks or {}), run_kind
        self.micro_batch_size, self.accumulation = split_batch(config, self.dist.world_size)
        self.device = resolve_device(config.device, self.dist)
        self.model = dist.unwrap_model(model).to(self.device)  # the plain module: optimizer, saving, evaluation
        self._forward_model = model.to(self.device)  # what objectives call (later DDP-wrapped, then compiled)
        if config.compile:  # fails here, before any work, where torch.compile cannot work (lmforge.utils.compiling)
            check_compile(self.device)
        self._eval_model: nn.Module | None = None  # what evaluation calls: the plain module, compiled with --compile
        self.model_config = model_config or _find_model_config(self.model)
        # a TaskModel's head describes itself (lmforge.heads.build_head); an explicit head= still wins
        self.head = head if head is not None else getattr(getattr(self.model, "head", None), "head_config", None)
        # FSDP2: shard before the optimizer sees the parameters; its tied names, which gathered states must restore
        self._tied = self._shard() if config.parallel == "fsdp" else None
        self.optimizer = build_optimizer(self.model, config, lr_scales)
        self._optimizer_state = self.optimizer if self._tied is None else \
            dist.GatheredOptimizerState(self.model, self.optimizer)
        self.scheduler = build_scheduler(self.optimizer, config)
        self.progress_state = Progress()
        self._batches: Iterator[dict[str, Tensor]] | None = None
        self._checked_first_step = False
        self._last_plot = -math.inf
        self._t0 = self._t_window = time.perf_counter()
        self._tokens_window, self._elapsed_before = 0, 0.0
        # checkpoint cadence (see the module docstring): explicit steps are exact on every rank; the default steps
        # and the time cadence are rank 0's decision, shared with the step's all-reduce like a stop signal
        self._default_steps = DEFAULT_SAVE_EVERY if config.save_every is None else 0
        minutes = DEFAULT_SAVE_MINUTES if config.save_minutes is None else config.save_minutes
        self._save_seconds = 60.0 * minutes
        self._last_save_t, self._last_save_cost = time.perf_counter(), 0.0
        self._signal: int | None = None  # the first SIGTERM / SIGINT received
        self._save_now = self._stop_now = False  # agreed by every process during the last step
        if config.tensorboard and self.dist.is_main:
            require_tensorboard()
        self._resume, self._overwrite = resume, overwrite
        # Checked here, so that a bad choice fails before any work; the folder itself is changed in fit().
        self.resume_from = self._plan_out_dir(resume, overwrite)
        self._state = self._load_checkpoint(self.resume_from) if self.resume_from else None
        self.precision = self._choose_precision()  # "fp32" or "bf16": what "auto" resolved to, kept on resume

    def _shard(self) -> dict[str, str] | None:
        """``parallel = "fsdp"``: shard the model over the processes (None in a single process: nothing to shard)."""
        if not self.dist.distributed:
            log.warning("parallel=fsdp in a single process: nothing to shard, training the whole model here")
            return None
        if self._forward_model is not self.model:
            raise LmforgeError("parallel=fsdp shards the model itself; pass the plain module, not a compiled or "
                               "DDP-wrapped one")
        return dist.shard_model(self.model, self.dist)

    @property
    def _sharded(self) -> bool:
        return self._tied is not None

    def _gathered_state(self) -> dict[str, Tensor] | None:
        """A sharded model's full state dict (rank 0; every rank must call this), None when not sharded."""
        return dist.gather_model_state(self.model, self._tied) if self._tied is not None else None

    def _choose_precision(self) -> str:
        """``config.precision`` as trained: "auto" decided once by rank 0 (``lmforge.training.precision``), or the
        decision saved in the checkpoint this run resumes from."""
        from lmforge.training.precision import resolve_precision

        saved = (self._state or {}).get("precision")
        if saved in ("fp32", "bf16"):
            if self.config.precision == "auto" and self.dist.is_main:
                log.info("precision auto: %s, as decided when this run started (saved in its checkpoint)", saved)
            return saved
        width = self.model_config.d_model if self.model_config is not None else 256
        d_ff = self.model_config.d_ff if self.model_config is not None else None
        choice = self._on_main(lambda: resolve_precision(self.config.precision, self.device, d_model=width,
                                                         d_ff=d_ff))
        if self.config.precision == "auto" and self.dist.is_main:
            log.info("precision %s (%s)", choice.precision, choice.reason)
        return choice.precision

    # Saved and restored as a whole by checkpoints: each gives and takes its own state (lmforge.training.state).
    def stateful_components(self) -> dict[str, Stateful]:
        return {"optimizer": self._optimizer_state, "scheduler": self.scheduler, "progress": self.progress_state,
                "best": self.tracker, **self.callbacks}

    # The loop reads and writes the run's progress under these names.
    step = property(lambda self: self.progress_state.step, lambda self, v: setattr(self.progress_state, "step", v))
    epoch = property(lambda self: self.progress_state.epoch,
                     lambda self, v: setattr(self.progress_state, "epoch", v))
    tokens = property(lambda self: self.progress_state.tokens,
                      lambda self, v: setattr(self.progress_state, "tokens", v))
    elapsed_s = property(lambda self: self.progress_state.elapsed_s,
                         lambda self, v: setattr(self.progress_state, "elapsed_s", v))
    last_eval = property(lambda self: self.progress_state.last_eval,
                         lambda self, v: setattr(self.progress_state, "last_eval", v))
    _window = property(lambda self: self.progress_state.window,
                       lambda self, v: setattr(self.progress_state, "window", v))

    @property
    def best(self) -> dict[str, Any] | None:
        """``{"value", "step", "record"}`` of the best evaluation so far (None without ``select`` or evaluation)."""
        return self.tracker.best

    # ---------------------------------------------------------------------------------------- run folder, resume
    def _plan_out_dir(self, resume: str | Path, overwrite: bool) -> Path | None:
        """Rank 0 checks the folder and finds the checkpoint to resume from (nothing on disk changes); every rank
        gets the answer, or the error."""
        return self._on_main(lambda: ckpt.plan_run_dir(self.out_dir, resume, overwrite))

    def _prepare_out_dir(self) -> None:
        """At the start of ``fit``, rank 0 makes the folder ready: the old run moved aside (``overwrite``), the
        folder created, what an interrupted run left removed, metrics logged after the checkpoint dropped."""
        self._on_main(lambda: ckpt.prepare_run_dir(self.out_dir, self._resume, self._overwrite, self.resume_from))

    def _on_main(self, work: Callable[[], Any]) -> Any:
        choice: Any = None
        if self.dist.is_main:
            try:
                choice = work()
            except (LmforgeError, OSError) as err:  # raised on every rank, not only here
                choice = err if isinstance(err, LmforgeError) else LmforgeError(f"{self.out_dir}: {err}")
        choice = dist.broadcast_object(choice, self.dist)
        if isinstance(choice, Exception):
            raise choice
        return choice

    def _load_checkpoint(self, path: Path) -> dict[str, Any]:
        state = ckpt.load_trainer_state(path)
        theirs = state.get("run_kind")
        if theirs is not None and self.run_kind is not None and theirs != self.run_kind:
            raise LmforgeError(f"cannot resume from {path}: it is a checkpoint of another kind of run ({theirs}), "
                               f"this run is {self.run_kind}; give this stage its own --out folder (or --overwrite)")
        missing = [name for name in self.stateful_components() if name not in state["components"]]
        if missing:
            raise LmforgeError(f"cannot resume from {path}: the checkpoint has no {', '.join(missing)} state (it was "
                               "written by a run with other training components); give this run its own --out "
                               "folder (or --overwrite)")
        problems = ckpt.config_differences(state.get("train_config"), to_dict(self.config),
                                           allowed=RESUMABLE_CHANGES)
        problems += ckpt.config_differences(state.get("model_config"),
                                            to_dict(self.model_config) if self.model_config else None, "model.")
        if state.get("world_size") != self.dist.world_size:
            problems.append(f"world_size (checkpoint {state.get('world_size')}, now {self.dist.world_size}): the "
                            "data position is saved per process, resume with the same number of processes")
        if problems:
            raise LmforgeError(f"cannot resume from {path}: these settings differ from the checkpoint: "
                               f"{'; '.join(problems)}. Only {', '.join(RESUMABLE_CHANGES)} may change on resume; "
                               "start a new run (another out_dir or --overwrite) to change the others")
        if self._sharded:
            dist.load_model_state(self.model, ckpt.read_model_state(path))
        else:
            ckpt.load_model(self.model, path)
        for name, component in self.stateful_components().items():
            component.load_state_dict(state["components"][name])
        self._apply_schedule()
        if self.dist.is_main:
            log.info("resuming from %s (step %d)", path, self.step)
        return state

    def _apply_schedule(self) -> None:
        """Set every group's lr to what THIS run's schedule gives at the restored step.

        The optimizer state carries the lr the checkpointed run's schedule had set; when ``max_steps`` grew on resume
        (a longer decay) that lr is stale, and the first step after resuming would use it (0 at the old run's end).
        With an unchanged schedule this recomputes the same number, so exact resumption is untouched.
        """
        scheduler = self.scheduler
        for group, base, factor in zip(self.optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas,
                                       strict=True):
            group["lr"] = base * factor(scheduler.last_epoch)
        scheduler._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    # ---------------------------------------------------------------------------------------- the loop
    def fit(self) -> dict[str, Any]:
        """Train to ``config.max_steps``; returns the last training record merged with the last eval metrics."""
        cfg, main = self.config, self.dist.is_main
        self._prepare_out_dir()
        if self._state is not None:
            self.train_data.load_state_dict(self._state["data"][self.dist.rank])
            ckpt.restore_rng(self._state["rng"][self.dist.rank])
        else:
            ckpt.seed_everything(cfg.seed + self.dist.rank)
        if main:
            self._write_run_config()
            if self.device.type == "cpu":
                for level, hint in ((logging.INFO, allocator_hint()),
                                    (logging.WARNING, cpu_bf16_hint() if self.precision == "bf16" else None)):
                    if hint:
                        log.log(level, hint)
        if not self._sharded:  # a sharded model synchronises itself
            self._forward_model = dist.wrap_model(self._forward_model, self.dist, self.device)
        self._compile_models()
        metrics = MetricsLog(self.out_dir, enabled=main, tensorboard=cfg.tensorboard,
                             purge_step=self.step + 1 if self._state else None)
        bar = tqdm(total=cfg.max_steps, initial=self.step, desc="train", dynamic_ncols=True,
                   disable=not (main and self.progress))
        last_record: dict[str, Any] = {}
        resumed_here = self.resume_from is not None and ckpt.is_inside(self.resume_from, self.out_dir)
        last_saved = self.step if resumed_here else -1
        try:
            with logging_redirect_tqdm(loggers=[log]) if not bar.disable else contextlib.nullcontext(), \
                    self._stopping_on_signals():
                self.model.train()
                self._t0, self._t_window, self._tokens_window = time.perf_counter(), time.perf_counter(), 0
                self._elapsed_before = self.elapsed_s
                self._last_save_t = time.perf_counter()
                while self.step < cfg.max_steps:
                    step_loss, lr = self._train_step()
                    bar.update(1)
                    bar.set_postfix(loss=f"{step_loss:.4f}", lr=f"{lr:.2e}", tok_s=f"{self._throughput():.0f}",
                                    refresh=False)
                    if self.step % cfg.log_every == 0 or self.step == cfg.max_steps:
                        last_record = self._flush_window(lr)
                        metrics.write(last_record)
                    if self._evaluates and cfg.eval_every and self.step % cfg.eval_every == 0:
                        self._evaluate_and_record(metrics)
                    if (cfg.save_every and self.step % cfg.save_every == 0) or self._save_now:
                        self.save_checkpoint()
                        last_saved = self.step
                    if self._stop_now and self.step < cfg.max_steps:
                        checkpoint = self.save_checkpoint() if last_saved != self.step else \
                            ckpt.checkpoint_path(self.out_dir, self.step)
                        raise TrainingInterrupted(self._signal or signal.SIGTERM, checkpoint, self.out_dir)
                if self._evaluates and self.last_eval.get("step") != self.step:
                    self._evaluate_and_record(metrics)
                if last_saved != self.step:
                    self.save_checkpoint()
                self._save_final()
        except BaseException:
            dist.cleanup_distributed(wait=False)  # the other processes may never reach a barrier
            raise
        else:
            dist.cleanup_distributed()
        finally:
            bar.close()
            metrics.close()
        return {**(last_record or self._read_last_train_record()), **self.last_eval}

    def _compile_models(self) -> None:
        """``--compile``: compile what the objective calls after DDP wrapped it (``torch.compile(DDP(model))``, as
        PyTorch documents for DDP), and give evaluation a compiled plain module; ``self.model`` stays the plain module
        that the optimizer, checkpoints and the final model read (no ``_orig_mod.`` in any saved key)."""
        self._eval_model = self.model
        if not self.config.compile:
            return
        inner = getattr(self._forward_model, "module", self._forward_model)  # under DDP
        if not (is_compiled(self._forward_model) or is_compiled(inner)):  # a model the caller compiled stays as is
            self._forward_model = compile_module(self._forward_model, self.device)
        wrapped = getattr(self._forward_model, "_orig_mod", None)
        # one process: evaluation shares the compiled module (its eval-mode graph is one more cache entry)
        self._eval_model = self._forward_model if wrapped is self.model else compile_module(self.model, self.device)
        if self.dist.is_main:
            log.info("--compile: torch.compile, %s backend; the first steps (and evaluations) include compiling",
                     compile_backend())

    def _next_batch(self) -> dict[str, Tensor]:
        for _ in range(2):
            if self._batches is None:
                self._batches = iter(self.train_data.batches(self.micro_batch_size))
            try:
                return next(self._batches)
            except StopIteration:
                self._batches = None
                self.epoch += 1
        raise LmforgeError("the training data yielded no batch (an empty dataset, or fewer sequences than one "
                           "micro-batch in this process's shard)")

    def _autocast(self) -> torch.autocast:
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.precision == "bf16")

    def _to_device(self, batch: dict[str, Any]) -> dict[str, Any]:
        return {k: v.to(self.device, non_blocking=True) if isinstance(v, Tensor) else v for k, v in batch.items()}

    def _train_step(self) -> tuple[float, float]:
        """One optimizer step over ``accumulation`` micro-batches; returns (loss, lr used)."""
        for callback in self.callbacks.values():
            callback.before_step(self.step)
        micro = [self._next_batch() for _ in range(self.accumulation)]
        local_counts: dict[str, float] = {}
        for batch in micro:
            for name, n in self.objective.counts(batch).items():
                local_counts[name] = local_counts.get(name, 0.0) + int(n)
        if not local_counts:
            raise LmforgeError("objective.counts(batch) returned no loss terms")
        # N_k: items of term k in the whole global batch (all micro-batches of all processes)
        counts = self._global_sums(local_counts)
        terms = sorted(counts)
        sums: dict[str, list[Any]] = {}  # "loss/<term>" and metric names -> [sum, count] over the micro-batches
        tokens = 0
        for i, batch in enumerate(micro):
            tokens += batch_tokens(batch)
            with dist.maybe_no_sync(self._forward_model, skip_sync=i < len(micro) - 1), \
                    compile_errors(self.config.compile):
                with self._autocast():
                    losses, metrics = self.objective(self._forward_model, self._to_device(batch))
                if not self._checked_first_step:
                    self._check_output(losses, batch, terms)
                # DDP averages gradients over processes: the world_size factor turns that into the global sum
                loss = sum(_upcast(losses[t][0]) / max(counts[t], 1.0) for t in terms) * self.dist.world_size
                loss.backward()
            _add_pairs(sums, {f"loss/{t}": losses[t] for t in terms})
            _add_pairs(sums, metrics)
        if not self._checked_first_step:
            self._check_same_names(sorted(sums))
            self._checked_first_step = True
        flags = {"trainer/save": float(self._save_due(self.step + 1)), "trainer/stop": float(self._signal is not None)}
        totals = self._global_sums({"tokens": tokens, **flags, **{f"{k}/sum": v[0] for k, v in sums.items()},
                                    **{f"{k}/count": v[1] for k, v in sums.items() if not k.startswith("loss/")}})
        # every process saves / stops after the same step; a single process also heeds a signal that came later
        self._save_now = totals["trainer/save"] > 0
        self._stop_now = totals["trainer/stop"] > 0 or (not self.dist.distributed and self._signal is not None)
        term_values = {t: totals[f"loss/{t}/sum"] / max(counts[t], 1.0) for t in terms}
        step_loss = sum(term_values.values())
        grad_norm = self._clip_gradients()
        lr = self.optimizer.param_groups[0]["lr"]
        if not (math.isfinite(step_loss) and math.isfinite(grad_norm)):
            raise LmforgeError(self._diverged_message(step_loss, grad_norm, lr))
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1

        self.tokens += int(totals["tokens"])
        self._tokens_window += int(totals["tokens"])
        w = self._window
        w["steps"] += 1
        w["loss"] += step_loss
        w["grad_norm"] += grad_norm
        for t, v in term_values.items():
            w["terms"][t] = w["terms"].get(t, 0.0) + v
        predicted = getattr(self.objective, "predicted_tokens_term", None)  # the term counting predicted tokens
        if predicted in counts:
            w["predicted_tokens"] = w.get("predicted_tokens", 0) + int(counts[predicted])
        for name in sums:
            if not name.startswith("loss/"):
                _add_pairs(w["metrics"], {name: (totals[f"{name}/sum"], totals[f"{name}/count"])})
        return step_loss, lr

    def _diverged_message(self, loss: float, grad_norm: float, lr: float) -> str:
        """A non-finite loss or gradient norm: what happened, the likely cause and the options to change."""
        what = f"the loss is {loss}" if not math.isfinite(loss) else f"the gradient norm is {grad_norm}"
        fixes = [f"lower the learning rate (--lr or --train.lr; now {self.config.lr:g})",
                 f"lengthen the warm-up (--train.warmup_ratio, now {self.config.warmup_ratio:g}, or "
                 "--train.warmup_steps)"]
        if self.config.max_grad_norm <= 0:
            fixes.append("clip the gradients (--train.max_grad_norm=1.0)")
        if self.precision == "bf16":
            fixes.append("train in fp32 (--precision fp32)")
        return (f"training diverged: {what} at step {self.step + 1} (lr {lr:.3g}). It stopped without updating the "
                "weights or saving; the last checkpoint, if any, is intact. Likely cause: too large a step for "
                f"this model and data; {', or '.join(fixes)}, then start again (or --resume auto from the last "
                "checkpoint)")

    def _global_sums(self, values: dict[str, Any]) -> dict[str, float]:
        """Each value (number or scalar tensor) summed over all processes, in one all-reduce."""
        keys = sorted(values)
        packed = torch.stack([torch.as_tensor(values[k], dtype=torch.float64, device=self.device) for k in keys]) \
            if keys else torch.zeros(0, dtype=torch.float64, device=self.device)
        return dict(zip(keys, dist.all_reduce_sum(packed, self.dist).tolist(), strict=True))

    def _check_output(self, losses: dict[str, Any], batch: dict[str, Any], terms: list[str]) -> None:
        """First step only: the objective's losses and counts must describe the same terms and item numbers."""
        if sorted(losses) != terms:
            raise LmforgeError(f"the objective returned loss terms {sorted(losses)} but its counts() gave "
                               f"{terms}; they must name the same terms")
        expected = self.objective.counts(batch)
        for t in terms:
            got = int(losses[t][1])
            if got != int(expected[t]):
                raise LmforgeError(f"loss term {t!r}: objective(model, batch) summed over {got} items but "
                                   f"objective.counts(batch) says {int(expected[t])}; they must agree")

    def _check_same_names(self, names: list[str]) -> None:
        everyone = dist.gather_objects(names, self.dist)
        if any(theirs != everyone[0] for theirs in everyone):
            raise LmforgeError(f"processes disagree on the loss terms / metrics: {everyone}; every process must "
                               "report the same names")

    def _clip_gradients(self) -> float:
        params = [p for p in self.model.parameters() if p.grad is not None]
        if not params:
            raise LmforgeError("no parameter received a gradient; does the objective call model(...) and return "
                               "losses that depend on it?")
        if self._sharded:  # DTensor gradients: the norm is a partial sum until gathered
            norm = torch.nn.utils.clip_grad_norm_(params, self.config.max_grad_norm if self.config.max_grad_norm > 0
                                                  else math.inf)
            return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
        if self.config.max_grad_norm > 0:
            return float(torch.nn.utils.clip_grad_norm_(params, self.config.max_grad_norm))
        norms = torch.stack([torch.linalg.vector_norm(p.grad.detach().float()) for p in params])
        return float(torch.linalg.vector_norm(norms))

    def _throughput(self) -> float:
        return self._tokens_window / max(time.perf_counter() - self._t_window, 1e-9)

    def _flush_window(self, lr: float) -> dict[str, Any]:
        w, n = self._window, max(self._window["steps"], 1)
        # the data's own epoch where it keeps one (pretraining data is endless: the Trainer never sees it end)
        epoch = getattr(self.train_data, "epoch", self.epoch)
        record: dict[str, Any] = {"step": self.step, "epoch": epoch if isinstance(epoch, int) else self.epoch,
                                  "loss": w["loss"] / n}
        record.update({f"loss_{t}": v / n for t, v in sorted(w["terms"].items())})
        record.update({name: s / c if c else 0.0 for name, (s, c) in sorted(w["metrics"].items())})
        record.update(_perplexities(record))
        record.update({"lr": lr, "grad_norm": w["grad_norm"] / n, "tokens_per_s": self._throughput(),
                       "tokens": self.tokens, "elapsed_s": self._elapsed()})
        if "predicted_tokens" in w:  # this interval's predicted (e.g. masked) tokens, next to the running tokens
            record["predicted_tokens"] = int(w["predicted_tokens"])
        self._window = new_window()
        self._t_window, self._tokens_window = time.perf_counter(), 0
        return record

    def _elapsed(self) -> float:
        return self._elapsed_before + time.perf_counter() - self._t0

    # ---------------------------------------------------------------------------------------- evaluation
    def evaluate(self) -> dict[str, float]:
        """Loss terms and metrics over ``eval_batches`` micro-batches of the eval data (summed over processes)."""
        if self.eval_data is None:
            raise LmforgeError("no eval_data was given to the Trainer")
        rng = ckpt.capture_rng()  # evaluation must not change the training run's random stream
        was_training = self.model.training
        self.model.eval()
        sums: dict[str, list[Any]] = {}  # "loss/<term>" and metric names -> [sum, count]
        try:
            batches: Any = self.eval_data.batches(self.micro_batch_size)
            if self._sharded:  # every process must run the same number of (collective) forward passes
                batches = list(itertools.islice(batches, self.config.eval_batches))
                batches = batches[:dist.all_min(len(batches), self.dist, self.device)]
            model = self._eval_model if self._eval_model is not None else self.model
            with torch.no_grad(), self._autocast(), compile_errors(self.config.compile):
                for i, batch in enumerate(batches):
                    if i >= self.config.eval_batches:
                        break
                    losses, metrics = self.objective(model, self._to_device(batch))
                    _add_pairs(sums, {f"loss/{t}": pair for t, pair in losses.items()})
                    _add_pairs(sums, metrics)
        finally:
            self.model.train(was_training)
            ckpt.restore_rng(rng)
        # a process whose shard gave no batch still takes part, with zeros for the names the others report
        names = sorted({n for theirs in dist.gather_objects(sorted(sums), self.dist) for n in theirs})
        totals = self._global_sums({f"{n}/{part}": sums.get(n, [0.0, 0.0])[j] for n in names
                                    for j, part in enumerate(("sum", "count"))})
        result: dict[str, float] = {"eval_loss": 0.0}
        for name in names:
            total, count = totals[f"{name}/sum"], totals[f"{name}/count"]
            if name.startswith("loss/"):
                term = name[len("loss/"):]
                result[f"eval_loss_{term}"] = total / max(count, 1.0)
                result["eval_loss"] += result[f"eval_loss_{term}"]
                if term in PERPLEXITY_TERMS:
                    result[f"eval_ppl_{term}"] = math.exp(min(result[f"eval_loss_{term}"], 700.0))
            else:
                result[f"eval_{name}"] = total / count if count else 0.0
        result.update(_perplexities(result))
        return result

    @property
    def _evaluates(self) -> bool:
        return self.eval_data is not None or self.evaluator is not None

    def _run_evaluator(self) -> dict[str, float]:
        rng = ckpt.capture_rng()
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad(), self._autocast():
                return {k: float(v) for k, v in self.evaluator(self.model).items()}
        finally:
            self.model.train(was_training)
            ckpt.restore_rng(rng)

    def _evaluate_and_record(self, metrics: MetricsLog) -> None:
        record: dict[str, Any] = {"step": self.step}
        if self.eval_data is not None:
            record.update(self.evaluate())
        if self.evaluator is not None:
            record.update(self._run_evaluator())
        self.last_eval = record
        metrics.write(self.last_eval)
        if self.dist.is_main:
            log.info("step %d: %s", self.step, ", ".join(f"{k} {v:.4g}" for k, v in self.last_eval.items()
                                                         if k != "step"))
            self._plot()
        self._keep_if_best(record)

    def _keep_if_best(self, record: dict[str, Any]) -> None:
        if not self.tracker.offer(record, self.step):
            return
        name = self.select.lstrip("-")
        gathered = self._gathered_state()
        if self.dist.is_main:
            ckpt.save_model_atomically(self.model, self.out_dir / ckpt.BEST_NAME, model_config=self.model_config,
                                       head=self.head, tokenizer=self.tokenizer, state_dict=gathered)
            # best/ is a staging folder: at the end its model moves up into out_dir, so name where it will be
            log.info("step %d: best %s so far (%.4g); kept as the final model of %s unless a later one beats it",
                     self.step, name, record[name], self.out_dir)
        dist.barrier(self.dist)

    # ---------------------------------------------------------------------------------------- saving
    def save_checkpoint(self) -> Path:
        """Write ``checkpoints/step-<step>`` (rank 0; every rank contributes its data position and RNG state)."""
        start = time.perf_counter()
        data_states = dist.gather_objects(self.train_data.state_dict(), self.dist)
        rng_states = dist.gather_objects(ckpt.capture_rng(), self.dist)
        path = ckpt.checkpoint_path(self.out_dir, self.step)
        gathered = self._gathered_state()
        optimizer = self._optimizer_state.state_dict() if self._sharded else None  # a collective: every rank
        if self.dist.is_main:
            components = {name: optimizer if name == "optimizer" and self._sharded else c.state_dict()
                          for name, c in self.stateful_components().items()}
            components["progress"]["elapsed_s"] = self._elapsed()  # the time trained so far, this session included
            state = {"step": self.step, "world_size": self.dist.world_size, "components": components,
                     "data": data_states, "rng": rng_states, "train_config": to_dict(self.config),
                     "run_kind": self.run_kind, "precision": self.precision,
                     "model_config": to_dict(self.model_config) if self.model_config else None}
            ckpt.save_checkpoint(self.out_dir, self.step, self.model, state, model_config=self.model_config,
                                 head=self.head, tokenizer=self.tokenizer, keep_last=self.config.keep_last,
                                 state_dict=gathered)
            log.info("saved checkpoint %s", path)
        dist.barrier(self.dist)
        self._last_save_t = time.perf_counter()
        self._last_save_cost = self._last_save_t - start
        return path

    def _save_due(self, step: int) -> bool:
        """Rank 0: whether the default step cadence or the time cadence asks for a checkpoint after ``step``."""
        if not self.dist.is_main:
            return False
        since = time.perf_counter() - self._last_save_t
        by_steps = bool(self._default_steps) and step % self._default_steps == 0
        by_time = self._save_seconds > 0 and since >= self._save_seconds
        return (by_steps or by_time) and since >= SAVE_COST_FACTOR * self._last_save_cost

    @contextlib.contextmanager
    def _stopping_on_signals(self) -> Iterator[None]:
        """While the loop runs, SIGTERM and SIGINT ask it to checkpoint after the current step and stop (the
        loop raises ``TrainingInterrupted``); a second signal stops at once. Handlers can only be installed from
        the main thread; elsewhere signals keep their usual effect."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def on_signal(signum: int, frame: Any) -> None:
            if self._signal is not None:  # asked twice: do not wait for the step and the checkpoint
                raise TrainingInterrupted(signum, None, self.out_dir)
            self._signal = signum
            if self.dist.is_main:
                log.warning("received %s: finishing this step and saving a checkpoint, then stopping (send it "
                            "again to stop at once)", signal.Signals(signum).name)

        previous = {s: signal.signal(s, on_signal) for s in STOP_SIGNALS}
        try:
            yield
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)

    def _save_final(self) -> None:
        gathered = self._gathered_state()
        if self.dist.is_main:
            with ckpt.writing(self.out_dir):
                self._write_final(gathered)
        dist.barrier(self.dist)

    def _write_final(self, gathered: dict[str, Tensor] | None = None) -> None:
        """The final model (the best one when a dev metric selects it), eval_results.json and the plot."""
        best_dir = self.out_dir / ckpt.BEST_NAME
        if self.best is not None and (best_dir.is_dir() or self._best_is_in_place()):
            if best_dir.is_dir():
                ckpt.promote_model(best_dir, self.out_dir)  # the final model is the best one
            results = {**self.best["record"], "best_step": self.best["step"], "last_step": self.step}
        else:
            if self.best is not None:
                log.warning("the best model (step %d) is no longer in %s; saving the last one instead",
                            self.best["step"], self.out_dir)
            ckpt.save_model(self.model, self.out_dir, model_config=self.model_config, head=self.head,
                            tokenizer=self.tokenizer, state_dict=gathered)
            results = self.last_eval
        self._write_run_config()
        if results:
            atomic_write_text(self.out_dir / "eval_results.json", json.dumps(results, indent=2) + "\n")
        self._plot(force=True)
        write_model_card(self.out_dir)  # README.md: what was trained, on what, how, the metrics and plots
        log.info("saved the final model in %s", self.out_dir)

    def _best_is_in_place(self) -> bool:
        """A finished run continued further: its top-level model is still the best one if nothing beat it."""
        try:
            done = json.loads((self.out_dir / "eval_results.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return False
        return done.get("best_step") == self.best["step"] and (self.out_dir / ckpt.WEIGHTS_NAME).is_file()

    def _write_run_config(self) -> None:
        payload = self.run_config if self.run_config is not None else {
            "train": to_dict(self.config), "model": to_dict(self.model_config) if self.model_config else None}
        atomic_write_text(self.out_dir / "run_config.json", json.dumps(payload, indent=2, default=str) + "\n")

    def _plot(self, force: bool = False) -> None:
        # drawing takes about 0.3 s: during the run, redraw at most every PLOT_INTERVAL_S seconds
        now = time.perf_counter()
        if not force and now - self._last_plot < PLOT_INTERVAL_S:
            return
        self._last_plot = now
        with contextlib.suppress(ImportError):
            plot_loss_curve(read_metrics(self.out_dir / METRICS_NAME), self.out_dir / CURVE_NAME)

    def _read_last_train_record(self) -> dict[str, Any]:
        train = [r for r in read_metrics(self.out_dir / METRICS_NAME) if "loss" in r]
        return train[-1] if train else {"step": self.step}

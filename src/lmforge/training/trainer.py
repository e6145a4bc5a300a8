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
same batches on every call (its position is not checkpointed). With NT-ASGD (``optimizer = "nt_asgd"``) the
evaluations, the best model and the final model use the optimizer's average of the iterates once its trigger has
fired, and every evaluation's ``eval_loss`` goes to that trigger (``lmforge.training.ntasgd``); checkpoints keep the
iterate, the optimizer's state the average.

**Data**: ``train_data.batches(micro_batch_size)`` yields dicts of tensors (already this process's shard); when the
iterator ends, ``batches`` is called again for the next epoch. ``state_dict()`` describes the position after the
batches yielded so far and holds only tensors, numbers, strings, lists and dicts; after ``load_state_dict(state)``
a new ``batches`` iterator continues from there. Tokens for ``tokens_per_s`` are ``attention_mask.sum()`` of each
batch (``src_mask.sum() + tgt_mask.sum()`` for seq2seq batches), or ``input_ids.numel()`` without a mask, summed
over processes.

**Randomness**: a fresh run seeds torch, numpy and ``random`` with ``config.seed + rank`` when ``fit`` starts (dropout
differs between processes); seed before building the model for a reproducible initialisation. Data objects keep
their own generators, saved in their ``state_dict``.

**Budget** (``TrainConfig.budget``: a training time such as ``"10m"`` or a number of tokens such as ``"5Mtok"``):
the lr of every update is set just before ``optimizer.step()`` from the fraction of the budget elapsed
(``lmforge.training.optim.lr_multiplier_at``; tokens: the global tokens so far with this update's; time: the
training seconds of ``RunClock`` at this update, averaged over the processes in the step's all-reduce so that all
agree), the loop ends after the first update that reaches the budget (or at ``max_steps``, then an optional cap),
and the final checkpoint and model are saved as for a step-limited run. The fraction is part of ``Progress``: a
token budget resumes bit-identically, a time budget with the time that remains. Records carry ``budget_fraction``.

**Run folder**: given by a ``RunOutput`` (``lmforge.training.run_folder``: the layout, overwrite and resume rules).
**Checkpoints** are written by the save cadence and on SIGTERM / SIGINT (``lmforge.training.cadence``), at the end,
and ``resume="auto"`` then continues from the newest one: the default recovery. **Compile**, FSDP and DDP:
``lmforge.training.runtime``. Plots, ``eval_results.json`` and the model card: ``lmforge.training.reporting``.

**Resume** (``RunOutput.resume``: ``"auto"`` | ``"never"`` | a checkpoint or run folder): restores weights,
optimizer, scheduler, step, data position and every RNG state, so the continued run is identical to an uninterrupted
one; lines that the interrupted run logged after its checkpoint are dropped from metrics.jsonl. Only
``RESUMABLE_CHANGES`` may differ from the checkpoint's TrainConfig (the model config must be equal, and so must the
number of processes). The constructor only checks the folder and reads the checkpoint; ``fit`` changes the folder.
What a checkpoint restores is the Trainer's ``Stateful`` components (optimizer, scheduler, progress, best-model
tracker, callbacks; ``lmforge.training.state``), each with its own ``state_dict``, plus every rank's data position
and RNG state.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from lmforge.config import TrainConfig, to_dict
from lmforge.errors import LmforgeError
from lmforge.objectives.base import ObjectiveOutput  # the contract's type lives with the objectives
from lmforge.training import checkpoint as ckpt
from lmforge.training import distributed as dist
from lmforge.training.accounting import (
    LOSS_PREFIX,
    RunClock,
    add_pairs,
    add_step,
    batch_tokens,
    check_output,
    check_same_names,
    diverged_message,
    eval_result,
    global_sums,
    packed_sums,
    upcast,
    window_record,
)
from lmforge.training.budget import RunLimit
from lmforge.training.cadence import SaveCadence, SignalStop, TrainingInterrupted
from lmforge.training.logging import MetricsLog, require_tensorboard
from lmforge.training.ntasgd import averaged_weights, evaluating
from lmforge.training.optim import build_optimizer, build_scheduler
from lmforge.training.reporting import Reporter
from lmforge.training.run_folder import RESUMABLE_CHANGES, RunFolder, RunOutput, as_run_output
from lmforge.training.runtime import (
    ModelPlacement,
    apply_schedule,
    choose_precision,
    evaluation_mode,
    find_model_config,
    log_cpu_hints,
    resolve_device,
    settled,
    split_batch,
)
from lmforge.training.state import BestTracker, Progress, Stateful, new_window
from lmforge.utils.compiling import compile_errors

# the names this module has always offered, now defined beside their parts
__all__ = ["RESUMABLE_CHANGES", "Objective", "ObjectiveOutput", "RunOutput", "TrainData", "Trainer",
           "TrainingInterrupted", "batch_tokens", "resolve_device", "split_batch"]

log = logging.getLogger("lmforge")


class Objective(Protocol):
    def __call__(self, model: nn.Module, batch: dict[str, Tensor]) -> ObjectiveOutput: ...

    def counts(self, batch: dict[str, Tensor]) -> dict[str, int]: ...


class TrainData(Protocol):
    def batches(self, micro_batch_size: int) -> Iterator[dict[str, Tensor]]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class Trainer:
    """Train ``model`` on ``objective`` over ``train_data`` as ``config`` says, recording into a run folder.

    Args:
        model: a plain module (or a torch.compile'd one); moved to the configured device.
        objective: see the module docstring.
        train_data: see the module docstring; already sharded for this process.
        config: the TrainConfig.
        output: a ``RunOutput`` (the folder, resume / overwrite, progress bar, and what saved models carry), or
            only the run folder (``RunOutput(folder)``).
        eval_data: anything with ``batches(micro_batch_size)`` giving a finite iterator.
        evaluator: ``evaluator(model) -> {metric: value}``, called in eval mode without gradients at every
            evaluation (on every process, which must all return the same numbers), e.g. a fine-tuning task's
            dev-set accuracy or F1 computed over the whole dev set; merged into the eval record under its own names.
        select: keep the best model by this eval metric (``"f1"``; ``"-eval_loss"`` to minimise): whenever an
            evaluation improves on it, the model is saved to ``best/`` in the run folder; at the end the final model
            and ``eval_results.json`` are those of the best evaluation.
        lr_scales: parameter name -> multiplier of ``config.lr`` (see ``build_optimizer``).
        callbacks: name -> a component with ``before_step(step)`` (called before every optimizer update with the
            number of completed updates, e.g. ``lmforge.training.unfreeze.GradualUnfreezing``) and
            ``state_dict`` / ``load_state_dict``: saved in checkpoints beside the optimizer and restored on resume.
        **deprecated: ``RunOutput``'s former keywords (``out_dir``, ``resume``, ``overwrite``, ``progress``, ``head``,
            ``tokenizer``, ``run_config``, ``run_kind``, ``model_config``), with a DeprecationWarning until 0.3.

    Raises:
        LmforgeError: a batch split that does not divide, a run folder holding another run, a checkpoint whose
            settings differ.
        TypeError: an unknown keyword, or no run folder.
    """

    def __init__(self, model: nn.Module, objective: Objective, train_data: TrainData, config: TrainConfig,
                 output: RunOutput | str | Path | None = None, *, eval_data: Any = None,
                 evaluator: Callable[[nn.Module], dict[str, float]] | None = None, select: str | None = None,
                 lr_scales: dict[str, float] | None = None, callbacks: dict[str, Any] | None = None,
                 **deprecated: Any) -> None:
        output = as_run_output(output, deprecated)
        self.dist = dist.init_distributed()
        self.config = config = settled(config)
        self.objective, self.train_data, self.eval_data = objective, train_data, eval_data
        self.evaluator, self.select = evaluator, select
        self.tracker = BestTracker(select)  # the best evaluation so far
        self.callbacks = dict(callbacks or {})
        self.micro_batch_size, self.accumulation = split_batch(config, self.dist.world_size)
        self.device = resolve_device(config.device, self.dist)
        # FSDP shards here, before the optimizer sees the parameters
        self.placement = ModelPlacement(model, self.device, self.dist, fsdp=config.parallel == "fsdp",
                                        compile=config.compile)
        self.model = self.placement.model  # the plain module: optimizer, saving, evaluation
        # a TaskModel's head describes itself (lmforge.heads.build_head); an explicit head still wins
        head = output.head if output.head is not None else \
            getattr(getattr(self.model, "head", None), "head_config", None)
        self.output = dataclasses.replace(output, head=head,
                                          model_config=output.model_config or find_model_config(self.model))
        self.model_config, self.out_dir = self.output.model_config, Path(self.output.out)
        self.folder, self.reporter = RunFolder(self.output, self.dist), Reporter(self.out_dir)
        self.optimizer = build_optimizer(self.model, config, lr_scales)
        self._optimizer_state = self.placement.optimizer_state(self.optimizer)
        self.progress_state = Progress()
        self.limit = RunLimit(config, self.progress_state)  # max_steps, or a time or token budget
        self.scheduler = build_scheduler(self.optimizer, config, self.limit.scheduler_factor())
        self._batches: Iterator[dict[str, Tensor]] | None = None
        self._checked_first_step = False
        self.clock = RunClock()
        self.cadence = SaveCadence(config.save_every, config.save_minutes, self.dist.is_main)
        self.stop = SignalStop(self.out_dir, announce=self.dist.is_main)
        if config.tensorboard and self.dist.is_main:
            require_tensorboard()
        # Checked here, so that a bad choice fails before any work; the folder itself is changed in fit().
        self.resume_from = self.folder.plan()
        self._state = self._load_checkpoint(self.resume_from) if self.resume_from else None
        # "fp32" or "bf16": what "auto" resolved to (rank 0 decides), or what the resumed run trained in
        self.precision = choose_precision(config.precision, (self._state or {}).get("precision"), self.model_config,
                                          self.device, self.folder.on_main, announce=self.dist.is_main)

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

    def _load_checkpoint(self, path: Path) -> dict[str, Any]:
        """Check that ``path`` can be continued exactly, then restore the weights and every component from it."""
        state = ckpt.load_trainer_state(path)
        self.folder.check_resumable(state, path, components=list(self.stateful_components()),
                                    train_config=self.config, world_size=self.dist.world_size)
        self.placement.load_weights(path)
        for name, component in self.stateful_components().items():
            component.load_state_dict(state["components"][name])
        self.limit.restored(path)
        apply_schedule(self.optimizer, self.scheduler)  # this run's lr at the restored step
        if self.dist.is_main:
            log.info("resuming from %s (step %d)", path, self.step)
        return state

    # ---------------------------------------------------------------------------------------- the loop
    def fit(self) -> dict[str, Any]:
        """Train to ``max_steps`` or through the budget; returns the last training record with the last eval metrics."""
        cfg, main = self.config, self.dist.is_main
        self.folder.prepare(self.resume_from)
        if self._state is not None:
            self.train_data.load_state_dict(self._state["data"][self.dist.rank])
            ckpt.restore_rng(self._state["rng"][self.dist.rank])
            ckpt.restore_objective(self.objective, self._state, self.dist.rank)
        else:
            ckpt.seed_everything(cfg.seed + self.dist.rank)
        if main:
            self.folder.write_run_config(cfg)
            log_cpu_hints(self.device, self.precision)
        self.placement.prepare_for_fit()
        metrics = MetricsLog(self.out_dir, enabled=main, tensorboard=cfg.tensorboard,
                             purge_step=self.step + 1 if self._state else None)
        if (line := self.limit.start()) and main:  # a budget's line
            log.info(line)
        bar = tqdm(**self.limit.bar(), dynamic_ncols=True, disable=not (main and self.output.progress))
        last_record: dict[str, Any] = {}
        resumed_here = self.resume_from is not None and ckpt.is_inside(self.resume_from, self.out_dir)
        last_saved = self.step if resumed_here else -1
        try:
            with logging_redirect_tqdm(loggers=[log]) if not bar.disable else contextlib.nullcontext(), \
                    self.stop.installed():
                self.model.train()
                self.clock.start(self.elapsed_s)
                self.cadence.restart_clock()
                while not self.limit.finished():
                    step_loss, lr = self._train_step()
                    bar.update(self.limit.advance(bar.n))
                    bar.set_postfix(loss=f"{step_loss:.4f}", lr=f"{lr:.2e}", tok_s=f"{self.clock.tokens_per_s():.0f}",
                                    refresh=False)
                    if self.step % cfg.log_every == 0 or self.limit.finished():
                        last_record = self._flush_window(lr)
                        metrics.write(last_record)
                    if self._evaluates and cfg.eval_every and self.step % cfg.eval_every == 0:
                        self._evaluate_and_record(metrics)
                    if self.cadence.due(self.step):
                        self.save_checkpoint()
                        last_saved = self.step
                    if self.stop.agreed and not self.limit.finished():
                        checkpoint = self.save_checkpoint() if last_saved != self.step else \
                            ckpt.checkpoint_path(self.out_dir, self.step)
                        raise self.stop.interrupted(checkpoint)
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
        return {**(last_record or self.reporter.last_train_record(self.step)), **self.last_eval}

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

    def _global_sums(self, values: dict[str, Any]) -> dict[str, float]:
        return global_sums(values, self.dist, self.device)

    def _train_step(self) -> tuple[float, float]:
        """One optimizer step over ``accumulation`` micro-batches; returns (loss, lr used)."""
        for callback in self.callbacks.values():
            callback.before_step(self.step)
        micro = [self._next_batch() for _ in range(self.limit.before_update(self.accumulation, self.objective))]
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
        tokens, forward = 0, self.placement.forward
        for i, batch in enumerate(micro):
            tokens += batch_tokens(batch)
            with dist.maybe_no_sync(forward, skip_sync=i < len(micro) - 1), compile_errors(self.config.compile):
                with self._autocast():
                    losses, metrics = self.objective(forward, self._to_device(batch))
                if not self._checked_first_step:
                    check_output(self.objective, losses, batch, terms)
                # DDP averages gradients over processes: the world_size factor turns that into the global sum
                loss = sum(upcast(losses[t][0]) / max(counts[t], 1.0) for t in terms) * self.dist.world_size
                loss.backward()
            add_pairs(sums, {f"{LOSS_PREFIX}{t}": losses[t] for t in terms})
            add_pairs(sums, metrics)
        if not self._checked_first_step:
            check_same_names(sorted(sums), self.dist)
            self._checked_first_step = True
        # the save and stop decisions travel with this step's all-reduce: every process acts after the same step
        flags = {"trainer/save": self.cadence.vote(self.step + 1), "trainer/stop": self.stop.vote()}
        flags.update(self.limit.votes(self.clock.elapsed()))  # a time budget: every process uses the same fraction
        totals = self._global_sums({"tokens": tokens, **flags, **packed_sums(sums)})
        self.cadence.agree(totals["trainer/save"])
        self.stop.agree(totals["trainer/stop"], self.dist.distributed)
        term_values = {t: totals[f"{LOSS_PREFIX}{t}/sum"] / max(counts[t], 1.0) for t in terms}
        step_loss = sum(term_values.values())
        grad_norm = self.placement.clip_gradients(self.config.max_grad_norm)
        self.limit.set_lr(self.optimizer, self.scheduler.base_lrs, totals, self.dist.world_size)
        lr = self.optimizer.param_groups[0]["lr"]
        if not (math.isfinite(step_loss) and math.isfinite(grad_norm)):
            raise LmforgeError(diverged_message(self.config, self.precision, self.step + 1, step_loss, grad_norm, lr))
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1

        self.tokens += int(totals["tokens"])
        self.clock.window_tokens += int(totals["tokens"])
        predicted = getattr(self.objective, "predicted_tokens_term", None)  # the term counting predicted tokens
        add_step(self._window, loss=step_loss, grad_norm=grad_norm, terms=term_values,
                 metrics={n: (totals[f"{n}/sum"], totals[f"{n}/count"]) for n in sums if not n.startswith(LOSS_PREFIX)},
                 predicted_tokens=int(counts[predicted]) if predicted in counts else None)
        return step_loss, lr

    def _flush_window(self, lr: float) -> dict[str, Any]:
        # the data's own epoch where it keeps one (pretraining data is endless: the Trainer never sees it end)
        epoch = getattr(self.train_data, "epoch", self.epoch)
        record = window_record(self._window, step=self.step, epoch=epoch if isinstance(epoch, int) else self.epoch,
                               lr=lr, tokens=self.tokens, tokens_per_s=self.clock.tokens_per_s(),
                               elapsed_s=self.clock.elapsed())
        self.limit.annotate(record)
        self._window = new_window()
        self.clock.new_window()
        return record

    # ---------------------------------------------------------------------------------------- evaluation
    def evaluate(self) -> dict[str, float]:
        """Loss terms and metrics over ``eval_batches`` micro-batches of the eval data (summed over processes)."""
        if self.eval_data is None:
            raise LmforgeError("no eval_data was given to the Trainer")
        sums: dict[str, list[Any]] = {}  # "loss/<term>" and metric names -> [sum, count]
        with evaluation_mode(self.model):
            batches: Any = self.eval_data.batches(self.micro_batch_size)
            if self.placement.sharded:  # every process must run the same number of (collective) forward passes
                batches = list(itertools.islice(batches, self.config.eval_batches))
                batches = batches[:dist.all_min(len(batches), self.dist, self.device)]
            model = self.placement.eval_model
            with torch.no_grad(), self._autocast(), compile_errors(self.config.compile):
                for i, batch in enumerate(batches):
                    if i >= self.config.eval_batches:
                        break
                    losses, metrics = self.objective(model, self._to_device(batch))
                    add_pairs(sums, {f"{LOSS_PREFIX}{t}": pair for t, pair in losses.items()})
                    add_pairs(sums, metrics)
        # a process whose shard gave no batch still takes part, with zeros for the names the others report
        names = sorted({n for theirs in dist.gather_objects(sorted(sums), self.dist) for n in theirs})
        totals = self._global_sums({f"{n}/{part}": sums.get(n, [0.0, 0.0])[j] for n in names
                                    for j, part in enumerate(("sum", "count"))})
        return eval_result(names, totals, getattr(self.objective, "term_weights", None))

    @property
    def _evaluates(self) -> bool:
        return self.eval_data is not None or self.evaluator is not None

    def _evaluate_and_record(self, metrics: MetricsLog) -> None:
        record: dict[str, Any] = {"step": self.step}
        with evaluating(self.optimizer, record):  # NT-ASGD: its averaged weights, then its trigger (training.ntasgd)
            if self.eval_data is not None:
                record.update(self.evaluate())
            if self.evaluator is not None:
                with evaluation_mode(self.model), torch.no_grad(), self._autocast():
                    record.update({k: float(v) for k, v in self.evaluator(self.model).items()})
            self.last_eval = record
            metrics.write(self.last_eval)
            if self.dist.is_main:
                self.reporter.evaluation(record)
            self._keep_if_best(record)

    def _keep_if_best(self, record: dict[str, Any]) -> None:
        if not self.tracker.offer(record, self.step):
            return
        name, gathered = self.select.lstrip("-"), self.placement.gathered_state()
        if self.dist.is_main:
            self.folder.save_best(self.model, gathered)
            # best/ is a staging folder: at the end its model moves up into out_dir, so name where it will be
            log.info("step %d: best %s so far (%.4g); kept as the final model of %s unless a later one beats it",
                     self.step, name, record[name], self.out_dir)
        dist.barrier(self.dist)

    # ---------------------------------------------------------------------------------------- saving
    def save_checkpoint(self) -> Path:
        """Write ``checkpoints/step-<step>`` (rank 0; every rank contributes its data position and RNG state)."""
        start = time.perf_counter()
        data_states, rng_states, objective_states = (dist.gather_objects(x, self.dist) for x in (
            self.train_data.state_dict(), ckpt.capture_rng(), ckpt.objective_state(self.objective)))
        path = ckpt.checkpoint_path(self.out_dir, self.step)
        gathered = self.placement.gathered_state()
        optimizer = self._optimizer_state.state_dict() if self.placement.sharded else None  # a collective: every rank
        if self.dist.is_main:
            components = {name: optimizer if name == "optimizer" and self.placement.sharded else c.state_dict()
                          for name, c in self.stateful_components().items()}
            components["progress"]["elapsed_s"] = self.clock.elapsed()  # the time trained so far, this session too
            # these keys are the checkpoint format (lmforge.training.checkpoint): old checkpoints must still resume
            state = {"step": self.step, "world_size": self.dist.world_size, "components": components,
                     "data": data_states, "rng": rng_states, "objective": objective_states,
                     "train_config": to_dict(self.config), "run_kind": self.output.run_kind,
                     "precision": self.precision,
                     "model_config": to_dict(self.model_config) if self.model_config else None}
            self.folder.save_checkpoint(self.step, self.model, state, self.config.keep_last, gathered)
            log.info("saved checkpoint %s", path)
        dist.barrier(self.dist)
        self.cadence.saved(start)
        return path

    def _save_final(self) -> None:
        """The final model (the best one when a dev metric selects it), the run config and the reports."""
        gathered = self.placement.gathered_state()
        if self.dist.is_main:
            with ckpt.writing(self.out_dir), averaged_weights(self.optimizer):  # NT-ASGD saves its average
                results = self.folder.write_final_model(self.model, self.best, self.step, self.last_eval, gathered)
                self.folder.write_run_config(self.config)
                self.reporter.finish(results)
        dist.barrier(self.dist)

"""The run folder of a Trainer: what it writes and where (``RunOutput``), and the folder itself (``RunFolder``).

Layout (``out``): ``metrics.jsonl``, ``loss_curve.png``, ``run_config.json``, ``checkpoints/step-<N>/`` (see
``lmforge.training.checkpoint``), ``best/`` while a selected best model is kept, and at the end the final model
(``config.json``, ``model.safetensors``, tokenizer files: the folder loads with ``load_pretrained``),
``eval_results.json`` and ``README.md``.

An ``out`` that already holds a run is refused unless ``resume`` continues it or ``overwrite=True``, which renames
the old folder to ``<out>.old-<timestamp>`` (nothing is deleted) and starts afresh (details:
``lmforge.training.checkpoint.plan_run_dir`` / ``prepare_run_dir``). The Trainer's constructor only checks the folder
(``RunFolder.plan``) and ``fit`` changes it (``RunFolder.prepare``), so a bad choice fails before any work.
Only ``RESUMABLE_CHANGES`` may differ from the checkpoint's TrainConfig (``RunFolder.check_resumable``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from lmforge.config import ModelConfig, TrainConfig, to_dict
from lmforge.errors import LmforgeError
from lmforge.training import checkpoint as ckpt
from lmforge.training import distributed as dist
from lmforge.utils.io import atomic_write_text
from lmforge.utils.model_folder import WEIGHTS_NAME

log = logging.getLogger("lmforge")

# TrainConfig fields that may differ between a checkpoint and the run resuming it. Changing max_steps stretches or
# shortens the linear/cosine schedule (and warm-up, when given as warmup_ratio) from the resumed step on.
RESUMABLE_CHANGES = ("max_steps", "log_every", "eval_every", "eval_batches", "save_every", "save_minutes",
                     "keep_last", "tensorboard", "device", "compile")
# The Trainer keywords that RunOutput replaced; still accepted, with a DeprecationWarning, until lmforge 0.3.
DEPRECATED_KEYWORDS = ("out_dir", "resume", "overwrite", "progress", "tokenizer", "run_config", "run_kind",
                       "model_config", "head")


@dataclasses.dataclass(frozen=True)
class RunOutput:
    """What a training run writes, and where: the Trainer's one output argument.

    Args:
        out: the run folder (see the module docstring for its layout).
        resume: "never", "auto" (the latest complete checkpoint under ``out/checkpoints``, if any), or the path of a
            checkpoint or run folder.
        overwrite: start afresh in an ``out`` that holds a run (renamed to ``<out>.old-<timestamp>``).
        progress: show a progress bar (rank 0).
        tokenizer: saved beside every saved model (anything with ``save_pretrained(dir, overwrite=)``).
        run_config: the resolved configuration of the whole run, written to ``run_config.json`` (default: the
            TrainConfig and the model config).
        run_kind: what this run is (e.g. "pretrain awd_lm from scratch", "finetune sequence"); saved in
            checkpoints, and resuming from a checkpoint of another kind is refused with a message naming both.
        model_config: saved as the saved models' ``config.json`` (default: ``model.config`` or
            ``model.backbone.config``).
        head: the head description of a TaskModel (see ``save_pretrained``; default: ``model.head.head_config``).
    """

    out: str | Path
    resume: str | Path = "never"
    overwrite: bool = False
    progress: bool = True
    tokenizer: Any = None
    run_config: dict[str, Any] | None = None
    run_kind: str | None = None
    model_config: ModelConfig | None = None
    head: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "out", Path(self.out))  # a str is accepted and kept as a Path (frozen: no setattr)


def as_run_output(output: RunOutput | str | Path | None, deprecated: dict[str, Any]) -> RunOutput:
    """The Trainer's ``output`` argument as a ``RunOutput``, taking the pre-RunOutput keywords for one release.

    Args:
        output: a ``RunOutput``, or only the run folder (``RunOutput(output)`` with the defaults), or None when the
            folder comes as the deprecated ``out_dir=`` keyword.
        deprecated: the Trainer's keywords that RunOutput replaced (``DEPRECATED_KEYWORDS``).

    Returns:
        The RunOutput to use.

    Raises:
        TypeError: an unknown keyword, a keyword given beside a RunOutput, or no run folder at all.
    """
    unknown = sorted(set(deprecated) - set(DEPRECATED_KEYWORDS))
    if unknown:
        raise TypeError(f"Trainer() got an unexpected keyword argument {unknown[0]!r}")
    if isinstance(output, RunOutput):
        if deprecated:
            raise TypeError(f"Trainer(): give {', '.join(sorted(deprecated))} inside the RunOutput, not beside it")
        return output
    if deprecated:
        names = ", ".join(f"{k}=" for k in deprecated)
        # stacklevel 3: the warning names the line that called Trainer(...), not this helper or the constructor
        warnings.warn(f"Trainer({names}...) is deprecated since lmforge 0.2 and will be removed in 0.3: pass "
                      "Trainer(model, objective, train_data, config, RunOutput(out_dir, resume=..., progress=..., "
                      "tokenizer=..., ...)) (from lmforge.training import RunOutput)", DeprecationWarning,
                      stacklevel=3)
    options = dict(deprecated)
    folder = options.pop("out_dir", None)
    if output is not None and folder is not None:
        raise TypeError("Trainer() got multiple values for the run folder (output and out_dir=)")
    folder = output if output is not None else folder
    if folder is None:
        raise TypeError("Trainer() needs the run output after config: RunOutput(out_dir, ...) or the folder")
    return RunOutput(folder, **options)


def decide_on_main(work: Callable[[], Any], info: dist.DistInfo, where: Path) -> Any:
    """Rank 0 runs ``work`` and every rank gets its answer, or its error (so that all processes fail together).

    Args:
        work: what only rank 0 does (reading or changing the folder, measuring the machine).
        info: the process group.
        where: named in an OSError's message.

    Returns:
        ``work()``'s result, on every rank.

    Raises:
        LmforgeError: raised by ``work`` on rank 0, or an OSError there, on every rank.
    """
    choice: Any = None
    if info.is_main:
        try:
            choice = work()
        except (LmforgeError, OSError) as err:  # raised on every rank, not only here
            choice = err if isinstance(err, LmforgeError) else LmforgeError(f"{where}: {err}")
    choice = dist.broadcast_object(choice, info)
    if isinstance(choice, Exception):
        raise choice
    return choice


class RunFolder:
    """The run folder: guarding and preparing it, the resume checks, the run config and the saved models.

    Args:
        output: the RunOutput, with ``model_config`` and ``head`` already resolved from the model.
        info: the process group; rank 0 alone writes.
    """

    def __init__(self, output: RunOutput, info: dist.DistInfo) -> None:
        self.output, self.dist, self.path = output, info, Path(output.out)

    def on_main(self, work: Callable[[], Any]) -> Any:
        """``decide_on_main`` for this folder."""
        return decide_on_main(work, self.dist, self.path)

    def plan(self) -> Path | None:
        """Check the folder and find the checkpoint to resume from (nothing on disk changes); every rank gets the
        answer, or the error. Returns the checkpoint, or None for a fresh run."""
        out = self.output
        return self.on_main(lambda: ckpt.plan_run_dir(self.path, out.resume, out.overwrite))

    def prepare(self, resume_from: Path | None) -> None:
        """At the start of ``fit``, make the folder ready (rank 0): the old run moved aside (``overwrite``), the
        folder created, what an interrupted run left removed, metrics logged after the checkpoint dropped."""
        out = self.output
        self.on_main(lambda: ckpt.prepare_run_dir(self.path, out.resume, out.overwrite, resume_from))

    def check_resumable(self, state: dict[str, Any], path: Path, *, components: list[str], train_config: TrainConfig,
                        world_size: int) -> None:
        """Refuse a checkpoint that this run cannot continue exactly.

        Args:
            state: the checkpoint's trainer state (``ckpt.load_trainer_state``).
            path: the checkpoint, named in the messages.
            components: the names of this run's Stateful components, which the checkpoint must all hold.
            train_config: this run's TrainConfig; only ``RESUMABLE_CHANGES`` may differ from the checkpoint's.
            world_size: this run's number of processes (the data position is saved per process).

        Raises:
            LmforgeError: another kind of run, missing components, or settings that differ.
        """
        theirs, ours = state.get("run_kind"), self.output.run_kind
        if theirs is not None and ours is not None and theirs != ours:
            raise LmforgeError(f"cannot resume from {path}: it is a checkpoint of another kind of run ({theirs}), "
                               f"this run is {ours}; give this stage its own --out folder (or --overwrite)")
        missing = [name for name in components if name not in state["components"]]
        if missing:
            raise LmforgeError(f"cannot resume from {path}: the checkpoint has no {', '.join(missing)} state (it was "
                               "written by a run with other training components); give this run its own --out "
                               "folder (or --overwrite)")
        model_config = self.output.model_config
        problems = ckpt.config_differences(state.get("train_config"), to_dict(train_config),
                                           allowed=RESUMABLE_CHANGES)
        problems += ckpt.config_differences(state.get("model_config"),
                                            to_dict(model_config) if model_config else None, "model.")
        if state.get("world_size") != world_size:
            problems.append(f"world_size (checkpoint {state.get('world_size')}, now {world_size}): the "
                            "data position is saved per process, resume with the same number of processes")
        if problems:
            raise LmforgeError(f"cannot resume from {path}: these settings differ from the checkpoint: "
                               f"{'; '.join(problems)}. Only {', '.join(RESUMABLE_CHANGES)} may change on resume; "
                               "start a new run (another out_dir or --overwrite) to change the others")

    def write_run_config(self, train_config: TrainConfig) -> None:
        """``run_config.json``: the run's resolved configuration (rank 0)."""
        model_config = self.output.model_config
        payload = self.output.run_config if self.output.run_config is not None else {
            "train": to_dict(train_config), "model": to_dict(model_config) if model_config else None}
        atomic_write_text(self.path / "run_config.json", json.dumps(payload, indent=2, default=str) + "\n")

    def _model_files(self) -> dict[str, Any]:
        """What every saved model carries beside its weights: config.json, the head, the tokenizer."""
        out = self.output
        return {"model_config": out.model_config, "head": out.head, "tokenizer": out.tokenizer}

    def save_checkpoint(self, step: int, model: nn.Module, state: dict[str, Any], keep_last: int,
                        state_dict: dict[str, Tensor] | None) -> None:
        """Write ``checkpoints/step-<step>`` (rank 0), keeping the newest ``keep_last`` (0: all)."""
        ckpt.save_checkpoint(self.path, step, model, state, keep_last=keep_last, state_dict=state_dict,
                             **self._model_files())

    def save_best(self, model: nn.Module, state_dict: dict[str, Tensor] | None) -> None:
        """Stage the best model so far in ``best/`` (rank 0); at the end it moves up into the folder."""
        ckpt.save_model_atomically(model, self.path / ckpt.BEST_NAME, state_dict=state_dict, **self._model_files())

    def write_final_model(self, model: nn.Module, best: dict[str, Any] | None, step: int,
                          last_eval: dict[str, Any], state_dict: dict[str, Tensor] | None) -> dict[str, Any]:
        """The final model (rank 0): the best one when a dev metric selected it, else ``model`` as trained.

        Args:
            model: the plain module.
            best: the BestTracker's ``{"value", "step", "record"}``, or None.
            step: the last step.
            last_eval: the last evaluation record ({} without evaluation).
            state_dict: a sharded model's gathered state (None: read ``model``).

        Returns:
            The results for ``eval_results.json``: the best evaluation (with ``best_step`` and ``last_step``), or
            the last one.
        """
        best_dir = self.path / ckpt.BEST_NAME
        if best is not None and (best_dir.is_dir() or self._best_is_in_place(best["step"])):
            if best_dir.is_dir():
                ckpt.promote_model(best_dir, self.path)  # the final model is the best one
            return {**best["record"], "best_step": best["step"], "last_step": step}
        if best is not None:
            log.warning("the best model (step %d) is no longer in %s; saving the last one instead", best["step"],
                        self.path)
        ckpt.save_model(model, self.path, state_dict=state_dict, **self._model_files())
        return last_eval

    def _best_is_in_place(self, best_step: int) -> bool:
        """A finished run continued further: its top-level model is still the best one if nothing beat it."""
        try:
            done = json.loads((self.path / "eval_results.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return False
        return done.get("best_step") == best_step and (self.path / WEIGHTS_NAME).is_file()

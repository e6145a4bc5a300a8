"""Training checkpoints: one folder per step, written atomically, read without unpickling arbitrary objects.

Layout::

    out_dir/checkpoints/step-<N>/
        model.safetensors    weights of the plain module (unwrapped from DDP / torch.compile); tied weights once
        config.json          lmforge model config (with a ModelConfig; the folder then loads with load_pretrained)
        vocab.txt ...        the tokenizer files, when the Trainer was given a tokenizer
        trainer_state.pt     {"format", "version": 2, "step", "world_size", "train_config", "model_config",
                              "components": {"optimizer", "scheduler", "progress", "best"} (each component's own
                              state_dict, lmforge.training.state), "data": [data state of rank r],
                              "rng": [RNG states of rank r]}; version 1 (flat keys) is migrated on load

The folder is assembled as ``checkpoints/.tmp-step-<N>-<pid>`` (every file fsync'ed) and renamed to ``step-<N>``
in one step, so a folder named ``step-<N>`` is always complete; a process killed mid-write leaves only a
``.tmp-*`` folder, which is ignored and removed by the next run. ``trainer_state.pt`` is read with
``torch.load(weights_only=True)``: it holds only tensors, numbers, strings, lists, tuples and dicts (RNG states
of numpy and ``random`` are converted to those).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save
from torch import nn

from lmforge.config import ModelConfig
from lmforge.errors import InputFileError, LmforgeError
from lmforge.training.logging import METRICS_NAME, truncate_metrics
from lmforge.utils.io import atomic_open, atomic_write_bytes, check_output_dir, prepare_output_dir
from lmforge.utils.model_folder import (
    CONFIG_NAME,
    WEIGHTS_NAME,
    dedupe_tied,
    load_state,
    read_config,
    read_weights,
    save_pretrained,
)

log = logging.getLogger("lmforge")

CHECKPOINTS_DIR = "checkpoints"
BEST_NAME = "best"  # the best model by the selected eval metric, while a run is going
STATE_NAME = "trainer_state.pt"
RUN_CONFIG_NAME = "run_config.json"  # written by the Trainer when a run starts
STATE_FORMAT = "lmforge-trainer-state"
STATE_VERSION = 2  # 2: Stateful components (lmforge.training.state); 1 is migrated on load
_STEP_DIR = re.compile(r"^step-(\d+)$")


# ------------------------------------------------------------------------------------------------------ folders
def checkpoint_path(out_dir: str | Path, step: int) -> Path:
    return Path(out_dir) / CHECKPOINTS_DIR / f"step-{step}"


def is_checkpoint(path: Path) -> bool:
    return (path / STATE_NAME).is_file() and (path / WEIGHTS_NAME).is_file()


def list_checkpoints(out_dir: str | Path) -> list[tuple[int, Path]]:
    """Complete checkpoints under ``out_dir/checkpoints``, oldest first, as (step, folder)."""
    root = Path(out_dir) / CHECKPOINTS_DIR
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = _STEP_DIR.match(child.name)
        if match and child.is_dir() and is_checkpoint(child):
            found.append((int(match.group(1)), child))
    return sorted(found)


def latest_checkpoint(out_dir: str | Path) -> Path | None:
    """The newest complete checkpoint folder, or None."""
    found = list_checkpoints(out_dir)
    return found[-1][1] if found else None


def remove_partial_checkpoints(out_dir: str | Path) -> list[Path]:
    """Delete the ``.tmp-*`` folders that a killed process left while writing or pruning a checkpoint (under
    ``checkpoints/``) or saving the best model (in the run folder); return them."""
    out_dir = Path(out_dir)
    removed = []
    for root in (out_dir / CHECKPOINTS_DIR, out_dir):
        if root.is_dir():
            for child in root.glob(".tmp-*"):
                if child.is_dir():
                    shutil.rmtree(child, ignore_errors=True)
                    removed.append(child)
    return removed


def prune_checkpoints(out_dir: str | Path, keep_last: int) -> None:
    """Keep the ``keep_last`` newest checkpoints (0 keeps all).

    Each old folder is first renamed to ``.tmp-pruned-step-<N>-<pid>`` (one atomic step) and only then deleted, so
    a process killed while deleting never leaves a half-deleted ``step-<N>``; the next run removes the rest.
    """
    if keep_last <= 0:
        return
    for _, path in list_checkpoints(out_dir)[:-keep_last]:
        aside = path.parent / f".tmp-pruned-{path.name}-{os.getpid()}"
        os.replace(path, aside)
        shutil.rmtree(aside, ignore_errors=True)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # e.g. Windows cannot open folders; the rename is still atomic there
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# ------------------------------------------------------------------------------------------------------ writing
def _free_space(path: Path) -> str:
    for p in (path, *path.parents):
        if p.exists():
            try:
                return f"{shutil.disk_usage(p).free / 1e6:,.0f} MB free there"
            except OSError:
                break
    return "free space unknown"


@contextlib.contextmanager
def writing(target: Path, cleanup: Path | None = None) -> Iterator[None]:
    """Turn a failed write of ``target`` into one clear error naming it, the cause and the space left.

    torch reports a full disk during ``torch.save`` as ``RuntimeError: [enforce fail at inline_container.cc]
    unexpected pos``; that, and OSError (full, read-only, no permission), become an ``LmforgeError``. ``cleanup``
    (a temporary folder) is removed first, so that nothing half-written stays behind.
    """
    try:
        yield
    except (OSError, RuntimeError) as err:
        if isinstance(err, OSError) and not err.filename:  # write() failures name no file
            err.filename = str(target)
        if cleanup is not None:
            shutil.rmtree(cleanup, ignore_errors=True)
        cause = (err.strerror or str(err)) if isinstance(err, OSError) else str(err).strip().partition("\n")[0]
        raise LmforgeError(f"{target}: could not write it ({cause}; {_free_space(target)}); free some space or "
                           "choose another output folder, then continue with --resume auto from the last complete "
                           "checkpoint") from err


# ------------------------------------------------------------------------------------------------------ model
def save_model(model: nn.Module, directory: str | Path, *, model_config: ModelConfig | None = None,
               head: dict[str, Any] | None = None, tokenizer: Any | None = None,
               state_dict: dict[str, torch.Tensor] | None = None) -> None:
    """Write the weights of ``model`` (a plain module) into ``directory``, replacing what is there.

    With a ModelConfig this is ``save_pretrained`` (config.json + model.safetensors + tokenizer files), a folder
    that ``load_pretrained`` reads. Without one (e.g. a word2vec model) only ``model.safetensors`` is written; its
    metadata records the tied weights. ``state_dict``: the weights to write instead of ``model.state_dict()`` (a
    sharded model's gathered state).
    """
    if model_config is not None:
        save_pretrained(model, directory, config=model_config, head=head, tokenizer=tokenizer, overwrite=True,
                        state_dict=state_dict)
        return
    tensors, tied = dedupe_tied(model.state_dict() if state_dict is None else state_dict)
    atomic_write_bytes(Path(directory) / WEIGHTS_NAME,
                       save(tensors, metadata={"format": "pt", "tied": json.dumps(tied)}))
    if tokenizer is not None:
        tokenizer.save_pretrained(directory, overwrite=True)


def save_model_atomically(model: nn.Module, directory: str | Path, **kwargs: Any) -> None:
    """``save_model`` into a temporary sibling folder, then swap it in: a crash leaves the old or the new folder."""
    directory = Path(directory)
    tmp = directory.parent / f".tmp-{directory.name}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    with writing(directory, cleanup=tmp):
        save_model(model, tmp, **kwargs)
        _fsync_dir(tmp)
    old = directory.parent / f".tmp-old-{directory.name}-{os.getpid()}"
    if directory.exists():
        os.replace(directory, old)
    os.replace(tmp, directory)
    shutil.rmtree(old, ignore_errors=True)
    _fsync_dir(directory.parent)


def promote_model(source: str | Path, target: str | Path) -> None:
    """Copy the model files of folder ``source`` into ``target`` (each file atomically), then remove ``source``."""
    source, target = Path(source), Path(target)
    for path in sorted(source.iterdir()):
        if path.is_file():
            atomic_write_bytes(target / path.name, path.read_bytes())
    shutil.rmtree(source, ignore_errors=True)


def _read_weights_and_ties(directory: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    tensors = read_weights(directory / WEIGHTS_NAME)
    if (directory / CONFIG_NAME).is_file():
        tied = read_config(directory).get("tied", {})
    else:
        with safe_open(str(directory / WEIGHTS_NAME), framework="pt") as f:
            tied = json.loads((f.metadata() or {}).get("tied", "{}"))
    return tensors, tied


def load_model(model: nn.Module, directory: str | Path) -> None:
    """Load weights written by ``save_model`` into ``model`` in place (keys and shapes are checked by name)."""
    directory = Path(directory)
    tensors, tied = _read_weights_and_ties(directory)
    load_state(model, tensors, tied, str(directory / WEIGHTS_NAME))


def read_model_state(directory: str | Path) -> dict[str, torch.Tensor]:
    """The full state dict written by ``save_model``, every tied name present (what a sharded model loads)."""
    tensors, tied = _read_weights_and_ties(Path(directory))
    return {**tensors, **{alias: tensors[kept] for alias, kept in tied.items() if kept in tensors}}


# ------------------------------------------------------------------------------------------------------ RNG
def capture_rng() -> dict[str, Any]:
    """The global RNG states (torch CPU and CUDA, numpy, ``random``) as tensors, numbers and strings."""
    np_state = np.random.get_state()
    py_version, py_internal, py_gauss = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": {"name": str(np_state[0]), "keys": torch.from_numpy(np.asarray(np_state[1], dtype=np.int64)),
                  "pos": int(np_state[2]), "has_gauss": int(np_state[3]), "cached_gaussian": float(np_state[4])},
        "python": {"version": int(py_version), "internal": torch.tensor(py_internal, dtype=torch.int64),
                   "gauss_next": py_gauss},
    }


def objective_state(objective: Any) -> Any:
    """What an objective that carries state across batches (Transformer-XL's memory) keeps in a checkpoint, one per
    rank beside its data position: its ``state_dict()``, or None for an objective without state."""
    state_dict = getattr(objective, "state_dict", None)
    return state_dict() if state_dict is not None else None


def restore_objective(objective: Any, state: dict[str, Any], rank: int) -> None:
    """Give ``objective`` this rank's state from a checkpoint's ``state`` (older checkpoints have none: it starts
    fresh)."""
    states = state.get("objective")
    if states and hasattr(objective, "load_state_dict"):
        objective.load_state_dict(states[rank])


def restore_rng(state: dict[str, Any]) -> None:
    """Inverse of ``capture_rng``."""
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    n = state["numpy"]
    np.random.set_state((n["name"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"],
                         n["cached_gaussian"]))
    p = state["python"]
    random.setstate((p["version"], tuple(int(v) for v in p["internal"].tolist()), p["gauss_next"]))


def seed_everything(seed: int) -> None:
    """Seed torch (CPU and CUDA), numpy and ``random``."""
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)
    random.seed(seed)


# ------------------------------------------------------------------------------------------------------ state
_PLAIN = (int, float, str, bool, type(None), torch.Tensor)


def check_plain(value: Any, where: str) -> None:
    """Raise if ``value`` holds anything but tensors, numbers, strings, None, lists, tuples and str-keyed dicts
    (what ``torch.load(weights_only=True)`` reads back)."""
    if isinstance(value, _PLAIN) or isinstance(value, torch.Size):
        return
    if isinstance(value, list | tuple):
        for i, item in enumerate(value):
            check_plain(item, f"{where}[{i}]")
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str | int):
                raise LmforgeError(f"{where} has a key of type {type(key).__name__}; checkpoint state may only use "
                                   "string or integer keys")
            check_plain(item, f"{where}[{key!r}]")
        return
    raise LmforgeError(f"{where} is a {type(value).__module__}.{type(value).__name__}; checkpoint state may only "
                       "hold tensors, numbers, strings, None, lists and dicts (convert numpy arrays with "
                       "torch.from_numpy or .tolist(), numpy scalars with int()/float())")


def save_checkpoint(out_dir: str | Path, step: int, model: nn.Module, state: dict[str, Any], *,
                    model_config: ModelConfig | None = None, head: dict[str, Any] | None = None,
                    tokenizer: Any | None = None, keep_last: int = 0,
                    state_dict: dict[str, torch.Tensor] | None = None) -> Path:
    """Write ``out_dir/checkpoints/step-<step>`` atomically (rank 0 only) and prune old checkpoints.

    Args:
        model: the plain module (not DDP / compiled).
        state: the trainer state (see the module docstring); checked with ``check_plain`` before anything is written.

    Returns:
        The checkpoint folder.
    """
    check_plain(state, "trainer state")
    final = checkpoint_path(out_dir, step)
    tmp = final.parent / f".tmp-step-{step}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    with writing(final, cleanup=tmp):
        save_model(model, tmp, model_config=model_config, head=head, tokenizer=tokenizer, state_dict=state_dict)
        with atomic_open(tmp / STATE_NAME, "wb") as f:
            torch.save({"format": STATE_FORMAT, "version": STATE_VERSION, **state}, f)
        _fsync_dir(tmp)
    if final.exists():  # re-saving a step (a run resumed at its last checkpoint): replace the old folder
        old = final.parent / f".tmp-old-step-{step}-{os.getpid()}"
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)
    _fsync_dir(final.parent)
    prune_checkpoints(out_dir, keep_last)
    return final


def load_trainer_state(directory: str | Path) -> dict[str, Any]:
    """Read ``trainer_state.pt`` of a checkpoint folder with ``weights_only=True``; clear errors otherwise."""
    path = Path(directory) / STATE_NAME
    if not path.is_file():
        raise InputFileError(f"{directory}: not a training checkpoint (no {STATE_NAME}); point resume at a "
                             f"{CHECKPOINTS_DIR}/step-<N> folder or a run folder")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises many types for corrupt or unsafe files
        # torch's own message advises loading with weights_only=False, which runs any code the file holds: never
        # passed on. The way out is an older checkpoint of the same run.
        reason = str(err).strip().partition("\n")[0]
        reason = "" if "weights_only" in reason or "Weights only" in reason else f" ({reason[:160]})"
        raise InputFileError(f"{path}: cannot read the trainer state{reason}: the file is corrupt, cut short or "
                             f"was not written by lmforge. {_older_checkpoints_advice(Path(directory))}") from err
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        raise InputFileError(f"{path}: not an lmforge trainer state")
    if state.get("version", 0) > STATE_VERSION:
        raise InputFileError(f"{path}: written by a newer lmforge (trainer state version {state['version']}); "
                             "upgrade lmforge")
    from lmforge.training.state import migrate_state

    return migrate_state(state)


def _older_checkpoints_advice(directory: Path) -> str:
    """What to resume from instead of a checkpoint that cannot be read: the run's older complete checkpoints,
    newest first."""
    own = _STEP_DIR.match(directory.name)
    older = []
    if own and directory.parent.name == CHECKPOINTS_DIR:
        older = [path for step, path in list_checkpoints(directory.parent.parent) if step < int(own.group(1))]
    if not older:
        return "Start afresh (--resume never) or resume from another copy of the run"
    return f"Resume from an older checkpoint instead (--resume PATH): {', '.join(map(str, older[::-1][:3]))}"


def config_differences(saved: dict[str, Any] | None, current: dict[str, Any] | None, prefix: str = "",
                       allowed: tuple[str, ...] = ()) -> list[str]:
    """``"name (checkpoint X, now Y)"`` for every field that differs and is not in ``allowed``.

    Fields present on one side only (added or removed by another lmforge version) are not compared.
    """
    if saved is None or current is None:
        if (saved is None) != (current is None):
            return [f"{prefix.rstrip('.') or 'config'} (checkpoint {'none' if saved is None else 'set'}, "
                    f"now {'none' if current is None else 'set'})"]
        return []
    out = []
    for key in sorted(set(saved) & set(current)):
        if key in allowed:
            continue
        old, new = saved.get(key), current.get(key)
        if old != new:
            out.append(f"{prefix}{key} (checkpoint {old!r}, now {new!r})")
    return out


# ------------------------------------------------------------------------------------------------------ run folder
def holds_run(out_dir: Path) -> bool:
    """A run was started here: run_config.json, metrics.jsonl or anything under checkpoints/."""
    root = out_dir / CHECKPOINTS_DIR
    return ((out_dir / RUN_CONFIG_NAME).exists() or (out_dir / METRICS_NAME).exists()
            or (root.is_dir() and any(root.iterdir())))


def is_inside(path: Path, folder: Path) -> bool:
    return path.resolve().is_relative_to(folder.resolve())


def step_of(path: Path) -> int:
    match = _STEP_DIR.match(path.name)
    if not match:
        raise LmforgeError(f"{path}: checkpoint folders inside a run are named step-<N>")
    return int(match.group(1))


def plan_run_dir(out_dir: Path, resume: str | Path, overwrite: bool) -> Path | None:
    """Check ``out_dir`` for a run and return the checkpoint to resume from, if any; nothing on disk changes.

    - ``resume="never"``: refuse a folder that holds anything, unless ``overwrite`` (``prepare_run_dir`` then moves
      it to ``<out_dir>.old-<UTC timestamp>``; nothing is deleted).
    - ``resume="auto"``: the latest complete checkpoint under ``out_dir/checkpoints``; none = start at step 0. A
      folder that holds files but no run is refused.
    - a path: that checkpoint folder (or the latest checkpoint of that run folder). From inside ``out_dir`` it must
      be the latest one (later checkpoints would be overwritten); from elsewhere ``out_dir`` must not hold a run.
    """
    if overwrite and resume != "never":
        raise LmforgeError(f"resume={str(resume)!r} and overwrite exclude each other: --resume continues the run in "
                           f"{out_dir}, --overwrite starts a new one")
    held = holds_run(out_dir) if out_dir.is_dir() else False
    if out_dir.is_dir() and any(out_dir.iterdir()) and not held and resume != "never":
        raise LmforgeError(f"{out_dir} holds files but no lmforge training run (no {RUN_CONFIG_NAME}, "
                           f"{METRICS_NAME} or {CHECKPOINTS_DIR}/), so there is nothing to resume there and lmforge "
                           "will not write beside those files: choose another output folder, or pass --overwrite "
                           "(without --resume) to move them aside")
    found: Path | None = None
    if resume == "never":
        if held and not overwrite:
            raise LmforgeError(f"{out_dir} already holds a training run (metrics.jsonl or checkpoints/); pass "
                               "--resume auto to continue it, or --overwrite to start a new run (the old folder is "
                               "renamed, not deleted), or choose another output folder")
        check_output_dir(out_dir, overwrite=overwrite)  # refuses a user's files
    elif resume == "auto":
        found = latest_checkpoint(out_dir)
        if found is None and held:
            log.warning("%s holds no complete checkpoint; starting from step 0", out_dir)
    else:
        found = _explicit_checkpoint(Path(resume), out_dir, held)
    check_output_dir(out_dir, continue_run=True)  # a file where the folder should be, or under a file
    return found


def prepare_run_dir(out_dir: Path, resume: str | Path, overwrite: bool, found: Path | None = None) -> Path | None:
    """Make ``out_dir`` ready for the run that ``plan_run_dir`` checked (rank 0 only); returns ``found``.

    The old folder is moved aside (``overwrite``), the folder made, half-written ``.tmp-*`` checkpoints removed,
    and metrics.jsonl lines logged after the resumed step (by the interrupted run) dropped, so that the continued
    run's lines follow without gaps or duplicates. Called without ``found``, it plans first (one call does both).
    """
    if found is None:
        found = plan_run_dir(out_dir, resume, overwrite)
    if resume == "never":
        prepare_output_dir(out_dir, overwrite=overwrite)
    prepare_output_dir(out_dir, continue_run=True)
    for leftover in remove_partial_checkpoints(out_dir):
        log.info("removed %s, left by an interrupted run", leftover)
    dropped = truncate_metrics(out_dir / METRICS_NAME, step_of(found) if found and is_inside(found, out_dir) else 0)
    if dropped:
        log.info("dropped %d metrics.jsonl lines logged after the checkpoint", dropped)
    return found


def _explicit_checkpoint(path: Path, out_dir: Path, held: bool) -> Path:
    if not is_checkpoint(path):
        latest = latest_checkpoint(path)
        if latest is None:
            raise LmforgeError(f"resume={str(path)!r}: neither a checkpoint folder (with {STATE_NAME}) nor a run "
                               f"folder holding {CHECKPOINTS_DIR}/step-<N>")
        path = latest
    if is_inside(path, out_dir):
        later = [p.name for s, p in list_checkpoints(out_dir) if s > step_of(path)]
        if later:
            raise LmforgeError(f"cannot resume from {path} inside {out_dir}: later checkpoints exist "
                               f"({', '.join(later)}); resume from it into a new output folder instead")
    elif held:
        raise LmforgeError(f"{out_dir} already holds a training run; resume from {path} into an empty output folder")
    return path

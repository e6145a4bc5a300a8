"""The comparison's output folder: what it keeps on disk, so that an interrupted comparison can resume.

``<out>/`` holds

* ``compare-config.json``: the config of the comparison (its setup keys must match on resume);
* ``runs.jsonl``: one line per finished run, ``{"key": ..., "result": ...}``, appended and flushed at once;
* ``data/``: ``test.csv``, ``dev.csv`` (with ``dev_fraction``) and ``train-<size>-<seed>.csv``;
  ``data/pretraining/`` the texts and shards of the ``[[pretrain]]`` tables;
* ``tokenizer/`` (when the config names none), ``word2vec.txt`` / ``glove.txt`` and ``vectors.json`` (their
  seconds), ``pretrained/<name>/`` and ``pretrained.json`` (their seconds);
* ``runs/<approach>-<size>-<seed>/`` (``-2``, ``-3``, ... for an ensemble's other members; ``-grid<k>`` for
  each point of an approach's ``grid``): each run's folder;
* the results: ``compare.csv``, ``compare.md``, ``compare.json`` and ``learning_curve.png``.

These names, and the run keys in ``runs.jsonl``, are a format: a folder written by an earlier lmforge (when this
was ``lmforge.compare``) resumes and reports with this one.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from pathlib import Path
from typing import Any

from lmforge.errors import LmforgeError
from lmforge.recipes.compare.config import Approach, CompareConfig

log = logging.getLogger("lmforge")

SETUP_KEYS = ("data", "text_column", "label_column", "test_fraction", "split_seed", "max_test", "tokenizer",
              "vocab_size", "pretrained", "max_length", "vectors_dim", "vectors_epochs", "glove_epochs",
              "vectors_window", "pretrain", "dev_fraction", "max_dev",
              "test_data")
# setup keys added after 0.1: a folder saved before them was run at these values
LATER_SETUP_DEFAULTS = {"dev_fraction": 0.0, "max_dev": 0, "test_data": ""}
CONFIG_NAME, RUNS_NAME = "compare-config.json", "runs.jsonl"
VECTORS_NAME, PRETRAINED_NAME = "vectors.json", "pretrained.json"  # {name: seconds} of what was trained once


def run_key(approach: Approach, size: int, seed: int) -> str:
    """What makes two runs the same: the approach's settings (its name included), the subset size and the seed. An
    empty ``grid`` (a key added after 0.1) is left out, so that runs an earlier lmforge finished keep their keys."""
    settings = dataclasses.asdict(approach)
    if not settings["grid"]:
        del settings["grid"]
    return json.dumps({"approach": settings, "size": size, "seed": seed}, sort_keys=True)


def run_dir(out: Path, approach: Approach, size: int, seed: int) -> Path:
    """The folder of one run (of the approach's own model; ``member_dirs`` adds an ensemble's others)."""
    return out / "runs" / f"{approach.name.replace(' ', '_').replace('/', '-')}-{size}-{seed}"


def member_dirs(run_dir: Path, approach: Approach) -> list[Path]:
    """The run folder of each model of an approach: ``run_dir``, then ``run_dir-2``, ... for ``ensemble`` members."""
    return [run_dir] + [run_dir.with_name(f"{run_dir.name}-{k}") for k in range(2, len(approach.models()) + 1)]


def _changed_tables(before: Any, after: Any) -> list[str]:
    """Names of the [[pretrain]] tables present before and now with other settings. A table added or removed on
    resume changes nothing that was run (its model is pretrained when first needed, under its own name); a changed
    one would leave finished runs that used the old model."""
    old = {p.get("name"): _settings(p) for p in before or []}
    new = {p.get("name"): _settings(p) for p in after or []}
    return sorted(n for n in old.keys() & new.keys() if old[n] != new[n])


def _settings(table: dict[str, Any]) -> dict[str, Any]:
    """A [[pretrain]] table as compared on resume: an empty ``loss`` and a false ``dropout_off`` (keys added after
    0.1, at those values in every folder an older release wrote) are the same as none."""
    return {k: v for k, v in table.items() if not (k in ("loss", "dropout_off") and not v)}


def _describe_change(key: str, before: Any, after: Any) -> str:
    if key == "pretrain":  # a list of tables: name the ones that differ instead of printing both lists
        return f"[[pretrain]] {', '.join(map(repr, _changed_tables(before, after)))} (changed)"
    return f"{key} (was {before!r}, now {after!r})"


def _finished_runs(runs_path: Path) -> dict[str, dict[str, Any]]:
    """The results in ``runs.jsonl`` by run key; a line cut off by an interruption is skipped (that run repeats)."""
    finished: dict[str, dict[str, Any]] = {}
    if runs_path.is_file():
        for n, line in enumerate(runs_path.read_text(encoding="utf-8").splitlines(), 1):
            try:
                record = json.loads(line)
                finished[record["key"]] = record["result"]
            except (json.JSONDecodeError, KeyError, TypeError):
                log.warning("%s line %d is not a finished run (cut off?); that run is repeated", runs_path, n)
    return finished


def prepare_out(config: CompareConfig, *, resume: bool, overwrite: bool) -> dict[str, dict[str, Any]]:
    """Make ``config.out`` ready; returns the finished runs to reuse (by ``run_key``) when resuming."""
    from lmforge.config import to_dict
    from lmforge.utils.io import atomic_write_text, move_aside

    if resume and overwrite:
        raise LmforgeError("--resume continues the comparison in the output folder, --overwrite starts a new one: "
                           "choose one")
    out = Path(config.out)
    saved_path = out / CONFIG_NAME
    finished: dict[str, dict[str, Any]] = {}
    if out.exists() and any(out.iterdir()):
        if resume and saved_path.is_file():
            saved = {**LATER_SETUP_DEFAULTS, **json.loads(saved_path.read_text(encoding="utf-8"))}
            current = to_dict(config)
            differs = {k: _changed_tables(saved.get(k), current[k]) if k == "pretrain" else saved.get(k) != current[k]
                       for k in SETUP_KEYS}
            changed = [_describe_change(k, saved.get(k), current[k]) for k in SETUP_KEYS if differs[k]]
            if changed:
                raise LmforgeError(f"cannot resume the comparison in {out}: {'; '.join(changed)}. Only sizes, seeds "
                                   "and approaches may change on resume; use another --out or --overwrite")
            finished = _finished_runs(out / RUNS_NAME)
            log.info("compare: resuming in %s with %d finished run(s)", out, len(finished))
        elif overwrite:
            log.warning("compare: moved the previous contents of %s to %s", out, move_aside(out))
        elif resume:
            raise LmforgeError(f"--resume: {out} holds no comparison ({CONFIG_NAME} is missing); drop --resume or "
                               "choose another --out")
        else:
            raise LmforgeError(f"{out} is not empty; pass --resume to continue the comparison there, --overwrite to "
                               "start a new one (the old folder is renamed, not deleted), or choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(saved_path, json.dumps(to_dict(config), indent=2) + "\n")
    return finished


def append_record(path: Path, record: dict[str, Any]) -> None:
    """One JSON line, flushed to disk before the next run starts."""
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_seconds(path: Path) -> dict[str, float]:
    """``vectors.json`` / ``pretrained.json``: the seconds of what was trained once ({} when not written yet)."""
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def write_seconds(path: Path, seconds: dict[str, float]) -> None:
    from lmforge.utils.io import atomic_write_text

    atomic_write_text(path, json.dumps(seconds) + "\n")

"""One run of an approach: where its model comes from, the check that every source exists before the first run,
and the fine-tuning on one training subset, scored on the test split."""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any

from lmforge.config import from_dict
from lmforge.errors import InputFileError, LmforgeError
from lmforge.recipes.compare.config import Approach, CompareConfig
from lmforge.recipes.compare.folder import member_dirs

log = logging.getLogger("lmforge")


def model_source(approach: Approach, config: CompareConfig, model: str | None = None) -> str:
    """The folder or preset of ``model`` (default: the approach's own; an ``ensemble`` member otherwise)."""
    model = approach.model if model is None else model
    if model.startswith("@") and config.spec(model[1:]) is not None:
        return str(Path(config.out) / "pretrained" / model[1:])
    if model == "@minilm":
        from lmforge.data.corpora import minilm_dir

        return str(minilm_dir())
    if model == "@pretrained":
        if not config.pretrained:
            raise LmforgeError(f"approach {approach.name!r} uses @pretrained but the config sets no pretrained folder")
        return config.pretrained
    return model


def check_sources(config: CompareConfig) -> None:
    """Fail before anything is written to ``out`` (and not hours into the comparison) when a data file or an
    approach's model cannot be found."""
    from lmforge.config import PRESETS

    for key, flag in (("data", "--train"), ("test_data", "--test")):
        path = getattr(config, key)
        if path and not (key == "data" and path == "bbc") and not Path(path).is_file():  # bbc: the embedded corpus
            raise InputFileError(f"{path}: no such file ({key} ({flag})); check the path, or set {key} in the config "
                                 "to a CSV/TSV/JSONL file of texts and labels")
    for spec in config.pretrain:
        if spec.preset not in PRESETS:
            raise LmforgeError(f"[[pretrain]] {spec.name!r}: preset={spec.preset!r} is not one of {', '.join(PRESETS)}")
    for approach, model in ((a, m) for a in config.approach for m in a.models()):
        if model.startswith("@") and config.spec(model[1:]) is not None:
            continue  # pretrained by the comparison itself
        source = model_source(approach, config, model)
        if model == "@pretrained" and not (Path(source) / "config.json").is_file():
            raise LmforgeError(f"approach {approach.name!r} uses @pretrained = {source!r}, which is not a model folder "
                               "(no config.json); pretrain one first (`make demo` leaves runs/demo/bert-mini), set "
                               "`pretrained` in the config, or leave the approach out with --only")
        if not Path(source).is_dir() and source not in PRESETS:
            raise LmforgeError(f"approach {approach.name!r}: model={source!r} is neither a model folder nor a preset "
                               f"({', '.join(PRESETS)})")


def run_one(approach: Approach, config: CompareConfig, train_file: Path, test_file: Path, n_train: int, seed: int,
            tokenizer_dir: str, vectors: dict[str, Path], run_dir: Path) -> dict[str, Any]:
    """Fine-tune one approach on one subset; returns the test metrics and the wall time.

    With ``approach.ensemble``, every member is fine-tuned the same way (same subset, seed and settings; folders
    ``run_dir``, ``run_dir-2``, ...) and the test metrics are those of their averaged class probabilities
    (``lmforge.recipes.ensemble``); the time and steps are the members' sums."""
    from lmforge.config import TaskConfig, TrainConfig
    from lmforge.recipes.finetune import FinetuneRun, build_finetune_trainer

    per_epoch = max(1, math.ceil(n_train / approach.batch_size))
    epochs = max(approach.epochs, approach.min_steps / per_epoch)
    task = from_dict(TaskConfig, {
        "task": "sequence", "max_length": config.max_length, "freeze": approach.freeze, "head_lr": approach.head_lr,
        "epochs": epochs, "init_embeddings": str(vectors[approach.vectors]) if approach.vectors else "",
        **approach.task}, where=f"approach {approach.name!r}: task")
    train = from_dict(TrainConfig, {
        "lr": approach.lr, "batch_size": approach.batch_size, "warmup_ratio": 0.1, "seed": seed, "eps": 1e-8,
        "log_every": 10, "eval_every": 10**9, "save_every": 10**9, "keep_last": 1,  # evaluate once, at the end
        **approach.train}, where=f"approach {approach.name!r}: train")
    start = time.perf_counter()
    folders, steps = [], 0
    for model, folder in zip(approach.models(), member_dirs(run_dir, approach), strict=True):
        source = model_source(approach, config, model)
        run = FinetuneRun(model=source, tokenizer=tokenizer_dir if not Path(source).is_dir() else "",
                          preset_options=dict(approach.preset_options), train_file=str(train_file),
                          dev_file=str(test_file), out=str(folder), task=task, train=train)
        level = log.level
        log.setLevel(logging.WARNING)  # one summary line per run instead of every checkpoint and evaluation
        try:
            trainer, _ = build_finetune_trainer(run, overwrite=True, progress=False)
            trainer.fit()
        finally:
            log.setLevel(level)
        folders.append(str(folder))
        steps += trainer.step
        record = trainer.last_eval
    if len(folders) > 1:
        record = score_folders(folders, test_file)
    seconds = time.perf_counter() - start
    return {"approach": approach.name, "family": approach.family, "size": n_train, "seed": seed,
            "accuracy": record["accuracy"], "f1": record["f1"], "seconds": seconds, "steps": steps}


def score_folders(folders: list[str], path: Path) -> dict[str, Any]:
    """The metrics of fine-tuned classifier folders on the labelled file ``path``: one model's, or the averaged class
    probabilities of several (``lmforge.recipes.ensemble``)."""
    if len(folders) > 1:
        from lmforge.recipes.ensemble import Ensemble

        ensemble = Ensemble(folders)
        examples = ensemble.read(str(path), labelled=True)
        return ensemble.task.metrics(examples, ensemble.predict(examples, str(path)))
    from lmforge.recipes.finetune import featurize, load_task_model

    model, task, tokenizer = load_task_model(folders[0])
    examples = task.read(str(path), labelled=True)
    features = featurize(task, examples, tokenizer, str(path), training=False)
    return task.metrics(examples, task.predict(model, examples, features, tokenizer, batch_size=32, progress=None))


def run_grid(approach: Approach, config: CompareConfig, train_file: Path, dev_file: Path, test_file: Path,
             n_train: int, seed: int, tokenizer_dir: str, vectors: dict[str, Path], run_dir: Path) -> dict[str, Any]:
    """Fine-tune every point of ``approach.grid`` on one subset, score each on the dev split, then score only the
    best one (highest dev accuracy, the first on a tie) on the test split.

    The result is ``run_one``'s with the test metrics of the chosen point, ``dev_accuracy`` / ``dev_f1`` of it,
    ``chosen`` (its settings) and ``grid`` (every point with its dev metrics); ``seconds`` and ``steps`` count the
    whole search, as a user who tunes pays for it. Point ``k`` runs in ``<run_dir>-grid<k>``.
    """
    import shutil

    tried, seconds, steps = [], 0.0, 0
    for k, point in enumerate(approach.grid_points()):
        folder = grid_dir(run_dir, k)
        for member in member_dirs(folder, approach):
            if member.exists():  # cut off by an interruption: our own scratch folder, started again
                shutil.rmtree(member)
        result = run_one(approach.at(point), config, train_file, dev_file, n_train, seed, tokenizer_dir, vectors,
                         folder)
        tried.append({"point": point, "dev_accuracy": result["accuracy"], "dev_f1": result["f1"], "folder": folder})
        seconds += result["seconds"]
        steps += result["steps"]
        log.info("compare: %s, seed %d, grid %s: dev accuracy %.3f", approach.name, seed, point, result["accuracy"])
    best = max(range(len(tried)), key=lambda k: (tried[k]["dev_accuracy"], -k))
    start = time.perf_counter()
    record = score_folders([str(f) for f in member_dirs(tried[best]["folder"], approach)], test_file)
    seconds += time.perf_counter() - start
    return {"approach": approach.name, "family": approach.family, "size": n_train, "seed": seed,
            "accuracy": record["accuracy"], "f1": record["f1"], "seconds": seconds, "steps": steps,
            "dev_accuracy": tried[best]["dev_accuracy"], "dev_f1": tried[best]["dev_f1"],
            "chosen": tried[best]["point"],
            "grid": [{k: v for k, v in t.items() if k != "folder"} for t in tried]}


def grid_dir(run_dir: Path, k: int) -> Path:
    """The folder of grid point ``k`` of a run."""
    return run_dir.with_name(f"{run_dir.name}-grid{k}")


def grid_dirs(run_dir: Path, approach: Approach) -> list[Path]:
    """Every folder a run writes: its own model's and an ensemble's others, for each grid point when it has a grid."""
    if not approach.grid:
        return member_dirs(run_dir, approach)
    return [m for k in range(len(approach.grid_points())) for m in member_dirs(grid_dir(run_dir, k), approach)]

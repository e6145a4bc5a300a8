"""``run_compare``: a whole comparison, in the order it happens. The data is split once; the tokenizer, the static
vectors and the ``[[pretrain]]`` models are trained once on the training texts; then every approach x size x seed
runs, each finished run saved at once (``runs.jsonl``) so that ``resume=True`` continues where it stopped; last,
the results are written (``lmforge.recipes.compare.report``)."""

from __future__ import annotations

import contextlib
import logging
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lmforge.errors import LmforgeError
from lmforge.recipes.compare.approaches import check_sources, grid_dirs, run_grid, run_one
from lmforge.recipes.compare.config import Approach, CompareConfig
from lmforge.recipes.compare.data import Split, split_data
from lmforge.recipes.compare.folder import (
    PRETRAINED_NAME,
    RUNS_NAME,
    VECTORS_NAME,
    append_record,
    member_dirs,
    prepare_out,
    read_seconds,
    run_dir,
    run_key,
    write_seconds,
)
from lmforge.recipes.compare.pretraining import pretrain_here, train_static_vectors
from lmforge.recipes.compare.report import write_results

log = logging.getLogger("lmforge")


@contextlib.contextmanager
def failing_step(what: str) -> Iterator[None]:
    """Name the comparison's step in an error raised inside it ("compare: approach 'w2v' (10 per class, seed 0):
    the loss is nan ..."): a comparison runs dozens of trainings, and the message alone would not say which one."""
    try:
        yield
    except LmforgeError as err:
        raise LmforgeError(f"compare stopped at {what}: {err}. Finished runs are kept; fix the setting and continue "
                           "with --resume") from err


def run_compare(config: CompareConfig, *, progress: bool = True, resume: bool = False,
                overwrite: bool = False) -> dict[str, Path]:
    """Run every approach x size x seed; write the CSV, the Markdown table and the learning curve.

    Args:
        resume: continue the comparison already in ``config.out`` (finished runs are not repeated).
        overwrite: move an existing ``config.out`` aside (``<out>.old-<timestamp>``) and start afresh.

    Returns:
        The paths of ``compare.csv`` (``csv``), ``compare.md`` (``md``) and ``learning_curve.png`` (``png``).
    """
    check_sources(config)
    out = Path(config.out)
    finished = prepare_out(config, resume=resume, overwrite=overwrite)
    split = split_data(config, out / "data")
    tokenizer_dir = train_tokenizer(config, out, split.train_texts)
    vectors, vector_seconds = train_vectors_once(config, out, tokenizer_dir, split.train_texts)
    pretrain_seconds = pretrain_models(config, out, tokenizer_dir, split.train_texts)
    results = run_all(config, split, tokenizer_dir, vectors, finished, progress=progress)
    return write_results(config, out, results, n_test=len(split.test), n_classes=split.n_classes,
                         vector_seconds=vector_seconds, pretrain_seconds=pretrain_seconds, n_dev=len(split.dev))


def train_tokenizer(config: CompareConfig, out: Path, train_texts: list[str]) -> str:
    """The tokenizer folder: the config's, the one trained before (resuming), or a WordPiece vocabulary trained now
    on the training texts (``out/tokenizer``)."""
    from lmforge.tokenizers import WordPieceTrainer

    tokenizer_dir = config.tokenizer
    if not tokenizer_dir and (out / "tokenizer" / "vocab.txt").is_file():  # resuming: the same vocabulary
        tokenizer_dir = str(out / "tokenizer")
    if not tokenizer_dir:
        start = time.perf_counter()
        tokenizer = WordPieceTrainer(config.vocab_size, algorithm="bpe-count").train(train_texts)
        tokenizer_dir = str(out / "tokenizer")
        tokenizer.save_pretrained(tokenizer_dir, overwrite=True)
        log.info("compare: trained a %d-token WordPiece vocabulary on the training texts in %.1f s",
                 tokenizer.vocab_size, time.perf_counter() - start)
    return tokenizer_dir


def train_vectors_once(config: CompareConfig, out: Path, tokenizer_dir: str,
                       train_texts: list[str]) -> tuple[dict[str, Path], dict[str, float]]:
    """The static vectors the approaches use (``out/word2vec.txt``, ``out/glove.txt``), trained on the training texts
    in word pieces unless trained before; returns their files and seconds (``vectors.json``) by kind."""
    from lmforge.tokenizers import WordPieceTokenizer

    vectors: dict[str, Path] = {}
    seconds_path = out / VECTORS_NAME
    vector_seconds = read_seconds(seconds_path)
    sentences: list[list[str]] | None = None
    for kind in sorted({a.vectors for a in config.approach if a.vectors}):
        vectors[kind] = out / f"{kind}.txt"
        if vectors[kind].is_file() and kind in vector_seconds:  # resuming: trained before
            continue
        if sentences is None:
            tokenizer = WordPieceTokenizer.from_pretrained(tokenizer_dir)
            sentences = [tokenizer.tokenize(t) for t in train_texts]
        start = time.perf_counter()
        epochs = config.glove_epochs if kind == "glove" else config.vectors_epochs
        with failing_step(f"training the {kind} vectors (vectors_dim {config.vectors_dim}, {epochs} epochs)"):
            train_static_vectors(kind, sentences, vectors[kind], dim=config.vectors_dim, epochs=epochs,
                                 window=config.vectors_window, seed=config.split_seed)
        vector_seconds[kind] = time.perf_counter() - start
        write_seconds(seconds_path, vector_seconds)
    return vectors, vector_seconds


def pretrain_models(config: CompareConfig, out: Path, tokenizer_dir: str, train_texts: list[str]) -> dict[str, float]:
    """Pretrain the ``[[pretrain]]`` models the approaches use (``out/pretrained/<name>``) unless pretrained before;
    returns the seconds of each (``pretrained.json``)."""
    pretrain_path = out / PRETRAINED_NAME
    pretrain_seconds = read_seconds(pretrain_path)
    for name in sorted({m[1:] for a in config.approach for m in a.models() if config.spec(m[1:]) is not None}):
        if name in pretrain_seconds and (out / "pretrained" / name / "config.json").is_file():
            continue  # resuming: pretrained before
        with failing_step(f"pretraining [[pretrain]] {name!r} (folder {out / 'pretrained' / name})"):
            pretrain_seconds[name] = pretrain_here(config.spec(name), train_texts, tokenizer_dir,
                                                   out / "data" / "pretraining", out / "pretrained" / name,
                                                   seed=config.split_seed)
        if pretrain_path.is_file():  # another comparison in this folder may have pretrained a model meanwhile
            pretrain_seconds = {**read_seconds(pretrain_path), **pretrain_seconds}
        write_seconds(pretrain_path, pretrain_seconds)
    return pretrain_seconds


def run_all(config: CompareConfig, split: Split, tokenizer_dir: str, vectors: dict[str, Path],
            finished: dict[str, dict[str, Any]], *, progress: bool = True) -> list[dict[str, Any]]:
    """Every approach x size x seed, in the config's order: a finished run's result is reused, the others run and
    are appended to ``runs.jsonl`` one by one (their model weights deleted unless ``keep_models``)."""
    from tqdm.auto import tqdm

    from lmforge.tasks.base import quiet_truncation

    runs = [(a, size, seed) for a in config.approach for size in config.sizes for seed in config.seeds]
    if any(run_key(*run) not in finished for run in runs):
        note_truncation(config, split, tokenizer_dir)
    results: list[dict[str, Any]] = []
    with quiet_truncation():  # said once above, not twice per run
        for approach, size, seed in tqdm(runs, desc="compare", disable=not progress):
            results.append(run_or_reuse(config, split, tokenizer_dir, vectors, finished, approach, size, seed))
    return results


def note_truncation(config: CompareConfig, split: Split, tokenizer_dir: str) -> None:
    """One line for the whole comparison: how many test texts are longer than ``max_length`` word pieces of its
    tokenizer, which every run cuts (the runs' own warnings, one per file and run, are at debug level)."""
    from lmforge.tokenizers import WordPieceTokenizer

    tokenizer = WordPieceTokenizer.from_pretrained(tokenizer_dir)
    budget = config.max_length - 2  # [CLS] and [SEP]
    texts = [split.pairs[i][0] for i in split.test]
    longer = sum(len(tokenizer.encode_ids(text)) > budget for text in texts)
    if longer:
        log.info("compare: %d of %d test texts are longer than max_length=%d word pieces; every run reads their "
                 "first %d (set max_length, or an approach's task.long_text, to change it)", longer, len(texts),
                 config.max_length, config.max_length)


def run_or_reuse(config: CompareConfig, split: Split, tokenizer_dir: str, vectors: dict[str, Path],
                 finished: dict[str, dict[str, Any]], approach: Approach, size: int, seed: int) -> dict[str, Any]:
    """One approach x size x seed: its finished result, or a new run appended to ``runs.jsonl``."""
    out = Path(config.out)
    train_file, n_train = split.train_file(size, seed)
    key = run_key(approach, size, seed)
    if key in finished:
        return finished[key]
    folder = run_dir(out, approach, size, seed)
    for member in member_dirs(folder, approach):
        if member.exists():  # cut off by an interruption: our own scratch folder, started again
            shutil.rmtree(member)
    with failing_step(f"approach {approach.name!r} ({size or 'all'} per class, seed {seed}; folder {folder})"):
        if approach.grid:  # settings chosen on the dev split, the chosen model alone scored on the test split
            result = run_grid(approach, config, train_file, split.dev_file, split.test_file, n_train, seed,
                              tokenizer_dir, vectors, folder)
        else:
            result = run_one(approach, config, train_file, split.test_file, n_train, seed, tokenizer_dir,
                             vectors, folder)
    result["per_class"] = size
    if not config.keep_models:  # keep the logs and scores, not the weights (a MiniLM run writes ~300 MB)
        for member in grid_dirs(folder, approach):
            shutil.rmtree(member / "checkpoints", ignore_errors=True)
            for name in ("model.safetensors", "vocab.txt"):
                (member / name).unlink(missing_ok=True)
    append_record(out / RUNS_NAME, {"key": key, "result": result})
    log.info("compare: %s, %s per class, seed %d: accuracy %.3f, macro-F1 %.3f (%.0f s)", approach.name,
             size or "all", seed, result["accuracy"], result["f1"], result["seconds"])
    return result

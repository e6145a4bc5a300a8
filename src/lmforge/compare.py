"""``lmforge compare``: the lectures' comparison of three ways to build a text classifier, on one fixed split.

(a) train from scratch (a small Transformer encoder, the RNN with attention pooling; random embeddings);
(b) the same RNN with embeddings initialised from Word2Vec or GloVe trained on the unlabelled training texts,
    frozen or fine-tuned;
(c) a frozen pretrained encoder with a linear head (feature extraction);
(d) pretrain + fine-tune (our own pretrained encoder, a public checkpoint).

Every approach is trained on class-balanced subsets of the training split (``sizes`` examples per class, 0 = all)
with several ``seeds`` (the seed draws the subset and initialises the model) and scored on the whole test split
(or a class-balanced ``max_test`` of it).
The results are ``compare.csv`` (one row per run), ``compare.md`` (mean and standard deviation of accuracy and
macro-F1 per approach and size, and the wall time of each approach) and ``learning_curve.png``.

An approach is a table in the config (``[[approach]]``); ``model`` is a preset name, a model folder, one of
``@minilm`` (the embedded MiniLM checkpoint) and ``@pretrained`` (the config's ``pretrained`` folder), or
``@NAME`` for a ``[[pretrain]]`` table of the config: a model that lmforge pretrains once per comparison on the
training texts, with the comparison's tokenizer (any ``lmforge pretrain`` objective: ``preset``, ``objective`` and
``model`` / ``data`` / ``train`` overrides), timed and named in the table. ``task`` and ``train`` tables in an
approach override its ``TaskConfig`` / ``TrainConfig`` (e.g. ULMFiT's ``gradual_unfreezing`` and schedule);
``vectors = "word2vec" | "glove"`` initialises the token embeddings from static vectors trained here on the
training texts split into the tokenizer's word pieces (so every token has a vector).

Nothing is lost when a comparison stops: every finished run is appended to ``runs.jsonl`` at once, and
``resume=True`` (``lmforge compare --resume``) continues in the same folder, reusing the tokenizer, the static
vectors and every finished run whose approach settings are unchanged; sizes, seeds and approaches may be added.
A folder that already holds a comparison is otherwise refused, or moved aside with ``overwrite=True``.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import io
import json
import logging
import math
import os
import random
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lmforge.config import from_dict
from lmforge.errors import LmforgeError

log = logging.getLogger("lmforge")

FAMILIES = {"scratch": "(a) from scratch", "static": "(b) static embeddings", "frozen": "(c) frozen encoder",
            "finetune": "(d) pretrain + fine-tune"}


@dataclass
class Approach:
    name: str = ""
    family: str = "scratch"
    model: str = ""
    preset_options: dict[str, Any] = field(default_factory=dict)
    vectors: str = ""
    freeze: str = "none"
    lr: float = 5e-5
    head_lr: float | None = None
    epochs: float = 3.0
    min_steps: int = 40
    batch_size: int = 16
    task: dict[str, Any] = field(default_factory=dict)  # TaskConfig overrides
    train: dict[str, Any] = field(default_factory=dict)  # TrainConfig overrides
    # more models fine-tuned the same way, their class probabilities averaged with this one's on the test set
    # (ULMFiT's forward + backward ensemble: ensemble = ["@awd-lstm-bwd"])
    ensemble: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.name or not self.model:
            raise LmforgeError("every [[approach]] needs a name and a model")
        if self.family not in FAMILIES:
            raise LmforgeError(f"approach {self.name!r}: family={self.family!r} is not one of {', '.join(FAMILIES)}")
        if self.vectors not in ("", "word2vec", "glove"):
            raise LmforgeError(f"approach {self.name!r}: vectors={self.vectors!r} is not word2vec or glove")
        if self.ensemble and (self.vectors or self.model in self.ensemble):
            raise LmforgeError(f"approach {self.name!r}: ensemble={self.ensemble!r} lists other models to average "
                               "with model (not model itself), and does not combine with vectors")

    def models(self) -> list[str]:
        """``model`` then the ``ensemble`` members."""
        return [self.model, *self.ensemble]


RESERVED = ("minilm", "pretrained")  # @NAME sources that are not [[pretrain]] tables


@dataclass
class PretrainSpec:
    """A model pretrained once per comparison on its training texts (``[[pretrain]]``; approaches use ``@name``).

    ``model``, ``data`` and ``train`` override the preset's ``ModelConfig``, the ``DataConfig`` (``seq_len``,
    masking, ...) and the ``TrainConfig`` (``max_steps``, ``batch_size``, ``lr``, ...) of the pretraining run.
    """

    name: str = ""
    preset: str = ""
    objective: str = "mlm"
    model: dict[str, Any] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)
    train: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.name or not self.preset:
            raise LmforgeError("every [[pretrain]] needs a name and a preset")
        if self.name in RESERVED or not self.name.replace("-", "").replace("_", "").isalnum():
            raise LmforgeError(f"[[pretrain]] name={self.name!r}: use letters, digits, '-' and '_' (not "
                               f"{' or '.join(RESERVED)}); approaches refer to it as model = \"@{self.name}\"")
        for key in ("path", "objective"):
            if key in self.data:
                raise LmforgeError(f"[[pretrain]] {self.name!r}: data.{key} is set by the comparison (the training "
                                   f"texts; the table's objective = ...); remove it")


@dataclass
class CompareConfig:
    out: str = "runs/compare"
    data: str = "bbc"
    text_column: str = "text"
    label_column: str = "label"
    test_fraction: float = 0.2
    split_seed: int = 0
    max_test: int = 0
    sizes: list[int] = field(default_factory=lambda: [10, 50, 200, 0])
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    tokenizer: str = ""
    vocab_size: int = 8000
    pretrained: str = ""
    max_length: int = 128
    vectors_dim: int = 128
    vectors_epochs: int = 5  # Word2Vec epochs (gensim's default)
    glove_epochs: int = 30  # GloVe needs many more passes (Pennington et al. ran 50 for under 300 dimensions)
    vectors_window: int = 5
    keep_models: bool = False
    pretrain: list[PretrainSpec] = field(default_factory=list)
    approach: list[Approach] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.approach:
            raise LmforgeError("the config lists no [[approach]]")
        if any(s < 0 for s in self.sizes) or not self.sizes or not self.seeds:
            raise LmforgeError("sizes must be >= 0 (0 = all) and sizes and seeds non-empty")
        names = [a.name for a in self.approach]
        if len(set(names)) != len(names):
            raise LmforgeError(f"approach names repeat: {names}")
        specs = [p.name for p in self.pretrain]
        if len(set(specs)) != len(specs):
            raise LmforgeError(f"[[pretrain]] names repeat: {specs}")
        for approach in self.approach:
            if approach.model.startswith("@") and approach.model[1:] not in (*RESERVED, *specs):
                raise LmforgeError(f"approach {approach.name!r}: model={approach.model!r} names no [[pretrain]] table "
                                   f"(defined: {', '.join(specs) or 'none'}) and is not @minilm or @pretrained")

    def spec(self, name: str) -> PretrainSpec | None:
        return next((p for p in self.pretrain if p.name == name), None)


def compare_config(values: dict[str, Any], where: str) -> CompareConfig:
    """A ``CompareConfig`` from TOML values; an approach's ``model`` may be a table with its preset's settings
    (``model = { source = "rnn-attn", d_model = 128 }``, see ``lmforge.recipes.resolve.split_model_table``)."""
    from lmforge.recipes.resolve import split_model_table

    approaches = [split_model_table(a, f"{where}: approach {a.get('name')!r}") if isinstance(a, dict) else a
                  for a in values.get("approach", [])]
    return from_dict(CompareConfig, {**values, "approach": approaches}, where=where)


# ---------------------------------------------------------------------------------------------- data
def load_labelled(config: CompareConfig) -> list[tuple[str, str]]:
    """(text, label) pairs: the BBC topics, or a CSV/TSV/JSONL file."""
    if config.data == "bbc":
        from lmforge.data.corpora import bbc_news_dir
        from lmforge.data.text import decode_utf8

        root = bbc_news_dir()
        return [(decode_utf8(f.read_bytes())[0].strip(), topic.name)
                for topic in sorted(p for p in root.iterdir() if p.is_dir()) for f in sorted(topic.glob("*.txt"))]
    from lmforge.data.readers import read_classification

    data = read_classification(config.data, text_column=config.text_column, label_column=config.label_column,
                               pair=False)
    if data.kind != "classification":
        raise LmforgeError(f"{config.data}: compare needs class labels, not numbers")
    return [(e.text, str(e.label)) for e in data.examples]


def subset(train: list[int], labels: list[str], per_class: int, seed: int) -> list[int]:
    """``per_class`` random training examples of every class (all of them for 0 or when a class has fewer)."""
    if per_class == 0:
        return list(train)
    rng = random.Random(seed)
    chosen = []
    for label in sorted(set(labels[i] for i in train)):
        members = [i for i in train if labels[i] == label]
        chosen += rng.sample(members, min(per_class, len(members)))
    return sorted(chosen)


def _write_csv(path: Path, rows: list[tuple[str, str]]) -> None:
    """Atomically (a run that reads the file, in this process or another one, never sees it half written)."""
    from lmforge.utils.io import atomic_write_text

    buffer = io.StringIO(newline="")
    writer = csv.writer(buffer)
    writer.writerow(["text", "label"])
    writer.writerows(rows)
    atomic_write_text(path, buffer.getvalue())


# ---------------------------------------------------------------------------------------------- static vectors
def train_static_vectors(kind: str, sentences: list[list[str]], out: Path, *, dim: int, epochs: int, window: int,
                         seed: int) -> Path:
    """Word2Vec (skip-gram) or GloVe vectors of the word pieces in ``sentences``, saved in word2vec text format.

    ``min_count`` is 1: every piece of the tokenizer's vocabulary that occurs gets a vector.
    """
    from lmforge.embeddings.glove import GloVeConfig
    from lmforge.embeddings.vocab import EncodedCorpus
    from lmforge.embeddings.word2vec import Word2VecConfig
    from lmforge.recipes.vectors import train_vectors

    settings = dict(dim=dim, window=window, epochs=epochs, min_count=1, seed=seed + 1)
    if kind == "word2vec":
        from lmforge.embeddings import sgns

        mode = "exact" if sgns.available() else "fast"
        if mode == "fast":
            log.warning("compare: Word2Vec's compiled loop was not built (no C compiler at install); training the "
                        "batched approximation (mode fast) instead")
        config = Word2VecConfig(mode=mode, **settings)
    else:
        config = GloVeConfig(**settings)
    level = log.level
    log.setLevel(logging.WARNING)  # one summary line instead of the vocabulary and every epoch
    try:
        result, _ = train_vectors(config, EncodedCorpus.from_sentences(sentences), out=out, metrics=False,
                                  progress=False)
    finally:
        log.setLevel(level)
    final = f", final loss {result.epochs[-1].loss:.3f}" if result.epochs else ""
    log.info("compare: %s (%d dims) on the training texts: %.1f s%s", kind, dim, result.seconds, final)
    return out


# ---------------------------------------------------------------------------------------------- pretraining here
def pretrain_here(spec: PretrainSpec, texts: list[str], tokenizer_dir: str, work: Path, out: Path,
                  seed: int) -> float:
    """Pretrain ``spec`` on ``texts`` (one document each) into the model folder ``out``; returns the seconds.

    The texts are tokenized once into ``work/shards`` (shared by every [[pretrain]] table); an interrupted
    pretraining continues from its last checkpoint (``resume="auto"``).
    """
    from lmforge.config import DataConfig, TrainConfig
    from lmforge.data.shards import MANIFEST_NAME, prepare_corpus
    from lmforge.recipes.pretrain import PretrainRun, build_trainer

    shards = work / "shards"
    if not (shards / MANIFEST_NAME).is_file():
        docs = work / "texts"
        docs.mkdir(parents=True, exist_ok=True)
        for i, text in enumerate(texts):
            (docs / f"{i:06d}.txt").write_text(text + "\n", encoding="utf-8")
        prepare_corpus(tokenizer_dir, [docs], shards, input_format="documents", workers=1, overwrite=True,
                       show_progress=False)
    where = f"[[pretrain]] {spec.name!r}"
    data = from_dict(DataConfig, {**spec.data, "path": str(shards), "objective": spec.objective},
                     where=f"{where}: data")
    train = from_dict(TrainConfig, {"seed": seed, "log_every": 10, **spec.train}, where=f"{where}: train")
    run = PretrainRun(preset=spec.preset, out=str(out), model=dict(spec.model), data=data, train=train)
    start = time.perf_counter()
    level = log.level
    log.setLevel(logging.WARNING)
    try:
        trainer = build_trainer(run, resume="auto", progress=False)
        final = trainer.fit()
    finally:
        log.setLevel(level)
    seconds = time.perf_counter() - start
    shown = ", ".join(f"{k} {v:.3f}" for k, v in final.items() if k.startswith("eval_") and isinstance(v, float))
    log.info("compare: pretrained %s (%s, %s, %d steps) on the training texts in %.1f min%s", spec.name, spec.preset,
             spec.objective, trainer.step, seconds / 60, f"; held out: {shown}" if shown else "")
    return seconds


# ---------------------------------------------------------------------------------------------- runs
def _model_source(approach: Approach, config: CompareConfig, model: str | None = None) -> str:
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
    """Fail before the first run, not hours into the comparison, when an approach's model cannot be found."""
    from lmforge.config import PRESETS

    for spec in config.pretrain:
        if spec.preset not in PRESETS:
            raise LmforgeError(f"[[pretrain]] {spec.name!r}: preset={spec.preset!r} is not one of {', '.join(PRESETS)}")
    for approach, model in ((a, m) for a in config.approach for m in a.models()):
        if model.startswith("@") and config.spec(model[1:]) is not None:
            continue  # pretrained by the comparison itself
        source = _model_source(approach, config, model)
        if model == "@pretrained" and not (Path(source) / "config.json").is_file():
            raise LmforgeError(f"approach {approach.name!r} uses @pretrained = {source!r}, which is not a model folder "
                               "(no config.json); pretrain one first (`make demo` leaves runs/demo/bert-mini), set "
                               "`pretrained` in the config, or leave the approach out with --only")
        if not Path(source).is_dir() and source not in PRESETS:
            raise LmforgeError(f"approach {approach.name!r}: model={source!r} is neither a model folder nor a preset "
                               f"({', '.join(PRESETS)})")


SETUP_KEYS = ("data", "text_column", "label_column", "test_fraction", "split_seed", "max_test", "tokenizer",
              "vocab_size", "pretrained", "max_length", "vectors_dim", "vectors_epochs", "glove_epochs",
              "vectors_window", "pretrain")
CONFIG_NAME, RUNS_NAME = "compare-config.json", "runs.jsonl"


def _run_key(approach: Approach, size: int, seed: int) -> str:
    """What makes two runs the same: the approach's settings (its name included), the subset size and the seed."""
    return json.dumps({"approach": dataclasses.asdict(approach), "size": size, "seed": seed}, sort_keys=True)


def _changed_tables(before: Any, after: Any) -> list[str]:
    """Names of the [[pretrain]] tables present before and now with other settings. A table added or removed on
    resume changes nothing that was run (its model is pretrained when first needed, under its own name); a changed
    one would leave finished runs that used the old model."""
    old = {p.get("name"): p for p in before or []}
    new = {p.get("name"): p for p in after or []}
    return sorted(n for n in old.keys() & new.keys() if old[n] != new[n])


def _describe_change(key: str, before: Any, after: Any) -> str:
    if key == "pretrain":  # a list of tables: name the ones that differ instead of printing both lists
        return f"[[pretrain]] {', '.join(map(repr, _changed_tables(before, after)))} (changed)"
    return f"{key} (was {before!r}, now {after!r})"


def prepare_out(config: CompareConfig, *, resume: bool, overwrite: bool) -> dict[str, dict[str, Any]]:
    """Make ``config.out`` ready; returns the finished runs to reuse (by ``_run_key``) when resuming."""
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
            saved = json.loads(saved_path.read_text(encoding="utf-8"))
            current = to_dict(config)
            differs = {k: _changed_tables(saved.get(k), current[k]) if k == "pretrain" else saved.get(k) != current[k]
                       for k in SETUP_KEYS}
            changed = [_describe_change(k, saved.get(k), current[k]) for k in SETUP_KEYS if differs[k]]
            if changed:
                raise LmforgeError(f"cannot resume the comparison in {out}: {'; '.join(changed)}. Only sizes, seeds "
                                   "and approaches may change on resume; use another --out or --overwrite")
            runs_path = out / RUNS_NAME
            if runs_path.is_file():
                for n, line in enumerate(runs_path.read_text(encoding="utf-8").splitlines(), 1):
                    try:
                        record = json.loads(line)
                        finished[record["key"]] = record["result"]
                    except (json.JSONDecodeError, KeyError, TypeError):
                        log.warning("%s line %d is not a finished run (cut off?); that run is repeated", runs_path, n)
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


def _append_record(path: Path, record: dict[str, Any]) -> None:
    """One JSON line, flushed to disk before the next run starts."""
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())


def member_dirs(run_dir: Path, approach: Approach) -> list[Path]:
    """The run folder of each model of an approach: ``run_dir``, then ``run_dir-2``, ... for ``ensemble`` members."""
    return [run_dir] + [run_dir.with_name(f"{run_dir.name}-{k}") for k in range(2, len(approach.models()) + 1)]


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
        source = _model_source(approach, config, model)
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
        from lmforge.recipes.ensemble import Ensemble

        ensemble = Ensemble(folders)
        examples = ensemble.read(str(test_file), labelled=True)
        record = ensemble.task.metrics(examples, ensemble.predict(examples, str(test_file)))
    seconds = time.perf_counter() - start
    return {"approach": approach.name, "family": approach.family, "size": n_train, "seed": seed,
            "accuracy": record["accuracy"], "f1": record["f1"], "seconds": seconds, "steps": steps}


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
    """
    import shutil

    from tqdm.auto import tqdm

    from lmforge.data.readers import stratified_split
    from lmforge.tokenizers import WordPieceTokenizer, WordPieceTrainer
    from lmforge.utils.io import atomic_write_text

    check_sources(config)
    out = Path(config.out)
    finished = prepare_out(config, resume=resume, overwrite=overwrite)
    pairs = load_labelled(config)
    labels = [label for _, label in pairs]
    train_idx, test_idx = stratified_split(labels, config.test_fraction, config.split_seed)
    if config.max_test and len(test_idx) > config.max_test:  # a smaller, still class-balanced test set (the demo)
        per_class = max(1, config.max_test // len(set(labels)))
        test_idx = subset(test_idx, labels, per_class, config.split_seed)
    data_dir = out / "data"
    data_dir.mkdir(exist_ok=True)
    test_file = data_dir / "test.csv"
    _write_csv(test_file, [pairs[i] for i in test_idx])
    train_texts = [pairs[i][0] for i in train_idx]

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
    vectors: dict[str, Path] = {}
    kinds = sorted({a.vectors for a in config.approach if a.vectors})
    seconds_path = out / "vectors.json"
    vector_seconds: dict[str, float] = (json.loads(seconds_path.read_text(encoding="utf-8"))
                                        if seconds_path.is_file() else {})
    sentences: list[list[str]] | None = None
    for kind in kinds:
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
        atomic_write_text(seconds_path, json.dumps(vector_seconds) + "\n")

    pretrain_path = out / "pretrained.json"
    pretrain_seconds: dict[str, float] = (json.loads(pretrain_path.read_text(encoding="utf-8"))
                                          if pretrain_path.is_file() else {})
    for name in sorted({m[1:] for a in config.approach for m in a.models() if config.spec(m[1:]) is not None}):
        if name in pretrain_seconds and (out / "pretrained" / name / "config.json").is_file():
            continue  # resuming: pretrained before
        with failing_step(f"pretraining [[pretrain]] {name!r} (folder {out / 'pretrained' / name})"):
            pretrain_seconds[name] = pretrain_here(config.spec(name), train_texts, tokenizer_dir,
                                                   data_dir / "pretraining", out / "pretrained" / name,
                                                   seed=config.split_seed)
        if pretrain_path.is_file():  # another comparison in this folder may have pretrained a model meanwhile
            pretrain_seconds = {**json.loads(pretrain_path.read_text(encoding="utf-8")), **pretrain_seconds}
        atomic_write_text(pretrain_path, json.dumps(pretrain_seconds) + "\n")

    runs = [(a, size, seed) for a in config.approach for size in config.sizes for seed in config.seeds]
    results: list[dict[str, Any]] = []
    for approach, size, seed in tqdm(runs, desc="compare", disable=not progress):
        chosen = subset(train_idx, labels, size, seed)
        train_file = data_dir / f"train-{size}-{seed}.csv"
        if not train_file.exists():
            _write_csv(train_file, [pairs[i] for i in chosen])
        key = _run_key(approach, size, seed)
        if key in finished:
            results.append(finished[key])
            continue
        run_dir = out / "runs" / f"{approach.name.replace(' ', '_').replace('/', '-')}-{size}-{seed}"
        for folder in member_dirs(run_dir, approach):
            if folder.exists():  # cut off by an interruption: our own scratch folder, started again
                shutil.rmtree(folder)
        with failing_step(f"approach {approach.name!r} ({size or 'all'} per class, seed {seed}; folder {run_dir})"):
            result = run_one(approach, config, train_file, test_file, len(chosen), seed, tokenizer_dir, vectors,
                             run_dir)
        result["per_class"] = size
        results.append(result)
        if not config.keep_models:  # keep the logs and scores, not the weights (a MiniLM run writes ~300 MB)
            for folder in member_dirs(run_dir, approach):
                shutil.rmtree(folder / "checkpoints", ignore_errors=True)
                for name in ("model.safetensors", "vocab.txt"):
                    (folder / name).unlink(missing_ok=True)
        _append_record(out / RUNS_NAME, {"key": key, "result": result})
        log.info("compare: %s, %s per class, seed %d: accuracy %.3f, macro-F1 %.3f (%.0f s)", approach.name,
                 size or "all", seed, result["accuracy"], result["f1"], result["seconds"])
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, ["approach", "family", "per_class", "size", "seed", "accuracy", "f1", "seconds",
                                     "steps"])
    writer.writeheader()
    writer.writerows(results)
    atomic_write_text(out / "compare.csv", buffer.getvalue())
    atomic_write_text(out / "compare.md", markdown_table(config, results, vector_seconds, len(test_idx),
                                                         pretrain_seconds))
    plot_learning_curve(config, results, out / "learning_curve.png", n_classes=len(set(labels)))
    atomic_write_text(out / "compare.json", json.dumps({"results": results, "vector_seconds": vector_seconds,
                                                        "pretrain_seconds": pretrain_seconds}, indent=2) + "\n")
    return {"csv": out / "compare.csv", "md": out / "compare.md", "png": out / "learning_curve.png"}


def _summary(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f}"


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


def markdown_table(config: CompareConfig, results: list[dict[str, Any]], vector_seconds: dict[str, float],
                   n_test: int, pretrain_seconds: dict[str, float] | None = None) -> str:
    sizes = config.sizes
    head = [f"{s or 'all'}/class" for s in sizes]
    lines = [f"Test accuracy and macro-F1 on {n_test} held-out examples (mean ± standard deviation over seeds "
             f"{', '.join(map(str, config.seeds))}).", "",
             "| approach | family | " + " | ".join(f"acc {h}" for h in head) + " | "
             + " | ".join(f"F1 {h}" for h in head) + " | seconds per run |",
             "|---|---|" + "---:|" * (2 * len(sizes) + 1)]
    for approach in config.approach:
        mine = [r for r in results if r["approach"] == approach.name]
        cells = []
        for metric in ("accuracy", "f1"):
            for size in sizes:
                values = [r[metric] for r in mine if r["per_class"] == size]
                cells.append(_summary(values) if values else "")
        seconds = statistics.mean(r["seconds"] for r in mine) if mine else 0.0
        name = approach.name
        timed = pretrain_seconds or {}
        mine_pretrained = [m[1:] for m in approach.models()
                           if m.startswith("@") and config.spec(m[1:]) is not None and m[1:] in timed]
        if mine_pretrained:  # an ensemble's members were each pretrained: their times add up
            name += f" (pretrained here: {_duration(sum(timed[m] for m in mine_pretrained))})"
        lines.append(f"| {name} | {FAMILIES[approach.family]} | " + " | ".join(cells) + f" | {seconds:.0f} |")
    if pretrain_seconds:
        lines += ["", "Pretrained by lmforge once, on the training texts only, before the runs: " + "; ".join(
            f"{s.name} ({s.preset}, objective {s.objective}) {_duration(pretrain_seconds[s.name])}"
            for s in config.pretrain if s.name in pretrain_seconds) + "."]
    if vector_seconds:
        lines += ["", "Static vectors trained once on the training texts: "
                  + ", ".join(f"{k} {v:.0f} s" for k, v in vector_seconds.items()) + "."]
    return "\n".join(lines) + "\n"


_FAMILY_LINES = {"scratch": ":", "static": "-.", "frozen": "--", "finetune": "-"}  # a family's lines look alike


def _classes_in(results: list[dict[str, Any]]) -> int:
    """The number of classes, read back from the runs of a per-class size (``size`` = per_class x classes when every
    class has that many training examples; a smaller class only lowers it, so the largest ratio is taken)."""
    ratios = [round(r["size"] / r["per_class"]) for r in results if r.get("per_class")]
    return max(ratios, default=1) or 1


def learning_curve_figure(config: CompareConfig, results: list[dict[str, Any]], *, n_classes: int | None = None):
    """Test accuracy against training examples per class (log scale), as the table counts them: one line per
    approach that has results (mean over seeds, the standard deviation as error bars), the families present named
    in the title and each legend entry; ``sizes = 0`` ("all") sits at the mean count per class of the full training
    split, its tick labelled "all".

    Args:
        n_classes: the number of classes (read back from the results when not given).

    Returns:
        A matplotlib Figure on the Agg canvas (pyplot's global state is untouched).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import NullFormatter, NullLocator

    n_classes = n_classes or _classes_in(results)
    fig = Figure(figsize=(8, 5), dpi=120, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    ticks: dict[float, str] = {}
    families: list[str] = []
    for approach in config.approach:
        xs, means, errs = [], [], []
        for size in config.sizes:
            runs = [r for r in results if r["approach"] == approach.name and r["per_class"] == size]
            if not runs:
                continue
            x = size if size else statistics.mean(r["size"] for r in runs) / n_classes
            ticks[x] = str(size) if size else f"all\n({x:.0f})"
            xs.append(x)
            values = [r["accuracy"] for r in runs]
            means.append(statistics.mean(values))
            errs.append(statistics.stdev(values) if len(values) > 1 else 0.0)
        if not xs:  # no run of this approach finished: no line and no legend entry
            continue
        if approach.family not in families:
            families.append(approach.family)
        letter = FAMILIES[approach.family].split()[0]
        ax.errorbar(xs, means, yerr=errs, marker="o", capsize=3, ls=_FAMILY_LINES[approach.family],
                    label=f"{letter} {approach.name}")
    if not families:
        raise LmforgeError("no finished run to draw a learning curve from")
    ax.set_xscale("log")
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xticks(sorted(ticks), [ticks[x] for x in sorted(ticks)])
    ax.set_xlabel("training examples per class (log scale)")
    ax.set_ylabel("test accuracy")
    ordered = [FAMILIES[f] for f in FAMILIES if f in families]
    ax.set_title("Learning curves: " + ", ".join(ordered), fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def plot_learning_curve(config: CompareConfig, results: list[dict[str, Any]], path: Path, *,
                        n_classes: int | None = None) -> None:
    """Write ``learning_curve_figure`` as a PNG, atomically."""
    from lmforge.utils.io import atomic_write_bytes

    fig = learning_curve_figure(config, results, n_classes=n_classes)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    atomic_write_bytes(path, buffer.getvalue())

"""``lmforge finetune``, ``lmforge evaluate`` and ``lmforge predict``: task heads on a pretrained encoder.

A run is a ``FinetuneRun``: a TOML file (``--config``), then the plain flags, then dotted overrides
(``--task.crf=true``, ``--train.lr=3e-5``). ``--model`` is an lmforge model folder (pretrained or fine-tuned: its
head is dropped), a Hugging Face BERT folder, or a preset name (a randomly initialised encoder, which needs
``--tokenizer``). The run folder ends up holding the best model by the dev metric (``config.json`` with the head,
its labels and the task settings, ``model.safetensors``, the tokenizer), ``eval_results.json`` and the Trainer's
logs and checkpoints (``--resume auto`` continues an interrupted run).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lmforge.commands.options import FRACTION, LEARNING_RATE, SEED, Count, Rate
from lmforge.config import (
    PRESETS,
    TASKS,
    TaskConfig,
    TrainConfig,
    apply_overrides,
    from_dict,
    load_toml,
    to_dict,
    toml_literal,
)
from lmforge.errors import InputFileError, LmforgeError

log = logging.getLogger("lmforge")

# Fine-tuning defaults of Devlin et al. (2019, appendix A.3: lr 5e-5 / 3e-5 / 2e-5, batch 16 / 32, 2-4 epochs) with
# 10% linear warm-up as in google-research/bert's run_classifier.py.
FINETUNE_DEFAULTS: dict[str, Any] = {"train": {"lr": 5e-5, "batch_size": 32, "warmup_ratio": 0.1, "log_every": 10,
                                               "eps": 1e-8}}


@dataclass
class FinetuneRun:
    """Everything one fine-tuning run needs."""

    model: str = ""
    tokenizer: str = ""
    preset_options: dict[str, Any] = field(default_factory=dict)  # ModelConfig overrides for a preset --model
    train_file: str = ""
    dev_file: str = ""
    out: str = ""
    task: TaskConfig = field(default_factory=TaskConfig)
    train: TrainConfig = field(default_factory=TrainConfig)


FLAGS = {"task": "task.task", "model": "model", "tokenizer": "tokenizer", "train": "train_file", "dev": "dev_file",
         "out": "out", "epochs": "task.epochs", "batch_size": "train.batch_size", "lr": "train.lr",
         "max_length": "task.max_length", "warmup_ratio": "train.warmup_ratio", "weight_decay": "train.weight_decay",
         "seed": "train.seed", "freeze": "task.freeze", "text_column": "task.text_column",
         "text_pair_column": "task.text_pair_column", "label_column": "task.label_column",
         "long_text": "task.long_text", "head_lr": "task.head_lr", "layer_decay": "task.layer_decay",
         "scheme": "task.scheme", "max_steps": "train.max_steps"}


def add_finetune_arguments(p: argparse.ArgumentParser) -> None:
    p.epilog = ("Any setting can also be given as --section.key=value, e.g. --task.max_span_width=6 "
                "--task.doc_stride=64 --train.micro_batch_size=8 (TOML values; strings may be bare).")
    p.add_argument("--config", metavar="FILE", help="a TOML recipe with [task] and [train] sections")
    p.add_argument("--task", choices=TASKS, help="sequence, pair, token (tagging), span (span labeling), qa")
    p.add_argument("--model", metavar="DIR|PRESET", help="an lmforge or Hugging Face BERT folder, or a preset name")
    p.add_argument("--tokenizer", metavar="DIR", help="default: the tokenizer in the model folder")
    p.add_argument("--train", metavar="FILE", help="training data (CSV/TSV/JSONL, CoNLL, span JSONL, SQuAD JSON)")
    p.add_argument("--dev", metavar="FILE", help="dev data: evaluated every epoch; the best model is kept")
    p.add_argument("--out", metavar="DIR", help="the run folder")
    p.add_argument("--epochs", type=Rate(0.0, 1e6, low_open=True))
    p.add_argument("--batch-size", type=Count(1, 65_536))
    p.add_argument("--lr", type=LEARNING_RATE)
    p.add_argument("--max-length", type=Count(8, 1_000_000), help="tokens per input, with [CLS]/[SEP] (default 128)")
    p.add_argument("--warmup-ratio", type=FRACTION)
    p.add_argument("--weight-decay", type=Rate(0.0))
    p.add_argument("--seed", type=SEED)
    p.add_argument("--max-steps", type=Count(1, 2**31 - 1), help="default: epochs x batches per epoch")
    p.add_argument("--crf", action="store_true", default=None, help="token task: a linear-chain CRF on the tags")
    p.add_argument("--freeze", metavar="MODE", help="none | all | embeddings | all-but-last:K")
    p.add_argument("--head-lr", type=LEARNING_RATE, help="the head's own learning rate")
    p.add_argument("--layer-decay", type=Rate(0.0, 1.0, low_open=True),
                   help="layer-wise learning-rate decay factor (e.g. 0.9)")
    p.add_argument("--long-text", choices=("truncate", "head-tail", "chunks"))
    p.add_argument("--scheme", choices=("auto", "BIO", "IOB1", "BIOES"), help="token task: the tag scheme")
    p.add_argument("--text-column", help="default: text")
    p.add_argument("--text-pair-column", help="default: text_pair")
    p.add_argument("--label-column", help="default: label")
    p.add_argument("--resume", default="never", metavar="auto|never|PATH")
    p.add_argument("--overwrite", action="store_true", help="start afresh; the old run folder is renamed")
    p.set_defaults(overrides=[])


def resolve_run(args: argparse.Namespace) -> FinetuneRun:
    values = _merge(FINETUNE_DEFAULTS, load_toml(args.config) if args.config else {})
    flags = [f"{key}={toml_literal(getattr(args, name))}" for name, key in FLAGS.items()
             if getattr(args, name, None) is not None]
    if getattr(args, "crf", None):
        flags.append("task.crf=true")
    head_keys = [o.split("=", 1)[0] for o in args.overrides if o.startswith("--head.") or o.startswith("head.")]
    if head_keys or "head" in values:
        raise LmforgeError(f"{', '.join(head_keys) or '[head]'}: the head's options live in the task section, e.g. "
                           "--task.crf=true (or --crf), --task.max_span_width=6, --task.word_pooling=mean")
    values = apply_overrides(values, flags + list(args.overrides))
    run = from_dict(FinetuneRun, values, where=args.config or "finetune")
    for name, flag in (("model", "--model"), ("train_file", "--train"), ("out", "--out")):
        if not getattr(run, name):
            raise LmforgeError(f"no {name.replace('_file', ' file')}: pass {flag}")
    run._max_steps_given = "max_steps" in values.get("train", {})  # type: ignore[attr-defined]
    run._eval_every_given = "eval_every" in values.get("train", {})  # type: ignore[attr-defined]
    run._save_every_given = "save_every" in values.get("train", {})  # type: ignore[attr-defined]
    return run


def _merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in base.items()}
    for key, value in top.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


# ---------------------------------------------------------------------------------------------- the model
def load_encoder(source: str, tokenizer_dir: str = "", seed: int = 0, preset_options: dict[str, Any] | None = None):
    """(backbone, ModelConfig, tokenizer) from a model folder or a preset name (see the module docstring)."""
    import torch

    from lmforge.config import model_config_from_preset
    from lmforge.models.pretrained import build_backbone, load_backbone
    from lmforge.tokenizers import WordPieceTokenizer

    tokenizer = WordPieceTokenizer.from_pretrained(tokenizer_dir) if tokenizer_dir else None
    path = Path(source)
    if path.is_dir() and preset_options:
        raise LmforgeError(f"preset_options ({', '.join(preset_options)}) only apply when --model is a preset name, "
                           f"not a folder ({source})")
    if path.is_dir():
        loaded = load_backbone(path)
        backbone, config = loaded.model, loaded.config
        tokenizer = tokenizer or loaded.tokenizer
        if tokenizer is None:
            raise InputFileError(f"{path}: the model folder has no tokenizer (vocab.txt); pass --tokenizer DIR "
                                 "with the tokenizer the model was trained with")
    elif source in PRESETS:
        if tokenizer is None:
            raise LmforgeError(f"--model {source} builds a new, untrained encoder: pass --tokenizer DIR (e.g. one made "
                               "by `lmforge tokenizer train`)")
        config = model_config_from_preset(source, **{**(preset_options or {}), "vocab_size": tokenizer.vocab_size,
                                                     "pad_token_id": tokenizer.pad_id})
        torch.manual_seed(seed)
        backbone = build_backbone(config)
    else:
        raise LmforgeError(f"--model {source}: not a folder and not a preset name (presets: {', '.join(PRESETS)})")
    if config.arch not in ("encoder", "rnn"):
        raise LmforgeError(f"--model {source} is a {config.arch}; fine-tuning heads need an encoder (BERT-style, "
                           "or the rnn-attn preset for sequence tasks)")
    if tokenizer.vocab_size > config.vocab_size:
        raise LmforgeError(f"the tokenizer has {tokenizer.vocab_size} tokens but the model's embedding only "
                           f"{config.vocab_size}; pass the model's own tokenizer")
    backbone.train()
    return backbone, config, tokenizer


def init_embeddings(backbone, tokenizer, path: str) -> float:
    """Copy the vectors of ``path`` (word2vec text or binary format) into the token embedding rows of the tokens
    they name; returns the fraction of the vocabulary covered (logged)."""
    import torch

    from lmforge.embeddings.io import load_word2vec

    vectors = load_word2vec(path)
    table = backbone.get_input_embeddings().weight
    if vectors.vectors.shape[1] != table.shape[1]:
        raise LmforgeError(f"{path}: vectors of dimension {vectors.vectors.shape[1]} cannot initialise embeddings "
                           f"of width {table.shape[1]}; train vectors with --dim {table.shape[1]}")
    rows, found = [], []
    for token, row in tokenizer.vocab.items():
        i = vectors.index.get(token)
        if i is not None:
            rows.append(row)
            found.append(i)
    if not rows:
        raise LmforgeError(f"{path}: none of its words is a token of the tokenizer; train the vectors on text "
                           "split by the same tokenizer")
    with torch.no_grad():
        table[torch.tensor(rows)] = torch.as_tensor(vectors.vectors[found], dtype=table.dtype)
    coverage = len(rows) / tokenizer.vocab_size
    log.info("init_embeddings: %d of %d tokens (%.1f%%) start from %s", len(rows), tokenizer.vocab_size,
             100 * coverage, path)
    return coverage


def _featurize(task, examples, tokenizer, path: str, *, training: bool):
    try:
        return task.featurize(examples, tokenizer, training=training)
    except LmforgeError as err:
        if str(err).startswith(str(path)):
            raise
        raise LmforgeError(f"{path}: {err}") from None


def build_finetune_trainer(run: FinetuneRun, *, resume: str = "never", overwrite: bool = False,
                           progress: bool = True):
    """Read the data, build TaskModel(encoder, head), freeze, and return (Trainer, task)."""
    import torch

    from lmforge.heads import TaskModel, build_head
    from lmforge.tasks import make_task
    from lmforge.tasks.base import FeatureData, TaskObjective
    from lmforge.training.distributed import init_distributed
    from lmforge.training.freeze import freeze, lr_scales
    from lmforge.training.trainer import Trainer
    from lmforge.utils.io import check_not_input

    check_not_input(run.out, [p for p in (run.model, run.tokenizer, run.train_file, run.dev_file,
                                          run.task.init_embeddings) if p and Path(p).exists()])
    task = make_task(run.task)
    backbone, config, tokenizer = load_encoder(run.model, run.tokenizer, run.train.seed, run.preset_options)
    if run.task.init_embeddings:
        init_embeddings(backbone, tokenizer, run.task.init_embeddings)
    if run.task.max_length > config.max_seq_len:
        raise LmforgeError(f"--max-length {run.task.max_length} exceeds the model's limit of {config.max_seq_len} "
                           "positions; lower it (long texts: --long-text head-tail|chunks, or QA windows)")
    train_examples = task.read(run.train_file, labelled=True)
    task.fit_labels(train_examples)
    train_features = _featurize(task, train_examples, tokenizer, run.train_file, training=True)
    evaluator = None
    if run.dev_file:
        dev_examples = task.read(run.dev_file, labelled=True)
        dev_features = _featurize(task, dev_examples, tokenizer, run.dev_file, training=False)
        batch = run.train.micro_batch_size or run.train.batch_size

        def evaluator(model):
            return task.metrics(dev_examples, task.predict(model, dev_examples, dev_features, tokenizer,
                                                           batch_size=batch))

    info = init_distributed()
    data = FeatureData(train_features, lambda fs: task.collate(fs, tokenizer.pad_id), seed=run.train.seed,
                       rank=info.rank, world_size=info.world_size)
    per_epoch = data.steps_per_epoch(run.train.batch_size)
    changes: dict[str, Any] = {}
    if not run._max_steps_given:  # type: ignore[attr-defined]
        changes["max_steps"] = max(1, math.ceil(run.task.epochs * per_epoch))
    if not run._eval_every_given and evaluator is not None:  # type: ignore[attr-defined]
        changes["eval_every"] = per_epoch
    if not run._save_every_given:  # type: ignore[attr-defined]
        changes["save_every"] = per_epoch
    if changes:
        run.train = from_dict(TrainConfig, {**to_dict(run.train), **changes})
    head_spec = task.head_spec()
    torch.manual_seed(run.train.seed)  # the head's initialisation is part of the run's seed
    model = TaskModel(backbone, build_head(head_spec, config, backbone))
    frozen = freeze(model, run.task.freeze)
    if frozen:
        log.info("--freeze %s: %d of %d parameter tensors frozen", run.task.freeze, len(frozen),
                 len(list(model.parameters())))
    scales = lr_scales(model, lr=run.train.lr, head_lr=run.task.head_lr, layer_decay=run.task.layer_decay)
    log.info("%s: %d training examples -> %d features, %d labels, %d steps (%d per epoch)", run.task.task,
             len(train_examples), len(train_features), len(task.labels), run.train.max_steps, per_epoch)
    trainer = Trainer(model, TaskObjective(task), data, run.train, run.out, model_config=config, head=head_spec,
                      tokenizer=tokenizer, run_config=to_dict(run), resume=resume, overwrite=overwrite,
                      progress=progress, evaluator=evaluator, select=task.metric if evaluator else None,
                      lr_scales=scales)
    return trainer, task


def run_finetune(args: argparse.Namespace) -> int:
    run = resolve_run(args)
    trainer, task = build_finetune_trainer(run, resume=args.resume, overwrite=args.overwrite)
    results = trainer.fit()
    if trainer.dist.is_main:
        print(f"fine-tuned {run.model} for {run.task.task} ({run.train.max_steps} steps) -> {run.out}")
        if trainer.best is not None:
            best = trainer.best["record"]
            shown = ", ".join(f"{k} {v:.4f}" for k, v in best.items() if k != "step" and isinstance(v, float))
            print(f"best {task.metric} at step {trainer.best['step']}: {shown}")
        else:
            print("final: " + ", ".join(f"{k} {v:.4f}" for k, v in results.items() if isinstance(v, float)))
    return 0


# ---------------------------------------------------------------------------------------------- evaluate, predict
def load_task_model(directory: str):
    """(model, task, tokenizer) of a fine-tuned model folder."""
    from lmforge.models.pretrained import load_pretrained
    from lmforge.tasks import task_from_head_spec

    loaded = load_pretrained(directory)
    if not loaded.head or "task" not in loaded.head:
        raise LmforgeError(f"{directory}: not a fine-tuned model (its config.json has no task head); fine-tune it "
                           "first with `lmforge finetune`")
    if loaded.tokenizer is None:
        raise InputFileError(f"{directory}: the model folder has no tokenizer (vocab.txt)")
    return loaded.model, task_from_head_spec(loaded.head), loaded.tokenizer


def add_evaluate_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, metavar="DIR", help="a folder made by `lmforge finetune`")
    p.add_argument("--data", required=True, metavar="FILE", help="labelled data in the task's format")
    p.add_argument("--batch-size", type=Count(1, 65_536), default=32)
    p.add_argument("--output", metavar="FILE.json", help="also write the metrics here")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --output file")


def run_evaluate(args: argparse.Namespace) -> int:
    from lmforge.utils.io import atomic_write_text, prepare_output_file

    if args.output:
        prepare_output_file(args.output, overwrite=args.overwrite, inputs=[args.model, args.data],
                            option="--output")
    model, task, tokenizer = load_task_model(args.model)
    examples = task.read(args.data, labelled=True)
    features = _featurize(task, examples, tokenizer, args.data, training=False)
    metrics = task.metrics(examples, task.predict(model, examples, features, tokenizer, batch_size=args.batch_size))
    text = json.dumps(metrics, indent=2)
    print(text)
    if args.output:
        atomic_write_text(Path(args.output), text + "\n")
    return 0


def add_predict_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, metavar="DIR", help="a folder made by `lmforge finetune`")
    p.add_argument("--input", required=True, metavar="FILE", help="inputs in the task's format (labels optional)")
    p.add_argument("--output", required=True, metavar="FILE.jsonl", help="one JSON prediction per input")
    p.add_argument("--batch-size", type=Count(1, 65_536), default=32)
    p.add_argument("--overwrite", action="store_true", help="replace an existing output file")


def run_predict(args: argparse.Namespace) -> int:
    from lmforge.utils.io import atomic_open, prepare_output_file

    output = prepare_output_file(args.output, overwrite=args.overwrite, inputs=[args.model, args.input],
                                 option="--output")
    model, task, tokenizer = load_task_model(args.model)
    examples = task.read(args.input, labelled=False)
    features = _featurize(task, examples, tokenizer, args.input, training=False)
    predictions = task.predict(model, examples, features, tokenizer, batch_size=args.batch_size)
    with atomic_open(output, "w") as f:
        for example, prediction in zip(examples, predictions, strict=True):
            f.write(json.dumps(task.record(example, prediction), ensure_ascii=False) + "\n")
    print(f"wrote {len(predictions)} predictions to {output}")
    return 0

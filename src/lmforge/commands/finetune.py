"""``lmforge finetune``, ``lmforge evaluate`` and ``lmforge predict``: task heads on a pretrained encoder.

A run is a ``FinetuneRun``: a TOML file (``--config``), then the plain flags, then dotted overrides
(``--task.crf=true``, ``--train.lr=3e-5``). ``--model`` is an lmforge model folder (pretrained or fine-tuned: its
head is dropped), a Hugging Face BERT folder, or a preset name (a randomly initialised encoder, which needs
``--tokenizer``). The run folder ends up holding the best model by the dev metric (``config.json`` with the head,
its labels and the task settings, ``model.safetensors``, the tokenizer), ``eval_results.json`` and the Trainer's
logs and checkpoints (``--resume auto`` continues an interrupted run).

``evaluate`` and ``predict`` take several ``--model`` folders (repeated, or a comma list) for an ensemble of sequence
classifiers, whose class probabilities are averaged (ULMFiT's forward + backward models; ``lmforge.recipes.ensemble``).
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any

from lmforge.choices import LONG_TEXT, PRECISIONS, RUNTIMES, TAG_SCHEMES, TASKS
from lmforge.commands.options import FRACTION, LEARNING_RATE, SEED, Count, Rate
from lmforge.config import (
    load_toml,
)
from lmforge.errors import LmforgeError
from lmforge.recipes.ensemble import Ensemble, model_folders
from lmforge.recipes.finetune import (
    CRF_HEAD_LR,
    DEFAULT_LR_HELP,
    FINETUNE_DEFAULTS,
    FinetuneRun,
    build_finetune_trainer,
    featurize,
    load_task_model,
)
from lmforge.recipes.pretrain import recorded_finetune_defaults
from lmforge.recipes.resolve import merge, model_overrides, resolve, split_model_table
from lmforge.utils.compiling import (
    COMPILE_HELP,
    INFERENCE_COMPILE_HELP,
    INFERENCE_PRECISION_HELP,
    RUNTIME_HELP,
    check_runtime_options,
    compile_errors,
    compile_in_place,
)

log = logging.getLogger("lmforge")


FLAGS = {"task": "task.task", "model": "model", "tokenizer": "tokenizer", "train": "train_file", "dev": "dev_file",
         "out": "out", "epochs": "task.epochs", "batch_size": "train.batch_size", "lr": "train.lr",
         "max_length": "task.max_length", "warmup_ratio": "train.warmup_ratio", "weight_decay": "train.weight_decay",
         "seed": "train.seed", "freeze": "task.freeze", "reinit_layers": "task.reinit_layers",
         "text_column": "task.text_column",
         "text_pair_column": "task.text_pair_column", "label_column": "task.label_column",
         "long_text": "task.long_text", "head_lr": "task.head_lr", "layer_decay": "task.layer_decay",
         "scheme": "task.scheme", "max_steps": "train.max_steps", "compile": "train.compile"}


def add_finetune_arguments(p: argparse.ArgumentParser) -> None:
    p.epilog = ("Any setting can also be given as --section.key=value, e.g. --task.max_span_width=6 "
                "--task.doc_stride=64 --train.micro_batch_size=8, and for a preset --model its sizes: "
                "--model.d_model=128 (TOML: model = { source = \"bert-mini\", d_model = 128 }).")
    p.add_argument("--config", metavar="FILE", help="a TOML recipe with [task] and [train] sections")
    p.add_argument("--task", choices=TASKS, help="sequence, pair, token (tagging), span (span labeling), qa, "
                   "choice (multiple choice)")
    p.add_argument("--model", metavar="DIR|PRESET", help="an lmforge or Hugging Face BERT folder, or a preset name")
    p.add_argument("--tokenizer", metavar="DIR", help="default: the tokenizer in the model folder")
    p.add_argument("--train", metavar="FILE", help="training data (CSV/TSV/JSONL, CoNLL, span JSONL, SQuAD JSON)")
    p.add_argument("--dev", metavar="FILE", help="dev data: evaluated every epoch; the best model is kept")
    p.add_argument("--out", metavar="DIR", help="the run folder")
    p.add_argument("--epochs", type=Rate(0.0, 1e6, low_open=True),
                   help="passes over the training data (default 3; a pretrained Transformer on a small training set "
                        "gets enough for 600 updates, at most 20, when --batch-size and --max-steps are not given "
                        "either)")
    p.add_argument("--batch-size", type=Count(1, 65_536),
                   help="examples per optimizer step (default 32; 16 for a pretrained Transformer on a small training "
                        "set, see --epochs)")
    p.add_argument("--lr", type=LEARNING_RATE, help=f"the learning rate; {DEFAULT_LR_HELP}")
    p.add_argument("--max-length", type=Count(8, 1_000_000), help="tokens per input, with [CLS]/[SEP] (default 128)")
    p.add_argument("--warmup-ratio", type=FRACTION, help="share of the steps with a linear learning-rate warm-up "
                   "(default 0.1)")
    p.add_argument("--weight-decay", type=Rate(0.0), help="AdamW's decoupled weight decay (default 0.01)")
    p.add_argument("--seed", type=SEED)
    p.add_argument("--max-steps", type=Count(1, 2**31 - 1), help="default: epochs x batches per epoch")
    p.add_argument("--compile", action="store_true", default=None, help=COMPILE_HELP)
    p.add_argument("--crf", action="store_true", default=None, help="token task: a linear-chain CRF on the tags")
    p.add_argument("--freeze", metavar="MODE", help="none | all | embeddings | all-but-last:K")
    p.add_argument("--reinit-layers", type=Count(0, 1 << 10), metavar="K",
                   help="re-initialise the top K layers and the pooler of the pretrained backbone before fine-tuning "
                   "(Zhang et al. 2021: helps few-sample fine-tuning; default 0)")
    p.add_argument("--head-lr", type=LEARNING_RATE, help="the head's own learning rate (default: --lr; for a CRF "
                   f"tagger on a pretrained Transformer at least {CRF_HEAD_LR:g}, as its head starts from nothing)")
    p.add_argument("--layer-decay", type=Rate(0.0, 1.0, low_open=True),
                   help="layer-wise learning-rate decay factor (e.g. 0.9)")
    p.add_argument("--long-text", choices=LONG_TEXT, help="sequence task, texts over --max-length: keep the first "
                   "tokens, the head and tail, or every window (chunks) (default truncate)")
    p.add_argument("--scheme", choices=("auto", *TAG_SCHEMES), help="token task: the tag scheme")
    p.add_argument("--text-column", help="default: text")
    p.add_argument("--text-pair-column", help="default: text_pair")
    p.add_argument("--label-column", help="default: label")
    p.add_argument("--resume", default="never", metavar="auto|never|PATH")
    p.add_argument("--overwrite", action="store_true", help="start afresh; the old run folder is renamed")
    p.set_defaults(overrides=[])


def resolve_run(args: argparse.Namespace) -> FinetuneRun:
    flags = {key: getattr(args, name, None) for name, key in FLAGS.items()}
    if getattr(args, "crf", None):
        flags["task.crf"] = True
    head_keys = [o.split("=", 1)[0] for o in args.overrides if o.startswith("--head.") or o.startswith("head.")]
    if head_keys or (args.config and "head" in load_toml(args.config)):
        raise LmforgeError(f"{', '.join(head_keys) or '[head]'}: the head's options live in the task section, e.g. "
                           "--task.crf=true (or --crf), --task.max_span_width=6, --task.word_pooling=mean")

    def build(defaults: dict) -> FinetuneRun:
        return resolve(FinetuneRun, defaults=defaults, config=args.config, flags=flags,
                       overrides=model_overrides(args.overrides), where="finetune", normalize=split_model_table)

    run = build(FINETUNE_DEFAULTS)
    recorded = recorded_finetune_defaults(run.model) if run.model else {}
    if recorded:  # the model's pretraining recipe says how to fine-tune it: its settings become the defaults
        run = build(merge(FINETUNE_DEFAULTS, {k: v for k, v in recorded.items() if k in ("train", "task")}))
        shown = ", ".join(f"{table}.{k}={v}" for table in ("train", "task") for k, v in recorded.get(table, {}).items())
        log.info("fine-tuning defaults recorded by the pretraining recipe of %s: %s (options and --config override "
                 "them)", run.model, shown)
        train, task = recorded.get("train", {}), recorded.get("task", {})
        args.recorded_lr = "lr" in train
        args.recorded_length = "max_length" in task
        args.recorded_schedule = "epochs" in task or "batch_size" in train or "max_steps" in train
    for name, flag in (("model", "--model"), ("train_file", "--train"), ("out", "--out")):
        if not getattr(run, name):
            raise LmforgeError(f"no {name.replace('_file', ' file')}: pass {flag}")
    return run


def _given(args: argparse.Namespace, flags: tuple[str, ...], keys: tuple[str, ...], recorded: str) -> bool:
    """Whether the user set one of ``keys`` ("table.key") by a plain flag (``flags``: args attributes), a
    ``--table.key=`` override or ``--config``'s tables, or the pretraining recipe of --model recorded it
    (``recorded``: the args attribute ``resolve_run`` set)."""
    if any(getattr(args, flag, None) is not None for flag in flags) or getattr(args, recorded, False):
        return True
    if any(o.lstrip("-").split("=", 1)[0] in keys for o in args.overrides):
        return True
    recipe = load_toml(args.config) if args.config else {}
    return any(key in (recipe.get(table) or {}) for table, key in (k.split(".", 1) for k in keys))


def lr_given(args: argparse.Namespace) -> bool:
    """Whether the learning rate was given; otherwise the recipe picks it by backbone."""
    return _given(args, ("lr",), ("train.lr",), "recorded_lr")


def length_given(args: argparse.Namespace) -> bool:
    """Whether ``max_length`` was given; otherwise a default longer than the model's positions is cut to them."""
    return _given(args, ("max_length",), ("task.max_length",), "recorded_length")


def schedule_given(args: argparse.Namespace) -> bool:
    """Whether the epochs, the batch size or the steps were given; otherwise a small training set gets enough
    updates."""
    return _given(args, ("epochs", "batch_size", "max_steps"), ("task.epochs", "train.batch_size", "train.max_steps"),
                  "recorded_schedule")


def run_finetune(args: argparse.Namespace) -> int:
    run = resolve_run(args)
    trainer, task = build_finetune_trainer(run, resume=args.resume, overwrite=args.overwrite,
                                           progress=_progress("train") is not None, choose_lr=not lr_given(args),
                                           fit_length=not length_given(args),
                                           choose_schedule=not schedule_given(args))
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


ENSEMBLE_HELP = ("a folder made by `lmforge finetune`; several (repeat --model, or A,B) average the class "
                 "probabilities of sequence classifiers (e.g. ULMFiT's forward and backward models)")


def add_evaluate_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, action="append", metavar="DIR", help=ENSEMBLE_HELP)
    p.add_argument("--test", dest="data", required=True, metavar="FILE",
                   help="labelled data in the task's format; a gold label the model cannot produce (never in its "
                        "training data) is scored as a miss, with a warning")
    p.add_argument("--batch-size", type=Count(1, 65_536), default=32, help="inputs per forward pass (default 32)")
    _add_input_arguments(p, labels=True)
    p.add_argument("--compile", action="store_true", help=INFERENCE_COMPILE_HELP)
    p.add_argument("--precision", choices=PRECISIONS, default="fp32", help=INFERENCE_PRECISION_HELP)
    p.add_argument("--runtime", choices=RUNTIMES, default="torch", help=RUNTIME_HELP)
    p.add_argument("--out", dest="output", metavar="FILE.json",
                   help="also write the metrics here, and beside them, for classification, tagging and span labeling, "
                        "the per-class report (FILE.per_class.json and .md: "
                        "precision, recall, F1, support) and the confusion matrix (FILE.confusion.png)")
    p.add_argument("--overwrite", action="store_true", help="replace existing output files")


def _add_input_arguments(p: argparse.ArgumentParser, *, labels: bool) -> None:
    """The options that say how to read a file whose layout differs from the training file's."""
    p.add_argument("--text-column", help="the column of the text (default: the one the model was trained on)")
    p.add_argument("--text-pair-column", help="pair models: the column of the second text (default: the training "
                                              "file's)")
    if labels:
        p.add_argument("--label-column", help="the column of the gold label (default: the training file's)")
    p.add_argument("--max-length", type=Count(8, 1_000_000),
                   help="tokens per input, with [CLS]/[SEP], up to the model's positions (default: the length the "
                        "model was fine-tuned with)")


def with_input_options(task: Any, args: argparse.Namespace, model_positions: int, folder: str) -> Any:
    """``task`` reading its input as ``--text-column`` / ``--text-pair-column`` / ``--label-column`` and
    ``--max-length`` say (each left as fine-tuned when not given)."""
    from dataclasses import replace

    from lmforge.tasks.base import COMMON_OPTIONS

    names = ("text_column", "text_pair_column", "label_column", "max_length")
    changes = {name: getattr(args, name) for name in names if getattr(args, name, None) is not None}
    unknown = [k for k in changes if k not in (*COMMON_OPTIONS, *task.options)]
    if unknown:
        flags = ", ".join("--" + k.replace("_", "-") for k in unknown)
        raise LmforgeError(f"{flags}: {folder} is a {task.config.task!r} model, whose input has no such column; "
                           "leave the option out")
    if changes.get("max_length", 0) > model_positions:
        raise LmforgeError(f"--max-length {changes['max_length']} exceeds the {model_positions} positions of the "
                           f"model in {folder}; give at most {model_positions}")
    if changes:
        task.config = replace(task.config, **changes)
    return task


def _member_input_options(ensemble: Ensemble, args: argparse.Namespace) -> None:
    for folder, (model, task, _) in zip(ensemble.folders, ensemble.members, strict=True):
        with_input_options(task, args, model.backbone.config.max_seq_len, folder)


def _compile_members(ensemble: Ensemble, args: argparse.Namespace) -> None:
    """``--precision`` and ``--compile``: every member model of an ensemble set up as ``prepare_inference`` does."""
    for model, *_ in ensemble.members:
        prepare_inference(model, args)


def prepare_inference(model: Any, args: argparse.Namespace) -> None:
    """``--precision`` (bf16 autocast, outputs in fp32) then ``--compile`` (compiled in place) on ``model``."""
    if getattr(args, "precision", "fp32") != "fp32":
        from lmforge.training.precision import autocast_inference

        choice = autocast_inference(model, args.precision)
        log.info("inference precision %s (%s)", choice.precision, choice.reason)
    if args.compile:
        compile_in_place(model)


def _progress(label: str) -> str | None:
    """``label`` for a progress bar, or None (no bar) under -q, as the logger's level says."""
    return label if log.isEnabledFor(logging.INFO) else None


def report_paths(output: str | Path) -> dict[str, Path]:
    """The files ``evaluate --out FILE.json`` writes beside FILE.json: the per-class report (JSON, Markdown) and
    the confusion-matrix PNG."""
    output = Path(output)
    stem = output.with_suffix("") if output.suffix == ".json" else output
    return {kind: stem.with_name(f"{stem.name}.{suffix}") for kind, suffix in
            (("json", "per_class.json"), ("markdown", "per_class.md"), ("png", "confusion.png"))}


def run_evaluate(args: argparse.Namespace) -> int:
    from lmforge.utils.io import atomic_write_text, prepare_output_file

    folders = model_folders(args.model)
    check_runtime_options(args)
    reports: dict[str, Path] = {}
    if args.output:
        prepare_output_file(args.output, overwrite=args.overwrite, inputs=[*folders, args.data],
                            option="--out")
        reports = report_paths(args.output)
        for path in reports.values():
            prepare_output_file(path, overwrite=args.overwrite, inputs=[*folders, args.data], option="--out")
    show = _progress("evaluate")
    if len(folders) > 1:
        ensemble = Ensemble(folders, args.runtime)
        _member_input_options(ensemble, args)
        _compile_members(ensemble, args)
        task, examples = ensemble.task, ensemble.read(args.data, labelled=True)
        task.warn_unknown_labels(examples, args.data)
        with compile_errors(args.compile):
            predictions = ensemble.predict(examples, args.data, batch_size=args.batch_size, progress=show)
    else:
        model, task, tokenizer = load_task_model(folders[0], args.runtime)
        task = with_input_options(task, args, model.backbone.config.max_seq_len, folders[0])
        prepare_inference(model, args)
        examples = task.read(args.data, labelled=True)
        features = featurize(task, examples, tokenizer, args.data, training=False)
        task.warn_unknown_labels(examples, args.data)
        with compile_errors(args.compile):
            predictions = task.predict(model, examples, features, tokenizer, batch_size=args.batch_size,
                                       progress=show)
    metrics = task.metrics(examples, predictions)
    text = json.dumps(metrics, indent=2)
    print(text)
    if args.output:
        atomic_write_text(Path(args.output), text + "\n")
    report = task.report(examples, predictions)
    if report is not None:
        _write_report(report, metrics, reports, title=f"{Path(folders[0]).name} on {Path(args.data).name}")
    return 0


def _write_report(report: dict, metrics: dict, paths: dict[str, Path], *, title: str) -> None:
    """Write the per-class report and the confusion matrix to ``paths`` (``report_paths``), and say where; without
    paths (no --out) log the Markdown table and how to keep it."""
    from lmforge.metrics import format_report
    from lmforge.utils.io import atomic_write_text

    report = {**report, "metrics": metrics}
    text = format_report(report, title=f"Per-{report['unit']} report: {title}", unit=report["unit"])
    if not paths:
        log.info("per-%s scores (pass --out FILE.json to also write them and a confusion-matrix PNG):\n%s",
                 report["unit"], text.rstrip())
        return
    atomic_write_text(paths["json"], json.dumps(report, indent=2) + "\n")
    atomic_write_text(paths["markdown"], text)
    written = [str(paths["json"]), str(paths["markdown"])]
    confusion = report.get("confusion")
    if confusion:
        from lmforge.viz.confusion import plot_confusion

        plot_confusion(confusion["labels"], confusion["matrix"], paths["png"], title=title,
                       rows=confusion.get("rows", "gold"), columns=confusion.get("columns", "predicted"))
        written.append(str(paths["png"]))
    log.info("per-%s report: %s", report["unit"], ", ".join(written))


def add_predict_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, action="append", metavar="DIR", help=ENSEMBLE_HELP)
    p.add_argument("--input", required=True, metavar="FILE", help="inputs in the task's format (labels optional: "
                   "any present are ignored, even ones the model never saw)")
    p.add_argument("--out", dest="output", required=True, metavar="FILE.jsonl",
                   help="one JSON prediction per input; a .csv or .tsv name writes a table (nested values as JSON)")
    p.add_argument("--batch-size", type=Count(1, 65_536), default=32, help="inputs per forward pass (default 32)")
    _add_input_arguments(p, labels=False)
    p.add_argument("--compile", action="store_true", help=INFERENCE_COMPILE_HELP)
    p.add_argument("--precision", choices=PRECISIONS, default="fp32", help=INFERENCE_PRECISION_HELP)
    p.add_argument("--runtime", choices=RUNTIMES, default="torch", help=RUNTIME_HELP)
    p.add_argument("--overwrite", action="store_true", help="replace an existing output file")


def run_predict(args: argparse.Namespace) -> int:
    from lmforge.utils.io import prepare_output_file

    folders = model_folders(args.model)
    check_runtime_options(args)
    output = prepare_output_file(args.output, overwrite=args.overwrite, inputs=[*folders, args.input],
                                 option="--out")
    show = _progress("predict")
    if len(folders) > 1:
        ensemble = Ensemble(folders, args.runtime)
        _member_input_options(ensemble, args)
        _compile_members(ensemble, args)
        task, examples = ensemble.task, ensemble.read(args.input, labelled=False)
        with compile_errors(args.compile):
            predictions = ensemble.predict(examples, args.input, batch_size=args.batch_size, progress=show)
    else:
        model, task, tokenizer = load_task_model(folders[0], args.runtime)
        task = with_input_options(task, args, model.backbone.config.max_seq_len, folders[0])
        prepare_inference(model, args)
        examples = task.read(args.input, labelled=False)
        features = featurize(task, examples, tokenizer, args.input, training=False)
        with compile_errors(args.compile):
            predictions = task.predict(model, examples, features, tokenizer, batch_size=args.batch_size,
                                       progress=show)
    records = [task.record(example, prediction) for example, prediction in zip(examples, predictions, strict=True)]
    write_records(output, records)
    print(f"wrote {len(predictions)} predictions to {output}")
    return 0


def write_records(path, records: list[dict]) -> None:
    """Predictions as JSON lines, or as a table when the file is named ``.csv`` / ``.tsv``: one column per key (in
    the order they first appear), nested values (probabilities, entity lists) as JSON in their cell."""
    import csv

    from lmforge.utils.io import atomic_open

    suffix = str(path).lower().rsplit(".", 1)[-1]
    with atomic_open(path, "w") as f:
        if suffix not in ("csv", "tsv"):
            for record in records:
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
            return
        columns = list(dict.fromkeys(key for record in records for key in record))
        writer = csv.writer(f, delimiter="," if suffix == "csv" else "\t", lineterminator="\n")
        writer.writerow(columns)
        for record in records:
            writer.writerow(["" if record.get(c) is None else json.dumps(record[c], ensure_ascii=False)
                             if isinstance(record[c], dict | list) else record[c] for c in columns])

"""``lmforge distill``: a small student encoder learns from a frozen teacher (DistilBERT's triple loss; MiniLM's
attention and value relations when the teacher has no MLM head). See ``lmforge.recipes.distill``."""

from __future__ import annotations

import argparse

from lmforge.choices import MASKINGS, PRECISIONS
from lmforge.commands.options import BUDGET_HELP, LEARNING_RATE, SEED, Count, budget
from lmforge.commands.pretrain import RESUME_HELP, SAVE_EVERY_HELP
from lmforge.errors import LmforgeError
from lmforge.recipes.distill import FROM_TEACHER, DistillRun, build_trainer
from lmforge.recipes.resolve import resolve
from lmforge.utils.compiling import COMPILE_HELP

FLAGS = {"teacher": "teacher", "student": "student", "data": "data.path", "out": "out",
         "temperature": "temperature", "alpha_ce": "alpha_ce", "alpha_mlm": "alpha_mlm", "alpha_cos": "alpha_cos",
         "alpha_att": "alpha_att", "alpha_val": "alpha_val", "alpha_rel": "alpha_rel",
         "relation_heads": "relation_heads", "teacher_layer": "teacher_layer", "max_steps": "train.max_steps",
         "budget": "train.budget",
         "batch_size": "train.batch_size", "micro_batch_size": "train.micro_batch_size", "seq_len": "data.seq_len",
         "lr": "train.lr", "precision": "train.precision", "compile": "train.compile", "save_every": "train.save_every",
         "eval_every": "train.eval_every", "seed": "train.seed", "masking": "data.masking"}


def _weight(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text} must be a finite number >= 0 (0 turns the term off)")
    return value


def _layers(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} must be comma-separated layer indices, e.g. 0,2,4") from None


def add_distill_arguments(p: argparse.ArgumentParser) -> None:
    p.epilog = ("Any setting can also be given as --section.key=value, e.g. --train.warmup_ratio=0.05 "
                "--data.mask_prob=0.15. The corpus must be prepared with the teacher's tokenizer: "
                "lmforge data prepare --tokenizer TEACHER --input TEXT --out SHARDS.")
    p.add_argument("--config", metavar="FILE", help="a TOML recipe with the keys of DistillRun")
    p.add_argument("--teacher", metavar="DIR", help="the teacher: an encoder folder (lmforge, or Hugging Face "
                   "BERT / ALBERT / DistilBERT), with or without its MLM head")
    p.add_argument("--student", metavar="PRESET|DIR", help=f"{FROM_TEACHER} (default): DistilBERT's student, one "
                   "teacher layer in two, no segment embedding, no pooler; or a preset (random init) or a model folder")
    p.add_argument("--student-layers", type=_layers, metavar="I,J,...",
                   help=f"with --student {FROM_TEACHER}: the teacher layers to keep (default 0,2,4,...)")
    p.add_argument("--input", dest="data", metavar="DIR",
                   help="a folder made by `lmforge data prepare` with the teacher's tokenizer")
    p.add_argument("--out", metavar="DIR", help="the run folder (the student is saved there)")
    p.add_argument("--temperature", type=_weight, metavar="T", help="soft-target temperature (default 2)")
    p.add_argument("--alpha-ce", type=_weight, metavar="W",
                   help="soft targets of the teacher's MLM (default 5 with an MLM head, else 0)")
    p.add_argument("--alpha-mlm", type=_weight, metavar="W",
                   help="the student's own MLM loss (default 2 with a teacher MLM head, else 0)")
    p.add_argument("--alpha-cos", type=_weight, metavar="W", help="cosine of the last hidden states (default 1)")
    p.add_argument("--alpha-att", type=_weight, metavar="W",
                   help="MiniLM's last-layer attention KL (default 1 without a teacher MLM head, else 0)")
    p.add_argument("--alpha-val", type=_weight, metavar="W",
                   help="MiniLM's value-relation KL (default 1 without a teacher MLM head, else 0)")
    p.add_argument("--alpha-rel", type=_weight, metavar="W",
                   help="MiniLMv2's query/key/value relation KLs (default 1 when the student has another head count "
                        "than a teacher without an MLM head, else 0)")
    p.add_argument("--relation-heads", type=Count(1, 4096), metavar="N",
                   help="MiniLMv2's relation heads (default: the teacher's heads); must divide both widths")
    p.add_argument("--teacher-layer", type=Count(0, 4095), metavar="I",
                   help="the teacher layer MiniLMv2's relations are read from, 0 the first (default: the last)")
    p.add_argument("--max-steps", type=Count(1, 2**31 - 1), help="optimizer steps (default 1000; with --budget: none, "
                   "an optional cap)")
    p.add_argument("--budget", type=budget, metavar="TIME|TOKENS", help=BUDGET_HELP)
    p.add_argument("--batch-size", type=Count(1, 1 << 20), help="sequences per optimizer step")
    p.add_argument("--micro-batch-size", type=Count(1, 1 << 20), help="sequences per forward pass")
    p.add_argument("--seq-len", type=Count(8, 1_000_000), help="tokens per packed example (default 128)")
    p.add_argument("--masking", choices=MASKINGS, help="masking strategy when a MLM term is on (default token)")
    p.add_argument("--lr", type=LEARNING_RATE)
    p.add_argument("--precision", choices=PRECISIONS,
                   help="fp32 (default); bf16 autocast; auto: bf16 only where this device runs it natively and a "
                        "measurement at the model's width shows it faster, else fp32 (decided once, kept on resume)")
    p.add_argument("--compile", action="store_true", default=None, help=COMPILE_HELP)
    p.add_argument("--save-every", type=Count(0), metavar="N", help=SAVE_EVERY_HELP)
    p.add_argument("--eval-every", type=Count(0), help="evaluate every N steps (0: only at the end)")
    p.add_argument("--seed", type=SEED)
    p.add_argument("--resume", default="never", metavar="auto|never|PATH", help=RESUME_HELP)
    p.add_argument("--overwrite", action="store_true", help="start afresh; the old run folder is renamed, not deleted")
    p.set_defaults(overrides=[])


def resolve_run(args: argparse.Namespace) -> DistillRun:
    flags = {key: getattr(args, name) for name, key in FLAGS.items()}
    flags["student_layers"] = args.student_layers
    run = resolve(DistillRun, config=args.config, flags=flags, overrides=args.overrides, where="distill")
    for value, flag in ((run.teacher, "--teacher DIR"), (run.data.path, "--input DIR"), (run.out, "--out DIR")):
        if not value:
            raise LmforgeError(f"distill needs {flag}")
    return run


def run_distill(args: argparse.Namespace) -> int:
    run = resolve_run(args)
    trainer = build_trainer(run, resume=args.resume, overwrite=args.overwrite)
    results = trainer.fit()
    if trainer.dist.is_main:
        shown = {k: round(v, 4) for k, v in results.items() if isinstance(v, float)}
        print(f"distilled {run.teacher} into a {trainer.model_config.n_layers}-layer student for "
              f"{trainer.step} steps -> {run.out}")
        print("final: " + ", ".join(f"{k} {v}" for k, v in shown.items()))
    return 0

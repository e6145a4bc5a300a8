"""``lmforge pretrain``: BERT (MLM + NSP), RoBERTa (MLM), SpanBERT (MLM + SBO) and GPT (causal LM) pretraining.

The run is described by a ``PretrainRun``: a TOML file (``--config``), then the plain flags, then dotted
overrides (``--train.lr=3e-4``), in that order of precedence. Distributed runs need nothing more than
``torchrun --nproc-per-node N -m lmforge pretrain ...`` (see ``lmforge.training.distributed``).
"""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lmforge.commands.options import LEARNING_RATE, SEED, Count
from lmforge.config import (
    OBJECTIVES,
    PRECISIONS,
    DataConfig,
    TrainConfig,
    apply_overrides,
    from_dict,
    load_toml,
    to_dict,
    toml_literal,
)
from lmforge.errors import LmforgeError

log = logging.getLogger("lmforge")

# objective -> the head that goes with it (None: the decoder's own LM head)
HEADS: dict[str, dict[str, Any] | None] = {"mlm+nsp": {"type": "pretraining"}, "mlm": {"type": "mlm"},
                                           "span": {"type": "span"}, "clm": None}


@dataclass
class PretrainRun:
    """Everything one pretraining run needs. ``model`` holds overrides of the preset's ModelConfig."""

    preset: str = "bert-mini"
    out: str = ""
    tokenizer: str = ""
    model: dict[str, Any] = field(default_factory=dict)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)


# plain flag -> dotted key in PretrainRun
FLAGS = {"preset": "preset", "objective": "data.objective", "data": "data.path", "tokenizer": "tokenizer",
         "out": "out", "max_steps": "train.max_steps", "batch_size": "train.batch_size",
         "micro_batch_size": "train.micro_batch_size", "seq_len": "data.seq_len", "lr": "train.lr",
         "precision": "train.precision", "save_every": "train.save_every", "eval_every": "train.eval_every",
         "seed": "train.seed", "masking": "data.masking"}


def add_pretrain_arguments(p: argparse.ArgumentParser) -> None:
    p.epilog = ("Any setting can also be given as --section.key=value, e.g. --train.warmup_ratio=0.1 "
                "--model.dropout=0.0 --data.mask_prob=0.2 (TOML values; strings may be bare).")
    p.add_argument("--config", metavar="FILE", help="a TOML recipe (configs/*.toml)")
    p.add_argument("--preset", help="model size: bert-tiny ... bert-large, gpt-nano ... gpt2-small")
    p.add_argument("--objective", choices=OBJECTIVES, help="mlm+nsp (BERT), mlm (RoBERTa), span (SpanBERT), clm (GPT)")
    p.add_argument("--data", metavar="DIR", help="a folder made by `lmforge data prepare`")
    p.add_argument("--tokenizer", metavar="DIR", help="default: the tokenizer saved in the data folder")
    p.add_argument("--out", metavar="DIR", help="the run folder")
    p.add_argument("--max-steps", type=Count(1, 2**31 - 1))
    p.add_argument("--batch-size", type=Count(1, 1 << 20), help="sequences per optimizer step (all processes together)")
    p.add_argument("--micro-batch-size", type=Count(1, 1 << 20),
                   help="sequences per forward pass (gradient accumulation)")
    p.add_argument("--seq-len", type=Count(8, 1_000_000))
    p.add_argument("--masking", choices=("token", "whole_word", "span"))
    p.add_argument("--lr", type=LEARNING_RATE)
    p.add_argument("--precision", choices=PRECISIONS)
    p.add_argument("--save-every", type=Count(0))
    p.add_argument("--eval-every", type=Count(0))
    p.add_argument("--seed", type=SEED)
    p.add_argument("--resume", default="never", metavar="auto|never|PATH",
                   help="auto: continue from the latest checkpoint in --out")
    p.add_argument("--overwrite", action="store_true", help="start afresh; the old run folder is renamed, not deleted")
    p.set_defaults(overrides=[])  # filled by the CLI with every --section.key=value argument


def resolve_run(args: argparse.Namespace) -> PretrainRun:
    values: dict[str, Any] = load_toml(args.config) if args.config else {}
    flags = [f"{key}={toml_literal(getattr(args, name))}" for name, key in FLAGS.items()
             if getattr(args, name) is not None]
    values = apply_overrides(values, flags + list(args.overrides))
    run = from_dict(PretrainRun, values, where=args.config or "pretrain")
    if not run.data.path:
        raise LmforgeError("no data: pass --data DIR (a folder made by `lmforge data prepare`) or set data.path")
    if not run.out:
        raise LmforgeError("no output folder: pass --out DIR or set out in the config")
    return run


def build_pretraining_model(run: PretrainRun, vocab_size: int):
    """The model for a run: TaskModel(Encoder, head) for the MLM objectives, Decoder for clm."""
    import torch

    from lmforge.config import model_config_from_preset
    from lmforge.heads import TaskModel, build_head
    from lmforge.models.pretrained import build_backbone

    config = model_config_from_preset(run.preset, **{**run.model, "vocab_size": vocab_size})
    wants = "decoder" if run.data.objective == "clm" else "encoder"
    if config.arch != wants:
        raise LmforgeError(f"objective {run.data.objective!r} trains a{'' if wants == 'encoder' else ''} {wants}, but "
                           f"preset {run.preset!r} is a {config.arch}; use a "
                           f"{'gpt-*' if wants == 'decoder' else 'bert-*'} preset")
    if run.data.seq_len > config.max_seq_len:
        raise LmforgeError(f"data.seq_len={run.data.seq_len} exceeds the model's max_seq_len={config.max_seq_len}; "
                           "lower --seq-len or raise --model.max_seq_len")
    torch.manual_seed(run.train.seed)  # a reproducible initialisation
    backbone = build_backbone(config)  # after checking that it fits in memory
    head = HEADS[run.data.objective]
    if head is None:
        return backbone, config, None
    if head["type"] == "span":
        head = {**head, "max_span_len": run.data.max_span_len}
    return TaskModel(backbone, build_head(head, config, backbone)), config, head


def build_trainer(run: PretrainRun, *, resume: str = "never", overwrite: bool = False, progress: bool = True):
    """Everything of a pretraining run up to the Trainer: tokenizer, data, model, objective."""
    from lmforge.data.pretraining import PretrainingData
    from lmforge.data.shards import ShardedCorpus
    from lmforge.objectives import CausalLMObjective, mlm_objective_for
    from lmforge.tokenizers import WordPieceTokenizer
    from lmforge.training.distributed import init_distributed
    from lmforge.training.trainer import Trainer
    from lmforge.utils.io import check_not_input

    tokenizer_dir = Path(run.tokenizer) if run.tokenizer else Path(run.data.path) / "tokenizer"
    check_not_input(run.out, [run.data.path, run.tokenizer])
    tokenizer = WordPieceTokenizer.from_pretrained(tokenizer_dir)
    corpus = ShardedCorpus(run.data.path, tokenizer)
    info = init_distributed()

    def data(split: str) -> PretrainingData:
        return PretrainingData(corpus, run.data, tokenizer, split=split, seed=run.train.seed, rank=info.rank,
                               world_size=info.world_size)

    try:
        train = data("train")
    except LmforgeError as err:
        if run.data.objective != "mlm+nsp" or "NSP needs" not in str(err):
            raise
        log.warning("%s; falling back to objective 'mlm' (no next-sentence prediction)", err)
        run.data = from_dict(DataConfig, {**to_dict(run.data), "objective": "mlm"})
        train = data("train")
    evaluation = data("eval") if run.data.eval_fraction > 0 else None
    model, config, head = build_pretraining_model(run, tokenizer.vocab_size)
    objective = CausalLMObjective() if run.data.objective == "clm" else mlm_objective_for(run.data.objective)
    return Trainer(model, objective, train, run.train, run.out, eval_data=evaluation, model_config=config,
                   head=head, tokenizer=tokenizer, run_config=to_dict(run), resume=resume, overwrite=overwrite,
                   progress=progress)


def run_pretrain(args: argparse.Namespace) -> int:
    run = resolve_run(args)
    trainer = build_trainer(run, resume=args.resume, overwrite=args.overwrite)
    results = trainer.fit()
    if trainer.dist.is_main:
        shown = {k: round(v, 4) for k, v in results.items() if isinstance(v, float)}
        print(f"pretrained {run.preset} ({run.data.objective}) for {run.train.max_steps} steps -> {run.out}")
        print("final: " + ", ".join(f"{k} {v}" for k, v in shown.items()))
    return 0

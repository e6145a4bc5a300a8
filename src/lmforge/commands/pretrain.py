"""``lmforge pretrain``: BERT (MLM + NSP), RoBERTa (MLM), SpanBERT (MLM + SBO), GPT (causal LM), XLNet (permutation
LM) and the other objectives of ``lmforge.objectives.registry``.

The run is described by a ``PretrainRun``: a TOML file (``--config``), then the plain flags, then dotted
overrides (``--train.lr=3e-4``), in that order of precedence. Distributed runs need nothing more than
``torchrun --nproc-per-node N -m lmforge pretrain ...`` (see ``lmforge.training.distributed``).
"""

from __future__ import annotations

import argparse
import logging

from lmforge.choices import MASKINGS, PRECISIONS
from lmforge.commands.options import BUDGET_HELP, LEARNING_RATE, SEED, Count, Rate, budget
from lmforge.config import DEFAULT_SAVE_EVERY, DEFAULT_SAVE_MINUTES
from lmforge.errors import LmforgeError
from lmforge.objectives.registry import OBJECTIVES
from lmforge.recipes.pretrain import PretrainRun, build_trainer, plateau_warning
from lmforge.recipes.resolve import resolve
from lmforge.utils.compiling import COMPILE_HELP

log = logging.getLogger("lmforge")

# the checkpoint options of every training command (lmforge.training.trainer, "Checkpoints")
SAVE_EVERY_HELP = (f"keep a checkpoint every N steps (default: every {DEFAULT_SAVE_EVERY} steps or "
                   f"{DEFAULT_SAVE_MINUTES:g} minutes, whichever comes first, skipped while writing would take over "
                   "1/20 of the training time; 0: none by steps). A checkpoint is also written at the end and on "
                   "SIGTERM / Ctrl-C, which then exit with status 143 / 130")
SAVE_MINUTES_HELP = (f"keep a checkpoint every M minutes of training (default {DEFAULT_SAVE_MINUTES:g}; 0: none by "
                     "time)")
RESUME_HELP = ("auto: continue from the newest complete checkpoint in --out, the recovery after a crash, kill -9 "
               "or SIGTERM (a fresh start when there is none); never (default): start a new run; PATH: continue "
               "from that checkpoint or run folder")


# plain flag -> dotted key in PretrainRun
FLAGS = {"preset": "preset", "objective": "data.objective", "data": "data.path", "tokenizer": "tokenizer",
         "out": "out", "max_steps": "train.max_steps", "budget": "train.budget", "batch_size": "train.batch_size",
         "micro_batch_size": "train.micro_batch_size", "seq_len": "data.seq_len", "lr": "train.lr",
         "precision": "train.precision", "compile": "train.compile", "save_every": "train.save_every",
         "save_minutes": "train.save_minutes", "eval_every": "train.eval_every",
         "seed": "train.seed", "masking": "data.masking", "init_from": "init_from", "layer_decay": "layer_decay",
         "dropout_off": "dropout_off"}


def add_pretrain_arguments(p: argparse.ArgumentParser) -> None:
    p.epilog = ("Any setting can also be given as --section.key=value, e.g. --train.warmup_ratio=0.1 "
                "--model.dropout=0.0 --data.mask_prob=0.2 (TOML values; strings may be bare). Objective plm "
                "(XLNet): --data.partial_k (6: about 1/K of the tokens are predicted), --data.plm_max_span (5 words), "
                "--data.num_predict (prediction rows per sequence; default ceil(seq_len / partial_k)). An "
                "objective's own loss options: --loss.rtd_weight (electra, 50), --loss.ar_alpha / --loss.tar_beta "
                "(awd_lm, 0), --loss.eval_mem_len (txl: the memory kept while evaluating).")
    p.add_argument("--config", metavar="FILE", help="a TOML recipe (configs/*.toml)")
    p.add_argument("--preset", help="model size: bert-tiny ... bert-large, albert-mini ... albert-xxlarge (objective "
                   "mlm+sop), distilbert-base, gpt-nano ... gpt2-small, elmo-small, elmo-original, awd-lstm(-small), "
                   "xlnet-tiny ... xlnet-large (objective plm), transformer-xl-tiny/base (objective txl), "
                   "electra-tiny/small/base (objective electra), bart-tiny/base (objective denoise)")
    p.add_argument("--objective", choices=list(OBJECTIVES),
                   help="; ".join(f"{name}: {o.description}" for name, o in OBJECTIVES.items()))
    p.add_argument("--input", dest="data", metavar="DIR", help="a folder made by `lmforge data prepare`")
    p.add_argument("--tokenizer", metavar="DIR", help="default: the tokenizer saved in the data folder")
    p.add_argument("--init-from", metavar="RUN", help="start from the weights (and model config) of a finished "
                   "pretraining run: LM fine-tuning on new text, ULMFiT's stage (b)")
    p.add_argument("--layer-decay", type=Rate(0.0, 1.0, low_open=True), metavar="F",
                   help="discriminative learning rates: each layer group below the top gets F times its upper "
                   "neighbour's lr (ULMFiT: 1/2.6 = 0.385)")
    p.add_argument("--dropout-off", action="store_true", default=None,
                   help="pretrain with every dropout of the model at 0 (Cramming, Geiping & Goldstein 2023); the saved "
                   "model keeps its dropouts for fine-tuning")
    p.add_argument("--out", metavar="DIR", help="the run folder")
    p.add_argument("--max-steps", type=Count(1, 2**31 - 1), help="optimizer steps to train (with --budget: an "
                   "optional cap)")
    p.add_argument("--budget", type=budget, metavar="TIME|TOKENS", help=BUDGET_HELP)
    p.add_argument("--batch-size", type=Count(1, 1 << 20), help="sequences per optimizer step (all processes together)")
    p.add_argument("--micro-batch-size", type=Count(1, 1 << 20),
                   help="sequences per forward pass (gradient accumulation)")
    p.add_argument("--seq-len", type=Count(8, 1_000_000), help="tokens per training sequence")
    p.add_argument("--masking", choices=MASKINGS, help="which tokens the masked-LM objectives hide: single tokens, "
                   "whole words, SpanBERT spans or ALBERT n-grams")
    p.add_argument("--lr", type=LEARNING_RATE)
    p.add_argument("--precision", choices=PRECISIONS,
                   help="fp32 (default); bf16 autocast; auto: bf16 only where this device runs it natively and a "
                        "measurement at the model's width shows it faster, else fp32 (decided once, kept on resume)")
    p.add_argument("--compile", action="store_true", default=None, help=COMPILE_HELP)
    p.add_argument("--save-every", type=Count(0), metavar="N", help=SAVE_EVERY_HELP)
    p.add_argument("--save-minutes", type=Rate(0.0), metavar="M", help=SAVE_MINUTES_HELP)
    p.add_argument("--eval-every", type=Count(0), help="evaluate on the held-out share of the corpus every N steps "
                   "(0: only at the end)")
    p.add_argument("--seed", type=SEED)
    p.add_argument("--resume", default="never", metavar="auto|never|PATH", help=RESUME_HELP)
    p.add_argument("--overwrite", action="store_true", help="start afresh; the old run folder is renamed, not deleted")
    p.set_defaults(overrides=[])  # filled by the CLI with every --section.key=value argument


def resolve_run(args: argparse.Namespace) -> PretrainRun:
    run = resolve(PretrainRun, config=args.config, flags={key: getattr(args, name) for name, key in FLAGS.items()},
                  overrides=args.overrides, where="pretrain")
    if not run.data.path:
        raise LmforgeError("no data: pass --input DIR (a folder made by `lmforge data prepare`) or set data.path")
    if not run.out:
        raise LmforgeError("no output folder: pass --out DIR or set out in the config")
    return run


def run_pretrain(args: argparse.Namespace) -> int:
    run = resolve_run(args)
    trainer = build_trainer(run, resume=args.resume, overwrite=args.overwrite)
    results = trainer.fit()
    if trainer.dist.is_main:
        if (warning := plateau_warning(results)) is not None:
            log.warning(warning)
        shown = {k: round(v, 4) for k, v in results.items() if isinstance(v, float)}
        what = f"the model of {run.init_from}" if run.init_from else run.preset  # --init-from ignores the preset
        print(f"pretrained {what} ({run.data.objective}) for {trainer.step} steps -> {run.out}")
        print("final: " + ", ".join(f"{k} {v}" for k, v in shown.items()))
    return 0

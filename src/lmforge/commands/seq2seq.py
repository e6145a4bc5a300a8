"""``lmforge train-seq2seq``: the command line of the encoder-decoder recipe (``lmforge.recipes.seq2seq``: the
defaults, the data, the dev and test decoding)."""

from __future__ import annotations

import argparse
import logging

from lmforge.commands.options import LEARNING_RATE, SEED, Count, Rate
from lmforge.errors import LmforgeError
from lmforge.recipes.resolve import resolve
from lmforge.recipes.seq2seq import (
    BBC_HEADLINES,
    SEQ2SEQ_DEFAULTS,
    Seq2SeqRun,
    build_seq2seq_trainer,
    describe_model,
    evaluate_test,
)
from lmforge.utils.compiling import COMPILE_HELP

log = logging.getLogger("lmforge")


FLAGS = {"preset": "preset", "tokenizer": "tokenizer", "vocab_size": "vocab_size", "out": "out", "epochs": "epochs",
         "train_data": "data.train", "dev_data": "data.dev", "test_data": "data.test", "lr": "train.lr",
         "batch_size": "train.batch_size", "seed": "train.seed", "max_steps": "train.max_steps",
         "compile": "train.compile"}
FLAGS["init"] = "init"  # start from a model folder's weights (BART: lmforge pretrain --objective denoise)


def add_seq2seq_arguments(p: argparse.ArgumentParser) -> None:
    p.epilog = ("Any setting can also be given as --section.key=value, e.g. --model.attention=additive "
                "--model.attention_window=3 --model.attention_alignment=predictive --model.decoder_order=bahdanau "
                "--decode.beams=8 --train.warmup_steps=1000.")
    p.add_argument("--config", metavar="FILE", help="a TOML recipe (configs/headlines-*.toml)")
    p.add_argument("--preset", help="rnn-seq2seq, transformer-base, ... (model sizes: --model.d_model=...)")
    p.add_argument("--tokenizer", metavar="DIR", help="the shared source/target WordPiece tokenizer (default: train "
                                                      "one of vocab_size tokens on the training pairs)")
    p.add_argument("--vocab-size", type=Count(10, 10_000_000), metavar="N",
                   help="without --tokenizer: the size of the vocabulary "
                        "trained on the pairs (default 8000)")
    p.add_argument("--train", dest="train_data", metavar="FILE", help=f"pairs (JSONL/TSV/CSV), or {BBC_HEADLINES}")
    p.add_argument("--dev", dest="dev_data", metavar="FILE",
                   help="dev pairs, decoded and scored with ROUGE every epoch; the best model is kept (with "
                        "bbc-headlines: its own dev split)")
    p.add_argument("--test", dest="test_data", metavar="FILE",
                   help="test pairs, decoded with [decode] by the best model at the end into test_results.json "
                        "(with bbc-headlines: its own test split)")
    p.add_argument("--out", metavar="DIR")
    p.add_argument("--init", metavar="DIR", help="start from the weights and model config of an encoder-decoder "
                   "folder, e.g. a BART-style `lmforge pretrain --objective denoise` run; its tokenizer is used "
                   "(--preset is then not used; --model.* may change the dropouts only)")
    p.add_argument("--epochs", type=Rate(0.0, 1e6, low_open=True), help="passes over the training pairs (default 10)")
    p.add_argument("--lr", type=LEARNING_RATE)
    p.add_argument("--batch-size", type=Count(1, 65_536), help="pairs per optimizer step (default 32)")
    p.add_argument("--max-steps", type=Count(1, 2**31 - 1), help="default: epochs x batches per epoch")
    p.add_argument("--compile", action="store_true", default=None, help=COMPILE_HELP)
    p.add_argument("--seed", type=SEED)
    p.add_argument("--resume", default="never", metavar="auto|never|PATH")
    p.add_argument("--overwrite", action="store_true")
    p.set_defaults(overrides=[])


def resolve_run(args: argparse.Namespace) -> Seq2SeqRun:
    run = resolve(Seq2SeqRun, defaults=SEQ2SEQ_DEFAULTS, config=args.config,
                  flags={key: getattr(args, name, None) for name, key in FLAGS.items()}, overrides=args.overrides,
                  where="train-seq2seq")
    if not run.out:
        raise LmforgeError("no output folder: pass --out DIR")
    if not run.data.train:
        raise LmforgeError(f"no training data: pass --train FILE (or {BBC_HEADLINES})")
    return run


def run_train_seq2seq(args: argparse.Namespace) -> int:
    from lmforge.persistence import load_pretrained

    run = resolve_run(args)
    trainer, tokenizer, test = build_seq2seq_trainer(run, resume=args.resume, overwrite=args.overwrite)
    trainer.fit()
    if not trainer.dist.is_main:
        return 0
    print(f"trained {describe_model(run, trainer.model_config, trainer.model)} for {run.train.max_steps} steps "
          f"-> {run.out}")
    if trainer.best is not None:
        shown = ", ".join(f"{k} {v:.2f}" for k, v in trainer.best["record"].items() if k.startswith("rouge"))
        print(f"best dev at step {trainer.best['step']} ({run.decode.dev_strategy}): {shown}")
    if test:
        trainer.model = load_pretrained(run.out).model  # the best model, as saved
        scores = evaluate_test(run, trainer, tokenizer, test)
        print(f"test ({run.decode.strategy}): " + ", ".join(f"{k} {v:.2f}" for k, v in scores.items()))
    return 0

"""``lmforge demo`` (``make demo``, also ``python -m lmforge.demo``): runs the steps of ``lmforge.recipes.demo`` in
the story's order and prints what each made."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from lmforge.commands.options import Count
from lmforge.errors import LmforgeError
from lmforge.recipes import demo
from lmforge.utils.log import setup_logging

DESCRIPTION = ("``make demo``: the whole story on the embedded BBC News corpus, from a tokenizer to transfer "
               "learning.")


def add_demo_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="runs/demo", metavar="DIR",
                   help="output folder (replaced by each demo run; a folder the demo did not make is refused)")
    p.add_argument("--vocab-size", type=Count(1), default=8000, metavar="N",
                   help="the vocabulary size of both tokenizers")
    p.add_argument("--pretrain-config", default=str(demo.DEFAULT_RECIPE), metavar="FILE",
                   help="the pretraining recipe's TOML (the small-budget recipe of issue 36)")
    p.add_argument("--budget", metavar="TIME|TOKENS", help="the pretraining's budget, e.g. 3m or 600ktok (default: "
                                                           "the recipe's)")
    p.add_argument("--steps", type=Count(1), metavar="N", help="pretrain this many steps instead of a budget")
    p.add_argument("--compare-config", default=str(demo.DEFAULT_COMPARE), metavar="FILE",
                   help="the comparison's TOML")


def _show_tokenizer(made: demo.TrainedTokenizer) -> None:
    print(f"\n== tokenizer ({made.algorithm}): {made.vocab_size} tokens in {made.seconds:.1f} s; "
          f"{made.pieces_per_word:.2f} pieces per word on BBC News")
    print("   first merges: " + ", ".join(made.first_merges))
    for text, tokens in made.examples:
        print(f"   {text}\n     -> {' '.join(tokens)}")


def _show_shards(shards: demo.Shards) -> None:
    counts = shards.counts
    print(f"\n== shards: {counts['documents']:,} documents, {counts['sentences']:,} sentences, "
          f"{counts['tokens']:,} tokens in {shards.seconds:.1f} s -> {shards.folder}")


def _show_pretraining(pretraining: demo.Pretraining) -> None:
    print(f"\n== pretraining {pretraining.describe()} -> {pretraining.run.out}")


def _show_pretrained(pretrained: demo.Pretrained) -> None:
    folder = pretrained.folder
    print(f"\n   held-out documents      before    after ({pretrained.minutes:.1f} min)")
    for label, before, after in pretrained.held_out():
        print(f"   {label:<22}{before:>9.3f}{after:>9.3f}")
    print(f"   loss curve: {folder / 'loss_curve.png'}; metrics: {folder / 'metrics.jsonl'}; "
          f"model: {folder} (loads with lmforge.load_pretrained, `lmforge embed --model {folder}`)")


def _show_comparison(paths: dict[str, Path], minutes: float) -> None:
    print(f"\n{paths['md'].read_text(encoding='utf-8')}")
    print(f"   {minutes:.1f} min; table: {paths['md']}; csv: {paths['csv']}; learning curve: {paths['png']}")


def run_demo(args: argparse.Namespace) -> int:
    """The demo, step by step: the split, the tokenizers, the shards, the pretraining, the comparison."""
    out = Path(args.out)
    started = time.perf_counter()
    train_files, test_files = demo.training_split()
    texts, stats = demo.read_training_texts(train_files)
    print(f"BBC News training split ({len(train_files)} articles; {len(test_files)} held out): {stats.summary()}")
    demo.replace_demo_folder(out)
    tokenizers = {}
    for algorithm in demo.TOKENIZER_ALGORITHMS:
        tokenizers[algorithm] = demo.train_tokenizer(texts, out, args.vocab_size, algorithm)
        _show_tokenizer(tokenizers[algorithm])
    tokenizer_dir = tokenizers[demo.PRETRAINING_TOKENIZER].folder
    shards = demo.prepare_shards(tokenizer_dir, train_files, out)
    _show_shards(shards)
    if args.budget and args.steps:
        raise LmforgeError("--budget and --steps both set how long the demo pretrains: give one")
    pretraining = demo.build_pretraining(shards, out, recipe=Path(args.pretrain_config), budget=args.budget,
                                         steps=args.steps)
    _show_pretraining(pretraining)
    pretrained = demo.pretrain(pretraining)
    _show_pretrained(pretrained)
    config = demo.comparison_config(Path(args.compare_config), out, tokenizer_dir, pretrained.folder)
    print(f"\n== the comparison ({len(config.approach)} approaches x {len(config.sizes)} sizes x "
          f"{len(config.seeds)} seeds) -> {config.out}")
    _show_comparison(*demo.compare(config))
    print(f"\nthe demo took {(time.perf_counter() - started) / 60:.1f} min")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m lmforge.demo``: the demo with its own parser (errors as ``lmforge demo: ...``, exit code 2)."""
    parser = argparse.ArgumentParser(description=DESCRIPTION, allow_abbrev=False)
    add_demo_arguments(parser)
    args = parser.parse_args(argv)
    setup_logging()
    try:
        return run_demo(args)
    except LmforgeError as err:
        print(f"lmforge demo: {err}", file=sys.stderr)
        return 2

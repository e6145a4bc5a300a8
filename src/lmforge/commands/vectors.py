"""``lmforge word2vec train``, ``lmforge glove train`` and ``lmforge vectors evaluate``."""

from __future__ import annotations

import argparse
import json
import logging
import math
import os

from lmforge.choices import WORD2VEC_MODES
from lmforge.commands.options import LEARNING_RATE, POSITIVE, SEED, Count, Rate
from lmforge.data.text import ReadStats
from lmforge.embeddings.io import FILE_FORMATS, load_word2vec
from lmforge.embeddings.vocab import encode_corpus
from lmforge.errors import LmforgeError
from lmforge.recipes.vectors import metrics_path, train_vectors
from lmforge.utils.io import prepare_output_file

log = logging.getLogger("lmforge")


def _available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _add_common(p: argparse.ArgumentParser, window: int, epochs: int, batch: int, batch_unit: str) -> None:
    p.add_argument("--input", nargs="+", required=True, metavar="PATH",
                   help="text files, or folders searched for .txt files (UTF-8; each line is a sentence)")
    p.add_argument("--out", required=True, metavar="FILE.txt", help="the vectors, in the word2vec format")
    p.add_argument("--binary", action="store_true", help="write the word2vec binary format instead of text")
    p.add_argument("--format", choices=FILE_FORMATS, default="word2vec",
                   help="word2vec: the 'N D' header line, then 'word v1 ... vD' rows (default); glove: the same rows "
                        "without the header, as the Stanford GloVe tool writes (text only). Readers detect both")
    p.add_argument("--dim", type=Count(1, 10_000), default=100, metavar="D", help="vector size (default 100)")
    p.add_argument("--window", type=Count(1, 10_000), default=window, metavar="W",
                   help=f"maximal distance (default {window})")
    p.add_argument("--min-count", type=Count(1, 2**31 - 1), default=5, metavar="C", help="drop rarer words (default 5)")
    p.add_argument("--epochs", type=Count(1, 100_000), default=epochs, metavar="E", help=f"passes (default {epochs})")
    p.add_argument("--workers", type=Count(1, 128), default=min(_available_cores(), 128), metavar="N",
                   help="lock-free training threads (default: the cores available)")
    p.add_argument("--batch-size", type=Count(1, 1_000_000), default=batch, metavar="N",
                   help=f"{batch_unit} per update "
                        f"(default {batch})")
    p.add_argument("--seed", type=SEED, default=1)
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N: where the tables live (default cpu)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output file")


def _number(x: float) -> float | None:
    """JSON has no NaN: an undefined score (no pair or question could be scored) is written as null."""
    return None if math.isnan(x) else x


# ---------------------------------------------------------------------------------------------- word2vec
def add_word2vec_arguments(p: argparse.ArgumentParser) -> None:
    _add_common(p, window=5, epochs=5, batch=1024, batch_unit="fast mode: centre words")
    arch = p.add_mutually_exclusive_group()
    arch.add_argument("--sg", dest="architecture", action="store_const", const="skipgram",
                      help="skip-gram (the default)")
    arch.add_argument("--cbow", dest="architecture", action="store_const", const="cbow",
                      help="continuous bag of words")
    p.set_defaults(architecture="skipgram")
    p.add_argument("--negative", type=Count(1, 1000), default=5, metavar="K", help="negatives per pair (default 5)")
    p.add_argument("--sample", type=Rate(0.0, 1.0), default=1e-3, metavar="T",
                   help="subsampling threshold t; 0 keeps every word (default 1e-3)")
    p.add_argument("--lr", dest="alpha", type=POSITIVE, default=0.025,
                   help="initial learning rate, gensim's alpha (default 0.025)")
    p.add_argument("--min-lr", dest="min_alpha", type=Rate(0.0), default=0.0001,
                   help="final learning rate, gensim's min_alpha (default 0.0001)")
    p.add_argument("--mode", choices=WORD2VEC_MODES, default="exact",
                   help="exact: the reference algorithm, every pair with its own negatives and its own SGD update "
                        "(compiled loop, CPU; the default); fast: the batched approximation (blocks sharing "
                        "negatives, summed updates; --batch-size, --share-negatives; runs on a GPU too)")
    p.add_argument("--share-negatives", type=Count(1, 10_000), default=8, metavar="G",
                   help="fast mode: consecutive centre words that share one draw of negatives (default 8; see "
                        "lmforge.embeddings.word2vec)")


def _check_outputs(args: argparse.Namespace) -> None:
    """Fail before the long work: the vectors file and its metrics file may be written (see the output policy)."""
    if args.binary and args.format == "glove":
        raise LmforgeError("--binary writes the word2vec binary format; the GloVe format (--format glove) is text "
                           "only: drop one of the two")
    for path in (args.out, metrics_path(args.out)):
        prepare_output_file(path, overwrite=args.overwrite, inputs=args.input)


def run_word2vec_train(args: argparse.Namespace) -> int:
    from lmforge.embeddings.word2vec import Word2VecConfig  # imports torch: not at the command line's start

    _check_outputs(args)
    config = Word2VecConfig(architecture=args.architecture, mode=args.mode, dim=args.dim, window=args.window,
                            negative=args.negative, min_count=args.min_count, sample=args.sample, alpha=args.alpha,
                            min_alpha=args.min_alpha, epochs=args.epochs, batch_size=args.batch_size,
                            share_negatives=args.share_negatives, workers=args.workers, seed=args.seed,
                            device=args.device)
    with encode_corpus(args.input, stats=ReadStats(), progress=True) as corpus:
        result, vocab = train_vectors(config, corpus, out=args.out, binary=args.binary, file_format=args.format)
    print(f"word2vec {config.architecture}: {len(vocab):,} words x {config.dim} dimensions, {config.epochs} epochs "
          f"in {result.seconds:.1f} s ({result.words_per_second:,.0f} words/s); final loss "
          f"{result.epochs[-1].loss:.4f}")
    print(f"saved {args.out} and {metrics_path(args.out)}")
    return 0


# ---------------------------------------------------------------------------------------------- GloVe
def add_glove_arguments(p: argparse.ArgumentParser) -> None:
    _add_common(p, window=15, epochs=15, batch=4096, batch_unit="co-occurrence entries")
    p.add_argument("--x-max", type=POSITIVE, default=100.0, help="weighting cut-off x_max (default 100)")
    p.add_argument("--alpha", type=POSITIVE, default=0.75, help="weighting exponent (default 0.75)")
    p.add_argument("--lr", type=LEARNING_RATE, default=0.05, help="AdaGrad's initial learning rate (default 0.05)")
    p.add_argument("--max-entries", type=Count(1, 2**31 - 1), default=20_000_000, metavar="N",
                   help="co-occurrence entries held in memory while counting; more spill to temporary files")


def run_glove_train(args: argparse.Namespace) -> int:
    from lmforge.embeddings.glove import GloVeConfig  # imports torch: not at the command line's start

    _check_outputs(args)
    config = GloVeConfig(dim=args.dim, window=args.window, min_count=args.min_count, epochs=args.epochs, lr=args.lr,
                         x_max=args.x_max, alpha=args.alpha, batch_size=args.batch_size, workers=args.workers,
                         seed=args.seed, max_entries=args.max_entries, device=args.device)
    with encode_corpus(args.input, stats=ReadStats(), progress=True) as corpus:
        result, vocab = train_vectors(config, corpus, out=args.out, binary=args.binary, file_format=args.format)
    print(f"glove: {len(vocab):,} words x {config.dim} dimensions from {result.nnz:,} co-occurrences "
          f"({result.cooccurrence_seconds:.1f} s), {config.epochs} epochs in {result.seconds:.1f} s; final loss "
          f"{result.epochs[-1].loss:.5f}")
    print(f"saved {args.out} and {metrics_path(args.out)}")
    return 0


# ---------------------------------------------------------------------------------------------- evaluate
def add_evaluate_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("vectors", metavar="VECTORS", help="a word2vec text or binary file, or a headerless GloVe text file "
                   "(format detected)")
    task = p.add_mutually_exclusive_group(required=True)
    task.add_argument("--pairs", metavar="FILE", help="word pairs with human scores: 'word1 word2 score' lines "
                      "(WordSim-353, SimLex-999); prints Spearman's rho")
    task.add_argument("--analogies", metavar="FILE", help="analogy questions in the Google format "
                      "(': section' lines, then 'a b c d'); prints 3CosAdd accuracy")
    p.add_argument("--case-sensitive", action="store_true",
                   help="match test words exactly (default: case-insensitive, as gensim)")


def run_evaluate(args: argparse.Namespace) -> int:
    kv = load_word2vec(args.vectors)
    kv.require_finite(args.vectors)  # a NaN table would "score" a meaningless rho
    insensitive = not args.case_sensitive
    if args.pairs:
        r = kv.evaluate_pairs(args.pairs, case_insensitive=insensitive)
        report = {"file": str(args.pairs), "spearman": _number(r.spearman), "pairs": r.pairs, "oov_pairs": r.oov_pairs,
                  "oov_ratio": round(r.oov_ratio, 4)}
    else:
        a = kv.evaluate_analogies(args.analogies, case_insensitive=insensitive)
        report = {"file": str(args.analogies), "accuracy": _number(a.accuracy), "correct": a.correct,
                  "questions": a.questions, "oov_questions": a.oov_questions,
                  "sections": {name: {"correct": c, "questions": q, "accuracy": c / q if q else None}
                               for name, (c, q) in a.sections.items()}}
    print(json.dumps(report, indent=2))
    return 0

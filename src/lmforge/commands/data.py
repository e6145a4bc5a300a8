"""``lmforge data prepare``: text files -> memory-mapped token shards (+ the tokenizer, copied beside them)."""

from __future__ import annotations

import argparse

from lmforge.commands.options import Count


def add_prepare_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tokenizer", required=True, metavar="DIR", help="a tokenizer folder (vocab.txt)")
    p.add_argument("--input", nargs="+", required=True, metavar="PATH", help="text files or folders of .txt")
    p.add_argument("--out", required=True, metavar="DIR", help="the prepared folder (shards + manifest.json)")
    p.add_argument("--format", dest="input_format", choices=("auto", "lines", "documents", "texts"), default="auto",
                   help="lines: one sentence per line, blank lines between documents (BERT's format); "
                        "documents: each file is a document, split into sentences; texts: one text per line "
                        "(tweets, reviews, questions), each a document; auto: decide per file and say why")
    p.add_argument("--workers", type=Count(1, 256), default=None, help="tokenizing processes (default: all cores)")
    p.add_argument("--shard-tokens", type=Count(1, 2**40), default=None, metavar="N", help="tokens per shard")
    p.add_argument("--overwrite", action="store_true",
                   help="move a non-empty --out aside (<name>.old-<time>) and prepare afresh")


def run_prepare(args: argparse.Namespace) -> int:
    from lmforge.data.shards import prepare_corpus

    options = {"input_format": args.input_format, "workers": args.workers, "overwrite": args.overwrite}
    if args.shard_tokens is not None:
        options["shard_size_tokens"] = args.shard_tokens
    manifest = prepare_corpus(args.tokenizer, args.input, args.out, **options)  # with the tokenizer, in tokenizer/
    counts = manifest.get("counts", manifest)
    print(f"prepared {args.out}: " + ", ".join(f"{k} {v:,}" for k, v in counts.items()
                                                if isinstance(v, int) and not isinstance(v, bool)))
    return 0

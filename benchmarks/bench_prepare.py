"""Peak memory and speed of ``lmforge data prepare`` on BBC News and on a corpus 10x its size.

Streaming means memory stays bounded by one shard, never the corpus: the peak resident memory of the
preparing process and of its largest worker should stay about flat when the corpus grows 10x.

    .venv/bin/python benchmarks/bench_prepare.py [--copies 10] [--workers 2] [--shard-tokens 2000000] [--quick]

Each size runs in a fresh subprocess; the corpus copies are written to a temporary folder (BBC's 2,225 files
repeated, each copy a separate set of documents).
"""

from __future__ import annotations

import argparse
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    emit_result,
    markdown_table,
    peak_rss_mb,
    print_machine,
    reproduce_command,
    run_child,
)


def child(corpus: str, tokenizer: str, out: str, workers: int, shard_tokens: int) -> None:
    from lmforge.data.shards import prepare_corpus

    start = time.perf_counter()
    manifest = prepare_corpus(tokenizer, [corpus], out, workers=workers, shard_size_tokens=shard_tokens,
                              show_progress=False)
    seconds = time.perf_counter() - start
    children_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024 / 1e6
    counts = manifest["counts"]
    emit_result({"seconds": seconds, "tokens": counts["tokens"], "documents": counts["documents"],
                 "shards": len(manifest["shards"]), "parent_mb": peak_rss_mb().get("vm_hwm"),
                 "worker_mb": children_mb})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, default=10)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--shard-tokens", type=int, default=2_000_000)
    parser.add_argument("--quick", action="store_true", help="a smoke run: a corpus 2x BBC News instead of 10x")
    parser.add_argument("--_child", nargs=3, metavar=("CORPUS", "TOKENIZER", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._child:
        child(*args._child, args.workers, args.shard_tokens)
        return
    if args.quick:
        args.copies = 2

    from lmforge.data.corpora import bbc_news_dir
    from lmforge.tokenizers import WordPieceTrainer

    print_machine()
    print("\n" + reproduce_command(__file__, sys.argv[1:]))
    bbc = bbc_news_dir()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        texts = [p.read_text(encoding="utf-8", errors="replace") for p in sorted(bbc.rglob("*.txt"))]
        WordPieceTrainer(8000, algorithm="bpe-count").train(texts).save_pretrained(root / "tok")
        big = root / "big"
        for copy in range(args.copies):
            shutil.copytree(bbc, big / f"copy-{copy:02d}")
        rows = []
        for name, corpus in (("BBC News (1x)", bbc), (f"BBC News x{args.copies}", big)):
            r = run_child(__file__, ["--_child", str(corpus), str(root / "tok"), str(root / f"out-{len(rows)}"),
                                     "--workers", str(args.workers), "--shard-tokens", str(args.shard_tokens)])
            rows.append([name, f"{r['documents']:,}", f"{r['tokens']:,}", r["shards"], f"{r['seconds']:.1f}",
                         f"{r['tokens'] / r['seconds'] / 1e6:.2f}", f"{r['parent_mb']:.0f}", f"{r['worker_mb']:.0f}"])
    print()
    print(markdown_table(["Corpus", "Documents", "Tokens", "Shards", "Seconds", "M tokens/s",
                          "Peak RSS main MB", "Peak RSS largest worker MB"], rows))


if __name__ == "__main__":
    main()

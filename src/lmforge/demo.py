"""``make demo``: the most complete pipeline lmforge has, on the embedded BBC News corpus.

Now: train WordPiece tokenizers (likelihood score and pair count) on BBC News, show encoded examples,
the vocabulary size and tokens per word of each, and save them under ``--out``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from lmforge.cli import setup_logging
from lmforge.data.corpora import bbc_news_dir
from lmforge.data.text import ReadStats, collect_text_files, read_texts
from lmforge.errors import LmforgeError
from lmforge.tokenizers import WordPieceTokenizer, WordPieceTrainer

EXAMPLES = (
    "Quarterly profits at US media giant TimeWarner jumped 76% to $1.13bn.",
    "The Chancellor's pre-budget report promised unbelievably low inflation.",
    "Wenger says Arsenal's youngsters are ready for the Champions League.",
)


def tokens_per_word(tokenizer: WordPieceTokenizer, texts: list[str]) -> float:
    words = sum(len(tokenizer.basic.tokenize(t)) for t in texts)
    pieces = sum(len(tokenizer.encode_ids(t)) for t in texts)
    return pieces / max(words, 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/demo", help="output folder (replaced by each demo run)")
    parser.add_argument("--vocab-size", type=int, default=8000)
    args = parser.parse_args(argv)
    setup_logging()
    out = Path(args.out)
    try:
        stats = ReadStats()
        texts = [t for _, t in read_texts(collect_text_files([bbc_news_dir()]), stats)]
    except LmforgeError as err:
        print(f"lmforge demo: {err}", file=sys.stderr)
        return 2
    print(f"BBC News: {stats.summary()}")
    for algorithm in ("wordpiece", "bpe-count"):
        start = time.perf_counter()
        trainer = WordPieceTrainer(args.vocab_size, algorithm=algorithm, show_progress=True)
        tokenizer = trainer.train(texts)
        seconds = time.perf_counter() - start
        tokenizer.save_pretrained(out / f"tokenizer-{algorithm}", overwrite=True)
        print(f"\n== {algorithm}: {tokenizer.vocab_size} tokens in {seconds:.1f} s; "
              f"{tokens_per_word(tokenizer, texts):.3f} tokens per word on BBC; "
              f"saved to {out / f'tokenizer-{algorithm}'}")
        print("   first merges: " + ", ".join(f"{m.left}+{m.right}" for m in trainer.merges[:8]))
        for text in EXAMPLES:
            enc = tokenizer(text)
            pieces = tokenizer.convert_ids_to_tokens(enc["input_ids"])
            print(f"   {text}\n     -> {' '.join(pieces)}\n     -> {enc['input_ids']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

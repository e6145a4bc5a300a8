"""``make demo``: the most complete pipeline lmforge has, on the embedded BBC News corpus.

1. Train WordPiece tokenizers on BBC News with the likelihood score and by pair count; show encoded examples,
   vocabulary sizes and pieces per word.
2. Tokenize the corpus into shards (``lmforge data prepare``).
3. Pretrain a bert-mini with BERT's recipe (MLM + NSP) for a few minutes and report MLM accuracy and
   perplexity on held-out documents before and after, with the loss curve saved as a PNG.

Everything lands under ``--out`` (default ``runs/demo``), which each demo run replaces.
"""

from __future__ import annotations

import argparse
import shutil
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
)


def tokens_per_word(tokenizer: WordPieceTokenizer, texts: list[str]) -> float:
    words = sum(len(tokenizer.basic.tokenize(t)) for t in texts)
    pieces = sum(len(tokenizer.encode_ids(t)) for t in texts)
    return pieces / max(words, 1)


def train_tokenizers(texts: list[str], out: Path, vocab_size: int) -> Path:
    """Both training criteria side by side; returns the folder of the one used for pretraining (by count)."""
    for algorithm in ("wordpiece", "bpe-count"):
        start = time.perf_counter()
        trainer = WordPieceTrainer(vocab_size, algorithm=algorithm)
        tokenizer = trainer.train(texts)
        seconds = time.perf_counter() - start
        tokenizer.save_pretrained(out / f"tokenizer-{algorithm}", overwrite=True)
        print(f"\n== tokenizer ({algorithm}): {tokenizer.vocab_size} tokens in {seconds:.1f} s; "
              f"{tokens_per_word(tokenizer, texts):.2f} pieces per word on BBC News")
        print("   first merges: " + ", ".join(f"{m.left}+{m.right}" for m in trainer.merges[:6]))
        for text in EXAMPLES:
            enc = tokenizer(text)
            print(f"   {text}\n     -> {' '.join(tokenizer.convert_ids_to_tokens(enc['input_ids']))}")
    # The likelihood score leaves frequent words in pieces (about 3 per word here), which makes pretraining
    # sequences 3x longer for the same text; the model trains on the count-based vocabulary.
    return out / "tokenizer-bpe-count"


def pretrain(tokenizer_dir: Path, out: Path, steps: int) -> None:
    from lmforge.commands.pretrain import PretrainRun, build_trainer
    from lmforge.config import DataConfig, TrainConfig
    from lmforge.data.shards import prepare_corpus

    data_dir = out / "bbc-shards"
    start = time.perf_counter()
    manifest = prepare_corpus(tokenizer_dir, [bbc_news_dir()], data_dir, overwrite=True, show_progress=False)
    WordPieceTokenizer.from_pretrained(tokenizer_dir).save_pretrained(data_dir / "tokenizer", overwrite=True)
    counts = manifest["counts"]
    print(f"\n== shards: {counts['documents']:,} documents, {counts['sentences']:,} sentences, "
          f"{counts['tokens']:,} tokens in {time.perf_counter() - start:.1f} s -> {data_dir}")
    run = PretrainRun(
        preset="bert-mini", out=str(out / "bert-mini"), model={"max_seq_len": 128},
        data=DataConfig(path=str(data_dir), objective="mlm+nsp", seq_len=128, max_predictions=20),
        train=TrainConfig(max_steps=steps, batch_size=32, lr=1e-3, warmup_ratio=0.1, eval_every=max(steps // 4, 1),
                          eval_batches=8, log_every=10, save_every=0))
    trainer = build_trainer(run, overwrite=True)
    print(f"\n== pretraining bert-mini (MLM + NSP, {steps} steps of 32 x 128) -> {run.out}")
    before = trainer.evaluate()
    start = time.perf_counter()
    after = trainer.fit()
    minutes = (time.perf_counter() - start) / 60
    print(f"\n   held-out documents      before    after ({minutes:.1f} min)")
    for key, label in (("eval_mlm_accuracy", "MLM accuracy"), ("eval_ppl_mlm", "MLM perplexity"),
                       ("eval_nsp_accuracy", "NSP accuracy")):
        if key in before and key in after:
            print(f"   {label:<22}{before[key]:>9.3f}{after[key]:>9.3f}")
    print(f"   loss curve: {Path(run.out) / 'loss_curve.png'}; metrics: {Path(run.out) / 'metrics.jsonl'}; "
          f"model: {run.out} (loads with lmforge.models.load_pretrained, `lmforge embed --model {run.out}`)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/demo", help="output folder (replaced by each demo run)")
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--steps", type=int, default=150, help="pretraining steps (about 2 s each on 2 cores)")
    args = parser.parse_args(argv)
    setup_logging()
    out = Path(args.out)
    try:
        stats = ReadStats()
        texts = [t for _, t in read_texts(collect_text_files([bbc_news_dir()]), stats)]
        print(f"BBC News: {stats.summary()}")
        if out.exists():
            shutil.rmtree(out)  # the demo's own folder: each run starts clean
        tokenizer_dir = train_tokenizers(texts, out, args.vocab_size)
        pretrain(tokenizer_dir, out, args.steps)
    except LmforgeError as err:
        print(f"lmforge demo: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

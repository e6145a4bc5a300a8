"""``make demo``: the whole story on the embedded BBC News corpus, from a tokenizer to transfer learning.

The BBC articles are split once (stratified 80/20 by topic, seed 0); only the training articles are used for
the tokenizer, pretraining and the static vectors, so the test articles stay unseen.

1. Train WordPiece tokenizers with the likelihood score and by pair count; show encoded examples, vocabulary
   sizes and pieces per word.
2. Tokenize the training articles into shards (``lmforge data prepare``).
3. Pretrain a bert-mini with BERT's recipe (MLM + NSP) for a few minutes, on 64-token pairs (the length the
   comparison fine-tunes on); MLM accuracy, perplexity and NSP accuracy on held-out documents before and after,
   with the loss curve saved as a PNG. A few CPU minutes are far from a real pretraining: BERT from scratch first
   sits on a plateau where it predicts the unigram distribution and every input gets nearly the same vector (a
   120-step run at 128 tokens ended there and could not be fine-tuned at all). 300 steps at 64 tokens left it in
   one measurement and not in others (MLM accuracy 0.048, NSP 0.449 after 300 steps on an AVX-512 machine in
   2026-11: still the plateau, and its comparison row stays at chance for 10 articles per class); the MiniLM rows
   of the comparison show what a real pretraining gives.
4. The comparison (``lmforge compare``, configs/compare-demo.toml): classifiers trained from scratch, from
   Word2Vec / GloVe vectors trained here, on a frozen MiniLM and on ELMo's biLM, and by fine-tuning our bert-mini,
   ULMFiT's AWD-LSTM and MiniLM, on 10 and 50 articles per class; the AWD-LSTM language model and the biLM are
   pretrained by the comparison itself on the training articles (its ``[[pretrain]]`` tables); ending with the
   table, the CSV and the learning curve.

Everything lands under ``--out`` (default ``runs/demo``), which each demo run replaces.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

from lmforge.data.corpora import bbc_news_dir
from lmforge.data.text import ReadStats, collect_text_files, read_texts
from lmforge.errors import LmforgeError
from lmforge.tokenizers import WordPieceTokenizer, WordPieceTrainer
from lmforge.utils.log import setup_logging

DEFAULT_COMPARE = Path(__file__).resolve().parents[2] / "configs" / "compare-demo.toml"
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


def pretrain(tokenizer_dir: Path, files: list[Path], out: Path, steps: int, seq_len: int = 64) -> Path:
    from lmforge.config import DataConfig, TrainConfig
    from lmforge.data.shards import prepare_corpus
    from lmforge.recipes.pretrain import PretrainRun, build_trainer

    data_dir = out / "bbc-shards"
    start = time.perf_counter()
    manifest = prepare_corpus(tokenizer_dir, files, data_dir, overwrite=True, show_progress=False)
    WordPieceTokenizer.from_pretrained(tokenizer_dir).save_pretrained(data_dir / "tokenizer", overwrite=True)
    counts = manifest["counts"]
    print(f"\n== shards: {counts['documents']:,} documents, {counts['sentences']:,} sentences, "
          f"{counts['tokens']:,} tokens in {time.perf_counter() - start:.1f} s -> {data_dir}")
    run = PretrainRun(
        preset="bert-mini", out=str(out / "bert-mini"), model={"max_seq_len": seq_len},
        data=DataConfig(path=str(data_dir), objective="mlm+nsp", seq_len=seq_len),
        train=TrainConfig(max_steps=steps, batch_size=32, lr=1e-3, warmup_ratio=0.1, eval_every=max(steps // 4, 1),
                          eval_batches=8, log_every=10, save_every=0))
    trainer = build_trainer(run, overwrite=True)
    print(f"\n== pretraining bert-mini (MLM + NSP, {steps} steps of 32 x {seq_len}) -> {run.out}")
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
    return Path(run.out)


def compare(config_path: Path, out: Path, tokenizer_dir: Path, pretrained: Path) -> None:
    from lmforge.compare import compare_config, run_compare
    from lmforge.config import load_toml

    values = load_toml(config_path)
    values.update(out=str(out / "compare"), tokenizer=str(tokenizer_dir), pretrained=str(pretrained))
    config = compare_config(values, str(config_path))
    print(f"\n== the comparison ({len(config.approach)} approaches x {len(config.sizes)} sizes x "
          f"{len(config.seeds)} seeds) -> {config.out}")
    start = time.perf_counter()
    paths = run_compare(config)
    print(f"\n{paths['md'].read_text(encoding='utf-8')}")
    print(f"   {(time.perf_counter() - start) / 60:.1f} min; table: {paths['md']}; csv: {paths['csv']}; "
          f"learning curve: {paths['png']}")


def training_split() -> tuple[list[Path], list[Path]]:
    """The BBC files of the comparison's training and test split (the same stratified split)."""
    from lmforge.data.readers import stratified_split

    files = collect_text_files([bbc_news_dir()])
    labels = [f.parent.name for f in files]
    train, test = stratified_split(labels, 0.2, 0)
    return [files[i] for i in train], [files[i] for i in test]


MARKER = ".lmforge-demo"  # marks a folder that a demo run made, and that the next demo run may replace


def replace_demo_folder(out: Path) -> None:
    """Start the demo in an empty ``out``: a previous demo's folder is deleted, anything else is refused."""
    if out.exists() and any(out.iterdir()):
        if not (out / MARKER).is_file():
            raise LmforgeError(f"{out} is not empty and was not made by the demo; choose another --out (the demo "
                               "replaces its folder at each run)")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).write_text("made by `python -m lmforge.demo`; the next demo run replaces this folder\n",
                              encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/demo",
                        help="output folder (replaced by each demo run; a folder the demo did not make is refused)")
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--steps", type=int, default=300, help="pretraining steps (about 0.5 s each on 2 cores)")
    parser.add_argument("--compare-config", default=str(DEFAULT_COMPARE), help="the comparison's TOML")
    args = parser.parse_args(argv)
    setup_logging()
    out = Path(args.out)
    try:
        started = time.perf_counter()
        train_files, test_files = training_split()
        stats = ReadStats()
        texts = [t for _, t in read_texts(train_files, stats)]
        print(f"BBC News training split ({len(train_files)} articles; {len(test_files)} held out): "
              f"{stats.summary()}")
        replace_demo_folder(out)
        tokenizer_dir = train_tokenizers(texts, out, args.vocab_size)
        pretrained = pretrain(tokenizer_dir, train_files, out, args.steps)
        compare(Path(args.compare_config), out, tokenizer_dir, pretrained)
        print(f"\nthe demo took {(time.perf_counter() - started) / 60:.1f} min")
    except LmforgeError as err:
        print(f"lmforge demo: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

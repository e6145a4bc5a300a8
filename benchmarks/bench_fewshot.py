"""Few-shot prompting of a GPT pretrained here on BBC News: topic accuracy against the number of demonstrations.

GPT-3's protocol (Brown et al. 2020, section 2.4) on the five BBC topics, with the gpt-mini that lmforge pretrains
on the training articles only (the test articles stay unseen; the split is the demo's: stratified 80/20, seed 0):

* the model: gpt-mini (6 layers of 192, pre-LN) trained with ``--objective clm`` on 256-token blocks of the training
  articles for ``--steps`` steps (configs/gpt-mini.toml's schedule, 256 positions so 16 demonstrations fit), or
  ``--model DIR`` to evaluate another causal LM folder (lmforge's or a Hugging Face GPT-2 one);
* the task: an article's title (its first line) -> its topic, prompt ``"<title> topic: <label>"`` per
  demonstration (WordPiece drops the separator's whitespace, so demonstrations are joined by " . ");
* K = 0, 1, 4, 16 demonstrations drawn at random from the training titles (``--draws`` draws per K, fixed per
  draw), ``--n-test`` test titles balanced over the topics; the topic whose name scores best is the answer
  (log-likelihood sum), also with contextual calibration (Zhao et al. 2021) and with GPT-3's unconditional
  normalisation.

Reported honestly, whatever it scores: a model this small, trained minutes on 1,780 articles, is expected to stay
near chance; the synthetic key-value task (``bench_icl.py``) is where in-context learning shows at this scale.

    python benchmarks/bench_fewshot.py            # ~20 min on 2 cores (mostly the pretraining)
    python benchmarks/bench_fewshot.py --quick    # a 2-minute check of the whole path
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

from common import fmt, machine_description, markdown_table, print_machine, reproduce_command
from lmforge.utils.io import atomic_write_text

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results"
SCORINGS = (("sum", False, "log-likelihood (sum)"), ("sum", True, "calibrated (Zhao et al.)"),
            ("unconditional", False, "unconditional-normalised (GPT-3)"))


def bbc_split() -> tuple[list[tuple[str, str, str]], list[tuple[str, str, str]]]:
    """(train, test) lists of (title, article, topic), the demo's stratified 80/20 split (seed 0)."""
    from lmforge.data.corpora import bbc_news_dir
    from lmforge.data.readers import stratified_split
    from lmforge.data.text import decode_utf8

    root = bbc_news_dir()
    items = []
    for topic in sorted(p for p in root.iterdir() if p.is_dir()):
        for f in sorted(topic.glob("*.txt")):
            text = decode_utf8(f.read_bytes())[0].strip()
            items.append((text.splitlines()[0].strip(), text, topic.name))
    train, test = stratified_split([t for _, _, t in items], 0.2, 0)
    return [items[i] for i in train], [items[i] for i in test]


def pretrain(train: list[tuple[str, str, str]], work: Path, steps: int, seq_len: int) -> tuple[Path, float]:
    from lmforge.config import DataConfig, TrainConfig
    from lmforge.data.shards import prepare_corpus
    from lmforge.recipes.pretrain import PretrainRun, build_trainer
    from lmforge.tokenizers import WordPieceTrainer

    texts = [article for _, article, _ in train]
    tokenizer_dir = work / "tokenizer"
    if not (tokenizer_dir / "vocab.txt").is_file():
        WordPieceTrainer(8000, algorithm="bpe-count").train(texts).save_pretrained(tokenizer_dir, overwrite=True)
    shards = work / "shards"
    if not (shards / "manifest.json").is_file():
        docs = work / "texts"
        docs.mkdir(parents=True, exist_ok=True)
        for i, text in enumerate(texts):
            (docs / f"{i:06d}.txt").write_text(text + "\n", encoding="utf-8")
        prepare_corpus(tokenizer_dir, [docs], shards, input_format="documents", workers=1, overwrite=True,
                       show_progress=False)
    run = PretrainRun(
        preset="gpt-mini", out=str(work / "gpt-mini"), model={"max_seq_len": seq_len, "dropout": 0.1},
        data=DataConfig(path=str(shards), objective="clm", seq_len=seq_len),
        train=TrainConfig(max_steps=steps, batch_size=32, lr=6e-4, beta2=0.95, weight_decay=0.1, schedule="cosine",
                          min_lr_ratio=0.1, warmup_ratio=0.05, eval_every=max(steps // 4, 1), eval_batches=8,
                          log_every=10, save_every=max(steps // 4, 1)))
    start = time.perf_counter()
    trainer = build_trainer(run, resume="auto", progress=True)
    final = trainer.fit()
    seconds = time.perf_counter() - start
    print(f"pretrained gpt-mini: {steps} steps of 32 x {seq_len} in {seconds / 60:.1f} min; held-out "
          + ", ".join(f"{k} {v:.3f}" for k, v in final.items() if k.startswith("eval_") and isinstance(v, float)))
    return Path(run.out), seconds


def balanced(test: list[tuple[str, str, str]], n: int, seed: int) -> list[tuple[str, str, str]]:
    topics = sorted({t for _, _, t in test})
    rng = random.Random(seed)
    out = []
    for topic in topics:
        members = [x for x in test if x[2] == topic]
        out += rng.sample(members, min(n // len(topics), len(members)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a causal LM folder to evaluate instead of pretraining gpt-mini here")
    parser.add_argument("--steps", type=int, default=250, help="pretraining steps of 32 x 256 tokens (default 250)")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--shots", default="0,1,4,16")
    parser.add_argument("--draws", type=int, default=5)
    parser.add_argument("--n-test", type=int, default=250)
    parser.add_argument("--work", default="runs/bench-fewshot", help="pretraining folder (resumed when there)")
    parser.add_argument("--quick", action="store_true", help="20 steps, 2 draws, 50 test titles")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if args.quick:
        args.steps, args.draws, args.n_test, args.work = 20, 2, 50, args.work + "-quick"
    out_json = Path(args.json or RESULTS / f"fewshot-bbc{'-quick' if args.quick else ''}.json")
    argv = sys.argv[1:]
    print(f"Reproduce: `{reproduce_command(__file__, argv)}`")
    print_machine()

    import torch

    from lmforge.persistence import load_pretrained
    from lmforge.prompting import FewShotConfig, fewshot_evaluate

    torch.manual_seed(0)
    train, test = bbc_split()
    seconds = None
    if args.model:
        model_dir = Path(args.model)
    else:
        model_dir, seconds = pretrain(train, Path(args.work), args.steps, args.seq_len)
    loaded = load_pretrained(model_dir)
    shots = tuple(int(k) for k in args.shots.split(","))
    demos = [{"text": title, "label": topic} for title, _, topic in train]
    queries = [{"text": title, "label": topic} for title, _, topic in balanced(test, args.n_test, 0)]
    rows, reports = [], {}
    for scoring, calibrated, name in SCORINGS:
        config = FewShotConfig(template="{text} topic: {label}", separator=" . ", shots=shots, draws=args.draws,
                               seed=0, scoring=scoring, calibrate=calibrated, batch_size=32)
        start = time.perf_counter()
        report = fewshot_evaluate(loaded.model, loaded.tokenizer, demos, queries, config, progress=True)
        took = time.perf_counter() - start
        reports[name] = report.to_dict()
        predictions = reports[name].get("predictions")
        if isinstance(predictions, dict):  # a few per K are enough to read; all of them make a 2 MB file
            reports[name]["predictions"] = {k: v[:5] if isinstance(v, list) else v for k, v in predictions.items()}
        png = out_json.with_name(out_json.stem + f"-{scoring}{'-calibrated' if calibrated else ''}.png")
        report.plot(png, title=f"BBC topics from titles, gpt-mini pretrained here: {name}")
        for row in report.rows:
            rows.append([name, row["shots"], fmt(row["accuracy_mean"], 3), fmt(row["accuracy_std"], 3),
                         row["dropped_demos"], f"{took:.0f}"])
        chance, majority = report.chance, report.majority
    print(f"\n{len(queries)} test titles (balanced), {len(demos)} training titles as the demonstration pool; chance "
          f"{chance:.3f}, majority {majority:.3f}\n")
    table = markdown_table(["scoring", "K", "accuracy (mean)", "std over draws", "demos dropped", "s"], rows)
    print(table)
    result = {"command": reproduce_command(__file__, argv), "machine": machine_description(),
              "model": str(model_dir) if args.model else f"gpt-mini pretrained here, {args.steps} steps",
              "pretrain_seconds": seconds, "n_test": len(queries), "chance": chance, "majority": majority,
              "reports": reports, "table": table}
    out_json.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out_json, json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {out_json.relative_to(ROOT.parent) if out_json.is_relative_to(ROOT.parent) else out_json}")


if __name__ == "__main__":
    main()

"""BBC headline generation: the Transformer encoder-decoder and the attentional RNN under each scoring function.

Every model writes an article's title from its first ``--max-source-len`` word pieces, on the fixed split of
``lmforge.data.seq2seq.headline_split`` (per topic: 85% train, 5% dev, 10% test). Same tokenizer (trained here on
the training articles), epochs, batch, label smoothing 0.1 and decoding (beam 4, GNMT length penalty 0.6) for all;
ROUGE-1/2/L F1 on the test articles with the rouge-score package, and the training time. Two baselines put the
numbers in context: "lead" copies the article's first N words (N = the mean title length of the training
articles, the classic extractive baseline of headline generation), and "first sentence" copies the article's
first sentence.

RNN variants are named SCORE[-local][-localp][-bahdanau]: a scoring function (or "none": no attention, the fixed
context vector of Cho et al. 2014), "-local" local-m and "-localp" local-p attention with window 5, "-bahdanau"
Bahdanau's decoder order (query s_{i-1}, context fed into the RNN).

BART variants (issue 21) fine-tune the ``bart-tiny`` encoder-decoder (2 + 2 layers, d_model 128, as the Transformer
row) with the same recipe: ``bart-scratch`` from random weights, ``bart-MIX`` after ``--pretrain-steps`` steps of
``lmforge pretrain --objective denoise`` on the TRAINING articles only (whole articles, split into sentences, in
``--pretrain-seq-len`` blocks), with one corruption mix: ``mask`` (token masking, 30% of the tokens), ``infill``
(text infilling, 30% of the tokens in Poisson(3) spans), ``infill-permute`` (infilling + sentence permutation,
BART's choice). The pretrained folders are kept and reused by later runs (a finished one is not trained again).

    .venv/bin/python benchmarks/bench_headlines.py [--epochs 20] [--variants transformer,additive,...] [--quick]
    .venv/bin/python benchmarks/bench_headlines.py --variants bart-scratch,bart-mask,bart-infill,bart-infill-permute
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from common import machine_description, markdown_table, print_machine, reproduce_command  # noqa: E402

SCORES = ("additive", "dot", "scaled_dot", "general", "cosine", "location")
VARIANTS = ("transformer", "none", *SCORES, "general-local", "general-localp", "additive-bahdanau")
# the corruption mixes of the BART ablation: DataConfig settings of `lmforge pretrain --objective denoise`
BART_MIXES = {
    "mask": {"token_mask_rate": 0.3, "infill_rate": 0.0, "permute_sentences": 0.0},
    "infill": {"infill_rate": 0.3, "permute_sentences": 0.0},
    "infill-permute": {"infill_rate": 0.3, "permute_sentences": 1.0},
}
BART_VARIANTS = ("bart-scratch", *(f"bart-{mix}" for mix in BART_MIXES))


def pretrain_denoiser(out: Path, mix: str, *, data: Path, tokenizer: Path, steps: int, seq_len: int,
                      threads: int) -> tuple[Path, float]:
    """``lmforge pretrain --objective denoise`` with one corruption mix, in its own process (its time is measured
    there); a finished folder from an earlier run is reused. Returns the folder and its training seconds."""
    import os
    import subprocess

    folder = out / f"pretrain-{mix}"
    done = folder / "model.safetensors"
    if not done.is_file():
        options = [f"--data.{k}={v}" for k, v in BART_MIXES[mix].items()]
        command = [sys.executable, "-m", "lmforge", "-q", "pretrain", "--preset", "bart-tiny", "--objective",
                   "denoise", "--input", str(data), "--tokenizer", str(tokenizer), "--out", str(folder),
                   "--max-steps", str(steps), "--batch-size", "32", "--seq-len", str(seq_len), "--lr", "1e-3",
                   f"--model.max_seq_len={seq_len}", "--train.warmup_ratio=0.05", "--eval-every", str(steps // 4),
                   "--save-every", str(max(steps // 10, 1)), "--resume", "auto", *options]
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        print("pretraining:", " ".join(command[1:]), flush=True)
        subprocess.run(command, check=True, env=env)
    records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines() if line.strip()]
    train = [r for r in records if "elapsed_s" in r]
    evals = [r for r in records if "eval_loss" in r]
    print(f"pretrained {mix}: {train[-1]['step']} steps, {train[-1]['elapsed_s']:.0f} s, eval loss "
          f"{evals[-1]['eval_loss']:.3f}, eval accuracy {evals[-1].get('eval_denoise_accuracy', 0):.3f}", flush=True)
    return folder, float(train[-1]["elapsed_s"])


def prepare_articles(out: Path, examples, train: list[int], tokenizer: Path) -> Path:
    """The training articles (never a dev or test one) as a prepared pretraining folder, one document each."""
    from lmforge.cli import main as lmforge_main

    data = out / "denoise-data"
    if not (data / "manifest.json").is_file():
        texts = out / "train-articles"
        texts.mkdir(parents=True, exist_ok=True)
        for i in train:
            (texts / f"{i:05d}.txt").write_text(examples[i].source + "\n", encoding="utf-8")
        if lmforge_main(["-q", "data", "prepare", "--tokenizer", str(tokenizer), "--input", str(texts), "--out",
                         str(data), "--format", "documents", "--workers", "1", "--overwrite"]) != 0:
            raise SystemExit("preparing the training articles failed")
    return data


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=float, default=20)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--max-source-len", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--variants", default=None, help=f"comma-separated (default: {','.join(VARIANTS)})")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-repeat-ngram", type=int, default=2,
                        help="the test set is decoded twice: plain beam 4, and beam 4 blocking repeated n-grams")
    parser.add_argument("--out", default=str(ROOT / "runs" / "bench-headlines"))
    parser.add_argument("--results", default=None,
                        help="file name under benchmarks/results (default headlines.json, headlines-quick.json)")
    parser.add_argument("--pretrain-steps", type=int, default=1000, help="denoising steps of the bart-MIX variants")
    parser.add_argument("--pretrain-seq-len", type=int, default=128)
    parser.add_argument("--setup-only", action="store_true",
                        help="make the tokenizer and the prepared articles, then stop (before parallel runs)")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: 0.2 epochs (of transformer,general unless --variants says otherwise)")
    args = parser.parse_args()
    if args.quick:
        args.epochs, args.variants = 0.2, args.variants or "transformer,general"
    args.variants = args.variants or ",".join(VARIANTS)

    import torch

    from lmforge.config import TrainConfig
    from lmforge.data.corpora import bbc_news_dir
    from lmforge.data.sentences import split_sentences
    from lmforge.data.seq2seq import bbc_headlines, featurize_pairs, headline_split
    from lmforge.metrics import rouge_scores
    from lmforge.persistence import load_pretrained
    from lmforge.recipes.seq2seq import (
        DecodeConfig,
        Seq2SeqDataConfig,
        Seq2SeqRun,
        build_seq2seq_trainer,
        decode_texts,
        evaluate_test,
    )
    from lmforge.tokenizers import WordPieceTrainer
    from lmforge.utils.log import setup_logging

    setup_logging(quiet=True)
    machine = machine_description()
    print_machine(machine)
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    examples = bbc_headlines(bbc_news_dir())
    train, _, test_idx = headline_split(examples)
    references = [examples[i].target for i in test_idx]
    lead_n = round(sum(len(examples[i].target.split()) for i in train) / len(train))
    baselines = {f"lead-{lead_n} (baseline)": [" ".join(examples[i].source.split()[:lead_n]) for i in test_idx],
                 "first sentence (baseline)": [(split_sentences(examples[i].source) or [""])[0] for i in test_idx]}
    rows = []
    for name, predictions in baselines.items():
        row = {"variant": name, "params": 0, "train_seconds": 0.0, "decode_seconds": 0.0, "steps": 0,
               **{k: round(v, 2) for k, v in rouge_scores(predictions, references).items()}}
        rows.append(row)
        print(json.dumps(row), flush=True)
    tokenizer_dir = out / "tokenizer"
    if not (tokenizer_dir / "vocab.txt").is_file():
        texts = [examples[i].source + "\n" + examples[i].target for i in train]
        WordPieceTrainer(8000, algorithm="bpe-count").train(texts).save_pretrained(tokenizer_dir, overwrite=True)
    if any(v.startswith("bart-") for v in args.variants.split(",")) or args.setup_only:
        articles = prepare_articles(out, examples, train, tokenizer_dir)
    if args.setup_only:
        return 0
    d = args.d_model
    for variant in args.variants.split(","):
        init, pretrain_s, pretrain_steps = None, 0.0, 0
        if variant in BART_VARIANTS:
            mix = variant.removeprefix("bart-")
            preset, model = "bart-tiny", {"max_seq_len": max(128, args.pretrain_seq_len), "dropout": 0.1}
            lr, schedule = 1e-3, {"schedule": "inverse_sqrt", "warmup_steps": 100}
            if mix != "scratch":
                init, pretrain_s = pretrain_denoiser(out, mix, data=articles, tokenizer=tokenizer_dir,
                                                     steps=args.pretrain_steps, seq_len=args.pretrain_seq_len,
                                                     threads=args.threads)
                init, model, pretrain_steps = str(init), {"dropout": 0.1}, args.pretrain_steps
        elif variant.startswith("bart-"):
            parser.error(f"unknown variant {variant!r}: the BART variants are {', '.join(BART_VARIANTS)}")
        elif variant == "transformer":
            preset, model = "transformer-base", {"d_model": d, "n_heads": 4, "n_layers": 2, "n_decoder_layers": 2,
                                                 "d_ff": 4 * d, "max_seq_len": 128, "dropout": 0.1}
            lr, schedule = 1e-3, {"schedule": "inverse_sqrt", "warmup_steps": 100}
        else:
            score, *options = variant.split("-")
            unknown = set(options) - {"local", "localp", "bahdanau"}
            if score not in (*SCORES, "none") or unknown:
                parser.error(f"unknown variant {variant!r}: SCORE[-local][-localp][-bahdanau], SCORE one of "
                             f"{', '.join(SCORES)}, none")
            preset, model = "rnn-seq2seq", {"d_model": d, "attention": score, "dropout": 0.1,
                                            "attention_window": 5 if {"local", "localp"} & set(options) else None,
                                            "attention_alignment": "predictive" if "localp" in options else "monotonic",
                                            "decoder_order": "bahdanau" if "bahdanau" in options else "luong"}
            lr, schedule = 2e-3, {"schedule": "linear", "warmup_steps": 50}
        run = Seq2SeqRun(preset=preset, model=model, tokenizer=str(tokenizer_dir), out=str(out / variant),
                         init=init or "",
                         epochs=args.epochs, data=Seq2SeqDataConfig(train="bbc-headlines",
                                                                    max_source_len=args.max_source_len,
                                                                    max_target_len=24, max_dev_examples=50),
                         decode=DecodeConfig(strategy="beam", beams=4, length_penalty="gnmt:0.6", max_new_tokens=24),
                         train=TrainConfig(lr=lr, batch_size=args.batch_size, beta2=0.98, eps=1e-9, weight_decay=0.0,
                                           log_every=20, **schedule))
        start = time.perf_counter()
        trainer, tokenizer, test = build_seq2seq_trainer(run, overwrite=True, progress=False)
        trainer.fit()
        train_s = time.perf_counter() - start
        trainer.model = load_pretrained(run.out).model
        start = time.perf_counter()
        scores = evaluate_test(run, trainer, tokenizer, test)
        decode_s = time.perf_counter() - start
        blocked = {}
        if args.no_repeat_ngram:
            features, _, _ = featurize_pairs(test, tokenizer, max_source_len=run.data.max_source_len,
                                             max_target_len=run.data.max_target_len)
            decode = dataclasses.replace(run.decode, no_repeat_ngram=args.no_repeat_ngram)
            predictions = decode_texts(trainer.model.eval(), tokenizer, features, decode)
            blocked_scores = rouge_scores(predictions, [e.target for e in test])
            blocked = {f"{k}_no_repeat": round(v, 2) for k, v in blocked_scores.items()}
        params = sum(p.numel() for p in trainer.model.parameters())
        row = {"variant": variant, "params": params, "train_seconds": train_s, "decode_seconds": decode_s,
               "steps": trainer.step, "pretrain_steps": pretrain_steps, "pretrain_seconds": pretrain_s,
               **{k: round(v, 2) for k, v in scores.items()}, **blocked}
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(f"\n{len(train)} training articles, {len(references)} test articles; {args.epochs:g} epochs, beam 4, "
          "GNMT length penalty 0.6\n")
    n = args.no_repeat_ngram
    table = [[r["variant"], f"{r['params'] / 1e6:.2f}M" if r["params"] else "-",
              *(f"{r[k]:.2f}" for k in ("rouge1", "rouge2", "rougeL")),
              *(f"{r[k + '_no_repeat']:.2f}" if k + "_no_repeat" in r else "-" for k in ("rouge1", "rouge2", "rougeL")),
              f"{r['pretrain_steps']} steps, {r['pretrain_seconds']:.0f} s" if r.get("pretrain_steps") else "-",
              r["steps"] or "-", f"{r['train_seconds']:.0f}" if r["params"] else "-",
              f"{r['decode_seconds']:.0f}" if r["params"] else "-"]
             for r in rows]
    print(markdown_table(["model", "params", "R-1", "R-2", "R-L", f"R-1 (no rep. {n})", f"R-2 (no rep. {n})",
                          f"R-L (no rep. {n})", "denoising pretraining", "steps", "train s", "test decode s"], table,
                         "llrrrrrrlrrr"))
    results = ROOT / "benchmarks" / "results"
    results.mkdir(exist_ok=True)
    name = args.results or ("headlines-quick.json" if args.quick else "headlines.json")
    (results / name).write_text(json.dumps({"command": reproduce_command(__file__, sys.argv[1:]), "machine": machine,
                                            "epochs": args.epochs, "test_articles": len(references),
                                            "rows": rows}, indent=2) + "\n")
    print(f"\ncommand: {reproduce_command(__file__, sys.argv[1:])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

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

    .venv/bin/python benchmarks/bench_headlines.py [--epochs 20] [--variants transformer,additive,...] [--quick]
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
    from lmforge.models.pretrained import load_pretrained
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
    d = args.d_model
    for variant in args.variants.split(","):
        if variant == "transformer":
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
               "steps": trainer.step, **{k: round(v, 2) for k, v in scores.items()}, **blocked}
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(f"\n{len(train)} training articles, {len(references)} test articles; {args.epochs:g} epochs, beam 4, "
          "GNMT length penalty 0.6\n")
    n = args.no_repeat_ngram
    table = [[r["variant"], f"{r['params'] / 1e6:.2f}M" if r["params"] else "-",
              *(f"{r[k]:.2f}" for k in ("rouge1", "rouge2", "rougeL")),
              *(f"{r[k + '_no_repeat']:.2f}" if k + "_no_repeat" in r else "-" for k in ("rouge1", "rouge2", "rougeL")),
              r["steps"] or "-", f"{r['train_seconds']:.0f}" if r["params"] else "-",
              f"{r['decode_seconds']:.0f}" if r["params"] else "-"]
             for r in rows]
    print(markdown_table(["model", "params", "R-1", "R-2", "R-L", f"R-1 (no rep. {n})", f"R-2 (no rep. {n})",
                          f"R-L (no rep. {n})", "steps", "train s", "test decode s"], table, "llrrrrrrrrr"))
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

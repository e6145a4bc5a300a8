"""Toy fine-tuning data for every task and a tiny encoder folder, shared by the task, CLI and pipeline tests.

Each dataset is learnable from one keyword, so a tiny model reaches a perfect dev score in a few dozen steps.
"""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

NAMES = ["alice", "bob", "carol", "dave", "erin", "frank"]
CITIES = ["paris", "rome", "oslo", "lima", "cairo", "delhi"]
FILLER = ["the", "a", "today", "went", "to", "saw", "with", "and", "in", "later", "met", "visited"]
GOOD, BAD = ["great", "lovely", "superb"], ["awful", "boring", "dreadful"]


def vocab() -> list[str]:
    words = NAMES + CITIES + FILLER + GOOD + BAD + ["capital", "of", "is", "what", "who", "lives", "?", ".",
                                                   "country", "north", "south", "same", "different"]
    pieces = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *dict.fromkeys(words)]
    pieces += [f"##{c}" for c in "abcdefghijklmnopqrstuvwxyz"] + list("abcdefghijklmnopqrstuvwxyz")
    return list(dict.fromkeys(pieces))


def make_encoder_dir(path: Path, *, seed: int = 0, **overrides: object) -> Path:
    """A randomly initialised tiny encoder with its tokenizer, saved as an lmforge model folder; ``overrides`` change
    its ModelConfig (e.g. ALBERT's ``embedding_size`` and ``share_layers``)."""
    import torch

    from lmforge.config import ModelConfig
    from lmforge.models import Encoder
    from lmforge.persistence import save_pretrained
    from lmforge.tokenizers import WordPieceTokenizer

    tokenizer = WordPieceTokenizer(vocab())
    torch.manual_seed(seed)
    config = ModelConfig(**{**dict(vocab_size=tokenizer.vocab_size, d_model=24, n_heads=2, n_layers=2, d_ff=48,
                                    max_seq_len=64, dropout=0.0, attention_dropout=0.0), **overrides})
    save_pretrained(Encoder(config), path, tokenizer=tokenizer)
    return path


def _sentence(rng: random.Random, words: list[str]) -> list[str]:
    out = []
    for w in words:
        out += rng.sample(FILLER, rng.randint(0, 2)) + [w]
    return out + rng.sample(FILLER, rng.randint(0, 2))


def write_sequence(path: Path, n: int, seed: int, *, fmt: str = "csv") -> Path:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        label = "pos" if i % 2 == 0 else "neg"
        word = rng.choice(GOOD if label == "pos" else BAD)
        rows.append({"text": " ".join(_sentence(rng, [rng.choice(NAMES), word])), "label": label})
    if fmt == "csv":
        with path.open("w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, ["text", "label"])
            writer.writeheader()
            writer.writerows(rows)
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def write_pair(path: Path, n: int, seed: int) -> Path:
    rng = random.Random(seed)
    with path.open("w", encoding="utf-8") as f:
        for i in range(n):
            a = rng.choice(CITIES)
            b = a if i % 2 == 0 else rng.choice([c for c in CITIES if c != a])
            f.write(json.dumps({"text": " ".join(_sentence(rng, [a])), "text_pair": " ".join(_sentence(rng, [b])),
                                "label": "same" if a == b else "different"}) + "\n")
    return path


def tagged_sentences(n: int, seed: int) -> list[tuple[list[str], list[str]]]:
    """Sentences with PER (one or two words) and LOC entities, BIO tags."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words, tags = [], []
        for kind in rng.sample(["PER", "PER2", "LOC"], 2):
            lead = rng.sample(FILLER, rng.randint(1, 2))
            words += lead
            tags += ["O"] * len(lead)
            if kind == "LOC":
                words.append(rng.choice(CITIES))
                tags.append("B-LOC")
            else:
                names = rng.sample(NAMES, 2 if kind == "PER2" else 1)
                words += names
                tags += ["B-PER"] + ["I-PER"] * (len(names) - 1)
        out.append((words, tags))
    return out


def write_conll(path: Path, n: int, seed: int) -> Path:
    with path.open("w", encoding="utf-8") as f:
        for words, tags in tagged_sentences(n, seed):
            f.writelines(f"{w}\t{t}\n" for w, t in zip(words, tags, strict=True))
            f.write("\n")
    return path


def write_spans(path: Path, n: int, seed: int) -> Path:
    from lmforge.data.schemes import tags_to_spans

    with path.open("w", encoding="utf-8") as f:
        for words, tags in tagged_sentences(n, seed):
            spans = [{"start": s, "end": e, "label": k} for s, e, k in tags_to_spans(tags, "BIO")]
            f.write(json.dumps({"tokens": words, "spans": spans}) + "\n")
    return path


def write_squad(path: Path, n: int, seed: int) -> Path:
    rng = random.Random(seed)
    paragraphs = []
    for i in range(n):
        people = rng.sample(NAMES, 3)
        cities = rng.sample(CITIES, 3)
        context = " ".join(f"{p} lives in {c} ." for p, c in zip(people, cities, strict=True))
        k = rng.randrange(3)
        start = context.index(f"{people[k]} lives in {cities[k]}") + len(f"{people[k]} lives in ")
        paragraphs.append({"context": context, "qas": [{"id": f"q{i}", "question": f"where lives {people[k]} ?",
                                                        "answers": [{"text": cities[k], "answer_start": start}]}]})
    path.write_text(json.dumps({"version": "1.1", "data": [{"title": "toy", "paragraphs": paragraphs}]}),
                    encoding="utf-8")
    return path


def write_choice(path: Path, n: int, seed: int) -> Path:
    """Multiple choice: the context names a person's city; the right option is that city (2 to 4 options)."""
    rng = random.Random(seed)
    with path.open("w", encoding="utf-8") as f:
        for _ in range(n):
            person, *cities = rng.sample(NAMES, 1) + rng.sample(CITIES, rng.randint(2, 4))
            right = rng.randrange(len(cities))
            context = " ".join(_sentence(rng, [person, "lives", "in", cities[right]]))
            f.write(json.dumps({"text": context, "choices": [f"{person} is in {c}" for c in cities],
                                "label": right}) + "\n")
    return path


def make_decoder_dir(path: Path, *, seed: int = 0, **overrides: object) -> Path:
    """A randomly initialised tiny GPT with the toy tokenizer, saved as an lmforge model folder."""
    import torch

    from lmforge.config import ModelConfig
    from lmforge.models import Decoder
    from lmforge.persistence import save_pretrained
    from lmforge.tokenizers import WordPieceTokenizer

    tokenizer = WordPieceTokenizer(vocab())
    torch.manual_seed(seed)
    config = ModelConfig(**{**dict(arch="decoder", vocab_size=tokenizer.vocab_size, d_model=24, n_heads=2,
                                   n_layers=2, d_ff=48, max_seq_len=64, dropout=0.0, attention_dropout=0.0,
                                   norm_first=True), **overrides})
    save_pretrained(Decoder(config), path, tokenizer=tokenizer)
    return path


WRITERS = {"sequence": write_sequence, "pair": write_pair, "token": write_conll, "span": write_spans,
           "qa": write_squad, "choice": write_choice}
SUFFIX = {"sequence": ".csv", "pair": ".jsonl", "token": ".conll", "span": ".jsonl", "qa": ".json",
          "choice": ".jsonl"}


def write_task_data(folder: Path, task: str, n_train: int = 48, n_dev: int = 16) -> tuple[Path, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    write = WRITERS[task]
    train = write(folder / f"{task}-train{SUFFIX[task]}", n_train, 1)
    dev = write(folder / f"{task}-dev{SUFFIX[task]}", n_dev, 2)
    return train, dev

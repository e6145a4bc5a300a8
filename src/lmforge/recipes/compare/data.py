"""The comparison's data: the labelled texts, their one fixed split, and the class-balanced training subsets.

Every run reads CSV files (``text,label``) under ``<out>/data``: ``test.csv`` (the test split, or its class-balanced
``max_test``), ``dev.csv`` with ``dev_fraction`` (carved from the training split before anything trains on it) and
``train-<size>-<seed>.csv`` (``size`` examples per class drawn with ``seed`` from the rest; 0 = all).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import random
from dataclasses import dataclass
from pathlib import Path

from lmforge.errors import LmforgeError
from lmforge.recipes.compare.config import CompareConfig


def load_labelled(config: CompareConfig, path: str | None = None) -> list[tuple[str, str]]:
    """(text, label) pairs: the BBC topics, or a CSV/TSV/JSONL file (``path``, default ``config.data``)."""
    if path is None and config.data == "bbc":
        from lmforge.data.corpora import bbc_news_dir
        from lmforge.data.text import decode_utf8

        root = bbc_news_dir()
        return [(decode_utf8(f.read_bytes())[0].strip(), topic.name)
                for topic in sorted(p for p in root.iterdir() if p.is_dir()) for f in sorted(topic.glob("*.txt"))]
    from lmforge.data.readers import read_classification

    path = config.data if path is None else path
    data = read_classification(path, text_column=config.text_column, label_column=config.label_column,
                               pair=False)
    if data.kind != "classification":
        raise LmforgeError(f"{path}: compare needs class labels, not numbers")
    return [(e.text, str(e.label)) for e in data.examples]


def subset(train: list[int], labels: list[str], per_class: int, seed: int) -> list[int]:
    """``per_class`` random training examples of every class (all of them for 0 or when a class has fewer)."""
    if per_class == 0:
        return list(train)
    rng = random.Random(seed)
    chosen = []
    for label in sorted(set(labels[i] for i in train)):
        members = [i for i in train if labels[i] == label]
        chosen += rng.sample(members, min(per_class, len(members)))
    return sorted(chosen)


def write_csv(path: Path, rows: list[tuple[str, str]]) -> None:
    """Atomically (a run that reads the file, in this process or another one, never sees it half written)."""
    from lmforge.utils.io import atomic_write_text

    buffer = io.StringIO(newline="")
    writer = csv.writer(buffer)
    writer.writerow(["text", "label"])
    writer.writerows(rows)
    atomic_write_text(path, buffer.getvalue())


@dataclass
class Split:
    """The labelled pairs, split once: indices of the training and test examples, and the test file written."""

    pairs: list[tuple[str, str]]
    labels: list[str]
    train: list[int]
    test: list[int]
    test_file: Path
    dev: list[int] = dataclasses.field(default_factory=list)
    dev_file: Path | None = None  # with dev_fraction: the settings of a grid are chosen on it

    @property
    def train_texts(self) -> list[str]:
        """The training texts: the only ones the tokenizer, the static vectors and the pretraining see."""
        return [self.pairs[i][0] for i in self.train]

    @property
    def n_classes(self) -> int:
        return len(set(self.labels))

    def train_file(self, per_class: int, seed: int) -> tuple[Path, int]:
        """The training file of one subset (written when missing) and its number of examples."""
        chosen = subset(self.train, self.labels, per_class, seed)
        path = self.test_file.parent / f"train-{per_class}-{seed}.csv"
        if not path.exists():
            write_csv(path, [self.pairs[i] for i in chosen])
        return path, len(chosen)


def split_data(config: CompareConfig, data_dir: Path) -> Split:
    """Load the labelled texts, split them (stratified by label, ``split_seed``) and write ``data_dir/test.csv``;
    with ``dev_fraction``, carve the dev split from the training split the same way and write ``dev.csv``."""
    from lmforge.data.readers import stratified_split

    pairs = load_labelled(config)
    if config.test_data:  # a test set of its own: every example of data trains (or is dev)
        train_idx = list(range(len(pairs)))
        test_pairs = load_labelled(config, config.test_data)
        unseen = sorted({label for _, label in test_pairs} - {label for _, label in pairs})
        if unseen:
            raise LmforgeError(f"test_data {config.test_data}: label(s) {', '.join(unseen)} never occur in the "
                               f"training data {config.data}")
        test_idx = list(range(len(pairs), len(pairs) + len(test_pairs)))
        pairs = pairs + test_pairs
    labels = [label for _, label in pairs]
    if not config.test_data:
        train_idx, test_idx = stratified_split(labels, config.test_fraction, config.split_seed)
    n_classes = len(set(labels))
    if config.max_test and len(test_idx) > config.max_test:  # a smaller, still class-balanced test set (the demo)
        test_idx = subset(test_idx, labels, max(1, config.max_test // n_classes), config.split_seed)
    dev_idx: list[int] = []
    if config.dev_fraction:
        keep, dev = stratified_split([labels[i] for i in train_idx], config.dev_fraction, config.split_seed)
        dev_idx, train_idx = [train_idx[i] for i in dev], [train_idx[i] for i in keep]
        if config.max_dev and len(dev_idx) > config.max_dev:
            capped = subset(dev_idx, labels, max(1, config.max_dev // n_classes), config.split_seed)
            train_idx = sorted(train_idx + sorted(set(dev_idx) - set(capped)))  # the rest goes back to training
            dev_idx = capped
    data_dir.mkdir(exist_ok=True)
    test_file = data_dir / "test.csv"
    write_csv(test_file, [pairs[i] for i in test_idx])
    dev_file = None
    if dev_idx:
        dev_file = data_dir / "dev.csv"
        write_csv(dev_file, [pairs[i] for i in dev_idx])
    return Split(pairs, labels, train_idx, test_idx, test_file, dev_idx, dev_file)

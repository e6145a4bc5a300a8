"""Fixtures for the data tests: a tiny WordPiece tokenizer trained on synthetic text, and small prepared corpora."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from lmforge.data.shards import ShardedCorpus, prepare_corpus
from lmforge.tokenizers import WordPieceTokenizer, WordPieceTrainer

SYLLABLES = ["ka", "lo", "mi", "ne", "su", "ta", "ri", "po", "ve", "du"]


def make_words(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    words = set()
    while len(words) < n:
        words.add("".join(rng.choice(SYLLABLES, size=rng.integers(1, 5))))
    return sorted(words)


WORDS = make_words(80)


def synthetic_documents(n_docs: int, seed: int, sentences: tuple[int, int] = (2, 9),
                        words: tuple[int, int] = (3, 14)) -> list[list[str]]:
    """Documents of capitalised sentences of random syllable words, each ending with a period."""
    rng = np.random.default_rng(seed)
    docs = []
    for _ in range(n_docs):
        doc = []
        for _ in range(rng.integers(*sentences)):
            sentence = " ".join(rng.choice(WORDS, size=rng.integers(*words)))
            doc.append(sentence[0].upper() + sentence[1:] + ".")
        docs.append(doc)
    return docs


def write_lines_file(path: Path, docs: list[list[str]]) -> Path:
    """BERT's format: one sentence per line, a blank line between documents."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n\n".join("\n".join(doc) for doc in docs) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory) -> Path:
    texts = [" ".join(doc) for doc in synthetic_documents(60, seed=123)]
    # A small vocabulary keeps many words in several pieces (for whole-word and span masking).
    tok = WordPieceTrainer(90, min_frequency=1).train(texts)
    folder = tmp_path_factory.mktemp("tokenizer")
    tok.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tokenizer(tokenizer_dir) -> WordPieceTokenizer:
    return WordPieceTokenizer.from_pretrained(tokenizer_dir)


@pytest.fixture(scope="session")
def corpus_docs() -> list[list[str]]:
    return synthetic_documents(24, seed=7)


@pytest.fixture(scope="session")
def corpus(tmp_path_factory, tokenizer_dir, corpus_docs) -> ShardedCorpus:
    """24 documents in two lines-format files, prepared in one process into shards of ~600 tokens."""
    root = tmp_path_factory.mktemp("corpus")
    write_lines_file(root / "text" / "a.txt", corpus_docs[:10])
    write_lines_file(root / "text" / "b.txt", corpus_docs[10:])
    prepare_corpus(tokenizer_dir, [root / "text"], root / "prepared", workers=1, shard_size_tokens=600,
                   show_progress=False)
    return ShardedCorpus(root / "prepared", tokenizer_dir)

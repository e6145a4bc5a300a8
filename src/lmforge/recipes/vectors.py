"""The static-vectors recipe: Word2Vec (Mikolov et al. 2013) or GloVe (Pennington et al. 2014) over an encoded
corpus, saved in the word2vec format with the per-epoch metrics beside it (``vectors.txt`` ->
``vectors.metrics.jsonl``). ``lmforge word2vec train`` / ``glove train`` and the comparison use it."""

from __future__ import annotations

import json
import logging
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmforge.embeddings.io import save_word2vec
from lmforge.utils.io import atomic_write_text

if TYPE_CHECKING:  # the trainers import torch; the command line imports this module for its help
    from lmforge.embeddings.glove import GloVeConfig
    from lmforge.embeddings.word2vec import Word2VecConfig

log = logging.getLogger("lmforge")


def metrics_path(out: str | Path) -> Path:
    """Where the per-epoch metrics go: ``vectors.txt`` -> ``vectors.metrics.jsonl``."""
    return Path(out).with_suffix(".metrics.jsonl")


def method_name(config: Word2VecConfig | GloVeConfig) -> str:
    from lmforge.embeddings.word2vec import Word2VecConfig

    return f"word2vec-{config.architecture}" if isinstance(config, Word2VecConfig) else "glove"


def train_vectors(config: Word2VecConfig | GloVeConfig, corpus: Any, *, out: str | Path | None = None,
                  binary: bool = False, file_format: str = "word2vec", metrics: bool = True,
                  progress: bool = True) -> tuple[Any, Any]:
    """Build the vocabulary (words with ``config.min_count`` or more), train, and save when ``out`` is given.

    Args:
        config: a ``Word2VecConfig`` or a ``GloVeConfig``: which method, and its settings.
        corpus: an ``EncodedCorpus`` (``lmforge.embeddings.vocab``: from files or from split sentences).
        out: the vectors file (word2vec text format, binary with ``binary``, or GloVe's headerless text with
            ``file_format="glove"``); ``metrics`` adds the per-epoch records beside it.

    Returns:
        (the training result, with ``vectors`` and ``epochs``; the vocabulary).
    """
    from lmforge.embeddings.glove import train_glove
    from lmforge.embeddings.word2vec import Word2VecConfig, train_word2vec

    vocab = corpus.build_vocabulary(config.min_count)
    log.info("vocabulary: %s words with count >= %d (%s of %s corpus words)", f"{len(vocab):,}", config.min_count,
             f"{vocab.kept_words:,}", f"{vocab.total_words:,}")
    records: list[dict[str, Any]] = []
    name = method_name(config)

    def on_epoch(e: Any) -> None:
        if isinstance(config, Word2VecConfig):
            log.info("epoch %d/%d: loss %.4f (mean per %s), %s pairs, lr %.5f, %.1f s", e.epoch, config.epochs,
                     e.loss, "pair" if config.architecture == "skipgram" else "centre word", f"{e.pairs:,}",
                     e.lr_end, e.seconds)
        else:
            log.info("epoch %d/%d: loss %.5f (weighted squared error per entry), %.1f s", e.epoch, config.epochs,
                     e.loss, e.seconds)
        records.append({"method": name, **asdict(e)})

    train = train_word2vec if isinstance(config, Word2VecConfig) else train_glove
    result = train(corpus, vocab, config, progress=progress, on_epoch=on_epoch)
    if out is not None:
        save_word2vec(result.vectors, out, binary=binary, format=file_format)
        if metrics:
            atomic_write_text(metrics_path(out), "".join(json.dumps(r) + "\n" for r in records))
    return result, vocab

"""Embeddings: contextual vectors from any lmforge or BERT model (``contextual``), static Word2Vec (``word2vec``)
and GloVe (``glove``) vectors, their word2vec-format files (``io``) and look-ups and evaluations (``vectors``).

Submodules are imported on first use, so ``import lmforge.embeddings`` stays light.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "COMBINES": "contextual", "POOLINGS": "contextual", "embed_texts": "contextual", "parse_layers": "contextual",
    "embed_words": "contextual", "WordVectors": "contextual", "WORD_POOLINGS": "contextual",
    "KeyedVectors": "vectors", "load_word2vec": "io", "save_word2vec": "io", "Vocabulary": "vocab",
    "EncodedCorpus": "vocab", "encode_corpus": "vocab", "SkipGram": "word2vec", "CBOW": "word2vec",
    "Word2VecConfig": "word2vec", "train_word2vec": "word2vec", "GloVe": "glove", "GloVeConfig": "glove",
    "cooccurrence_matrix": "glove", "train_glove": "glove",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(f"lmforge.embeddings.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'lmforge.embeddings' has no attribute {name!r}")


__all__ = list(_WHERE)

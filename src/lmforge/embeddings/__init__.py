"""Embeddings: contextual vectors from any lmforge or BERT model (static Word2Vec/GloVe come later)."""

from lmforge.embeddings.contextual import COMBINES, POOLINGS, embed_texts, parse_layers

__all__ = ["COMBINES", "POOLINGS", "embed_texts", "parse_layers"]

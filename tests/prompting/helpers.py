"""Tiny models, a whole-word WordPiece tokenizer and toy sentiment examples for the prompting tests."""

from __future__ import annotations

import torch
from torch import nn

from lmforge.config import ModelConfig
from lmforge.models.decoder import Decoder
from lmforge.prompting import Example
from lmforge.tokenizers import WordPieceTokenizer

# Whole words only (no ## pieces, no letters): every generated token decodes to one word.
WORDS = ["review", "sentiment", "answer", ":", ".", "/", "the", "a", "was", "movie", "film", "plot", "acting",
         "great", "good", "fine", "bad", "dull", "awful", "positive", "negative", "neutral", "yes", "no", "n",
         "zzunique", "and", "very", "not", "so"]
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]

TEMPLATE = "Review: {text}\nSentiment: {label}"
VERBALIZER = {"pos": "positive", "neg": "negative"}

TRAIN = [Example("great movie", None, "pos"), Example("dull plot", None, "neg"),
         Example("good acting", None, "pos"), Example("awful film", None, "neg"),
         Example("very good plot", None, "pos"), Example("so bad", None, "neg"),
         Example("fine film", None, "pos"), Example("not good", None, "neg")]
TEST = [Example("the movie was great", None, "pos"), Example("the plot was dull", None, "neg"),
        Example("a good film", None, "pos"), Example("bad acting", None, "neg"), Example("the film", None, "pos")]


def tokenizer() -> WordPieceTokenizer:
    return WordPieceTokenizer(SPECIAL + WORDS)


def _randomise(model: nn.Module, seed: int) -> nn.Module:
    # Large weights give peaked, varied distributions, so comparisons of scores are not ties.
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=p.dtype)
            p.copy_(1.0 + 0.1 * noise if "norm" in name and name.endswith("weight") else 0.4 * noise)
    return model


def decoder(seed: int = 0, max_seq_len: int = 96, dtype: torch.dtype = torch.float64) -> Decoder:
    config = ModelConfig(arch="decoder", vocab_size=len(SPECIAL) + len(WORDS), d_model=12, n_heads=3, n_layers=2,
                         d_ff=37, max_seq_len=max_seq_len, norm_first=True, dropout=0.0,
                         attention_dropout=0.0)
    return _randomise(Decoder(config).to(dtype).eval(), seed)


def log_likelihood(model: Decoder, context: list[int], answer: list[int]) -> float:
    """The oracle: one plain forward pass over context + answer, no padding, log_softmax, sum of the answer's
    tokens."""
    ids = torch.tensor([context + answer])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0].double(), dim=-1)  # (T, V)
    return sum(float(logp[len(context) + j - 1, tok]) for j, tok in enumerate(answer))

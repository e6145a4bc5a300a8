"""Tests of lmforge.viz and ``lmforge viz``. The tiny models shared by the test files are built here."""

from __future__ import annotations

from pathlib import Path

import torch

from lmforge.config import ModelConfig
from lmforge.tokenizers import WordPieceTokenizer
from tests.toy_tasks import vocab

TEXT = "alice went to paris"
PAIR = "bob saw rome later"


def tiny_tokenizer() -> WordPieceTokenizer:
    return WordPieceTokenizer(vocab())


def tiny_config(arch: str = "encoder", **changes) -> ModelConfig:
    """d_model 12, 2 layers, 2 heads, d_ff 37, no dropout, the math kernel."""
    options = dict(arch=arch, vocab_size=len(vocab()), d_model=12, n_heads=2, n_layers=2, d_ff=37, max_seq_len=64,
                   dropout=0.0, attention_dropout=0.0, kernel="math")
    if arch == "seq2seq":
        options.update(positional="sinusoidal", scale_embeddings=True, n_decoder_layers=3)
    if arch in ("rnn_seq2seq", "rnn"):
        options.update(n_layers=1)
    options.update(changes)
    return ModelConfig(**options)


def tiny_model(arch: str = "encoder", seed: int = 0, **changes) -> torch.nn.Module:
    from lmforge.models import ARCHITECTURES

    torch.manual_seed(seed)
    return ARCHITECTURES[arch](tiny_config(arch, **changes)).eval()


def save_tiny_model(path: Path, arch: str = "encoder", seed: int = 0) -> Path:
    from lmforge.persistence import save_pretrained

    save_pretrained(tiny_model(arch, seed), path, tokenizer=tiny_tokenizer())
    return path

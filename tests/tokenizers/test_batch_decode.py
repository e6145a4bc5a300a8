"""``batch_decode``: Hugging Face's name for decoding a batch of id sequences (issue 23: lmforge had only
``decode``), on both tokenizers, from lists, padded tensors and arrays."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lmforge.errors import LmforgeError
from lmforge.tokenizers import WordPieceTokenizer
from lmforge.tokenizers.bytebpe import BYTE_TO_CHAR, ByteLevelBPETokenizer

TEXTS = ["alice lives in paris", "bob", "un ##known words stay"]


@pytest.fixture
def wordpiece() -> WordPieceTokenizer:
    return WordPieceTokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "alice", "lives", "in", "paris", "bob",
                               "words", "stay", "un", "##known", "#"])


def test_wordpiece_batch_decode_of_a_padded_tensor_equals_decode_per_text(wordpiece):
    batch = wordpiece(TEXTS, padding=True, return_tensors="pt")
    assert isinstance(batch["input_ids"], torch.Tensor) and batch["input_ids"].shape[0] == 3
    decoded = wordpiece.batch_decode(batch["input_ids"])
    assert decoded == [wordpiece.decode(wordpiece(t)["input_ids"]) for t in TEXTS]
    assert decoded[1] == "bob"  # padding and [CLS]/[SEP] are special tokens: skipped
    with_specials = wordpiece.batch_decode(batch["input_ids"], skip_special_tokens=False)
    assert with_specials[1].startswith("[CLS] bob [SEP] [PAD]")
    assert wordpiece.batch_decode(np.asarray(batch["input_ids"])) == decoded
    assert wordpiece.batch_decode([row.tolist() for row in batch["input_ids"]]) == decoded


def test_bytebpe_batch_decode_inverts_encoding():
    small = ByteLevelBPETokenizer({c: i for i, c in enumerate(BYTE_TO_CHAR)}, [], eos_token=None)
    texts = ["hé là", "😀 ok", ""]
    assert small.batch_decode([small.encode_ids(t) for t in texts]) == texts


def test_batch_decode_of_one_sequence_points_to_decode(wordpiece):
    with pytest.raises(LmforgeError, match="use decode"):
        wordpiece.batch_decode([5, 6, 7])
    with pytest.raises(LmforgeError, match="use decode"):
        wordpiece.batch_decode(torch.tensor([5, 6, 7]))

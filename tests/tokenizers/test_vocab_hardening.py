"""A broken vocab.txt or tokenizer_config.json is one clear line naming the file (issue 14)."""

from __future__ import annotations

import json

import pytest

from lmforge.errors import InputFileError
from lmforge.tokenizers import WordPieceTokenizer

TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b"]


@pytest.fixture()
def folder(tmp_path):
    WordPieceTokenizer(TOKENS).save_pretrained(tmp_path / "tok")
    return tmp_path / "tok"


def fails(path, match: str, file: str) -> None:
    with pytest.raises(InputFileError, match=match) as err:
        WordPieceTokenizer.from_pretrained(path)
    assert "\n" not in str(err.value) and file in str(err.value)


def test_binary_vocab_names_the_file_and_line(folder):
    (folder / "vocab.txt").write_bytes(b"[PAD]\n[UNK]\nok\n\xff\xfe\x00bad\n")
    fails(folder, "vocab.txt:4: not valid UTF-8", str(folder / "vocab.txt"))
    fails(folder / "vocab.txt", "vocab.txt:4: not valid UTF-8", str(folder / "vocab.txt"))
    (folder / "vocab.txt").write_bytes(bytes(range(256)))
    fails(folder, "vocab.txt:2: not valid UTF-8", str(folder / "vocab.txt"))


def test_binary_vocab_in_a_model_folder(tmp_path):
    from lmforge.config import ModelConfig
    from lmforge.models import ARCHITECTURES
    from lmforge.persistence import load_pretrained, save_pretrained

    model = ARCHITECTURES["encoder"](ModelConfig(vocab_size=7, d_model=8, n_heads=2, n_layers=1, max_seq_len=8))
    save_pretrained(model, tmp_path / "m", tokenizer=WordPieceTokenizer(TOKENS))
    (tmp_path / "m" / "vocab.txt").write_bytes(b"\x80" * 100)
    with pytest.raises(InputFileError, match="vocab.txt:1: not valid UTF-8"):
        load_pretrained(tmp_path / "m")


@pytest.mark.parametrize(("content", "match"), [
    (bytes(range(256)), "not UTF-8 text"),
    (b"{", "not valid JSON"),
    (b"[" * 100_000, "not valid JSON"),
    (b"[1, 2]", "not a JSON object"),
    (b'"x"', "not a JSON object"),
    (b'{"lmforge": [1]}', '"lmforge" must be an object'),
    (b'{"lmforge": {"special_tokens": "[PAD]"}}', "lmforge.special_tokens must be a list of tokens"),
    (b'{"lmforge": {"special_tokens": [1]}}', "lmforge.special_tokens must be a list of tokens"),
    (b'{"lmforge": {"max_input_chars_per_word": "x"}}', "lmforge.max_input_chars_per_word must be an integer"),
])
def test_broken_tokenizer_config(folder, content, match):
    (folder / "tokenizer_config.json").write_bytes(content)
    fails(folder, match, str(folder / "tokenizer_config.json"))


def test_odd_but_valid_tokenizer_config_values_still_load(folder):
    (folder / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False, "model_max_length": 1e30,
                                                              "unk_token": {"content": "[UNK]"}}))
    tok = WordPieceTokenizer.from_pretrained(folder)
    assert not tok.lowercase and tok.model_max_length == 512

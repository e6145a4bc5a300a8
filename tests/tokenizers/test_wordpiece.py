import json

import pytest
import torch

from lmforge.errors import LmforgeError
from lmforge.tokenizers import WordPieceTokenizer

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "un", "##aff", "##able", "runn", "##ing", "run",
         "the", ",", ".", "a", "##b", "##c", "b", "c", "hello", "world", "##s"]


@pytest.fixture()
def tok() -> WordPieceTokenizer:
    return WordPieceTokenizer(VOCAB)


def ids(tok, pieces):
    return [tok.vocab[p] for p in pieces]


def test_greedy_longest_match_first(tok):
    assert tok.tokenize("unaffable running") == ["un", "##aff", "##able", "runn", "##ing"]
    assert tok.tokenize("abc") == ["a", "##b", "##c"]


def test_unknown_words_become_one_unk(tok):
    # "unaffablex": no piece covers "x", so the whole word is [UNK], not a partial split
    assert tok.tokenize("unaffablex the") == ["[UNK]", "the"]


def test_words_longer_than_the_limit_are_unk():
    tok = WordPieceTokenizer(VOCAB, max_input_chars_per_word=5)
    assert tok.tokenize("hello worlds") == ["hello", "[UNK]"]


def test_special_tokens_in_text_are_never_split(tok):
    enc = tok("hello [MASK], world[SEP]", return_offsets=True, return_word_ids=True)
    assert tok.convert_ids_to_tokens(enc["input_ids"]) == [
        "[CLS]", "hello", "[MASK]", ",", "world", "[SEP]", "[SEP]"]
    assert enc["offsets"][2] == (6, 12)
    assert enc["word_ids"] == [None, 0, 1, 2, 3, 4, None]


def test_pair_layout_and_segment_ids(tok):
    enc = tok("hello world", "the run", return_offsets=True, return_word_ids=True)
    assert enc["input_ids"] == ids(tok, ["[CLS]", "hello", "world", "[SEP]", "the", "run", "[SEP]"])
    assert enc["token_type_ids"] == [0, 0, 0, 0, 1, 1, 1]
    assert enc["attention_mask"] == [1] * 7
    assert enc["offsets"] == [(0, 0), (0, 5), (6, 11), (0, 0), (0, 3), (4, 7), (0, 0)]
    assert enc["word_ids"] == [None, 0, 1, None, 0, 1, None]


def test_offsets_of_pieces(tok):
    enc = tok("Unaffable", return_offsets=True)
    assert enc["offsets"] == [(0, 0), (0, 2), (2, 5), (5, 9), (0, 0)]


@pytest.mark.parametrize(("n1", "n2", "max_length", "keep"), [
    (5, 5, 9, (3, 3)), (5, 5, 10, (3, 4)), (6, 4, 9, (3, 3)), (7, 3, 8, (3, 2)),
    (3, 3, 8, (2, 3)), (10, 2, 8, (3, 2)), (2, 2, 10, (2, 2)),
])
def test_longest_first_truncation_follows_the_reference_rule(tok, n1, n2, max_length, keep):
    # Expected values observed from Hugging Face tokenizers' longest_first on the same lengths.
    enc = tok(" ".join(["a"] * n1), " ".join(["b"] * n2), max_length=max_length, truncation=True)
    types = enc["token_type_ids"]
    assert (types.count(0) - 2, types.count(1) - 1) == keep
    assert enc.num_truncated_tokens == n1 + n2 - sum(keep)
    assert len(enc["input_ids"]) <= max_length


def test_only_first_and_only_second(tok):
    a, b = " ".join(["a"] * 6), " ".join(["b"] * 3)
    enc = tok(a, b, max_length=8, truncation="only_first")
    assert enc["token_type_ids"].count(0) - 2 == 2 and enc["token_type_ids"].count(1) - 1 == 3
    enc = tok(a, b, max_length=10, truncation="only_second")
    assert enc["token_type_ids"].count(0) - 2 == 6 and enc["token_type_ids"].count(1) - 1 == 1
    with pytest.raises(LmforgeError, match="only_first"):
        tok(a, " ".join(["b"] * 9), max_length=8, truncation="only_first")


def test_truncation_is_reported_not_silent(tok, caplog):
    with caplog.at_level("WARNING", logger="lmforge"):
        batch = tok(["a a a a a a", "a"], max_length=4, truncation=True)
    assert batch.num_truncated == 1 and batch.truncated_tokens == [4, 0]
    assert "truncated" in caplog.text


def test_padding_and_tensors(tok):
    batch = tok(["hello", "hello world the"], padding=True, return_tensors="pt")
    assert batch["input_ids"].shape == (2, 5)
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]
    assert batch["input_ids"][0, -1].item() == tok.pad_id
    fixed = tok(["hello"], padding="max_length", max_length=6, return_tensors="np")
    assert fixed["input_ids"].shape == (1, 6)
    with pytest.raises(LmforgeError, match="padding=True"):
        tok(["hello", "hello world"], return_tensors="pt")


def test_left_padding(tok):
    tok.padding_side = "left"
    batch = tok(["hello", "hello world the"], padding=True, return_word_ids=True)
    assert batch["attention_mask"][0] == [0, 0, 1, 1, 1]
    assert batch["word_ids"][0] == [None, None, None, 0, None]


def test_decode_joins_pieces(tok):
    enc = tok("Unaffable running, the world.")
    assert tok.decode(enc["input_ids"]) == "unaffable running , the world ."
    assert tok.decode(torch.tensor(enc["input_ids"]), skip_special_tokens=False).startswith("[CLS] unaffable")
    with pytest.raises(LmforgeError, match="outside the vocabulary"):
        tok.decode([len(VOCAB) + 5])


def test_bad_arguments(tok):
    with pytest.raises(LmforgeError, match="truncation"):
        tok("a", truncation="sideways")
    with pytest.raises(LmforgeError, match="padding"):
        tok("a", padding="everything")
    with pytest.raises(LmforgeError, match="max_length"):
        tok("a", padding="max_length")
    with pytest.raises(LmforgeError, match="not a string"):
        tok(["a", 3])


def test_vocab_without_special_tokens_is_a_clear_error(tmp_path):
    (tmp_path / "vocab.txt").write_text("hello\nworld\n[UNK]\n", encoding="utf-8")
    with pytest.raises(LmforgeError) as err:
        WordPieceTokenizer.from_pretrained(tmp_path)
    message = str(err.value)
    assert "vocab.txt" in message and "[CLS]" in message and "[UNK]" not in message.split("lacks")[1]


def test_save_and_load_round_trip(tmp_path, tok):
    tok.save_pretrained(tmp_path / "t")
    assert (tmp_path / "t" / "vocab.txt").read_text(encoding="utf-8").splitlines() == VOCAB
    config = json.loads((tmp_path / "t" / "tokenizer_config.json").read_text())
    assert config["do_lower_case"] is True
    again = WordPieceTokenizer.from_pretrained(tmp_path / "t")
    text = "Unaffable running, the world."
    assert again(text, return_offsets=True) == tok(text, return_offsets=True)
    with pytest.raises(LmforgeError, match="already exists"):
        tok.save_pretrained(tmp_path / "t")
    tok.save_pretrained(tmp_path / "t", overwrite=True)


def test_lowercase_is_inferred_from_a_bare_vocab(tmp_path):
    (tmp_path / "vocab.txt").write_text("\n".join([*VOCAB[:5], "Hello", "world"]) + "\n", encoding="utf-8")
    assert WordPieceTokenizer.from_pretrained(tmp_path).lowercase is False
    (tmp_path / "vocab.txt").write_text("\n".join([*VOCAB[:5], "hello", "world"]) + "\n", encoding="utf-8")
    assert WordPieceTokenizer.from_pretrained(tmp_path).lowercase is True


def test_missing_and_duplicate_vocab(tmp_path):
    with pytest.raises(LmforgeError, match="no such tokenizer"):
        WordPieceTokenizer.from_pretrained(tmp_path / "nope")
    with pytest.raises(LmforgeError, match="no vocab.txt"):
        WordPieceTokenizer.from_pretrained(tmp_path)
    (tmp_path / "vocab.txt").write_text("[PAD]\na\na\n", encoding="utf-8")
    with pytest.raises(LmforgeError, match=r"vocab.txt:3"):
        WordPieceTokenizer.from_pretrained(tmp_path)

"""Exactness against Hugging Face's Rust BERT tokenizer on the whole BBC News corpus."""

from __future__ import annotations

import re

import pytest

from lmforge.tokenizers import WordPieceTokenizer, WordPieceTrainer

pytest.importorskip("transformers", reason="transformers is the parity reference (dev extra)")
from transformers import BertTokenizerFast  # noqa: E402  (the Rust-backed tokenizer)

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[\"'A-Z0-9£$])")


@pytest.fixture(scope="module")
def sentences(bbc_texts) -> list[list[str]]:
    """Each article's sentences (paragraph lines split after . ! ? before a capital or digit)."""
    docs = []
    for text in bbc_texts:
        docs.append([s for line in text.splitlines() if line.strip() for s in _SENTENCE_END.split(line.strip())])
    return docs


@pytest.fixture(scope="module")
def pair(minilm_dir):
    ours = WordPieceTokenizer.from_pretrained(minilm_dir)
    ref = BertTokenizerFast(vocab=str(minilm_dir / "vocab.txt"))
    return ours, ref


def _compare(ours, ref, firsts, seconds=None, **kw):
    theirs = ref(firsts, seconds, return_offsets_mapping=True, **kw)
    mine = ours(firsts, seconds, return_offsets=True, return_word_ids=True, **kw)
    mismatches = []
    for i in range(len(firsts)):
        offsets = [tuple(o) for o in theirs["offset_mapping"][i]]
        if (mine["input_ids"][i] != theirs["input_ids"][i]
                or mine["token_type_ids"][i] != theirs["token_type_ids"][i]
                or mine["offsets"][i] != offsets or mine["word_ids"][i] != theirs.word_ids(i)):
            mismatches.append(firsts[i] if seconds is None else (firsts[i], seconds[i]))
    return mismatches


def test_every_bbc_sentence_matches(pair, sentences):
    ours, ref = pair
    flat = [s for doc in sentences for s in doc]
    assert len(flat) > 30_000
    assert _compare(ours, ref, flat) == []


def test_sentence_pairs_match(pair, sentences):
    ours, ref = pair
    firsts = [a for doc in sentences for a in doc[:-1]]
    seconds = [b for doc in sentences for b in doc[1:]]
    assert _compare(ours, ref, firsts, seconds) == []


@pytest.mark.parametrize("strategy", ["longest_first", "only_second"])
def test_truncated_pairs_match(pair, sentences, strategy):
    ours, ref = pair
    firsts = [doc[0] for doc in sentences if len(doc) > 2]
    seconds = [" ".join(doc[1:]) for doc in sentences if len(doc) > 2]  # long second segments
    assert _compare(ours, ref, firsts, seconds, truncation=strategy, max_length=64) == []


def test_truncated_singles_match(pair, bbc_texts):
    ours, ref = pair
    paragraphs = [line for text in bbc_texts for line in text.splitlines() if line.strip()]
    for max_length in (16, 128):
        assert _compare(ours, ref, paragraphs, truncation=True, max_length=max_length) == []


def test_our_trained_vocab_loads_in_transformers(tmp_path, bbc_texts):
    tok = WordPieceTrainer(2000).train(bbc_texts[:300])
    tok.save_pretrained(tmp_path / "tok")
    from_dir = BertTokenizerFast.from_pretrained(str(tmp_path / "tok"))
    from_vocab = BertTokenizerFast(vocab=str(tmp_path / "tok" / "vocab.txt"))
    lines = [line for text in bbc_texts[300:400] for line in text.splitlines() if line.strip()]
    ours = tok(lines)["input_ids"]
    assert from_dir(lines)["input_ids"] == ours
    assert from_vocab(lines)["input_ids"] == ours


TRICKY = [
    "Héllo, Wörld! Ça va? naïve café façade", "e\u0301 combining accent", "tab\there\nnew line\r\nCRLF",
    "zero\u200bwidth soft\u00adhyphen \x00nul \ufffdreplacement", "nbsp\u00a0and\u2003em\u2028sep",
    "中文字符 mixed with English and 日本語", "emoji 😀 and 🙂!", "[MASK] in text, [CLS][SEP] glued",
    "unbelievably-long-hyphenated-word's end...", "ＦＵＬＬＷＩＤＴＨ ｔｅｘｔ", "Ǆ ǅ ǆ ß ẞ İstanbul ΣΑΣ",
    "x" * 150 + " after a very long word", "   ", "", "a\u1fefb greek varia", "$1.13bn (£600m) 76%",
    "\U00020000\U00020001 astral CJK", "Ελληνικά κείμενα και Русский текст", "טקסט בעברית ועربي",
]


@pytest.mark.parametrize("text", TRICKY)
def test_tricky_strings_match(pair, text):
    ours, ref = pair
    assert _compare(ours, ref, [text]) == []
    assert _compare(ours, ref, [text], [text[::-1]], truncation=True, max_length=12) == []

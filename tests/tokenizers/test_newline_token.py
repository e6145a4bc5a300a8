"""WordPiece with a newline token (issue 38): BERT's basic tokenizer reads line breaks as spaces, so a GPT on its
pieces could never write one. With ``newline_token`` each line break is a token that decodes back to a line break,
the data preparation keeps the paragraphs' and lines' breaks, and a tokenizer without it behaves as before."""

from __future__ import annotations

import json

import numpy as np

from lmforge.cli import main
from lmforge.data.shards import ShardedCorpus, file_documents
from lmforge.tokenizers import WordPieceTokenizer
from lmforge.tokenizers.trainer import WordPieceTrainer

TEXT = "the cat sat on the mat . the dog ran to the cat .\nthe mat sat ."


def trained(newline: bool) -> WordPieceTokenizer:
    trainer = WordPieceTrainer(60, min_frequency=1, newline_token="[NL]" if newline else None)
    return trainer.train([TEXT] * 3)


def test_each_line_break_is_the_newline_token_and_decodes_back():
    tok = trained(newline=True)
    nl = tok.vocab["[NL]"]
    assert tok.newline_id == nl and "[NL]" in tok.special_tokens
    ids = tok.encode_ids("the cat\nsat\r\non the mat")
    assert ids.count(nl) == 2 and ids == tok.encode_ids("the cat [NL] sat [NL] on the mat")
    assert tok.decode(ids) == "the cat\nsat\non the mat"  # kept although special tokens are skipped
    assert tok.decode([tok.cls_id, *tok.encode_ids("cat\n\nmat"), tok.sep_id]) == "cat\n\nmat"
    ids, offsets, _ = tok.encode_text("cat\nmat")
    assert ids[1] == nl and offsets[1] == (3, 4)
    with_specials = tok("the cat\nsat")["input_ids"]
    assert with_specials[0] == tok.cls_id and with_specials.count(nl) == 1


def test_the_setting_is_saved_and_a_tokenizer_without_it_reads_breaks_as_spaces(tmp_path):
    tok = trained(newline=True)
    tok.save_pretrained(tmp_path / "nl")
    config = json.loads((tmp_path / "nl" / "tokenizer_config.json").read_text())
    assert config["lmforge"]["newline_token"] == "[NL]"
    again = WordPieceTokenizer.from_pretrained(tmp_path / "nl")
    assert again.newline_id == tok.newline_id and again.decode(again.encode_ids("cat\nmat")) == "cat\nmat"
    plain = trained(newline=False)
    assert plain.newline_id is None and "[NL]" not in plain.vocab
    assert plain.encode_ids("the cat\nsat") == plain.encode_ids("the cat sat")
    assert plain.decode(plain.encode_ids("the cat\nsat")) == "the cat sat"
    plain.save_pretrained(tmp_path / "plain")
    assert "newline_token" not in json.loads((tmp_path / "plain" / "tokenizer_config.json").read_text())["lmforge"]


def test_file_documents_keep_paragraph_and_line_breaks_inside_a_document():
    prose = "First one. Second one.\n\nThird one.\n\nLast one."
    assert file_documents(prose, "documents", line_breaks=True)[1] == [
        ["First one.", "Second one.\n\n", "Third one.\n\n", "Last one."]]
    assert file_documents(prose, "documents")[1] == [["First one.", "Second one.", "Third one.", "Last one."]]
    lines = "a b c\nd e f\n\ng h i\n"
    assert file_documents(lines, "lines", line_breaks=True)[1] == [["a b c\n", "d e f"], ["g h i"]]


def test_prepared_corpus_and_cli_keep_the_breaks(tmp_path, capsys):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(3):
        (corpus / f"doc{i}.txt").write_text("The cat sat. The dog ran.\n\nThe mat sat on the cat.\n", encoding="utf-8")
    assert main(["-q", "tokenizer", "train", "--input", str(corpus), "--vocab-size", "80", "--out", str(tmp_path / "t"),
                 "--keep-newlines", "--min-frequency", "1"]) == 0
    assert main(["-q", "data", "prepare", "--tokenizer", str(tmp_path / "t"), "--input", str(corpus), "--out",
                 str(tmp_path / "d"), "--workers", "1", "--format", "documents"]) == 0
    tok = WordPieceTokenizer.from_pretrained(tmp_path / "t")
    ids = np.asarray(ShardedCorpus(tmp_path / "d", tok).document_tokens(0)).tolist()
    assert ids.count(tok.newline_id) == 2 and ids[-1] != tok.newline_id
    assert tok.decode(ids) == "the cat sat . the dog ran .\n\nthe mat sat on the cat ."

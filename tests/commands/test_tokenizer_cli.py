"""``lmforge tokenizer train|encode`` end to end, including the bad inputs a user can give."""

import json

import pytest

from lmforge.cli import main
from lmforge.tokenizers import WordPieceTokenizer

TEXT = "The cat sat on the mat.\nThe dog sat on the log.\n\nCats and dogs, mats and logs.\n"


@pytest.fixture()
def corpus(tmp_path):
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "a.txt").write_text(TEXT * 3, encoding="utf-8")
    (folder / "b.txt").write_bytes("Price: \xa3600m for the cat.\n".encode("latin-1"))  # not UTF-8
    (folder / "skip.csv").write_text("not,read\n", encoding="utf-8")
    return folder


def test_train_then_encode(tmp_path, corpus, capsys):
    out = tmp_path / "tok"
    assert main(["tokenizer", "train", "--input", str(corpus), "--vocab-size", "50", "--out", str(out),
                 "--min-frequency", "1"]) == 0
    captured = capsys.readouterr()
    assert "50 tokens" in captured.out
    assert "b.txt: not valid UTF-8, 1 byte(s) replaced" in captured.err
    report = json.loads((out / "training_report.json").read_text())
    assert report["invalid_utf8_bytes"] == 1 and report["files"] == 2
    assert (out / "merges.tsv").read_text().count("\n") == report["merges"] + 1
    tok = WordPieceTokenizer.from_pretrained(out)
    assert tok.vocab_size == 50

    lines = tmp_path / "lines.txt"
    lines.write_text("The cat sat.\nDogs and logs on mats.\n", encoding="utf-8")
    pairs = tmp_path / "pairs.txt"
    pairs.write_text("On the mat.\nThe log.\n", encoding="utf-8")
    target = tmp_path / "enc.jsonl"
    assert main(["tokenizer", "encode", "--tokenizer", str(out), "--input", str(lines), "--pair-input",
                 str(pairs), "--max-length", "8", "--out", str(target)]) == 0
    records = [json.loads(line) for line in target.read_text().splitlines()]
    assert len(records) == 2
    expected = tok("The cat sat.", "On the mat.", max_length=8, truncation=True, return_offsets=True)
    assert records[0]["input_ids"] == expected["input_ids"]
    assert records[0]["token_type_ids"] == expected["token_type_ids"]
    assert [tuple(o) for o in records[0]["offsets"]] == expected["offsets"]
    assert "truncated" in capsys.readouterr().out


def test_existing_output_is_not_overwritten(tmp_path, corpus, capsys):
    out = tmp_path / "tok"
    args = ["tokenizer", "train", "--input", str(corpus), "--vocab-size", "40", "--out", str(out)]
    assert main(args) == 0
    before = (out / "vocab.txt").read_text()
    assert main([*args[:-4], "--vocab-size", "45", "--out", str(out)]) == 2
    assert "is not empty" in capsys.readouterr().err
    assert (out / "vocab.txt").read_text() == before
    assert main([*args[:-4], "--vocab-size", "45", "--out", str(out), "--overwrite"]) == 0


@pytest.mark.parametrize(("make_args", "message"), [
    (lambda p: ["--input", str(p / "missing.txt"), "--vocab-size", "50"], "missing.txt: no such file"),
    (lambda p: ["--input", str(p / "empty.txt"), "--vocab-size", "50"], "holds no words"),
    (lambda p: ["--input", str(p / "small.txt"), "--vocab-size", "6"], "vocab_size=6 is below"),
    (lambda p: ["--input", str(p / "emptydir"), "--vocab-size", "50"], "folder holds no .txt"),
])
def test_bad_training_input_is_one_clear_line(tmp_path, capsys, make_args, message):
    (tmp_path / "empty.txt").write_text("  \n\n", encoding="utf-8")
    (tmp_path / "small.txt").write_text("abc abd", encoding="utf-8")
    (tmp_path / "emptydir").mkdir()
    code = main(["tokenizer", "train", *make_args(tmp_path), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    last = err.splitlines()[-1]  # progress bars may come first
    assert code == 2
    assert message in last and last.startswith("lmforge: error:") and "Traceback" not in err


def test_encode_bad_inputs(tmp_path, capsys):
    tok_dir = tmp_path / "tok"
    tok_dir.mkdir()
    (tok_dir / "vocab.txt").write_text("hello\n[UNK]\n", encoding="utf-8")
    (tmp_path / "in.txt").write_text("hello\n", encoding="utf-8")
    (tmp_path / "pairs.txt").write_text("a\nb\n", encoding="utf-8")
    code = main(["tokenizer", "encode", "--tokenizer", str(tok_dir), "--input", str(tmp_path / "in.txt"),
                 "--out", str(tmp_path / "o.jsonl")])
    err = capsys.readouterr().err
    assert code == 2 and "vocab.txt" in err and "[CLS]" in err
    WordPieceTokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hello"]).save_pretrained(tok_dir,
                                                                                               overwrite=True)
    code = main(["tokenizer", "encode", "--tokenizer", str(tok_dir), "--input", str(tmp_path / "in.txt"),
                 "--pair-input", str(tmp_path / "pairs.txt"), "--out", str(tmp_path / "o.jsonl")])
    assert code == 2 and "has 2 lines but" in capsys.readouterr().err
    assert not (tmp_path / "o.jsonl").exists()

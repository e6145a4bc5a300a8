"""GloVe's headerless text format (issue 16, item 7): written with format="glove" / --format glove, detected on
load next to the word2vec text and binary formats, checked against gensim's reader (``no_header=True``), and the
bad files a user can give, with the line named."""

from __future__ import annotations

import numpy as np
import pytest

from lmforge import cli
from lmforge.commands import vectors as vectors_cmd
from lmforge.embeddings.io import load_word2vec, save_word2vec
from lmforge.embeddings.vectors import KeyedVectors
from lmforge.errors import InputFileError, LmforgeError
from tests.embeddings.synthetic import planted_corpus


@pytest.fixture()
def kv() -> KeyedVectors:
    """Values of very different magnitudes, which a lossy text format would not keep; words that look like
    numbers, which must not be taken for a header."""
    rng = np.random.default_rng(3)
    words = ["the", "2020", "café", "-1", "x1", "1e5", "zebra"]
    scale = np.array([1, 1e-7, 1e7, 1, -3e-38], dtype=np.float32)
    return KeyedVectors(words, (rng.normal(size=(len(words), 5)) * scale).astype(np.float32))


def _gensim():
    return pytest.importorskip("gensim.models", reason="gensim is not installed (a dev extra): the parity tests "
                               "against gensim's KeyedVectors need it")


FORMATS = [("word2vec", False), ("word2vec", True), ("glove", False)]
IDS = ["word2vec-text", "word2vec-binary", "glove"]


# ---------------------------------------------------------------------------------------------- round trips
@pytest.mark.parametrize("fmt, binary", FORMATS, ids=IDS)
def test_round_trip_in_each_format_is_exact_and_detected(tmp_path, kv, fmt, binary):
    path = tmp_path / "v.vec"
    save_word2vec(kv, path, binary=binary, format=fmt)
    has_header = path.read_bytes().split(b"\n", 1)[0] == f"{len(kv)} {kv.dim}".encode()
    assert has_header == (fmt == "word2vec")
    back = load_word2vec(path)  # format detected
    assert back.words == kv.words
    np.testing.assert_array_equal(back.vectors, kv.vectors)
    assert load_word2vec(path, binary=binary).words == kv.words


def test_glove_file_is_the_word2vec_text_without_its_header(tmp_path, kv):
    save_word2vec(kv, tmp_path / "w.txt")
    save_word2vec(kv, tmp_path / "g.txt", format="glove")
    w2v = (tmp_path / "w.txt").read_text(encoding="utf-8").splitlines()
    assert (tmp_path / "g.txt").read_text(encoding="utf-8").splitlines() == w2v[1:]


@pytest.mark.parametrize("fmt, binary", FORMATS, ids=IDS)
def test_gensim_reads_ours(tmp_path, kv, fmt, binary):
    gensim = _gensim()
    path = tmp_path / "ours.vec"
    save_word2vec(kv, path, binary=binary, format=fmt)
    theirs = gensim.KeyedVectors.load_word2vec_format(str(path), binary=binary, no_header=fmt == "glove")
    assert list(theirs.index_to_key) == kv.words
    np.testing.assert_array_equal(theirs.vectors, kv.vectors)


def test_we_read_gensims_headerless_output(tmp_path, kv):
    gensim = _gensim()
    theirs = gensim.KeyedVectors(vector_size=kv.dim)
    theirs.add_vectors(kv.words, kv.vectors)
    path = tmp_path / "gensim.txt"
    theirs.save_word2vec_format(str(path), write_header=False)
    assert not path.read_text(encoding="utf-8").startswith(f"{len(kv)} ")
    ours = load_word2vec(path)
    assert ours.words == kv.words
    np.testing.assert_array_equal(ours.vectors, kv.vectors)


def test_a_stanford_style_file_reads_as_gensim_reads_it(tmp_path):
    """As glove.6B.50d.txt looks: no header, punctuation and numbers as words, CRLF tolerated."""
    path = tmp_path / "glove.6B.3d.txt"
    path.write_bytes(b"the 0.418 0.24968 -0.41242\n, 0.013441 0.23682 -0.16899\n2020 -1 2 3\n"
                     b"<unk> 1e-05 -2.5E+3 0\r\n")
    ours = load_word2vec(path)
    assert ours.words == ["the", ",", "2020", "<unk>"] and ours.dim == 3
    np.testing.assert_array_equal(ours["<unk>"], np.array([1e-5, -2500, 0], dtype=np.float32))
    gensim = _gensim()
    theirs = gensim.KeyedVectors.load_word2vec_format(str(path), no_header=True)
    assert list(theirs.index_to_key) == ours.words
    np.testing.assert_array_equal(theirs.vectors, ours.vectors)


def test_one_line_file(tmp_path):
    path = tmp_path / "one.txt"
    path.write_text("hello 0.5 -1 2", encoding="utf-8")  # not even a final newline
    kv = load_word2vec(path)
    assert kv.words == ["hello"] and kv["hello"].tolist() == [0.5, -1, 2]
    path.write_text("hello 0.5\n\n", encoding="utf-8")  # trailing blank lines are not rows
    assert load_word2vec(path).vectors.shape == (1, 1)


# ---------------------------------------------------------------------------------------------- the ambiguity
def test_a_first_row_of_two_unsigned_integers_is_a_header(tmp_path):
    """The rule: the first line is a header when it is exactly two unsigned decimal integers. A 1-dimensional
    GloVe file starting '2020 3' therefore reads as a header, and fails saying how to write it instead."""
    path = tmp_path / "year.txt"
    path.write_text("2020 3\nfoo 1\n", encoding="utf-8")
    with pytest.raises(InputFileError, match=r"line 1: the header says 2,020 vectors of 3 dimensions.*headerless "
                       r"GloVe file whose first row is the word '2020'.*decimal point, e.g. 3\.0") as err:
        load_word2vec(path)
    assert str(path) in str(err.value)
    path.write_text("2020 3\n", encoding="utf-8")  # the one-line file
    with pytest.raises(InputFileError, match=r"headerless GloVe file whose first row is the word '2020'"):
        load_word2vec(path)
    for first in ("2020 3.0", "2020 -3", "2020 3e0", "+1 3"):  # not two unsigned integers: a GloVe row
        path.write_text(f"{first}\nfoo 1\n", encoding="utf-8")
        kv = load_word2vec(path)
        assert kv.words == [first.split()[0], "foo"] and kv.dim == 1
    path.write_text("2 1\n2020 3\nfoo 1\n", encoding="utf-8")  # and with a header it is a plain row
    assert load_word2vec(path).words == ["2020", "foo"]


def test_writing_glove_never_produces_the_ambiguous_first_row(tmp_path):
    kv = KeyedVectors(["2020", "1999"], np.array([[3.0], [4.0]], dtype=np.float32))
    path = tmp_path / "years.txt"
    save_word2vec(kv, path, format="glove")
    assert path.read_text(encoding="utf-8") == "2020 3.0\n1999 4\n"
    back = load_word2vec(path)
    assert back.words == kv.words
    np.testing.assert_array_equal(back.vectors, kv.vectors)
    gensim = _gensim()
    theirs = gensim.KeyedVectors.load_word2vec_format(str(path), no_header=True)
    np.testing.assert_array_equal(theirs.vectors, kv.vectors)


# ---------------------------------------------------------------------------------------------- bad files
@pytest.mark.parametrize("content, message", [
    ("a 1 2\nb 3 4 5\n", r"line 2: 3 values after the word, but line 1 has 2"),
    ("a 1 2\nb 3 4\nc 5\n", r"line 3: 1 values after the word, but line 1 has 2"),
    ("a 1 2\n\nb 3 4\n", r"line 2: 0 values after the word, but line 1 has 2"),
    ("a 1 2\nb 3 x\n", r"line 2: a value is not a number"),
    ("hello\nb 3 4\n", r"line 1: expected the header 'N D' \(word2vec\) or a row 'word v1 ... vD' \(GloVe\)"),
    ("", r"line 1: expected the header .*got an empty file"),
    ("\n\n", r"line 1: expected the header .*got an empty file"),
])
def test_bad_headerless_files_name_the_line(tmp_path, content, message):
    path = tmp_path / "bad.txt"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(InputFileError, match=message) as err:
        load_word2vec(path)
    assert str(path) in str(err.value)


def test_a_long_first_row_then_short_rows_fails_before_allocating(tmp_path):
    """Without a header the table's size comes from the row count and the first row: every row is checked
    before the table is allocated (a 10^6-value first row and 10^6 empty lines would otherwise ask for 4 TB)."""
    path = tmp_path / "lying.txt"
    path.write_bytes(b"w " + b"0 " * 100_000 + b"\n" + b"x 1\n" * 100_000)
    with pytest.raises(InputFileError, match=r"line 2: 1 values after the word, but line 1 has 100000"):
        load_word2vec(path)


def test_lying_header_still_fails_before_allocating(tmp_path):
    path = tmp_path / "lying.txt"
    path.write_text("3000000000 300\na 1 2\n", encoding="utf-8")
    with pytest.raises(InputFileError, match=r"line 1: the header says 3,000,000,000 vectors of 300 dimensions, "
                       r"more than the file's"):
        load_word2vec(path)


def test_binary_requested_for_a_headerless_file(tmp_path):
    path = tmp_path / "g.txt"
    path.write_text("a 1 2\n", encoding="utf-8")
    with pytest.raises(InputFileError, match=r"line 1: a word2vec binary file starts with the header 'N D'"):
        load_word2vec(path, binary=True)
    path.write_bytes(b"a 1\n\xff 2\n")
    with pytest.raises(InputFileError, match=r"line 2: the word is not valid UTF-8"):
        load_word2vec(path)
    path.write_bytes(b"\xff\xfe\x00\x01 \x80\x81\n")  # binary bytes without a header
    with pytest.raises(InputFileError, match=r"line 1: .*not UTF-8; is this a binary file without its header"):
        load_word2vec(path)


def test_glove_format_is_text_only_and_named(tmp_path, kv):
    with pytest.raises(LmforgeError, match="text only"):
        save_word2vec(kv, tmp_path / "v.bin", binary=True, format="glove")
    with pytest.raises(LmforgeError, match="format='fasttext' is not one of word2vec, glove"):
        save_word2vec(kv, tmp_path / "v.txt", format="fasttext")
    assert not list(tmp_path.iterdir())


# ---------------------------------------------------------------------------------------------- the commands
@pytest.fixture()
def registered(monkeypatch):
    monkeypatch.setitem(cli.COMMANDS, "word2vec train", ("train Word2Vec", vectors_cmd.add_word2vec_arguments,
                                                         vectors_cmd.run_word2vec_train))
    monkeypatch.setitem(cli.COMMANDS, "glove train", ("train GloVe", vectors_cmd.add_glove_arguments,
                                                      vectors_cmd.run_glove_train))


@pytest.mark.parametrize("command, extra", [
    (["word2vec", "train"], ["--negative", "3"]),
    (["glove", "train"], ["--x-max", "10"]),
])
def test_train_commands_write_the_glove_format(tmp_path, capsys, registered, command, extra):
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(" ".join(s) for s in planted_corpus(200)) + "\n", encoding="utf-8")
    out = tmp_path / "v.txt"
    base = [*command, "--input", str(corpus), "--out", str(out), "--dim", "6", "--window", "3", "--min-count", "2",
            "--epochs", "1", "--workers", "1", *extra]
    assert cli.main([*base, "--format", "glove"]) == 0
    first = out.read_text(encoding="utf-8").split("\n", 1)[0].split(" ")
    assert len(first) == 7  # a word and 6 values: no 'N D' header
    kv = load_word2vec(out)
    assert kv.dim == 6 and len(kv) > 10 and (tmp_path / "v.metrics.jsonl").is_file()
    capsys.readouterr()
    assert cli.main([*base, "--format", "glove", "--binary", "--overwrite"]) == 2
    assert "text only" in capsys.readouterr().err
    assert cli.main([*base, "--overwrite"]) == 0  # the default stays word2vec text
    assert out.read_text(encoding="utf-8").startswith(f"{len(load_word2vec(out))} 6\n")

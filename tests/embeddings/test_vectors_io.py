"""The word2vec formats (ours <-> gensim, text and binary, bad files with line numbers) and KeyedVectors' look-ups
and evaluations."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lmforge.embeddings.io import load_word2vec, save_word2vec
from lmforge.embeddings.vectors import KeyedVectors, rank_average, spearman
from lmforge.errors import InputFileError, LmforgeError


@pytest.fixture()
def kv() -> KeyedVectors:
    rng = np.random.default_rng(0)
    words = ["the", "king", "queen", "man", "woman", "café", "x1", "zebra", "mp3"]
    return KeyedVectors(words, rng.normal(size=(len(words), 7)).astype(np.float32))


@pytest.fixture()
def extreme(kv) -> KeyedVectors:
    """Values of very different magnitudes, which a lossy text format would not keep."""
    scale = np.array([1, 1e-7, 1e7, 1, -3e-38, 1, 1], dtype=np.float32)
    return KeyedVectors(kv.words, kv.vectors * scale)


def _gensim():
    return pytest.importorskip("gensim.models", reason="gensim is not installed (a dev extra): the parity tests "
                               "against gensim's KeyedVectors need it")


# ---------------------------------------------------------------------------------------------- formats
@pytest.mark.parametrize("binary", [False, True])
def test_round_trip_is_exact(tmp_path, extreme, binary):
    kv = extreme
    path = tmp_path / "v.bin"
    save_word2vec(kv, path, binary=binary)
    back = load_word2vec(path)  # format detected
    assert back.words == kv.words
    np.testing.assert_array_equal(back.vectors, kv.vectors)
    assert load_word2vec(path, binary=binary).words == kv.words


@pytest.mark.parametrize("binary", [False, True])
def test_gensim_reads_ours(tmp_path, extreme, binary):
    kv = extreme
    gensim = _gensim()
    path = tmp_path / "ours.vec"
    save_word2vec(kv, path, binary=binary)
    theirs = gensim.KeyedVectors.load_word2vec_format(str(path), binary=binary)
    assert list(theirs.index_to_key) == kv.words
    np.testing.assert_array_equal(theirs.vectors, kv.vectors)


@pytest.mark.parametrize("binary", [False, True])
def test_we_read_gensim(tmp_path, extreme, binary):
    kv = extreme
    gensim = _gensim()
    theirs = gensim.KeyedVectors(vector_size=kv.dim)
    theirs.add_vectors(kv.words, kv.vectors)
    path = tmp_path / "gensim.vec"
    theirs.save_word2vec_format(str(path), binary=binary)  # binary: no newline between vectors
    ours = load_word2vec(path)
    assert ours.words == kv.words
    np.testing.assert_array_equal(ours.vectors, kv.vectors)  # text: gensim writes str(float32), exact


def test_c_tool_text_rows_with_trailing_space(tmp_path):
    path = tmp_path / "c.txt"
    path.write_text("2 3\n</s> 0.1 0.2 0.3 \nword -1 2.5e-3 4 \n", encoding="utf-8")
    kv = load_word2vec(path)
    assert kv.words == ["</s>", "word"]
    np.testing.assert_allclose(kv["word"], [-1, 2.5e-3, 4], rtol=1e-6)


@pytest.mark.parametrize("content, message", [
    ("3 2\na 1 2\nb 3 4\n", r"line 4: the header says 3 vectors but the file ends after 2"),
    ("1 2\na 1 2\nb 3 4\n", r"line 3: the header says 1 vectors but the file has 1 more row"),
    ("2 2\na 1 2\nb 3 4 5\n", r"line 3: 3 values after the word, but the header says 2 dimensions"),
    ("2 2\na 1 2\nb 3\n", r"line 3: 1 values after the word"),
    ("2 2\na 1 2\nb 3 x\n", r"line 3: a value is not a number"),
    ("two 2\na 1 2\n", r"line 2: 2 values after the word, but line 1 has 1"),  # no header: read as GloVe
    ("", r"line 1: expected the header"),
])
def test_text_header_disagreeing_with_rows(tmp_path, content, message):
    path = tmp_path / "bad.txt"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(InputFileError, match=message) as err:
        load_word2vec(path, binary=False)
    assert str(path) in str(err.value)


def test_binary_header_disagreeing_with_rows(tmp_path, kv):
    path = tmp_path / "v.bin"
    save_word2vec(kv, path, binary=True)
    data = path.read_bytes()
    n = len(kv)
    path.write_bytes(data.replace(f"{n} 7".encode(), f"{n + 1} 7".encode(), 1))
    with pytest.raises(InputFileError, match=rf"vector {n + 1} .*ends after {n}"):
        load_word2vec(path, binary=True)
    path.write_bytes(data.replace(f"{n} 7".encode(), f"{n - 1} 7".encode(), 1))
    with pytest.raises(InputFileError, match="bytes remain after the 8 vectors"):
        load_word2vec(path, binary=True)


def test_duplicate_words_keep_the_first(tmp_path, caplog):
    path = tmp_path / "dup.txt"
    path.write_text("3 2\na 1 2\nb 3 4\na 5 6\n", encoding="utf-8")
    kv = load_word2vec(path)
    assert kv.words == ["a", "b"] and kv["a"].tolist() == [1, 2]
    assert "appears again in row 3" in caplog.text


def test_words_with_spaces_cannot_be_saved(tmp_path):
    with pytest.raises(LmforgeError, match="white space"):
        save_word2vec(KeyedVectors(["new york"], np.ones((1, 2))), tmp_path / "v.txt")
    assert not (tmp_path / "v.txt").exists()


# ---------------------------------------------------------------------------------------------- look-ups
def _analogy_vectors() -> KeyedVectors:
    # king - man + woman = queen exactly; "king" itself would win if the query words were not excluded
    words = ["man", "woman", "king", "queen", "apple", "paris", "france", "rome", "italy"]
    v = np.array([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 1, 0], [0, 0, 0, 1],
                  [0, 0, 1, 1], [0, 1, 1, 1], [0, 0.1, 1, 1], [0.1, 1, 1, 1]], dtype=np.float32)
    return KeyedVectors(words, v)


def test_most_similar_and_similarity(kv):
    unit = kv.vectors / np.linalg.norm(kv.vectors, axis=1, keepdims=True)
    sims = unit @ unit[1]
    order = [i for i in np.argsort(-sims) if i != 1][:3]
    got = kv.most_similar("king", topn=3)
    assert [w for w, _ in got] == [kv.words[i] for i in order]
    np.testing.assert_allclose([s for _, s in got], sims[order], rtol=1e-5)
    assert kv.similarity("king", "queen") == pytest.approx(float(sims[2]), rel=1e-5)
    with pytest.raises(KeyError, match="'nope' is not in the vocabulary"):
        kv.similarity("king", "nope")


def test_analogy_excludes_the_query_words():
    kv = _analogy_vectors()
    assert kv.analogy("man", "king", "woman")[0][0] == "queen"
    target = kv.unit_vectors()[kv.index["king"]] - kv.unit_vectors()[kv.index["man"]] + kv.unit_vectors()[
        kv.index["woman"]]
    assert kv.most_similar(target, topn=1)[0][0] in {"king", "queen"}  # without exclusion a query word may win
    assert all(w not in {"man", "king", "woman"} for w, _ in kv.analogy("man", "king", "woman", topn=5))


def test_evaluate_analogies_sections_and_oov(tmp_path):
    kv = _analogy_vectors()
    path = tmp_path / "questions.txt"
    path.write_text(": family\nman king woman queen\nMan Woman King Queen\nman king woman unicorn\n"
                    ": capitals\nparis france rome italy\nfrance paris italy apple\n", encoding="utf-8")
    r = kv.evaluate_analogies(path)
    assert r.questions == 4 and r.oov_questions == 1
    assert r.sections["family"] == (2, 2)
    assert r.sections["capitals"][1] == 2
    assert r.correct == 2 + r.sections["capitals"][0] and r.accuracy == r.correct / 4
    assert kv.evaluate_analogies(path, case_insensitive=False).questions == 3
    bad = tmp_path / "bad.txt"
    bad.write_text(": s\na b c\n", encoding="utf-8")
    with pytest.raises(InputFileError, match="line 2: expected four words"):
        kv.evaluate_analogies(bad)


def test_spearman_hand_computed_with_ties():
    np.testing.assert_array_equal(rank_average([10, 20, 20, 5]), [2, 3.5, 3.5, 1])
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # ranks x = [1, 2, 3, 4], y = [1.5, 1.5, 4, 3]: Pearson of the ranks
    rx, ry = np.array([1, 2, 3, 4.0]), np.array([1.5, 1.5, 4, 3])
    expected = np.corrcoef(rx, ry)[0, 1]
    assert spearman([1, 2, 3, 4], [7, 7, 9, 8]) == pytest.approx(expected)
    assert math.isnan(spearman([1], [2]))
    stats = pytest.importorskip("scipy.stats", reason="scipy is not installed")
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 5, 40), rng.integers(0, 5, 40)
    assert spearman(x, y) == pytest.approx(stats.spearmanr(x, y).statistic)


def test_evaluate_pairs_counts_oov(tmp_path):
    kv = _analogy_vectors()
    path = tmp_path / "pairs.tsv"
    path.write_text("# a comment\nword1\tword2\tscore\nking\tqueen\t9\nKing\tman\t6\nparis\trome\t7\n"
                    "apple\tparis\t1\nunicorn\tking\t5\n", encoding="utf-8")
    r = kv.evaluate_pairs(path)
    assert (r.pairs, r.oov_pairs, r.total) == (4, 1, 5) and r.oov_ratio == pytest.approx(0.2)
    model = [kv.similarity("king", "queen"), kv.similarity("king", "man"), kv.similarity("paris", "rome"),
             kv.similarity("apple", "paris")]
    assert r.spearman == pytest.approx(spearman(model, [9, 6, 7, 1]))
    assert kv.evaluate_pairs(path, case_insensitive=False).oov_pairs == 2
    bad = tmp_path / "bad.tsv"
    bad.write_text("king queen 9\nking man\n", encoding="utf-8")
    with pytest.raises(InputFileError, match="line 2: expected 'word1 word2 score'"):
        kv.evaluate_pairs(bad)


def test_gensim_agrees_on_neighbours_and_analogies(kv):
    gensim = _gensim()
    theirs = gensim.KeyedVectors(vector_size=kv.dim)
    theirs.add_vectors(kv.words, kv.vectors)
    for word in ("king", "café"):
        ours = kv.most_similar(word, topn=4)
        ref = theirs.most_similar(word, topn=4)
        assert [w for w, _ in ours] == [w for w, _ in ref]
        np.testing.assert_allclose([s for _, s in ours], [s for _, s in ref], rtol=1e-5)
    ours = kv.analogy("man", "king", "woman", topn=3)
    ref = theirs.most_similar(positive=["king", "woman"], negative=["man"], topn=3)
    assert [w for w, _ in ours] == [w for w, _ in ref]

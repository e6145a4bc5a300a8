"""``lmforge embed --word-pooling`` and the ``feature-extraction`` pipeline's ``word_pooling`` on a tiny encoder."""

from __future__ import annotations

import numpy as np
import pytest

import lmforge
from lmforge.cli import main
from lmforge.embeddings.contextual import embed_texts, embed_words
from lmforge.errors import LmforgeError
from lmforge.persistence import load_backbone

LINES = ["Alice lives in Paris.", "", "bob saw carol , later"]


@pytest.fixture()
def lines_file(tmp_path):
    path = tmp_path / "lines.txt"
    path.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize("how", ["first", "mean"])
def test_embed_word_pooling_writes_vectors_words_and_spans(tmp_path, tiny_encoder_dir, lines_file, how):
    out = tmp_path / "w.npz"
    assert main(["embed", "--model", str(tiny_encoder_dir), "--input", str(lines_file), "--word-pooling", how,
                 "--layers", "-2,-1", "--combine", "concat", "--out", str(out)]) == 0
    loaded = load_backbone(tiny_encoder_dir)
    expected = embed_words(loaded.model, loaded.tokenizer, LINES, layers=[-2, -1], combine="concat",
                           word_pooling=how)
    with np.load(out) as arrays:  # no pickled objects: words are a unicode array
        assert sorted(arrays.files) == sorted(f"{k}_{i}" for k in ("arr", "words", "spans") for i in range(3))
        for i, (line, item) in enumerate(zip(LINES, expected, strict=True)):
            np.testing.assert_array_equal(arrays[f"arr_{i}"], item.vectors)
            assert arrays[f"arr_{i}"].shape == (len(item.words), 48)
            assert arrays[f"words_{i}"].tolist() == item.words
            assert [line[s:e] for s, e in arrays[f"spans_{i}"].tolist()] == item.words
    assert expected[0].words == ["Alice", "lives", "in", "Paris", "."]


def test_embed_keeps_the_text_pooling_default_and_rejects_mixed_options(tmp_path, tiny_encoder_dir, lines_file,
                                                                       capsys):
    out = tmp_path / "e.npy"
    assert main(["embed", "--model", str(tiny_encoder_dir), "--input", str(lines_file), "--out", str(out)]) == 0
    loaded = load_backbone(tiny_encoder_dir)
    np.testing.assert_array_equal(np.load(out), embed_texts(loaded.model, loaded.tokenizer, LINES, pooling="mean"))
    assert main(["embed", "--model", str(tiny_encoder_dir), "--input", str(lines_file), "--word-pooling", "first",
                 "--out", str(tmp_path / "w.npy")]) == 2
    assert "word pooling 'first' writes a .npz file" in capsys.readouterr().err
    assert main(["embed", "--model", str(tiny_encoder_dir), "--input", str(lines_file), "--word-pooling", "mean",
                 "--pooling", "cls", "--out", str(tmp_path / "w.npz")]) == 2
    assert "exclude each other" in capsys.readouterr().err


def test_feature_extraction_word_pooling(tiny_encoder_dir):
    fe = lmforge.pipeline("feature-extraction", model=tiny_encoder_dir, layers="-2,-1", combine="mean",
                          word_pooling="mean")
    one = fe("Alice lives in Paris.")
    assert set(one) == {"words", "spans", "vectors"} and one["words"] == ["Alice", "lives", "in", "Paris", "."]
    assert one["spans"][3] == (15, 20) and one["vectors"].shape == (5, 24)
    loaded = load_backbone(tiny_encoder_dir)
    expected = embed_words(loaded.model, loaded.tokenizer, LINES, layers=[-2, -1], word_pooling="mean")
    many = fe(LINES)
    assert len(many) == 3 and [m["words"] for m in many] == [e.words for e in expected]
    for got, item in zip(many, expected, strict=True):
        np.testing.assert_allclose(got["vectors"], item.vectors, atol=1e-6)
    # without word_pooling the pipeline still returns one vector per text
    assert lmforge.pipeline("feature-extraction", model=tiny_encoder_dir)("bob").shape == (24,)


def test_feature_extraction_rejects_bad_word_pooling(tiny_encoder_dir):
    with pytest.raises(LmforgeError, match="exclude each other"):
        lmforge.pipeline("feature-extraction", model=tiny_encoder_dir, pooling="cls", word_pooling="first")
    with pytest.raises(LmforgeError, match="word_pooling='last'"):
        lmforge.pipeline("feature-extraction", model=tiny_encoder_dir, word_pooling="last")

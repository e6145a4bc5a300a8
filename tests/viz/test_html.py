"""The HTML viewer file without a browser: self-contained, and its payload decodes to the model's weights."""

from __future__ import annotations

import re

import numpy as np
import pytest

from lmforge.errors import InputFileError, LmforgeError
from lmforge.viz.attention import AttentionMap, AttentionSet, collect_attention
from lmforge.viz.html import (
    EXACT_LIMIT,
    attention_html,
    choose_precision,
    decode_matrix,
    encode_matrix,
    read_attention_html,
    write_attention_html,
)
from tests.viz import PAIR, TEXT, tiny_model, tiny_tokenizer


def _softmax_rows(rng: np.random.Generator, shape: tuple[int, ...], sharpness: float = 3.0) -> np.ndarray:
    x = rng.normal(size=shape) * sharpness
    e = np.exp(x - x.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)).astype(np.float32)


@pytest.fixture(scope="module")
def seq2seq_attention() -> AttentionSet:
    return collect_attention(tiny_model("seq2seq"), tiny_tokenizer(), TEXT, PAIR)


def test_file_is_self_contained(seq2seq_attention, tmp_path):
    path = write_attention_html(seq2seq_attention, tmp_path / "a.html")
    text = path.read_text(encoding="utf-8")
    assert "http://" not in text and "https://" not in text and "//cdn" not in text
    assert not re.search(r"<(script|link|img|iframe)[^>]*\s(src|href)=", text)  # nothing loaded from anywhere
    assert text.count("<script") == 2 and "<style>" in text
    for control in ('id="map"', 'id="layer"', 'id="head"', 'id="view"', 'id="tooltip"', '"all heads (mean)"'):
        assert control in text


def test_payload_decodes_to_the_model_weights(seq2seq_attention, tmp_path):
    path = write_attention_html(seq2seq_attention, tmp_path / "a.html")
    back = read_attention_html(path)
    assert [m.name for m in back.maps] == ["encoder self-attention", "decoder causal self-attention",
                                            "cross-attention"]
    for got, want in zip(back.maps, seq2seq_attention.maps, strict=True):
        assert (got.rows, got.cols, got.layers, got.heads) == (want.rows, want.cols, want.layers, want.heads)
        np.testing.assert_array_equal(got.weights, want.weights)  # float32 is stored bit for bit


def test_pair_segments_travel_with_the_tokens(tmp_path):
    attn = collect_attention(tiny_model("encoder"), tiny_tokenizer(), TEXT, PAIR)
    back = read_attention_html(attention_html(attn))
    assert back.maps[0].row_segments == attn.maps[0].row_segments and 1 in back.maps[0].col_segments


@pytest.mark.parametrize("precision,levels", [("uint8", 255), ("uint16", 65535)])
def test_quantised_chunks_stay_within_half_a_step_of_the_row_max(precision, levels):
    w = _softmax_rows(np.random.default_rng(0), (37, 53))
    w[3, :] = 0.0  # an all-zero row (fully masked) must not divide by zero
    back = decode_matrix(encode_matrix(w, precision), 37, 53, precision)
    bound = w.max(axis=1, keepdims=True) / (2 * levels) + 1e-7
    assert np.all(np.abs(back - w) <= bound)
    assert np.all(back[3] == 0) and np.allclose(back.max(axis=1), w.max(axis=1))


def test_auto_precision_switches_to_uint8_for_long_inputs():
    small = AttentionSet("s", [AttentionMap("m", ["a"] * 8, ["a"] * 8, [0], [0], np.zeros((1, 1, 8, 8), "f4"))])
    assert choose_precision(small) == "float32"
    side = int(np.sqrt(EXACT_LIMIT)) + 1
    big = AttentionSet("b", [AttentionMap("m", ["a"] * side, ["a"] * side, [0], [0],
                                          np.zeros((1, 1, side, side), "f4"))])
    assert choose_precision(big) == "uint8"
    assert choose_precision(big, "float32") == "float32"
    with pytest.raises(LmforgeError, match="precision 'int4'"):
        choose_precision(big, "int4")


def test_long_input_file_size_with_quantisation():
    # 1 layer x 4 heads of a 512-token input: uint8 + zlib keeps well under 1 byte per weight.
    w = _softmax_rows(np.random.default_rng(1), (1, 4, 512, 512), sharpness=4.0)
    tokens = [f"t{i}" for i in range(512)]
    attn = AttentionSet("long", [AttentionMap("encoder self-attention", tokens, tokens, [0], [0, 1, 2, 3], w)])
    text = attention_html(attn, precision="uint8")
    assert len(text.encode("utf-8")) < w.size
    back = read_attention_html(text).maps[0].weights
    assert np.all(np.abs(back - w) <= w.max(-1, keepdims=True) / 510 + 1e-7)


def test_token_text_cannot_break_out_of_the_script_element():
    tokens = ["</script><img src=x>", "<!--", "ok"]
    attn = AttentionSet("t", [AttentionMap("m", tokens, tokens, [0], [0], np.full((1, 1, 3, 3), 1 / 3, "f4"))])
    text = attention_html(attn)
    assert "</script><img" not in text and "<!--" not in text
    assert read_attention_html(text).maps[0].rows == tokens


def test_read_errors(tmp_path):
    with pytest.raises(InputFileError, match="no such file"):
        read_attention_html(tmp_path / "missing.html")
    (tmp_path / "other.html").write_text("<html><body>hello</body></html>", encoding="utf-8")
    with pytest.raises(InputFileError, match="no lmforge attention data"):
        read_attention_html(tmp_path / "other.html")

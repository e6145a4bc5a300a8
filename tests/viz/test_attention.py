"""collect_attention: the right weights, tokens and segments for every model family."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lmforge.errors import LmforgeError
from lmforge.viz.attention import collect_attention, resolve_indices
from tests.viz import PAIR, TEXT, tiny_model, tiny_tokenizer


def test_encoder_weights_tokens_and_segments():
    model, tok = tiny_model("encoder"), tiny_tokenizer()
    attn = collect_attention(model, tok, TEXT, PAIR)
    (m,) = attn.maps
    enc = tok(TEXT, PAIR)
    assert m.rows == m.cols == tok.convert_ids_to_tokens(enc["input_ids"])
    assert m.rows[0] == "[CLS]" and m.rows.count("[SEP]") == 2
    assert m.row_segments == enc["token_type_ids"] and 1 in m.row_segments
    assert m.layers == [0, 1] and m.heads == [0, 1]
    ids = torch.tensor([enc["input_ids"]])
    with torch.no_grad():
        ref = model(ids, token_type_ids=torch.tensor([enc["token_type_ids"]]), output_attentions=True).attentions
    expected = torch.stack([a[0] for a in ref]).numpy()  # (L, H, T, T)
    np.testing.assert_allclose(m.weights, expected, atol=1e-7)
    np.testing.assert_allclose(m.weights.sum(-1), 1.0, atol=1e-5)


def test_encoder_layer0_against_an_independent_softmax():
    # Oracle outside the model code: softmax(q k^T / sqrt(Dh)) of layer 0 (post-LN: its input is the embeddings).
    model, tok = tiny_model("encoder", kernel="sdpa"), tiny_tokenizer()  # a fast-kernel model still gives weights
    m = collect_attention(model, tok, TEXT, layers=[0]).maps[0]
    ids = torch.tensor([tok(TEXT)["input_ids"]])
    with torch.no_grad():
        x = model.embeddings(ids)  # (1, T, D)
        attn = model.layers[0].self_attn
        H, Dh = 2, 6
        q = attn.q_proj(x).view(1, -1, H, Dh).transpose(1, 2)  # (1, H, T, Dh)
        k = attn.k_proj(x).view(1, -1, H, Dh).transpose(1, 2)
        expected = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(Dh), dim=-1)[0].numpy()  # (H, T, T)
    np.testing.assert_allclose(m.weights[0], expected, atol=1e-6)


def test_layer_and_head_selection_keeps_model_numbering():
    model, tok = tiny_model("encoder"), tiny_tokenizer()
    full = collect_attention(model, tok, TEXT).maps[0]
    part = collect_attention(model, tok, TEXT, layers=[-1], heads=[1]).maps[0]
    assert part.layers == [1] and part.heads == [1]
    np.testing.assert_array_equal(part.weights[0, 0], full.weights[1, 1])
    with pytest.raises(LmforgeError, match="layer 2 does not exist"):
        collect_attention(model, tok, TEXT, layers=[2])
    with pytest.raises(LmforgeError, match="head -3 does not exist"):
        collect_attention(model, tok, TEXT, heads=[-3])


def test_resolve_indices():
    assert resolve_indices(None, 3, "layer") == [0, 1, 2]
    assert resolve_indices([2, -1, 0], 3, "layer") == [2, 0]  # -1 is 2 again: kept once
    with pytest.raises(LmforgeError, match="valid indices are 0..2"):
        resolve_indices([3], 3, "layer")


def test_decoder_is_causal_and_marks_the_pair():
    model, tok = tiny_model("decoder"), tiny_tokenizer()
    m = collect_attention(model, tok, TEXT, PAIR).maps[0]
    ids = [*tok.encode_ids(TEXT), tok.sep_id, *tok.encode_ids(PAIR)]
    assert m.rows == m.cols == tok.convert_ids_to_tokens(ids)
    assert m.name == "decoder causal self-attention"
    assert m.row_segments == [0] * (len(tok.encode_ids(TEXT)) + 1) + [1] * len(tok.encode_ids(PAIR))
    T = len(ids)
    assert np.all(m.weights[..., np.triu_indices(T, 1)[0], np.triu_indices(T, 1)[1]] == 0)
    with torch.no_grad():
        ref = model(torch.tensor([ids]), output_attentions=True).attentions
    np.testing.assert_allclose(m.weights, torch.stack([a[0] for a in ref]).numpy(), atol=1e-7)


def test_encoder_decoder_maps_and_memory():
    model, tok = tiny_model("seq2seq"), tiny_tokenizer()
    attn = collect_attention(model, tok, TEXT, PAIR)
    enc, dec, cross = attn.maps
    src = tok.convert_ids_to_tokens(tok.encode_ids(TEXT))
    tgt = ["[CLS]", *tok.convert_ids_to_tokens(tok.encode_ids(PAIR))]
    assert (enc.rows, enc.cols, dec.rows, dec.cols) == (src, src, tgt, tgt)
    assert (cross.rows, cross.cols) == (tgt, src)  # rows = target tokens, columns = source tokens
    assert enc.layers == [0, 1] and dec.layers == cross.layers == [0, 1, 2]  # 2 encoder, 3 decoder layers
    # The step-by-step encoder pass reproduces EncoderDecoder.encode exactly.
    from lmforge.viz.attention import _encode_with_weights

    src_ids = torch.tensor([tok.encode_ids(TEXT)])
    with torch.no_grad():
        memory, _ = _encode_with_weights(model, src_ids)
        assert torch.equal(memory, model.encode(src_ids))
        out = model(src_ids, torch.tensor([tok.convert_tokens_to_ids(tgt)]), output_attentions=True)
    np.testing.assert_allclose(cross.weights, torch.stack([a[0] for a in out.cross_attentions]).numpy(), atol=1e-7)
    np.testing.assert_allclose(dec.weights, torch.stack([a[0] for a in out.self_attentions]).numpy(), atol=1e-7)
    np.testing.assert_allclose(enc.weights.sum(-1), 1.0, atol=1e-5)
    # An encoder layer index that only the decoder has is an error naming the stack.
    with pytest.raises(LmforgeError, match="encoder layer 2"):
        collect_attention(model, tok, TEXT, PAIR, layers=[2])
    with pytest.raises(LmforgeError, match="--pair"):
        collect_attention(model, tok, TEXT)


def test_rnn_seq2seq_cross_attention():
    model, tok = tiny_model("rnn_seq2seq"), tiny_tokenizer()
    (m,) = collect_attention(model, tok, TEXT, PAIR).maps
    assert m.name == "cross-attention" and m.layers == [0] and m.heads == [0]
    src_ids = torch.tensor([tok.encode_ids(TEXT)])
    tgt_ids = torch.tensor([[tok.cls_id, *tok.encode_ids(PAIR)]])
    assert m.cols == tok.convert_ids_to_tokens(src_ids[0]) and m.rows == tok.convert_ids_to_tokens(tgt_ids[0])
    with torch.no_grad():
        expected = model(src_ids, tgt_ids, output_attentions=True).attentions[0].numpy()  # (T, S)
    np.testing.assert_allclose(m.weights[0, 0], expected, atol=1e-7)
    with pytest.raises(LmforgeError, match="has one"):
        collect_attention(model, tok, TEXT, PAIR, heads=[1])


def test_rnn_encoder_pooling_weights():
    model, tok = tiny_model("rnn"), tiny_tokenizer()
    (m,) = collect_attention(model, tok, TEXT).maps
    assert m.rows == ["[pool]"] and m.cols[0] == "[CLS]" and m.weights.shape == (1, 1, 1, len(m.cols))
    np.testing.assert_allclose(m.weights.sum(), 1.0, atol=1e-6)


def test_truncation_and_bad_inputs():
    model, tok = tiny_model("encoder"), tiny_tokenizer()
    long_text = " ".join(["paris"] * 100)
    assert len(collect_attention(model, tok, long_text).maps[0].rows) == 64  # the model's max_seq_len
    assert len(collect_attention(model, tok, long_text, max_length=9).maps[0].rows) == 9
    with pytest.raises(LmforgeError, match="no tokens"):
        collect_attention(tiny_model("decoder"), tok, "   ")
    with pytest.raises(LmforgeError, match="cannot collect attention"):
        collect_attention(torch.nn.Linear(2, 2), tok, TEXT)


def test_attention_map_checks_its_shape():
    from lmforge.viz.attention import AttentionMap

    m = AttentionMap("m", ["a", "b"], ["a", "b", "c"], [0], [0, 1], np.zeros((1, 2, 2, 3), np.float32))
    assert m.row_segments == [0, 0] and m.col_segments == [0, 0, 0]
    with pytest.raises(LmforgeError, match=r"do not fit 1 layers x 2 heads x 2 rows x 3 columns"):
        AttentionMap("m", ["a", "b"], ["a", "b", "c"], [0], [0, 1], np.zeros((1, 2, 3, 2), np.float32))

"""Word-level contextual embeddings (``embed_words``): pooling against a hand computation, layer combinations,
pre-split input, truncation, and the polysemy property on the real MiniLM checkpoint."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from lmforge.config import ModelConfig
from lmforge.embeddings.contextual import WordVectors, embed_texts, embed_words
from lmforge.errors import LmforgeError
from lmforge.models import Encoder
from lmforge.tokenizers import WordPieceTokenizer

# Words of several pieces ("zebras" = zebra ##s, "qux" = q ##u ##x) next to one-piece words and punctuation.
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "zebra", "runs", "fast", "q", "a", ",", ".", "!",
         "##s", "##u", "##x", "##ly", "slow"]
TEXTS = ["The zebras run slowly, qux!", "qux", "", "the zebra runs fast . the zebras runs slowly ."]


@pytest.fixture(scope="module")
def tiny():
    tok = WordPieceTokenizer(VOCAB)
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=tok.vocab_size, d_model=12, n_heads=2, n_layers=3, d_ff=37, max_seq_len=31,
                         dropout=0.0, attention_dropout=0.0)
    return Encoder(config).eval(), tok


def manual_word_vectors(model, tok, text: str, layers: list[int], combine: str, how: str) -> np.ndarray:
    """Word vectors of one text run alone (no padding), pooled by hand from hidden_states and word_ids."""
    enc = tok(text, return_word_ids=True)
    ids = torch.tensor([enc["input_ids"]])
    with torch.no_grad():
        states = model(ids, output_hidden_states=True).hidden_states
    chosen = [states[i][0] for i in layers]  # each (T, D)
    h = {"mean": lambda: sum(chosen) / len(chosen), "sum": lambda: sum(chosen),
         "concat": lambda: torch.cat(chosen, -1)}[combine]()
    n_words = max((w for w in enc["word_ids"] if w is not None), default=-1) + 1
    rows = []
    for w in range(n_words):
        positions = [t for t, wid in enumerate(enc["word_ids"]) if wid == w]
        rows.append(h[positions[0]] if how == "first" else h[positions].mean(0))
    return torch.stack(rows).numpy() if rows else np.zeros((0, h.shape[-1]), dtype=np.float32)


@pytest.mark.parametrize("how", ["first", "mean"])
@pytest.mark.parametrize(("layers", "combine"), [([-1], "mean"), ([0], "mean"), ([-2, -1], "sum"),
                                                 ([1, 2, 3], "mean"), ([0, -1], "concat")])
def test_word_pooling_equals_a_hand_computation(tiny, how, layers, combine):
    model, tok = tiny
    got = embed_words(model, tok, TEXTS, layers=layers, combine=combine, word_pooling=how, batch_size=3)
    assert len(got) == len(TEXTS)
    for text, item in zip(TEXTS, got, strict=True):
        expected = manual_word_vectors(model, tok, text, layers, combine, how)
        assert item.vectors.dtype == np.float32 and item.vectors.shape == expected.shape
        np.testing.assert_allclose(item.vectors, expected, atol=1e-5, rtol=1e-5)


def test_first_and_mean_differ_only_on_words_of_several_pieces(tiny):
    model, tok = tiny
    first, mean = (embed_words(model, tok, TEXTS[:1], word_pooling=how)[0] for how in ("first", "mean"))
    multi = [len(tok.encode_ids(w)) > 1 for w in first.words]
    assert any(multi) and not all(multi)
    for k, several in enumerate(multi):
        assert np.allclose(first.vectors[k], mean.vectors[k]) != several


def test_words_and_spans_of_raw_text(tiny):
    model, tok = tiny
    item = embed_words(model, tok, ["The zebras run slowly, qux!"], layers=[-3, -1], combine="concat")[0]
    assert isinstance(item, WordVectors)
    assert item.words == ["The", "zebras", "run", "slowly", ",", "qux", "!"]  # original case, punctuation split
    assert item.spans == [(0, 3), (4, 10), (11, 14), (15, 21), (21, 22), (23, 26), (26, 27)]
    assert item.vectors.shape == (7, 24) and item.n_words_total == 7


def test_pre_split_words_equal_raw_text_and_keep_odd_words(tiny):
    model, tok = tiny
    raw = embed_words(model, tok, [TEXTS[0]], layers=[-2, -1], word_pooling="mean")[0]
    pre = embed_words(model, tok, [raw.words], layers=[-2, -1], word_pooling="mean")[0]
    assert pre.words == raw.words and pre.spans is None
    np.testing.assert_allclose(pre.vectors, raw.vectors, atol=1e-6)
    # A CoNLL token holding punctuation stays one word; a token without pieces becomes [UNK] and still counts.
    odd = embed_words(model, tok, [["qux!", "\x07", "zebra"]])[0]
    assert odd.words == ["qux!", "\x07", "zebra"] and odd.vectors.shape == (3, 12)


def test_padding_does_not_change_vectors(tiny):
    model, tok = tiny
    alone = [embed_words(model, tok, [t], layers=[-1])[0].vectors for t in TEXTS]
    batched = embed_words(model, tok, TEXTS, layers=[-1], batch_size=4)
    for a, b in zip(alone, batched, strict=True):
        np.testing.assert_allclose(b.vectors, a, atol=1e-5)


def test_truncation_keeps_whole_words_and_warns(tiny, caplog):
    model, tok = tiny
    text = "the zebras run slowly"  # the(1) zebra ##s(2) [UNK](1) slow ##ly(2)
    with caplog.at_level(logging.WARNING, logger="lmforge"):
        item = embed_words(model, tok, [text], max_length=2 + 4, word_pooling="mean")[0]
    assert item.words == ["the", "zebras", "run"] and item.n_words_total == 4  # "slowly" would need 2 more
    assert "last words were cut" in caplog.text
    np.testing.assert_allclose(item.vectors, manual_word_vectors(model, tok, "the zebras run", [-1], "mean",
                                                                 "mean"), atol=1e-5)


def test_empty_inputs(tiny):
    model, tok = tiny
    assert embed_words(model, tok, []) == []
    items = embed_words(model, tok, ["", []], layers=[-1, -2], combine="concat")
    assert [i.vectors.shape for i in items] == [(0, 24), (0, 24)] and items[0].words == []


def test_bad_options_name_the_fix(tiny):
    model, tok = tiny
    with pytest.raises(LmforgeError, match="word_pooling='last'"):
        embed_words(model, tok, ["the"], word_pooling="last")
    with pytest.raises(LmforgeError, match="layer 7 does not exist"):
        embed_words(model, tok, ["the"], layers=[7])
    with pytest.raises(LmforgeError, match="combine='max'"):
        embed_words(model, tok, ["the"], combine="max")
    with pytest.raises(LmforgeError, match="input 1 must be a text"):
        embed_words(model, tok, ["the", 3])


def test_embed_texts_unchanged_by_the_refactor(tiny):
    model, tok = tiny
    enc = tok(TEXTS[0])
    with torch.no_grad():
        states = model(torch.tensor([enc["input_ids"]]), output_hidden_states=True).hidden_states
    tokens = embed_texts(model, tok, TEXTS, layers=[-2, -1], combine="sum", pooling="none")
    np.testing.assert_allclose(tokens[0], (states[-2] + states[-1])[0].numpy(), atol=1e-5)
    mean = embed_texts(model, tok, TEXTS[:2], layers=[-1], pooling="mean")
    np.testing.assert_allclose(mean[0], states[-1][0].mean(0).numpy(), atol=1e-5)


# ---------------------------------------------------------------------------------------------- polysemy
RIVER = ["We sat on the bank of the river and watched the boats.", "The river overflowed its bank after the storm.",
         "Fish hide near the muddy bank of the stream.", "They walked along the grassy bank of the canal."]
MONEY = ["I deposited my salary at the bank this morning.", "The bank approved our loan for the new house.",
         "She opened a savings account at a local bank.", "The bank raised its interest rates again."]


@pytest.mark.parametrize("layers", [[-1], [-4, -3, -2, -1]])
def test_bank_has_one_static_vector_but_sense_dependent_contextual_vectors(minilm_dir, layers):
    from lmforge.persistence import load_backbone

    loaded = load_backbone(minilm_dir)
    model, tok = loaded.model, loaded.tokenizer
    items = embed_words(model, tok, RIVER + MONEY, layers=layers)
    rows = [[w.lower() for w in item.words].index("bank") for item in items]
    contextual = np.stack([item.vectors[r] for item, r in zip(items, rows, strict=True)])  # (8, 384)
    ids = [tok.encode_ids(item.words[r]) for item, r in zip(items, rows, strict=True)]
    assert all(i == ids[0] for i in ids) and len(ids[0]) == 1  # one piece, the same id in every sentence
    static = np.stack([model.get_input_embeddings().weight[i[0]].detach().numpy() for i in ids])
    np.testing.assert_array_equal(static, np.broadcast_to(static[0], static.shape))  # the static vector is one

    unit = contextual / np.linalg.norm(contextual, axis=1, keepdims=True)
    sim = unit @ unit.T  # (8, 8)
    n = len(RIVER)
    off = ~np.eye(n, dtype=bool)
    within = min(sim[:n, :n][off].mean(), sim[n:, n:][off].mean())
    across = sim[:n, n:].mean()
    assert sim[:n, n:].max() < 0.99  # every occurrence has its own vector
    assert within - across > 0.05, sim  # ... and they group by sense
    nearest = np.where(np.eye(2 * n, dtype=bool), -np.inf, sim).argmax(1)
    assert ((nearest < n) == (np.arange(2 * n) < n)).all(), sim  # each one's nearest neighbour shares its sense


def test_layers_of_different_widths_combine_only_by_concat():
    from lmforge.embeddings.contextual import _select

    states = [torch.ones(1, 3, 4), torch.ones(1, 3, 6), torch.ones(1, 3, 4)]  # an AWD-LSTM: inner layers wider
    assert _select(states, [0, 1], "concat").shape == (1, 3, 10)
    assert _select(states, [0, 2], "mean").shape == (1, 3, 4)
    with pytest.raises(LmforgeError, match=r"--combine mean needs layers of one width.*0: 4, 1: 6.*--combine concat"):
        _select(states, [0, 1], "mean")

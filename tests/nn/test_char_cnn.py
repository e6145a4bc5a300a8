"""The character CNN token layer: spelling, highway by formula, padding characters never matter."""

from __future__ import annotations

import torch

from lmforge.nn.char_cnn import BOUNDARY, BOW, EOW, CharCNN, Highway, spell_tokens


def test_spelling_marks_words_and_boundaries():
    table = spell_tokens(["[PAD]", "[CLS]", "[SEP]", "ab", "##é", "abcdefgh"], 6)
    assert table.shape == (6, 6) and table.dtype == torch.int16
    assert table[0].tolist() == [0] * 6
    assert table[1].tolist() == table[2].tolist() == [BOW, BOUNDARY, EOW, 0, 0, 0]
    assert table[3].tolist() == [BOW, ord("a") + 1, ord("b") + 1, EOW, 0, 0]
    assert table[4].tolist() == [BOW, ord("#") + 1, ord("#") + 1, 0xC3 + 1, 0xA9 + 1, EOW]
    assert table[5].tolist() == [BOW, *(ord(c) + 1 for c in "abcd"), EOW]  # cut to max_chars - 2 bytes


def test_highway_follows_the_formula():
    torch.manual_seed(0)
    highway = Highway(5, 2)
    x = torch.randn(3, 7, 5)
    expected = x
    for layer in highway.layers:
        W, b = layer.weight, layer.bias
        h = torch.relu(expected @ W[:5].T + b[:5])
        t = torch.sigmoid(expected @ W[5:].T + b[5:])
        expected = t * h + (1 - t) * expected
    torch.testing.assert_close(highway(x), expected)
    assert torch.all(highway.layers[0].bias[5:] == -2.0)  # starts close to carrying its input


def test_output_does_not_depend_on_padding_characters():
    torch.manual_seed(0)
    cnn = CharCNN(d_char=4, filters=[[1, 3], [2, 5], [4, 6]], n_highway=1, d_out=7)
    words = ["a", "ab", "hello", "[CLS]"]
    short, long = spell_tokens(words, 7), spell_tokens(words, 15)  # "hello" fits in 7
    out_short = cnn(short.unsqueeze(0))
    torch.testing.assert_close(out_short, cnn(long.unsqueeze(0)))  # more padding: the same vectors
    with torch.no_grad():  # the padding row is zero and receives no update (padding_idx)
        assert torch.all(cnn.embeddings.weight[0] == 0)
    out_short.sum().backward()
    assert torch.all(cnn.embeddings.weight.grad[0] == 0)
    # one word's vector does not depend on the other tokens of the batch
    torch.testing.assert_close(cnn(short[2:3].unsqueeze(0))[0, 0], out_short[0, 2])

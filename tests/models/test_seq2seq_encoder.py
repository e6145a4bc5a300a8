"""The encoder of an encoder-decoder alone (family seq2seq_encoder): the same function as the encoder-decoder's
``encode``, a masked-mean pooled output, and a BART-style folder fine-tuned and embedded through it."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from lmforge.cli import main
from lmforge.config import ModelConfig
from lmforge.errors import LmforgeError
from lmforge.models import architecture
from lmforge.models.seq2seq import EncoderDecoder, SourceEncoder
from lmforge.persistence import load_pretrained, save_pretrained

V = 41
SHAPES = {
    # BART's choices: post-LN, learned positions, GELU, one shared table, no embedding scaling
    "bart": dict(positional="learned", activation="gelu", norm_first=False, scale_embeddings=False),
    # the Transformer's: sinusoidal positions, scaled embeddings; pre-LN closes the encoder with a LayerNorm; two
    # tables
    "pre-ln, two tables": dict(norm_first=True, share_embeddings=False, tie_embeddings=False),
    "rotary": dict(positional="rotary"),
}


def encoder_decoder(seed: int = 0, **kw) -> EncoderDecoder:
    torch.manual_seed(seed)
    config = ModelConfig(**{**dict(arch="seq2seq", vocab_size=V, d_model=12, n_heads=3, n_layers=2,
                                   n_decoder_layers=1, d_ff=20, max_seq_len=16, dropout=0.0, attention_dropout=0.0),
                           **kw})
    return EncoderDecoder(config).eval()


@pytest.mark.parametrize("shape", SHAPES)
def test_the_wrapped_encoder_computes_exactly_the_encoder_decoders_encode(shape):
    model = encoder_decoder(**SHAPES[shape])
    encoder = SourceEncoder.wrap(model).eval()
    assert encoder.config.arch == "seq2seq_encoder"
    assert not any(k.startswith(("decoder", "tgt_", "lm_head")) for k in encoder.state_dict())
    ids = torch.randint(5, V, (3, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(3, 9, dtype=torch.long)
    mask[1, 6:] = 0
    mask[2, :2] = 0  # left padding
    with torch.no_grad():
        expected = model.encode(ids, mask)
        out = encoder(ids, attention_mask=mask, output_hidden_states=True)
        seen = encoder(ids, attention_mask=mask, output_attentions=[-1])  # that layer takes the math kernel
    real = mask.bool()
    torch.testing.assert_close(out.last_hidden_state[real], expected[real], rtol=0, atol=0)
    assert len(out.hidden_states) == 3 and torch.equal(out.hidden_states[-1], out.last_hidden_state)
    assert seen.attentions[0] is None and seen.attentions[1].shape == (3, 3, 9, 9)
    weights = seen.attentions[1]
    torch.testing.assert_close(weights.sum(-1), torch.ones(3, 3, 9))
    assert float((weights * (~real)[:, None, None, :]).abs().max()) == 0.0  # padding is never attended to
    torch.testing.assert_close(seen.last_hidden_state[real], expected[real], rtol=1e-5, atol=1e-5)
    # the pooled output is the mean over the real tokens, padding on either side ignored
    for row in range(3):
        torch.testing.assert_close(out.pooled_output[row], expected[row][real[row]].mean(0))


def test_padding_side_does_not_change_the_pooled_output():
    encoder = SourceEncoder.wrap(encoder_decoder(**SHAPES["bart"])).eval()
    ids = torch.randint(5, V, (1, 6), generator=torch.Generator().manual_seed(2))
    right = torch.cat([ids, torch.zeros(1, 3, dtype=torch.long)], 1)
    left = torch.cat([torch.zeros(1, 3, dtype=torch.long), ids], 1)
    with torch.no_grad():
        alone = encoder(ids).pooled_output
        r = encoder(right, attention_mask=(right != 0).long()).pooled_output
        lft = encoder(left, attention_mask=(left != 0).long()).pooled_output
    torch.testing.assert_close(r, alone)
    torch.testing.assert_close(lft, alone)


def test_wrap_options_round_trip_and_errors(tmp_path):
    model = encoder_decoder(**SHAPES["bart"])
    encoder = SourceEncoder.wrap(model, dropout=0.3)
    assert encoder.config.dropout == 0.3 and encoder.config.d_model == 12
    save_pretrained(encoder.eval(), tmp_path / "enc")
    loaded = load_pretrained(tmp_path / "enc")
    ids = torch.randint(5, V, (2, 7))
    with torch.no_grad():
        assert torch.equal(loaded.model(ids).last_hidden_state, encoder(ids).last_hidden_state)
    with pytest.raises(LmforgeError, match="takes an EncoderDecoder"):
        SourceEncoder.wrap(encoder)
    with pytest.raises(LmforgeError, match="arch='seq2seq_encoder'"):
        SourceEncoder(model.config)
    with pytest.raises(LmforgeError, match="max_seq_len=16"):
        encoder(torch.randint(5, V, (1, 17)))
    assert architecture("seq2seq").finetune_as == "seq2seq_encoder"


@pytest.fixture(scope="module")
def bart_folder(tmp_path_factory):
    """A tiny random BART-shaped encoder-decoder folder with the toy tasks' tokenizer."""
    from lmforge.config import model_config_from_preset
    from lmforge.tokenizers import WordPieceTokenizer
    from tests.toy_tasks import vocab

    tokenizer = WordPieceTokenizer(vocab())
    config = model_config_from_preset("bart-tiny", vocab_size=tokenizer.vocab_size, d_model=16, n_heads=2, d_ff=32,
                                      max_seq_len=64, n_layers=1, n_decoder_layers=1, dropout=0.0)
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("bart") / "model"
    save_pretrained(EncoderDecoder(config), folder, tokenizer=tokenizer)
    return folder


@pytest.mark.parametrize("task", ["sequence", "token", "qa"])
def test_an_encoder_decoder_folder_fine_tunes_through_its_encoder(bart_folder, tmp_path, task):
    from tests.conftest import FINETUNE_ARGS
    from tests.toy_tasks import write_task_data

    train, dev = write_task_data(tmp_path / "data", task, n_train=16, n_dev=8)
    out = tmp_path / "run"
    assert main(["-q", "finetune", "--task", task, "--model", str(bart_folder), "--train", str(train), "--dev",
                 str(dev), "--out", str(out), "--epochs", "1", "--batch-size", "8", "--max-length", "32",
                 "--model.dropout=0.2", *FINETUNE_ARGS[task]]) == 0
    loaded = load_pretrained(out)
    assert loaded.config.arch == "seq2seq_encoder" and loaded.config.dropout == 0.2 and loaded.head is not None
    start = load_pretrained(bart_folder).model
    if task == "sequence":  # the encoder started from the folder's weights (the layers moved, the shapes kept)
        assert loaded.model.backbone.embedding.weight.shape == start.src_embed.weight.shape
        assert main(["-q", "predict", "--model", str(out), "--input", str(dev), "--out",
                     str(tmp_path / "pred.jsonl")]) == 0
        records = [json.loads(line) for line in (tmp_path / "pred.jsonl").read_text().splitlines()]
        assert len(records) == 8 and all("label" in r for r in records)


def test_embed_reads_an_encoder_decoder_folder_through_its_encoder(bart_folder, tmp_path):
    lines = tmp_path / "lines.txt"
    lines.write_text("the movie was good\nbad plot\n")
    assert main(["-q", "embed", "--model", str(bart_folder), "--input", str(lines), "--out",
                 str(tmp_path / "v.npy")]) == 0
    vectors = np.load(tmp_path / "v.npy")
    loaded = load_pretrained(bart_folder)
    encoder = SourceEncoder.wrap(loaded.model).eval()
    ids = torch.tensor([loaded.tokenizer("bad plot")["input_ids"]])
    with torch.no_grad():
        expected = encoder(ids).last_hidden_state.mean(1)[0].numpy()
    assert vectors.shape == (2, 16)
    np.testing.assert_allclose(vectors[1], expected, rtol=1e-5, atol=1e-6)

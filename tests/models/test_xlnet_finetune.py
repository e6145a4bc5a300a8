"""XLNet fine-tunes through the existing tasks: its ``pooled_output`` is the last real token's state (XLNet's "last"
sequence summary), so the sequence and pair heads read it and the token, span and QA heads read
``last_hidden_state``, through the command line, and a fine-tuned folder evaluates as saved."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from lmforge.cli import main
from lmforge.config import ModelConfig
from lmforge.models.xlnet import XLNet
from tests.conftest import FINETUNE_ARGS
from tests.toy_tasks import vocab, write_task_data

METRIC = {"sequence": "accuracy", "pair": "accuracy", "token": "f1", "span": "f1", "qa": "f1"}


def make_xlnet_dir(path: Path, *, seed: int = 0, **overrides: object) -> Path:
    """A randomly initialised tiny XLNet with the toy tokenizer, saved as an lmforge model folder."""
    from lmforge.persistence import save_pretrained
    from lmforge.tokenizers import WordPieceTokenizer

    tokenizer = WordPieceTokenizer(vocab())
    torch.manual_seed(seed)
    config = ModelConfig(**{**dict(arch="xlnet", vocab_size=tokenizer.vocab_size, d_model=24, n_heads=2, n_layers=2,
                                    d_ff=48, max_seq_len=64, dropout=0.0, attention_dropout=0.0), **overrides})
    save_pretrained(XLNet(config), path, tokenizer=tokenizer)
    return path


def tiny(attn_type: str = "bi") -> XLNet:
    torch.manual_seed(0)
    config = ModelConfig(arch="xlnet", vocab_size=40, d_model=12, n_heads=3, n_layers=2, d_ff=20, dropout=0.0,
                         attention_dropout=0.0, attn_type=attn_type)
    return XLNet(config).double().eval()


@pytest.mark.parametrize("attn_type", ["bi", "uni"])
def test_pooled_output_is_the_last_real_tokens_state_whatever_the_padding(attn_type):
    model = tiny(attn_type)
    lengths = [5, 3, 7]
    ids = torch.randint(5, 40, (3, 7), generator=torch.Generator().manual_seed(1))
    mask = torch.zeros(3, 7, dtype=torch.long)
    for row, n in enumerate(lengths):
        mask[row, :n] = 1
    types = torch.zeros(3, 7, dtype=torch.long)
    types[:, 2:] = 1
    with torch.no_grad():
        out = model(ids, attention_mask=mask, token_type_ids=types)
        assert out.pooled_output.shape == (3, 12)
        for row, n in enumerate(lengths):
            torch.testing.assert_close(out.pooled_output[row], out.last_hidden_state[row, n - 1])
            alone = model(ids[row:row + 1, :n], token_type_ids=types[row:row + 1, :n])  # no padding, no mask
            torch.testing.assert_close(alone.pooled_output[0], alone.last_hidden_state[0, -1])
            torch.testing.assert_close(out.pooled_output[row], alone.pooled_output[0])
        # the padding's ids do not matter
        other = torch.where(mask.bool(), ids, (ids + 7) % 40)
        torch.testing.assert_close(model(other, attention_mask=mask, token_type_ids=types).pooled_output,
                                   out.pooled_output)


def test_xlnet_output_reads_as_an_encoder_output():
    from lmforge.models import architecture
    from lmforge.models.encoder import EncoderOutput

    out = tiny()(torch.randint(5, 40, (2, 4)), output_hidden_states=True)
    assert out._fields[:4] == EncoderOutput._fields
    record = architecture("xlnet")
    assert record.encodes_text and record.has_pooled_output and record.generates and record.is_causal_lm
    assert not record.position_limited  # relative positions


@pytest.fixture(scope="module")
def xlnet_dir(tmp_path_factory):
    return make_xlnet_dir(tmp_path_factory.mktemp("xlnet"))


@pytest.mark.parametrize("task", ["sequence", "pair", "token", "qa"])
def test_xlnet_fine_tunes_for_every_task_and_evaluates_as_saved(xlnet_dir, task, tmp_path, capsys):
    from lmforge.persistence import load_pretrained

    train, dev = write_task_data(tmp_path, task)
    out = tmp_path / "run"
    code = main(["-q", "finetune", "--task", task, "--model", str(xlnet_dir), "--train", str(train), "--dev",
                 str(dev), "--out", str(out), "--epochs", "2", "--batch-size", "8", "--lr", "3e-3", "--max-length",
                 "32", "--seed", "0", *FINETUNE_ARGS[task]])
    assert code == 0, capsys.readouterr().err
    loaded = load_pretrained(out)
    assert loaded.config.arch == "xlnet" and isinstance(loaded.model.backbone, XLNet)
    recorded = json.loads((out / "eval_results.json").read_text())[METRIC[task]]
    capsys.readouterr()
    assert main(["-q", "evaluate", "--model", str(out), "--test", str(dev)]) == 0
    assert json.loads(capsys.readouterr().out)[METRIC[task]] == pytest.approx(recorded, abs=1e-9)


def test_an_xlnet_classifier_has_xlnets_summary_and_exports_as_xlnet_for_sequence_classification(xlnet_dir, tmp_path):
    # XLNet classifies a tanh projection of its last token (its released code's summary, Hugging Face's
    # sequence_summary): new heads get it, and the model then exports to transformers with equal logits
    transformers = pytest.importorskip("transformers", reason="transformers is the export's reader (dev extra)")
    import torch

    from lmforge.persistence import load_pretrained

    train, dev = write_task_data(tmp_path, "sequence", n_train=16, n_dev=8)
    out = tmp_path / "run"
    assert main(["-q", "finetune", "--task", "sequence", "--model", str(xlnet_dir), "--train", str(train), "--dev",
                 str(dev), "--out", str(out), "--epochs", "1", "--batch-size", "8", "--max-length", "32"]) == 0
    loaded = load_pretrained(out)
    assert loaded.head["hidden"] == "tanh" and loaded.model.head.dense is not None
    assert main(["-q", "convert", "--to-hf", str(out), "--out", str(tmp_path / "hf")]) == 0
    hf = transformers.XLNetForSequenceClassification.from_pretrained(tmp_path / "hf").eval()
    ids = torch.tensor([loaded.tokenizer.encode("the cat sat on the mat")["input_ids"]])
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(ids, torch.ones_like(ids)).logits, hf(ids).logits,
                                   rtol=1e-4, atol=1e-5)

"""RNN encoder with attention pooling: outputs and shapes, padding invariance, every score and cell, the sequence
head and layer-wise freezing on top of it, save/load, and ``lmforge finetune --task sequence --model rnn-attn``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from lmforge.cli import main
from lmforge.config import ModelConfig, model_config_from_preset
from lmforge.errors import LmforgeError
from lmforge.heads import TaskModel, build_head
from lmforge.models import ARCHITECTURES
from lmforge.models.encoder import EncoderOutput
from lmforge.models.rnn_encoder import RNNEncoder
from lmforge.persistence import load_pretrained, save_pretrained
from lmforge.training.freeze import freeze
from tests.toy_tasks import make_encoder_dir, write_sequence

B, T, V, D = 3, 7, 99, 12


def _config(**overrides) -> ModelConfig:
    values = dict(arch="rnn", vocab_size=V, d_model=D, n_heads=1, n_layers=2, max_seq_len=16, dropout=0.0)
    values.update(overrides)
    return ModelConfig(**values)


def _model(seed: int = 0, **overrides) -> RNNEncoder:
    torch.manual_seed(seed)
    return RNNEncoder(_config(**overrides)).double().eval()


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    """A right-padded row, a left-padded row and a full row; the padding ids are random (they must not matter)."""
    ids = torch.randint(1, V, (B, T), generator=torch.Generator().manual_seed(5))
    mask = torch.ones(B, T, dtype=torch.long)
    mask[0, 4:] = 0
    mask[1, :2] = 0
    return ids, mask


def test_outputs_and_shapes():
    model = _model()
    ids, mask = _batch()
    with torch.no_grad():
        out = model(ids, mask, token_type_ids=torch.ones_like(ids), output_hidden_states=True,
                    output_attentions=True)
        plain = model(ids, mask)
    assert isinstance(out, EncoderOutput)
    assert out.last_hidden_state.shape == (B, T, D) and out.pooled_output.shape == (B, D)
    assert len(out.hidden_states) == 3 and out.hidden_states[-1] is out.last_hidden_state  # embeddings + 2 layers
    assert out.hidden_states[0].shape == (B, T, D)
    (weights,) = out.attentions
    assert weights.shape == (B, 1, 1, T)
    torch.testing.assert_close(weights.sum(-1), torch.ones(B, 1, 1, dtype=torch.float64))
    assert float(weights[..., :].squeeze()[mask == 0].abs().max()) == 0.0
    # pooled = the attention-weighted average of the states
    torch.testing.assert_close(out.pooled_output, torch.einsum("bt,btd->bd", weights[:, 0, 0], out.last_hidden_state))
    # token_type_ids are ignored, and the flags only add outputs
    torch.testing.assert_close(plain.pooled_output, out.pooled_output, rtol=0, atol=0)
    assert plain.hidden_states is None and plain.attentions is None
    assert float(out.last_hidden_state[mask == 0].abs().max()) == 0.0


@pytest.mark.parametrize("cell", ["gru", "lstm"])
@pytest.mark.parametrize("score", ["dot", "scaled_dot", "general", "additive", "cosine", "location"])
def test_padding_is_invisible_for_every_score_and_cell(score, cell):
    model = _model(attention=score, rnn_cell=cell)
    ids, mask = _batch()
    with torch.no_grad():
        out = model(ids, mask)
        torch.testing.assert_close(model(ids.masked_fill(mask == 0, 7), mask).pooled_output, out.pooled_output,
                                   rtol=0, atol=0)
        for b in range(B):
            keep = mask[b] == 1
            alone = model(ids[b:b + 1, keep])
            torch.testing.assert_close(alone.pooled_output[0], out.pooled_output[b], rtol=1e-12, atol=1e-12)
            torch.testing.assert_close(alone.last_hidden_state[0], out.last_hidden_state[b, keep])


def test_unidirectional_and_state_dict_names():
    model = _model(bidirectional=False, d_model=11, n_layers=1)
    ids, mask = _batch()
    with torch.no_grad():
        assert model(ids, mask).pooled_output.shape == (B, 11)
    keys = set(_model().state_dict())
    assert {"embeddings.weight", "layers.0.weight_ih_l0", "layers.1.weight_hh_l0_reverse", "pooler.query",
            "pooler.attention.score.weight"} <= keys
    assert float(_model().get_input_embeddings().weight[0].detach().abs().max()) == 0.0  # padding row


def test_sequence_head_and_layerwise_freezing_see_the_backbone():
    model = _model().float().train()
    head = build_head({"type": "sequence_classification", "labels": ["neg", "pos"]}, model.config, model)
    task_model = TaskModel(model, head)
    ids, mask = _batch()
    out = task_model(ids, mask, torch.zeros_like(ids), labels=torch.tensor([0, 1, 1]))
    assert out.logits.shape == (B, 2) and out.loss_sum.requires_grad
    frozen = freeze(task_model, "all-but-last:1")
    assert "backbone.embeddings.weight" in frozen and "backbone.layers.0.weight_ih_l0" in frozen
    assert not any(name.startswith(("backbone.layers.1.", "backbone.pooler.")) for name in frozen)


def test_preset_and_save_load_round_trip(tmp_path):
    config = model_config_from_preset("rnn-attn", vocab_size=V, d_model=D)
    torch.manual_seed(0)
    model = ARCHITECTURES[config.arch](config).eval()
    assert isinstance(model, RNNEncoder) and model.config is config and model.pooler is not None
    save_pretrained(model, tmp_path / "m")
    loaded = load_pretrained(tmp_path / "m")
    ids, mask = _batch()
    with torch.no_grad():
        a, b = model(ids, mask), loaded.model(ids, mask)
    torch.testing.assert_close(b.last_hidden_state, a.last_hidden_state, rtol=0, atol=0)
    torch.testing.assert_close(b.pooled_output, a.pooled_output, rtol=0, atol=0)


def test_bad_inputs_are_clear_errors():
    model = _model(attention="location", max_seq_len=8)
    ids, mask = _batch()
    with pytest.raises(LmforgeError, match="max_seq_len=8"):
        model(torch.ones(1, 9, dtype=torch.long))
    _model(max_seq_len=8)(torch.ones(1, 9, dtype=torch.long))  # content scores read any length
    with pytest.raises(LmforgeError, match="unsqueeze"):
        model(ids[0])
    with pytest.raises(LmforgeError, match="outside the vocabulary"):
        model(ids.masked_fill(mask == 0, V))
    with pytest.raises(LmforgeError, match="attention_mask must be"):
        model(ids, mask[:, :3])
    with pytest.raises(LmforgeError, match="integers"):
        model(ids.double())
    with pytest.raises(LmforgeError, match="attention_window=2"):
        RNNEncoder(_config(attention_window=2))


# ------------------------------------------------------------------------------------------------ the CLI
@pytest.mark.slow
def test_finetune_cli_with_the_rnn_attn_preset(tmp_path: Path, capsys):
    """``lmforge finetune --task sequence --model rnn-attn --tokenizer DIR`` learns the toy task; ``lmforge
    evaluate`` on the saved folder gives the same metrics."""
    tokenizer_dir = make_encoder_dir(tmp_path / "tok")
    train = write_sequence(tmp_path / "train.csv", 48, 1)
    dev = write_sequence(tmp_path / "dev.csv", 16, 2)
    out = tmp_path / "run"
    code = main(["-q", "finetune", "--task", "sequence", "--model", "rnn-attn", "--tokenizer", str(tokenizer_dir),
                 "--train", str(train), "--dev", str(dev), "--out", str(out), "--epochs", "8", "--batch-size", "8",
                 "--lr", "3e-3", "--max-length", "32", "--seed", "0"])
    assert code == 0
    results = json.loads((out / "eval_results.json").read_text())
    assert results["accuracy"] >= 0.85  # 16 dev examples: at least 14 right (one example is 6 points; chance 0.5)
    loaded = load_pretrained(out)
    assert loaded.config.arch == "rnn" and isinstance(loaded.model.backbone, RNNEncoder)
    capsys.readouterr()
    assert main(["evaluate", "--model", str(out), "--test", str(dev)]) == 0
    again = json.loads(capsys.readouterr().out)
    for name in ("accuracy", "f1", "mcc"):
        assert again[name] == pytest.approx(results[name], abs=1e-9), name

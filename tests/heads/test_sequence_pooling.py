"""``--task.pooling mean``: a sequence classifier over the mean of the final states of the real tokens (the [CLS]
state and pooler of an encoder pretrained by MLM alone never received a gradient)."""

from __future__ import annotations

import json

import pytest
import torch

from lmforge.config import ModelConfig, TaskConfig
from lmforge.errors import LmforgeError
from lmforge.heads.base import TaskModel
from lmforge.heads.classification import SequenceClassificationHead, build_sequence_head, mean_states
from lmforge.models.encoder import Encoder


def test_mean_states_by_formula_ignores_padding():
    hidden = torch.arange(2 * 4 * 3, dtype=torch.float32).reshape(2, 4, 3)
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])
    got = mean_states(hidden, mask)
    assert torch.equal(got[0], (hidden[0, 0] + hidden[0, 1]) / 2)
    assert torch.equal(got[1], hidden[1].mean(0))
    assert torch.equal(mean_states(hidden, None), hidden.mean(1))


def _model(pooling: str) -> TaskModel:
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=50, d_model=16, n_heads=2, n_layers=2, d_ff=32, max_seq_len=16)
    encoder = Encoder(config).eval()
    return TaskModel(encoder, build_sequence_head(config, encoder, labels=["a", "b", "c"], pooling=pooling)).eval()


def test_the_mean_head_classifies_the_masked_mean_of_the_last_layer():
    model = _model("mean")
    ids = torch.randint(1, 50, (2, 6), generator=torch.Generator().manual_seed(1))
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1] * 6])
    logits = model(ids, mask).logits
    states = model.backbone(ids, attention_mask=mask).last_hidden_state  # the full last layer (not [CLS] alone)
    expected = model.head.classifier(mean_states(states, mask))
    torch.testing.assert_close(logits, expected)
    padded = ids.clone()
    padded[0, 4:] = 7  # what sits at padded positions changes nothing
    torch.testing.assert_close(model(padded, mask).logits, logits)
    assert not model._pooled_only and _model("cls")._pooled_only  # cls keeps the [CLS]-only last layer


def test_cls_pooling_is_unchanged_and_mean_differs():
    ids = torch.randint(1, 50, (2, 6), generator=torch.Generator().manual_seed(1))
    cls = _model("cls")
    mean = _model("mean")
    mean.load_state_dict(cls.state_dict())  # same weights, other pooling
    out = cls.backbone(ids)
    torch.testing.assert_close(cls(ids).logits, cls.head.classifier(out.pooled_output))
    assert not torch.allclose(cls(ids).logits, mean(ids).logits)


def test_bad_poolings_are_refused_in_one_line():
    with pytest.raises(LmforgeError, match="pooling='max' is not one of cls, mean"):
        SequenceClassificationHead(8, ["a", "b"], pooling="max")
    with pytest.raises(LmforgeError, match="pooling='max' is not one of cls, mean"):
        TaskConfig(pooling="max")
    with pytest.raises(LmforgeError, match="task 'token' has its own pooling"):
        TaskConfig(task="token", pooling="mean")


def test_an_awd_lstm_keeps_its_concat_pooling():
    from lmforge.config import model_config_from_preset
    from lmforge.models.loading import build_backbone

    config = model_config_from_preset("awd-lstm-small", vocab_size=40)
    with pytest.raises(LmforgeError, match="concat pooling"):
        build_sequence_head(config, build_backbone(config), labels=["a", "b"], pooling="mean")


def test_a_model_fine_tuned_with_mean_pooling_saves_and_reloads_it(tiny_encoder_dir, tmp_path):
    from lmforge.cli import main
    from lmforge.recipes.finetune import load_task_model
    from tests.toy_tasks import write_task_data

    train, dev = write_task_data(tmp_path, "sequence")
    out = tmp_path / "run"
    assert main(["-q", "finetune", "--task", "sequence", "--model", str(tiny_encoder_dir), "--train", str(train),
                 "--dev", str(dev), "--out", str(out), "--epochs", "1", "--batch-size", "8", "--max-length", "32",
                 "--task.pooling=mean"]) == 0
    head = json.loads((out / "config.json").read_text())["head"]
    assert head["pooling"] == "mean"
    model, task, _ = load_task_model(str(out))
    assert model.head.pooling == "mean" and task.config.pooling == "mean"

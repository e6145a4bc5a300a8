"""Every fine-tuning task takes ALBERT- and DistilBERT-shaped encoders as backbones (factorised embeddings, shared
layers, no segment embedding, no pooler), through the command line, and their folders evaluate as saved."""

from __future__ import annotations

import json

import pytest

from lmforge.cli import main
from lmforge.persistence import load_pretrained
from tests.conftest import FINETUNE_ARGS
from tests.toy_tasks import make_encoder_dir, write_task_data

SHAPES = {"albert": dict(embedding_size=8, share_layers="all"),
          "distilbert": dict(type_vocab_size=0, pooler=False)}
METRIC = {"sequence": "accuracy", "pair": "accuracy", "token": "f1", "span": "f1", "qa": "f1"}


@pytest.fixture(scope="module", params=sorted(SHAPES))
def backbone(request, tmp_path_factory):
    return request.param, make_encoder_dir(tmp_path_factory.mktemp(request.param), **SHAPES[request.param])


@pytest.mark.parametrize("task", ["sequence", "pair", "token", "span", "qa"])
def test_compact_encoders_fine_tune_for_every_task(backbone, task, tmp_path, capsys):
    shape, model_dir = backbone
    train, dev = write_task_data(tmp_path, task)
    out = tmp_path / "run"
    code = main(["-q", "finetune", "--task", task, "--model", str(model_dir), "--train", str(train), "--dev", str(dev),
                 "--out", str(out), "--epochs", "2", "--batch-size", "8", "--lr", "3e-3", "--max-length", "32",
                 "--seed", "0", *FINETUNE_ARGS[task]])
    assert code == 0, capsys.readouterr().err
    loaded = load_pretrained(out)
    for key, value in SHAPES[shape].items():
        assert getattr(loaded.config, key) == value
    if shape == "albert":
        layers = loaded.model.backbone.layers
        assert all(layer is layers[0] for layer in layers)  # still one shared layer after fine-tuning and loading
    recorded = json.loads((out / "eval_results.json").read_text())[METRIC[task]]
    capsys.readouterr()
    assert main(["-q", "evaluate", "--model", str(out), "--test", str(dev)]) == 0
    assert json.loads(capsys.readouterr().out)[METRIC[task]] == pytest.approx(recorded, abs=1e-9)

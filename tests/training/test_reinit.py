"""``--reinit-layers K`` (Zhang et al. 2021): exactly the top K layers and the pooler are drawn again."""

import pytest
import torch

from lmforge.config import ModelConfig
from lmforge.errors import LmforgeError
from lmforge.heads import TaskModel, build_head
from lmforge.models import ARCHITECTURES
from lmforge.training.reinit import reinit_top_layers

TINY = dict(vocab_size=50, d_model=16, n_heads=2, n_layers=3, d_ff=24, max_seq_len=16)
HEAD = {"type": "sequence_classification", "labels": ["a", "b"]}


def task_model(arch: str = "encoder", **kw) -> TaskModel:
    torch.manual_seed(0)
    config = ModelConfig(arch=arch, **{**TINY, **kw})
    backbone = ARCHITECTURES[arch](config)
    with torch.no_grad():  # weights a fresh draw cannot give back: every tensor moved off its initialisation
        for p in backbone.parameters():
            p.add_(0.5)
    return TaskModel(backbone, build_head(HEAD, config, backbone))


@pytest.mark.parametrize("k", [0, 1, 2, 3])
def test_exactly_the_top_k_layers_and_the_pooler_are_redrawn(k):
    model = task_model()
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    torch.manual_seed(1)
    done = reinit_top_layers(model, k)
    assert done == [f"backbone.layers.{i}" for i in range(3 - k, 3)] + (["backbone.pooler"] if k else [])
    for name, p in model.named_parameters():
        fresh = any(name.startswith(f"{prefix}.") for prefix in done)
        assert torch.equal(p, before[name]) != fresh, name
    std = model.backbone.config.init_std
    for prefix in done:  # drawn as the family draws new weights (lmforge.nn.init.normal_init)
        module = model.get_submodule(prefix)
        for m in module.modules():
            if isinstance(m, torch.nn.LayerNorm):
                assert torch.equal(m.weight, torch.ones_like(m.weight)) and not m.bias.any()
            elif isinstance(m, torch.nn.Linear):
                assert m.bias is None or not m.bias.any()
                assert abs(float(m.weight.mean())) < 0.05 and float(m.weight.std()) < 2 * std


def test_a_decoder_has_no_pooler_and_keeps_its_final_norm():
    model = task_model("decoder", norm_first=True)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    assert reinit_top_layers(model, 1) == ["backbone.layers.2"]
    changed = {name for name, p in model.named_parameters() if not torch.equal(p, before[name])}
    assert changed and all(name.startswith("backbone.layers.2.") for name in changed)


def test_what_cannot_be_reinitialised_is_refused():
    with pytest.raises(LmforgeError, match="the backbone has 3 layers"):
        reinit_top_layers(task_model(), 4)
    with pytest.raises(LmforgeError, match="shares its layers across depths"):
        reinit_top_layers(task_model(share_layers="all"), 1)
    with pytest.raises(LmforgeError, match="a rnn backbone has no such layers"):
        reinit_top_layers(task_model("rnn"), 1)


def test_the_task_setting_is_checked():
    from lmforge.config import TaskConfig

    assert TaskConfig(reinit_layers=2).reinit_layers == 2
    with pytest.raises(LmforgeError, match="reinit_layers=-1 must be an integer >= 0"):
        TaskConfig(reinit_layers=-1)

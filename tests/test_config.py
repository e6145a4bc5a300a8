from dataclasses import dataclass, field

import pytest

from lmforge.config import (
    PRESETS,
    ModelConfig,
    apply_overrides,
    from_dict,
    load_toml,
    model_config_from_preset,
    to_dict,
)
from lmforge.errors import LmforgeError


@dataclass
class RunConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    name: str = "run"
    steps: int = 10
    lr: float = 1e-3


def test_every_preset_builds_and_round_trips():
    for name in PRESETS:
        config = model_config_from_preset(name, vocab_size=99)
        if config.transformer:  # an RNN has no heads to divide d_model between
            assert config.d_model % config.n_heads == 0
        assert from_dict(ModelConfig, to_dict(config)) == config


def test_preset_sizes_and_defaults():
    base = model_config_from_preset("bert-base")
    assert (base.n_layers, base.d_model, base.n_heads, base.d_ff) == (12, 768, 12, 3072)
    big = model_config_from_preset("transformer-big")
    assert (big.n_layers, big.n_decoder_layers, big.d_model, big.n_heads, big.d_ff) == (6, 6, 1024, 16, 4096)
    with pytest.raises(LmforgeError, match="unknown preset 'bert-huge'; choose one of bert-tiny"):
        model_config_from_preset("bert-huge")


def test_validation_names_the_values():
    with pytest.raises(LmforgeError, match="d_model=100 is not divisible by n_heads=3"):
        ModelConfig(d_model=100, n_heads=3)
    with pytest.raises(LmforgeError, match="activation='swish' is not one of"):
        ModelConfig(activation="swish")
    with pytest.raises(LmforgeError, match="dropout=1.5"):
        ModelConfig(dropout=1.5)


def test_strict_loading_and_overrides(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('name = "demo"\nsteps = 5\n[model]\nd_model = 64\nn_heads = 4\n', encoding="utf-8")
    values = apply_overrides(load_toml(path), ["model.n_layers=2", "--lr=3e-4", "name=other"])
    run = from_dict(RunConfig, values)
    assert (run.name, run.steps, run.lr, run.model.d_model, run.model.n_layers) == ("other", 5, 3e-4, 64, 2)
    with pytest.raises(LmforgeError, match=r"unknown key\(s\) 'd_mdl'; valid keys for arch encoder are arch"):
        from_dict(RunConfig, apply_overrides(values, ["model.d_mdl=3"]))
    with pytest.raises(LmforgeError, match="config.steps: expected an integer"):
        from_dict(RunConfig, {"steps": "ten"})
    path.write_text("name = \n", encoding="utf-8")
    with pytest.raises(LmforgeError, match="run.toml: not valid TOML"):
        load_toml(path)


def test_atomic_writes_get_the_usual_file_mode(tmp_path):
    import os
    import stat

    from lmforge.utils.io import atomic_write_text

    atomic_write_text(tmp_path / "out.txt", "x")
    (tmp_path / "plain.txt").write_text("x")
    mode = stat.S_IMODE(os.stat(tmp_path / "out.txt").st_mode)
    assert mode == stat.S_IMODE(os.stat(tmp_path / "plain.txt").st_mode)

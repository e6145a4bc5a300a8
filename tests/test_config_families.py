"""A config per model family: the core every family shares, each family's own options and presets, strict building
with errors that name the family, and the upgrade of folders written before families existed."""

import dataclasses
import json

import pytest

from lmforge import choices
from lmforge.config import (
    PRESETS,
    AWDLSTMConfig,
    DecoderConfig,
    EncoderConfig,
    ModelConfig,
    XLNetConfig,
    apply_overrides,
    core_fields,
    family_class,
    family_classes,
    from_dict,
    model_config_from_preset,
    to_dict,
    upgrade_model_values,
)
from lmforge.errors import LmforgeError

TINY = dict(vocab_size=99, d_model=12, n_heads=3, n_layers=2, d_ff=37, max_seq_len=16)


def test_the_core_is_small_and_every_family_extends_it():
    assert len(core_fields()) <= 20
    assert set(family_classes()) == set(choices.ARCHITECTURES)
    for arch, cls in family_classes().items():
        assert issubclass(cls, ModelConfig) and arch in cls.archs
        assert core_fields() == [f.name for f in dataclasses.fields(cls)][:len(core_fields())]


def test_model_config_builds_the_family_class():
    assert type(ModelConfig(**TINY)) is EncoderConfig  # the default arch
    xl = ModelConfig(arch="xlnet", mem_len=8, **TINY)
    assert type(xl) is XLNetConfig and xl.mem_len == 8 and isinstance(xl, ModelConfig)
    assert type(dataclasses.replace(xl, mem_len=4)) is XLNetConfig
    assert type(from_dict(ModelConfig, {"arch": "awd_lstm", "d_hidden": 24, **TINY})) is AWDLSTMConfig


def test_a_field_of_another_family_is_named_with_its_family():
    with pytest.raises(LmforgeError, match=r"unknown key\(s\) 'mem_len'; valid keys for arch decoder are arch, .*"
                                           r"\('mem_len' is an option of arch xlnet\)"):
        from_dict(ModelConfig, {"arch": "decoder", "mem_len": 3, **TINY}, where="model")
    with pytest.raises(LmforgeError, match=r"'reverse' is an option of arch awd_lstm"):
        ModelConfig(arch="encoder", reverse=True, **TINY)
    with pytest.raises(LmforgeError, match=r"unknown key\(s\) 'bogus'; valid keys for arch encoder"):
        from_dict(ModelConfig, apply_overrides({"arch": "encoder"}, ["bogus=1"]))
    with pytest.raises(LmforgeError, match="model.arch: 'lstm' is not one of encoder, decoder"):
        from_dict(ModelConfig, {"arch": "lstm"}, where="model")


def test_each_family_validates_its_own_options():
    with pytest.raises(LmforgeError, match="attn_type='sideways' is not one of bi, uni"):
        ModelConfig(arch="xlnet", attn_type="sideways", **TINY)
    with pytest.raises(LmforgeError, match="d_hidden=0 must be an integer"):
        ModelConfig(arch="awd_lstm", d_hidden=0, **TINY)
    with pytest.raises(LmforgeError, match="generator_size=2 must be a fraction"):
        ModelConfig(arch="encoder", generator_size=2, **TINY)
    with pytest.raises(LmforgeError, match="splits d_model=13 between two directions"):
        ModelConfig(arch="rnn", **{**TINY, "d_model": 13})
    ModelConfig(arch="bilm", token_encoder="embedding", **{**TINY, "d_model": 13})  # the biLM does not split it


def test_presets_hold_only_their_family_s_fields_and_round_trip():
    for name, values in PRESETS.items():
        cls = family_class(values["arch"])
        assert set(values) <= set(cls.field_names()), name
        config = model_config_from_preset(name, vocab_size=99)
        assert type(config) is cls and from_dict(ModelConfig, to_dict(config)) == config


def test_a_saved_config_writes_only_its_family_s_fields():
    decoder = to_dict(model_config_from_preset("gpt-nano"))
    assert "type_vocab_size" not in decoder and "char_filters" not in decoder and "mem_len" not in decoder
    assert set(decoder) == set(DecoderConfig.field_names())


def test_format_1_values_are_upgraded_by_dropping_other_families_fields():
    flat = {**to_dict(ModelConfig(**TINY)), "mem_len": None, "char_filters": [[1, 4]], "reverse": False,
            "rnn_cell": "gru"}
    flat["type_vocab_size"] = 0
    upgraded = upgrade_model_values(dict(flat, arch="decoder"), 1)
    assert "type_vocab_size" not in upgraded and "reverse" not in upgraded
    assert type(from_dict(ModelConfig, upgraded)) is DecoderConfig
    assert upgrade_model_values(dict(flat, bogus=1), 1)["bogus"] == 1  # unknown keys stay, to be named
    assert upgrade_model_values(flat, 2) is flat  # the current format is read strictly


def test_a_format_1_folder_loads(tmp_path):
    from lmforge.models import ARCHITECTURES
    from lmforge.persistence import load_pretrained, save_pretrained

    config = ModelConfig(arch="decoder", norm_first=True, **TINY)
    save_pretrained(ARCHITECTURES["decoder"](config), tmp_path / "m")
    path = tmp_path / "m" / "config.json"
    raw = json.loads(path.read_text())
    assert raw["format_version"] == 2
    raw["format_version"] = 1
    raw["model"].update(type_vocab_size=0, bidirectional=True, char_filters=[[1, 32]], mem_len=None)
    path.write_text(json.dumps(raw))
    assert load_pretrained(tmp_path / "m").config == config


def test_fields_the_flat_config_ignored_are_dropped_with_a_warning_for_one_release():
    with pytest.warns(DeprecationWarning, match="type_vocab_size=0: not an option of arch 'decoder', ignored"):
        assert type(ModelConfig(arch="decoder", type_vocab_size=0, **TINY)) is DecoderConfig
    with pytest.warns(DeprecationWarning, match="share_layers='none'"):
        ModelConfig(arch="xlnet", share_layers="none", **TINY)  # another family's option at its default
    with pytest.raises(LmforgeError, match="'share_layers' is an option of arch encoder"):
        ModelConfig(arch="xlnet", share_layers="all", **TINY)  # a value the flat config refused too


def test_the_architecture_registry_names_each_family_s_config_class():
    from lmforge.models import architecture

    for arch in choices.ARCHITECTURES:
        assert architecture(arch).config_class is family_class(arch)
        assert architecture(arch).config_class.transformer == (not architecture(arch).recurrent) or arch in (
            "bilm", "awd_lstm")  # the two non-Transformer families that are not ``recurrent`` (no cell to choose)


def test_without_dropout_zeroes_every_dropout_of_the_family():
    bert = model_config_from_preset("bert-tiny").without_dropout()
    assert (bert.dropout, bert.attention_dropout) == (0.0, 0.0) and type(bert) is EncoderConfig
    awd = model_config_from_preset("awd-lstm-small").without_dropout()
    assert all(getattr(awd, name) == 0.0 for name in ("embed_p", "input_p", "hidden_p", "weight_p", "output_p"))
    assert awd.d_hidden == 256  # nothing else changes

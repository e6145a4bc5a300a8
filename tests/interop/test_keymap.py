"""The declarative key maps (``lmforge.interop.keymap``) and the registry of Hugging Face formats
(``lmforge.interop.formats``), on small hand-made state dicts."""

from __future__ import annotations

import pytest
import torch

from lmforge.errors import LmforgeError
from lmforge.interop import formats, hf_albert, hf_bert, hf_distilbert, hf_electra, hf_gpt2, hf_roberta, hf_xlnet
from lmforge.interop.keymap import KeyMap, with_leaves
from tests.interop.parity import hf_model, transformers

TOY = KeyMap(
    family="Toy",
    checkpoints="a ToyModel",
    top={"embed.weight": "wte.weight"},
    layer=with_leaves({"fc": "dense"}),
    hf_layer="blocks.{i}.",
    prefix="toy.",
    heads={"head.bias": "lm.bias"},
    tied={"lm.weight": "embed.weight"},
    ignored=("blocks.{i}.mask",),
    transposed=frozenset({"fc.weight"}),
    spellings={".gamma": ".weight"},
    exportable="only toys",
)


def toy_state(*, prefix: str = "toy.") -> dict[str, torch.Tensor]:
    return {f"{prefix}wte.weight": torch.arange(6.0).view(3, 2), f"{prefix}blocks.0.dense.gamma": torch.ones(2, 3),
            f"{prefix}blocks.0.dense.bias": torch.zeros(3), f"{prefix}blocks.0.mask": torch.ones(1),
            "lm.bias": torch.zeros(3), "lm.weight": torch.arange(6.0).view(3, 2)}


def test_both_directions_come_from_one_table() -> None:
    ours = TOY.from_hf(toy_state())
    assert list(ours) == ["embed.weight", "layers.0.fc.weight", "layers.0.fc.bias", "head.bias"]  # checkpoint order
    assert ours["layers.0.fc.weight"].shape == (3, 2)  # transposed
    back = TOY.to_hf(ours, prefixed=True, include_tied=True)
    assert list(back) == ["toy.wte.weight", "toy.blocks.0.dense.weight", "toy.blocks.0.dense.bias", "lm.bias",
                          "lm.weight"]
    assert back["lm.weight"] is back["toy.wte.weight"]  # the tied repeat, the same tensor
    assert TOY.from_hf({k[len("toy."):] if k.startswith("toy.") else k: v for k, v in toy_state().items()}).keys() \
        == ours.keys()  # a bare model class: no prefix


def test_errors_name_the_keys() -> None:
    with pytest.raises(LmforgeError, match=r"unexpected key\(s\) in the Toy state dict: 'toy.blocks.0.other.weight'"
                                           r".*expected a ToyModel checkpoint"):
        TOY.from_hf({**toy_state(), "toy.blocks.0.other.weight": torch.zeros(1)})
    untied = {**toy_state(), "lm.weight": torch.zeros(3, 2)}
    with pytest.raises(LmforgeError, match=r"'lm.weight' differs from 'wte.weight': an untied MLM decoder"):
        TOY.from_hf(untied)
    with pytest.raises(LmforgeError, match=r"no Hugging Face Toy name for key\(s\) 'x0', .*'x9' \.\.\.; only toys"):
        TOY.to_hf({f"x{i}": torch.zeros(1) for i in range(11)}, prefixed=False)
    with pytest.raises(ValueError, match="two of our names to one Hugging Face name"):
        KeyMap(family="Bad", checkpoints="", top={"a": "x", "b": "x"}, layer={})


def test_claims_take_the_keys_the_table_does_not_name() -> None:
    seen = []

    def claim(key: str, value: torch.Tensor) -> dict[str, torch.Tensor] | None:
        seen.append(key)
        return {"fused.weight": value} if key.endswith("fused") else None

    ours = TOY.from_hf({**toy_state(), "toy.blocks.1.fused": torch.ones(1)}, claim)
    assert seen == ["blocks.1.fused"] and "fused.weight" in ours  # the key relative to the body


# ---------------------------------------------------------------------------------------------- the registry
def test_the_registry_reads_each_model_type() -> None:
    assert set(formats.HF_FORMATS) == {"bert", "roberta", "albert", "distilbert", "electra", "gpt2", "xlnet"}
    modules = {"bert": hf_bert, "roberta": hf_roberta, "albert": hf_albert, "distilbert": hf_distilbert,
               "electra": hf_electra, "gpt2": hf_gpt2, "xlnet": hf_xlnet}
    for model_type, module in modules.items():
        assert formats.hf_format(model_type).config_from_hf is module.config_from_hf
    # the repeats a shape-only (meta) pass leaves out: the tied decoders / LM heads
    assert {t: f.compared_repeats for t, f in formats.HF_FORMATS.items()} == {
        "bert": ("cls.predictions.decoder.weight",), "roberta": ("lm_head.decoder.weight",),
        "albert": ("predictions.decoder.weight",),
        "distilbert": ("vocab_projector.weight",), "gpt2": ("lm_head.weight",), "xlnet": ("lm_loss.weight",),
        "electra": ("generator_lm_head.weight",)}
    with pytest.raises(LmforgeError, match=r"'t5' checkpoint; lmforge reads model_type 'bert', .*'electra'"):
        formats.hf_format("t5")


def test_the_registry_gives_task_states_heads_and_optional_keys() -> None:
    config = transformers.BertConfig(vocab_size=61, hidden_size=12, num_hidden_layers=1, num_attention_heads=3,
                                     intermediate_size=20, max_position_embeddings=16)
    bert = formats.hf_format("bert")
    tensors = hf_model("BertForMaskedLM", config, seed=1).state_dict()
    state, head, optional = bert.state_from_hf(tensors, True, bert.config_from_hf(config.to_dict()))
    # BertForMaskedLM is the MLM head alone (no NSP classifier to start fresh); its missing pooler starts fresh
    assert head == {"type": "mlm"} and optional == ("backbone.pooler.",)
    assert {k.split(".", 1)[0] for k in state} == {"backbone", "head"}
    state, head, optional = bert.state_from_hf(tensors, False, bert.config_from_hf(config.to_dict()))
    assert head is None and optional == ("pooler.",) and "embeddings.tokens.weight" in state

    electra = formats.hf_format("electra")
    config = transformers.ElectraConfig(vocab_size=61, embedding_size=8, hidden_size=12, num_hidden_layers=1,
                                        num_attention_heads=3, intermediate_size=20, max_position_embeddings=16)
    tensors = hf_model("ElectraForPreTraining", config, seed=2).state_dict()
    _, head, optional = electra.state_from_hf(tensors, True, electra.config_from_hf(config.to_dict()))
    assert head == {"type": "rtd"} and optional == ()
    assert formats.hf_format("gpt2").untied_head == ("lm_head.",)

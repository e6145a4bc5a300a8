"""The architecture registry (``lmforge.models.architecture``): one record per family, and every capability a record
claims is what a tiny instance of its class actually does (and what it does not claim, the class does not do).

The tests are written against capabilities, never against family names, so a new family is covered by adding its
record.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from lmforge import choices
from lmforge.config import PRESETS, ModelConfig
from lmforge.errors import LmforgeError
from lmforge.models import ARCHITECTURES, CAPABILITIES, Architecture, architecture, architectures_with

B, T, V, D = 2, 5, 99, 12
NAMES = list(ARCHITECTURES)


@pytest.fixture(autouse=True, scope="module")
def _one_intra_op_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: extra threads only add synchronisation
    yield
    torch.set_num_threads(before)


def tiny_config(name: str, **overrides) -> ModelConfig:
    """Small odd sizes, so that a mixed-up dimension fails; one layer, no dropout."""
    values = dict(arch=name, vocab_size=V, d_model=D, n_heads=3, n_layers=1, d_ff=19, max_seq_len=16, dropout=0.0,
                  attention_dropout=0.0, kernel="math")
    return ModelConfig(**{**values, **overrides})


def tiny_model(name: str, seed: int = 0, **overrides) -> nn.Module:
    torch.manual_seed(seed)
    return ARCHITECTURES[name](tiny_config(name, **overrides)).eval()


def ids(*shape: int, seed: int = 1) -> torch.Tensor:
    # 5.. keeps clear of the special ids (pad 0) so no row is accidentally empty or padded.
    return torch.randint(5, V, shape, generator=torch.Generator().manual_seed(seed))


def run(model: nn.Module, source: torch.Tensor, **kwargs):
    """A forward pass on ``source``: encoder-decoders also get a short target (teacher forcing)."""
    if architecture(model.config.arch).has_encoder_decoder:
        return model(source, ids(source.shape[0], 3, seed=2), **kwargs)
    return model(source, **kwargs)


# --------------------------------------------------------------------------------------------------- the registry
def test_every_architecture_has_a_record_in_the_order_of_the_choices():
    assert NAMES == list(choices.ARCHITECTURES)
    assert len(ARCHITECTURES) == len(NAMES)
    for name in NAMES:
        record = architecture(name)
        assert isinstance(record, Architecture) and record.name == name and record.description
        assert name in ARCHITECTURES
        assert ARCHITECTURES[name] is record.load()
        assert ARCHITECTURES[name].__name__ == record.class_name and ARCHITECTURES[name].__module__ == record.module


def test_records_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        architecture(NAMES[0]).generates = True  # type: ignore[misc]


def test_unknown_names_get_a_clear_error():
    listed = ", ".join(choices.ARCHITECTURES)
    with pytest.raises(LmforgeError, match=f"unknown architecture 'bert'; choose one of {listed}$"):
        architecture("bert")
    with pytest.raises(LmforgeError, match="unknown architecture 'bert'"):
        ARCHITECTURES["bert"]
    with pytest.raises(LmforgeError, match=r"unknown architecture \['encoder'\]"):
        architecture(["encoder"])  # type: ignore[arg-type]  # e.g. a list read from a config file
    assert "bert" not in ARCHITECTURES and ["encoder"] not in ARCHITECTURES


def test_architectures_with_lists_the_qualifying_families_in_registry_order():
    for capability in CAPABILITIES:
        found = architectures_with(capability)
        assert found == [n for n in NAMES if getattr(architecture(n), capability)]
    assert architectures_with("generates") == ["decoder", "seq2seq", "rnn_seq2seq", "bilm", "awd_lstm", "xlnet"]
    assert architectures_with("encodes_text") == ["encoder", "decoder", "seq2seq_encoder", "rnn", "bilm", "elmo",
                                                  "awd_lstm", "xlnet"]
    assert architectures_with("left_context_only") == ["decoder", "awd_lstm"]
    for not_a_capability in ("name", "presets", "flies"):
        with pytest.raises(LmforgeError, match=f"unknown architecture capability '{not_a_capability}'; choose one "
                                               "of encodes_text"):
            architectures_with(not_a_capability)


def test_capabilities_are_consistent():
    for name in NAMES:
        a = architecture(name)
        assert not (a.has_encoder_decoder and a.is_causal_lm)
        if a.generates:  # a generator either continues its prompt or decodes from a separate source
            assert a.has_encoder_decoder or a.is_causal_lm
        if a.has_pooled_output:
            assert a.encodes_text
        if a.left_context_only:  # a one-way model is a language model (its states were trained to predict)
            assert a.is_causal_lm and a.encodes_text
        if a.hf_export is not None:
            assert isinstance(a.hf_export, str) and a.hf_export


def test_the_preset_hint_names_presets_of_the_family():
    wrapped = {architecture(n).finetune_as for n in NAMES} - {None, ""}  # built from another family's folder
    assert wrapped <= set(NAMES)
    for name in NAMES:
        if name in wrapped:
            continue
        prefix = architecture(name).presets.rstrip("*")
        assert any(p.startswith(prefix) and spec["arch"] == name for p, spec in PRESETS.items()), name


def test_importing_the_registry_imports_no_torch():
    code = ("import sys; from lmforge.models import architecture, architectures_with; "
            "architecture('encoder'); architectures_with('generates'); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


# --------------------------------------------------------------------------------------------------- capabilities
@pytest.mark.parametrize("name", architectures_with("encodes_text"))
def test_text_encoders_return_per_token_hidden_states(name):
    from lmforge.models.encoder import EncoderOutput

    model = tiny_model(name)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, 3:] = 0
    out = model(ids(B, T), attention_mask=mask, output_hidden_states=True)
    # EncoderOutput's fields, by name (a decoder's output also has its logits and cache)
    assert set(EncoderOutput._fields) <= set(out._fields)
    # widths: D for most; ELMo's biLM gives [forward; backward] = 2D, and its task model ELMo_k (2D) then D
    assert out.last_hidden_state.shape[:2] == (B, T) and out.last_hidden_state.shape[-1] in (D, 2 * D)
    assert out.hidden_states and all(h.shape[:2] == (B, T) for h in out.hidden_states)
    assert out.hidden_states[-1].shape == out.last_hidden_state.shape


@pytest.mark.parametrize("name", NAMES)
def test_pooled_output_exactly_where_claimed(name):
    from lmforge.heads.classification import build_sequence_head

    model, config = tiny_model(name), tiny_config(name)
    if architecture(name).has_pooled_output:
        assert model(ids(B, T)).pooled_output.shape == (B, getattr(model, "pooled_dim", D))  # ULMFiT: 3D
        head = build_sequence_head(config, model, labels=["a", "b", "c"])
        assert head.classifier.out_features == 3
    else:
        assert getattr(model, "pooler", None) is None
        with pytest.raises(LmforgeError, match="pooled \\[CLS\\] vector.*encoder \\(bert-\\*\\)"):
            build_sequence_head(config, model, labels=["a", "b"])


@pytest.mark.parametrize("name", NAMES)
def test_generation_works_exactly_where_claimed(name):
    from lmforge.generation import adapter_for, generate

    model = tiny_model(name)
    prompt, mask = ids(B, 4), torch.ones(B, 4, dtype=torch.long)
    if not architecture(name).generates:
        with pytest.raises(LmforgeError, match="cannot generate with a"):
            adapter_for(model, bos_id=1)
        return
    adapter = adapter_for(model, bos_id=1)
    logits, state = adapter.start(prompt, mask, 3)
    assert logits.shape == (B, V)
    logits, _ = adapter.step(state, logits.argmax(-1))
    assert logits.shape == (B, V)
    out = generate(model, prompt, mask, max_new_tokens=3, bos_id=1)
    assert len(out.sequences) == B and all(len(s[0]) == 3 for s in out.sequences)


@pytest.mark.parametrize("name", architectures_with("generates"))
def test_encoder_decoders_need_a_start_token_and_causal_lms_continue_the_prompt(name):
    from lmforge.generation import adapter_for

    family, model = architecture(name), tiny_model(name)
    prompt, mask = ids(B, 4), torch.ones(B, 4, dtype=torch.long)
    if family.has_encoder_decoder:
        with pytest.raises(LmforgeError, match="is an encoder-decoder.*pass bos_id"):
            adapter_for(model)
        assert adapter_for(model, bos_id=1).context(prompt, mask)[0].shape == (B, 0)  # the source is not output
    if family.is_causal_lm:
        assert torch.equal(adapter_for(model).context(prompt, mask)[0], prompt)  # the prompt is the output's start


@pytest.mark.parametrize("name", architectures_with("is_causal_lm"))
def test_causal_lms_never_look_ahead(name):
    model = tiny_model(name)
    a = ids(1, T)
    b = a.clone()
    b[0, -1] = (a[0, -1] + 1) % V
    if architecture(name).reads_characters:  # distinct spellings, or every token reads the same
        model.set_vocabulary([f"w{i}" for i in range(V)])
    # ELMo's biLM generates with its forward LM alone (the backward LM reads ahead by design)
    run = getattr(model, "forward_lm", None)
    with torch.no_grad():
        la, lb = (model(a).logits, model(b).logits) if run is None else \
            (model.lm_logits(run(a).last_hidden_state), model.lm_logits(run(b).last_hidden_state))
    torch.testing.assert_close(la[:, :-1], lb[:, :-1])
    assert not torch.allclose(la[:, -1], lb[:, -1])


@pytest.mark.parametrize("name", NAMES)
def test_position_limit_exactly_where_claimed(name):
    model = tiny_model(name)
    too_long = ids(1, model.config.max_seq_len + 1)
    with torch.no_grad():
        if architecture(name).position_limited:
            with pytest.raises(LmforgeError, match="max_seq_len=16"):
                run(model, too_long)
        else:
            run(model, too_long)  # a recurrent model reads any length


@pytest.mark.parametrize("name", NAMES)
def test_recurrent_families_are_sized_by_their_cell(name):
    from lmforge.config import family_class

    if "rnn_cell" not in family_class(name).field_names():  # no cell to choose (a config per family)
        assert not architecture(name).recurrent
        return

    def n_params(cell: str) -> int:
        return sum(p.numel() for p in tiny_model(name, rnn_cell=cell).parameters())

    assert (n_params("gru") != n_params("lstm")) == architecture(name).recurrent


@pytest.mark.parametrize("name", NAMES)
def test_attention_weights_exactly_where_claimed(name):
    with torch.no_grad():
        out = run(tiny_model(name), ids(1, T), output_attentions=True)
    weights = [value for field, value in out._asdict().items() if field.endswith("attentions") and value is not None]
    assert bool(weights) == architecture(name).returns_attention


def test_the_attention_viewer_collects_every_family_that_returns_attention():
    from lmforge.viz.attention import _COLLECTORS

    assert sorted(_COLLECTORS) == sorted(architectures_with("returns_attention"))


@pytest.mark.parametrize("name", NAMES)
def test_init_std_is_used_exactly_where_claimed(name):
    # With init_std 0 a family that draws from N(0, init_std) has all-zero matrices (LayerNorms, 1-D, keep 1).
    matrices = [p.detach() for p in tiny_model(name, init_std=0.0).parameters() if p.dim() >= 2]
    assert matrices
    assert all(float(w.abs().max()) == 0.0 for w in matrices) == architecture(name).uses_init_std


@pytest.mark.parametrize("name", NAMES)
def test_hugging_face_export_exactly_where_claimed(name):
    from lmforge.persistence.hf_export import export_to_hf

    layout = architecture(name).hf_export
    # The layouts' own constraints: GPT-2 is pre-LN, BERT post-LN.
    config = tiny_config(name, norm_first=layout == "gpt2")
    torch.manual_seed(0)
    loaded = SimpleNamespace(config=config, model=ARCHITECTURES[name](config), head=None)
    if layout is None:
        with pytest.raises(LmforgeError, match=f"exporting a '{name}' model to Hugging Face is not supported"):
            export_to_hf(loaded)
    else:
        hf_config, hf_state = export_to_hf(loaded)
        assert hf_config["model_type"] == layout and hf_state

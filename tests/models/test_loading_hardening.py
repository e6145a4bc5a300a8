"""A hand-edited model folder fails with one clear line, before anything big is built (issue 14)."""

from __future__ import annotations

import json
import resource
import shutil
import time

import pytest
import torch
from safetensors.torch import save_file

from lmforge.config import ModelConfig
from lmforge.errors import InputFileError, LmforgeError
from lmforge.heads import TaskModel, build_head
from lmforge.interop import hf_bert, hf_gpt2
from lmforge.models import ARCHITECTURES
from lmforge.persistence import (
    load_backbone,
    load_pretrained,
    read_config,
    read_safetensors_header,
    save_pretrained,
)
from lmforge.tokenizers import WordPieceTokenizer

TINY = dict(vocab_size=99, d_model=12, n_heads=3, n_layers=2, d_ff=37, max_seq_len=16)
HEAD = {"type": "sequence_classification", "labels": ["neg", "pos"], "task": {"task": "sequence"}}


def tiny(arch: str = "encoder", **kw) -> ModelConfig:
    return ModelConfig(arch=arch, **{**TINY, **({"norm_first": True} if arch == "decoder" else {}), **kw})


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A fine-tuned-looking folder: encoder + sequence head + tokenizer."""
    directory = tmp_path_factory.mktemp("saved") / "m"
    config = tiny()
    backbone = ARCHITECTURES["encoder"](config)
    model = TaskModel(backbone, build_head(HEAD, config, backbone))
    tokenizer = WordPieceTokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b"])
    save_pretrained(model, directory, tokenizer=tokenizer)
    return directory


@pytest.fixture()
def folder(saved, tmp_path):
    """A fresh copy of ``saved`` to edit."""
    return shutil.copytree(saved, tmp_path / "m")


def edit(folder, **changes) -> None:
    """Set top-level keys of config.json (``model``, ``head`` ... ; a dict for ``model`` updates it)."""
    path = folder / "config.json"
    raw = json.loads(path.read_text())
    for key, value in changes.items():
        if key == "model" and isinstance(value, dict):
            raw["model"].update(value)
        else:
            raw[key] = value
    path.write_text(json.dumps(raw))


def fails(load, folder, match: str, file: str = "config.json") -> str:
    """The loader raises an LmforgeError: one line, naming ``file`` of ``folder`` and matching ``match``."""
    with pytest.raises(LmforgeError, match=match) as err:
        load(folder)
    message = str(err.value)
    assert "\n" not in message and str(folder / file) in message, message
    return message


# ---------------------------------------------------------------------------------------------- config.json itself
@pytest.mark.parametrize(("content", "match"), [
    (bytes(range(256)), "not UTF-8 text"),
    (b"[1, 2]", "not a JSON object"),
    (b'"lmforge"', "not a JSON object"),
    (b"42", "not a JSON object"),
    (b"{", "not valid JSON"),
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    (b'{"format": "lmforge", "n": ' + b"9" * 5000 + b"}", "not valid JSON"),
    (b'{"format": "lmforge", "model": {"d_model": NaN}}', "NaN is not a JSON value"),
])
def test_config_json_that_is_not_an_object(folder, content, match):
    (folder / "config.json").write_bytes(content)
    for load in (load_pretrained, load_backbone, read_config):
        fails(load, folder, match)


@pytest.mark.parametrize(("version", "match"), [
    ("1", "format_version '1' is not a format lmforge writes; it must be an integer from 1 to 2"),
    (True, "format_version True is not"),
    (1.0, "format_version 1.0 is not"),
    (0, "format_version 0 is not"),
    (None, "format_version None is not"),
    (3, r"saved by a newer lmforge \(format_version 3; this one reads 1 to 2\); upgrade lmforge"),
])
def test_format_version_must_be_an_integer_this_release_reads(folder, version, match):
    edit(folder, format_version=version)
    fails(load_pretrained, folder, match)


@pytest.mark.parametrize(("changes", "match"), [
    ({"model": None}, '"model" must be an object'),
    ({"model": [1]}, '"model" must be an object'),
    ({"model": {"bogus": 1}}, r"model: unknown key\(s\) 'bogus'; valid keys for arch encoder are arch"),
    ({"model": {"d_model": -12}}, "d_model=-12 must be a positive integer"),
    ({"model": {"vocab_size": "99"}}, "model.vocab_size: expected an integer"),
    ({"model": {"n_layers": 2.5}}, "model.n_layers: expected an integer"),
    ({"model": {"dropout": 3}}, r"dropout=3.0 must be in \[0, 1\)"),
    ({"tied": [1]}, '"tied" must be an object'),
    ({"tied": "x"}, '"tied" must be an object'),
    ({"tied": {"a": 1}}, '"tied" must be an object'),
])
def test_model_and_tied_sections(folder, changes, match):
    edit(folder, **changes)
    for load in (load_pretrained, load_backbone):
        fails(load, folder, match)


# ---------------------------------------------------------------------------------------------- the head
@pytest.mark.parametrize(("head", "match"), [
    ({**HEAD, "bogus": 1}, r"head: unknown option\(s\) 'bogus' of a 'sequence_classification' head; valid options "
                           "are labels, regression, dropout"),
    ({"type": "sequence_classification"}, "head: a 'sequence_classification' head needs 'labels'"),
    ({"type": "token_classification", "crf": True}, "head: a 'token_classification' head needs 'labels'"),
    ({"type": "nope"}, "head: unknown head type 'nope'; choose one of pretraining"),
    ({"labels": ["a", "b"]}, "head: unknown head type None"),
    ([1], "head: expected an object"),
    ("sequence_classification", "head: expected an object"),
    ({**HEAD, "labels": "ab"}, "head.labels: expected a list"),
    ({**HEAD, "labels": ["a", 2]}, r"head.labels\[1\]: expected a string"),
    ({**HEAD, "regression": "no"}, "head.regression: expected true or false"),
    ({**HEAD, "dropout": 5}, r"head.dropout: 5.0 must be in \[0, 1\)"),
    ({**HEAD, "task": [1]}, "head.task: expected a table of task settings"),
    ({**HEAD, "task": {"task": "sequence", "bogus": 1}}, r"head.task: unknown key\(s\) 'bogus'"),
    ({**HEAD, "task": {"task": "token"}}, "head.task: task 'token' uses a 'token_classification' head"),
    ({**HEAD, "task": {"task": "nope"}}, "task='nope' is not one of"),
])
def test_a_bad_head_is_named_before_anything_is_built(folder, head, match):
    edit(folder, head=head)
    # serve and checkpoint resumption read config.json through read_config: they fail the same way
    for load in (load_pretrained, load_backbone, read_config):
        fails(load, folder, match)


def test_head_options_the_head_itself_rejects_name_the_file(folder):
    edit(folder, head={**HEAD, "labels": ["only"]})
    message = fails(load_pretrained, folder, "classification needs at least 2 labels")
    assert message.count("config.json") == 1


def test_evaluate_and_predict_report_a_bad_head_in_one_line(folder, capsys):
    from lmforge.cli import main

    edit(folder, head={**HEAD, "bogus": 1})
    data = folder.parent / "data.jsonl"
    data.write_text('{"text": "a b", "label": "pos"}\n')
    assert main(["evaluate", "--model", str(folder), "--test", str(data)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "unknown option(s) 'bogus'" in err and "Traceback" not in err


# ---------------------------------------------------------------------------------------------- sizes
# what a config too large for its weights is told, by the first check that catches it
ABSURD = ("do not fit|does not describe these weights|beyond any model lmforge can build|more than this machine's "
          ".* of memory")


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


@pytest.mark.parametrize("model", [{"vocab_size": 2_000_000_000}, {"d_model": 1_200_000_000, "n_heads": 3},
                                   {"d_ff": 2_000_000_000}, {"n_layers": 1_000_000_000},
                                   {"type_vocab_size": 2_000_000_000},
                                   # below ModelConfig's hard limits: caught by the safetensors header check
                                   {"vocab_size": 10_000_000}, {"d_ff": 200_000}, {"n_layers": 1_000}])
def test_absurd_sizes_fail_fast_without_allocating(folder, model):
    edit(folder, model=model)
    before, start = _peak_rss_mb(), time.perf_counter()
    for load in (load_pretrained, load_backbone):
        with pytest.raises(LmforgeError, match=ABSURD) as err:
            load(folder)
        assert "\n" not in str(err.value)
    assert time.perf_counter() - start < 5
    assert _peak_rss_mb() - before < 500


def test_a_config_with_more_layers_than_the_weights(folder):
    edit(folder, model={"n_layers": 4})
    start = time.perf_counter()
    message = fails(load_pretrained, folder, "the weights do not fit the model that config.json describes: missing "
                    r"key\(s\): backbone.layers.2.", file="model.safetensors")
    assert time.perf_counter() - start < 5 and "backbone.layers.0." not in message


def test_a_position_table_too_large_to_compute(tmp_path):
    # sinusoidal positions are computed from max_seq_len, not stored: the weights cannot bound them
    save_pretrained(ARCHITECTURES["seq2seq"](tiny("seq2seq", positional="sinusoidal")), tmp_path / "m")
    edit(tmp_path / "m", model={"max_seq_len": 2_000_000_000})
    start = time.perf_counter()
    fails(load_pretrained, tmp_path / "m", r"GiB for tables computed from its sizes \(max_seq_len=2000000000|"
                                           r"max_seq_len=2000000000 is beyond any model lmforge can build")
    assert time.perf_counter() - start < 5


# ---------------------------------------------------------------------------------------------- model.safetensors
def _header(entries: dict, data: bytes = b"") -> bytes:
    text = json.dumps(entries).encode()
    return len(text).to_bytes(8, "little") + text + data


@pytest.mark.parametrize(("content", "match"), [
    (b"", "0 bytes, too short for a header"),
    (b"\x05\x00", "2 bytes, too short for a header"),
    ((10**12).to_bytes(8, "little") + b"{}", "its header length says 1000000000000 bytes but the file has 10"),
    ((4).to_bytes(8, "little") + b"\xff\xfe{}", "its header is not JSON"),
    (_header([1, 2]), "its header is not a JSON object"),
    (_header({"w": {"dtype": "F32", "shape": "12"}}), "bad header entry for 'w'"),
    (_header({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 0]}}), "bad header entry for 'w'"),
    (_header({"w": {"dtype": "F32", "shape": [4]}}), "bad header entry for 'w'"),
    (_header({"w": [1]}), "bad header entry for 'w'"),
    (_header({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, b"\x00" * 8),
     "tensor 'w' lies at bytes 0-16 of its data, which has 8"),
])
def test_corrupt_weights_files(folder, content, match):
    (folder / "model.safetensors").write_bytes(content)
    for load in (load_pretrained, load_backbone, read_safetensors_header):
        target = folder / "model.safetensors" if load is read_safetensors_header else folder
        with pytest.raises(InputFileError, match=match) as err:
            load(target)
        assert "\n" not in str(err.value) and "model.safetensors: not a readable safetensors file" in str(err.value)


def test_weights_that_are_a_folder_or_missing(folder):
    (folder / "model.safetensors").unlink()
    fails(load_pretrained, folder, "weights file not found", file="model.safetensors")
    (folder / "model.safetensors").mkdir()
    fails(load_pretrained, folder, "a folder, not a safetensors file", file="model.safetensors")


def test_a_truncated_weights_file(folder):
    path = folder / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-100])
    fails(load_pretrained, folder, "not a readable safetensors file", file="model.safetensors")


def test_header_reader_matches_the_saved_tensors(saved):
    header = read_safetensors_header(saved / "model.safetensors")
    assert header["backbone.embeddings.tokens.weight"] == ("F32", (99, 12))
    assert header["head.classifier.weight"] == ("F32", (2, 12)) and "__metadata__" not in header


# ---------------------------------------------------------------------------------------------- still loading
@pytest.mark.parametrize("arch", ["encoder", "decoder", "seq2seq", "rnn", "rnn_seq2seq"])
def test_every_architecture_still_loads(tmp_path, arch):
    extra = {"n_heads": 1, "d_model": 12} if arch.startswith("rnn") else {}
    model = ARCHITECTURES[arch](tiny(arch, **extra))
    save_pretrained(model, tmp_path / "m")
    loaded = load_pretrained(tmp_path / "m")
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, loaded.model.state_dict()[name]), name


@pytest.mark.parametrize("head", [{"type": "pretraining"}, {"type": "mlm"}, {"type": "span", "max_span_len": 4},
                                  {"type": "qa"}, {"type": "span_classification", "labels": ["X"]},
                                  {"type": "token_classification", "labels": ["O", "B-X", "I-X"], "crf": True}])
def test_task_models_with_tied_and_constrained_heads_still_load(tmp_path, head):
    config = tiny()
    backbone = ARCHITECTURES["encoder"](config)
    save_pretrained(TaskModel(backbone, build_head(head, config, backbone)), tmp_path / "m")
    assert load_pretrained(tmp_path / "m").head == head
    assert not isinstance(load_backbone(tmp_path / "m").model, TaskModel)


# ---------------------------------------------------------------------------------------------- Hugging Face folders
def _hf_bert_folder(directory, heads: bool = True):
    config = tiny()
    backbone = ARCHITECTURES["encoder"](config)
    model = TaskModel(backbone, build_head({"type": "pretraining"}, config, backbone))
    state = model.state_dict()
    encoder = {k[len("backbone."):]: v for k, v in state.items() if k.startswith("backbone.")}
    head = {k[len("head."):]: v for k, v in state.items() if k.startswith("head.")} if heads else None
    directory.mkdir()
    save_file({k: v.contiguous() for k, v in hf_bert.state_dict_to_hf(encoder, head, include_tied=False).items()},
              str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps(hf_bert.config_to_hf(config)))
    return directory


def _hf_gpt2_folder(directory, tie: bool = True):
    config = tiny("decoder", tie_embeddings=tie, activation="gelu_tanh")
    model = ARCHITECTURES["decoder"](config)
    directory.mkdir()
    tensors = hf_gpt2.state_dict_to_hf(model.state_dict(), config)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps(hf_gpt2.config_to_hf(config)))
    return directory, model


def test_hugging_face_folders_still_load(tmp_path):
    assert isinstance(load_pretrained(_hf_bert_folder(tmp_path / "bert")).model, TaskModel)
    assert not isinstance(load_pretrained(_hf_bert_folder(tmp_path / "bare", heads=False)).model, TaskModel)
    for tie in (True, False):
        directory, model = _hf_gpt2_folder(tmp_path / f"gpt2-{tie}", tie)
        ids = torch.randint(0, 99, (2, 5))
        with torch.no_grad():
            torch.testing.assert_close(load_pretrained(directory).model.eval()(ids).logits, model.eval()(ids).logits)


@pytest.mark.parametrize(("changes", "match"), [
    ({"vocab_size": 2_000_000_000}, "do not fit|beyond any model lmforge can build"),
    ({"hidden_size": 1_200_000_000, "intermediate_size": 37}, "do not fit|beyond any model lmforge can build"),
    ({"num_hidden_layers": 1_000_000_000}, "does not describe these weights|beyond any model lmforge can build"),
    ({"num_hidden_layers": 4}, r"missing key\(s\): backbone.layers.2"),
    ({"hidden_size": "12"}, "hidden_size: expected an integer, got '12'"),
    ({"hidden_act": ["gelu"]}, r"hidden_act=\['gelu'\] is not supported"),
    ({"hidden_dropout_prob": "0.1"}, "hidden_dropout_prob: expected a number"),
    ({"pad_token_id": "0"}, "pad_token_id: expected an integer"),
    ({"max_position_embeddings": None}, "max_position_embeddings: expected an integer, got None"),
])
def test_hugging_face_bert_configs_are_checked_before_building(tmp_path, changes, match):
    directory = _hf_bert_folder(tmp_path / "bert")
    raw = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**raw, **changes}))
    start = time.perf_counter()
    with pytest.raises(LmforgeError, match=match) as err:
        load_pretrained(directory)
    assert "\n" not in str(err.value) and str(directory) in str(err.value)
    assert time.perf_counter() - start < 5


@pytest.mark.parametrize(("changes", "match"), [
    ({"vocab_size": 2_000_000_000}, "do not fit|beyond any model lmforge can build"),
    ({"n_positions": 2_000_000_000}, "do not fit|beyond any model lmforge can build"),
    ({"n_layer": 1_000_000_000}, "does not describe these weights|beyond any model lmforge can build"),
    ({"n_embd": "12"}, "n_embd: expected an integer"),
    ({"activation_function": 3}, "activation_function: expected a string"),
    ({"tie_word_embeddings": "yes"}, "tie_word_embeddings: expected true or false"),
])
def test_hugging_face_gpt2_configs_are_checked_before_building(tmp_path, changes, match):
    directory, _ = _hf_gpt2_folder(tmp_path / "gpt2")
    raw = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**raw, **changes}))
    with pytest.raises(LmforgeError, match=match) as err:
        load_pretrained(directory)
    assert "\n" not in str(err.value) and str(directory) in str(err.value)


def test_hugging_face_weights_of_the_wrong_rank(tmp_path):
    directory, _ = _hf_gpt2_folder(tmp_path / "gpt2")
    save_file({"transformer.wte.weight": torch.zeros(99, 12), "transformer.h.0.attn.c_attn.weight": torch.zeros(())},
              str(directory / "model.safetensors"))
    with pytest.raises(LmforgeError, match="model.safetensors: not a gpt2 checkpoint's tensors"):
        load_pretrained(directory)


@pytest.mark.parametrize(("arch", "model", "match"), [
    ("encoder", {"init_std": -1.0}, r"init_std=-1.0 must be in \[0, 10\)"),
    ("rnn", {"d_model": 2**40}, "beyond any model lmforge can build"),
])
def test_configs_that_cannot_be_built_at_all(tmp_path, arch, model, match):
    extra = {"n_heads": 1} if arch == "rnn" else {}
    save_pretrained(ARCHITECTURES[arch](tiny(arch, **extra)), tmp_path / "m")
    edit(tmp_path / "m", model=model)
    message = fails(load_pretrained, tmp_path / "m", match)
    assert message.count(str(tmp_path / "m" / "config.json")) == 1


def test_a_new_model_that_cannot_fit_in_memory_is_refused_before_it_is_built(monkeypatch):
    import os

    from lmforge.persistence import build_backbone, check_memory

    config = tiny("encoder")
    n = check_memory(config)
    model = ARCHITECTURES["encoder"](config)
    assert n == sum(p.numel() for p in model.parameters()) + sum(b.numel() for b in model.buffers())
    real = os.sysconf
    monkeypatch.setattr(os, "sysconf", lambda name: 1 if name == "SC_PHYS_PAGES" else real(name))  # one page
    with pytest.raises(LmforgeError, match=rf"this model has {n:,} parameters .* more than this machine's"):
        build_backbone(config)

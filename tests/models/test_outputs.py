"""The shared output records (``lmforge.models.outputs``, issue 35): each family module re-exports its own as the
same class, and no model file imports another one (only the package and the outputs module)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import lmforge.models
from lmforge.models import outputs

MODELS = Path(lmforge.models.__file__).parent
FAMILY_FILES = ("awd_lstm", "decoder", "elmo", "encoder", "rnn_encoder", "rnn_seq2seq", "seq2seq", "xlnet")

OLD_HOMES = {
    "EncoderOutput": ("encoder", "rnn_encoder", "awd_lstm"),
    "EncoderRowsOutput": ("encoder",),
    "DecoderOutput": ("decoder",),
    "DecodeOutput": ("seq2seq",),
    "Seq2SeqOutput": ("seq2seq",),
    "SourceEncoderOutput": ("seq2seq",),
    "RNNSeq2SeqOutput": ("rnn_seq2seq",),
    "XLNetOutput": ("xlnet",),
    "XLNetLMOutput": ("xlnet",),
    "BiLMOutput": ("elmo",),
    "ForwardLMOutput": ("elmo",),
    "StreamLMOutput": ("elmo",),
    "LSTMState": ("elmo",),
}


def test_every_record_lives_in_outputs_and_keeps_its_old_import_path():
    assert set(OLD_HOMES) == set(outputs.__all__)
    for name, modules in OLD_HOMES.items():
        for module in modules:
            assert getattr(importlib.import_module(f"lmforge.models.{module}"), name) is getattr(outputs, name)


@pytest.mark.parametrize("name", [*FAMILY_FILES, "outputs"])
def test_no_model_file_imports_another_and_none_is_over_500_lines(name):
    source = (MODELS / f"{name}.py").read_text()
    for node in ast.walk(ast.parse(source)):
        modules = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) else []
        for module in modules:
            parts = module.split(".")
            assert not (parts[:2] == ["lmforge", "models"] and len(parts) > 2 and parts[2] in FAMILY_FILES), \
                f"{name}.py imports {module}"
    assert len(source.splitlines()) <= 500

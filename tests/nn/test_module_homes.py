"""Where ``lmforge.nn``'s names live after the split of ``nn/attention.py`` (issue 35): every old import path still
works and gives the same object, no file of ``lmforge.nn`` imports a layer above it, and none is over 500 lines."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import lmforge.nn

NN = Path(lmforge.nn.__file__).parent

HOMES = {
    "lmforge.nn.scores": ["SCORES", "AdditiveScore", "AttentionOutput", "CosineScore", "DotScore", "GeneralScore",
                          "LocationScore", "ScaledDotScore", "make_score", "masked_softmax"],
    "lmforge.nn.generic_attention": ["Attention"],
    "lmforge.nn.reinforce": ["RewardBaseline", "SampledAlignments", "reinforce_loss"],
    "lmforge.nn.kv_cache": ["KVCache"],
    "lmforge.nn.attention": ["KERNELS", "MultiHeadAttention", "attention_weights", "math_attention",
                             "sdpa_attention"],
}
# layers above nn (lowest first: base < data/tokenizers/metrics < nn < models < heads < objectives/tasks/interop)
ABOVE_NN = ("models", "heads", "objectives", "tasks", "interop", "training", "generation", "pipelines", "serve",
            "commands", "cli", "recipes", "viz", "embeddings", "prompting")


def test_every_old_attention_name_is_importable_from_nn_attention_and_is_the_moved_object():
    old = importlib.import_module("lmforge.nn.attention")
    moved = {name for names in HOMES.values() for name in names}
    assert moved == set(old.__all__)
    for home, names in HOMES.items():
        module = importlib.import_module(home)
        for name in names:
            assert getattr(old, name) is getattr(module, name), name
            assert getattr(lmforge.nn, name) is getattr(module, name), name


@pytest.mark.parametrize("path", sorted(NN.rglob("*.py")), ids=lambda p: str(p.relative_to(NN)))
def test_nn_imports_nothing_above_it_and_stays_short(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) else []
        for name in names:
            parts = name.split(".")
            assert not (parts[0] == "lmforge" and len(parts) > 1 and parts[1] in ABOVE_NN), f"{path.name}: {name}"
    assert len(path.read_text().splitlines()) <= 500

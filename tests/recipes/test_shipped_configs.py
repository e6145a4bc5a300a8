"""Every comparison config shipped in configs/ and benchmarks/probes/ parses and names only what it defines: a typo
in a TOML that a README tells users to run would otherwise surface only after minutes of pretraining."""

from __future__ import annotations

from pathlib import Path

import pytest

from lmforge.config.base import load_toml
from lmforge.errors import LmforgeError
from lmforge.recipes.compare import compare_config

ROOT = Path(__file__).resolve().parents[2]
COMPARE_CONFIGS = sorted(p for folder in ("configs", "benchmarks/probes") for p in (ROOT / folder).glob("*.toml")
                         if "approach" in load_toml(p))


def test_there_are_comparison_configs_to_check():
    names = {p.name for p in COMPARE_CONFIGS}
    assert {"compare-bbc.toml", "compare-demo.toml", "compare-pretraining-10m.toml", "compare-trec.toml",
            "compare-bbc-dev.toml"} <= names


@pytest.mark.parametrize("path", COMPARE_CONFIGS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_shipped_comparison_config_parses(path):
    config = compare_config(load_toml(path), str(path))  # checks each approach's @NAME against [[pretrain]]
    pretrained = {p.name for p in config.pretrain}
    for approach in config.approach:
        for ref in approach.ensemble:
            assert ref[1:] in pretrained, f"{path.name}: {approach.name!r} averages {ref}, not a [[pretrain]] name"
        for point in approach.grid_points():
            assert not approach.at(point).grid
    for spec in config.pretrain:  # every [[pretrain]] table is used by some approach
        assert any(f"@{spec.name}" in (a.model, *a.ensemble) for a in config.approach), f"{spec.name} is unused"


def test_a_reference_to_a_missing_pretraining_is_an_error_naming_it():
    values = load_toml(ROOT / "configs" / "compare-pretraining-10m.toml")
    values["approach"][1]["model"] = "@no-such-pretraining"
    with pytest.raises(LmforgeError, match="no-such-pretraining"):
        compare_config(values, "broken.toml")

"""``lmforge.recipes.compare`` reads the folders of ``lmforge.compare`` (lmforge 0.1.0, before the move): resuming
one repeats nothing and writes the same results; ``lmforge.compare`` still imports, with a deprecation warning."""

from __future__ import annotations

import importlib
import shutil
import sys
import warnings
from pathlib import Path

import pytest

from lmforge.cli import main
from tests.toy_tasks import write_sequence

OLD_FOLDER = Path(__file__).parent / "compare_folder_0_1_0"
RESULTS = ("compare.csv", "compare.md", "compare.json")


@pytest.fixture
def old_comparison(tmp_path, monkeypatch) -> Path:
    """A copy of the 0.1.0 folder with its data, as the working directory (its config's paths are relative)."""
    work = tmp_path / "work"
    shutil.copytree(OLD_FOLDER, work)
    write_sequence(work / "data.csv", 32, 0)
    monkeypatch.chdir(work)
    return work


def _nothing_trains(monkeypatch, calls: list) -> None:
    """No run, vector training or pretraining may happen: each records its call and fails."""
    import lmforge.recipes.compare.run as run

    def refuse(name):
        def step(*args, **kwargs):
            calls.append((name, args))
            raise AssertionError(f"{name} ran again")
        return step

    for name in ("run_one", "train_static_vectors", "pretrain_here"):
        monkeypatch.setattr(run, name, refuse(name))


def test_an_old_folder_resumes_without_repeating_anything_and_writes_the_same_results(old_comparison, monkeypatch):
    out = old_comparison / "out"
    before = {name: (out / name).read_text(encoding="utf-8") for name in RESULTS}
    (out / "compare.csv").unlink()
    calls: list = []
    _nothing_trains(monkeypatch, calls)
    assert main(["-q", "compare", "--config", "compare.toml", "--resume"]) == 0
    assert calls == []
    for name, text in before.items():
        assert (out / name).read_text(encoding="utf-8") == text, name
    assert (out / "learning_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_an_old_folder_takes_a_new_seed_on_resume(old_comparison, monkeypatch):
    """The run keys of 0.1.0 still match: only the new seed's runs are run, the old ones are read back."""
    import lmforge.recipes.compare.run as run

    calls: list = []
    _nothing_trains(monkeypatch, calls)

    def fake_run(approach, config, train_file, test_file, n_train, seed, *args):
        calls.append((approach.name, seed))
        return {"approach": approach.name, "family": approach.family, "size": n_train, "seed": seed,
                "accuracy": 1.0, "f1": 1.0, "seconds": 1.0, "steps": 2}

    monkeypatch.setattr(run, "run_one", fake_run)
    assert main(["-q", "compare", "--config", "compare.toml", "--resume", "--seeds", "0,1,2"]) == 0
    assert sorted(calls) == [("RNN + word2vec (frozen)", 2), ("Transformer (scratch)", 2),
                             ("tiny, pretrained here", 2)]
    assert len((old_comparison / "out" / "runs.jsonl").read_text(encoding="utf-8").splitlines()) == 9
    table = (old_comparison / "out" / "compare.md").read_text(encoding="utf-8")
    assert "over seeds 0, 1, 2" in table and "| 0.667 ± 0.289 |" in table  # 0.5, 0.5 (read back) and 1.0 (new)


def test_the_old_module_warns_and_re_exports_the_new_names():
    import lmforge.recipes.compare as new

    sys.modules.pop("lmforge.compare", None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        old = importlib.import_module("lmforge.compare")
    messages = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]
    assert any("lmforge.recipes.compare" in m for m in messages), messages
    assert old.__all__ and all(getattr(old, name) is getattr(new, name) for name in old.__all__)
    for name in ("CompareConfig", "Approach", "PretrainSpec", "compare_config", "run_compare", "markdown_table",
                 "learning_curve_figure", "load_labelled", "subset", "train_static_vectors", "run_one"):
        assert name in old.__all__

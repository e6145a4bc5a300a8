"""The pretraining-objective registry: the single source of names, and one entry + one file per new objective."""

from __future__ import annotations

import json

import pytest

from lmforge.cli import build_parser, main
from lmforge.errors import LmforgeError
from lmforge.objectives.registry import OBJECTIVES, PretrainingObjective, get_objective, register_objective


def choices_of(option: str, command: str = "pretrain") -> list[str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices[command]
    return list(next(a for a in sub._actions if option in a.option_strings).choices)


def test_the_cli_offers_exactly_the_registry():
    assert choices_of("--objective") == list(OBJECTIVES) == ["mlm+nsp", "mlm+sop", "mlm", "span", "clm", "bilm",
                                                                 "awd_lm", "plm", "txl",
                                                                 "denoise", "electra"]


def test_unknown_names_and_duplicates_are_clear_errors():
    with pytest.raises(LmforgeError, match="objective='bogus' is not one of mlm\\+nsp, mlm\\+sop, mlm, span, clm"):
        get_objective("bogus")
    with pytest.raises(LmforgeError, match="'mlm' is already registered"):
        register_objective(OBJECTIVES["mlm"])
    with pytest.raises(LmforgeError, match="plan 'zigzag' is not one of nsp, packed, segments, causal"):
        register_objective(PretrainingObjective("z", "", arch="encoder", plan="zigzag", loss=lambda data: None))
    assert "z" not in OBJECTIVES


@pytest.fixture
def toy():
    from tests.objectives import toy_objective

    entry = toy_objective.register()
    yield entry
    del OBJECTIVES[entry.name]


def test_a_new_objective_is_one_entry_and_one_file(toy, tmp_path, capsys):
    text = tmp_path / "corpus.txt"
    text.write_text("".join(f"the cat sat on mat number {i}. it was a good mat.\n\n" for i in range(60)))
    assert main(["tokenizer", "train", "--input", str(text), "--vocab-size", "60", "--out", str(tmp_path / "tok")]) == 0
    assert main(["data", "prepare", "--tokenizer", str(tmp_path / "tok"), "--input", str(text), "--out",
                 str(tmp_path / "data"), "--workers", "1", "--format", "lines"]) == 0
    assert toy.name in choices_of("--objective")
    code = main(["pretrain", "--preset", "bert-tiny", "--objective", toy.name, "--input", str(tmp_path / "data"),
                 "--out", str(tmp_path / "run"), "--max-steps", "3", "--batch-size", "4", "--seq-len", "16",
                 "--model.max_seq_len=16", "--model.n_layers=1", "--train.log_every=1"])
    assert code == 0, capsys.readouterr().err
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r] == [1, 2, 3]
    assert all("loss_smooth_mlm" in r and "smooth_mlm_accuracy" in r for r in records if "loss" in r)
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["head"]["type"] == "mlm"
    run_config = json.loads((tmp_path / "run" / "run_config.json").read_text())
    assert run_config["data"]["objective"] == toy.name


def test_loss_weights_are_the_objective_s_options_and_old_data_keys_move_there():
    import warnings

    from lmforge.config import DataConfig, from_dict
    from lmforge.objectives.options import ElectraLoss
    from lmforge.recipes.pretrain import PretrainRun

    assert get_objective("electra").options({"rtd_weight": 30}) == ElectraLoss(30.0)
    assert get_objective("mlm").options() is None
    assert not any(hasattr(DataConfig(), key) for key in DataConfig.MOVED_TO_LOSS)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = from_dict(PretrainRun, {"data": {"objective": "electra", "rtd_weight": 20.0}}, where="pretrain")
    assert run.loss == {"rtd_weight": 20.0} and "rtd_weight" not in vars(run.data)
    assert any("data.rtd_weight moved to loss.rtd_weight" in str(w.message) for w in caught)
    with pytest.raises(LmforgeError, match="both data.rtd_weight and loss.rtd_weight are set"):
        from_dict(PretrainRun, {"data": {"rtd_weight": 20.0}, "loss": {"rtd_weight": 1.0}}, where="pretrain")

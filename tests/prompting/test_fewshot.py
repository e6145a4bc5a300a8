"""``fewshot_evaluate``: rows per K and draw, reproducible draws, dropped demonstrations, generate mode, the report's
JSON and plot, accepted example types, and bad settings."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from lmforge.data.readers import ClassificationExample
from lmforge.errors import LmforgeError
from lmforge.generation import generate
from lmforge.prompting import FewShotConfig, PromptBuilder, PromptTemplate, cut_at_stop, fewshot_evaluate
from tests.prompting.helpers import TEMPLATE, TEST, TRAIN, VERBALIZER, decoder, tokenizer

PNG = b"\x89PNG\r\n\x1a\n"


def _config(**overrides) -> FewShotConfig:
    return FewShotConfig(**{"template": TEMPLATE, "verbalizer": VERBALIZER, "shots": (0, 1, 4), "draws": 2,
                            **overrides})


def test_rows_per_k_with_draws_and_a_json_and_png_report(tmp_path):
    report = fewshot_evaluate(decoder(), tokenizer(), TRAIN, TEST, _config())
    assert [r["shots"] for r in report.rows] == [0, 1, 4]
    assert [len(r["accuracies"]) for r in report.rows] == [1, 2, 2]
    for row in report.rows:
        assert set(row) == {"shots", "accuracy_mean", "accuracy_std", "accuracies", "dropped_demos", "n_test"}
        assert row["n_test"] == len(TEST) and row["dropped_demos"] == 0
        assert row["accuracy_mean"] == pytest.approx(sum(row["accuracies"]) / len(row["accuracies"]))
        assert all(a * len(TEST) == pytest.approx(round(a * len(TEST))) for a in row["accuracies"])
    assert report.rows[0]["accuracy_std"] == 0.0
    first = report.predictions[4]
    assert len(first) == len(TEST) and all(len(r["demos"]) == 4 for r in first)
    assert report.rows[2]["accuracies"][0] == pytest.approx(sum(r["correct"] for r in first) / len(TEST))
    assert report.chance == 0.5 and report.majority == pytest.approx(3 / 5) and report.labels == ["pos", "neg"]
    data = json.loads(report.save_json(tmp_path / "f.json").read_text())
    assert data["rows"] == report.rows and data["config"]["shots"] == [0, 1, 4] and set(data["predictions"]) == {
        "0", "1", "4"}
    assert report.plot(tmp_path / "f.png").read_bytes().startswith(PNG)
    assert "± " in report.table() and "chance 0.5000" in report.table()


def test_same_seed_same_results_and_fixed_versus_per_example_demonstrations():
    model = decoder()
    a = fewshot_evaluate(model, tokenizer(), TRAIN, TEST, _config(shots=(3,), draws=2, seed=7))
    b = fewshot_evaluate(model, tokenizer(), TRAIN, TEST, _config(shots=(3,), draws=2, seed=7))
    c = fewshot_evaluate(model, tokenizer(), TRAIN, TEST, _config(shots=(3,), draws=2, seed=8))
    assert a.to_dict() == b.to_dict()
    assert [r["demos"] for r in a.predictions[3]] != [r["demos"] for r in c.predictions[3]]
    assert len({tuple(r["demos"]) for r in a.predictions[3]}) == 1  # fixed: one set for the draw
    fresh = fewshot_evaluate(model, tokenizer(), TRAIN, TEST, _config(shots=(3,), draws=1, demos="per-example"))
    assert len({tuple(r["demos"]) for r in fresh.predictions[3]}) > 1


def test_a_test_example_found_in_train_never_demonstrates_itself():
    train = [*TRAIN, TEST[0]]
    for demos in ("fixed", "per-example"):
        report = fewshot_evaluate(decoder(), tokenizer(), train, TEST,
                                  _config(shots=(len(train) - 1,), draws=3, demos=demos, max_new_tokens=1))
        assert len(train) - 1 not in report.predictions[len(train) - 1][0]["demos"]


def test_long_prompts_drop_demonstrations_and_the_total_is_reported(caplog):
    with caplog.at_level(logging.WARNING, logger="lmforge"):
        report = fewshot_evaluate(decoder(max_seq_len=24), tokenizer(), TRAIN, TEST, _config(shots=(0, 4), draws=2))
    # every demonstration is 7 tokens, a query 5 to 8, the start token 1 and the answer 1: at most 2 fit in 24
    row = report.rows[1]
    kept = [len(r["demos"]) for r in report.predictions[4]]
    assert all(k <= 2 for k in kept) and row["dropped_demos"] >= 2 * len(TEST)
    assert report.rows[0]["dropped_demos"] == 0
    assert f"dropped {row['dropped_demos']} demonstration(s)" in caplog.text
    assert len([r for r in caplog.records if "demonstration(s)" in r.getMessage()]) == 1  # one warning


def test_generate_mode_greedy_answers_cut_at_the_stop_string_and_exact_match():
    model, tok = decoder(seed=3), tokenizer()
    config = _config(mode="generate", shots=(0,), max_new_tokens=3, stop=("sentiment",))
    report = fewshot_evaluate(model, tok, TRAIN, TEST, config)
    builder = PromptBuilder(tok, PromptTemplate.parse(TEMPLATE), VERBALIZER, "\n\n", TRAIN, 96, 3)
    for ex, record in zip(TEST, report.predictions[0], strict=True):
        ids = torch.tensor([builder.build([], ex.text).ids])
        seq = generate(model, ids, strategy="greedy", eos_id=tok.sep_id, max_new_tokens=3).sequences[0][0]
        assert record["generated"] == cut_at_stop(tok.decode(list(seq)), ["sentiment"])
    # K = 0 prompts hold no verbalisation: make the first example's answer what the model says, and it is right
    said = " ".join(report.predictions[0][0]["generated"].split())
    assert said, "the tiny model generated nothing to compare"
    right = fewshot_evaluate(model, tok, TRAIN, TEST, _config(mode="generate", shots=(0,), max_new_tokens=3,
                             stop=("sentiment",), verbalizer={"pos": said.upper(), "neg": "zzunique"}))
    assert right.predictions[0][0]["correct"] and right.predictions[0][0]["prediction"] == "pos"
    assert right.chance is None
    assert cut_at_stop("yes.\nno", ["\n", "."]) == "yes" and cut_at_stop("abc", ["x"]) == "abc"


def test_examples_may_be_reader_examples_dicts_or_tuples():
    model = decoder()
    as_reader = [ClassificationExample(e.text, None, e.label, i + 2) for i, e in enumerate(TRAIN)]
    as_dicts = [{"text": e.text, "label": e.label} for e in TEST]
    as_tuples = [(e.text, e.label) for e in TEST]
    config = _config(shots=(2,), draws=1)
    a = fewshot_evaluate(model, tokenizer(), as_reader, as_dicts, config)
    b = fewshot_evaluate(model, tokenizer(), TRAIN, as_tuples, config)
    assert a.rows == b.rows


@pytest.mark.parametrize("overrides, words", [
    (dict(shots=(0, 9)), "K=9 exceeds the 8 training examples"),
    (dict(template="Review: {text}"), "no {label}"),
    (dict(template="{label}"), "no {text}"),
    (dict(verbalizer={"pos": "positive"}), "no words for label 'neg'"),
    (dict(verbalizer={"pos": "good", "neg": "Good"}), "same verbalisation"),
])
def test_bad_settings_are_clear_errors(overrides, words):
    with pytest.raises(LmforgeError) as err:
        fewshot_evaluate(decoder(), tokenizer(), TRAIN, TEST, _config(**overrides))
    assert words in str(err.value)


@pytest.mark.parametrize("overrides, words", [
    (dict(shots=(1, 1)), "repeats"), (dict(shots=(-1,)), "integers >= 0"), (dict(draws=0), "draws=0"),
    (dict(scoring="max"), "scoring='max'"), (dict(demos="random"), "demos='random'"),
    (dict(mode="generate", calibrate=True), "calibrate applies"), (dict(stop=("",)), "non-empty strings"),
])
def test_bad_config_values_are_refused(overrides, words):
    with pytest.raises(LmforgeError, match="few-shot settings: ") as err:
        _config(**overrides)
    assert words in str(err.value)


def test_unlabelled_or_numeric_examples_are_refused():
    with pytest.raises(LmforgeError, match="test example 1 has no label"):
        fewshot_evaluate(decoder(), tokenizer(), TRAIN, [("good", None)], _config(shots=(0,)))
    with pytest.raises(LmforgeError, match="not a class name"):
        fewshot_evaluate(decoder(), tokenizer(), TRAIN, [("good", 0.5)], _config(shots=(0,)))

"""Span labeling with nested gold spans: the reader and featurizer keep them, ``--task.span_decoding=nested``
predicts them back, and ``--task.span_features`` chooses the span representation (old folders load as "width")."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import pytest
import torch

from lmforge.cli import main
from lmforge.data.readers import read_spans
from lmforge.data.spans import enumerate_spans
from lmforge.data.token_features import featurize_spans
from lmforge.tokenizers import WordPieceTokenizer
from tests.toy_tasks import CITIES, FILLER, NAMES, vocab


def write_nested_spans(path: Path, n: int, seed: int) -> Path:
    """Sentences with a PER name and an ORG that holds a LOC city, "[[paris] country]" or "[capital of [rome]]"
    (an entity inside a longer one, as in "[[New York] University]"), sometimes a bare LOC city too.

    Every sentence has one nested pair, so flat decoding, which returns one span of the pair at most, misses at
    least one gold span in three or four."""
    rng = random.Random(seed)
    with path.open("w", encoding="utf-8") as f:
        for _ in range(n):
            # (entity words, its spans relative to the entity's first word)
            parts = [([rng.choice(NAMES)], [(0, 1, "PER")])]
            if rng.random() < 0.5:
                parts.append(([rng.choice(CITIES), "country"], [(0, 2, "ORG"), (0, 1, "LOC")]))
            else:
                parts.append((["capital", "of", rng.choice(CITIES)], [(0, 3, "ORG"), (2, 3, "LOC")]))
            if rng.random() < 0.4:
                parts.append(([rng.choice(CITIES)], [(0, 1, "LOC")]))
            rng.shuffle(parts)
            words: list[str] = []
            spans: list[dict] = []
            for entity, marks in parts:
                words += rng.sample(FILLER, rng.randint(1, 2))
                spans += [{"start": len(words) + s, "end": len(words) + e, "label": k} for s, e, k in marks]
                words += entity
            words += rng.sample(FILLER, rng.randint(0, 1))
            f.write(json.dumps({"tokens": words, "spans": spans}) + "\n")
    return path


def test_nested_and_crossing_gold_spans_are_read_and_featurized(tmp_path):
    path = tmp_path / "nested.jsonl"
    spans = [{"start": 1, "end": 4, "label": "ORG"}, {"start": 3, "end": 4, "label": "LOC"},
             {"start": 3, "end": 5, "label": "ORG"}]
    path.write_text(json.dumps({"tokens": ["the", "capital", "of", "paris", "country"], "spans": spans}) + "\n")
    (example,) = read_spans(path)
    assert example.spans == [(1, 4, "ORG"), (3, 4, "LOC"), (3, 5, "ORG")]  # nested and crossing, all kept
    (feature,), truncated, too_wide = featurize_spans([(example.tokens, example.spans)], WordPieceTokenizer(vocab()),
                                                      {"LOC": 0, "ORG": 1}, 32, 3)
    assert truncated == too_wide == 0
    table = enumerate_spans(5, 3)
    labelled = {table[k]: c for k, c in enumerate(feature["span_labels"]) if c}
    assert labelled == {(1, 3): 2, (3, 3): 1, (3, 4): 2}  # (i, j inclusive): class id = label index + 1


def _finetune(encoder: Path, folder: Path, *options: str) -> tuple[Path, Path]:
    train = write_nested_spans(folder / "train.jsonl", 48, 1)
    dev = write_nested_spans(folder / "dev.jsonl", 16, 2)
    out = folder / "run"
    code = main(["-q", "finetune", "--task", "span", "--model", str(encoder), "--train", str(train), "--dev", str(dev),
                 "--out", str(out), "--epochs", "40", "--batch-size", "8", "--lr", "3e-3", "--max-length", "32",
                 "--seed", "0", "--task.max_span_width=3", *options])
    assert code == 0
    return out, dev


def _scores(run: Path, dev: Path, decoding: str) -> dict[str, float]:
    from lmforge.recipes.finetune import load_task_model

    model, task, tokenizer = load_task_model(str(run))
    task.config = dataclasses.replace(task.config, span_decoding=decoding)
    examples = task.read(str(dev))
    features = task.featurize(examples, tokenizer, training=False)
    model.eval()
    with torch.no_grad():
        predictions = task.predict(model, examples, features, tokenizer)
    return task.metrics(examples, predictions)


def _flat_ceiling(dev: Path) -> float:
    """The best F1 any flat decoding can reach: every gold span but one of each nested pair, nothing wrong."""
    examples = read_spans(dev)
    gold = sum(len(e.spans) for e in examples)
    best = gold - len(examples)  # one nested pair per sentence
    return 2 * best / (best + gold)


@pytest.mark.parametrize("features", ["width", "lecture"])
def test_nested_decoding_predicts_nested_gold_spans_back(features, tiny_encoder_dir, tmp_path):
    run, dev = _finetune(tiny_encoder_dir, tmp_path, "--task.span_decoding=nested", f"--task.span_features={features}")
    saved = json.loads((run / "config.json").read_text())["head"]
    assert saved["features"] == saved["task"]["span_features"] == features
    assert saved["task"]["span_decoding"] == "nested"
    from lmforge.recipes.finetune import load_task_model

    model, _, _ = load_task_model(str(run))
    assert ("head.width.weight" in model.state_dict()) == (features == "width")

    nested, flat = _scores(run, dev, "nested"), _scores(run, dev, "flat")
    results = json.loads((run / "eval_results.json").read_text())
    assert results["f1"] == pytest.approx(nested["f1"], abs=1e-9)  # the run evaluated with its own decoding
    ceiling = _flat_ceiling(dev)
    print(f"features={features}: nested F1 {nested['f1']:.3f}, flat F1 {flat['f1']:.3f}, flat ceiling {ceiling:.3f}")
    assert ceiling < 0.85
    assert flat["f1"] <= ceiling + 1e-9
    assert nested["f1"] >= 0.9 and nested["f1"] > ceiling + 0.05


def test_a_saved_span_model_without_the_new_options_loads_as_width_and_flat(finetuned, tmp_path):
    import shutil

    from lmforge.recipes.finetune import load_task_model

    run, _, dev = finetuned("span")
    old = tmp_path / "old"
    shutil.copytree(run, old)
    config = json.loads((old / "config.json").read_text())
    head = config["head"]
    for key in ("features", "decoding"):
        head.pop(key, None)
    for key in ("span_features", "span_decoding"):
        head["task"].pop(key, None)
    (old / "config.json").write_text(json.dumps(config))
    model, task, _ = load_task_model(str(old))
    assert model.head.features == "width" and model.head.decoding == "flat"
    assert task.config.span_features == "width" and task.config.span_decoding == "flat"
    assert "head.width.weight" in model.state_dict()
    new_model, _, _ = load_task_model(str(run))
    assert model.state_dict().keys() == new_model.state_dict().keys()
    assert _scores(old, dev, "flat") == _scores(run, dev, "flat")

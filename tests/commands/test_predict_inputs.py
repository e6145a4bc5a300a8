"""``evaluate`` / ``predict`` on files laid out differently from the training file: other column names, ``.txt``
(one text or sentence per line), ``--max-length``, Parquet and ``datasets`` folders (ClassLabel ids read as their
names). Each must give the same predictions and metrics as the training layout."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from lmforge.cli import main
from lmforge.data.readers import read_conll


def _run(*args: str) -> int:
    return main(["-q", *args])


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f))


def _evaluate(capsys, model: Path, data: Path, *extra: str) -> dict:
    capsys.readouterr()
    assert _run("evaluate", "--model", str(model), "--test", str(data), *extra) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def _predict(model: Path, data: Path, out: Path, *extra: str) -> list[dict]:
    assert _run("predict", "--model", str(model), "--input", str(data), "--out", str(out), *extra) == 0
    return [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]


def test_other_column_names_with_the_column_options(finetuned, tmp_path, capsys):
    out, _, dev = finetuned("sequence")
    expected = _evaluate(capsys, out, dev)
    renamed = tmp_path / "renamed.csv"
    with renamed.open("w", encoding="utf-8", newline="") as f:
        writer = csv.DictWriter(f, ["sentence", "gold"])
        writer.writeheader()
        writer.writerows({"sentence": r["text"], "gold": r["label"]} for r in _rows(dev))
    assert _run("evaluate", "--model", str(out), "--test", str(renamed)) == 2
    assert "name the text column with --text-column" in capsys.readouterr().err  # the advice names a real flag
    again = _evaluate(capsys, out, renamed, "--text-column", "sentence", "--label-column", "gold")
    assert again == expected
    assert _predict(out, renamed, tmp_path / "a.jsonl", "--text-column", "sentence") == \
        _predict(out, dev, tmp_path / "b.jsonl")


def test_plain_text_one_input_per_line(finetuned, tmp_path, capsys):
    out, _, dev = finetuned("sequence")
    texts = tmp_path / "texts.txt"
    texts.write_text("".join(r["text"] + "\n\n" for r in _rows(dev)), encoding="utf-8")  # blank lines skipped
    from_txt = _predict(out, texts, tmp_path / "a.jsonl")
    from_csv = _predict(out, dev, tmp_path / "b.jsonl")
    assert [r["label"] for r in from_txt] == [r["label"] for r in from_csv] and len(from_txt) == 16
    assert _run("evaluate", "--model", str(out), "--test", str(texts)) == 2
    assert "a .txt file holds one text per line and no labels" in capsys.readouterr().err


def test_a_token_model_tags_running_text(finetuned, tmp_path):
    out, _, dev = finetuned("token")
    sentences = read_conll(dev)
    raw = tmp_path / "raw.txt"
    raw.write_text("".join(" ".join(s.tokens) + "\n" for s in sentences), encoding="utf-8")
    from_txt = _predict(out, raw, tmp_path / "a.jsonl")
    from_conll = _predict(out, dev, tmp_path / "b.jsonl")
    assert [r["tokens"] for r in from_txt] == [s.tokens for s in sentences]
    assert [r["tags"] for r in from_txt] == [r["tags"] for r in from_conll]


def test_max_length_and_options_a_model_has_not(finetuned, tmp_path, capsys):
    out, _, dev = finetuned("sequence")
    shorter = _evaluate(capsys, out, dev, "--max-length", "12")
    assert set(shorter) >= {"accuracy", "f1"}
    assert _run("evaluate", "--model", str(out), "--test", str(dev), "--max-length", "100000") == 2
    assert "exceeds the" in (err := capsys.readouterr().err) and "positions of the model" in err
    token_out, _, token_dev = finetuned("token")
    assert _run("predict", "--model", str(token_out), "--input", str(token_dev), "--out", str(tmp_path / "x.jsonl"),
                "--text-column", "words") == 2
    assert "--text-column: " in (err := capsys.readouterr().err) and "'token' model" in err


PYARROW = "Parquet needs pyarrow (the formats extra; make test installs it)"


def test_parquet_gives_the_same_metrics(finetuned, tmp_path, capsys):
    pa = pytest.importorskip("pyarrow", reason=PYARROW)
    import pyarrow.parquet as pq

    out, _, dev = finetuned("sequence")
    rows = _rows(dev)
    table = tmp_path / "dev.parquet"
    pq.write_table(pa.table({"text": [r["text"] for r in rows], "label": [r["label"] for r in rows]}), table)
    assert _evaluate(capsys, out, table) == _evaluate(capsys, out, dev)


def test_datasets_folders_and_class_labels(finetuned, tmp_path, capsys):
    datasets = pytest.importorskip("datasets", reason="the datasets package writes the reference folders")
    out, _, dev = finetuned("sequence")
    rows = _rows(dev)
    names = ["neg", "pos"]
    features = datasets.Features({"text": datasets.Value("string"), "label": datasets.ClassLabel(names=names)})
    ds = datasets.Dataset.from_dict({"text": [r["text"] for r in rows],
                                     "label": [names.index(r["label"]) for r in rows]}, features=features)
    ds.save_to_disk(str(tmp_path / "dev-ds"))
    ds.to_parquet(str(tmp_path / "dev-ids.parquet"))
    expected = _evaluate(capsys, out, dev)
    assert _evaluate(capsys, out, tmp_path / "dev-ds") == expected  # ids 0/1 read as neg/pos
    assert _evaluate(capsys, out, tmp_path / "dev-ids.parquet") == expected
    datasets.DatasetDict({"validation": ds}).save_to_disk(str(tmp_path / "dict"))
    assert _run("evaluate", "--model", str(out), "--test", str(tmp_path / "dict")) == 2
    assert "a DatasetDict folder (splits validation); give one split's folder" in capsys.readouterr().err

    token_out, _, token_dev = finetuned("token")
    sentences = read_conll(token_dev)
    tags = sorted({t for s in sentences for t in s.tags})
    tag_features = datasets.Features({"tokens": datasets.Sequence(datasets.Value("string")),
                                      "ner_tags": datasets.Sequence(datasets.ClassLabel(names=tags))})
    tagged = datasets.Dataset.from_dict({"tokens": [s.tokens for s in sentences],
                                         "ner_tags": [[tags.index(t) for t in s.tags] for s in sentences]},
                                        features=tag_features)
    tagged.save_to_disk(str(tmp_path / "ner-ds"))
    assert _evaluate(capsys, token_out, tmp_path / "ner-ds") == _evaluate(capsys, token_out, token_dev)


def test_a_damaged_or_foreign_table_gets_one_clear_line(tmp_path):
    pytest.importorskip("pyarrow", reason=PYARROW)
    from lmforge.data.readers import read_classification
    from lmforge.errors import InputFileError

    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"not parquet")
    with pytest.raises(InputFileError, match="not a Parquet file"):
        read_classification(bad)
    folder = tmp_path / "ds"
    folder.mkdir()
    (folder / "dataset_info.json").write_text("{}", encoding="utf-8")
    with pytest.raises(InputFileError, match="no state.json"):
        read_classification(folder)


def test_a_csv_or_tsv_name_writes_a_table(finetuned, tmp_path):
    # `predict --out predictions.csv` wrote JSON lines into a .csv; a table name now gets a table
    out, _, dev = finetuned("sequence")
    records = _predict(out, dev, tmp_path / "p.jsonl")
    for name, delimiter in (("p.csv", ","), ("p.tsv", "\t")):
        assert _run("predict", "--model", str(out), "--input", str(dev), "--out", str(tmp_path / name)) == 0
        with (tmp_path / name).open(encoding="utf-8", newline="") as f:
            rows = list(csv.DictReader(f, delimiter=delimiter))
        assert [r["label"] for r in rows] == [r["label"] for r in records]
        assert [json.loads(r["probabilities"]) for r in rows] == [r["probabilities"] for r in records]
        assert [float(r["score"]) for r in rows] == pytest.approx([r["score"] for r in records])

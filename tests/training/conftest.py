from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True, scope="package")
def _one_intra_op_thread() -> Iterator[None]:
    # Tiny tensors: a second thread only adds synchronisation; the subprocess workers use one thread too.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)

"""Shared settings for the nn tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def _one_intra_op_thread() -> Iterator[None]:
    # The tensors here are tiny: splitting them over threads only adds synchronisation, and on a busy 2-core
    # machine a second thread made these tests up to 80x slower. Restored after each module.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)

"""``row_topk`` (beam search's per-row top-k through block maxima) against ``torch.topk``."""

from __future__ import annotations

import pytest
import torch

from lmforge.generation.search import TOPK_BLOCK, row_topk


@pytest.mark.parametrize("V", [50, 5 * TOPK_BLOCK * 8 + 17, 50257])
@pytest.mark.parametrize("k", [1, 8])
def test_equals_topk(V, k):
    x = torch.log_softmax(torch.randn(6, V, generator=torch.Generator().manual_seed(V + k)) * 4, dim=-1)
    x[0, -3:] = 50.0 + torch.arange(3.0)  # the best entries in the short tail block
    x[1, :] = -torch.inf
    x[1, 7] = 0.0  # one finite entry, the rest -inf
    values, indices = row_topk(x, k)
    ref_values, ref_indices = x.topk(k, dim=-1)
    torch.testing.assert_close(values, ref_values, rtol=0, atol=0)
    finite = ref_values.isfinite()
    assert torch.equal(indices[finite], ref_indices[finite])  # -inf ties come in any order, as in topk
    assert torch.equal(x.gather(1, indices), values)


def test_ties_at_the_block_boundary_and_nan_fall_back_to_topk(monkeypatch):
    V = 50257
    x = torch.randn(3, V, generator=torch.Generator().manual_seed(0))
    x[0, ::TOPK_BLOCK] = 9.0  # every block's maximum equal: the k-th and (k+1)-th block tie
    x[2, 11] = torch.nan
    calls = []
    real = torch.Tensor.topk

    def spy(self, *args, **kwargs):
        calls.append(tuple(self.shape))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "topk", spy)
    values, indices = row_topk(x, 4)
    assert (3, V) in calls  # fell back to the full top-k
    ref_values, ref_indices = real(x, 4, dim=-1)
    torch.testing.assert_close(values, ref_values, rtol=0, atol=0, equal_nan=True)
    assert torch.equal(indices[1:], ref_indices[1:])
    assert torch.isnan(values[2, 0]) and (values[0] == 9.0).all()

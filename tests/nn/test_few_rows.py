"""The few-row vocabulary projection of decoding steps (lmforge.nn.kernels.few_rows): every form equals F.linear, the
choice is made once per shape, and anything else goes to F.linear."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lmforge.nn.kernels import few_rows
from lmforge.nn.kernels.few_rows import FORMS, MAX_ROWS, project_rows


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 8, 16])
def test_every_form_equals_f_linear(rows):
    torch.manual_seed(0)
    x, weight = torch.randn(rows, 24), torch.randn(301, 24)
    ref = F.linear(x, weight)
    for name, form in FORMS.items():
        if name == "left4" and rows > 4:
            continue
        out = form(x, weight)
        assert out.shape == ref.shape and out.is_contiguous(), name
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5, msg=name)
    torch.testing.assert_close(project_rows(x, weight), ref, rtol=1e-5, atol=1e-5)


def test_the_form_is_chosen_once_per_shape_and_kept(monkeypatch):
    monkeypatch.setattr(few_rows, "_CHOICE", {})
    timed = []
    real = few_rows._time
    monkeypatch.setattr(few_rows, "_time", lambda form, x, w: timed.append(form) or real(form, x, w))
    x, weight = torch.randn(2, 8), torch.randn(50, 8)
    project_rows(x, weight)
    first = len(timed)
    assert first == 3  # linear, left and left4 (fewer than four rows)
    project_rows(torch.randn(2, 8), weight)
    assert len(timed) == first  # the same key: no new timing
    assert list(few_rows._CHOICE.values())[0] in FORMS


def test_training_batches_and_other_shapes_take_f_linear(monkeypatch):
    monkeypatch.setattr(few_rows, "_CHOICE", {})
    weight = torch.randn(40, 8, requires_grad=True)
    x = torch.randn(3, 8)
    out = project_rows(x, weight)  # a gradient is wanted: autograd's F.linear
    assert out.requires_grad and few_rows._CHOICE == {}
    with torch.no_grad():
        project_rows(torch.randn(17, 8), weight)  # more than MAX_ROWS rows
        project_rows(torch.randn(2, 3, 8), weight)  # not (rows, D)
    assert few_rows._CHOICE == {}


def test_out_receives_the_plain_product_and_few_rows_keep_their_own_tensor():
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(300, 24, generator=g)
    many = torch.randn(MAX_ROWS + 3, 24, generator=g)
    out = torch.full((MAX_ROWS + 3, 300), float("nan"))
    with torch.no_grad():
        got = project_rows(many, weight, out=out)
        assert got.data_ptr() == out.data_ptr()
        torch.testing.assert_close(got, F.linear(many, weight), rtol=1e-5, atol=1e-5)
        few = torch.randn(3, 24, generator=g)
        buffer = torch.zeros(3, 300)
        torch.testing.assert_close(project_rows(few, weight, out=buffer), F.linear(few, weight), rtol=1e-5,
                                   atol=1e-5)
        wrong = torch.zeros(MAX_ROWS + 3, 299)  # a buffer of another shape is not used
        assert project_rows(many, weight, out=wrong).data_ptr() != wrong.data_ptr()
    many.requires_grad_()
    assert project_rows(many, weight, out=out).requires_grad  # with autograd: F.linear, never out=

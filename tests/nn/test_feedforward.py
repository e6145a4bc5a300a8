"""Feed-forward network and activation table."""

from __future__ import annotations

import math

import pytest
import torch

from lmforge.errors import LmforgeError
from lmforge.nn import ACTIVATIONS, FeedForward

XS = [-3.0, -1.0, -0.25, 0.0, 0.5, 1.0, 2.5]


def _gelu_exact(x: float) -> float:
    return 0.5 * x * (1 + math.erf(x / math.sqrt(2)))


def _gelu_tanh(x: float) -> float:
    return 0.5 * x * (1 + math.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def _gelu_sigmoid(x: float) -> float:
    return x / (1 + math.exp(-1.702 * x))


@pytest.mark.parametrize(
    "name,formula",
    [
        ("relu", lambda x: max(x, 0.0)),
        ("gelu", _gelu_exact),
        ("gelu_tanh", _gelu_tanh),
        ("gelu_sigmoid", _gelu_sigmoid),
    ],
)
def test_activation_formulas(name, formula):
    got = ACTIVATIONS[name](torch.tensor(XS, dtype=torch.float64))
    for x, y in zip(XS, got.tolist(), strict=True):
        assert y == pytest.approx(formula(x), abs=1e-12)


def test_feedforward_is_fc2_act_fc1():
    torch.manual_seed(0)
    ffn = FeedForward(12, 37, activation="gelu_tanh").double()
    assert [n for n, _ in ffn.named_parameters()] == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    x = torch.randn(3, 7, 12, dtype=torch.float64)
    h = x @ ffn.fc1.weight.T + ffn.fc1.bias
    h = 0.5 * h * (1 + torch.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h**3)))
    torch.testing.assert_close(ffn(x), h @ ffn.fc2.weight.T + ffn.fc2.bias)


def test_feedforward_hidden_dropout_only_in_training():
    torch.manual_seed(0)
    ffn = FeedForward(12, 37, dropout=0.5)
    x = torch.randn(3, 7, 12)
    ffn.eval()
    torch.testing.assert_close(ffn(x), ffn.fc2(ACTIVATIONS["gelu"](ffn.fc1(x))))
    ffn.train()
    assert not torch.allclose(ffn(x), ffn.fc2(ACTIVATIONS["gelu"](ffn.fc1(x))))


def test_feedforward_bad_options():
    with pytest.raises(LmforgeError, match=r"'swish'.*relu, gelu, gelu_tanh, gelu_sigmoid"):
        FeedForward(12, 37, activation="swish")
    with pytest.raises(LmforgeError, match="-0.1"):
        FeedForward(12, 37, dropout=-0.1)

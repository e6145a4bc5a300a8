"""ScalarMix (ELMo's equation 1) by its formula: even at the start, softmax weights, gamma, layer norm over real
tokens only, layer dropout."""

from __future__ import annotations

import pytest
import torch

from lmforge.errors import LmforgeError
from lmforge.nn.scalar_mix import ScalarMix


def _layers(n=3, B=3, T=7, D=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, T, D, generator=g) * (j + 1) + j for j in range(n)]


def test_starts_as_the_mean_of_the_layers():
    layers = _layers()
    mix = ScalarMix(3)
    torch.testing.assert_close(mix(layers), torch.stack(layers).mean(0))


def test_weights_and_gamma_follow_the_formula():
    layers = _layers()
    mix = ScalarMix(3)
    with torch.no_grad():
        mix.weights.copy_(torch.tensor([0.5, -1.0, 2.0]))
        mix.gamma.fill_(1.7)
    s = torch.softmax(torch.tensor([0.5, -1.0, 2.0]), 0)
    expected = 1.7 * sum(s[j] * layers[j] for j in range(3))
    torch.testing.assert_close(mix(layers), expected)


def test_layer_norm_uses_real_tokens_only():
    layers = _layers(n=2)
    mask = torch.ones(3, 7)
    mask[0, 4:] = 0
    mask[2, 1:] = 0
    mix = ScalarMix(2, layer_norm=True)
    out = mix(layers, mask)
    expected = 0
    for h in layers:
        real = h[mask.bool()]  # (N, D) real tokens only
        mean, var = real.mean(), real.var(unbiased=False)
        expected = expected + 0.5 * (h - mean) / torch.sqrt(var + 1e-12)
    torch.testing.assert_close(out, expected)
    # whatever the padding holds, the real tokens' mix is the same
    noisy = [h.masked_fill(~mask.bool().unsqueeze(-1), 1e3) for h in layers]
    torch.testing.assert_close(mix(noisy, mask)[mask.bool()], out[mask.bool()])


def test_gradients_reach_weights_and_gamma():
    mix = ScalarMix(3, layer_norm=True)
    mix(_layers()).pow(2).sum().backward()
    assert mix.weights.grad is not None and mix.weights.grad.abs().sum() > 0 and mix.gamma.grad is not None


def test_layer_dropout_only_in_training():
    torch.manual_seed(0)
    layers = [torch.full((1, 1, 1), float(j)) for j in range(4)]
    mix = ScalarMix(4, dropout=0.5)
    with torch.no_grad():
        seen = {float(mix(layers)) for _ in range(50)}
    assert len(seen) > 1  # layers dropped at random
    mix.eval()
    with torch.no_grad():
        assert float(mix(layers)) == pytest.approx(1.5)


def test_works_over_a_transformer_s_hidden_states():
    from lmforge.config import model_config_from_preset
    from lmforge.models.encoder import Encoder

    config = model_config_from_preset("bert-tiny", vocab_size=99, d_model=12, n_heads=2, d_ff=37, max_seq_len=16)
    out = Encoder(config).eval()(torch.randint(5, 99, (3, 7)), output_hidden_states=True)
    mix = ScalarMix(len(out.hidden_states))
    torch.testing.assert_close(mix(out.hidden_states), torch.stack(out.hidden_states).mean(0))


def test_bad_arguments():
    with pytest.raises(LmforgeError, match="at least one layer"):
        ScalarMix(0)
    with pytest.raises(LmforgeError, match="weighs 2 layers"):
        ScalarMix(2)(_layers(3))

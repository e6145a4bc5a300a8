"""Cramming's small-compute options on every Transformer family that pretrains (issue 36, item 2): no biases in the
attention and feed-forward projections, and the gated (GEGLU) feed-forward; checked by formula and by parameter
lists, and refused where a family or an export cannot express them."""

import pytest
import torch
import torch.nn.functional as F

from lmforge.config import ModelConfig
from lmforge.errors import LmforgeError
from lmforge.models import ARCHITECTURES
from lmforge.nn.feedforward import FeedForward
from lmforge.persistence import load_pretrained, save_pretrained

TINY = dict(vocab_size=60, d_model=16, n_heads=2, n_layers=2, d_ff=24, max_seq_len=16, dropout=0.0,
            attention_dropout=0.0)


def test_the_gated_feed_forward_by_formula():
    torch.manual_seed(0)
    ffn = FeedForward(8, 5, activation="gelu", gated=True)
    x = torch.randn(2, 3, 8)
    w1, b1 = ffn.fc1.weight, ffn.fc1.bias  # (2F, D): the activated half first, then the gate's values
    a, b = x @ w1[:5].T + b1[:5], x @ w1[5:].T + b1[5:]
    expected = (F.gelu(a) * b) @ ffn.fc2.weight.T + ffn.fc2.bias
    torch.testing.assert_close(ffn(x), expected)
    assert ffn.fc1.weight.shape == (10, 8) and FeedForward(8, 5).fc1.weight.shape == (5, 8)


@pytest.mark.parametrize("arch", ["encoder", "decoder", "seq2seq"])
def test_no_bias_and_gated_in_every_layer_of_the_family(arch, tmp_path):
    torch.manual_seed(0)
    config = ModelConfig(arch=arch, bias=False, ffn="gated", **TINY)
    model = ARCHITECTURES[arch](config)
    names = [name for name, _ in model.named_parameters()]
    projections = [n for n in names if any(p in n for p in ("_proj.", "ffn.fc1.", "ffn.fc2."))]
    assert projections and not [n for n in projections if n.endswith(".bias")]  # no projection bias anywhere
    assert any(n.endswith("norm.bias") for n in names)  # LayerNorms keep theirs (Cramming's option is the linears)
    fc1 = [p for n, p in model.named_parameters() if n.endswith("ffn.fc1.weight")]
    assert fc1 and all(p.shape == (2 * TINY["d_ff"], TINY["d_model"]) for p in fc1)
    ids = torch.randint(1, 60, (2, 7))
    out = model(ids, ids) if arch == "seq2seq" else model(ids)
    logits = out.logits if hasattr(out, "logits") and out.logits is not None else out.last_hidden_state
    logits.float().pow(2).mean().backward()
    assert all(p.grad is not None for n, p in model.named_parameters() if n in projections)  # every layer trains
    save_pretrained(model.eval(), tmp_path / "m")
    loaded = load_pretrained(tmp_path / "m")
    assert (loaded.config.bias, loaded.config.ffn) == (False, "gated")
    with torch.no_grad():
        again = loaded.model(ids, ids) if arch == "seq2seq" else loaded.model(ids)
        first = model(ids, ids) if arch == "seq2seq" else model(ids)
    torch.testing.assert_close(again[0], first[0])


def test_what_cannot_express_them_refuses():
    with pytest.raises(LmforgeError, match="ffn='gated': XLNet's layers have no gated variant yet") as err:
        ModelConfig(arch="xlnet", ffn="gated", **TINY)  # refused, not silently ignored
    assert "\n" not in str(err.value)
    assert not ModelConfig(arch="xlnet", bias=False, **TINY).bias  # no FFN biases: tests/models/test_xlnet_untied.py
    assert ModelConfig(arch="xlnet", norm_first=True, **TINY).norm_first  # pre-LN: tests/models/test_xlnet_pre_ln.py
    with pytest.raises(LmforgeError, match="ffn='swish' is not one of mlp, gated"):
        ModelConfig(ffn="swish", **TINY)
    from lmforge.persistence.hf_export import export_to_hf
    from lmforge.utils.model_folder import Loaded

    config = ModelConfig(arch="decoder", ffn="gated", **TINY)
    loaded = Loaded(ARCHITECTURES["decoder"](config), config, None, None)
    with pytest.raises(LmforgeError, match="has no Hugging Face layout"):
        export_to_hf(loaded)


@pytest.mark.parametrize("preset, base", [("bert-mini-budget", "bert-mini"), ("albert-mini-budget", "albert-mini"),
                                          ("electra-mini-budget", "electra-small")])
def test_the_small_budget_presets_are_their_base_pre_ln_untied_and_rotary(preset, base):
    from lmforge.config import model_config_from_preset

    budget, plain = model_config_from_preset(preset, vocab_size=64), model_config_from_preset(base, vocab_size=64)
    assert budget.norm_first and not budget.tie_embeddings and not plain.norm_first and plain.tie_embeddings
    assert budget.positional == "rotary" and plain.positional == "learned"
    changed = {k for k in budget.__dataclass_fields__ if getattr(budget, k) != getattr(plain, k)}
    assert changed <= {"norm_first", "tie_embeddings", "positional", "n_layers"}  # electra-mini: 4 layers

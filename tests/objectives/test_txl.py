"""The Transformer-XL objective (txl): memory carried across consecutive segments equals reading them as one
sequence; no gradient through the memory; a longer evaluation memory; bad settings; logits inside the model's
forward (DistributedDataParallel runs the objectives)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from lmforge.config import DataConfig, ModelConfig, model_config_from_preset
from lmforge.errors import LmforgeError
from lmforge.models.xlnet import XLNet
from lmforge.objectives.registry import get_objective
from lmforge.objectives.txl import TXLObjective, check_txl_model

V, D, T = 37, 12, 6


def tiny(**overrides) -> XLNet:
    torch.manual_seed(0)
    config = dict(arch="xlnet", vocab_size=V, d_model=D, n_heads=3, n_layers=2, d_ff=20, dropout=0.0,
                  attention_dropout=0.0, attn_type="uni", mem_len=T, activation="relu", lm_stream="content")
    return XLNet(ModelConfig(**{**config, **overrides})).eval()


def stream(rows: int = 2, segments: int = 4, seed: int = 0) -> torch.Tensor:
    return torch.randint(1, V, (rows, segments * T + 1), generator=torch.Generator().manual_seed(seed))


def window(x: torch.Tensor, k: int) -> dict[str, torch.Tensor]:
    """Segment k of the rows of ``x``, as plan "stream" gives it (labels = the next tokens)."""
    B = x.shape[0]
    return {"input_ids": x[:, k * T:(k + 1) * T], "labels": x[:, k * T + 1:(k + 1) * T + 1],
            "attention_mask": torch.ones(B, T, dtype=torch.long), "reset": torch.full((B,), int(k == 0))}


def reference_loss(model: XLNet, x: torch.Tensor, start: int, k: int) -> torch.Tensor:
    """Summed NLL of segment k's targets, the model reading segments start..k as one sequence without memory."""
    with torch.no_grad():
        logits = model(x[:, start * T:(k + 1) * T], return_logits="content").logits[:, (k - start) * T:]
    return F.cross_entropy(logits.flatten(0, 1), x[:, k * T + 1:(k + 1) * T + 1].flatten(), reduction="sum")


def test_memory_on_segment_two_equals_the_concatenation():
    model, x = tiny(), stream()
    objective = TXLObjective()
    with torch.no_grad():
        first = objective(model, window(x, 0)).losses["lm"]
        second, n = objective(model, window(x, 1)).losses["lm"]
    assert n == 2 * T
    torch.testing.assert_close(first[0], reference_loss(model, x, 0, 0), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(second, reference_loss(model, x, 0, 1), rtol=1e-5, atol=1e-5)
    # the memory is the model's own (use_mems): per layer the last mem_len inputs
    with torch.no_grad():
        own = model(x[:, T:2 * T], mems=list(model(x[:, :T], use_mems=True).mems), use_mems=True).mems
    for mine, theirs in zip(objective.memory(False), own, strict=True):
        assert mine.shape == (2, T, D)
        torch.testing.assert_close(mine, theirs)
    # a reset batch starts without memory: segment 1 alone
    with torch.no_grad():
        alone = objective(model, {**window(x, 1), "reset": torch.ones(2, dtype=torch.long)}).losses["lm"][0]
    torch.testing.assert_close(alone, reference_loss(model, x, 1, 1), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(alone, second)


def test_no_gradient_flows_into_the_memory():
    model, x = tiny().train(), stream()
    objective = TXLObjective()
    loss1, _ = objective(model, window(x, 0)).losses["lm"]
    assert all(not m.requires_grad and m.grad_fn is None for m in objective.memory(True))
    loss2, _ = objective(model, window(x, 1)).losses["lm"]
    loss2.backward()
    # had batch 2's backward gone through batch 1's graph, that graph would be freed and this would raise
    loss1.backward()
    assert model.lm_head.bias.grad is not None and model.word_embedding.weight.grad.abs().sum() > 0
    # training and evaluation keep their own memories
    assert objective.memory(False) is None


def test_a_longer_evaluation_memory_is_used_and_gives_a_finite_perplexity():
    model, x = tiny(), stream(segments=5)
    objective = get_objective("txl").build_loss(DataConfig(objective="txl", seq_len=T + 2), {"eval_mem_len": 3 * T})
    total, count = 0.0, 0
    with torch.no_grad():
        for k in range(5):
            loss, n = objective(model, window(x, k)).losses["lm"]
            total, count = total + float(loss), count + n
            assert objective.memory(False)[0].shape[1] == min((k + 1) * T, 3 * T)
            if k == 2:  # a memory of 3 segments: segment 2 reads as segments 0..2 at once
                torch.testing.assert_close(loss, reference_loss(model, x, 0, 2), rtol=1e-5, atol=1e-5)
    assert math.isfinite(math.exp(total / count))
    # training keeps the model's mem_len
    train = TXLObjective(eval_mem_len=3 * T)
    model.train()
    for k in range(3):
        train(model, window(x, k))
    assert train.memory(True)[0].shape[1] == T and train.memory(False) is None


def test_registry_entry_and_the_presets():
    entry = get_objective("txl")
    assert (entry.arch, entry.plan, entry.head, entry.masking) == ("xlnet", "stream", None, None)
    assert entry.description == "Transformer-XL (Dai et al. 2019): causal LM over consecutive segments with memory"
    for name in ("transformer-xl-tiny", "transformer-xl-base"):
        config = model_config_from_preset(name)
        assert (config.arch, config.attn_type, config.same_length) == ("xlnet", "uni", False)
        entry.check_model(config, DataConfig(objective="txl"))
    tiny_config = model_config_from_preset("transformer-xl-tiny")
    assert (tiny_config.n_layers, tiny_config.d_model, tiny_config.n_heads, tiny_config.d_ff,
            tiny_config.mem_len) == (4, 128, 4, 512, 64)


def test_bad_settings_are_clear_errors():
    with pytest.raises(LmforgeError, match="mem_len=0 must be an integer"):
        ModelConfig(arch="xlnet", attn_type="uni", mem_len=0)
    with pytest.raises(LmforgeError, match="needs attn_type='uni'.*every position sees the token it predicts"):
        check_txl_model(ModelConfig(arch="xlnet", attn_type="bi", mem_len=8))
    with pytest.raises(LmforgeError, match="needs attn_type='uni'"):
        TXLObjective()(tiny(attn_type="bi"), window(stream(), 0))
    with pytest.raises(LmforgeError, match="set --model.mem_len"):
        check_txl_model(ModelConfig(arch="xlnet", attn_type="uni", lm_stream="content"))
    with pytest.raises(LmforgeError, match="arch='xlnet'"):
        check_txl_model(ModelConfig())
    with pytest.raises(LmforgeError, match="eval_mem_len=0 must be an integer in"):
        get_objective("txl").options({"eval_mem_len": 0})
    with pytest.raises(LmforgeError, match="eval_mem_len=0 must be an integer"):
        TXLObjective(eval_mem_len=0)
    with pytest.raises(LmforgeError, match="backward LM's windows"):
        TXLObjective()(tiny(), {**window(stream(), 0), "backward": torch.ones(2, dtype=torch.long)})


def test_logits_inside_forward_and_their_bad_requests():
    model, x = tiny(), stream()
    ids = x[:, :T]
    with torch.no_grad():
        out = model(ids, return_logits="content")
        torch.testing.assert_close(out.logits, model.lm_logits(out.last_hidden_state))
        rows = torch.zeros(2, T, dtype=torch.bool)
        rows[0, 1] = rows[1, 4] = True
        some = model(ids, return_logits="content", logits_rows=rows).logits
        torch.testing.assert_close(some, out.logits[rows])
        assert model(ids).logits is None
    for kwargs, words in ((dict(return_logits="both"), "return_logits must be None, 'content'"),
                          (dict(return_logits="query"), "runs only with a target_mapping"),
                          (dict(logits_rows=rows), "pass it with return_logits"),
                          (dict(return_logits="content", logits_rows=rows[:, :2]), "logits_rows must be a bool")):
        with pytest.raises(LmforgeError, match=words):
            model(ids, **kwargs)


@pytest.mark.parametrize("name", ["txl", "plm"])
def test_the_objectives_run_under_distributed_data_parallel(name, tmp_path):
    """One gloo process: with the LM head inside XLNet.forward, DDP's backward sees every parameter once."""
    import numpy as np
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from lmforge.data.permutation import plm_example
    from lmforge.data.pretraining import collate_plm

    if dist.is_initialized():
        pytest.skip("a process group is already initialised")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        model = tiny(**({} if name == "txl" else dict(attn_type="bi", mem_len=None))).train()
        wrapped = DistributedDataParallel(model, find_unused_parameters=True)
        if name == "txl":
            objective, x = TXLObjective(), stream()
            batches = [window(x, 0), window(x, 1)]
        else:
            objective = get_objective("plm").loss(None)
            rng = np.random.default_rng(0)
            seqs = [rng.integers(1, V, size=8).astype(np.int64) for _ in range(2)]
            batch = collate_plm([plm_example(s, rng=np.random.default_rng(i), special_mask=np.zeros(8, bool),
                                             partial_k=2) for i, s in enumerate(seqs)], 0)
            batches = [batch, batch]  # a head used outside the wrapped forward fails at the second step
        for batch in batches:
            wrapped.zero_grad()
            loss, n = objective(wrapped, batch).losses[name if name == "plm" else "lm"]
            (loss / n).backward()
            assert model.lm_head.bias.grad is not None and model.lm_head.bias.grad.abs().sum() > 0
    finally:
        dist.destroy_process_group()


def test_the_stream_that_generates_is_the_one_trained():
    from lmforge.config import model_config_from_preset
    from lmforge.objectives.registry import get_objective
    from lmforge.objectives.txl import check_txl_model

    txl = model_config_from_preset("transformer-xl-tiny")
    assert txl.lm_stream == "content"
    get_objective("txl").check_model(txl, None)
    with pytest.raises(LmforgeError, match="lm_stream=content"):
        check_txl_model(model_config_from_preset("transformer-xl-tiny", lm_stream="query"))
    with pytest.raises(LmforgeError, match="objective plm trains the query stream"):
        get_objective("plm").check_model(txl, None)
    get_objective("plm").check_model(model_config_from_preset("xlnet-tiny"), None)


def test_a_tiny_transformer_xl_learns_a_deterministic_stream():
    # next token = current + 1 (mod V), read in consecutive segments with the memory carried: the objective, the
    # memory and the content-stream logits must let a small model drive the loss towards zero
    torch.manual_seed(0)
    V = 20
    config = model_config_from_preset("transformer-xl-tiny", vocab_size=V, n_layers=1, d_model=32, n_heads=2, d_ff=64,
                                      mem_len=8, dropout=0.0)
    model, objective = XLNet(config), TXLObjective()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    start, losses = torch.randint(0, V, (4, 1)), []
    for step in range(80):
        seq = (start + torch.arange(step * 8, step * 8 + 9)) % V
        out = objective(model, {"input_ids": seq[:, :-1], "labels": seq[:, 1:]})
        loss = out.losses["lm"][0] / out.losses["lm"][1]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    assert losses[0] > 2.5 and sum(losses[-5:]) / 5 < 0.5, losses[::10]

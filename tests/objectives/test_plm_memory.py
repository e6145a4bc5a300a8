"""XLNet pretrained with segment recurrence (issue 38): the memory of consecutive batches equals the concatenated
context, no gradient reaches it, bi_data's reversed distances, perm_size's local permutation, and the stream data."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from lmforge.config import DataConfig, ModelConfig
from lmforge.data.permutation import factorization_order, plm_memory_example
from lmforge.data.pretraining import collate_plm
from lmforge.errors import LmforgeError
from lmforge.models import xlnet as xlnet_module
from lmforge.models.xlnet import XLNet
from lmforge.objectives.plm import PLMObjective
from lmforge.objectives.registry import get_objective

V, D, SEP = 41, 12, 1


def tiny(**overrides) -> XLNet:
    torch.manual_seed(0)
    config = dict(arch="xlnet", vocab_size=V, d_model=D, n_heads=3, n_layers=2, d_ff=20, dropout=0.0,
                  attention_dropout=0.0, mem_len=64)
    return XLNet(ModelConfig(**{**config, **overrides})).eval()


def memory_batch(ids: np.ndarray, reuse_len: int, seed: int, **options) -> dict[str, torch.Tensor]:
    example = plm_memory_example(ids, reuse_len=reuse_len, rng=np.random.default_rng(seed),
                                 special_mask=ids == SEP, partial_k=3, **options)
    return collate_plm([example], 0)


def test_reused_part_sees_nothing_of_the_rest_and_the_rest_sees_it_all():
    ids = np.random.default_rng(0).integers(2, V, size=24)
    example = plm_memory_example(ids, reuse_len=8, rng=np.random.default_rng(1), special_mask=np.zeros(24, bool),
                                 partial_k=3)
    q = example["query_perm_mask"]
    assert q[:8, 8:].all() and not q[8:, :8].any()
    assert example["is_target"][:8].any() and example["is_target"][8:].any()  # each part predicts
    # each part's targets see only what comes before them in that part's order, never themselves
    rank = np.empty(24, dtype=int)
    rank[example["order"]] = np.arange(24)
    for i in np.flatnonzero(example["is_target"]):
        lo, hi = (0, 8) if i < 8 else (8, 24)
        seen = {j for j in range(lo, hi) if not q[i, j]}
        expected = {j for j in range(lo, hi) if not example["is_target"][j] or rank[j] < rank[i]} - {i}
        assert seen == expected
    assert example["target_mask"].sum() == example["is_target"].sum() <= 8  # ceil(24 / 3) rows shared


def test_perm_size_orders_chunk_by_chunk_with_one_shuffle_of_the_offsets():
    targets = np.ones(12, dtype=bool)
    targets[[0, 5]] = False
    rng = np.random.default_rng(3)
    order = factorization_order(12, rng=rng, targets=targets, perm_size=4)
    shuffled = np.random.default_rng(3).permutation(4)  # the offset at each rank, drawn first
    offset_rank = np.argsort(shuffled)
    expected = sorted(np.flatnonzero(targets), key=lambda p: (p // 4, offset_rank[p % 4]))
    assert order[:2].tolist() == [0, 5] and order[2:].tolist() == expected
    with pytest.raises(LmforgeError, match="perm_size=5 must be an integer >= 1 that divides"):
        factorization_order(12, rng=rng, targets=targets, perm_size=5)


def test_memory_equals_the_concatenated_context_across_two_consecutive_batches():
    model = tiny()
    R, T = 8, 20
    stream = np.random.default_rng(5).integers(2, V, size=60)
    first = np.concatenate([stream[0:T - 1], [SEP]])
    second = np.concatenate([stream[R:R + T - 1], [SEP]])  # the next sequence of the row: starts R tokens later
    b1, b2 = memory_batch(first, R, 0), memory_batch(second, R, 1)
    objective = PLMObjective(reuse_len=R)
    with torch.no_grad():
        objective(model, b1)
        mems = objective.memory(training=False)
        assert len(mems) == 2 and tuple(mems[0].shape) == (1, R, D)
        out2 = model(b2["input_ids"], perm_mask=b2["perm_mask"], target_mapping=b2["target_mapping"], mems=mems)
        # the same context without memory: [first's reused part; second], the reused part with first's masks
        x = torch.cat([b1["input_ids"][:, :R], b2["input_ids"]], dim=1)  # (1, R + T)
        perm = torch.ones(1, R + T, R + T, dtype=torch.bool)
        perm[:, :R, :R] = b1["perm_mask"][:, :R, :R]
        perm[:, R:, :R] = False
        perm[:, R:, R:] = b2["perm_mask"]
        mapping = torch.cat([torch.zeros(1, b2["target_mapping"].shape[1], R), b2["target_mapping"]], dim=2)
        whole = model(x, perm_mask=perm, target_mapping=mapping)
    torch.testing.assert_close(out2.last_hidden_state, whole.last_hidden_state[:, R:], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out2.query_state, whole.query_state, rtol=1e-5, atol=1e-5)
    # and the objective's loss on the second batch is the loss of that concatenated context
    real = b2["labels"] != -100
    expected = F.cross_entropy(model.lm_logits(whole.query_state)[real], b2["labels"][real], reduction="sum")
    with torch.no_grad():
        got = objective(model, b2).losses["plm"][0]
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    # the memory now holds both reused parts, oldest first (mem_len 64 keeps them all)
    assert tuple(objective.memory(training=False)[0].shape) == (1, 2 * R, D)


def test_no_gradient_reaches_the_memory_and_reset_empties_it():
    model = tiny().train()
    R, T = 6, 16
    ids = np.random.default_rng(2).integers(2, V, size=T)
    batch = memory_batch(ids, R, 0)
    objective = PLMObjective(reuse_len=R)
    objective(model, batch)
    stored = objective.memory(training=True)
    assert all(not m.requires_grad for m in stored)
    leaf = tuple(m.clone().requires_grad_(True) for m in stored)
    out = model(batch["input_ids"], perm_mask=batch["perm_mask"], target_mapping=batch["target_mapping"], mems=leaf,
                return_logits="query")
    out.logits.sum().backward()
    assert all(m.grad is None for m in leaf)
    assert any(p.grad is not None for p in model.parameters())
    # a batch that starts a new pass (reset) reads no memory: its loss is the loss without one
    fresh = PLMObjective(reuse_len=R)
    with torch.no_grad():
        model.eval()
        objective.load_state_dict(None)
        objective(model, batch)
        reset = {**batch, "reset": torch.ones(1, dtype=torch.long)}
        assert torch.equal(objective(model, reset).losses["plm"][0], fresh(model, batch).losses["plm"][0])


def test_reversed_rows_negate_the_relative_distances(monkeypatch):
    model = tiny()
    x = torch.randint(2, V, (2, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        flipped = model(x, reversed_rows=torch.tensor([True, False])).last_hidden_state
        plain = model(x).last_hidden_state
    original = xlnet_module.relative_positions_encoding

    def negated(q_len, k_len, d_model, *, bidirectional, clamp_len=None, dtype=torch.float32, device=None):
        pos = -torch.arange(k_len, -q_len if bidirectional else -1, -1, dtype=torch.float64)
        inv = 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
        return torch.cat((torch.sin(pos[:, None] * inv), torch.cos(pos[:, None] * inv)), -1).to(dtype)

    monkeypatch.setattr(xlnet_module, "relative_positions_encoding", negated)
    with torch.no_grad():
        reference = model(x).last_hidden_state
    monkeypatch.setattr(xlnet_module, "relative_positions_encoding", original)
    torch.testing.assert_close(flipped[0], reference[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(flipped[1], plain[1])
    assert not torch.allclose(flipped[0], plain[0])
    with pytest.raises(LmforgeError, match="reversed_rows must be a bool"):
        model(x, reversed_rows=torch.ones(3, dtype=torch.bool))


def test_the_stream_continues_each_row_and_resumes(tmp_path, bbc_dir):
    from lmforge.cli import main
    from lmforge.data.plm_stream import PLMStreamData
    from lmforge.tokenizers import WordPieceTokenizer

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for path in sorted((bbc_dir / "business").glob("*.txt"))[:12]:
        (corpus / path.name).write_bytes(path.read_bytes())
    assert main(["-q", "tokenizer", "train", "--input", str(corpus), "--vocab-size", "400", "--out",
                 str(tmp_path / "tok"), "--algorithm", "bpe-count"]) == 0
    assert main(["-q", "data", "prepare", "--tokenizer", str(tmp_path / "tok"), "--input", str(corpus), "--out",
                 str(tmp_path / "data"), "--workers", "1"]) == 0
    tokenizer = WordPieceTokenizer.from_pretrained(tmp_path / "tok")
    config = DataConfig(objective="plm", seq_len=24, reuse_len=8, perm_size=8, bi_data=True, eval_fraction=0.0)
    data = PLMStreamData(tmp_path / "data", config, tokenizer)
    batches = data.batches(4)
    first, second = next(batches), next(batches)
    state = data.state_dict()
    third = next(batches)
    assert first["reset"].tolist() == [1] * 4 and second["reset"].tolist() == [0] * 4
    assert first["reversed_rows"].tolist() == [False, False, True, True]
    assert torch.equal(second["input_ids"][:, :8], first["input_ids"][:, 8:16])  # row b continues row b
    assert (second["input_ids"][:, -1] == tokenizer.sep_id).all()
    assert second["perm_mask"][:, :8, 8:].all() and not second["perm_mask"][:, 8:, :8].any()
    stream = data._stream(0)  # the reversed rows read the stream from its end
    n = len(stream) // 2
    assert first["input_ids"][2, :8].tolist() == stream[::-1][:n * 2].reshape(2, n)[0, :8].tolist()
    again = PLMStreamData(tmp_path / "data", config, tokenizer)
    again.load_state_dict(state)
    resumed = next(again.batches(4))
    assert all(torch.equal(resumed[k], third[k]) for k in third)
    with pytest.raises(LmforgeError, match="micro-batch size must be even"):
        next(data.batches(3))


def test_settings_are_checked():
    with pytest.raises(LmforgeError, match="reuse_len=32 must be an integer in"):
        DataConfig(objective="plm", seq_len=32, reuse_len=32)
    with pytest.raises(LmforgeError, match="perm_size is part of XLNet's stream with memory"):
        DataConfig(objective="plm", seq_len=32, perm_size=16)
    with pytest.raises(LmforgeError, match="perm_size=5 must be an integer >= 1 dividing both"):
        DataConfig(objective="plm", seq_len=32, reuse_len=16, perm_size=5)
    with pytest.raises(LmforgeError, match="reuse_len applies to objective plm"):
        DataConfig(objective="mlm", seq_len=32, reuse_len=16)
    entry = get_objective("plm")
    with pytest.raises(LmforgeError, match="set --model.mem_len too"):
        entry.check_model(ModelConfig(arch="xlnet", vocab_size=V, d_model=D, n_heads=3, n_layers=1, d_ff=8),
                          DataConfig(objective="plm", seq_len=32, reuse_len=16))
    assert entry.build_loss(DataConfig(objective="plm", seq_len=32, reuse_len=16), None).reuse_len == 16

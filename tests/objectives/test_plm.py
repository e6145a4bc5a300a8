"""The PLM objective (XLNet): the identity order with every token a target is a causal LM; padding and batching
change nothing; counts and metrics."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from lmforge.config import ModelConfig
from lmforge.data.permutation import plm_example
from lmforge.data.pretraining import collate_plm
from lmforge.models.xlnet import XLNet
from lmforge.objectives.plm import PLMObjective
from lmforge.objectives.registry import get_objective

V, D = 41, 12
PAD = 0


def tiny() -> XLNet:
    torch.manual_seed(0)
    return XLNet(ModelConfig(arch="xlnet", vocab_size=V, d_model=D, n_heads=3, n_layers=2, d_ff=20, dropout=0.0,
                             attention_dropout=0.0)).eval()


def sequences(lengths, seed: int = 1) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(1, V, size=n).astype(np.int64) for n in lengths]


def examples(seqs, seed: int = 0, **options) -> list[dict]:
    return [plm_example(ids, rng=np.random.default_rng([seed, i]), special_mask=np.zeros(len(ids), dtype=bool),
                        **options) for i, ids in enumerate(seqs)]


def causal_reference(model: XLNet, ids: np.ndarray) -> tuple[torch.Tensor, int]:
    """Summed NLL of predicting each token t from tokens 0..t-1 only, one model call per t, by hand.

    Each call sees the prefix and a stand-in at position t (a different token: the query stream must not read it),
    with ``attn_type="bi"`` and the strictly-causal query mask (position i may not see j >= i), and one prediction
    row at t read through the LM head. No future token is in the input at all.
    """
    total, correct = torch.zeros(()), 0
    for t in range(len(ids)):
        stand_in = (int(ids[t]) % (V - 1)) + 1 if ids[t] != V - 1 else 1
        x = torch.tensor(np.concatenate([ids[:t], [stand_in]]))[None]  # (1, t + 1)
        causal = torch.ones(t + 1, t + 1, dtype=torch.bool).triu(0)[None]  # True = may not see: j >= i
        mapping = torch.zeros(1, 1, t + 1)
        mapping[0, 0, t] = 1.0
        with torch.no_grad():
            out = model(x, perm_mask=causal, target_mapping=mapping)
            logits = model.lm_logits(out.query_state)[0, 0]
        total = total + F.cross_entropy(logits[None], torch.tensor([int(ids[t])]), reduction="sum")
        correct += int(logits.argmax() == int(ids[t]))
    return total, correct


def test_identity_order_with_every_token_a_target_is_a_causal_lm():
    model = tiny()
    assert model.config.attn_type == "bi"
    seqs = sequences([9, 6, 9])  # the 6-token sequence is padded in the batch
    exs = [plm_example(ids, rng=np.random.default_rng(i), special_mask=np.zeros(len(ids), dtype=bool), partial_k=1,
                       num_predict=len(ids), order="identity") for i, ids in enumerate(seqs)]
    for e, ids in zip(exs, seqs, strict=True):  # every token is a target, in position order: causal masks
        assert e["is_target"].all() and (e["order"] == np.arange(len(ids))).all()
        assert (e["query_perm_mask"] == np.triu(np.ones((len(ids),) * 2, dtype=bool))).all()
    batch = collate_plm(exs, PAD)
    objective = PLMObjective()
    with torch.no_grad():
        out = objective(model, batch)
    loss, n = out.losses["plm"]
    refs = [causal_reference(model, ids) for ids in seqs]
    assert n == objective.counts(batch)["plm"] == sum(len(s) for s in seqs)
    torch.testing.assert_close(loss, sum(r[0] for r in refs), rtol=1e-5, atol=1e-5)
    assert int(out.metrics["plm_accuracy"][0]) == sum(r[1] for r in refs)
    assert out.metrics["plm_accuracy"][1] == n


def test_random_orders_batched_and_padded_equal_one_sequence_at_a_time():
    model = tiny()
    seqs = sequences([12, 7, 10], seed=3)
    exs = examples(seqs, seed=5, partial_k=3, max_span=3, num_predict=4)
    objective = PLMObjective()
    with torch.no_grad():
        batched, n = objective(model, collate_plm(exs, PAD)).losses["plm"]
        alone = [objective(model, collate_plm([e], PAD)).losses["plm"] for e in exs]
    assert n == sum(a[1] for a in alone) == sum(int(e["target_mask"].sum()) for e in exs)
    torch.testing.assert_close(batched, sum(a[0] for a in alone), rtol=1e-5, atol=1e-5)
    # the targets are hidden from their own query stream: changing a target token changes only the other rows
    e = exs[0]
    first = int(np.flatnonzero(e["is_target"])[0])
    changed = dict(e, input_ids=e["input_ids"].copy())
    changed["input_ids"][first] = changed["input_ids"][first] % (V - 1) + 1
    with torch.no_grad():
        g0 = model(**_inputs(collate_plm([e], PAD))).query_state
        g1 = model(**_inputs(collate_plm([changed], PAD))).query_state
    row = int(np.flatnonzero(e["target_mapping"][:, first])[0])
    torch.testing.assert_close(g0[0, row], g1[0, row])


def _inputs(batch: dict) -> dict:
    return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"],
            "perm_mask": batch["perm_mask"], "target_mapping": batch["target_mapping"]}


def test_the_loss_trains_and_the_registry_entry():
    entry = get_objective("plm")
    assert (entry.arch, entry.plan, entry.head, entry.masking) == ("xlnet", "plm", None, None)
    model = tiny().train()
    batch = collate_plm(examples(sequences([10, 10]), partial_k=2), PAD)
    objective = entry.loss(None)
    loss, n = objective(model, batch).losses["plm"]
    (loss / n).backward()
    assert model.mask_emb.grad is not None and model.lm_head.bias.grad.abs().sum() > 0
    assert model.word_embedding.weight.grad.abs().sum() > 0

"""Plan "plm" (XLNet): the batch format and its padding, exact resumption, fresh orders each epoch, bad settings."""

from __future__ import annotations

import itertools
import re

import numpy as np
import pytest
import torch

from lmforge.config import DataConfig
from lmforge.data.instances import plan_packed
from lmforge.data.pretraining import PretrainingData
from lmforge.errors import LmforgeError
from lmforge.objectives.registry import get_objective


def config(**overrides) -> DataConfig:
    return DataConfig(**{"objective": "plm", "seq_len": 40, "eval_fraction": 0.1, **overrides})


def plm_data(corpus, tokenizer, cfg: DataConfig, **kwargs) -> PretrainingData:
    objective = get_objective(cfg.objective)
    return PretrainingData(corpus, cfg, tokenizer, plan=objective.plan, masking=objective.masking_for(cfg), **kwargs)


def take(data: PretrainingData, micro_batch_size: int, n: int) -> list[dict[str, torch.Tensor]]:
    return list(itertools.islice(data.batches(micro_batch_size), n))


def assert_same(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.keys() == y.keys()
        for k in x:
            assert torch.equal(x[k], y[k]), k


def test_batches_hold_packed_sequences_as_plm_examples(corpus, tokenizer):
    cfg = config(partial_k=4, plm_max_span=3)
    data = plm_data(corpus, tokenizer, cfg, seed=3)
    assert data.masking is None and data.num_predict == 10  # ceil(40 / 4)
    # the examples are RoBERTa's packed full sentences
    assert data.examples_per_epoch() == len(plan_packed(data.documents, corpus.sentence_offsets, 40))
    special = torch.tensor(sorted(tokenizer.special_ids))
    n_batches = data.examples_per_epoch() // 4
    for batch in take(data, 4, n_batches):
        ids, attention, perm = batch["input_ids"], batch["attention_mask"].bool(), batch["perm_mask"]
        B, T = ids.shape
        mapping, target_mask, labels = batch["target_mapping"], batch["target_mask"], batch["labels"]
        N = labels.shape[1]
        assert perm.dtype == torch.bool and mapping.dtype == torch.float32 and target_mask.dtype == torch.bool
        assert perm.shape == (B, T, T) and mapping.shape == (B, N, T) and N <= data.num_predict
        assert (batch["token_type_ids"] == 0).all() and (ids[~attention] == tokenizer.pad_id).all()
        assert torch.equal(target_mask, labels != -100)
        # each real row is one-hot at a real, non-special position holding its label, in increasing order
        assert torch.equal(mapping.sum(-1), target_mask.float())
        position = mapping.argmax(-1)  # (B, N)
        for b in range(B):
            rows = position[b][target_mask[b]]
            assert (rows.diff() > 0).all() and attention[b, rows].all()
            assert torch.equal(ids[b, rows], labels[b][target_mask[b]])
            assert not torch.isin(ids[b, rows], special).any()
            assert 1 <= len(rows) <= data.num_predict
            n = int(attention[b].sum())
            # padding: nobody sees a padded position, a padded position sees nothing
            assert perm[b, :, n:].all() and perm[b, n:, :].all()
            # the query stream of a target never sees itself; the context (non-targets) sees no target
            assert perm[b, rows, rows].all()
            is_target = torch.zeros(T, dtype=torch.bool)
            is_target[rows] = True
            context = ~is_target & attention[b]
            assert perm[b][context][:, is_target].all()
            among_context = perm[b][context][:, context]  # ... and all of the context but itself (query stream)
            assert torch.equal(among_context, torch.eye(int(context.sum()), dtype=torch.bool))
        # about 1/K of the text tokens are predicted
        assert 0.1 < float(target_mask.sum()) / float(attention.sum()) < 0.4


def test_resume_gives_exactly_the_uninterrupted_batches(corpus, tokenizer):
    cfg = config(partial_k=3)
    full = plm_data(corpus, tokenizer, cfg, seed=11)
    per_epoch = full.examples_per_epoch() // 4
    total = per_epoch * 2 + 3  # crosses two epoch boundaries
    reference = take(full, 4, total)
    assert full.state_dict()["epoch"] >= 1
    for cut in (1, per_epoch, per_epoch + 2):
        first = plm_data(corpus, tokenizer, cfg, seed=11)
        head = take(first, 4, cut)
        state = first.state_dict()
        resumed = plm_data(corpus, tokenizer, cfg, seed=11)
        resumed.load_state_dict(state)
        assert_same(head + take(resumed, 4, total - cut), reference)
    # the same seed gives the same batches, another seed other targets and orders
    assert_same(take(plm_data(corpus, tokenizer, cfg, seed=11), 4, 3), reference[:3])
    other = take(plm_data(corpus, tokenizer, cfg, seed=12), 4, 3)
    assert any(not torch.equal(a["perm_mask"], b["perm_mask"]) for a, b in zip(other, reference, strict=True))


def _by_text(batches: list[dict]) -> dict[tuple, tuple]:
    out = {}
    for batch in batches:
        for i in range(len(batch["input_ids"])):
            n = int(batch["attention_mask"][i].sum())
            out[tuple(batch["input_ids"][i, :n].tolist())] = (batch["labels"][i].tolist(),
                                                              batch["perm_mask"][i, :n, :n].flatten().tolist())
    return out


def test_targets_and_orders_change_between_epochs_not_in_static_mode_or_eval(corpus, tokenizer):
    for static in (False, True):
        data = plm_data(corpus, tokenizer, config(static=static, dupe_factor=1), seed=0)
        n = data.examples_per_epoch() // 2
        epochs = take(data, 2, 2 * n)
        first, second = _by_text(epochs[:n]), _by_text(epochs[n:])
        assert first.keys() == second.keys()
        assert (first == second) == static
    evaluation = plm_data(corpus, tokenizer, config(), split="eval", seed=0)
    assert_same(list(evaluation.batches(2)), list(plm_data(corpus, tokenizer, config(), split="eval",
                                                           seed=9).batches(2)))


def test_num_predict_sets_the_rows_and_caps_the_targets(corpus, tokenizer):
    data = plm_data(corpus, tokenizer, config(partial_k=2, num_predict=3), seed=0)
    batch = next(iter(data.batches(4)))
    assert batch["labels"].shape[1] == 3 and (batch["target_mask"].sum(1) <= 3).all()
    everything = plm_data(corpus, tokenizer, config(partial_k=1, num_predict=40), seed=0)
    batch = next(iter(everything.batches(4)))
    special = torch.isin(batch["input_ids"], torch.tensor(sorted(tokenizer.special_ids)))
    # partial_k 1: every text token is predicted
    assert torch.equal(batch["target_mask"].sum(1), (batch["attention_mask"].bool() & ~special).sum(1))


@pytest.mark.parametrize(("overrides", "message"), [
    ({"partial_k": 0}, "partial_k=0 must be in [1, seq_len=40]"),
    ({"partial_k": 0.5}, "partial_k=0.5 must be in [1, seq_len=40]"),
    ({"partial_k": 41}, "partial_k=41 must be in [1, seq_len=40]"),
    ({"partial_k": float("nan")}, "partial_k=nan"),
    ({"num_predict": 41}, "num_predict=41 must be an integer in [1, seq_len=40]"),
    ({"num_predict": 0}, "num_predict=0 must be an integer in [1, seq_len=40]"),
    ({"plm_max_span": 0}, "plm_max_span=0 must be an integer >= 1"),
])
def test_bad_settings_are_refused_clearly(overrides, message):
    with pytest.raises(LmforgeError, match=rf"invalid data config: .*{re.escape(message)}"):
        config(**overrides)


def test_a_sequence_with_nothing_to_predict_is_all_context(corpus, tokenizer):
    data = plm_data(corpus, tokenizer, config(), seed=0)
    ids = np.array([tokenizer.cls_id, tokenizer.unk_id, tokenizer.sep_id], dtype=np.int64)
    example = data._plm_example(ids, np.random.default_rng(0))
    assert not example["target_mask"].any() and (example["labels"] == -100).all()
    assert not (example["query_perm_mask"] & ~np.eye(3, dtype=bool)).any()

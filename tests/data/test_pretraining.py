"""PretrainingData: batch format per objective, exact resumption, rank sharding, the eval split, bad inputs."""

import itertools

import numpy as np
import pytest
import torch

from lmforge.config import DataConfig
from lmforge.data.instances import TooFewDocumentsError
from lmforge.data.pretraining import PretrainingData, split_documents
from lmforge.data.shards import ShardedCorpus, prepare_corpus
from lmforge.errors import LmforgeError
from lmforge.objectives.registry import get_objective

from .conftest import synthetic_documents, write_lines_file

OBJECTIVES = ["mlm+nsp", "mlm", "span", "clm"]


def data_for(corpus, cfg: DataConfig, tokenizer, **kwargs) -> PretrainingData:
    """PretrainingData as the pretraining recipe makes it: the plan and masking of ``cfg.objective``."""
    objective = get_objective(cfg.objective)
    return PretrainingData(corpus, cfg, tokenizer, plan=objective.plan, masking=objective.masking_for(cfg), **kwargs)


def config(**overrides) -> DataConfig:
    return DataConfig(**{"seq_len": 40, "eval_fraction": 0.1, "max_predictions": 8, **overrides})


def take(data: PretrainingData, micro_batch_size: int, n: int) -> list[dict[str, torch.Tensor]]:
    return list(itertools.islice(data.batches(micro_batch_size), n))


def assert_same(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.keys() == y.keys()
        for k in x:
            assert torch.equal(x[k], y[k]), k


def rows(batches: list[dict]) -> list[tuple]:
    """Each example as a tuple of its real tokens and labels (identifies it across batchings)."""
    out = []
    for b in batches:
        labels = b["mlm_labels"] if "mlm_labels" in b else b["labels"]
        for i in range(len(b["input_ids"])):
            real = b["attention_mask"][i].bool()
            out.append((tuple(b["input_ids"][i][real].tolist()), tuple(labels[i][real].tolist())))
    return out


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_batch_format(corpus, tokenizer, objective):
    masking = "whole_word" if objective == "mlm" else "token"
    data = data_for(corpus, config(objective=objective, masking=masking), tokenizer, seed=3)
    for batch in take(data, 3, 4):
        assert all(v.dtype == torch.long for v in batch.values())
        B, T = batch["input_ids"].shape
        assert B == 3 and T <= 40
        attention = batch["attention_mask"]
        assert set(attention.unique().tolist()) <= {0, 1} and (attention.sum(1) > 0).all()
        assert (batch["input_ids"][attention == 0] == tokenizer.pad_id).all()
        if objective == "clm":
            assert set(batch) == {"input_ids", "labels", "attention_mask"}
            assert T == 40 and (attention == 1).all()
            np.testing.assert_array_equal(batch["labels"][:, :-1], batch["input_ids"][:, 1:])
            continue
        expected = {"input_ids", "attention_mask", "token_type_ids", "mlm_labels"}
        expected |= {"nsp_labels"} if objective == "mlm+nsp" else set()
        expected |= {"sbo_left", "sbo_right", "sbo_offset"} if objective == "span" else set()
        assert set(batch) == expected
        labels = batch["mlm_labels"]
        assert (labels[attention == 0] == -100).all()
        predicted = (labels != -100).sum(1)
        assert ((predicted >= 1) & (predicted <= 8)).all()
        assert (batch["input_ids"][:, 0] == tokenizer.cls_id).all()
        if objective == "mlm+nsp":
            assert batch["nsp_labels"].shape == (3,) and set(batch["nsp_labels"].tolist()) <= {0, 1}
            assert (batch["token_type_ids"] == 1).any()
        else:
            assert (batch["token_type_ids"] == 0).all()
        if objective == "span":
            chosen = labels != -100
            left, right, offset = batch["sbo_left"], batch["sbo_right"], batch["sbo_offset"]
            lengths = attention.sum(1, keepdim=True).expand(B, T)
            assert (left[chosen] >= 0).all() and (right[chosen] < lengths[chosen]).all()
            assert (left[~chosen] == -1).all() and (offset[~chosen] == 0).all()
            pos = torch.arange(T).expand(B, T)
            assert (pos[chosen] - left[chosen] - 1 == offset[chosen]).all()
            assert (labels.gather(1, left.clamp(min=0))[chosen] == -100).all()  # boundaries are observed


@pytest.mark.parametrize("objective, static", [("mlm+nsp", False), ("mlm+nsp", True), ("mlm", False),
                                               ("span", True), ("clm", False)])
def test_resume_gives_exactly_the_uninterrupted_batches(corpus, tokenizer, objective, static):
    cfg = config(objective=objective, static=static, dupe_factor=2)
    full = data_for(corpus, cfg, tokenizer, seed=11)
    per_epoch = full.examples_per_epoch() // 4
    total = per_epoch * 2 + 3  # crosses two epoch boundaries
    reference = take(full, 4, total)
    for cut in (1, per_epoch, per_epoch + 2):
        first = data_for(corpus, cfg, tokenizer, seed=11)
        head = take(first, 4, cut)
        state = first.state_dict()
        assert state["position"] % 4 == 0
        resumed = data_for(corpus, cfg, tokenizer, seed=11)
        resumed.load_state_dict(state)
        assert_same(head + take(resumed, 4, total - cut), reference)
    assert full.state_dict()["epoch"] >= 1


def test_dynamic_masks_change_between_epochs_static_ones_do_not(corpus, tokenizer):
    for static in (False, True):
        data = data_for(corpus, config(objective="mlm", static=static, dupe_factor=1), tokenizer, seed=0)
        n = data.examples_per_epoch() // 2
        epochs = take(data, 2, 2 * n)
        first, second = sorted(rows(epochs[:n])), sorted(rows(epochs[n:]))
        assert (first == second) == static


@pytest.mark.parametrize("objective", ["mlm+nsp", "span", "clm"])
def test_ranks_split_the_examples_of_one_process(corpus, tokenizer, objective):
    cfg = config(objective=objective)
    single = rows(take(data_for(corpus, cfg, tokenizer, seed=5), 6, 5))
    ranks = [rows(take(data_for(corpus, cfg, tokenizer, seed=5, rank=r, world_size=2), 3, 5))
             for r in (0, 1)]
    assert len(ranks[0]) == len(ranks[1]) == 15
    assert sorted(ranks[0] + ranks[1]) == sorted(single)
    assert not set(ranks[0]) & set(ranks[1])


def test_eval_split_is_held_out_and_fixed(corpus, tokenizer):
    cfg = config(objective="mlm+nsp", eval_fraction=0.2)
    train = data_for(corpus, cfg, tokenizer, seed=1)
    evaluation = data_for(corpus, cfg, tokenizer, split="eval", seed=1)
    assert not set(train.documents) & set(evaluation.documents)
    assert sorted([*train.documents, *evaluation.documents]) == list(range(corpus.num_documents))
    assert len(evaluation.documents) == round(0.2 * corpus.num_documents)
    once, twice = list(evaluation.batches(4)), list(evaluation.batches(4))
    assert len(once) >= 2
    assert_same(once, twice)
    other_seed = data_for(corpus, cfg, tokenizer, split="eval", seed=99)
    assert_same(list(other_seed.batches(4)), once)  # evaluation does not depend on the training seed
    # the eval documents' tokens never appear in training batches' A segments
    eval_tokens = {tuple(corpus.document_tokens(d)[:6].tolist()) for d in evaluation.documents}
    for batch in take(train, 8, 10):
        for ids in batch["input_ids"]:
            assert tuple(ids[1:7].tolist()) not in eval_tokens


def test_split_documents():
    train, held = split_documents(100, 0.02)
    assert len(held) == 2 and len(train) == 98 and not set(train) & set(held)
    assert len(split_documents(10, 0.01)[1]) == 1  # at least one
    assert len(split_documents(1, 0.5)[1]) == 0  # never the only document
    assert len(split_documents(10, 0.0)[1]) == 0
    assert split_documents(10, 0.3)[1].tolist() == split_documents(10, 0.3)[1].tolist()


# ------------------------------------------------------------------------------------------------ bad inputs
@pytest.fixture()
def one_document(tmp_path, tokenizer_dir) -> ShardedCorpus:
    write_lines_file(tmp_path / "one.txt", synthetic_documents(1, seed=2, sentences=(6, 7)))
    prepare_corpus(tokenizer_dir, [tmp_path / "one.txt"], tmp_path / "prepared", workers=1, show_progress=False)
    return ShardedCorpus(tmp_path / "prepared")


def test_one_document_nsp_fails_clearly_and_mlm_works(one_document, tokenizer):
    with pytest.raises(TooFewDocumentsError, match="NSP needs at least two documents.*objective \"mlm\""):
        data_for(one_document, config(objective="mlm+nsp"), tokenizer)
    assert issubclass(TooFewDocumentsError, LmforgeError)
    data = data_for(one_document, config(objective="mlm", seq_len=16), tokenizer)
    assert take(data, 2, 1)[0]["input_ids"].shape[0] == 2


def test_corpus_too_small_for_a_batch(one_document, tokenizer):
    data = data_for(one_document, config(objective="mlm", seq_len=128), tokenizer)
    with pytest.raises(LmforgeError, match="fewer than one micro-batch"):
        data.batches(8)
    with pytest.raises(LmforgeError, match="no eval split"):
        data_for(one_document, config(objective="mlm"), tokenizer, split="eval")


def test_tokenizer_mismatch_and_bad_state(corpus, tokenizer, tmp_path):
    from lmforge.tokenizers import WordPieceTokenizer

    other = WordPieceTokenizer(tokenizer.ids_to_tokens[:-1])
    with pytest.raises(LmforgeError, match="different one"):
        data_for(corpus, config(), other)
    data = data_for(corpus.path, config(), tokenizer, seed=4)  # a path works too
    assert data_for(None, config(path=str(corpus.path)), tokenizer).documents.tolist() == \
        data.documents.tolist()  # and so does data.path
    with pytest.raises(LmforgeError, match="set data.path"):
        data_for(None, config(), tokenizer)
    with pytest.raises(LmforgeError, match="seed 4"):
        data.load_state_dict({"epoch": 0, "position": 0, "seed": 5})
    with pytest.raises(LmforgeError, match="epoch and position"):
        data.load_state_dict({"epoch": 0})
    with pytest.raises(LmforgeError, match="rank"):
        data_for(corpus, config(), tokenizer, rank=2, world_size=2)

"""DataConfig.doc_aligned (objective clm): every causal row starts at a document start, each document's tokens are
targets exactly once, in order, the padding of a document's short last row is ignored by the loss, and the order,
resumption, rank sharding and eval split work as for the packed blocks."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from lmforge.config import DataConfig
from lmforge.data.instances import DocAlignedBlocks
from lmforge.data.pretraining import collate_causal
from lmforge.errors import LmforgeError
from lmforge.objectives.causal_lm import CausalLMObjective

from .test_pretraining import assert_same, data_for, rows, take


def config(**overrides) -> DataConfig:
    return DataConfig(**{"objective": "clm", "seq_len": 16, "eval_fraction": 0.1, "doc_aligned": True,
                         **overrides})


@pytest.mark.parametrize("block_len", [1, 5, 16, 37])
def test_each_document_is_cut_on_its_own_and_every_token_is_a_target_once(corpus, block_len):
    sep = corpus.special_ids["sep"]
    docs = [5, 2, 9, 0]
    blocks = DocAlignedBlocks(corpus, block_len, eos_id=sep, documents=docs)
    windows = [blocks[i] for i in range(len(blocks))]
    assert all(2 <= len(w) <= block_len + 1 for w in windows)
    i = 0
    for d in docs:
        sequence = np.concatenate([[sep], corpus.document_tokens(d), [sep]])
        own = []
        while sum(len(w) - 1 for w in own) < len(sequence) - 1:
            own.append(windows[i])
            i += 1
        assert own[0][0] == sep  # the row starts at the document's start, after its leading [SEP]
        assert all(len(w) == block_len + 1 for w in own[:-1])  # only the document's last row is short
        # inputs and targets: every token after the leading [SEP] is a target exactly once, in order
        np.testing.assert_array_equal(np.concatenate([w[1:] for w in own]), sequence[1:])
        np.testing.assert_array_equal(np.concatenate([w[:-1] for w in own]), sequence[:-1])
    assert i == len(blocks)
    assert blocks.num_stream_tokens == sum(corpus.document_lengths[d] + 2 for d in docs)
    with pytest.raises(IndexError):
        blocks[len(blocks)]
    with pytest.raises(LmforgeError, match="block_len"):
        DocAlignedBlocks(corpus, 0, eos_id=sep)


def test_short_rows_are_padded_and_the_loss_counts_only_real_targets(corpus, tokenizer):
    data = data_for(corpus, config(), tokenizer, seed=3)
    batches = take(data, 4, data.examples_per_epoch() // 4)
    saw_padding = False
    for batch in batches:
        ids, labels, attention = batch["input_ids"], batch["labels"], batch["attention_mask"]
        assert ids.shape[1] <= 16
        real = attention.bool()
        assert (labels[~real] == -100).all() and (ids[~real] == tokenizer.pad_id).all()
        assert (labels[real] != -100).all()
        saw_padding |= bool((~real).any())
    assert saw_padding
    # the objective's loss and counts see the real targets only: a short row padded in a batch adds its own loss
    torch.manual_seed(0)
    embedding = torch.nn.Embedding(tokenizer.vocab_size, tokenizer.vocab_size)

    def model(input_ids, attention_mask=None):  # position-wise, so only the labels decide what counts
        return SimpleNamespace(logits=embedding(input_ids))

    objective = CausalLMObjective()
    sep = tokenizer.sep_id
    blocks = [np.array([sep, 7, 8, 9, sep]), np.array([sep, 7, 8])]
    batch = collate_causal(blocks, tokenizer.pad_id)
    assert batch["labels"].tolist() == [[7, 8, 9, sep], [7, 8, -100, -100]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    assert objective.counts(batch) == {"lm": 6}
    loss, n = objective(model, batch).losses["lm"]
    alone = [objective(model, collate_causal([b], tokenizer.pad_id)).losses["lm"] for b in blocks]
    assert n == 6 == sum(k for _, k in alone)
    assert torch.allclose(loss, sum(x for x, _ in alone))


def test_rows_start_at_document_starts_in_batches(corpus, tokenizer):
    longest = int(max(corpus.document_lengths))
    data = data_for(corpus, config(seq_len=longest + 1), tokenizer, seed=0)  # one row per document
    n = data.examples_per_epoch()
    assert n == len(data.documents)
    firsts = set()
    for batch in take(data, 2, n // 2):
        assert (batch["input_ids"][:, 0] == tokenizer.sep_id).all()
        for ids, mask in zip(batch["input_ids"], batch["attention_mask"], strict=True):
            firsts.add(tuple(ids[mask.bool()][1:6].tolist()))
    assert firsts == {tuple(corpus.document_tokens(d)[:5].tolist()) for d in data.documents}


def test_resume_epochs_and_ranks_as_the_packed_blocks(corpus, tokenizer):
    cfg = config()
    full = data_for(corpus, cfg, tokenizer, seed=11)
    per_epoch = full.examples_per_epoch() // 4
    total = per_epoch * 2 + 3  # crosses two epoch boundaries
    reference = take(full, 4, total)
    for cut in (1, per_epoch, per_epoch + 2):
        first = data_for(corpus, cfg, tokenizer, seed=11)
        head = take(first, 4, cut)
        resumed = data_for(corpus, cfg, tokenizer, seed=11)
        resumed.load_state_dict(first.state_dict())
        assert_same(head + take(resumed, 4, total - cut), reference)
    assert full.state_dict()["epoch"] >= 1
    # an epoch draws distinct rows of the blocks, in a new order each epoch; the same seed gives the same batches
    blocks = full._fixed
    every = {(tuple(b[:-1].tolist()), tuple(b[1:].tolist())) for b in (blocks[i] for i in range(len(blocks)))}
    first, second = rows(reference[:per_epoch]), rows(reference[per_epoch + 1:2 * per_epoch + 1])
    assert set(first) <= every and set(second) <= every and first != second
    assert_same(take(data_for(corpus, cfg, tokenizer, seed=11), 4, 5), reference[:5])
    # ranks split one process's rows
    single = rows(take(data_for(corpus, cfg, tokenizer, seed=5), 6, 5))
    ranks = [rows(take(data_for(corpus, cfg, tokenizer, seed=5, rank=r, world_size=2), 3, 5)) for r in (0, 1)]
    assert sorted(ranks[0] + ranks[1]) == sorted(single)


def test_eval_split_holds_other_documents(corpus, tokenizer):
    cfg = config(eval_fraction=0.2, seq_len=int(max(corpus.document_lengths)) + 1)
    train = data_for(corpus, cfg, tokenizer, seed=1)
    evaluation = data_for(corpus, cfg, tokenizer, split="eval", seed=1)
    assert not set(train.documents) & set(evaluation.documents)
    assert evaluation.examples_per_epoch() == len(evaluation.documents)
    assert_same(list(evaluation.batches(2)), list(evaluation.batches(2)))


def test_packed_blocks_stay_the_default(corpus, tokenizer):
    packed = data_for(corpus, config(doc_aligned=False), tokenizer, seed=0)
    batch = take(packed, 4, 1)[0]
    assert batch["input_ids"].shape == (4, 16) and (batch["attention_mask"] == 1).all()


@pytest.mark.parametrize("objective", ["mlm", "mlm+nsp", "bilm", "txl"])
def test_refused_for_other_objectives(objective):
    with pytest.raises(LmforgeError, match="doc_aligned"):
        DataConfig(objective=objective, doc_aligned=True)
    with pytest.raises(LmforgeError, match="doc_aligned"):
        DataConfig(objective="clm", doc_aligned="yes")
    assert DataConfig(objective=objective).doc_aligned is False

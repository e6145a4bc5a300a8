"""The backward AWD-LSTM (``ModelConfig.reverse``; ULMFiT's backward LM, Howard & Ruder 2018, sections 3.4 and 4):
it reads each row right to left with outputs at their input positions, its LM stream gives the previous tokens as
targets, the objective refuses a direction mismatch, generation refuses it, and ``lmforge pretrain
--model.reverse=true`` makes one."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from lmforge.config import DataConfig, ModelConfig
from lmforge.data.lm_stream import LMStreamData
from lmforge.errors import LmforgeError
from lmforge.models.awd_lstm import AWDLSTM
from lmforge.objectives.awd_lm import AWDLMObjective

B, T, V, D, H = 3, 9, 61, 10, 14
LENGTHS = [9, 5, 2]  # one full row, two padded on the right


def tiny(reverse: bool, seed: int = 0, **overrides) -> AWDLSTM:
    values = dict(arch="awd_lstm", vocab_size=V, d_model=D, d_hidden=H, n_layers=2,
                  bptt=4, bpt3c_grad_len=6, embed_p=0.0, input_p=0.0, hidden_p=0.0, weight_p=0.0, output_p=0.0,
                  reverse=reverse)
    torch.manual_seed(seed)
    return AWDLSTM(ModelConfig(**{**values, **overrides})).eval()


def batch(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(5, V, (B, T), generator=torch.Generator().manual_seed(seed))
    mask = (torch.arange(T)[None, :] < torch.tensor(LENGTHS)[:, None]).long()
    return ids.masked_fill(mask == 0, 0), mask


# ------------------------------------------------------------------------------------------------- config
def test_reverse_is_an_awd_lstm_option_only():
    assert ModelConfig(arch="awd_lstm", reverse=True).reverse and not ModelConfig(arch="awd_lstm").reverse
    with pytest.raises(LmforgeError, match=r"unknown key\(s\) 'reverse'; valid keys for arch encoder .* \('reverse' is "
                                           r"an option of arch awd_lstm\)"):
        ModelConfig(arch="encoder", reverse=True)


# ------------------------------------------------------------------------------------------------- the model
def test_position_k_reads_only_the_tokens_at_and_after_k():
    model = tiny(reverse=True)
    ids, mask = batch()
    with torch.no_grad():
        base = model(ids, mask).last_hidden_state
        for row, n in enumerate(LENGTHS):
            for j in range(n):
                changed = ids.clone()
                changed[row, j] = 5 + (int(ids[row, j]) - 5 + 1) % (V - 5)
                h = model(changed, mask).last_hidden_state
                assert torch.equal(h[:row], base[:row]) and torch.equal(h[row + 1:], base[row + 1:])
                # later positions (which read j only after them) do not move; j and every earlier one does
                assert torch.allclose(h[row, j + 1:], base[row, j + 1:], atol=0, rtol=0), (row, j)
                assert all(not torch.allclose(h[row, k], base[row, k]) for k in range(j + 1)), (row, j)
        assert not base[1, LENGTHS[1]:].any() and not base[2, LENGTHS[2]:].any()  # 0 at the padding


def test_reversed_equals_the_forward_model_on_reversed_rows():
    backward, forward = tiny(reverse=True), tiny(reverse=False)
    assert all(torch.equal(a, b) for a, b in zip(backward.state_dict().values(), forward.state_dict().values(),
                                                 strict=True))
    ids, mask = batch()
    with torch.no_grad():
        out = backward(ids, mask, output_hidden_states=True)
        for row, n in enumerate(LENGTHS):
            ref = forward(ids[row:row + 1, :n].flip(1), output_hidden_states=True)  # the row read right to left
            torch.testing.assert_close(out.last_hidden_state[row:row + 1, :n], ref.last_hidden_state.flip(1))
            for mine, theirs in zip(out.hidden_states, ref.hidden_states, strict=True):
                torch.testing.assert_close(mine[row:row + 1, :n], theirs.flip(1))
            torch.testing.assert_close(out.logits[row:row + 1, :n], ref.logits.flip(1))
            # concat pooling in reading order: h_T is the state after the row's first token
            torch.testing.assert_close(out.pooled_output[row:row + 1], ref.pooled_output)
            for (h, c), (h_ref, c_ref) in zip(out.state, ref.state, strict=True):
                torch.testing.assert_close(h[:, row:row + 1], h_ref)
                torch.testing.assert_close(c[:, row:row + 1], c_ref)
    # with a graph (BPT3C keeps the last bpt3c_grad_len tokens of the reading order) the values are the same
    torch.testing.assert_close(backward(ids, mask).last_hidden_state, out.last_hidden_state)


# ------------------------------------------------------------------------------------------------- the LM stream
@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    from lmforge.data.shards import ShardedCorpus, prepare_corpus
    from lmforge.tokenizers import WordPieceTokenizer
    from tests.toy_tasks import vocab

    root = tmp_path_factory.mktemp("reverse-stream")
    tokenizer = WordPieceTokenizer(vocab())
    tokenizer.save_pretrained(root / "tok")
    words = ["alice", "bob", "paris", "london", "capital", "of", "is", "north", "south", "same"]
    rng = np.random.default_rng(0)
    docs = ["\n".join(" ".join(rng.choice(words, size=rng.integers(4, 9))) + " ." for _ in range(3))
            for _ in range(12)]
    (root / "text").mkdir()
    (root / "text" / "a.txt").write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    prepare_corpus(root / "tok", [root / "text"], root / "prepared", workers=1, show_progress=False)
    return ShardedCorpus(root / "prepared", root / "tok"), tokenizer


def stream(corpus, reverse: bool, split: str = "train", seq_len: int = 8) -> LMStreamData:
    corp, tokenizer = corpus
    config = DataConfig(objective="awd_lm", seq_len=seq_len, eval_fraction=0.2, variable_bptt=False)
    return LMStreamData(corp, config, tokenizer, split=split, reverse=reverse)


@pytest.mark.parametrize("split", ["train", "eval"])
def test_backward_windows_run_right_to_left_with_the_previous_tokens_as_labels(corpus, split):
    data = stream(corpus, reverse=True, split=split)
    rows = data.rows(2, epoch=0)
    width = rows.shape[1]
    it = data.batches(2)
    windows = []
    end = width  # the first window ends at the row's end, each next one where the previous began
    while end > 1:
        b = next(it)
        x, y = b["input_ids"].numpy(), b["labels"].numpy()
        L = x.shape[1]
        assert b["backward"].tolist() == [1, 1] and b["reset"].tolist() == [int(end == width)] * 2
        np.testing.assert_array_equal(x, rows[:, end - L:end])  # text order
        np.testing.assert_array_equal(y, rows[:, end - L - 1:end - 1])  # each label: the token before its input
        windows.append(x)
        end -= L
    # together the windows cover every token that has a previous one
    np.testing.assert_array_equal(np.concatenate(windows[::-1], axis=1), rows[:, 1:])
    forward = next(stream(corpus, reverse=False, split=split).batches(2))
    assert "backward" not in forward


def test_the_objective_trains_the_backward_lm_as_the_forward_lm_on_flipped_text(corpus):
    """Backward model + backward windows (carried state included) == forward model (same weights) on the flipped
    stream with its ordinary next-token windows: the same losses, window after window."""
    kw = dict(vocab_size=corpus[1].vocab_size, bptt=70, bpt3c_grad_len=70)
    backward, forward = tiny(reverse=True, **kw), tiny(reverse=False, **kw)
    data = stream(corpus, reverse=True)
    it = data.batches(2)
    obj_b, obj_f = AWDLMObjective(), AWDLMObjective()
    for _ in range(5):
        b = next(it)
        flipped = {"input_ids": b["input_ids"].flip(1), "labels": b["labels"].flip(1), "reset": b["reset"]}
        with torch.no_grad():
            loss_b, n_b = obj_b(backward, b).losses["lm"]
            loss_f, n_f = obj_f(forward, flipped).losses["lm"]
        assert n_b == n_f == b["labels"].numel()
        torch.testing.assert_close(loss_b, loss_f)


def test_a_direction_mismatch_is_refused(corpus):
    kw = dict(vocab_size=corpus[1].vocab_size)
    back = next(stream(corpus, reverse=True).batches(2))
    ahead = next(stream(corpus, reverse=False).batches(2))
    with pytest.raises(LmforgeError, match=r"the model is a backward LM \(model.reverse=true\) but the batches are "
                                           r"forward windows"):
        AWDLMObjective()(tiny(reverse=True, **kw), ahead)
    with pytest.raises(LmforgeError, match=r"the batches are a backward LM's windows .* but the model reads left to "
                                           r"right"):
        AWDLMObjective()(tiny(reverse=False, **kw), back)


# ------------------------------------------------------------------------------------------------- generation, CLI
def test_generation_refuses_a_backward_model():
    from lmforge.generation import adapter_for

    adapter_for(tiny(reverse=False))  # the forward model generates
    with pytest.raises(LmforgeError, match=r"cannot generate with a backward language model \(model.reverse=true\)"):
        adapter_for(tiny(reverse=True))


def test_pretrain_with_model_reverse_makes_a_backward_lm(corpus, tmp_path, capsys):
    from lmforge.cli import main

    prepared = corpus[0].path
    out = tmp_path / "lm_bwd"
    assert main(["-q", "pretrain", "--preset", "awd-lstm-small", "--objective", "awd_lm", "--input", str(prepared),
                 "--out", str(out), "--max-steps", "2", "--batch-size", "2", "--seq-len", "8",
                 "--model.d_model=8", "--model.d_hidden=8", "--model.n_layers=1", "--model.reverse=true"]) == 0
    # it trained: the recipe gave the backward model backward windows (the objective refuses a mismatch)
    assert json.loads((out / "config.json").read_text())["model"]["reverse"] is True
    capsys.readouterr()
    code = main(["-q", "generate", "--model", str(out), "--prompt", "alice is"])
    err = capsys.readouterr().err.strip()
    assert code != 0 and "cannot generate with a backward language model" in err and len(err.splitlines()) == 1

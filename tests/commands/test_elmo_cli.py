"""ELMo end to end on the command line: ``pretrain --objective bilm`` on a slice of BBC News, ``embed`` its layers,
``finetune --task token`` (BiLSTM + CRF) and ``--task sequence`` on the frozen biLM's scalar mix, then ``evaluate``."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from lmforge.cli import main
from lmforge.persistence import load_pretrained
from tests.toy_tasks import write_task_data

TINY = ["--model.n_layers=2", "--model.d_model=16", "--model.d_cell=32", "--model.n_highway=1",
        "--model.char_filters=[[1, 4], [2, 8], [3, 8]]", "--model.max_chars_per_token=10", "--model.dropout=0.0",
        "--train.log_every=1", "--train.eval_batches=1"]
MODEL = {"n_layers": 2, "d_model": 16, "d_cell": 32, "n_highway": 1, "char_filters": [[1, 4], [2, 8], [3, 8]],
         "max_chars_per_token": 10, "dropout": 0.0}  # TINY's model settings


@pytest.fixture(scope="module")
def bilm_run(tmp_path_factory, bbc_dir):
    root = tmp_path_factory.mktemp("elmo")
    corpus = root / "corpus"
    corpus.mkdir()
    for path in sorted((bbc_dir / "business").glob("*.txt"))[:8]:
        (corpus / path.name).write_bytes(path.read_bytes())
    # elmo-small reads whole words (input_unit "word"): a word-level vocabulary, the other words [UNK]
    assert main(["-q", "tokenizer", "train", "--input", str(corpus), "--vocab-size", "400", "--out",
                 str(root / "tok"), "--algorithm", "words", "--min-frequency", "1"]) == 0
    assert main(["-q", "data", "prepare", "--tokenizer", str(root / "tok"), "--input", str(corpus), "--out",
                 str(root / "data"), "--workers", "1"]) == 0
    out = root / "run"
    assert main(["-q", "pretrain", "--preset", "elmo-small", "--objective", "bilm", "--input", str(root / "data"),
                 "--out", str(out), "--max-steps", "3", "--batch-size", "4", "--seq-len", "16", *TINY]) == 0
    return out


def test_pretraining_logs_both_perplexities_and_saves_a_spelled_bilm(bilm_run):
    records = [json.loads(line) for line in (bilm_run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "loss" in r]
    assert [r["step"] for r in train] == [1, 2, 3]
    for r in train:
        assert r["loss"] == pytest.approx((r["forward_nll"] + r["backward_nll"]) / 2)
        assert r["forward_ppl"] == pytest.approx(np.exp(r["forward_nll"]))
    final = json.loads((bilm_run / "eval_results.json").read_text())
    assert {"eval_forward_ppl", "eval_backward_ppl", "eval_ppl_lm"} <= set(final)
    loaded = load_pretrained(bilm_run)
    assert loaded.config.arch == "bilm" and loaded.tokenizer is not None
    assert int(loaded.model.token_chars[loaded.tokenizer.cls_id, 1]) != 0  # the vocabulary was spelled
    # the paper's biLM: whole words, LSTM cells and projections clipped at 3
    assert (loaded.config.input_unit, loaded.config.cell_clip, loaded.config.proj_clip) == ("word", 3.0, 3.0)
    assert not any(t.startswith("##") for t in loaded.tokenizer.ids_to_tokens)


def test_embed_mixes_the_bilm_layers(bilm_run, tmp_path):
    lines = tmp_path / "in.txt"
    lines.write_text("the company said profits rose\nshares fell\n", encoding="utf-8")
    mean_out, top_out = tmp_path / "mean.npy", tmp_path / "top.npy"
    assert main(["-q", "embed", "--model", str(bilm_run), "--input", str(lines), "--out", str(mean_out),
                 "--layers", "0,1,2", "--combine", "mean"]) == 0
    assert main(["-q", "embed", "--model", str(bilm_run), "--input", str(lines), "--out", str(top_out)]) == 0
    mean, top = np.load(mean_out), np.load(top_out)
    assert mean.shape == top.shape == (2, 32) and not np.allclose(mean, top)
    words = tmp_path / "words.npz"
    assert main(["-q", "embed", "--model", str(bilm_run), "--input", str(lines), "--out", str(words),
                 "--word-pooling", "first", "--layers", "0,1,2"]) == 0
    assert np.load(words)["arr_0"].shape == (5, 32)


@pytest.mark.parametrize(("task", "extra"), [("token", ["--crf"]), ("sequence", [])])
def test_finetune_on_frozen_elmo(bilm_run, tmp_path, task, extra, capsys):
    train, dev = write_task_data(tmp_path / "data", task, n_train=24, n_dev=8)
    out = tmp_path / "ft"
    assert main(["-q", "finetune", "--task", task, "--model", str(bilm_run), "--train", str(train), "--dev", str(dev),
                 "--out", str(out), "--epochs", "2", "--batch-size", "8", "--lr", "3e-3", "--max-length", "32",
                 "--model.elmo_layer_norm=true", *extra]) == 0
    loaded = load_pretrained(out)
    assert loaded.config.arch == "elmo" and loaded.config.elmo_layer_norm
    # the biLM did not move; the scalar mix did
    bilm = load_pretrained(bilm_run).model
    for name, tensor in bilm.state_dict().items():
        assert torch.equal(loaded.model.backbone.bilm.state_dict()[name], tensor), name
    assert not torch.equal(loaded.model.backbone.mix.weights, torch.zeros(3))
    capsys.readouterr()
    assert main(["-q", "evaluate", "--model", str(out), "--test", str(dev)]) == 0
    assert ("f1" if task == "token" else "accuracy") in json.loads(capsys.readouterr().out)


def test_the_sampled_softmax_ranks_the_corpus_tokens_for_its_log_uniform_sampler(bilm_run):
    # the recipe gives the biLM the corpus's token counts (bilm-tf's frequency ranking for its Zipfian sampler)
    from lmforge.config import from_dict
    from lmforge.data.shards import ShardedCorpus
    from lmforge.recipes.pretrain import PretrainRun, build_trainer

    data = bilm_run.parent / "data"
    run = from_dict(PretrainRun, {"preset": "elmo-small", "out": str(bilm_run.parent / "sampled"),
                                  "model": {**MODEL, "softmax_samples": 16},
                                  "data": {"objective": "bilm", "path": str(data), "seq_len": 16},
                                  "train": {"max_steps": 1, "batch_size": 4}})
    trainer = build_trainer(run, progress=False)
    backbone = getattr(trainer.model, "backbone", trainer.model)
    counts = ShardedCorpus(data).token_counts()
    order = backbone.frequency_order.tolist()
    assert counts[order[0]] == counts.max()
    assert all(counts[a] >= counts[b] for a, b in zip(order[:50], order[1:51], strict=True))


def test_a_piece_corpus_is_refused_for_a_word_level_bilm_and_read_with_input_unit_piece(bilm_run, tmp_path, capsys):
    root = bilm_run.parent
    assert main(["-q", "tokenizer", "train", "--input", str(root / "corpus"), "--vocab-size", "300", "--out",
                 str(tmp_path / "tok"), "--algorithm", "bpe-count"]) == 0
    assert main(["-q", "data", "prepare", "--tokenizer", str(tmp_path / "tok"), "--input", str(root / "corpus"),
                 "--out", str(tmp_path / "data"), "--workers", "1"]) == 0
    args = ["-q", "pretrain", "--preset", "elmo-small", "--objective", "bilm", "--input", str(tmp_path / "data"),
            "--max-steps", "1", "--batch-size", "2", "--seq-len", "8", *TINY]
    assert main([*args, "--out", str(tmp_path / "words")]) != 0
    assert "--algorithm words" in capsys.readouterr().err
    assert main([*args, "--out", str(tmp_path / "pieces"), "--model.input_unit=piece"]) == 0


def test_kill_and_resume_continues_both_carried_states_exactly(bilm_run, tmp_path, capsys):
    # each direction's LSTM state is checkpointed: the steps after a resume equal the uninterrupted run's
    from lmforge.training import load_trainer_state

    args = ["-q", "pretrain", "--preset", "elmo-small", "--objective", "bilm", "--input",
            str(bilm_run.parent / "data"), "--batch-size", "2", "--seq-len", "8", *TINY, "--max-steps", "4",
            "--save-every", "2", "--train.eval_every=0", "--data.eval_fraction=0"]
    assert main([*args, "--out", str(tmp_path / "whole")]) == 0, capsys.readouterr().err
    state = load_trainer_state(tmp_path / "whole" / "checkpoints" / "step-2")["objective"][0]["train_state"]
    assert set(state) == {"forward", "backward"} and tuple(state["backward"][1][1].shape) == (1, 2, 32)
    assert main([*args, "--out", str(tmp_path / "resumed"), "--resume",
                 str(tmp_path / "whole" / "checkpoints" / "step-2")]) == 0, capsys.readouterr().err
    from tests.training.helpers import losses_by_step

    assert losses_by_step(tmp_path / "resumed") == [r for r in losses_by_step(tmp_path / "whole") if r[0] > 2]

"""BART's denoising objective (objective denoise): the loss against an independent computation, the registry entry,
a tiny `lmforge pretrain --objective denoise` run that resumes exactly, and `train-seq2seq --init` from it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from lmforge.cli import main
from lmforge.config import ModelConfig
from lmforge.data.seq2seq import collate_pairs
from lmforge.errors import LmforgeError
from lmforge.models.seq2seq import EncoderDecoder
from lmforge.objectives import DenoisingObjective
from lmforge.objectives.registry import get_objective
from lmforge.persistence import load_pretrained

CFG = dict(arch="seq2seq", vocab_size=99, d_model=12, n_heads=3, n_layers=1, n_decoder_layers=2, d_ff=37,
           max_seq_len=16, dropout=0.0, attention_dropout=0.0)
TINY = ["--model.n_layers=1", "--model.n_decoder_layers=1", "--model.d_model=16", "--model.n_heads=2",
        "--model.d_ff=32", "--model.max_seq_len=32", "--seq-len", "32", "--batch-size", "4", "--train.log_every=1"]


def test_the_loss_is_the_cross_entropy_of_the_original_tokens():
    torch.manual_seed(0)
    model = EncoderDecoder(ModelConfig(**CFG)).eval()
    g = torch.Generator().manual_seed(1)
    pairs = [(torch.randint(5, 99, (n,), generator=g).tolist(), torch.randint(5, 99, (m,), generator=g).tolist())
             for n, m in ((7, 9), (4, 6), (6, 3))]  # (corrupted, original) of odd lengths: the batch pads both sides
    batch = collate_pairs([{"src_ids": s, "tgt_ids": [2, *t, 3]} for s, t in pairs], pad_id=0)
    objective = DenoisingObjective()
    out = objective(model, batch)
    reference, n = torch.zeros(()), 0
    with torch.no_grad():  # one example at a time, no padding: -log p(original token) summed by hand
        for source, original in pairs:
            target = torch.tensor([2, *original, 3])
            logits = model(torch.tensor([source]), target[None, :-1]).logits[0]  # (T, V)
            reference -= logits.log_softmax(-1).gather(1, target[1:, None]).sum()
            n += len(target) - 1
    torch.testing.assert_close(out.losses["denoise"][0].detach(), reference, rtol=1e-5, atol=1e-5)
    assert out.losses["denoise"][1] == n == objective.counts(batch)["denoise"] == 9 + 6 + 3 + 3
    assert 0 <= int(out.metrics["denoise_accuracy"][0]) <= n
    out.losses["denoise"][0].backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_registry_entry_and_presets():
    from lmforge.config import model_config_from_preset

    entry = get_objective("denoise")
    assert (entry.arch, entry.plan, entry.head, entry.masking) == ("seq2seq", "denoise", None, None)
    base = model_config_from_preset("bart-base")
    assert (base.n_layers, base.n_decoder_layers, base.d_model, base.n_heads, base.d_ff) == (6, 6, 768, 12, 3072)
    assert (base.positional, base.activation, base.norm_first) == ("learned", "gelu", False)
    assert model_config_from_preset("bart-tiny").arch == "seq2seq"


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    root = tmp_path_factory.mktemp("denoise")
    text = root / "corpus.txt"
    text.write_text("".join(f"The cat sat on mat number {i}. It was a good mat. The dog saw {i % 7} birds.\n\n"
                            for i in range(40)), encoding="utf-8")
    assert main(["-q", "tokenizer", "train", "--input", str(text), "--vocab-size", "80", "--out",
                 str(root / "tok")]) == 0
    assert main(["-q", "data", "prepare", "--tokenizer", str(root / "tok"), "--input", str(text), "--out",
                 str(root / "data"), "--workers", "1", "--format", "lines"]) == 0
    pairs = root / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"source": f"the dog saw {i} birds on mat number {i}.",
                                         "target": f"dog {i}"}) + "\n" for i in range(12)), encoding="utf-8")
    return root


def _records(out: Path) -> dict[int, dict]:
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: {k: v for k, v in r.items() if k not in ("tokens_per_s", "elapsed_s")}
            for r in lines if "loss" in r}


def test_pretrain_denoise_resumes_exactly_and_train_seq2seq_starts_from_it(prepared, tmp_path, monkeypatch, capsys):
    from lmforge.training.trainer import Trainer

    def pretrain(out: Path, *extra: str) -> int:
        return main(["-q", "pretrain", "--preset", "bart-tiny", "--objective", "denoise", "--input",
                     str(prepared / "data"), "--out", str(out), "--max-steps", "6", "--save-every", "2",
                     "--data.rotate_prob=0.5", "--data.delete_rate=0.05", *TINY, *extra])

    assert pretrain(tmp_path / "whole") == 0, capsys.readouterr().err
    original = Trainer._train_step

    def crash_at_step_4(self):
        if self.step == 3:
            raise KeyboardInterrupt
        return original(self)

    monkeypatch.setattr(Trainer, "_train_step", crash_at_step_4)
    assert pretrain(tmp_path / "cut") == 130  # interrupted after step 3; the last checkpoint is step 2
    monkeypatch.setattr(Trainer, "_train_step", original)
    assert pretrain(tmp_path / "cut", "--resume", "auto") == 0
    whole, cut = _records(tmp_path / "whole"), _records(tmp_path / "cut")
    assert sorted(whole) == sorted(cut) == [1, 2, 3, 4, 5, 6]
    assert whole == cut and all(0.0 <= r["denoise_accuracy"] <= 1.0 for r in whole.values())
    loaded = load_pretrained(tmp_path / "whole")
    resumed = load_pretrained(tmp_path / "cut").model.state_dict()
    for name, tensor in loaded.model.state_dict().items():
        torch.testing.assert_close(resumed[name], tensor, rtol=0, atol=1e-6, msg=name)
    assert loaded.config.arch == "seq2seq" and loaded.tokenizer is not None

    # train-seq2seq --init: the model starts from exactly these weights, with the folder's tokenizer
    from lmforge.recipes.seq2seq import Seq2SeqDataConfig, Seq2SeqRun, build_seq2seq_trainer

    run = Seq2SeqRun(init=str(tmp_path / "whole"), out=str(tmp_path / "ft"), model={"dropout": 0.0},
                     data=Seq2SeqDataConfig(train=str(prepared / "pairs.jsonl"), max_source_len=32))
    trainer, tokenizer, _ = build_seq2seq_trainer(run, progress=False)
    assert tokenizer.ids_to_tokens == loaded.tokenizer.ids_to_tokens and trainer.model.config.dropout == 0.0
    start = trainer.model.state_dict()
    assert start.keys() == loaded.model.state_dict().keys()
    for name, tensor in loaded.model.state_dict().items():
        assert torch.equal(start[name], tensor), name
    capsys.readouterr()
    assert main(["-q", "train-seq2seq", "--init", str(tmp_path / "whole"), "--train",
                 str(prepared / "pairs.jsonl"), "--out", str(tmp_path / "ft-cli"), "--max-steps", "2",
                 "--batch-size", "4", "--data.max_source_len=32"]) == 0, capsys.readouterr().err
    assert load_pretrained(tmp_path / "ft-cli").config.d_model == 16
    bad = Seq2SeqRun(init=str(tmp_path / "whole"), out=str(tmp_path / "bad"), model={"d_model": 32},
                     data=Seq2SeqDataConfig(train=str(prepared / "pairs.jsonl"), max_source_len=32))
    with pytest.raises(LmforgeError, match="change d_model"):
        build_seq2seq_trainer(bad, progress=False)
    assert main(["-q", "train-seq2seq", "--init", str(tmp_path / "nowhere"), "--train",
                 str(prepared / "pairs.jsonl"), "--out", str(tmp_path / "bad2")]) == 2
    assert "not a folder" in capsys.readouterr().err

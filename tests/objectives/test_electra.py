"""ELECTRA (Clark et al. 2020): labels, the gradient cut at the sampling, the loss formula, the registry entry and
presets, and a tiny ``lmforge pretrain --objective electra`` that resumes exactly and fine-tunes."""

from __future__ import annotations

import json
import random

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from lmforge.cli import main
from lmforge.config import DataConfig, ModelConfig, model_config_from_preset
from lmforge.errors import LmforgeError
from lmforge.heads import electra as electra_heads
from lmforge.heads.electra import SHARED_EMBEDDINGS, generator_config, sample_replacements
from lmforge.models.encoder import Encoder
from lmforge.objectives.electra import ElectraObjective
from lmforge.objectives.options import ElectraLoss
from lmforge.objectives.registry import get_objective
from lmforge.persistence import build_model, load_backbone, load_pretrained
from tests.training.helpers import read_jsonl, without_timing

B, T, V = 3, 7, 99
MASK_ID = 4


def tiny(**overrides):
    config = ModelConfig(**{**dict(vocab_size=V, d_model=12, n_heads=3, n_layers=2, d_ff=37, max_seq_len=16,
                                   embedding_size=8, pooler=False, generator_size=2 / 3), **overrides})
    torch.manual_seed(0)
    return build_model(config, {"type": "electra"})


def masked_batch(seed: int = 0) -> dict[str, torch.Tensor]:
    """Original ids in [5, V), about a third of the real tokens masked ([MASK] in the input), row 2 padded."""
    g = torch.Generator().manual_seed(seed)
    original = torch.randint(5, V, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[2, 4:] = 0
    selected = (torch.rand(B, T, generator=g) < 0.35) & mask.bool()
    selected[0, 1] = selected[1, 2] = True
    labels = torch.where(selected, original, torch.full_like(original, -100))
    input_ids = torch.where(selected, torch.full_like(original, MASK_ID), original)
    input_ids[2, 4:] = 0
    return dict(input_ids=input_ids, attention_mask=mask, token_type_ids=torch.zeros_like(input_ids),
                mlm_labels=labels, original=torch.where(mask.bool(), original, 0))


def own_generator_parameters(model) -> dict[str, torch.nn.Parameter]:
    """The generator's layers, projection and MLM head: everything of the generator but the shared embeddings."""
    shared = {id(p) for p in model.backbone.parameters()}
    named = dict(model.head.generator.named_parameters(prefix="generator"))
    named.update(model.head.mlm.named_parameters(prefix="mlm"))
    return {k: p for k, p in named.items() if id(p) not in shared}


# ---------------------------------------------------------------------------------------------- labels
def test_replaced_only_where_the_sample_differs(monkeypatch):
    """A sampled original is labelled original (Clark et al. 2020, section 2); the discriminator reads the samples."""
    model = tiny().eval()
    batch = masked_batch()
    selected = batch["mlm_labels"] != -100
    targets = batch["mlm_labels"][selected]  # (N,)
    n = targets.numel()
    keep = torch.arange(n) % 2 == 0  # even draws give back the original token, odd ones another
    drawn = torch.where(keep, targets, (targets - 5 + 1) % (V - 5) + 5)
    monkeypatch.setattr(electra_heads, "sample_replacements", lambda logits, temperature=1.0: drawn)
    seen = {}
    model.backbone.register_forward_pre_hook(lambda module, args: seen.setdefault("ids", args[0].clone()))
    out = model(batch["input_ids"], attention_mask=batch["attention_mask"], mlm_labels=batch["mlm_labels"])

    expected = batch["original"].clone()
    expected[selected] = drawn
    assert torch.equal(out.corrupted_ids, expected) and torch.equal(seen["ids"], expected)
    labels = torch.zeros(B, T, dtype=torch.bool)
    labels[selected] = ~keep
    assert torch.equal(out.replaced, labels)
    assert out.mlm_logits.shape == (n, V) and out.rtd_logits.shape == (B, T)


def test_real_samples_label_exactly_the_changed_tokens():
    model = tiny().train()
    batch = masked_batch(seed=1)
    selected = batch["mlm_labels"] != -100
    torch.manual_seed(3)
    out = model(batch["input_ids"], attention_mask=batch["attention_mask"], mlm_labels=batch["mlm_labels"])
    real = batch["attention_mask"].bool()
    assert torch.equal(out.corrupted_ids[~selected & real], batch["original"][~selected & real])
    assert torch.equal(out.replaced, out.corrupted_ids != torch.where(selected, batch["mlm_labels"],
                                                                      batch["input_ids"]))
    assert not out.replaced[~selected].any()


def test_sampling_follows_the_generator_distribution():
    logits = torch.tensor([[0.0, 50.0, 0.0], [50.0, 0.0, 0.0], [0.0, 0.0, 50.0]])
    assert sample_replacements(logits).tolist() == [1, 0, 2]
    assert sample_replacements(torch.zeros(0, 5)).shape == (0,)
    torch.manual_seed(0)
    draws = sample_replacements(torch.log(torch.tensor([[0.2, 0.8]])).expand(4000, 2))
    assert abs(draws.float().mean().item() - 0.8) < 0.03
    logits = torch.randn(4, 6, requires_grad=True)
    assert not sample_replacements(logits).requires_grad


def test_everything_empty_of_masks_still_runs():
    model = tiny().eval()
    batch = masked_batch()
    labels = torch.full_like(batch["mlm_labels"], -100)
    out = ElectraObjective()(model, {**batch, "input_ids": batch["original"], "mlm_labels": labels})
    assert out.losses["mlm"][1] == 0 and out.metrics["replaced_share"][0] == 0


# ---------------------------------------------------------------------------------------------- gradients
def test_the_discriminator_loss_sends_no_gradient_into_the_generator():
    model = tiny().train()
    batch = masked_batch()
    objective = ElectraObjective()
    torch.manual_seed(1)
    losses = objective(model, batch).losses
    losses["rtd"][0].backward()
    own = own_generator_parameters(model)
    assert own and all(p.grad is None or not p.grad.any() for p in own.values()), \
        [k for k, p in own.items() if p.grad is not None and p.grad.any()]
    disc = dict(model.backbone.named_parameters())
    assert all(disc[k].grad is not None for k in disc if k.startswith("layers."))
    tokens = model.backbone.embeddings.tokens.weight
    assert tokens.grad is not None and tokens.grad.any()  # the shared embeddings learn from the discriminator
    assert model.head.rtd.dense.weight.grad.any()

    model.zero_grad(set_to_none=True)
    torch.manual_seed(1)
    objective(model, batch).losses["mlm"][0].backward()  # the generator term trains the generator only
    assert all(p.grad is not None and p.grad.any() for k, p in own.items() if "layers." in k or "mlm." in k)
    assert all(p.grad is None for k, p in model.backbone.named_parameters() if k.startswith("layers."))
    assert model.head.rtd.dense.weight.grad is None


def test_the_generator_shares_the_discriminator_embeddings():
    model = tiny()
    for name in SHARED_EMBEDDINGS:
        assert getattr(model.head.generator.embeddings, name) is getattr(model.backbone.embeddings, name)
    assert model.head.mlm.weight is model.backbone.embeddings.tokens.weight
    gen = model.head.generator
    assert (gen.config.d_model, gen.config.n_heads, gen.config.d_ff, gen.config.n_layers) == (8, 2, 25, 2)
    assert gen.embeddings.projection is None  # E = 8 = the generator's width; the discriminator projects 8 -> 12
    assert model.backbone.embeddings.projection is not None


# ---------------------------------------------------------------------------------------------- loss
def test_the_loss_is_generator_mlm_plus_fifty_times_the_discriminator_bce():
    model = tiny().eval()  # no dropout: the same draws give the same outputs
    batch = masked_batch()
    objective = get_objective("electra").build_loss(DataConfig(objective="electra"))
    assert objective.rtd_weight == 50.0
    torch.manual_seed(5)
    result = objective(model, batch)
    torch.manual_seed(5)
    out = model(batch["input_ids"], attention_mask=batch["attention_mask"], mlm_labels=batch["mlm_labels"])
    labels = batch["mlm_labels"]
    real = batch["attention_mask"].bool()
    mlm = F.cross_entropy(out.mlm_logits, labels[labels != -100])  # mean over masked tokens
    disc = F.binary_cross_entropy_with_logits(out.rtd_logits[real], out.replaced[real].float())  # mean over real
    total = sum(s / n for s, n in result.losses.values())
    torch.testing.assert_close(total, mlm + 50.0 * disc)
    assert objective.counts(batch) == {k: int(n) for k, (_, n) in result.losses.items()}
    assert result.losses["rtd"][1] == int(real.sum()) and result.losses["mlm"][1] == int((labels != -100).sum())
    torch.testing.assert_close(result.metrics["rtd_bce"][0] / result.metrics["rtd_bce"][1], disc)
    weighted = ElectraObjective(ElectraLoss(rtd_weight=2.0))
    torch.manual_seed(5)
    torch.testing.assert_close(weighted(model, batch).losses["rtd"][0], 2.0 * disc * int(real.sum()))


# ---------------------------------------------------------------------------------------------- config
def test_registry_entry_presets_and_generator_sizes():
    entry = get_objective("electra")
    assert (entry.arch, entry.plan, entry.head, entry.masking) == ("encoder", "packed", {"type": "electra"}, "config")
    expected = {"electra-small": ((12, 256, 4, 1024, 128), (64, 1, 256)),  # Clark et al. 2020, Table 6
                "electra-base": ((12, 768, 12, 3072, 768), (256, 4, 1024)),
                "electra-tiny": ((2, 128, 2, 512, 64), (32, 1, 128))}
    for name, (disc, gen) in expected.items():
        config = model_config_from_preset(name)
        assert (config.n_layers, config.d_model, config.n_heads, config.d_ff, config.d_embedding) == disc
        assert not config.pooler
        g = generator_config(config)
        assert (g.d_model, g.n_heads, g.d_ff) == gen and (g.n_layers, g.d_embedding) == (disc[0], disc[4])
    assert generator_config(ModelConfig(d_model=64, n_heads=4)).d_model == 16  # unset: 1/4


def test_bad_settings_are_clear_errors():
    with pytest.raises(LmforgeError, match=r"generator_size=1.5 must be a fraction in \(0, 1\]"):
        ModelConfig(generator_size=1.5)
    with pytest.raises(LmforgeError, match="'generator_size' is an option of arch encoder"):
        ModelConfig(arch="decoder", generator_size=0.5)
    with pytest.raises(LmforgeError, match="rtd_weight=-1.0 must be a finite number >= 0"):
        get_objective("electra").options({"rtd_weight": -1.0})
    with pytest.raises(LmforgeError, match="objective 'mlm' has no loss options"):
        get_objective("mlm").options({"rtd_weight": 1.0})
    with pytest.raises(LmforgeError, match=r"d_model=19 \(of 48\) and n_heads=6 \(of 16\), which does not divide"):
        generator_config(ModelConfig(d_model=48, n_heads=16, generator_size=0.4, vocab_size=V, n_layers=1))
    untied = tiny(tie_embeddings=False)  # the generator's MLM head gets an un-embedding of its own (issue 36)
    tokens = untied.backbone.embeddings.tokens.weight
    assert untied.head.mlm.weight is not tokens and untied.head.mlm.weight.shape == tokens.shape
    tied = tiny()
    assert tied.head.mlm.weight is tied.backbone.embeddings.tokens.weight


# ---------------------------------------------------------------------------------------------- end to end
def _corpus(path) -> None:
    from tests.toy_tasks import BAD, CITIES, FILLER, GOOD, NAMES

    rng = random.Random(0)
    words = NAMES + CITIES + FILLER + GOOD + BAD
    docs = ["\n".join(" ".join(rng.choice(words) for _ in range(rng.randint(4, 10))) + " ." for _ in range(4))
            for _ in range(40)]
    path.write_text("\n\n".join(docs) + "\n", encoding="utf-8")


TINY_RUN = ["--preset", "electra-tiny", "--objective", "electra", "--batch-size", "4", "--seq-len", "16",
            "--model.max_seq_len=32", "--model.n_layers=1", "--model.d_model=16", "--model.n_heads=2",
            "--model.d_ff=32", "--model.embedding_size=8", "--model.generator_size=0.5", "--train.log_every=1",
            "--train.schedule=constant", "--train.lr=1e-3", "--data.eval_fraction=0"]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    root = tmp_path_factory.mktemp("electra")
    _corpus(root / "corpus.txt")
    assert main(["tokenizer", "train", "--input", str(root / "corpus.txt"), "--vocab-size", "120", "--out",
                 str(root / "tok")]) == 0
    assert main(["data", "prepare", "--tokenizer", str(root / "tok"), "--input", str(root / "corpus.txt"), "--out",
                 str(root / "data"), "--workers", "1", "--format", "lines"]) == 0
    return root


def test_pretrain_resumes_exactly_and_the_discriminator_fine_tunes(prepared, tmp_path, capsys):
    data = ["--input", str(prepared / "data")]
    whole, part = tmp_path / "whole", tmp_path / "part"
    assert main(["-q", "pretrain", *TINY_RUN, *data, "--out", str(whole), "--max-steps", "4"]) == 0, \
        capsys.readouterr().err
    assert main(["-q", "pretrain", *TINY_RUN, *data, "--out", str(part), "--max-steps", "2"]) == 0
    assert main(["-q", "pretrain", *TINY_RUN, *data, "--out", str(part), "--max-steps", "4", "--resume",
                 "auto"]) == 0, capsys.readouterr().err
    a, b = read_jsonl(whole / "metrics.jsonl"), read_jsonl(part / "metrics.jsonl")
    train = [r for r in a if "loss" in r]
    assert [r["step"] for r in train] == [1, 2, 3, 4]
    assert all({"loss_mlm", "loss_rtd", "rtd_accuracy", "rtd_bce", "replaced_share"} <= set(r) for r in train)
    assert without_timing(a) == without_timing(b)
    wa, wb = load_file(str(whole / "model.safetensors")), load_file(str(part / "model.safetensors"))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)

    # the folder: a discriminator backbone with the ELECTRA head; it loads whole, or as a plain encoder
    saved = json.loads((whole / "config.json").read_text())
    assert saved["head"] == {"type": "electra"} and saved["model"]["pooler"] is False
    full = load_pretrained(whole)
    assert full.model.head.generator.config.d_model == 8
    backbone = load_backbone(whole)
    assert isinstance(backbone.model, Encoder) and backbone.tokenizer is not None
    sd = full.model.backbone.state_dict()
    assert all(torch.equal(sd[k], v) for k, v in backbone.model.state_dict().items())

    from tests.toy_tasks import write_task_data

    train_file, dev_file = write_task_data(tmp_path, "sequence", n_train=24, n_dev=8)
    assert main(["-q", "finetune", "--task", "sequence", "--model", str(whole), "--train", str(train_file), "--dev",
                 str(dev_file), "--out", str(tmp_path / "ft"), "--epochs", "1", "--batch-size", "8", "--max-length",
                 "24", "--seed", "0"]) == 0, capsys.readouterr().err
    tuned = load_pretrained(tmp_path / "ft")
    assert tuned.head["type"] == "sequence_classification"
    assert main(["-q", "embed", "--model", str(whole), "--input", str(dev_file), "--out",
                 str(tmp_path / "e.npy")]) == 0


def test_one_call_runs_the_whole_step_under_distributed_data_parallel(tmp_path):
    """One gloo process: generator, sampling and discriminator all run inside the wrapped forward, so DDP's backward
    sees the generator's and the discriminator's parameters (the shared embeddings once) at every step."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    if dist.is_initialized():
        pytest.skip("a process group is already initialised")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        model = tiny().train()
        wrapped = DistributedDataParallel(model, find_unused_parameters=True)
        objective = ElectraObjective()
        for seed in (0, 1):
            wrapped.zero_grad()
            losses = objective(wrapped, masked_batch(seed)).losses
            sum(s / n for s, n in losses.values()).backward()
            assert model.head.mlm.dense.weight.grad.abs().sum() > 0
            assert model.head.rtd.dense.weight.grad.abs().sum() > 0
            assert model.backbone.embeddings.tokens.weight.grad.abs().sum() > 0
    finally:
        dist.destroy_process_group()

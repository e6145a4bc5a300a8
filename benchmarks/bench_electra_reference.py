"""ELECTRA side by side with Hugging Face's ElectraForMaskedLM + ElectraForPreTraining on the same batches (issue 21).

lmforge's ELECTRA discriminator does not learn at the demo's budget (BENCHMARKS "ELECTRA against BERT at the same
pretraining time"). This script asks whether that is lmforge's implementation or the setting: it builds lmforge's
ELECTRA model for a run, converts its weights to a Hugging Face generator (``ElectraForMaskedLM``) and discriminator
(``ElectraForPreTraining``) that share their embedding block as the paper does, and trains both for the same steps
on the same batches (lmforge's masked-LM data), with the same optimiser, schedule and loss
(generator MLM + lambda * discriminator BCE over real tokens). The Hugging Face side's loop is written here from the
paper (Clark et al. 2020, section 2); lmforge's side is ``lmforge.objectives.electra`` on lmforge's model.

First check (``--check``): with dropout off, the two sides give the same first-step loss, samples and gradient norm
(the conversion, the sampling and the loss agree). Then both train; every ``--eval-every`` steps each side is scored on
the same held-out batches (fixed masks, each side's own generator samples): the discriminator's BCE against the BCE of
predicting the replaced share as a constant, its ROC AUC (threshold-free), and the generator's MLM accuracy.

    .venv/bin/python benchmarks/bench_electra_reference.py --data runs/compare-pretraining/data/pretraining/shards \\
        --steps 300 --lr 1e-3

Writes ``benchmarks/results/electra-reference.json`` (the curves) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from lmforge.config import DataConfig, TrainConfig, from_dict
from lmforge.heads.electra import generator_config, sample_replacements
from lmforge.interop import hf_electra
from lmforge.recipes.pretrain import PretrainRun, build_trainer
from lmforge.training.optim import build_optimizer, build_scheduler

RESULTS = Path(__file__).resolve().parent / "results"
IGNORE = -100


def hf_models(model, config):
    """Hugging Face generator and discriminator holding lmforge's weights, sharing one embedding block."""
    import transformers

    state = model.state_dict()
    disc_sd = {k[len("backbone."):]: v for k, v in state.items() if k.startswith("backbone.")}
    rtd_sd = {k[len("head."):]: v for k, v in state.items() if k.startswith("head.rtd.")}
    disc_cfg = transformers.ElectraConfig(**hf_electra.config_to_hf(config, "ElectraForPreTraining"),
                                          attn_implementation="sdpa")
    disc = transformers.ElectraForPreTraining(disc_cfg)
    missing, unexpected = disc.load_state_dict(hf_electra.state_dict_to_hf(disc_sd, rtd_sd), strict=False)
    assert not unexpected and all("position_ids" in k for k in missing), (missing, unexpected)
    gen_config = generator_config(config)
    gen_enc, gen_heads = hf_electra.generator_state_dicts(state)
    gen_cfg = transformers.ElectraConfig(**hf_electra.config_to_hf(gen_config, "ElectraForMaskedLM"),
                                         attn_implementation="sdpa")
    gen = transformers.ElectraForMaskedLM(gen_cfg)
    missing, unexpected = gen.load_state_dict(hf_electra.state_dict_to_hf(gen_enc, gen_heads), strict=False)
    assert not unexpected and all("position_ids" in k for k in missing), (missing, unexpected)
    gen.electra.embeddings = disc.electra.embeddings  # the paper's sharing: one token/position table
    gen.generator_lm_head.weight = disc.electra.embeddings.word_embeddings.weight  # tied un-embedding
    return gen, disc


class HFElectra(torch.nn.Module):
    """The paper's training step over Hugging Face's two models (the reference side)."""

    def __init__(self, gen, disc, rtd_weight: float) -> None:
        super().__init__()
        self.gen, self.disc, self.rtd_weight = gen, disc, rtd_weight

    def forward(self, batch):
        labels, mask = batch["mlm_labels"], batch["attention_mask"]
        types = batch.get("token_type_ids")
        selected = labels != IGNORE
        gen_logits = self.gen(input_ids=batch["input_ids"], attention_mask=mask, token_type_ids=types).logits
        mlm_logits = gen_logits[selected]  # (N, V)
        targets = labels[selected]
        mlm = F.cross_entropy(mlm_logits.float(), targets)
        sampled = sample_replacements(mlm_logits)
        original = torch.where(selected, labels, batch["input_ids"])
        corrupted = original.masked_scatter(selected, sampled)
        replaced = corrupted != original
        rtd_logits = self.disc(input_ids=corrupted, attention_mask=mask, token_type_ids=types).logits
        real = mask.bool()
        bce = F.binary_cross_entropy_with_logits(rtd_logits[real].float(), replaced[real].float())
        return mlm + self.rtd_weight * bce, dict(mlm_logits=mlm_logits, targets=targets, rtd=rtd_logits[real],
                                                  replaced=replaced[real], sampled=sampled)


def ours_step(model, objective, batch):
    """lmforge's ELECTRA objective on lmforge's model: the loss as the Trainer forms it (each term's sum over its
    items), and the same diagnostics."""
    out = objective(model, batch)
    loss = sum(total / max(items, 1) for total, items in out.losses.values())
    return loss


def auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """ROC AUC by the rank statistic (ties get their mean rank)."""
    pos = labels.bool()
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if not n_pos or not n_neg:
        return float("nan")
    order = torch.argsort(scores)
    ranks = torch.empty_like(scores, dtype=torch.float64)
    ranks[order] = torch.arange(1, len(scores) + 1, dtype=torch.float64)
    sorted_scores = scores[order]
    _, inverse, counts = torch.unique_consecutive(sorted_scores, return_inverse=True, return_counts=True)
    starts = torch.cumsum(counts, 0) - counts
    mean_rank = (starts + (counts + 1) / 2.0).to(torch.float64)
    ranks[order] = mean_rank[inverse]
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


@torch.no_grad()
def evaluate(side: str, model, batches, seed: int) -> dict:
    """Held-out discriminator BCE, its constant baseline, AUC, recall at 0.5, generator accuracy."""
    model.eval()
    state = torch.get_rng_state()
    torch.manual_seed(seed)
    rtd, replaced, correct, n = [], [], 0, 0
    for batch in batches:
        if side == "hf":
            _, extra = model(batch)
            logits, labels = extra["rtd"], extra["replaced"]
            mlm_logits, targets = extra["mlm_logits"], extra["targets"]
        else:
            labels_all = batch["mlm_labels"]
            out = model(batch["input_ids"], attention_mask=batch["attention_mask"],
                        token_type_ids=batch.get("token_type_ids"), mlm_labels=labels_all)
            real = batch["attention_mask"].bool()
            logits, labels = out.rtd_logits[real], out.replaced[real]
            mlm_logits, targets = out.mlm_logits, labels_all[labels_all != IGNORE]
        rtd.append(logits.float())
        replaced.append(labels)
        correct += int((mlm_logits.argmax(-1) == targets).sum())
        n += targets.numel()
    torch.set_rng_state(state)
    model.train()
    scores, labels = torch.cat(rtd), torch.cat(replaced).float()
    share = float(labels.mean())
    constant = -(share * math.log(share) + (1 - share) * math.log(1 - share)) if 0 < share < 1 else 0.0
    return dict(rtd_bce=float(F.binary_cross_entropy_with_logits(scores, labels)), constant_bce=constant,
                auc=auc(scores, labels), recall=float(((scores > 0) & labels.bool()).sum() / max(labels.sum(), 1)),
                replaced_share=share, mlm_accuracy=correct / max(n, 1))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="a folder made by `lmforge data prepare` (its tokenizer inside)")
    p.add_argument("--preset", default="electra-small")
    p.add_argument("--layers", type=int, default=4, help="discriminator depth (default 4: bert-mini's)")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup-ratio", type=float, default=0.1)
    p.add_argument("--eval-every", type=int, default=30)
    p.add_argument("--eval-batches", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", default=str(RESULTS / "electra-reference.json"))
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    command = "python benchmarks/bench_electra_reference.py " + " ".join(sys.argv[1:])
    print(command)
    print(f"{platform.processor() or platform.machine()}, torch {torch.__version__}, {torch.get_num_threads()} threads")

    with tempfile.TemporaryDirectory() as tmp:
        run = PretrainRun(preset=args.preset, out=os.path.join(tmp, "run"),
                          model={"max_seq_len": args.seq_len, "n_layers": args.layers},
                          data=from_dict(DataConfig, {"path": args.data, "objective": "electra",
                                                      "seq_len": args.seq_len, "eval_fraction": 0.05}),
                          train=from_dict(TrainConfig, {"batch_size": args.batch_size, "lr": args.lr,
                                                        "warmup_ratio": args.warmup_ratio, "max_steps": args.steps,
                                                        "seed": args.seed}))
        trainer = build_trainer(run, progress=False)
    ours, objective, config = trainer.model, trainer.objective, trainer.model.backbone.config
    gen, disc = hf_models(ours, config)
    ref = HFElectra(gen, disc, objective.rtd_weight)
    train_config = run.train
    eval_batches = []
    for i, b in enumerate(trainer.eval_data.batches(args.batch_size)):
        if i >= args.eval_batches:
            break
        eval_batches.append(b)

    # 1. first-step agreement with dropout off: same loss, samples and gradient norm
    ours.eval(), ref.eval()
    first = next(iter(trainer.train_data.batches(args.batch_size)))
    torch.manual_seed(123)
    loss_ours = ours_step(ours, objective, first)
    torch.manual_seed(123)
    loss_ref, _ = ref(first)
    loss_ours.backward(), loss_ref.backward()
    gnorm = [math.sqrt(sum(float(q.grad.pow(2).sum()) for q in m.parameters() if q.grad is not None))
             for m in (ours, ref)]
    ours.zero_grad(set_to_none=True), ref.zero_grad(set_to_none=True)
    check = dict(loss_lmforge=loss_ours.item(), loss_hf=loss_ref.item(), grad_norm_lmforge=gnorm[0],
                 grad_norm_hf=gnorm[1])
    print(f"first step, dropout off: loss {check['loss_lmforge']:.6f} (lmforge) vs {check['loss_hf']:.6f} (HF); "
          f"gradient norm {gnorm[0]:.5f} vs {gnorm[1]:.5f}")
    ours.train(), ref.train()

    # 2. train both on the same batches
    opt = {"lmforge": trainer.optimizer, "hf": build_optimizer(ref, train_config)}
    sched = {"lmforge": trainer.scheduler, "hf": build_scheduler(opt["hf"], train_config)}
    models = {"lmforge": ours, "hf": ref}
    curves: dict[str, list] = {"lmforge": [], "hf": []}
    rng = {name: torch.Generator().manual_seed(args.seed) for name in models}
    start = time.time()
    batches = trainer.train_data.batches(args.batch_size)
    for step in range(args.steps + 1):
        if step % args.eval_every == 0 or step == args.steps:
            row = []
            for name in models:
                m = evaluate("hf" if name == "hf" else "ours", models[name], eval_batches, 1000 + step)
                curves[name].append({"step": step, **m})
                row.append(f"{name}: BCE {m['rtd_bce']:.3f} (const {m['constant_bce']:.3f}) AUC {m['auc']:.3f} "
                           f"recall {m['recall']:.3f} MLM {m['mlm_accuracy']:.3f}")
            print(f"step {step:5d}  " + "  |  ".join(row), flush=True)
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            tmp_out = Path(args.out).with_suffix(".tmp")
            tmp_out.write_text(json.dumps(dict(command=command, args=vars(args), first_step=check, curves=curves,
                                               seconds=time.time() - start), indent=1))
            tmp_out.replace(args.out)
        if step == args.steps:
            break
        batch = next(batches)
        for name, model in models.items():
            # each side draws its dropout masks and samples from its own stream, the same seed for both
            torch.set_rng_state(rng[name].get_state()) if step else torch.manual_seed(args.seed)
            loss = ours_step(model, objective, batch) if name == "lmforge" else model(batch)[0]
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), train_config.max_grad_norm or float("inf"))
            opt[name].step(), sched[name].step(), opt[name].zero_grad(set_to_none=True)
            rng[name].set_state(torch.get_rng_state())
    print(f"done in {time.time() - start:.0f} s -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A training run in its own process, for the kill -9 / resume and the 2-process DDP tests.

    python -m tests.training.worker OUT_DIR {decoder|tiny|sharded} [--die-at N] [--resume auto] [--parallel fsdp]

Under torchrun-style environment variables (RANK, WORLD_SIZE, ...) it joins the process group and shards the data.
"""

from __future__ import annotations

import argparse

import torch

from lmforge.training import RunOutput, Trainer, init_distributed
from tests.training.helpers import LMObjective, ToyData, tiny_decoder, tiny_lm, train_config

# decoder: dropout on, evaluation, checkpoints every 3 steps (the kill / resume test)
# tiny: no dropout, 8 sequences per step over the processes, evaluation at the end (the DDP test)
SETTINGS = {
    "decoder": dict(max_steps=10, batch_size=4, micro_batch_size=2, save_every=3, keep_last=2, eval_every=4,
                    schedule="cosine", warmup_steps=2),
    "tiny": dict(max_steps=3, batch_size=8, micro_batch_size=2, weight_decay=0.1, max_grad_norm=0.5),
    # sharded: the tiny settings on a 2-layer decoder without dropout (per-layer FSDP units, tied embeddings),
    # checkpoints every 2 steps, evaluation every 3
    "sharded": dict(max_steps=6, batch_size=8, micro_batch_size=2, weight_decay=0.1, max_grad_norm=0.5,
                    save_every=2, keep_last=0, eval_every=3, eval_batches=2),
}


def build(kind: str, rank: int, world: int, die_at: int | None = None, parallel: str = "ddp"):
    config = train_config(**SETTINGS[kind], parallel=parallel)
    model = tiny_decoder() if kind == "decoder" else \
        tiny_decoder(dropout=0.0, attention_dropout=0.0) if kind == "sharded" else tiny_lm()
    data = ToyData(n=48, seed=3, rank=rank, world=world, per_rank=config.batch_size // world, die_at=die_at)
    eval_data = ToyData(n=12, seed=4, fixed=True)  # every process evaluates the same batches
    return model, data, eval_data, config


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir")
    parser.add_argument("kind", choices=sorted(SETTINGS))
    parser.add_argument("--die-at", type=int)
    parser.add_argument("--resume", default="never")
    parser.add_argument("--parallel", default="ddp")
    args = parser.parse_args()
    torch.set_num_threads(1)
    info = init_distributed()
    model, data, eval_data, config = build(args.kind, info.rank, info.world_size, args.die_at, args.parallel)
    trainer = Trainer(model, LMObjective(two_terms=True), data, config,
                      RunOutput(args.out_dir, resume=args.resume, progress=False), eval_data=eval_data)
    # what this process holds of the parameters: all of them (ddp), half of each (fsdp)
    held = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel() for p in trainer.model.parameters())
    print(f"rank {info.rank}: sharded={trainer.placement.sharded} holds {held} parameter values", flush=True)
    trainer.fit()


if __name__ == "__main__":
    main()

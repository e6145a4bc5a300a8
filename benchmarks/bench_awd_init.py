"""Issue 38: why the AWD-LSTM stalls at the unigram loss with the paper's embedding initialisation and Adam.

A 1-layer LM (embedding 12, tied decoder) on a cycle of 7 tokens, two rows of 10 tokens per step with the state
carried (stateful truncated BPTT), as ``tests/models/test_awd_lstm.py``'s toy LM. A model that knows the 7 tokens but
not their order has loss ln 7 = 1.95. Each line trains one setting for 150 steps and reports the mean loss of the
last 5, the mean |h| of the LSTM's output and its standard deviation over time on the cycle (how much the output
depends on the input; a saturated LSTM gives |h| near 1 and little variation).

    OMP_NUM_THREADS=1 python benchmarks/bench_awd_init.py        # the table of BENCHMARKS.md, "Issue 38: AWD-LSTM"

"plain" is an AWD-LSTM written with torch.nn alone (nn.Embedding U(-r, r), nn.LSTM with PyTorch's initialisation, a
decoder tied to the embedding with a zero bias, no dropout): the stall does not come from lmforge's code.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from lmforge.config import ModelConfig
from lmforge.models.awd_lstm import AWDLSTM
from lmforge.objectives.awd_lm import AWDLMObjective

V, D, STEPS = 99, 12, 150
PATTERN = torch.tensor([5, 9, 13, 17, 21, 25, 29])
STREAM = PATTERN.repeat(40)


class PlainLM(nn.Module):
    def __init__(self, r: float) -> None:
        super().__init__()
        self.embed = nn.Embedding(V, D)
        nn.init.uniform_(self.embed.weight, -r, r)
        self.rnn = nn.LSTM(D, D, batch_first=True)
        self.bias = nn.Parameter(torch.zeros(V))

    def forward(self, x, state):
        h, state = self.rnn(self.embed(x), state)
        return h, F.linear(h, self.embed.weight, self.bias), state


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor, bool]:
    p = (step * 10) % 270
    x = torch.stack([STREAM[p:p + 10], STREAM[p + 3:p + 13]])
    y = torch.stack([STREAM[p + 1:p + 11], STREAM[p + 4:p + 14]])
    return x, y, p == 0


def run(model_kind: str, r: float, optimizer: str, lr: float, clip: float, dropout: bool = True,
        freeze_lstm: int = 0, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> dict[str, float]:
    torch.manual_seed(0)
    if model_kind == "lmforge":
        p = dict(embed_p=0.02, input_p=0.05, hidden_p=0.05, weight_p=0.1, output_p=0.05) if dropout else \
            dict(embed_p=0.0, input_p=0.0, hidden_p=0.0, weight_p=0.0, output_p=0.0)
        model = AWDLSTM(ModelConfig(arch="awd_lstm", vocab_size=V, d_model=D, d_hidden=19, n_layers=1,
                                    max_seq_len=1 << 16, bptt=10, init_range=r, **p))
        lstm = model.layers[0].rnn
        objective = AWDLMObjective()
    else:
        model = PlainLM(r)
        lstm, state = model.rnn, None
    opt = torch.optim.Adam(model.parameters(), lr=lr, betas=betas, eps=eps) if optimizer == "adam" else \
        torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for step in range(STEPS):
        x, y, reset = batch(step)
        if model_kind == "lmforge":
            out = objective(model.train(), {"input_ids": x, "labels": y, "reset": torch.tensor([int(reset)] * 2)})
            loss = out.losses["lm"][0] / out.losses["lm"][1]
        else:
            state = None if reset else tuple(s.detach() for s in state)
            _, logits, state = model(x, state)
            loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
        opt.zero_grad()
        loss.backward()
        if step < freeze_lstm:  # the LSTM waits while the embedding and the decoder bias learn
            for q in lstm.parameters():
                q.grad = None
        if clip:
            nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        losses.append(float(loss.detach()))
    model.eval()
    with torch.no_grad():
        h = model(STREAM[:21][None]).last_hidden_state[0] if model_kind == "lmforge" else \
            model(STREAM[:21][None], None)[0][0]
    return {"loss": sum(losses[-5:]) / 5, "abs_h": float(h.abs().mean()), "h_over_time": float(h.std(0).mean())}


SETTINGS = [
    ("lmforge, U(-1, 1), Adam 1e-2", dict(model_kind="lmforge", r=1.0, optimizer="adam", lr=1e-2, clip=1.0)),
    ("lmforge, U(-0.1, 0.1), Adam 1e-2", dict(model_kind="lmforge", r=0.1, optimizer="adam", lr=1e-2, clip=1.0)),
    ("  same, no dropout", dict(model_kind="lmforge", r=0.1, optimizer="adam", lr=1e-2, clip=1.0, dropout=False)),
    ("  same, no clipping", dict(model_kind="lmforge", r=0.1, optimizer="adam", lr=1e-2, clip=0.0)),
    ("  same, fastai's Adam (betas 0.9 / 0.99, eps 1e-5)",
     dict(model_kind="lmforge", r=0.1, optimizer="adam", lr=1e-2, clip=1.0, betas=(0.9, 0.99), eps=1e-5)),
    ("  same, Adam lr 3e-3", dict(model_kind="lmforge", r=0.1, optimizer="adam", lr=3e-3, clip=1.0)),
    ("  same, the LSTM frozen for the first 40 steps",
     dict(model_kind="lmforge", r=0.1, optimizer="adam", lr=1e-2, clip=1.0, freeze_lstm=40)),
    ("plain PyTorch, U(-0.1, 0.1), Adam 1e-2", dict(model_kind="plain", r=0.1, optimizer="adam", lr=1e-2, clip=1.0)),
    ("plain PyTorch, U(-1, 1), Adam 1e-2", dict(model_kind="plain", r=1.0, optimizer="adam", lr=1e-2, clip=1.0)),
    ("lmforge, U(-0.1, 0.1), SGD 30, clip 0.25 (the paper's)",
     dict(model_kind="lmforge", r=0.1, optimizer="sgd", lr=30.0, clip=0.25)),
]


def main() -> None:
    print(f"| setting (150 steps; ln 7 = {math.log(7):.2f}) | loss, last 5 | mean abs h | h's std over time |")
    print("|---|---:|---:|---:|")
    for name, options in SETTINGS:
        r = run(**options)
        print(f"| {name} | {r['loss']:.3f} | {r['abs_h']:.2f} | {r['h_over_time']:.2f} |")


if __name__ == "__main__":
    main()

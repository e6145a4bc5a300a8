"""Where the time goes, job by job: ``torch.profiler`` tables and MFU of lmforge before issue 22, now and the reference.

Issue 22 asks for "a profile table per job (top operators before and after)". For each job this script profiles
a few warm steps of three sides, each in its own fresh process:

- ``before``: lmforge at git ``e0a7c89`` (the last commit before issue 22's work began), exported with
  ``git archive`` into a temporary folder and imported through ``PYTHONPATH``;
- ``now``: lmforge from this working tree (``src/``);
- ``reference``: the Hugging Face ``transformers`` model, built the way the matching benchmark builds it.

Jobs (random weights, synthetic random token ids, fp32, no data files):

- ``pretrain-bert``: bert-mini MLM + NSP training step (forward + loss + backward + AdamW + zero_grad), batch 32 x
  128, dropout 0.1; ``bench_pretrain.py``'s models, batch and step functions (``TaskModel`` + ``MaskedLMObjective``
  against ``BertForPreTraining``; torch's default AdamW on both sides, as there).
- ``train-gpt``: GPT causal-LM training step at gpt-mini (6 layers, 192 wide, vocabulary 50,257), batch 16 x 128;
  ``bench_pretrain.py``'s ``Decoder`` + ``CausalLMObjective`` against ``GPT2LMHeadModel``.
- ``encode``: encoder inference, eval mode, ``torch.inference_mode()``, MiniLM-L6-H384 shape, batch 32 padded to
  128 with lengths uniform in 16..128; ``bench_encoder.py``'s models (one ``BertModel``'s weights converted into
  our ``Encoder``) and inputs.
- ``finetune``: sequence classification (5 labels) training step on such padded batches (MiniLM shape, dropout 0.1
  on hidden states and attention probabilities, train mode); ``TaskModel(Encoder, sequence_classification head)``
  against ``BertForSequenceClassification`` with the same converted weights, ``torch.optim.AdamW(fused=True)`` on
  both sides (what lmforge's Trainer and ``finetune_reference.py`` use).
- ``generate``: cached greedy generation of 32 new tokens, batch 8 left-padded prompts of 8..32 tokens, gpt-mini;
  ``bench_generate.py``'s models (our ``Decoder``'s weights copied into ``GPT2LMHeadModel``), prompts and calls.
  One step = one ``generate`` call.

Each child uses one torch thread (``torch.set_num_threads(1)``, ``OMP_NUM_THREADS=1``) so that the shares of the
three sides are comparable on a shared 2-core machine and every operator runs on the calling thread. A child runs
``--warmup`` untimed steps, ``--steps`` timed steps without the profiler (median CPU and wall time reported), then
``--steps`` steps, each under its own ``torch.profiler.profile(activities=[CPU], record_shapes=False)`` and inside a
``record_function`` marker; the fastest profiled step is kept (the machine is shared: a step that loses its core
charges the wait to whichever operator was running). Operators are ranked by self CPU time; the share is the
operator's self time over the marker's total, so the shares of a side add up to 100% with the marker's own self
time, listed as "(Python and other time outside torch operators)".

MFU (issue 39, item 6). After its profiled steps each child runs one more step under
``torch.utils.flop_counter.FlopCounterMode`` and records that side's own FLOPs per step: what that side computes,
so the sides of a job need not count the same (lmforge's MLM projects onto the vocabulary at the masked positions
only, Hugging Face's at every position; lmforge's encoder layers run on the real tokens of a padded batch, Hugging
Face's on every padded position). Achieved FLOP/s = FLOPs per step / the median wall time of an unprofiled step;
MFU = that over the machine's fp32 matmul peak at one thread, ``bench_pretrain.matmul_peak()`` (best of repeated
2048^3 ``F.linear`` products) run in a fresh one-thread child at the start and again at the end of the run, the
better reading kept (the machine is shared). What is counted, at 2 FLOPs per multiply-add, forward and backward:

- by torch's own formulas: ``mm``, ``addmm``, ``bmm``, ``baddbmm`` (every overload, ``out=`` included: lmforge's
  fused LM loss and few-row projection write with ``out=``), convolutions and the CUDA SDPA kernels;
- by formulas this script adds (``extra_flop_formulas``), because torch 2.13's counter has none and these jobs run
  them: the in-place ``addmm_`` (lmforge's fused LM loss accumulates the vocabulary matrix's gradient with it, chunk
  after chunk) and ``baddbmm_``, ``addbmm``, and the CPU flash-attention kernel
  ``_scaled_dot_product_flash_attention_for_cpu`` and its backward, which both sides' SDPA calls reach on a CPU
  (without it every fused attention is 0 FLOPs on a CPU). A causal mask's skipped half is not subtracted, as torch
  does not for the CUDA kernels. SDPA's math fallback (dropout on a CPU) and lmforge's own attention kernels are
  ``bmm``/``baddbmm`` and counted as such;
- not counted (0 FLOPs on both sides, the convention of ``bench_pretrain.py``): element-wise arithmetic, softmax and
  log-softmax, layer norm, GELU/tanh, dropout masks, embedding look-ups, gathers and scatters, the loss and the
  optimizer. Every other product-like operator a step runs without a formula (a name with mm, matmul, linear,
  einsum, dot, mv, conv or attention in it) is listed per side in the JSON and under the job's table, so a missing
  count shows; on this machine's run the lists were empty.

"GFLOP/s in the products" is the same FLOPs over the self time of the counted operators in the profiled step: how
fast the products themselves ran; the gap to the achieved GFLOP/s is the time spent outside them.

Sides: ``--sides now,reference`` skips ``before`` (a ``git archive`` of an old commit that imports today's
``bench_*.py`` helpers, so it may break when they change); it stays the default. ``--no-peak`` skips the peak and
the MFU columns. Written files carry no path of this machine (the checkout, the temporary folder, the interpreter's
prefix and the home folder are replaced).

Run: ``OMP_NUM_THREADS=1 .venv/bin/python benchmarks/profile_jobs.py [--jobs pretrain-bert,train-gpt,encode,
finetune,generate] [--sides before,now,reference] [--steps 3] [--warmup 1] [--top 10] [--no-peak]``. Prints Markdown
and writes ``benchmarks/results/profile-jobs.md`` and ``benchmarks/results/profile-jobs.json`` (``--out STEM`` for
other names).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common import (
    REPO_ROOT,
    allocator,
    cpu_model,
    emit_result,
    machine_description,
    markdown_table,
    reproduce_command,
    run_child,
)

HERE = Path(__file__).resolve().parent
BEFORE_COMMIT = "e0a7c89"  # "fuzz: pretrain with the electra and denoise objectives...", just before issue 22's work
THREADS_ENV = "LMFORGE_PROFILE_THREADS"
# glibc malloc told to reuse freed memory instead of returning it (the variables lmforge's training commands set with
# mallopt in their own process): a side's large per-step tensors then stop faulting their pages in on every step
GLIBC_TUNING = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": "68719476736"}
SIDES = ("before", "now", "reference")
SIDE_TITLES = {"before": f"lmforge before ({BEFORE_COMMIT})", "now": "lmforge now", "reference": "reference (HF)"}
JOBS = {  # name -> title
    "pretrain-bert": "bert-mini MLM + NSP pretraining step (batch 32 x 128)",
    "train-gpt": "GPT causal-LM training step, gpt-mini (batch 16 x 128, vocabulary 50,257)",
    "encode": "Encoder inference, MiniLM-L6-H384 shape, batch 32 padded 16..128",
    "finetune": "Fine-tuning step, sequence classification, MiniLM shape, batch 32 padded 16..128, dropout 0.1",
    "generate": "Cached greedy generation, gpt-mini, batch 8 (prompts 8..32 tokens), 32 new tokens",
}
REFERENCE_MODEL = {
    "pretrain-bert": "BertForPreTraining",
    "train-gpt": "GPT2LMHeadModel",
    "encode": "BertModel",
    "finetune": "BertForSequenceClassification",
    "generate": "GPT2LMHeadModel.generate",
}
STEP_MARKER = "profile_jobs.step"
MOVE = 0.03  # a category "moved" between two sides when its time per step differs by this share of the step
OUTSIDE = "(Python and other time outside torch operators)"
MINILM = "minilm"
N_LABELS = 5
NEW_TOKENS = 32


# ---------------------------------------------------------------------------------------------- machine
def cpu_flags() -> dict[str, bool]:
    """The instruction-set extensions that decide fp32 and bf16 speed here."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = set(next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), []))
    except OSError:
        flags = set()
    return {"AVX2": "avx2" in flags, "AVX-512": "avx512f" in flags, "AVX512_BF16": "avx512_bf16" in flags,
            "AMX": bool({"amx_bf16", "amx_tile"} & flags)}


def torch_capability() -> str:
    import torch

    try:
        return str(torch.backends.cpu.get_cpu_capability())
    except AttributeError:
        return "unknown"


# ---------------------------------------------------------------------------------------------- jobs (child side)
def job_pretrain(side: str, gpt: bool) -> Callable[[], Any]:
    """bench_pretrain.py's models, batch and step function for one side."""
    import bench_pretrain as bp

    shape = bp.SHAPES["gpt" if gpt else "bert-mini"]
    ours, hf = (bp.build_gpt if gpt else bp.build_bert)(shape)
    batch = (bp.gpt_batch if gpt else bp.bert_batch)(shape.batch, shape.vocab)
    steps = bp.make_steps(shape, ours, hf, batch, "fp32")
    return steps["HF" if side == "reference" else "lmforge"]


def padded_inputs() -> dict[str, Any]:
    import bench_encoder as be

    return be.make_inputs(be.Case(MINILM, 32, 16))


def job_encode(side: str) -> Callable[[], Any]:
    """bench_encoder.py's MiniLM models (same weights) on its batch of 32 padded 16..128."""
    import torch

    import bench_encoder as be

    hf, ours = be.build_models(MINILM)
    model = hf if side == "reference" else ours
    inputs = padded_inputs()

    def step() -> Any:
        with torch.inference_mode():
            return model(**inputs).last_hidden_state

    return step


def job_finetune(side: str) -> Callable[[], Any]:
    """Sequence classification over the MiniLM shape, dropout on, one AdamW(fused) step per batch."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    import bench_encoder as be
    from lmforge.heads import TaskModel, build_head
    from lmforge.interop.hf_bert import config_from_hf, state_dict_from_hf
    from lmforge.models.encoder import Encoder

    layers, width, heads = be.SHAPES[MINILM]
    torch.manual_seed(0)
    hf_config = BertConfig(vocab_size=be.VOCAB, hidden_size=width, num_hidden_layers=layers, num_attention_heads=heads,
                           intermediate_size=4 * width, num_labels=N_LABELS, hidden_dropout_prob=0.1,
                           attention_probs_dropout_prob=0.1, attn_implementation="sdpa")
    hf = BertForSequenceClassification(hf_config)
    inputs = padded_inputs()
    labels = torch.randint(0, N_LABELS, (inputs["input_ids"].shape[0],), generator=torch.Generator().manual_seed(1))
    if side == "reference":
        model: torch.nn.Module = hf.train()

        def loss_fn() -> torch.Tensor:
            return model(**inputs, labels=labels).loss
    else:
        config = config_from_hf(hf_config.to_dict())
        config.kernel = "sdpa"
        encoder = Encoder(config)
        encoder_sd, _ = state_dict_from_hf(hf.bert.state_dict(prefix="bert."))
        encoder.load_state_dict(encoder_sd)
        head = build_head({"type": "sequence_classification", "labels": [f"c{i}" for i in range(N_LABELS)]},
                          config, encoder)
        model = TaskModel(encoder, head).train()
        del hf

        def loss_fn() -> torch.Tensor:
            out = model(inputs["input_ids"], inputs["attention_mask"], inputs["token_type_ids"], labels=labels)
            return out.loss_sum / out.loss_count

    opt = torch.optim.AdamW(model.parameters(), lr=5e-5, weight_decay=0.01, fused=True)
    torch.manual_seed(0)  # dropout

    def step() -> torch.Tensor:
        loss = loss_fn()
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.detach()

    return step


def job_generate(side: str) -> Callable[[], Any]:
    """bench_generate.py's gpt-mini models (same weights), greedy with the cache, batch 8."""
    import torch

    import bench_generate as bg

    ours, hf = bg.build_models("gpt-mini")
    ids, mask = bg.make_prompts(8, 32)
    case = bg.Case("greedy", 8, True)
    run = bg.run_hf if side == "reference" else bg.run_ours
    model = hf if side == "reference" else ours

    def step() -> Any:
        with torch.inference_mode():
            return run(model, ids, mask, case, NEW_TOKENS)

    return step


def build_job(job: str, side: str) -> Callable[[], Any]:
    if job in ("pretrain-bert", "train-gpt"):
        return job_pretrain(side, gpt=job == "train-gpt")
    return {"encode": job_encode, "finetune": job_finetune, "generate": job_generate}[job](side)


def child(job: str, side: str, steps: int, warmup: int, keep: int) -> dict[str, Any]:
    """Build one side of one job, time it, profile it: the operators of the least disturbed profiled step."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    import lmforge

    torch.set_num_threads(threads())
    logging.getLogger("transformers").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    source = Path(lmforge.__file__).resolve().parent.parent
    if side != "reference" and (source == REPO_ROOT / "src") != (side == "now"):
        raise RuntimeError(f"{side}: lmforge was imported from the wrong tree")
    step = build_job(job, side)
    for _ in range(warmup):
        step()
    wall, cpu = [], []
    for _ in range(steps):
        w, c = time.perf_counter(), time.process_time()
        step()
        wall.append((time.perf_counter() - w) * 1e3)
        cpu.append((time.process_time() - c) * 1e3)
    # One profile per step; the fastest is kept: on a shared machine a step that lost its core to another process
    # charges the wait to whichever operator was running.
    profiles = []
    for _ in range(steps):
        with profile(activities=[ProfilerActivity.CPU], record_shapes=False) as prof:
            with record_function(STEP_MARKER):
                step()
        events = prof.key_averages()
        total_us = next(e for e in events if e.key == STEP_MARKER).cpu_time_total
        profiles.append((total_us, events))
    total_us, events = min(profiles, key=lambda pe: pe[0])
    ops = [{"op": OUTSIDE if e.key == STEP_MARKER else e.key, "self_ms": e.self_cpu_time_total / 1e3,
            "share": e.self_cpu_time_total / total_us, "calls": e.count}
           for e in events if e.self_cpu_time_total > 0]
    ops.sort(key=lambda o: -o["self_ms"])
    flops = count_flops(step)  # one more step, after the timed and profiled ones (the mode slows a step down)
    counted = set(flops["by_op"])
    product_ms = sum(o["self_ms"] for o in ops if o["op"] in counted)  # every operator, not only the kept ones
    return {"job": job, "side": side, "torch_threads": torch.get_num_threads(), "step_wall_ms": wall,
            "step_cpu_ms": cpu, "step_ms_median": statistics.median(wall), "step_cpu_ms_median": statistics.median(cpu),
            "profiled_steps_ms": [t / 1e3 for t, _ in profiles], "profiled_step_ms": total_us / 1e3,
            "covered_share": sum(o["share"] for o in ops[:keep]), "ops": ops[:keep], "ops_total": len(ops),
            "flops": flops["total"], "flops_by_op": flops["by_op"], "flops_uncounted_ops": flops["uncounted"],
            "counted_ops_ms": product_ms}


# ---------------------------------------------------------------------------------------------- FLOPs (child side)
MATMUL_LIKE = re.compile(r"mm|matmul|linear|einsum|dot|mv|addr|conv|attention|attn|mkldnn|_mkl|tensordot")


def _addmm_flop(self_shape: Any, a_shape: Any, b_shape: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    """(m, k) @ (k, n), or the batched (b, m, k) @ (b, k, n) of baddbmm_ / addbmm: 2 FLOPs per multiply-add."""
    batch = a_shape[0] if len(a_shape) == 3 else 1
    return 2 * batch * a_shape[-2] * a_shape[-1] * b_shape[-1]


def extra_flop_formulas() -> dict[Any, Any]:
    """Formulas FlopCounterMode lacks in this torch for products that the jobs run on a CPU.

    ``torch.utils.flop_counter`` counts mm, addmm, bmm, baddbmm (every overload: ``out=`` included) and the CUDA SDPA
    kernels, but not the in-place ``addmm_`` / ``baddbmm_`` (lmforge's fused LM loss accumulates its weight gradient
    with ``addmm_``) nor the CPU flash-attention kernel ``_scaled_dot_product_flash_attention_for_cpu`` and its
    backward, which both sides' SDPA calls reach on a CPU. They get torch's own formulas (the causal half is not
    subtracted, as torch does for the CUDA kernels).
    """
    import torch
    from torch.utils import flop_counter as fc

    aten = torch.ops.aten

    def sdpa_cpu(query_shape: Any, key_shape: Any, value_shape: Any, *args: Any, out_shape: Any = None,
                 **kwargs: Any) -> int:
        return fc.sdpa_flop_count(query_shape, key_shape, value_shape)

    def sdpa_cpu_backward(grad_out_shape: Any, query_shape: Any, key_shape: Any, value_shape: Any, *args: Any,
                          out_shape: Any = None, **kwargs: Any) -> int:
        return fc.sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)

    return {aten.addmm_: _addmm_flop, aten.baddbmm_: _addmm_flop, aten.addbmm: _addmm_flop,
            aten.addbmm_: _addmm_flop, aten._scaled_dot_product_flash_attention_for_cpu: sdpa_cpu,
            aten._scaled_dot_product_flash_attention_for_cpu_backward: sdpa_cpu_backward}


def count_flops(step: Callable[[], Any]) -> dict[str, Any]:
    """FLOPs of one step as ``torch.utils.flop_counter.FlopCounterMode`` counts them (with ``extra_flop_formulas``),
    per operator (profiler spelling, ``aten::mm``), and every product-like operator the step ran that has no
    formula (its FLOPs are missing from the total)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.flop_counter import FlopCounterMode, flop_registry

    seen: dict[str, int] = {}

    class Seen(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            name = str(func._overloadpacket)
            seen[name] = seen.get(name, 0) + 1
            return func(*args, **(kwargs or {}))

    extra = extra_flop_formulas()
    counter = FlopCounterMode(display=False, custom_mapping=extra)
    with counter, Seen():
        step()
    by_op = {str(op).replace(".", "::", 1): int(n) for op, n in counter.get_flop_counts().get("Global", {}).items()}
    formulas = {str(op) for op in (*flop_registry, *extra)}
    # an operator with a CompositeImplicitAutograd kernel (aten.linear, aten.scaled_dot_product_attention under
    # inference_mode) is decomposed by the counter, and its pieces are counted
    uncounted = {name.replace(".", "::", 1): calls for name, calls in seen.items()
                 if name not in formulas and MATMUL_LIKE.search(name.split(".", 1)[-1])
                 and not torch._C._dispatch_has_kernel_for_dispatch_key(name.replace(".", "::", 1),
                                                                         "CompositeImplicitAutograd")}
    return {"total": int(counter.get_total_flops()), "by_op": dict(sorted(by_op.items(), key=lambda kv: -kv[1])),
            "uncounted": uncounted}


def peak_child() -> dict[str, Any]:
    """``bench_pretrain.matmul_peak()`` at one thread, in this fresh process."""
    import torch

    import bench_pretrain as bp

    torch.set_num_threads(threads())
    return {"threads": torch.get_num_threads(),
            **{k: {"gflops": g, "n": n} for k, (g, n) in bp.matmul_peak().items()}}


# ---------------------------------------------------------------------------------------------- categories
LINEAR = "linear layers (addmm, addmm_, mm)"
CATEGORIES = [  # (category, regular expression on the operator name), first match wins
    (OUTSIDE, re.escape(OUTSIDE)),
    (LINEAR, r"aten::(addmm_?|mm|matmul|linear|_addmm_activation)$|mkldnn_|_mkl"),  # addmm_: fused LM loss
    ("attention, fused SDPA kernel", r"scaled_dot_product|_flash_attention|_efficient_attention"),
    ("attention, unfused math path (bmm, softmax)", r"aten::(bmm|baddbmm|_?softmax|_softmax_backward_data)$"),
    ("dropout masks (bernoulli_)", r"bernoulli|native_dropout|aten::dropout"),
    ("log-softmax / cross-entropy", r"log_softmax|nll_loss|cross_entropy"),
    ("layer norm", r"layer_norm"),
    ("activations (GELU, tanh)", r"gelu|tanh|aten::pow|relu|silu"),
    ("optimizer", r"_foreach_|_fused_adam|Optimizer\.|aten::addcdiv|aten::lerp|aten::sqrt"),
    ("embedding / gather / scatter / index", r"embedding|index|gather|scatter|masked_select|nonzero|take|argmax|"
                                             r"topk|aten::max"),
    ("copies / allocation", r"copy_|_to_copy|clone|contiguous|aten::cat|empty|zeros|aten::fill_|zero_|aten::to$|"
                            r"aten::ones|aten::full|resize_|as_strided|cumsum"),
    ("autograd bookkeeping", r"^autograd::|Backward\d*$|AccumulateGrad"),
    ("element-wise arithmetic", r"aten::(add|mul|div|sub|where|masked_fill|rsub|neg|exp|sum|mean|eq|ne|lt|gt|"
                                r"ge|le|bitwise|logical|clamp)"),
]
LEVERS = {
    OUTSIDE: "fewer, larger operations per step (the Python between operators: fused modules, torch.compile, for "
             "decoding a compiled or graph-captured step)",
    "attention, fused SDPA kernel": "attention on the real tokens only (variable-length attention instead of the "
                                    "padded layout; when decoding, only the filled part of the cache) or bf16",
    "attention, unfused math path (bmm, softmax)": "keeping attention on the fused SDPA kernel (on CPU, SDPA with "
                                                   "dropout_p > 0 falls back to bmm + softmax + a bernoulli mask)",
    "dropout masks (bernoulli_)": "cheaper dropout masks (issue 22 item 2: random integers against a threshold, "
                                  "drawn once per step)",
    "log-softmax / cross-entropy": "fewer passes over the (positions x vocabulary) scores (a fused, chunked "
                                   "log-softmax + loss + gradient)",
    "layer norm": "fusing layer norm with the residual add (torch.compile)",
    "activations (GELU, tanh)": "a fused activation (the exact GELU kernel instead of the tanh formula's element-wise "
                                "chain, or torch.compile)",
    "optimizer": "a fused optimizer step (AdamW(fused=True), as lmforge's Trainer uses)",
    "embedding / gather / scatter / index": "fewer gathers and scatters (packing once per batch and keeping the "
                                            "packed layout through attention)",
    "copies / allocation": "fewer copies and allocations (the scatter into and gather out of the padded attention "
                           "layout, contiguous() round trips, buffers reused in place)",
    "autograd bookkeeping": "fewer autograd nodes (fused modules, torch.compile)",
    "element-wise arithmetic": "fusing element-wise chains (torch.compile, fused kernels)",
    "other": "a closer look at the operators in the table",
}


def category(op: str) -> str:
    for name, pattern in CATEGORIES:
        if re.search(pattern, op):
            return name
    return "other"


def categories(ops: list[dict[str, Any]]) -> dict[str, float]:
    """Share of the step per category (from the kept operators), largest first."""
    out: dict[str, float] = {}
    for o in ops:
        out[category(o["op"])] = out.get(category(o["op"]), 0.0) + o["share"]
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


# ---------------------------------------------------------------------------------------------- report
def pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def ran(results: dict[str, Any]) -> list[str]:
    """The sides present in ``results``, in SIDES order."""
    return [s for s in SIDES if s in results]


def job_table(results: dict[str, dict[str, Any]], top: int) -> str:
    header, rows = ["#"], []
    for side in ran(results):
        header += [f"{SIDE_TITLES[side]} operator", "self %", "ms/step"]
    for i in range(top):
        row: list[object] = [i + 1]
        for side in ran(results):
            ops = results[side]["ops"] if side in results else []
            if i < len(ops):
                o = ops[i]
                row += [f"`{o['op']}`", pct(o["share"]), f"{o['self_ms']:,.1f}"]
            else:
                row += ["", "", ""]
        rows.append(row)
    return markdown_table(header, rows, "r" + "lrr" * len(ran(results)))


def speedups(results: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Median CPU time per unprofiled step of ``before`` and ``reference`` over ``now`` (above 1: now is faster)."""
    now = results.get("now")
    if not now:
        return {}
    return {side: results[side]["step_cpu_ms_median"] / now["step_cpu_ms_median"]
            for side in ("before", "reference") if side in results}


def step_line(results: dict[str, dict[str, Any]]) -> str:
    parts = [f"{SIDE_TITLES[side]} {results[side]['step_cpu_ms_median']:,.0f} ms CPU / "
             f"{results[side]['step_ms_median']:,.0f} ms wall ({results[side]['profiled_step_ms']:,.0f} ms profiled)"
             for side in SIDES if side in results]
    ratios = [f"now vs {'before' if side == 'before' else 'the reference'} {r:.2f}x"
              for side, r in speedups(results).items()]
    return (f"Step time (unprofiled medians, {threads()} thread(s)): " + "; ".join(parts)
            + (f"; by CPU time {', '.join(ratios)} (above 1: lmforge now is faster)." if ratios else "."))


def category_table(results: dict[str, dict[str, Any]]) -> str:
    cats = {side: categories(results[side]["ops"]) for side in ran(results)}
    names = sorted({c for per in cats.values() for c in per},
                   key=lambda c: -max(cats[s].get(c, 0.0) for s in cats))
    rows = []
    for c in names:
        row: list[object] = [c]
        for side in cats:
            ms = cats[side].get(c, 0.0) * results[side]["profiled_step_ms"]
            row.append(f"{pct(cats[side].get(c, 0.0))} ({ms:,.0f} ms)")
        rows.append(row)
    return markdown_table(["Category: share of the profiled step (ms/step)", *(SIDE_TITLES[s] for s in cats)],
                          rows)


def summary(results: dict[str, dict[str, Any]], bf16_native: str) -> str:
    """Where the time goes now, what moved against before and the reference, and the next lever."""
    now = results.get("now")
    if not now:
        return ""
    cats = categories(now["ops"])
    text = [f"Where the time goes now: {', '.join(f'{c} {pct(s)}' for c, s in list(cats.items())[:3])}."]
    ratio = speedups(results)
    for side in ("before", "reference"):
        other = results.get(side)
        if not other:
            continue
        ocats = categories(other["ops"])
        def ms(c: str, per: dict[str, float], r: dict[str, Any]) -> float:
            return per.get(c, 0.0) * r["profiled_step_ms"]

        moved = sorted(set(ocats) | set(cats), key=lambda c: -abs(ms(c, ocats, other) - ms(c, cats, now)))
        moved = [c for c in moved[:2] if abs(ms(c, ocats, other) - ms(c, cats, now)) >= MOVE * now["profiled_step_ms"]]
        parts = [f"{c} {pct(ocats.get(c, 0.0))} ({ms(c, ocats, other):,.0f} ms) -> {pct(cats.get(c, 0.0))} "
                 f"({ms(c, cats, now):,.0f} ms)" for c in moved]
        if parts:
            text.append(f"From {SIDE_TITLES[side]} to now ({ratio[side]:.2f}x) the largest "
                        f"{'moves are' if len(parts) > 1 else 'move is'} {' and '.join(parts)}.")
        else:
            text.append(f"From {SIDE_TITLES[side]} to now ({ratio[side]:.2f}x) no category moved by more than "
                        f"{MOVE:.0%} of the step: the same operators at the same shares (differences in step time "
                        "are run-to-run noise of this shared machine).")
    rest = [c for c in cats if c != LINEAR][:2]
    levers = "; then ".join(f"{c} ({pct(cats[c])}): {LEVERS.get(c, LEVERS['other'])}" for c in rest)
    linear = cats.get(LINEAR, 0.0)
    bf16 = (f"bf16 autocast, which this CPU runs natively ({bf16_native})" if bf16_native
            else "bf16 on a CPU with AVX512_BF16 or AMX (not this one)")
    text.append(f"Next lever: {levers}. The linear layers ({pct(linear)}) only get cheaper with fewer FLOPs "
                f"(fewer positions: unpadding, projecting only what the loss reads) or {bf16}.")
    return " ".join(text)


def peak_gflops(meta: dict[str, Any]) -> float | None:
    """The better of the two fp32 readings (GFLOP/s), None where the peak was not measured."""
    readings = [r["fp32"]["gflops"] for r in meta.get("peak", {}).values() if isinstance(r, dict) and "fp32" in r]
    return max(readings) if readings else None


def flop_row(results: dict[str, dict[str, Any]], side: str, peak: float | None) -> list[object]:
    """Step time, speed against the reference, own GFLOP per step, GFLOP/s, MFU, GFLOP/s inside the products."""
    r = results[side]
    ref = results.get("reference")
    ratio = (f"{ref['step_ms_median'] / r['step_ms_median']:.2f}x" if ref and "error" not in ref
             and side != "reference" else "")
    if "flops" not in r:
        return [SIDE_TITLES[side], f"{r['step_ms_median']:,.0f}", f"{r['step_cpu_ms_median']:,.0f}", ratio,
                "n/a", "n/a", "n/a", "n/a"]
    achieved = r["flops"] / (r["step_ms_median"] / 1e3) / 1e9
    inside = r["flops"] / (r["counted_ops_ms"] / 1e3) / 1e9 if r.get("counted_ops_ms") else None
    return [SIDE_TITLES[side], f"{r['step_ms_median']:,.0f}", f"{r['step_cpu_ms_median']:,.0f}", ratio,
            f"{r['flops'] / 1e9:,.2f}", f"{achieved:,.1f}", pct(achieved / peak) if peak else "n/a",
            f"{inside:,.1f}" if inside else "n/a"]


FLOP_HEADER = ["Side", "step ms (wall)", "step ms (CPU)", "lmforge / reference (speed)", "GFLOP/step (own)",
               "GFLOP/s", "MFU", "GFLOP/s in the products"]


def flop_table(results: dict[str, dict[str, Any]], peak: float | None) -> str:
    return markdown_table(FLOP_HEADER, [flop_row(results, s, peak) for s in ran(results)])


def summary_table(all_results: dict[str, dict[str, dict[str, Any]]], peak: float | None) -> str:
    rows = []
    for job, results in all_results.items():
        good = {s: r for s, r in results.items() if "error" not in r}
        rows += [[f"`{job}`", *flop_row(good, s, peak)] for s in ran(good)]
    return markdown_table(["Job", *FLOP_HEADER], rows, "ll" + "r" * (len(FLOP_HEADER) - 1))


def uncounted_line(results: dict[str, dict[str, Any]]) -> str:
    parts = [f"{SIDE_TITLES[s]}: {', '.join(f'`{op}` ({n} calls)' for op, n in r['flops_uncounted_ops'].items())}"
             for s, r in results.items() if r.get("flops_uncounted_ops")]
    return ("Product-like operators without a FLOP formula (their FLOPs are missing from GFLOP/step): "
            + "; ".join(parts) + ".") if parts else ""


def flops_line(results: dict[str, dict[str, Any]]) -> str:
    """Which counted operators make up each side's FLOPs."""
    parts = []
    for s, r in results.items():
        if r.get("flops"):
            ops = list(r["flops_by_op"].items())[:4]
            parts.append(f"{SIDE_TITLES[s]} " + ", ".join(f"`{op}` {pct(n / r['flops'])}" for op, n in ops))
    return ("FLOPs by operator: " + "; ".join(parts) + ".") if parts else ""


def render(all_results: dict[str, dict[str, dict[str, Any]]], meta: dict[str, Any], top: int) -> str:
    sides = meta.get("sides", list(SIDES))
    peak = peak_gflops(meta)
    title = ", ".join(SIDE_TITLES[s].replace("reference (HF)", "the Hugging Face reference") for s in sides)
    out = [f"# Profiles per job{', with MFU' if peak else ''}: {title}", ""]
    out += ["Command (from the repository root):", "", "```bash", meta["command"], "```", ""]
    out += ["Machine:", ""]
    out += [f"- {k}: {v}" for k, v in meta["machine"].items()]
    out += [f"- Instruction set: {meta['isa']}; torch's CPU capability: {meta['torch_capability']}",
            f"- Allocator (every side, every child): {meta['allocator']}",
            (f"- torch threads: {meta['threads']} in every child" if meta.get("threads", 1) != 1 else
             "- torch threads: 1 in every child (`torch.set_num_threads(1)`, `OMP_NUM_THREADS=1`), so the shares of "
             "the sides are comparable on this shared machine")]
    if meta.get("peak"):
        readings = "; ".join(f"at {when} fp32 {r['fp32']['gflops']:.1f} GFLOP/s (n = {r['fp32']['n']}), bf16 "
                             f"{r['bf16']['gflops']:.1f} GFLOP/s (n = {r['bf16']['n']})"
                             for when, r in meta["peak"].items() if "fp32" in r)
        out += [f"- Matmul peak, {meta.get('threads', 1)} thread(s) (`bench_pretrain.matmul_peak()` in a fresh "
                "process with that many threads: best of "
                f"repeated `F.linear` n^3 products): {readings}; MFU below uses the better fp32 reading, "
                f"**{peak:.1f} GFLOP/s**"]
    out += [f"- Load average (1, 5, 15 min) at end: {meta.get('load_end', 'n/a')}; the whole run took "
            f"{meta.get('wall_s', 0):,.0f} s", ""]
    if peak:
        out += ["## MFU per job and side", ""]
        out += ["GFLOP/step is each side's own count: the FLOPs that side computes in one step, so two sides of a "
                "job need not count the same. lmforge's MLM projects onto the vocabulary at the masked positions "
                "only and Hugging Face's at every position; lmforge's encoder layers run on the real tokens of a "
                "padded batch (unpadding) and Hugging Face's on every padded position. The count is "
                "`torch.utils.flop_counter.FlopCounterMode` over one extra step (after the timed and profiled "
                "ones), 2 FLOPs per multiply-add: matrix products (`mm`, `addmm`, `bmm`, `baddbmm`, their `out=` "
                "forms and, by formulas this script adds, the in-place `addmm_`/`baddbmm_` and `addbmm`) and "
                "attention kernels (the CUDA SDPA kernels by torch's formulas; the CPU flash kernel "
                "`_scaled_dot_product_flash_attention_for_cpu` and its backward, which torch's counter misses, by "
                "the same formulas added here; a causal mask's half is not subtracted), forward and backward. "
                "Element-wise operations, softmax and log-softmax, layer norm, GELU, dropout masks, embedding "
                "look-ups and gathers, the loss and the optimizer count 0 (the convention of `bench_pretrain.py`). "
                "Achieved GFLOP/s = GFLOP/step / the median wall time of an unprofiled step; MFU = achieved / the "
                "measured fp32 peak at one thread. \"GFLOP/s in the products\" = GFLOP/step / the self time of the "
                "counted operators in the profiled step: how fast the products themselves ran (small or thin "
                "products run below the 2048^3 peak); the gap between it and GFLOP/s is the time outside the "
                "products. \"lmforge / reference (speed)\" = the reference's wall time / that side's (above 1: "
                "lmforge is faster).", ""]
        out += [summary_table(all_results, peak), ""]
    out += [f"Each side of each job runs in its own process: {meta['warmup']} warm-up step(s), {meta['steps']} "
            "timed steps (their median CPU time, `time.process_time`, and wall time are the step times below; with "
            "one thread CPU time is the work done and hardly counts the waits for a core that other jobs cause), then "
            f"{meta['steps']} steps each under its own `torch.profiler.profile` (CPU activities, "
            "`record_shapes=False`), of which the fastest is tabled (a step that lost its core to another process "
            "charges the wait to whichever operator was running). Operators are ranked by self CPU time; \"self %\" "
            "is the share of that profiled step (the shares of a side, with the time outside torch operators, add "
            "up to 100%), \"ms/step\" the self time (profiler overhead included, so a profiled step is slower than "
            "an unprofiled one). "
            + (f"\"Before\" is lmforge at git {BEFORE_COMMIT}, just before issue 22's work (exported with `git "
               "archive` and imported through `PYTHONPATH`); " if "before" in sides else "")
            + f"\"now\" is this working tree ({meta['now_version']}); the reference is `transformers` "
            f"{meta['transformers']} (sdpa attention), built as the matching `bench_*.py` builds it. Random weights, "
            "synthetic random ids, fp32.", ""]
    out += ["The category table below each operator table groups every kept operator (the top "
            f"{meta['keep']} of each side) by a name pattern (`CATEGORIES` in the script); the sentence under it "
            "is generated from the same numbers.", ""]
    for job, results in all_results.items():
        out += [f"## {JOBS[job]}", ""]
        failed = [f"{SIDE_TITLES[s]}: {results[s]['error']}" for s in SIDES if "error" in results.get(s, {})]
        good = {s: r for s, r in results.items() if "error" not in r}
        out += [f"`{job}`: lmforge against `{REFERENCE_MODEL[job]}`. {step_line(good)}", ""]
        out += [f"Failed: {'; '.join(failed)}", ""] if failed else []
        if peak and good:
            out += [flop_table(good, peak), ""]
            out += [line for text in (flops_line(good), uncounted_line(good)) if text for line in (text, "")]
        out += [job_table(good, top), "", category_table(good), "", summary(good, meta["bf16_native"]), ""]
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------- main
def export_before(folder: Path) -> Path:
    """``src/`` of BEFORE_COMMIT under ``folder``; returns the folder to put on PYTHONPATH."""
    archive = subprocess.run(["git", "--no-optional-locks", "archive", BEFORE_COMMIT, "src"], cwd=REPO_ROOT,
                             capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive.stdout, check=True)
    return folder / "src"


def threads() -> int:
    """The torch threads of every child (``--threads``, passed down in ``THREADS_ENV``)."""
    return int(os.environ.get(THREADS_ENV, "1"))


def child_env(side: str, before_src: Path) -> dict[str, str]:
    n = str(threads())
    env = dict(os.environ, OMP_NUM_THREADS=n, MKL_NUM_THREADS=n)
    env["PYTHONPATH"] = str(before_src if side == "before" else REPO_ROOT / "src")
    return env


def measure_peak(when: str) -> dict[str, Any]:
    """The matmul peak at one thread, in a fresh child (``{}`` with a note on stderr if it fails)."""
    print(f"matmul peak ({when}), one thread...", file=sys.stderr, flush=True)
    try:
        r = run_child(__file__, ["--peak"], env=child_env("now", REPO_ROOT / "src"))
    except RuntimeError as e:
        print(f"  failed: {str(e).splitlines()[0]}", file=sys.stderr, flush=True)
        return {}
    print(f"  fp32 {r['fp32']['gflops']:.1f} GFLOP/s, bf16 {r['bf16']['gflops']:.1f} GFLOP/s", file=sys.stderr,
          flush=True)
    return r


def sanitise(text: str, tmp: str | None = None) -> str:
    """No path of this machine in what is written: the checkout, the temporary folder, the interpreter's prefix
    and the home folder become relative or placeholder names."""
    pairs = [(str(REPO_ROOT) + "/", ""), (str(REPO_ROOT), "."), (sys.prefix, "<venv>"),
             (tempfile.gettempdir(), "<tmp>"), (str(Path.home()), "~")]
    if tmp:
        pairs.insert(0, (tmp, "<tmp>"))
    for old, new in pairs:
        if len(old) > 1:
            text = text.replace(old, new)
    return text


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", default=",".join(JOBS), help=f"comma-separated subset of {', '.join(JOBS)}")
    p.add_argument("--sides", default=",".join(SIDES), help=f"comma-separated subset of {', '.join(SIDES)}")
    p.add_argument("--steps", type=int, default=3, help="timed steps, then as many profiled steps (default 3)")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps first (default 1)")
    p.add_argument("--top", type=int, default=10, help="operators per table (default 10)")
    p.add_argument("--keep", type=int, default=40, help="operators kept per side in the JSON (default 40)")
    p.add_argument("--out", default=str(HERE / "results" / "profile-jobs"),
                   help="output stem: STEM.md and STEM.json (default benchmarks/results/profile-jobs)")
    p.add_argument("--from-json", metavar="FILE", help="only render STEM.md again from a JSON this script wrote")
    p.add_argument("--no-peak", action="store_true", help="skip the matmul peak (no MFU columns)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads in every child, and for the peak (default 1: comparable operator shares)")
    p.add_argument("--tune-glibc", action="store_true",
                   help=f"run every child with {' '.join(f'{k}={v}' for k, v in GLIBC_TUNING.items())} (glibc "
                        "malloc reusing freed memory: both sides at the reference's best allocator settings)")
    p.add_argument("--child", nargs=2, metavar=("JOB", "SIDE"), help=argparse.SUPPRESS)
    p.add_argument("--peak", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.steps < 1 or args.warmup < 0 or args.top < 1 or args.keep < args.top:
        p.error("--steps and --top must be >= 1, --warmup >= 0, --keep >= --top")
    if args.peak:
        emit_result(peak_child())
        return 0
    if args.child:
        emit_result(child(*args.child, steps=args.steps, warmup=args.warmup, keep=args.keep))
        return 0
    if args.from_json:
        with open(args.from_json, encoding="utf-8") as f:
            saved = json.load(f)
        markdown = sanitise(render(saved["jobs"], saved["meta"], args.top))
        print(markdown)
        Path(args.out).with_suffix(".md").write_text(markdown + "\n", encoding="utf-8")
        return 0
    os.environ[THREADS_ENV] = str(args.threads)
    if args.tune_glibc:
        os.environ.update(GLIBC_TUNING)
    jobs = [j for j in args.jobs.split(",") if j]
    sides = [s for s in args.sides.split(",") if s]
    unknown = [j for j in jobs if j not in JOBS] + [s for s in sides if s not in SIDES]
    if unknown:
        p.error(f"unknown job or side: {', '.join(unknown)}")

    import torch

    flags = cpu_flags()
    machine = machine_description()
    cmd_args = list(argv if argv is not None else sys.argv[1:])
    command = reproduce_command(__file__, cmd_args)
    for var in ("MKL_NUM_THREADS", "OMP_NUM_THREADS", "LD_PRELOAD", *(() if args.tune_glibc else GLIBC_TUNING)):
        if os.environ.get(var):
            command = f"{var}={os.environ[var]} {command}"
    meta = {"command": command, "sides": sides, "machine": machine, "cpu": cpu_model(), "flags": flags,
            "isa": ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in flags.items()),
            "torch_capability": torch_capability(), "allocator": allocator(), "torch": torch.__version__,
            "transformers": machine["transformers"], "now_version": machine["lmforge"].split("(", 1)[-1].rstrip(")"),
            "before_commit": BEFORE_COMMIT, "steps": args.steps,
            "bf16_native": " + ".join(k for k in ("AVX512_BF16", "AMX") if flags[k]),
            "warmup": args.warmup, "keep": args.keep, "threads": args.threads}
    print(f"CPU: {meta['cpu']}; {meta['isa']}; torch capability {meta['torch_capability']}", file=sys.stderr)
    print(f"Allocator: {meta['allocator']}; torch threads {args.threads} per child", file=sys.stderr)
    all_results: dict[str, dict[str, dict[str, Any]]] = {}
    wall = time.perf_counter()
    peaks = {} if args.no_peak else {"start": measure_peak("at start")}
    with tempfile.TemporaryDirectory(prefix="lmforge-before-") as tmp:
        before_src = export_before(Path(tmp)) if "before" in sides else Path(tmp)
        for job in jobs:
            all_results[job] = {}
            for side in sides:
                print(f"{job} / {side}...", file=sys.stderr, flush=True)
                start = time.perf_counter()
                try:
                    r = run_child(__file__, ["--child", job, side, "--steps", str(args.steps), "--warmup",
                                             str(args.warmup), "--keep", str(args.keep)],
                                  env=child_env(side, before_src))
                except RuntimeError as e:
                    print(f"  failed: {e}", file=sys.stderr, flush=True)
                    all_results[job][side] = {"error": str(e).splitlines()[0]}
                    continue
                all_results[job][side] = r
                top_op = r["ops"][0]
                missing = f"; no formula: {', '.join(r['flops_uncounted_ops'])}" if r["flops_uncounted_ops"] else ""
                print(f"  {r['step_ms_median']:,.0f} ms wall, {r['step_cpu_ms_median']:,.0f} ms CPU/step; "
                      f"{r['flops'] / 1e9:,.2f} GFLOP/step; top: {top_op['op']} {pct(top_op['share'])} "
                      f"({time.perf_counter() - start:.0f} s){missing}", file=sys.stderr, flush=True)
    if not args.no_peak:  # the machine is shared: measure again and keep the better reading
        peaks["end"] = measure_peak("at end")
    meta["peak"] = {when: r for when, r in peaks.items() if r}
    meta["wall_s"] = round(time.perf_counter() - wall, 1)
    meta["load_end"] = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    markdown = sanitise(render(all_results, meta, args.top), tmp)
    print(markdown)
    stem = Path(args.out)
    stem.parent.mkdir(parents=True, exist_ok=True)
    stem.with_suffix(".md").write_text(markdown + "\n", encoding="utf-8")
    stem.with_suffix(".json").write_text(sanitise(json.dumps({"meta": meta, "jobs": all_results}, indent=1), tmp)
                                         + "\n", encoding="utf-8")
    print(sanitise(f"wrote {stem.with_suffix('.md')} and {stem.with_suffix('.json')} ({meta['wall_s']:.0f} s)", tmp),
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

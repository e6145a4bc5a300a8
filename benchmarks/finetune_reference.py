"""The Hugging Face side of ``bench_finetune.py``: one fine-tuning run through ``transformers`` in a plain PyTorch loop.

Run by ``bench_finetune.py`` in a fresh process (one per task and seed); prints one ``RESULT`` JSON line.

What it shares with the lmforge side, so that only the model code and the training loop differ:

- the data: the same split files, read with lmforge's readers and turned into model inputs with lmforge's task
  featurizers (the MiniLM ``vocab.txt``; the Rust ``BertTokenizerFast`` gives the same ids, which this script checks
  for the classification and tagging inputs and reports), padded per batch by the same collate functions;
- the batch order: epoch e visits the features in ``torch.randperm(n, generator=seed + e)`` order, as lmforge's
  ``FeatureData`` does;
- the decoding and the metric: lmforge's task ``metrics`` (accuracy / macro-F1, conlleval entity F1, SQuAD EM/F1) and,
  for QA, ``decode_qa`` on this model's start/end logits.

What is Hugging Face's own: ``AutoModelFor{SequenceClassification,TokenClassification,QuestionAnswering}`` loaded with
``from_pretrained`` (sdpa attention; the new head initialised by transformers, normal(0, 0.02), after
``torch.manual_seed(seed)``), its loss (``outputs.loss``), its weight-decay rule (``Trainer.get_decay_parameter_names``:
no decay for biases and LayerNorm), the optimizer the HF Trainer picks by default (``torch.optim.AdamW(fused=True)``)
and ``get_linear_schedule_with_warmup``. Token classification labels the first sub-word of each word and gives -100
to the others (Hugging Face's usual alignment); words are predicted from their first sub-word.

Usage (normally only via bench_finetune.py)::

    python benchmarks/finetune_reference.py --task sequence --model DIR --train FILE --test FILE \
        --epochs 1 --batch-size 32 --lr 5e-5 --max-length 128 --seed 0
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
import time
from typing import Any

import numpy as np
import torch

from common import emit_result

EVAL_BATCH = 32  # the batch of `lmforge evaluate` (its default)


# ---------------------------------------------------------------------------------------------- data
def load_data(args: argparse.Namespace):
    """(task, tokenizer, train examples, train features, test examples, test features), all lmforge's."""
    from lmforge.config import TaskConfig
    from lmforge.tasks import make_task
    from lmforge.tokenizers import WordPieceTokenizer

    options: dict[str, Any] = {"task": args.task, "max_length": args.max_length}
    if args.task == "qa":
        options["doc_stride"] = args.doc_stride
    task = make_task(TaskConfig(**options))
    tokenizer = WordPieceTokenizer.from_pretrained(args.model)
    train_examples = task.read(args.train, labelled=True)
    task.fit_labels(train_examples)
    train_features = task.featurize(train_examples, tokenizer, training=True)
    test_examples = task.read(args.test, labelled=True)
    test_features = task.featurize(test_examples, tokenizer, training=False)
    return task, tokenizer, train_examples, train_features, test_examples, test_features


def tokenizer_mismatches(task_name: str, model_dir: str, examples: list[Any], features: list[dict[str, Any]],
                         max_length: int) -> int | None:
    """How many inputs the Rust ``BertTokenizerFast`` would encode differently (None: not checked, QA)."""
    from transformers import AutoTokenizer

    fast = AutoTokenizer.from_pretrained(model_dir)
    if task_name == "sequence":
        theirs = fast([e.text for e in examples], truncation=True, max_length=max_length)["input_ids"]
        ours = [f["windows"][0] for f in features]
    elif task_name == "token":
        theirs = fast([e.tokens for e in examples], is_split_into_words=True, truncation=True,
                      max_length=max_length)["input_ids"]
        ours = [f["input_ids"] for f in features]
    else:
        return None
    return sum(list(a) != list(b) for a, b in zip(theirs, ours, strict=True))


def hf_batch(task_name: str, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """lmforge's collated batch -> the keyword arguments of the Hugging Face model."""
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
    if task_name == "sequence" and "labels" in batch:
        inputs["labels"] = batch["labels"]
    elif task_name == "token" and "labels" in batch:
        inputs["labels"] = first_subword_labels(batch["word_index"], batch["labels"])
    elif task_name == "qa" and "start_positions" in batch:
        inputs["start_positions"], inputs["end_positions"] = batch["start_positions"], batch["end_positions"]
    return inputs


def first_subword_positions(word_index: torch.Tensor) -> torch.Tensor:
    """(B, T) bool: True at the first sub-word of every word (``word_index`` is -1 at specials and padding)."""
    previous = torch.cat([torch.full_like(word_index[:, :1], -1), word_index[:, :-1]], dim=1)
    return (word_index >= 0) & (word_index != previous)


def first_subword_labels(word_index: torch.Tensor, word_labels: torch.Tensor) -> torch.Tensor:
    """Word labels (B, W) -> sub-word labels (B, T): the word's label at its first sub-word, -100 elsewhere."""
    first = first_subword_positions(word_index)
    gathered = word_labels.gather(1, word_index.clamp(min=0).clamp(max=word_labels.shape[1] - 1))  # (B, T)
    return gathered.masked_fill(~first, -100)


# ---------------------------------------------------------------------------------------------- model, optimizer
def build_model(task, args: argparse.Namespace) -> torch.nn.Module:
    import transformers

    kind = {"sequence": transformers.AutoModelForSequenceClassification,
            "token": transformers.AutoModelForTokenClassification,
            "qa": transformers.AutoModelForQuestionAnswering}[args.task]
    options: dict[str, Any] = {}
    if args.task in ("sequence", "token"):
        options = {"num_labels": len(task.labels), "id2label": dict(enumerate(task.labels)),
                   "label2id": {label: i for i, label in enumerate(task.labels)}}
    torch.manual_seed(args.seed)  # the new head's initialisation
    return kind.from_pretrained(args.model, **options).train()


def decay_parameter_names(model: torch.nn.Module) -> set[str]:
    """The names the HF Trainer applies weight decay to (its own rule: no biases, no LayerNorm parameters)."""
    from transformers import Trainer

    # get_decay_parameter_names does not read the Trainer's state; call it without building a Trainer
    return set(Trainer.get_decay_parameter_names(None, model))


def build_optimizer(model: torch.nn.Module, args: argparse.Namespace, total_steps: int):
    from transformers import get_linear_schedule_with_warmup

    decay = decay_parameter_names(model)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    groups = [{"params": [p for n, p in named if n in decay], "weight_decay": args.weight_decay},
              {"params": [p for n, p in named if n not in decay], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.999), eps=args.eps, fused=True)
    warmup = int(args.warmup_ratio * total_steps)  # the same count as lmforge's TrainConfig.warmup()
    return optimizer, get_linear_schedule_with_warmup(optimizer, warmup, total_steps), warmup


# ---------------------------------------------------------------------------------------------- train, predict
def train(model: torch.nn.Module, task, tokenizer, features: list[dict[str, Any]], args: argparse.Namespace
          ) -> dict[str, Any]:
    """The training loop; returns its timing (without the model build and the evaluation) and losses."""
    steps_per_epoch = math.ceil(len(features) / args.batch_size)
    total = max(1, math.ceil(args.epochs * steps_per_epoch))
    optimizer, scheduler, warmup = build_optimizer(model, args, total)
    torch.manual_seed(args.seed)  # dropout
    losses: list[float] = []
    step, epoch, tokens = 0, 0, 0
    model.train()
    start = time.perf_counter()
    while step < total:
        order = torch.randperm(len(features), generator=torch.Generator().manual_seed(args.seed + epoch)).tolist()
        for s in range(0, len(order), args.batch_size):
            if step >= total:
                break
            batch = task.collate([features[i] for i in order[s:s + args.batch_size]], tokenizer.pad_id)
            tokens += int(batch["attention_mask"].sum())
            if args.mask_context:
                loss = masked_qa_loss(model, batch)
            else:
                loss = model(**hf_batch(args.task, batch)).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(float(loss.detach()))
            step += 1
        epoch += 1
    seconds = time.perf_counter() - start
    return {"train_s": seconds, "steps": step, "warmup_steps": warmup, "tokens": tokens,
            "final_loss": float(np.mean(losses[-10:])), "first_loss": losses[0]}


def masked_qa_loss(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Diagnostic variant (``--mask-context``): Hugging Face's QA model, but with lmforge's loss, whose start and
    end cross-entropies only see the window's context tokens and [CLS] (``batch["context_mask"]``)."""
    import torch.nn.functional as F

    out = model(**hf_batch("qa", {k: v for k, v in batch.items() if not k.endswith("_positions")}))
    allowed = batch["context_mask"]  # (B, T) bool
    lowest = torch.finfo(out.start_logits.dtype).min
    start = out.start_logits.masked_fill(~allowed, lowest)
    end = out.end_logits.masked_fill(~allowed, lowest)
    return (F.cross_entropy(start, batch["start_positions"]) + F.cross_entropy(end, batch["end_positions"])) / 2


def eval_batches(task, tokenizer, features: list[dict[str, Any]]):
    """Yield (feature indices, HF inputs) in length order (as lmforge's ``run_model`` batches for prediction)."""
    from lmforge.tasks.base import feature_length

    order = sorted(range(len(features)), key=lambda i: feature_length(features[i]))
    for s in range(0, len(order), EVAL_BATCH):
        chunk = order[s:s + EVAL_BATCH]
        batch = task.collate([features[i] for i in chunk], tokenizer.pad_id)
        yield chunk, batch


@torch.no_grad()
def predict(model: torch.nn.Module, task, tokenizer, examples: list[Any], features: list[dict[str, Any]],
            args: argparse.Namespace) -> list[dict[str, Any]]:
    """One prediction per example in the form lmforge's ``task.metrics`` reads."""
    model.eval()
    if args.task == "sequence":
        predictions: list[dict[str, Any] | None] = [None] * len(examples)
        for chunk, batch in eval_batches(task, tokenizer, features):
            best = model(**hf_batch("sequence", batch)).logits.argmax(-1).tolist()
            for j, i in enumerate(chunk):
                predictions[features[i]["example_index"]] = {"label": task.labels[best[j]]}
        return predictions  # type: ignore[return-value]
    if args.task == "token":
        predictions = [None] * len(examples)
        for chunk, batch in eval_batches(task, tokenizer, features):
            best = model(**hf_batch("token", batch)).logits.argmax(-1)  # (B, T)
            first = first_subword_positions(batch["word_index"])
            for j, i in enumerate(chunk):
                ids = best[j][first[j]].tolist()  # one per kept word, in order
                n_total = features[i]["n_words_total"]
                predictions[i] = {"tags": [task.labels[k] for k in ids] + ["O"] * (n_total - len(ids))}
        return predictions  # type: ignore[return-value]
    from lmforge.data.qa_features import decode_qa

    starts: list[np.ndarray | None] = [None] * len(features)
    ends: list[np.ndarray | None] = [None] * len(features)
    for chunk, batch in eval_batches(task, tokenizer, features):
        out = model(**hf_batch("qa", batch))
        s, e = out.start_logits.float().numpy(), out.end_logits.float().numpy()
        for j, i in enumerate(chunk):
            n = len(features[i]["input_ids"])
            starts[i], ends[i] = s[j, :n], e[j, :n]
    c = task.config
    decoded = decode_qa(examples, features, starts, ends, n_best=c.n_best, max_answer_length=c.max_answer_length)
    return [decoded[e.id] for e in examples]


# ---------------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", required=True, choices=("sequence", "token", "qa"))
    p.add_argument("--model", required=True, help="the MiniLM folder (Hugging Face layout)")
    p.add_argument("--train", required=True)
    p.add_argument("--test", required=True)
    p.add_argument("--epochs", type=float, required=True)
    p.add_argument("--batch-size", type=int, required=True)
    p.add_argument("--lr", type=float, required=True)
    p.add_argument("--max-length", type=int, required=True)
    p.add_argument("--doc-stride", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--warmup-ratio", type=float, default=0.1)
    p.add_argument("--eps", type=float, default=1e-8)
    p.add_argument("--max-grad-norm", type=float, default=1.0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--mask-context", action="store_true",
                   help="QA diagnostic: train with lmforge's loss (cross-entropy over context tokens and [CLS] only) "
                        "instead of Hugging Face's (over every position); not used by bench_finetune.py")
    args = p.parse_args(argv)
    if args.mask_context and args.task != "qa":
        p.error("--mask-context is for --task qa")
    torch.set_num_threads(args.threads)
    logging.getLogger("transformers").setLevel(logging.ERROR)
    import transformers

    transformers.logging.set_verbosity_error()

    t0 = time.perf_counter()
    task, tokenizer, train_examples, train_features, test_examples, test_features = load_data(args)
    mismatches = tokenizer_mismatches(args.task, args.model, train_examples + test_examples,
                                      train_features + test_features, args.max_length)
    model = build_model(task, args)
    setup_s = time.perf_counter() - t0
    result = train(model, task, tokenizer, train_features, args)
    t1 = time.perf_counter()
    predictions = predict(model, task, tokenizer, test_examples, test_features, args)
    metrics = task.metrics(test_examples, predictions)
    result.update({"eval_s": time.perf_counter() - t1, "setup_s": setup_s, "metrics": metrics,
                   "train_examples": len(train_examples), "train_features": len(train_features),
                   "test_examples": len(test_examples), "tokenizer_mismatches": mismatches,
                   "threads": torch.get_num_threads(), "labels": len(task.labels),
                   "attn_implementation": getattr(model.config, "_attn_implementation", None)})
    emit_result(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())

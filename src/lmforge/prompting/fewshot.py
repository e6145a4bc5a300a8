"""Zero- and few-shot evaluation of a causal language model by prompting (no gradient step).

GPT-2 (Radford et al. 2019, "Language Models are Unsupervised Multitask Learners") does tasks zero-shot by
conditioning on a prompt; GPT-3 (Brown et al. 2020, "Language Models are Few-Shot Learners") puts K solved
training examples ("demonstrations") before the test input and picks, among the candidate answers, the one the model
finds most likely (section 2.4), or lets the model write the answer (free-form tasks). Zhao et al. 2021 ("Calibrate
Before Use") show that the choice and order of the demonstrations moves accuracy a lot, hence several draws per K
here, and that dividing by the label probabilities of a content-free input removes much of the bias.

For every K in ``config.shots`` and every draw (seed ``seed + draw``; K = 0 has one), each test example gets a
prompt (``lmforge.prompting.templates``) and a prediction:
    classify  the label whose verbalisation scores best after the prompt (``lmforge.prompting.scoring``:
              sum / mean / unconditional, optionally calibrated);
    generate  greedy decoding from the prompt, cut at the first stop string (or the end-of-document token),
              compared with the verbalised label by exact match (whitespace-normalised; lowercased when the
              tokenizer lowercases).
"""

from __future__ import annotations

import logging
import random
import statistics
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from lmforge.errors import LmforgeError
from lmforge.prompting.report import FewShotReport
from lmforge.prompting.scoring import (
    CausalLM,
    _device,
    calibrate,
    causal_lm_for,
    label_probabilities,
    score_candidates,
)
from lmforge.prompting.templates import (
    Example,
    PromptBuilder,
    PromptTemplate,
    as_examples,
    document_end_id,
    draw_demonstrations,
    resolve_verbalizer,
)

log = logging.getLogger("lmforge")

__all__ = ["DEMOS", "MODES", "SCORINGS", "FewShotConfig", "content_free_inputs", "cut_at_stop", "fewshot_evaluate"]

SCORINGS = ("sum", "mean", "unconditional")
DEMOS = ("fixed", "per-example")
MODES = ("classify", "generate")


@dataclass
class FewShotConfig:
    """How ``fewshot_evaluate`` prompts and scores.

    Attributes:
        template: must hold ``{text}`` and ``{label}`` (where the answer goes, normally last); ``{text_pair}``
            optional; literal braces as ``{{`` ``}}`` (``lmforge.prompting.templates``).
        verbalizer: label -> the words that stand for it in prompts; None: the label names themselves.
        shots: the numbers of demonstrations K to evaluate.
        draws: demonstration draws per K (seeds ``seed``, ``seed + 1``, ...); K = 0 has one.
        seed: the first draw's seed.
        demos: "fixed" (the same K demonstrations for every test example of a draw) or "per-example" (a fresh
            draw per test example).
        scoring: "sum", "mean" or "unconditional" (``lmforge.prompting.scoring``); classify mode.
        calibrate: contextual calibration (Zhao et al. 2021); classify mode.
        separator: the text between demonstrations.
        mode: "classify" (likelihood of each label's verbalisation) or "generate" (greedy, exact match).
        max_new_tokens: generate mode: tokens generated at most.
        stop: generate mode: strings that end the answer (the first one found in the decoded text).
        batch_size: sequences per forward pass (classify) or prompts per generation batch.
    """

    template: str = "{text} {label}"
    verbalizer: dict[str, str] | None = None
    shots: tuple[int, ...] = (0, 1, 4, 16)
    draws: int = 3
    seed: int = 0
    demos: str = "fixed"
    scoring: str = "sum"
    calibrate: bool = False
    separator: str = "\n\n"
    mode: str = "classify"
    max_new_tokens: int = 10
    stop: tuple[str, ...] = ("\n",)
    batch_size: int = 16

    def __post_init__(self) -> None:
        if isinstance(self.shots, int):
            self.shots = (self.shots,)
        if isinstance(self.stop, str):
            self.stop = (self.stop,)
        self.shots = tuple(self.shots) if isinstance(self.shots, list | tuple) else self.shots
        self.stop = tuple(self.stop) if isinstance(self.stop, list | tuple) else self.stop
        self.validate()

    def validate(self) -> None:
        """Raise ``LmforgeError`` naming every offending value and the fix."""
        problems: list[str] = []
        PromptTemplate.parse(self.template)  # raises with its own message
        if not isinstance(self.shots, tuple) or not self.shots or not all(_is_int(k) and k >= 0 for k in self.shots):
            problems.append(f"shots={self.shots!r} must be a non-empty tuple of integers >= 0, e.g. (0, 1, 4, 16)")
        elif len(set(self.shots)) != len(self.shots):
            problems.append(f"shots={self.shots!r} repeats a value; list each K once")
        for name, low in (("draws", 1), ("max_new_tokens", 1), ("batch_size", 1), ("seed", 0)):
            value = getattr(self, name)
            if not _is_int(value) or value < low:
                problems.append(f"{name}={value!r} must be an integer >= {low}")
        for name, choices in (("demos", DEMOS), ("scoring", SCORINGS), ("mode", MODES)):
            if getattr(self, name) not in choices:
                problems.append(f"{name}={getattr(self, name)!r} is not one of {', '.join(choices)}")
        if not isinstance(self.separator, str):
            problems.append(f"separator={self.separator!r} must be a string")
        if not isinstance(self.stop, tuple) or not all(isinstance(s, str) and s for s in self.stop):
            problems.append(f"stop={self.stop!r} must be a tuple of non-empty strings")
        if not isinstance(self.calibrate, bool):
            problems.append(f"calibrate={self.calibrate!r} must be True or False")
        if self.verbalizer is not None and not isinstance(self.verbalizer, dict):
            problems.append(f"verbalizer must be a dict label -> words or None; got {type(self.verbalizer).__name__}")
        if self.mode == "generate":
            if self.calibrate:
                problems.append("--calibrate applies to --mode classify (it rescales the label probabilities); "
                                "--mode generate has none")
            if self.scoring != "sum":
                problems.append(f"--scoring {self.scoring} applies to --mode classify; --mode generate compares "
                                "the generated text with the answer")
        if problems:
            raise LmforgeError("few-shot settings: " + "; ".join(problems))

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["shots"], out["stop"] = list(self.shots), list(self.stop)
        return out


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def content_free_inputs(tokenizer: Any) -> list[str]:
    """Zhao et al.'s content-free inputs: "N/A", the empty string, and the tokenizer's mask token if it has one."""
    inputs = ["N/A", ""]
    mask = getattr(tokenizer, "mask_token", None)
    if isinstance(mask, str) and mask:
        inputs.append(mask)
    return inputs


@dataclass
class _Run:
    """One (K, draw): its accuracy, dropped demonstrations, cut queries and per-example records."""

    accuracy: float
    dropped: int
    cut: int
    records: list[dict[str, Any]] = field(default_factory=list)


def fewshot_evaluate(model: Any, tokenizer: Any, train_examples: Sequence[Any], test_examples: Sequence[Any],
                     config: FewShotConfig | None = None, *, progress: bool = False,
                     name: str | None = None) -> FewShotReport:
    """Evaluate in-context learning: accuracy per K (mean and std over demonstration draws).

    Args:
        model: a causal LM (``Decoder``; ``AWDLSTM`` / ``BiLM`` forward LMs; any generating causal LM in generate
            mode). Run in eval mode without gradients.
        tokenizer: its tokenizer (``encode_ids``, ``decode``, ``sep_id`` or ``bos_id``).
        train_examples: the demonstration pool: objects with ``.text`` and ``.label`` (and optional
            ``.text_pair``), dicts with those keys, or (text, label) tuples.
        test_examples: the examples to predict, labelled alike.
        config: the settings (default ``FewShotConfig()``).
        progress: show a progress bar (test examples).
        name: how messages name the model (e.g. its folder).

    Returns:
        ``FewShotReport``: ``rows`` (one per K), predictions of the first draw at each K, chance and majority.

    Raises:
        LmforgeError: a bad template or verbalizer, a test example without a label, K larger than the training
            set, a model that is not a causal LM.
    """
    config = config if config is not None else FewShotConfig()
    if not isinstance(config, FewShotConfig):
        raise LmforgeError(f"config must be a FewShotConfig; got {type(config).__name__}")
    config.validate()
    lm = causal_lm_for(model, name, scoring=config.mode == "classify")
    template = PromptTemplate.parse(config.template)
    train, test = as_examples(train_examples, "train"), as_examples(test_examples, "test")
    if not test:
        raise LmforgeError("no test examples: give at least one labelled example to evaluate")
    for where, examples in (("test", test), ("train", train)):
        unlabelled = next((i for i, e in enumerate(examples) if e.label is None), None)
        if unlabelled is not None:
            ex = examples[unlabelled]
            raise LmforgeError(f"{where} example {unlabelled + 1}{f' (line {ex.line})' if ex.line else ''} has no "
                               "label; fewshot needs labelled examples (demonstrations show them, accuracy compares "
                               "with them)")
    largest = max(config.shots)
    if largest > len(train):
        raise LmforgeError(f"shots: K={largest} exceeds the {len(train)} training examples; lower the number of "
                           "shots or give more training examples")
    verbalizer = resolve_verbalizer(config.verbalizer, train, test)
    room = config.max_new_tokens if config.mode == "generate" else None
    builder = PromptBuilder(tokenizer, template, verbalizer, config.separator, train, lm.max_len, room)
    by_text: dict[tuple[str, str | None], set[int]] = {}
    for j, ex in enumerate(train):
        by_text.setdefault((ex.text, ex.text_pair), set()).add(j)
    excluded = [frozenset(by_text.get((ex.text, ex.text_pair), ())) for ex in test]

    from tqdm.auto import tqdm

    runs = [(k, d) for k in config.shots for d in range(1 if k == 0 else config.draws)]
    bar = tqdm(total=len(runs) * len(test), desc="fewshot", unit="example", disable=not progress,
               dynamic_ncols=True)
    unconditional = None
    if config.mode == "classify" and config.scoring == "unconditional":
        unconditional = score_candidates(lm.model, tokenizer, [builder.context_ids()], builder.candidates,
                                         batch_size=config.batch_size).log_probs[0]  # (C,)
    rows, predictions, cut_total, dropped_total = [], {}, 0, 0
    try:
        for k in config.shots:
            accuracies, dropped = [], 0
            for draw in range(1 if k == 0 else config.draws):
                rng = random.Random(config.seed + draw)
                demos = draw_demonstrations(len(train), k, len(test), rng, per_example=config.demos == "per-example",
                                            excluded=excluded)
                if config.mode == "classify":
                    run = _classify(lm, tokenizer, builder, test, demos, config, unconditional, bar.update)
                else:
                    run = _generate(lm, tokenizer, builder, test, demos, config, bar.update)
                accuracies.append(run.accuracy)
                dropped += run.dropped
                cut_total += run.cut
                if draw == 0:
                    predictions[k] = run.records
            dropped_total += dropped
            rows.append({"shots": k, "accuracy_mean": statistics.fmean(accuracies),
                         "accuracy_std": statistics.stdev(accuracies) if len(accuracies) > 1 else 0.0,
                         "accuracies": accuracies, "dropped_demos": dropped, "n_test": len(test)})
    finally:
        bar.close()
    if dropped_total:
        log.warning("dropped %d demonstration(s), oldest first, from prompts longer than the model's context "
                    "(max_seq_len=%s minus %d positions for the answer); see dropped_demos per K",
                    dropped_total, lm.max_len, lm.max_len - builder.limit if builder.limit is not None else 0)
    if cut_total:
        log.warning("%d prompt(s) did not fit the model's context even without demonstrations: the query was cut "
                    "from its left (its end, next to the answer, is kept)", cut_total)
    counts = Counter(ex.label for ex in test)
    return FewShotReport(
        rows=rows, config=config.to_dict(), labels=builder.labels,
        chance=1.0 / len(builder.labels) if config.mode == "classify" else None,
        majority=max(counts.values()) / len(test), predictions=predictions, n_train=len(train),
        cut_queries=cut_total)


def _chunks(n: int, size: int) -> list[range]:
    return [range(s, min(n, s + size)) for s in range(0, n, size)]


def _combine(log_probs: torch.Tensor, n_tokens: torch.Tensor, scoring: str,
             unconditional: torch.Tensor | None) -> torch.Tensor:
    """(P, C) scores of the chosen scoring from the summed log-likelihoods."""
    if scoring == "mean":
        return log_probs / n_tokens.to(log_probs.dtype)
    if scoring == "unconditional":
        assert unconditional is not None
        return log_probs - unconditional[None, :]
    return log_probs


def _classify(lm: CausalLM, tokenizer: Any, builder: PromptBuilder, test: list[Example], demos: list[list[int]],
              config: FewShotConfig, unconditional: torch.Tensor | None, advance: Callable[[int], Any]) -> _Run:
    labels = builder.labels
    prompts = [builder.build(demos[i], ex.text, ex.text_pair, where=f"test example {i + 1}")
               for i, ex in enumerate(test)]
    scores = torch.empty((len(test), len(labels)), dtype=torch.float64)
    for chunk in _chunks(len(test), config.batch_size):
        result = score_candidates(lm.model, tokenizer, [prompts[i].ids for i in chunk], builder.candidates,
                                  batch_size=config.batch_size)
        scores[chunk.start:chunk.stop] = _combine(result.log_probs, result.n_tokens, config.scoring, unconditional)
        advance(len(chunk))
    probs = label_probabilities(scores)  # (N, C)
    if config.calibrate:
        p_cf = _content_free_probs(lm, tokenizer, builder, demos, config, unconditional)
        probs = calibrate(probs, p_cf)
    predicted = probs.argmax(-1).tolist()
    records, correct = [], 0
    for i, ex in enumerate(test):
        label = labels[predicted[i]]
        correct += label == ex.label
        records.append({"index": i, "line": ex.line, "label": ex.label, "prediction": label,
                        "correct": label == ex.label, "demos": prompts[i].demos,
                        "scores": {lab: round(float(s), 6) for lab, s in zip(labels, scores[i], strict=True)},
                        "probs": {lab: round(float(p), 6) for lab, p in zip(labels, probs[i], strict=True)}})
    return _Run(correct / len(test), sum(p.dropped for p in prompts), sum(p.cut > 0 for p in prompts), records)


def _content_free_probs(lm: CausalLM, tokenizer: Any, builder: PromptBuilder, demos: list[list[int]],
                        config: FewShotConfig, unconditional: torch.Tensor | None) -> torch.Tensor:
    """(N, C) p_cf per test example: the mean label probabilities of the content-free inputs after that example's
    demonstrations (computed once per distinct demonstration list: once per draw with fixed demonstrations)."""
    inputs = content_free_inputs(tokenizer)
    distinct = list(dict.fromkeys(tuple(d) for d in demos))
    prompts = [builder.build(list(d), text, text if builder.template.uses_pair else None, check_pair=False).ids
               for d in distinct for text in inputs]
    result = score_candidates(lm.model, tokenizer, prompts, builder.candidates, batch_size=config.batch_size)
    probs = label_probabilities(_combine(result.log_probs, result.n_tokens, config.scoring, unconditional))
    p_cf = probs.reshape(len(distinct), len(inputs), -1).mean(1)  # (distinct, C)
    where = {d: i for i, d in enumerate(distinct)}
    return p_cf[[where[tuple(d)] for d in demos]]


def _normalise(text: str, lowercase: bool) -> str:
    text = " ".join(text.split())
    return text.lower() if lowercase else text


def cut_at_stop(text: str, stops: Sequence[str]) -> str:
    """``text`` up to (not including) the earliest of the stop strings."""
    ends = [text.find(s) for s in stops if s and s in text]
    return text[:min(ends)] if ends else text


def _generate(lm: CausalLM, tokenizer: Any, builder: PromptBuilder, test: list[Example], demos: list[list[int]],
              config: FewShotConfig, advance: Callable[[int], Any]) -> _Run:
    from lmforge.generation import generate

    lowercase = bool(getattr(tokenizer, "lowercase", False))
    end = document_end_id(tokenizer)
    pad = getattr(tokenizer, "pad_id", None)
    pad = pad if isinstance(pad, int) else 0
    if hasattr(tokenizer, "newline_id") and tokenizer.newline_id is None and any("\n" in s for s in config.stop):
        log.warning("the stop string(s) %s hold a line break, which this WordPiece tokenizer never writes (it reads "
                    "line breaks as spaces): answers end only at the end-of-document token or --max-new-tokens. "
                    "Give --stop a visible string, or train the tokenizer with --keep-newlines",
                    ", ".join(repr(s) for s in config.stop))
    device = _device(lm.model)
    prompts = [builder.build(demos[i], ex.text, ex.text_pair, where=f"test example {i + 1}")
               for i, ex in enumerate(test)]
    # The gold answer as the tokenizer would write it back (WordPiece: lowercased, punctuation spaced).
    gold = {label: _normalise(tokenizer.decode(tokenizer.encode_ids(words)), lowercase)
            for label, words in builder.verbalizer.items()}
    texts: list[str] = []
    for chunk in _chunks(len(test), config.batch_size):
        rows = [prompts[i].ids for i in chunk]
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for r, row in enumerate(rows):
            ids[r, width - len(row):] = torch.tensor(row, dtype=torch.long)
            mask[r, width - len(row):] = 1
        out = generate(lm.model, ids.to(device), mask.to(device), strategy="greedy", eos_id=end, pad_id=pad,
                       max_new_tokens=config.max_new_tokens)
        texts += [cut_at_stop(tokenizer.decode(list(out.sequences[r][0])), config.stop) for r in range(len(rows))]
        advance(len(chunk))
    records, correct = [], 0
    answers = {v: label for label, v in gold.items()}
    for i, ex in enumerate(test):
        said = _normalise(texts[i], lowercase)
        right = said == gold[ex.label]
        correct += right
        records.append({"index": i, "line": ex.line, "label": ex.label, "prediction": answers.get(said),
                        "generated": texts[i], "answer": builder.verbalizer[ex.label], "correct": right,
                        "demos": prompts[i].demos})
    return _Run(correct / len(test), sum(p.dropped for p in prompts), sum(p.cut > 0 for p in prompts), records)

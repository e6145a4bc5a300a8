"""One-line inference: ``lmforge.pipeline(task, model=DIR)`` returns a callable for raw text.

=======================  ==============================================  ==========================================
task                     model folder                                    call -> result
=======================  ==============================================  ==========================================
``fill-mask``            a pretrained encoder with its MLM head          ``"Paris is the [MASK] of France."`` ->
                                                                         ``[{"token", "token_id", "score",
                                                                         "sequence"}, ...]`` (top_k; a list per
                                                                         mask when there are several)
``text-classification``  ``lmforge finetune --task sequence|pair``       ``"text"`` or ``{"text", "text_pair"}``
                                                                         -> ``{"label", "score"}`` (``{"value"}``
                                                                         for regression); with ``top_k``: the
                                                                         ``top_k`` best as a list
``token-classification`` ``lmforge finetune --task token`` (or span)     ``"text"`` -> ``[{"entity_group",
                                                                         "start", "end", "word", "score"}, ...]``
                                                                         with character offsets into the text
``question-answering``   ``lmforge finetune --task qa``                  ``{"question", "context"}`` ->
                                                                         ``{"answer", "start", "end", "score"}``;
                                                                         with ``top_k``: a ranked list
``multiple-choice``      ``lmforge finetune --task choice``              ``{"text", "choices": [...]}`` ->
                                                                         ``{"label" (index), "choice", "score",
                                                                         "probabilities"}``; with ``top_k``: the
                                                                         ``top_k`` best options as a list
``feature-extraction``   any encoder (lmforge or Hugging Face BERT)      ``"text"`` -> a vector (``pooling``
                                                                         ``mean``/``cls``) or one per token;
                                                                         with ``word_pooling``: ``{"words",
                                                                         "spans", "vectors"}`` (one per word)
``text-generation``      a language model (GPT, AWD-LSTM, biLM, XLNet)   ``"prompt"`` -> ``[{"generated_text"}]``
                         or an encoder-decoder (``train-seq2seq``)       (``num_return_sequences`` of them; the
                                                                         prompt then its continuation, or the
                                                                         continuation alone with
                                                                         ``return_full_text=False``)
=======================  ==============================================  ==========================================

Every pipeline takes one input or a list of inputs (and then returns a list). Texts longer than the model's
window are truncated with a counted warning, except for question answering, which slides windows over the
context.

Every ``score`` is a probability, as in Hugging Face's pipelines: a softmax over the classes, the options or the
vocabulary; a tagged entity's is the mean of its words' tag probabilities; an answer's is the product of its start
and end probabilities, each a softmax over the positions of the window the answer comes from (``p_start(i) *
p_end(j)``, as transformers' question-answering pipeline computes it; SQuAD v2.0's empty answer scores
``p_start([CLS]) * p_end([CLS])``).
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import torch

from lmforge.choices import PRECISIONS
from lmforge.errors import LmforgeError

PIPELINES = ("fill-mask", "text-classification", "token-classification", "question-answering",
             "multiple-choice", "feature-extraction", "text-generation")


def pipeline(task: str, model: str | Path, *, device: str = "cpu", batch_size: int = 32, runtime: str = "torch",
             compile: bool = False, precision: str = "fp32", **options: Any):
    """Build the pipeline for ``task`` from the model folder ``model`` (see the module docstring).

    Args:
        task: one of ``PIPELINES``.
        model: a model folder (saved by lmforge, or a Hugging Face BERT folder for fill-mask and
            feature-extraction).
        device: where the model runs.
        batch_size: inputs per forward pass.
        runtime: ``"torch"``, or ``"onnx"``: the encoder runs in ONNX Runtime from the folder's ``onnx/`` graph
            (``lmforge convert --to-onnx``), the head in PyTorch (``lmforge.persistence.onnx``).
        compile: compile the model with ``torch.compile`` for inference, as ``predict --compile`` does
            (``lmforge.utils.compiling.compile_in_place``: one graph, the weights folded in; the first calls of each
            new shape compile). Not for text-generation (its decoding loop runs uncompiled) nor with
            ``runtime="onnx"``.
        precision: ``"fp32"`` (default), ``"bf16"`` or ``"auto"``: the model under bf16 autocast, its outputs back in
            fp32 (``lmforge.training.precision.autocast_inference``; bf16 is fast only on a CPU with AVX512_BF16
            or AMX). Not for text-generation nor with ``runtime="onnx"``.
        options: per pipeline: ``top_k`` (fill-mask: 5; text-classification, question-answering, multiple-choice:
            None, one best answer as a dict; a number gives that many as a ranked list); ``layers``, ``combine``,
            ``pooling`` or ``word_pooling`` (feature-extraction, see ``lmforge.embeddings.contextual.embed_texts``
            and ``embed_words``); ``return_full_text`` and any ``lmforge.generation.GenerationConfig`` field
            (text-generation: ``max_new_tokens``, ``strategy``, ``num_beams``, ``top_p``, ...; given at build
            time or per call).
    """
    builders = {"fill-mask": FillMaskPipeline, "text-classification": TextClassificationPipeline,
                "token-classification": TokenClassificationPipeline, "question-answering": QuestionAnsweringPipeline,
                "multiple-choice": MultipleChoicePipeline, "feature-extraction": FeatureExtractionPipeline,
                "text-generation": TextGenerationPipeline}
    if task not in builders:
        raise LmforgeError(f"unknown pipeline {task!r}; choose one of {', '.join(PIPELINES)}")
    if compile and task == "text-generation":
        raise LmforgeError("compile=True: the text-generation pipeline's decoding loop runs uncompiled; leave "
                           "compile out")
    if compile and runtime != "torch":
        raise LmforgeError(f"compile=True and runtime={runtime!r} exclude each other: compile compiles the PyTorch "
                           "model, which ONNX Runtime replaces; give one")
    if precision not in PRECISIONS:
        raise LmforgeError(f"precision={precision!r} is not one of {', '.join(PRECISIONS)}")
    if precision != "fp32" and (task == "text-generation" or runtime != "torch"):
        raise LmforgeError(f"precision={precision!r} is PyTorch's autocast for the encoder pipelines; the "
                           "text-generation pipeline and runtime='onnx' run in fp32: leave it out")
    built = builders[task](model, device=device, batch_size=batch_size, runtime=runtime, **options)
    if precision != "fp32":
        from lmforge.training.precision import autocast_inference

        autocast_inference(built.model, precision)
    return _CompiledPipeline(built) if compile else built


class _CompiledPipeline:
    """A pipeline whose model is compiled in place; a failure of torch.compile at a call is an ``LmforgeError``
    naming the option. Every other attribute is the pipeline's."""

    def __init__(self, pipe: Any) -> None:
        from lmforge.utils.compiling import compile_in_place

        compile_in_place(pipe.model)
        self._pipe = pipe

    def __call__(self, inputs: Any, **kwargs: Any) -> Any:
        from lmforge.utils.compiling import compile_errors

        with compile_errors():
            return self._pipe(inputs, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pipe, name)


def _as_list(inputs: Any) -> tuple[list[Any], bool]:
    if isinstance(inputs, (str, dict)):
        return [inputs], True
    if isinstance(inputs, (list, tuple)):
        return list(inputs), False
    raise LmforgeError(f"expected a text, a dict or a list of them, got {type(inputs).__name__}")


def _check_top_k(top_k: Any) -> int | None:
    if top_k is not None and (type(top_k) is not int or top_k < 1):
        raise LmforgeError(f"top_k must be an integer >= 1 (or None for the best answer alone), got {top_k!r:.40}")
    return top_k


def _check_text(text: Any, what: str = "text") -> str:
    if not isinstance(text, str):
        raise LmforgeError(f"{what} must be a string, got {type(text).__name__}")
    return text


class _TaskPipeline:
    """A fine-tuned model folder: its model, task and tokenizer."""

    expected: tuple[str, ...] = ()
    ranks = False  # has several answers to rank (top_k)

    def __init__(self, model: str | Path, *, device: str = "cpu", batch_size: int = 32,
                 top_k: int | None = None, runtime: str = "torch") -> None:
        from lmforge.recipes.finetune import load_task_model

        self.top_k = _check_top_k(top_k)
        self.model, self.task, self.tokenizer = load_task_model(str(model), runtime)
        if self.task.config.task not in self.expected:
            raise LmforgeError(f"{model}: a model fine-tuned for {self.task.config.task!r}; this pipeline needs "
                               f"one fine-tuned for {' or '.join(self.expected)}")
        self.model.to(device).eval()
        self.batch_size = batch_size
        if top_k is not None and not self.ranks:
            raise LmforgeError(f"top_k: the {self.task.config.task!r} pipeline gives one answer per input; leave "
                               "top_k out")

    def _predict(self, examples: list[Any]) -> list[Any]:
        features = self.task.featurize(examples, self.tokenizer, training=False)
        return self.task.predict(self.model, examples, features, self.tokenizer, batch_size=self.batch_size)


class TextClassificationPipeline(_TaskPipeline):
    expected = ("sequence", "pair")
    ranks = True

    def __call__(self, inputs: str | dict | list) -> Any:
        from lmforge.data.readers import ClassificationExample

        items, single = _as_list(inputs)
        examples = []
        for i, item in enumerate(items):
            if isinstance(item, dict):
                unknown = set(item) - {"text", "text_pair"}
                if unknown or "text" not in item:
                    raise LmforgeError(f"input {i}: expected keys text (and text_pair), got {sorted(item)}")
                text, pair = _check_text(item["text"]), item.get("text_pair")
            else:
                text, pair = _check_text(item), None
            if self.task.pair and pair is None:
                raise LmforgeError(f"input {i}: this model classifies sentence pairs; pass {{'text', 'text_pair'}}")
            examples.append(ClassificationExample(text, pair, None, i + 1))
        predictions = self._predict(examples)
        if self.top_k is not None and self.task.regression:
            raise LmforgeError("top_k: this model predicts a number (regression), not classes; leave top_k out")
        if self.top_k is None:
            results: list[Any] = [{k: v for k, v in p.items() if k != "probabilities"} for p in predictions]
        else:
            results = [[{"label": label, "score": score} for label, score in
                        sorted(p["probabilities"].items(), key=lambda kv: -kv[1])[:self.top_k]] for p in predictions]
        return results[0] if single else results


def word_spans(tokenizer: Any, text: str) -> list[tuple[int, int]]:
    """Character spans of the words the tokenizer splits ``text`` into (whitespace and punctuation; a byte-level
    BPE's runs of spaces, which are words of its own with empty spans, are left out)."""
    _, offsets, words = tokenizer.encode_text(text)
    spans: dict[int, list[int]] = {}
    for (start, end), w in zip(offsets, words, strict=True):
        if start == end or text[start:end].isspace():
            continue
        span = spans.setdefault(w, [start, end])
        span[0], span[1] = min(span[0], start), max(span[1], end)
    return [(s, e) for _, (s, e) in sorted(spans.items())]


class TokenClassificationPipeline(_TaskPipeline):
    """Entities of raw text: the text is split into words, tagged, and tags are grouped into entities."""

    expected = ("token", "span")

    def __call__(self, inputs: str | list[str]) -> Any:
        from lmforge.data.readers import SpanExample, TaggedSentence
        from lmforge.data.schemes import tags_to_spans

        items, single = _as_list(inputs)
        texts = [_check_text(t) for t in items]
        spans = [word_spans(self.tokenizer, t) for t in texts]
        words = [[t[s:e] for s, e in sp] for t, sp in zip(texts, spans, strict=True)]
        results: list[list[dict[str, Any]]] = []
        if self.task.config.task == "token":
            preds = self._predict([TaggedSentence(w, None, i + 1) for i, w in enumerate(words)])
            for text, sp, pred in zip(texts, spans, preds, strict=True):
                entities = []
                for s, e, label in tags_to_spans(pred["tags"], self.task.scheme):
                    score = sum(pred["scores"][s:e]) / (e - s)
                    entities.append(self._entity(text, sp, s, e, label, score))
                results.append(entities)
        else:
            preds = self._predict([SpanExample(w, None, i + 1) for i, w in enumerate(words)])
            for text, sp, pred in zip(texts, spans, preds, strict=True):
                results.append([self._entity(text, sp, s, e, label, None) for s, e, label in pred])
        return results[0] if single else results

    @staticmethod
    def _entity(text: str, spans: list[tuple[int, int]], s: int, e: int, label: str,
                score: float | None) -> dict[str, Any]:
        start, end = spans[s][0], spans[e - 1][1]
        return {"entity_group": label, "start": start, "end": end, "word": text[start:end], "score": score}


class QuestionAnsweringPipeline(_TaskPipeline):
    """Answers as spans of the context, ranked as BERT's SQuAD code and ``lmforge evaluate`` rank them, by the sum of
    the start and end logits over all windows, so that the pipeline and ``evaluate`` give the same answer; each
    span's ``score`` is its probability within its window, ``p_start(i) * p_end(j)`` with each a softmax over the
    window's positions (what transformers' pipeline reports; the best over the windows holding the span)."""

    expected = ("qa",)
    ranks = True

    def __call__(self, inputs: dict | list[dict]) -> Any:
        from lmforge.data.readers import QAExample

        items, single = _as_list(inputs)
        examples = []
        for i, item in enumerate(items):
            if not isinstance(item, dict) or set(item) != {"question", "context"}:
                raise LmforgeError(f"input {i}: expected a dict with exactly the keys question and context")
            examples.append(QAExample(str(i), "", _check_text(item["question"], "question"),
                                      _check_text(item["context"], "context"), [], False))
        features = self.task.featurize(examples, self.tokenizer, training=False)
        results: list[Any] = []
        for prediction in self._answer(examples, features):
            if self.top_k is None:
                results.append(self._answer_dict(prediction))
            else:
                ranked = [e for e in prediction.get("n_best", [prediction]) if e.get("score") is not None]
                results.append([self._answer_dict(e) for e in ranked[:self.top_k]])
        return results[0] if single else results

    def _answer(self, examples: list[Any], features: list[Any]) -> list[dict[str, Any]]:
        """``decode_qa`` of the examples over the start and end logits (BERT's ranking), each span then given its
        window probability (a second decoding over log-softmaxed logits; see the class docstring)."""
        from lmforge.data.qa_features import decode_qa
        from lmforge.tasks.base import run_model

        n = len(features)
        logits: dict[str, list[Any]] = {k: [None] * n for k in ("start", "end", "log_start", "log_end")}
        collate = lambda fs: self.task.collate(fs, self.tokenizer.pad_id)  # noqa: E731
        for chunk, out in run_model(self.model, features, collate, self.batch_size,
                                    drop=("start_positions", "end_positions")):
            s, e = out.start_logits.float(), out.end_logits.float()  # (B, T): masked positions stay ~ -inf
            rows = {"start": s, "end": e, "log_start": s.log_softmax(-1), "log_end": e.log_softmax(-1)}
            rows = {k: v.cpu().numpy() for k, v in rows.items()}
            for j, i in enumerate(chunk):
                width = len(features[i]["input_ids"])
                for k, v in rows.items():
                    logits[k][i] = v[j, :width]
        c = self.task.config
        n_best = max(c.n_best, self.top_k or 1)
        options = dict(max_answer_length=c.max_answer_length, version_2=bool(c.version_2),
                       null_threshold=c.null_threshold)
        ranked = decode_qa(examples, features, logits["start"], logits["end"], n_best=n_best, **options)
        in_window = decode_qa(examples, features, logits["log_start"], logits["log_end"], n_best=4 * n_best,
                              **options)
        predictions = []
        for example in examples:
            prediction = ranked[example.id]
            log_p = {(x["start"], x["end"]): x["score"] for x in in_window[example.id]["n_best"]
                     if x["score"] is not None}
            for entry in (prediction, *prediction["n_best"]):
                entry["window_log_prob"] = log_p.get((entry["start"], entry["end"]))
            predictions.append(prediction)
        return predictions

    @staticmethod
    def _answer_dict(entry: dict[str, Any]) -> dict[str, Any]:
        score = entry.get("window_log_prob") if entry.get("score") is not None else None
        return {"answer": entry["text"], "start": entry["start"], "end": entry["end"],
                "score": None if score is None else math.exp(score)}


class MultipleChoicePipeline(_TaskPipeline):
    expected = ("choice",)
    ranks = True

    def __call__(self, inputs: dict | list[dict]) -> Any:
        from lmforge.data.readers import ChoiceExample

        items, single = _as_list(inputs)
        examples = []
        for i, item in enumerate(items):
            if not isinstance(item, dict) or set(item) != {"text", "choices"}:
                raise LmforgeError(f"input {i}: expected a dict with exactly the keys text and choices")
            choices = item["choices"]
            if not isinstance(choices, (list, tuple)) or len(choices) < 2:
                raise LmforgeError(f"input {i}: choices must be a list of two or more option texts")
            examples.append(ChoiceExample(_check_text(item["text"]),
                                          tuple(_check_text(c, "an option") for c in choices), None, i + 1))
        results: list[Any] = self._predict(examples)
        if self.top_k is not None:
            results = [[{"label": k, "choice": ex.choices[k], "score": p["probabilities"][k]}
                        for k in sorted(range(len(ex.choices)), key=lambda k: -p["probabilities"][k])[:self.top_k]]
                       for ex, p in zip(examples, results, strict=True)]
        return results[0] if single else results


class FillMaskPipeline:
    """Top-k fillers of each ``[MASK]`` from the masked-LM head of a pretrained encoder."""

    def __init__(self, model: str | Path, *, device: str = "cpu", batch_size: int = 32, top_k: int = 5,
                 runtime: str = "torch") -> None:
        from lmforge.persistence import load_pretrained

        loaded = load_pretrained(model, runtime=runtime)
        if not loaded.head or loaded.head.get("type") not in ("pretraining", "mlm", "span"):
            raise LmforgeError(f"{model}: the model has no masked-LM head (fill-mask needs one saved by `lmforge "
                               "pretrain` with an MLM objective, or a Hugging Face BertForPreTraining/MaskedLM "
                               "folder)")
        if loaded.tokenizer is None:
            raise LmforgeError(f"{model}: the model folder has no tokenizer (vocab.txt)")
        if _check_top_k(top_k) is None:
            raise LmforgeError("top_k must be an integer >= 1 for fill-mask, got None")
        self.model, self.tokenizer, self.top_k, self.batch_size = loaded.model.to(device).eval(), \
            loaded.tokenizer, top_k, batch_size
        self.device = device

    @torch.no_grad()
    def __call__(self, inputs: str | list[str]) -> Any:
        items, single = _as_list(inputs)
        texts = [_check_text(t) for t in items]
        tok, results = self.tokenizer, []
        limit = self.model.backbone.config.max_seq_len
        for start in range(0, len(texts), self.batch_size):
            chunk = texts[start:start + self.batch_size]
            batch = tok(chunk, padding=True, truncation=True, max_length=limit, return_tensors="pt")
            ids = batch["input_ids"]
            masked = ids == tok.mask_id
            for i, row in enumerate(masked):
                if not row.any():
                    raise LmforgeError(f"input {start + i} has no {tok.mask_token} token to fill: {chunk[i][:80]!r}")
            batch = {k: v.to(self.device) for k, v in batch.items()}
            out = self.model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"],
                             masked_positions=masked.to(self.device))
            probs = out.mlm_logits.float().softmax(-1).cpu()  # (N, V), masks in row-major order
            top = probs.topk(self.top_k, dim=-1)
            n = 0
            # a byte-level BPE's token is bytes ("ĠParis"): shown decoded (" Paris"), and the filled sentence is the
            # decoded ids, as transformers' fill-mask pipeline writes them
            spaced = bool(getattr(tok, "words_need_spaces", False))
            for i in range(len(chunk)):
                per_mask = []
                for _ in range(int(masked[i].sum())):
                    per_mask.append([{"token": _shown(tok, int(t), spaced), "token_id": int(t), "score": float(s)}
                                     for s, t in zip(top.values[n], top.indices[n], strict=True)])
                    n += 1
                if len(per_mask) == 1:  # one mask: the filled sentence too
                    real = ids[i][batch["attention_mask"][i].cpu().bool()]
                    for cand in per_mask[0]:
                        cand["sequence"] = (tok.decode(real.masked_fill(real == tok.mask_id, cand["token_id"]).tolist())
                                            if spaced else filled(chunk[i], tok.mask_token, cand["token"]))
                results.append(per_mask[0] if len(per_mask) == 1 else per_mask)
        return results[0] if single else results


def _shown(tokenizer: Any, token_id: int, decoded: bool) -> str:
    """A fill-mask candidate as shown: its vocabulary entry, or (byte-level BPE) its decoded text."""
    return tokenizer.decode([token_id]) if decoded else tokenizer.convert_ids_to_tokens([token_id])[0]


def filled(text: str, mask: str, token: str) -> str:
    """``text`` with its first ``mask`` replaced by the WordPiece ``token``. A ``##`` piece continues the word
    before the mask, so it is written without its marker and without the space before the mask:
    ``filled("Shares rose [MASK]", "[MASK]", "##e")`` -> ``"Shares rosee"``."""
    if token.startswith("##") and len(token) > 2:
        return re.sub(r"\s*" + re.escape(mask), lambda _: token[2:], text, count=1)
    return text.replace(mask, token, 1)


class FeatureExtractionPipeline:
    """Contextual embeddings of texts (``lmforge.embeddings.contextual.embed_texts``), or of their words with
    ``word_pooling="first"|"mean"`` (``embed_words``: per text ``{"words", "spans", "vectors"}``, ``vectors``
    (words, D'), ``spans`` the words' character offsets). ``pooling`` (default ``"mean"``) and ``word_pooling``
    exclude each other."""

    def __init__(self, model: str | Path, *, device: str = "cpu", batch_size: int = 32, layers: Any = (-1,),
                 combine: str = "mean", pooling: str | None = None, word_pooling: str | None = None,
                 runtime: str = "torch") -> None:
        from lmforge.embeddings.contextual import WORD_POOLINGS, parse_layers
        from lmforge.persistence import load_backbone

        if word_pooling is not None and pooling is not None:
            raise LmforgeError("pooling and word_pooling exclude each other (vectors per text or token vs. per "
                               "word); give one")
        if word_pooling is not None and word_pooling not in WORD_POOLINGS:
            raise LmforgeError(f"word_pooling={word_pooling!r} is not one of {', '.join(WORD_POOLINGS)}")
        loaded = load_backbone(model, runtime)
        if loaded.tokenizer is None:
            raise LmforgeError(f"{model}: the model folder has no tokenizer (vocab.txt)")
        self.model, self.tokenizer = loaded.model.to(device).eval(), loaded.tokenizer
        self.layers, self.combine, self.pooling = parse_layers(layers), combine, pooling or "mean"
        self.word_pooling, self.batch_size = word_pooling, batch_size

    def __call__(self, inputs: str | list[str]) -> Any:
        from lmforge.embeddings.contextual import embed_texts, embed_words

        items, single = _as_list(inputs)
        texts = [_check_text(t) for t in items]
        if self.word_pooling is not None:
            vectors = [{"words": w.words, "spans": w.spans, "vectors": w.vectors}
                       for w in embed_words(self.model, self.tokenizer, texts, layers=self.layers,
                                            combine=self.combine, word_pooling=self.word_pooling,
                                            batch_size=self.batch_size)]
        else:
            vectors = embed_texts(self.model, self.tokenizer, texts, layers=self.layers, combine=self.combine,
                                  pooling=self.pooling, batch_size=self.batch_size)
        return vectors[0] if single else vectors


class TextGenerationPipeline:
    """Continue prompts with a language model, or write targets with an encoder-decoder, and return text
    (``lmforge.generation.text``): per prompt a list of ``{"generated_text"}``, as Hugging Face's text-generation
    pipeline. Options are ``GenerationConfig`` fields (``max_new_tokens``, ``strategy``, ``num_beams``,
    ``num_return_sequences``, ``temperature``, ``top_k``, ``top_p``, ``seed``, ...) and ``return_full_text``
    (default True: the prompt, then its continuation), given at build time or per call."""

    def __init__(self, model: str | Path, *, device: str = "cpu", batch_size: int = 16, runtime: str = "torch",
                 **options: Any) -> None:
        from lmforge.generation.text import load_generator

        self.model, self.tokenizer, self.family = load_generator(model, runtime=runtime)
        self.model.to(device).eval()
        self.batch_size, self.options = batch_size, {"max_new_tokens": 30, **options}
        self._config(self.options)  # refuses a bad option now, not at the first call

    def _config(self, options: dict[str, Any]) -> tuple[Any, bool]:
        from lmforge.generation import GenerationConfig

        options = dict(options)
        full_text = options.pop("return_full_text", True)
        if not isinstance(full_text, bool):
            raise LmforgeError(f"return_full_text must be True or False, got {full_text!r}")
        tok = self.tokenizer
        config = GenerationConfig(**options).replace(
            eos_id=tok.sep_id, pad_id=tok.pad_id, bos_id=tok.cls_id if self.family.has_encoder_decoder else None)
        return config, full_text

    def __call__(self, inputs: str | list[str], **options: Any) -> Any:
        from lmforge.generation.text import encode_prompt, generate_batched, generated_text

        items, single = _as_list(inputs)
        texts = [_check_text(t, "prompt") for t in items]
        config, full_text = self._config({**self.options, **options})
        limit = self.model.config.max_seq_len
        prompts = [encode_prompt(self.tokenizer, t, self.family, f"input {i}", limit) for i, t in enumerate(texts)]
        results = generate_batched(self.model, prompts, config, self.batch_size)
        continues = not self.family.has_encoder_decoder
        out = [[{"generated_text": generated_text(self.tokenizer, text, ids, seq, continues=continues,
                                                  full_text=full_text)} for seq in result[0]]
               for text, ids, result in zip(texts, prompts, results, strict=True)]
        return out[0] if single else out

"""The HTTP app of ``lmforge serve``: a FastAPI app over one model folder, with micro-batched JSON endpoints.

Which endpoints a model serves follows from its folder:

=====================================================  =========================================================
model folder                                           endpoints
=====================================================  =========================================================
fine-tuned ``sequence`` / ``pair`` (``lmforge          ``/classify`` + ``/embed`` (its encoder)
finetune``)
fine-tuned ``token`` / ``span``                        ``/tag`` + ``/embed``
fine-tuned ``qa``                                      ``/answer`` + ``/embed``
a pretrained encoder with its masked-LM head           ``/fill-mask`` + ``/embed``
a plain encoder (lmforge, or a Hugging Face BERT)      ``/embed``
a decoder (GPT) or an encoder-decoder                  ``/generate``
=====================================================  =========================================================

Every server also answers ``/health``, ``/info`` (the model, its task and labels, the limits, the endpoints),
``/openapi.json`` and ``/docs`` (offline: ``lmforge.serve.docs``). The other endpoints answer 404 with a message
naming what this model serves.
The answers are those of ``lmforge.pipeline`` (and ``/embed`` those of ``lmforge embed``: the same
``embed_texts`` with the same layers, combine and pooling). Request limits and errors: ``lmforge.serve.schemas``.
Batching: ``lmforge.serve.batcher``. Weights are read only through ``lmforge.persistence`` (safetensors;
pickle files are refused).

FastAPI and uvicorn are optional dependencies (``pip install 'lmforge[serve]'``); ``create_app`` imports FastAPI.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import torch

from lmforge.errors import InputFileError, LmforgeError
from lmforge.models import Architecture, architecture, architectures_with
from lmforge.serve.batcher import MicroBatcher, ShuttingDown
from lmforge.serve.docs import add_docs, swagger_assets
from lmforge.serve.schemas import Limits

log = logging.getLogger("lmforge")

TASK_ENDPOINTS = ("/fill-mask", "/classify", "/tag", "/answer", "/embed", "/generate")
ENDPOINT_OF_TASK = {"sequence": "/classify", "pair": "/classify", "token": "/tag", "span": "/tag", "qa": "/answer"}
MLM_HEADS = ("pretraining", "mlm", "span")


class ApiError(Exception):
    """An answer other than 200: ``status`` and a message for the ``{"error": ...}`` body."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


# ---------------------------------------------------------------------------------------------- the model
class ServedModel:
    """One model folder loaded for serving: what it serves, how to check a request, how to run a batch.

    The ``run_*`` methods take a batch of inputs (from several requests) and return one result per input; they run
    in the batchers' executor thread, one at a time. The ``check_*`` methods run on the event loop: they count
    tokens, raise ``ApiError`` for inputs over the limits and return warnings for inputs the model will cut.

    Args:
        model_dir: a model folder (see the module docstring).
        limits: the request limits.
        max_batch: inputs per forward pass.
        device: where the model runs.
        compile: compile the encoder's forward (task, /fill-mask and /embed endpoints) with torch.compile, in place,
            and compile it now with a warm-up pass (a backend that cannot work fails here, before serving);
            /generate's decoding loop runs uncompiled.
        runtime: ``"torch"``, or ``"onnx"``: the encoder runs in ONNX Runtime (``lmforge.persistence.onnx``).
    """

    def __init__(self, model_dir: str | Path, limits: Limits, *, max_batch: int = 32, device: str = "cpu",
                 compile: bool = False, runtime: str = "torch", precision: str = "fp32") -> None:
        from lmforge.persistence import CONFIG_NAME, read_config

        self.dir = Path(model_dir)
        self.limits, self.max_batch, self.device, self.runtime = limits, max_batch, device, runtime
        raw = read_config(self.dir)
        self.task = None
        self.pipeline: Any = None
        self.backbone: torch.nn.Module | None = None
        head = raw.get("head") if raw.get("format") == "lmforge" else None
        if head and "task" in head:
            self._load_finetuned(head)
        elif (head or {}).get("type") in MLM_HEADS or raw.get("model_type") == "bert" and _hf_has_mlm(self.dir):
            self._load_masked_lm()
        else:
            self._load_plain()
        if self.tokenizer is None:
            raise InputFileError(f"{self.dir}: the model folder has no tokenizer (vocab.txt); save the model with "
                                 f"its tokenizer ({CONFIG_NAME} alone is not enough to serve it)")
        self.precision = "fp32"
        if precision != "fp32" and self.backbone is not None:  # /generate's decoding loop keeps fp32
            from lmforge.training.precision import autocast_forward, autocast_inference

            choice = autocast_inference(self.model, precision)  # resolved once ("auto" measures once)
            if choice.precision == "bf16" and self.backbone is not self.model:
                autocast_forward(self.backbone)  # /embed calls the encoder directly
            self.precision = choice.precision
            log.info("--precision %s: %s (%s)", precision, choice.precision, choice.reason)
        self.n_hidden_states = self._count_hidden_states() if self.backbone is not None else 0
        self._sample_requests = itertools.count()  # makes every sampling request its own batch key
        self.compiled = compile and self._compile()

    def _compile(self) -> bool:
        """``--compile``: the encoder (and the task model around it) compiled in place, then warmed up."""
        from lmforge.utils.compiling import compile_errors, compile_in_place

        if self.backbone is None:
            log.warning("--compile: %s serves /generate only, whose decoding loop runs uncompiled", self.dir.name)
            return False
        for module in {id(m): m for m in (self.model, self.backbone)}.values():
            compile_in_place(module)
        with compile_errors():
            self._count_hidden_states()  # compiles the encoder's forward now, not at the first request
        log.info("--compile: the encoder is compiled (the first batches of each new shape compile again)")
        return True

    # ------------------------------------------------------------------------------------------ loading
    def _load_finetuned(self, spec: dict[str, Any]) -> None:
        from lmforge.pipelines import (
            QuestionAnsweringPipeline,
            TextClassificationPipeline,
            TokenClassificationPipeline,
        )

        name = (spec.get("task") or {}).get("task", "sequence")  # as lmforge.tasks.task_from_head_spec
        if name not in ENDPOINT_OF_TASK:
            raise LmforgeError(f"{self.dir}: a model fine-tuned for {name!r}, which lmforge serve has no endpoint for "
                               f"yet (it serves {', '.join(ENDPOINT_OF_TASK)}); use `lmforge predict` or the "
                               "Python pipeline (lmforge.pipeline('multiple-choice', DIR))")
        builder = {"/classify": TextClassificationPipeline, "/tag": TokenClassificationPipeline,
                   "/answer": QuestionAnsweringPipeline}[ENDPOINT_OF_TASK.get(name, "/classify")]
        self.pipeline = builder(self.dir, device=self.device, batch_size=self.max_batch, runtime=self.runtime)
        self.task = self.pipeline.task
        self.model, self.tokenizer = self.pipeline.model, self.pipeline.tokenizer
        self.backbone = self.model.backbone
        self.config = self.backbone.config
        self.head_type = spec.get("type")
        self.endpoints = [ENDPOINT_OF_TASK[self.task.config.task], "/embed"]

    def _load_masked_lm(self) -> None:
        from lmforge.pipelines import FillMaskPipeline

        self.pipeline = FillMaskPipeline(self.dir, device=self.device, batch_size=self.max_batch,
                                         runtime=self.runtime)
        self.model, self.tokenizer = self.pipeline.model, self.pipeline.tokenizer
        self.backbone = self.model.backbone
        self.config = self.backbone.config
        self.head_type = (self.model.head.head_config or {}).get("type")
        self.endpoints = ["/fill-mask", "/embed"]

    def _load_plain(self) -> None:
        from lmforge.persistence import load_pretrained

        loaded = load_pretrained(self.dir, with_head=False, runtime=self.runtime)
        self.model, self.tokenizer, self.config, self.head_type = loaded.model.to(self.device).eval(), \
            loaded.tokenizer, loaded.config, None
        if self.family.encodes_text and not (self.family.generates and self.family.left_context_only):
            self.backbone = self.model  # a left-to-right LM (GPT, AWD-LSTM) is served as the generator it is
            self.endpoints = ["/embed"]
        elif self.family.generates:
            self.endpoints = ["/generate"]
        else:
            served = ", ".join(architectures_with("encodes_text") + architectures_with("generates"))
            raise LmforgeError(f"{self.dir}: a {loaded.config.arch!r} model; lmforge serve serves text encoders "
                               f"(/embed) and text generators (/generate): {served}")

    def _count_hidden_states(self) -> int:
        assert self.backbone is not None
        enc = self.tokenizer(["a"], return_tensors="pt")
        with torch.no_grad():
            out = self.backbone(enc["input_ids"].to(self.device), attention_mask=enc["attention_mask"].to(self.device),
                                output_hidden_states=True)
        return len(out.hidden_states)

    # ------------------------------------------------------------------------------------------ description
    @property
    def family(self) -> Architecture:
        """The model family's record: what it can do decides the endpoints and how prompts are read."""
        return architecture(self.config.arch)

    def window(self, endpoint: str) -> int:
        """Tokens per input the model reads at ``endpoint``: for the task endpoint of a fine-tuned model its
        fine-tuned ``max_length``, else the model's ``max_seq_len`` (/embed reads whole texts up to that)."""
        if self.task is not None and endpoint in ("/classify", "/tag"):
            return min(self.task.config.max_length, self.config.max_seq_len)
        return self.config.max_seq_len

    def describe(self) -> str:
        if self.task is not None:
            return f"a model fine-tuned for {self.task.config.task!r}"
        if "/fill-mask" in self.endpoints:
            return "a pretrained encoder with a masked-LM head"
        if self.family.generates and self.family.encodes_text:  # a GPT, a biLM or BART: /generate and /embed
            kind = "encoder-decoder" if self.family.has_encoder_decoder else "language model"
            return f"a {self.config.arch} {kind} (text generation and embeddings)"
        if self.family.encodes_text:
            return "an encoder without a task head"
        return f"a {self.config.arch} (text generation)"

    def info(self) -> dict[str, Any]:
        return {"model": self.dir.name, "arch": self.config.arch, "head": self.head_type,
                "task": self.task.config.task if self.task is not None else None,
                "labels": list(getattr(self.task, "labels", []) or []), "endpoints": list(self.endpoints),
                "max_length": self.limits.max_length,
                "model_window": {path: self.window(path) for path in self.endpoints}}

    # ------------------------------------------------------------------------------------------ checks
    def _count(self, text: str) -> int:
        return len(self.tokenizer.encode_ids(text))

    def _check_length(self, where: str, n: int, specials: bool = True) -> None:
        if n > self.limits.max_length:
            counted = " ([CLS]/[SEP] included)" if specials else ""
            raise ApiError(413, f"{where}: {n} tokens{counted}; at most {self.limits.max_length} are accepted "
                                "(server option --max-length)")

    def _cut_note(self, endpoint: str) -> str:
        if endpoint != "/classify" or self.task is None or self.task.config.task != "sequence":
            return "truncated"
        c = self.task.config
        return {"truncate": "truncated", "head-tail": "cut to its head and tail",
                "chunks": f"split into windows (at most {c.max_chunks}), whose logits are averaged"}[c.long_text]

    def check_texts(self, endpoint: str, texts: Sequence[str], pairs: Sequence[str] | None = None) -> list[str]:
        """Raise ApiError for texts over ``max_length`` tokens; warnings for texts over the model's window."""
        warnings = []
        window = self.window(endpoint)
        for i, text in enumerate(texts):
            n = self._count(text) + 2
            if pairs is not None:
                n += self._count(pairs[i]) + 1
            self._check_length(f"texts[{i}]" + (f" + text_pairs[{i}]" if pairs is not None else ""), n)
            if n > window:
                warnings.append(f"texts[{i}]: {n} tokens, more than the model's window of {window}: "
                                f"{self._cut_note(endpoint)}")
        return warnings

    def check_classify(self, texts: list[str], pairs: list[str] | None) -> list[str]:
        assert self.task is not None
        if self.task.pair and pairs is None:
            raise ApiError(422, "this model classifies sentence pairs: send text_pairs, one per text")
        if not self.task.pair and pairs is not None:
            raise ApiError(422, "this model classifies single texts; drop text_pairs")
        if pairs is not None and len(pairs) != len(texts):
            raise ApiError(422, f"text_pairs has {len(pairs)} items but texts has {len(texts)}; send one per text")
        return self.check_texts("/classify", texts, pairs)

    def check_fill_mask(self, texts: list[str], top_k: int) -> list[str]:
        if top_k > self.config.vocab_size:
            raise ApiError(422, f"top_k={top_k} exceeds the vocabulary of {self.config.vocab_size} tokens")
        mask = self.tokenizer.mask_token
        for i, text in enumerate(texts):
            if mask not in text:
                raise ApiError(422, f"texts[{i}] has no {mask} token to fill")
        return self.check_texts("/fill-mask", texts)

    def check_answer(self, question: str, context: str) -> list[str]:
        assert self.task is not None
        n = self._count(question)
        self._check_length("question", n + 2)
        limit = self.task.config.max_query_length
        # The context is never cut: it is read in overlapping windows (doc_stride); only --max-chars bounds it.
        return [f"question: {n} tokens, more than the model's max_query_length of {limit}: truncated"] \
            if n > limit else []

    def check_layers(self, layers: Sequence[int]) -> None:
        n = self.n_hidden_states
        bad = [i for i in layers if not -n <= i < n]
        if bad:
            raise ApiError(422, f"layers {bad} do not exist: this model has {n - 1} layers plus the embedding "
                                f"output, so valid indices are {-n}..{n - 1}")

    # ------------------------------------------------------------------------------------------ batches
    def run_task(self, key: Hashable, items: list[Any]) -> list[Any]:
        """The task pipeline (classify, tag, answer) over a batch of inputs."""
        return self.pipeline(items)

    def run_fill_mask(self, top_k: Hashable, texts: list[str]) -> list[Any]:
        self.pipeline.top_k = top_k  # safe: batches run one at a time in one thread
        return self.pipeline(texts)

    def run_embed(self, key: Hashable, texts: list[str]) -> list[Any]:
        """``embed_texts`` (or ``embed_words`` with word pooling), as ``lmforge embed`` calls it."""
        from lmforge.embeddings.contextual import embed_texts, embed_words

        layers, combine, pooling, word_pooling = key  # type: ignore[misc]
        assert self.backbone is not None
        if word_pooling is not None:
            return [{"vectors": w.vectors.tolist(), "words": w.words, "spans": [list(s) for s in w.spans or []]}
                    for w in embed_words(self.backbone, self.tokenizer, texts, layers=list(layers), combine=combine,
                                         word_pooling=word_pooling, batch_size=self.max_batch)]
        vectors = embed_texts(self.backbone, self.tokenizer, texts, layers=list(layers), combine=combine,
                              pooling=pooling, batch_size=self.max_batch)
        return [v.tolist() for v in vectors]

    # ------------------------------------------------------------------------------------------ generation
    def prompt_ids(self, prompt: str) -> list[int]:
        """Token ids of a prompt: for a decoder, [SEP] (the end-of-document id its training stream puts before
        each document) then the pieces; for an encoder-decoder, the source pieces alone (as ``train-seq2seq``
        encodes sources), cut to the model's ``max_seq_len``."""
        ids = self.tokenizer.encode_ids(prompt)
        if self.family.is_causal_lm:
            return [self.tokenizer.sep_id, *ids]
        return ids[:self.config.max_seq_len] or [self.tokenizer.unk_id]

    def check_generate(self, body: Any) -> tuple[Hashable, list[str]]:
        """Validate the options and prompts of a /generate request; return (batch key, warnings).

        The key holds every option, and the number of new tokens is capped per request (never per batch), so a
        batched request generates exactly what it would alone. Sampling requests never share a batch: their
        random draws would depend on their batch mates.
        """
        from lmforge.generation import GenerationConfig

        warnings: list[str] = []
        lengths = []
        if body.texts is None:
            warnings.append("prompts is deprecated: send the same list as texts (prompts stops working in the next "
                            "release)")
        for i, prompt in enumerate(body.inputs):
            n = len(self.tokenizer.encode_ids(prompt))
            self._check_length(f"texts[{i}]", n, specials=False)
            if not self.family.is_causal_lm and n > self.config.max_seq_len:  # prompt_ids cuts sources
                warnings.append(f"texts[{i}]: {n} tokens, more than the model's max_seq_len of "
                                f"{self.config.max_seq_len}: truncated")
            lengths.append(len(self.prompt_ids(prompt)))
        new_tokens = body.max_new_tokens
        if self.family.is_causal_lm:  # prompt and new tokens share one context window
            room = self.config.max_seq_len - max(lengths) + 1  # the last new token is never fed back
            if room < 1:
                raise ApiError(413, f"texts[{lengths.index(max(lengths))}]: {max(lengths)} tokens (with the "
                                    f"start token) fill the model's context of {self.config.max_seq_len}; "
                                    "shorten it")
            if new_tokens > room:
                warnings.append(f"max_new_tokens={new_tokens} reduced to {room}: the longest prompt has "
                                f"{max(lengths)} tokens and the model reads {self.config.max_seq_len} positions")
                new_tokens = room
        elif self.family.position_limited and new_tokens > self.config.max_seq_len:  # the decoder's own positions
            warnings.append(f"max_new_tokens={new_tokens} reduced to {self.config.max_seq_len}: the decoder reads "
                            f"at most max_seq_len={self.config.max_seq_len} positions")
            new_tokens = self.config.max_seq_len
        options = body.model_dump(exclude={"texts", "prompts", "return_full_text"})
        options["max_new_tokens"] = new_tokens
        tok = self.tokenizer
        options.update(eos_id=tok.sep_id, bos_id=tok.cls_id, pad_id=tok.pad_id)
        try:
            GenerationConfig(**options)  # validates every option with a message naming it
        except LmforgeError as err:
            raise ApiError(422, str(err)) from None
        key = tuple(sorted(options.items())) + (("return_full_text", body.return_full_text),)
        if options["strategy"] == "sample":
            key += (("request", next(self._sample_requests)),)
        return key, warnings

    def run_generate(self, key: Hashable, prompts: list[str]) -> list[Any]:
        from lmforge.generation import GenerationConfig, generate
        from lmforge.generation.text import generated_text

        options = {k: v for k, v in key if k not in ("request", "return_full_text")}  # type: ignore[union-attr]
        full_text = dict(key)["return_full_text"]  # type: ignore[arg-type]
        config = GenerationConfig(**options)
        rows = [self.prompt_ids(p) for p in prompts]
        ids = torch.full((len(rows), max(map(len, rows))), self.tokenizer.pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for r, row in enumerate(rows):
            ids[r, :len(row)] = torch.tensor(row)
            mask[r, :len(row)] = 1
        out = generate(self.model, ids.to(self.device), mask.to(self.device), config=config)
        continues = not self.family.has_encoder_decoder
        return [{"texts": [generated_text(self.tokenizer, prompt, row, s, continues=continues, full_text=full_text)
                           for s in hyps],
                 "token_ids": [list(s) for s in hyps], "scores": [float(x) for x in scores]}
                for prompt, row, hyps, scores in zip(prompts, rows, out.sequences, out.scores, strict=True)]


def _hf_has_mlm(directory: Path) -> bool:
    """Whether a Hugging Face BERT folder holds masked-LM head weights (read from the safetensors header only)."""
    from safetensors import safe_open

    from lmforge.persistence import WEIGHTS_NAME

    path = directory / WEIGHTS_NAME
    if not path.is_file():
        return False  # load_pretrained then names the problem (and any pickle file it refuses)
    try:
        with safe_open(str(path), framework="pt") as f:
            return any(k.startswith("cls.predictions.") for k in f.keys())
    except Exception:  # a corrupt file: load_pretrained reports it
        return False


# ---------------------------------------------------------------------------------------------- the app
def create_app(model_dir: str | Path, *, max_batch: int = 32, max_length: int = 512, batching: bool = True,
               max_wait_ms: float = 3.0, max_texts: int = 64, max_chars: int = 20_000, max_new_tokens: int = 256,
               device: str = "cpu", compile: bool = False, runtime: str = "torch", precision: str = "fp32"):
    """A FastAPI app serving the model folder ``model_dir`` (loaded now: a bad folder raises here).

    Args:
        max_batch: inputs (texts) per forward pass; concurrent requests are batched up to this.
        max_length: tokens per text accepted, [CLS]/[SEP] included (413 beyond).
        batching: False runs every request on its own (one forward pass per request).
        max_wait_ms: how long a waiting request may wait for others to share its batch.
        max_texts: texts (prompts) per request.
        max_chars: characters per text.
        max_new_tokens: the largest ``max_new_tokens`` a /generate request may ask for.
        compile: torch.compile the encoder (``ServedModel``'s ``compile``).
        runtime: ``"torch"`` or ``"onnx"`` (``ServedModel``'s ``runtime``).
        precision: ``"fp32"``, ``"bf16"`` or ``"auto"``: the encoder (and its head) under bf16 autocast, outputs in
            fp32 (``lmforge.training.precision.autocast_inference``).

    Returns:
        a ``fastapi.FastAPI``; ``app.state.model`` is the ``ServedModel``, ``app.state.batchers`` the batchers.

    Raises:
        LmforgeError: the folder cannot be served (no tokenizer, pickle weights only, unknown layout...).
    """
    from fastapi import FastAPI

    from lmforge import __version__
    from lmforge.serve import schemas as sc

    if max_batch < 1:
        raise LmforgeError(f"--max-batch must be >= 1, got {max_batch}")
    if max_wait_ms < 0:
        raise LmforgeError(f"--max-wait-ms must be >= 0, got {max_wait_ms}")
    try:
        limits = Limits(max_texts=max_texts, max_chars=max_chars, max_length=max_length,
                        max_new_tokens=max_new_tokens)
    except ValueError as err:
        raise LmforgeError(str(err)) from None
    from lmforge.utils.compiling import check_inference_options

    check_inference_options(compile=compile, runtime=runtime, precision=precision)
    served = ServedModel(model_dir, limits, max_batch=max_batch, device=device, compile=compile, runtime=runtime,
                         precision=precision)
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lmforge-model")
    runs: dict[str, Callable[[Hashable, list[Any]], Sequence[Any]]] = {
        "/classify": served.run_task, "/tag": served.run_task, "/answer": served.run_task,
        "/fill-mask": served.run_fill_mask, "/embed": served.run_embed,
        "/generate": served.run_generate}
    batchers = {path: MicroBatcher(runs[path], executor, max_batch=max_batch, max_wait=max_wait_ms / 1000,
                                   enabled=batching, name=path) for path in served.endpoints}

    @asynccontextmanager
    async def lifespan(app):
        yield
        # uvicorn has already waited for the requests in flight; this serves anything still queued.
        for batcher in batchers.values():
            await batcher.close()
        executor.shutdown(wait=True)

    # /docs is served by lmforge.serve.docs (no CDN: it works offline); ReDoc, a CDN page too, is not served
    app = FastAPI(title="lmforge serve", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None,
                  description=f"Serving {served.dir.name}: {served.describe()}. Endpoints: "
                              f"{', '.join(served.endpoints)}. Errors answer {{\"error\": message}}.")
    app.state.model, app.state.batchers, app.state.limits = served, batchers, limits
    app.add_middleware(BodySizeLimit, max_bytes=limits.max_body_bytes)
    schemas = sc.build_schemas(limits)
    errors = {code: {"model": sc.ErrorBody} for code in (400, 404, 413, 415, 422, 500, 503)}
    fields_of: dict[str, list[str]] = {}

    _add_error_handlers(app, served, fields_of)
    add_docs(app, swagger_assets())

    async def run(path: str, items: list[Any], key: Hashable = None) -> list[Any]:
        try:
            return await batchers[path].submit(items, key)
        except ShuttingDown:
            raise ApiError(503, "the server is shutting down; retry on another instance") from None
        except LmforgeError as err:
            raise ApiError(422, str(err)) from None
        except Exception as err:
            log.exception("%s failed", path)
            raise ApiError(500, f"internal error while running the model ({type(err).__name__}: {err})") from None

    def post(path: str, request_model: Any, response_model: Any, handler: Callable) -> None:
        """Register ``handler(body)`` at ``path`` with the request model built for this server's limits."""
        async def endpoint(body):
            return await handler(body)

        endpoint.__annotations__ = {"body": request_model}  # the models are built at run time (limits)
        endpoint.__name__ = path.strip("/").replace("-", "_")
        fields_of[path] = list(request_model.model_fields)
        app.add_api_route(path, endpoint, methods=["POST"], response_model=response_model,
                          response_model_exclude_none=True, responses=errors, summary=_SUMMARIES[path])

    # ------------------------------------------------------------------------------------------ endpoints
    @app.get("/health", response_model=sc.Health, summary="liveness: {\"status\": \"ok\"}")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/info", response_model=sc.Info, summary="the model, its task and labels, the limits, the endpoints")
    async def info() -> dict[str, Any]:
        return {**served.info(), "max_batch": max_batch, "max_texts": limits.max_texts,
                "max_chars": limits.max_chars, "batching": batching, "max_wait_ms": max_wait_ms,
                "batch_stats": {path: {"batches": b.batches, "items": b.batched_items, "in_flight": b.in_flight}
                                for path, b in batchers.items()}}

    async def classify(body) -> dict[str, Any]:
        warnings = served.check_classify(body.texts, body.text_pairs)
        items = body.texts if body.text_pairs is None else \
            [{"text": t, "text_pair": p} for t, p in zip(body.texts, body.text_pairs, strict=True)]
        return {"results": await run("/classify", items), "warnings": warnings}

    async def tag(body) -> dict[str, Any]:
        warnings = served.check_texts("/tag", body.texts)
        return {"results": await run("/tag", body.texts), "warnings": warnings}

    async def answer(body) -> dict[str, Any]:
        warnings = served.check_answer(body.question, body.context)
        (result,) = await run("/answer", [{"question": body.question, "context": body.context}])
        return {**result, "warnings": warnings}

    async def fill_mask(body) -> dict[str, Any]:
        warnings = served.check_fill_mask(body.texts, body.top_k)
        return {"results": await run("/fill-mask", body.texts, body.top_k), "warnings": warnings}

    async def embed(body) -> dict[str, Any]:
        if body.pooling is not None and body.word_pooling is not None:
            raise ApiError(422, "pooling and word_pooling exclude each other (vectors per text or token vs. per "
                                "word); give one")
        served.check_layers(body.layers)
        warnings = served.check_texts("/embed", body.texts)
        key = (tuple(body.layers), body.combine, body.pooling or "mean", body.word_pooling)
        results = await run("/embed", body.texts, key)
        if body.word_pooling is None:
            return {"embeddings": results, "warnings": warnings}
        return {"embeddings": [r["vectors"] for r in results], "words": [r["words"] for r in results],
                "spans": [r["spans"] for r in results], "warnings": warnings}

    async def generate(body) -> dict[str, Any]:
        key, warnings = served.check_generate(body)
        return {"results": await run("/generate", body.inputs, key), "warnings": warnings}

    handlers = {"/classify": (schemas.Classify, sc.ClassifyResponse, classify),
                "/tag": (schemas.Tag, sc.TagResponse, tag),
                "/answer": (schemas.Answer, sc.Answer, answer),
                "/fill-mask": (schemas.FillMask, sc.FillMaskResponse, fill_mask),
                "/embed": (schemas.Embed, sc.EmbedResponse, embed),
                "/generate": (schemas.Generate, sc.GenerateResponse, generate)}
    for path in served.endpoints:
        post(path, *handlers[path])
    return app


class BodySizeLimit:
    """ASGI middleware: a request body over ``max_bytes`` gets 413, and no more than the limit (plus the message
    that crossed it) is ever read from it.

    A Content-Length over the limit is answered before anything is read. Every body, chunked ones included (they
    have no Content-Length), is also counted as it arrives: the ``http.request`` message that takes the count over
    the limit is dropped, and ``receive`` raises an ``HTTPException(413)`` instead of returning it, now and on every
    later call, so the endpoint never gets a body. FastAPI re-raises an HTTPException raised while it reads a body
    (any other exception would turn into a 400), and the app's handler answers it with ``{"error": message}``; one
    that reaches this middleware is answered here, unless a response has started. Exactly one response goes out.

    The 413 goes out as soon as the limit is crossed; what the client still sends is left to the server, which
    reads and discards it (uvicorn, h11 and httptools alike, keeps nothing of a request whose response is complete),
    so memory stays flat and the connection stays usable. The 413 deliberately has no ``Connection: close``: closing
    a socket with unread data resets the connection, and a client still sending its body then often loses the
    answer (in a trial, 6 of 20 chunked 64 MiB uploads by httpx to uvicorn over loopback got no response).
    """

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            await _too_large_response(self.too_large(int(length)))(scope, receive, send)
            return
        request = _CountedRequest(self, receive, send)
        try:
            await self.app(scope, request.receive, request.send)
        except Exception as exc:
            if exc is not request.error or request.response_started:
                raise
            await _too_large_response(request.error.detail)(scope, receive, send)

    def too_large(self, size: int, *, complete: bool = True) -> str:
        """The 413 message: the body's size (``complete=False``: the bytes read before stopping), the limit, and
        the server options it follows from."""
        has = f"{size:,}" if complete else f"at least {size:,}"
        return (f"the body has {has} bytes; at most {self.max_bytes:,} are accepted (it follows from --max-texts "
                "and --max-chars)")


class _CountedRequest:
    """The ``receive`` and ``send`` that one request's app gets from ``BodySizeLimit``: ``receive`` counts the
    body's bytes and raises ``error`` past the limit; ``send`` notes whether a response has started."""

    def __init__(self, limit: BodySizeLimit, receive: Callable, send: Callable) -> None:
        self.limit, self._receive, self._send = limit, receive, send
        self.received = 0
        self.error: Any = None  # the HTTPException(413) raised, once the limit is crossed
        self.response_started = False

    async def receive(self) -> dict[str, Any]:
        if self.error is not None:  # asked again after the 413: read nothing more
            raise self.error
        message = await self._receive()
        if message["type"] == "http.request":
            self.received += len(message.get("body", b""))
            if self.received > self.limit.max_bytes:
                from starlette.exceptions import HTTPException

                complete = not message.get("more_body", False)
                self.error = HTTPException(413, self.limit.too_large(self.received, complete=complete))
                raise self.error
        return message

    async def send(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.response_started = True
        await self._send(message)


def _too_large_response(message: str) -> Any:
    """413 ``{"error": message}``, the body every error of the app has."""
    from fastapi.responses import JSONResponse

    return JSONResponse({"error": message}, status_code=413)


def _add_error_handlers(app: Any, served: ServedModel, fields_of: dict[str, list[str]]) -> None:
    """Answer every error as ``{"error": message}``: ApiError, invalid bodies (``describe_validation_errors``),
    unknown endpoints (404 naming what this model serves) and wrong methods (405)."""
    from fastapi import Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from starlette.exceptions import HTTPException as StarletteHTTPException

    from lmforge.serve.schemas import describe_validation_errors

    def error(status: int, message: str) -> JSONResponse:
        return JSONResponse({"error": message}, status_code=status)

    @app.exception_handler(ApiError)
    async def on_api_error(request: Request, exc: ApiError) -> JSONResponse:
        return error(exc.status, exc.message)

    @app.exception_handler(RequestValidationError)
    async def on_invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        status, message = describe_validation_errors(list(exc.errors()), fields=fields_of.get(request.url.path, []),
                                                     content_type=request.headers.get("content-type", ""))
        return error(status, message)

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        path = request.url.path
        if exc.status_code == 404:
            what = (f"{path} is not served by this model: {served.dir.name} is {served.describe()}"
                    if path in TASK_ENDPOINTS else f"no endpoint {path}")
            answered = ", ".join(served.endpoints + ["/health", "/info"])
            return error(404, f"{what}; this server answers {answered} (see /info, /docs)")
        if exc.status_code == 405:
            return error(405, f"{request.method} is not allowed on {path}; "
                              f"use {'GET' if path in ('/health', '/info') else 'POST'}")
        return error(exc.status_code, str(exc.detail))


_SUMMARIES = {
    "/classify": "labels (and scores) of texts, or of text pairs, from a fine-tuned classifier",
    "/tag": "entities with character offsets, from a fine-tuned tagger",
    "/answer": "the answer span of a question in a context, from a fine-tuned QA model",
    "/fill-mask": "the top-k fillers of each [MASK], from a masked-LM head",
    "/embed": "contextual embeddings (as `lmforge embed`): layers, combine, pooling or word_pooling",
    "/generate": "continuations of prompts (decoder) or outputs for inputs (encoder-decoder)",
}

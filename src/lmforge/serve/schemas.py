"""Request and response bodies of ``lmforge serve`` (pydantic), and clear messages for invalid requests.

Every request model forbids unknown fields and is strict about types (``"3"`` is not an integer, ``1`` is not a
text). The size limits come from the server's options, so the models are built per server by ``build_schemas``
and show the limits in the OpenAPI schema (``/openapi.json``, ``/docs``).

Limits and what breaking them answers (the body is always ``{"error": "message"}``):

- not JSON, or an empty body: 400; a body sent without ``Content-Type: application/json``: 415;
- a wrong type, an unknown field, a missing field, an empty list, a value out of range: 422;
- more than ``max_texts`` texts (prompts) in one request, a text longer than ``max_chars`` characters, or longer
  than ``max_length`` tokens ([CLS] and [SEP] included), a body larger than these allow (``max_body_bytes``):
  413, naming the limit and the server option that sets it.

The body size is checked on the bytes received, whatever the transfer encoding: a Content-Length over the limit is
refused unread, and a body without one (chunked) is refused as soon as the bytes received pass the limit, without
the excess ever being held. The other limits are checked on the parsed body, so they hold however it was sent.

Texts within ``max_length`` but longer than the model's own window (the ``max_length`` it was fine-tuned with,
or its ``max_seq_len``) are processed as the library processes them everywhere else (truncated, or cut to head
and tail or split into windows as the model was fine-tuned), and the answer's ``warnings`` list names each one.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from lmforge.embeddings.contextual import COMBINES, POOLINGS, WORD_POOLINGS


@dataclass(frozen=True)
class Limits:
    """What one request may hold; set by ``lmforge serve`` options.

    Attributes:
        max_texts: texts (or prompts) per request (``--max-texts``).
        max_chars: characters per text (``--max-chars``).
        max_length: tokens per text, [CLS] and [SEP] included (``--max-length``).
        max_top_k: the largest ``top_k`` of /fill-mask.
        max_new_tokens: the largest ``max_new_tokens`` of /generate (``--max-new-tokens``).
        max_layers: the most layer indices /embed combines.
    """

    max_texts: int = 64
    max_chars: int = 20_000
    max_length: int = 512
    max_top_k: int = 50
    max_new_tokens: int = 256
    max_layers: int = 64

    @property
    def max_body_bytes(self) -> int:
        """The largest request body: texts and text pairs at their limits, 12 bytes per character (an astral
        character escaped as a surrogate pair, ``\\ud83d\\ude00``, as ``json.dumps`` does by default), and room for
        the other fields. Enforced on the bytes received, chunked bodies included (``app.BodySizeLimit``)."""
        return 2 * self.max_texts * self.max_chars * 12 + 65_536

    def __post_init__(self) -> None:
        bad = [f"{name}={value}" for name, value in vars(self).items() if not isinstance(value, int) or value < 1]
        if bad:
            raise ValueError(f"serving limits must be integers >= 1: {', '.join(bad)}")


class _Strict(BaseModel):
    """Request bodies: unknown fields and loose types are errors."""

    model_config = ConfigDict(extra="forbid", strict=True)


class _Response(BaseModel):
    """Response bodies (built by the server; documented in the OpenAPI schema)."""


# ---------------------------------------------------------------------------------------------- responses
class ErrorBody(_Response):
    error: str = Field(description="what was wrong and how to fix it")


class Health(_Response):
    status: Literal["ok"] = "ok"


class Info(_Response):
    model: str = Field(description="the model folder's name")
    arch: str = Field(description="encoder, decoder, seq2seq, rnn or rnn_seq2seq")
    head: str | None = Field(description="the head type saved with the model (null for a bare backbone)")
    task: str | None = Field(description="the fine-tuning task (sequence, pair, token, span, qa) or null")
    labels: list[str] = Field(description="the labels a classifier or tagger predicts")
    endpoints: list[str] = Field(description="the endpoints this server answers")
    max_length: int = Field(description="tokens per text this server accepts, [CLS]/[SEP] included")
    model_window: dict[str, int] = Field(description="per endpoint, the tokens per input the model itself reads; "
                                                     "longer texts are cut (or windowed) and named in the answer's "
                                                     "warnings")
    max_batch: int
    max_texts: int
    max_chars: int
    batching: bool
    max_wait_ms: float
    batch_stats: dict[str, dict[str, int]] = Field(
        description="per endpoint: forward passes run so far (batches), the inputs they held (items) and the "
                    "requests waiting for an answer now (in_flight)")


class Classification(_Response):
    label: str | None = Field(None, description="the predicted class (classification)")
    score: float | None = Field(None, description="its probability")
    value: float | None = Field(None, description="the predicted number (regression)")


class ClassifyResponse(_Response):
    results: list[Classification] = Field(description="one per text, in order")
    warnings: list[str] = Field(description="texts longer than the model's window and what was done to them")


class Entity(_Response):
    entity_group: str
    start: int = Field(description="character offset of the entity in the text")
    end: int
    word: str = Field(description="text[start:end]")
    score: float | None = Field(None, description="mean tag probability (absent for span models)")


class TagResponse(_Response):
    results: list[list[Entity]] = Field(description="the entities of each text, in order")
    warnings: list[str]


class Filler(_Response):
    token: str
    token_id: int
    score: float
    sequence: str | None = Field(None, description="the text with the mask filled (one-mask texts only)")


class FillMaskResponse(_Response):
    results: list[list[Filler] | list[list[Filler]]] = Field(
        description="per text: the top_k fillers, or a list of them per mask when the text has several")
    warnings: list[str]


class EmbedResponse(_Response):
    embeddings: list[list[float]] | list[list[list[float]]] = Field(
        description="one vector per text (pooling mean/cls), or one per token (pooling none) or per word "
                    "(word_pooling)")
    words: list[list[str]] | None = Field(None, description="with word_pooling: the words of each text")
    spans: list[list[tuple[int, int]]] | None = Field(
        None, description="with word_pooling: each word's character offsets (start, end) in its text")
    warnings: list[str]


class Answer(_Response):
    answer: str = Field(description="a span of the context (empty: no answer, SQuAD 2.0 models)")
    start: int | None = Field(None, description="character offset in the context (absent: no answer)")
    end: int | None = None
    score: float | None = Field(None, description="its probability: p_start * p_end, each a softmax over the positions "
                                                  "of its window (as transformers' question-answering pipeline)")
    warnings: list[str]


class Generation(_Response):
    texts: list[str] = Field(description="the hypotheses of this prompt, best first: a language model's prompt "
                                         "followed by its continuation (its continuation alone with "
                                         "return_full_text false), an encoder-decoder's target; word pieces joined")
    token_ids: list[list[int]] = Field(description="their generated token ids (the stop token excluded)")
    scores: list[float] | None = Field(None, description="their scores (beam search: the ranking score)")


class GenerateResponse(_Response):
    results: list[Generation] = Field(description="one per prompt, in order")
    warnings: list[str]


# ---------------------------------------------------------------------------------------------- requests
def build_schemas(limits: Limits) -> SimpleNamespace:
    """The request models with this server's limits (``ns.FillMask``, ``ns.Classify``, ``ns.Tag``, ``ns.Embed``,
    ``ns.Answer``, ``ns.Generate``)."""
    text = Annotated[str, StringConstraints(max_length=limits.max_chars)]
    texts = Annotated[list[text], Field(min_length=1, max_length=limits.max_texts,
                                        description=f"1 to {limits.max_texts} texts of at most "
                                                    f"{limits.max_chars} characters and {limits.max_length} tokens")]

    class FillMaskRequest(_Strict):
        texts: texts
        top_k: Annotated[int, Field(ge=1, le=limits.max_top_k)] = 5

    class ClassifyRequest(_Strict):
        texts: texts
        text_pairs: Annotated[list[text] | None, Field(
            max_length=limits.max_texts, description="the second texts, for sentence-pair models (one per text)")
        ] = None

    class TagRequest(_Strict):
        texts: texts

    class EmbedRequest(_Strict):
        texts: texts
        layers: Annotated[list[int], Field(min_length=1, max_length=limits.max_layers, description=(
            "hidden-state indices: 0 = embeddings, -1 = the last layer; several are combined"))] = [-1]  # noqa: RUF012
        combine: Literal[COMBINES] = "mean"  # type: ignore[valid-type]
        pooling: Annotated[Literal[POOLINGS] | None, Field(  # type: ignore[valid-type]
            description="mean (default), cls, or none (one vector per token)")] = None
        word_pooling: Annotated[Literal[WORD_POOLINGS] | None, Field(  # type: ignore[valid-type]
            description="one vector per word instead, from its first sub-word or the mean of its sub-words "
                        "(excludes pooling)")] = None

    class AnswerRequest(_Strict):
        question: Annotated[str, StringConstraints(min_length=1, max_length=limits.max_chars)]
        context: Annotated[str, StringConstraints(min_length=1, max_length=limits.max_chars)]

    class GenerateRequest(_Strict):
        texts: Annotated[list[text] | None, Field(min_length=1, max_length=limits.max_texts, description=(
            "the prompts (decoders) or sources (encoder-decoders)"))] = None
        prompts: Annotated[list[text] | None, Field(min_length=1, max_length=limits.max_texts, description=(
            "deprecated spelling of texts (accepted for one release, with a warning)"))] = None
        strategy: Literal["greedy", "beam", "sample"] = "greedy"
        max_new_tokens: Annotated[int, Field(ge=1, le=limits.max_new_tokens)] = 20
        num_beams: Annotated[int, Field(ge=1, le=16)] = 4
        num_return_sequences: Annotated[int, Field(ge=1, le=16)] = 1
        length_penalty: str = "none"
        temperature: Annotated[float, Field(gt=0)] = 1.0
        top_k: Annotated[int, Field(ge=0)] = 0
        top_p: Annotated[float, Field(gt=0, le=1)] = 1.0
        repetition_penalty: Annotated[float, Field(gt=0)] = 1.0
        no_repeat_ngram_size: Annotated[int, Field(ge=0)] = 0
        seed: int | None = None
        return_full_text: bool = Field(True, description=(
            "a language model's texts start with the prompt (true) or hold the continuation alone (false)"))

        @model_validator(mode="after")
        def _one_spelling(self):  # texts, or the deprecated prompts, exactly once
            if self.texts is not None and self.prompts is not None:
                raise ValueError("give texts only (prompts is its deprecated spelling)")
            if self.texts is None and self.prompts is None:
                raise ValueError("texts: required field missing")
            return self

        @property
        def inputs(self) -> list[str]:
            return self.texts if self.texts is not None else self.prompts  # type: ignore[return-value]

    return SimpleNamespace(FillMask=FillMaskRequest, Classify=ClassifyRequest, Tag=TagRequest, Embed=EmbedRequest,
                           Answer=AnswerRequest, Generate=GenerateRequest)


# ---------------------------------------------------------------------------------------------- error messages
SIZE_ERRORS = ("too_long", "string_too_long")


def _where(loc: tuple | list) -> str:
    parts = [p for p in loc if p != "body"]
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "body"


def describe_validation_errors(errors: list[dict[str, Any]], *, fields: list[str],
                               content_type: str) -> tuple[int, str]:
    """(HTTP status, one message) for pydantic's validation errors of a request body (see the module docstring).

    Args:
        errors: ``RequestValidationError.errors()``.
        fields: the fields the endpoint accepts (named when one is unknown or the body is not an object).
        content_type: the request's Content-Type header.
    """
    messages, statuses = [], []
    accepted = ", ".join(fields)
    for e in errors:
        kind, loc, ctx = e.get("type", ""), tuple(e.get("loc", ())), e.get("ctx") or {}
        where = _where(loc)
        if kind == "json_invalid":
            position = loc[-1] if loc and isinstance(loc[-1], int) else "?"
            statuses.append(400)
            messages.append(f"the body is not valid JSON (character {position}: {ctx.get('error', e.get('msg'))})")
        elif loc == ("body",) and kind == "missing":
            statuses.append(400)
            messages.append(f"the body is empty; send a JSON object with the fields {accepted}")
        elif loc == ("body",) and kind == "value_error":  # a model validator's own message (e.g. /generate's texts)
            statuses.append(422)
            messages.append(str(e.get("msg", "")).removeprefix("Value error, "))
        elif loc == ("body",) and "json" not in content_type.lower():
            statuses.append(415)
            messages.append(f"the body must be JSON sent with the header Content-Type: application/json (got "
                            f"{content_type or 'no Content-Type'})")
        elif loc == ("body",):
            statuses.append(422)
            messages.append(f"the body must be a JSON object with the fields {accepted}")
        elif kind == "extra_forbidden":
            statuses.append(422)
            messages.append(f"unknown field {where!r}; this endpoint accepts {accepted}")
        elif kind == "missing":
            statuses.append(422)
            messages.append(f"{where}: required field missing")
        elif kind == "too_long":
            statuses.append(413)
            option = "--max-texts" if where in ("texts", "prompts", "text_pairs") else None
            messages.append(f"{where}: {ctx.get('actual_length')} items; at most {ctx.get('max_length')} are "
                            f"accepted per request" + (f" (server option {option})" if option else ""))
        elif kind == "string_too_long":
            statuses.append(413)
            size = len(e["input"]) if isinstance(e.get("input"), str) else "too many"
            messages.append(f"{where}: {size} characters; at most {ctx.get('max_length')} are accepted "
                            f"(server option --max-chars)")
        elif kind == "too_short" and ctx.get("min_length") == 1:
            statuses.append(422)
            messages.append(f"{where}: must not be empty")
        else:
            statuses.append(422)
            messages.append(f"{where}: {e.get('msg')}")
    if not statuses:
        return 422, "invalid request"
    # One status for the whole answer: a syntax problem first, then a type problem, then a size problem.
    for status in (400, 415, 422, 413):
        if status in statuses:
            return status, "; ".join(messages)
    return 422, "; ".join(messages)

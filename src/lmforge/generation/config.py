"""``GenerationConfig``: every decoding choice in one validated dataclass, and ``GenerationOutput``.

Strategies:
    greedy  the most likely next token at every step (one hypothesis per input).
    beam    beam search with ``num_beams`` live hypotheses per input, returning the best ``num_return_sequences``
            finished ones, ranked by the length-normalised score (see ``lmforge.generation.search``).
    sample  ancestral sampling from the processed distribution (temperature, top-k, top-p), seeded by ``seed``;
            ``num_return_sequences`` independent samples per input.

Length penalties (beam search only), with S = the sum of the log-probabilities of the generated tokens (stop token
included) and |Y| = their number (stop token included):
    none      S
    average   S / |Y|
    gnmt      S / lp(Y), lp(Y) = ((5 + |Y|) / 6) ** alpha  (Wu et al. 2016, "Google's Neural Machine Translation
              System", eq. 14). Written "gnmt:ALPHA", e.g. "gnmt:0.6"; plain "gnmt" means alpha 0.6.
Direction: S is negative and grows more negative with every token, so plain S favours short outputs. Dividing
by a length term that grows with |Y| shrinks the magnitude of long hypotheses' scores: ``average`` and ``gnmt``
with alpha > 0 favour longer outputs than ``none``, more so the larger alpha (alpha = 0 is ``none``; alpha = 1 is
close to ``average`` for long outputs). A negative alpha favours even shorter outputs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from lmforge.errors import LmforgeError

__all__ = ["LENGTH_PENALTIES", "STRATEGIES", "GenerationConfig", "GenerationOutput", "length_penalty"]

STRATEGIES = ("greedy", "beam", "sample")
LENGTH_PENALTIES = ("none", "average", "gnmt")
DEFAULT_GNMT_ALPHA = 0.6  # the usual default (tensor2tensor, Marian); Wu et al. tuned alpha in [0.2, 1.0]


@dataclass
class GenerationConfig:
    """How ``lmforge.generation.generate`` decodes.

    Attributes:
        strategy: "greedy", "beam" or "sample".
        max_new_tokens: the most tokens generated per hypothesis (the stop token counts). Capped, with a warning,
            where the prompt plus the new tokens would exceed the model's ``max_seq_len``.
        num_beams: k, live hypotheses per input (beam only).
        num_return_sequences: t, hypotheses returned per input: the best t finished beams (t <= k), or t independent
            samples; 1 for greedy.
        length_penalty: "none", "average", "gnmt" or "gnmt:ALPHA" (beam only; see the module docstring).
        temperature: logits are divided by it before sampling (> 0; sample only).
        top_k: keep the k most likely tokens (0 = off; sample only).
        top_p: nucleus sampling, keep the smallest set of most likely tokens whose probability reaches p
            (in (0, 1], 1 = off; sample only).
        repetition_penalty: CTRL's penalty (Keskar et al. 2019), > 0, 1 = off: a token already in the context
            (the real prompt tokens of a decoder-only model, plus every generated token) has a positive logit
            divided by it, a negative one multiplied by it. All strategies.
        no_repeat_ngram_size: n > 0 forbids any n-gram from occurring twice in the same context (0 = off). All
            strategies.
        eos_id: the end-of-sequence id; generating it finishes a hypothesis. None = only ``stop_ids`` and
            ``max_new_tokens`` end one.
        stop_ids: further ids that finish a hypothesis like ``eos_id``.
        bos_id: the token an encoder-decoder's decoder starts from (required for those models; ignored by
            decoder-only models, whose prompt is the start).
        pad_id: the filler of ``GenerationOutput.padded()`` after a hypothesis ends.
        use_cache: incremental decoding with the key/value cache (Transformers); False re-runs the whole prefix at
            every step (slow; the test oracle). The RNN has no cache distinction: its recurrent state is its
            cache, and the flag has no effect there.
        seed: seeds the sampling generator (None = a non-deterministic seed), unless ``generate`` is given one.
    """

    strategy: str = "greedy"
    max_new_tokens: int = 20
    num_beams: int = 4
    num_return_sequences: int = 1
    length_penalty: str = "none"
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    no_repeat_ngram_size: int = 0
    eos_id: int | None = None
    stop_ids: Sequence[int] = field(default_factory=tuple)
    bos_id: int | None = None
    pad_id: int = 0
    use_cache: bool = True
    seed: int | None = None

    def __post_init__(self) -> None:
        self.stop_ids = tuple(self.stop_ids)
        self.validate()

    def validate(self) -> None:
        """Raise ``LmforgeError`` naming every offending value and how to fix it."""
        problems: list[str] = []
        if self.strategy not in STRATEGIES:
            problems.append(f"strategy={self.strategy!r} is not one of {', '.join(STRATEGIES)}")
        if not _is_int(self.max_new_tokens) or self.max_new_tokens < 1:
            problems.append(f"max_new_tokens={self.max_new_tokens!r} must be an integer >= 1")
        if not _is_int(self.num_beams) or self.num_beams < 1:
            problems.append(f"num_beams={self.num_beams!r} must be an integer >= 1")
        if not _is_int(self.num_return_sequences) or self.num_return_sequences < 1:
            problems.append(f"num_return_sequences={self.num_return_sequences!r} must be an integer >= 1")
        elif self.strategy == "beam" and _is_int(self.num_beams) and self.num_return_sequences > self.num_beams:
            problems.append(f"num_return_sequences={self.num_return_sequences} exceeds num_beams="
                            f"{self.num_beams}: beam search can return at most k hypotheses; raise num_beams "
                            "or ask for fewer")
        elif self.strategy == "greedy" and self.num_return_sequences != 1:
            problems.append(f"num_return_sequences={self.num_return_sequences}: greedy search finds one "
                            "hypothesis; use strategy 'beam' or 'sample' for several")
        try:
            length_penalty(self.length_penalty)
        except LmforgeError as err:
            problems.append(str(err))
        if not _is_number(self.temperature) or not self.temperature > 0:
            problems.append(f"temperature={self.temperature!r} must be > 0 (1 = the model's distribution)")
        if not _is_int(self.top_k) or self.top_k < 0:
            problems.append(f"top_k={self.top_k!r} must be an integer >= 0 (0 = off)")
        if not _is_number(self.top_p) or not 0.0 < self.top_p <= 1.0:
            problems.append(f"top_p={self.top_p!r} must be in (0, 1] (1 = off)")
        if not _is_number(self.repetition_penalty) or not self.repetition_penalty > 0:
            problems.append(f"repetition_penalty={self.repetition_penalty!r} must be > 0 (1 = off, > 1 "
                            "discourages repeats)")
        if not _is_int(self.no_repeat_ngram_size) or self.no_repeat_ngram_size < 0:
            problems.append(f"no_repeat_ngram_size={self.no_repeat_ngram_size!r} must be an integer >= 0 (0 = off)")
        for name in ("eos_id", "bos_id"):
            value = getattr(self, name)
            if value is not None and (not _is_int(value) or value < 0):
                problems.append(f"{name}={value!r} must be a token id >= 0 or None")
        if not _is_int(self.pad_id) or self.pad_id < 0:
            problems.append(f"pad_id={self.pad_id!r} must be a token id >= 0")
        bad_stops = [s for s in self.stop_ids if not _is_int(s) or s < 0]
        if bad_stops:
            problems.append(f"stop_ids {bad_stops!r} must be token ids >= 0")
        if self.seed is not None and not _is_int(self.seed):
            problems.append(f"seed={self.seed!r} must be an integer or None")
        if self.strategy in ("greedy", "beam"):
            # Sampling options would be silently ignored by a deterministic search: say so instead.
            unused = [f"{name}={getattr(self, name)}" for name, off in (("temperature", 1.0), ("top_k", 0),
                                                                         ("top_p", 1.0))
                      if getattr(self, name) != off]
            if unused:
                problems.append(f"{', '.join(unused)} only apply to strategy 'sample' (got {self.strategy!r})")
        if problems:
            raise LmforgeError("invalid generation config: " + "; ".join(problems))

    @property
    def stop_set(self) -> tuple[int, ...]:
        """Every id that finishes a hypothesis: ``eos_id`` and ``stop_ids``."""
        ids = ([] if self.eos_id is None else [self.eos_id]) + list(self.stop_ids)
        return tuple(dict.fromkeys(ids))

    def replace(self, **overrides: Any) -> GenerationConfig:
        """A validated copy with some fields changed; unknown names are an error listing the valid ones."""
        valid = [f.name for f in dataclasses.fields(self)]
        unknown = sorted(set(overrides) - set(valid))
        if unknown:
            raise LmforgeError(f"unknown generation option(s) {', '.join(unknown)}; valid options: "
                               f"{', '.join(valid)}")
        return dataclasses.replace(self, **overrides)


def length_penalty(spec: str) -> tuple[str, float]:
    """Parse a length-penalty name: "none", "average", "gnmt" or "gnmt:ALPHA" -> (name, alpha).

    Raises:
        LmforgeError: an unknown name or a malformed alpha.
    """
    if not isinstance(spec, str):
        raise LmforgeError(f"length_penalty={spec!r} must be a string: one of none, average, gnmt, gnmt:ALPHA")
    name, _, alpha_text = spec.strip().partition(":")
    if name not in LENGTH_PENALTIES:
        raise LmforgeError(f"length_penalty={spec!r} is not one of none, average, gnmt, gnmt:ALPHA "
                           "(e.g. gnmt:0.6)")
    if not alpha_text:
        return name, DEFAULT_GNMT_ALPHA if name == "gnmt" else 0.0
    if name != "gnmt":
        raise LmforgeError(f"length_penalty={spec!r}: only gnmt takes a parameter (gnmt:ALPHA)")
    try:
        alpha = float(alpha_text)
    except ValueError:
        raise LmforgeError(f"length_penalty={spec!r}: ALPHA must be a number, e.g. gnmt:0.6") from None
    if alpha != alpha or alpha in (float("inf"), float("-inf")):
        raise LmforgeError(f"length_penalty={spec!r}: ALPHA must be finite")
    return name, alpha


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and x == x


@dataclass
class GenerationOutput:
    """What ``generate`` returns: per input, its hypotheses best first.

    Attributes:
        sequences: ``sequences[i][j]`` = the new token ids of hypothesis j of input i: the prompt is not repeated
            and the stop token (EOS or a stop id) that ended it is NOT included (it is in ``stop_tokens``).
        scores: the ranking score of each hypothesis: the length-normalised log-probability for beam search,
            ``log_probs`` for greedy and sampling.
        log_probs: the sum of the log-probabilities of the generated tokens, the stop token included, under the
            model's distribution after the scoring processors (repetition penalty, n-gram blocking; the plain
            model when neither is on). Sampling's temperature, top-k and top-p decide what is drawn, not how it
            is scored.
        stop_tokens: the id that ended each hypothesis, or None when it reached ``max_new_tokens``.
        pad_id: filler of ``padded``.
    """

    sequences: list[list[list[int]]]
    scores: list[list[float]]
    log_probs: list[list[float]]
    stop_tokens: list[list[int | None]]
    pad_id: int = 0

    def __len__(self) -> int:
        return len(self.sequences)

    @property
    def best(self) -> list[list[int]]:
        """The first (best) hypothesis of every input."""
        return [hyps[0] if hyps else [] for hyps in self.sequences]

    def padded(self, pad_id: int | None = None) -> torch.Tensor:
        """All hypotheses as one (B, t, L) long tensor, L = the longest, filled with ``pad_id`` after each end."""
        fill = self.pad_id if pad_id is None else pad_id
        n_hyps = max((len(h) for h in self.sequences), default=0)
        width = max((len(s) for h in self.sequences for s in h), default=0)
        out = torch.full((len(self.sequences), n_hyps, width), fill, dtype=torch.long)
        for i, hyps in enumerate(self.sequences):
            for j, seq in enumerate(hyps):
                out[i, j, :len(seq)] = torch.tensor(seq, dtype=torch.long)
        return out

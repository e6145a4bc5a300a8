"""Tagging schemes for entity spans: BIO (IOB2), IOB1 and BIOES, with conversion, validation and CRF constraints.

A tag is ``"O"`` (outside) or ``PREFIX-TYPE`` (``"B-PER"``; the type may itself hold hyphens: ``"B-geo-loc"``).
Spans are ``(start, end, type)`` token ranges with ``end`` EXCLUSIVE (``tokens[start:end]``).

The schemes (Ramshaw & Marcus, 1995; Tjong Kim Sang & Veenstra, 1999; Ratinov & Roth, 2009):

* **BIO** (also called IOB2): every entity starts with ``B-X`` and continues with ``I-X``.
* **IOB1**: an entity is ``I-X ... I-X``; ``B-X`` marks the first token of an entity only when it directly follows
  another entity of the same type (``I-X B-X``: two adjacent entities). CoNLL-2003's original files use it.
* **BIOES** (also IOBES; BILOU is the same with ``L-``/``U-`` for ``E-``/``S-``, accepted here as aliases and
  written back as ``E-``/``S-``): ``B-X I-X* E-X`` for multi-token entities and ``S-X`` for one-token ones.

Decoding ill-formed sequences (:func:`tags_to_spans`) follows conlleval (the CoNLL shared-task scorer): in BIO,
an ``I-X`` after ``O``, at the start, or after a tag of another type *starts a new entity* instead of being
dropped. With that rule BIO and IOB1 decode identically (both start an entity at ``B-X`` and at an ``I-X`` that
does not continue an ``X``), so the same decoder serves both. In BIOES, an entity likewise starts at ``B-X`` or
``S-X``, or at an ``I-X``/``E-X`` that does not continue an open ``X`` entity; it ends after ``E-X`` or ``S-X``
or before any tag that does not continue it.

A sequence is *valid* under a scheme when :func:`check_scheme` accepts it — equivalently, when re-encoding its
decoded spans (:func:`spans_to_tags`) gives back the same tags. :func:`allowed_transitions` gives the same
rules as start / transition / end masks for a linear-chain CRF.

For training, convert IOB1 data to BIO first (``convert_tags(tags, "IOB1", "BIO")``): BIO is what taggers are
usually trained and scored on, and its rules are local (a B-X never depends on the previous entity). IOB1's
exact constraints are nevertheless provided by :func:`allowed_transitions` for models that keep IOB1 tags.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Literal

from lmforge.choices import TAG_SCHEMES
from lmforge.errors import LmforgeError

__all__ = [
    "SCHEMES",
    "Scheme",
    "allowed_transitions",
    "check_scheme",
    "close_labels",
    "convert_tags",
    "detect_scheme",
    "entity_types",
    "label_of",
    "normalize_scheme",
    "parse_tag",
    "spans_to_tags",
    "tags_to_spans",
]

Scheme = Literal["BIO", "IOB1", "BIOES"]
SCHEMES: tuple[str, ...] = TAG_SCHEMES
_ALIASES = {"BIO": "BIO", "IOB2": "BIO", "IOB1": "IOB1", "BIOES": "BIOES", "IOBES": "BIOES", "BILOU": "BIOES"}
_PREFIXES = {"BIO": "BI", "IOB1": "BI", "BIOES": "BIES"}
_BILOU = {"L": "E", "U": "S"}

Span = tuple[int, int, str]


def normalize_scheme(scheme: str) -> Scheme:
    """The canonical name of a scheme (case-insensitive; IOB2 -> BIO, IOBES/BILOU -> BIOES).

    Raises:
        LmforgeError: an unknown name (the message lists the choices).
    """
    name = _ALIASES.get(str(scheme).upper())
    if name is None:
        raise LmforgeError(f"unknown tagging scheme {scheme!r}; choose one of {', '.join(SCHEMES)} "
                           f"(aliases: IOB2 = BIO, IOBES/BILOU = BIOES)")
    return name  # type: ignore[return-value]


def parse_tag(tag: str) -> tuple[str, str | None]:
    """Split a tag into ``(prefix, type)``: ``"B-geo-loc"`` -> ``("B", "geo-loc")``, ``"O"`` -> ``("O", None)``.

    ``L-``/``U-`` (BILOU) come back as ``E``/``S``.

    Raises:
        LmforgeError: not ``O`` and not ``P-TYPE`` with P one of B, I, E, S, L, U.
    """
    if tag == "O":
        return "O", None
    prefix, sep, kind = tag.partition("-")
    prefix = _BILOU.get(prefix, prefix)
    if not sep or not kind or prefix not in ("B", "I", "E", "S"):
        raise LmforgeError(f"malformed tag {tag!r}; tags are 'O' or PREFIX-TYPE with PREFIX one of B, I, E, S "
                           f"(or L, U), e.g. 'B-PER'")
    return prefix, kind


def label_of(tag: str) -> str | None:
    """The entity type of a tag (``"I-PER"`` -> ``"PER"``), None for ``"O"``."""
    return parse_tag(tag)[1]


def entity_types(tags: Iterable[str]) -> list[str]:
    """The sorted entity types among ``tags`` (a flat iterable of tags; chain sentences first)."""
    return sorted({kind for kind in map(label_of, tags) if kind is not None})


def _parse_for(tag: str, scheme: Scheme) -> tuple[str, str | None]:
    prefix, kind = parse_tag(tag)
    if prefix != "O" and prefix not in _PREFIXES[scheme]:
        raise LmforgeError(f"tag {tag!r} does not belong to the {scheme} scheme (prefixes "
                           f"{', '.join(_PREFIXES[scheme])} and O); the tags look like BIOES: pass scheme='BIOES' "
                           f"or let detect_scheme choose")
    return prefix, kind


# ----------------------------------------------------------------------------------------------- rules


def _can_start(prefix: str, kind: str | None, scheme: Scheme) -> bool:
    if scheme == "BIO":
        return prefix != "I"
    if scheme == "IOB1":
        return prefix != "B"  # B-X needs a preceding X entity
    return prefix not in ("I", "E")


def _can_follow(prev: tuple[str, str | None], cur: tuple[str, str | None], scheme: Scheme) -> bool:
    (p_prefix, p_kind), (c_prefix, c_kind) = prev, cur
    if scheme == "BIO":
        return c_prefix != "I" or (p_prefix in ("B", "I") and p_kind == c_kind)
    if scheme == "IOB1":
        return c_prefix != "B" or (p_prefix in ("B", "I") and p_kind == c_kind)
    # BIOES: an open entity (after B or I) must continue with I or E of its type; otherwise a new one may start.
    if p_prefix in ("B", "I"):
        return c_prefix in ("I", "E") and p_kind == c_kind
    return c_prefix in ("O", "B", "S")


def _can_end(prefix: str, scheme: Scheme) -> bool:
    return scheme != "BIOES" or prefix in ("O", "E", "S")


def _first_violation(tags: Sequence[str], scheme: Scheme) -> str | None:
    """A description of the first rule broken by ``tags``, or None when they are valid."""
    parsed = [_parse_for(tag, scheme) for tag in tags]
    if not parsed:
        return None
    if not _can_start(*parsed[0], scheme):
        return f"token 0: {tags[0]!r} cannot start a sentence"
    for i in range(1, len(parsed)):
        if not _can_follow(parsed[i - 1], parsed[i], scheme):
            return f"token {i}: {tags[i]!r} cannot follow {tags[i - 1]!r}"
    if not _can_end(parsed[-1][0], scheme):
        return f"token {len(tags) - 1}: {tags[-1]!r} cannot end a sentence"
    return None


def check_scheme(tag_sequences: Iterable[Sequence[str]], scheme: str, *, lines: Sequence[int] | None = None,
                 source: str | None = None) -> None:
    """Raise unless every sequence is valid under ``scheme`` (see the module doc for the rules).

    Args:
        tag_sequences: one tag list per sentence.
        scheme: BIO, IOB1 or BIOES (or an alias).
        lines: optional line number per sentence (``TaggedSentence.line``) to name in the error.
        source: optional file name to name in the error.

    Raises:
        LmforgeError: naming the first invalid sentence (index or file:line), token and transition, and the fix.
    """
    scheme = normalize_scheme(scheme)
    for s, tags in enumerate(tag_sequences):
        problem = _first_violation(tags, scheme)
        if problem is None:
            continue
        where = f"sentence {s}" if lines is None else f"line {lines[s]} (sentence {s})"
        if source is not None:
            where = f"{source}: {where}" if lines is None else f"{source}:{lines[s]}: sentence {s}"
        raise LmforgeError(f"{where}: {problem} under the {scheme} scheme; pass the scheme the data uses "
                           f"(detect_scheme guesses it), or convert the tags with convert_tags")


def detect_scheme(tag_sequences: Iterable[Sequence[str]]) -> Scheme:
    """Guess the scheme of tagged data.

    The rule, applied over all sequences:

    1. **BIOES** if any tag has an ``E-``/``S-`` (or ``L-``/``U-``) prefix;
    2. otherwise **IOB1** if some ``I-X`` starts an entity (at a sentence start, after ``O`` or after another
       type) *and* no ``B-X`` starts an entity (at a sentence start, after ``O`` or after another type) — in
       IOB1, B appears only between two adjacent same-type entities;
    3. otherwise **BIO** (including data without entities, and data where both kinds of start occur: that is
       ill-formed BIO, which decodes leniently).
    """
    i_starts = b_starts = False
    for tags in tag_sequences:
        prev_prefix, prev_kind = "O", None
        for tag in tags:
            prefix, kind = parse_tag(tag)
            if prefix in ("E", "S"):
                return "BIOES"
            opens = prev_prefix == "O" or prev_kind != kind
            i_starts |= prefix == "I" and opens
            b_starts |= prefix == "B" and opens
            prev_prefix, prev_kind = prefix, kind
    return "IOB1" if i_starts and not b_starts else "BIO"


# ----------------------------------------------------------------------------------------------- label sets


def close_labels(tags: Iterable[str], scheme: str) -> list[str]:
    """The tag vocabulary of ``tags`` closed under ``scheme``: every entity type seen brings all of its tags.

    A training file may hold ``B-sportsteam`` but never ``I-sportsteam`` (every sports team in it is one word); a
    tagger whose label set is read off that file can never predict a two-word team, and a test file that has one
    would hold a tag the model does not know. Closing the set fixes both: under BIO (and IOB1) every type X gets
    ``B-X`` and ``I-X``, under BIOES also ``E-X`` and ``S-X``. ``O`` is always included (a sentence without
    entities needs it).

    Args:
        tags: the tags seen (any order, repeats allowed; BILOU's ``L-``/``U-`` count as ``E-``/``S-``).
        scheme: BIO, IOB1 or BIOES (or an alias).

    Returns:
        ``"O"`` first, then the tags of each type in type order (``B-X, I-X`` or ``B-X, I-X, E-X, S-X``).

    Raises:
        LmforgeError: a malformed tag, or a tag whose prefix the scheme does not have.
    """
    scheme = normalize_scheme(scheme)
    kinds = sorted({kind for kind in (_parse_for(tag, scheme)[1] for tag in tags) if kind is not None})
    return ["O", *(f"{prefix}-{kind}" for kind in kinds for prefix in _PREFIXES[scheme])]


# ----------------------------------------------------------------------------------------------- conversion


def tags_to_spans(tags: Sequence[str], scheme: str = "BIO") -> list[Span]:
    """Decode tags into entity spans, leniently as conlleval does for ill-formed sequences (see the module doc).

    Args:
        tags: one tag per token.
        scheme: BIO, IOB1 or BIOES (or an alias).

    Returns:
        ``(start, end, type)`` spans, ``end`` EXCLUSIVE, ordered by start; they never overlap.
    """
    scheme = normalize_scheme(scheme)
    spans: list[Span] = []
    start: int | None = None  # the open entity's first token
    open_kind: str | None = None
    for i, tag in enumerate(tags):
        prefix, kind = _parse_for(tag, scheme)
        continues = start is not None and kind == open_kind and prefix in ("I", "E")
        if not continues and start is not None:
            spans.append((start, i, open_kind))  # type: ignore[arg-type]
            start = None
        if prefix == "O":
            continue
        if not continues:
            start, open_kind = i, kind
        if prefix in ("E", "S"):  # BIOES: the entity ends here
            spans.append((start, i + 1, open_kind))  # type: ignore[arg-type]
            start = None
    if start is not None:
        spans.append((start, len(tags), open_kind))  # type: ignore[arg-type]
    return spans


def spans_to_tags(spans: Iterable[Span], length: int, scheme: str = "BIO") -> list[str]:
    """Encode non-overlapping ``(start, end, type)`` spans (``end`` EXCLUSIVE) as ``length`` tags.

    Raises:
        LmforgeError: a span out of ``[0, length]``, empty, or overlapping another.
    """
    scheme = normalize_scheme(scheme)
    tags = ["O"] * length
    previous: Span | None = None
    for span in sorted(spans):
        start, end, kind = span
        if not 0 <= start < end <= length:
            raise LmforgeError(f"span {span} is out of range for {length} tokens (need 0 <= start < end <= "
                               f"{length}; end is exclusive)")
        if previous is not None and start < previous[1]:
            raise LmforgeError(f"spans {previous} and {span} overlap; a tag sequence can only encode "
                               f"non-overlapping spans")
        tags[start:end] = [f"I-{kind}"] * (end - start)
        if scheme == "BIO":
            tags[start] = f"B-{kind}"
        elif scheme == "IOB1":
            if previous is not None and previous[1] == start and previous[2] == kind:
                tags[start] = f"B-{kind}"
        elif end - start == 1:
            tags[start] = f"S-{kind}"
        else:
            tags[start], tags[end - 1] = f"B-{kind}", f"E-{kind}"
        previous = span
    return tags


def convert_tags(tags: Sequence[str], source: str, target: str) -> list[str]:
    """Re-encode a tag sequence from one scheme to another (via spans; ill-formed input is decoded leniently)."""
    return spans_to_tags(tags_to_spans(tags, source), len(tags), target)


# ----------------------------------------------------------------------------------------------- CRF masks


def allowed_transitions(labels: Sequence[str], scheme: str) -> tuple[list[bool], list[list[bool]], list[bool]]:
    """The scheme's rules as masks over a label vocabulary, for a constrained linear-chain CRF or decoder.

    Args:
        labels: the tag vocabulary, e.g. ``["O", "B-PER", "I-PER"]`` (in the model's label-id order).
        scheme: BIO, IOB1 or BIOES (or an alias).

    Returns:
        ``(start, transitions, end)``: ``start[j]`` whether tag j may begin a sentence; ``transitions[i][j]``
        whether tag j may directly follow tag i; ``end[j]`` whether tag j may end a sentence. A tag sequence obeys
        all three exactly when :func:`check_scheme` accepts it.

    Raises:
        LmforgeError: a label that is not a tag of the scheme.
    """
    scheme = normalize_scheme(scheme)
    parsed = [_parse_for(label, scheme) for label in labels]
    start = [_can_start(prefix, kind, scheme) for prefix, kind in parsed]
    transitions = [[_can_follow(a, b, scheme) for b in parsed] for a in parsed]
    end = [_can_end(prefix, scheme) for prefix, _ in parsed]
    return start, transitions, end

"""Synthetic key -> value data on which a small GPT learns in-context learning through induction heads.

Each training document lists key -> value pairs under a mapping drawn afresh for that document::

    k12 = v3 ; k5 = v40 ; k12 = v3 ; k7 = v9 ; k5 = v40 ; ...

Keys repeat inside a document, and because the mapping is new every time, the value of a repeated key can be
predicted only by finding the key's earlier occurrence and copying the token that followed it two places later:
the induction mechanism of Olsson et al. (2022, "In-context Learning and Induction Heads"), a previous-token head
in one layer composed with a head in a later layer that attends to the token after an earlier match. The first
occurrence of a key is unpredictable (chance is 1 / n_values), so nothing but the context helps, and since values
are drawn at random per document no mapping can be memorised. (Olsson et al. study induction on natural text and
on repeated random tokens; this key-value format is the few-shot-prompt version of the same copy task, in the
spirit of their "in-context learning" framing.)

``key_value_task`` writes one held-out mapping as a classification task (JSON lines ``{"text": key, "label":
value}``): the training file is the demonstration pool, the test file queries the same keys. A few-shot prompt
built from the template ``TEMPLATE`` and separator ``SEPARATOR`` tokenizes exactly like a training document::

    "k12 = v3" + " ; " + "k5 = v40" + " ; " + "k12 ="      ->   k12 = v3 ; k5 = v40 ; k12 =

so with K demonstrations the query key is in the context with a probability that grows with K, and a model that
has learnt the induction mechanism answers it; without demonstrations (K = 0) it can only guess.

Every key and value is one whole word of a vocabulary built for the purpose (``key_value_tokenizer``), so each is
exactly one WordPiece token; ``=`` and ``;`` are punctuation, split off by the basic tokenizer as tokens of their
own. The corpus is written in lmforge's ``lines`` format (one sentence per line, a blank line between documents;
here each document is one line), so ``lmforge data prepare --format lines`` reads one document per line and the
causal-LM stream puts a ``[SEP]`` before each document, as a prompt to a causal LM starts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from lmforge.errors import LmforgeError
from lmforge.tokenizers.wordpiece import DEFAULT_SPECIAL_TOKENS, WordPieceTokenizer
from lmforge.utils.io import atomic_write_text

__all__ = ["SEPARATOR", "TEMPLATE", "key_name", "key_value_corpus", "key_value_document", "key_value_task",
           "key_value_tokenizer", "key_value_vocabulary", "repeated_tokens_document", "value_name"]

TEMPLATE = "{text} = {label}"  # one demonstration of a few-shot prompt: "k12 = v3"
SEPARATOR = " ; "  # between demonstrations, as between the pairs of a training document
ASSIGN, DELIMITER = "=", ";"


def key_name(i: int) -> str:
    """The word of key ``i``: ``k{i}``."""
    return f"k{i}"


def value_name(i: int) -> str:
    """The word of value ``i``: ``v{i}``."""
    return f"v{i}"


def _check_sizes(n_keys: int, n_values: int) -> None:
    for name, n in (("n_keys", n_keys), ("n_values", n_values)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise LmforgeError(f"{name}={n!r} must be a whole number >= 1")


def key_value_vocabulary(n_keys: int, n_values: int) -> list[str]:
    """The tokens of the key-value language, in id order: the five special tokens (``[PAD] [UNK] [CLS] [SEP]
    [MASK]``), ``=`` and ``;``, the keys ``k0 .. k{n_keys-1}`` and the values ``v0 .. v{n_values-1}``."""
    _check_sizes(n_keys, n_values)
    return [*DEFAULT_SPECIAL_TOKENS, ASSIGN, DELIMITER, *map(key_name, range(n_keys)),
            *map(value_name, range(n_values))]


def key_value_tokenizer(n_keys: int, n_values: int) -> WordPieceTokenizer:
    """A WordPiece tokenizer whose vocabulary is ``key_value_vocabulary``: every key, value and symbol of the
    corpus is one token (no word is split into pieces, none becomes [UNK]). Save it with ``save_pretrained``."""
    return WordPieceTokenizer(key_value_vocabulary(n_keys, n_values))


def _range(value: int | tuple[int, int], name: str) -> tuple[int, int]:
    """An inclusive (low, high) range from a number or a pair, checked to be >= 1 and ordered."""
    lo, hi = (value, value) if isinstance(value, int | np.integer) and not isinstance(value, bool) else \
        tuple(value) if isinstance(value, tuple | list) and len(value) == 2 else (None, None)
    if not all(isinstance(v, int | np.integer) and not isinstance(v, bool) for v in (lo, hi)) or not 1 <= lo <= hi:
        raise LmforgeError(f"{name}={value!r} must be a whole number >= 1 or a range (low, high) with "
                           "1 <= low <= high")
    return int(lo), int(hi)


def _check_format(template: str, separator: str) -> tuple[int, int]:
    """Words (= tokens of the key-value vocabulary) of one pair and of the separator; refuses a template without
    both slots, a label slot before the text slot, or a line break (a document is one line)."""
    if not isinstance(template, str) or "{text}" not in template or "{label}" not in template or \
            template.index("{text}") > template.index("{label}"):
        raise LmforgeError(f"template={template!r} must hold {{text}} then {{label}}, e.g. {TEMPLATE!r}")
    if not isinstance(separator, str) or "\n" in template + separator or "\r" in template + separator:
        raise LmforgeError(f"separator={separator!r} and the template must not hold line breaks (a document is one "
                           f"line); e.g. {SEPARATOR!r}")
    if not separator:
        raise LmforgeError("separator='' would glue pairs into one word; use e.g. ' ' or ' ; '")
    return len(template.format(text="k", label="v").split()), len(separator.split())


def key_value_document(rng: np.random.Generator, *, n_pairs: int, n_distinct: int, n_keys: int,
                       n_values: int, template: str = TEMPLATE, separator: str = SEPARATOR,
                       repeats: int = 1) -> str:
    """One document: ``n_pairs`` pairs over ``n_distinct`` keys, under a mapping drawn afresh.

    The keys are ``n_distinct`` distinct draws from the pool of ``n_keys``; each gets a value drawn uniformly from
    the ``n_values`` (values may repeat across keys); the sequence visits every chosen key once in a random order
    (so no key is wasted) and fills the remaining ``n_pairs - n_distinct`` places with keys drawn uniformly from the
    chosen ones, the whole then shuffled. A pair whose key came before is predictable from the context alone.
    Each pair is ``template`` filled with the key as ``{text}`` and the value as ``{label}``; ``separator`` joins
    them. ``repeats`` > 1: only the first ``ceil(n_pairs / repeats)`` pairs are drawn so, and the rest repeat
    them in the same order, cyclically (the repeated-sequence pattern on which Olsson et al. measure induction
    heads): there the keys are predictable from the context too, not only the values.
    """
    keys = rng.choice(n_keys, size=n_distinct, replace=False)
    values = rng.integers(0, n_values, size=n_distinct)
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise LmforgeError(f"repeats={repeats!r} must be a whole number >= 1 (1: no replay)")
    first = -(-n_pairs // repeats)
    n_distinct = min(n_distinct, first)
    order = np.concatenate([np.arange(n_distinct), rng.integers(0, n_distinct, size=first - n_distinct)])
    rng.shuffle(order)
    order = np.resize(order, n_pairs)  # the first block again and again, cut at n_pairs
    return separator.join(template.format(text=key_name(keys[i]), label=value_name(values[i])) for i in order)


def repeated_tokens_document(rng: np.random.Generator, *, n_tokens: int, n_keys: int, n_values: int,
                             distinct: bool = False) -> str:
    """``n_tokens`` words drawn uniformly (with replacement) from the keys and values, then the same words again:
    Olsson et al.'s repeated random tokens, written in the key-value vocabulary. Only the second half is
    predictable, and only by an induction head (the first half is noise and the period differs per document, so no
    fixed-offset head solves it).

    With ``distinct`` the first half has no word twice (drawn without replacement; ``n_tokens`` at most
    ``n_keys + n_values``), so "the word after the earlier occurrence of this one" is always the right answer in the
    second half. With replacement in a vocabulary this small, a word often occurs twice in the first half with two
    different successors, and the copy rule is ambiguous there: a weaker, noisier signal for the induction circuit
    (Aoyama et al. 2025 relate induction-head formation to how reliably a repeated bigram repeats)."""
    words = [*map(key_name, range(n_keys)), *map(value_name, range(n_values))]
    if distinct and n_tokens > len(words):
        raise LmforgeError(f"n_tokens={n_tokens} distinct words do not exist in a vocabulary of {len(words)} keys "
                           "and values: lower the number of tokens or allow repeats (distinct=False)")
    picks = rng.choice(len(words), size=n_tokens, replace=False) if distinct else rng.integers(0, len(words),
                                                                                               size=n_tokens)
    half = [words[i] for i in picks]
    return " ".join(half + half)


def key_value_corpus(path: str | Path, *, n_sequences: int, pairs_per_sequence: int | tuple[int, int],
                     n_keys: int, n_values: int, seed: int,
                     keys_per_sequence: int | tuple[int, int] | None = None, template: str = TEMPLATE,
                     separator: str = SEPARATOR, replay_share: float = 0.0,
                     repeats: int | tuple[int, int] = 2, random_share: float = 0.0,
                     random_tokens: int | tuple[int, int] = (10, 60),
                     random_distinct: bool = False) -> dict[str, Any]:
    """Write a pretraining corpus of key-value documents (UTF-8, one document per line, a blank line between).

    Args:
        path: the text file to write (read it with ``lmforge data prepare --format lines``).
        n_sequences: the number of documents.
        pairs_per_sequence: pairs per document, a number or an inclusive range ``(low, high)`` drawn uniformly
            per document. A range makes documents of different lengths, so that documents start at every offset
            of the fixed-length training blocks, as a prompt (``[SEP]`` then the pairs) starts at position 0.
        n_keys: the key pool (``k0 ..``); make it larger than a document's distinct keys, so that no key set is
            memorised either.
        n_values: the value pool (``v0 ..``): chance accuracy on an unseen key is 1 / n_values.
        seed: the random seed; the same arguments write the same file.
        keys_per_sequence: distinct keys per document, a number or an inclusive range (default: from 1 to the
            document's number of pairs, capped at ``n_keys``); fewer distinct keys means more repeats. Each draw
            is capped at the document's pairs and at ``n_keys``.
        template, separator: the format of a pair and the text between pairs; the few-shot prompts must use the
            same two. ``"{text} {label}"`` and ``" "`` give bare ``k12 v3 k5 v40 ...``: the query's own token then
            occurred before, the textbook induction pattern, which a small model learns sooner.
        replay_share: the share of documents made of one block of pairs repeated ``repeats`` times in the same
            order (``key_value_document``): a denser training signal for the induction circuit, whose plateau
            before it forms is otherwise long in a model this small.
        repeats: the blocks of such a document (>= 2), or an inclusive range drawn per document: varying block
            lengths keep a head that attends at one fixed offset from solving the repeats without matching tokens.
        random_share: the share of documents that are repeated random tokens instead of pairs
            (``repeated_tokens_document``: N words drawn from the keys and values, then the same N again), the
            sequences on which Olsson et al. see the induction phase change in small models; the rest are key-value
            documents as above.
        random_tokens: N for those documents, a number or an inclusive range drawn per document.
        random_distinct: draw those N words without replacement (see ``repeated_tokens_document``); the range's
            upper end must then be at most ``n_keys + n_values``.

    Returns:
        Counts: documents, pairs, tokens (without the [SEP] between documents), the share of pairs whose key
        appeared earlier in its document (the values only the context can predict), and ``random_documents``.
    """
    _check_sizes(n_keys, n_values)
    pair_words, separator_words = _check_format(template, separator)
    if isinstance(n_sequences, bool) or not isinstance(n_sequences, int) or n_sequences < 1:
        raise LmforgeError(f"n_sequences={n_sequences!r} must be a whole number >= 1")
    lo, hi = _range(pairs_per_sequence, "pairs_per_sequence")
    k_lo, k_hi = _range(keys_per_sequence if keys_per_sequence is not None else (1, hi), "keys_per_sequence")
    if not 0.0 <= replay_share <= 1.0:
        raise LmforgeError(f"replay_share={replay_share!r} must be in [0, 1]")
    r_lo, r_hi = (repeats, repeats) if isinstance(repeats, int) else _range(repeats, "repeats")
    if not 0.0 <= random_share <= 1.0:
        raise LmforgeError(f"random_share={random_share!r} must be in [0, 1]")
    t_lo, t_hi = _range(random_tokens, "random_tokens")
    if random_distinct and random_share and t_hi > n_keys + n_values:
        raise LmforgeError(f"random_tokens up to {t_hi} cannot be distinct words: there are {n_keys + n_values} keys "
                           "and values; lower the range's upper end or set random_distinct=False")
    rng = np.random.default_rng(seed)
    lines, pairs, repeated, n_random, random_words = [], 0, 0, 0, 0
    for _ in range(n_sequences):
        if random_share and rng.random() < random_share:
            n = int(rng.integers(t_lo, t_hi + 1))
            lines.append(repeated_tokens_document(rng, n_tokens=n, n_keys=n_keys, n_values=n_values,
                                                  distinct=random_distinct))
            n_random, random_words = n_random + 1, random_words + 2 * n
            continue
        n = int(rng.integers(lo, hi + 1))
        times = (r_lo if r_lo == r_hi else int(rng.integers(r_lo, r_hi + 1))) if rng.random() < replay_share else 1
        distinct = min(int(rng.integers(k_lo, k_hi + 1)), -(-n // times), n_keys)
        lines.append(key_value_document(rng, n_pairs=n, n_distinct=distinct, n_keys=n_keys, n_values=n_values,
                                        template=template, separator=separator, repeats=times))
        pairs, repeated = pairs + n, repeated + n - distinct
    atomic_write_text(path, "\n\n".join(lines) + "\n")
    tokens = pair_words * pairs + separator_words * (pairs - (n_sequences - n_random)) + random_words
    return {"documents": n_sequences, "pairs": pairs, "tokens": tokens,
            "repeated_share": repeated / pairs if pairs else 0.0, "random_documents": n_random}


def key_value_task(train_path: str | Path, test_path: str | Path, *, n_pairs: int, seed: int, n_keys: int,
                   n_values: int, n_queries: int | None = None) -> dict[str, str]:
    """Write one fresh mapping as a few-shot classification task (JSON lines ``{"text": key, "label": value}``).

    Args:
        train_path: the demonstration pool: the mapping's ``n_pairs`` pairs, each once, in a random order.
        test_path: the queries: ``n_queries`` distinct keys of the same mapping (default all ``n_pairs``) with
            their values as labels.
        n_pairs: keys in the mapping, distinct draws from the pool of ``n_keys``; with K demonstrations drawn
            without replacement, a query's key is in the prompt with probability K / n_pairs.
        seed: the random seed of the mapping (use one not used for the training corpus's mappings' seed, though
            with random values a repeated mapping would not help a model anyway).
        n_keys, n_values: the pools of the training corpus (the task must use the model's vocabulary).

    Returns:
        The mapping, ``{key: value}``.
    """
    _check_sizes(n_keys, n_values)
    if isinstance(n_pairs, bool) or not isinstance(n_pairs, int) or not 1 <= n_pairs <= n_keys:
        raise LmforgeError(f"n_pairs={n_pairs!r} must be a whole number in [1, n_keys={n_keys}]; lower n_pairs "
                           "or use a larger key pool")
    n_queries = n_pairs if n_queries is None else n_queries
    if isinstance(n_queries, bool) or not isinstance(n_queries, int) or not 1 <= n_queries <= n_pairs:
        raise LmforgeError(f"n_queries={n_queries!r} must be a whole number in [1, n_pairs={n_pairs}]")
    rng = np.random.default_rng(seed)
    keys = rng.choice(n_keys, size=n_pairs, replace=False)
    values = rng.integers(0, n_values, size=n_pairs)
    mapping = {key_name(k): value_name(v) for k, v in zip(keys, values, strict=True)}
    names = list(mapping)

    def write(path: str | Path, order: np.ndarray) -> None:
        rows = [json.dumps({"text": names[i], "label": mapping[names[i]]}) for i in order]
        atomic_write_text(path, "\n".join(rows) + "\n")

    write(train_path, rng.permutation(n_pairs))
    write(test_path, rng.permutation(n_pairs)[:n_queries])
    return mapping

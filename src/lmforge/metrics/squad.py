"""SQuAD scores: exact match and token-overlap F1, maximised over the gold answers, in percent.

The logic of the official evaluation scripts (SQuAD v1.1 ``evaluate-v1.1.py`` and v2.0 ``evaluate-v2.0.py``;
Rajpurkar et al., 2016; 2018), re-implemented:

* answers are compared after :func:`normalize_answer`: lower-case, drop ASCII punctuation, drop the articles
  *a/an/the*, collapse white space;
* F1 is over the bags of normalised tokens; when either side has no token, F1 = 1 if both are empty, else 0
  (v2.0's rule; v1.1 gives 0 even when both are empty, which only differs for a gold answer that normalises to
  nothing, such as ``"the"``);
* each question scores the maximum over its gold answers; an impossible question (v2.0) has the single gold
  answer ``""``, so the empty prediction scores 1 and any other 0;
* a question without a prediction scores 0 and still counts (both scripts do this); predictions for unknown ids
  are ignored.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Mapping, Sequence

from lmforge.data.readers import QAExample
from lmforge.errors import LmforgeError

__all__ = ["exact_match", "f1", "normalize_answer", "squad_scores"]

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(text: str) -> str:
    """Lower-case, remove punctuation, remove articles, collapse white space (in that order, as the scripts)."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, gold: str) -> float:
    """1.0 when the normalised strings are equal, else 0.0."""
    return float(normalize_answer(prediction) == normalize_answer(gold))


def f1(prediction: str, gold: str) -> float:
    """Token-overlap F1 between the normalised prediction and gold answer (bags of words, in [0, 1])."""
    pred_tokens = normalize_answer(prediction).split()
    gold_tokens = normalize_answer(gold).split()
    if not pred_tokens or not gold_tokens:
        return float(pred_tokens == gold_tokens)
    overlap = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if overlap == 0:
        return 0.0
    precision = overlap / len(pred_tokens)
    recall = overlap / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def _gold_answers(example: QAExample) -> list[str]:
    if example.is_impossible:
        return [""]
    if not example.answers:
        raise LmforgeError(f"question {example.id!r} has no gold answers and is not marked impossible, so it "
                           f"cannot be scored; read the gold file with require_answers=True")
    return [text for text, _ in example.answers]


def squad_scores(predictions: Mapping[str, str], examples: Sequence[QAExample]) -> dict[str, float]:
    """Score predicted answer strings against SQuAD examples.

    Args:
        predictions: question id -> predicted answer text ("" predicts "no answer").
        examples: the gold questions (from :func:`lmforge.data.readers.read_squad`).

    Returns:
        ``{"exact_match", "f1"}`` in percent (0-100) over all examples; when any question is impossible, also
        ``HasAns_exact``, ``HasAns_f1``, ``HasAns_total`` (over answerable questions, when there are any) and
        ``NoAns_exact``, ``NoAns_f1``, ``NoAns_total``, as the v2.0 script reports.

    Raises:
        LmforgeError: no examples, a prediction that is not a string, an answerable question without gold
            answers.
    """
    if not examples:
        raise LmforgeError("cannot score an empty set of questions")
    em_by_id: dict[str, float] = {}
    f1_by_id: dict[str, float] = {}
    for example in examples:
        prediction = predictions.get(example.id)
        if prediction is None:
            em_by_id[example.id] = f1_by_id[example.id] = 0.0
            continue
        if not isinstance(prediction, str):
            raise LmforgeError(f"the prediction for question {example.id!r} must be a string, got "
                               f"{type(prediction).__name__}")
        golds = _gold_answers(example)
        em_by_id[example.id] = max(exact_match(prediction, gold) for gold in golds)
        f1_by_id[example.id] = max(f1(prediction, gold) for gold in golds)

    def percent(ids: list[str], scores: dict[str, float]) -> float:
        return 100.0 * sum(scores[i] for i in ids) / len(ids)

    all_ids = [example.id for example in examples]
    result: dict[str, float] = {"exact_match": percent(all_ids, em_by_id), "f1": percent(all_ids, f1_by_id)}
    no_ans = [example.id for example in examples if example.is_impossible]
    if no_ans:
        has_ans = [example.id for example in examples if not example.is_impossible]
        if has_ans:
            result.update(HasAns_exact=percent(has_ans, em_by_id), HasAns_f1=percent(has_ans, f1_by_id),
                          HasAns_total=float(len(has_ans)))
        result.update(NoAns_exact=percent(no_ans, em_by_id), NoAns_f1=percent(no_ans, f1_by_id),
                      NoAns_total=float(len(no_ans)))
    return result

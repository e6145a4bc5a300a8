"""SQuAD v1.1/v2.0 scores on hand-computed examples."""

import pytest

from lmforge.data.readers import QAExample
from lmforge.errors import LmforgeError
from lmforge.metrics import exact_match, normalize_answer, squad_f1, squad_scores

CONTEXT = "The Denver Broncos beat the Carolina Panthers 24-10 in Santa Clara."


def question(qid: str, *answers: str, impossible: bool = False) -> QAExample:
    return QAExample(qid, "t", "?", CONTEXT, [(a, CONTEXT.index(a)) for a in answers], impossible)


def test_normalize_answer():
    assert normalize_answer("  The Denver  Broncos! ") == "denver broncos"
    assert normalize_answer("an apple, a pear") == "apple pear"
    assert normalize_answer("theatre") == "theatre"  # articles only as whole words
    assert normalize_answer("24-10") == "2410"        # punctuation is removed, not replaced by a space
    assert normalize_answer("A") == ""


def test_exact_match_and_f1():
    assert exact_match("the Denver Broncos", "Denver Broncos.") == 1.0
    assert exact_match("Broncos", "Denver Broncos") == 0.0
    # prediction 3 tokens, gold 2 tokens, overlap 2: P 2/3, R 1, F1 0.8
    assert squad_f1("Denver Broncos won", "Denver Broncos") == pytest.approx(0.8)
    # bag overlap counts repeated tokens at most as often as in both
    assert squad_f1("go go go", "go") == pytest.approx(2 * (1 / 3) * 1 / (1 / 3 + 1))
    assert squad_f1("Panthers", "Broncos") == 0.0
    assert squad_f1("", "") == 1.0 and squad_f1("the", "") == 1.0 and squad_f1("x", "") == 0.0


def test_squad_scores_v1_max_over_answers_and_missing_predictions():
    examples = [question("q1", "Denver Broncos", "Broncos"), question("q2", "Santa Clara"), question("q3", "24-10")]
    predictions = {"q1": "Broncos", "q2": "in Santa Clara", "other": "ignored"}
    scores = squad_scores(predictions, examples)
    # q1: EM 1 (second answer); q2: EM 0, F1 = 2 * (2/2) * (2/3) / (1 + 2/3) = 0.8; q3 missing -> 0
    assert scores == {"exact_match": pytest.approx(100 / 3), "f1": pytest.approx(100 * 1.8 / 3)}


def test_squad_scores_v2_reports_has_and_no_answer():
    examples = [question("q1", "Denver Broncos"), question("q2", impossible=True), question("q3", impossible=True)]
    scores = squad_scores({"q1": "Denver", "q2": "", "q3": "Carolina"}, examples)
    f1_q1 = 2 * 1 * 0.5 / 1.5
    assert scores["exact_match"] == pytest.approx(100 / 3)
    assert scores["f1"] == pytest.approx(100 * (f1_q1 + 1) / 3)
    assert scores["HasAns_exact"] == 0.0 and scores["HasAns_f1"] == pytest.approx(100 * f1_q1)
    assert scores["NoAns_exact"] == 50.0 and scores["NoAns_f1"] == 50.0
    assert scores["HasAns_total"] == 1 and scores["NoAns_total"] == 2


def test_squad_scores_errors():
    with pytest.raises(LmforgeError, match="empty"):
        squad_scores({}, [])
    with pytest.raises(LmforgeError, match="must be a string"):
        squad_scores({"q1": 3}, [question("q1", "Broncos")])
    with pytest.raises(LmforgeError, match="no gold answers"):
        squad_scores({"q1": "x"}, [question("q1")])

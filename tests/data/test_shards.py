"""prepare_corpus and ShardedCorpus: exact round trips, shard layout, formats, the BBC corpus, bad inputs."""

import json
from pathlib import Path

import numpy as np
import pytest

from lmforge.data.sentences import split_paragraphs, split_sentences
from lmforge.data.shards import (
    MANIFEST_NAME,
    ShardedCorpus,
    detect_format,
    file_documents,
    load_file_records,
    prepare_corpus,
    token_dtype,
    tokenizer_hash,
)
from lmforge.errors import InputFileError, LmforgeError
from lmforge.tokenizers import WordPieceTokenizer, WordPieceTrainer

from .conftest import synthetic_documents, write_lines_file

PROSE = """A title without a period

Mr. Smith went to Washington. He arrived at 3.30 p.m. on Monday. "Good," he said.
Then he went home.

Sales rose 3.5% to $1.13bn. Analysts were pleased!
"""


def read_all(corpus: ShardedCorpus) -> list[list[list[int]]]:
    return [[s.tolist() for s in corpus.document(d)] for d in range(corpus.num_documents)]


def test_lines_format_round_trips_exactly(corpus, corpus_docs, tokenizer):
    assert corpus.num_documents == len(corpus_docs)
    expected = [[tokenizer.encode_ids(s) for s in doc] for doc in corpus_docs]
    assert read_all(corpus) == expected
    assert corpus.num_sentences == sum(map(len, corpus_docs))
    assert corpus.num_tokens == sum(len(s) for doc in expected for s in doc)
    for d in range(corpus.num_documents):
        np.testing.assert_array_equal(corpus.document_tokens(d), sum(expected[d], []))
        assert corpus.document_lengths[d] == len(sum(expected[d], []))
    np.testing.assert_array_equal(corpus.document_tokens(-1), corpus.document_tokens(corpus.num_documents - 1))
    with pytest.raises(IndexError):
        corpus.document(corpus.num_documents)


def test_shards_hold_whole_documents_and_read_back_identically(tmp_path, tokenizer_dir, corpus, corpus_docs):
    # the fixture was prepared with 600-token shards: several shards, each within the limit (whole documents)
    manifest = corpus.manifest
    assert corpus.num_shards >= 4
    for entry in manifest["shards"]:
        ids = np.load(corpus.path / f"{entry['name']}.ids.npy", mmap_mode="r")
        sent = np.load(corpus.path / f"{entry['name']}.sent.npy")
        doc = np.load(corpus.path / f"{entry['name']}.doc.npy")
        assert ids.dtype == np.uint16 and sent.dtype == np.int64 and doc.dtype == np.int64
        assert sent[-1] == len(ids) == entry["tokens"] and doc[-1] == len(sent) == entry["sentences"]
        assert len(ids) <= 600
    assert sum(e["tokens"] for e in manifest["shards"]) == manifest["counts"]["tokens"]
    # one big shard, two worker processes: the same corpus
    write_lines_file(tmp_path / "text" / "a.txt", corpus_docs[:10])
    write_lines_file(tmp_path / "text" / "b.txt", corpus_docs[10:])
    prepare_corpus(tokenizer_dir, [tmp_path / "text"], tmp_path / "one", workers=2, show_progress=False)
    one = ShardedCorpus(tmp_path / "one")
    assert one.num_shards == 1
    assert read_all(one) == read_all(corpus)


def test_manifest_contents(corpus, tokenizer_dir, tokenizer):
    m = json.loads((corpus.path / MANIFEST_NAME).read_text())
    assert m["version"] == 1 and m["dtype"] == "uint16" and m["vocab_size"] == tokenizer.vocab_size
    assert m["tokenizer"]["hash"] == tokenizer_hash(tokenizer_dir) == tokenizer_hash(tokenizer)
    assert m["special_ids"] == {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4}
    assert m["counts"]["files"] == 2 and m["counts"]["invalid_utf8_bytes"] == 0
    files = load_file_records(corpus.path)
    assert [f["format"] for f in files] == ["lines", "lines"] and m["formats"] == {"lines": 2}
    assert sum(f["documents"] for f in files) == m["counts"]["documents"] == 24


def test_tokenizer_hash_covers_vocabulary_and_casing(tokenizer):
    cased = WordPieceTokenizer(tokenizer.ids_to_tokens, lowercase=False)
    assert tokenizer_hash(cased) != tokenizer_hash(tokenizer)
    assert tokenizer_hash(WordPieceTokenizer(tokenizer.ids_to_tokens)) == tokenizer_hash(tokenizer)


def test_dtype_choice():
    assert token_dtype(30522) == np.uint16 and token_dtype(65535) == np.uint16
    assert token_dtype(65536) == np.uint32 and token_dtype(250_000) == np.uint32


def test_format_detection_and_documents_format(tmp_path, tokenizer_dir, tokenizer):
    lines_text = "\n\n".join("\n".join(doc) for doc in synthetic_documents(3, seed=1, sentences=(3, 5)))
    assert detect_format(lines_text) == "lines"
    assert detect_format(PROSE) == "documents"
    assert detect_format("One sentence. Another one here.\nAnd a third. Then four.\n") == "documents"
    fmt, docs = file_documents(PROSE, "auto")
    assert fmt == "documents" and len(docs) == 1
    assert docs[0] == ["A title without a period", "Mr. Smith went to Washington.",
                       "He arrived at 3.30 p.m. on Monday.", '"Good," he said.', "Then he went home.",
                       "Sales rose 3.5% to $1.13bn.", "Analysts were pleased!"]
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "prose.txt").write_text(PROSE, encoding="utf-8")
    (tmp_path / "in" / "lines.txt").write_text(lines_text, encoding="utf-8")
    m = prepare_corpus(tokenizer_dir, [tmp_path / "in"], tmp_path / "out", workers=1, show_progress=False)
    assert {f["path"].rsplit("/", 1)[1]: f["format"] for f in load_file_records(tmp_path / "out")} == {
        "lines.txt": "lines",
                                                                             "prose.txt": "documents"}
    assert m["counts"]["documents"] == 4
    # forcing a format applies it to every file
    m = prepare_corpus(tokenizer_dir, [tmp_path / "in"], tmp_path / "out", input_format="documents",
                       workers=1, overwrite=True, show_progress=False)
    assert m["counts"]["documents"] == 2 and m["formats"] == {"documents": 2}
    corpus = ShardedCorpus(tmp_path / "out", tokenizer)
    expected = [tokenizer.encode_ids(s) for p in split_paragraphs(lines_text) for s in split_sentences(p)]
    assert read_all(corpus)[0] == expected


def test_empty_sentences_and_documents_are_dropped(tmp_path, tokenizer_dir):
    (tmp_path / "in").mkdir()
    # U+FFFD and control characters are removed by BERT's cleaning: those sentences have no tokens
    (tmp_path / "in" / "a.txt").write_text("Ka lo mi.\n\ufffd\ufffd\nSu ta.\n\n\ufffd\n\x00\n\n  \n", encoding="utf-8")
    m = prepare_corpus(tokenizer_dir, [tmp_path / "in"], tmp_path / "out", input_format="lines", workers=1,
                       show_progress=False)
    assert m["counts"]["documents"] == 1 and m["counts"]["sentences"] == 2
    assert m["counts"]["dropped_empty_sentences"] == 3 and m["counts"]["dropped_empty_documents"] == 1


def test_overwrite_moves_the_old_folder_aside(tmp_path, tokenizer_dir, corpus_docs):
    write_lines_file(tmp_path / "a.txt", corpus_docs)
    prepare_corpus(tokenizer_dir, [tmp_path / "a.txt"], tmp_path / "out", workers=1, shard_size_tokens=500,
                   show_progress=False)
    n_before = len(list((tmp_path / "out").glob("shard-*.ids.npy")))
    assert n_before > 1
    with pytest.raises(LmforgeError, match="is not empty.*--overwrite"):
        prepare_corpus(tokenizer_dir, [tmp_path / "a.txt"], tmp_path / "out", workers=1, show_progress=False)
    (tmp_path / "out" / "notes.md").write_text("mine")
    prepare_corpus(tokenizer_dir, [tmp_path / "a.txt"], tmp_path / "out", workers=1, overwrite=True,
                   show_progress=False)
    assert len(list((tmp_path / "out").glob("shard-*.npy"))) == 3  # a fresh folder: no stale shards
    (aside,) = tmp_path.glob("out.old-*")  # the old folder, user's file included, kept whole
    assert (aside / "notes.md").read_text() == "mine"
    assert len(list(aside.glob("shard-*.ids.npy"))) == n_before
    assert not list(tmp_path.glob(".out.partial-*"))  # no temporary folder left
    assert ShardedCorpus(tmp_path / "out").num_documents == len(corpus_docs)
    assert (tmp_path / "out" / "tokenizer" / "vocab.txt").is_file()


def test_interrupted_prepare_leaves_nothing_and_the_next_run_cleans_up(tmp_path, tokenizer_dir, corpus_docs,
                                                                       monkeypatch, caplog):
    import lmforge.data.shards as shards

    write_lines_file(tmp_path / "a.txt", corpus_docs)

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(shards, "_save_npy", killed)
    with pytest.raises(KeyboardInterrupt):
        prepare_corpus(tokenizer_dir, [tmp_path / "a.txt"], tmp_path / "out", workers=1, show_progress=False)
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.partial-*"))
    monkeypatch.undo()
    # a kill -9 leaves the hidden partial folder of a dead process: the next run removes it and says so
    stale = tmp_path / ".out.partial-999999999"
    (stale / "shard-00000.ids.npy").parent.mkdir()
    (stale / "shard-00000.ids.npy").write_bytes(b"half")
    with caplog.at_level("WARNING", logger="lmforge"):
        prepare_corpus(tokenizer_dir, [tmp_path / "a.txt"], tmp_path / "out", workers=1, show_progress=False)
    assert not stale.exists() and "left by an interrupted run" in caplog.text
    assert ShardedCorpus(tmp_path / "out").num_documents == len(corpus_docs)


def test_memory_stays_bounded_by_one_shard(tmp_path, tokenizer_dir):
    import tracemalloc

    docs = synthetic_documents(900, seed=11, sentences=(6, 10), words=(10, 14))
    for k in range(90):  # small files: what one file costs while it is tokenized stays small
        write_lines_file(tmp_path / "in" / f"{k}.txt", docs[k * 10:(k + 1) * 10])

    def peak(shard_size: int, out: str) -> tuple[int, int]:
        tracemalloc.start()
        m = prepare_corpus(tokenizer_dir, [tmp_path / "in"], tmp_path / out, workers=1,
                           shard_size_tokens=shard_size, show_progress=False)
        _, top = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        return top, m["counts"]["tokens"]

    small, tokens = peak(20_000, "small")
    big, _ = peak(10_000_000, "big")
    ids_bytes = 2 * tokens  # uint16
    assert tokens > 200_000 and len(list((tmp_path / "small").glob("*.ids.npy"))) >= 10
    assert big - small > ids_bytes  # one big shard holds the whole corpus in memory (measured: about 2x)...
    assert small < ids_bytes  # ...small shards keep the peak below the size of the corpus's ids
    assert read_all(ShardedCorpus(tmp_path / "small")) == read_all(ShardedCorpus(tmp_path / "big"))


def test_bbc_corpus_with_two_workers(tmp_path, bbc_dir, bbc_texts):
    tok = WordPieceTrainer(800).train(bbc_texts[::20])
    tok.save_pretrained(tmp_path / "tok")
    m = prepare_corpus(tmp_path / "tok", [bbc_dir], tmp_path / "bbc", workers=2, show_progress=False)
    assert m["counts"]["files"] == m["counts"]["documents"] == 2225
    assert m["formats"] == {"documents": 2225}
    records = load_file_records(tmp_path / "bbc")
    assert [(Path(k).parts[-2:], v) for k, v in m["bad_files"].items()] == [(("sports", "199.txt"), 1)]
    assert m["counts"]["invalid_utf8_bytes"] == 1  # the one Latin-1 file is reported
    corpus = ShardedCorpus(tmp_path / "bbc", tmp_path / "tok")
    assert corpus.num_sentences > 30_000 and corpus.num_tokens > 1_000_000
    for d in (0, 1000, 2224):  # spot checks: the splitter's sentences, tokenized
        path = records[d]["path"]
        text = open(path, "rb").read().decode("utf-8", errors="replace")
        expected = [tok.encode_ids(s) for p in split_paragraphs(text) for s in split_sentences(p)]
        assert [s.tolist() for s in corpus.document(d)] == [e for e in expected if e]


# ------------------------------------------------------------------------------------------------ bad inputs
def test_missing_manifest_and_folder(tmp_path):
    with pytest.raises(InputFileError, match="no such prepared corpus folder.*lmforge data prepare"):
        ShardedCorpus(tmp_path / "nowhere")
    (tmp_path / "half").mkdir()
    with pytest.raises(InputFileError, match="no manifest.json.*run `lmforge data prepare"):
        ShardedCorpus(tmp_path / "half")


def test_tokenizer_mismatch_names_both_folders(tmp_path, corpus, corpus_docs):
    other = WordPieceTrainer(70, min_frequency=1).train([" ".join(d) for d in corpus_docs])
    other.save_pretrained(tmp_path / "other_tok")
    with pytest.raises(LmforgeError) as err:
        ShardedCorpus(corpus.path, tmp_path / "other_tok")
    message = str(err.value)
    assert str(corpus.path) in message and str(tmp_path / "other_tok") in message
    assert corpus.manifest["tokenizer"]["path"] in message and "Prepare the corpus again" in message
    with pytest.raises(LmforgeError, match="different one"):
        ShardedCorpus(corpus.path, other)


def test_empty_corpus_and_missing_tokenizer(tmp_path, tokenizer_dir):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "blank.txt").write_text("\n \n\n", encoding="utf-8")
    with pytest.raises(InputFileError, match="the corpus is empty"):
        prepare_corpus(tokenizer_dir, [tmp_path / "in"], tmp_path / "out", workers=1, show_progress=False)
    assert not (tmp_path / "out" / MANIFEST_NAME).exists()
    with pytest.raises(InputFileError, match="no vocab.txt"):
        (tmp_path / "tok").mkdir()
        prepare_corpus(tmp_path / "tok", [tmp_path / "in"], tmp_path / "out2", show_progress=False)
    with pytest.raises(InputFileError, match="no such file or folder"):
        prepare_corpus(tokenizer_dir, [tmp_path / "missing.txt"], tmp_path / "out3", show_progress=False)
    with pytest.raises(LmforgeError, match="input_format"):
        prepare_corpus(tokenizer_dir, [tmp_path / "in"], tmp_path / "out4", input_format="csv")


def test_changed_shard_is_detected(tmp_path, tokenizer_dir, corpus_docs):
    write_lines_file(tmp_path / "a.txt", corpus_docs)
    prepare_corpus(tokenizer_dir, [tmp_path / "a.txt"], tmp_path / "out", workers=1, show_progress=False)
    np.save(tmp_path / "out" / "shard-00000.ids.npy", np.zeros(3, dtype=np.uint16))
    with pytest.raises(InputFileError, match="does not match the manifest"):
        ShardedCorpus(tmp_path / "out")
    (tmp_path / "out" / "shard-00000.doc.npy").unlink()
    with pytest.raises(InputFileError, match="missing or unreadable"):
        ShardedCorpus(tmp_path / "out")


def test_large_lines_files_are_read_in_document_aligned_pieces(tmp_path, tokenizer_dir, monkeypatch):
    from lmforge.data import shards

    docs = synthetic_documents(40, seed=5)
    write_lines_file(tmp_path / "in" / "big.txt", docs)
    (tmp_path / "in" / "prose.txt").write_text(PROSE * 20, encoding="utf-8")  # one document, read whole
    crlf = "\r\n\r\n".join("\r\n".join(d) for d in synthetic_documents(6, seed=6))
    (tmp_path / "in" / "crlf.txt").write_bytes(crlf.encode())
    texts = "\n".join(" ".join(d[:2]) for d in synthetic_documents(120, seed=7)) + "\n"  # one text per line
    (tmp_path / "in" / "texts.txt").write_text(texts, encoding="utf-8")
    reference = prepare_corpus(tokenizer_dir, [tmp_path / "in"], tmp_path / "whole", workers=1, show_progress=False)
    size = (tmp_path / "in" / "big.txt").stat().st_size
    points = shards._cut_points(tmp_path / "in" / "big.txt", size, 1000)
    assert len(points) > 10 and points[-1] == size
    data = (tmp_path / "in" / "big.txt").read_bytes()
    assert all(data[p - 2:p] == b"\n\n" for p in points[1:-1])
    assert len(shards._file_jobs(0, tmp_path / "in" / "big.txt", "auto", 1000)) == len(points) - 1
    assert [j[4] for j in shards._file_jobs(0, tmp_path / "in" / "prose.txt", "auto", 1000)] == ["documents"]
    assert len(shards._file_jobs(0, tmp_path / "in" / "crlf.txt", "lines", 300)) > 1
    text_jobs = shards._file_jobs(0, tmp_path / "in" / "texts.txt", "auto", 1000)  # cut at any line break
    assert len(text_jobs) > 3 and {j[4] for j in text_jobs} == {"texts"}
    assert reference["formats"]["texts"] == 1
    monkeypatch.setattr(shards, "CHUNK_BYTES", 1000)
    for workers in (1, 2):
        m = prepare_corpus(tokenizer_dir, [tmp_path / "in"], tmp_path / f"pieces{workers}", workers=workers,
                           show_progress=False)
        assert load_file_records(tmp_path / f"pieces{workers}") == load_file_records(tmp_path / "whole")
        assert m["counts"] == reference["counts"]
        assert read_all(ShardedCorpus(tmp_path / f"pieces{workers}")) == read_all(ShardedCorpus(tmp_path / "whole"))


def test_the_log_says_which_format_each_file_was_read_as_and_warns_of_one_long_lines_document(tmp_path,
                                                                                            tokenizer_dir, caplog):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "prose.txt").write_text(PROSE, encoding="utf-8")
    questions = [f"Who wrote the letter number {i}?" for i in range(250)]  # one text per line, no blank lines
    (tmp_path / "in" / "questions.txt").write_text("\n".join(questions) + "\n", encoding="utf-8")
    with caplog.at_level("INFO", logger="lmforge"):
        m = prepare_corpus(tokenizer_dir, [tmp_path / "in"], tmp_path / "out", workers=1, show_progress=False)
    # one text per line and no blank line: each line is a document of its own (issue 37, item 7)
    assert m["formats"] == {"documents": 1, "texts": 1}
    assert m["counts"]["documents"] == 251
    assert "read 1 file(s) as documents (each file one document, split into sentences); 1 file(s) as texts (one " \
           "text per line, each a document" in caplog.text and "--format auto decided per file" in caplog.text
    # forced to BERT's format, the same file is one long document, and the warning names the fix
    caplog.clear()
    with caplog.at_level("INFO", logger="lmforge"):
        prepare_corpus(tokenizer_dir, [tmp_path / "in" / "questions.txt"], tmp_path / "out-lines", workers=1,
                       input_format="lines", show_progress=False)
    assert "questions.txt: read as lines (one sentence per line) with no blank line between documents, so its 250 " \
           "lines are one document" in caplog.text and "--format texts" in caplog.text
    assert "prose.txt: read as lines" not in caplog.text


def test_texts_format_detection_keeps_hard_wrapped_prose_and_short_files_apart():
    tweets = "\n".join(f"@user{i} loving the new phone {i} lol" for i in range(30)) + "\n"
    assert detect_format(tweets) == "texts"
    reviews = "\n".join(f"Great film number {i}. The cast is superb! Would watch again." for i in range(25))
    assert detect_format(reviews) == "texts"
    fmt, docs = file_documents(reviews, "auto")
    assert fmt == "texts" and len(docs) == 25 and docs[0] == ["Great film number 0.", "The cast is superb!",
                                                              "Would watch again."]
    wrapped = "\n".join(["The committee met on Tuesday to discuss the budget and the plans for"] +
                        ["the coming year, which several members said would be difficult for"] * 24 +
                        ["everyone."])
    assert detect_format(wrapped) == "documents"  # one paragraph cut at a fixed width
    assert detect_format("\n".join(f"Who wrote letter {i}?" for i in range(5))) == "lines"  # too few for texts

"""Corpus -> word counts -> vocabulary, and a streaming corpus of token ids for static embeddings.

Words are BERT's basic words (``lmforge.tokenizers.basic.BasicTokenizer``: lower-cased, accents stripped,
punctuation split off), and the punctuation characters it isolates are then dropped: they carry no meaning of
their own and would otherwise be among the most frequent "words" (the reference word2vec corpora, text8 and
Google News, hold no punctuation either). Each non-empty line is a sentence: windows never cross a line break,
as in gensim's ``LineSentence`` (a line longer than ``MAX_SENTENCE_WORDS`` words is cut into pieces of that
size, as gensim does; the C tool cuts at 1,000).

Memory stays bounded by the vocabulary, not the corpus: one pass tokenizes each file, counts the words and
appends their ids (numbered in order of first appearance) to a temporary file of int32, which is memory-mapped
afterwards. Words rarer than ``min_count`` are then mapped to -1 by a small table and dropped chunk by chunk
while training reads the corpus, before any window is formed (as the C tool and gensim do: a dropped word
does not take a position).
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from lmforge.data.text import ReadStats, collect_text_files, read_texts
from lmforge.errors import InputFileError, LmforgeError
from lmforge.tokenizers.basic import BasicTokenizer, is_punctuation

log = logging.getLogger("lmforge")

MAX_SENTENCE_WORDS = 10_000  # gensim's MAX_WORDS_IN_BATCH


def split_words(text: str, tokenizer: BasicTokenizer) -> list[str]:
    """The words of one line: BERT basic words without the isolated punctuation characters."""
    return [w for w in tokenizer.tokenize(text) if not (len(w) == 1 and is_punctuation(w))]


@dataclass
class Vocabulary:
    """Words kept for training, most frequent first, with their corpus counts.

    Attributes:
        words: the kept words; a word's id is its position (id 0 is the most frequent word).
        counts: (V,) int64 corpus count of each kept word.
        index: word -> id.
        total_words: the number of word occurrences in the corpus before ``min_count`` (for reports).
        min_count: the threshold that was applied.
    """

    words: list[str]
    counts: np.ndarray
    index: dict[str, int] = field(repr=False)
    total_words: int = 0
    min_count: int = 1

    @classmethod
    def from_counts(cls, counts: dict[str, int], min_count: int = 5) -> Vocabulary:
        """Keep the words seen at least ``min_count`` times, sorted by count (ties keep first appearance).

        Raises:
            LmforgeError: ``min_count`` < 1, no words at all, or ``min_count`` removes every word.
        """
        if min_count < 1:
            raise LmforgeError(f"min_count={min_count} must be at least 1")
        if not counts:
            raise InputFileError("the corpus holds no words; give text files with content")
        kept = [(w, c) for w, c in counts.items() if c >= min_count]
        if not kept:
            top = max(counts.values())
            raise LmforgeError(f"min_count={min_count} removes every word: the most frequent of the "
                               f"{len(counts):,} distinct words occurs {top} time(s); lower --min-count to "
                               f"at most {top} or give a larger corpus")
        kept.sort(key=lambda wc: -wc[1])  # stable: ties keep the dictionary's (first appearance) order
        words = [w for w, _ in kept]
        return cls(words=words, counts=np.array([c for _, c in kept], dtype=np.int64),
                   index={w: i for i, w in enumerate(words)}, total_words=int(sum(counts.values())),
                   min_count=min_count)

    def __len__(self) -> int:
        return len(self.words)

    @property
    def kept_words(self) -> int:
        """Occurrences of kept words in the corpus (the words training sees before subsampling)."""
        return int(self.counts.sum())


class EncodedCorpus:
    """A corpus as one array of word ids plus sentence boundaries, read in chunks of whole sentences.

    The ids are those of the first pass (order of first appearance, see ``raw_words``); ``remap`` turns them into
    vocabulary ids, -1 for dropped words. Build it with ``encode_corpus`` (files, memory-mapped) or
    ``EncodedCorpus.from_sentences`` (in memory, for tests and benchmarks).

    Args:
        ids: (N,) int32 raw word ids, all sentences one after another.
        starts: (S + 1,) int64 offsets of the sentences in ``ids`` (``starts[-1] == N``).
        raw_words: the word of each raw id.
        counts: (len(raw_words),) int64 corpus count of each raw word.
        workdir: a temporary folder that ``close`` deletes (None when everything is in memory).
    """

    def __init__(self, ids: np.ndarray, starts: np.ndarray, raw_words: list[str], counts: np.ndarray,
                 workdir: Path | None = None) -> None:
        self.ids = ids
        self.starts = starts
        self.raw_words = raw_words
        self.counts = counts
        self.workdir = workdir
        self.remap: np.ndarray | None = None

    @classmethod
    def from_sentences(cls, sentences: Iterable[Sequence[str]]) -> EncodedCorpus:
        """Encode already split sentences (lists of words) in memory."""
        index: dict[str, int] = {}
        ids: list[int] = []
        starts = [0]
        for sentence in sentences:
            for start in range(0, len(sentence), MAX_SENTENCE_WORDS):
                piece = sentence[start:start + MAX_SENTENCE_WORDS]
                ids.extend(index.setdefault(w, len(index)) for w in piece)
                starts.append(len(ids))
        arr = np.array(ids, dtype=np.int32)
        counts = np.bincount(arr, minlength=len(index)).astype(np.int64)
        return cls(arr, np.array(starts, dtype=np.int64), list(index), counts)

    def word_counts(self) -> dict[str, int]:
        return {w: int(c) for w, c in zip(self.raw_words, self.counts, strict=True)}

    def build_vocabulary(self, min_count: int) -> Vocabulary:
        """Apply ``min_count``, set ``remap`` and return the vocabulary (see ``Vocabulary.from_counts``)."""
        vocab = Vocabulary.from_counts(self.word_counts(), min_count)
        self.set_vocabulary(vocab)
        return vocab

    def set_vocabulary(self, vocab: Vocabulary) -> None:
        """Map raw ids to ``vocab``'s ids (-1 for words it does not hold)."""
        self.remap = np.array([vocab.index.get(w, -1) for w in self.raw_words], dtype=np.int64)

    @property
    def total_words(self) -> int:
        return int(self.ids.shape[0])

    @property
    def n_sentences(self) -> int:
        return int(self.starts.shape[0] - 1)

    def chunks(self, max_words: int = 100_000) -> Iterator[tuple[np.ndarray, np.ndarray, int]]:
        """Whole sentences, about ``max_words`` raw words at a time, in vocabulary ids with dropped words removed.

        Yields:
            ``(ids, sentence, raw)``: (n,) int64 vocabulary ids; (n,) int64 sentence number of each id (only
            equality between neighbours matters); and the number of raw words the chunk covered, dropped words
            included (the unit of training progress, as in gensim and the C tool).
        """
        if self.remap is None:
            raise LmforgeError("no vocabulary set; call build_vocabulary(min_count) first")
        n_sent = self.n_sentences
        s = 0
        while s < n_sent:
            # the first sentence boundary at or after max_words past this chunk's start
            e = int(np.searchsorted(self.starts, self.starts[s] + max_words, side="left"))
            e = min(max(e, s + 1), n_sent)
            lo, hi = int(self.starts[s]), int(self.starts[e])
            raw_ids = np.asarray(self.ids[lo:hi])
            lengths = np.diff(self.starts[s:e + 1])
            sentence = np.repeat(np.arange(s, e, dtype=np.int64), lengths)
            ids = self.remap[raw_ids]
            keep = ids >= 0
            yield ids[keep], sentence[keep], hi - lo
            s = e

    def close(self) -> None:
        """Delete the temporary files (memory-mapped arrays must not be used afterwards)."""
        if self.workdir is not None:
            self.ids = np.zeros(0, dtype=np.int32)
            self.starts = np.zeros(1, dtype=np.int64)
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    def __enter__(self) -> EncodedCorpus:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def encode_corpus(paths: Iterable[str | Path], tmp_dir: str | Path | None = None, stats: ReadStats | None = None,
                  progress: bool = False) -> EncodedCorpus:
    """Tokenize text files (or folders of ``.txt``) once into a memory-mapped ``EncodedCorpus``.

    Args:
        paths: files and folders, as for ``lmforge.data.text.collect_text_files``.
        tmp_dir: where the temporary id files go (default: the system's temporary folder).
        stats: filled with what was read (files, bytes, invalid UTF-8).
        progress: show a progress bar over files.

    Raises:
        InputFileError: a path is missing, or the corpus holds no words.
    """
    from tqdm.auto import tqdm

    files = collect_text_files(paths)
    stats = stats if stats is not None else ReadStats()
    tokenizer = BasicTokenizer()
    workdir = Path(tempfile.mkdtemp(prefix="lmforge-corpus-", dir=tmp_dir))
    index: dict[str, int] = {}
    counts: list[int] = []
    n_ids = n_sentences = 0
    try:
        with open(workdir / "ids.int32", "wb") as f_ids, open(workdir / "starts.int64", "wb") as f_starts:
            f_starts.write(np.zeros(1, dtype=np.int64).tobytes())
            for _, text in read_texts(tqdm(files, desc="reading", unit="file", disable=not progress), stats):
                buf: list[int] = []
                ends: list[int] = []  # sentence ends, as offsets in the whole corpus
                for line in text.splitlines():
                    words = split_words(line, tokenizer)
                    for start in range(0, len(words), MAX_SENTENCE_WORDS):
                        for w in words[start:start + MAX_SENTENCE_WORDS]:
                            i = index.get(w)
                            if i is None:
                                i = index[w] = len(counts)
                                counts.append(0)
                            counts[i] += 1
                            buf.append(i)
                        ends.append(n_ids + len(buf))
                if buf:
                    f_ids.write(np.array(buf, dtype=np.int32).tobytes())
                    f_starts.write(np.array(ends, dtype=np.int64).tobytes())
                    n_ids += len(buf)
                    n_sentences += len(ends)
        if n_ids == 0:
            raise InputFileError(f"the input ({stats.summary()}) holds no words; give text files with content")
        ids = np.memmap(workdir / "ids.int32", dtype=np.int32, mode="r", shape=(n_ids,))
        starts = np.memmap(workdir / "starts.int64", dtype=np.int64, mode="r", shape=(n_sentences + 1,))
    except BaseException:
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    log.info("read %s: %s words, %s distinct, %s sentences (lines)", stats.summary(), f"{n_ids:,}",
             f"{len(index):,}", f"{n_sentences:,}")
    return EncodedCorpus(ids, starts, list(index), np.array(counts, dtype=np.int64), workdir=workdir)

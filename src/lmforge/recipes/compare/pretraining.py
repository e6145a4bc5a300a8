"""What a comparison trains once, on its training texts only, before any run: the static vectors (Word2Vec,
GloVe) of the ``vectors`` approaches and the models of its ``[[pretrain]]`` tables."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from lmforge.config import from_dict
from lmforge.recipes.compare.config import PretrainSpec

log = logging.getLogger("lmforge")


def train_static_vectors(kind: str, sentences: list[list[str]], out: Path, *, dim: int, epochs: int, window: int,
                         seed: int) -> Path:
    """Word2Vec (skip-gram) or GloVe vectors of the word pieces in ``sentences``, saved in word2vec text format.

    ``min_count`` is 1: every piece of the tokenizer's vocabulary that occurs gets a vector.
    """
    from lmforge.embeddings.glove import GloVeConfig
    from lmforge.embeddings.vocab import EncodedCorpus
    from lmforge.embeddings.word2vec import Word2VecConfig
    from lmforge.recipes.vectors import train_vectors

    settings = dict(dim=dim, window=window, epochs=epochs, min_count=1, seed=seed + 1)
    if kind == "word2vec":
        from lmforge.embeddings import sgns

        mode = "exact" if sgns.available() else "fast"
        if mode == "fast":
            log.warning("compare: Word2Vec's compiled loop was not built (no C compiler at install); training the "
                        "batched approximation (mode fast) instead")
        config = Word2VecConfig(mode=mode, **settings)
    else:
        config = GloVeConfig(**settings)
    level = log.level
    log.setLevel(logging.WARNING)  # one summary line instead of the vocabulary and every epoch
    try:
        result, _ = train_vectors(config, EncodedCorpus.from_sentences(sentences), out=out, metrics=False,
                                  progress=False)
    finally:
        log.setLevel(level)
    final = f", final loss {result.epochs[-1].loss:.3f}" if result.epochs else ""
    log.info("compare: %s (%d dims) on the training texts: %.1f s%s", kind, dim, result.seconds, final)
    return out


def pretrain_here(spec: PretrainSpec, texts: list[str], tokenizer_dir: str, work: Path, out: Path,
                  seed: int) -> float:
    """Pretrain ``spec`` on ``texts`` (one document each) into the model folder ``out``; returns the seconds.

    The texts are tokenized once into ``work/shards`` (shared by every [[pretrain]] table); an interrupted
    pretraining continues from its last checkpoint (``resume="auto"``). A biLM that reads whole words
    (``input_unit = "word"``, the elmo presets') gets a word-level tokenizer of the same texts instead
    (``word_tokenizer``) and its own ``work/word-shards``.
    """
    from lmforge.config import PRESETS, DataConfig, TrainConfig
    from lmforge.data.shards import MANIFEST_NAME, prepare_corpus
    from lmforge.recipes.pretrain import PretrainRun, build_trainer, plateau_warning

    words = {**PRESETS.get(spec.preset, {}), **spec.model}.get("input_unit") == "word"
    shards = work / ("word-shards" if words else "shards")
    if not (shards / MANIFEST_NAME).is_file():
        docs = work / "texts"
        docs.mkdir(parents=True, exist_ok=True)
        for i, text in enumerate(texts):
            (docs / f"{i:06d}.txt").write_text(text + "\n", encoding="utf-8")
        if words:
            tokenizer_dir = str(word_tokenizer(texts, tokenizer_dir, work / "word-tokenizer"))
        prepare_corpus(tokenizer_dir, [docs], shards, input_format="documents", workers=1, overwrite=True,
                       show_progress=False)
    where = f"[[pretrain]] {spec.name!r}"
    data = from_dict(DataConfig, {**spec.data, "path": str(shards), "objective": spec.objective},
                     where=f"{where}: data")
    train = from_dict(TrainConfig, {"seed": seed, "log_every": 10, **spec.train}, where=f"{where}: train")
    run = PretrainRun(preset=spec.preset, out=str(out), model=dict(spec.model), data=data, loss=dict(spec.loss),
                      train=train, dropout_off=spec.dropout_off)
    start = time.perf_counter()
    level = log.level
    log.setLevel(logging.WARNING)
    try:
        trainer = build_trainer(run, resume="auto", progress=False)
        final = trainer.fit()
    finally:
        log.setLevel(level)
    seconds = time.perf_counter() - start
    shown = ", ".join(f"{k} {v:.3f}" for k, v in final.items() if k.startswith("eval_") and isinstance(v, float))
    log.info("compare: pretrained %s (%s, %s, %d steps) on the training texts in %.1f min%s", spec.name, spec.preset,
             spec.objective, trainer.step, seconds / 60, f"; held out: {shown}" if shown else "")
    if (warning := plateau_warning(final)) is not None:
        log.warning("compare: [[pretrain]] %s: %s", spec.name, warning)
    return seconds


WORD_MIN_COUNT = 3  # bilm-tf's vocabulary of the 1B Word Benchmark: the words seen at least 3 times
WORD_VOCAB_MAX = 100_000


def word_tokenizer(texts: list[str], tokenizer_dir: str, out: Path) -> Path:
    """A word-level tokenizer of ``texts`` (``lmforge tokenizer train --algorithm words``: the words seen at least
    ``WORD_MIN_COUNT`` times, at most ``WORD_VOCAB_MAX``, the others [UNK]), cased as the comparison's tokenizer in
    ``tokenizer_dir``; saved in ``out``."""
    from lmforge.tokenizers import WordPieceTokenizer, WordPieceTrainer

    cased = WordPieceTokenizer.from_pretrained(tokenizer_dir)
    trainer = WordPieceTrainer(WORD_VOCAB_MAX, algorithm="words", min_frequency=WORD_MIN_COUNT,
                               lowercase=cased.lowercase)
    trainer.train(texts).save_pretrained(out, overwrite=True)
    log.info("compare: a word-level tokenizer for the biLM: %d words (%.1f%% of the running words [UNK])",
             trainer.report["words_used"], 100 * trainer.report["unknown_token_rate"])
    return out

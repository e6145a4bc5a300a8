"""The demo (``make demo``, ``lmforge demo``): the whole story on the embedded BBC News corpus, from a tokenizer to
transfer learning.

The BBC articles are split once (stratified 80/20 by topic, seed 0); only the training articles are used for
the tokenizer, pretraining and the static vectors, so the test articles stay unseen.

1. Train WordPiece tokenizers with the likelihood score and by pair count; show encoded examples, vocabulary
   sizes and pieces per word.
2. Tokenize the training articles into shards (``lmforge data prepare``).
3. Pretrain a bert-mini for 6 minutes with the small-budget recipe (``configs/bert-mini-small-budget.toml``: pre-LN,
   rotary positions, an MLM un-embedding of its own, no dropout, MLM alone at a 40% mask rate, bf16 where the CPU
   has it) on 64-token blocks (the length the comparison fine-tunes on); MLM accuracy against the best constant
   guess, perplexity and the token states' mean cosine on held-out documents before and after, with the loss curve
   saved as a PNG. BERT's 2018 recipe (post-LN, dropout, MLM + NSP) would sit for minutes on the plateau where it
   predicts the unigram distribution and every input gets nearly the same vector; the small-budget recipe leaves it
   within a minute (BENCHMARKS.md, "Issue 36").
4. The comparison (``lmforge compare``, configs/compare-demo.toml): classifiers trained from scratch (the same
   bert-mini shape from random weights is the pretrained row's control), from Word2Vec / GloVe vectors trained here,
   and by fine-tuning our bert-mini and MiniLM (pretrained elsewhere), on 10 and 50 articles per class; ending with
   the table, the CSV and the learning curve. ULMFiT, ELMo and the frozen encoders are in configs/compare-bbc.toml:
   their own pretraining would not fit in the demo's quarter of an hour.

Everything lands under ``--out`` (default ``runs/demo``), which each demo run replaces.

Each step below is one function, in the story's order; each returns what it made, and ``lmforge.commands.demo``
runs them and prints their results.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmforge.errors import LmforgeError

if TYPE_CHECKING:
    from lmforge.data.text import ReadStats
    from lmforge.recipes.compare import CompareConfig
    from lmforge.recipes.pretrain import PretrainRun
    from lmforge.tokenizers import WordPieceTokenizer

DEFAULT_COMPARE = Path(__file__).resolve().parents[3] / "configs" / "compare-demo.toml"
DEFAULT_RECIPE = Path(__file__).resolve().parents[3] / "configs" / "bert-mini-small-budget.toml"
EXAMPLES = (
    "Quarterly profits at US media giant TimeWarner jumped 76% to $1.13bn.",
    "The Chancellor's pre-budget report promised unbelievably low inflation.",
)
MARKER = ".lmforge-demo"  # marks a folder that a demo run made, and that the next demo run may replace
# Both training criteria side by side. The likelihood score leaves frequent words in pieces (about 3 per word
# here), which makes pretraining sequences 3x longer for the same text; the model trains on the count-based one.
TOKENIZER_ALGORITHMS = ("wordpiece", "bpe-count")
PRETRAINING_TOKENIZER = "bpe-count"
HELD_OUT_METRICS = (("eval_mlm_accuracy", "MLM accuracy"), ("eval_mlm_constant_accuracy", "  best constant guess"),
                    ("eval_ppl_mlm", "MLM perplexity"), ("eval_nsp_accuracy", "NSP accuracy"),
                    ("eval_token_cosine", "token-state cosine"))


# ---------------------------------------------------------------------------------------------- 0. the data
def training_split() -> tuple[list[Path], list[Path]]:
    """The BBC files of the comparison's training and test split (the same stratified split)."""
    from lmforge.data.corpora import bbc_news_dir
    from lmforge.data.readers import stratified_split
    from lmforge.data.text import collect_text_files

    files = collect_text_files([bbc_news_dir()])
    labels = [f.parent.name for f in files]
    train, test = stratified_split(labels, 0.2, 0)
    return [files[i] for i in train], [files[i] for i in test]


def read_training_texts(files: list[Path]) -> tuple[list[str], ReadStats]:
    """The training articles' texts, and what reading them met (files, bytes, replaced characters)."""
    from lmforge.data.text import ReadStats, read_texts

    stats = ReadStats()
    return [t for _, t in read_texts(files, stats)], stats


def replace_demo_folder(out: Path) -> None:
    """Start the demo in an empty ``out``: a previous demo's folder is deleted, anything else is refused."""
    if out.exists() and any(out.iterdir()):
        if not (out / MARKER).is_file():
            raise LmforgeError(f"{out} is not empty and was not made by the demo; choose another --out (the demo "
                               "replaces its folder at each run)")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).write_text("made by the demo (`lmforge demo`, `python -m lmforge.demo`); the next demo run "
                              "replaces this folder\n", encoding="utf-8")


# ---------------------------------------------------------------------------------------------- 1. tokenizers
@dataclass
class TrainedTokenizer:
    """A WordPiece vocabulary trained on the training texts, with what the demo shows of it."""

    algorithm: str
    folder: Path
    vocab_size: int
    seconds: float
    pieces_per_word: float
    first_merges: list[str]  # "left+right" of the first merges
    examples: list[tuple[str, list[str]]]  # each of EXAMPLES and its tokens


def tokens_per_word(tokenizer: WordPieceTokenizer, texts: list[str]) -> float:
    """Word pieces per word (the words of the tokenizer's basic splitting) over ``texts``."""
    words = sum(len(tokenizer.basic.tokenize(t)) for t in texts)
    pieces = sum(len(tokenizer.encode_ids(t)) for t in texts)
    return pieces / max(words, 1)


def train_tokenizer(texts: list[str], out: Path, vocab_size: int, algorithm: str) -> TrainedTokenizer:
    """Step 1: a WordPiece vocabulary by ``algorithm`` (likelihood ``wordpiece`` or pair count ``bpe-count``),
    saved in ``out/tokenizer-<algorithm>``; the time covers the training only."""
    from lmforge.tokenizers import WordPieceTrainer

    start = time.perf_counter()
    trainer = WordPieceTrainer(vocab_size, algorithm=algorithm)
    tokenizer = trainer.train(texts)
    seconds = time.perf_counter() - start
    folder = out / f"tokenizer-{algorithm}"
    tokenizer.save_pretrained(folder, overwrite=True)
    examples = [(text, tokenizer.convert_ids_to_tokens(tokenizer(text)["input_ids"])) for text in EXAMPLES]
    return TrainedTokenizer(algorithm, folder, tokenizer.vocab_size, seconds, tokens_per_word(tokenizer, texts),
                            [f"{m.left}+{m.right}" for m in trainer.merges[:6]], examples)


# ---------------------------------------------------------------------------------------------- 2. shards
@dataclass
class Shards:
    """The training articles tokenized for pretraining (``lmforge data prepare``)."""

    folder: Path
    counts: dict[str, int]  # documents, sentences, tokens
    seconds: float


def prepare_shards(tokenizer_dir: Path, files: list[Path], out: Path) -> Shards:
    """Step 2: tokenize the training articles into ``out/bbc-shards`` (with a copy of the tokenizer)."""
    from lmforge.data.shards import prepare_corpus
    from lmforge.tokenizers import WordPieceTokenizer

    folder = out / "bbc-shards"
    start = time.perf_counter()
    manifest = prepare_corpus(tokenizer_dir, files, folder, overwrite=True, show_progress=False)
    WordPieceTokenizer.from_pretrained(tokenizer_dir).save_pretrained(folder / "tokenizer", overwrite=True)
    return Shards(folder, manifest["counts"], time.perf_counter() - start)


# ---------------------------------------------------------------------------------------------- 3. pretraining
@dataclass
class Pretraining:
    """A bert-mini pretraining, built and ready to run (``trainer``)."""

    run: PretrainRun
    trainer: Any  # lmforge.training.Trainer

    @property
    def folder(self) -> Path:
        return Path(self.run.out)

    def describe(self) -> str:
        """"bert-mini (objective mlm, mask rate 0.4, pre-LN, no dropout while pretraining; a budget of 3m, batches of
        32 x 64)": what the run does, from its settings."""
        from lmforge.config import model_config_from_preset

        run = self.run
        options = [f"objective {run.data.objective}", f"mask rate {run.data.mask_prob:g}"]
        config = model_config_from_preset(run.preset, **run.model)
        if config.norm_first:
            options.append("pre-LN")
        if not config.tie_embeddings:
            options.append("untied MLM un-embedding")
        if config.positional != "learned":
            options.append(f"{config.positional} positions")
        if run.dropout_off:
            options.append("no dropout while pretraining")
        if run.train.precision != "fp32":
            options.append(f"precision {run.train.precision}")
        length = f"a budget of {run.train.budget}" if run.train.budget else f"{run.train.max_steps} steps"
        return (f"{run.preset} ({', '.join(options)}; {length}, batches of {run.train.batch_size} x "
                f"{run.data.seq_len})")


@dataclass
class Pretrained:
    """What the pretraining did: the held-out metrics before and after it, and its minutes."""

    folder: Path
    before: dict[str, Any]
    after: dict[str, Any]
    minutes: float

    def held_out(self) -> list[tuple[str, float, float]]:
        """(label, before, after) of the held-out metrics both evaluations report."""
        return [(label, self.before[key], self.after[key]) for key, label in HELD_OUT_METRICS
                if key in self.before and key in self.after]


def build_pretraining(shards: Shards, out: Path, *, recipe: Path = DEFAULT_RECIPE, budget: str | None = None,
                      steps: int | None = None) -> Pretraining:
    """Step 3a: a pretraining run of the small-budget recipe (``configs/bert-mini-small-budget.toml``: pre-LN, no
    dropout while pretraining, MLM alone at a 40% mask rate, on 64-token blocks, batches of 32) on the shards, into
    ``out/bert-mini``, for the recipe's time budget (``budget`` overrides it; ``steps`` trains that many steps
    instead), evaluated on held-out documents as it goes."""
    from lmforge.config import to_dict
    from lmforge.recipes.pretrain import PretrainRun, build_trainer
    from lmforge.recipes.resolve import resolve

    run = resolve(PretrainRun, config=str(recipe), flags={"out": str(out / "bert-mini"),
                                                          "data.path": str(shards.folder)})
    train = run.train
    if steps is not None:
        train.budget, train.max_steps = "", steps
    elif budget is not None:
        train.budget = budget
    train.eval_batches, train.log_every, train.save_every = 8, 10, 0
    # evaluated on held-out documents every 200 steps of a budget (about ten times in 6 minutes), four times in a count
    train.eval_every = 200 if train.budget else max(train.max_steps // 4, 1)
    run = resolve(PretrainRun, defaults=to_dict(run), where=str(recipe))  # checked again with the changes
    return Pretraining(run, build_trainer(run, overwrite=True))


def pretrain(pretraining: Pretraining) -> Pretrained:
    """Step 3b: evaluate, pretrain, and evaluate again (the time covers the training)."""
    before = pretraining.trainer.evaluate()
    start = time.perf_counter()
    after = pretraining.trainer.fit()
    return Pretrained(pretraining.folder, before, after, (time.perf_counter() - start) / 60)


# ---------------------------------------------------------------------------------------------- 4. comparison
def comparison_config(config_path: Path, out: Path, tokenizer_dir: Path, pretrained: Path) -> CompareConfig:
    """Step 4a: the comparison's config (configs/compare-demo.toml), writing to ``out/compare``, with the demo's
    tokenizer and its pretrained bert-mini as ``@pretrained``."""
    from lmforge.config import load_toml
    from lmforge.recipes.compare import compare_config

    values = load_toml(config_path)
    values.update(out=str(out / "compare"), tokenizer=str(tokenizer_dir), pretrained=str(pretrained))
    return compare_config(values, str(config_path))


def compare(config: CompareConfig) -> tuple[dict[str, Path], float]:
    """Step 4b: run the comparison; returns the paths of its table (``md``), CSV and learning curve, and its
    minutes."""
    from lmforge.recipes.compare import run_compare

    start = time.perf_counter()
    paths = run_compare(config)
    return paths, (time.perf_counter() - start) / 60

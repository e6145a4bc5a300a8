"""The comparison's typed config: ``CompareConfig``, its ``[[approach]]`` tables (``Approach``) and its
``[[pretrain]]`` tables (``PretrainSpec``), checked when they are built; ``compare_config`` reads them from TOML."""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field
from typing import Any

from lmforge.config import from_dict
from lmforge.errors import LmforgeError

# the settings an approach's ``grid`` may search (its own fields) besides ``task.NAME`` and ``train.NAME``
GRID_FIELDS = ("lr", "head_lr", "epochs", "min_steps", "batch_size", "freeze")

FAMILIES = {"scratch": "(a) from scratch", "static": "(b) static embeddings", "frozen": "(c) frozen encoder",
            "finetune": "(d) pretrain + fine-tune"}


@dataclass
class Approach:
    """One way to build the classifier (``[[approach]]``): a model, how it is initialised and trained.

    ``model`` is a preset name, a model folder, ``@minilm``, ``@pretrained`` or ``@NAME`` of a ``[[pretrain]]``
    table; ``task`` and ``train`` override the ``TaskConfig`` / ``TrainConfig`` of its fine-tuning.

    ``grid`` lists settings to choose on the comparison's dev split (``dev_fraction``), e.g.
    ``grid = { lr = [5e-4, 1e-3], epochs = [10, 20], "task.reinit_layers" = [0, 1] }``: every run (size x seed)
    fine-tunes each combination, scores it on the dev split, and only the best one (highest dev accuracy, the first
    listed on a tie) is scored on the test split. Keys: ``lr``, ``head_lr``, ``epochs``, ``min_steps``,
    ``batch_size``, ``freeze``, ``task.NAME`` and ``train.NAME``.
    """

    name: str = ""
    family: str = "scratch"
    model: str = ""
    preset_options: dict[str, Any] = field(default_factory=dict)
    vectors: str = ""
    freeze: str = "none"
    lr: float = 5e-5
    head_lr: float | None = None
    epochs: float = 3.0
    min_steps: int = 40
    batch_size: int = 16
    task: dict[str, Any] = field(default_factory=dict)  # TaskConfig overrides
    train: dict[str, Any] = field(default_factory=dict)  # TrainConfig overrides
    # more models fine-tuned the same way, their class probabilities averaged with this one's on the test set
    # (ULMFiT's forward + backward ensemble: ensemble = ["@awd-lstm-bwd"])
    ensemble: list[str] = field(default_factory=list)
    grid: dict[str, list[Any]] = field(default_factory=dict)  # settings chosen on the dev split (class docstring)

    def __post_init__(self) -> None:
        if not self.name or not self.model:
            raise LmforgeError("every [[approach]] needs a name and a model")
        for key, values in self.grid.items():
            known = key in GRID_FIELDS or (key.count(".") == 1 and key.split(".")[0] in ("task", "train"))
            if not known:
                raise LmforgeError(f"approach {self.name!r}: grid key {key!r} is not one of {', '.join(GRID_FIELDS)}, "
                                   "task.NAME or train.NAME")
            if not isinstance(values, list) or not values:
                raise LmforgeError(f"approach {self.name!r}: grid.{key} must be a non-empty list of values, e.g. "
                                   f"{key} = [{getattr(self, key, 1)!r}]")
        if self.family not in FAMILIES:
            raise LmforgeError(f"approach {self.name!r}: family={self.family!r} is not one of {', '.join(FAMILIES)}")
        if self.vectors not in ("", "word2vec", "glove"):
            raise LmforgeError(f"approach {self.name!r}: vectors={self.vectors!r} is not word2vec or glove")
        if self.ensemble and (self.vectors or self.model in self.ensemble):
            raise LmforgeError(f"approach {self.name!r}: ensemble={self.ensemble!r} lists other models to average "
                               "with model (not model itself), and does not combine with vectors")

    def models(self) -> list[str]:
        """``model`` then the ``ensemble`` members."""
        return [self.model, *self.ensemble]

    def grid_points(self) -> list[dict[str, Any]]:
        """Every combination of the ``grid`` values, the first key varying slowest (one empty point without a grid)."""
        keys = list(self.grid)
        return [dict(zip(keys, values, strict=True)) for values in itertools.product(*(self.grid[k] for k in keys))]

    def at(self, point: dict[str, Any]) -> Approach:
        """This approach with the settings of one grid ``point`` applied (and no grid)."""
        own = {k: v for k, v in point.items() if "." not in k}
        task = {**self.task, **{k[5:]: v for k, v in point.items() if k.startswith("task.")}}
        train = {**self.train, **{k[6:]: v for k, v in point.items() if k.startswith("train.")}}
        return dataclasses.replace(self, grid={}, task=task, train=train, **own)


RESERVED = ("minilm", "pretrained")  # @NAME sources that are not [[pretrain]] tables


@dataclass
class PretrainSpec:
    """A model pretrained once per comparison on its training texts (``[[pretrain]]``; approaches use ``@name``).

    ``model``, ``data``, ``loss`` and ``train`` override the preset's ``ModelConfig``, the ``DataConfig``
    (``seq_len``, masking, ...), the objective's loss options (ELECTRA's ``rtd_weight`` ...) and the ``TrainConfig``
    (``max_steps``, ``batch_size``, ``lr``, ...) of the pretraining run; ``train = {budget = "3m"}`` (or
    ``"2Mtok"``) gives every model the same training time or tokens instead of a step count. ``dropout_off``
    pretrains without dropout (the folder keeps the preset's rates, so fine-tuning has them back).
    """

    name: str = ""
    preset: str = ""
    objective: str = "mlm"
    model: dict[str, Any] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)
    loss: dict[str, Any] = field(default_factory=dict)
    train: dict[str, Any] = field(default_factory=dict)
    dropout_off: bool = False  # pretrain without dropout; the saved folder keeps its rates for fine-tuning (Cramming)

    def __post_init__(self) -> None:
        from lmforge.recipes.pretrain import PretrainRun

        moved = PretrainRun._upgrade_values({"data": self.data, "loss": self.loss}, f"[[pretrain]] {self.name!r}")
        self.data, self.loss = moved["data"], moved["loss"]  # loss weights an older [data] table held
        if not self.name or not self.preset:
            raise LmforgeError("every [[pretrain]] needs a name and a preset")
        if self.name in RESERVED or not self.name.replace("-", "").replace("_", "").isalnum():
            raise LmforgeError(f"[[pretrain]] name={self.name!r}: use letters, digits, '-' and '_' (not "
                               f"{' or '.join(RESERVED)}); approaches refer to it as model = \"@{self.name}\"")
        for key in ("path", "objective"):
            if key in self.data:
                raise LmforgeError(f"[[pretrain]] {self.name!r}: data.{key} is set by the comparison (the training "
                                   f"texts; the table's objective = ...); remove it")


@dataclass
class CompareConfig:
    """A whole comparison: the data and its split, the subset sizes and seeds, the tokenizer, the static vectors'
    settings, and the ``[[pretrain]]`` and ``[[approach]]`` tables."""

    out: str = "runs/compare"
    data: str = "bbc"
    text_column: str = "text"
    label_column: str = "label"
    test_fraction: float = 0.2
    split_seed: int = 0
    max_test: int = 0
    # a test set of its own (a file, as data, e.g. TREC's 500 questions): data is then all training split, and
    # test_fraction is not used
    test_data: str = ""
    # a dev split carved from the training split (stratified, split_seed) before the subsets are drawn: approaches
    # with a grid choose their settings on it; it is never trained on (no subset, tokenizer, vector or pretraining
    # sees it). max_dev caps it, class-balanced, as max_test caps the test split.
    dev_fraction: float = 0.0
    max_dev: int = 0
    sizes: list[int] = field(default_factory=lambda: [10, 50, 200, 0])
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    tokenizer: str = ""
    vocab_size: int = 8000
    pretrained: str = ""
    max_length: int = 128
    vectors_dim: int = 128
    vectors_epochs: int = 5  # Word2Vec epochs (gensim's default)
    glove_epochs: int = 30  # GloVe needs many more passes (Pennington et al. ran 50 for under 300 dimensions)
    vectors_window: int = 5
    keep_models: bool = False
    pretrain: list[PretrainSpec] = field(default_factory=list)
    approach: list[Approach] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.approach:
            raise LmforgeError("the config lists no [[approach]]")
        if self.test_data and self.data == "bbc":
            raise LmforgeError("test_data names the test file of a data file; the BBC corpus is split by "
                               "test_fraction (leave test_data out)")
        if not 0.0 <= self.dev_fraction < 1.0 or self.max_dev < 0:
            raise LmforgeError(f"dev_fraction={self.dev_fraction} must be in [0, 1) and max_dev={self.max_dev} >= 0")
        tuned = [a.name for a in self.approach if a.grid]
        if tuned and not self.dev_fraction:
            raise LmforgeError(f"approach(es) {', '.join(map(repr, tuned))} have a grid to choose on a dev split, but "
                               "the config has none: set dev_fraction (e.g. dev_fraction = 0.1 of the training split)")
        if any(s < 0 for s in self.sizes) or not self.sizes or not self.seeds:
            raise LmforgeError("sizes must be >= 0 (0 = all) and sizes and seeds non-empty")
        names = [a.name for a in self.approach]
        if len(set(names)) != len(names):
            raise LmforgeError(f"approach names repeat: {names}")
        specs = [p.name for p in self.pretrain]
        if len(set(specs)) != len(specs):
            raise LmforgeError(f"[[pretrain]] names repeat: {specs}")
        for approach in self.approach:
            if approach.model.startswith("@") and approach.model[1:] not in (*RESERVED, *specs):
                raise LmforgeError(f"approach {approach.name!r}: model={approach.model!r} names no [[pretrain]] table "
                                   f"(defined: {', '.join(specs) or 'none'}) and is not @minilm or @pretrained")

    def spec(self, name: str) -> PretrainSpec | None:
        """The ``[[pretrain]]`` table called ``name`` (None when there is none)."""
        return next((p for p in self.pretrain if p.name == name), None)


def compare_config(values: dict[str, Any], where: str) -> CompareConfig:
    """A ``CompareConfig`` from TOML values; an approach's ``model`` may be a table with its preset's settings
    (``model = { source = "rnn-attn", d_model = 128 }``, see ``lmforge.recipes.resolve.split_model_table``)."""
    from lmforge.recipes.resolve import split_model_table

    approaches = [split_model_table(a, f"{where}: approach {a.get('name')!r}") if isinstance(a, dict) else a
                  for a in values.get("approach", [])]
    return from_dict(CompareConfig, {**values, "approach": approaches}, where=where)

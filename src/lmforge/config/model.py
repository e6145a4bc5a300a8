"""``ModelConfig``: the vocabulary every model family shares, and the registry of families that extend it.

A model's config is the core below plus its family's options: ``EncoderConfig`` (BERT, ALBERT, DistilBERT,
ELECTRA), ``DecoderConfig`` (GPT), ``Seq2SeqConfig`` (Transformer, BART), ``XLNetConfig`` (XLNet, Transformer-XL),
``RNNConfig`` / ``RNNSeq2SeqConfig`` (the lectures' RNNs), ``BiLMConfig`` (ELMo) and ``AWDLSTMConfig`` (AWD-LSTM,
ULMFiT), one file each under ``lmforge.config.families`` with its presets beside it, as Hugging Face keeps a
``BertConfig`` beside ``GPT2Config``. ``arch`` selects the family:

    ModelConfig(arch="xlnet", mem_len=64)      # an XLNetConfig; ModelConfig() is an EncoderConfig
    from_dict(ModelConfig, {"arch": "decoder", ...})   # strict: a key of another family is an error naming it

Each family validates itself (``_family_problems``), and a saved folder writes only its family's fields.
Folders written before families existed (``format_version`` 1) held every family's fields: ``upgrade_model_values``
drops the ones the family does not have (its models never read them).
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from dataclasses import dataclass
from typing import Any, ClassVar

from lmforge.choices import ACTIVATIONS, ARCHITECTURES, FFNS, KERNELS, POSITIONALS
from lmforge.errors import LmforgeError

# Hard limits on single sizes, far above any real model (GPT-3 has 96 layers, d_model 12,288, d_ff 49,152): a typo or a
# crafted file fails here, at once, instead of in the allocator. What fits in memory is checked when a model is built.
MAX_SIZE = {"vocab_size": 1 << 24, "d_model": 1 << 16, "n_heads": 1 << 10, "n_layers": 1 << 10, "d_ff": 1 << 18,
            "max_seq_len": 1 << 20}

# arch -> its family's config class (filled by lmforge.config.families, one ``register_family`` per class)
_FAMILIES: dict[str, type[ModelConfig]] = {}


@dataclass
class ModelConfig:
    """The shape every model family shares (the vocabulary of ``lmforge.models``); a family adds its own options.

    ``d_ff`` defaults to ``4 * d_model``; ``d_head`` is ``d_model // n_heads``. The recurrent families (RNN, biLM,
    AWD-LSTM) read the sizes, dropout and initialisation here and ignore the Transformer ones (``n_heads``, ``d_ff``,
    ``positional``, ``activation``, ``kernel``, ``norm_first``).

    ``ModelConfig(arch=..., **fields)`` builds the family's class (see the module docstring).
    """

    arch: str = "encoder"
    vocab_size: int = 30522
    d_model: int = 768
    n_heads: int = 12
    n_layers: int = 12
    d_ff: int | None = None
    max_seq_len: int = 512
    dropout: float = 0.1
    attention_dropout: float = 0.1
    activation: str = "gelu"
    norm_first: bool = False
    layer_norm_eps: float = 1e-12
    positional: str = "learned"
    tie_embeddings: bool = True
    kernel: str = "sdpa"
    # Cramming's small-compute options (Geiping & Goldstein 2023): no biases in the attention and feed-forward
    # projections, a gated feed-forward (FFNS)
    bias: bool = True
    ffn: str = "mlp"
    pad_token_id: int = 0
    init_std: float = 0.02

    # what a family class says of itself
    archs: ClassVar[tuple[str, ...]] = ()  # the ``arch`` values this class serves
    transformer: ClassVar[bool] = True  # sized by n_heads and d_ff (False: the Transformer fields do not apply)
    dropout_fields: ClassVar[tuple[str, ...]] = ("dropout", "attention_dropout")  # every dropout probability

    def without_dropout(self) -> ModelConfig:
        """The same model with every dropout probability of its family at 0 (``dropout_fields``): what a run that
        pretrains without dropout builds, while the folder it saves keeps this config for fine-tuning."""
        return dataclasses.replace(self, **{name: 0.0 for name in self.dropout_fields})

    def __new__(cls, *args: Any, **kwargs: Any) -> ModelConfig:
        # ``ModelConfig(arch="xlnet", ...)`` is the family's class: old code and user code that build the core class
        # with a family's fields keep working, and ``dataclasses.replace`` / copies keep the class they were given
        if cls is ModelConfig:
            cls = family_class(kwargs.get("arch", "encoder"))
        unknown = [key for key in kwargs if key not in family_fields(cls)]
        ignored = [key for key in unknown if _was_ignored(key, kwargs[key])]
        if ignored:
            warnings.warn(f"{', '.join(f'{k}={kwargs[k]!r}' for k in ignored)}: not an option of arch "
                          f"{kwargs.get('arch', cls.archs[0])!r}, ignored (a config per family: this goes in the next "
                          "release; remove it)", DeprecationWarning, stacklevel=2)
            unknown = [key for key in unknown if key not in ignored]
        if unknown:  # a clear error instead of the dataclass's TypeError
            raise LmforgeError(f"invalid model config: unknown key(s) {', '.join(map(repr, unknown))}; valid keys"
                               f"{cls._keys_label()} are {', '.join(family_fields(cls))}{cls._unknown_hint(unknown)}")
        return super().__new__(cls)

    def __post_init__(self) -> None:
        if self.d_ff is None:
            self.d_ff = 4 * self.d_model
        self.validate()

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    @property
    def d_embedding(self) -> int:
        """The token embedding's width (``d_model``; ALBERT's factorised ``embedding_size`` in ``EncoderConfig``)."""
        return self.d_model

    @property
    def n_distinct_layers(self) -> int:
        """The layers that have weights of their own (ALBERT's shared layers count once; an encoder-decoder adds
        its decoder's): a lower bound on the tensors a checkpoint of this config holds."""
        return self.n_layers

    # ------------------------------------------------------------------------------------------------ validation
    def validate(self) -> None:
        """Raise ``LmforgeError`` naming every offending value."""
        problems = self._core_problems() + self._family_problems()
        if problems:
            raise LmforgeError("invalid model config: " + "; ".join(problems))

    def _family_problems(self) -> list[str]:
        """The family's own options (each family class overrides it)."""
        return []

    def _core_problems(self) -> list[str]:
        problems = []
        if self.arch not in self.archs:
            problems.append(f"arch={self.arch!r} is not one of {', '.join(self.archs)} (this is a "
                            f"{type(self).__name__}; build the config with ModelConfig(arch=...))")
        for name, choices in (("positional", POSITIONALS), ("activation", ACTIVATIONS), ("kernel", KERNELS),
                              ("ffn", FFNS)):
            if getattr(self, name) not in choices:
                problems.append(f"{name}={getattr(self, name)!r} is not one of {', '.join(choices)}")
        sizes = ("vocab_size", "d_model", "n_layers", "max_seq_len") + (("n_heads", "d_ff") if self.transformer else ())
        for name in sizes:
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                problems.append(f"{name}={value!r} must be a positive integer")
            elif value > MAX_SIZE[name]:
                problems.append(f"{name}={value} is beyond any model lmforge can build (at most {MAX_SIZE[name]:,})")
        if not problems and self.transformer and self.d_model % self.n_heads:
            problems.append(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}; choose "
                            f"n_heads among the divisors of {self.d_model}")
        for name in ("dropout", "attention_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                problems.append(f"{name}={getattr(self, name)} must be in [0, 1)")
        if not 0.0 <= self.init_std < 10.0:  # also refuses NaN
            problems.append(f"init_std={self.init_std} must be in [0, 10)")
        if not 0.0 < self.layer_norm_eps < 1.0:
            problems.append(f"layer_norm_eps={self.layer_norm_eps} must be in (0, 1)")
        if (self.transformer and self.positional == "rotary" and isinstance(self.n_heads, int) and self.n_heads > 0
                and self.d_model % self.n_heads == 0 and self.d_head % 2):
            problems.append(f"rotary positions need an even head size; d_model/n_heads = {self.d_head}")
        if not 0 <= self.pad_token_id < max(self.vocab_size, 1):
            problems.append(f"pad_token_id={self.pad_token_id} is outside the vocabulary (size {self.vocab_size})")
        return problems

    # ------------------------------------------------------------------------------------ strict building (from_dict)
    @classmethod
    def _resolve(cls, values: dict[str, Any], where: str) -> type[ModelConfig]:
        """The class ``from_dict`` builds for ``values``: the family of ``values["arch"]`` (of ``cls`` itself when
        it is already a family class)."""
        if cls is not ModelConfig:
            return cls
        arch = values.get("arch", "encoder")
        try:
            return family_class(arch)
        except LmforgeError:
            raise LmforgeError(f"{where}.arch: {arch!r:.40} is not one of {', '.join(ARCHITECTURES)}") from None

    @classmethod
    def _unknown_hint(cls, keys: list[str]) -> str:
        """Where the unknown ``keys`` belong, when another family has them."""
        owners = {key: [name for name, family in _FAMILIES.items() if key in family_fields(family)] for key in keys}
        hints = [f"{key!r} is an option of arch {' / '.join(archs)}" for key, archs in owners.items() if archs]
        return f" ({'; '.join(hints)})" if hints else ""

    @classmethod
    def _keys_label(cls) -> str:
        return f" for arch {' / '.join(cls.archs)}"

    @classmethod
    def field_names(cls) -> list[str]:
        """The keys of this class's config (the core's, then the family's)."""
        return family_fields(cls)


# Values of other families' fields that the flat config of format 1 accepted for every family and no model read:
# every field at its family's default, and what the presets of other families set (no segment embedding, one-way).
_PRESET_NOISE = {("type_vocab_size", 0), ("bidirectional", False)}


def _was_ignored(key: str, value: Any) -> bool:
    """Whether ``ModelConfig(key=value)`` for a family without ``key`` was accepted and ignored before configs per
    family (then it is dropped with a DeprecationWarning; any other value is an error)."""
    if (key, value) in _PRESET_NOISE:
        return True
    for cls in set(_FAMILIES.values()):
        for f in dataclasses.fields(cls):
            if f.name == key and f.default is not dataclasses.MISSING and type(f.default) is type(value):
                return f.default == value
    return False


def core_fields() -> list[str]:
    """The names of the fields every family shares."""
    return [f.name for f in dataclasses.fields(ModelConfig)]


def family_fields(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls) if f.init]


def register_family(cls: type[ModelConfig]) -> type[ModelConfig]:
    """Class decorator: ``cls`` is the config of the families ``cls.archs``."""
    for arch in cls.archs:
        if arch not in ARCHITECTURES:
            raise AssertionError(f"{cls.__name__}: arch {arch!r} is not in lmforge.choices.ARCHITECTURES")
        _FAMILIES[arch] = cls
    init, names = cls.__init__, frozenset(family_fields(cls))

    @functools.wraps(init)
    def __init__(self: ModelConfig, *args: Any, **kwargs: Any) -> None:
        # ``__new__`` has refused other families' fields or warned about the ignored ones: drop those
        init(self, *args, **{k: v for k, v in kwargs.items() if k in names})

    cls.__init__ = __init__
    return cls


def family_class(arch: Any) -> type[ModelConfig]:
    """The config class of the family ``arch``.

    Raises:
        LmforgeError: an unknown family; the message lists the known ones.
    """
    import lmforge.config.families  # noqa: F401  (each family module registers its class on import)

    try:
        return _FAMILIES[arch]
    except (KeyError, TypeError):  # TypeError: an unhashable value read from a config file
        raise LmforgeError(f"arch={arch!r:.40} is not one of {', '.join(ARCHITECTURES)}") from None


def family_classes() -> dict[str, type[ModelConfig]]:
    """``{arch: config class}`` for every family, in the order of ``lmforge.choices.ARCHITECTURES``."""
    return {arch: family_class(arch) for arch in ARCHITECTURES}


def upgrade_model_values(values: dict[str, Any], format_version: int) -> dict[str, Any]:
    """The ``model`` table of a saved config in the current format.

    Format 1 (every lmforge before configs per family) wrote every field of every family: a BERT folder held ELMo's
    character filters. The fields its family does not have are dropped: no model of that family ever read them, and
    the flat config refused values other than their defaults where they could have mattered.
    """
    if format_version >= 2 or not isinstance(values, dict):
        return values
    try:
        cls = family_class(values.get("arch", "encoder"))
    except LmforgeError:
        return values  # the strict build names the bad arch
    keep = set(family_fields(cls))
    known = set().union(*(family_fields(c) for c in family_classes().values()))
    # an unknown key stays, so that the strict build still names it
    return {k: v for k, v in values.items() if k in keep or k not in known}

"""Declarative state-dict key maps between Hugging Face checkpoints and lmforge models.

Every Hugging Face family (BERT, ALBERT, DistilBERT, ELECTRA, GPT-2, XLNet) is described by one ``KeyMap``: a table
of our names against theirs, written once, in our -> their direction. The inverse (import) is derived from it, so a
name cannot be right one way and wrong the other. A table has these parts:

- ``top``: entries outside the layer stack (embeddings, pooler, final norm), relative to the body;
- ``layer``: the entries of one layer, relative to the layer, under the layer patterns ``our_layer`` /
  ``hf_layer`` (``"layers.{i}."`` / ``"encoder.layer.{i}."``, ``{i}`` = the layer index);
- ``prefix``: Hugging Face's task classes nest the body under it (``"bert."``); a bare model class has none;
- ``heads``: the task heads' entries, at the top level of Hugging Face's state dict (never under ``prefix``);
- ``tied``: entries of Hugging Face's state dict that repeat another one (a tied decoder): checked or used on
  import, written on export when asked;
- ``ignored``: buffers some checkpoints carry that hold no weights (``embeddings.position_ids``), skipped.

What a family does beyond renaming (GPT-2's fused q/k/v, ALBERT's layer groups ...) stays in its own module, which
hands the keys the table does not name to a ``claim`` function (see ``KeyMap.rename_from_hf`` / ``KeyMap.to_hf``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import torch
from torch import Tensor

from lmforge.errors import LmforgeError

__all__ = ["Claim", "KeyMap", "with_leaves"]

# A family's hook for the keys its table does not name: given (key, tensor), return the entries to write instead
# (an empty mapping: the key is consumed, e.g. a fused tensor collected for later), or None: the key is unknown.
Claim = Callable[[str, Tensor], Mapping[str, Tensor] | None]

_SHOWN = 10  # keys an error names before "..."


def with_leaves(modules: Mapping[str, str], leaves: Iterable[str] = ("weight", "bias")) -> dict[str, str]:
    """A parameter table from a module table: ``{"ffn.fc1": "intermediate.dense"}`` ->
    ``{"ffn.fc1.weight": "intermediate.dense.weight", "ffn.fc1.bias": "intermediate.dense.bias"}``."""
    leaves = tuple(leaves)
    return {f"{ours}.{leaf}": f"{theirs}.{leaf}" for ours, theirs in modules.items() for leaf in leaves}


def _named(keys: list[str]) -> str:
    """Up to ten keys, quoted, and "..." when there are more."""
    return ", ".join(repr(k) for k in keys[:_SHOWN]) + (" ..." if len(keys) > _SHOWN else "")


def _pattern(template: str) -> re.Pattern[str]:
    """``"encoder.layer.{i}."`` -> a pattern whose groups are the index and the rest of the key."""
    before, marker, after = template.partition("{i}")
    if not marker:
        raise ValueError(f"layer pattern {template!r} has no {{i}}")
    return re.compile(re.escape(before) + r"(\d+)" + re.escape(after) + r"(.+)")


def _inverse(table: Mapping[str, str], what: str) -> dict[str, str]:
    inverse = {theirs: ours for ours, theirs in table.items()}
    if len(inverse) != len(table):
        raise ValueError(f"the {what} table maps two of our names to one Hugging Face name")
    return inverse


@dataclass(frozen=True, eq=False)
class KeyMap:
    """One Hugging Face family's state-dict names, both directions from one table (see the module docstring).

    Attributes:
        family: the family's name in messages ("BERT").
        checkpoints: the classes an imported state dict may come from, for the unexpected-key error
            ("a BertModel, BertForPreTraining or BertForMaskedLM").
        top: our key -> theirs, for entries outside the layers (relative to the body: no ``prefix``).
        layer: our key -> theirs inside one layer (relative to the layer pattern).
        hf_layer / our_layer: the layer patterns, ``{i}`` standing for the index.
        prefix: where Hugging Face's task classes put the body ("bert."), or "".
        heads: our head key -> Hugging Face's (top level). Their first name components are the head prefixes:
            a Hugging Face key under one of them belongs to a head, never to the body.
        tied: Hugging Face key -> our key it repeats. A repeat of a body entry (the word embedding, as a tied
            decoder weight) must hold the same values on import (else the decoder is untied, which lmforge does not
            support); a repeat of a head entry (BERT's decoder bias) stands in for it when the checkpoint lacks it.
        ignored: body keys skipped on import (buffers without weights); ``{i}`` may stand for a layer index.
        transposed: layer keys (ours) that Hugging Face stores transposed: imported and exported as ``.t()``.
        spellings: older spellings of a key's end (Hugging Face's -> today's), accepted on import.
        exportable: what the export supports, ending the error that names keys it cannot write.
        decoder: what a tied repeat is, for the untied error ("MLM decoder", "LM head").
    """

    family: str
    checkpoints: str
    top: Mapping[str, str]
    layer: Mapping[str, str]
    hf_layer: str = "encoder.layer.{i}."
    our_layer: str = "layers.{i}."
    prefix: str = ""
    heads: Mapping[str, str] = field(default_factory=dict)
    tied: Mapping[str, str] = field(default_factory=dict)
    ignored: tuple[str, ...] = ()
    transposed: frozenset[str] = frozenset()
    spellings: Mapping[str, str] = field(default_factory=dict)
    exportable: str = ""
    decoder: str = "MLM decoder"
    # derived in __post_init__
    _top_from_hf: dict[str, str] = field(init=False, repr=False)
    _layer_from_hf: dict[str, str] = field(init=False, repr=False)
    _heads_from_hf: dict[str, str] = field(init=False, repr=False)
    _head_prefixes: tuple[str, ...] = field(init=False, repr=False)
    _hf_layer_key: re.Pattern[str] = field(init=False, repr=False)
    _our_layer_key: re.Pattern[str] = field(init=False, repr=False)
    _ignored: tuple[re.Pattern[str], ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        derived = {
            "_top_from_hf": _inverse(self.top, "top"),
            "_layer_from_hf": _inverse(self.layer, "layer"),
            "_heads_from_hf": _inverse(self.heads, "heads"),
            "_head_prefixes": tuple(dict.fromkeys(k.split(".", 1)[0] + "." for k in (*self.heads.values(),
                                                                                      *self.tied))),
            "_hf_layer_key": _pattern(self.hf_layer),
            "_our_layer_key": _pattern(self.our_layer),
            "_ignored": tuple(re.compile(re.escape(k).replace(r"\{i\}", r"\d+")) for k in self.ignored),
        }
        for name, value in derived.items():
            object.__setattr__(self, name, value)

    # ------------------------------------------------------------------------------------------ single names
    def hf_layer_key(self, key: str) -> tuple[str, str] | None:
        """(index, rest) of a body-relative Hugging Face key under the layer pattern, else None."""
        m = self._hf_layer_key.fullmatch(key)
        return None if m is None else (m.group(1), m.group(2))

    def our_layer_key(self, key: str) -> tuple[str, str] | None:
        """(index, rest) of one of our keys under the layer pattern, else None."""
        m = self._our_layer_key.fullmatch(key)
        return None if m is None else (m.group(1), m.group(2))

    def hf_layer_name(self, index: str | int, rest: str, *, prefixed: bool = False) -> str:
        """The Hugging Face key ``rest`` of layer ``index`` (any ``rest``: fused tensors have no table entry)."""
        return (self.prefix if prefixed else "") + self.hf_layer.format(i=index) + rest

    def hf_name(self, ours: str, *, prefixed: bool = False) -> str | None:
        """Hugging Face's name for one of our body or head keys (the body's under ``prefix`` when ``prefixed``),
        or None when the table has none."""
        if ours in self.heads:
            return self.heads[ours]
        theirs = self.top.get(ours)
        if theirs is None and (parsed := self.our_layer_key(ours)) is not None and parsed[1] in self.layer:
            theirs = self.hf_layer.format(i=parsed[0]) + self.layer[parsed[1]]
        if theirs is None:
            return None
        return (self.prefix if prefixed else "") + theirs

    def our_name(self, theirs: str) -> str | None:
        """Our name for a body-relative Hugging Face key (no prefix, not a head), or None."""
        if theirs in self._top_from_hf:
            return self._top_from_hf[theirs]
        parsed = self.hf_layer_key(theirs)
        if parsed is not None and parsed[1] in self._layer_from_hf:
            return self.our_layer.format(i=parsed[0]) + self._layer_from_hf[parsed[1]]
        return None

    def _put(self, out: dict[str, Tensor], name: str | None, ours: str | None, key: str, value: Tensor,
             claim: Claim | None) -> bool:
        """Write ``value`` to ``out`` under ``name`` (transposed when ``ours`` is in ``transposed``), or, without a
        name, what ``claim`` makes of ``key``. False when neither names it: an unknown key."""
        if name is None:
            claimed = None if claim is None else claim(key, value)
            out.update(claimed or {})
            return claimed is not None
        parsed = None if ours is None else self.our_layer_key(ours)
        out[name] = value.t().contiguous() if parsed is not None and parsed[1] in self.transposed else value
        return True

    def _respell(self, key: str) -> str:
        for old, new in self.spellings.items():
            if key.endswith(old):
                return key[: -len(old)] + new
        return key

    # ------------------------------------------------------------------------------------------ import
    def rename_from_hf(self, hf_sd: Mapping[str, Tensor], claim: Claim | None = None
                       ) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        """Rename a Hugging Face state dict to ours, in its order; tied repeats are set aside, not checked.

        The body's ``prefix`` is stripped when every key outside the heads has it (a task class), else none is
        (a bare model class). Keys neither the table nor ``ignored`` names go to ``claim``.

        Returns:
            ``(state, repeats)``: our body and head entries in one dict (tensors shared, except ``transposed``
            ones), and the tied repeats found (Hugging Face key -> tensor) for ``resolve_tied``.

        Raises:
            LmforgeError: naming the keys that are neither in the table nor claimed.
        """
        body = [k for k in hf_sd if not k.startswith(self._head_prefixes)]
        prefixed = bool(self.prefix) and bool(body) and all(k.startswith(self.prefix) for k in body)
        state: dict[str, Tensor] = {}
        repeats: dict[str, Tensor] = {}
        unexpected = []
        for raw_key, value in hf_sd.items():
            key = self._respell(raw_key)
            if raw_key.startswith(self._head_prefixes):
                if key in self.tied:
                    repeats[key] = value
                elif key in self._heads_from_hf:
                    state[self._heads_from_hf[key]] = value
                else:
                    unexpected.append(raw_key)
                continue
            if prefixed:
                key = key[len(self.prefix):]
            if any(p.fullmatch(key) for p in self._ignored):
                continue
            ours = self.our_name(key)
            if not self._put(state, ours, ours, key, value, claim):
                unexpected.append(raw_key)
        if unexpected:
            raise LmforgeError(f"unexpected key(s) in the {self.family} state dict: {_named(unexpected)}; expected "
                               f"{self.checkpoints} checkpoint")
        return state, repeats

    def resolve_tied(self, state: dict[str, Tensor], repeats: Mapping[str, Tensor]) -> None:
        """Check or use the tied repeats ``rename_from_hf`` set aside (see ``tied``), updating ``state``.

        Raises:
            LmforgeError: a repeat of a body entry that holds other values (an untied decoder), named.
        """
        for theirs, value in repeats.items():
            ours = self.tied[theirs]
            if ours in self.heads:
                state.setdefault(ours, value)
                continue
            original = state.get(ours)
            if value.is_meta or (original is not None and original.is_meta):  # shapes only: the real load checks
                continue
            if original is None or original.shape != value.shape or not torch.equal(original, value):
                raise LmforgeError(f"{theirs!r} differs from {self.hf_name(ours)!r}: an untied {self.decoder} is "
                                   "not supported")

    def from_hf(self, hf_sd: Mapping[str, Tensor], claim: Claim | None = None) -> dict[str, Tensor]:
        """``rename_from_hf`` then ``resolve_tied``: our state dict (body and heads in one)."""
        state, repeats = self.rename_from_hf(hf_sd, claim)
        self.resolve_tied(state, repeats)
        return state

    def split_heads(self, state: Mapping[str, Tensor]) -> tuple[dict[str, Tensor], dict[str, Tensor] | None]:
        """(body, heads) of our state dict, each in its order; heads None when there are none."""
        body = {k: v for k, v in state.items() if k not in self.heads}
        heads = {k: v for k, v in state.items() if k in self.heads}
        return body, (heads or None)

    # ------------------------------------------------------------------------------------------ export
    def to_hf(self, state: Mapping[str, Tensor], *, prefixed: bool, include_tied: bool = False,
              claim: Claim | None = None) -> dict[str, Tensor]:
        """Rename our state dict (body and heads in one) to Hugging Face's, in its order.

        Args:
            prefixed: put the body under ``prefix`` (Hugging Face's task classes).
            include_tied: also write the tied repeats of the heads written (see ``write_tied``).
            claim: gets the keys the table does not name.

        Raises:
            LmforgeError: naming the keys that are neither in the table nor claimed.
        """
        out: dict[str, Tensor] = {}
        unknown = []
        for key, value in state.items():
            if not self._put(out, self.hf_name(key, prefixed=prefixed), key, key, value, claim):
                unknown.append(key)
        if unknown:
            hint = f"; {self.exportable}" if self.exportable else ""
            raise LmforgeError(f"no Hugging Face {self.family} name for key(s) {_named(unknown)}{hint}")
        if include_tied:
            self.write_tied(out, prefixed=prefixed)
        return out

    def write_tied(self, out: dict[str, Tensor], *, prefixed: bool) -> None:
        """Add to ``out`` the tied repeats whose head it has (a head key under the repeat's first name component)
        and whose original it has, as the same tensors: what Hugging Face's own ``state_dict()`` lists."""
        heads_written = {k.split(".", 1)[0] for k in out if k in self._heads_from_hf}
        for theirs, ours in self.tied.items():
            source = self.hf_name(ours, prefixed=prefixed)
            if theirs.split(".", 1)[0] in heads_written and source in out:
                out[theirs] = out[source]

    @property
    def compared_repeats(self) -> tuple[str, ...]:
        """The tied repeats ``resolve_tied`` compares by value (those of body entries): a shape-only pass over meta
        tensors has no values, so it leaves them out."""
        return tuple(theirs for theirs, ours in self.tied.items() if ours not in self.heads)

"""What every Hugging Face family's config conversion shares: activation names, typed reads of a ``config.json``
dict, and the errors that name a setting one side cannot express."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from lmforge.config import coerce
from lmforge.errors import LmforgeError

__all__ = ["ACT_FROM_HF", "ACT_TO_HF", "activation_from_hf", "check_architecture", "check_model_type",
           "config_reader", "refuse_export"]

# Hugging Face's activation names -> ours. "gelu_new", "gelu_pytorch_tanh" and "gelu_fast" are all the tanh
# approximation (the first two exactly; gelu_fast rearranges the same formula).
ACT_FROM_HF = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu_fast": "gelu_tanh",
               "relu": "relu", "quick_gelu": "gelu_sigmoid"}
ACT_TO_HF = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu", "gelu_sigmoid": "quick_gelu"}


def config_reader(hf: Mapping[str, Any]) -> Callable[..., Any]:
    """``get(key, default, kind=int)``: ``hf[key]`` (``default`` when absent) checked to be of ``kind`` before any
    arithmetic on it (a hand-edited ``config.json`` fails with the key's name, not a TypeError)."""

    def get(key: str, default: Any, kind: Any = int) -> Any:
        return coerce(hf.get(key, default), kind, key)

    return get


def check_model_type(hf: Mapping[str, Any], model_type: str, checkpoint: str) -> None:
    """Refuse a config whose ``model_type`` (when present) is not ``model_type``; ``checkpoint`` reads "a BERT
    checkpoint"."""
    found = hf.get("model_type", model_type)
    if found != model_type:
        raise LmforgeError(f"config model_type={found!r} is not {checkpoint} (expected {model_type!r})")


def activation_from_hf(hf: Mapping[str, Any], key: str, default: str) -> str:
    """Our name for the activation ``hf[key]`` names (``default`` when absent).

    Raises:
        LmforgeError: an activation we do not have (named, with the supported ones).
    """
    act = hf.get(key, default)
    if not isinstance(act, str) or act not in ACT_FROM_HF:
        raise LmforgeError(f"{key}={act!r} is not supported; choose one of {', '.join(ACT_FROM_HF)}")
    return ACT_FROM_HF[act]


def check_architecture(architecture: str, architectures: tuple[str, ...]) -> None:
    """Refuse an ``architectures`` entry the family does not write."""
    if architecture not in architectures:
        raise LmforgeError(f"architecture={architecture!r}; choose one of {', '.join(architectures)}")


def refuse_export(problems: list[str], family: str) -> None:
    """Raise naming every option of a config that Hugging Face's ``family`` cannot express (nothing when none)."""
    if problems:
        raise LmforgeError(f"cannot express this model as a Hugging Face {family}: " + "; ".join(problems))

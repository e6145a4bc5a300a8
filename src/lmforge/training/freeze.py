"""Which backbone parameters train during fine-tuning, and at which learning rate.

``freeze(model, mode)`` switches ``requires_grad`` off for part of a ``TaskModel``'s backbone (the head always
trains):

- ``none``: everything trains (full fine-tuning, Devlin et al. 2019);
- ``all``: the whole backbone is frozen: feature extraction with a linear (or CRF, span, QA) head on top;
- ``embeddings``: token, position and segment embeddings (and their LayerNorm) are frozen;
- ``all-but-last:K``: embeddings and every layer except the last K are frozen; the last K layers, the final norm
  (pre-LN models) and the pooler train. ``all-but-last:0`` freezes the layers but trains the pooler.

``lr_scales(model, ...)`` gives each trainable parameter a multiplier of the run's learning rate: the head's own
``head_lr`` and layer-wise learning-rate decay (Howard & Ruder 2018's discriminative fine-tuning; the form of
Clark et al. 2020, ELECTRA, appendix A): parameter at depth d of L layers gets ``decay ** (L + 1 - d)``, with the
embeddings at d = 0, layer i (0-based) at d = i + 1 and the pooler / final norm / head at d = L + 1 (factor 1).

Shared layers (ALBERT's ``share_layers``): a parameter used by several layers has the depth of its deepest use. It
trains when any of its uses is in the last K layers, and gets that use's learning rate.
"""

from __future__ import annotations

import re

from torch import nn

from lmforge.errors import LmforgeError

_LAYER = re.compile(r"^(?:backbone\.)?layers\.(\d+)\.")
_EMBEDDING = re.compile(
    r"^(?:backbone\.)?(?:embeddings|tokens|positions|segments|embed_norm|token_embedding|position_embedding)\b")


def _n_layers(model: nn.Module) -> int:
    # every alias of a shared parameter counts: a 12-layer ALBERT has one set of layer weights named 12 ways
    ids = [int(m.group(1)) for name, _ in model.named_parameters(remove_duplicate=False) if (m := _LAYER.match(name))]
    return max(ids) + 1 if ids else 0


def _deepest_use(model: nn.Module, n_layers: int, strip: str = "") -> dict[int, int]:
    """``id(parameter) -> depth``: the depth of its first name, or of its deepest layer when the parameter is shared
    by several layers (ALBERT). Other aliases do not count: a head's un-embedding tied to the token embedding stays
    at the embeddings' depth."""
    depths: dict[int, int] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        inner = name[len(strip):] if strip and name.startswith(strip) else name
        depth = depth_of(inner, n_layers)
        if id(param) not in depths:
            depths[id(param)] = depth
        elif _LAYER.match(inner) is not None:
            depths[id(param)] = max(depths[id(param)], depth)
    return depths


def depth_of(name: str, n_layers: int) -> int:
    """0 for embeddings, i + 1 for ``layers.i``, ``n_layers + 1`` for everything above (pooler, norm, head)."""
    if (m := _LAYER.match(name)) is not None:
        return int(m.group(1)) + 1
    if _EMBEDDING.match(name) is not None:
        return 0
    return n_layers + 1


def parse_freeze(mode: str) -> tuple[str, int]:
    """``"all-but-last:2"`` -> ``("all-but-last", 2)``; other modes -> ``(mode, 0)``."""
    if mode in ("none", "all", "embeddings"):
        return mode, 0
    kind, _, k = mode.partition(":")
    if kind == "all-but-last" and k.isdigit():
        return kind, int(k)
    raise LmforgeError(f"--freeze {mode!r}: choose none, all, embeddings or all-but-last:K (e.g. all-but-last:2)")


def freeze(model: nn.Module, mode: str) -> list[str]:
    """Freeze part of ``model.backbone`` in place; returns the names of the frozen parameters.

    Raises:
        LmforgeError: an unknown mode, K larger than the number of layers, or a model without a backbone.
    """
    kind, k = parse_freeze(mode)
    backbone = getattr(model, "backbone", None)
    if backbone is None:
        raise LmforgeError("--freeze needs a TaskModel (a backbone with a head)")
    n_layers = _n_layers(backbone)
    if kind == "all-but-last" and k > n_layers:
        raise LmforgeError(f"--freeze all-but-last:{k}: the model has only {n_layers} layers")
    frozen = []
    deepest = _deepest_use(backbone, n_layers)
    for name, param in backbone.named_parameters():
        depth = deepest[id(param)]
        if kind == "all":
            off = True
        elif kind == "embeddings":
            off = depth == 0
        elif kind == "all-but-last":
            off = depth <= n_layers - k
        else:
            off = False
        param.requires_grad_(not off)
        if off:
            frozen.append(f"backbone.{name}")
    return frozen


def lr_scales(model: nn.Module, *, lr: float, head_lr: float | None = None,
              layer_decay: float = 1.0) -> dict[str, float]:
    """Learning-rate multiplier of every trainable parameter of a ``TaskModel`` (see the module docstring)."""
    n_layers = _n_layers(getattr(model, "backbone", model))
    deepest = _deepest_use(model, n_layers, strip="backbone.")
    scales = {}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        if name.startswith("head."):
            scales[name] = (head_lr / lr) if head_lr is not None else 1.0
        else:
            scales[name] = layer_decay ** (n_layers + 1 - deepest[id(param)])
    return scales

"""Whether ``torch.compile`` is capturing a graph, so that lmforge's data-dependent steps take their general path.

TorchDynamo (``torch.compile``, ``torch.export``) records one graph for every input; a Python branch on a tensor's
values (an input check, the all-real-mask shortcut, unpadding, a cache-sized chunk loop) would split the graph or
specialise it on the example's sizes. Each such step tests ``capturing()`` and, while it is true, takes the path
that is right for any input (see ``lmforge.utils.compiling``). ``torch.jit.trace`` (the TorchScript ONNX exporter)
is not covered: lmforge has no ONNX export yet.
"""

from __future__ import annotations

import torch

__all__ = ["capturing"]


def capturing() -> bool:
    """True while TorchDynamo records the model (``torch.compile``, ``torch.export``)."""
    return torch.compiler.is_compiling()

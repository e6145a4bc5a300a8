"""Whether ``torch.compile`` is capturing a graph, so that lmforge's data-dependent steps take their general path.

TorchDynamo (``torch.compile``, ``torch.export``) records one graph for every input; a Python branch on a tensor's
values (an input check, the all-real-mask shortcut, unpadding, a cache-sized chunk loop) would split the graph or
specialise it on the example's sizes. Each such step tests ``capturing()`` and, while it is true, takes the path
that is right for any input (see ``lmforge.utils.compiling``).

``torch.compile`` may still break a graph where the break pays (unpadding, the all-real-mask shortcut: BENCHMARKS,
issue 39). ``torch.export`` (and so the ONNX export, ``lmforge.persistence.onnx``) cannot break a graph at all: while
``exporting()`` is true those steps take one path for every input (the mask always applied, as an additive bias;
unpadding always on, its token count a size of the graph).
``torch.jit.trace`` is not supported: it would bake the example's values into the graph.
"""

from __future__ import annotations

import torch

__all__ = ["capturing", "exporting"]


def capturing() -> bool:
    """True while TorchDynamo records the model (``torch.compile``, ``torch.export``)."""
    return torch.compiler.is_compiling()


def exporting() -> bool:
    """True while ``torch.export`` records the model (the ONNX export): one graph, with no data-dependent branch."""
    return torch.compiler.is_exporting()

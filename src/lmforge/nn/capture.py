"""Whether ``torch.compile`` is capturing a graph, so that lmforge's data-dependent steps take their general path.

TorchDynamo (``torch.compile``, ``torch.export``) records one graph for every input; a Python branch on a tensor's
values (an input check, the all-real-mask shortcut, unpadding, a cache-sized chunk loop) would split the graph or
specialise it on the example's sizes. Each such step tests ``capturing()`` and, while it is true, takes the path
that is right for any input (see ``lmforge.utils.compiling``).

Two steps choose per batch on a tensor's values: unpadding (``Packing.decide``: is the batch padded enough?) and
the all-real-mask shortcut (no mask at all when nothing is padded). ``one_graph()`` says whether they must take one
path for every input instead, which is then: unpadding always on, its token count N a size of the graph (ONNX
NonZero; TorchDynamo's unbacked size), and the mask always applied, as an additive bias. It is true

* while ``torch.export`` records the model (``exporting()``: the ONNX export, ``lmforge.persistence.onnx``), which
  cannot break a graph at all;
* while ``torch.compile`` traces inside ``one_graph_capture()``: compiled inference (``compile_in_place``), where
  one graph lets inductor fold the weights in (freezing) and pays far more than choosing per batch (BENCHMARKS,
  issue 39, item 3).

Compiled training keeps the per-batch choice: its graph breaks there, and running the real tokens only pays more
than one graph without freezing. ``torch.jit.trace`` is not supported: it would bake the example's values into the
graph.
"""

from __future__ import annotations

import torch

from lmforge.utils.compiling import one_graph_capture, one_graph_requested

__all__ = ["capturing", "exporting", "one_graph", "one_graph_capture"]


def capturing() -> bool:
    """True while TorchDynamo records the model (``torch.compile``, ``torch.export``)."""
    return torch.compiler.is_compiling()


def exporting() -> bool:
    """True while ``torch.export`` records the model (the ONNX export): one graph, with no data-dependent branch."""
    return torch.compiler.is_exporting()


def one_graph() -> bool:
    """True while a trace must take one path for every input (see the module docstring): exporting, or compiling
    inside ``one_graph_capture()``."""
    return exporting() or (one_graph_requested() and capturing())

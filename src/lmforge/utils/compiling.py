"""``--compile``: ``torch.compile`` for training, inference and serving (issue 22, item 6).

What it does
------------
* **Training** (``TrainConfig.compile``, ``--compile`` on every training command): the Trainer compiles the module
  the objective calls, after moving it to the device and wrapping it in DistributedDataParallel, as PyTorch
  documents for DDP (``torch.compile(DDP(model))``: TorchDynamo's DDPOptimizer splits the graph at the gradient
  buckets so the all-reduce still overlaps the backward pass). The optimizer, evaluation bookkeeping and every
  save read the plain module underneath, so no saved key ever carries ``_orig_mod.``. Dropout under inductor uses
  the eager random stream (``torch._inductor.config.fallback_random``), so a run resumed with ``--compile`` from a
  checkpoint written without it (or the other way round) continues exactly, within floating-point tolerance.
* **Inference and serving** (``predict``, ``evaluate``, ``embed``, ``serve``): the model is compiled in place
  (``nn.Module.compile``'s mechanism), so it stays the same object (its class, attributes and state dict
  unchanged). It is traced as ONE graph, padded batches included (``lmforge.nn.capture.one_graph_capture``:
  unpadding stays on inside the graph, its token count a size of it), and inductor folds the weights into that
  graph (``freezing``: prepacked weight layouts for the CPU's matrix kernels, bias and activation fused into them):
  1.8-2.2x eager on a CPU, where the per-layer graphs before were level with it (BENCHMARKS, issue 39, item 3). The
  weights are read when a shape first compiles, so a model whose weights change afterwards must be compiled
  afresh.
* **Shapes**: ``dynamic=None``, PyTorch's automatic dynamic shapes: the first call compiles for its exact shapes;
  when a dimension changes, the next compile makes it symbolic, so batches of varying length cost one more compile,
  not one per batch. Recompiles per function are capped at ``RECOMPILE_LIMIT``; hitting the cap logs a warning
  (the function then runs uncompiled) and says what to do.
* **Graphs**: while TorchDynamo traces (``lmforge.nn.capture.capturing()``) the token-id range checks are skipped
  (the eager path keeps them; compiled callers read ids their tokenizer made), attention dropout uses the same
  packed mask written out for autograd instead of its cache-sized chunks (whose Python loops would compile again
  for every length), and shape-check messages are formatted only on failure (a size formatted into a string would
  specialise the graph on it). So a batch without padding is one graph per Transformer family, and new lengths
  reuse it after the automatic-dynamic recompile (``tests/training/test_compile_graphs.py``). In training a padded
  batch keeps its breaks at unpadding and the all-real-mask shortcut: without freezing, running the real tokens
  only is worth more than one graph (compiled inference that computed the padding made it 0.66x eager).
* **Errors**: where compiling is impossible (no C++ compiler for inductor on a CPU, no Triton on a GPU, a Python
  TorchDynamo does not support) ``check_compile`` raises an ``LmforgeError`` naming ``--compile`` before any work;
  a backend failure at the first step (or any later recompile) becomes one too (``compile_errors``), never a
  traceback from inside torch.

The backend is inductor; ``LMFORGE_COMPILE_BACKEND`` (an internal hook for tests and benchmarks) names another
(``eager``, ``aot_eager``: no code generation, seconds instead of a minute). Importing this module does not import
torch (the command line imports it for the help texts).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from lmforge.errors import LmforgeError

if TYPE_CHECKING:  # torch is imported when something is compiled: the command line starts without it
    import torch
    from torch import nn

log = logging.getLogger("lmforge")

BACKEND_ENV = "LMFORGE_COMPILE_BACKEND"
DEFAULT_BACKEND = "inductor"
# compiled variants kept per function before it falls back to eager (torch's own default is 8 as well): training
# shapes, the automatic-dynamic recompile, eval mode and a batch of one fit well inside
RECOMPILE_LIMIT = 8
COMPILE_HELP = ("compile the model with torch.compile (inductor): the first steps are slower (compilation, up to a "
                "few minutes on a CPU), the later ones faster; checkpoints are written from the plain module. Needs a "
                "C++ compiler on a CPU (Triton on a GPU) (default: off)")
INFERENCE_COMPILE_HELP = ("compile the model with torch.compile (inductor) before running it, as one graph with the "
                          "weights folded in: the first batches of each new shape are slower (compilation), the "
                          "later ones about twice as fast on a CPU; needs a C++ compiler on a CPU (default: off)")
INFERENCE_PRECISION_HELP = ("run the model in fp32 (default), bf16 (autocast: matrix products in bf16, outputs back "
                            "in fp32; fast where the CPU has AVX512_BF16 or AMX, emulated and slow elsewhere) or "
                            "auto (bf16 only where it measures faster here)")
RUNTIME_HELP = ("what runs the model: torch (default), or onnx: ONNX Runtime, from the folder's onnx/ graph "
                "(make one with lmforge convert --to-onnx; a task head still runs in PyTorch; needs the "
                "lmforge[onnx] extra)")


def check_runtime_options(args: Any) -> None:
    """``check_inference_options`` on a command's parsed arguments."""
    check_inference_options(compile=getattr(args, "compile", False), runtime=getattr(args, "runtime", "torch"),
                            precision=getattr(args, "precision", "fp32"))


def check_inference_options(*, compile: bool, runtime: str, precision: str = "fp32") -> None:
    """``--compile`` and ``--precision`` act on PyTorch's model: with ``--runtime onnx`` ONNX Runtime runs it
    instead, as exported."""
    if compile and runtime != "torch":
        raise LmforgeError(f"--compile and --runtime {runtime} exclude each other: --compile compiles the PyTorch "
                           "model, which ONNX Runtime replaces; give one")
    if precision != "fp32" and runtime != "torch":
        raise LmforgeError(f"--precision {precision} and --runtime {runtime} exclude each other: the precision is "
                           "PyTorch's autocast; an ONNX graph runs as exported (fp32, or int8 with convert --to-onnx "
                           "--quantize int8)")


_TORCH_LOGGER = "torch._dynamo.convert_frame"  # where TorchDynamo reports a function that hit the recompile limit
_FIX = "run without --compile"


def compile_backend() -> str:
    """The backend ``--compile`` uses: inductor, or what ``LMFORGE_COMPILE_BACKEND`` names."""
    return os.environ.get(BACKEND_ENV, "").strip() or DEFAULT_BACKEND


def cxx_candidates() -> list[str]:
    """The C++ compilers inductor would try on a CPU, in its order (``$CXX``, else g++; clang++ on macOS)."""
    from torch._inductor import config

    cxx = config.cpp.cxx
    return [c for c in (cxx if isinstance(cxx, (list, tuple)) else (cxx,)) if c]


def find_cxx() -> str | None:
    """The first of ``cxx_candidates`` found on PATH (or as a path), None when none is."""
    for candidate in cxx_candidates():
        found = shutil.which(candidate)
        if found:
            return found
    return None


def check_compile(device: torch.device | str, backend: str | None = None) -> None:
    """Raise ``LmforgeError`` (naming ``--compile`` and the fix) when ``torch.compile`` cannot work here."""
    import torch

    backend = backend or compile_backend()
    device = torch.device(device)
    try:
        from torch._dynamo.eval_frame import check_if_dynamo_supported

        check_if_dynamo_supported()
    except ImportError as err:
        raise LmforgeError(f"--compile needs torch.compile, which this torch ({torch.__version__}) does not have; "
                           f"upgrade torch or {_FIX}") from err
    except RuntimeError as err:
        raise LmforgeError(f"--compile needs TorchDynamo, which does not support this Python "
                           f"({sys.version.split()[0]}) with torch {torch.__version__}: {err}; {_FIX}") from err
    if backend != "inductor":
        return
    if device.type == "cpu" and find_cxx() is None:
        tried = ", ".join(cxx_candidates()) or "g++"
        raise LmforgeError(f"--compile needs a C++ compiler for torch.compile's inductor backend on the CPU (looked "
                           f"for {tried}; the CXX environment variable names another): install one (e.g. g++) or "
                           f"{_FIX}")
    if device.type == "cuda":
        from torch.utils._triton import has_triton

        if not has_triton():
            raise LmforgeError(f"--compile needs Triton for torch.compile's inductor backend on a GPU (pip install "
                               f"triton, matching torch {torch.__version__}), or {_FIX}")


def _configure(backend: str, *, training: bool) -> None:
    import torch._dynamo

    torch._dynamo.config.recompile_limit = RECOMPILE_LIMIT
    if backend == "inductor" and training:
        import torch._inductor.config

        # dropout draws the same numbers as without --compile: exact resume across --compile on/off
        torch._inductor.config.fallback_random = True
    _watch_recompile_limit()
    _quiet_expected_breaks()


def compile_module(model: nn.Module, device: torch.device | str, *, training: bool = True,
                   backend: str | None = None, dynamic: bool | None = None) -> nn.Module:
    """``torch.compile(model)`` (an ``OptimizedModule`` wrapping it; the plain one stays ``model``), checked first.

    Args:
        model: the module (or its DDP wrapper) to compile.
        device: where it runs (decides what the backend needs).
        training: a training run (dropout then draws eager's random numbers under inductor).
        backend: default ``compile_backend()``.
        dynamic: torch.compile's ``dynamic``; None = automatic dynamic shapes (see the module docstring).
    """
    import torch

    backend = backend or compile_backend()
    check_compile(device, backend)
    _configure(backend, training=training)
    return torch.compile(model, backend=backend, dynamic=dynamic)


def compile_in_place(model: nn.Module, *, backend: str | None = None, dynamic: bool | None = None) -> nn.Module:
    """Compile ``model``'s forward in place for inference and serving, and return it: the object, its class and
    its state dict stay as they were (``nn.Module.compile``'s mechanism).

    The model is traced as one graph (``lmforge.nn.capture.one_graph_capture``: unpadding always on, its token
    count a size of the graph), and inductor folds the weights into it (``freezing``: constant folding and weight
    layouts prepacked for the CPU's matrix kernels), which only an inference graph allows. **The weights are read
    when a shape first compiles**: change them afterwards (training, ``load_state_dict``) and compile a fresh
    model; the compiled one would go on computing with the old ones. A forward with gradients on is compiled
    without freezing.
    """
    import torch

    backend = backend or compile_backend()
    param = next(model.parameters(), None)
    check_compile(param.device if param is not None else "cpu", backend)
    _configure(backend, training=False)
    compiled = torch.compile(model._call_impl, backend=backend, dynamic=dynamic)
    import torch._inductor.config

    def call_one_graph(*args: Any, **kwargs: Any) -> Any:
        # freezing is read while TorchDynamo traces (the weights become graph constants), not only by inductor:
        # torch.compile(options=) would come too late, so it is set around the call, for this model's graphs only
        with one_graph_capture(), torch._inductor.config.patch(freezing=backend == "inductor"):
            return compiled(*args, **kwargs)

    model._compiled_call_impl = call_one_graph  # what nn.Module.compile sets: __call__ runs it instead of forward
    return model


_ONE_GRAPH = [False]  # set inside one_graph_capture(); TorchDynamo reads it as a constant of the traced graph


def one_graph_requested() -> bool:
    """Whether the calling code runs inside ``one_graph_capture()`` (``lmforge.nn.capture.one_graph`` reads it)."""
    return _ONE_GRAPH[0]


@contextlib.contextmanager
def one_graph_capture() -> Iterator[None]:
    """Inside, ``torch.compile`` traces lmforge's models as one graph: unpadding's data-dependent token count is
    captured (TorchDynamo's ``capture_dynamic_output_shape_ops``) instead of breaking the graph, and the per-batch
    choices take their general path (``lmforge.nn.capture.one_graph``). Calls of an already compiled graph are
    unaffected."""
    import torch._dynamo

    previous = _ONE_GRAPH[0]
    _ONE_GRAPH[0] = True
    try:
        with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
            yield
    finally:
        _ONE_GRAPH[0] = previous


def is_compiled(model: nn.Module) -> bool:
    """Whether ``model`` is a ``torch.compile`` wrapper or was compiled in place."""
    return hasattr(model, "_orig_mod") or getattr(model, "_compiled_call_impl", None) is not None


# ------------------------------------------------------------------------------------------------------- errors
def _is_compile_failure(err: BaseException) -> bool:
    """A failure of TorchDynamo or of the backend (code generation, the C++ compiler), not of the model's code."""
    module = type(err).__module__ or ""
    if module.startswith(("torch._dynamo", "torch._inductor", "torch._functorch", "torch._subclasses")):
        return True
    try:
        from torch._dynamo.exc import BackendCompilerFailed
    except ImportError:  # pragma: no cover
        return False
    return isinstance(err, BackendCompilerFailed)


def _summary(err: BaseException) -> str:
    """The first informative line of a torch error (its messages run to pages), at most 300 characters."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    text = next((line for line in lines if not line.startswith(("backend=", "Set TORCHDYNAMO", "You can suppress"))),
                type(err).__name__)
    return text if len(text) <= 300 else text[:297] + "..."


@contextlib.contextmanager
def compile_errors(enabled: bool = True) -> Iterator[None]:
    """Inside, a failure of torch.compile (TorchDynamo, inductor, the C++ compiler) is re-raised as an
    ``LmforgeError`` that names ``--compile`` and the fix; every other exception passes unchanged."""
    if not enabled:
        yield
        return
    try:
        yield
    except LmforgeError:
        raise
    except Exception as err:
        if not _is_compile_failure(err):
            raise
        raise LmforgeError(f"--compile failed: torch.compile ({compile_backend()} backend) could not compile the "
                           f"model: {type(err).__name__}: {_summary(err)}; {_FIX} (or install what is missing, e.g. "
                           "a C++ compiler and the Python headers on a CPU)") from err


# ------------------------------------------------------------------------------------------------------- recompiles
class _RecompileLimitWarning(logging.Filter):
    """Turns TorchDynamo's 'hit config.recompile_limit' record into a warning of lmforge's (once per function)."""

    def __init__(self) -> None:
        super().__init__("lmforge.recompile_limit")
        self.seen: set[str] = set()
        self.hits = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str) and record.msg.startswith("torch._dynamo hit config."):
            args: Any = record.args if isinstance(record.args, tuple) else ()
            function = str(args[2]) if len(args) > 2 else "a function"
            self.hits += 1
            if function not in self.seen:
                self.seen.add(function)
                limit = args[1] if len(args) > 1 else RECOMPILE_LIMIT
                reason = str(args[3]) if len(args) > 3 else "unknown"
                log.warning("--compile: %s was recompiled %s times (the cache limit) and now runs uncompiled; the "
                            "last recompile was for: %s. The inputs' shapes or types vary more than automatic "
                            "dynamic shapes absorb (set TORCH_LOGS=recompiles to see every reason); the run goes "
                            "on, slower than it could; drop --compile if this keeps happening", function, limit,
                            reason)
        return True


def _watch_recompile_limit() -> _RecompileLimitWarning:
    logger = logging.getLogger(_TORCH_LOGGER)
    for existing in logger.filters:
        if isinstance(existing, _RecompileLimitWarning):
            return existing
    watcher = _RecompileLimitWarning()
    logger.addFilter(watcher)
    return watcher


class _ExpectedBreak(logging.Filter):
    """Drops TorchDynamo's warning about the graph break at ``Tensor.item()``: lmforge's input checks (ids within
    the vocabulary, any padding at all) read one number on purpose, and the warning (a page, once per process) would
    suggest a setting that cannot remove those breaks. It stays visible at debug level."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str) and record.msg.lstrip().startswith("Graph break from `Tensor.item()`"):
            log.debug("--compile: graph breaks at Tensor.item() (lmforge's input checks): %s", record.getMessage())
            return False
        return True


def _quiet_expected_breaks() -> None:
    logger = logging.getLogger("torch._dynamo.variables.tensor")
    if not any(isinstance(f, _ExpectedBreak) for f in logger.filters):
        logger.addFilter(_ExpectedBreak())


def recompile_limit_hits() -> int:
    """How many times a compiled function hit the recompile limit in this process (0 before any ``--compile``)."""
    for existing in logging.getLogger(_TORCH_LOGGER).filters:
        if isinstance(existing, _RecompileLimitWarning):
            return existing.hits
    return 0

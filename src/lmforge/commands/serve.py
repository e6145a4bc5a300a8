"""``lmforge serve``: a model folder behind a JSON HTTP API (FastAPI under uvicorn; ``lmforge.serve``).

The server binds to 127.0.0.1 unless ``--host`` says otherwise (with a warning: it has no authentication).
SIGTERM or Ctrl-C shut it down gracefully: it stops accepting connections, answers the requests in flight (for
at most ``--graceful-timeout`` seconds), drains the batchers and exits 0. FastAPI and uvicorn are imported only
here, so the rest of lmforge works without them.
"""

from __future__ import annotations

import argparse
import logging
import signal
from typing import Any

from lmforge.choices import PRECISIONS, RUNTIMES
from lmforge.commands.options import PORT, Count, Rate
from lmforge.errors import LmforgeError
from lmforge.utils.compiling import INFERENCE_PRECISION_HELP, RUNTIME_HELP

log = logging.getLogger("lmforge")

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    p.epilog = ("Endpoints follow from the model: /classify (fine-tuned sequence/pair), /tag (token/span), /answer "
                "(qa), /fill-mask (an MLM head), /embed (any encoder), /generate (decoder, encoder-decoder); always "
                "/health, /info and /docs.")
    p.add_argument("--model", required=True, metavar="DIR", help="a model folder (lmforge or Hugging Face BERT)")
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=PORT, default=8000, help="default 8000")
    p.add_argument("--max-batch", type=Count(1, 4096), default=32, metavar="N",
                   help="texts per forward pass, shared by concurrent requests (default 32)")
    p.add_argument("--max-length", type=Count(3, 1_000_000), default=512, metavar="TOKENS",
                   help="tokens per text accepted, [CLS]/[SEP] included; longer texts get 413 (default 512)")
    p.add_argument("--max-texts", type=Count(1, 100_000), default=64, metavar="N",
                   help="texts (prompts) per request (default 64)")
    p.add_argument("--max-chars", type=Count(1, 10_000_000), default=20_000, metavar="N",
                   help="characters per text (default 20000)")
    p.add_argument("--max-new-tokens", type=Count(1, 100_000), default=256, metavar="N",
                   help="the largest max_new_tokens a /generate request may ask for (default 256)")
    p.add_argument("--max-wait-ms", type=Rate(0.0, 10_000.0), default=3.0, metavar="MS",
                   help="how long a request may wait for others to share its forward pass (default 3)")
    p.add_argument("--no-batching", dest="batching", action="store_false",
                   help="one forward pass per request (for comparison)")
    p.add_argument("--threads", type=Count(1, 1024), default=None, metavar="N",
                   help="PyTorch intra-op threads (default: PyTorch's, one per core; 1 is faster on a busy machine)")
    p.add_argument("--graceful-timeout", type=Rate(0.0, 86_400.0), default=30.0, metavar="SECONDS",
                   help="time to finish the requests in flight after SIGTERM / Ctrl-C (default 30)")
    p.add_argument("--compile", action="store_true",
                   help="compile the encoder with torch.compile (inductor) at start-up, with a warm-up pass: slower "
                        "to start, faster per batch; /generate runs uncompiled; needs a C++ compiler on a CPU "
                        "(default: off)")
    p.add_argument("--precision", choices=PRECISIONS, default="fp32", help=INFERENCE_PRECISION_HELP)
    p.add_argument("--runtime", choices=RUNTIMES, default="torch", help=RUNTIME_HELP)
    p.add_argument("--access-log", action="store_true", help="log every request (uvicorn's access log)")


def run_serve(args: argparse.Namespace) -> int:
    from lmforge.serve import require_serving

    require_serving()
    import uvicorn

    from lmforge.serve.app import create_app

    if not 0 <= args.port <= 65535:
        raise LmforgeError(f"--port {args.port} must be in 0..65535")
    if args.graceful_timeout < 0:
        raise LmforgeError(f"--graceful-timeout {args.graceful_timeout} must be >= 0")
    if args.host not in LOOPBACK:
        log.warning("--host %s: the server is reachable from other machines and has no authentication; put it "
                    "behind a proxy that checks who may call it", args.host)
    stop = _StopSignals()
    with stop:
        if args.threads is not None:
            import torch

            if args.threads < 1:
                raise LmforgeError(f"--threads must be >= 1, got {args.threads}")
            torch.set_num_threads(args.threads)
        app = create_app(args.model, max_batch=args.max_batch, max_length=args.max_length,
                         batching=args.batching, max_wait_ms=args.max_wait_ms, max_texts=args.max_texts,
                         max_chars=args.max_chars, max_new_tokens=args.max_new_tokens, compile=args.compile,
                         runtime=args.runtime, precision=args.precision)
        if stop.received:  # stopped while the model was loading
            return 0
        quiet = not log.isEnabledFor(logging.INFO)
        config = uvicorn.Config(app, host=args.host, port=args.port, log_level="warning" if quiet else "info",
                                access_log=args.access_log, timeout_graceful_shutdown=args.graceful_timeout,
                                lifespan="on")
        served = app.state.model
        log.info("serving %s (%s) at http://%s:%d: %s", served.dir.name, served.describe(), args.host, args.port,
                 ", ".join(served.endpoints))
        uvicorn.Server(config).run()
    if stop.received:
        log.info("stopped by %s after answering the requests in flight", stop.received)
    return 0


class _StopSignals:
    """SIGTERM/SIGINT handlers for the time around uvicorn's own.

    uvicorn handles both signals while it serves (graceful shutdown), then raises the signal again once it is done,
    so that the default action (killing the process) still happens. After a graceful shutdown that is not wanted:
    the process should exit 0. These handlers only record the signal: uvicorn's re-raise lands here.
    """

    def __init__(self) -> None:
        self.received: str | None = None
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: Any) -> None:
        self.received = signal.Signals(signum).name

    def __enter__(self) -> _StopSignals:
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread: leave signals alone
                pass
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

"""Helpers of the serving tests: a real uvicorn server on a free loopback port, in a thread or a subprocess."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the serving extra is not installed (pip install 'lmforge[serve]')")
pytest.importorskip("uvicorn", reason="the serving extra is not installed (pip install 'lmforge[serve]')")
pytest.importorskip("httpx", reason="httpx (a dev dependency) is not installed")

REPO = Path(__file__).resolve().parents[2]

# ``lmforge serve`` before the command is registered in lmforge.cli: the same parser and run function.
SERVE_SCRIPT = ("import argparse, sys\n"
                "from lmforge.cli import setup_logging\n"
                "from lmforge.commands.serve import add_serve_arguments, run_serve\n"
                "p = argparse.ArgumentParser(prog='lmforge serve')\n"
                "add_serve_arguments(p)\n"
                "setup_logging(False)\n"
                "sys.exit(run_serve(p.parse_args(sys.argv[1:])))\n")


def serve_command(*args: str) -> list[str]:
    """The command line of ``lmforge serve ARGS`` with this interpreter."""
    from lmforge.cli import COMMANDS

    if "serve" in COMMANDS:
        return [sys.executable, "-m", "lmforge", "serve", *args]
    return [sys.executable, "-c", SERVE_SCRIPT, *args]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def server_thread(app) -> Iterator[str]:
    """Serve ``app`` with uvicorn in a thread on a free loopback port; yield its base URL; shut it down after."""
    import uvicorn

    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


@contextlib.contextmanager
def server_process(*args: str, port: int | None = None, timeout: float = 60) -> Iterator[tuple[str, subprocess.Popen]]:
    """Run ``lmforge serve ARGS --port P`` in a subprocess; yield (base URL, process) once /health answers."""
    import httpx

    port = port or free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)]),
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    proc = subprocess.Popen(serve_command(*args, "--port", str(port)), cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    try:
        while True:
            if proc.poll() is not None:
                out, err = proc.communicate()
                raise RuntimeError(f"lmforge serve exited with {proc.returncode}:\n{out}\n{err}")
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("lmforge serve did not start in time")
            time.sleep(0.1)
        yield url, proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

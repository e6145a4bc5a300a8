"""``lmforge serve`` as a process: start-up, graceful shutdown with requests in flight, the command's checks."""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from lmforge.errors import LmforgeError
from tests.serve import REPO, server_process


def test_sigterm_answers_the_requests_in_flight_then_exits_0(tiny_encoder_dir):
    # A long batching wait keeps the requests queued in the server when SIGTERM arrives.
    # No --host: the server must bind to loopback, where server_process looks for it.
    with server_process("--model", str(tiny_encoder_dir), "--max-batch", "64", "--max-wait-ms", "5000") as (url, proc):
        texts = [f"alice lives in paris {'and ' * i}" for i in range(6)]
        alone = httpx.post(f"{url}/embed", json={"texts": texts}, timeout=60).json()["embeddings"]
        with ThreadPoolExecutor(6) as pool:
            futures = [pool.submit(httpx.post, f"{url}/embed", json={"texts": [t]}, timeout=60) for t in texts]
            deadline = time.monotonic() + 30
            while httpx.get(f"{url}/info", timeout=30).json()["batch_stats"]["/embed"]["in_flight"] < 6:
                assert time.monotonic() < deadline, "the requests did not reach the server"
                time.sleep(0.05)
            assert not any(f.done() for f in futures), "the requests should still be waiting for their batch"
            proc.send_signal(signal.SIGTERM)
            responses = [f.result() for f in futures]
        code = proc.wait(60)
        stderr = proc.stderr.read()
    assert [r.status_code for r in responses] == [200] * 6
    for response, expected in zip(responses, alone, strict=True):
        assert response.json()["embeddings"][0] == pytest.approx(expected, rel=1e-4, abs=1e-5)
    assert code == 0, stderr
    assert "stopped by SIGTERM" in stderr


def _args(*argv: str) -> argparse.Namespace:
    from lmforge.commands.serve import add_serve_arguments

    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    return parser.parse_args(list(argv))


def test_other_hosts_get_a_warning(tiny_encoder_dir, monkeypatch, capsys):
    import uvicorn

    from lmforge.cli import setup_logging
    from lmforge.commands.serve import run_serve

    started = {}
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, sockets=None: started.update(host=self.config.host))
    setup_logging(False)
    assert run_serve(_args("--model", str(tiny_encoder_dir), "--host", "0.0.0.0", "--port", "0")) == 0
    assert started == {"host": "0.0.0.0"}
    assert "--host 0.0.0.0: the server is reachable from other machines" in capsys.readouterr().err
    assert run_serve(_args("--model", str(tiny_encoder_dir), "--port", "0")) == 0
    assert started == {"host": "127.0.0.1"} and "reachable" not in capsys.readouterr().err


def test_missing_fastapi_names_the_extra(tiny_encoder_dir, monkeypatch):
    from lmforge.commands.serve import run_serve

    monkeypatch.setitem(sys.modules, "fastapi", None)
    with pytest.raises(LmforgeError, match=r"needs fastapi \(not installed here\): pip install 'lmforge\[serve\]'"):
        run_serve(_args("--model", str(tiny_encoder_dir)))
    from lmforge.serve import create_app

    with pytest.raises(LmforgeError, match=r"pip install 'lmforge\[serve\]'"):
        create_app(tiny_encoder_dir)


def test_lmforge_imports_without_the_serving_extra():
    code = ("import sys\n"
            "sys.modules.update(fastapi=None, uvicorn=None, starlette=None)\n"
            "import lmforge, lmforge.cli, lmforge.serve, lmforge.serve.batcher, lmforge.commands.serve\n"
            "print('ok')\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr

"""The request body limit holds whatever the transfer encoding: bodies sent chunked (no Content-Length) are counted
as they arrive and refused with 413 as soon as they pass the limit, without the app reading, or the server holding,
the rest. The limits on texts, characters and tokens hold for chunked bodies too."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from lmforge.serve import create_app
from lmforge.serve.app import BodySizeLimit
from lmforge.serve.schemas import Limits
from tests.serve import server_process

# 2 texts of 100 characters: a body limit of 2 * 2 * 100 * 12 + 65,536 = 70,336 bytes.
LIMITS = {"max_texts": 2, "max_chars": 100, "max_length": 16}
LIMIT = Limits(**LIMITS).max_body_bytes
CHUNK = 16_384
JSON = {"content-type": "application/json"}


def _too_large(has: str, limit: int = LIMIT) -> str:
    return f"the body has {has} bytes; at most {limit:,} are accepted (it follows from --max-texts and --max-chars)"


class Pulled:
    """A request body of ``total`` bytes streamed from an async generator; ``bytes`` counts what was pulled."""

    def __init__(self, head: bytes, total: int, chunk: int = CHUNK) -> None:
        self.head, self.total, self.chunk = head, total, chunk
        self.bytes = 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        if self.head:
            self.bytes += len(self.head)
            yield self.head
        while self.bytes < self.total:
            piece = b"a" * min(self.chunk, self.total - self.bytes)
            self.bytes += len(piece)
            yield piece


async def _split(body: bytes, size: int) -> AsyncIterator[bytes]:
    for start in range(0, len(body), size):
        yield body[start:start + size]


def post(app, *contents, path: str = "/embed", headers: dict[str, str] | None = None) -> list[httpx.Response]:
    """POST each content in turn to ``app`` in process, in one event loop (the app's batchers live on one).

    httpx's ASGI transport hands a streamed content (an async iterable, sent chunked) to the app one
    ``http.request`` message per piece, and pulls a piece only when the app asks for one.
    """
    async def run() -> list[httpx.Response]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
            return [await client.post(path, content=c, headers={**JSON, **(headers or {})}) for c in contents]

    return asyncio.run(run())


async def _shut_down(app) -> None:
    """Run the app's lifespan, whose exit closes its batchers and its model thread."""
    async with app.router.lifespan_context(app):
        pass


@pytest.fixture
def app(tiny_encoder_dir):
    """A fresh app per test: its batchers belong to the event loop of the test's one ``post``."""
    app = create_app(tiny_encoder_dir, max_wait_ms=0, **LIMITS)
    yield app
    asyncio.run(_shut_down(app))


# ---------------------------------------------------------------------------------------------- in process
def test_a_chunked_body_over_the_limit_gets_413_and_is_not_read_further(app):
    body = Pulled(b'{"texts": ["', total=50 * LIMIT)
    (r,) = post(app, body)  # httpx's ASGI transport fails on a second response: the 413 went out once
    assert r.request.headers["transfer-encoding"] == "chunked" and "content-length" not in r.request.headers
    assert r.status_code == 413, r.text
    assert LIMIT < body.bytes <= LIMIT + CHUNK  # reading stopped at the first piece past the limit
    assert r.json() == {"error": _too_large(f"at least {body.bytes:,}")}
    assert app.state.batchers["/embed"].batches == 0  # the endpoint never ran


def test_a_chunked_body_under_the_limit_gets_200_and_the_same_answer(app):
    raw = json.dumps({"texts": ["alice lives in paris", "bob"]}).encode()
    chunked, whole = post(app, _split(raw, 7), raw)
    assert chunked.request.headers["transfer-encoding"] == "chunked"
    assert chunked.status_code == 200, chunked.text
    assert chunked.json() == whole.json()


def test_the_limit_is_inclusive(app):
    raw = b'{"texts": ["a"]}' + b" " * (LIMIT - 16)
    at, over = post(app, _split(raw, CHUNK), _split(raw + b" ", CHUNK))
    assert at.status_code == 200, at.text
    assert over.status_code == 413 and over.json() == {"error": _too_large(f"at least {LIMIT + 1:,}")}


def test_a_content_length_over_the_limit_gets_413_before_any_byte_is_read(app):
    body = Pulled(b"", total=LIMIT + 1)
    (r,) = post(app, body, headers={"content-length": str(LIMIT + 1)})
    assert r.status_code == 413 and r.json() == {"error": _too_large(f"{LIMIT + 1:,}")}
    assert body.bytes == 0


@pytest.mark.parametrize("body, message", [
    ({"texts": ["a", "b", "c"]}, "texts: 3 items; at most 2 are accepted per request (server option --max-texts)"),
    ({"texts": ["a" * 101]}, "texts[0]: 101 characters; at most 100 are accepted (server option --max-chars)"),
    ({"texts": ["alice " * 15]}, "texts[0]: 17 tokens ([CLS]/[SEP] included); at most 16 are accepted (server "
                                 "option --max-length)"),
])
def test_texts_characters_and_tokens_are_limited_whatever_the_transfer_encoding(app, body, message):
    raw = json.dumps(body).encode()
    for r in post(app, raw, _split(raw, 5)):
        assert r.status_code == 413 and r.json() == {"error": message}


async def _read_all(receive) -> None:
    while (await receive()).get("more_body", False):
        pass


async def _bare_app(scope, receive, send) -> None:
    """An ASGI app without FastAPI's exception handlers: the 413 reaches the middleware itself."""
    await _read_all(receive)
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"read"})


async def _streaming_app(scope, receive, send) -> None:
    """An app that starts its answer before reading the body: too late for a 413."""
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await _read_all(receive)


def test_the_middleware_answers_a_413_no_handler_took_and_never_answers_twice():
    from starlette.exceptions import HTTPException

    limited = BodySizeLimit(_bare_app, max_bytes=100)
    over, at = post(limited, _split(b"a" * 250, 60), _split(b"a" * 100, 60), path="/")
    assert over.status_code == 413 and over.json() == {"error": _too_large("at least 120", limit=100)}
    assert at.status_code == 200 and at.text == "read"
    with pytest.raises(HTTPException) as raised:  # a response has started: the error goes to the server
        post(BodySizeLimit(_streaming_app, max_bytes=100), _split(b"a" * 250, 60), path="/")
    assert raised.value.status_code == 413


def test_a_body_whose_last_message_passes_the_limit_is_named_by_its_size():
    messages = [{"type": "http.request", "body": b"a" * 60, "more_body": True},
                {"type": "http.request", "body": b"a" * 60, "more_body": False}]
    sent: list[dict] = []

    async def receive() -> dict:
        return messages.pop(0)

    async def send(message: dict) -> None:
        sent.append(message)

    asyncio.run(BodySizeLimit(_bare_app, max_bytes=100)({"type": "http", "headers": []}, receive, send))
    assert [m.get("status") for m in sent] == [413, None]
    assert json.loads(sent[1]["body"]) == {"error": _too_large("120", limit=100)}


# ---------------------------------------------------------------------------------------------- a real server
@pytest.fixture(scope="module")
def server(tiny_encoder_dir) -> Iterator[tuple[str, int]]:
    """``lmforge serve`` in a subprocess with the small limits; yields (base URL, server pid)."""
    with server_process("--model", str(tiny_encoder_dir), "--max-texts", "2", "--max-chars", "100",
                        "--max-length", "16") as (url, proc):
        yield url, proc.pid
        proc.terminate()
        assert proc.wait(60) == 0
        stderr = proc.stderr.read()
    assert "Exception in ASGI application" not in stderr and "Traceback" not in stderr, stderr


def _memory_mib(pid: int) -> dict[str, float]:
    """VmRSS (now) and VmHWM (the peak so far) of a process, in MiB."""
    status = Path(f"/proc/{pid}/status")
    if not status.exists():
        pytest.skip("reading a process's memory needs /proc (Linux)")
    fields = dict(line.split(":", 1) for line in status.read_text().splitlines() if ":" in line)
    return {key: int(fields[key].split()[0]) / 1024 for key in ("VmRSS", "VmHWM")}


def _stream(total: int, chunk: int = 1 << 20) -> Iterator[bytes]:
    """A JSON-looking body of ``total`` bytes, made one chunk at a time (the client never holds it whole)."""
    yield b'{"texts": ["'
    block = b"a" * chunk
    for _ in range(total // chunk):
        yield block


def test_a_real_server_refuses_a_huge_chunked_body_with_flat_memory(server):
    url, pid = server
    size = 1000 * LIMIT  # ~67 MiB
    with httpx.Client(base_url=url, timeout=60) as client:
        assert client.post("/embed", json={"texts": ["alice"]}).status_code == 200  # warm up
        assert client.post("/embed", content=_stream(4 * LIMIT, CHUNK), headers=JSON).status_code == 413
        before = _memory_mib(pid)
        r = client.post("/embed", content=_stream(size), headers=JSON)
        after = _memory_mib(pid)
        assert client.post("/embed", json={"texts": ["bob"]}).status_code == 200  # the server is fine
    print(f"\nchunked body of {size / 2**20:.0f} MiB, limit {LIMIT:,} bytes: server VmRSS {before['VmRSS']:.0f} -> "
          f"{after['VmRSS']:.0f} MiB, VmHWM {before['VmHWM']:.0f} -> {after['VmHWM']:.0f} MiB")
    assert r.status_code == 413 and r.json()["error"].startswith("the body has at least ")
    assert after["VmHWM"] - before["VmHWM"] < size / 2**20 / 8
    assert after["VmRSS"] - before["VmRSS"] < size / 2**20 / 8


def _recv(sock: socket.socket) -> bytes:
    data = sock.recv(65536)
    if not data:
        pytest.fail("the server closed the connection")
    return data


def _read_response(sock: socket.socket) -> tuple[int, bytes]:
    """(status, body) of one HTTP/1.1 response with a Content-Length."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += _recv(sock)
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    while len(body) < int(headers["content-length"]):
        body += _recv(sock)
    return int(lines[0].split()[1]), body


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def test_the_413_comes_before_the_end_of_the_body_and_the_connection_stays_usable(server):
    url, _ = server
    address = urlsplit(url)
    with socket.create_connection((address.hostname, address.port), timeout=30) as sock:
        sock.sendall(b"POST /embed HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n" + _chunk(b'{"texts": ["'))
        for _ in range(2 * LIMIT // CHUNK):
            sock.sendall(_chunk(b"a" * CHUNK))
        status, body = _read_response(sock)  # the body is not finished: the server answered without it
        assert status == 413 and json.loads(body)["error"].startswith("the body has at least ")
        for _ in range(2 * LIMIT // CHUNK):  # the rest, which the server reads and discards
            sock.sendall(_chunk(b"a" * CHUNK))
        sock.sendall(b"0\r\n\r\nGET /health HTTP/1.1\r\nHost: test\r\n\r\n")
        assert _read_response(sock) == (200, b'{"status":"ok"}')

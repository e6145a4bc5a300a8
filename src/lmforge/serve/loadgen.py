"""A load generator for ``lmforge serve``: N requests, C at a time, latency percentiles, throughput, and a check
that the answers under load equal the answers one at a time.

Meant to run in its own process, apart from the server (the serving tests and ``benchmarks/bench_serve.py``)::

    python -m lmforge.serve.loadgen --url http://127.0.0.1:8000 --path /classify --bodies bodies.json \\
        --requests 2000 --concurrency 16

``bodies.json`` is a JSON list of request bodies; request i sends body ``i % len(bodies)``. First every distinct
body is sent once, one at a time (the reference answers, and a warm-up); then the N requests run with C in
flight. The result is one JSON object on stdout: the status counts, p50/p90/p99/max latency in milliseconds,
requests per second, and how many answers differ from the reference (floats within a tolerance, everything else
exactly). Requires httpx (a dev dependency).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

REL_TOL = 1e-4  # batched and one-at-a-time forward passes differ by fp32 rounding (padding, summation order)
ABS_TOL = 1e-5


@dataclass
class LoadResult:
    """What one load run measured."""

    path: str
    requests: int
    concurrency: int
    wall_s: float
    throughput_rps: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    mean_ms: float
    status_counts: dict[str, int]
    server_errors: int
    mismatches: int = 0
    checked: int = 0
    first_mismatch: dict[str, Any] | None = None
    errors: list[str] = field(default_factory=list)
    batches: int | None = None  # forward passes the server ran for the load phase (from its /info), if it says
    batched_items: int | None = None


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank percentile ``q`` (0-100) of ``values``."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def same_answer(a: Any, b: Any, rel_tol: float = REL_TOL, abs_tol: float = ABS_TOL) -> bool:
    """Whether two JSON answers are equal: floats within the tolerances, everything else exactly."""
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, int | float) and isinstance(b, int | float) and \
            math.isclose(a, b, rel_tol=rel_tol, abs_tol=abs_tol)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_answer(a[k], b[k], rel_tol, abs_tol) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_answer(x, y, rel_tol, abs_tol) for x, y in zip(a, b, strict=True))
    return a == b


async def run_load(url: str, path: str, bodies: Sequence[Any], *, requests: int, concurrency: int,
                   check: bool = True, timeout: float = 120.0) -> LoadResult:
    """Send ``requests`` POSTs of ``bodies`` (cycled) to ``url + path`` with ``concurrency`` in flight."""
    import httpx

    if not bodies:
        raise ValueError("no request bodies")
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=timeout, limits=limits) as client:
        reference: list[Any] = []
        if check:  # one at a time: the reference answers (also warms the server up)
            for body in bodies:
                r = await client.post(path, json=body)
                reference.append(r.json() if r.status_code == 200 else None)
        before = await _batch_stats(client, path)
        latencies: list[float] = [0.0] * requests
        statuses: list[int] = [0] * requests
        answers: list[Any] = [None] * requests
        errors: list[str] = []
        next_index = 0

        async def worker() -> None:
            nonlocal next_index
            while next_index < requests:
                i = next_index
                next_index += 1
                start = time.perf_counter()
                try:
                    r = await client.post(path, json=bodies[i % len(bodies)])
                    statuses[i] = r.status_code
                    if check and r.status_code == 200:
                        answers[i] = r.json()
                except httpx.HTTPError as err:
                    statuses[i] = -1
                    errors.append(f"request {i}: {type(err).__name__}: {err}")
                latencies[i] = time.perf_counter() - start

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - start
        after = await _batch_stats(client, path)
    ms = [x * 1000 for x in latencies]
    result = LoadResult(path=path, requests=requests, concurrency=concurrency, wall_s=wall,
                        throughput_rps=requests / wall if wall > 0 else math.nan, p50_ms=percentile(ms, 50),
                        p90_ms=percentile(ms, 90), p99_ms=percentile(ms, 99), max_ms=max(ms), mean_ms=sum(ms) / len(ms),
                        status_counts={str(k): v for k, v in sorted(Counter(statuses).items())},
                        server_errors=sum(1 for s in statuses if s >= 500 or s < 0), errors=errors[:10])
    if before is not None and after is not None:
        result.batches = after["batches"] - before["batches"]
        result.batched_items = after["items"] - before["items"]
    if check:
        for i, answer in enumerate(answers):
            if answer is None:
                continue
            result.checked += 1
            expected = reference[i % len(bodies)]
            if not same_answer(answer, expected):
                result.mismatches += 1
                if result.first_mismatch is None:
                    result.first_mismatch = {"request": i, "body": bodies[i % len(bodies)],
                                             "one_at_a_time": expected, "under_load": answer}
    return result


async def _batch_stats(client: Any, path: str) -> dict[str, int] | None:
    """The server's batch counters for ``path`` (``lmforge serve``'s /info), or None for another server."""
    try:
        r = await client.get("/info")
        return r.json()["batch_stats"][path] if r.status_code == 200 else None
    except (ValueError, KeyError, TypeError):
        return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lmforge.serve.loadgen", description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True, help="the server, e.g. http://127.0.0.1:8000")
    p.add_argument("--path", required=True, help="the endpoint, e.g. /classify")
    p.add_argument("--bodies", required=True, metavar="FILE.json", help="a JSON list of request bodies")
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--no-check", dest="check", action="store_false", help="skip the one-at-a-time comparison")
    args = p.parse_args(argv)
    with open(args.bodies, encoding="utf-8") as f:
        bodies = json.load(f)
    if args.requests < 1 or args.concurrency < 1:
        p.error("--requests and --concurrency must be >= 1")
    result = asyncio.run(run_load(args.url, args.path, bodies, requests=args.requests,
                                  concurrency=args.concurrency, check=args.check))
    print(json.dumps(asdict(result)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A bounded load test: ``lmforge serve`` in one process, the load generator in another, 16 requests in flight.

The test sends 400 requests (the benchmark, ``benchmarks/bench_serve.py``, sends 2,000) so that it stays well under
30 s on two busy cores. It requires zero 5xx answers and answers under load equal to the answers one at a time
(labels exactly, scores within 1e-4 relative), and prints p50/p99 latency and throughput.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

from tests.serve import REPO, server_process
from tests.toy_tasks import BAD, FILLER, GOOD, NAMES

REQUESTS = 400
CONCURRENCY = 16


def make_bodies(n: int = 48, seed: int = 0) -> list[dict]:
    """/classify bodies of varied lengths (so batches mix paddings); every fifth holds two texts."""
    rng = random.Random(seed)

    def text() -> str:
        return " ".join(rng.sample(FILLER, rng.randint(0, 8)) + [rng.choice(NAMES), rng.choice(GOOD + BAD)])

    return [{"texts": [text()] + ([text()] if i % 5 == 4 else [])} for i in range(n)]


def test_load_has_no_server_errors_and_answers_as_one_at_a_time(finetuned, tmp_path):
    out, _, _ = finetuned("sequence")
    bodies = tmp_path / "bodies.json"
    bodies.write_text(json.dumps(make_bodies()), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
    with server_process("--model", str(out), "--max-batch", "32", "--max-wait-ms", "3") as (url, proc):
        client = subprocess.run([sys.executable, "-m", "lmforge.serve.loadgen", "--url", url, "--path", "/classify",
                                 "--bodies", str(bodies), "--requests", str(REQUESTS), "--concurrency",
                                 str(CONCURRENCY)], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
        assert client.returncode == 0, client.stderr
        result = json.loads(client.stdout)
        proc.terminate()
        assert proc.wait(60) == 0
    print(f"\n/classify, {REQUESTS} requests, {CONCURRENCY} concurrent: p50 {result['p50_ms']:.1f} ms, "
          f"p99 {result['p99_ms']:.1f} ms, {result['throughput_rps']:.1f} requests/s, statuses "
          f"{result['status_counts']}")
    assert result["server_errors"] == 0 and result["errors"] == []
    assert result["status_counts"] == {"200": REQUESTS}
    assert result["checked"] == REQUESTS
    assert result["mismatches"] == 0, result["first_mismatch"]
    assert result["p50_ms"] <= result["p99_ms"] and result["throughput_rps"] > 0

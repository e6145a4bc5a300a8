"""``MicroBatcher``: concurrent requests share calls, results go back to their requests, failures stay isolated."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from lmforge.errors import LmforgeError
from lmforge.serve.batcher import MicroBatcher, ShuttingDown


class Recorder:
    """``run(key, items)``: records each call; an item "bad" fails the call; results are (key, item * 2)."""

    def __init__(self, delay: float = 0.0) -> None:
        self.calls: list[tuple[object, list]] = []
        self.delay = delay
        self.threads: set[str] = set()

    def __call__(self, key, items):
        self.threads.add(threading.current_thread().name)
        self.calls.append((key, list(items)))
        if self.delay:
            time.sleep(self.delay)
        if "bad" in items:
            raise LmforgeError("bad input")
        return [(key, item * 2) for item in items]


def run(coro):
    return asyncio.run(coro)


@pytest.fixture
def executor():
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="model") as pool:
        yield pool


def test_concurrent_requests_share_calls_and_get_their_own_results(executor):
    recorder = Recorder(delay=0.02)
    batcher = MicroBatcher(recorder, executor, max_batch=8, max_wait=0.05, name="t")

    async def main():
        requests = [[f"{i}a", f"{i}b"] if i % 2 else [f"{i}"] for i in range(9)]
        results = await asyncio.gather(*(batcher.submit(r) for r in requests))
        await batcher.close()
        return requests, results

    requests, results = run(main())
    for request, result in zip(requests, results, strict=True):
        assert result == [(None, item * 2) for item in request]
    sizes = [len(items) for _, items in recorder.calls]
    assert sum(sizes) == 13 and len(recorder.calls) < 9, sizes  # batched: fewer calls than requests
    assert max(sizes) <= 8
    assert recorder.threads == {"model_0"}  # every call in the executor's one thread


def test_a_request_larger_than_max_batch_runs_alone(executor):
    recorder = Recorder()
    batcher = MicroBatcher(recorder, executor, max_batch=3, max_wait=0.01)

    async def main():
        return await asyncio.gather(batcher.submit(list("abcde")), batcher.submit(["x"]))

    big, small = run(main())
    assert big == [(None, c * 2) for c in "abcde"] and small == [(None, "xx")]
    assert sorted(len(items) for _, items in recorder.calls) == [1, 5]


def test_different_keys_never_share_a_call(executor):
    recorder = Recorder()
    batcher = MicroBatcher(recorder, executor, max_batch=16, max_wait=0.05)

    async def main():
        return await asyncio.gather(batcher.submit(["a"], key=1), batcher.submit(["b"], key=2),
                                    batcher.submit(["c"], key=1))

    a, b, c = run(main())
    assert (a, b, c) == ([(1, "aa")], [(2, "bb")], [(1, "cc")])
    assert sorted((key, items) for key, items in recorder.calls) == [(1, ["a", "c"]), (2, ["b"])]


def test_a_failing_request_does_not_fail_its_batch_mates(executor):
    recorder = Recorder()
    batcher = MicroBatcher(recorder, executor, max_batch=16, max_wait=0.05)

    async def main():
        return await asyncio.gather(batcher.submit(["a"]), batcher.submit(["bad"]), batcher.submit(["c"]),
                                    return_exceptions=True)

    a, bad, c = run(main())
    assert a == [(None, "aa")] and c == [(None, "cc")]
    assert isinstance(bad, LmforgeError) and "bad input" in str(bad)
    assert recorder.calls[0][1] == ["a", "bad", "c"]  # tried together first, then one by one


def test_disabled_batching_runs_each_request_on_its_own(executor):
    recorder = Recorder(delay=0.01)
    batcher = MicroBatcher(recorder, executor, max_batch=16, max_wait=0.05, enabled=False)

    async def main():
        return await asyncio.gather(*(batcher.submit([i]) for i in range(5)))

    assert run(main()) == [[(None, i * 2)] for i in range(5)]
    assert [items for _, items in recorder.calls] == [[i] for i in range(5)]  # in arrival order


def test_close_serves_queued_requests_then_refuses_new_ones(executor):
    recorder = Recorder(delay=0.05)
    batcher = MicroBatcher(recorder, executor, max_batch=2, max_wait=0.001)

    async def main():
        pending = [asyncio.ensure_future(batcher.submit([i])) for i in range(6)]
        await asyncio.sleep(0.01)  # the worker has taken the first batch; the rest are queued
        await batcher.close()
        assert all(p.done() for p in pending)
        with pytest.raises(ShuttingDown):
            await batcher.submit([9])
        return [p.result() for p in pending]

    assert run(main()) == [[(None, i * 2)] for i in range(6)]


def test_invalid_settings_are_rejected(executor):
    with pytest.raises(ValueError, match="max_batch"):
        MicroBatcher(Recorder(), executor, max_batch=0)
    with pytest.raises(ValueError, match="max_wait"):
        MicroBatcher(Recorder(), executor, max_wait=-1)

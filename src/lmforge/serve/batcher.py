"""Dynamic micro-batching: concurrent requests to one endpoint share one forward pass.

Each endpoint has a ``MicroBatcher``. A request submits its items (texts) and awaits a future. One worker task per
batcher takes the first waiting request, then keeps collecting until the batch holds ``max_batch`` items or
``max_wait`` seconds have passed, and runs the whole batch with ONE call of ``run`` in a thread (PyTorch releases
the GIL in its kernels, so the event loop keeps accepting and validating requests meanwhile). The results are
split back per request. This is the scheme of serving systems such as Clipper (Crankshaw et al., 2017, "Clipper:
A Low-Latency Online Prediction Serving System", section 4.3, adaptive batching with a batch delay) and NVIDIA
Triton's dynamic batcher; the batch size here is fixed by ``max_batch`` rather than adapted.

All batchers of a server share one single-thread executor, so only one forward pass runs at a time: on a few CPU
cores two concurrent passes would only slow each other down, and the model and tokenizer need no locking.

Answers equal one-at-a-time answers: requests in one batch differ only in the padding around them, and the models
are padding-invariant up to fp32 rounding. Requests whose ``key`` differs (e.g. other embedding layers) are run in
separate calls. When a batched call fails, each of its requests is run again on its own, so one bad input never
fails the requests it happened to share a batch with.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("lmforge")

RunFn = Callable[[Hashable, list[Any]], Sequence[Any]]


class ShuttingDown(RuntimeError):
    """A request arrived after the batcher was closed."""


@dataclass
class _Request:
    key: Hashable
    items: list[Any]
    future: asyncio.Future = field(repr=False)


_STOP = object()  # queued by ``close``: everything queued before it is still served


class MicroBatcher:
    """Collects concurrent requests into batches of up to ``max_batch`` items for one ``run`` call.

    Args:
        run: ``run(key, items) -> results``, one result per item, called in ``executor``; ``key`` is the
            requests' shared option (requests with different keys never share a call).
        executor: where ``run`` runs (a single-thread executor shared by all endpoints).
        max_batch: items per call; a request larger than this runs alone (``run`` must then split it itself).
        max_wait: seconds to wait for more requests once one is waiting (the latency paid for batching).
        enabled: False runs every request on its own, in arrival order (the baseline of the benchmark).
        name: the endpoint, for log messages.
    """

    def __init__(self, run: RunFn, executor: Executor, *, max_batch: int = 32, max_wait: float = 0.003,
                 enabled: bool = True, name: str = "") -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if max_wait < 0:
            raise ValueError(f"max_wait must be >= 0, got {max_wait}")
        self.run, self.executor = run, executor
        self.max_batch, self.max_wait, self.enabled, self.name = max_batch, max_wait, enabled, name
        self._queue: asyncio.Queue | None = None
        self._worker: asyncio.Task | None = None
        self._carry: _Request | None = None  # taken from the queue but did not fit the last batch
        self._closed = False
        self._in_flight = 0
        self.batches = 0  # calls of ``run`` so far (statistics for /info and the tests)
        self.batched_items = 0

    # ------------------------------------------------------------------------------------------ public
    async def submit(self, items: Sequence[Any], key: Hashable = None) -> list[Any]:
        """The results for ``items`` (in order), once the batch holding them has run.

        Raises:
            ShuttingDown: the batcher is closed.
            Exception: whatever ``run`` raised for this request's items when run on their own.
        """
        if self._closed:
            raise ShuttingDown("the server is shutting down")
        items = list(items)
        if not items:
            return []
        self._in_flight += 1
        try:
            if not self.enabled:
                return await self._call(key, items)
            self._ensure_worker()
            assert self._queue is not None
            future = asyncio.get_running_loop().create_future()
            self._queue.put_nowait(_Request(key, items, future))
            return await future
        finally:
            self._in_flight -= 1

    @property
    def in_flight(self) -> int:
        """Requests submitted and not answered yet."""
        return self._in_flight

    async def close(self) -> None:
        """Stop taking requests, serve every request already queued, then stop the worker."""
        self._closed = True
        if self._worker is not None and not self._worker.done():
            assert self._queue is not None
            self._queue.put_nowait(_STOP)
            await self._worker
        while self._in_flight:  # unbatched requests still running in the executor
            await asyncio.sleep(0.005)

    # ------------------------------------------------------------------------------------------ worker
    def _ensure_worker(self) -> None:
        # Created lazily on the serving loop, so the batcher also works without the app's lifespan events.
        if self._worker is None or self._worker.done():
            self._queue = self._queue or asyncio.Queue()
            self._worker = asyncio.get_running_loop().create_task(self._work(), name=f"batcher-{self.name}")

    async def _work(self) -> None:
        assert self._queue is not None
        loop = asyncio.get_running_loop()
        stopping = False
        while not stopping:
            first = self._carry or await self._queue.get()
            self._carry = None
            if first is _STOP:
                break
            batch, size = [first], len(first.items)
            deadline = loop.time() + self.max_wait
            while size < self.max_batch:
                if self._queue.empty():
                    remaining = deadline - loop.time()
                    if remaining <= 0:
                        break
                    # Poll rather than wait_for(queue.get()): cancelling a pending get is easy to get wrong.
                    await asyncio.sleep(min(remaining, 0.0005))
                    continue
                request = self._queue.get_nowait()
                if request is _STOP:
                    stopping = True
                    break
                if size + len(request.items) > self.max_batch:
                    self._carry = request  # starts the next batch
                    break
                batch.append(request)
                size += len(request.items)
            await self._run_batch(batch)
        if self._carry is not None:  # cannot happen after _STOP, which is always last; kept for safety
            await self._run_batch([self._carry])
            self._carry = None

    async def _run_batch(self, batch: list[_Request]) -> None:
        groups: dict[Hashable, list[_Request]] = {}
        for request in batch:
            groups.setdefault(request.key, []).append(request)
        for key, requests in groups.items():
            items = [item for r in requests for item in r.items]
            try:
                results = await self._call(key, items)
            except Exception as err:  # isolated below: one bad request must not fail the others
                if len(requests) == 1:
                    _settle(requests[0].future, error=err)
                    continue
                log.debug("%s: a batch of %d requests failed (%s); running them one by one", self.name,
                          len(requests), err)
                for request in requests:
                    try:
                        _settle(request.future, result=await self._call(key, request.items))
                    except Exception as one_err:  # handed to that request's handler
                        _settle(request.future, error=one_err)
                continue
            start = 0
            for request in requests:
                _settle(request.future, result=results[start:start + len(request.items)])
                start += len(request.items)

    async def _call(self, key: Hashable, items: list[Any]) -> list[Any]:
        self.batches += 1
        self.batched_items += len(items)
        results = await asyncio.get_running_loop().run_in_executor(self.executor, self.run, key, items)
        results = list(results)
        if len(results) != len(items):
            raise RuntimeError(f"{self.name}: {len(items)} inputs gave {len(results)} results")
        return results


def _settle(future: asyncio.Future, *, result: Any = None, error: BaseException | None = None) -> None:
    if future.done():  # the client went away and its handler was cancelled
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)

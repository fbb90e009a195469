"""``BatchingRetriever``: coalesce concurrent ``retrieve`` calls into one batched call.

Many envs in one process (a rollout of 64 trajectories) each search one query at a time; against
a retrieval server that is one HTTP round trip per query. Wrapped in a ``BatchingRetriever``,
calls that arrive within ``max_wait`` seconds of each other (up to ``max_batch`` queries) go out
as one ``retrieve(queries, k)`` call, the way Search-R1 batches its rollouts' searches. Each
caller gets its own slice of the result, or the batch's exception.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field

from turngym.envs.search.retriever import Doc, Retriever, RetrieverError


@dataclass
class _Request:
    queries: list[str]
    k: int
    future: Future = field(default_factory=Future)


class BatchingRetriever:
    """A thread-safe ``Retriever`` that batches concurrent calls to ``inner``."""

    def __init__(self, inner: Retriever, *, max_batch: int = 64, max_wait: float = 0.002):
        if max_batch < 1 or max_wait < 0:
            raise ValueError("max_batch must be >= 1 and max_wait >= 0")
        self.inner = inner
        self.max_batch = max_batch
        self.max_wait = max_wait
        self.batches = 0  # how many calls reached ``inner`` (for tests and metrics)
        self._pending: list[_Request] = []
        self._cond = threading.Condition()
        self._closed = False
        self._worker = threading.Thread(target=self._run, name="turngym-retrieval-batcher", daemon=True)
        self._worker.start()

    def retrieve(self, queries: Sequence[str], k: int = 3) -> list[list[Doc]]:
        if isinstance(queries, str):
            raise RetrieverError("queries must be a list of strings, not one string")
        request = _Request(list(queries), k)
        if not request.queries:
            return []
        with self._cond:
            if self._closed:
                raise RetrieverError("the batching retriever is closed")
            self._pending.append(request)
            self._cond.notify()
        return request.future.result()

    def _take_batch(self) -> list[_Request] | None:
        """Wait for a request, then up to ``max_wait`` for more with the same ``k``."""
        with self._cond:
            while not self._pending and not self._closed:
                self._cond.wait()
            if not self._pending:
                return None
            self._cond.wait_for(
                lambda: self._closed or self._size(self._pending) >= self.max_batch, self.max_wait
            )
            k = self._pending[0].k
            batch, rest, size = [], [], 0
            for r in self._pending:
                if r.k == k and (not batch or size + len(r.queries) <= self.max_batch):
                    batch.append(r)
                    size += len(r.queries)
                else:
                    rest.append(r)
            self._pending = rest
            return batch

    @staticmethod
    def _size(requests: list[_Request]) -> int:
        return sum(len(r.queries) for r in requests)

    def _run(self) -> None:
        while (batch := self._take_batch()) is not None:
            queries = [q for r in batch for q in r.queries]
            try:
                results = self.inner.retrieve(queries, batch[0].k)
                self.batches += 1
                if len(results) != len(queries):
                    raise RetrieverError(
                        f"retriever returned {len(results)} result lists for {len(queries)} queries"
                    )
            except BaseException as e:  # noqa: BLE001 - every waiting caller gets the failure
                for r in batch:
                    r.future.set_exception(e)
                continue
            start = 0
            for r in batch:
                r.future.set_result(results[start : start + len(r.queries)])
                start += len(r.queries)

    def close(self) -> None:
        """Finish the queued calls, stop the worker, and close ``inner`` if it can be closed."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._worker.join(timeout=30)
        close = getattr(self.inner, "close", None)
        if callable(close):
            close()

"""BatchingRetriever: concurrent calls coalesce into batched calls, results and errors reach the right caller."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from turngym.envs.search.batching import BatchingRetriever
from turngym.envs.search.retriever import Doc, RetrieverError


class Recording:
    """A retriever that answers each query with one doc named after it, and records its calls."""

    def __init__(self, delay: float = 0.0, fail_on: str | None = None):
        self.calls: list[tuple[list[str], int]] = []
        self.delay = delay
        self.fail_on = fail_on
        self.closed = False
        self.lock = threading.Lock()

    def retrieve(self, queries, k=3):
        with self.lock:
            self.calls.append((list(queries), k))
        time.sleep(self.delay)
        if self.fail_on in queries:
            raise RetrieverError(f"boom on {self.fail_on}")
        return [[Doc(q, q, f"{q} x{k}")] for q in queries]

    def close(self):
        self.closed = True


def test_concurrent_calls_are_batched_and_answered_correctly():
    inner = Recording(delay=0.01)
    batcher = BatchingRetriever(inner, max_batch=64, max_wait=0.05)
    queries = [f"q{i}" for i in range(40)]
    with ThreadPoolExecutor(40) as pool:
        results = list(pool.map(lambda q: batcher.retrieve([q], 3), queries))
    assert [r[0][0].id for r in results] == queries  # every caller got its own answer
    assert sum(len(c[0]) for c in inner.calls) == 40
    assert len(inner.calls) < 10  # ... from a few batched calls, not 40
    batcher.close()
    assert inner.closed


def test_batches_respect_max_batch_and_k():
    inner = Recording(delay=0.01)
    batcher = BatchingRetriever(inner, max_batch=5, max_wait=0.05)
    with ThreadPoolExecutor(20) as pool:
        out = list(pool.map(lambda i: batcher.retrieve([f"q{i}", f"r{i}"], 1 + i % 2), range(20)))
    assert all(len(c[0]) <= 5 for c in inner.calls)
    assert all(
        {len(d) for d in r} == {1} and r[0][0].contents.endswith(f"x{1 + i % 2}") for i, r in enumerate(out)
    )
    for queries, k in inner.calls:  # one k per batch, and the right queries for it
        assert all(int(q[1:]) % 2 == k - 1 for q in queries)
    batcher.close()


def test_errors_reach_every_caller_of_the_failed_batch_only():
    inner = Recording(delay=0.02, fail_on="bad")
    batcher = BatchingRetriever(inner, max_batch=64, max_wait=0.05)

    def call(q):
        try:
            return batcher.retrieve([q], 3)[0][0].id
        except RetrieverError as e:
            return str(e)

    with ThreadPoolExecutor(3) as pool:
        got = list(pool.map(call, ["a", "bad", "c"]))
    assert all("boom on bad" in g for g in got)  # they travelled in one batch
    assert batcher.retrieve(["later"], 3)[0][0].id == "later"  # the batcher keeps working
    batcher.close()
    with pytest.raises(RetrieverError, match="closed"):
        batcher.retrieve(["x"], 3)


def test_input_checks():
    batcher = BatchingRetriever(Recording())
    assert batcher.retrieve([], 3) == []
    with pytest.raises(RetrieverError, match="list of strings"):
        batcher.retrieve("abc", 3)
    with pytest.raises(ValueError):
        BatchingRetriever(Recording(), max_batch=0)
    batcher.close()

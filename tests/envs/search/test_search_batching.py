"""BatchingRetriever: concurrent calls coalesce into batched calls, results and errors reach the right caller."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from turngym.envs.search.batching import BatchingRetriever
from turngym.envs.search.retriever import Doc, RetrieverError


class Recording:
    """Answers each query with one doc named after it and records its calls. ``gate`` holds the
    call for the query "hold" until released, so the tests can queue requests deterministically."""

    def __init__(self, fail_on: str | None = None):
        self.calls: list[tuple[list[str], int]] = []
        self.fail_on = fail_on
        self.closed = False
        self.gate = threading.Event()
        self.holding = threading.Event()

    def retrieve(self, queries, k=3):
        self.calls.append((list(queries), k))
        if "hold" in queries:
            self.holding.set()
            assert self.gate.wait(10)
        if self.fail_on in queries:
            raise RetrieverError(f"boom on {self.fail_on}")
        return [[Doc(q, q, f"{q} x{k}")] for q in queries]

    def close(self):
        self.closed = True


def queued_while_busy(batcher, inner, requests):
    """Run ``requests`` ((queries, k) pairs) in threads while the worker is busy, then release it."""
    with ThreadPoolExecutor(len(requests) + 1) as pool:
        blocker = pool.submit(batcher.retrieve, ["hold"], 3)
        assert inner.holding.wait(10)
        futures = [pool.submit(batcher.retrieve, q, k) for q, k in requests]
        deadline = time.monotonic() + 10
        while len(batcher._pending) < len(requests):  # all queued behind the busy worker
            assert time.monotonic() < deadline
            time.sleep(0.005)
        inner.gate.set()
        blocker.result()
        return [f.exception() or f.result() for f in futures]


def test_concurrent_calls_are_batched_and_answered_correctly():
    inner = Recording()
    batcher = BatchingRetriever(inner, max_batch=64)
    queries = [f"q{i}" for i in range(40)]
    results = queued_while_busy(batcher, inner, [([q], 3) for q in queries])
    assert [r[0][0].id for r in results] == queries  # every caller got its own answer
    assert sorted(inner.calls[1][0]) == sorted(queries) and inner.calls[1][1] == 3
    assert len(inner.calls) == 2  # the blocker, then one batch of 40
    batcher.close()
    assert inner.closed


def test_batches_respect_max_batch_and_k():
    inner = Recording()
    batcher = BatchingRetriever(inner, max_batch=5)
    requests = [([f"q{i}", f"r{i}"], 1 + i % 2) for i in range(20)]
    out = queued_while_busy(batcher, inner, requests)
    for (queries, k), result in zip(requests, out, strict=True):
        assert [d[0].id for d in result] == queries and result[0][0].contents.endswith(f"x{k}")
    batches = inner.calls[1:]
    assert all(len(q) <= 5 for q, _ in batches) and len(batches) == 10  # 2 requests (4 queries) each
    for queries, k in batches:  # one k per batch, and the right queries for it
        assert all(int(q[1:]) % 2 == k - 1 for q in queries)
    batcher.close()


def test_errors_reach_every_caller_of_the_failed_batch_only():
    inner = Recording(fail_on="bad")
    batcher = BatchingRetriever(inner)
    out = queued_while_busy(batcher, inner, [(["a"], 3), (["bad"], 3), (["c"], 3), (["d"], 5)])
    assert all(isinstance(e, RetrieverError) and "boom on bad" in str(e) for e in out[:3])  # one batch
    assert out[3][0][0].id == "d"  # a different k: its own batch, unaffected
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

"""A retrieval server (FastAPI) and its client; the client stands in for a local retriever.

``POST /retrieve`` takes Search-R1's request schema ``{"queries": [...], "topk": 3,
"return_scores": false}`` and answers ``{"result": [[doc, ...], ...]}`` where each doc is
``{"id", "title", "contents"}`` (or ``{"document": doc, "score": s}`` with ``return_scores``),
so Search-R1's own retrieval servers and this one are interchangeable. ``GET /health`` reports
the corpus size.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import Any

import httpx
from pydantic import BaseModel, Field

from turngym.envs.search.batching import BatchingRetriever
from turngym.envs.search.corpus import split_title
from turngym.envs.search.retriever import Doc, Retriever, RetrieverError

MAX_QUERIES = 1024
MAX_TOPK = 100
MAX_QUERY_CHARS = 10_000


class RetrieveRequest(BaseModel):
    """Search-R1's request body."""

    queries: list[str] = Field(min_length=1, max_length=MAX_QUERIES)
    topk: int = Field(3, ge=1, le=MAX_TOPK)
    return_scores: bool = False


def create_app(retriever: Retriever, *, corpus_size: int | None = None):
    """A FastAPI app serving ``retriever`` at ``/retrieve``."""
    from fastapi import FastAPI, HTTPException

    app = FastAPI(title="turngym retriever")

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {"status": "ok", "passages": corpus_size}

    @app.post("/retrieve")
    def retrieve(req: RetrieveRequest) -> dict[str, Any]:
        too_long = [i for i, q in enumerate(req.queries) if len(q) > MAX_QUERY_CHARS]
        if too_long:
            raise HTTPException(422, f"queries {too_long[:5]} are longer than {MAX_QUERY_CHARS} characters")
        try:
            results = retriever.retrieve(req.queries, req.topk)
        except RetrieverError as e:
            raise HTTPException(422, str(e)) from e
        if req.return_scores:
            return {
                "result": [[{"document": d.to_record(), "score": d.score} for d in docs] for docs in results]
            }
        return {"result": [[d.to_record() for d in docs] for docs in results]}

    return app


def serve(
    corpus: str | os.PathLike[str],
    host: str = "127.0.0.1",
    port: int = 8000,
    cache_dir: str | os.PathLike[str] | None = None,
) -> None:
    """Index ``corpus`` (cached) and serve it until interrupted."""
    import uvicorn

    from turngym.envs.search.retriever import BM25Retriever

    retriever = BM25Retriever.from_jsonl(corpus, cache_dir=cache_dir)
    uvicorn.run(create_app(retriever, corpus_size=len(retriever.corpus)), host=host, port=port)


class RemoteRetriever:
    """``retrieve(queries, k)`` against a ``/retrieve`` server (this one or Search-R1's).

    Requests go in batches of ``batch_size`` queries; every transport or protocol failure
    raises ``RetrieverError`` with the URL and the cause.
    """

    def __init__(self, url: str, *, timeout: float = 10.0, batch_size: int = 256, retries: int = 1):
        base = url.rstrip("/")
        self.url = base if base.endswith("/retrieve") else base + "/retrieve"
        self.batch_size = batch_size
        self.retries = retries
        self._client = httpx.Client(timeout=timeout)

    def retrieve(self, queries: Sequence[str], k: int = 3) -> list[list[Doc]]:
        if isinstance(queries, str):
            raise RetrieverError("queries must be a list of strings, not one string")
        out: list[list[Doc]] = []
        queries = list(queries)
        for start in range(0, len(queries), self.batch_size):
            batch = queries[start : start + self.batch_size]
            payload = self._post({"queries": batch, "topk": k, "return_scores": True})
            result = payload.get("result") if isinstance(payload, dict) else None
            if not isinstance(result, list) or len(result) != len(batch):
                raise RetrieverError(
                    f"{self.url}: malformed response (expected 'result' with {len(batch)} lists)"
                )
            out.extend([_parse_doc(item, self.url) for item in docs] for docs in result)
        return out

    def _post(self, body: dict[str, Any]) -> Any:
        last: Exception | None = None
        for _ in range(self.retries + 1):
            try:
                resp = self._client.post(self.url, json=body)
            except httpx.HTTPError as e:
                last = e
                continue
            if resp.status_code >= 500:
                last = RetrieverError(f"HTTP {resp.status_code}")
                continue
            if resp.status_code != 200:
                raise RetrieverError(f"{self.url}: HTTP {resp.status_code}: {resp.text[:300]}")
            try:
                return resp.json()
            except ValueError as e:
                raise RetrieverError(f"{self.url}: response is not JSON: {e}") from e
        raise RetrieverError(f"{self.url}: retrieval server unreachable ({type(last).__name__}: {last})")

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> RemoteRetriever:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _parse_doc(item: Any, url: str) -> Doc:
    score = 0.0
    if isinstance(item, dict) and "document" in item:
        score = float(item.get("score") or 0.0)
        item = item["document"]
    if not isinstance(item, dict) or "contents" not in item:
        raise RetrieverError(f"{url}: malformed document in response: {str(item)[:200]}")
    title, contents = item.get("title"), str(item["contents"])
    if title is None:  # wiki-18 style: "Title"\ntext
        title, contents = split_title(contents)
    return Doc(str(item.get("id", "")), str(title), contents, score)


_SHARED: dict[str, BatchingRetriever] = {}
_SHARED_LOCK = threading.Lock()


def shared_remote(url: str) -> BatchingRetriever:
    """One batching client per server URL per process: concurrent envs' searches share HTTP calls."""
    with _SHARED_LOCK:
        if url not in _SHARED:
            _SHARED[url] = BatchingRetriever(RemoteRetriever(url))
        return _SHARED[url]

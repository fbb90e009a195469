"""Retrievers: a batched ``retrieve(queries, k) -> [[Doc, ...], ...]`` API.

``BM25Retriever`` indexes a ``Corpus`` with bm25s; the index is built once and cached on disk
under ``<cache>/search/bm25/<corpus fingerprint>-<params>/`` (written to a temp directory and
renamed, so concurrent builders never see half an index), then loaded memory-mapped, so several
processes share one copy. ``RemoteRetriever`` (in ``server.py``) speaks the same API over HTTP.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

from turngym.core.cache import cache_root
from turngym.envs.search.corpus import Corpus

log = logging.getLogger(__name__)

INDEX_FORMAT = 1
_IMPORT_LOCK = threading.Lock()


def import_bm25s():
    """``import bm25s`` without numba and jax. turngym ranks with numpy, but bm25s imports numba (~1 s)
    whenever it is installed, and imports jax and runs a top-k with it at import time, which starts
    jax on the GPU and preallocates most of its memory: a training process that builds a search env
    then runs out of GPU memory. Both are hidden for that one import (unless already loaded). A lock
    makes envs built in several threads at once wait for the one import (never a half-built module)."""
    with _IMPORT_LOCK:
        if "bm25s" in sys.modules:
            return sys.modules["bm25s"]
        hidden = [name for name in ("numba", "jax") if name not in sys.modules]
        for name in hidden:
            sys.modules[name] = None  # type: ignore[assignment]  # makes `import <name>` raise ImportError
        try:
            import bm25s
        finally:
            for name in hidden:
                del sys.modules[name]
        return bm25s


class RetrieverError(RuntimeError):
    """Retrieval failed (bad request, unreachable server, broken index); the message says why."""


@dataclass(frozen=True, slots=True)
class Doc:
    """One retrieved passage and its score."""

    id: str
    title: str
    contents: str
    score: float = 0.0

    def to_record(self) -> dict[str, str]:
        return {"id": self.id, "title": self.title, "contents": self.contents}


@runtime_checkable
class Retriever(Protocol):
    """Anything with a batched ``retrieve``: the local BM25 index or a remote server."""

    def retrieve(self, queries: Sequence[str], k: int = 3) -> list[list[Doc]]: ...


@dataclass(frozen=True)
class BM25Params:
    """Scoring and tokenisation settings; part of the index cache key."""

    k1: float = 1.5
    b: float = 0.75
    method: str = "lucene"
    token_pattern: str = r"(?u)\b\w\w+\b"
    stopwords: str = "en"

    def key(self) -> str:
        bm25s = import_bm25s()
        payload = json.dumps(
            {
                "format": INDEX_FORMAT,
                "bm25s": bm25s.__version__,
                "k1": self.k1,
                "b": self.b,
                "method": self.method,
                "pattern": self.token_pattern,
                "stopwords": self.stopwords,
            },
            sort_keys=True,
        )
        return hashlib.sha256(payload.encode()).hexdigest()[:10]


class Tokenizer:
    """Lowercase regex tokens minus English stopwords (the same for passages and queries)."""

    def __init__(self, params: BM25Params):
        import_bm25s()
        from bm25s.stopwords import STOPWORDS_EN

        self._findall = re.compile(params.token_pattern).findall
        self._stop = frozenset(STOPWORDS_EN) if params.stopwords == "en" else frozenset()

    def __call__(self, text: str) -> list[str]:
        stop = self._stop
        return [t for t in self._findall(text.lower()) if t not in stop]


class BM25Retriever:
    """bm25s over a corpus, with an on-disk index cache keyed by the corpus fingerprint."""

    def __init__(
        self,
        corpus: Corpus,
        *,
        cache_dir: str | os.PathLike[str] | None = None,
        use_cache: bool = True,
        params: BM25Params | None = None,
    ):
        bm25s = import_bm25s()
        if len(corpus) == 0:
            raise RetrieverError("cannot index an empty corpus")
        self.corpus = corpus
        self.params = params or BM25Params()
        self.tokenize = Tokenizer(self.params)
        self.build_seconds = 0.0
        self.loaded_from_cache = False
        self.index_dir: Path | None = None
        if use_cache:
            self.index_dir = cache_root(cache_dir) / "search" / "bm25" / self._cache_name()
            if (self.index_dir / "done").is_file():
                try:
                    self.model = bm25s.BM25.load(str(self.index_dir), mmap=True, show_progress=False)
                    self._check_loaded()
                    self.loaded_from_cache = True
                except Exception as e:  # noqa: BLE001 - a broken cache entry is rebuilt, never fatal
                    log.warning("rebuilding the bm25 index at %s: %s", self.index_dir, e)
                    self.model = self._build()
                    self._save(self.index_dir, replace=True)
            else:
                self.model = self._build()
                self._save(self.index_dir)
        else:
            self.model = self._build()
        self._vocab: dict[str, int] = self.model.vocab_dict

    @classmethod
    def from_jsonl(cls, path: str | os.PathLike[str], **kwargs) -> BM25Retriever:
        return cls(Corpus.from_jsonl(path), **kwargs)

    def _cache_name(self) -> str:
        return f"{self.corpus.fingerprint[:20]}-{self.params.key()}"

    def _build(self):
        bm25s = import_bm25s()
        start = time.perf_counter()
        tokenize = self.tokenize
        vocab: dict[str, int] = {}
        ids: list[list[int]] = []
        setdefault = vocab.setdefault
        for i in range(len(self.corpus)):
            ids.append([setdefault(t, len(vocab)) for t in tokenize(self.corpus.text(i))])
        model = bm25s.BM25(k1=self.params.k1, b=self.params.b, method=self.params.method)
        model.index((ids, vocab), show_progress=False)
        self.build_seconds = time.perf_counter() - start
        return model

    def _save(self, final: Path, replace: bool = False) -> None:
        """Write the index to a temp folder and rename it into place; a finished index from a
        concurrent builder is kept unless ``replace`` (the cached one was found damaged)."""
        final.parent.mkdir(parents=True, exist_ok=True)
        if (final / "done").is_file() and not replace:
            return
        tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}."))
        tmp.chmod(0o755)
        try:
            self.model.save(str(tmp), show_progress=False)
            (tmp / "meta.json").write_text(
                json.dumps({"passages": len(self.corpus), "fingerprint": self.corpus.fingerprint})
            )
            (tmp / "done").write_text("")
            if (final / "done").is_file() and not replace:
                return  # another process finished first
            if final.exists():
                shutil.rmtree(final, ignore_errors=True)
            os.replace(tmp, final)
        except (
            OSError
        ) as e:  # another process won the race, or the disk is read-only: keep the in-memory index
            log.info("bm25 index not cached at %s: %s", final, e)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def _check_loaded(self) -> None:
        meta = json.loads((self.index_dir / "meta.json").read_text())  # type: ignore[operator]
        if meta.get("passages") != len(self.corpus) or meta.get("fingerprint") != self.corpus.fingerprint:
            raise RetrieverError("cached index does not match the corpus")

    # ------------------------------------------------------------- retrieval
    def scores(self, query: str) -> np.ndarray:
        """BM25 score of every passage for ``query`` (zeros when no query term is indexed)."""
        token_ids = [self._vocab[t] for t in self.tokenize(query) if t in self._vocab]
        if not token_ids:
            return np.zeros(len(self.corpus), dtype=np.float32)
        return self.model.get_scores_from_ids(token_ids)

    def top_positions(self, query: str, k: int) -> list[tuple[int, float]]:
        """(corpus position, score) of the best ``k`` passages with a positive score, best first."""
        scores = self.scores(query)
        n = len(scores)
        k = min(k, n)
        if k <= 0:
            return []
        top = np.argpartition(-scores, k - 1)[:k] if k < n else np.arange(n)
        top = top[scores[top] > 0]
        order = np.lexsort((top, -scores[top]))  # by score, ties by corpus order (deterministic)
        return [(int(top[i]), float(scores[top[i]])) for i in order]

    def retrieve(self, queries: Sequence[str], k: int = 3) -> list[list[Doc]]:
        """Top-``k`` passages for each query (fewer when fewer passages match at all)."""
        if isinstance(queries, str):
            raise RetrieverError("queries must be a list of strings, not one string")
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise RetrieverError(f"k must be a positive integer, got {k!r}")
        out: list[list[Doc]] = []
        c = self.corpus
        for q in queries:
            if not isinstance(q, str):
                raise RetrieverError(f"each query must be a string, got {type(q).__name__}")
            out.append([Doc(c.ids[i], c.titles[i], c.contents[i], s) for i, s in self.top_positions(q, k)])
        return out

    def memory_bytes(self) -> int:
        """Bytes held by the score arrays (memory-mapped when loaded from the cache)."""
        return int(sum(getattr(v, "nbytes", 0) for v in self.model.scores.values()))


_SHARED: dict[tuple[str, str, str], BM25Retriever] = {}
_SHARED_LOCK = threading.Lock()


def shared_bm25(corpus: Corpus, cache_dir: str | os.PathLike[str] | None = None) -> BM25Retriever:
    """One ``BM25Retriever`` per corpus per process (64 envs over one corpus share one index)."""
    key = (corpus.fingerprint, str(cache_root(cache_dir)), BM25Params().key())
    with _SHARED_LOCK:
        r = _SHARED.get(key)
        if r is None:
            r = _SHARED[key] = BM25Retriever(corpus, cache_dir=cache_dir)
        return r

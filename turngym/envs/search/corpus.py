"""A passage corpus in the JSONL format Search-R1 and FlashRAG use: ``{"id", "title", "contents"}``.

Records without a ``title`` follow the wiki-18 convention, where ``contents`` starts with the
quoted title on its own line (``"Title"\\ntext``); the title is split off. The corpus is held
column-wise (three lists) so that 100k+ passages stay compact and fast to hash.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class CorpusError(ValueError):
    """A corpus file or record that cannot be read; the message says which line and why."""


@dataclass(frozen=True, slots=True)
class Passage:
    id: str
    title: str
    contents: str

    def to_record(self) -> dict[str, str]:
        return {"id": self.id, "title": self.title, "contents": self.contents}


def split_title(contents: str) -> tuple[str, str]:
    """wiki-18 style ``"Title"\\ntext`` -> ``("Title", "text")``; other text has an empty title."""
    head, sep, rest = contents.partition("\n")
    if sep and len(head) >= 2 and head.startswith('"') and head.endswith('"'):
        return head[1:-1], rest
    return "", contents


class Corpus:
    """Passages with string ids; ``corpus[i]`` is the i-th passage, ``corpus.get(id)`` by id."""

    def __init__(self, ids: list[str], titles: list[str], contents: list[str]):
        if not (len(ids) == len(titles) == len(contents)):
            raise CorpusError("ids, titles and contents must have the same length")
        self.ids = ids
        self.titles = titles
        self.contents = contents
        self._index: dict[str, int] | None = None
        self._fingerprint: str | None = None

    # ------------------------------------------------------------ building
    @classmethod
    def from_records(cls, records: Iterable[dict[str, Any]], source: str = "records") -> Corpus:
        ids: list[str] = []
        titles: list[str] = []
        contents: list[str] = []
        for n, rec in enumerate(records, 1):
            if not isinstance(rec, dict):
                raise CorpusError(f"{source}: record {n} is {type(rec).__name__}, not an object")
            if "id" not in rec or "contents" not in rec:
                raise CorpusError(f"{source}: record {n} needs 'id' and 'contents' (has {sorted(rec)})")
            text = rec["contents"]
            if not isinstance(text, str):
                raise CorpusError(f"{source}: record {n}: 'contents' must be a string")
            title = rec.get("title")
            if title is None:
                title, text = split_title(text)
            ids.append(str(rec["id"]))
            titles.append(str(title))
            contents.append(text)
        corpus = cls(ids, titles, contents)
        if len(corpus._id_index()) != len(ids):
            seen: set[str] = set()
            dup = next(i for i in ids if i in seen or seen.add(i))  # type: ignore[func-returns-value]
            raise CorpusError(f"{source}: duplicate passage id {dup!r}")
        return corpus

    @classmethod
    def from_jsonl(cls, path: str | os.PathLike[str]) -> Corpus:
        path = Path(path)
        if not path.is_file():
            raise CorpusError(f"corpus file not found: {path}")
        return cls.from_records(_read_jsonl(path), source=str(path))

    @classmethod
    def from_passages(cls, passages: Iterable[Passage]) -> Corpus:
        ps = list(passages)
        return cls([p.id for p in ps], [p.title for p in ps], [p.contents for p in ps])

    def to_jsonl(self, path: str | os.PathLike[str]) -> Path:
        """Write ``{"id","title","contents"}`` lines atomically (a temp file renamed into place)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_write(path) as fh:
            for pid, title, text in zip(self.ids, self.titles, self.contents, strict=True):
                fh.write(json.dumps({"id": pid, "title": title, "contents": text}, ensure_ascii=False))
                fh.write("\n")
        return path

    # -------------------------------------------------------------- access
    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> Passage:
        return Passage(self.ids[i], self.titles[i], self.contents[i])

    def __iter__(self) -> Iterator[Passage]:
        for i in range(len(self.ids)):
            yield self[i]

    def _id_index(self) -> dict[str, int]:
        if self._index is None:
            self._index = {pid: i for i, pid in enumerate(self.ids)}
        return self._index

    def position(self, pid: str) -> int:
        """Index of the passage with id ``pid``; ``KeyError`` if there is none."""
        return self._id_index()[pid]

    def get(self, pid: str) -> Passage | None:
        i = self._id_index().get(pid)
        return None if i is None else self[i]

    def __contains__(self, pid: object) -> bool:
        return isinstance(pid, str) and pid in self._id_index()

    def text(self, i: int) -> str:
        """What the retriever indexes: the title, then the contents."""
        return f"{self.titles[i]}\n{self.contents[i]}" if self.titles[i] else self.contents[i]

    @property
    def fingerprint(self) -> str:
        """sha256 over the passages (ids, titles, contents), independent of JSON formatting."""
        if self._fingerprint is None:
            h = hashlib.sha256()
            for pid, title, text in zip(self.ids, self.titles, self.contents, strict=True):
                h.update(f"{pid}\x1f{title}\x1f{text}\x1e".encode())
            self._fingerprint = h.hexdigest()
        return self._fingerprint


def _read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    with path.open(encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            line = line.strip()
            if not line:
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError as e:
                raise CorpusError(f"{path}:{n}: not valid JSON: {e}") from None


class atomic_write:
    """``with atomic_write(path) as fh``: write text to a temp file, renamed over ``path`` on success."""

    def __init__(self, path: Path, mode: str = "w"):
        self.path = path
        self.mode = mode

    def __enter__(self):
        fd, self._tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.", suffix=".tmp")
        os.chmod(self._tmp, 0o644)  # a cache others may read, like any file written with open()
        self._fh = os.fdopen(fd, self.mode, encoding=None if "b" in self.mode else "utf-8")
        return self._fh

    def __exit__(self, exc_type, exc, tb) -> None:
        self._fh.close()
        if exc_type is None:
            os.replace(self._tmp, self.path)
        else:
            os.unlink(self._tmp)

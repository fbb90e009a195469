"""Loaders for published QA formats: Search-R1 parquet, FlashRAG JSONL and HotpotQA JSON.

* Search-R1 (``scripts/data_process/*_search.py``): parquet rows with ``id``, ``question``,
  ``golden_answers``, ``data_source``, ``prompt`` (chat messages), ``reward_model``
  (``{"ground_truth": {"target": [...]}}``) and ``extra_info``.
* FlashRAG: JSONL rows ``{"id", "question", "golden_answers", "metadata"}``.
* HotpotQA: one JSON list of ``{"_id", "question", "answer", "supporting_facts", "context",
  "type", "level"}``; the ``context`` paragraphs become a corpus (one passage per title, its
  sentences joined by :func:`join_sentences`), the supporting titles give the supporting ids and a
  title-query search trace.

``load_tasks(path)`` picks the format from the file. Malformed rows raise ``LoadError`` naming
the row; rows without a gold answer (e.g. HotpotQA's unlabelled test set) are skipped and counted.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from pathlib import Path
from typing import Any

from turngym.envs.search.corpus import Corpus
from turngym.envs.search.tasks import QATask

log = logging.getLogger(__name__)

FORMATS = ("search-r1", "flashrag", "hotpotqa")
_SEARCH_R1_QUESTION = re.compile(r"Question:\s*(.*?)\s*$", re.DOTALL)


class LoadError(ValueError):
    """A task file that cannot be read; the message names the file and row."""


def detect_format(path: str | os.PathLike[str]) -> str:
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        return "search-r1"
    if suffix in (".jsonl", ".ndjson"):
        return "flashrag"
    if suffix == ".json":
        with path.open(encoding="utf-8") as fh:
            head = fh.read(4096)
        return "hotpotqa" if '"supporting_facts"' in head or '"context"' in head else "flashrag"
    raise LoadError(f"{path}: cannot tell the task format from the suffix {suffix!r}; pass format=")


def load_tasks(path: str | os.PathLike[str], format: str | None = None) -> tuple[list[QATask], Corpus | None]:
    """Tasks from ``path`` and, for HotpotQA, the corpus built from its contexts (else None)."""
    path = Path(path)
    if not path.is_file():
        raise LoadError(f"task file not found: {path}")
    fmt = format or detect_format(path)
    if fmt == "search-r1":
        return load_search_r1_parquet(path), None
    if fmt == "flashrag":
        return load_flashrag_jsonl(path), None
    if fmt == "hotpotqa":
        return load_hotpotqa_json(path)
    raise LoadError(f"unknown task format {fmt!r}; choose one of {FORMATS}")


def load_search_r1_parquet(path: str | os.PathLike[str]) -> list[QATask]:
    import pyarrow.parquet as pq

    try:
        rows = pq.read_table(path).to_pylist()
    except Exception as e:  # noqa: BLE001 - pyarrow raises many types for a bad file
        raise LoadError(f"{path}: not a readable parquet file: {e}") from e
    tasks: list[QATask] = []
    skipped = 0
    for n, row in enumerate(rows):
        question = row.get("question")
        if not question:
            prompt = row.get("prompt") or []
            content = prompt[-1].get("content", "") if prompt and isinstance(prompt[-1], dict) else ""
            m = _SEARCH_R1_QUESTION.search(content)
            question = m.group(1) if m else content
        answers = row.get("golden_answers")
        if answers is None:
            truth = (row.get("reward_model") or {}).get("ground_truth") or {}
            answers = truth.get("target") if isinstance(truth, dict) else truth
        if isinstance(answers, str):
            answers = [answers]
        if not answers:
            skipped += 1
            continue
        extra = row.get("extra_info") or {}
        tid = row.get("id") or f"{row.get('data_source', 'search-r1')}-{extra.get('index', n)}"
        tasks.append(
            _task(
                path,
                n,
                id=str(tid),
                question=str(question).strip(),
                answers=list(answers),
                kind=str(row.get("data_source") or ""),
                metadata={"source": "search-r1", "split": extra.get("split")},
            )
        )
    _report_skipped(path, skipped)
    return tasks


def load_flashrag_jsonl(path: str | os.PathLike[str]) -> list[QATask]:
    path = Path(path)
    tasks: list[QATask] = []
    skipped = 0
    with path.open(encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise LoadError(f"{path}:{n}: not valid JSON: {e}") from None
            if not isinstance(rec, dict):
                raise LoadError(f"{path}:{n}: a record must be an object")
            if not rec.get("golden_answers", rec.get("answers", rec.get("answer"))):
                skipped += 1
                continue
            try:
                tasks.append(QATask.from_record(rec, default_id=f"{path.stem}-{n}"))
            except (ValueError, TypeError) as e:
                raise LoadError(f"{path}:{n}: {e}") from None
    _report_skipped(path, skipped)
    return tasks


def load_hotpotqa_json(path: str | os.PathLike[str]) -> tuple[list[QATask], Corpus]:
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise LoadError(f"{path}: not valid JSON: {e}") from None
    if not isinstance(data, list):
        raise LoadError(f"{path}: HotpotQA files hold a JSON list of examples")
    passages: dict[str, dict[str, str]] = {}  # title -> record
    tasks: list[QATask] = []
    skipped = 0
    for n, ex in enumerate(data):
        if not isinstance(ex, dict) or "question" not in ex:
            raise LoadError(f"{path}: example {n} is not a HotpotQA record")
        for item in ex.get("context") or []:
            if not (isinstance(item, list | tuple) and len(item) == 2):
                raise LoadError(f"{path}: example {n}: each context item must be [title, sentences]")
            title, sentences = item
            if not (isinstance(sentences, list) and all(isinstance(x, str) for x in sentences)):
                raise LoadError(f"{path}: example {n}: the sentences of {title!r} must be a list of strings")
            if title not in passages:
                passages[title] = {
                    "id": _title_id(title),
                    "title": title,
                    "contents": join_sentences(sentences),
                }
        if not ex.get("answer"):
            skipped += 1
            continue
        titles: list[str] = []
        for fact in ex.get("supporting_facts") or []:
            if fact and fact[0] in passages and fact[0] not in titles:
                titles.append(fact[0])
        tasks.append(
            _task(
                path,
                n,
                id=str(ex.get("_id", ex.get("id", n))),
                question=ex["question"],
                answers=[ex["answer"]],
                supporting_ids=[_title_id(t) for t in titles],
                gold_trace=list(titles),
                kind=str(ex.get("type", "")),
                hops=len(titles),
                metadata={"source": "hotpotqa", "level": ex.get("level")},
            )
        )
    _report_skipped(path, skipped)
    return tasks, Corpus.from_records(passages.values(), source=str(path))


def join_sentences(sentences: list[str]) -> str:
    """A HotpotQA paragraph from its sentence list.

    In HotpotQA's ``context`` every sentence after the first usually carries its own leading space
    (``["Ed Wood is a film.", " It stars Johnny Depp."]``), and the official preprocessing
    concatenates them as they are; some sentences lack it, and plain concatenation would glue them
    ("Marrow.It returns"). So a sentence is appended as is when it starts with whitespace (or the
    text so far ends with it), else after a single space.
    """
    text = ""
    for sentence in sentences:
        if not sentence:
            continue
        if text and not (sentence[0].isspace() or text[-1].isspace()):
            text += " "
        text += sentence
    return text.strip()


def _title_id(title: str) -> str:
    return "hp-" + hashlib.sha1(title.encode()).hexdigest()[:12]


def _task(path: Path | str, n: int, **fields: Any) -> QATask:
    try:
        return QATask(**fields)
    except (ValueError, TypeError) as e:
        raise LoadError(f"{path}: row {n}: {e}") from None


def _report_skipped(path: Path | str, skipped: int) -> None:
    if skipped:
        log.warning("%s: skipped %d rows without a gold answer", path, skipped)

"""Loaders for published QA formats: Search-R1, FlashRAG and HotpotQA, from files or through ``datasets``.

The formats (one home each: a :class:`TaskFormat` in ``TASK_FORMATS`` maps a format's rows to tasks):

* ``search-r1`` (``scripts/data_process/*_search.py``): rows with ``id``, ``question``,
  ``golden_answers``, ``data_source``, ``prompt`` (chat messages), ``reward_model``
  (``{"ground_truth": {"target": [...]}}``) and ``extra_info``; shipped as parquet.
* ``flashrag``: rows ``{"id", "question", "golden_answers", "metadata"}``; shipped as JSONL.
* ``hotpotqa``: rows ``{"_id", "question", "answer", "supporting_facts", "context", "type",
  "level"}`` — the release's JSON list (``context`` = ``[[title, [sentences]], ...]``) or the
  column layout of the Hugging Face copy (``context`` = ``{"title": [...], "sentences": [[...]]}``,
  ``supporting_facts`` = ``{"title": [...], "sent_id": [...]}``). The ``context`` paragraphs become
  a corpus (one passage per title, its sentences joined by :func:`join_sentences`), the supporting
  titles give the supporting ids and a title-query search trace.

Where the rows come from is separate from the format, which is told from the columns (or given):

* :func:`load_tasks` reads one plain file itself (``.parquet`` with pyarrow; ``.jsonl``; ``.json``
  holding a list, one object, or JSONL) and hands a directory, a glob, a list of files or a
  compressed file (``.jsonl.gz``...) to :func:`load_dataset_tasks`;
* :func:`load_dataset_tasks` reads them with ``datasets.load_dataset("parquet" | "json",
  data_files=...)``, one file at a time so errors can name the file;
* :func:`tasks_from_dataset` maps a ``datasets.Dataset`` the user already has.

Malformed rows raise ``LoadError`` naming the file and row; rows without a gold answer (e.g.
HotpotQA's unlabelled test set) are skipped and counted.
"""

from __future__ import annotations

import glob
import hashlib
import json
import logging
import os
import re
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from turngym.core.cache import cache_root
from turngym.envs.search.corpus import Corpus
from turngym.envs.search.tasks import QATask

log = logging.getLogger(__name__)

_SEARCH_R1_QUESTION = re.compile(r"Question:\s*(.*?)\s*$", re.DOTALL)

#: ``datasets`` builder by file suffix (after any compression suffix)
BUILDERS = {".parquet": "parquet", ".jsonl": "json", ".ndjson": "json", ".json": "json"}
COMPRESSIONS = (".gz", ".bz2", ".xz", ".zst", ".lz4")

Row = tuple[str, dict[str, Any]]  # (where, record): ``where`` names the file and the row for errors
TaskFiles = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]


class LoadError(ValueError):
    """A task file that cannot be read; the message names the file and row."""


@dataclass(frozen=True)
class TaskFormat:
    """A published task format: how to recognise its columns and turn its rows into tasks.

    ``build(rows, source)`` gets ``(where, record)`` pairs and returns the tasks and, for formats
    that carry their passages (HotpotQA), the corpus built from them (else None).
    """

    name: str
    matches: Callable[[Collection[str]], bool]
    needs: str  # the columns it needs, for error messages
    build: Callable[[Iterable[Row], str], tuple[list[QATask], Corpus | None]]


#: task formats by name, tried in this order when the format is told from the columns
TASK_FORMATS: dict[str, TaskFormat] = {}


def register_task_format(fmt: TaskFormat) -> TaskFormat:
    TASK_FORMATS[fmt.name] = fmt
    return fmt


def format_for(columns: Collection[str], source: str, format: str | None = None) -> TaskFormat:
    """The named format (checked against ``columns``) or the first whose columns match; errors
    name ``source``, the columns it has and what each format needs."""
    cols = sorted(columns)
    if format is not None:
        if format not in TASK_FORMATS:
            raise LoadError(f"unknown task format {format!r}; choose one of {tuple(TASK_FORMATS)}")
        fmt = TASK_FORMATS[format]
        if not fmt.matches(columns):
            raise LoadError(f"{source}: the {format} format needs {fmt.needs}; the data has columns {cols}")
        return fmt
    for fmt in TASK_FORMATS.values():
        if fmt.matches(columns):
            return fmt
    needs = "; ".join(f"{f.name} needs {f.needs}" for f in TASK_FORMATS.values())
    raise LoadError(f"{source}: columns {cols} match no task format ({needs})")


# ------------------------------------------------------------------ sources of rows
def load_tasks(
    path: TaskFiles | Any, format: str | None = None, cache_dir: str | os.PathLike[str] | None = None
) -> tuple[list[QATask], Corpus | None]:
    """Tasks from ``path`` and, for HotpotQA, the corpus built from its contexts (else None).

    ``path`` is a task file, a directory, a glob, a list of files, a folder ``save_to_disk`` wrote,
    or a ``datasets.Dataset``; the format comes from the columns unless ``format`` names it.
    """
    if not isinstance(path, str | os.PathLike | list | tuple):
        return tasks_from_dataset(path, format)
    if isinstance(path, str | os.PathLike):
        p = Path(path).expanduser()
        if p.is_file() and p.suffix.lower() in BUILDERS:
            rows = _file_rows(p)
            fmt = format_for(_columns(r for _, r in rows), str(p), format)
            return fmt.build(rows, str(p))
        if is_saved_dataset(p):
            return tasks_from_dataset(_load_from_disk(p), format)
    return load_dataset_tasks(path, format, cache_dir=cache_dir)


def is_saved_dataset(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a folder ``Dataset.save_to_disk`` wrote (a split, or splits)."""
    p = Path(path).expanduser()
    return p.is_dir() and ((p / "state.json").is_file() or (p / "dataset_dict.json").is_file())


def _load_from_disk(path: Path) -> Any:
    datasets = _import_datasets()
    try:
        return datasets.load_from_disk(str(path))
    except Exception as e:  # noqa: BLE001 - a damaged folder raises many types
        raise LoadError(f"{path}: not a readable saved dataset: {e}") from e


def detect_format(path: str | os.PathLike[str]) -> str:
    """The format of a task file, from its rows' columns."""
    path = Path(path)
    if path.suffix.lower() not in BUILDERS:
        raise LoadError(f"{path}: cannot tell the task format from the suffix {path.suffix!r}; pass format=")
    return format_for(_columns(r for _, r in _file_rows(path)), str(path)).name


def load_search_r1_parquet(path: str | os.PathLike[str]) -> list[QATask]:
    return _search_r1_tasks(_parquet_rows(Path(path)), str(path))[0]


def load_flashrag_jsonl(path: str | os.PathLike[str]) -> list[QATask]:
    return _flashrag_tasks(_jsonl_rows(Path(path)), str(path))[0]


def load_hotpotqa_json(path: str | os.PathLike[str]) -> tuple[list[QATask], Corpus]:
    path = Path(path)
    data = _read_json(path)
    if not isinstance(data, list):
        raise LoadError(f"{path}: HotpotQA files hold a JSON list of examples")
    tasks, corpus = _hotpotqa_tasks(((f"{path}: example {n}", ex) for n, ex in enumerate(data)), str(path))
    assert corpus is not None
    return tasks, corpus


def data_files(spec: TaskFiles) -> list[Path]:
    """The files a directory (its parquet/JSON(L) files, recursively, but no hidden or metadata
    files), a glob or a list names, sorted."""
    specs = [spec] if isinstance(spec, str | os.PathLike) else list(spec)
    if not specs:
        raise LoadError("no task files given")
    out: list[Path] = []
    for s in specs:
        p = Path(s).expanduser()
        if p.is_dir():
            found = sorted(f for f in p.rglob("*") if _is_task_file(f, p))
            if not found:
                raise LoadError(f"{p}: no parquet or JSON(L) files in this directory")
        elif p.is_file():
            found = [p]
        elif glob.has_magic(str(p)):
            found = sorted(Path(f) for f in glob.glob(str(p), recursive=True) if Path(f).is_file())
            if not found:
                raise LoadError(f"no task files match {str(p)!r}")
        else:
            raise LoadError(f"task file not found: {p}")
        out += found
    return out


def load_dataset_tasks(
    files: TaskFiles, format: str | None = None, cache_dir: str | os.PathLike[str] | None = None
) -> tuple[list[QATask], Corpus | None]:
    """Tasks read through ``datasets.load_dataset("parquet" | "json", data_files=...)``.

    ``files`` is a file, a directory, a glob or a list of them (``.parquet``, ``.jsonl``, ``.json``,
    optionally compressed); each file is loaded on its own (its arrow cache under
    ``<turngym cache>/datasets``) so that an error names it. All files must hold one format.
    """
    paths = data_files(files)
    builders = {p: _builder(p) for p in paths}
    unknown = [str(p) for p, b in builders.items() if b is None]
    if unknown:
        raise LoadError(f"cannot read {unknown}: task files are {sorted(BUILDERS)} (optionally compressed)")
    datasets = _import_datasets()
    cache = str(cache_root(cache_dir) / "datasets")
    fmt: TaskFormat | None = None
    rows: list[Row] = []
    for p in paths:
        try:
            ds = datasets.load_dataset(builders[p], data_files=str(p), split="train", cache_dir=cache)
        except Exception as e:  # noqa: BLE001 - datasets and pyarrow raise many types for a bad file
            cause = e.__cause__ or e.__context__
            detail = f"{e}" + (f" ({cause})" if cause is not None and str(cause) not in str(e) else "")
            raise LoadError(f"{p}: not a readable {builders[p]} file: {detail}") from e
        this = format_for(ds.column_names, str(p), format or (fmt.name if fmt else None))
        fmt = fmt or this
        rows += _dataset_rows(ds, str(p))
    assert fmt is not None
    source = str(files) if isinstance(files, str | os.PathLike) else f"{len(paths)} files"
    return fmt.build(rows, source)


def tasks_from_dataset(dataset: Any, format: str | None = None) -> tuple[list[QATask], Corpus | None]:
    """Tasks from a ``datasets.Dataset`` already in memory (e.g. ``load_dataset(...)["test"]``)."""
    columns = getattr(dataset, "column_names", None)
    if isinstance(columns, dict):  # a DatasetDict: {split: columns}
        raise LoadError(f"a dataset dict with splits {list(columns)}: pass one split, e.g. ds['test']")
    if not hasattr(dataset, "column_names") or not hasattr(dataset, "__iter__"):
        raise LoadError(
            f"tasks must be a task file, a directory, a glob, a list of files or a datasets.Dataset, "
            f"got {type(dataset).__name__}"
        )
    source = (
        f"dataset {getattr(dataset, 'info', None) and dataset.info.dataset_name or type(dataset).__name__}"
    )
    rows = _dataset_rows(dataset, source)
    # an IterableDataset read in streaming mode may not know its columns until it is read
    fmt = format_for(columns if columns is not None else _columns(r for _, r in rows), source, format)
    return fmt.build(rows, source)


def _dataset_rows(ds: Iterable[dict[str, Any]], source: str) -> list[Row]:
    return [(f"{source}: row {n}", dict(rec)) for n, rec in enumerate(ds)]


def _import_datasets():
    try:
        import datasets
    except ImportError as e:
        raise LoadError(
            "reading a directory, a glob, a list of files, a compressed file or a saved dataset needs the "
            "`datasets` "
            "package: pip install 'turngym[interop]'"
        ) from e
    return datasets


#: JSON files that dataset folders hold beside the data (``save_to_disk``, hub metadata)
METADATA_FILES = frozenset({"dataset_info.json", "dataset_infos.json", "dataset_dict.json", "state.json"})


def _is_task_file(path: Path, root: Path) -> bool:
    """A data file of a directory: not hidden (``.cache/`` of a hub download), not metadata."""
    hidden = any(part.startswith(".") for part in path.relative_to(root).parts)
    return path.is_file() and not hidden and path.name not in METADATA_FILES and _builder(path) is not None


def _builder(path: Path) -> str | None:
    name = path.name.lower()
    for c in COMPRESSIONS:
        name = name.removesuffix(c)
    return BUILDERS.get(Path(name).suffix)


def _columns(records: Iterable[dict[str, Any]]) -> set[str]:
    cols: set[str] = set()
    for rec in records:
        cols.update(rec)
    return cols


def _file_rows(path: Path) -> list[Row]:
    if not path.is_file():
        raise LoadError(f"task file not found: {path}")
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        return _parquet_rows(path)
    if suffix in (".jsonl", ".ndjson"):
        return _jsonl_rows(path)
    if suffix == ".json":  # a JSON list (HotpotQA's release), one object, or JSON lines
        try:
            data = json.loads(path.read_text(encoding="utf-8-sig"))
        except json.JSONDecodeError:
            return _jsonl_rows(path)
        if isinstance(data, dict):
            return [(f"{path}", data)]
        if not isinstance(data, list):
            raise LoadError(f"{path}: expected a JSON list of records, one record or JSON lines")
        rows = [(f"{path}: example {n}", rec) for n, rec in enumerate(data)]
        for where, rec in rows:
            if not isinstance(rec, dict):
                raise LoadError(f"{where}: a record must be an object, got {type(rec).__name__}")
        return rows
    raise LoadError(f"{path}: cannot tell the task format from the suffix {suffix!r}; pass format=")


def _parquet_rows(path: Path) -> list[Row]:
    import pyarrow.parquet as pq

    try:
        records = pq.read_table(path).to_pylist()
    except Exception as e:  # noqa: BLE001 - pyarrow raises many types for a bad file
        raise LoadError(f"{path}: not a readable parquet file: {e}") from e
    return [(f"{path}: row {n}", rec) for n, rec in enumerate(records)]


def _jsonl_rows(path: Path) -> list[Row]:
    rows: list[Row] = []
    with path.open(encoding="utf-8-sig") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise LoadError(f"{path}:{n}: not valid JSON: {e}") from None
            if not isinstance(rec, dict):
                raise LoadError(f"{path}:{n}: a record must be an object")
            rows.append((f"{path}:{n}", rec))
    return rows


def _read_json(path: Path) -> Any:
    if not path.is_file():
        raise LoadError(f"task file not found: {path}")
    try:
        return json.loads(path.read_text(encoding="utf-8-sig"))
    except json.JSONDecodeError as e:
        raise LoadError(f"{path}: not valid JSON: {e}") from None


# ------------------------------------------------------------------ row -> task, one home per format
def _search_r1_tasks(rows: Iterable[Row], source: str) -> tuple[list[QATask], None]:
    tasks: list[QATask] = []
    skipped = 0
    for n, (where, row) in enumerate(rows):
        question = row.get("question")
        if not question:
            prompt = row.get("prompt") or []
            content = prompt[-1].get("content", "") if prompt and isinstance(prompt[-1], dict) else ""
            m = _SEARCH_R1_QUESTION.search(content or "")
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
        index = extra.get("index") if extra.get("index") is not None else n
        tid = row.get("id") or f"{row.get('data_source') or 'search-r1'}-{index}"
        tasks.append(
            _task(
                where,
                id=str(tid),
                question=str(question or "").strip(),
                answers=list(answers),
                kind=str(row.get("data_source") or ""),
                metadata={"source": "search-r1", "split": extra.get("split")},
            )
        )
    _report_skipped(source, skipped)
    return tasks, None


def _flashrag_tasks(rows: Iterable[Row], source: str) -> tuple[list[QATask], None]:
    tasks: list[QATask] = []
    skipped = 0
    stem = re.sub(r"\W+", "-", Path(source).stem).strip("-") or "task"  # ids for rows without one
    for n, (where, rec) in enumerate(rows, 1):
        if not rec.get("golden_answers", rec.get("answers", rec.get("answer"))):
            skipped += 1
            continue
        try:
            tasks.append(QATask.from_record(rec, default_id=f"{stem}-{n}"))
        except (ValueError, TypeError) as e:
            raise LoadError(f"{where}: {e}") from None
    _report_skipped(source, skipped)
    return tasks, None


def _hotpotqa_tasks(rows: Iterable[Row], source: str) -> tuple[list[QATask], Corpus]:
    passages: dict[str, dict[str, str]] = {}  # title -> record
    tasks: list[QATask] = []
    skipped = 0
    for n, (where, ex) in enumerate(rows):
        if not isinstance(ex, dict) or not ex.get("question"):
            raise LoadError(f"{where}: not a HotpotQA record (no question)")
        for title, sentences in _hotpot_context(where, ex.get("context")):
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
        for title in _hotpot_fact_titles(where, ex.get("supporting_facts")):
            if title in passages and title not in titles:
                titles.append(title)
        tasks.append(
            _task(
                where,
                id=str(ex.get("_id") or ex.get("id") or n),
                question=ex["question"],
                answers=[ex["answer"]],
                supporting_ids=[_title_id(t) for t in titles],
                gold_trace=list(titles),
                kind=str(ex.get("type") or ""),
                hops=len(titles),
                metadata={"source": "hotpotqa", "level": ex.get("level")},
            )
        )
    _report_skipped(source, skipped)
    return tasks, Corpus.from_records(passages.values(), source=source)


def _hotpot_context(where: str, context: Any) -> list[tuple[str, list[str]]]:
    """``[[title, sentences], ...]`` (the release) or ``{"title": [...], "sentences": [...]}`` (columns)."""
    if context is None:
        return []
    if isinstance(context, dict):
        titles, sentence_lists = context.get("title"), context.get("sentences")
        if not (isinstance(titles, list) and isinstance(sentence_lists, list)) or len(titles) != len(
            sentence_lists
        ):
            raise LoadError(f"{where}: 'context' needs equally long 'title' and 'sentences' lists")
        items: list[Any] = list(zip(titles, sentence_lists, strict=True))
    elif isinstance(context, list):
        items = context
    else:
        raise LoadError(
            f"{where}: 'context' must be a list of [title, sentences], got {type(context).__name__}"
        )
    out = []
    for item in items:
        if not (isinstance(item, list | tuple) and len(item) == 2):
            raise LoadError(f"{where}: each context item must be [title, sentences]")
        title, sentences = item
        if not (isinstance(sentences, list) and all(isinstance(x, str) for x in sentences)):
            raise LoadError(f"{where}: the sentences of {title!r} must be a list of strings")
        out.append((str(title), sentences))
    return out


def _hotpot_fact_titles(where: str, facts: Any) -> list[str]:
    """The titles of ``[[title, sent_id], ...]`` or ``{"title": [...], "sent_id": [...]}``."""
    if not facts:
        return []
    if isinstance(facts, dict):
        titles = facts.get("title") or []
        if not isinstance(titles, list):
            raise LoadError(f"{where}: 'supporting_facts' needs a 'title' list")
        return [str(t) for t in titles]
    if not isinstance(facts, list):
        raise LoadError(f"{where}: 'supporting_facts' must be a list of [title, sentence id]")
    return [str(f[0]) for f in facts if isinstance(f, list | tuple) and f]


register_task_format(
    TaskFormat(
        "hotpotqa",
        matches=lambda cols: "question" in cols and "context" in cols,
        needs="columns question and context (answer, supporting_facts, type, level optional)",
        build=_hotpotqa_tasks,
    )
)
register_task_format(
    TaskFormat(
        "search-r1",
        matches=lambda cols: (
            bool({"question", "prompt"} & set(cols))
            and bool({"golden_answers", "reward_model"} & set(cols))
            and bool({"data_source", "reward_model", "prompt"} & set(cols))
        ),
        needs="columns question or prompt, golden_answers or reward_model, and data_source",
        build=_search_r1_tasks,
    )
)
register_task_format(
    TaskFormat(
        "flashrag",
        matches=lambda cols: "question" in cols and bool({"golden_answers", "answers", "answer"} & set(cols)),
        needs="columns question and golden_answers (id, metadata optional)",
        build=_flashrag_tasks,
    )
)

#: the built-in format names
FORMATS = tuple(TASK_FORMATS)


# ------------------------------------------------------------------ helpers
def join_sentences(sentences: Iterable[str]) -> str:
    """A HotpotQA paragraph from its sentence list.

    HotpotQA's own preprocessing concatenates a paragraph's sentences as they are: in its
    ``context`` every sentence after the first carries its leading space (``["Ed Wood is a
    film.", " It stars Johnny Depp."]``). Some sentences lack it, and plain concatenation glues
    them ("Marrow.It returns"). So the whitespace where two sentences meet (the end of one plus the
    start of the next) becomes exactly one character: a newline if it held one, else a space — never
    nothing and never two. On the release's own spacing this equals plain concatenation.
    Whitespace-only sentences are dropped; the text inside a sentence is kept as it is.
    """
    out, tail = "", ""
    for sentence in sentences:
        body = sentence.strip()
        if not body:
            continue
        lead = sentence[: len(sentence) - len(sentence.lstrip())]
        if out:
            out += "\n" if "\n" in tail + lead else " "
        out += body
        tail = sentence[len(sentence.rstrip()) :]
    return out


def _title_id(title: str) -> str:
    return "hp-" + hashlib.sha1(title.encode()).hexdigest()[:12]


def _task(where: str, **fields: Any) -> QATask:
    try:
        return QATask(**fields)
    except (ValueError, TypeError) as e:
        raise LoadError(f"{where}: {e}") from None


def _report_skipped(source: str, skipped: int) -> None:
    if skipped:
        log.warning("%s: skipped %d rows without a gold answer", source, skipped)

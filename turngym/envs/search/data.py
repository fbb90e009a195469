"""Where the env's corpus and tasks come from, cached on disk and shared within a process.

``synthetic_dataset`` generates a world and its questions once, writes ``corpus.jsonl`` and
``tasks.jsonl`` under ``<cache>/search/worlds/<key>/`` and reads them back afterwards; the
files are ordinary corpus/FlashRAG files a user can inspect or reuse. ``load_corpus`` and
``load_task_file`` read user files (or a ``datasets.Dataset``). All three keep one copy per process, so many envs over
the same data share it; ``select_tasks`` filters such a task list once per process too (a rollout
builds one env per trajectory, on the event loop, so construction must stay cheap).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from turngym.core.cache import cache_root
from turngym.envs.search.corpus import Corpus
from turngym.envs.search.loaders import (
    TaskFiles,
    data_files,
    is_saved_dataset,
    load_flashrag_jsonl,
    load_tasks,
)
from turngym.envs.search.questions import MIXES, generate_questions
from turngym.envs.search.tasks import QATask, write_tasks
from turngym.envs.search.world import World, WorldConfig

DATASET_FORMAT = 2  # 2: tasks' metadata carries hop_answers

_MEMO: dict[tuple, object] = {}
_LOCK = threading.Lock()


def _memo(key: tuple, build):
    with _LOCK:
        if key not in _MEMO:
            _MEMO[key] = build()
        return _MEMO[key]


def _loaded_here(tasks: object) -> bool:
    """Whether ``tasks`` is a list this module loaded (held, unchanged, for the whole process)."""
    with _LOCK:
        return any(isinstance(v, tuple) and any(x is tasks for x in v) for v in _MEMO.values())


def select_tasks(
    tasks: list[QATask], split: str | None, kinds: list[str] | None, hops: list[int] | None
) -> tuple[tuple[QATask, ...], dict[str, int]]:
    """The tasks passing the filters (read-only) and each one's position by id.

    Over a list loaded by this module the selection is computed once and shared by every env that
    asks for it; a caller's own list is filtered afresh (it may change between envs).
    """

    def build() -> tuple[tuple[QATask, ...], dict[str, int]]:
        chosen = tuple(
            t
            for t in tasks
            if (split is None or t.split == split)
            and (kinds is None or t.kind in kinds)
            and (hops is None or t.hops in hops)
        )
        return chosen, {t.id: i for i, t in enumerate(chosen)}

    if not _loaded_here(tasks):
        return build()
    key = (
        "select",
        id(tasks),
        split,
        None if kinds is None else tuple(kinds),
        None if hops is None else tuple(hops),
    )
    return _memo(key, build)  # type: ignore[return-value]


def _file_key(path: str | os.PathLike[str]) -> tuple:
    p = Path(path).expanduser().resolve()
    st = p.stat()
    return (str(p), st.st_mtime_ns, st.st_size)


def synthetic_dataset(
    n_passages: int = 10_000,
    n_tasks: int = 2_000,
    seed: int = 0,
    cache_dir: str | os.PathLike[str] | None = None,
    mix: str = "default",
) -> tuple[Corpus, list[QATask]]:
    """The generated world's corpus and ``n_tasks`` questions of a named ``mix`` (cached on disk)."""
    if mix not in MIXES:
        raise ValueError(f"unknown question mix {mix!r}; choose one of {sorted(MIXES)}")
    config = WorldConfig(seed=seed, n_passages=n_passages)
    name = f"{config.key()}-{n_tasks}-{mix}-v{DATASET_FORMAT}"
    folder = cache_root(cache_dir) / "search" / "worlds" / name

    def build() -> tuple[Corpus, list[QATask]]:
        corpus_path, tasks_path = folder / "corpus.jsonl", folder / "tasks.jsonl"
        if corpus_path.is_file() and tasks_path.is_file():
            try:
                return Corpus.from_jsonl(corpus_path), load_flashrag_jsonl(tasks_path)
            except (OSError, ValueError):
                pass  # a damaged cache entry is regenerated below
        world = World.generate(config)
        tasks = generate_questions(
            world, n_tasks, seed=seed, mix=mix, id_prefix=f"synth-{mix}-{config.key()[:8]}-{seed}"
        )
        try:
            write_tasks(tasks, tasks_path)
            world.corpus.to_jsonl(corpus_path)
        except OSError:
            pass  # read-only cache: keep the in-memory copy
        return world.corpus, tasks

    return _memo(("synthetic", str(folder)), build)  # type: ignore[return-value]


def load_corpus(path: str | os.PathLike[str]) -> Corpus:
    return _memo(("corpus", *_file_key(path)), lambda: Corpus.from_jsonl(path))  # type: ignore[return-value]


def load_task_file(
    path: TaskFiles | Any, format: str | None = None, cache_dir: str | os.PathLike[str] | None = None
) -> tuple[list[QATask], Corpus | None]:
    """Tasks (and a HotpotQA corpus) from a file, a directory, a glob, a list of files or a
    ``datasets.Dataset``, loaded once per process while the files are unchanged."""
    return _memo(("tasks", format, *_source_key(path)), lambda: load_tasks(path, format, cache_dir))  # type: ignore[return-value]


def _source_key(source: TaskFiles | Any) -> tuple:
    if not isinstance(source, str | os.PathLike | list | tuple):  # a datasets.Dataset: its content hash
        return ("dataset", getattr(source, "_fingerprint", None) or id(source))
    if isinstance(source, str | os.PathLike) and Path(source).expanduser().is_file():
        return _file_key(source)
    if isinstance(source, str | os.PathLike) and is_saved_dataset(source):
        files = sorted(f for f in Path(source).expanduser().rglob("*") if f.is_file())
        return tuple(k for f in files for k in _file_key(f))
    return tuple(k for p in data_files(source) for k in _file_key(p))

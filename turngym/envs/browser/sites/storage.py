"""SQLite files of the local sites: cached pristine builds and per-instance working copies.

A site's data is generated once from a seed into a *pristine* SQLite file under the cache
(:func:`turngym.core.cache.cache_root`; built in a temporary file and renamed, so
concurrent workers never see half a database). Each site instance serves a private
*working* copy; :meth:`WorkingCopy.restore` resets the site by copying the pristine file over
it (a few milliseconds for these sizes). Apps open a fresh connection per request, so a
restore never leaves a stale handle behind.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path


def build_cached(path: Path, build: Callable[[sqlite3.Connection], None]) -> Path:
    """Return ``path``, first running ``build(conn)`` on a fresh database if the file is missing."""
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        conn = sqlite3.connect(tmp)
        try:
            build(conn)
            conn.commit()
        finally:
            conn.close()
        os.chmod(tmp, 0o644)  # a shared cache: readable by other users' workers
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return path


@contextlib.contextmanager
def connect(path: str | Path, *, readonly: bool = False) -> Iterator[sqlite3.Connection]:
    """A short-lived connection (rows as ``sqlite3.Row``); commits on success, always closes."""
    uri = f"file:{path}?mode=ro" if readonly else f"file:{path}"
    conn = sqlite3.connect(uri, uri=True, timeout=10, check_same_thread=False)
    conn.row_factory = sqlite3.Row
    try:
        yield conn
        conn.commit()
    finally:
        conn.close()


class WorkingCopy:
    """A private, writable copy of a pristine database, restorable in milliseconds."""

    def __init__(self, pristine: Path, *, directory: str | Path | None = None):
        self.pristine = Path(pristine)
        self._dir = tempfile.TemporaryDirectory(prefix="turngym-site-", dir=directory)
        self.path = Path(self._dir.name) / self.pristine.name
        self.last_restore_s = 0.0
        self.restore()

    def restore(self) -> float:
        """Copy the pristine file over the working copy; returns the seconds it took."""
        t0 = time.perf_counter()
        for suffix in ("-wal", "-shm", "-journal"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(str(self.path) + suffix)
        shutil.copyfile(self.pristine, self.path)
        self.last_restore_s = time.perf_counter() - t0
        return self.last_restore_s

    def cleanup(self) -> None:
        self._dir.cleanup()

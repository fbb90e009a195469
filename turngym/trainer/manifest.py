"""Durable files and the manifest that says a checkpoint directory is complete and intact.

A checkpoint directory is written beside its final name, every file and directory is fsynced, and
``manifest.json`` is written last: the format and its version, the step, and the size and sha256 of
every other file under the directory, subdirectories included (a torch.distributed.checkpoint
directory of shard files is covered the same way as ``trainable.pt``), keyed by POSIX path relative
to the directory. Only then is the directory renamed into place, and its parent fsynced.

:func:`verify_manifest` reads a directory back against its manifest and names the first thing
wrong — which file, which check — as a :class:`Damage`; ``None`` means every byte is as written.

:func:`fsync_tree`, :func:`fsync_dir` and :func:`atomic_write` are the durable-write helpers the
trainer's other run files (warm-start weights, the metrics file when rewritten) use too.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO

MANIFEST = "manifest.json"
FORMAT = "turngym-checkpoint"
VERSION = 1
_CHUNK = 1 << 20


@dataclass(frozen=True)
class Damage:
    """What is wrong with a checkpoint directory: the file (relative path) and the check it failed."""

    path: Path
    file: str
    check: str
    detail: str = ""

    def __str__(self) -> str:
        tail = f" ({self.detail})" if self.detail else ""
        return f"{self.path}: {self.file}: {self.check}{tail}"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _hash_all(root: Path, names: list[str]) -> dict[str, str]:
    """sha256 of each file, several at once (hashlib releases the GIL: shards hash in parallel)."""
    from concurrent.futures import ThreadPoolExecutor

    if len(names) <= 1:
        return {rel: sha256_file(root / rel) for rel in names}
    with ThreadPoolExecutor(max_workers=min(len(names), os.cpu_count() or 1, 8)) as pool:
        return dict(zip(names, pool.map(lambda rel: sha256_file(root / rel), names), strict=True))


def fsync_dir(path: Path) -> None:
    """Make a directory's entries (names created, renamed or removed in it) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """fsync every file under ``root``, then every directory, deepest first, ``root`` last."""
    for dirpath, _dirs, files in os.walk(root, topdown=False):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(dirpath))


def atomic_write(path: Path, data: bytes | Callable[[BinaryIO], object]) -> None:
    """Replace ``path`` whole with ``data`` (bytes, or a function that writes to the open file):
    written and fsynced beside it, renamed over it, its directory fsynced."""
    path = Path(path)
    tmp = path.with_name(f".tmp-{path.name}")
    try:
        with open(tmp, "wb") as f:
            if isinstance(data, bytes):
                f.write(data)
            else:
                data(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def _files(root: Path) -> list[str]:
    """Every regular file under ``root`` but the manifest, as sorted POSIX paths relative to it."""
    out = []
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            rel = PurePosixPath(Path(dirpath, name).relative_to(root).as_posix())
            if str(rel) != MANIFEST:
                out.append(str(rel))
    return sorted(out)


def write_manifest(root: Path, step: int, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Hash every file under ``root`` (already written and fsynced) and write ``root/manifest.json``
    last, fsynced with ``root``. ``extra`` keys (e.g. a sharded checkpoint's world size) are kept
    beside the format's own."""
    names = _files(root)
    sums = _hash_all(root, names)
    files = {rel: {"bytes": (root / rel).stat().st_size, "sha256": sums[rel]} for rel in names}
    manifest = {**(extra or {}), "format": FORMAT, "version": VERSION, "step": int(step), "files": files}
    with open(root / MANIFEST, "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    fsync_dir(root)
    return manifest


def read_manifest(root: Path) -> tuple[dict[str, Any] | None, Damage | None]:
    """The manifest of ``root`` if it is there, parses, and is of a format and version this code reads."""
    path = Path(root) / MANIFEST
    if not path.is_file():
        return None, Damage(root, MANIFEST, "missing", "the directory was never completed")
    try:
        manifest = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        return None, Damage(root, MANIFEST, "not valid JSON", str(e))
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        return None, Damage(root, MANIFEST, "not a turngym checkpoint manifest")
    if manifest.get("version") != VERSION:
        return None, Damage(
            root,
            MANIFEST,
            "unknown format version",
            f"{manifest.get('version')!r}; this code reads {VERSION}",
        )
    if not isinstance(manifest.get("step"), int) or not isinstance(manifest.get("files"), dict):
        return None, Damage(root, MANIFEST, "no integer step or no file list")
    return manifest, None


def verify_manifest(root: Path, step: int | None = None) -> Damage | None:
    """``None`` when ``root`` is exactly what its manifest says (the step ``step``, when given: the
    step its directory name promises); else the first thing wrong, in a fixed order: the manifest
    itself, its step, files missing, files the manifest does not list, then each file's size and
    sha256."""
    root = Path(root)
    manifest, damage = read_manifest(root)
    if damage is not None:
        return damage
    assert manifest is not None
    if step is not None and manifest["step"] != step:
        return Damage(
            root, MANIFEST, "step mismatch", f"manifest says {manifest['step']}, directory says {step}"
        )
    listed: dict[str, Any] = manifest["files"]
    for rel in sorted(listed):
        p = PurePosixPath(rel)
        if p.is_absolute() or ".." in p.parts or rel == MANIFEST:
            return Damage(root, rel, "path outside the checkpoint directory")
        entry = listed[rel]
        if not isinstance(entry, dict) or not isinstance(entry.get("sha256"), str):
            return Damage(root, rel, "manifest entry without a sha256")
        if not (root / rel).is_file():
            return Damage(root, rel, "missing")
    extra = sorted(set(_files(root)) - set(listed))
    if extra:
        return Damage(root, extra[0], "not in the manifest", f"{len(extra)} unlisted file(s)")
    for rel in sorted(listed):
        size, want = (root / rel).stat().st_size, listed[rel]
        if size != want.get("bytes"):
            return Damage(
                root, rel, "size mismatch", f"manifest says {want.get('bytes')} bytes, file has {size}"
            )
    sums = _hash_all(root, sorted(listed))
    for rel in sorted(listed):
        want, got = listed[rel], sums[rel]
        if got != want["sha256"]:
            return Damage(
                root, rel, "sha256 mismatch", f"manifest says {want['sha256'][:12]}…, file has {got[:12]}…"
            )
    return None

"""Reading git diffs: a patch as per-file sections (used by patch filtering, grading and task loading)."""

from __future__ import annotations

import re

_DIFF_HEADER = re.compile(r"^diff --git a/(.+?) b/(.+?)$", re.M)


def split_patch(patch: str) -> list[tuple[str, str]]:
    """A git diff as ``(path, section)`` pairs, one per file."""
    heads = list(_DIFF_HEADER.finditer(patch))
    out = []
    for i, m in enumerate(heads):
        end = heads[i + 1].start() if i + 1 < len(heads) else len(patch)
        out.append((m.group(2), patch[m.start() : end]))
    return out

"""Text operations of the ``file_editor`` tool (R2E-Gym / SWE-agent / Anthropic str_replace editor).

Pure functions on strings, so they are tested without a container; the env does the file I/O.
Every misuse raises :class:`EditError` with a message written for the model.
"""

from __future__ import annotations

SNIPPET_CONTEXT = 4


class EditError(ValueError):
    """The edit cannot be done as asked; the message tells the model why."""


def number_lines(text: str, start: int = 1) -> str:
    """``cat -n`` style: right-aligned line numbers, a tab, the line."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines = lines[:-1]
    return "\n".join(f"{i:6d}\t{line}" for i, line in enumerate(lines, start))


def view(text: str, path: str, view_range: list[int] | None = None) -> str:
    """A file's content with line numbers, optionally lines ``[start, end]`` (``end = -1``: to the end)."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines = lines[:-1]
    n = len(lines)
    if view_range is None:
        return f"Here's the result of running `cat -n` on {path}:\n{number_lines(text)}\n"
    if len(view_range) != 2 or not all(isinstance(x, int) for x in view_range):
        raise EditError("view_range must be a list of two integers [start, end]")
    start, end = view_range
    if not 1 <= start <= max(n, 1):
        raise EditError(f"invalid view_range {view_range}: start must be in [1, {n}]")
    if end == -1:
        end = n
    if end < start or end > n:
        raise EditError(f"invalid view_range {view_range}: end must be -1 or in [{start}, {n}]")
    body = "\n".join(lines[start - 1 : end])
    return f"Here's the result of running `cat -n` on {path} (lines {start}-{end}):\n{number_lines(body, start)}\n"


def _snippet(text: str, first_line: int, last_line: int, path: str) -> str:
    lines = text.split("\n")
    lo = max(first_line - SNIPPET_CONTEXT, 1)
    hi = min(last_line + SNIPPET_CONTEXT, len(lines))
    body = "\n".join(lines[lo - 1 : hi])
    return (
        f"The file {path} has been edited. Here's the result of running `cat -n` on a snippet of it:\n"
        f"{number_lines(body, lo)}\nReview the changes and make sure they are as expected."
    )


def str_replace(text: str, old_str: str, new_str: str, path: str) -> tuple[str, str]:
    """Replace the single occurrence of ``old_str``; returns (new text, message with a snippet)."""
    if old_str == "":
        raise EditError("old_str must not be empty (use insert or create to add text)")
    count = text.count(old_str)
    if count == 0:
        raise EditError(f"No replacement was performed: old_str did not appear verbatim in {path}.")
    if count > 1:
        lines, pos = [], text.find(old_str)
        while pos != -1:
            lines.append(text.count("\n", 0, pos) + 1)
            pos = text.find(old_str, pos + 1)
        raise EditError(
            f"No replacement was performed: old_str appears {count} times in {path} (lines {lines}). "
            "Include more surrounding lines so it is unique."
        )
    at = text.index(old_str)
    new_text = text[:at] + new_str + text[at + len(old_str) :]
    first = text.count("\n", 0, at) + 1
    return new_text, _snippet(new_text, first, first + new_str.count("\n"), path)


def insert(text: str, insert_line: int, new_str: str, path: str) -> tuple[str, str]:
    """Insert ``new_str`` after line ``insert_line`` (0 = at the top); returns (new text, message)."""
    lines = text.split("\n")
    trailing = bool(lines) and lines[-1] == ""
    body = lines[:-1] if trailing else lines
    if not 0 <= insert_line <= len(body):
        raise EditError(f"invalid insert_line {insert_line}: it must be in [0, {len(body)}]")
    new_lines = new_str.split("\n")
    if new_lines and new_lines[-1] == "" and len(new_lines) > 1:
        new_lines = new_lines[:-1]
    out = body[:insert_line] + new_lines + body[insert_line:]
    new_text = "\n".join(out) + ("\n" if trailing or not body else "")
    return new_text, _snippet(new_text, insert_line + 1, insert_line + len(new_lines), path)

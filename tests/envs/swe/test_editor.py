"""The file editor's text operations (no container needed), with property tests."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from turngym.envs.swe import editor

lines = st.lists(st.text(alphabet="abc xyz()=:_", max_size=12), min_size=1, max_size=12)


@given(lines, st.integers(0, 20), st.text(alphabet="pqr\n", max_size=10))
def test_insert_keeps_every_original_line_in_order(body, at, new):
    text = "\n".join(body) + "\n"
    n = len(body)
    if at > n:
        with pytest.raises(editor.EditError):
            editor.insert(text, at, new, "/f")
        return
    out, msg = editor.insert(text, at, new, "/f")
    new_lines = new.split("\n")
    if len(new_lines) > 1 and new_lines[-1] == "":
        new_lines = new_lines[:-1]
    assert out.split("\n")[:-1] == body[:at] + new_lines + body[at:]
    assert "has been edited" in msg


@given(lines, st.text(alphabet="abc", min_size=1, max_size=3), st.text(alphabet="XY\n", max_size=4))
def test_str_replace_only_when_unique(body, old, new):
    text = "\n".join(body)
    count = text.count(old)
    if count != 1:
        with pytest.raises(editor.EditError, match="verbatim" if count == 0 else "times"):
            editor.str_replace(text, old, new, "/f")
        return
    out, _ = editor.str_replace(text, old, new, "/f")
    assert out == text.replace(old, new)


def test_view_ranges():
    text = "one\ntwo\nthree\n"
    assert editor.view(text, "/f").splitlines()[1:] == ["     1\tone", "     2\ttwo", "     3\tthree"]
    assert editor.view(text, "/f", [2, -1]).splitlines()[1:] == ["     2\ttwo", "     3\tthree"]
    for bad in ([0, 1], [2, 1], [1, 9], [1]):
        with pytest.raises(editor.EditError):
            editor.view(text, "/f", bad)


def test_empty_old_str_is_refused():
    with pytest.raises(editor.EditError, match="empty"):
        editor.str_replace("abc", "", "x", "/f")

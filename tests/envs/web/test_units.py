"""Fast tests without a browser: task catalogue, DOM rendering, expert logic, key names."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from turngym.core.types import ToolCall
from turngym.envs.browser.dom import Node, Snapshot
from turngym.envs.gui.env import normalise_key
from turngym.envs.web.expert import EXPERT_TASKS, expert_steps
from turngym.envs.web.tasks import all_tasks, get_task, html_dir, list_tasks, resolve_tasks
from turngym.tools import ToolError


def test_catalogue_lists_all_130_tasks_with_descriptions():
    tasks = all_tasks()
    assert len(tasks) == 130
    assert (html_dir() / "core" / "core.js").is_file()
    assert sum(bool(t.description) for t in tasks.values()) >= 120
    assert get_task("click-button").description.startswith("Click on a specific button")
    assert get_task("bisect-angle").partial_reward
    assert get_task("terminal").nondeterministic and not get_task("click-button").nondeterministic
    assert len(list_tasks(include_nondeterministic=False)) == 130 - sum(
        t.nondeterministic for t in tasks.values()
    )


def test_task_selection_and_unknown_names():
    assert resolve_tasks("all") == list_tasks()
    assert resolve_tasks(None) == list_tasks(include_nondeterministic=False)
    assert resolve_tasks("expert") == list(EXPERT_TASKS)
    assert resolve_tasks(["click-test", "enter-text"]) == ["click-test", "enter-text"]
    with pytest.raises(KeyError, match="click-buton.*Did you mean click-button"):
        resolve_tasks("click-buton")
    with pytest.raises(ValueError):
        resolve_tasks([])


def _snap(*nodes: Node) -> Snapshot:
    return Snapshot(nodes=list(nodes))


def test_snapshot_text_key_and_lookup():
    snap = _snap(
        Node(1, 0, "div", "div", dom_id="area"),
        Node(2, 1, "textbox", "input", name="User", value='a"b', focused=True, box=(10, 20, 100, 16)),
        Node(None, 1, "text", "#text", name="loose text"),
        Node(3, 1, "checkbox", "input", name="HF2", checked=False),
        Node(4, 1, "button", "button", name="Submit"),
    )
    text = snap.text()
    assert text.splitlines() == [
        "[1] div #area",
        '  [2] textbox "User" value="a\\"b" focused',
        '  StaticText "loose text"',
        '  [3] checkbox "HF2" checked=false',
        '  [4] button "Submit"',
    ]
    assert "box=(10,20,100,16)" in snap.text(with_boxes=True)
    assert snap.by_id(4).name == "Submit" and snap.by_id(99) is None
    assert snap.find(role="button", name=" Submit ") == [snap.by_id(4)]
    assert (
        snap.by_id(2).center == (60, 28)
        and snap.by_id(2).contains(10, 20)
        and not snap.by_id(2).contains(110, 20)
    )
    changed = _snap(
        *[n if n.id != 3 else Node(3, 1, "checkbox", "input", name="HF2", checked=True) for n in snap.nodes]
    )
    assert snap.key() != changed.key() and snap.key() == _snap(*snap.nodes).key()
    long = _snap(*[Node(i, 0, "span", "span", name="x" * 50) for i in range(1, 400)])
    assert "characters of the page cut" in long.text(max_chars=1000)


def test_expert_checkboxes_clicks_only_what_differs_then_submits():
    snap = _snap(
        Node(5, 2, "checkbox", "input", name="a", checked=True),
        Node(7, 2, "checkbox", "input", name="b", checked=False),
        Node(9, 2, "checkbox", "input", name="c", checked=False),
        Node(10, 1, "button", "button", name="Submit"),
    )
    steps = expert_steps("click-checkboxes", "Select b, c and click Submit.", snap)
    assert [(s.kind, s.node.id) for s in steps] == [("click", 5), ("click", 7), ("click", 9), ("click", 10)]
    assert steps[-1].to_dom_call() == ToolCall(name="click", arguments={"bid": 10})


@pytest.mark.parametrize(
    ("problem", "answer"),
    [("3 - x = 84", "-81"), ("x + 7 = 10", "3"), ("12 + x = 2", "-10"), ("-4 - x = 0", "-4")],
)
def test_expert_solves_algebra(problem, answer):
    snap = _snap(Node(3, 1, "div", "div", name=problem, dom_id="math-problem"), Node(5, 1, "textbox", "input"),
                 Node(6, 1, "button", "button", name="Submit"))  # fmt: skip
    steps = expert_steps("simple-algebra", "Solve for x", snap)
    assert steps[0].kind == "fill" and steps[0].text == answer


def test_expert_skips_fields_already_filled_and_unknown_tasks():
    snap = _snap(
        Node(4, 1, "textbox", "input", value="Agustina"), Node(5, 1, "button", "button", name="Submit")
    )
    steps = expert_steps("enter-text", 'Enter "Agustina" into the text field and press Submit.', snap)
    assert [s.kind for s in steps] == ["click"]
    assert expert_steps("tic-tac-toe", "win", snap) is None
    assert expert_steps("click-button", 'Click on the "nope" button.', snap) is None


def test_expert_covers_at_least_25_tasks():
    assert len(EXPERT_TASKS) >= 25
    assert set(EXPERT_TASKS) <= set(all_tasks())


@pytest.mark.parametrize(("key", "expected"), [("enter", "Enter"), ("ctrl", "Control"), ("a", "a"), ("F5", "F5"),
                                               ("esc", "Escape"), ("ArrowUp", "ArrowUp"), ("space", " ")])  # fmt: skip
def test_normalise_key(key, expected):
    assert normalise_key(key) == expected


@given(st.text(min_size=2, max_size=12, alphabet=st.characters(min_codepoint=97, max_codepoint=122)))
def test_normalise_key_rejects_or_maps_every_lowercase_word(word):
    try:
        out = normalise_key(word)
    except ToolError as e:
        assert "unknown key" in str(e)
    else:
        assert out[0].isupper() or out == " "

"""A scripted MiniWoB++ expert: reads the instruction and the current pruned DOM, returns the next steps.

The expert is reactive (it looks only at the current page), so it works for both envs:
``web-miniwob`` turns its steps into tool calls by element id, ``gui-miniwob`` into mouse
and keyboard calls at the elements' boxes. ``EXPERT_TASKS`` lists the tasks it solves;
``tests/envs/web/test_expert.py`` checks each on many seeds.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

from turngym.core.registry import keyed_decorator
from turngym.core.types import ToolCall
from turngym.envs.browser.dom import Node, Snapshot
from turngym.envs.browser.env import call


@dataclass(frozen=True)
class Step:
    """One abstract UI action on an element."""

    kind: Literal["click", "fill", "select", "press", "drag"]
    node: Node
    text: str = ""
    target: Node | None = None

    def to_dom_call(self) -> ToolCall:
        if self.kind == "click":
            return call("click", bid=self.node.id)
        if self.kind == "fill":
            return call("fill", bid=self.node.id, value=self.text)
        if self.kind == "select":
            return call("select_option", bid=self.node.id, options=self.text)
        if self.kind == "press":
            return call("press", bid=self.node.id, key_comb=self.text)
        assert self.target is not None
        return call("drag_and_drop", from_bid=self.node.id, to_bid=self.target.id)


Handler = Callable[[str, Snapshot, dict[str, str]], "list[Step] | None"]
_HANDLERS: dict[str, Handler] = {}


_handles = keyed_decorator(_HANDLERS)


def expert_steps(
    task: str, instruction: str, snap: Snapshot, fields: dict[str, str] | None = None
) -> list[Step] | None:
    """The next steps for ``task`` on this page, or None when the expert does not know the task/page."""
    handler = _HANDLERS.get(task)
    if handler is None:
        return None
    try:
        steps = handler(instruction, snap, fields or {})
    except (LookupError, ValueError, ZeroDivisionError):
        return None
    # a field that already holds its text needs no second fill (lets a plan span several turns)
    return [s for s in steps if not (s.kind == "fill" and s.node.value == s.text)]


# --------------------------------------------------------------------------- helpers
def _search(pattern: str, text: str, missing: str | None = None) -> re.Match[str]:
    """``re.search``; a miss raises LookupError (``missing``, else ``text``): the handler gives up."""
    m = re.search(pattern, text)
    if not m:
        raise LookupError(text if missing is None else missing)
    return m


def _quoted(instruction: str) -> str:
    m = _search(r'"(.*?)"', instruction, "no quoted text in the instruction")
    return m.group(1)


def _one(nodes: list[Node]) -> Node:
    if not nodes:
        raise LookupError("no such element")
    return nodes[0]


def _button(snap: Snapshot, name: str) -> Node:
    buttons = snap.find(role="button")
    exact = [n for n in buttons if n.name.strip() == name.strip()]
    return _one(exact or [n for n in buttons if n.name.strip().lower() == name.strip().lower()])


def _submit(snap: Snapshot) -> Node:
    names = ("submit", "login", "search", "go!")
    return _one(
        [n for n in snap.find(role="button") if n.name.lower() in names]
        or [n for n in snap.nodes if n.id is not None and n.name.lower() in names]
        or snap.find(role="button")
    )


def _textboxes(snap: Snapshot) -> list[Node]:
    return [n for n in snap.find(role="textbox") if not n.disabled]


def _ordinal(text: str) -> int:
    m = _search(r"(\d+)(?:st|nd|rd|th)", text, "no ordinal")
    return int(m.group(1))


# --------------------------------------------------------------------------- handlers
@_handles("click-test")
def _click_test(instr: str, snap: Snapshot, fields: dict[str, str]) -> list[Step]:
    return [Step("click", _one(snap.find(role="button")))]


@_handles("click-test-2", "click-test-transfer")
def _click_test_2(instr: str, snap: Snapshot, fields: dict[str, str]) -> list[Step]:
    m = _search(r"Click button (\w+)", instr)
    return [Step("click", _button(snap, m.group(1)))]


@_handles("click-button", "unicode-test")
def _click_button(instr: str, snap: Snapshot, fields: dict[str, str]) -> list[Step]:
    return [Step("click", _button(snap, _quoted(instr)))]


@_handles("click-button-sequence")
def _click_sequence(instr: str, snap: Snapshot, fields: dict[str, str]) -> list[Step]:
    return [Step("click", _button(snap, "ONE")), Step("click", _button(snap, "TWO"))]


@_handles("click-link")
def _click_link(instr: str, snap: Snapshot, fields: dict[str, str]) -> list[Step]:
    word = _quoted(instr)
    return [
        Step(
            "click",
            _one([n for n in snap.nodes if n.id is not None and n.name == word and n.tag in ("span", "a")]),
        )
    ]


@_handles("click-dialog")
def _click_dialog(instr: str, snap: Snapshot, fields: dict[str, str]) -> list[Step]:
    return [Step("click", _button(snap, "Close"))]


@_handles("click-dialog-2")
def _click_dialog_2(instr: str, snap: Snapshot, fields: dict[str, str]) -> list[Step]:
    label = _quoted(instr)
    return [Step("click", _button(snap, "Close" if label.lower() == "x" else label))]


_WIDGET_ROLE = {"button": "button", "checkbox": "checkbox", "radio": "radio"}


@_handles("click-widget")
def _click_widget(instr: str, snap: Snapshot, fields: dict[str, str]) -> list[Step]:
    kind = _quoted(instr)
    if kind in _WIDGET_ROLE:
        nodes = snap.find(role=_WIDGET_ROLE[kind])
    elif kind == "textarea":
        nodes = snap.find(role="textbox", tag="textarea")
    elif kind == "text":
        nodes = snap.find(role="textbox", tag="input")
    else:
        raise LookupError(kind)
    return [Step("click", _one(nodes))]


@_handles("click-checkboxes", "click-checkboxes-large", "click-checkboxes-transfer", "click-option")
def _click_checkboxes(instr: str, snap: Snapshot, fields: dict[str, str]) -> list[Step]:
    m = re.match(r"Select (.*) and click Submit", instr)
    if not m:
        raise LookupError(instr)
    wanted = set() if m.group(1) == "nothing" else {w.strip() for w in m.group(1).split(",")}
    steps = []
    for n in snap.nodes:
        if n.role in ("checkbox", "radio") and n.id is not None and bool(n.checked) != (n.name in wanted):
            steps.append(Step("click", n))
    return [*steps, Step("click", _submit(snap))]


@_handles("click-tab")
def _click_tab(instr: str, snap: Snapshot, fields: dict[str, str]) -> list[Step]:
    m = _search(r"Tab #(\d+)", instr)
    return [
        Step("click", _one([n for n in snap.nodes if n.id is not None and n.name == f"Tab #{m.group(1)}"]))
    ]


@_handles("click-tab-2", "click-tab-2-easy", "click-tab-2-medium", "click-tab-2-hard")
def _click_tab_2(instr: str, snap: Snapshot, fields: dict[str, str]) -> list[Step]:
    word = _quoted(instr)
    links = [n for n in snap.nodes if n.id is not None and n.name == word and n.tag == "span"]
    if links:
        return [Step("click", links[0])]
    tabs = [n for n in snap.nodes if n.role == "tab"]
    active = next(i for i, t in enumerate(tabs) if "ui-state-active" in t.cls)
    return [Step("click", tabs[active + 1])]  # tabs are searched left to right


@_handles("enter-text", "enter-text-dynamic")
def _enter_text(instr: str, snap: Snapshot, fields: dict[str, str]) -> list[Step]:
    return [Step("fill", _one(_textboxes(snap)), _quoted(instr)), Step("click", _submit(snap))]


@_handles("enter-text-2")
def _enter_text_2(instr: str, snap: Snapshot, fields: dict[str, str]) -> list[Step]:
    text = _quoted(instr)
    text = text.upper() if "upper case" in instr else text.lower()
    return [Step("fill", _one(_textboxes(snap)), text), Step("click", _submit(snap))]


@_handles("enter-password")
def _enter_password(instr: str, snap: Snapshot, fields: dict[str, str]) -> list[Step]:
    pw = _quoted(instr)
    boxes = _textboxes(snap)
    if len(boxes) < 2:
        raise LookupError("two password fields")
    return [Step("fill", boxes[0], pw), Step("fill", boxes[1], pw), Step("click", _submit(snap))]


@_handles("login-user", "login-user-popup")
def _login(instr: str, snap: Snapshot, fields: dict[str, str]) -> list[Step]:
    m = _search(r'username "(.*?)" and the password "(.*?)"', instr)
    popup = [n for n in snap.find(role="button") if n.name.lower() in ("cancel", "close")]
    if popup:  # login-user-popup: dismiss the popup first
        return [Step("click", popup[0])]
    user = _one([n for n in _textboxes(snap) if n.dom_id == "username"])
    pw = _one([n for n in _textboxes(snap) if n.dom_id == "password"])
    return [Step("fill", user, m.group(1)), Step("fill", pw, m.group(2)), Step("click", _submit(snap))]


@_handles("focus-text")
def _focus_text(instr: str, snap: Snapshot, fields: dict[str, str]) -> list[Step]:
    return [Step("click", _one(_textboxes(snap)))]


@_handles("focus-text-2")
def _focus_text_2(instr: str, snap: Snapshot, fields: dict[str, str]) -> list[Step]:
    return [Step("click", _textboxes(snap)[_ordinal(instr) - 1])]


_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "x": lambda a, b: a * b, "*": lambda a, b: a * b}


@_handles("simple-arithmetic")
def _arithmetic(instr: str, snap: Snapshot, fields: dict[str, str]) -> list[Step]:
    problem = _one([n for n in snap.nodes if n.dom_id == "math-problem"]).name
    m = re.match(r"\s*(-?\d+)\s*([-+x*])\s*(-?\d+)\s*=", problem)
    if not m:
        raise LookupError(problem)
    value = _OPS[m.group(2)](int(m.group(1)), int(m.group(3)))
    return [Step("fill", _one(_textboxes(snap)), str(value)), Step("click", _submit(snap))]


@_handles("simple-algebra")
def _algebra(instr: str, snap: Snapshot, fields: dict[str, str]) -> list[Step]:
    problem = _one([n for n in snap.nodes if n.dom_id == "math-problem"]).name.replace(" ", "")
    lhs, rhs = problem.split("=")

    # a linear expression in x on one side: evaluate at x=0 and x=1 to get slope and intercept
    def f(x: int) -> Fraction:
        expr = re.sub(r"(?<=\d)x", f"*{x}", lhs).replace("x", str(x))
        return Fraction(eval(expr, {"__builtins__": {}}))  # noqa: S307 - digits and + - * only

    if not re.fullmatch(r"[-+*\dx]+", lhs) or not re.fullmatch(r"-?\d+", rhs):
        raise LookupError(problem)
    slope, intercept = f(1) - f(0), f(0)
    x = (Fraction(int(rhs)) - intercept) / slope
    answer = str(x.numerator) if x.denominator == 1 else str(float(x))
    return [Step("fill", _one(_textboxes(snap)), answer), Step("click", _submit(snap))]


@_handles("choose-list")
def _choose_list(instr: str, snap: Snapshot, fields: dict[str, str]) -> list[Step]:
    m = re.match(r"Select (.*) from the list", instr)
    if not m:
        raise LookupError(instr)
    return [Step("select", _one(snap.find(role="combobox")), m.group(1)), Step("click", _submit(snap))]


@_handles("click-collapsible", "click-collapsible-nodelay")
def _collapsible(instr: str, snap: Snapshot, fields: dict[str, str]) -> list[Step]:
    header = _one([n for n in snap.find(role="tab") if n.name.startswith("Section")])
    if "ui-state-active" in header.cls:
        return [Step("click", _submit(snap))]
    return [Step("click", header), Step("click", _submit(snap))]


@_handles("click-collapsible-2", "click-collapsible-2-nodelay")
def _collapsible_2(instr: str, snap: Snapshot, fields: dict[str, str]) -> list[Step]:
    word = _quoted(instr)
    links = [n for n in snap.nodes if n.id is not None and n.name == word and n.tag == "span"]
    if links:
        return [Step("click", links[0])]
    headers = [n for n in snap.find(role="tab") if n.name.startswith("Section")]
    expanded = [i for i, h in enumerate(headers) if "ui-state-active" in h.cls]
    nxt = headers[(expanded[0] + 1) if expanded else 0]
    return [Step("click", nxt)]


@_handles("read-table")
def _read_table(instr: str, snap: Snapshot, fields: dict[str, str]) -> list[Step]:
    m = re.match(r"Enter the value of (.*) into the text field", instr)
    if not m:
        raise LookupError(instr)
    cells = snap.find(role="cell")
    i = next(i for i, c in enumerate(cells) if c.name == m.group(1))
    return [Step("fill", _one(_textboxes(snap)), cells[i + 1].name), Step("click", _submit(snap))]


@_handles("find-word")
def _find_word(instr: str, snap: Snapshot, fields: dict[str, str]) -> list[Step]:
    words = _one(snap.find(role="paragraph")).name.split()
    word = re.sub(r"[^a-zA-Z]", "", words[_ordinal(instr) - 1])
    return [Step("fill", _one(_textboxes(snap)), word), Step("click", _submit(snap))]


@_handles("copy-paste")
def _copy_paste(instr: str, snap: Snapshot, fields: dict[str, str]) -> list[Step]:
    source = _one([n for n in snap.nodes if n.dom_id == "to-copy"])
    target = _one([n for n in snap.nodes if n.dom_id == "answer-input"])
    return [Step("fill", target, source.value or ""), Step("click", _submit(snap))]


@_handles("enter-date")
def _enter_date(instr: str, snap: Snapshot, fields: dict[str, str]) -> list[Step]:
    m = _search(r"(\d\d)/(\d\d)/(\d{4})", instr)
    mm, dd, yyyy = m.groups()
    return [Step("fill", _one(_textboxes(snap)), f"{yyyy}-{mm}-{dd}"), Step("click", _submit(snap))]


@_handles("enter-time")
def _enter_time(instr: str, snap: Snapshot, fields: dict[str, str]) -> list[Step]:
    m = _search(r"(\d{1,2}):(\d\d)\s*(AM|PM)", instr)
    h, minute, half = int(m.group(1)), m.group(2), m.group(3)
    h = h % 12 + (12 if half == "PM" else 0)
    return [Step("fill", _one(_textboxes(snap)), f"{h:02d}:{minute}"), Step("click", _submit(snap))]


@_handles("grid-coordinate")
def _grid(instr: str, snap: Snapshot, fields: dict[str, str]) -> list[Step]:
    m = _search(r"\((-?\d+),\s*(-?\d+)\)", instr)
    key = f"({m.group(1)},{m.group(2)})"
    return [Step("click", _one([n for n in snap.nodes if n.dom_id == key]))]


_COLOR_RGB = {
    "red": "rgb(255, 0, 0)", "blue": "rgb(0, 0, 255)", "olive": "rgb(128, 128, 0)", "lime": "rgb(0, 255, 0)",
    "black": "rgb(0, 0, 0)", "white": "rgb(255, 255, 255)", "grey": "rgb(128, 128, 128)",
    "purple": "rgb(128, 0, 128)", "orange": "rgb(255, 165, 0)", "yellow": "rgb(255, 255, 0)",
    "cyan": "rgb(0, 255, 255)", "pink": "rgb(255, 192, 203)", "magenta": "rgb(255, 0, 255)",
}  # fmt: skip


@_handles("click-color")
def _click_color(instr: str, snap: Snapshot, fields: dict[str, str]) -> list[Step]:
    m = _search(r"Click on the (\w+) colored box", instr)
    rgb = _COLOR_RGB[m.group(1)]
    return [Step("click", _one([n for n in snap.nodes if "color" in n.cls.split() and n.bg == rgb]))]


@_handles("navigate-tree")
def _navigate_tree(instr: str, snap: Snapshot, fields: dict[str, str]) -> list[Step]:
    name = _quoted(instr)
    hits = [n for n in snap.nodes if n.id is not None and n.tag == "span" and n.name == name]
    if hits:
        return [Step("click", hits[0])]
    closed = [n for n in snap.nodes if "expandable-hitarea" in n.cls.split()]
    return [Step("click", _one(closed))]


@_handles("multi-layouts", "multi-orderings")
def _multi(instr: str, snap: Snapshot, fields: dict[str, str]) -> list[Step]:
    m = _search(r"Search for (.*) movies directed by (.*) from year (\d+)", instr)
    values = {"genre": m.group(1), "director": m.group(2), "year": m.group(3)}
    synonyms = {"genre": ("genre",), "director": ("director",), "year": ("year", "date")}
    labels = [
        n
        for n in snap.nodes
        if n.role not in ("textbox", "button")
        and any(w in n.name.lower() for ws in synonyms.values() for w in ws)
    ]
    steps = []
    for box in _textboxes(snap):
        # the label is the nearest piece of text (layouts put it above, left or below the field)
        x, y = box.center
        label = box.name or min(labels, key=lambda n: (n.center[0] - x) ** 2 + (n.center[1] - y) ** 2).name
        field = next((f for f, words in synonyms.items() if any(w in label.lower() for w in words)), None)
        if field is None:
            raise LookupError(f"field {box.id} has no known label")
        steps.append(Step("fill", box, values[field]))
    return [*steps, Step("click", _submit(snap))]


@_handles("drag-box")
def _drag_box(instr: str, snap: Snapshot, fields: dict[str, str]) -> list[Step]:
    small = _one([n for n in snap.nodes if n.dom_id == "draggableSmall"])
    large = _one([n for n in snap.nodes if n.dom_id == "draggableLarge"])
    sx, sy, sw, sh = small.box
    lx, ly, lw, lh = large.box
    # the task wants the small box strictly inside (offsets > 0 and < the size difference)
    if lx < sx - 1 and ly < sy - 1 and sx + sw < lx + lw - 1 and sy + sh < ly + lh - 1:
        return [Step("click", _submit(snap))]
    return [Step("drag", small, target=large)]


@_handles("form-sequence-2")
def _form_sequence_2(instr: str, snap: Snapshot, fields: dict[str, str]) -> list[Step]:
    m = _search(
        r'Check the (\d)\w\w radio button and enter the number "(.*?)" into the (\d)\w\w textbox', instr
    )
    radios = snap.find(role="radio")
    boxes = _textboxes(snap)
    return [
        Step("click", radios[int(m.group(1)) - 1]),
        Step("fill", boxes[int(m.group(3)) - 1], m.group(2)),
        Step("click", _submit(snap)),
    ]


#: Tasks the expert solves (reward > 0 on >= 90% of seeds, checked by the tests).
EXPERT_TASKS: tuple[str, ...] = tuple(sorted(_HANDLERS))
#: Tasks the pixel expert (``gui-miniwob``) solves through mouse and keyboard alone (clicks at element
#: boxes, typed text): the DOM expert's tasks less those needing a native <select> or a date/time picker.
GUI_EXPERT_TASKS: tuple[str, ...] = tuple(
    t for t in EXPERT_TASKS if t not in {"choose-list", "enter-date", "enter-time"}
)

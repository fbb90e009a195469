import asyncio
import time
from typing import Literal

import pytest

from turngym.core.types import ToolCall
from turngym.tools import ToolBox, ToolError, ToolOutput, tool, tool_def


@tool
def search(query: str, k: int = 3) -> str:
    """Search the corpus.

    Args:
        query: what to look for
        k: how many passages
    """
    return f"{k} results for {query}"


@tool(timeout=0.2)
async def slow(seconds: float) -> str:
    """Sleep, then answer."""
    await asyncio.sleep(seconds)
    return "woke"


@tool(timeout=0.2)
def slow_sync(seconds: float) -> str:
    """Sleep in a thread, then answer."""
    time.sleep(seconds)
    return "woke"


@tool
def boom() -> str:
    """Always fails."""
    raise KeyError("missing")


@tool
def refuse() -> str:
    """Fails the expected way."""
    raise ToolError("element 12 not found")


@tool
def big() -> str:
    """Huge output."""
    return "x" * 100_000


@tool
def picture() -> ToolOutput:
    """Returns an image."""
    return ToolOutput(text="see image", images=[b"\x89PNG fake"])


@tool
def choose(kind: Literal["a", "b"], items: list[int], flag: bool = False) -> dict:
    """Typed arguments."""
    return {"kind": kind, "n": len(items), "flag": flag}


def test_schema_from_signature_and_docstring():
    spec = tool_def(search).spec
    assert spec.name == "search"
    assert spec.description == "Search the corpus."
    p = spec.parameters
    assert p["type"] == "object"
    assert p["required"] == ["query"]
    assert p["properties"]["query"] == {"type": "string", "description": "what to look for"}
    assert p["properties"]["k"]["default"] == 3 and p["properties"]["k"]["type"] == "integer"
    assert "title" not in p
    assert tool_def(choose).spec.parameters["properties"]["kind"]["enum"] == ["a", "b"]


def test_decorated_function_still_callable():
    assert search("x", k=1) == "1 results for x"


def test_tool_signature_errors():
    with pytest.raises(TypeError, match="annotation"):

        @tool
        def bad(x):  # noqa: ANN001
            """No annotation."""

    with pytest.raises(TypeError, match=r"\*args"):

        @tool
        def bad2(*xs: int) -> None:
            """Varargs."""


@pytest.fixture
def box() -> ToolBox:
    return ToolBox([search, slow, slow_sync, boom, refuse, big, picture, choose], max_output_chars=1000)


async def call(box: ToolBox, name: str, **args):
    return await box.call(ToolCall(id="c", name=name, arguments=args))


async def test_ok_call(box):
    r = await call(box, "search", query="cats")
    assert r.ok and r.content == "3 results for cats" and r.call_id == "c"
    r = await call(box, "choose", kind="a", items=[1, 2])
    assert r.ok and r.content == '{"kind": "a", "n": 2, "flag": false}'


@pytest.mark.parametrize("value", [True, "7", 7.0, [7], None])
async def test_an_int_argument_is_a_json_integer(box, value):
    """Regression (issue 3: arith paid 1.0 for ``answer(value=true)``): pydantic's lax mode took
    ``true``, ``"7"`` and ``7.0`` as an int; arguments are now validated as JSON in strict mode."""
    r = await call(box, "search", query="x", k=value)
    assert not r.ok and r.error_kind == "bad_arguments" and "argument 'k'" in r.error
    r = await call(box, "choose", kind="a", items=[1, value])
    assert not r.ok and r.error_kind == "bad_arguments" and "items.1" in r.error


async def test_strict_arguments_keep_what_json_spells(box):
    """Strictness refuses coercions, not JSON: an integer is a fine float, and a bool is a bool."""
    r = await call(box, "slow", seconds=0)  # int for a float parameter
    assert r.ok and r.content == "woke"
    r = await call(box, "choose", kind="b", items=[], flag=True)
    assert r.ok and r.content.endswith('"flag": true}')
    r = await call(box, "choose", kind="b", items=[], flag=1)
    assert r.error_kind == "bad_arguments" and "'flag'" in r.error


@pytest.mark.parametrize(
    ("arguments", "says"),
    [
        ({"query": "\ud800"}, "lone surrogate"),
        ({"query": "ok", "k": float("nan")}, "not a JSON number"),
        ({"query": b"\xff"}, "bytes is not a JSON value"),
        ({"query": "x", "k": 10**5000}, "more than 1000 digits"),
    ],
)
async def test_arguments_that_are_not_json_are_bad_arguments(box, arguments, says):
    """A caller that skips the parsers (a structured ToolCall built in Python) gets the same refusal."""
    r = await box.call(ToolCall(id="c", name="search", arguments=arguments))
    assert not r.ok and r.error_kind == "bad_arguments" and says in r.error
    r.error.encode("utf-8")  # the error itself is valid text


async def test_unknown_tool_suggests_close_match(box):
    r = await call(box, "serch", query="x")
    assert not r.ok and r.error_kind == "unknown_tool"
    assert "'search'" in r.error and "Available tools" in r.error


async def test_bad_arguments_are_explained(box):
    r = await call(box, "search", k="many")
    assert not r.ok and r.error_kind == "bad_arguments"
    assert "missing required argument 'query'" in r.error and "argument 'k'" in r.error
    r = await call(box, "search", query="x", extra=1)
    assert "unexpected argument 'extra'" in r.error
    r = await call(box, "choose", kind="c", items=[])
    assert r.error_kind == "bad_arguments" and "'kind'" in r.error
    r = await call(box, "search", query=12)
    assert r.error_kind == "bad_arguments"  # no silent int -> str coercion


async def test_exceptions_and_tool_errors(box):
    r = await call(box, "boom")
    assert not r.ok and r.error_kind == "exception" and "KeyError" in r.error
    r = await call(box, "refuse")
    assert not r.ok and r.error_kind == "tool_error" and r.error == "element 12 not found"


async def test_timeouts_async_and_sync(box):
    for name in ("slow", "slow_sync"):
        start = time.perf_counter()
        r = await call(box, name, seconds=2)
        assert not r.ok and r.error_kind == "timeout", name
        assert time.perf_counter() - start < 1.5
        r = await call(box, name, seconds=0.01)
        assert r.ok and r.content == "woke"


async def test_oversized_output_truncated_with_marker(box):
    r = await call(box, "big")
    assert r.ok and r.truncated
    assert len(r.content) <= 1000
    assert "characters truncated" in r.content


async def test_images_pass_through(box):
    r = await call(box, "picture")
    assert r.images == [b"\x89PNG fake"] and r.content == "see image"


def test_duplicate_names_rejected():
    with pytest.raises(ValueError, match="duplicate"):
        ToolBox([search, search])


def test_methods_become_bound_tools():
    class Counter:
        def __init__(self):
            self.n = 0

        @tool
        def add(self, k: int = 1) -> int:
            """Add k."""
            self.n += k
            return self.n

    c = Counter()
    box = ToolBox.from_object(c)
    assert box.names == ["add"]
    r = box.call_sync(ToolCall(name="add", arguments={"k": 5}))
    assert r.content == "5" and c.n == 5

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from turngym.core.types import Message, ToolCall, ToolResult
from turngym.tools import HermesParser, OpenAIParser, TagParser, get_parser


def test_hermes_several_calls_and_text():
    text = (
        'Let me look.\n<tool_call>{"name": "search", "arguments": {"query": "a"}}</tool_call>\n'
        '<tool_call>\n{"name": "search", "arguments": {"query": "b", "k": 2}}\n</tool_call> done'
    )
    r = HermesParser().parse(text)
    assert [c.status for c in r.calls] == ["ok", "ok"]
    assert [c.arguments for c in r.valid_calls] == [{"query": "a"}, {"query": "b", "k": 2}]
    assert r.text == "Let me look.\n\n done"


def test_hermes_statuses():
    p = HermesParser()
    assert p.parse("<tool_call>{bad</tool_call>").calls[0].status == "invalid_json"
    assert p.parse('<tool_call>{"arguments": {}}</tool_call>').calls[0].status == "invalid_call"
    assert p.parse('<tool_call>{"name": "x", "arguments": 3}</tool_call>').calls[0].status == "invalid_call"
    assert p.parse('<tool_call>{"name": "x"').calls[0].status == "unclosed"
    assert p.parse("no calls here").calls == []
    # OpenAI-style nesting and string arguments are accepted
    r = p.parse('<tool_call>{"function": {"name": "x", "arguments": "{\\"a\\": 1}"}}</tool_call>')
    assert r.valid_calls[0] == ToolCall(name="x", arguments={"a": 1})
    assert (
        p.parse('<tool_call>{"name": "x", "arguments": "{nope"}</tool_call>').calls[0].status
        == "invalid_json"
    )


def test_openai_structured_calls():
    msg = Message(role="assistant", content="hi", tool_calls=[ToolCall(id="1", name="a", arguments={"x": 1})])
    r = OpenAIParser().parse(msg)
    assert r.valid_calls == msg.tool_calls and r.text == "hi"
    # the Hermes parser hands structured calls to the OpenAI path
    assert HermesParser().parse(msg).valid_calls == msg.tool_calls
    r = OpenAIParser().parse(json.dumps([{"name": "a", "arguments": {}}, {"bad": 1}]))
    assert [c.status for c in r.calls] == ["ok", "invalid_call"]


def test_tag_protocol():
    p = TagParser()
    r = p.parse("<think>hmm</think><search> capital of France </search>")
    assert r.valid_calls[0].name == "search" and r.valid_calls[0].arguments == {"query": "capital of France"}
    r = p.parse("<answer>Paris</answer>")
    assert r.valid_calls[0].name == "answer" and r.valid_calls[0].arguments == {"text": "Paris"}
    assert p.parse("<search>unclosed").calls[0].status == "unclosed"
    assert p.parse("plain").calls == []
    out = p.format_result(ToolResult(name="search", content="Doc 1"))
    assert out.role == "user" and out.content == "<information>Doc 1</information>"
    custom = TagParser(tags={"bash": ("bash", "command")}, result_tag="output", first_only=False)
    r = custom.parse("<bash>ls</bash><bash>pwd</bash>")
    assert [c.arguments["command"] for c in r.valid_calls] == ["ls", "pwd"]


def test_get_parser():
    assert get_parser("tags").name == "tags"
    assert get_parser(None).name == "hermes"
    try:
        get_parser("nope")
    except ValueError as e:
        assert "hermes" in str(e)
    else:
        raise AssertionError


fragments = st.sampled_from(
    [
        "<tool_call>",
        "</tool_call>",
        "{",
        "}",
        '"name"',
        ":",
        '"arguments"',
        "[",
        "]",
        ",",
        "<search>",
        "</search>",
        "<answer>",
        "</answer>",
        '"',
        "\\",
        "null",
        "1e999",
        "\x00",
    ]
)
noisy = st.lists(st.one_of(fragments, st.text(max_size=8)), max_size=40).map("".join)


@settings(max_examples=400)
@given(st.one_of(st.text(), noisy))
def test_parsers_never_raise(text):
    for parser in (HermesParser(), OpenAIParser(), TagParser()):
        r = parser.parse(text)
        for c in r.calls:
            assert c.status in ("ok", "invalid_json", "invalid_call", "unclosed")
            assert c.ok == (c.call is not None)
            if not c.ok:
                assert c.error


@settings(max_examples=200)
@given(
    st.text(max_size=20).filter(lambda s: s.strip()),
    st.dictionaries(st.text(max_size=10), st.integers() | st.text(max_size=10), max_size=4),
)
def test_hermes_round_trip(name, args):
    text = f"<tool_call>{json.dumps({'name': name, 'arguments': args})}</tool_call>"
    r = HermesParser().parse(text)
    if "</tool_call>" in json.dumps(name) or "</tool_call>" in json.dumps(args):
        return
    assert r.valid_calls[0].name == name.strip() and r.valid_calls[0].arguments == args


_name = st.from_regex(r"[a-z][a-z_]{0,11}", fullmatch=True)
_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=30)


@settings(max_examples=100)
@given(
    name=_name, arguments=st.dictionaries(_name, st.one_of(_text, st.integers(), st.booleans()), max_size=4)
)
def test_hermes_format_call_parses_back_to_the_same_call(name, arguments):
    call = ToolCall(name=name, arguments=arguments)
    text = HermesParser().format_call(call)
    (parsed,) = HermesParser().parse(text).calls
    assert parsed.ok and parsed.call.name == name and parsed.call.arguments == arguments


@settings(max_examples=100)
@given(
    value=_text.map(str.strip).filter(lambda v: "</" not in v and "<search>" not in v and "<answer>" not in v)
)
def test_tag_format_call_parses_back_to_the_same_call(value):
    parser = TagParser()
    for tool, arg in (("search", "query"), ("answer", "text")):
        (parsed,) = parser.parse(parser.format_call(ToolCall(name=tool, arguments={arg: value}))).calls
        assert parsed.ok and parsed.call.name == tool and parsed.call.arguments == {arg: value}


def test_format_call_in_each_protocol_and_what_a_protocol_cannot_write():
    import pytest

    call = ToolCall(name="answer", arguments={"text": "Paris"})
    assert (
        HermesParser().format_call(call)
        == '<tool_call>{"name": "answer", "arguments": {"text": "Paris"}}</tool_call>'
    )
    assert TagParser().format_call(call) == "<answer> Paris </answer>"
    msg = OpenAIParser().format_call(call)
    assert (
        isinstance(msg, Message)
        and msg.tool_calls == [call]
        and OpenAIParser().parse(msg).valid_calls == [call]
    )
    with pytest.raises(ValueError, match="no tag calls the tool 'calc'"):
        TagParser().format_call(ToolCall(name="calc", arguments={"a": 1}))
    with pytest.raises(ValueError, match="one argument"):
        TagParser().format_call(ToolCall(name="search", arguments={"query": "q", "k": 3}))


# --------------------------------------------------------------------------- invalid unicode and non-JSON
def test_a_lone_surrogate_is_an_invalid_call_in_every_form():
    """Regression (issue 3: 592 exceptions out of ``env.step``): a structured call whose arguments hold a
    lone surrogate made ``OpenAIParser.parse`` raise from ``model_dump_json``. Such strings come from real
    JSON (``"\\ud800"`` is a legal escape); every parser now answers them with an invalid call."""
    structured = [
        ToolCall(id="c", name="lookup", arguments={"topic": "\ud800"}),
        ToolCall(id="c", name="look\udfffup", arguments={}),
        ToolCall(id="c", name="lookup", arguments={"\udc00": 1}),
        ToolCall(id="c", name="lookup", arguments={"nested": [{"deep": ["ok", "x\ud83d"]}]}),
    ]
    for call in structured:
        for parser in (OpenAIParser(), HermesParser()):
            (parsed,) = parser.parse(Message(role="assistant", content="", tool_calls=[call])).calls
            assert parsed.status == "invalid_call" and "lone surrogate" in parsed.error
            parsed.error.encode("utf-8")  # the message for the model is valid text
            json.loads(json.dumps(parsed.raw))
    escaped = '<tool_call>{"name": "lookup", "arguments": {"topic": "\\ud800"}}</tool_call>'
    (parsed,) = HermesParser().parse(escaped).calls
    assert parsed.status == "invalid_call" and "argument topic holds a lone surrogate" in parsed.error
    (parsed,) = (
        OpenAIParser().parse('{"name": "lookup", "arguments": "{\\"topic\\": \\"\\\\udc00\\"}"}').calls
    )
    assert parsed.status == "invalid_call" and "lone surrogate" in parsed.error
    (parsed,) = TagParser().parse("<search>who is \ud800</search>").calls
    assert parsed.status == "invalid_call" and "lone surrogate" in parsed.error
    # an id that is not valid text is replaced (the env assigns one), the call itself is fine
    (parsed,) = (
        OpenAIParser()
        .parse(Message(role="assistant", tool_calls=[ToolCall(id="\ud800", name="a", arguments={})]))
        .calls
    )
    assert parsed.ok and parsed.call.id == ""


def test_what_json_cannot_carry_is_an_invalid_call():
    """NaN, a 5,000-digit number (CPython refuses to read it), bytes, deep nesting: invalid, not raised."""
    p = HermesParser()
    (nan,) = p.parse('<tool_call>{"name": "a", "arguments": {"x": NaN}}</tool_call>').calls
    assert nan.status == "invalid_call" and "not a JSON number" in nan.error
    (big,) = p.parse('<tool_call>{"name": "a", "arguments": {"x": ' + "9" * 5000 + "}}</tool_call>").calls
    assert big.status == "invalid_json" and "too long" in big.error
    deep: list = []
    for _ in range(3000):
        deep = [deep]
    for arguments, says in (
        ({"x": b"\xff"}, "bytes"),
        ({"x": deep}, "nested more than"),
        ({"x": {1, 2}}, "set"),
    ):
        msg = Message(role="assistant", tool_calls=[ToolCall(name="a", arguments=arguments)])
        (parsed,) = OpenAIParser().parse(msg).calls
        assert parsed.status == "invalid_call" and says in parsed.error


json_leaves = (
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(st.characters(exclude_categories=()))
)
json_trees = st.recursive(
    json_leaves, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3)
)


@settings(max_examples=300)
@given(name=st.text(), arguments=st.dictionaries(st.text(), json_trees, max_size=4), call_id=st.text())
def test_structured_calls_never_raise_and_ok_ones_are_valid_text(name, arguments, call_id):
    msg = Message(role="assistant", tool_calls=[ToolCall(id=call_id, name=name, arguments=arguments)])
    for parser in (OpenAIParser(), HermesParser()):
        (parsed,) = parser.parse(msg).calls
        assert parsed.error is None if parsed.ok else parsed.error
        if parsed.ok:  # what a tool sees can be written as strict JSON in UTF-8
            json.dumps(parsed.call.model_dump(), allow_nan=False).encode("utf-8")
            parsed.call.model_dump_json()
        else:
            parsed.error.encode("utf-8")


@settings(max_examples=300)
@given(
    st.text(st.characters(exclude_categories=())),
    st.sampled_from(['"\\ud800"', '"a\\udfffb"', "NaN", "-Infinity", "1e999", "9" * 5000]),
)
def test_parsers_never_raise_on_text_with_what_json_cannot_carry(text, value):
    body = f'<tool_call>{{"name": "t", "arguments": {{"a": {value}, "b": {json.dumps(text)}}}}}</tool_call>'
    (call,) = HermesParser().parse(body).calls
    assert not call.ok and call.error.encode("utf-8")
    for parser in (HermesParser(), OpenAIParser(), TagParser()):
        for action in (body, text, f"<search>{text}</search>"):
            for c in parser.parse(action).calls:
                if c.ok:
                    c.call.model_dump_json()
                else:
                    c.error.encode("utf-8")

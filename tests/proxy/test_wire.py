"""The OpenAI wire format, property-tested: valid requests map exactly, any other body is a 400 that
names a field, never another exception."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turngym.proxy.wire import ProxyError, parse_chat_request, parse_text_request

TEXT = st.text(max_size=30)
ARGS = st.dictionaries(st.text(min_size=1, max_size=5), st.integers() | st.text(max_size=5), max_size=3)


@st.composite
def conversations(draw):
    msgs = [{"role": draw(st.sampled_from(["system", "developer", "user"])), "content": draw(TEXT)}]
    for k in range(draw(st.integers(0, 4))):
        args = draw(ARGS)
        call = {"id": f"c{k}", "type": "function", "function": {"name": "f", "arguments": json.dumps(args)}}
        msgs.append({"role": "assistant", "content": draw(st.none() | TEXT), "tool_calls": [call]})
        parts = draw(st.booleans())
        content = [{"type": "text", "text": draw(TEXT)}] if parts else draw(TEXT)
        msgs.append({"role": "tool", "tool_call_id": f"c{k}", "content": content})
        msgs.append({"role": "user", "content": draw(TEXT)})
    return msgs


@settings(max_examples=200, deadline=None)
@given(conversations(), st.integers(1, 16), st.floats(0, 2), st.none() | st.integers(0, 2**31))
def test_valid_requests_map_field_for_field(msgs, n, temperature, seed):
    req = parse_chat_request(
        {"model": "m", "messages": msgs, "n": n, "temperature": temperature, "seed": seed}
    )
    assert (req.n, req.temperature, req.seed) == (n, temperature, seed)
    assert len(req.messages) == len(msgs)
    for raw, m in zip(msgs, req.messages, strict=True):
        assert m.role == {"developer": "system"}.get(raw["role"], raw["role"])
        content = raw.get("content") or ""
        assert m.content == (content if isinstance(content, str) else content[0]["text"])
        if raw["role"] == "assistant":
            (call,) = m.tool_calls
            assert call.arguments == json.loads(raw["tool_calls"][0]["function"]["arguments"])
        if raw["role"] == "tool":
            assert m.tool_call_id == raw["tool_call_id"] and m.name == "f"


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=12,
)
FIELDS = ["model", "messages", "n", "temperature", "top_p", "stop", "max_tokens", "tools", "tool_choice",
          "seed", "logprobs", "stream", "stream_options", "response_format", "prompt", "echo"]  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(st.sampled_from(FIELDS), JSON, max_size=6) | JSON)
def test_any_body_is_a_request_or_a_400_never_a_crash(body):
    for parse in (parse_chat_request, parse_text_request):
        try:
            parse(body)
        except ProxyError as e:
            assert e.status == 400 and e.message
            assert e.body()["error"]["type"] == "invalid_request_error"


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(["n", "temperature", "top_p", "max_tokens", "seed", "stop", "logprobs"]), JSON)
def test_a_bad_value_is_refused_naming_its_field(field, value):
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], field: value}
    try:
        parse_chat_request(body)
    except ProxyError as e:
        assert e.param is not None and e.param.split("[")[0].split(".")[0] == field
    # else: the value was a valid one for the field


@pytest.mark.parametrize("body", [[], "x", 3, None])
def test_a_body_that_is_not_an_object_is_refused(body):
    with pytest.raises(ProxyError, match="JSON object"):
        parse_chat_request(body)


def _dumped(req):
    return [m.model_dump() for m in req.messages]


@settings(max_examples=150, deadline=None)
@given(conversations(), conversations(), st.integers(0, 12))
def test_a_request_after_a_known_one_parses_as_if_alone(first, second, keep):
    """The episode's previous request's messages (KnownMessages) change nothing but the work: the
    next request, whatever it shares with them, maps exactly as it would on its own."""
    prev = parse_chat_request({"model": "m", "messages": first})
    msgs = first[:keep] + second  # kept history, then new (a tool result may answer a kept call)
    body = {"model": "m", "messages": msgs}
    alone = parse_chat_request(json.loads(json.dumps(body)))
    after = parse_chat_request(body, prev.known)
    assert _dumped(after) == _dumped(alone)
    shared = prev.known.shared(msgs)
    assert shared >= min(keep, len(first))  # more where the new part happens to repeat the old
    assert all(after.messages[i] is prev.messages[i] for i in range(shared))  # reused, not re-made
    assert after.known.raw == msgs and after.known.messages == after.messages


@settings(max_examples=60, deadline=None)
@given(conversations(), st.sampled_from([{"role": "wizard", "content": "x"}, {"content": "no role"},
                                         {"role": "user", "content": [{"type": "image_url"}]}]))  # fmt: skip
def test_a_bad_message_after_known_ones_is_named_by_its_place_in_the_request(msgs, bad):
    prev = parse_chat_request({"model": "m", "messages": msgs})
    body = {"model": "m", "messages": [*msgs, {"role": "user", "content": "ok"}, bad]}
    with pytest.raises(ProxyError) as alone:
        parse_chat_request(json.loads(json.dumps(body)))
    with pytest.raises(ProxyError) as after:
        parse_chat_request(body, prev.known)
    assert after.value.param == alone.value.param and after.value.param.startswith(
        f"messages[{len(msgs) + 1}]"
    )
    assert after.value.message == alone.value.message

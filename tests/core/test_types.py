import io
import struct
import zlib

from hypothesis import given
from hypothesis import strategies as st

from turngym.core.types import Message, ToolCall, ToolResult, ToolSpec, Trajectory, Turn


def tiny_png() -> bytes:
    """A real 1x1 PNG, built by hand so the test needs no imaging library."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    raw = b"\x00\xff\x00\x00"
    buf = io.BytesIO()
    buf.write(b"\x89PNG\r\n\x1a\n")
    buf.write(chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)))
    buf.write(chunk(b"IDAT", zlib.compress(raw)))
    buf.write(chunk(b"IEND", b""))
    return buf.getvalue()


def test_message_with_image_round_trips_through_json():
    png = tiny_png()
    m = Message(role="tool", content="shot", name="screenshot", tool_call_id="c1", images=[png])
    text = m.model_dump_json()
    assert "iVBOR" in text  # base64 of the PNG signature
    again = Message.model_validate_json(text)
    assert again == m
    assert again.images[0] == png


def test_tool_call_and_spec_openai_forms():
    c = ToolCall(id="c1", name="search", arguments={"query": "x", "k": 2})
    assert c.to_openai()["function"]["arguments"] == '{"query": "x", "k": 2}'
    s = ToolSpec(name="search", description="d", parameters={"type": "object", "properties": {}})
    assert s.to_openai() == {
        "type": "function",
        "function": {
            "name": "search",
            "description": "d",
            "parameters": {"type": "object", "properties": {}},
        },
    }
    m = Message(role="assistant", content="", tool_calls=[c])
    assert m.to_chat()["tool_calls"][0]["function"]["name"] == "search"


def test_tool_result_equality_ignores_timing():
    a = ToolResult(name="x", content="1", elapsed_s=0.1)
    b = ToolResult(name="x", content="1", elapsed_s=0.2)
    assert a == b
    assert a != ToolResult(name="x", content="2")


def make_trajectory() -> Trajectory:
    t = Trajectory.start(
        [Message(role="system", content="s"), Message(role="user", content="q")],
        {"task_id": "t1", "reference": {"answer": ["a"]}, "state_key": "k0"},
        env_id="e-v0",
        seed=3,
    )
    t.record_step(
        Message(role="assistant", content="<tool_call>{}</tool_call>"),
        [Message(role="tool", content="r", images=[tiny_png()])],
        0.5,
        False,
        False,
        {
            "reward_components": {"ig": 0.5},
            "invalid_action": False,
            "error": "",
            "state_key": "k1",
            "turn": 1,
            "task_id": "t1",
            "reference": {"answer": ["a"]},
            "tool_results": [ToolResult(name="search", content="r")],
            "extra": {"obj": object()},
        },
    )
    t.record_step(Message(role="assistant", content="done"), [], 1.0, True, False, {"turn": 2})
    t.token_ids, t.loss_mask, t.logprobs = [1, 2, 3], [0, 1, 1], [0.0, -0.5, -0.25]
    t.turns[0].gen_span = (1, 3)
    return t


def test_trajectory_round_trip_and_derived_fields():
    t = make_trajectory()
    again = Trajectory.from_json(t.to_json())
    assert again == t
    assert again.total_reward == 1.5 and again.outcome == 1.0 and again.num_turns == 2
    assert again.terminated and again.done
    assert again.turns[0].state_key == "k1" and again.start_state_key == "k0"
    assert again.turns[0].gen_span == (1, 3)
    assert isinstance(again.turns[0].info["extra"]["obj"], str)  # non-JSON values kept as repr
    assert [m.role for m in again.messages()] == ["system", "user", "assistant", "tool", "assistant"]


text = st.text(max_size=50)
messages = st.builds(
    Message,
    role=st.sampled_from(["system", "user", "assistant", "tool"]),
    content=text,
    name=st.none() | text,
    images=st.lists(st.binary(max_size=64), max_size=2),
)


@given(
    st.lists(messages, max_size=5),
    st.floats(allow_nan=False, allow_infinity=False),
    st.dictionaries(text, st.integers() | text, max_size=4),
)
def test_any_trajectory_round_trips(prompt, reward, reference):
    t = Trajectory(prompt=prompt, reference=reference)
    t.turns.append(Turn(index=0, action=Message(role="assistant", content="a"), reward=reward))
    assert Trajectory.from_json(t.to_json()) == t


def test_a_spec_json_is_its_dump_and_follows_changes_to_the_spec():
    """``ToolSpec.openai_json`` (kept between calls for the prompts' tool lists) is always
    ``json.dumps(to_openai())``, also after the spec's name, description or parameters change in place."""
    import json

    from turngym.tools.parsers import HermesParser

    spec = ToolSpec(
        name="add", description="Add two numbers.", parameters={"type": "object", "properties": {}}
    )

    def dump() -> str:
        return json.dumps(spec.to_openai(), ensure_ascii=False)

    assert spec.openai_json() == dump() and spec.openai_json() == dump()
    spec.parameters["properties"]["a"] = {"type": "integer", "description": "é"}  # in place
    assert spec.openai_json() == dump() and '"é"' in spec.openai_json()
    spec.description = "Add two integers."
    assert spec.openai_json() == dump()
    text = HermesParser().instructions([spec, ToolSpec(name="stop")])
    assert dump() in text and '"name": "stop"' in text

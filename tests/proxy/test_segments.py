"""Segments: a call that extends the last prompt + reply continues one token sequence; anything else
starts a new segment with the drift's reason and location (real tokenizers, real templates)."""

from __future__ import annotations

import pytest

from turngym.agents.chat import ChatFormat, ChatTokens
from turngym.core.types import Message, ToolCall
from turngym.proxy.scripted import end_of_turn
from turngym.proxy.segments import Candidate, plan_chat, plan_text

TOOLS = [
    {"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {}}}}
]


def _sample(fmt: ChatFormat, text: str) -> list[int]:
    return [*fmt.encode(text), end_of_turn(fmt)]


def _first_call(fmt, messages, reply_text, action):
    plan = plan_chat(fmt, messages, None, None)
    ids = _sample(fmt, reply_text)
    span = plan.tokens.add_generation(ids, [-0.5] * len(ids))
    return plan, [Candidate(plan.tokens, action, reply_text, span)]


@pytest.fixture
def convo():
    return [Message(role="system", content="You add."), Message(role="user", content="2+3?")]


def test_a_tool_result_after_the_returned_reply_continues_the_sequence_token_for_token(tokenizer, convo):
    fmt = ChatFormat(tokenizer, tools=TOOLS)
    text = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    action = Message(
        role="assistant", tool_calls=[ToolCall(id="call_1", name="add", arguments={"a": 2, "b": 3})]
    )
    plan1, seg = _first_call(fmt, convo, text, action)
    before = seg[0].tokens.token_ids.tolist()
    sent_back = Message(
        role="assistant", tool_calls=[ToolCall(id="other-id", name="add", arguments={"a": 2, "b": 3})]
    )
    tool = Message(role="tool", content="5", tool_call_id="other-id", name="add")
    plan2 = plan_chat(fmt, [*convo, sent_back, tool], seg, fmt)
    assert plan2.continued and plan2.drift is None
    after = plan2.tokens.token_ids.tolist()
    assert after[: len(before)] == before  # the sampled ids are kept exactly as sampled
    mask = plan2.tokens.loss_mask.tolist()
    assert mask[seg[0].gen_span[0] : seg[0].gen_span[1]] == [1] * (seg[0].gen_span[1] - seg[0].gen_span[0])
    assert sum(mask) == seg[0].gen_span[1] - seg[0].gen_span[0]  # loss only on sampled tokens
    # the new prompt is what a fresh rendering of the whole conversation tokenizes to
    fresh = ChatTokens(fmt, [*convo, sent_back, tool]).token_ids.tolist()
    assert after == fresh
    assert plan2.observation == [tool] and plan2.obs_span == (len(before), len(after))


@pytest.mark.parametrize(
    "edit,reason,message",
    [
        (lambda c, a, t: [c[0], Message(role="user", content="2+4?"), a, t], "history_changed", 1),
        (lambda c, a, t: [c[1], a, t], "history_changed", 0),
        (lambda c, a, t: [*c, Message(role="assistant", content="something else"), t], "reply_changed", 2),
        (lambda c, a, t: [*c], "reply_changed", 2),
    ],
)
def test_a_rewritten_or_dropped_history_starts_a_new_segment_with_the_drift_located(
    tokenizer, convo, edit, reason, message
):
    fmt = ChatFormat(tokenizer)
    action = Message(role="assistant", content="It is 5.")
    _, seg = _first_call(fmt, convo, "It is 5.", action)
    messages = edit(convo, action, Message(role="user", content="Sure?"))
    plan = plan_chat(fmt, messages, seg, fmt)
    assert not plan.continued
    assert plan.drift is not None and plan.drift.reason == reason and plan.drift.message == message
    old, new = seg[0].tokens.token_ids.tolist(), plan.tokens.token_ids.tolist()
    k = plan.drift.token
    assert old[:k] == new[:k] and (k == min(len(old), len(new)) or old[k] != new[k])
    assert plan.tokens.token_ids.tolist() == ChatTokens(fmt, messages).token_ids.tolist()


def test_a_template_that_rewrites_history_is_a_template_drift(strip_tokenizer, convo):
    fmt = ChatFormat(strip_tokenizer)
    text = "let me think</think>It is 5."
    action = Message(role="assistant", content=text)
    _, seg = _first_call(fmt, convo, text, action)
    plan = plan_chat(fmt, [*convo, action, Message(role="user", content="Sure?")], seg, fmt)
    assert not plan.continued and plan.drift.reason == "template" and plan.drift.message == 2


def test_other_tools_start_a_new_segment(tokenizer, convo):
    fmt, other = ChatFormat(tokenizer), ChatFormat(tokenizer, tools=TOOLS)
    action = Message(role="assistant", content="5")
    _, seg = _first_call(fmt, convo, "5", action)
    plan = plan_chat(other, [*convo, action, Message(role="user", content="ok")], seg, fmt)
    assert plan.drift.reason == "tools_changed"


def test_the_harness_may_go_on_with_any_of_n_replies(tokenizer, convo):
    fmt = ChatFormat(tokenizer)
    plan = plan_chat(fmt, convo, None, None)
    seg = []
    for text in ("It is 5.", "Five."):
        tokens = plan.tokens.copy()
        ids = _sample(fmt, text)
        span = tokens.add_generation(ids, [0.0] * len(ids))
        seg.append(Candidate(tokens, Message(role="assistant", content=text), text, span))
    nxt = plan_chat(
        fmt,
        [*convo, Message(role="assistant", content="Five."), Message(role="user", content="ok")],
        seg,
        fmt,
    )
    assert nxt.continued and nxt.chosen == 1
    assert nxt.tokens.token_ids.tolist()[: seg[1].gen_span[1]] == seg[1].tokens.token_ids.tolist()


def test_completions_continue_when_the_prompt_extends_prompt_and_completion(tokenizer):
    fmt = ChatFormat(tokenizer)
    plan = plan_text(fmt, "Evaluate: 2 + 3", None)
    ids = fmt.encode(" = 5")
    span = plan.tokens.add_generation(ids, [0.0] * len(ids), " = 5")
    seg = [Candidate(plan.tokens, Message(role="assistant", content=" = 5"), " = 5", span)]
    nxt = plan_text(fmt, "Evaluate: 2 + 3 = 5. Next: 4 * 4", seg)
    assert nxt.continued and nxt.tokens.token_ids.tolist()[: span[1]] == plan.tokens.token_ids.tolist()
    as_ids = plan_text(fmt, [*plan.tokens.token_ids.tolist(), 7, 8], seg)
    assert as_ids.continued and as_ids.tokens.token_ids.tolist()[-2:] == [7, 8]
    other = plan_text(fmt, "Evaluate: 9", seg)
    assert not other.continued and other.drift.reason == "history_changed"

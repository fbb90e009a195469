"""Token bookkeeping against real chat templates (ChatML, thinking, thinking_strip)."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from turngym.agents.chat import ChatFormat, ChatTokens, TokenMismatch
from turngym.core.types import Message

PROMPT = [
    Message(role="system", content="You are an agent."),
    Message(role="user", content="Evaluate: (2 + 3)"),
]


def sampled(fmt: ChatFormat, text: str, stop: bool = True) -> list[int]:
    ids = fmt.encode(text)
    return ids + [fmt.tokenizer.convert_tokens_to_ids("<|im_end|>")] if stop else ids


def play(
    fmt: ChatFormat, actions: list[str], observations: list[list[Message]], stop: bool = True
) -> ChatTokens:
    tokens = ChatTokens(fmt, PROMPT)
    for i, text in enumerate(actions):
        tokens.add_generation(sampled(fmt, text, stop), [-0.5] * len(sampled(fmt, text, stop)))
        if i < len(observations):
            tokens.add_observation(Message(role="assistant", content=text), observations[i])
    return tokens


def tool_obs(content: str) -> list[Message]:
    return [Message(role="tool", content=content, name="calculate", tool_call_id="call_1_0")]


def test_chatml_sequence_equals_the_template_rendering(tokenizer):
    fmt = ChatFormat(tokenizer)
    actions = [
        '<tool_call>\n{"name": "calculate", "arguments": {"a": 2, "op": "+", "b": 3}}\n</tool_call>',
        "done",
    ]
    tokens = play(fmt, actions, [tool_obs("5")])
    conv = [*PROMPT, Message(role="assistant", content=actions[0]), *tool_obs("5")]
    expected = fmt.render(conv, add_generation_prompt=True)
    # everything up to the last generation is exactly the template's rendering
    last = sampled(fmt, actions[1])
    assert tokens.token_ids.tolist()[: len(tokens) - len(last)] == fmt.encode(expected)
    assert tokens.token_ids.tolist()[-len(last) :] == last
    assert tokens.retokenization_drift == 0
    assert tokens.prompt_len == len(fmt.encode(fmt.render(PROMPT, add_generation_prompt=True)))


def test_loss_mask_and_logprobs_cover_sampled_ids_only(tokenizer):
    fmt = ChatFormat(tokenizer)
    tokens = ChatTokens(fmt, PROMPT)
    spans = []
    for text, obs in [("first", tool_obs("a")), ("second", tool_obs("b")), ("third", None)]:
        ids = sampled(fmt, text)
        spans.append(("gen", tokens.add_generation(ids, [-1.0] * len(ids))))
        if obs:
            spans.append(("obs", tokens.add_observation(Message(role="assistant", content=text), obs)))
    # spans tile the sequence after the prompt
    pos = tokens.prompt_len
    for kind, (a, b) in spans:
        assert a == pos and b > a
        assert set(tokens.loss_mask[a:b]) == ({1} if kind == "gen" else {0})
        assert set(tokens.logprobs[a:b]) == ({-1.0} if kind == "gen" else {0.0})
        pos = b
    assert pos == len(tokens) == len(tokens.loss_mask) == len(tokens.logprobs)
    assert sum(tokens.loss_mask) == sum(len(sampled(fmt, t)) for t in ("first", "second", "third"))


def test_generation_cut_by_max_tokens_gets_the_closing_tail_unmasked(tokenizer):
    fmt = ChatFormat(tokenizer)
    tokens = ChatTokens(fmt, PROMPT)
    ids = fmt.encode("partial answer")  # no stop token: finish_reason == "length"
    gen = tokens.add_generation(ids, [-1.0] * len(ids))
    obs = tokens.add_observation(Message(role="assistant", content="partial answer"), tool_obs("x"))
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert tokens.token_ids.tolist()[obs[0]] == im_end and tokens.loss_mask[obs[0]] == 0
    assert gen[1] == obs[0]
    conv = [*PROMPT, Message(role="assistant", content="partial answer"), *tool_obs("x")]
    assert tokens.token_ids.tolist() == fmt.encode(fmt.render(conv, add_generation_prompt=True))


def test_thinking_template_keeps_prefix_consistency(thinking_tokenizer):
    fmt = ChatFormat(thinking_tokenizer)
    first = "I should add.</think>\n<tool_call>\n{}\n</tool_call>"
    tokens = play(fmt, [first, "five</think>\ndone"], [tool_obs("5")])
    rendered = fmt.render(PROMPT, add_generation_prompt=True)
    assert rendered.endswith("<|im_start|>assistant\n<think>\n")
    assert tokens.retokenization_drift == 0
    assert fmt.decode(tokens.token_ids.tolist()).count("I should add.") == 1


def test_template_that_rewrites_history_is_detected(strip_tokenizer):
    fmt = ChatFormat(strip_tokenizer)
    tokens = ChatTokens(fmt, PROMPT)
    ids = sampled(fmt, "secret plan</think>\ncall")
    tokens.add_generation(ids, [-1.0] * len(ids))
    with pytest.raises(TokenMismatch, match="does not extend"):
        tokens.add_observation(Message(role="assistant", content="secret plan</think>\ncall"), tool_obs("r"))


def test_native_tools_are_rendered_by_the_template(tokenizer):
    tools = [{"type": "function", "function": {"name": "calculate", "description": "c", "parameters": {}}}]
    fmt = ChatFormat(tokenizer, tools=tools)
    text = fmt.render(PROMPT, add_generation_prompt=True)
    assert "# Tools" in text and '"name": "calculate"' in text
    assert "# Tools" not in ChatFormat(tokenizer).render(PROMPT, add_generation_prompt=True)


def test_tokenizer_without_template_is_refused(tokenizer):
    import copy

    bare = copy.deepcopy(tokenizer)
    bare.chat_template = None
    with pytest.raises(ValueError, match="no chat template"):
        ChatFormat(bare)


text_st = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="<>"), min_size=1, max_size=40
)


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(turns=st.lists(st.tuples(text_st, text_st), min_size=1, max_size=4))
def test_property_sequence_is_prompt_plus_sampled_plus_template_deltas(tokenizer, turns):
    fmt = ChatFormat(tokenizer)
    tokens = ChatTokens(fmt, PROMPT)
    conv = list(PROMPT)
    for action, result in turns:
        ids = sampled(fmt, action)
        tokens.add_generation(ids, [-1.0] * len(ids))
        obs = tool_obs(result)
        tokens.add_observation(Message(role="assistant", content=action), obs)
        conv += [Message(role="assistant", content=action), *obs]
    # sampled ids are kept as sampled; non-sampled ids are exactly the template's
    gen_ids = [t for t, m in zip(tokens.token_ids, tokens.loss_mask, strict=True) if m == 1]
    assert gen_ids == [t for a, _ in turns for t in sampled(fmt, a)]
    if tokens.retokenization_drift == 0:
        assert tokens.token_ids.tolist() == fmt.encode(fmt.render(conv, add_generation_prompt=True))


special_text = st.lists(
    st.one_of(text_st, st.sampled_from(["<|im_start|>", "<|im_end|>", "<tool_call>", "\n", " ", "<|im"])),
    max_size=8,
).map("".join)


def reference(tokenizer, text: str) -> list[int]:
    """The tokenizer's own encoding of the whole text (no pieces, no cache)."""
    return list(tokenizer.encode(text, add_special_tokens=False))


@settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prev=special_text, more=special_text, cut=st.integers(0, 40))
def test_property_incremental_encoding_equals_full_encoding(tokenizer, prev, more, cut):
    fmt = ChatFormat(tokenizer)
    prev_ids = fmt.encode(prev)
    extended = prev + more  # extends prev ...
    assert fmt.encode_extending(extended, prev, prev_ids) == reference(tokenizer, extended)
    rewritten = prev[: max(len(prev) - cut, 0)] + more  # ... or rewrites its end
    assert fmt.encode_extending(rewritten, prev, prev_ids) == reference(tokenizer, rewritten)


@settings(max_examples=100, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prev=special_text, more=special_text, cut=st.integers(0, 40), split=st.integers(0, 60))
def test_property_extension_over_split_previous_ids_is_exact(tokenizer, prev, more, cut, split):
    fmt = ChatFormat(tokenizer)
    prev_ids = fmt.encode(prev)
    parts = (prev_ids[:split], prev_ids[split:])  # the previous ids in two consecutive parts
    for text in (prev + more, prev[: max(len(prev) - cut, 0)] + more):
        keep, ids = fmt.extension(text, prev, *parts)
        assert 0 <= keep <= len(prev_ids)
        assert prev_ids[:keep] + ids == reference(tokenizer, text)


def test_template_problem_says_whether_a_template_extends_turn_by_turn(
    tokenizer, thinking_tokenizer, strip_tokenizer
):
    from turngym.agents.chat import template_problem

    assert template_problem(tokenizer) is None and template_problem(thinking_tokenizer) is None
    problem = template_problem(strip_tokenizer)  # drops earlier reasoning: rewrites the history
    assert problem is not None and "cannot be extended turn by turn" in problem and "\n" not in problem

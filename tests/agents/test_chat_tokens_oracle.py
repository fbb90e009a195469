"""``ChatTokens`` (incremental, cached, prefix-sharing) against a from-scratch oracle: the same ids,
masks, drift counts and ``TokenMismatch`` on every turn, for four chat-template styles."""

import copy

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from turngym.agents.chat import ChatFormat, ChatTokens, TokenMismatch
from turngym.core.types import Message

text_st = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=30) | st.sampled_from(
    ["", "\n", " x", "<think>\nr\n</think>\n\nok", "</think>a", "<tool_call>\n{}\n</tool_call>", "<|im_end|>"]
)


class Oracle:
    """The bookkeeping rules of ``turngym.agents.chat`` with whole renderings encoded every turn."""

    def __init__(self, fmt: ChatFormat, prompt: list[Message]):
        self.fmt, self.messages = fmt, list(prompt)
        self.rendered = self.encode(prompt, True)
        self.ids, self.mask, self.drift, self.last_gen = list(self.rendered), [0] * len(self.rendered), 0, []

    def encode(self, messages, gen):
        text = self.fmt.render(messages, add_generation_prompt=gen)
        return list(self.fmt.tokenizer.encode(text, add_special_tokens=False))

    def add_generation(self, ids):
        self.ids += ids
        self.mask += [1] * len(ids)
        self.last_gen = list(ids)

    def add_observation(self, action, observation):
        closed = self.encode([*self.messages, action], False)
        full = self.encode([*self.messages, action, *observation], True)
        if closed[: len(self.rendered)] != self.rendered or full[: len(closed)] != closed:
            raise TokenMismatch("oracle")
        suffix, stops = self.fmt.assistant_suffix_ids, self.fmt.stop_token_ids
        if self.last_gen and self.last_gen[-1] in stops:
            tail = next((suffix[i + 1 :] for i, t in enumerate(suffix) if t in stops), [])
        else:
            tail = list(suffix)
        self.drift += closed[len(self.rendered) :] != self.last_gen + tail
        delta = tail + full[len(closed) :]
        self.ids += delta
        self.mask += [0] * len(delta)
        self.messages += [action, *observation]
        self.rendered = full


@pytest.fixture(scope="module")
def formats(tokenizer, thinking_tokenizer, strip_tokenizer):
    closing = copy.deepcopy(tokenizer)  # closes a final assistant turn with a token the next prompt lacks
    gen = "{% if add_generation_prompt %}"
    assert closing.chat_template.count(gen) == 1
    closing.chat_template = closing.chat_template.replace(
        gen,
        "{% if not add_generation_prompt and messages[-1].role == 'assistant' %}<|endoftext|>{% endif %}"
        + gen,
    )
    return [ChatFormat(t) for t in (tokenizer, thinking_tokenizer, strip_tokenizer, closing)]


turn_st = st.tuples(
    text_st,  # the action text
    st.sampled_from(["exact", "stop", "resampled"]),  # how its ids were sampled
    st.lists(st.tuples(st.sampled_from(["tool", "user"]), text_st), min_size=1, max_size=2),
)


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(system=text_st, user=text_st, turns=st.lists(turn_st, min_size=1, max_size=4), data=st.data())
def test_property_chat_tokens_equal_the_oracle_turn_by_turn(formats, system, user, turns, data):
    for fmt in formats:
        check_against_oracle(fmt, system, user, turns, data)


@pytest.mark.pretrained
@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(system=text_st, user=text_st, turns=st.lists(turn_st, min_size=1, max_size=4), data=st.data())
def test_property_smollm2_template_equals_the_oracle(smollm2_format, system, user, turns, data):
    """The real SmolLM2-135M-Instruct template (ChatML, tool results in a ``tool`` role, a default
    system message when none is given) under the same bookkeeping rules."""
    check_against_oracle(smollm2_format, system, user, turns, data)


@pytest.fixture(scope="module")
def smollm2_format(smollm2_tokenizer):
    return ChatFormat(smollm2_tokenizer)


def check_against_oracle(fmt, system, user, turns, data):
    prompt = [Message(role="system", content=system), Message(role="user", content=user)]
    tokens, oracle = ChatTokens(fmt, prompt), Oracle(fmt, prompt)
    assert tokens.token_ids.tolist() == oracle.ids
    for action_text, how, obs in turns:
        ids = fmt.encode(action_text)
        if how == "stop":
            ids = [*ids, fmt.tokenizer.convert_tokens_to_ids("<|im_end|>")]
        elif how == "resampled":  # ids whose text does not re-encode to them: retokenization drift
            ids = data.draw(st.lists(st.integers(3, 1000), max_size=6))
        tokens.add_generation(ids, [-1.0] * len(ids))
        oracle.add_generation(ids)
        action = Message(role="assistant", content=fmt.decode(ids) if how == "resampled" else action_text)
        observation = [Message(role=r, content=c) for r, c in obs]
        try:
            oracle.add_observation(action, observation)
        except TokenMismatch:
            with pytest.raises(TokenMismatch):
                tokens.add_observation(action, observation)
            break
        tokens.add_observation(action, observation)
        assert tokens.token_ids.tolist() == oracle.ids
        assert tokens.loss_mask.tolist() == oracle.mask
        assert tokens.retokenization_drift == oracle.drift

"""``ChatFormat.render`` renders the compiled template directly: exactly ``apply_chat_template``."""

import copy

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from turngym.agents.chat import ChatFormat
from turngym.core.types import Message, ToolCall

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculate",
            "description": "Evaluate a op b.",
            "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}},
        },
    }
]
text_st = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=25) | st.sampled_from(
    ["", "<|im_end|>", "<think>\nhm\n</think>\n\nok", "{{ raise }}", "{% if %}", " \n "]
)
call_st = st.builds(
    ToolCall,
    id=st.sampled_from(["call_0", "c1"]),
    name=st.sampled_from(["calculate", "answer"]),
    arguments=st.dictionaries(st.sampled_from(["a", "b"]), st.integers(-5, 5), max_size=2),
)
message_st = st.one_of(
    st.builds(Message, role=st.sampled_from(["user", "system"]), content=text_st),
    st.builds(Message, role=st.just("assistant"), content=text_st, tool_calls=st.lists(call_st, max_size=2)),
    st.builds(
        Message, role=st.just("tool"), content=text_st, name=st.just("calculate"), tool_call_id=st.just("c1")
    ),
)
conversation_st = st.tuples(
    st.lists(st.builds(Message, role=st.just("system"), content=text_st), max_size=1),
    st.builds(Message, role=st.just("user"), content=text_st),
    st.lists(message_st, max_size=6),
).map(lambda t: [*t[0], t[1], *t[2]])


@pytest.fixture(scope="module")
def formats(tokenizer, thinking_tokenizer, strip_tokenizer):
    return [
        ChatFormat(tokenizer),
        ChatFormat(tokenizer, tools=TOOLS),
        ChatFormat(thinking_tokenizer),
        ChatFormat(strip_tokenizer, template_kwargs={"enable_thinking": False}),
    ]


def test_every_format_uses_the_direct_path(formats):
    assert all(fmt._template is not None for fmt in formats)


@settings(max_examples=80, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(conversation=conversation_st, gen=st.booleans())
def test_property_direct_rendering_equals_apply_chat_template(formats, conversation, gen):
    for fmt in formats:
        chat = [m.to_chat() for m in conversation]
        try:
            expected = fmt._apply_template(chat, gen)
        except Exception as e:  # noqa: BLE001 - a template that refuses a conversation refuses it both ways
            with pytest.raises(type(e)):
                fmt.render(conversation, gen)
            continue
        assert fmt.render(conversation, gen) == expected


def test_reserved_template_kwargs_fall_back_to_apply_chat_template(tokenizer):
    fmt = ChatFormat(tokenizer, template_kwargs={"documents": [{"title": "t", "text": "x"}]})
    assert fmt._template is None
    conv = [Message(role="user", content="hi")]
    assert fmt.render(conv, True) == tokenizer.apply_chat_template(
        [m.to_chat() for m in conv],
        tokenize=False,
        add_generation_prompt=True,
        documents=fmt.template_kwargs["documents"],
    )


CUSTOM = (
    "{{ eos_token }}{% for m in messages %}{% generation %}[{{ loop.index0 }}/{{ loop.length }}"
    "{{ loop.cycle('a', 'b') }}{% if loop.last %}L{% endif %}]{% endgeneration %}"
    "{{ m.role }}:{{ m.content }}|{{ m.get('name', '-') }}|{{ m.items() | list | length }}"
    "|{{ 'x' if m.nope is defined else 'y' }}|{{ m.keys is defined }}"
    "{% if m.role == 'bad' %}{{ raise_exception('bad role') }}{% endif %}\n{% endfor %}"
    "{% if add_generation_prompt %}{{ greeting }}{% endif %}"
)


@pytest.fixture(scope="module")
def custom_tokenizer(tokenizer):
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = CUSTOM
    return tok


def test_special_tokens_variables_tags_and_dict_methods_render_as_in_transformers(custom_tokenizer):
    fmt = ChatFormat(custom_tokenizer, template_kwargs={"greeting": "hello"})
    assert fmt._template is not None
    conv = [Message(role="user", content="q"), Message(role="tool", content="r", name="f", tool_call_id="c")]
    text = fmt.render(conv, True)
    assert text == fmt._apply_template([m.to_chat() for m in conv], True)
    assert text.startswith(custom_tokenizer.eos_token) and "|f|4|y|True" in text and text.endswith("hello")
    with pytest.raises(Exception, match="bad role"):
        fmt.render([{"role": "bad", "content": "x"}], False)

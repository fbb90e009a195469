"""Images in observations: sent as image parts to chat APIs, rejected clearly by text-only token bookkeeping."""

import base64

import pytest

from turngym.agents.chat import ChatFormat, ChatTokens, ImagesNotSupported
from turngym.agents.openai_chat import to_openai_messages
from turngym.core.types import Message

PNG = b"\x89PNG\r\n\x1a\nfake"


def test_images_become_image_url_parts():
    msgs = [
        Message(role="system", content="sys"),
        Message(role="user", content="look", images=[PNG]),
        Message(role="assistant", content="clicking"),
        Message(role="tool", content="clicked", tool_call_id="c1", name="click", images=[PNG, PNG]),
    ]
    out = to_openai_messages(msgs)
    assert [d["role"] for d in out] == ["system", "user", "assistant", "tool", "user"]
    user = out[1]["content"]
    assert user[0] == {"type": "text", "text": "look"}
    assert user[1]["image_url"]["url"] == "data:image/png;base64," + base64.b64encode(PNG).decode()
    assert out[3] == {"role": "tool", "content": "clicked", "tool_call_id": "c1"}  # tool content stays text
    follow = out[4]["content"]
    assert follow[0]["text"] == "(images from the tool message above)" and len(follow) == 3


def test_text_only_messages_unchanged():
    out = to_openai_messages([Message(role="user", content="hi")])
    assert out == [{"role": "user", "content": "hi"}]


def test_text_only_tokenizer_rejects_images(tokenizer):
    fmt = ChatFormat(tokenizer)
    prompt = [Message(role="user", content="what is on screen?", images=[PNG])]
    with pytest.raises(ImagesNotSupported, match="1 image.*text-only"):
        ChatTokens(fmt, prompt)
    tokens = ChatTokens(fmt, [Message(role="user", content="no images")])
    sampled = fmt.encode("ok") + sorted(fmt.stop_token_ids)[:1]
    tokens.add_generation(sampled, [0.0] * len(sampled))
    with pytest.raises(ImagesNotSupported):
        tokens.add_observation(
            Message(role="assistant", content="ok"), [Message(role="tool", content="shot", images=[PNG])]
        )

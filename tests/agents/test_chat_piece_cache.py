"""``ChatFormat.encode``: piecewise encoding through the LRU piece cache equals the tokenizer's."""

import copy

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from turngym.agents.chat import ChatFormat, ChatTokens, PieceCache, _split_anchors
from turngym.core.types import Message

text_st = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=30)
specials = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tool_call>", "</think>", "<|im", "\n", " ", "  "]
special_text = st.lists(st.one_of(text_st, st.sampled_from(specials)), max_size=10).map("".join)
hyp = settings(max_examples=120, suppress_health_check=[HealthCheck.function_scoped_fixture])


def reference(tokenizer, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


@pytest.fixture(scope="module")
def overlapping_tokenizer(tokenizer):
    """Added tokens that contain or overlap anchors: a naive split at the anchors would be wrong."""
    tok = copy.deepcopy(tokenizer)
    tok.add_special_tokens({"additional_special_tokens": ["<|im_end|>!", "x<|im"]})
    return tok


@hyp
@given(texts=st.lists(special_text, min_size=1, max_size=4))
def test_property_cached_encoding_equals_the_tokenizers(tokenizer, thinking_tokenizer, texts):
    for tok in (tokenizer, thinking_tokenizer):
        fmt = ChatFormat(tok)
        for text in [*texts, *texts]:  # the second round is served from the cache
            assert fmt.encode(text) == reference(tok, text)


@hyp
@given(texts=st.lists(special_text.map(lambda t: t.replace("<|im", "x<|im")), min_size=1, max_size=3))
def test_property_added_tokens_overlapping_anchors_keep_the_encoding(overlapping_tokenizer, texts):
    fmt = ChatFormat(overlapping_tokenizer)
    for text in [*texts, "a<|im_end|>!b x<|im_start|> <|im_end|>", *texts]:
        assert fmt.encode(text) == reference(overlapping_tokenizer, text)


def test_anchors_exclude_overlapping_and_unsafe_tokens(tokenizer, overlapping_tokenizer):
    anchors = set(_split_anchors(tokenizer).values())
    assert {"<|im_start|>", "<|im_end|>", "<tool_call>"} <= anchors
    unsafe = set(_split_anchors(overlapping_tokenizer).values())
    assert "<|im_end|>" not in unsafe and "<|im_start|>" not in unsafe  # contained / overlapped
    assert "<tool_call>" in unsafe
    split = copy.deepcopy(tokenizer)
    split.split_special_tokens = True  # special tokens are encoded as text: no piece is independent
    assert _split_anchors(split) == {}
    fmt = ChatFormat(split)
    text = "<|im_start|>user\nhi<|im_end|>"
    assert fmt.encode(text) == reference(split, text) != reference(tokenizer, text)
    fmt.encode(text).append(-1)  # the whole text is one cached piece: still not shared
    assert fmt.encode(text) == reference(split, text)


def test_cache_hits_and_returns_independent_lists(tokenizer):
    fmt = ChatFormat(tokenizer)
    text = fmt.render(
        [Message(role="system", content="rules " * 50), Message(role="user", content="q")], True
    )
    first = fmt.encode(text)
    misses = fmt.pieces.misses
    first.append(-1)  # a caller mutating its result ...
    again = fmt.encode(text)
    assert again == reference(tokenizer, text)  # ... does not leak into the cache
    assert fmt.pieces.misses == misses and fmt.pieces.hits >= 3


def test_prompts_of_a_group_share_pieces_but_not_state(tokenizer):
    fmt = ChatFormat(tokenizer)
    prompt = [Message(role="system", content="You are an agent. " * 20), Message(role="user", content="2+3")]
    a, b = ChatTokens(fmt, prompt), ChatTokens(fmt, prompt)
    assert a.token_ids == b.token_ids
    a.add_generation([5, 6], [-1.0, -1.0])
    assert len(b) == b.prompt_len == len(reference(tokenizer, fmt.render(prompt, True)))
    other = ChatTokens(fmt, [prompt[0], Message(role="user", content="7*8")])  # same system prompt, new task
    assert other.token_ids.tolist() == reference(tokenizer, fmt.render(other.messages, True))


def test_piece_cache_evicts_least_recently_used_within_its_budget():
    cache = PieceCache(max_chars=10)
    for key in ("aaaa", "bbbb"):
        cache.put(key, [1])
    assert cache.get("aaaa") is not None  # a is now the most recent
    cache.put("cccc", [2])  # 12 chars > 10: b goes
    assert cache.get("bbbb") is None and cache.get("aaaa") is not None and cache.get("cccc") is not None
    assert cache.chars == 8 and len(cache) == 2
    cache.put("x" * 11, [3])  # longer than the whole budget: not kept
    assert cache.get("x" * 11) is None and len(cache) == 2


def test_disabled_cache_still_encodes_exactly(tokenizer):
    fmt = ChatFormat(tokenizer, cache_chars=0)
    text = "<|im_start|>system\nhello<|im_end|>\n<|im_start|>assistant\n"
    assert fmt.encode(text) == fmt.encode(text) == reference(tokenizer, text)
    assert len(fmt.pieces) == 0


def test_rust_tokenizer_state_left_by_other_callers_does_not_change_the_ids(tokenizer):
    tok = copy.deepcopy(tokenizer)
    fmt = ChatFormat(tok, cache_chars=0)
    assert fmt._raw is not None  # the fast path is taken for a clean tokenizer ...
    text = "<|im_start|>user\nsome longer text to encode here<|im_end|>\n"
    clean = fmt.encode(text)
    tok.backend_tokenizer.enable_truncation(max_length=2)  # ... state a caller's padding/truncation left
    tok.backend_tokenizer.enable_padding(length=64)
    assert fmt.encode(text) == clean == reference(tok, text)


def test_decode_matches_the_tokenizers_including_cleanup(tokenizer):
    tok = copy.deepcopy(tokenizer)
    fmt = ChatFormat(tok)
    ids = fmt.encode("a , b . c<|im_end|> d <tool_call>")
    assert fmt.decode(ids) == tok.decode(ids, skip_special_tokens=True)
    tok.clean_up_tokenization_spaces = True  # the Rust decoder alone would not clean up
    tok.clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output = True
    assert (
        fmt.decode(ids)
        == tok.decode(ids, skip_special_tokens=True)
        != tok.backend_tokenizer.decode(ids, skip_special_tokens=True)
    )

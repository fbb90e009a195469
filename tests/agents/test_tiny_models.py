import os

import pytest

from turngym.agents.models import load_model, load_tokenizer, resolve_model
from turngym.agents.tiny import MARKUP_TOKENS, TinyConfig, tiny_model_path


def test_tiny_model_is_cached_and_loads_through_the_common_path(tiny_dir, tokenizer):
    before = os.path.getmtime(tiny_dir / "model.safetensors")
    assert tiny_model_path() == tiny_dir  # second call: no rebuild
    assert os.path.getmtime(tiny_dir / "model.safetensors") == before
    assert resolve_model("tiny") == str(tiny_dir)
    assert resolve_model("/some/dir") == "/some/dir"
    model = load_model("tiny", device="cpu")
    cfg = model.config
    assert cfg.model_type == "qwen2"
    assert cfg.hidden_size // cfg.num_attention_heads == 64  # vLLM CPU attention needs head dim >= 64
    assert cfg.vocab_size == len(tokenizer)
    assert model.generation_config.eos_token_id  # stops on <|im_end|>


def test_cache_key_depends_on_config_and_template(tmp_path):
    a = tiny_model_path(TinyConfig(num_hidden_layers=1), cache_dir=tmp_path)
    b = tiny_model_path(TinyConfig(num_hidden_layers=1), template="thinking", cache_dir=tmp_path)
    assert a != b and a.parent == b.parent == tmp_path
    assert load_tokenizer(b).chat_template != load_tokenizer(a).chat_template
    with pytest.raises(ValueError, match="unknown template"):
        tiny_model_path(template="nope", cache_dir=tmp_path)


def test_every_field_of_the_shape_reaches_the_saved_model_config(tmp_path):
    """``TinyConfig.model_shape`` passes the shape to ``Qwen2Config`` by name: a non-default value of
    each field is in the saved config (the vocabulary is the tokenizer's, the seed seeds the init)."""
    import json

    shape = TinyConfig(
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=512,
        seed=3,
    )
    saved = json.loads((tiny_model_path(shape, cache_dir=tmp_path) / "config.json").read_text())
    for name, value in shape.model_shape().items():
        assert saved[name] == value, name
    assert saved["head_dim"] == 32 and saved["max_position_embeddings"] == 512
    assert saved["tie_word_embeddings"] is True


def test_tokenizer_is_byte_level_with_markup_tokens(tokenizer):
    text = "Évaluer: (12 + 7) * 3 \u2603 \n\t"
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text
    for tok in MARKUP_TOKENS + ["<|im_start|>", "<|im_end|>"]:
        assert len(tokenizer.encode(tok, add_special_tokens=False)) == 1, tok
    # markup survives skip_special_tokens (the tool-call parser needs it); <|im_end|> does not
    ids = tokenizer.encode("<tool_call>x</tool_call><|im_end|>", add_special_tokens=False)
    assert tokenizer.decode(ids, skip_special_tokens=True) == "<tool_call>x</tool_call>"


def test_chatml_template_renders_tools_calls_and_results(tokenizer):
    tools = [{"type": "function", "function": {"name": "calc", "description": "d", "parameters": {}}}]
    msgs = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "calc", "arguments": '{"a": 1}'}}
            ],
        },
        {"role": "tool", "content": "2", "tool_call_id": "c1"},
        {"role": "tool", "content": "3", "tool_call_id": "c2"},
    ]
    text = tokenizer.apply_chat_template(msgs, tools=tools, tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nbe brief\n\n# Tools")
    assert '"name": "calc"' in text
    assert '<tool_call>\n{"name": "calc", "arguments": {"a": 1}}\n</tool_call><|im_end|>\n' in text
    # consecutive tool results share one user turn
    assert (
        "<|im_start|>user\n<tool_response>\n2\n</tool_response>\n<tool_response>\n3\n</tool_response><|im_end|>\n"
        in text
    )
    assert text.endswith("<|im_start|>assistant\n")


def test_thinking_templates(thinking_tokenizer, strip_tokenizer):
    msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "plan</think>\nanswer"}]
    keep = thinking_tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    strip = strip_tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert "<think>\nplan</think>\nanswer<|im_end|>" in keep
    assert "plan" not in strip and "<|im_start|>assistant\nanswer<|im_end|>" in strip
    assert keep.endswith("<|im_start|>assistant\n<think>\n") and strip.endswith("<think>\n")


def test_concurrent_first_builds_share_one_model(tmp_path):
    """Ranks of one job (or test workers) asking for the same tiny model at once: one builds it, the
    others wait and load it (a rename race once failed a 2-GPU run with "Directory not empty")."""
    import subprocess
    import sys

    code = f"from turngym.agents.tiny import tiny_model_path; print(tiny_model_path(cache_dir={str(tmp_path)!r}))"
    procs = [
        subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) for _ in range(3)
    ]
    paths = {p.communicate(timeout=300)[0].strip() for p in procs}
    assert all(p.returncode == 0 for p in procs) and len(paths) == 1
    built = [p.name for p in tmp_path.iterdir() if not p.name.startswith(".")]
    assert built == [paths.pop().rsplit("/", 1)[1]]  # one model, no leftover build directory

"""Tiny random-init models for tests, demos and benchmarks.

``tiny_model_path()`` builds (once, then caches on disk) a small Qwen2-architecture causal LM
with a byte-level BPE tokenizer trained in about a second, a real chat template with tool calls,
and saves it as a normal Hugging Face model directory that transformers and vLLM load like any
other checkpoint. Two chat-template styles exist:

* ``"chatml"``: ChatML with native tool rendering (Qwen2.5 convention: ``<tools>`` in the system
  turn, ``<tool_call>`` blocks in assistant turns, tool results as ``<tool_response>`` in a user turn);
* ``"thinking"``: the same plus a reasoning block; the generation prompt opens ``<think>\\n`` and
  earlier reasoning stays in the history (prefix-consistent);
* ``"thinking_strip"``: like ``"thinking"`` but earlier turns' reasoning is dropped from the history
  (the R1/QwQ convention), which breaks prefix consistency on purpose; the token bookkeeping must
  detect it.

The cache key is a hash of the config, the template and ``BUILD_VERSION``; the directory is
``$TURNGYM_CACHE_DIR/tiny/<key>`` (default ``~/.cache/turngym``). Builds are atomic (write to a temporary
directory, then rename), so concurrent test workers never see a half-written model.

Head dim must be 64 or more for vLLM's CPU attention (16 is rejected).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from turngym.core.cache import cache_root

BUILD_VERSION = 2

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
#: Added tokens that stay in decoded text (the tool-call parser and the thinking split need them).
MARKUP_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]

_TOOLS_SYSTEM = (
    "{% if tools %}<|im_start|>system\n"
    "{% if messages[0].role == 'system' %}{{ messages[0].content }}\n\n{% endif %}"
    "# Tools\n\nYou may call one or more functions. Function signatures:\n<tools>"
    "{% for t in tools %}\n{{ t | tojson }}{% endfor %}\n</tools>\n"
    'For each call, write <tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
    "</tool_call><|im_end|>\n"
    "{% elif messages[0].role == 'system' %}<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n"
    "{% endif %}"
)

_TOOL_CALLS = (
    "{% for tc in message.tool_calls or [] %}"
    "{% if tc.function is defined %}{% set tc = tc.function %}{% endif %}"
    '{% if content or not loop.first %}\n{% endif %}<tool_call>\n{"name": "{{ tc.name }}", "arguments": '
    "{% if tc.arguments is string %}{{ tc.arguments }}{% else %}{{ tc.arguments | tojson }}{% endif %}"
    "}\n</tool_call>"
    "{% endfor %}"
)

_TOOL_RESULT = (
    "{% if loop.first or messages[loop.index0 - 1].role != 'tool' %}<|im_start|>user{% endif %}"
    "\n<tool_response>\n{{ message.content }}\n</tool_response>"
    "{% if loop.last or messages[loop.index0 + 1].role != 'tool' %}<|im_end|>\n{% endif %}"
)


def _template(assistant_body: str, generation_prompt: str) -> str:
    """Assemble a template; literal newlines become ``{{ '\\n' }}`` so Jinja's trim_blocks cannot eat them."""
    text = (
        _TOOLS_SYSTEM
        + "{% for message in messages %}"
        + "{% if message.role == 'user' or (message.role == 'system' and not loop.first) %}"
        + "<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n"
        + "{% elif message.role == 'assistant' %}"
        + "{% set content = message.content or '' %}"
        + assistant_body
        + _TOOL_CALLS
        + "<|im_end|>\n"
        + "{% elif message.role == 'tool' %}"
        + _TOOL_RESULT
        + "{% endif %}"
        + "{% endfor %}"
        + "{% if add_generation_prompt %}"
        + generation_prompt
        + "{% endif %}"
    )
    return text.replace("\n", "{{ '\\n' }}")


CHAT_TEMPLATES: dict[str, str] = {
    "chatml": _template("<|im_start|>assistant\n{{ content }}", "<|im_start|>assistant\n"),
    "thinking": _template(
        "<|im_start|>assistant\n<think>\n{{ content }}", "<|im_start|>assistant\n<think>\n"
    ),
    "thinking_strip": _template(
        "<|im_start|>assistant\n"
        "{% if '</think>' in content %}{% set content = content.split('</think>')[-1].lstrip() %}{% endif %}"
        "{{ content }}",
        "<|im_start|>assistant\n<think>\n",
    ),
}


@dataclass(frozen=True)
class TinyConfig:
    """Shape of a tiny model. The defaults build a ~0.3M-parameter model in about a second."""

    vocab_size: int = 1024
    hidden_size: int = 128
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 2
    num_key_value_heads: int = 1
    max_position_embeddings: int = 4096
    seed: int = 0

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def model_shape(self) -> dict[str, int]:
        """The ``Qwen2Config`` arguments this shape sets (the fields share their names; the vocabulary
        size is the trained tokenizer's, the seed only seeds the init)."""
        shape = {k: v for k, v in asdict(self).items() if k not in ("vocab_size", "seed")}
        return {**shape, "head_dim": self.head_dim}


def tiny_model_path(
    config: TinyConfig | None = None, template: str = "chatml", cache_dir: str | Path | None = None
) -> Path:
    """Return the directory of a tiny model, building it on first use."""
    config = config or TinyConfig()
    if template not in CHAT_TEMPLATES:
        raise ValueError(f"unknown template {template!r}; choose from {sorted(CHAT_TEMPLATES)}")
    if config.head_dim * config.num_attention_heads != config.hidden_size:
        raise ValueError("hidden_size must be a multiple of num_attention_heads")
    key = hashlib.sha1(
        json.dumps([BUILD_VERSION, asdict(config), template], sort_keys=True).encode()
    ).hexdigest()[:12]
    root = Path(cache_dir) if cache_dir is not None else cache_root() / "tiny"
    target = root / f"{template}-h{config.hidden_size}-l{config.num_hidden_layers}-{key}"
    if (target / "config.json").exists() and (target / "tokenizer.json").exists():
        return target
    root.mkdir(parents=True, exist_ok=True)
    # one builder at a time (ranks of one job, test workers): the others wait, then find it built
    with open(root / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / "config.json").exists() and (target / "tokenizer.json").exists():
            return target
        tmp = Path(tempfile.mkdtemp(dir=root, prefix=".build-"))
        try:
            build_tiny_model(tmp, config, template)
            shutil.rmtree(target, ignore_errors=True)  # an incomplete one left by a killed build
            os.rename(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def build_tiny_model(out_dir: str | Path, config: TinyConfig | None = None, template: str = "chatml") -> Path:
    """Train the tokenizer, random-init the model and save both to ``out_dir``."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    config = config or TinyConfig()
    out = Path(out_dir)
    tokenizer = build_tokenizer(config.vocab_size, template)
    ids = tokenizer.convert_tokens_to_ids(SPECIAL_TOKENS)
    pad_id, _, im_end = ids
    model_config = Qwen2Config(
        **config.model_shape(),
        vocab_size=len(tokenizer),
        tie_word_embeddings=True,
        bos_token_id=pad_id,
        eos_token_id=im_end,
        pad_token_id=pad_id,
        torch_dtype="float32",
    )
    torch.manual_seed(config.seed)
    model = Qwen2ForCausalLM(model_config)
    model.generation_config = GenerationConfig(
        bos_token_id=pad_id, eos_token_id=[im_end, pad_id], pad_token_id=pad_id, do_sample=True
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def build_tokenizer(vocab_size: int = 1024, template: str = "chatml"):
    """A byte-level BPE tokenizer trained on a small synthetic corpus, with a chat template."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKUP_TOKENS])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        bos_token=None,
        clean_up_tokenization_spaces=False,
        model_max_length=4096,
    )
    fast.chat_template = CHAT_TEMPLATES[template]
    return fast


def _corpus():
    """Deterministic training text: chat markup, JSON tool calls, numbers and common words."""
    import random

    rng = random.Random(0)
    words = (
        "the of and to in is you that it he was for on are as with his they at be this have from or one "
        "had by word but not what all were we when your can said there use an each which she do how their "
        "if will up other about out many then them these so some her would make like him into time has look "
        "two more write go see number no way could people my than first water been call who oil its now find "
        "long down day did get come made may part search answer question document title result error tool "
        "calculate evaluate expression value function arguments name query passage city flight hotel plan "
        "click type submit file bash python test"
    ).split()
    for _ in range(3000):
        n = rng.randint(3, 14)
        sentence = " ".join(rng.choice(words) for _ in range(n))
        yield sentence.capitalize() + rng.choice([".", "?", "!", ":"])
        a, b = rng.randint(0, 999), rng.randint(0, 999)
        op = rng.choice("+-*")
        yield f"Evaluate: (({a} {op} {b}) {rng.choice('+-*')} {rng.randint(0, 99)})"
        yield json.dumps(
            {"name": rng.choice(words), "arguments": {rng.choice(words): rng.choice([a, str(b)])}}
        )
        yield f"<|im_start|>{rng.choice(['system', 'user', 'assistant'])}\n{sentence}<|im_end|>\n"

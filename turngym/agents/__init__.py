"""Agents and inference backends.

* ``backend``: the token-level ``Backend`` protocol (``generate(prompt_ids, SamplingParams) -> Generation``).
* ``hf.HFBackend`` (transformers in-process, continuous batching, per-request seeds, prefix reuse per
  trajectory), ``hf.HFProcessBackend`` (the same in a worker process with its own GIL: use it
  on a GPU beside a busy event loop), ``vllm.VLLMBackend`` (vLLM OpenAI-compatible servers, LoRA
  hot-loading) and ``vllm.VLLMServer`` (start/stop a local server).
* ``chat``: chat-template rendering and per-trajectory token bookkeeping (``ChatTokens``).
* ``llm.LLMAgent`` (trainable, token-level), ``scripted.ScriptedAgent`` / ``scripted.RandomAgent``,
  ``openai_chat.OpenAIChatAgent`` (API models with native tool calling, evaluation only).
* ``tiny``: tiny random-init Qwen2 models with a trained byte-level BPE tokenizer; ``models``:
  loading tokenizers and models by local path or hub id (``"tiny"`` builds a tiny one).

Heavy modules (torch, transformers, httpx, openai) load only when their classes are used.
"""

from turngym.agents.backend import Backend, BackendError, Generation, SamplingParams
from turngym.agents.base import Agent, AgentSession, AgentStep, ContextFull
from turngym.agents.chat import ChatFormat, ChatTokens, TokenMismatch
from turngym.agents.llm import LLMAgent
from turngym.agents.scripted import AgentError, RandomAgent, ScriptedAgent

_LAZY = {
    "HFBackend": "turngym.agents.hf",
    "HFSlotBackend": "turngym.agents.hf",
    "HFProcessBackend": "turngym.agents.hf",
    "VLLMBackend": "turngym.agents.vllm",
    "VLLMServer": "turngym.agents.vllm",
    "OpenAIChatAgent": "turngym.agents.openai_chat",
    "TinyConfig": "turngym.agents.tiny",
    "tiny_model_path": "turngym.agents.tiny",
    "load_tokenizer": "turngym.agents.models",
    "load_model": "turngym.agents.models",
    "resolve_model": "turngym.agents.models",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'turngym.agents' has no attribute {name!r}")


__all__ = [
    "Agent",
    "AgentError",
    "AgentSession",
    "AgentStep",
    "Backend",
    "BackendError",
    "ChatFormat",
    "ChatTokens",
    "ContextFull",
    "Generation",
    "LLMAgent",
    "RandomAgent",
    "SamplingParams",
    "ScriptedAgent",
    "TokenMismatch",
    *_LAZY,
]

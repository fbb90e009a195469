"""One typed description of "what generates the actions", and one place that builds it.

    spec = AgentSpec(kind="hf", model="smollm2-135m", max_batch_size=32, temperature=0.7)
    async with AsyncExitStack() as stack:
        agent = await make_agent(spec, stack)  # backends and servers close with the stack

Kinds (``agent_kinds()``; add one with ``@agent_kind("name")``):

* ``scripted``: the env's own expert (``ScriptedAgent``); ``random``: random tool calls
  (``RandomAgent``, ``seed``);
* ``openai``: an OpenAI-compatible chat API (``model``, ``base_url``), messages in and out;
* ``hf``: transformers in this process (``hf_engine``: ``auto``/``continuous``/``slots``,
  ``turngym.agents.hf.registry``), ``hf_worker``: the same in a worker process with its own GIL;
* ``vllm``: vLLM servers at ``urls``, or one started for ``model`` when there are none.

The token-level kinds (``hf``, ``hf_worker``, ``vllm``) wrap their backend in an ``LLMAgent``
(``max_tokens``, ``temperature``, ``top_p``, ``max_context``). ``make_token_backend`` builds just the
backend, from a spec or around a model object the caller already holds (the trainer's policy).
The CLI's ``rollout``/``eval`` and the trainer build through here.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, field_validator, model_validator

log = logging.getLogger(__name__)

AgentBuilder = Callable[["AgentSpec", AsyncExitStack], Awaitable[Any]]
_KINDS: dict[str, AgentBuilder] = {}
NEEDS_MODEL = {"openai", "hf", "hf_worker", "vllm"}


def agent_kind(name: str) -> Callable[[AgentBuilder], AgentBuilder]:
    """Register an async builder ``(spec, stack) -> agent`` under ``name``; it pushes whatever must
    close (backends, servers) onto ``stack``."""

    def register(fn: AgentBuilder) -> AgentBuilder:
        _KINDS[name] = fn
        return fn

    return register


def agent_kinds() -> list[str]:
    return sorted(_KINDS)


class AgentSpec(BaseModel):
    """What generates the actions: the kind and its settings (see the module doc)."""

    model_config = ConfigDict(extra="forbid")

    kind: str = "hf"
    model: str | None = None  # a registered name (turngym models), a path or a hub id
    urls: list[str] = []  # vllm: server URLs (none: start a local server for ``model``)
    base_url: str | None = None  # openai: the API's base URL
    dtype: str = "auto"
    hf_engine: Literal["auto", "continuous", "slots"] = "auto"
    # hf: torch.compile the slots engine's decode step (turngym.agents.hf.registry.COMPILE_SETTINGS:
    # default, max-autotune-no-cudagraphs, dynamic; true = default); None: off
    hf_compile: bool | str | None = None
    max_batch_size: int = 64  # hf: rows generated together
    max_context: int = 4096  # tokens per trajectory (prompt + every turn)
    max_tokens: int = 256  # per turn
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0  # random: its RNG

    @field_validator("kind")
    @classmethod
    def _known(cls, kind: str) -> str:
        if kind not in _KINDS:
            raise ValueError(f"unknown agent kind {kind!r}; registered: {', '.join(agent_kinds())}")
        return kind

    @field_validator("hf_compile")
    @classmethod
    def _compile_setting(cls, value: bool | str | None) -> str | None:
        from turngym.agents.hf.registry import compile_setting

        return compile_setting(value)

    @model_validator(mode="after")
    def _needs_model(self) -> AgentSpec:
        if self.kind in NEEDS_MODEL and not self.model:
            raise ValueError(f"agent kind {self.kind!r} needs a model (a name, path or hub id)")
        if self.max_batch_size < 1 or self.max_context < 1 or self.max_tokens < 1:
            raise ValueError("max_batch_size, max_context and max_tokens must be >= 1")
        return self

    @property
    def torch_dtype(self) -> str | None:
        return None if self.dtype == "auto" else self.dtype


async def make_agent(spec: AgentSpec, stack: AsyncExitStack) -> Any:
    """The agent ``spec`` describes; what it opens closes with ``stack``."""
    return await _KINDS[spec.kind](spec, stack)


def make_token_backend(
    spec: AgentSpec,
    *,
    model: Any = None,
    tokenizer: Any = None,
    max_wait_ms: float | None = None,
    **engine_options: Any,
) -> Any:
    """The token-level backend of an ``hf``/``hf_worker`` spec (``model``: a model object to serve
    instead of loading ``spec.model``, only in-process; ``max_wait_ms``: how long an idle HF
    scheduler gathers a first batch; ``engine_options``: further settings of the HF engine's
    constructor, e.g. ``device``, ``fuse_tokens``, ``reuse_prefix``), or of a ``vllm`` spec with ``urls``."""
    if spec.kind == "vllm":
        if engine_options:
            raise ValueError(f"engine options are for hf kinds: {', '.join(engine_options)}")
        if not spec.urls:
            raise ValueError("make_token_backend needs vllm urls; make_agent starts a server")
        from turngym.agents.vllm import VLLMBackend

        return VLLMBackend(spec.urls)
    if spec.kind not in ("hf", "hf_worker"):
        raise ValueError(f"agent kind {spec.kind!r} has no token-level backend")
    source = model if model is not None else spec.model
    # what both HF kinds take from the spec (the worker builds the same engine in its process)
    kwargs: dict[str, Any] = {
        "engine": spec.hf_engine,
        "max_context": spec.max_context,
        "compile": spec.hf_compile,
        "max_batch_size": spec.max_batch_size,
        **engine_options,
    }
    if model is None:  # a model object keeps its own dtype
        kwargs["dtype"] = spec.torch_dtype
    if max_wait_ms is not None:
        kwargs["max_wait_ms"] = max_wait_ms
    if spec.kind == "hf_worker":
        if model is not None:
            raise ValueError(
                "hf_worker loads the model in its worker: give a name or path, not a model object"
            )
        from turngym.agents.hf.worker import HFProcessBackend

        return HFProcessBackend(source, tokenizer, **kwargs)
    from turngym.agents.hf.registry import make_hf_backend

    return make_hf_backend(source, tokenizer, **kwargs)


@agent_kind("scripted")
async def _scripted(spec: AgentSpec, stack: AsyncExitStack) -> Any:
    from turngym.agents import ScriptedAgent

    return ScriptedAgent()


@agent_kind("random")
async def _random(spec: AgentSpec, stack: AsyncExitStack) -> Any:
    from turngym.agents import RandomAgent

    return RandomAgent(seed=spec.seed)


@agent_kind("openai")
async def _openai(spec: AgentSpec, stack: AsyncExitStack) -> Any:
    from turngym.agents.openai_chat import OpenAIChatAgent

    return OpenAIChatAgent(
        spec.model, base_url=spec.base_url, temperature=spec.temperature, max_tokens=spec.max_tokens
    )


async def _llm_agent(spec: AgentSpec, backend: Any, tokenizer: Any, stack: AsyncExitStack) -> Any:
    from turngym.agents import LLMAgent, SamplingParams

    stack.push_async_callback(backend.aclose)
    sampling = SamplingParams(max_tokens=spec.max_tokens, temperature=spec.temperature, top_p=spec.top_p)
    return LLMAgent(backend, tokenizer, sampling, max_context=spec.max_context)


@agent_kind("hf")
@agent_kind("hf_worker")
async def _hf(spec: AgentSpec, stack: AsyncExitStack) -> Any:
    from turngym.agents.models import load_tokenizer

    tokenizer = load_tokenizer(spec.model)
    return await _llm_agent(spec, make_token_backend(spec, tokenizer=tokenizer), tokenizer, stack)


@agent_kind("vllm")
async def _vllm(spec: AgentSpec, stack: AsyncExitStack) -> Any:
    from turngym.agents.models import load_tokenizer
    from turngym.agents.vllm import VLLMBackend, VLLMServer

    tokenizer = load_tokenizer(spec.model)
    urls = spec.urls
    if not urls:
        server = VLLMServer(spec.model, max_model_len=spec.max_context, dtype=spec.dtype, enable_lora=False)
        log.warning("starting a vLLM server for %s (log: %s) ...", spec.model, server.log_path)
        await asyncio.to_thread(server.start)
        stack.callback(server.stop)
        urls = [server.url]
    return await _llm_agent(spec, VLLMBackend(urls), tokenizer, stack)

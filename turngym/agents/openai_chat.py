"""``OpenAIChatAgent``: evaluate chat-API models with native tool calling (not trainable).

    agent = OpenAIChatAgent("gpt-4o-mini")                       # OPENAI_API_KEY from the environment
    agent = OpenAIChatAgent("tiny", base_url=server.url + "/v1")  # any OpenAI-compatible server
    agent = OpenAIChatAgent(..., tool_choice="required")          # or "none", or a tool's name
    engine = RolloutEngine("arith", agent, env_kwargs={"tools_in_prompt": False})

The env's tools go to the API as ``tools`` (``ToolSpec.to_openai()``), so the env must be made
with ``tools_in_prompt=False``. Tool calls come back structured and are passed to the env as a
``Message`` with ``tool_calls``; arguments that are not valid JSON become an empty argument object
(the env then reports the missing arguments) and the raw text is kept in the step's ``info``.
``tool_choice`` is passed through: ``"auto"`` (default), ``"required"`` (the model must call a
tool), ``"none"``, or a tool's name (that tool must be called; checked against the env's tools).
vLLM serves ``required`` and named calls with guided decoding (``--enable-auto-tool-choice
--tool-call-parser hermes``), so even a weak model returns a well-formed call envelope;
``strict_tools=True`` marks every tool ``strict`` (OpenAI's strict function calling), which makes
vLLM constrain the arguments to the tool's JSON schema too. Error observations
without a ``tool_call_id`` are sent as user messages. Trajectories carry
text only (no token ids). API failures raise ``BackendError``.
"""

from __future__ import annotations

import json
from typing import Any

from turngym.agents.backend import BackendError
from turngym.agents.base import AgentStep, TextSession
from turngym.core.types import Message, ToolCall


class OpenAIChatAgent:
    name = "openai"

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        temperature: float = 0.0,
        max_tokens: int = 1024,
        timeout: float = 120.0,
        max_retries: int = 3,
        extra_body: dict[str, Any] | None = None,
        tool_choice: str = "auto",
        strict_tools: bool = False,
        client: Any = None,
    ):
        self.model = model
        self.tool_choice = tool_choice
        self.strict_tools = strict_tools
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.extra_body = extra_body
        if client is None:
            from openai import AsyncOpenAI

            client = AsyncOpenAI(
                base_url=base_url, api_key=api_key or _env_key(), timeout=timeout, max_retries=max_retries
            )
        self.client = client

    def start(self, env: Any, prompt: list[Message], *, seed: int | None, route: str) -> _ChatSession:
        base = getattr(env, "unwrapped", env)
        if getattr(base, "tools_in_prompt", False):
            raise ValueError("OpenAIChatAgent passes tools natively: make the env with tools_in_prompt=False")
        names = [t.name for t in base.tools]
        if self.tool_choice not in ("auto", "required", "none") and self.tool_choice not in names:
            raise ValueError(f"tool_choice {self.tool_choice!r} is not one of this env's tools {names}")
        tools = [t.to_openai() for t in base.tools]
        if self.strict_tools:
            for t in tools:
                t["function"]["strict"] = True
        return _ChatSession(self, prompt, tools, seed)

    async def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], seed: int | None):
        import openai

        kwargs: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
        }
        if tools:
            kwargs["tools"] = tools
            choice = self.tool_choice
            if choice not in ("auto", "required", "none"):
                choice = {"type": "function", "function": {"name": choice}}
            kwargs["tool_choice"] = choice
        if seed is not None:
            kwargs["seed"] = seed
        if self.extra_body:
            kwargs["extra_body"] = self.extra_body
        try:
            return await self.client.chat.completions.create(**kwargs)
        except openai.OpenAIError as e:
            raise BackendError(f"{type(e).__name__}: {e}") from e


class _ChatSession(TextSession):
    def __init__(self, agent: OpenAIChatAgent, prompt: list[Message], tools: list[dict[str, Any]], seed):
        super().__init__(prompt)
        self.agent, self.tools, self.seed = agent, tools, seed

    async def act(self) -> AgentStep:
        resp = await self.agent.complete(to_openai_messages(self.messages), self.tools, self.seed)
        try:
            choice = resp.choices[0]
            msg = choice.message
        except (AttributeError, IndexError) as e:
            raise BackendError(f"malformed chat completion: {resp!r}"[:300]) from e
        calls, bad = [], {}
        for i, tc in enumerate(msg.tool_calls or []):
            raw = tc.function.arguments or ""
            try:
                args = json.loads(raw) if raw.strip() else {}
                if not isinstance(args, dict):
                    raise ValueError("arguments must be a JSON object")
            except ValueError as e:
                args, bad[tc.id or str(i)] = {}, f"{e}: {raw[:500]}"
            calls.append(ToolCall(id=tc.id or f"call_{i}", name=tc.function.name, arguments=args))
        action = Message(role="assistant", content=msg.content or "", tool_calls=calls)
        usage = getattr(resp, "usage", None)
        info: dict[str, Any] = {"completion_tokens": getattr(usage, "completion_tokens", None)}
        if bad:
            info["bad_arguments"] = bad
        return AgentStep(action, choice.finish_reason, info=info)


def to_openai_messages(messages: list[Message]) -> list[dict[str, Any]]:
    """Chat dicts for the API; tool messages without a call id become user messages.

    Images travel as ``image_url`` content parts with PNG data URLs. The API accepts images in
    user messages only, so the images of a tool or system message follow it in a user message.
    """
    out = []
    for m in messages:
        d = m.to_chat()
        if m.role == "tool" and not m.tool_call_id:
            d = {"role": "user", "content": m.content}
        if d["role"] == "tool":
            d.pop("name", None)
        if m.images and d["role"] == "user":
            d["content"] = [{"type": "text", "text": d["content"]}, *_image_parts(m.images)]
            out.append(d)
            continue
        out.append(d)
        if m.images:
            note = f"(image{'s' if len(m.images) > 1 else ''} from the {m.role} message above)"
            out.append({"role": "user", "content": [{"type": "text", "text": note}, *_image_parts(m.images)]})
    return out


def _image_parts(images: list[bytes]) -> list[dict[str, Any]]:
    import base64

    return [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(img).decode()}}
        for img in images
    ]


def _env_key() -> str:
    import os

    return os.environ.get("OPENAI_API_KEY", "EMPTY")

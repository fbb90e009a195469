"""A turngym env as a ``verifiers`` (v1, verifiers >= 0.4) taskset and environment.

    from turngym.interop.verifiers import evaluate, load_environment
    env = load_environment(env_id="arith", num_tasks=8, env_kwargs={"depth": 2})
    episodes = asyncio.run(evaluate(env_id="arith", model="my-model", base_url="http://127.0.0.1:8000/v1"))

verifiers 0.4 builds an environment from a *taskset* (config in, tasks out), an ``Env`` whose ``run(task,
agents)`` plays one episode, and a *harness* that runs the model. This module supplies all three, the way
verifiers' own TextArena and OpenEnv tasksets wrap a stepped engine:

* :class:`TurngymTaskset`: one task per seed; the task's prompt is the turngym env's first messages after
  ``reset(seed)`` (system prompt with the env's tool instructions, and the user turn); the task data keeps
  the env id, seed, env arguments and turngym ``task_id``.
* :class:`TurngymEnv`: the turngym env plays the model's user. Each model reply is one ``env.step`` (the
  env parses its tool calls with its own parser, so a malformed call, an unknown tool or bad arguments come
  back as turngym's error observation, exactly as in turngym's own rollouts); the step's observation is the
  next user turn (tool results as ``<tool_response>`` blocks; after a reply with structured tool calls,
  as ``tool`` messages answering each call id); the episode ends when the env terminates or truncates it. Rewards land on the trace: ``turngym_return`` (weight 1, the episode's return) and one
  ``turngym/<component>`` per reward component (weight 0: reported, not summed); ``trace.info`` keeps
  ``turngym_task_id``, ``turngym_steps``, ``turngym_done``, ``turngym_invalid_actions``. An env that raises
  mid-episode fails the episode (verifiers records the error on the episode; no reward is recorded).
* :class:`TurngymChatHarness`: a tool-less chat loop run in-process (no program to install): one chat
  completion per segment, sent through verifiers' interception endpoint, so the trace records every call.

``load_environment(env_id=...)`` builds the environment in Python; the taskset is also importable by
verifiers' plugin loader under the id ``turngym_verifiers`` once this module is imported (verifiers resolves
plugin ids to top-level module names). :func:`evaluate` runs verifiers' own eval loop (``run_eval``).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import verifiers.v1 as vf
from pydantic import Field

from turngym.core.registry import registry
from turngym.core.types import Message as TgMessage

#: The plugin id verifiers' loaders resolve to this module (registered in ``sys.modules`` below).
TASKSET_ID = "turngym_verifiers"


# ------------------------------------------------------------------------------ taskset
class TurngymTasksetConfig(vf.TasksetConfig):
    env_id: str = "arith"
    """The turngym env id (``turngym list`` shows them)."""
    seeds: list[int] | None = None
    """The seeds to reset the env on, one task each; default ``range(first_seed, first_seed + num_tasks)``."""
    num_tasks: int = Field(8, ge=1)
    first_seed: int = 0
    env_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Constructor arguments for ``turngym.make`` (e.g. ``{"depth": 2, "max_turns": 6}``)."""


class TurngymData(vf.TaskData):
    env_id: str
    seed: int
    env_kwargs: dict[str, Any] = Field(default_factory=dict)
    turngym_task_id: str


class TurngymTask(vf.Task[TurngymData, vf.State, vf.TaskConfig]):
    @property
    def key(self) -> str:
        return f"{self.data.env_id}:{self.data.seed}:{self.data.turngym_task_id}"


def _split_prompt(messages: list[TgMessage]) -> tuple[str | None, str | list[dict[str, str]]]:
    system = "\n\n".join(m.content for m in messages if m.role == "system") or None
    rest = [m for m in messages if m.role != "system"]
    if len(rest) == 1 and rest[0].role == "user":
        return system, rest[0].content
    return system, [{"role": m.role, "content": m.content} for m in rest]


class TurngymTaskset(vf.Taskset[TurngymTask, TurngymTasksetConfig]):
    def load(self) -> Iterator[TurngymTask]:
        config = self.config
        seeds = (
            config.seeds
            if config.seeds is not None
            else range(config.first_seed, config.first_seed + config.num_tasks)
        )
        env = registry.make(config.env_id, **config.env_kwargs)  # an unknown id raises UnknownEnvError here
        try:
            for seed in seeds:
                obs, info = env.reset(seed=int(seed))
                system, prompt = _split_prompt(obs)
                yield TurngymTask(
                    TurngymData(
                        name=f"{config.env_id}#{seed}",
                        id=info["task_id"],
                        prompt=prompt,
                        system_prompt=system,
                        env_id=config.env_id,
                        seed=int(seed),
                        env_kwargs=dict(config.env_kwargs),
                        turngym_task_id=info["task_id"],
                    ),
                    config.task,
                )
        finally:
            env.close()


# ------------------------------------------------------------------------------ harness
class TurngymChatHarnessConfig(vf.HarnessConfig):
    max_tokens: int | None = None
    """``max_tokens`` of each chat completion (None: the server's default)."""
    request_timeout: float = 600.0


class TurngymChatHarness(vf.Harness[TurngymChatHarnessConfig]):
    """One chat completion per segment, in-process, through the rollout's interception endpoint."""

    APPENDS_SYSTEM_PROMPT = True
    SUPPORTS_RESUME = True
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def launch(
        self,
        ctx: Any,
        trace: Any,
        runtime: Any,
        endpoint: str,
        secret: str,
        mcp_urls: dict[str, str],
        data: vf.TaskData,
        tool_interception_url: str | None = None,
    ) -> vf.ProgramResult:
        import httpx
        from verifiers.v1.dialects.chat import message_to_wire

        system, prompt = self.resolve_prompt(data)
        messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
        if isinstance(prompt, str):
            messages.append({"role": "user", "content": prompt})
        else:
            messages += [m if isinstance(m, dict) else message_to_wire(m) for m in prompt or []]
        body: dict[str, Any] = {"model": ctx.model, "messages": messages}
        if self.config.max_tokens is not None:
            body["max_tokens"] = self.config.max_tokens
        async with httpx.AsyncClient(
            timeout=httpx.Timeout(self.config.request_timeout, connect=10.0)
        ) as http:
            try:
                resp = await http.post(
                    endpoint.rstrip("/") + "/chat/completions",
                    json=body,
                    headers={"Authorization": f"Bearer {secret}"},
                )
            except httpx.HTTPError as e:
                return vf.ProgramResult(exit_code=1, stdout="", stderr=f"model request failed: {e!r}")
        if resp.status_code != 200:
            return vf.ProgramResult(
                exit_code=1, stdout="", stderr=f"model request: HTTP {resp.status_code}: {resp.text[:2000]}"
            )
        return vf.ProgramResult(exit_code=0, stdout="", stderr="")


# ---------------------------------------------------------------------------------- env
class TurngymEnvConfig(vf.EnvConfig):
    player: vf.AgentConfig = vf.AgentConfig()


def observation_text(obs: list[TgMessage]) -> str:
    """A step's observation as one user turn: tool results in ``<tool_response>`` blocks (the Hermes
    convention chat templates use for tool results), other messages as their text."""
    parts = []
    for m in obs:
        if m.role == "tool":
            parts.append(f"<tool_response>\n{m.content}\n</tool_response>")
        elif m.content:
            parts.append(m.content)
    return "\n".join(parts) or "(no observation)"


def observation_messages(obs: list[TgMessage]) -> list[dict[str, Any]]:
    """A step's observation after a reply with structured (native) tool calls: each tool result as a
    ``tool`` message answering its call id (what chat APIs require after ``tool_calls``), anything else
    (an error with no call id, an extra observation) as one user message."""
    out: list[dict[str, Any]] = []
    rest = []
    for m in obs:
        if m.role == "tool" and m.tool_call_id:
            out.append({"role": "tool", "tool_call_id": m.tool_call_id, "content": m.content})
        else:
            rest.append(m)
    if rest or not out:
        out.append({"role": "user", "content": observation_text(rest)})
    return out


class TurngymEnv(vf.Env[TurngymEnvConfig]):
    """The turngym env plays the user: each model reply is one ``step``; its observation is the next turn."""

    async def run(self, task: TurngymTask, agents: Any) -> None:
        data = task.data
        env = registry.make(data.env_id, **data.env_kwargs)
        total, steps, invalid, done = 0.0, 0, 0, False
        components: dict[str, float] = {}
        try:
            _, info = await env.areset(seed=data.seed)
            if info["task_id"] != data.turngym_task_id:
                raise vf.TaskError(
                    f"{data.env_id}: seed {data.seed} now gives task {info['task_id']!r}, not the taskset's "
                    f"{data.turngym_task_id!r}; rebuild the taskset with the same env arguments"
                )
            async with agents.player.interaction(task) as interaction:
                segment = await interaction.turn()
                while not segment.terminated:
                    action = _reply_message(segment)
                    obs, reward, terminated, truncated, info = await env.astep(action)
                    steps += 1
                    total += float(reward)
                    invalid += bool(info.get("invalid_action"))
                    for key, value in info.get("reward_components", {}).items():
                        components[key] = components.get(key, 0.0) + float(value)
                    if terminated or truncated:
                        done = True
                        break
                    turn = observation_messages(obs) if action.tool_calls else observation_text(obs)
                    segment = await interaction.turn(turn)
        finally:
            await env.aclose()
        trace = interaction.trace
        trace.record_reward("turngym_return", total, 1.0)
        for key, value in sorted(components.items()):
            trace.record_reward(f"turngym/{key}", value, 0.0)
        trace.info["turngym_task_id"] = data.turngym_task_id
        trace.info["turngym_steps"] = steps
        trace.info["turngym_done"] = done
        trace.info["turngym_invalid_actions"] = invalid


def _reply_message(segment: Any) -> TgMessage:
    """The segment's final assistant message as a turngym action (text, plus structured tool calls if the
    server returned any: the env's parser reads either)."""
    from turngym.core.types import ToolCall

    for message in reversed(segment.messages):
        if isinstance(message, vf.AssistantMessage):
            calls = []
            for call in getattr(message, "tool_calls", None) or []:
                args = _json_args(call.arguments)
                calls.append(ToolCall(id=call.id, name=call.name, arguments=args))
            return TgMessage(role="assistant", content=message.content or "", tool_calls=calls)
    return TgMessage(role="assistant", content=segment.last_reply)


def _json_args(arguments: Any) -> dict[str, Any]:
    import json

    if isinstance(arguments, dict):
        return arguments
    try:
        value = json.loads(arguments or "{}")
    except (TypeError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


# ------------------------------------------------------------------------------- entry points
def load_environment(
    env_id: str = "arith",
    *,
    num_tasks: int = 8,
    seeds: list[int] | None = None,
    env_kwargs: dict[str, Any] | None = None,
    max_tokens: int | None = None,
    **env_config: Any,
) -> TurngymEnv:
    """The verifiers environment for turngym env ``env_id`` (an unknown id raises ``UnknownEnvError``)."""
    registry.spec(env_id)  # fail early, with close matches, on an unknown id
    config = env_config_for(
        env_id, num_tasks=num_tasks, seeds=seeds, env_kwargs=env_kwargs, max_tokens=max_tokens
    )
    if env_config:
        config = config.model_copy(update=env_config)
    return TurngymEnv(config)


def env_config_for(
    env_id: str,
    *,
    num_tasks: int = 8,
    seeds: list[int] | None = None,
    env_kwargs: dict[str, Any] | None = None,
    max_tokens: int | None = None,
) -> TurngymEnvConfig:
    """The ``EnvConfig`` naming this taskset and harness for ``env_id`` (what verifiers' ``EvalConfig`` takes)."""
    taskset = TurngymTasksetConfig(
        id=TASKSET_ID, env_id=env_id, num_tasks=num_tasks, seeds=seeds, env_kwargs=dict(env_kwargs or {})
    )
    harness = TurngymChatHarnessConfig(id=TASKSET_ID, max_tokens=max_tokens)
    # the harness runs in-process and needs no sandbox: a local runtime keeps the interception on localhost
    player = vf.AgentConfig(harness=harness, runtime=vf.SubprocessConfig())
    return TurngymEnvConfig(taskset=taskset, player=player)


async def evaluate(
    env_id: str,
    *,
    model: str,
    base_url: str,
    api_key_var: str = "OPENAI_API_KEY",
    num_tasks: int = 8,
    seeds: list[int] | None = None,
    env_kwargs: dict[str, Any] | None = None,
    num_rollouts: int = 1,
    max_tokens: int | None = None,
    output_dir: str = "outputs",
    max_concurrent: int | None = 8,
) -> list[Any]:
    """Run verifiers' eval loop (``run_eval``) on ``env_id`` against an OpenAI-compatible server; returns
    verifiers' ``Episode`` list (each trace's ``rewards`` holds ``turngym_return`` and the components).
    Nothing is pushed to a platform; traces are written under ``output_dir`` as verifiers does."""
    from verifiers.v1.cli.eval.runner import run_eval
    from verifiers.v1.configs.cli.eval import EvalConfig

    config = EvalConfig(
        env=env_config_for(
            env_id, num_tasks=num_tasks, seeds=seeds, env_kwargs=env_kwargs, max_tokens=max_tokens
        ),
        model=model,
        client=vf.EvalClientConfig(base_url=base_url, api_key_var=api_key_var),
        num_rollouts=num_rollouts,
        push=False,
        rich=None,
        output_dir=output_dir,
        max_concurrent=max_concurrent,
    )
    return await run_eval(config)


__all__ = ["TurngymChatHarness", "TurngymEnv", "TurngymTaskset"]

sys.modules.setdefault(TASKSET_ID, sys.modules[__name__])

"""``mcp``: answer a task with tools that live in MCP servers (stdio commands or streamable-HTTP URLs).

    env = turngym.make("mcp", servers=[{"name": "kb", "command": "python", "args": ["kb_server.py"]}],
                       tasks="tasks.jsonl")

Tools: every tool the servers list (through the official ``mcp`` SDK), plus the env's own terminal
``answer(text)``. Each MCP tool's input schema becomes a ``ToolSpec`` (``turngym.envs.mcp.schema``); a tool
whose schema turngym cannot express is dropped with a warning (``info["mcp_dropped_tools"]``) or refused
with ``on_unsupported_schema="error"``. A tool name used by two servers is exposed as ``<server>__<tool>``.

Calls are validated against the tool's schema, then routed to the owning server with its ``timeout``;
errors, timeouts and long outputs become observations and never end the episode. A server that dies
mid-episode ends it with no reward and ``info["masked"]``, so the rollout engine masks the trajectory.

Servers: ``lifecycle="shared"`` (the default; read-only tools) connect once per process and config;
``"per_episode"`` (stateful tools) start at every ``reset``. Tasks (``turngym.envs.mcp.tasks``): a JSONL/JSON
file or a list (``prompt``, ``answer``(s), optional ``metadata`` and expert ``solution``); without servers
and tasks the env runs ``turngym.envs.mcp.demo_server``.

Reward (last turn): ``<metric> + format`` with the metric ``em`` (default), ``f1`` or ``contains``; per
turn an optional ``invalid`` penalty. The family's pairwise judge is ``turngym.envs.mcp.judge``. Not
forkable: the servers hold state outside the process. docs/envs/mcp.md has the details.
"""

from __future__ import annotations

import asyncio
import base64
import json
import sys
import warnings
from collections.abc import Callable
from typing import Any, Literal

import numpy as np

from turngym.core.env import INVALID_KINDS, Task, pick_task_index
from turngym.core.spaces import ActionSpace
from turngym.core.types import Message, ToolResult, ToolSpec
from turngym.envs.mcp.client import McpConnection, ServerLost, acquire_shared, release_shared
from turngym.envs.mcp.config import ServerConfig, load_servers
from turngym.envs.mcp.schema import ArgumentValidator, UnsupportedSchema, sanitize_name, to_tool_spec
from turngym.envs.mcp.tasks import McpTask, load_tasks
from turngym.envs.search.metrics import best_exact_match, best_f1, contains_answer
from turngym.tools import BadArguments, BoundTool, ToolBox, ToolDef, ToolError, ToolOutput, tool
from turngym.tools.env import Env

SYSTEM_PROMPT = (
    "You solve the user's task with the tools below, which are provided by MCP servers. Call tools as "
    "often as you need, then call answer with a short final answer."
)

#: answer metrics by name: ``(prediction, golds) -> score``; add one with ``ANSWER_METRICS[name] = fn``
ANSWER_METRICS: dict[str, Callable[[str, list[str]], float]] = {
    "em": best_exact_match,
    "f1": best_f1,
    "contains": lambda prediction, golds: float(contains_answer(prediction, golds)),
}
RESERVED_NAMES = frozenset({"answer"})


class McpToolDef(ToolDef):
    """A tool defined by an MCP server: its spec, a JSON-Schema argument validator, an async caller."""

    def __init__(
        self,
        spec: ToolSpec,
        fn: Callable[..., Any],
        timeout: float,
        server: str,
        remote_name: str,
    ):
        self._define(fn, spec.name, spec.description, terminal=False, timeout=timeout)
        self.spec = spec
        self.server = server
        self.remote_name = remote_name
        self._validator = ArgumentValidator(spec.parameters)

    def validate(self, arguments: dict[str, Any]) -> dict[str, Any]:
        return self._validator(arguments)

    def __repr__(self) -> str:
        return f"McpToolDef({self.name!r} -> {self.server}/{self.remote_name})"


def default_servers() -> list[ServerConfig]:
    """The demo server over stdio (``turngym.envs.mcp.demo_server``, run as a script)."""
    from turngym.envs.mcp import demo_server

    # by file path, not ``-m``: the SDK starts stdio servers with a minimal environment (no PYTHONPATH)
    return [ServerConfig(name="demo", command=sys.executable, args=[str(demo_server.__file__)])]


class McpEnv(Env):
    """Tools from MCP servers plus ``answer(text)``; tasks from a dataset; answer-metric reward."""

    default_max_turns = 8
    forkable = False
    _not_forkable_reason = (
        "its tools live in MCP servers (other processes or hosts) whose state a copy of the env cannot branch"
    )

    def __init__(
        self,
        servers: Any = None,
        tasks: str | list[Any] | None = None,
        *,
        reward: str = "em",
        format_penalty: float = 0.1,
        invalid_penalty: float = 0.0,
        on_unsupported_schema: Literal["drop", "error"] = "drop",
        system_prompt: str = SYSTEM_PROMPT,
        **kwargs: Any,
    ):
        if reward not in ANSWER_METRICS:
            raise ValueError(f"reward must be one of {sorted(ANSWER_METRICS)}, got {reward!r}")
        if on_unsupported_schema not in ("drop", "error"):
            raise ValueError(
                f"on_unsupported_schema must be 'drop' or 'error', got {on_unsupported_schema!r}"
            )
        if servers is None and tasks is not None:
            raise ValueError("tasks were given without servers: pass servers= (configs or a JSON file)")
        super().__init__(**kwargs)
        if servers is None:
            from turngym.envs.mcp.demo_server import DEMO_TASKS

            self.servers = default_servers()
            self.tasks = load_tasks(list(DEMO_TASKS))
        else:
            self.servers = load_servers(servers)
            if tasks is None:
                raise ValueError(
                    "servers were given without tasks: pass tasks= (a JSONL/JSON file or a list)"
                )
            self.tasks = load_tasks(tasks)
        self._task_index = {t.id: i for i, t in enumerate(self.tasks)}
        self.reward_metric = reward
        self.format_penalty = float(format_penalty)
        self.invalid_penalty = float(invalid_penalty)
        self.on_unsupported_schema = on_unsupported_schema
        self.system_prompt = system_prompt
        self._timeout = self.toolbox.timeout
        self._max_output_chars = self.toolbox.max_output_chars

        self.current: McpTask | None = None
        self._answer: str | None = None
        self._lost: str | None = None
        self.dropped_tools: list[str] = []
        self._routes: dict[tuple[str, str], str] = {}  # (server, remote name) -> exposed name
        self._shared: dict[str, McpConnection] = {}
        self._episode: dict[str, McpConnection] = {}
        try:
            for config in self.servers:
                if config.lifecycle == "shared":
                    self._shared[config.name] = acquire_shared(config)
            self._install_tools()
        except BaseException:
            self._release_all()
            raise

    # ------------------------------------------------------------------ tools
    @tool(terminal=True)
    def answer(self, text: str) -> str:
        """Give the final answer; ends the episode.

        Args:
            text: the answer, as short as possible
        """
        self._answer = text.strip()[:10_000]
        return "Answer submitted."

    def _connection(self, server: str) -> McpConnection | None:
        return self._shared.get(server) or self._episode.get(server)

    def _install_tools(self) -> None:
        """Rebuild the toolbox: ``answer`` plus every listed tool of the connected servers."""
        listed: list[tuple[ServerConfig, Any]] = []
        for config in self.servers:
            conn = self._connection(config.name)
            if conn is None:
                continue
            for t in conn.tools:
                if config.include is None or t.name in config.include:
                    listed.append((config, t))
        counts: dict[str, int] = {}
        for _, t in listed:
            counts[sanitize_name(t.name)] = counts.get(sanitize_name(t.name), 0) + 1
        box = ToolBox.from_object(self, timeout=self._timeout, max_output_chars=self._max_output_chars)
        routes: dict[tuple[str, str], str] = {}
        dropped: list[str] = []
        for config, t in listed:
            name = sanitize_name(t.name)
            if config.prefix or counts[name] > 1 or name in RESERVED_NAMES or name != t.name:
                name = sanitize_name(f"{config.name}__{t.name}")
            try:
                spec = to_tool_spec(name, t.description, t.input_schema, tool=f"{config.name}/{t.name}")
            except UnsupportedSchema as e:
                if self.on_unsupported_schema == "error":
                    raise
                dropped.append(str(e))
                continue
            if name in box:
                dropped.append(f"tool {config.name}/{t.name!r}: exposed name {name!r} is already taken")
                continue
            definition = McpToolDef(
                spec, self._caller(config, t.name, name), config.timeout, config.name, t.name
            )
            box.add(BoundTool(definition))
            routes[(config.name, t.name)] = name
        for message in dropped:
            if message not in self.dropped_tools:
                warnings.warn(f"mcp env: dropped {message}", stacklevel=2)
        self.dropped_tools = dropped
        self.toolbox = box
        self.action_space = ActionSpace(box.specs)
        self._routes = routes

    def _caller(self, config: ServerConfig, remote: str, exposed: str) -> Callable[..., Any]:
        async def call(**arguments: Any) -> Any:
            return await self._call(config, remote, exposed, arguments)

        return call

    async def _call(self, config: ServerConfig, remote: str, exposed: str, arguments: dict[str, Any]) -> Any:
        conn = self._connection(config.name)
        if conn is None:
            return self._server_lost(exposed, f"MCP server {config.name!r} is not running")
        try:
            result = await conn.call(remote, arguments, config.timeout)
        except BadArguments as e:  # refused before it was sent: this call only, the connection is fine
            return ToolResult(name=exposed, ok=False, error_kind="bad_arguments", error=str(e))
        except ServerLost as e:
            return self._server_lost(exposed, str(e))
        except TimeoutError as e:
            raise TimeoutError(f"MCP server {config.name!r}: {e}") from e
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - a protocol error: the server refused the request
            raise ToolError(f"MCP server {config.name!r} refused the call: {getattr(e, 'message', e)}") from e
        text, images = _content(result)
        if result.is_error:
            raise ToolError(text or f"{exposed!r} failed (the server gave no message)")
        return ToolOutput(text=text, images=images)

    def _server_lost(self, exposed: str, reason: str) -> ToolResult:
        self._lost = self._lost or reason
        self.end_episode()
        return ToolResult(
            name=exposed, ok=False, error_kind="server_lost", error=f"{reason}; the episode ends here"
        )

    # ------------------------------------------------------------------ hooks
    async def _reset(self, rng: np.random.Generator, options: dict[str, Any]) -> Task:
        await self._stop_episode_servers()
        self._lost = None
        self._answer = None
        for name, conn in list(self._shared.items()):  # a shared server that died meanwhile: reconnect
            if not conn.alive or not await conn.ping():
                config = conn.config
                del self._shared[name]
                await asyncio.to_thread(release_shared, conn)
                self._shared[name] = await asyncio.to_thread(acquire_shared, config)
        per_episode = [c for c in self.servers if c.lifecycle == "per_episode"]
        if per_episode:
            for c in per_episode:  # registered before they start, so close() stops them whatever happens
                self._episode[c.name] = McpConnection(c)
            starts = [asyncio.to_thread(self._episode[c.name].start) for c in per_episode]
            outcomes = await asyncio.gather(*starts, return_exceptions=True)
            errors = [o for o in outcomes if isinstance(o, BaseException)]
            if errors:
                await self._stop_episode_servers()
                raise errors[0]
        self._install_tools()

        index = pick_task_index(options, self._task_index, len(self.tasks), rng)
        self.current = task = self.tasks[index]
        system = f"{self.system_prompt}\n\n{self.tool_instructions()}".strip()
        return Task(
            messages=[Message(role="system", content=system), Message(role="user", content=task.prompt)],
            task_id=task.id,
            reference={"answers": list(task.answers)},
            info={
                "metadata": dict(task.metadata),
                "mcp_servers": [c.name for c in self.servers],
                "mcp_dropped_tools": list(self.dropped_tools),
            },
        )

    def _turn_reward(self, results: list[ToolResult], done: bool) -> dict[str, float]:
        if self._lost is not None:  # an infrastructure fault: no reward at all (the episode is masked)
            return {}
        components: dict[str, float] = {}
        if self.invalid_penalty:
            bad = sum(1 for r in results if not r.ok and r.error_kind in INVALID_KINDS)
            components["invalid"] = -self.invalid_penalty * bad
        if not done:
            return components
        assert self.current is not None
        golds = self.current.answers
        if self._answer is None:
            components.update({name: 0.0 for name in ANSWER_METRICS})
            components["format"] = -self.format_penalty
            return components
        components.update({name: float(fn(self._answer, golds)) for name, fn in ANSWER_METRICS.items()})
        components["format"] = 0.0
        return components

    def _reward(self, components: dict[str, float]) -> float:
        """Only the chosen metric is paid, plus ``format`` and ``invalid`` (see the module docstring)."""
        return (
            components.get(self.reward_metric, 0.0)
            + components.get("format", 0.0)
            + components.get("invalid", 0.0)
        )

    def _step_info(self) -> dict[str, Any]:
        info: dict[str, Any] = {}
        if self._answer is not None:
            info["answer"] = self._answer
        if self._lost is not None:
            info["masked"] = True
            info["mask_reason"] = f"mcp server lost: {self._lost}"
        return info

    async def _close(self) -> None:
        await self._stop_episode_servers()
        shared, self._shared = list(self._shared.values()), {}
        await asyncio.gather(*(asyncio.to_thread(release_shared, c) for c in shared))

    async def _stop_episode_servers(self) -> None:
        episode, self._episode = list(self._episode.values()), {}
        await asyncio.gather(*(asyncio.to_thread(c.stop) for c in episode))

    def _release_all(self) -> None:
        for conn in self._episode.values():
            conn.stop()
        for conn in self._shared.values():
            release_shared(conn)
        self._episode, self._shared = {}, {}

    # ------------------------------------------------------------- experts
    def expert_action(self) -> str | Message | None:
        """Replay the task's ``solution`` (one call a turn), then answer with the first reference answer."""
        task = self.current
        if task is None or self._done or not task.answers:
            return None
        if self.turn < len(task.solution):
            step = task.solution[self.turn]
            return self.format_call(self._exposed(step.name, step.server), step.arguments)
        return self.format_call("answer", {"text": task.answers[0]})

    def _exposed(self, name: str, server: str | None) -> str:
        if server is not None:
            return self._routes.get((server, name), name)
        if name in self.toolbox:
            return name
        matches = [exposed for (_, remote), exposed in self._routes.items() if remote == name]
        return matches[0] if len(matches) == 1 else name

    @property
    def last_answer(self) -> str | None:
        return self._answer


def _content(result: Any) -> tuple[str, list[bytes]]:
    """The text of a ``CallToolResult`` (text blocks joined; others described) and its PNG images."""
    parts: list[str] = []
    images: list[bytes] = []
    for block in result.content or []:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        elif kind == "image":
            mime = getattr(block, "mime_type", None) or getattr(block, "mimeType", "")
            if mime == "image/png":
                images.append(base64.b64decode(block.data))
            else:
                parts.append(f"[image {mime}, not shown]")
        elif kind == "resource":
            resource = block.resource
            parts.append(getattr(resource, "text", None) or f"[resource {resource.uri}]")
        elif kind == "resource_link":
            parts.append(f"[resource {block.uri}]")
        else:
            parts.append(f"[{kind or 'unknown'} content, not shown]")
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False, default=str))
    return "\n".join(parts), images

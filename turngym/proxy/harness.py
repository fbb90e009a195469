"""Run an unmodified harness G times per task against a running proxy and collect its episodes.

    trajs = await run_harness(
        "python my_agent.py --base-url {base_url} --api-key {api_key} --task {task}",
        tasks=["3", "4"], proxy_url=running.url, api_key=running.token, group_size=4,
        concurrency=16, timeout_s=300,
    )

Each run gets its own episode key (``<prefix>-t<task>-g<sample>``), opened on the proxy with the
task, group and sample first. The command template's fields (each shell-quoted): ``{base_url}`` (the
episode's OpenAI base URL), ``{api_key}``, ``{task}``, ``{mcp_url}`` (the episode's env tools, when
the proxy serves an env), ``{episode}``. The same values are in the child's environment
(``OPENAI_BASE_URL``, ``OPENAI_API_KEY``, ``TURNGYM_TASK``, ``TURNGYM_MCP_URL``, ``TURNGYM_EPISODE``),
so a harness that reads the usual OpenAI variables needs no flags at all.

Every run gives one trajectory, never an exception: a harness that exits non-zero is masked
``harness_crashed`` (exit code and the last line of its stderr), one that runs past ``timeout_s``
is killed with its process group and masked ``harness_timeout``, one that exits cleanly but whose
reward (posted, the env's, or the proxy's reward function) has not come ``reward_timeout_s`` later
is masked ``no_reward``. The harness's exit code, wall time and stderr tail are in
``trajectory.metadata["harness"]``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import signal
import string
import time
import uuid
from collections.abc import Sequence
from typing import Any

import httpx

from turngym.core.types import Trajectory


async def run_harness(
    command: str,
    tasks: Sequence[str],
    *,
    proxy_url: str,
    api_key: str | None,
    group_size: int = 1,
    concurrency: int = 8,
    timeout_s: float = 300.0,
    reward_timeout_s: float = 30.0,
    mcp: bool = False,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
    prefix: str | None = None,
) -> list[Trajectory]:
    """One trajectory per (task, sample), in task-major order (see the module docstring)."""
    if group_size < 1 or concurrency < 1 or timeout_s <= 0:
        raise ValueError("group_size and concurrency must be >= 1, timeout_s > 0")
    check_template(command)
    prefix = prefix or f"h{uuid.uuid4().hex[:8]}"
    gate = asyncio.Semaphore(concurrency)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with httpx.AsyncClient(base_url=proxy_url, headers=headers, timeout=60) as http:

        async def one(ti: int, task: str, g: int) -> Trajectory:
            key = f"{prefix}-t{ti}-g{g}"
            async with gate:
                return await _run_one(
                    http, command, key, task, group=f"{prefix}-t{ti}", sample=g, proxy_url=proxy_url,
                    api_key=api_key, timeout_s=timeout_s, reward_timeout_s=reward_timeout_s, mcp=mcp,
                    env=env, cwd=cwd,
                )  # fmt: skip

        runs = [one(ti, task, g) for ti, task in enumerate(tasks) for g in range(group_size)]
        return list(await asyncio.gather(*runs))


async def _run_one(
    http: httpx.AsyncClient,
    command: str,
    key: str,
    task: str,
    *,
    group: str,
    sample: int,
    proxy_url: str,
    api_key: str | None,
    timeout_s: float,
    reward_timeout_s: float,
    mcp: bool,
    env: dict[str, str] | None,
    cwd: str | None,
) -> Trajectory:
    (
        await http.post(f"/v1/episodes/{key}", json={"task_id": task, "group": group, "sample": sample})
    ).raise_for_status()
    values = {
        "base_url": f"{proxy_url}/v1/episodes/{key}",
        "api_key": api_key or "none",
        "task": task,
        "mcp_url": f"{proxy_url}/v1/episodes/{key}/mcp" if mcp else "",
        "episode": key,
    }
    cmd = command.format(**{k: shlex.quote(v) for k, v in values.items()})
    child_env = {
        **os.environ,
        **(env or {}),
        "OPENAI_BASE_URL": values["base_url"],
        "OPENAI_API_KEY": values["api_key"],
        "TURNGYM_TASK": task,
        "TURNGYM_MCP_URL": values["mcp_url"],
        "TURNGYM_EPISODE": key,
    }
    t0 = time.monotonic()
    proc = await asyncio.create_subprocess_shell(
        cmd,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,  # its own process group: a timeout kills the harness and its children
        env=child_env,
        cwd=cwd,
    )
    mask = ""
    try:
        _, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError:
        _kill(proc)
        _, err = await proc.communicate()
        mask = f"harness_timeout: the harness ran past {timeout_s:g}s and was killed"
    rc = proc.returncode
    tail = err.decode(errors="replace").strip().splitlines()[-20:]
    if not mask and rc != 0:
        last = tail[-1] if tail else "(no stderr)"
        mask = f"harness_crashed: exit code {rc}: {last[:300]}"
    await http.post(f"/v1/episodes/{key}/end", json={"mask": mask})  # 409 if the harness ended it
    deadline = time.monotonic() + reward_timeout_s
    status = (await http.get(f"/v1/episodes/{key}")).json()
    while status.get("status") != "finished" and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
        status = (await http.get(f"/v1/episodes/{key}")).json()
    if status.get("status") != "finished":
        why = f"no_reward: no reward within {reward_timeout_s:g}s of the harness's exit"
        await http.post(f"/v1/episodes/{key}/end", json={"mask": why})
        status = (await http.get(f"/v1/episodes/{key}")).json()
    traj = Trajectory.model_validate(status["trajectory"])
    if mask and not traj.masked:  # the harness posted its reward, then crashed or hung
        traj.masked, traj.mask_reason = True, mask
    traj.metadata["harness"] = {"exit_code": rc, "wall_s": time.monotonic() - t0, "stderr_tail": tail}
    return traj


FIELDS = ("base_url", "api_key", "task", "mcp_url", "episode")


def check_template(command: str) -> None:
    """Refuse a command template with a field other than ``FIELDS`` (literal braces are ``{{``/``}}``)."""
    try:
        names = {name for _, name, _, _ in string.Formatter().parse(command) if name is not None}
    except ValueError as e:
        raise ValueError(f"the harness command is not a valid template: {e}") from None
    unknown = names - set(FIELDS)
    if unknown:
        raise ValueError(
            f"unknown field(s) {sorted(unknown)} in the harness command; fields: {', '.join(FIELDS)} "
            "(write a literal brace as {{ or }})"
        )


def _kill(proc: Any) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)

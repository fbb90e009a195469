"""CLI: ``turngym play ENV``: a person plays an env by typing tool calls, or watches its scripted expert
or a model (through the rollout engine) play it."""

from __future__ import annotations

import ast
import json
from typing import Annotated, Any

import typer
from rich.panel import Panel

from turngym.cli_args import CLIError, KwOption, console, make_env, parse_key_values
from turngym.core.types import Message, ToolCall
from turngym.tools.parsers import get_parser


def parse_typed_call(line: str, tools: list[Any], parser: Any = None) -> str | Message:
    """A person's call -> the action the env's ``parser`` reads (``parser.format_call``; default
    the Hermes convention).

    Accepts ``name(arg=value, ...)`` (Python literals), ``name value ...`` for a
    single-argument tool, a bare ``name``, a JSON object ``{"name": ..., "arguments": {...}}``, or
    raw text starting with ``<`` (sent as is).
    """
    render = (parser or get_parser()).format_call
    line = line.strip()
    if not line or line.startswith("<"):
        return line
    if line.startswith("{"):
        try:
            call = json.loads(line)
            return render(ToolCall(name=call["name"], arguments=call.get("arguments") or {}))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            raise CLIError(
                f'cannot read {line!r}: write {{"name": ..., "arguments": {{...}}}} ({e})'
            ) from None
    by_name = {t.name: t for t in tools}
    head, _, rest = line.partition(" ")
    if head in by_name and not head.endswith(")") and "(" not in head:
        params = list(by_name[head].parameters.get("properties", {}))
        args: dict[str, Any] = {}
        if rest.strip():
            if not params:
                raise CLIError(f"{head} takes no arguments")
            args[params[0]] = _literal(rest.strip())
        return render(ToolCall(name=head, arguments=args))
    try:
        node = ast.parse(line, mode="eval").body
    except SyntaxError as e:
        raise CLIError(f"cannot read {line!r}: {e.msg}") from None
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise CLIError(f"cannot read {line!r}: write name(arg=value, ...)")
    name = node.func.id
    params = list(by_name[name].parameters.get("properties", {})) if name in by_name else []
    args = {}
    for i, a in enumerate(node.args):
        if i >= len(params):
            raise CLIError(f"too many positional arguments for {name}")
        args[params[i]] = ast.literal_eval(a)
    for k in node.keywords:
        if k.arg is None:
            raise CLIError("**kwargs are not supported")
        args[k.arg] = ast.literal_eval(k.value)
    return render(ToolCall(name=name, arguments=args))


def _literal(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _show_messages(messages: list[Any], title: str) -> None:
    for m in messages:
        head = m.role + (f" · {m.name}" if m.name else "")
        body = m.content if len(m.content) < 4000 else m.content[:4000] + f"\n… ({len(m.content)} chars)"
        extra = f"\n[dim]<{len(m.images)} image(s)>[/dim]" if m.images else ""
        console.print(Panel(body + extra, title=f"{title}: {head}", title_align="left", expand=True))


def play_command(
    env_id: Annotated[str, typer.Argument(help="Environment id.")] = "search-qa",
    seed: Annotated[int, typer.Option(help="Task seed.")] = 0,
    expert: Annotated[bool, typer.Option("--expert", help="Let the scripted expert play.")] = False,
    episodes: Annotated[
        int, typer.Option("-n", "--episodes", help="Episodes to play (seed, seed+1, ...).")
    ] = 1,
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            help="Watch a model play (greedy, transformers backend): a pretrained name (turngym models), "
            "a folder or a hub id.",
        ),
    ] = None,
    max_tokens: Annotated[int, typer.Option("--max-tokens", help="With --model: tokens per turn.")] = 256,
    kw: KwOption = None,
) -> None:
    """Play an environment in the terminal by typing tool calls (or watch its scripted expert or a model).

    Type ``name(arg=value)``, ``name value``, a JSON call, or raw model text starting with
    ``<``. ``:expert`` takes the expert's action, ``:tools`` lists tools, ``:quit`` leaves.
    """
    if model is not None:
        _watch_model(env_id, model, seed, episodes, max_tokens, parse_key_values(kw or []))
        return
    env = make_env(env_id, kw)
    solved = 0
    try:
        for ep in range(episodes):
            obs, info = env.reset(seed=seed + ep)
            console.rule(f"{env_id} · task {info.get('task_id', '')} · seed {seed + ep}")
            _show_messages(obs, "obs")
            total, done = 0.0, False
            while not done:
                if expert:
                    action = env.expert_action()
                    if action is None:
                        raise CLIError(f"{env_id} has no scripted expert")
                    console.print(f"[cyan]expert>[/cyan] {action}")
                else:
                    action = _prompt_action(env)
                    if action is None:
                        console.print("bye")
                        return
                obs, reward, terminated, truncated, info = env.step(action)
                total += reward
                done = terminated or truncated
                _show_messages(obs, f"turn {info['turn']}")
                comps = ", ".join(f"{k}={v:g}" for k, v in info["reward_components"].items())
                status = "terminated" if terminated else "truncated" if truncated else "running"
                console.print(
                    f"[bold]reward[/bold] {reward:g} ({comps or '-'})  total {total:g}  [dim]{status}"
                    + ("  invalid action" if info["invalid_action"] else "")
                    + "[/dim]"
                )
            solved += int(total > 0)
        console.print(f"[bold green]{solved}/{episodes} episodes with positive return[/bold green]")
    finally:
        env.close()


def _watch_model(env_id: str, model: str, seed: int, episodes: int, max_tokens: int, kwargs: dict) -> None:
    """Episodes played by a model through the rollout engine, shown turn by turn."""
    import asyncio
    from contextlib import AsyncExitStack

    from turngym.agents.factory import AgentSpec, make_agent
    from turngym.rollout.engine import RolloutConfig, RolloutEngine

    spec = AgentSpec(kind="hf", model=model, max_tokens=max_tokens, temperature=0.0)

    async def run() -> list[Any]:
        async with AsyncExitStack() as stack:
            agent = await make_agent(spec, stack)
            engine = RolloutEngine(env_id, agent, RolloutConfig(group_size=1), env_kwargs=kwargs)
            return await engine.run(list(range(seed, seed + episodes)))

    solved = 0
    for traj in asyncio.run(run()):
        console.rule(f"{env_id} · task {traj.task_id} · seed {traj.seed} · {model}")
        _show_messages(traj.prompt, "obs")
        for turn in traj.turns:
            console.print(f"[cyan]model>[/cyan] {turn.action.content}", highlight=False)
            _show_messages(turn.observation, f"turn {turn.index}")
            comps = ", ".join(f"{k}={v:g}" for k, v in turn.reward_components.items())
            flag = "  invalid action" if turn.invalid_action else ""
            console.print(f"[bold]reward[/bold] {turn.reward:g} ({comps or '-'})[dim]{flag}[/dim]")
        if traj.masked:
            console.print(f"[red]masked: {traj.mask_reason}: {traj.metadata.get('error', '')[:300]}[/red]")
        solved += int(not traj.masked and traj.total_reward > 0)
        console.print(f"return {traj.total_reward:g}, {traj.num_turns} turns")
    console.print(f"[bold green]{solved}/{episodes} episodes with positive return[/bold green]")


def _prompt_action(env: Any) -> str | Message | None:
    while True:
        try:
            line = console.input("[bold cyan]you>[/bold cyan] ")
        except EOFError:
            return None
        line = line.strip()
        if line in (":quit", ":q", "exit"):
            return None
        if line == ":tools":
            for t in env.tools:
                console.print(f"  {t.name}{json.dumps(t.parameters.get('properties', {}))} — {t.description}")
            continue
        if line == ":expert":
            action = env.expert_action()
            if action is None:
                console.print("[yellow]no expert for this env[/yellow]")
                continue
            console.print(f"[dim]{action}[/dim]")
            return action
        try:
            return parse_typed_call(line, env.tools, env.parser)
        except (CLIError, ValueError) as e:
            console.print(f"[red]{e}[/red]")

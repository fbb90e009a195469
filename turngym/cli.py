"""The ``turngym`` command line (typer + rich).

Core commands live here (``envs``, ``info``, ``play``, ``check``); the other commands live
beside the code they drive (``turngym/<area>/commands.py``) and are attached below.
Errors print as one line on stderr with a non-zero exit code.
"""

from __future__ import annotations

import ast
import importlib
import json
import sys
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.panel import Panel
from rich.table import Table

from turngym.cli_args import parse_key_values

app = typer.Typer(
    name="turngym",
    help="Multi-turn RL for LLM agents: environments, rollouts, training.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()
err_console = Console(stderr=True)


class CLIError(Exception):
    """An expected failure: printed as one line, exit code 2."""


# --------------------------------------------------------------------------- envs / info
@app.command("envs")
def envs_command(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
    all_versions: Annotated[
        bool, typer.Option("--all", help="List every version, not just the latest.")
    ] = False,
) -> None:
    """List the registered environments."""
    from turngym.core.registry import registry

    specs = [registry[i] for i in registry] if all_versions else registry.latest()
    if as_json:
        rows = [
            {
                "id": s.id,
                "name": s.name,
                "version": s.version,
                "family": s.family,
                "entry_point": s.entry_point if isinstance(s.entry_point, str) else repr(s.entry_point),
                "defaults": s.kwargs,
                "requires": list(s.requires),
                "source": s.source,
                "description": s.description,
            }
            for s in specs
        ]
        print(json.dumps(rows, indent=2, default=str))
        return
    table = Table(title="turngym environments")
    for col in ("id", "family", "requires", "description"):
        table.add_column(col, overflow="fold")
    for s in specs:
        table.add_row(s.id, s.family, ",".join(s.requires) or "-", s.description)
    console.print(table)
    for name, error in registry.plugin_errors.items():
        err_console.print(f"[yellow]plugin {name!r} failed to load: {error}[/yellow]")


def _make(env_id: str, kwargs: list[str] | None) -> Any:
    from turngym.core.registry import make

    return make(env_id, **parse_key_values(kwargs or []))


KwOption = Annotated[
    list[str] | None,
    typer.Option("--env-arg", help="Env constructor argument KEY=VALUE (JSON value); repeatable."),
]


@app.command("info")
def info_command(env_id: str, kw: KwOption = None) -> None:
    """Show an environment's tools, spaces and defaults."""
    from turngym.core.registry import spec as get_spec

    s = get_spec(env_id)
    env = _make(env_id, kw)
    try:
        console.print(Panel.fit(f"[bold]{s.id}[/bold]  ({s.family})\n{s.description}", title="env"))
        meta = Table(show_header=False)
        meta.add_row("entry point", str(s.entry_point))
        meta.add_row("defaults", json.dumps(s.kwargs, default=str))
        meta.add_row("max turns", str(env.max_turns))
        meta.add_row("parser", env.parser.name)
        meta.add_row("observation space", repr(env.observation_space))
        meta.add_row("action space", repr(env.action_space))
        console.print(meta)
        tools = Table(title="tools")
        tools.add_column("name")
        tools.add_column("terminal")
        tools.add_column("arguments", overflow="fold")
        tools.add_column("description", overflow="fold")
        for t in env.tools:
            props = t.parameters.get("properties", {})
            required = set(t.parameters.get("required", []))
            args = ", ".join(
                f"{k}{'' if k in required else '?'}: {v.get('type', 'any')}" for k, v in props.items()
            )
            tools.add_row(t.name, "yes" if t.terminal else "", args, t.description)
        console.print(tools)
    finally:
        env.close()


# --------------------------------------------------------------------------------- play
def parse_typed_call(line: str, tools: list[Any]) -> str:
    """A person's call -> a Hermes tool-call action.

    Accepts ``name(arg=value, ...)`` (Python literals), ``name value ...`` for a
    single-argument tool, a bare ``name``, a JSON object, or raw text starting with ``<``
    (sent as is).
    """
    line = line.strip()
    if not line or line.startswith("<"):
        return line
    if line.startswith("{"):
        return f"<tool_call>{line}</tool_call>"
    by_name = {t.name: t for t in tools}
    head, _, rest = line.partition(" ")
    if head in by_name and not head.endswith(")") and "(" not in head:
        params = list(by_name[head].parameters.get("properties", {}))
        args: dict[str, Any] = {}
        if rest.strip():
            if not params:
                raise CLIError(f"{head} takes no arguments")
            args[params[0]] = _literal(rest.strip())
        return f"<tool_call>{json.dumps({'name': head, 'arguments': args})}</tool_call>"
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
    return f"<tool_call>{json.dumps({'name': name, 'arguments': args})}</tool_call>"


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


@app.command("play")
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
    env = _make(env_id, kw)
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

    from turngym.agents import LLMAgent, SamplingParams
    from turngym.agents.hf import HFBackend
    from turngym.agents.models import load_tokenizer
    from turngym.rollout.engine import RolloutConfig, RolloutEngine

    tokenizer = load_tokenizer(model)
    backend = HFBackend(model, tokenizer)
    agent = LLMAgent(backend, tokenizer, SamplingParams(max_tokens=max_tokens, temperature=0.0))
    engine = RolloutEngine(env_id, agent, RolloutConfig(group_size=1), env_kwargs=kwargs)

    async def run() -> list[Any]:
        try:
            return await engine.run(list(range(seed, seed + episodes)))
        finally:
            await backend.aclose()

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


def _prompt_action(env: Any) -> str | None:
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
            return parse_typed_call(line, env.tools)
        except (CLIError, ValueError) as e:
            console.print(f"[red]{e}[/red]")


# -------------------------------------------------------------------------------- check
@app.command("check")
def check_command(
    targets: Annotated[
        list[str] | None,
        typer.Argument(
            help="Env ids, or paths of Python files/packages defining envs (default: all registered)."
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    kw: KwOption = None,
) -> None:
    """Run the conformance suite on environments; exit code 1 if any check fails."""
    from pathlib import Path

    from turngym.core.registry import registry
    from turngym.sdk.check_path import load_envs_from_path
    from turngym.testing import check_env

    envs: list[Any] = []
    for target in targets or [s.id for s in registry.latest()]:
        envs.extend(load_envs_from_path(target) if Path(target).exists() else [target])
    reports = [check_env(e, **(parse_key_values(kw or []) if isinstance(e, str) else {})) for e in envs]
    if as_json:
        print(json.dumps([r.to_dict() for r in reports], indent=2))
    else:
        for r in reports:
            table = Table(title=f"{r.env_id}: {'PASS' if r.ok else 'FAIL'}", title_justify="left")
            table.add_column("check")
            table.add_column("result")
            table.add_column("detail", overflow="fold")
            for c in r.results:
                table.add_row(
                    c.name, "[green]ok[/green]" if c.passed else "[red]FAIL[/red]", c.detail.strip()[:800]
                )
            console.print(table)
    if not all(r.ok for r in reports):
        raise typer.Exit(1)


# ------------------------------------------------------------- commands from other areas
#: (command name, module, function). Modules stay light at import; heavy work happens inside.
EXTERNAL_COMMANDS: list[tuple[str, str, str]] = [
    ("new", "turngym.sdk.commands", "new_command"),
    ("view", "turngym.viewer.commands", "view_command"),
    ("rollout", "turngym.rollout.commands", "rollout"),
    ("eval", "turngym.rollout.commands", "eval"),
    ("train", "turngym.trainer.commands", "train"),
    ("sft", "turngym.trainer.commands", "sft"),
    ("models", "turngym.agents.commands", "models_command"),
    ("serve", "turngym.remote.commands", "serve_command"),
]
#: group -> (help, [(command name, module, function)])
EXTERNAL_GROUPS: dict[str, tuple[str, list[tuple[str, str, str]]]] = {
    "sandbox": (
        "Docker sandboxes and browsers: build images, list and reap leftovers.",
        [
            ("build", "turngym.envs.swe.commands", "sandbox_build"),
            ("ls", "turngym.sandboxes.commands", "sandbox_ls"),
            ("prune", "turngym.sandboxes.commands", "sandbox_prune"),
            ("browser-reap", "turngym.envs.web.commands", "browser_reap"),
        ],
    ),
    "search": (
        "search-qa: synthetic worlds, BM25 indexes and the /retrieve server.",
        [
            ("generate", "turngym.envs.search.commands", "search_generate"),
            ("index", "turngym.envs.search.commands", "search_index"),
            ("serve", "turngym.envs.search.commands", "search_serve"),
            ("query", "turngym.envs.search.commands", "search_query"),
        ],
    ),
    "swe": (
        "swe-docker: synthesise and validate bug-fix tasks from real packages.",
        [
            ("synth", "turngym.envs.swe.commands", "swe_synth"),
            ("validate", "turngym.envs.swe.commands", "swe_validate"),
        ],
    ),
    "travel": (
        "travel-planner: build the sandbox database, sample queries, evaluate plans.",
        [
            ("build-db", "turngym.envs.travel.commands", "travel_build_db"),
            ("sample", "turngym.envs.travel.commands", "travel_sample"),
            ("eval", "turngym.envs.travel.commands", "travel_eval"),
        ],
    ),
    "web": (
        "web families: MiniWoB++ task list, local sites (web-shop, web-arena-lite).",
        [
            ("miniwob-tasks", "turngym.envs.web.commands", "miniwob_tasks"),
            ("shop-build", "turngym.envs.webshop.commands", "webshop_build"),
            ("serve", "turngym.envs.webshop.commands", "web_site_serve"),
            ("arena-tasks", "turngym.envs.webshop.commands", "webarena_tasks"),
        ],
    ),
}


def _attach_external() -> None:
    for name, module, attr in EXTERNAL_COMMANDS:
        app.command(name)(getattr(importlib.import_module(module), attr))
    for group, (help_text, commands) in EXTERNAL_GROUPS.items():
        sub = typer.Typer(help=help_text, no_args_is_help=True)
        for name, module, attr in commands:
            sub.command(name)(getattr(importlib.import_module(module), attr))
        app.add_typer(sub, name=group)


_attach_external()


def main(argv: list[str] | None = None) -> None:
    from turngym.core.registry import UnknownEnvError

    try:
        app(args=argv, standalone_mode=True)
    except (CLIError, UnknownEnvError, ImportError, ValueError, FileNotFoundError) as e:
        err_console.print(f"[red]error:[/red] {e}", highlight=False, soft_wrap=True)
        sys.exit(2)


if __name__ == "__main__":
    main()

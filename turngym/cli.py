"""The ``turngym`` command line (typer + rich).

Every command lives beside the code it drives (``turngym/<area>/commands.py``, ``play`` in
``turngym/rollout/play.py``) and is attached below, lazily: modules stay light at import.
Errors print as one line on stderr with a non-zero exit code.
"""

from __future__ import annotations

import sys

import typer

from turngym.cli_args import CLIError, console, err_console  # noqa: F401 - re-exported
from turngym.core.plugins import load_object
from turngym.rollout.play import parse_typed_call  # noqa: F401 - re-exported

app = typer.Typer(
    name="turngym",
    help="Multi-turn RL for LLM agents: environments, rollouts, training.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

#: command -> "module:function" (a command of a group: "group command"). Modules stay light at
#: import; heavy work happens inside.
COMMANDS: dict[str, str] = {
    "envs": "turngym.core.commands:envs_command",
    "info": "turngym.core.commands:info_command",
    "play": "turngym.rollout.play:play_command",
    "check": "turngym.sdk.commands:check_command",
    "new": "turngym.sdk.commands:new_command",
    "view": "turngym.viewer.commands:view_command",
    "rollout": "turngym.rollout.commands:rollout",
    "eval": "turngym.rollout.commands:eval",
    "train": "turngym.trainer.commands:train",
    "sft": "turngym.trainer.commands:sft",
    "models": "turngym.agents.commands:models_command",
    "serve": "turngym.remote.commands:serve_command",
    "proxy": "turngym.proxy.commands:proxy_command",
    "credit audit": "turngym.trainer.audit.commands:audit_command",
    "sandbox build": "turngym.envs.swe.commands:sandbox_build",
    "sandbox ls": "turngym.sandboxes.commands:sandbox_ls",
    "sandbox prune": "turngym.sandboxes.commands:sandbox_prune",
    "sandbox browser-reap": "turngym.envs.web.commands:browser_reap",
    "search generate": "turngym.envs.search.commands:search_generate",
    "search index": "turngym.envs.search.commands:search_index",
    "search serve": "turngym.envs.search.commands:search_serve",
    "search query": "turngym.envs.search.commands:search_query",
    "swe synth": "turngym.envs.swe.commands:swe_synth",
    "swe validate": "turngym.envs.swe.commands:swe_validate",
    "swe import-swebench": "turngym.envs.swe.commands:swe_import_swebench",
    "travel build-db": "turngym.envs.travel.commands:travel_build_db",
    "travel sample": "turngym.envs.travel.commands:travel_sample",
    "travel eval": "turngym.envs.travel.commands:travel_eval",
    "web miniwob-tasks": "turngym.envs.web.commands:miniwob_tasks",
    "web shop-build": "turngym.envs.webshop.commands:webshop_build",
    "web serve": "turngym.envs.browser.sites.commands:web_site_serve",
    "web arena-tasks": "turngym.envs.webarena.commands:webarena_tasks",
}
#: group -> its help
GROUPS: dict[str, str] = {
    "credit": "Credit assignment: audit every method against ground-truth turn advantages from forked envs.",
    "sandbox": "Docker sandboxes and browsers: build images, list and reap leftovers.",
    "search": "search-qa: synthetic worlds, BM25 indexes and the /retrieve server.",
    "swe": "swe-docker: synthesise, import (SWE-bench, Harbor) and validate bug-fix tasks.",
    "travel": "travel-planner: build the sandbox database, sample queries, evaluate plans.",
    "web": "web families: MiniWoB++ task list, local sites (web-shop, web-arena-lite).",
}


def _attach_external() -> None:
    groups = {group: typer.Typer(help=text, no_args_is_help=True) for group, text in GROUPS.items()}
    for path, ref in COMMANDS.items():
        group, _, name = path.rpartition(" ")
        (groups[group] if group else app).command(name)(load_object(ref, f"command {path!r}"))
    for group, sub in groups.items():
        app.add_typer(sub, name=group)


_attach_external()


def main(argv: list[str] | None = None) -> None:
    from rich.markup import escape

    from turngym.core.registry import UnknownEnvError

    try:
        app(args=argv, standalone_mode=True)
    except (CLIError, UnknownEnvError, ImportError, ValueError, FileNotFoundError) as e:
        err_console.print(f"[red]error:[/red] {escape(str(e))}", highlight=False, soft_wrap=True)
        sys.exit(2)


if __name__ == "__main__":
    main()

"""The CLI command functions of the web-site envs."""

from __future__ import annotations

import json

import typer
from typer.testing import CliRunner

from turngym.envs.webshop import commands


def _app() -> typer.Typer:
    app = typer.Typer()
    app.command()(commands.webshop_build)
    app.command()(commands.webarena_tasks)
    app.command()(commands.web_site_serve)
    return app


def test_build_and_tasks_commands(tmp_path, monkeypatch):
    monkeypatch.setenv("TURNGYM_CACHE", str(tmp_path / "cache"))
    r = CliRunner().invoke(_app(), ["webshop-build", "--size", "60", "--seed", "2"])
    assert r.exit_code == 0 and "60 products" in r.output
    assert list((tmp_path / "cache" / "webshop").glob("catalog-*-s2-n60.sqlite"))
    out = tmp_path / "tasks.json"
    r = CliRunner().invoke(_app(), ["webarena-tasks", str(out), "--per-template", "1"])
    assert r.exit_code == 0 and "18 tasks" in r.output
    assert len(json.loads(out.read_text())) == 18


def test_serve_rejects_unknown_site():
    r = CliRunner().invoke(_app(), ["web-site-serve", "shopping_admin", "--port", "0"])
    assert r.exit_code != 0 and "unknown site" in r.output

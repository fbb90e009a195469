"""The CLI command functions of the web-site envs."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from turngym.envs.browser.sites import site_names, start_site
from turngym.envs.browser.sites.commands import web_site_serve
from turngym.envs.webarena.commands import webarena_tasks
from turngym.envs.webshop.commands import webshop_build


def _app() -> typer.Typer:
    app = typer.Typer()
    app.command()(webshop_build)
    app.command()(webarena_tasks)
    app.command()(web_site_serve)
    return app


def test_build_and_tasks_commands(tmp_path, monkeypatch):
    monkeypatch.setenv("TURNGYM_CACHE_DIR", str(tmp_path / "cache"))
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


def test_the_site_registry_starts_each_built_in_site(tmp_path, monkeypatch):
    import httpx

    from turngym.envs.browser.sites import register_site

    monkeypatch.setenv("TURNGYM_CACHE_DIR", str(tmp_path / "cache"))
    assert {"shop", "forum", "tracker"} <= set(site_names())
    for name, text in (("forum", "Forums"), ("tracker", "Projects")):
        server = start_site(name, seed=0)
        try:
            assert text in httpx.get(server.url + "/", timeout=30).text
        finally:
            server.stop()
    # a name is taken once; entry points are module:function
    register_site("forum", "turngym.envs.webarena.sites:serve_site")  # the same again: fine
    with pytest.raises(ValueError, match="already registered"):
        register_site("forum", "somewhere:else")
    with pytest.raises(ValueError, match="module:function"):
        register_site("x", "no-colon")
    with pytest.raises(ValueError, match="unknown site 'nope'"):
        start_site("nope")

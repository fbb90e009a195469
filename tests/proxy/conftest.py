"""Shared fixtures of the proxy tests: a proxy serving the scripted arith expert and the arith env's tools."""

from __future__ import annotations

import pytest

TOKEN = "harness-test-token-0123456789"


@pytest.fixture(scope="module")
def expert_proxy(tokenizer, tmp_path_factory):
    from turngym.proxy import make_proxy, serve_proxy
    from turngym.proxy.scripted import ScriptedBackend, arith_policy

    proxy = make_proxy(
        backend=ScriptedBackend(tokenizer, arith_policy), tokenizer=tokenizer, name="expert",
        out=tmp_path_factory.mktemp("harness-run"),
    )  # fmt: skip
    with serve_proxy(proxy, token=TOKEN, envs=["arith"], env_kwargs={"tools_in_prompt": False}) as r:
        yield r

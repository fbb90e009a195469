"""An OpenAI-compatible proxy in front of turngym's token backends that records token-exact episodes.

An unmodified agent (the ``openai`` SDK, the OpenAI Agents SDK, smolagents, ...) is pointed at the
proxy as its model; each of its calls is served from a turngym backend and recorded: prompt ids,
sampled ids, logprobs, the drift where the harness re-rendered or dropped history; episodes become
turngym trajectories (one turn per call) with their reward. docs/harness.md has the recipe.

* ``wire``: OpenAI request validation (the ``openai`` package's types), errors;
* ``model``: backend + chat template + tool-call parser; ``responses``: OpenAI response objects;
* ``segments``: does a call continue the sequence (token for token) or start a new segment;
* ``episodes``: episodes, rewards, deadlines, trajectories; ``service``: one call end to end;
* ``calls``: the two call routes as bare ASGI; ``server``: the other routes (FastAPI) behind
  ``turngym.remote.security``, and the server; ``api``: ``make_proxy``,
  ``serve_proxy``; ``harness``: run a harness command G times per task and collect its episodes;
* ``commands``: ``turngym proxy``.
"""

from typing import Any

#: the environment variable that holds the proxy's token (its clients' OpenAI API key)
TOKEN_ENV = "TURNGYM_PROXY_TOKEN"

#: the public names and their modules, imported on first use: the CLI registers ``turngym proxy``
#: without importing the server's dependencies (FastAPI, uvicorn, openai), which are an extra
_EXPORTS = {
    "EpisodeStore": "turngym.proxy.episodes",
    "Proxy": "turngym.proxy.service",
    "ProxyModel": "turngym.proxy.model",
    "RunningProxy": "turngym.proxy.api",
    "make_proxy": "turngym.proxy.api",
    "serve_proxy": "turngym.proxy.api",
    "split_segments": "turngym.proxy.episodes",
}

__all__ = ["TOKEN_ENV", *_EXPORTS]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

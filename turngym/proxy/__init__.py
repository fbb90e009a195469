"""An OpenAI-compatible proxy in front of turngym's token backends that records token-exact episodes.

An unmodified agent (the ``openai`` SDK, the OpenAI Agents SDK, smolagents, ...) is pointed at the
proxy as its model; each of its calls is served from a turngym backend and recorded: prompt ids,
sampled ids, logprobs, the drift where the harness re-rendered or dropped history; episodes become
turngym trajectories (one turn per call) with their reward. docs/harness.md has the recipe.

* ``wire``: OpenAI request validation (the ``openai`` package's types), errors;
* ``model``: backend + chat template + tool-call parser; ``responses``: OpenAI response objects;
* ``segments``: does a call continue the sequence (token for token) or start a new segment;
* ``episodes``: episodes, rewards, deadlines, trajectories; ``service``: one call end to end;
* ``server``: the FastAPI routes behind ``turngym.remote.security``; ``api``: ``make_proxy``,
  ``serve_proxy``; ``harness``: run a harness command G times per task and collect its episodes;
* ``commands``: ``turngym proxy``.
"""

from turngym.proxy.api import RunningProxy, make_proxy, serve_proxy
from turngym.proxy.episodes import EpisodeStore, split_segments
from turngym.proxy.model import ProxyModel
from turngym.proxy.service import Proxy

__all__ = [
    "EpisodeStore",
    "Proxy",
    "ProxyModel",
    "RunningProxy",
    "make_proxy",
    "serve_proxy",
    "split_segments",
]

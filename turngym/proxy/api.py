"""The Python API: build a proxy around a model (or a backend you hold) and serve it on loopback.

    from turngym.proxy import make_proxy, serve_proxy

    proxy = make_proxy("tiny", out="runs/harness")          # an hf backend, trajectories to runs/harness
    with serve_proxy(proxy, token=TOKEN) as running:           # 127.0.0.1, a free port
        client = openai.OpenAI(base_url=running.base_url("ep-1"), api_key=TOKEN)
        ...                                                    # the harness calls the model
        running.post_reward("ep-1", 1.0)                       # or a reward_fn, or the env's reward
    trajectories = proxy.store.finished                        # episode key -> Trajectory

``make_proxy`` takes a model name (``turngym.agents.models``: ``tiny``, ``smollm2-135m``, a path or a
hub id; built through ``turngym.agents.factory.make_token_backend``) or ``backend=``/``tokenizer=`` of
one already running (the trainer's). ``serve_proxy`` applies the same guard as ``turngym serve``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from turngym.proxy import TOKEN_ENV
from turngym.proxy.episodes import EpisodeStore, RewardFn
from turngym.proxy.model import ProxyModel
from turngym.proxy.server import ProxyServer, guarded_app
from turngym.proxy.service import Proxy


def make_proxy(
    model: str | None = None,
    *,
    backend: Any = None,
    tokenizer: Any = None,
    name: str | None = None,
    out: str | Path | None = None,
    reward_fn: RewardFn | None = None,
    reward_timeout_s: float = 60.0,
    idle_timeout_s: float = 600.0,
    max_context: int = 4096,
    max_tokens: int = 512,
    parser: str | Any = "hermes",
    env_id: str = "proxy",
    **spec: Any,
) -> Proxy:
    """A ``Proxy`` for ``model`` (or ``backend`` + ``tokenizer``); ``spec``: more ``AgentSpec`` fields
    (``kind``, ``dtype``, ``max_batch_size``, ``hf_engine``...). Trajectories go to ``out`` if given."""
    if backend is None:
        if model is None:
            raise ValueError("give a model (name or path) or a backend and its tokenizer")
        from turngym.agents.factory import AgentSpec, make_token_backend
        from turngym.agents.models import load_tokenizer

        tokenizer = tokenizer or load_tokenizer(model)
        agent_spec = AgentSpec(model=model, max_context=max_context, max_tokens=max_tokens, **spec)
        backend = make_token_backend(agent_spec, tokenizer=tokenizer)
    elif tokenizer is None:
        raise ValueError("a backend needs its tokenizer")
    served = name or (Path(model).name if model else "model")
    writer = None
    if out is not None:
        from turngym.rollout.store import TrajectoryWriter

        writer = TrajectoryWriter(out)
    store = EpisodeStore(
        env_id=env_id,
        model=served,
        writer=writer,
        reward_fn=reward_fn,
        reward_timeout_s=reward_timeout_s,
        idle_timeout_s=idle_timeout_s,
    )
    pm = ProxyModel(
        backend, tokenizer, name=served, max_context=max_context, max_tokens=max_tokens, parser=parser
    )
    return Proxy(pm, store)


@dataclass
class RunningProxy:
    """A served proxy: where it listens and the token to send."""

    proxy: Proxy
    server: ProxyServer
    token: str | None
    envs: Any = None  # the EpisodeSessions serving env tools over MCP, if any

    @property
    def url(self) -> str:
        return self.server.url

    def base_url(self, episode: str | None = None) -> str:
        """The OpenAI ``base_url`` for ``episode`` (its calls are grouped under it)."""
        return f"{self.url}/v1" if episode is None else f"{self.url}/v1/episodes/{episode}"

    def mcp_url(self, episode: str) -> str:
        """The MCP URL of ``episode``'s env tools (only when served with ``envs``)."""
        if self.envs is None:
            raise ValueError("this proxy serves no env: serve_proxy(..., envs=[...])")
        return f"{self.url}/v1/episodes/{episode}/mcp"

    @property
    def api_key(self) -> str:
        return self.token or "none"

    def post_reward(self, episode: str, reward: float, components: dict[str, float] | None = None) -> Any:
        import httpx

        r = httpx.post(
            f"{self.url}/v1/episodes/{episode}/reward",
            json={"reward": reward, "components": components or {}},
            headers={"Authorization": f"Bearer {self.api_key}"},
            timeout=60,
        )
        r.raise_for_status()
        return r.json()


@contextlib.contextmanager
def serve_proxy(
    proxy: Proxy,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    token: str | None = None,
    insecure_no_token: bool = False,
    envs: list[str] | None = None,
    env_kwargs: dict[str, Any] | None = None,
    max_sessions: int = 256,
    **guard_options: Any,
) -> Iterator[RunningProxy]:
    """Serve ``proxy`` in a background thread until the block ends (then live episodes finish, masked
    if they have no reward, and the trajectory file is closed). ``token``: else ``$TURNGYM_PROXY_TOKEN``,
    else a fresh one (``running.token``); ``envs``: env ids whose tools are served over MCP per episode
    (``running.mcp_url(e)``, ``turngym.proxy.envs``); ``guard_options``: ``ServeGuard.for_bind`` options."""
    from turngym.remote.security import ServeGuard, resolve_token

    sessions = None
    if envs:
        from turngym.proxy.envs import EpisodeSessions

        sessions = EpisodeSessions(envs, proxy.store, max_sessions=max_sessions, env_kwargs=env_kwargs)

    token, _ = resolve_token(token, env_var=TOKEN_ENV, insecure_no_token=insecure_no_token, host=host)
    server = ProxyServer(host, port)
    guard = ServeGuard.for_bind(
        host,
        server.port,
        token,
        auth_hint="send the token as the OpenAI API key (Authorization: Bearer <token>)",
        **guard_options,
    )
    try:
        server.start(guarded_app(proxy, guard, envs=sessions))
        yield RunningProxy(proxy, server, token, sessions)
    finally:
        server.stop()
        close_proxy(proxy)


def close_proxy(proxy: Proxy) -> None:
    """Close the trajectory file (writes the parquet copy); the backend stays with its owner."""
    if proxy.store.writer is not None:
        proxy.store.writer.close()


def aclose_backend(proxy: Proxy) -> None:
    aclose = getattr(proxy.model.backend, "aclose", None)
    if aclose is not None:
        asyncio.run(aclose())

"""``VLLMBackend``: token ids in and out of one or more vLLM OpenAI-compatible servers.

    backend = VLLMBackend(["http://127.0.0.1:8000", "http://127.0.0.1:8001"])
    gen = await backend.generate(prompt_ids, SamplingParams(max_tokens=128), route="traj-3")
    await backend.load_lora_adapter("policy", "/ckpt/step-10")      # weight sync (every server)
    gen = await backend.generate(prompt_ids, sampling, adapter="policy")

* Requests go to ``/v1/completions`` with the prompt as token ids, ``logprobs`` and
  ``return_tokens_as_token_ids`` so the sampled ids and their logprobs come back exactly.
* Requests that share a ``route`` (one trajectory) go to the same server (prefix-cache reuse);
  a new route goes to the server with the fewest requests in flight.
* httpx async client with a connection pool; connection errors, timeouts and 5xx responses are
  retried with exponential backoff; 4xx responses and exhausted retries raise ``BackendError``.
* Failover (several servers): a request whose server fails and then does not answer ``/health`` takes
  that server out (``backend.dead``) and goes at once to the least-loaded live server (its route
  moves with it); no request is lost while one server lives. Dead servers are probed in the
  background every ``health_interval`` seconds (or by ``await backend.check_health()``) and come back
  with the loaded LoRA adapters reloaded. ``backend.stats`` counts failovers, deaths, revivals.
* ``VLLMServer`` starts and stops a local server process for a model directory (tests, CLI); the
  process gets its own process group and is killed at interpreter exit if still running.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from turngym.agents.backend import BackendError, Generation, SamplingParams, TokenBackend


class _Retryable(Exception):
    """A failure worth retrying: transport error or 5xx."""


class VLLMBackend(TokenBackend):
    def __init__(
        self,
        urls: str | list[str],
        model: str | None = None,
        *,
        timeout: float = 300.0,
        max_retries: int = 4,
        backoff_s: float = 0.5,
        max_connections: int = 512,
        api_key: str | None = None,
        health_interval: float = 10.0,
        health_timeout: float = 3.0,
    ):
        import httpx

        self.urls = [u.rstrip("/") for u in ([urls] if isinstance(urls, str) else urls)]
        if not self.urls:
            raise ValueError("at least one server URL is needed")
        self.model = model
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.health_interval = health_interval
        self.health_timeout = health_timeout
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout, connect=10.0),
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
            headers=headers,
        )
        self._routes: OrderedDict[str, str] = OrderedDict()
        self._in_flight = dict.fromkeys(self.urls, 0)
        self.adapters: set[str] = set()
        self._adapter_paths: dict[str, str] = {}  # reloaded on a server that comes back
        self._weights_path: str | None = (
            None  # full weights last pushed: reloaded on a server that comes back
        )
        self.dead: dict[str, str] = {}  # url -> why it was taken out
        self.stats = {"failovers": 0, "deaths": 0, "revivals": 0, "retries": 0}
        self._last_probe = 0.0
        self._probe_task: asyncio.Task | None = None

    # ----------------------------------------------------------------- generate
    async def _generate(
        self, prompt_ids: list[int], sampling: SamplingParams, route: str | None, adapter: str | None
    ) -> Generation:
        body: dict[str, Any] = {
            "model": adapter or await self._model_name(self._pick(route) or self.urls[0]),
            "prompt": list(prompt_ids),
            "max_tokens": sampling.max_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": sampling.top_k,
            "logprobs": 0,
            "return_tokens_as_token_ids": True,
            "skip_special_tokens": True,
        }
        if sampling.stop_token_ids:
            body["stop_token_ids"] = list(sampling.stop_token_ids)
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        data = await self._routed(route, "/v1/completions", body)
        return _parse_completion(data, len(prompt_ids))

    def server_for(self, route: str | None) -> str:
        """The server of ``route`` (sticky while it is live); new routes go to the least-loaded live server."""
        url = self._pick(route)
        if url is None:
            raise BackendError(f"no live vLLM server: {self.dead}")
        return url

    @property
    def live_urls(self) -> list[str]:
        return [u for u in self.urls if u not in self.dead]

    # ----------------------------------------------------------------- health
    async def check_health(self) -> dict[str, bool]:
        """Probe ``/health`` on every server: failing ones are taken out, dead ones that answer come back
        (after the loaded LoRA adapters are loaded on them)."""
        self._last_probe = time.monotonic()
        alive = await asyncio.gather(*(self._alive(u) for u in self.urls))
        for url, ok in zip(self.urls, alive, strict=True):
            if ok and url in self.dead:
                await self._revive(url)
            elif not ok and url not in self.dead:
                self._mark_dead(url, "health check failed")
        return {u: u not in self.dead for u in self.urls}

    async def _alive(self, url: str) -> bool:
        try:
            resp = await self._client.get(url + "/health", timeout=self.health_timeout)
        except Exception:  # noqa: BLE001 - any failure means not healthy
            return False
        return resp.status_code == 200

    def _mark_dead(self, url: str, why: str) -> None:
        if url not in self.dead:
            self.dead[url] = why
            self.stats["deaths"] += 1

    async def _revive(self, url: str) -> None:
        try:
            if self._weights_path is not None:
                await self._reload_on(url, self._weights_path)
            for name, path in self._adapter_paths.items():
                try:  # a server that was only unreachable may still hold an older version
                    await self._send("POST", url, "/v1/unload_lora_adapter", {"lora_name": name}, False)
                except BackendError:
                    pass
                await self._send(
                    "POST", url, "/v1/load_lora_adapter", {"lora_name": name, "lora_path": path}, False
                )
        except (_Retryable, BackendError) as e:
            self.dead[url] = f"back, but reloading weights or adapters failed: {e}"
            return
        self.dead.pop(url, None)
        self.stats["revivals"] += 1

    def _probe_dead_when_due(self) -> None:
        """Dead servers are probed in the background at most every ``health_interval`` seconds."""
        due = time.monotonic() - self._last_probe >= self.health_interval
        if self.dead and due and (self._probe_task is None or self._probe_task.done()):
            self._last_probe = time.monotonic()
            self._probe_task = asyncio.get_running_loop().create_task(self.check_health())

    # ----------------------------------------------------------------- LoRA
    async def load_lora_adapter(self, name: str, path: str | Path, *, replace: bool = True) -> None:
        """Load a peft adapter on every live server; with ``replace``, an adapter of that name is swapped.
        Servers that are down get it when they come back."""
        if replace and name in self.adapters:
            await self.unload_lora_adapter(name)
        body = {"lora_name": name, "lora_path": str(path)}
        await self._on_every_live_server("/v1/load_lora_adapter", body)
        self.adapters.add(name)
        self._adapter_paths[name] = str(path)

    async def unload_lora_adapter(self, name: str) -> None:
        await self._on_every_live_server("/v1/unload_lora_adapter", {"lora_name": name})
        self.adapters.discard(name)
        self._adapter_paths.pop(name, None)

    async def _on_every_live_server(self, path: str, body: dict[str, Any]) -> None:
        await self._on_every_live(path, lambda url: self._request("POST", url, path, body, json_reply=False))

    async def _on_every_live(self, what: str, call: Callable[[str], Awaitable[Any]]) -> None:
        """``call(url)`` on every live server at once; a server that fails and no longer answers
        ``/health`` is taken out (when there are others), any other failure is raised."""
        urls = self.live_urls
        if not urls:
            raise BackendError(f"no live vLLM server for {what}: {self.dead}")
        results = await asyncio.gather(*(call(u) for u in urls), return_exceptions=True)
        failed = {u: r for u, r in zip(urls, results, strict=True) if isinstance(r, BaseException)}
        for url, error in failed.items():
            if len(self.urls) > 1 and not await self._alive(url):
                self._mark_dead(url, f"{what} failed: {error}")
            else:
                raise error
        if not self.live_urls:
            raise BackendError(f"{what} failed on every server: {failed}")

    # ----------------------------------------------------------------- full weights
    async def reload_weights(self, path: str | Path) -> None:
        """Full-weight sync: every live server reloads its model's weights in place from ``path`` (a
        Hugging Face checkpoint directory the servers can read, e.g. ``model.save_pretrained(path)`` on
        a shared disk), then drops its prefix cache, whose entries were computed with the old weights.
        This is vLLM's ``reload_weights`` worker method reached through ``POST /collective_rpc``, which
        servers expose when started with ``VLLM_SERVER_DEV_MODE=1`` (``VLLMServer(weight_reload=True)``).
        Servers that are down get the weights when they come back."""
        path = str(Path(path).resolve())
        await self._on_every_live("reload_weights", lambda url: self._reload_on(url, path))
        self._weights_path = path

    async def _reload_on(self, url: str, path: str) -> None:
        try:
            body = {"method": "reload_weights", "kwargs": {"weights_path": path}}
            await self._request("POST", url, "/collective_rpc", body, json_reply=False)
            await self._request("POST", url, "/reset_prefix_cache", None, json_reply=False)
        except BackendError as e:
            if "404" in str(e):
                raise BackendError(
                    f"{url} has no /collective_rpc: start the server with VLLM_SERVER_DEV_MODE=1 "
                    "(VLLMServer(..., weight_reload=True)) to reload full weights"
                ) from e
            raise

    async def models(self, url: str | None = None) -> list[str]:
        data = await self._request("GET", url or self.urls[0], "/v1/models")
        return [m["id"] for m in data.get("data", [])]

    async def aclose(self) -> None:
        if self._probe_task is not None:
            self._probe_task.cancel()
        await self._client.aclose()

    # ----------------------------------------------------------------- HTTP
    def _pick(self, route: str | None) -> str | None:
        live = self.live_urls
        if not live:
            return None
        if len(live) == 1:
            return live[0]
        if route is not None and route in self._routes and self._routes[route] not in self.dead:
            self._routes.move_to_end(route)
            return self._routes[route]
        url = min(live, key=lambda u: self._in_flight[u])
        if route is not None:
            self._routes[route] = url
            self._routes.move_to_end(route)
            if len(self._routes) > 100_000:
                self._routes.popitem(last=False)
        return url

    async def _model_name(self, url: str) -> str:
        if self.model is None:
            names = await self.models(url)
            if not names:
                raise BackendError(f"{url} serves no model")
            self.model = names[0]
        return self.model

    async def _routed(self, route: str | None, path: str, body: dict[str, Any]) -> Any:
        """POST to the route's server; a server that fails and does not answer ``/health`` is taken out
        and the request goes at once to another live server. Other failures back off and retry."""
        self._probe_dead_when_due()
        last, attempt = "", 0
        while True:
            url = self._pick(route)
            if url is None:
                await self.check_health()
                url = self._pick(route)
            if url is None:
                last = f"no live server ({self.dead})"
            else:
                self._in_flight[url] += 1
                try:
                    return await self._send("POST", url, path, body)
                except _Retryable as e:
                    last = f"{url}: {e}"
                    if len(self.urls) > 1 and not await self._alive(url):
                        self._mark_dead(url, str(e))
                        if self.live_urls:
                            self.stats["failovers"] += 1
                            continue
                finally:
                    self._in_flight[url] -= 1
            attempt += 1
            if attempt > self.max_retries:
                raise BackendError(f"POST {path} failed after {attempt} attempts: {last}")
            self.stats["retries"] += 1
            await asyncio.sleep(self._backoff(attempt))

    async def _request(
        self, method: str, url: str, path: str, body: dict[str, Any] | None = None, json_reply: bool = True
    ) -> Any:
        """One server, retried with exponential backoff on transport errors and 5xx."""
        last = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                await asyncio.sleep(self._backoff(attempt))
            try:
                return await self._send(method, url, path, body, json_reply)
            except _Retryable as e:
                last = str(e)
        raise BackendError(f"{method} {url}{path} failed after {self.max_retries + 1} attempts: {last}")

    async def _send(
        self, method: str, url: str, path: str, body: dict[str, Any] | None = None, json_reply: bool = True
    ) -> Any:
        import httpx

        try:
            resp = await self._client.request(method, url + path, json=body)
        except httpx.TransportError as e:
            raise _Retryable(f"{type(e).__name__}: {e}") from e
        if resp.status_code >= 500:
            raise _Retryable(f"HTTP {resp.status_code}: {resp.text[:500]}")
        if resp.status_code >= 400:
            raise BackendError(f"{method} {url}{path} -> HTTP {resp.status_code}: {resp.text[:1000]}")
        if not json_reply:
            return resp.text
        try:
            return resp.json()
        except ValueError as e:
            raise BackendError(f"{url}{path} returned non-JSON: {resp.text[:200]!r}") from e

    def _backoff(self, attempt: int) -> float:
        return self.backoff_s * 2 ** (attempt - 1) * (0.5 + random.random())


def _parse_completion(data: dict[str, Any], prompt_len: int) -> Generation:
    try:
        choice = data["choices"][0]
        lp = choice["logprobs"]
        ids = [_token_id(t) for t in lp["tokens"]]
        logprobs = [float(x) if x is not None else 0.0 for x in lp["token_logprobs"]]
        reason = choice.get("finish_reason") or "stop"
        return Generation(ids, logprobs, reason, text=choice.get("text", ""), prompt_len=prompt_len)
    except (KeyError, IndexError, TypeError, ValueError) as e:
        raise BackendError(f"malformed completion response: {e}: {str(data)[:300]}") from e


def _token_id(token: str) -> int:
    if not token.startswith("token_id:"):
        raise ValueError(f"expected 'token_id:N', got {token!r} (is return_tokens_as_token_ids supported?)")
    return int(token[len("token_id:") :])


# ---------------------------------------------------------------------- server process
class VLLMServer:
    """A local ``vllm.entrypoints.openai.api_server`` process.

        with VLLMServer(model_dir, max_model_len=1024, dtype="float32") as server:
            backend = VLLMBackend(server.url)

    ``start()`` waits for ``/health`` (raising with the log tail if the process dies or the
    timeout passes); ``stop()`` terminates the whole process group. On CPU the KV cache defaults
    to 1 GiB (``VLLM_CPU_KVCACHE_SPACE``); runtime LoRA loading is enabled when ``enable_lora``, and
    full-weight reloads (``VLLMBackend.reload_weights``) when ``weight_reload``.
    """

    def __init__(
        self,
        model: str | Path,
        *,
        port: int | None = None,
        host: str = "127.0.0.1",
        max_model_len: int = 1024,
        dtype: str = "auto",
        enable_lora: bool = True,
        max_lora_rank: int = 8,
        served_model_name: str | None = None,
        weight_reload: bool = False,
        extra_args: list[str] | None = None,
        env: dict[str, str] | None = None,
        startup_timeout: float = 240.0,
        log_path: str | Path | None = None,
    ):
        from turngym.agents.models import resolve_model

        self.model = resolve_model(model)
        self.host, self.port = host, port or _free_port()
        self.args = [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            self.model,
            "--host",
            host,
            "--port",
            str(self.port),
            "--max-model-len",
            str(max_model_len),
            "--dtype",
            dtype,
        ]
        if enable_lora:
            self.args += ["--enable-lora", "--max-lora-rank", str(max_lora_rank)]
        if served_model_name:
            self.args += ["--served-model-name", served_model_name]
        extra = list(extra_args or [])
        if _cpu_build() and not any("chunked-prefill" in a or "max-num-batched-tokens" in a for a in extra):
            # vLLM-CPU 0.32 kills its engine when it discards the token sampled for a partially
            # prefilled *seeded* request (it rewinds the request's generator, which a CPU generator
            # refuses: "CPU Generator does not use offset"). Whole prefills avoid that path.
            budget = str(max(max_model_len, 8192))
            self.args += ["--no-enable-chunked-prefill", "--max-num-batched-tokens", budget]
        self.args += extra
        self.env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
        if enable_lora:
            self.env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
        if weight_reload:  # /collective_rpc and /reset_prefix_cache, for VLLMBackend.reload_weights
            self.env["VLLM_SERVER_DEV_MODE"] = "1"
        self.env.update(env or {})
        self.startup_timeout = startup_timeout
        self.log_path = Path(log_path) if log_path else Path(f"/tmp/turngym-vllm-{self.port}.log")
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> VLLMServer:
        import httpx

        if self.proc is not None:
            return self
        log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            self.args, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
        )
        log.close()
        atexit.register(self.stop)
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = self.log_tail()
                self.proc = None
                raise RuntimeError(f"vLLM server exited during startup:\n{tail}")
            try:
                if httpx.get(self.url + "/health", timeout=2.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise TimeoutError(f"vLLM server not ready after {self.startup_timeout}s:\n{self.log_tail()}")

    def stop(self, timeout: float = 20.0) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                proc.wait(wait)
                return
            except subprocess.TimeoutExpired:
                continue

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def __enter__(self) -> VLLMServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _cpu_build() -> bool:
    """Whether the installed vLLM is the CPU build (the ``vllm-cpu`` distribution)."""
    from importlib import metadata

    try:
        metadata.distribution("vllm-cpu")
    except metadata.PackageNotFoundError:
        return False
    return True


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

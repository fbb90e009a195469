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
from pathlib import Path
from typing import Any

from turngym.agents.backend import BackendError, Generation, SamplingParams


class VLLMBackend:
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
    ):
        import httpx

        self.urls = [u.rstrip("/") for u in ([urls] if isinstance(urls, str) else urls)]
        if not self.urls:
            raise ValueError("at least one server URL is needed")
        self.model = model
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout, connect=10.0),
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
            headers=headers,
        )
        self._routes: OrderedDict[str, str] = OrderedDict()
        self._in_flight = dict.fromkeys(self.urls, 0)
        self.adapters: set[str] = set()

    # ----------------------------------------------------------------- generate
    async def generate(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams,
        *,
        route: str | None = None,
        adapter: str | None = None,
    ) -> Generation:
        if not prompt_ids:
            raise BackendError("empty prompt")
        url = self.server_for(route)
        body: dict[str, Any] = {
            "model": adapter or await self._model_name(url),
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
        self._in_flight[url] += 1
        try:
            data = await self._post(url, "/v1/completions", body)
        finally:
            self._in_flight[url] -= 1
        return _parse_completion(data, len(prompt_ids))

    def server_for(self, route: str | None) -> str:
        """The server of ``route`` (sticky); new routes go to the least-loaded server."""
        if len(self.urls) == 1:
            return self.urls[0]
        if route is not None and route in self._routes:
            self._routes.move_to_end(route)
            return self._routes[route]
        url = min(self.urls, key=lambda u: self._in_flight[u])
        if route is not None:
            self._routes[route] = url
            if len(self._routes) > 100_000:
                self._routes.popitem(last=False)
        return url

    # ----------------------------------------------------------------- LoRA
    async def load_lora_adapter(self, name: str, path: str | Path, *, replace: bool = True) -> None:
        """Load a peft adapter on every server; with ``replace``, an adapter of that name is swapped."""
        if replace and name in self.adapters:
            await self.unload_lora_adapter(name)
        body = {"lora_name": name, "lora_path": str(path)}
        await asyncio.gather(
            *(self._post(u, "/v1/load_lora_adapter", body, json_reply=False) for u in self.urls)
        )
        self.adapters.add(name)

    async def unload_lora_adapter(self, name: str) -> None:
        body = {"lora_name": name}
        await asyncio.gather(
            *(self._post(u, "/v1/unload_lora_adapter", body, json_reply=False) for u in self.urls)
        )
        self.adapters.discard(name)

    async def models(self, url: str | None = None) -> list[str]:
        data = await self._request("GET", url or self.urls[0], "/v1/models")
        return [m["id"] for m in data.get("data", [])]

    async def aclose(self) -> None:
        await self._client.aclose()

    # ----------------------------------------------------------------- HTTP
    async def _model_name(self, url: str) -> str:
        if self.model is None:
            names = await self.models(url)
            if not names:
                raise BackendError(f"{url} serves no model")
            self.model = names[0]
        return self.model

    async def _post(self, url: str, path: str, body: dict[str, Any], json_reply: bool = True) -> Any:
        return await self._request("POST", url, path, body, json_reply)

    async def _request(
        self, method: str, url: str, path: str, body: dict[str, Any] | None = None, json_reply: bool = True
    ) -> Any:
        import httpx

        last = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                await asyncio.sleep(self.backoff_s * 2 ** (attempt - 1) * (0.5 + random.random()))
            try:
                resp = await self._client.request(method, url + path, json=body)
            except httpx.TransportError as e:
                last = f"{type(e).__name__}: {e}"
                continue
            if resp.status_code >= 500:
                last = f"HTTP {resp.status_code}: {resp.text[:500]}"
                continue
            if resp.status_code >= 400:
                raise BackendError(f"{method} {url}{path} -> HTTP {resp.status_code}: {resp.text[:1000]}")
            if not json_reply:
                return resp.text
            try:
                return resp.json()
            except ValueError as e:
                raise BackendError(f"{url}{path} returned non-JSON: {resp.text[:200]!r}") from e
        raise BackendError(f"{method} {url}{path} failed after {self.max_retries + 1} attempts: {last}")


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
    to 1 GiB (``VLLM_CPU_KVCACHE_SPACE``); runtime LoRA loading is enabled when ``enable_lora``.
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
        self.args += list(extra_args or [])
        self.env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
        if enable_lora:
            self.env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

"""Proxy overhead: a call through ``turngym proxy`` against the same call to the backend directly.

    python benchmarks/harness.py [--backends instant,sim,tiny] [--episodes 64] [--turns 4] [--calls 60]
                                 [--http auto|h11|httptools|h11,httptools]

For each backend (``instant``: fixed ids at once, the proxy's cost alone; ``sim``: a latency model of
a GPU server, ``SIM_STEP_S`` per decode step whatever the batch, so 64 episodes decode together;
``tiny``: the tiny HF model on CPU with continuous batching) the proxy runs in a child process (its own GIL, as in use) and is
called over loopback with ``aiohttp`` (one episode per client coroutine, a growing conversation: each
call sends the previous reply and a new user turn). The baseline calls ``backend.generate`` in this
process with the same prompts (rendered once with the chat template) and the same ``max_tokens``.

* latency: one episode, ``--calls`` sequential calls; p50 of each, and the difference (the proxy's
  overhead per call: HTTP, validation, rendering, bookkeeping, response);
* throughput: ``--episodes`` concurrent episodes of ``--turns`` calls each; calls/s of each and the
  ratio proxy / direct.

* floor: ``GET /health`` p50 on one connection, loopback HTTP with no proxy work (the part of the
  overhead that any HTTP server in front of the backend pays).

The client is aiohttp (one session, one connection per episode); its own CPU per call is printed.
Runs alternate proxy and direct (twice each) so load drift hits both; the load average is printed.
``--http h11,httptools`` serves the proxy once per HTTP parser (a process each) and measures them in
turns, in alternating order, against the same direct baseline.
On a loaded machine wall-clock numbers mostly measure the load, so the proxy process's own CPU time
per call (``/proc/<pid>/stat``: user + system, its whole work: HTTP, proxy and, for ``tiny``, the
model) is printed too, and the calls/s one core could serve at that cost (1 / CPU per call): what
the proxy side would reach with a core of its own.
Targets (issue 39): overhead p50 <= 5 ms, throughput ratio >= 0.9 at 64 concurrent episodes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TOKEN = "benchmark-token-0123456789abcdef"
MAX_TOKENS = 16
SYSTEM = "You are a careful calculator agent. Evaluate the expression one step at a time."


SIM_STEP_S = 0.02


def _backend(kind: str):
    from turngym.agents.models import load_tokenizer
    from turngym.proxy.scripted import InstantBackend

    tok = load_tokenizer("tiny")
    if kind == "instant":
        return InstantBackend(tok, n_tokens=MAX_TOKENS), tok
    if kind == "sim":

        class SimBackend(InstantBackend):
            async def _generate(self, prompt_ids, sampling, route, adapter):
                gen = await super()._generate(prompt_ids, sampling, route, adapter)
                await asyncio.sleep(SIM_STEP_S * len(gen.token_ids))
                return gen

        return SimBackend(tok, n_tokens=MAX_TOKENS), tok
    from turngym.agents.hf import HFBackend
    from turngym.agents.tiny import tiny_model_path

    return HFBackend(tiny_model_path(), tok, max_batch_size=64, max_wait_ms=2), tok


def _serve(kind: str, port: int, http: str) -> None:
    from turngym.proxy import make_proxy, serve_proxy

    os.environ["TURNGYM_HTTP"] = http  # the HTTP/1.1 parser (turngym.remote.http_protocols)
    backend, tok = _backend(kind)
    proxy = make_proxy(backend=backend, tokenizer=tok, name="m", max_context=4096, max_tokens=MAX_TOKENS)
    with serve_proxy(proxy, token=TOKEN, port=port) as running:
        print(f"proxy for {kind} (pid {os.getpid()}): HTTP parser {running.server.http_parser}", flush=True)
        while True:
            time.sleep(3600)


def _conversation(turn: int, episode: int) -> list[dict]:
    msgs = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"Evaluate: ({episode} + 7) * 3"},
    ]
    for k in range(turn):
        msgs += [
            {"role": "assistant", "content": f"Step {k}: the next value"},
            {"role": "user", "content": "go on"},
        ]
    return msgs


async def _proxy_episode(http, key: str, turns: int, episode: int, lat: list[float]) -> None:
    msgs = _conversation(0, episode)
    for _ in range(turns):
        t0 = time.perf_counter()
        async with http.post(
            f"/v1/episodes/{key}/chat/completions",
            json={"model": "m", "messages": msgs, "max_tokens": MAX_TOKENS, "temperature": 0},
        ) as r:
            r.raise_for_status()
            body = await r.json()
        lat.append(time.perf_counter() - t0)
        msgs += [body["choices"][0]["message"], {"role": "user", "content": "go on"}]


async def _direct_episode(backend, fmt, turns: int, episode: int, lat: list[float], route: str) -> None:
    from turngym.agents.backend import SamplingParams
    from turngym.agents.chat import ChatTokens
    from turngym.core.types import Message

    sampling = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, stop_token_ids=tuple(fmt.stop_token_ids))
    msgs = [Message(**m) for m in _conversation(0, episode)]
    tokens = ChatTokens(fmt, msgs)  # the prompts are rendered here, outside the timed calls
    for _ in range(turns):
        prompt = tokens.token_ids.tolist()
        t0 = time.perf_counter()
        gen = await backend.generate(prompt, sampling, route=route)
        lat.append(time.perf_counter() - t0)
        tokens.add_generation(gen.token_ids, gen.logprobs)
        reply = Message(role="assistant", content=fmt.decode(gen.token_ids))
        tokens.add_observation(reply, [Message(role="user", content="go on")])


def _client(url: str, connections: int):
    """The load generator: aiohttp (httpx's pool costs ~8 ms of client CPU per call at 64 connections
    here, which capped the 'proxy' side at ~30 calls/s whatever the server did)."""
    import aiohttp

    return aiohttp.ClientSession(
        base_url=url,
        headers={"Authorization": f"Bearer {TOKEN}"},
        connector=aiohttp.TCPConnector(limit=connections),
        timeout=aiohttp.ClientTimeout(total=300),
    )


async def _run_proxy(url: str, episodes: int, turns: int, tag: str) -> tuple[list[float], float]:
    lat: list[float] = []
    async with _client(url, episodes) as http:
        t0 = time.perf_counter()
        await asyncio.gather(*(_proxy_episode(http, f"{tag}-{i}", turns, i, lat) for i in range(episodes)))
        return lat, time.perf_counter() - t0


async def _run_floor(url: str, calls: int) -> list[float]:
    """Loopback HTTP alone: ``GET /health`` on one connection (the floor under any proxy's overhead)."""
    lat: list[float] = []
    async with _client(url, 1) as http:
        for _ in range(calls):
            t0 = time.perf_counter()
            async with http.get("/health") as r:
                await r.read()
            lat.append(time.perf_counter() - t0)
    return lat


async def _run_direct(backend, fmt, episodes: int, turns: int, tag: str) -> tuple[list[float], float]:
    lat: list[float] = []
    t0 = time.perf_counter()
    await asyncio.gather(
        *(_direct_episode(backend, fmt, turns, i, lat, f"{tag}-{i}") for i in range(episodes))
    )
    return lat, time.perf_counter() - t0


def _wait_up(url: str, proc) -> None:
    import httpx

    for _ in range(600):
        if not proc.is_alive():
            raise RuntimeError("the proxy process died")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError("the proxy did not come up")


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bench(kind: str, episodes: int, turns: int, calls: int, parsers: list[str]) -> dict[str, dict]:
    """One proxy process per HTTP parser in ``parsers``, measured in turns against one direct
    baseline: ``{parser: numbers}`` (the direct numbers are the same in each)."""
    import socket

    from turngym.agents.chat import ChatFormat

    procs, urls = {}, {}
    for http in parsers:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        procs[http] = mp.get_context("spawn").Process(target=_serve, args=(kind, port, http), daemon=True)
        procs[http].start()
        urls[http] = f"http://127.0.0.1:{port}"
    backend, tok = _backend(kind)
    fmt = ChatFormat(tok)
    try:
        for http in parsers:
            _wait_up(urls[http], procs[http])
        keys = ("proxy_p50", "floor_p50", "proxy_cps", "proxy_cpu", "client_cpu")
        out: dict = {http: {k: [] for k in keys} for http in parsers}
        direct: dict = {"direct_p50": [], "direct_cps": []}
        for http in parsers:  # warm both paths
            asyncio.run(_run_proxy(urls[http], 2, 2, f"warm-{kind}"))
        asyncio.run(_run_direct(backend, fmt, 2, 2, f"warm-{kind}"))
        for rep in range(2):
            for http in parsers if rep % 2 == 0 else parsers[::-1]:  # alternate the order: load drift
                url, pid, o = urls[http], procs[http].pid, out[http]
                o["floor_p50"].append(statistics.median(asyncio.run(_run_floor(url, calls))))
                lat, _ = asyncio.run(_run_proxy(url, 1, calls, f"lat{rep}"))
                o["proxy_p50"].append(statistics.median(lat))
                cpu0, mine = _cpu_s(pid), time.process_time()
                lat, wall = asyncio.run(_run_proxy(url, episodes, turns, f"tp{rep}"))
                o["proxy_cpu"].append((_cpu_s(pid) - cpu0) / len(lat))
                o["client_cpu"].append((time.process_time() - mine) / len(lat))
                o["proxy_cps"].append(len(lat) / wall)
            lat, _ = asyncio.run(_run_direct(backend, fmt, 1, calls, f"lat{rep}"))
            direct["direct_p50"].append(statistics.median(lat))
            lat, wall = asyncio.run(_run_direct(backend, fmt, episodes, turns, f"tp{rep}"))
            direct["direct_cps"].append(len(lat) / wall)
        base = {k: statistics.median(v) for k, v in direct.items()}
        return {http: {**base, **{k: statistics.median(v) for k, v in o.items()}} for http, o in out.items()}
    finally:
        for proc in procs.values():
            proc.kill()
            proc.join(10)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backends", default="instant,sim,tiny")
    ap.add_argument("--episodes", type=int, default=64)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--calls", type=int, default=60)
    ap.add_argument(
        "--http",
        default="auto",
        help="the proxy's HTTP/1.1 parser(s), comma-separated: auto, h11, httptools (several: one proxy "
        "process each, measured in turns against the same direct baseline)",
    )
    ap.add_argument("--json", help="also write the numbers to this file")
    args = ap.parse_args()
    parsers = [p.strip() for p in args.http.split(",") if p.strip()]
    load0 = os.getloadavg()[0]
    print(f"load average before: {load0:.2f}; {os.cpu_count()} CPUs; max_tokens {MAX_TOKENS}")
    print(f"{'backend':8} {'HTTP':9} {'p50 direct':>11} {'p50 proxy':>10} {'overhead':>9} {'HTTP floor':>10} "
          f"{'calls/s direct':>15} {'calls/s proxy':>14} {'ratio':>6} {'proxy CPU/call':>15} "
          f"{'client CPU/call':>16} {'proxy calls/s/core':>19}")  # fmt: skip
    results: dict = {}
    for kind in args.backends.split(","):
        results[kind] = bench(kind, args.episodes, args.turns, args.calls, parsers)
        for http, r in results[kind].items():
            print(
                f"{kind:8} {http:9} {r['direct_p50'] * 1e3:9.2f}ms {r['proxy_p50'] * 1e3:8.2f}ms "
                f"{(r['proxy_p50'] - r['direct_p50']) * 1e3:7.2f}ms {r['floor_p50'] * 1e3:8.2f}ms "
                f"{r['direct_cps']:15.1f} {r['proxy_cps']:14.1f} "
                f"{r['proxy_cps'] / r['direct_cps']:6.2f} {r['proxy_cpu'] * 1e3:13.2f}ms "
                f"{r['client_cpu'] * 1e3:14.2f}ms {1 / r['proxy_cpu']:19.0f}",
                flush=True,
            )
    if args.json:
        Path(args.json).write_text(
            json.dumps({"load_before": load0, "cpus": os.cpu_count(), **results}, indent=1)
        )
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()

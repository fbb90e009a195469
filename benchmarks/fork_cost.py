"""Fork cost per forkable family: p50/p99 of ``env.fork()`` at turn 2, against ``reset()`` of the same env in the same run; run ``python benchmarks/fork_cost.py [--forks 200] [--envs arith search-qa ...] [--swe-forks 10]``.

Each env forks ``--per-episode`` times at turn 2 (after two expert steps) of ``forks / per-episode``
episodes (seeds 0, 1, ...); resets are timed on the same env over as many seeds. A fork's own close
is not timed. The ratio ``fork p50 / reset p50`` is the machine-independent number.

swe-docker (when a Docker daemon answers; ``--swe-forks 0`` skips it) is timed apart, with few
repetitions: at turn 2 of a shipped task (a file created with the editor, a source file edited with
bash) its fork (a tar snapshot of the container's writable mounts unpacked into a warm pool container)
against a reset from the warm pool, and against the alternative it was chosen over: ``docker commit``
of the live container plus a container started from that image (which, with the read-only root and
tmpfs mounts of the sandbox, does not even carry the edits: the row says so).
``--browser`` adds the browser families (a MiniWoB task and a site task; Chromium): their fork is a new
browser context plus a replay of the episode's page actions, so it costs about a reset plus the prefix.
Their turn-2 state comes from two ``noop`` turns (MiniWoB: the expert would finish in one) or two expert
turns (web-shop: search, then open a product); use fewer forks (``--forks 20``).
"""

from __future__ import annotations

import argparse
import statistics
import time

import turngym

SERVICES = {"docker", "web"}
NOOP = '<tool_call>{"name": "noop", "arguments": {"wait_ms": 0}}</tool_call>'
#: browser rows: env id -> (make kwargs, the turn-1/2 action or None for the expert's)
BROWSER: dict[str, tuple[dict, str | None]] = {
    "web-miniwob-v0": ({"task": "enter-text"}, NOOP),
    "web-shop-v0": ({"split": "test", "catalog_size": 2000, "n_goals": 600}, None),
}


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def forkable_ids() -> list[str]:
    out = []
    for s in turngym.registry.latest():
        if SERVICES & set(s.requires):
            continue
        if getattr(s.load(), "forkable", False):
            out.append(s.id)
    return out


def bench(
    env_id: str, forks: int, per_episode: int, kwargs: dict | None = None, action: str | None = None
) -> dict[str, float]:
    t = time.perf_counter()
    env = turngym.make(env_id, **(kwargs or {}))
    make_s = time.perf_counter() - t
    env.reset(seed=0)  # warm-up (lazy imports, caches)
    env.fork().close()
    resets, fork_times = [], []
    episodes = max(1, forks // per_episode)
    for seed in range(episodes):
        for i in range(per_episode):
            t = time.perf_counter()
            env.reset(seed=seed * per_episode + i)
            resets.append(time.perf_counter() - t)
    for seed in range(episodes):
        env.reset(seed=seed)
        for _ in range(2):
            if not env._done:
                env.step(action or env.expert_action() or "no call")
        for _ in range(per_episode):
            t = time.perf_counter()
            child = env.fork()
            fork_times.append(time.perf_counter() - t)
            child.close()
    env.close()
    f50, f99 = pct(fork_times, 0.5) * 1e3, pct(fork_times, 0.99) * 1e3
    r50, r99 = pct(resets, 0.5) * 1e3, pct(resets, 0.99) * 1e3
    return {
        "make_s": make_s,
        "fork_p50": f50,
        "fork_p99": f99,
        "fork_mean": statistics.fmean(fork_times) * 1e3,
        "reset_p50": r50,
        "reset_p99": r99,
        "n": len(fork_times),
    }


def bench_swe(forks: int) -> dict[str, float]:
    import json

    from turngym.envs.swe.tasks import load_instances
    from turngym.sandboxes.docker import DockerSandbox, docker_client

    def call(name: str, **arguments: object) -> str:
        return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"

    task = load_instances()[0]
    t = time.perf_counter()
    env = turngym.make("swe-docker", task_ids=[task.instance_id], max_active=4, pool_warm=1)
    make_s = time.perf_counter() - t
    env.reset(seed=0)  # warm-up: the task image and the pool
    env.fork().close()
    resets, fork_times, commit_times = [], [], []
    for i in range(forks):
        env._pool.wait_warm(60)  # a reset from the warm pool, as in a rollout
        t = time.perf_counter()
        env.reset(seed=i)
        resets.append(time.perf_counter() - t)
    env.step(call("file_editor", command="create", path="/testbed/notes.txt", file_text="branch point\n"))
    env.step(call("bash", command=f"echo '# edited' >> {task.expert_edits[0]['path']}"))
    for _ in range(forks):
        env._pool.wait_warm(60)
        t = time.perf_counter()
        child = env.fork()
        fork_times.append(time.perf_counter() - t)
        child.close()
    client, limits = docker_client(), env._pool.limits
    commit_sees_edits = True
    for _ in range(max(1, forks // 2)):
        t = time.perf_counter()
        image = env._sb.container.commit(repository="turngym-fork-probe")
        sb = DockerSandbox.create(image.id, limits=limits, workdir="/testbed")
        commit_times.append(time.perf_counter() - t)
        commit_sees_edits &= sb.exec("test -f /testbed/notes.txt").exit_code == 0
        sb.close()
        client.images.remove(image.id, force=True)
    snapshot = env._sb.snapshot(list(limits.writable), max_bytes=1 << 30)
    env.close()
    return {
        "make_s": make_s,
        "fork_p50": pct(fork_times, 0.5) * 1e3,
        "fork_p99": pct(fork_times, 0.99) * 1e3,
        "reset_p50": pct(resets, 0.5) * 1e3,
        "reset_p99": pct(resets, 0.99) * 1e3,
        "commit_p50": pct(commit_times, 0.5) * 1e3,
        "commit_sees_edits": commit_sees_edits,
        "snapshot_kb": len(snapshot) / 1024,
        "n": len(fork_times),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--forks", type=int, default=200, help="forks per env (at turn 2)")
    ap.add_argument("--per-episode", type=int, default=10, help="forks of each episode's turn-2 state")
    ap.add_argument("--envs", nargs="*", default=None, help="env ids (default: every light forkable env)")
    ap.add_argument("--swe-forks", type=int, default=10, help="swe-docker forks (slow; 0 skips it)")
    ap.add_argument("--browser", action="store_true", help="also the browser families (needs Chromium)")
    args = ap.parse_args()
    envs = args.envs or forkable_ids()
    if args.browser:
        envs += [e for e in BROWSER if e not in envs]
    swe = args.swe_forks > 0 and (args.envs is None or "swe-docker" in envs)
    envs = [e for e in envs if e != "swe-docker"]
    print(f"fork() at turn 2 vs reset() of the same env; {args.forks} forks per env")
    for env_id in envs:
        kwargs, action = BROWSER.get(env_id, ({}, None))
        r = bench(env_id, args.forks, args.per_episode, kwargs, action)
        print(
            f"{env_id}: fork p50 {r['fork_p50']:.3f} ms p99 {r['fork_p99']:.3f} ms (n={r['n']}) | "
            f"reset p50 {r['reset_p50']:.3f} ms, p99 {r['reset_p99']:.3f} ms | "
            f"ratio_fork_vs_reset={r['fork_p50'] / r['reset_p50']:.3f} (p50s; make {r['make_s']:.2f} s)",
            flush=True,
        )
    if swe:
        from turngym.sandboxes.docker import docker_available

        if not docker_available():
            print("swe-docker: skipped (no Docker daemon)")
            return
        r = bench_swe(args.swe_forks)
        print(
            f"swe-docker: fork p50 {r['fork_p50']:.1f} ms p99 {r['fork_p99']:.1f} ms (n={r['n']}, tar snapshot "
            f"{r['snapshot_kb']:.0f} KiB) | reset p50 {r['reset_p50']:.1f} ms, p99 {r['reset_p99']:.1f} ms | "
            f"ratio_fork_vs_reset={r['fork_p50'] / r['reset_p50']:.3f} | docker commit + start p50 "
            f"{r['commit_p50']:.1f} ms (carries the edits: {r['commit_sees_edits']}) (make {r['make_s']:.2f} s)",
            flush=True,
        )


if __name__ == "__main__":
    main()

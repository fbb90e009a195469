"""search-qa benchmark: world generation, index build, retrieval latency, env step, recall, expert vs floors.

    python benchmarks/search_qa.py [--passages 100000] [--questions 2000] [--episodes 300]

Baselines measured in the same run: bm25s's documented path (``bm25s.tokenize`` + ``BM25.index``
and ``BM25.retrieve``) for the index and retrieval numbers; the bare retriever call for the env
step; a random agent and a "search the question, answer the top title" agent for the expert.
Targets from issue 3 (2-core machine): retrieval p50 <= 2 ms, env step p50 <= 5 ms,
index build <= 30 s, 100k-passage index memory <= 1 GiB, recall@3 of gold queries >= 0.9.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.array(xs) * 1000, q))


def timed(fn, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def line(name: str, **values) -> None:
    print(
        f"{name:<28} "
        + "  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items())
    )


def bench_make(cache: str) -> tuple[float, float]:
    code = "import time,turngym;t=time.perf_counter();turngym.make('search-qa');print(time.perf_counter()-t)"
    env = {"TURNGYM_CACHE_DIR": cache, "PATH": "/usr/bin:/bin"}
    cold = float(
        subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        ).stdout
    )
    warm = float(
        subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        ).stdout
    )
    return cold, warm


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--passages", type=int, default=100_000)
    ap.add_argument("--questions", type=int, default=2_000)
    ap.add_argument("--episodes", type=int, default=300)
    ap.add_argument("--queries", type=int, default=500)
    args = ap.parse_args()

    import bm25s

    from turngym.envs.search.env import SearchQAEnv, format_call
    from turngym.envs.search.questions import generate_questions
    from turngym.envs.search.retriever import BM25Retriever
    from turngym.envs.search.world import World, WorldConfig

    # ---- generation + index build
    t = time.perf_counter()
    world = World.generate(WorldConfig(seed=0, n_passages=args.passages))
    gen_s = time.perf_counter() - t
    t = time.perf_counter()
    tasks = generate_questions(world, args.questions, seed=0)
    q_s = time.perf_counter() - t
    gc.collect()
    rss0 = rss_mib()
    retriever = BM25Retriever(world.corpus, use_cache=False)
    rss1 = rss_mib()
    build_s = retriever.build_seconds
    line("generate world", passages=len(world.corpus), seconds=gen_s, questions_s=q_s)
    line("index build (ours)", seconds=build_s, gen_plus_index_s=gen_s + build_s)
    line("index memory", arrays_mib=retriever.memory_bytes() / 2**20, rss_delta_mib=rss1 - rss0)

    texts = [world.corpus.text(i) for i in range(len(world.corpus))]
    t = time.perf_counter()
    baseline = bm25s.BM25()
    baseline.index(bm25s.tokenize(texts, stopwords="en", show_progress=False), show_progress=False)
    base_build = time.perf_counter() - t
    line("index build (bm25s api)", seconds=base_build, ratio_ours_vs_bm25s=build_s / base_build)

    with tempfile.TemporaryDirectory() as cache:
        t = time.perf_counter()
        BM25Retriever(world.corpus, cache_dir=cache)
        save_s = time.perf_counter() - t
        t = time.perf_counter()
        cached = BM25Retriever(world.corpus, cache_dir=cache)
        load_s = time.perf_counter() - t
        assert cached.loaded_from_cache
        line("index cache", build_and_save_s=save_s, load_s=load_s)

    # ---- retrieval latency
    rng = random.Random(0)
    queries = [q for task in tasks for q in task.gold_trace]
    rng.shuffle(queries)
    single = queries[: args.queries]
    it = iter(single)
    ours_1 = timed(lambda: retriever.retrieve([next(it)], 3), len(single))
    it = iter(single)
    base_1 = timed(
        lambda: baseline.retrieve(
            bm25s.tokenize([next(it)], stopwords="en", show_progress=False), k=3, show_progress=False
        ),
        len(single),
    )
    line("retrieve 1 query (ours)", p50_ms=pct(ours_1, 50), p99_ms=pct(ours_1, 99))
    line(
        "retrieve 1 query (bm25s)",
        p50_ms=pct(base_1, 50),
        p99_ms=pct(base_1, 99),
        speedup=pct(base_1, 50) / pct(ours_1, 50),
    )
    batches = [queries[i : i + 64] for i in range(0, min(len(queries), 64 * 40), 64)]
    it = iter(batches)
    ours_64 = timed(lambda: retriever.retrieve(next(it), 3), len(batches))
    it = iter(batches)
    base_64 = timed(
        lambda: baseline.retrieve(
            bm25s.tokenize(next(it), stopwords="en", show_progress=False), k=3, show_progress=False
        ),
        len(batches),
    )
    line("retrieve batch 64 (ours)", p50_ms=pct(ours_64, 50), p99_ms=pct(ours_64, 99))
    line(
        "retrieve batch 64 (bm25s)",
        p50_ms=pct(base_64, 50),
        p99_ms=pct(base_64, 99),
        speedup=pct(base_64, 50) / pct(ours_64, 50),
    )

    # ---- recall@3 of the gold passage for the gold queries
    hits = total = 0
    by_hop: dict[int, list[int]] = {}
    for task in tasks:
        for hop, (pid, docs) in enumerate(
            zip(task.supporting_ids, retriever.retrieve(task.gold_trace, 3), strict=True)
        ):
            ok = pid in [d.id for d in docs]
            hits += ok
            total += 1
            by_hop.setdefault(hop + 1, []).append(ok)
    line(
        "recall@3 gold queries",
        recall=hits / total,
        queries=total,
        **{f"hop{h}": sum(v) / len(v) for h, v in by_hop.items()},
    )
    bridges = [t for t in tasks if t.kind == "bridge"]
    q_hits = sum(
        t.supporting_ids[-1] in [d.id for d in retriever.retrieve([t.question], 3)[0]] for t in bridges
    )
    line("shortcut: question->last hop", recall_at_3=q_hits / len(bridges), bridge_questions=len(bridges))

    # ---- env step latency over the 100k corpus (parse + search + render + info)
    env = SearchQAEnv(corpus=world.corpus, tasks=tasks, retriever=retriever)
    steps, raw = [], []
    for seed in range(200):
        env.reset(seed=seed)
        query = env.current.gold_trace[0]
        action = format_call("hermes", "search", {"query": query})
        t = time.perf_counter()
        env.step(action)
        steps.append(time.perf_counter() - t)
        t = time.perf_counter()
        retriever.retrieve([query], 3)
        raw.append(time.perf_counter() - t)
    line(
        "env step search",
        p50_ms=pct(steps, 50),
        p99_ms=pct(steps, 99),
        overhead_vs_retrieve_ms=pct(steps, 50) - pct(raw, 50),
    )

    # ---- expert vs floors on the same tasks
    def play(policy) -> float:
        em = 0.0
        for seed in range(args.episodes):
            obs, info = env.reset(seed=seed)
            done = False
            while not done:
                obs, reward, terminated, truncated, info = env.step(policy(obs, info))
                done = terminated or truncated
            em += info["reward_components"]["em"]
        return em / args.episodes

    r = random.Random(1)
    vocab = [w for t in tasks[:200] for w in t.question.split()]

    def random_policy(obs, info):
        if r.random() < 0.3:
            return format_call("hermes", "answer", {"text": " ".join(r.sample(vocab, 2))})
        return format_call("hermes", "search", {"query": " ".join(r.sample(vocab, 3)), "k": r.randint(1, 5)})

    def naive_policy(obs, info):
        if obs and obs[0].content.startswith("Doc 1 (Title: "):
            return format_call(
                "hermes", "answer", {"text": obs[0].content.split("(Title: ", 1)[1].split(")", 1)[0]}
            )
        return format_call("hermes", "search", {"query": info["reference"]["question"], "k": 3})

    line(
        "EM on generated tasks",
        expert=play(lambda obs, info: env.expert_action()),
        random=play(random_policy),
        search_question_once=play(naive_policy),
        episodes=args.episodes,
    )

    # ---- turngym.make("search-qa") in a fresh process: cold (empty cache) and warm
    with tempfile.TemporaryDirectory() as cache:
        cold, warm = bench_make(cache)
    line("make('search-qa')", cold_s=cold, warm_s=warm)
    print(
        json.dumps(
            {"passages": len(world.corpus), "index_build_s": round(build_s, 2), "gen_s": round(gen_s, 2)}
        )
    )


if __name__ == "__main__":
    main()

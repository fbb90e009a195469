"""The OpenAI Agents SDK (``openai-agents``) playing a turngym env: model through the proxy, tools over MCP.

An ordinary Agents SDK program: an ``Agent`` with an ``OpenAIChatCompletionsModel`` (any
OpenAI-compatible endpoint) and an ``MCPServerStreamableHttp`` for its tools. The only env-specific
step is the MCP ``reset`` call that starts the episode and gives the task's messages.

    python examples/harness/openai_agents_arith.py --base-url http://127.0.0.1:8100/v1/episodes/ep1 \\
        --mcp-url http://127.0.0.1:8100/v1/episodes/ep1/mcp --api-key TOKEN --model tiny --task 3

Flags default to ``OPENAI_BASE_URL``, ``OPENAI_API_KEY``, ``TURNGYM_MCP_URL``, ``TURNGYM_TASK``.
``openai-agents`` pins other versions of ``openai`` and ``mcp`` than turngym's environment: install it
in a virtual environment of its own (docs/harness.md).
"""

from __future__ import annotations

import argparse
import asyncio
import os

from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, set_tracing_disabled
from agents.mcp import MCPServerStreamableHttp, create_static_tool_filter
from openai import AsyncOpenAI


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base-url", default=os.environ.get("OPENAI_BASE_URL"))
    p.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"))
    p.add_argument("--mcp-url", default=os.environ.get("TURNGYM_MCP_URL"))
    p.add_argument("--task", default=os.environ.get("TURNGYM_TASK", "0"))
    p.add_argument("--model", default="tiny")
    p.add_argument("--max-turns", type=int, default=10)
    args = p.parse_args()
    set_tracing_disabled(True)  # no traces to OpenAI's servers
    client = AsyncOpenAI(base_url=args.base_url, api_key=args.api_key, max_retries=0)
    tools = MCPServerStreamableHttp(
        params={"url": args.mcp_url, "headers": {"Authorization": f"Bearer {args.api_key}"}, "timeout": 60},
        tool_filter=create_static_tool_filter(blocked_tool_names=["reset"]),
        cache_tools_list=True,
        client_session_timeout_seconds=60,
    )
    async with tools:
        first = await tools.call_tool("reset", {"seed": int(args.task)})
        observation = (first.structured_content or {})["observation"]
        system = "\n".join(m["content"] for m in observation if m["role"] == "system")
        user = "\n".join(m["content"] for m in observation if m["role"] == "user")
        agent = Agent(
            name="solver",
            instructions=system,
            model=OpenAIChatCompletionsModel(model=args.model, openai_client=client),
            model_settings=ModelSettings(max_tokens=256),
            mcp_servers=[tools],
        )
        result = await Runner.run(agent, user, max_turns=args.max_turns)
        print(result.final_output)


if __name__ == "__main__":
    asyncio.run(main())

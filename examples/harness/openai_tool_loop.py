"""A plain OpenAI SDK tool loop that plays a turngym env: the model through the proxy, the tools over MCP.

Nothing here knows about turngym: it is the usual loop of ``chat.completions.create`` with ``tools``,
executing each ``tool_call`` on an MCP server and sending the result back as a ``tool`` message.

    turngym proxy --model tiny --env arith --out runs/harness     # prints the URL and the token
    python examples/harness/openai_tool_loop.py --base-url http://127.0.0.1:8100/v1/episodes/ep1 \\
        --mcp-url http://127.0.0.1:8100/v1/episodes/ep1/mcp --api-key TOKEN --model tiny --task 3

(``--task`` is the env's seed.) The flags default to ``OPENAI_BASE_URL``, ``OPENAI_API_KEY``,
``TURNGYM_MCP_URL`` and ``TURNGYM_TASK``, which ``turngym.proxy.harness.run_harness`` sets.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os

import httpx2
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client
from openai import AsyncOpenAI


def _schema(tool) -> dict:
    schema = dict(tool.input_schema)
    props = {k: v for k, v in (schema.get("properties") or {}).items() if k != "episode_id"}
    return {**schema, "properties": props}


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base-url", default=os.environ.get("OPENAI_BASE_URL"))
    p.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"))
    p.add_argument("--mcp-url", default=os.environ.get("TURNGYM_MCP_URL"))
    p.add_argument("--task", default=os.environ.get("TURNGYM_TASK", "0"))
    p.add_argument("--model", default="tiny")
    p.add_argument("--max-turns", type=int, default=8)
    args = p.parse_args()
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {args.api_key}"}, timeout=120)
    model = AsyncOpenAI(base_url=args.base_url, api_key=args.api_key, max_retries=0)
    async with Client(streamable_http_client(args.mcp_url, http_client=http), mode="legacy") as mcp:
        tools = [t for t in (await mcp.list_tools()).tools if t.name != "reset"]
        specs = [
            {
                "type": "function",
                "function": {"name": t.name, "description": t.description or "", "parameters": _schema(t)},
            }
            for t in tools
        ]
        first = await mcp.call_tool("reset", {"seed": int(args.task)})
        messages = [
            {"role": m["role"], "content": m["content"]} for m in first.structured_content["observation"]
        ]
        for _ in range(args.max_turns):
            reply = await model.chat.completions.create(model=args.model, messages=messages, tools=specs)
            msg = reply.choices[0].message
            messages.append(msg.model_dump(exclude_none=True))
            if not msg.tool_calls:
                break
            done = False
            for call in msg.tool_calls:
                result = await mcp.call_tool(call.function.name, json.loads(call.function.arguments))
                text = "\n".join(c.text for c in result.content if c.type == "text")
                messages.append({"role": "tool", "tool_call_id": call.id, "content": text})
                done = done or bool((result.structured_content or {}).get("terminated"))
            if done:
                break
    await http.aclose()


if __name__ == "__main__":
    asyncio.run(main())

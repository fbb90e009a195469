"""A minimal OpenAI-compatible chat server for fault injection (run as a separate process).

It answers every request with one tool call — ``search`` until the conversation holds two tool
results, then ``answer`` — after an optional delay (``--delay``), so a test can kill it with SIGKILL
mid-run, restart it on the same port, or make it slower than the client's timeout.

    python -m tests.reliability.chat_server --port 8123 [--delay 0.2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import uvicorn
from fastapi import FastAPI, Request


def build_app(delay: float) -> FastAPI:
    app = FastAPI()

    @app.get("/health")
    async def health() -> dict:
        return {"ok": True}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> dict:
        body = await request.json()
        await asyncio.sleep(delay)
        tool_results = sum(1 for m in body["messages"] if m.get("role") == "tool")
        name, args = ("search", {"query": "who"}) if tool_results < 2 else ("answer", {"text": "nobody"})
        return {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", "fault"),
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "tool_calls",
                    "message": {
                        "role": "assistant",
                        "content": "",
                        "tool_calls": [
                            {
                                "id": f"call_{tool_results}",
                                "type": "function",
                                "function": {"name": name, "arguments": json.dumps(args)},
                            }
                        ],
                    },
                }
            ],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }

    return app


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--delay", type=float, default=0.0)
    a = ap.parse_args()
    uvicorn.run(build_app(a.delay), host="127.0.0.1", port=a.port, log_level="warning")


if __name__ == "__main__":
    main()

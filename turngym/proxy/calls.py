"""The call routes (``POST /v1[/episodes/{e}]/chat/completions`` and ``.../completions``) as bare ASGI.

These two routes carry every model call, so they sit ahead of the FastAPI app (which serves the rest)
and do only what a call needs: read the body, find the episode, run the ``Proxy``, send the OpenAI
response (JSON, or SSE events straight from the finished generation). FastAPI/Starlette's middleware
stack, router and request objects cost more CPU than the proxy's own work on a short call, and on one
event loop that CPU is what 64 concurrent episodes queue behind (docs/harness.md, "Overhead"). The
guard (``turngym.remote.security``) stays outside: every request reaches this layer checked.

The episode of a call outside ``/v1/episodes/{e}/``: the ``X-Turngym-Episode`` header, else the key
``episode_from_api_key`` (``turngym.proxy.server``) put in the scope, else ``default``. A
``ProxyError`` becomes OpenAI's error JSON; any other failure a 500 in the same shape, logged.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable
from typing import Any

from turngym.proxy.episodes import check_key
from turngym.proxy.responses import chat_chunks, chat_completion, text_chunks, text_completion
from turngym.proxy.service import Proxy
from turngym.proxy.wire import ProxyError, parse_chat_request, parse_text_request

log = logging.getLogger(__name__)

EPISODE_HEADER = b"x-turngym-episode"
#: the scope key under which ``episode_from_api_key`` leaves the episode named by the API key
EPISODE_SCOPE_KEY = "turngym.proxy.episode"
_CALL_PATH = re.compile(r"/v1(?:/episodes/([^/]+))?/(chat/completions|completions)")
_JSON = [(b"content-type", b"application/json")]
_SSE = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]


def call_routes(app: Any, proxy: Proxy) -> Any:
    """``app`` with the call routes answered ahead of it (everything else goes to ``app``)."""
    tokenizer = proxy.model.tokenizer

    async def calls(scope: dict, receive: Any, send: Any) -> None:
        m = _CALL_PATH.fullmatch(scope["path"]) if scope["type"] == "http" else None
        if m is None:
            await app(scope, receive, send)
            return
        try:
            if scope["method"] != "POST":
                raise ProxyError(405, f"{scope['method']} is not allowed here; POST a request")
            raw = await _read_body(receive)
            if raw is None:
                return  # the client left before sending its request
            body = _json_body(raw)
            key = _episode(scope, m.group(1))
            if m.group(2) == "chat/completions":
                ep = proxy.store.live.get(key)  # its last request's messages, parsed already
                req = parse_chat_request(body, ep.known if ep is not None else None)
                result = await proxy.chat(key, req)
                if req.stream:
                    chunks = chat_chunks(
                        result, tokenizer, logprobs=req.logprobs, include_usage=req.include_usage
                    )
                    await _send_events(send, chunks)
                    return
                out = chat_completion(result, tokenizer, logprobs=req.logprobs)
            else:
                treq = parse_text_request(body)
                tresult = await proxy.complete(key, treq)
                lp = treq.logprobs is not None
                if treq.stream:
                    await _send_events(
                        send, text_chunks(tresult, tokenizer, logprobs=lp, include_usage=treq.include_usage)
                    )
                    return
                out = text_completion(tresult, tokenizer, logprobs=lp)
        except ProxyError as e:
            await _send(send, e.status, json.dumps(e.body()).encode(), _JSON)
            return
        except Exception as e:  # noqa: BLE001 - a fault of ours: an OpenAI-style 500, and the log
            log.exception("the proxy failed on %s", scope["path"])
            err = ProxyError(500, f"internal error: {type(e).__name__}: {e}", code="internal_error")
            await _send(send, 500, json.dumps(err.body()).encode(), _JSON)
            return
        await _send(send, 200, out.model_dump_json(exclude_none=True).encode(), _JSON)

    return calls


async def _read_body(receive: Any) -> bytes | None:
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


def _json_body(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ProxyError(400, f"the body is not JSON: {e}") from None


def _episode(scope: dict, path_key: str | None) -> str:
    if path_key is not None:
        return check_key(path_key)
    for name, value in scope.get("headers") or ():
        if bytes(name).lower() == EPISODE_HEADER and value:
            return check_key(bytes(value).decode("latin-1"))
    from_key = scope.get(EPISODE_SCOPE_KEY)
    return check_key(from_key) if from_key else "default"


async def _send(send: Any, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    length = (b"content-length", str(len(body)).encode())
    await send({"type": "http.response.start", "status": status, "headers": [*headers, length]})
    await send({"type": "http.response.body", "body": body})


async def _send_events(send: Any, items: Iterable[Any]) -> None:
    """SSE: one ``data:`` event per chunk, then ``data: [DONE]``."""
    await send({"type": "http.response.start", "status": 200, "headers": _SSE})
    for item in items:
        event = f"data: {item.model_dump_json(exclude_none=True)}\n\n".encode()
        await send({"type": "http.response.body", "body": event, "more_body": True})
    await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})

"""The JSON error replies of every ``turngym serve`` route (native, OpenEnv): ``{"detail": {"error",
"kind"}}`` with the status of :data:`~turngym.remote.protocol.ERROR_STATUS`, the message always short
(never the request's input echoed back whole), an unexpected exception a JSON 500 (details logged)."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from turngym.remote.protocol import ERROR_STATUS, ErrorBody, ServeError, excerpt

log = logging.getLogger(__name__)


def add_error_handlers(app: Any) -> None:
    """Answer ``app``'s refusals, malformed requests and failures as JSON."""

    @app.exception_handler(ServeError)
    async def _serve_error(request: Request, e: ServeError) -> JSONResponse:
        return JSONResponse(status_code=e.status, content={"detail": e.body().model_dump()})

    @app.exception_handler(RequestValidationError)
    async def _malformed(request: Request, e: RequestValidationError) -> JSONResponse:
        return malformed_reply(e)

    @app.exception_handler(Exception)
    async def _internal(request: Request, e: Exception) -> JSONResponse:
        return internal_reply(e)


def malformed_reply(e: RequestValidationError) -> JSONResponse:
    """422 for a request that is not the protocol's: each field's location and message, never its input."""
    parts = [f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors()]
    body = ErrorBody(error=excerpt("malformed request: " + "; ".join(parts[:5])), kind="malformed")
    return JSONResponse(status_code=ERROR_STATUS["malformed"], content={"detail": body.model_dump()})


def internal_reply(e: Exception) -> JSONResponse:
    """500 as JSON: the exception's type and a short excerpt of its message (the rest is logged)."""
    log.error("request failed", exc_info=e)
    body = ErrorBody(error=excerpt(f"{type(e).__name__}: {e}", 300), kind="internal")
    return JSONResponse(status_code=500, content={"detail": body.model_dump()})

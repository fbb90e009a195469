"""Envs served out: ``turngym serve`` (HTTP/WebSocket, OpenEnv, MCP) and the ``RemoteEnv`` client.

See docs/interop.md ("Envs served out"). Nothing heavy is imported here: the server needs FastAPI and
uvicorn, the client httpx and websockets.
"""

from turngym.remote.client import RemoteEnv, RemoteEnvError, RemoteEnvLost

__all__ = ["RemoteEnv", "RemoteEnvError", "RemoteEnvLost"]

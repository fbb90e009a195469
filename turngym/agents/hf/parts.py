"""What an engine's parts (scheduler, KV manager, runner) see of the engine they serve: the typed
surface of ``HFBackend`` they may use, so that they depend on this protocol and not on the front end."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Protocol

from turngym.agents.hf.request import Request


class Engine(Protocol):
    """The front end's state and services, as the parts use them."""

    model: Any
    device: Any
    pad_id: int
    max_batch_size: int
    fuse_tokens: int
    reuse_prefix: bool
    park_s: float
    weights_version: int
    epoch: int
    donors: dict[str, str]
    stats: dict[str, Any]
    trace: list[tuple] | None
    lock: threading.Lock
    kernels: Callable[[], Any]

    def take_released(self) -> set[str]: ...

    def may_resume(self, r: Request, released: set[str], now: float) -> bool: ...

    def deliver(self, r: Request, park: bool) -> bool: ...

    def iteration_done(self) -> None: ...

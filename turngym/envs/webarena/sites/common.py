"""What the arena-style sites share: word lists for generated people and text, small request helpers."""

from __future__ import annotations

from typing import Any

import numpy as np

ADJECTIVES = (
    "quiet", "brave", "lucky", "silver", "rapid", "mellow", "cosmic", "gentle", "bold", "sunny", "frosty", "clever",
    "dusty", "wild", "noble", "witty", "amber", "crimson", "hidden", "lazy",
)  # fmt: skip
ANIMALS = (
    "otter", "falcon", "panda", "lynx", "heron", "badger", "koala", "raven", "tiger", "whale", "gecko", "bison",
    "moose", "owl", "fox", "yak", "crane", "marten", "ibis", "seal",
)  # fmt: skip


def usernames(rng: np.random.Generator, n: int) -> list[str]:
    """``n`` distinct usernames like ``quiet_otter42``."""
    out: list[str] = []
    while len(out) < n:
        name = f"{ADJECTIVES[rng.integers(len(ADJECTIVES))]}_{ANIMALS[rng.integers(len(ANIMALS))]}{rng.integers(10, 99)}"
        if name not in out:
            out.append(name)
    return out


def pick(rng: np.random.Generator, items: tuple[str, ...] | list[str]) -> str:
    return items[int(rng.integers(len(items)))]


def html_response(text: str, status: int = 200) -> Any:
    from starlette.responses import HTMLResponse

    return HTMLResponse(text, status)


def redirect(url: str) -> Any:
    from starlette.responses import RedirectResponse

    return RedirectResponse(url, 303)

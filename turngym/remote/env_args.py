"""Which ``make()`` arguments a ``turngym serve`` client may set, and the checks on their values.

A client's ``kwargs`` reach the server's ``make(env_id, **kwargs)``: a command, a path or a URL there
runs, reads or fetches on the server's host. So:

* nothing is client-settable unless the operator allow-lists it for that env (``--client-arg NAME``
  for every served env, ``--client-arg ENV:NAME`` for one);
* some arguments are never client-settable, allow-listed or not, judged from the env constructor's
  parameter name and type: anything that names a command, a path, a URL or host, a container image or
  package, an object (a retriever, a judge), or a resource limit or size (``max_*``, ``n_*``,
  ``*timeout*``, ``pool*``, ...). Allow-listing one is an error when the server starts;
* the operator's own arguments (``--env-arg``) always win: a client may repeat one with the same
  value, never change it;
* an allow-listed value is validated against the parameter's annotation (a dict where an ``int`` is
  expected is a 400, not a crash inside the env).

:class:`ArgPolicy` holds one env's rules; :func:`never_settable` says why a name is refused.
"""

from __future__ import annotations

import inspect
import os
import pathlib
import re
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import TypeAdapter, ValidationError

#: name parts that make an argument never client-settable, by what they name
NEVER_PARTS: dict[str, frozenset[str]] = {
    "a command": frozenset(
        "command commands cmd cmds exec shell script entrypoint argv args servers server plugin".split()
    ),
    "a path": frozenset("path paths dir dirs directory file files root src cache db snapshot corpus".split())
    | frozenset("tasks catalog goals queries data dataset home cwd workdir mount".split()),
    "a URL or host": frozenset(
        "url urls uri endpoint host hosts port retriever proxy remote sites api".split()
    ),
    "an image or package": frozenset(
        "image images docker container containers packages package requires index registry".split()
    ),
    "a resource limit or size": frozenset(
        "max min limit limits timeout timeouts pool warm workers worker concurrency memory mem cpu cpus".split()
    )
    | frozenset("size n per count budget active wait chars rows parallel threads procs gpu gpus".split()),
    "a code object or policy": frozenset(
        "judge kwargs env_kwargs callback hook factory allow unpinned".split()
    ),
}
_SAFE_LEAVES = (bool, int, float, str, type(None))


def never_settable(name: str, annotation: Any = inspect.Parameter.empty) -> str | None:
    """Why a client may never set ``name`` (``"it names a path"``), or None."""
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]{0,63}", name):
        return "it is not a plain argument name"
    parts = set(re.split(r"_+", name.lower())) | {name.lower()}
    named = [what for what, words in NEVER_PARTS.items() if parts & words]
    if named:
        return "it names " + " or ".join(named)
    if annotation is not inspect.Parameter.empty and not _plain(annotation):
        return "its type is not plain JSON data (a path, an object or code)"
    return None


def _plain(annotation: Any) -> bool:
    """Whether every value of ``annotation`` is JSON data (numbers, strings, booleans, None, lists and
    dicts of them, literals); ``Any`` counts as plain (the name rules still apply)."""
    if annotation is Any or annotation in _SAFE_LEAVES:
        return True
    if annotation in (os.PathLike, pathlib.Path, pathlib.PurePath, bytes):
        return False
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return all(isinstance(v, _SAFE_LEAVES) for v in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType, list, tuple, dict, set, frozenset) or (
        origin is not None and getattr(origin, "__module__", "") == "collections.abc"
    ):
        if origin is not None and getattr(origin, "__module__", "") == "collections.abc":
            if origin.__name__ not in ("Sequence", "Mapping", "Iterable", "Collection"):
                return False
        return all(a is Ellipsis or _plain(a) for a in typing.get_args(annotation))
    return False


def constructor_params(factory: Callable[..., Any]) -> tuple[dict[str, Any], bool]:
    """``(name -> annotation, takes **kwargs)`` of an env's constructor; annotations that cannot be
    resolved count as unknown (``inspect.Parameter.empty``)."""
    try:
        sig = inspect.signature(factory)
    except (TypeError, ValueError):
        return {}, True
    try:
        hints = typing.get_type_hints(factory.__init__ if inspect.isclass(factory) else factory)
    except Exception:  # noqa: BLE001 - unresolvable forward references: judge by name alone
        hints = {}
    params: dict[str, Any] = {}
    var_kw = False
    for name, p in sig.parameters.items():
        if p.kind is inspect.Parameter.VAR_KEYWORD:
            var_kw = True
        elif p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY):
            params[name] = hints.get(name, p.annotation)
    return params, var_kw


class ArgRefused(Exception):
    """A client's make() argument refused; ``kind`` is a protocol error kind."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


@dataclass
class ArgPolicy:
    """One served env's make() arguments: the operator's (``fixed``) and the client-settable names."""

    env_id: str
    fixed: dict[str, Any] = field(default_factory=dict)
    allowed: frozenset[str] = frozenset()
    params: dict[str, Any] = field(default_factory=dict)
    var_kw: bool = True

    @classmethod
    def build(
        cls, env_id: str, factory: Callable[..., Any], fixed: Mapping[str, Any], allowed: Iterable[str]
    ) -> ArgPolicy:
        """The policy, refusing (``ValueError``) an allow-listed name that is never client-settable."""
        params, var_kw = constructor_params(factory)
        names = frozenset(allowed)
        for name in sorted(names):
            why = never_settable(name, params.get(name, inspect.Parameter.empty))
            if why is not None:
                raise ValueError(
                    f"--client-arg {name!r} for {env_id}: never client-settable ({why}); set it on the "
                    "server with --env-arg instead"
                )
            if name not in params and not var_kw:
                raise ValueError(f"--client-arg {name!r}: {env_id} takes no argument of that name")
        return cls(env_id=env_id, fixed=dict(fixed), allowed=names, params=params, var_kw=var_kw)

    def merge(self, client: Mapping[str, Any]) -> dict[str, Any]:
        """The make() arguments for a client's ``kwargs``; raises :class:`ArgRefused`."""
        out = dict(self.fixed)
        for name, value in client.items():
            if name in self.fixed:
                if _equal(value, self.fixed[name]):
                    continue
                raise ArgRefused(
                    "forbidden_arg", f"make() argument {_short(name)!r} is set by the server's operator"
                )
            if name not in self.allowed:
                why = never_settable(name, self.params.get(name, inspect.Parameter.empty))
                hint = (
                    f"never client-settable ({why})"
                    if why
                    else f"not client-settable here (the operator may allow it: --client-arg {name})"
                )
                raise ArgRefused(
                    "forbidden_arg", f"make() argument {_short(name)!r} of {self.env_id}: {hint}"
                )
            annotation = self.params.get(name, inspect.Parameter.empty)
            if annotation not in (inspect.Parameter.empty, Any):
                try:
                    value = TypeAdapter(annotation).validate_python(value)
                except ValidationError as e:
                    first = e.errors()[0]["msg"] if e.errors() else "invalid"
                    raise ArgRefused(
                        "bad_request", f"make() argument {name!r} of {self.env_id}: {_short(first)}"
                    ) from None
                except Exception:  # noqa: BLE001 - an annotation pydantic cannot check: refuse
                    raise ArgRefused(
                        "forbidden_arg", f"make() argument {name!r} of {self.env_id}: cannot be checked"
                    ) from None
            out[name] = value
        return out


def _equal(a: Any, b: Any) -> bool:
    try:
        return bool(a == b) and type(a) is type(b)
    except Exception:  # noqa: BLE001 - odd values are not equal
        return False


def _short(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[:limit] + "..."

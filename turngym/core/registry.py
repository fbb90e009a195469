"""Environment registry: versioned ids, lazy entry points, plugin discovery, Gymnasium mirroring.

``register("search-qa-v0", "turngym.envs.search.env:SearchQAEnv", max_turns=6)`` records a
spec without importing anything; ``make("search-qa")`` picks the latest version, merges
defaults with overrides and imports the class only then. Third-party packages register
through the entry-point group ``turngym.envs`` (a callable that registers, or a module
whose import registers). Every env is also registered in Gymnasium as ``turngym/<id>``.

``make`` sets ``env.spec`` as ``gymnasium.make`` does: the env's ``EnvSpec`` (a
``gymnasium.envs.registration.EnvSpec``) with ``kwargs`` holding the defaults merged with the
overrides it was made with, so ``env.spec.id`` names the env (``"search-qa-v0"``).
"""

from __future__ import annotations

import difflib
import re
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from gymnasium.envs.registration import EnvSpec as GymEnvSpec

from turngym.core.plugins import load_entry_points, load_object

ENTRY_POINT_GROUP = "turngym.envs"
GYM_NAMESPACE = "turngym"
_ID_RE = re.compile(r"^(?P<name>[a-z0-9][a-z0-9_.-]*?)(?:-v(?P<version>\d+))?$")
_F = TypeVar("_F", bound=Callable[..., Any])


def keyed_decorator(table: dict[Any, _F]) -> Callable[..., Callable[[_F], _F]]:
    """A decorator factory filling a dispatch table: ``@handles("a", "b")``, with
    ``handles = keyed_decorator(table)``, puts the function in ``table`` under each key."""

    def under(*keys: Any) -> Callable[[_F], _F]:
        def deco(fn: _F) -> _F:
            for key in keys:
                table[key] = fn
            return fn

        return deco

    return under


class UnknownEnvError(KeyError):
    """No environment with this id; the message lists close matches."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


@dataclass
class EnvSpec(GymEnvSpec):
    """A registered env: a Gymnasium ``EnvSpec`` (``id`` ``"name-vN"``, ``entry_point``, ``kwargs``
    = constructor defaults; ``name``/``version`` derived from the id) plus turngym's catalogue fields.

    The registry's specs are shared: treat them as read-only. ``make`` gives each env its own copy
    as ``env.spec`` (``kwargs`` = defaults merged with the overrides).
    """

    # turngym envs keep their own order checks and run no Gymnasium env checker when made
    order_enforce: bool = False
    disable_env_checker: bool = True
    description: str = ""
    family: str = ""
    requires: tuple[str, ...] = ()  # extras needed, e.g. ("docker",)
    source: str = "turngym"  # the package that registered it
    # "module:attr" of the env's published judge (a turngym.core.judging.EnvJudge), if any
    judge: str | None = None

    def load(self) -> Callable[..., Any]:
        if callable(self.entry_point):
            return self.entry_point
        try:
            return load_object(self.entry_point, f"entry point of {self.id!r}")
        except ImportError as e:
            hint = (
                f" (install the extra: pip install 'turngym[{','.join(self.requires)}]')"
                if self.requires
                else ""
            )
            raise ImportError(f"cannot load env {self.id!r}: {e}{hint}") from e

    def load_judge(self) -> Any:
        """The ``EnvJudge`` this env publishes (``judge="module:attr"`` at registration), or None."""
        if not self.judge:
            return None
        return load_object(self.judge, f"judge of {self.id!r}")

    # --- what callers may know about an env without constructing one (its class's declarations)
    def parser(self, overrides: dict[str, Any] | None = None) -> Any:
        """The tool-call parser (a registered name or a parser object) episodes of this env use with
        ``overrides``: the caller's ``parser``, else the registered default, else Hermes."""
        return {**self.kwargs, **(overrides or {})}.get("parser", "hermes")

    def open_ended(self) -> bool:
        """Whether the env declares no checkable outcome (its class's ``open_ended``, e.g. travel-open:
        judged pairwise, outcome always 0)."""
        return bool(getattr(self.load(), "open_ended", False))

    def builds_in_thread(self) -> bool:
        """False where the env's class says its constructor is cheap (``Env.construct_in_thread``)."""
        return getattr(self.load(), "construct_in_thread", True) is not False

    def make(self, **overrides: Any) -> Any:
        """Construct the env with the defaults merged with ``overrides``; sets ``env.spec``."""
        kwargs = {**self.kwargs, **overrides}
        env = self.load()(**kwargs)
        _attach_spec(env, replace(self, kwargs=kwargs))
        return env


def _attach_spec(env: Any, spec: EnvSpec) -> None:
    """``env.unwrapped.spec = spec`` as ``gymnasium.make`` does (a wrapper's ``spec`` is derived from it);
    an entry point that returns something that takes no attributes is left alone."""
    try:
        getattr(env, "unwrapped", env).spec = spec
    except (AttributeError, TypeError):
        pass


def parse_id(env_id: str) -> tuple[str, int | None]:
    """``"search-qa-v2"`` -> ``("search-qa", 2)``; ``"search-qa"`` -> ``("search-qa", None)``."""
    if env_id.startswith(GYM_NAMESPACE + "/"):
        env_id = env_id[len(GYM_NAMESPACE) + 1 :]
    m = _ID_RE.match(env_id)
    if not m:
        raise ValueError(f"malformed env id {env_id!r}: use lowercase 'name' or 'name-vN'")
    version = m.group("version")
    return m.group("name"), int(version) if version is not None else None


class Registry(Mapping[str, EnvSpec]):
    """All registered env specs, keyed by full id (``name-vN``)."""

    def __init__(self) -> None:
        self._specs: dict[str, EnvSpec] = {}
        self._plugins_loaded = False
        self._lock = threading.RLock()
        self.plugin_errors: dict[str, str] = {}

    # Mapping API (plugins are discovered on first use)
    def __getitem__(self, env_id: str) -> EnvSpec:
        return self.spec(env_id)

    def __iter__(self) -> Iterator[str]:
        self.load_plugins()
        return iter(sorted(self._specs))

    def __len__(self) -> int:
        self.load_plugins()
        return len(self._specs)

    def __contains__(self, env_id: object) -> bool:
        if not isinstance(env_id, str):
            return False
        try:
            self.spec(env_id)
            return True
        except (UnknownEnvError, ValueError):
            return False

    def register(
        self,
        env_id: str,
        entry_point: str | Callable[..., Any],
        *,
        description: str = "",
        family: str = "",
        requires: tuple[str, ...] | list[str] = (),
        source: str = "turngym",
        judge: str | None = None,
        override: bool = False,
        **kwargs: Any,
    ) -> EnvSpec:
        name, version = parse_id(env_id)
        version = 0 if version is None else version
        full = f"{name}-v{version}"
        with self._lock:
            if full in self._specs and not override:
                raise ValueError(f"env {full!r} is already registered (pass override=True to replace it)")
            spec = EnvSpec(
                id=full,
                entry_point=entry_point,
                kwargs=dict(kwargs),
                description=description,
                family=family or name,
                requires=tuple(requires),
                source=source,
                judge=judge,
            )
            self._specs[full] = spec
        _register_in_gymnasium(spec)
        return spec

    def spec(self, env_id: str) -> EnvSpec:
        name, version = parse_id(env_id)
        with self._lock:
            spec = self._find(name, version)
            if spec is None and not self._plugins_loaded:
                self.load_plugins()
                spec = self._find(name, version)
        if spec is None:
            raise UnknownEnvError(self._unknown_message(env_id, name, version))
        return spec

    def _find(self, name: str, version: int | None) -> EnvSpec | None:
        if version is not None:
            return self._specs.get(f"{name}-v{version}")
        versions = [s for s in self._specs.values() if s.name == name]
        return max(versions, key=lambda s: s.version) if versions else None

    def _unknown_message(self, env_id: str, name: str, version: int | None) -> str:
        known_versions = sorted(s.id for s in self._specs.values() if s.name == name)
        if known_versions:
            return f"env {env_id!r} has no version {version}; registered: {', '.join(known_versions)}"
        names = sorted({s.name for s in self._specs.values()})
        close = difflib.get_close_matches(name, names, n=3, cutoff=0.5)
        hint = f" Did you mean: {', '.join(close)}?" if close else ""
        return f"unknown env {env_id!r}.{hint} Registered: {', '.join(names) or '(none)'}"

    def make(self, env_id: str, /, **kwargs: Any) -> Any:
        return self.spec(env_id).make(**kwargs)

    def latest(self) -> list[EnvSpec]:
        """The newest version of every env name."""
        self.load_plugins()
        best: dict[str, EnvSpec] = {}
        for s in self._specs.values():
            if s.name not in best or s.version > best[s.name].version:
                best[s.name] = s
        return [best[n] for n in sorted(best)]

    def load_plugins(self, force: bool = False) -> None:
        """Discover third-party envs through the ``turngym.envs`` entry-point group."""
        with self._lock:
            if self._plugins_loaded and not force:
                return
            self._plugins_loaded = True
            load_entry_points(ENTRY_POINT_GROUP, self.plugin_errors)

    def unregister(self, env_id: str) -> None:
        spec = self.spec(env_id)
        with self._lock:
            self._specs.pop(spec.id, None)
        try:
            import gymnasium

            gymnasium.registry.pop(f"{GYM_NAMESPACE}/{spec.id}", None)
        except ImportError:
            pass


def _register_in_gymnasium(spec: EnvSpec) -> None:
    import gymnasium

    gym_id = f"{GYM_NAMESPACE}/{spec.id}"
    gymnasium.registry.pop(gym_id, None)
    gymnasium.register(
        id=gym_id,
        entry_point=spec.entry_point,
        kwargs=dict(spec.kwargs),
        disable_env_checker=True,
        order_enforce=False,
    )


registry = Registry()


def register(env_id: str, entry_point: str | Callable[..., Any], **kwargs: Any) -> EnvSpec:
    """Register an env. Keyword arguments other than the spec's own fields are constructor defaults."""
    return registry.register(env_id, entry_point, **kwargs)


def make(env_id: str, /, **kwargs: Any) -> Any:
    """Make an env by id (``name`` = latest version, ``name-vN``, or ``turngym/name-vN``).

    ``env_id`` is positional-only, so an env may take an ``env_id`` keyword of its own (``remote``)."""
    return registry.make(env_id, **kwargs)


def spec(env_id: str) -> EnvSpec:
    return registry.spec(env_id)

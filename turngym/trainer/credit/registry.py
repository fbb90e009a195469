"""The registry of credit methods: ``credit.method`` names a method, ``credit.<method>`` holds its options.

A method is one builder function, registered with its settings model::

    from pydantic import BaseModel

    from turngym.trainer.credit.registry import CreditContext, credit_method


    class ConstantSettings(BaseModel):
        value: float = 1.0


    @credit_method("constant", settings=ConstantSettings)
    def build(settings: ConstantSettings, ctx: CreditContext):
        return Constant(settings.value)  # a CreditMethod, or a whole CreditPipeline

The config then accepts ``credit.method=constant`` and ``credit.constant.value=0.5``. The built-in
methods register themselves in their modules (``grpo.py``, ``igpo.py``, ...); a third-party module
registers when it is imported, or through the entry-point group ``turngym.credit`` (the entry
point names the module; a callable it names is called once)::

    [project.entry-points."turngym.credit"]
    constant = "my_pkg.credit"
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

from turngym.core.plugins import load_entry_points
from turngym.trainer.credit.base import OutcomeReward

if TYPE_CHECKING:
    from turngym.trainer.credit.pipeline import CreditPipeline

log = logging.getLogger("turngym.trainer.credit")

ENTRY_POINT_GROUP = "turngym.credit"
BUILTIN_MODULES = ("grpo", "igpo", "gated", "arena", "pointwise", "gigpo", "dual_level", "tree", "vine")
#: names a method cannot take: the keys and attributes of ``CreditSettings`` besides the method sections
RESERVED = frozenset({"method", "outcome_component", "norm_by_std", "leave_one_out", "options"})


class MethodSettings(BaseModel):
    """Base of a method's options (``credit.<method>``): unknown keys are errors."""

    model_config = ConfigDict(extra="forbid")


class NoSettings(MethodSettings):
    """The options of a method that has none."""


@dataclass(frozen=True)
class CreditContext:
    """What a builder may need besides its own settings.

    ``credit``: the whole ``credit`` section (its shared options: ``outcome_component``,
    ``norm_by_std``, ``leave_one_out``); ``outcome``: the outcome provider those options describe;
    ``model``/``tokenizer``: the model being trained (None outside the trainer); ``seed``: the run
    seed; ``judge``: a judge passed to ``Trainer(config, judge=...)``, if any; ``parser``: the env's
    tool-call parser (how the policy writes a call: IGPO's answer frame), if known; ``env``: the id
    of the env being trained (its published judge and rubric: ``arena``), if known.
    """

    credit: Any = None
    model: Any = None
    tokenizer: Any = None
    seed: int = 0
    judge: Callable | None = None
    outcome: OutcomeReward = field(default_factory=OutcomeReward)
    parser: Any = None  # the env's tool-call parser (how the policy writes calls), if known
    env: str | None = None  # the env id being trained, if known


Builder = Callable[[Any, CreditContext], Any]


@dataclass(frozen=True)
class MethodSpec:
    """A registered method: its name, options model, builder and deprecated flat keys
    (``legacy_keys``: ``credit.<flat key>`` -> the field of ``credit.<name>`` it means)."""

    name: str
    settings: type[BaseModel]
    build: Builder
    legacy_keys: dict[str, str] = field(default_factory=dict)
    module: str = ""


_METHODS: dict[str, MethodSpec] = {}
_LOCK = threading.RLock()
_loaded = False
plugin_errors: dict[str, str] = {}


def credit_method(
    name: str,
    settings: type[BaseModel] | None = None,
    *,
    legacy_keys: dict[str, str] | None = None,
) -> Callable[[Builder], Builder]:
    """Register ``build(settings, ctx) -> CreditPipeline | CreditMethod`` as the method ``name``.

    ``settings``: a pydantic model of the method's options (``credit.<name>``); every field needs a
    default for the method to be usable without options. Registering a name again replaces it.
    """
    if not name or not name.isidentifier() or name in RESERVED or hasattr(BaseModel, name):
        raise ValueError(
            f"credit method name {name!r} must be an identifier that is not a shared credit option "
            f"or a pydantic attribute (it is a config key: credit.{name})"
        )

    def register(build: Builder) -> Builder:
        spec = MethodSpec(
            name, settings or NoSettings, build, dict(legacy_keys or {}), getattr(build, "__module__", "")
        )
        with _LOCK:
            _METHODS[name] = spec
        return build

    return register


def unregister_credit_method(name: str) -> None:
    with _LOCK:
        _METHODS.pop(name, None)


def _load() -> None:
    """Import the built-in method modules and the ``turngym.credit`` entry points (once)."""
    global _loaded
    if _loaded:
        return
    with _LOCK:
        if _loaded:
            return
        for module in BUILTIN_MODULES:
            importlib.import_module(f"turngym.trainer.credit.{module}")
        _loaded = True
        load_entry_points(ENTRY_POINT_GROUP, plugin_errors)


def registered_credit_methods() -> list[str]:
    """The names ``credit.method`` accepts, sorted."""
    _load()
    return sorted(_METHODS)


def credit_methods() -> dict[str, MethodSpec]:
    """Every registered method by name."""
    _load()
    return dict(_METHODS)


def get_credit_method(name: str) -> MethodSpec:
    _load()
    spec = _METHODS.get(name)
    if spec is None:
        raise ValueError(f"unknown credit method {name!r}; known: {', '.join(registered_credit_methods())}")
    return spec


def build_credit_pipeline(
    credit: Any,
    *,
    model: Any = None,
    tokenizer: Any = None,
    seed: int = 0,
    judge: Callable | None = None,
    parser: Any = None,
    env: str | None = None,
) -> CreditPipeline:
    """The pipeline of ``credit.method`` (``credit``: a ``CreditSettings``), built by its builder."""
    from turngym.trainer.credit.pipeline import CreditPipeline

    spec = get_credit_method(credit.method)
    ctx = CreditContext(
        credit=credit,
        model=model,
        tokenizer=tokenizer,
        seed=seed,
        judge=judge,
        outcome=OutcomeReward(component=credit.outcome_component),
        parser=parser,
        env=env,
    )
    built = spec.build(credit.options(spec.name), ctx)
    pipeline = built if isinstance(built, CreditPipeline) else CreditPipeline(built)
    if pipeline.name is None:
        pipeline.name = spec.name
    return pipeline

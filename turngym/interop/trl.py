"""turngym envs in TRL's ``GRPOTrainer`` through its ``environment_factory`` hook (trl >= 1.16).

    from turngym.interop.trl import grpo_trainer
    trainer = grpo_trainer("arith", "Qwen/Qwen3-0.6B", seeds=range(64), args=GRPOConfig(...))
    trainer.train()

or with the building blocks, for a trainer set up by hand::

    GRPOTrainer(
        model=model,
        train_dataset=prompt_dataset("arith", seeds=range(64)),
        environment_factory=environment_factory("arith"),
        reward_funcs=[component_reward("correct")],   # optional: the return is the env's own reward
        args=GRPOConfig(reward_weights=[0.0], ...),    # weight 0: logged, not trained on
    )

* **Prompts**: :func:`prompt_dataset` stores each seed's first messages as the ``prompt`` column;
  TRL's ``reset(**row)`` resets the env on that seed and refuses a row built for another task.
  Tools are rendered by the chat template, so the env uses ``parser="openai"``.
* **Tools**: each env tool becomes a method with a signature and docstring built from its schema;
  one call is one turngym step, and turngym's validation errors come back as ``Error: ...``.
* **Rewards**: ``get_reward`` is the episode's return; :func:`component_reward` makes one reward
  component a TRL reward function. An env that raises mid-episode makes the completion unscorable
  (every reward ``None``: TRL gives it zero advantage).

docs/interop.md maps a turngym episode onto TRL's loop in full.
"""

from __future__ import annotations

import inspect
import keyword
import logging
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal, Union

from turngym.core.registry import registry
from turngym.core.types import Message, ToolCall, ToolSpec

logger = logging.getLogger(__name__)

#: Env constructor arguments the adapter sets: TRL renders tools natively and sends structured calls.
ADAPTER_MAKE_KWARGS = {"parser": "openai", "tools_in_prompt": False}
#: Method names TRL reserves on an environment class: a tool may not use them.
RESERVED = frozenset({"reset", "get_reward"})


class EpisodeError(RuntimeError):
    """The turngym env raised during an episode; the completion is unscorable (reward ``None``)."""


# ---------------------------------------------------------------------------- tool signatures
_JSON_TYPES: dict[str, Any] = {
    "string": str,
    "integer": int,
    "number": float,
    "boolean": bool,
    "object": dict,
    "null": type(None),
}


def schema_type(schema: dict[str, Any]) -> Any:
    """The Python type hint whose ``transformers`` JSON schema matches ``schema`` as closely as a hint can
    (``enum`` -> ``Literal``, ``array`` -> ``list[...]``, unions -> ``Union``); ``Any`` when unknown."""
    if not isinstance(schema, dict):
        return Any
    if "enum" in schema and schema["enum"]:
        values = [v for v in schema["enum"] if isinstance(v, (str, int, float, bool)) or v is None]
        if values:
            return Literal[tuple(values)]  # type: ignore[valid-type]
    if "const" in schema and isinstance(schema["const"], (str, int, float, bool)):
        return Literal[schema["const"]]  # type: ignore[valid-type]
    options = schema.get("anyOf") or schema.get("oneOf")
    if options:
        return _union([schema_type(o) for o in options])
    kind = schema.get("type")
    if isinstance(kind, list):
        return _union([schema_type({**schema, "type": k}) for k in kind])
    if kind == "array":
        items = schema.get("items")
        return list[schema_type(items)] if isinstance(items, dict) and items else list
    return _JSON_TYPES.get(kind, Any) if isinstance(kind, str) else Any


def _union(hints: list[Any]) -> Any:
    unique = list(dict.fromkeys(hints))
    if Any in unique:
        return Any
    return unique[0] if len(unique) == 1 else Union[tuple(unique)]  # noqa: UP007 (built at runtime)


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def tool_method(spec: ToolSpec) -> Callable[..., str]:
    """A method ``name(self, **arguments) -> str`` for TRL: its signature, hints and Google docstring come
    from the tool's JSON schema, and a call steps the env with ``spec.name`` and the arguments given
    (checked by turngym, so a wrong or missing argument is an error observation, not a Python error)."""
    if spec.name in RESERVED or spec.name.startswith("_"):
        raise ValueError(
            f"tool {spec.name!r} cannot be a TRL environment method: TRL exposes public methods by name and "
            f"reserves {sorted(RESERVED)}; rename the tool"
        )
    name = spec.name

    def method(self: Any, **arguments: Any) -> str:
        return self._call(name, arguments)

    props = spec.parameters.get("properties") or {}
    required = set(spec.parameters.get("required") or [])
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    annotations: dict[str, Any] = {}
    lines = [_one_line(spec.description) or f"Call the {name} tool."]
    ordered = [p for p in props if p in required] + [p for p in props if p not in required]
    if ordered:
        lines += ["", "Args:"]
    for arg in ordered:
        if not arg.isidentifier() or keyword.iskeyword(arg):
            raise ValueError(
                f"tool {name!r}: argument {arg!r} cannot be a Python parameter name, and TRL builds tool schemas "
                "from Python signatures (transformers' get_json_schema); rename the argument"
            )
        hint = schema_type(props[arg])
        annotations[arg] = hint
        default = inspect.Parameter.empty if arg in required else props[arg].get("default")
        params.append(
            inspect.Parameter(arg, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=hint)
        )
        lines.append(
            f"    {arg}: {_one_line(props[arg].get('description') or props[arg].get('title') or arg)}"
        )
    annotations["return"] = str
    method.__name__ = method.__qualname__ = name
    method.__doc__ = "\n".join(lines)
    method.__annotations__ = annotations
    method.__signature__ = inspect.Signature(params, return_annotation=str)  # type: ignore[attr-defined]
    return method


# ------------------------------------------------------------------------------ environment
class TurngymEnvironment:
    """One TRL rollout's environment: a turngym env, reset per rollout, stepped once per tool call.

    TRL exposes every public function of this class as a tool, so the only public members are ``reset``,
    ``get_reward`` and the tools (added by :func:`environment_class`); the rest is private.
    """

    _env_id: str = ""
    _make_kwargs: dict[str, Any] = {}

    def __init__(self) -> None:
        self._env = registry.make(self._env_id, **{**self._make_kwargs, **ADAPTER_MAKE_KWARGS})
        weakref.finalize(self, _close_quietly, self._env)
        self._new_episode()

    def _new_episode(self) -> None:
        self._return = 0.0
        self._components: dict[str, float] = {}
        self._steps = 0
        self._invalid = 0
        self._done = False
        self._error: str | None = None
        self._task_id: str | None = None

    def reset(self, seed: int | None = None, task_id: str | None = None, **row: Any) -> str | None:
        """Reset the turngym env on the row's ``seed`` (the prompt is already in the row). Returns None, or
        a note appended to the prompt when the env failed to reset (the completion is then unscorable)."""
        self._new_episode()
        try:
            _, info = self._env.reset(seed=None if seed is None else int(seed), options=row.get("options"))
        except Exception as e:  # noqa: BLE001 - any env failure masks this completion, never the run
            return self._fail("reset", e)
        self._task_id = info.get("task_id")
        if task_id is not None and self._task_id != task_id:
            raise ValueError(
                f"{self._env_id}: seed {seed} now gives task {self._task_id!r}, but the dataset row was built "
                f"for {task_id!r}; build the dataset with the same env arguments as environment_factory"
            )
        return None

    def get_reward(self) -> float | None:
        """The episode's return so far; None (unscorable) when the env failed during the episode."""
        return None if self._error else self._return

    def _call(self, name: str, arguments: dict[str, Any]) -> str:
        if self._error:
            raise EpisodeError(
                f"the environment failed earlier in this episode ({self._error}); no call runs"
            )
        if self._done:
            raise EpisodeError("the episode is over: no more tool calls are run")
        action = Message(role="assistant", content="", tool_calls=[ToolCall(name=name, arguments=arguments)])
        try:
            obs, reward, terminated, truncated, info = self._env.step(action)
        except Exception as e:  # noqa: BLE001
            self._fail(f"step ({name})", e)
            raise EpisodeError(f"the environment failed: {type(e).__name__}: {e}") from e
        self._steps += 1
        self._return += float(reward)
        for key, value in info.get("reward_components", {}).items():
            self._components[key] = self._components.get(key, 0.0) + float(value)
        self._invalid += bool(info.get("invalid_action"))
        self._done = bool(terminated or truncated)
        text = "\n".join(m.content for m in obs if m.content)
        if self._done:
            text += "\n(The episode is over.)" if text else "(The episode is over.)"
        return text

    def _fail(self, where: str, error: BaseException) -> str:
        self._error = f"{where}: {type(error).__name__}: {error}"
        logger.warning(
            "turngym env %s failed in %s; this completion is unscorable", self._env_id, self._error
        )
        return f"\n(The environment failed: {type(error).__name__}: {error})"


def _close_quietly(env: Any) -> None:
    try:
        env.close()
    except Exception:  # noqa: BLE001 - closing at garbage collection must not raise
        logger.debug("closing a turngym env failed", exc_info=True)


def environment_class(env_id: str, **make_kwargs: Any) -> type[TurngymEnvironment]:
    """A :class:`TurngymEnvironment` subclass for ``env_id`` with one method per tool. The env is made once
    here to read its tools (an unknown id raises ``UnknownEnvError`` with close matches)."""
    probe = registry.make(env_id, **{**make_kwargs, **ADAPTER_MAKE_KWARGS})
    try:
        specs = list(probe.tools)
        full_id = probe.spec.id if probe.spec is not None else env_id
    finally:
        probe.close()
    members: dict[str, Any] = {"_env_id": env_id, "_make_kwargs": dict(make_kwargs)}
    for spec in specs:
        members[spec.name] = tool_method(spec)
    name = "turngym_" + full_id.rsplit("-v", 1)[0].replace("-", "_")
    return type(name, (TurngymEnvironment,), members)


def environment_factory(env_id: str, **make_kwargs: Any) -> Callable[[], TurngymEnvironment]:
    """What ``GRPOTrainer(environment_factory=...)`` takes: a callable making one environment per rollout."""
    return environment_class(env_id, **make_kwargs)


def prompt_dataset(env_id: str, seeds: Iterable[int], **make_kwargs: Any) -> Any:
    """A ``datasets.Dataset`` with one row per seed: ``prompt`` (the task's first messages), ``seed``,
    ``task_id``. Pass the same ``make_kwargs`` as to :func:`environment_factory`."""
    from datasets import Dataset

    env = registry.make(env_id, **{**make_kwargs, **ADAPTER_MAKE_KWARGS})
    rows: dict[str, list[Any]] = {"prompt": [], "seed": [], "task_id": []}
    try:
        for seed in seeds:
            obs, info = env.reset(seed=int(seed))
            rows["prompt"].append([{"role": m.role, "content": m.content} for m in obs])
            rows["seed"].append(int(seed))
            rows["task_id"].append(info["task_id"])
    finally:
        env.close()
    if not rows["seed"]:
        raise ValueError("prompt_dataset needs at least one seed")
    return Dataset.from_dict(rows)


# ---------------------------------------------------------------------------------- rewards
def component_reward(component: str) -> Callable[..., list[float | None]]:
    """A TRL reward function: the episode's sum of the turngym reward component ``component``
    (0.0 when the env never paid it; None when the env failed during the episode)."""

    def reward(environments: Sequence[TurngymEnvironment] | None = None, **_: Any) -> list[float | None]:
        if environments is None:
            raise ValueError("component rewards read the episode's env: use them with environment_factory")
        return [None if e._error else e._components.get(component, 0.0) for e in environments]

    reward.__name__ = reward.__qualname__ = f"turngym_{component}"
    return reward


def unparsed_tool_call(completion: Any) -> bool:
    """Whether a TRL completion ends with an assistant message whose text holds a ``<tool_call>`` that
    TRL's response parser could not read (malformed JSON, an unclosed tag): TRL then ends the rollout
    with that text, so the env never sees the call."""
    if not isinstance(completion, list):
        return False
    last = next((m for m in reversed(completion) if m.get("role") == "assistant"), None)
    return bool(last) and not last.get("tool_calls") and "<tool_call>" in str(last.get("content") or "")


def episode_stats(environments: Sequence[TurngymEnvironment] | None = None, **kwargs: Any) -> list[None]:
    """A reward function that pays nothing (all None) and logs the episodes' turngym metrics through
    TRL's ``log_metric``: ``turngym/steps``, ``turngym/done``, ``turngym/invalid_actions``, ``turngym/failed``
    and ``turngym/unparsed_calls`` (completions ending in a tool call TRL could not parse)."""
    log = kwargs.get("log_metric")
    envs = list(environments or [])
    completions = kwargs.get("completions") or []
    if log is not None and envs:
        n = len(envs)
        log("turngym/steps", sum(e._steps for e in envs) / n)
        log("turngym/done", sum(e._done for e in envs) / n)
        log("turngym/invalid_actions", sum(e._invalid for e in envs) / n)
        log("turngym/failed", sum(e._error is not None for e in envs) / n)
        if completions:
            log("turngym/unparsed_calls", sum(map(unparsed_tool_call, completions)) / len(completions))
    return [None] * len(kwargs.get("prompts", envs))


# ---------------------------------------------------------------------------------- trainer
def hermes_response_template() -> dict[str, Any]:
    """A ``transformers`` response template for ChatML chat templates with Hermes tool calls
    (``<tool_call>{json}</tool_call>`` blocks; turngym's tiny models and Qwen2.5-style templates): TRL's
    own Qwen3 template, which parses that layout. Set it as ``tokenizer.response_template`` for a
    tokenizer whose chat template TRL does not recognise."""
    import copy

    from trl.chat_template_utils import qwen3_template

    return copy.deepcopy(qwen3_template)


def tool_call_bias(tokenizer: Any, calls: Sequence[dict[str, Any]], step: float = 10.0) -> list[list[Any]]:
    """A ``sequence_bias`` (``GRPOConfig(generation_kwargs={"sequence_bias": ...})``) that steers a
    random-init demo model (turngym's tiny models) to write one of ``calls`` as a Hermes tool call,
    ``<tool_call>{json}</tool_call>`` and the end-of-turn token, so TRL has tool calls to run. Each token
    of a call is biased by ``step`` times the length of the call prefix it continues, so the longest match
    wins; where calls diverge the model's own logits pick. Not for a real model, which calls tools itself."""
    import json

    bias: dict[tuple[int, ...], float] = {}
    for call in calls:
        text = f"<tool_call>\n{json.dumps(call)}\n</tool_call>{tokenizer.eos_token}"
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        for k in range(1, len(ids) + 1):
            bias[tuple(ids[:k])] = step * k
    return [[list(ids), value] for ids, value in bias.items()]


def _ensure_response_template(tokenizer: Any) -> None:
    """TRL parses tool calls with the tokenizer's response template; set one when TRL cannot."""
    if getattr(tokenizer, "response_template", None) is not None:
        return
    from trl.chat_template_utils import add_response_schema

    try:
        add_response_schema(tokenizer)
    except ValueError:
        template = getattr(tokenizer, "chat_template", None) or ""
        if "<tool_call>" not in template:
            raise ValueError(
                "TRL does not recognise this chat template and it does not write Hermes <tool_call> blocks: "
                "set tokenizer.response_template yourself (transformers' response parsing docs)"
            ) from None
        tokenizer.response_template = hermes_response_template()


def grpo_trainer(
    env_id: str,
    model: Any,
    *,
    seeds: Iterable[int] = range(64),
    args: Any = None,
    components: Sequence[str] = (),
    env_kwargs: dict[str, Any] | None = None,
    processing_class: Any = None,
    **trainer_kwargs: Any,
) -> Any:
    """A ``trl.GRPOTrainer`` on ``env_id``: prompts from ``seeds``, the env's tools, the episode's return
    as the reward, and each reward component in ``components`` logged as ``rewards/turngym_<name>``
    (weight 0 unless ``args.reward_weights`` says otherwise). ``args.max_tool_calling_iterations`` defaults
    to the env's turn limit. Extra keyword arguments go to ``GRPOTrainer``."""
    from trl import GRPOConfig, GRPOTrainer

    env_kwargs = dict(env_kwargs or {})
    factory = environment_class(env_id, **env_kwargs)
    dataset = prompt_dataset(env_id, seeds, **env_kwargs)
    reward_funcs = [component_reward(c) for c in components] + [episode_stats]
    args = args if args is not None else GRPOConfig(output_dir=f"runs/trl-{env_id}")
    if args.reward_weights is None:
        args.reward_weights = [0.0] * len(reward_funcs)
    elif len(args.reward_weights) == len(reward_funcs) - 1:
        args.reward_weights = [*args.reward_weights, 0.0]  # episode_stats pays nothing
    if processing_class is None:
        from transformers import AutoTokenizer

        name = model if isinstance(model, str) else model.config._name_or_path
        processing_class = AutoTokenizer.from_pretrained(name, padding_side="left")
    _ensure_response_template(processing_class)
    if args.max_tool_calling_iterations is None:
        probe = registry.make(env_id, **{**env_kwargs, **ADAPTER_MAKE_KWARGS})
        args.max_tool_calling_iterations = probe.max_turns
        probe.close()
    return GRPOTrainer(
        model=model,
        reward_funcs=reward_funcs,
        args=args,
        train_dataset=dataset,
        processing_class=processing_class,
        environment_factory=factory,
        **trainer_kwargs,
    )

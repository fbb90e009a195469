"""TRL adapter: turngym envs in the real ``trl.GRPOTrainer`` (environment_factory hook), on CPU.

The tiny random-init model cannot call tools by itself: its sampling is steered with a generation
``sequence_bias`` (``tool_call_bias``) towards two well-formed Hermes tool calls, so TRL's real tool loop
runs the env's tools; then the real GRPO trainer runs two steps on ``arith`` and its loss, computed from
the model's own log-probs, changes the weights.
"""

from __future__ import annotations

import inspect
import keyword
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("trl")
pytest.importorskip("datasets")

import turngym  # noqa: E402
from turngym.core.types import ToolSpec  # noqa: E402
from turngym.interop.trl import (  # noqa: E402
    EpisodeError,
    component_reward,
    environment_class,
    episode_stats,
    grpo_trainer,
    prompt_dataset,
    schema_type,
    tool_call_bias,
    tool_method,
    unparsed_tool_call,
)

ENV_KWARGS = {"depth": 1, "max_turns": 3}


def _register_crashing() -> str:
    from turngym.envs.arith.env import ArithEnv

    class _Crash(ArithEnv):
        def _turn_reward(self, results, done):
            if self.turn >= 2:
                raise RuntimeError("reward service unreachable")
            return super()._turn_reward(results, done)

    turngym.register("arith-crashing-trl", _Crash, override=True, description="test: raises on turn 2")
    return "arith-crashing-trl"


def test_tools_become_methods_with_the_schema_transformers_renders():
    from transformers.utils.chat_template_utils import get_json_schema

    cls = environment_class("arith", **ENV_KWARGS)
    env = cls()
    schema = get_json_schema(env.calculate)["function"]
    assert schema["name"] == "calculate"
    assert schema["parameters"]["required"] == ["a", "op", "b"]
    assert schema["parameters"]["properties"]["op"]["enum"] == ["+", "-", "*"]
    assert schema["parameters"]["properties"]["a"] == {"type": "integer", "description": "left operand"}
    # TRL lists public functions of the class as tools: exactly the env's tools besides reset/get_reward
    public = {n for n, _ in inspect.getmembers(cls, inspect.isfunction) if not n.startswith("_")}
    assert public == {"reset", "get_reward", "calculate", "answer"}


def test_a_tool_schema_with_optional_arrays_and_unions_round_trips():
    from transformers.utils.chat_template_utils import get_json_schema

    spec = ToolSpec(
        name="lookup",
        description="Look\n things up.",
        parameters={
            "type": "object",
            "properties": {
                "ids": {"type": "array", "items": {"type": "integer"}, "description": "ids"},
                "mode": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None},
                "limit": {"type": "integer", "default": 5, "description": "how many"},
            },
            "required": ["ids"],
        },
    )
    schema = get_json_schema(tool_method(spec))["function"]
    assert schema["description"] == "Look things up."
    assert schema["parameters"]["required"] == ["ids"]
    props = schema["parameters"]["properties"]
    assert props["ids"]["type"] == "array" and props["ids"]["items"] == {"type": "integer"}
    assert props["mode"]["type"] == "string" and props["mode"]["nullable"] is True
    assert schema_type({"type": ["integer", "string"]}) == (int | str)
    with pytest.raises(ValueError, match="reserves"):
        tool_method(ToolSpec(name="reset"))
    with pytest.raises(ValueError, match="'from' cannot be a Python parameter name"):
        tool_method(
            ToolSpec(name="route", parameters={"type": "object", "properties": {"from": {"type": "string"}}})
        )


def test_an_episode_through_the_environment_class():
    ds = prompt_dataset("arith", range(2), **ENV_KWARGS)
    assert ds.column_names == ["prompt", "seed", "task_id"]
    assert [m["role"] for m in ds[0]["prompt"]] == ["system", "user"]
    assert "<tool_call>" not in ds[0]["prompt"][0]["content"]  # TRL renders the tools, not turngym
    env = environment_class("arith", **ENV_KWARGS)()
    assert env.reset(**ds[0]) is None
    expression = ds[0]["prompt"][-1]["content"].removeprefix("Evaluate: ")
    a, op, b = expression.strip("()").split()
    assert env.calculate(a=int(a), op=op, b=int(b)) == str(eval(expression))
    # bad arguments: turngym's error observation, a counted invalid action, no Python error
    text = env.calculate(a="x", op="/", b=1)
    assert text.startswith("Error: invalid arguments for 'calculate'") and env._invalid == 1
    assert env.answer(value=eval(expression)).endswith("(The episode is over.)")
    assert env.get_reward() == 1.0 and component_reward("correct")(environments=[env]) == [1.0]
    with pytest.raises(EpisodeError, match="episode is over"):
        env.calculate(a=1, op="+", b=1)
    # a row built for another task is refused, never scored against the wrong task
    with pytest.raises(ValueError, match="dataset row was built"):
        env.reset(seed=0, task_id="arith-d1-0000000000")


def test_an_env_that_raises_mid_episode_makes_the_completion_unscorable(caplog):
    env_id = _register_crashing()
    env = environment_class(env_id, **ENV_KWARGS)()
    env.reset(**prompt_dataset(env_id, [0], **ENV_KWARGS)[0])
    env.calculate(a=1, op="+", b=1)
    with pytest.raises(EpisodeError, match="reward service unreachable"):
        env.calculate(a=1, op="+", b=1)
    with pytest.raises(EpisodeError, match="failed earlier"):
        env.answer(value=2)
    assert env.get_reward() is None and component_reward("correct")(environments=[env]) == [None]
    assert "unscorable" in caplog.text


def test_tool_calls_trl_could_not_parse_are_counted():
    logged = {}
    env = environment_class("arith", **ENV_KWARGS)()
    completions = [
        [
            {
                "role": "assistant",
                "content": '<tool_call>{"name": "calculate", "arguments": {"a": 1,</tool_call>',
            }
        ],
        [
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"type": "function", "function": {"name": "x"}}],
            },
            {"role": "tool", "name": "x", "content": "ok"},
            {"role": "assistant", "content": "the answer is 3"},
        ],
    ]
    out = episode_stats(
        environments=[env, env],
        completions=completions,
        prompts=[[], []],
        log_metric=lambda k, v: logged.__setitem__(k, v),
    )
    assert out == [None, None]
    assert logged["turngym/unparsed_calls"] == 0.5 and logged["turngym/steps"] == 0.0
    assert unparsed_tool_call(completions[0]) and not unparsed_tool_call(completions[1])


def test_unknown_env_ids_are_clear_errors():
    with pytest.raises(turngym.UnknownEnvError, match="Did you mean: arith"):
        environment_class("arithh")
    with pytest.raises(turngym.UnknownEnvError):
        prompt_dataset("no-such-env", [0])


#: What the random tiny model is steered to write (generation ``sequence_bias``): one of two well-formed
#: calls, picked by its own logits. With one turn, answering pays 0 (1 if 4 is right) and calculating runs
#: out of turns and pays the format penalty (-0.1), so the GRPO groups have reward variance to learn from.
GRPO_ENV_KWARGS = {"depth": 1, "max_turns": 1}
STEER_CALLS = [
    {"name": "calculate", "arguments": {"a": 2, "op": "+", "b": 2}},
    {"name": "answer", "arguments": {"value": 4}},
]


def test_grpo_trainer_runs_on_arith_steps_the_env_and_trains(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig

    from turngym.agents.tiny import tiny_model_path

    torch.manual_seed(0)
    path = tiny_model_path()
    tok = AutoTokenizer.from_pretrained(path, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    seeds = range(8)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}

    args = GRPOConfig(
        output_dir=str(tmp_path / "out"),
        max_steps=2,
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=64,
        learning_rate=1e-3,
        logging_steps=1,
        report_to="none",
        use_cpu=True,
        save_strategy="no",
        beta=0.0,
        generation_kwargs={"sequence_bias": tool_call_bias(tok, STEER_CALLS)},
    )
    trainer = grpo_trainer(
        "arith",
        model,
        seeds=seeds,
        args=args,
        components=["correct"],
        env_kwargs=GRPO_ENV_KWARGS,
        processing_class=tok,
    )
    assert args.max_tool_calling_iterations == 1  # the env's turn limit
    assert tok.response_template is not None  # TRL does not know the tiny template: the Hermes one is set
    trainer.train()

    logs = [row for row in trainer.state.log_history if "rewards/turngym_arith/mean" in row]
    assert len(logs) == 2, trainer.state.log_history
    for row in logs:
        assert math.isfinite(row["rewards/turngym_arith/mean"])
        assert math.isfinite(row["rewards/turngym_correct/mean"])
    # the env was stepped: TRL called its tools and turngym counted the steps
    assert sum(row["tools/call_frequency"] for row in logs) > 0, logs
    assert sum(row["turngym/steps"] for row in logs) > 0, logs
    stepped = [e for e in trainer._environment_pool[None] if e._steps > 0]
    assert stepped and all(e._task_id is not None for e in stepped)
    # the rewards TRL logged are the envs' returns (mean over the last batch of rollouts)
    last = [e.get_reward() for e in trainer._environment_pool[None]]
    assert logs[-1]["rewards/turngym_arith/mean"] == pytest.approx(sum(last) / len(last), abs=1e-6)
    assert {e.get_reward() for e in trainer._environment_pool[None]} <= {-0.1, 0.0, 1.0}
    changed = [n for n, p in model.named_parameters() if not torch.equal(p.detach(), before[n])]
    assert changed, "GRPO did not change any weight"


_SCALARS = ["string", "integer", "number", "boolean"]
_names = st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True).filter(
    lambda n: n not in {"self", "cls"} and not keyword.iskeyword(n)
)
_prop = st.one_of(
    st.sampled_from(_SCALARS).map(lambda t: {"type": t}),
    st.sampled_from(_SCALARS).map(lambda t: {"type": "array", "items": {"type": t}}),
    st.lists(st.text("abcxyz+-*", min_size=1, max_size=3), min_size=1, max_size=4, unique=True).map(
        lambda v: {"type": "string", "enum": v}
    ),
)


@settings(max_examples=60)
@given(props=st.dictionaries(_names, _prop, min_size=1, max_size=5), data=st.data())
def test_tool_schemas_survive_the_round_trip_through_transformers(props, data):
    """Whatever a turngym tool schema says (scalars, arrays, enums, optional arguments), the method built
    for TRL renders, through transformers' ``get_json_schema``, to the same types and required set."""
    from transformers.utils.chat_template_utils import get_json_schema

    required = data.draw(st.lists(st.sampled_from(sorted(props)), unique=True))
    spec = ToolSpec(
        name="tool",
        description="A tool.",
        parameters={"type": "object", "properties": props, "required": required},
    )
    rendered = get_json_schema(tool_method(spec))["function"]["parameters"]
    assert set(rendered.get("required", [])) == set(required)
    for name, schema in props.items():
        got = rendered["properties"][name]
        assert got["type"] == schema["type"]
        assert got.get("items") == schema.get("items")
        assert got.get("enum") == schema.get("enum")


def test_tool_names_that_are_not_identifiers_still_reach_trl():
    """MCP-style names (``read-file``) are attribute names TRL can list and call by name."""
    from transformers.utils.chat_template_utils import get_json_schema

    method = tool_method(
        ToolSpec(name="read-file", description="Read.", parameters={"type": "object", "properties": {}})
    )
    assert get_json_schema(method)["function"]["name"] == "read-file"
    cls = type("Env", (), {"read-file": method, "reset": lambda self: None})
    assert [n for n, _ in inspect.getmembers(cls, inspect.isfunction)] == [
        "read-file",
        "reset",
    ]

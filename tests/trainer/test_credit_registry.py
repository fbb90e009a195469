"""The credit-method registry: built-ins, config validation through it, the old flat keys, a method
added from a test module, the per-step hooks and the advantages the pipeline writes into turns."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import pytest
from pydantic import ValidationError

from turngym.trainer.config import load_config
from turngym.trainer.credit import GRPO, CreditPipeline, GroupCredit, grpo
from turngym.trainer.credit import registry as reg
from turngym.trainer.credit.registry import (
    CreditContext,
    MethodSettings,
    credit_method,
    registered_credit_methods,
    unregister_credit_method,
)
from turngym.trainer.judges import ProgrammaticJudge
from turngym.trainer.orchestrator import build_credit
from turngym.trainer.orchestrator import step_seed as _derive

from .helpers import make_traj

BUILTIN = {
    "grpo": "GRPO",
    "igpo": "IGPO",
    "gated": "Gated",
    "arena": "Arena",
    "pointwise": "Pointwise",
    "gigpo": "GiGPO",
    "turn": "DualLevel",
}


def group(n=4, turns=2):
    return [make_traj([0.0] * (turns - 1) + [float(i)], group="g") for i in range(n)]


@pytest.mark.parametrize("name", sorted(BUILTIN))
def test_every_builtin_is_registered_and_builds_from_a_default_config(name):
    assert name in registered_credit_methods()
    cfg = load_config(None, [f"credit.method={name}"])
    pipeline = build_credit(cfg)
    assert isinstance(pipeline, CreditPipeline) and pipeline.method_name == name
    assert type(pipeline.method).__name__ == BUILTIN[name]
    assert type(cfg.credit.options()).__module__.startswith("turngym.trainer.credit.")
    trajs = group()
    out = pipeline(trajs)
    assert len(out.turn_advantages) == 4 and all(len(a) == 2 for a in out.turn_advantages)


def test_unknown_method_names_the_known_ones():
    with pytest.raises(ValidationError, match="unknown credit.method 'ppo'; known: ") as e:
        load_config(None, ["credit.method=ppo"])
    assert all(name in str(e.value) for name in BUILTIN)
    with pytest.raises(
        ValueError, match="known: arena, gated, gigpo, grpo, igpo, pointwise, tree, tree_gigpo, turn"
    ):
        reg.get_credit_method("ppo")


def test_unknown_options_are_clear_errors():
    with pytest.raises(ValidationError, match=r"unknown credit option\(s\) \['gigpo_gama'\]"):
        load_config(None, ["credit.gigpo_gama=0.5"])
    with pytest.raises(ValidationError, match=r"credit\.igpo\.nrom: Extra inputs are not permitted"):
        load_config(None, ["credit.igpo.nrom=joint"])
    with pytest.raises(ValidationError, match=r"credit\.gigpo\.mode"):
        load_config(None, ["credit.gigpo.mode=nope"])


FLAT = [
    ("gigpo_gamma", "gigpo", "gamma", 0.5),
    ("gigpo_omega", "gigpo", "omega", 2.0),
    ("gigpo_mode", "gigpo", "mode", "mean_norm"),
    ("gigpo_step_norm_by_std", "gigpo", "step_norm_by_std", True),
    ("turn_lambda", "turn", "lam", 0.7),
]


@pytest.mark.parametrize(("flat", "method", "key", "value"), FLAT, ids=[f[0] for f in FLAT])
def test_old_flat_keys_map_to_the_nested_ones(flat, method, key, value, tmp_path):
    p = tmp_path / "old.yaml"
    p.write_text(f"credit:\n  method: {method}\n  {flat}: {value}\n")
    with pytest.warns(FutureWarning, match=f"credit.{flat} is deprecated; use credit.{method}.{key}"):
        cfg = load_config(p)
    assert getattr(getattr(cfg.credit, method), key) == value
    assert flat not in cfg.credit.model_dump()  # saved configs use the nested key only
    new = load_config(None, [f"credit.method={method}", f"credit.{method}.{key}={value}"])
    assert new == cfg
    with pytest.warns(FutureWarning):  # both, agreeing: fine
        both = load_config(p, [f"credit.{method}.{key}={value}"])
    assert both == cfg


def test_flat_and_nested_keys_that_disagree_fail_clearly():
    with pytest.raises(ValidationError, match="credit.gigpo_gamma=0.5 and credit.gigpo.gamma=0.9 disagree"):
        load_config(None, ["credit.gigpo_gamma=0.5", "credit.gigpo.gamma=0.9"])


def test_flat_keys_reach_the_built_method():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        cfg = load_config(
            None, ["credit.method=gigpo", "credit.gigpo_gamma=0.5", "credit.gigpo_mode=mean_norm"]
        )
        turn = build_credit(load_config(None, ["credit.method=turn", "credit.turn_lambda=0.3"]))
    g = build_credit(cfg).method
    assert (g.gamma, g.omega, g.mode) == (0.5, 1.0, "mean_norm")
    assert turn.method.lam == 0.3


def test_shared_options_keep_working():
    p = build_credit(
        load_config(
            None, ["credit.norm_by_std=false", "credit.leave_one_out=true", "credit.outcome_component=x"]
        )
    )
    assert (p.method.norm_by_std, p.method.leave_one_out, p.method.outcome.component) == (False, True, "x")
    igpo = build_credit(load_config(None, ["credit.method=igpo", "credit.outcome_component=f1"]))
    assert igpo.method.outcome.component == "f1" and igpo.method.outcome.missing == -2.0


# ------------------------------------------------------------------ a method defined here
class ConstantSettings(MethodSettings):
    value: float = 1.0


@dataclass
class Constant:
    """Every turn gets the same advantage."""

    value: float
    seen: list | None = None
    name: str = "constant"

    def begin_step(self, step: int, seed: int) -> None:
        self.seen = [step, seed]

    def metrics(self) -> dict[str, float]:
        return {"constant/value": self.value}

    def group_advantages(self, group) -> GroupCredit:
        return GroupCredit([[self.value] * len(t.turns) for t in group])


@pytest.fixture
def constant_method():
    contexts: list[CreditContext] = []

    @credit_method("constant", settings=ConstantSettings)
    def build(settings: ConstantSettings, ctx: CreditContext) -> Constant:
        contexts.append(ctx)
        return Constant(settings.value)

    yield contexts
    unregister_credit_method("constant")


def test_a_method_registered_in_a_test_module_is_usable_from_the_config(constant_method):
    assert "constant" in registered_credit_methods()
    cfg = load_config(None, ["credit.method=constant", "credit.constant.value=0.5", "seed=7"])
    assert cfg.credit.constant == ConstantSettings(value=0.5)
    judge = ProgrammaticJudge(lambda a, b: (0.0, 0.0))
    pipeline = build_credit(cfg, judge=judge)
    ctx = constant_method[-1]
    assert (ctx.seed, ctx.judge, ctx.model, ctx.credit) == (7, judge, None, cfg.credit)
    trajs = group(3, turns=2)
    pipeline.begin_step(2, 99)
    out = pipeline(trajs)
    assert pipeline.method.seen == [2, 99]
    assert out.turn_advantages == [[0.5, 0.5]] * 3
    assert out.metrics["constant/value"] == 0.5  # the method's metrics() hook
    assert all(t.info["advantages"] == {"constant": 0.5} for traj in trajs for t in traj.turns)
    with pytest.raises(ValidationError, match=r"credit\.constant\.valeu"):
        load_config(None, ["credit.method=constant", "credit.constant.valeu=1"])


def test_an_unregistered_method_is_unknown_again(constant_method):
    unregister_credit_method("constant")
    with pytest.raises(ValidationError, match="unknown credit.method 'constant'"):
        load_config(None, ["credit.method=constant"])


def test_entry_point_plugins_register_and_broken_ones_are_reported(monkeypatch):
    class EP:
        def __init__(self, name, obj):
            self.name, self.obj = name, obj

        def load(self):
            if isinstance(self.obj, Exception):
                raise self.obj
            return self.obj

    def plug():
        credit_method("plugged")(lambda settings, ctx: GRPO())

    monkeypatch.setattr(reg, "_loaded", False)
    monkeypatch.setattr(reg, "plugin_errors", {})
    monkeypatch.setattr(
        reg.importlib.metadata,
        "entry_points",
        lambda group: (
            [EP("plugged", plug), EP("broken", ImportError("no module"))]
            if group == reg.ENTRY_POINT_GROUP
            else []
        ),
    )
    try:
        assert "plugged" in registered_credit_methods()
        assert reg.plugin_errors == {"broken": "ImportError: no module"}
        assert build_credit(load_config(None, ["credit.method=plugged"])).method_name == "plugged"
    finally:
        unregister_credit_method("plugged")


# ------------------------------------------------------------------ hooks and write-back
def tied_arena(seed=0):
    """An arena whose judge always ties, so the ranking is decided by the seeded tie-breaks."""
    cfg = load_config(None, ["credit.method=arena", "credit.arena.workers=1", f"seed={seed}"])
    return build_credit(cfg, judge=ProgrammaticJudge(lambda a, b: (0.0, 0.0)))


def test_begin_step_reseeds_the_arena_deterministically():
    trajs = [make_traj([1.0], group=g) for g in "aabbbbbbbb"]

    def run(pipeline, step, seed):
        pipeline.begin_step(step, _derive(seed, step))
        return pipeline(trajs).turn_advantages

    a, b = tied_arena(), tied_arena()
    first = run(a, 3, 0)
    run(a, 4, 0)  # another step in between changes nothing for a later reseed
    assert run(a, 3, 0) == first == run(b, 3, 0)  # same seed + step -> same tournament
    assert any(run(b, s, 0) != first for s in range(4, 12))  # other steps, other tie-breaks
    out = a(trajs)
    assert out.metrics["judge/matches"] > 0 and out.metrics["judge/ties"] == out.metrics["judge/matches"]


def test_judge_passed_to_the_trainer_wins_and_the_configured_one_is_built():
    judge = ProgrammaticJudge(lambda a, b: (1.0, 0.0))
    cfg = load_config(None, ["credit.method=arena"])
    assert build_credit(cfg, judge=judge).method.judge is judge
    assert isinstance(build_credit(cfg).method.judge, ProgrammaticJudge)  # the outcome judge
    with pytest.raises(ValueError, match="judge=llm needs judge_base_url"):
        build_credit(load_config(None, ["credit.method=arena", "credit.arena.judge=llm"]))


def test_the_pipeline_writes_each_turns_advantage_into_the_turn():
    trajs = [
        make_traj([0.0, 1.0], group="a", infos=[{"info_gain": 0.1}, {}]),
        make_traj([0.0], group="a"),
        make_traj([3.0, 3.0], group="a", masked=True),
    ]
    out = CreditPipeline(GRPO())(trajs)
    a = grpo([1.0, 0.0])
    assert [t.info["advantages"] for t in trajs[0].turns] == [{"grpo": pytest.approx(a[0])}] * 2
    assert trajs[0].turns[0].info["info_gain"] == 0.1  # other info kept
    assert trajs[1].turns[0].info["advantages"] == {"grpo": pytest.approx(a[1])}
    assert [t.info["advantages"] for t in trajs[2].turns] == [{"grpo": 0.0}] * 2  # masked: 0
    for traj, adv in zip(trajs, out.turn_advantages, strict=True):
        assert [t.info["advantages"]["grpo"] for t in traj.turns] == adv
    CreditPipeline(GRPO(), name="grpo-loo")(trajs)  # a second method adds its own key
    assert set(trajs[0].turns[0].info["advantages"]) == {"grpo", "grpo-loo"}


@pytest.mark.parametrize("bad", ["method", "norm_by_std", "options", "model_dump", "not-an-id", ""])
def test_names_that_clash_with_config_keys_are_refused(bad):
    with pytest.raises(ValueError, match="must be an identifier"):
        credit_method(bad)


def test_igpo_return_normalisation_reaches_the_method_and_bad_values_fail_at_load():
    method = build_credit(
        load_config(None, ["credit.method=igpo", "credit.igpo.returns=depth_zscore"])
    ).method
    assert method.returns == "depth_zscore"
    assert build_credit(load_config(None, ["credit.method=igpo"])).method.returns == "none"  # the paper's
    with pytest.raises(ValidationError, match=r"credit\.igpo\.returns"):
        load_config(None, ["credit.method=igpo", "credit.igpo.returns=centre"])

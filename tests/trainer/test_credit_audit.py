"""The credit audit (turngym.trainer.audit): statistics on hand-computed examples and properties,
A* from split continuation samples, scoring aligned with A* (an oracle method scores 1, its
negation -1), every default method on arith and on search-qa with the tiny model, the token
budget, the CLI and the viewer's plots."""

import asyncio
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from turngym.agents import LLMAgent, RandomAgent, SamplingParams, ScriptedAgent
from turngym.trainer.audit import AuditConfig, markdown_table, parse_method, run_audit, write_audit
from turngym.trainer.audit.run import split_estimates
from turngym.trainer.audit.stats import bootstrap, pearson, rankdata, sign_agreement, spearman
from turngym.trainer.credit.base import GroupCredit
from turngym.trainer.credit.registry import credit_method, unregister_credit_method

from .helpers import make_traj

approx = pytest.approx
ARITH = {"max_turns": 4, "depth": 2}


# ------------------------------------------------------------------ statistics
def test_ranks_and_correlations_hand_computed():
    assert rankdata([10, 20, 20, 5]).tolist() == [2.0, 3.5, 3.5, 1.0]
    assert pearson([1, 2, 3], [2, 4, 6]) == approx(1.0) and pearson([1, 2, 3], [3, 2, 1]) == approx(-1.0)
    # x = [1, 2, 3, 4], y = [1, 3, 2, 4]: ranks equal values; r = 0.8 (sum of d^2 = 2: 1 - 6*2/60)
    assert spearman([1, 2, 3, 4], [1, 3, 2, 4]) == approx(0.8)
    assert pearson([1, 1, 1], [1, 2, 3]) is None and spearman([1], [2]) is None
    # sign agreement skips pairs where A* is 0; no credit (x = 0) where A* != 0 disagrees
    assert sign_agreement([0.5, -1.0, 0.0, 3.0], [1.0, 1.0, 2.0, 0.0]) == approx(1 / 3)
    assert sign_agreement([1.0], [0.0]) is None


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(-50, 50), st.integers(-50, 50)), min_size=3, max_size=30))
def test_spearman_is_invariant_to_monotone_transforms_and_bounded(pairs):
    x, y = [p[0] / 10 for p in pairs], [p[1] / 10 for p in pairs]  # a grid with ties, exact order
    rho = spearman(x, y)
    if rho is None:
        assert len(set(x)) == 1 or len(set(y)) == 1
        return
    assert -1.0 <= rho <= 1.0
    assert spearman([np.exp(v) for v in x], y) == approx(rho, abs=1e-9)
    assert spearman(x, [-v for v in y]) == approx(-rho, abs=1e-9)
    assert spearman(x, x) == approx(1.0)


def test_bootstrap_resamples_whole_trajectories():
    clusters = [([1.0, 2.0], [1.0, 2.0]), ([3.0], [3.5]), ([0.0, -1.0], [0.5, -2.0])]
    a = bootstrap(clusters, pearson, reps=100, seed=3)
    assert a == bootstrap(clusters, pearson, reps=100, seed=3)  # seeded
    assert a["value"] == approx(pearson([1, 2, 3, 0, -1], [1, 2, 3.5, 0.5, -2]))
    assert a["se"] > 0 and a["lo"] <= a["value"] <= a["hi"] + 1e-12
    one = bootstrap(clusters[:1], pearson, reps=100)
    assert one["se"] is None  # one trajectory: no spread to resample


def test_method_specs_parse_options():
    assert parse_method("igpo:ig_type=log_prob_diff,norm=separate") == (
        "igpo",
        {"ig_type": "log_prob_diff", "norm": "separate"},
    )
    assert parse_method("gigpo:gamma=0.9") == ("gigpo", {"gamma": 0.9}) and parse_method("grpo") == (
        "grpo",
        {},
    )
    with pytest.raises(ValueError, match="key=value"):
        parse_method("igpo:oops")


def test_split_estimates_hand_computed():
    t = make_traj([0.0, 1.0])
    t.metadata["vine"] = {"samples": [[1.0, 0.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0]]}
    split_estimates(t, vine_k=1)
    assert t.metadata["vine"]["samples"] == [[1.0], [1.0]]  # the vine method's share
    audit = t.metadata["audit"]
    # V*(s0) = mean(0, 1, 1) = 2/3; V*(s1) = mean(1, 0, 0) = 1/3; V*(s2) = R = 1
    assert audit["v"] == approx([2 / 3, 1 / 3, 1.0]) and audit["n"] == [3, 3]
    assert audit["a_star"] == approx([-1 / 3, 2 / 3])
    se = np.std([0, 1, 1], ddof=1) / np.sqrt(3)  # both states: sample std of a 2-1 split
    assert audit["a_star_se"] == approx([np.hypot(se, se), se])
    assert t.turns[1].info["advantages"]["A*"] == approx(2 / 3)


# ------------------------------------------------------------------ the audit on real rollouts
@pytest.fixture
def oracle_methods():
    """Two test methods that read A* itself: scoring must give +1 and -1 (pairs aligned)."""

    class Oracle:
        def __init__(self, sign):
            self.sign, self.name = sign, "oracle"

        def group_advantages(self, group):
            return GroupCredit(
                [[self.sign * (a or 0.0) for a in t.metadata["audit"]["a_star"]] for t in group]
            )

    credit_method("oracle")(lambda s, ctx: Oracle(1.0))
    credit_method("anti_oracle")(lambda s, ctx: Oracle(-1.0))
    yield
    unregister_credit_method("oracle")
    unregister_credit_method("anti_oracle")


def test_scores_align_with_a_star_and_every_default_method_runs(oracle_methods):
    cfg = AuditConfig(env="arith", env_kwargs=ARITH, n=16, group_size=4, k=4, vine_k=2, bootstrap=50, seed=2)
    cfg = AuditConfig(**{**cfg.__dict__, "methods": (*cfg.methods, "oracle", "anti_oracle")})
    result = asyncio.run(run_audit(RandomAgent(0.3, seed=1), cfg))
    r = result.report
    assert r["trajectories"] == 16 and r["masked"] == 0 and r["scored_turns"] > 5
    assert r["methods"]["oracle"]["spearman"]["value"] == approx(1.0)
    assert r["methods"]["oracle"]["sign_agreement"]["value"] == approx(1.0)
    assert r["methods"]["anti_oracle"]["spearman"]["value"] == approx(-1.0)
    for label in cfg.methods:  # every default method ran on the same trajectories
        assert "error" not in r["methods"][label], (label, r["methods"][label])
    assert r["methods"]["igpo"]["metrics"]["igpo/ig_fallback"] > 0  # no model: outcome only, reported
    assert "fell back" in markdown_table(r)
    for t in result.trajectories:
        assert all(len(s) <= 2 for s in t.metadata["vine"]["samples"])  # vine's own 2, apart from A*'s
        assert all(n == 4 for n in t.metadata["audit"]["n"][: t.num_turns])
        assert t.turns[0].node_id == f"root.{t.sample}"  # a group is a tree that branched at turn 0
    json.dumps(r)  # every number serialisable
    assert r["rollout"]["vine"]["continuations"] == 6 * sum(t.num_turns for t in result.trajectories)


def test_all_scores_every_registered_method_and_reports_those_that_cannot_run():
    from turngym.trainer.credit.registry import registered_credit_methods

    methods = ("all", "gigpo:no_such_option=1")
    cfg = AuditConfig(env="arith", env_kwargs=ARITH, n=4, group_size=2, k=2, methods=methods, bootstrap=5)
    r = asyncio.run(run_audit(RandomAgent(0.3, seed=2), cfg)).report
    assert set(registered_credit_methods()) <= set(r["methods"])  # arena, gated, pointwise too
    assert all("error" not in r["methods"][m] for m in registered_credit_methods())
    assert "no_such_option" in r["methods"]["gigpo:no_such_option=1"]["error"]  # said, not hidden
    assert "not run" in markdown_table(r)


def test_the_deterministic_expert_has_zero_true_advantage():
    cfg = AuditConfig(env="arith", env_kwargs=ARITH, n=2, group_size=2, k=2, methods=("grpo",), bootstrap=10)
    r = asyncio.run(run_audit(ScriptedAgent(), cfg)).report
    assert r["a_star"]["abs_mean"] == 0.0 and r["a_star"]["se_max"] == 0.0 and r["zero_groups"] == 1.0
    assert r["methods"]["grpo"]["sign_agreement"]["value"] is None  # no turn with A* != 0 to agree on


def test_tool_turns_only_scores_tool_call_turns():
    cfg = AuditConfig(env="arith", env_kwargs=ARITH, n=8, group_size=4, k=2, turns="tool", bootstrap=10)
    result = asyncio.run(run_audit(RandomAgent(0.5, seed=4), cfg))
    tool = sum(
        1
        for t in result.trajectories
        for s, turn in enumerate(t.turns)
        if any(x.name for x in turn.tool_results) and t.metadata["audit"]["a_star"][s] is not None
    )
    assert result.report["scored_turns"] == tool > 0
    assert result.report["scored_turns"] < sum(t.num_turns for t in result.trajectories)


def test_config_is_validated():
    for bad in ({"k": 1}, {"turns": "most"}, {"budget": 0}, {"n": 0}):
        with pytest.raises(ValueError):
            AuditConfig(**bad)


# ------------------------------------------------------------------ the tiny model
def tiny_agent(hf_backend, tokenizer):
    return LLMAgent(hf_backend, tokenizer, SamplingParams(max_tokens=12), max_context=2048)


def test_search_qa_with_the_tiny_model_and_igpo_scoring(hf_backend, tokenizer, tiny_dir, tmp_path):
    from turngym.agents.models import load_model
    from turngym.tools.parsers import get_parser
    from turngym.viewer.report import write_report

    cfg = AuditConfig(env="search-qa", n=4, group_size=2, k=2, vine_k=1, max_turns=2, bootstrap=10)
    model = load_model(tiny_dir, device="cpu")
    result = asyncio.run(
        run_audit(
            tiny_agent(hf_backend, tokenizer),
            cfg,
            model=model,
            tokenizer=tokenizer,
            parser=get_parser("hermes"),
        )
    )
    r = result.report
    assert r["trajectories"] == 4 and r["tokens"]["forked"] > 0
    assert r["tokens"]["generated"] > r["tokens"]["forked"]  # the trajectories' own tokens + the forks'
    assert r["methods"]["igpo"]["metrics"]["ig/contexts"] > 0  # IGPO scored with the model
    assert "error" not in r["methods"]["vine"] and "error" not in r["methods"]["tree_gigpo"]
    write_audit(tmp_path, r, result.trajectories)
    write_audit(tmp_path, r, result.trajectories)  # a rerun replaces the trajectories
    assert len((tmp_path / "trajectories.jsonl").read_text().splitlines()) == 4
    assert json.loads((tmp_path / "audit.json").read_text())["env"] == "search-qa"
    html = write_report(tmp_path).read_text()
    assert "credit audit" in html and "A*" in html


def test_budget_stops_forks_and_is_reported(hf_backend, tokenizer):
    cfg = AuditConfig(env="arith", env_kwargs=ARITH, n=2, group_size=2, k=2, budget=1, methods=("grpo",))
    r = asyncio.run(run_audit(tiny_agent(hf_backend, tokenizer), cfg)).report
    assert r["tokens"]["budget_exhausted"] and r["tokens"]["forks_stopped_by_budget"] > 0
    assert "exhausted" in markdown_table(r)


def test_cli_writes_json_table_and_trajectories(tmp_path):
    from turngym.cli import app

    out = tmp_path / "audit"
    res = CliRunner().invoke(
        app,
        ["credit", "audit", "arith", "-b", "random", "-n", "2", "-g", "2", "--k", "2", "--bootstrap", "5",
         "--env-arg", "max_turns=3", "--method", "grpo", "--method", "gigpo:gamma=0.9", "--out", str(out)],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "| gigpo:gamma=0.9 |" in res.output
    report = json.loads((out / "audit.json").read_text())
    assert list(report["methods"]) == ["grpo", "gigpo:gamma=0.9"] and report["trajectories"] == 4
    bad = CliRunner().invoke(app, ["credit", "audit", "arith", "-b", "random", "--k", "1", "--out", str(out)])
    assert bad.exit_code != 0 and "k >= 2" in bad.output

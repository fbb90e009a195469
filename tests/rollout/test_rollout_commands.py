"""``turngym rollout`` / ``turngym eval`` command functions, and the interval maths."""

import json

import pytest
import typer
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from turngym.cli_args import parse_key_values
from turngym.rollout.commands import eval as eval_cmd
from turngym.rollout.commands import rollout, wilson_interval
from turngym.rollout.store import load_trajectories

app = typer.Typer()
app.command("rollout")(rollout)
app.command("eval")(eval_cmd)
runner = CliRunner()


def test_rollout_scripted_writes_reloadable_files(tmp_path):
    res = runner.invoke(
        app, ["rollout", "arith", "--backend", "scripted", "-n", "3", "-g", "2", "--out", str(tmp_path)]
    )
    assert res.exit_code == 0, res.output
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert stats["requested"] == 6 == stats["completed"]
    trajs = load_trajectories(tmp_path)
    assert len(trajs) == 6 and all(t.total_reward == 1.0 for t in trajs)


def test_eval_reports_success_with_interval(tmp_path):
    res = runner.invoke(
        app,
        [
            "eval",
            "arith",
            "-n",
            "6",
            "--backend",
            "random",
            "--out",
            str(tmp_path),
            "--env-arg",
            "max_turns=2",
        ],
    )
    assert res.exit_code == 0, res.output
    report = json.loads((tmp_path / "eval.json").read_text())
    assert (
        report["episodes"] == 6
        and 0 <= report["success_ci"][0] <= report["success_rate"] <= report["success_ci"][1]
    )
    assert report["mean_turns"] <= 2


def test_the_hf_worker_is_the_default_exactly_on_cuda(monkeypatch):
    import torch

    from turngym.rollout.commands import use_hf_worker

    for cuda in (False, True):
        monkeypatch.setattr(torch.cuda, "is_available", lambda cuda=cuda: cuda)
        assert use_hf_worker(None) is cuda
        assert use_hf_worker(True) is True and use_hf_worker(False) is False


@pytest.mark.parametrize(
    "worker", [[], ["--hf-in-process"], ["--hf-worker"]], ids=["default", "in_process", "worker_process"]
)
def test_eval_with_hf_tiny_model(tmp_path, worker):
    res = runner.invoke(
        app,
        [
            "eval",
            "arith",
            "--backend",
            "hf",
            "--model",
            "tiny",
            "-n",
            "2",
            "--max-tokens",
            "8",
            "--env-arg",
            "max_turns=2",
            "--out",
            str(tmp_path),
            *worker,
        ],
    )
    assert res.exit_code == 0, res.output
    trajs = load_trajectories(tmp_path)
    assert len(trajs) == 2 and all(t.token_ids and sum(t.loss_mask) > 0 for t in trajs)


def test_bad_arguments_are_clear_errors():
    res = runner.invoke(app, ["eval", "arith", "--backend", "nope"])
    assert res.exit_code != 0 and "--backend must be one of" in res.output
    res = runner.invoke(app, ["eval", "arith", "--backend", "hf"])
    assert res.exit_code != 0 and "needs --model" in res.output
    res = runner.invoke(app, ["eval", "arith", "--env-arg", "novalue"])
    assert res.exit_code != 0 and "KEY=VALUE" in res.output


def test_parse_key_values():
    assert parse_key_values(["depth=4", "name=abc", "flag=true", 'opts={"a": 1}']) == {
        "depth": 4,
        "name": "abc",
        "flag": True,
        "opts": {"a": 1},
    }


@given(n=st.integers(1, 10_000), data=st.data())
def test_wilson_interval_contains_the_estimate(n, data):
    k = data.draw(st.integers(0, n))
    lo, hi = wilson_interval(k, n)
    assert 0.0 <= lo <= k / n <= hi <= 1.0
    lo2, hi2 = wilson_interval(4 * k, 4 * n)  # same rate, four times the data: a narrower interval
    assert hi2 - lo2 < hi - lo


# ------------------------------------------------------------------ --tree
def test_rollout_tree_writes_every_leaf_with_node_ids(tmp_path):
    args = ["rollout", "search-qa", "--backend", "scripted", "-n", "2", "--out", str(tmp_path)]
    res = runner.invoke(app, [*args, "--tree", "--tree-k", "3", "--tree-turns", "0,1"])
    assert res.exit_code == 0, res.output
    stats = json.loads((tmp_path / "stats.json").read_text())
    trajs = load_trajectories(tmp_path)
    assert stats["tree"]["trees"] == 2 and stats["requested"] == len(trajs) == stats["completed"]
    for seed in (0, 1):
        leaves = [t for t in trajs if t.seed == seed]
        # the expert answers in >= 2 turns: 3 children at turn 0, each branching into 3 at turn 1
        assert len(leaves) == 9 and {t.turns[1].parent_id for t in leaves} == {"root.0", "root.1", "root.2"}


def test_rollout_tree_options_are_checked(tmp_path):
    res = runner.invoke(app, ["rollout", "arith", "--out", str(tmp_path), "--tree", "--tree-k", "1"])
    assert res.exit_code == 2 and "k must be >= 2" in res.output
    res = runner.invoke(app, ["rollout", "arith", "--out", str(tmp_path), "--tree", "--tree-branch", "dice"])
    assert res.exit_code == 2 and "unknown branch policy 'dice'" in res.output


def test_rollout_tree_of_a_non_forkable_env_fails_before_any_episode(tmp_path):
    from turngym.core.registry import registry

    registry.register("unforkable-toy-v0", "faulty_env:FaultyEnv", override=True)
    try:
        res = runner.invoke(app, ["rollout", "unforkable-toy", "--out", str(tmp_path), "--tree"])
        assert res.exit_code == 2 and "tree rollouts need a forkable env" in res.output
        assert "--tree-fallback-flat" in res.output
        assert (
            not (tmp_path / "trajectories.jsonl").exists()
            or not (tmp_path / "trajectories.jsonl").read_text()
        )
        res = runner.invoke(
            app,
            [
                "rollout",
                "unforkable-toy",
                "--out",
                str(tmp_path),
                "--tree",
                "--tree-fallback-flat",
                "-n",
                "1",
            ],
        )
        assert res.exit_code == 0, res.output
        assert len(load_trajectories(tmp_path)) == 2  # a flat group of K=2
    finally:
        registry.unregister("unforkable-toy-v0")


def test_commands_receive_typed_option_models():
    """``with_options`` hands a command validated pydantic models (no packed dicts), with the
    command's own defaults, and a value the model refuses is an error naming the flag."""
    from turngym.rollout.cli_options import RunOptions, TreeOptions, with_options

    seen = {}

    @with_options(RunOptions, TreeOptions, after=1, n=5)
    def probe(env: str, *, run: RunOptions, tree: TreeOptions) -> None:
        seen.update(env=env, run=run, tree=tree)

    probe_app = typer.Typer()
    probe_app.command("probe")(probe)
    probe_app.command("other")(lambda: None)  # two commands: typer keeps the name
    res = runner.invoke(
        probe_app, ["probe", "arith", "-g", "3", "--url", "u1", "--url", "u2", "--tree", "--tree-k", "4"]
    )
    assert res.exit_code == 0, res.output
    run, tree = seen["run"], seen["tree"]
    assert isinstance(run, RunOptions) and isinstance(tree, TreeOptions) and seen["env"] == "arith"
    assert (run.n, run.g, run.url, run.backend) == (
        5,
        3,
        ["u1", "u2"],
        "scripted",
    )  # n: this command's default
    spec = run.agent_spec()
    assert tree.config().k == 4 and spec.urls == ["u1", "u2"] and spec.max_batch_size == run.concurrency
    assert (spec.kind, spec.max_context, spec.seed, spec.temperature) == ("scripted", 4096, 0, 1.0)
    with pytest.raises(ValueError):  # frozen: a command cannot rewrite its options
        run.n = 9
    for args, flag in (
        (["-n", "0"], "-n"),
        (["--turn-timeout", "-1"], "--turn-timeout"),
        (["-g", "0"], "-g"),
    ):
        res = runner.invoke(probe_app, ["probe", "arith", *args])
        assert res.exit_code != 0 and flag in res.output and "greater than" in res.output, res.output
    with pytest.raises(TypeError, match="no option"):
        with_options(RunOptions, after=1, nope=1)


def test_rollout_with_a_bad_tree_schedule_is_a_clear_error(tmp_path):
    res = runner.invoke(app, ["rollout", "arith", "--out", str(tmp_path), "--tree", "--tree-turns", "x,1"])
    assert res.exit_code != 0 and "--tree" in res.output

import subprocess
import sys
import textwrap

import gymnasium
import pytest

import turngym
from turngym.core.registry import Registry, UnknownEnvError, parse_id


def test_parse_id():
    assert parse_id("search-qa-v2") == ("search-qa", 2)
    assert parse_id("search-qa") == ("search-qa", None)
    assert parse_id("turngym/arith-v0") == ("arith", 0)
    with pytest.raises(ValueError):
        parse_id("Bad Id!")


def test_versions_defaults_and_overrides():
    reg = Registry()
    reg.register("toy-v0", "turngym.envs.arith.env:ArithEnv", depth=1)
    reg.register("toy-v1", "turngym.envs.arith.env:ArithEnv", depth=2, max_turns=5)
    assert reg.spec("toy").id == "toy-v1"  # bare name = latest
    env = reg.make("toy")
    assert env.depth == 2 and env.max_turns == 5
    env = reg.make("toy-v0", depth=4)
    assert env.depth == 4
    with pytest.raises(ValueError, match="already registered"):
        reg.register("toy-v1", "x:Y")
    with pytest.raises(UnknownEnvError, match="registered: toy-v0, toy-v1"):
        reg.spec("toy-v7")
    with pytest.raises(UnknownEnvError, match="Did you mean: toy"):
        reg.spec("tyo")


def test_entry_point_is_lazy(tmp_path, monkeypatch):
    (tmp_path / "lazy_env_mod.py").write_text(
        textwrap.dedent(
            """
            from turngym.envs.arith.env import ArithEnv
            IMPORTED = True
            class LazyEnv(ArithEnv):
                pass
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    reg = Registry()
    reg.register("lazy-v0", "lazy_env_mod:LazyEnv")
    assert "lazy_env_mod" not in sys.modules
    env = reg.make("lazy")
    assert type(env).__name__ == "LazyEnv" and "lazy_env_mod" in sys.modules
    bad = reg.register("broken-v0", "no_such_module_xyz:Env", requires=("docker",))
    with pytest.raises(ImportError, match=r"turngym\[docker\]"):
        bad.make()


def test_gymnasium_registry_mirror():
    assert "turngym/arith-v0" in gymnasium.registry
    env = gymnasium.make("turngym/arith-v0", depth=2)
    assert env.unwrapped.depth == 2
    obs, info = env.reset(seed=0)
    assert info["task_id"].startswith("arith-d2")


def test_plugin_discovery_through_entry_points(tmp_path):
    """A third-party package registers through the ``turngym.envs`` entry-point group."""
    (tmp_path / "myplugin.py").write_text(
        textwrap.dedent(
            """
            import turngym
            def register():
                turngym.register("plugin-env-v3", "turngym.envs.arith.env:ArithEnv", depth=1, source="myplugin")
            """
        )
    )
    dist = tmp_path / "myplugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: myplugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[turngym.envs]\nmyplugin = myplugin:register\n")
    code = textwrap.dedent(
        """
        import turngym
        env = turngym.make("plugin-env")
        print(turngym.spec("plugin-env").id, turngym.spec("plugin-env").source, env.depth)
        print("plugin-env-v3" in list(turngym.registry))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={"PYTHONPATH": str(tmp_path), "PATH": ""},
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["plugin-env-v3", "myplugin", "1", "True"]


def test_builtin_registry_contents():
    ids = [s.id for s in turngym.registry.latest()]
    assert "arith-v0" in ids
    assert "arith-v0" in turngym.registry
    assert 42 not in turngym.registry


def test_make_sets_spec_like_gymnasium():
    env = turngym.make("arith", depth=3)
    assert isinstance(env.spec, gymnasium.envs.registration.EnvSpec)
    assert env.spec.id == "arith-v0" and (env.spec.name, env.spec.version) == ("arith", 0)
    assert env.spec.kwargs == {**turngym.spec("arith").kwargs, "depth": 3}
    assert env.spec.family == "arith"
    assert "depth" not in turngym.spec("arith").kwargs  # the registry's spec is not touched
    assert turngym.make("turngym/arith-v0").spec.id == "arith-v0"
    assert turngym.make("arith-v0").spec.id == "arith-v0"


def test_make_sets_spec_of_a_versioned_id():
    reg = Registry()
    reg.register("toy-v0", "turngym.envs.arith.env:ArithEnv", depth=1)
    reg.register("toy-v2", "turngym.envs.arith.env:ArithEnv", depth=2)
    assert reg.make("toy").spec.id == "toy-v2"
    env = reg.make("toy-v0", max_turns=4)
    assert env.spec.id == "toy-v0" and env.spec.kwargs == {"depth": 1, "max_turns": 4}
    assert type(env)(depth=1).spec is None  # constructed directly: no spec, as in Gymnasium


def test_spec_through_wrappers_and_gymnasium_make():
    from turngym.core.wrappers import RecordTrajectory, TurnLimit

    wrapped = RecordTrajectory(TurnLimit(turngym.make("arith"), 3))
    assert wrapped.spec.id == "arith-v0"
    assert [w.name for w in wrapped.spec.additional_wrappers] == ["TurnLimit", "RecordTrajectory"]
    assert wrapped.env_id == "arith-v0"
    gym_env = gymnasium.make("turngym/arith-v0", depth=2)
    assert gym_env.spec.id == "turngym/arith-v0" and gym_env.spec.kwargs["depth"] == 2
    assert gym_env.unwrapped.depth == 2


def test_spec_metadata_answers_without_making_an_env():
    """The trainer and the engine read an env's parser, open-endedness and thread construction from
    its spec (its class's declarations), never from a probe env."""
    from turngym.core.registry import spec

    s = spec("search-qa")
    assert s.parser() == s.kwargs.get("parser", "hermes")
    assert s.parser({"parser": "tags"}) == "tags"  # the caller's choice wins
    assert spec("travel-open").open_ended() and not spec("travel-planner").open_ended()
    assert spec("arith").builds_in_thread() is False and spec("search-qa").builds_in_thread() is True

"""``load_object``: the one resolver of ``"package.module:name"`` references (env entry points and
judges, credit scorers and judges, harness reward functions, site servers)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from turngym.core.plugins import load_object
from turngym.core.registry import EnvSpec


def test_a_reference_names_a_module_attribute_or_a_dotted_one():
    from turngym.core.registry import EnvSpec as spec_class

    assert load_object("turngym.core.registry:EnvSpec", "x") is spec_class
    assert load_object("turngym.core.registry:EnvSpec.load", "x") is spec_class.load
    assert load_object("turngym.core.plugins:load_object", "x", must_call=True) is load_object


def test_a_bad_reference_is_a_clear_error_naming_the_setting():
    with pytest.raises(ValueError, match=r"my\.setting must be 'module:name', got 'no-colon'"):
        load_object("no-colon", "my.setting")
    with pytest.raises(ValueError, match=r"my\.setting 'turngym\.core\.plugins:nope': .* has no nope"):
        load_object("turngym.core.plugins:nope", "my.setting")
    with pytest.raises(ValueError, match="is not a callable"):
        load_object("turngym.core.plugins:log.name", "my.setting", must_call=True)
    with pytest.raises(ImportError):
        load_object("turngym.no_such_module:f", "my.setting")


_NAME = st.text(alphabet="abcdefghij_.", min_size=1, max_size=12)


@given(
    st.one_of(
        st.text(alphabet=st.characters(blacklist_characters=":"), max_size=30),  # no colon
        _NAME.map(lambda n: ":" + n),  # no module
        _NAME.map(lambda m: m + ":"),  # no name
    )
)
def test_every_malformed_reference_raises_value_error_and_nothing_else(path):
    with pytest.raises(ValueError, match="must be 'module:name'"):
        load_object(path, "setting")


def test_the_registry_and_the_credit_settings_resolve_through_it():
    """An env spec's entry point and judge, a pointwise scorer and an arena judge_fn: a missing name
    is a ValueError naming what was wrong (it was an AttributeError or a silent None before)."""
    from turngym.trainer.credit.arena import ArenaSettings, build_judge

    bad = EnvSpec(id="x-v0", entry_point="turngym.core.plugins:Nope", judge="turngym.core.plugins:nope")
    with pytest.raises(ValueError, match="entry point of 'x-v0'"):
        bad.load()
    with pytest.raises(ValueError, match="judge of 'x-v0'"):
        bad.load_judge()
    with pytest.raises(ValueError, match=r"credit\.arena\.judge_fn"):
        build_judge(ArenaSettings(judge_fn="turngym.core.plugins:nope"))
    with pytest.raises(ValueError, match=r"credit\.arena\.judge_fn"):
        build_judge(ArenaSettings(judge_fn="no-colon"))


def test_the_harness_reward_fn_resolves_through_it():
    from turngym.trainer.harness_rollout import load_reward_fn

    assert load_reward_fn("turngym.core.plugins:load_object") is load_object
    for bad in ("no-colon", "turngym.core.plugins:nope", "turngym.core.plugins:log.name"):
        with pytest.raises(ValueError, match=r"rollout\.harness\.reward_fn"):
            load_reward_fn(bad)

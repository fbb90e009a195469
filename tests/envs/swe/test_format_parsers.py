"""Property tests of the task-format parsers: test-id lists, Harbor rewards, Dockerfile FROM lines,
instance files. Whatever the input, they return the right value or raise the documented error."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from turngym.envs.swe.harbor import from_images
from turngym.envs.swe.repo import read_reward
from turngym.envs.swe.tasks import InstanceError, _json_list, read_instance_file

test_ids = st.lists(st.text(min_size=1, max_size=30), max_size=8)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=10,
)


@settings(deadline=None, max_examples=60)
@given(test_ids)
def test_test_id_lists_round_trip_as_list_or_json_string(ids):
    assert _json_list(ids, "FAIL_TO_PASS", "i") == ids
    assert _json_list(json.dumps(ids), "FAIL_TO_PASS", "i") == ids


@settings(deadline=None, max_examples=60)
@given(json_values)
@example("")
@example(" ")
def test_anything_else_is_an_instance_error_naming_instance_and_field(value):
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return
    forms = [value, json.dumps(value)]
    if isinstance(value, str) and not value.strip():  # a blank field means no test ids...
        assert _json_list(value, "PASS_TO_PASS", "inst-1") == []
        forms = forms[1:]  # ...but a JSON string holding a string is no list
    for given_as in forms:
        with pytest.raises(InstanceError, match=r"instance inst-1: field PASS_TO_PASS"):
            _json_list(given_as, "PASS_TO_PASS", "inst-1")


@settings(deadline=None, max_examples=60)
@given(st.text(max_size=40).filter(lambda t: t.strip() != ""))
def test_a_string_that_is_not_json_names_the_field(text):
    try:
        json.loads(text)
    except json.JSONDecodeError:
        with pytest.raises(InstanceError, match=r"field FAIL_TO_PASS is a string but not a JSON list"):
            _json_list(text, "FAIL_TO_PASS", "x")


@settings(deadline=None, max_examples=60)
@given(st.floats(allow_nan=False, allow_infinity=False))
def test_rewards_read_back_exactly(x):
    assert read_reward(f"{x!r}\n", "reward.txt") == x
    assert read_reward(json.dumps({"reward": x, "other": 0}), "reward.json") == x
    assert read_reward(json.dumps({"accuracy": x}), "reward.json") == x


@settings(deadline=None, max_examples=60)
@given(json_values)
def test_reward_json_is_one_number_or_a_value_error(value):
    try:
        r = read_reward(json.dumps(value), "reward.json")
    except ValueError:
        return
    assert isinstance(r, float) and not math.isnan(r)


@settings(deadline=None, max_examples=60)
@given(
    st.lists(
        st.from_regex(r"[a-z][a-z0-9.-]{0,10}(:[a-z0-9.]{1,6})?", fullmatch=True), min_size=1, max_size=4
    ),
    st.from_regex(r"[a-z][a-z0-9-]{0,10}:[0-9a-f]{4}", fullmatch=True),
)
def test_from_images_lists_each_external_image_once(images, base):
    stages = [f"s{i}" for i in range(len(images))]
    lines = ["ARG BASE_IMAGE"] + [f"FROM {img} AS {st_}" for img, st_ in zip(images, stages, strict=True)]
    lines += ["FROM ${BASE_IMAGE}", "FROM s0", "FROM scratch"]
    got = from_images("\n".join(lines), {"BASE_IMAGE": base})
    expected = list(dict.fromkeys([i for i in images if i != "scratch"] + [base]))
    assert got == expected


@settings(deadline=None, max_examples=60)
@given(st.lists(st.dictionaries(st.text(max_size=5), st.integers(), max_size=3), max_size=5))  # any unicode
def test_instance_files_keep_where_each_entry_came_from(tmp_path_factory, entries):
    d = tmp_path_factory.mktemp("f")
    jl = d / "x.jsonl"
    jl.write_text("".join(json.dumps(e, ensure_ascii=False) + "\n\n" for e in entries))
    assert read_instance_file(jl) == [(f"{jl} line {2 * i + 1}", e) for i, e in enumerate(entries)]
    js = d / "x.json"
    js.write_text(json.dumps(entries))
    assert read_instance_file(js) == [(f"{js} entry {i}", e) for i, e in enumerate(entries)]


def test_graders_are_checked_when_tasks_load():
    from turngym.envs.swe.repo import GRADER_NEEDS, GRADERS, check_grader, grader

    check_grader("swebench")  # installed here (the interop extra)
    with pytest.raises(KeyError, match="unknown grader 'nope'"):
        check_grader("nope")

    @grader("needs-missing", needs="turngym_no_such_module")
    def _g(sm, f2p, p2p):
        return [], [], "RESOLVED_NO"

    try:
        with pytest.raises(ImportError, match="needs the turngym_no_such_module package"):
            check_grader("needs-missing")
    finally:
        GRADERS.pop("needs-missing")
        GRADER_NEEDS.pop("needs-missing")


@settings(deadline=None, max_examples=60)
@given(
    st.dictionaries(
        st.text(min_size=1, max_size=8), st.sampled_from(["PASSED", "FAILED", "ERROR", "SKIPPED"])
    )
)
def test_swebench_grader_agrees_with_its_definition(sm):
    """RESOLVED_FULL iff every FAIL_TO_PASS test PASSED (or XFAIL) and every PASS_TO_PASS test PASSED or
    was SKIPPED; the strict grader also wants PASS_TO_PASS to pass."""
    from turngym.envs.swe.repo import GRADERS

    names = sorted(sm)
    f2p, p2p = names[: len(names) // 2] + ["missing::t"] * (len(names) % 2), names[len(names) // 2 :]
    f2p_ok, p2p_ok, status = GRADERS["swebench"](sm, f2p, p2p)
    assert f2p_ok == [t for t in f2p if sm.get(t) == "PASSED"]
    assert p2p_ok == [t for t in p2p if sm.get(t) in ("PASSED", "SKIPPED")]
    assert (status == "RESOLVED_FULL") == (len(f2p_ok) == len(f2p) and len(p2p_ok) == len(p2p))
    strict_ok = GRADERS["strict"](sm, f2p, p2p)[2] == "RESOLVED_FULL"
    assert strict_ok == (all(sm.get(t) == "PASSED" for t in f2p + p2p))

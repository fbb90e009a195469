"""WebArena's evaluators and task format (no browser)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from turngym.envs.webarena.evaluators import (
    EvaluationError,
    ProgramContext,
    clean_answer,
    evaluate,
    exact_match,
    must_include,
    program_html,
    string_match,
    url_match,
)
from turngym.envs.webarena.taskgen import TEMPLATES, generate_tasks
from turngym.envs.webarena.tasks import (
    TaskFormatError,
    check_task,
    fill_placeholders,
    load_tasks,
    save_tasks,
    site_for,
)


def _cfg(**ev):
    return {"intent": "q?", "eval": ev}


def test_clean_answer_and_exact_match():
    assert clean_answer('  "Hello World" ') == "hello world"
    assert clean_answer("'x'") == "x" and clean_answer("'") == "'"
    assert exact_match("42", " 42 ") == 1.0 and exact_match("42", "420") == 0.0
    assert exact_match("Yes", '"yes"') == 1.0


def test_must_include_tokenizes_single_short_references():
    assert must_include("0", "10 issues", tokenize=True) == 0.0
    assert must_include("0", "there are 0 issues", tokenize=True) == 1.0
    assert must_include("0", "10 issues", tokenize=False) == 1.0
    assert must_include("Quiet_Otter", "it is quiet_otter42") == 1.0


def test_string_match_combines_approaches():
    cfg = _cfg(eval_types=["string_match"], reference_answers={"must_include": ["alice", "bob"]})
    assert string_match(cfg, "Alice and Bob") == 1.0 and string_match(cfg, "alice") == 0.0
    cfg = _cfg(eval_types=["string_match"], reference_answers={"exact_match": "7", "must_include": ["7"]})
    assert string_match(cfg, "7") == 1.0 and string_match(cfg, "17") == 0.0
    fuzzy = _cfg(eval_types=["string_match"], reference_answers={"fuzzy_match": ["blue"]})
    with pytest.raises(EvaluationError, match="judge"):
        string_match(fuzzy, "blue")
    assert string_match(fuzzy, "navy", judge=lambda intent, ref, pred: 1.0 if pred == "navy" else 0.0) == 1.0
    na = _cfg(eval_types=["string_match"], reference_answers={"fuzzy_match": "N/A"})
    assert string_match(na, "n/a") == 1.0 and string_match(na, "something") == 0.0
    with pytest.raises(EvaluationError):
        string_match(_cfg(reference_answers={"regex": "x"}), "x")


def test_url_match_gold_in_pred():
    cfg = _cfg(eval_types=["url_match"], reference_url="http://t.local/p/-/issues?label_name=bug")
    assert url_match(cfg, "http://t.local/p/-/issues?state=opened&label_name=bug") == 1.0
    assert url_match(cfg, "http://t.local/p/-/issues?label_name=ui") == 0.0
    assert url_match(cfg, "http://t.local/q/-/issues?label_name=bug") == 0.0
    alt = _cfg(reference_url="http://f.local/f/a |OR| http://f.local/f/b/")
    assert url_match(alt, "http://f.local/f/b") == 1.0 and url_match(alt, "http://f.local/f/c") == 0.0
    spaced = _cfg(reference_url="http://t.local/p/-/issues?label_name=good+first+issue")
    assert url_match(spaced, "http://t.local/p/-/issues?state=opened&label_name=good+first+issue") == 1.0
    with pytest.raises(EvaluationError):
        url_match(_cfg(reference_url=""), "x")
    with pytest.raises(EvaluationError):
        url_match(_cfg(reference_url="http://a", url_note="EXACT"), "http://a")


async def test_program_html_reads_pages_and_databases():
    seen = []

    async def read_page(url, locator):
        seen.append((url, locator))
        return "<b>Labels: bug, ui</b>" if locator else "<html>&amp; whole page</html>"

    def query_db(site, sql):
        seen.append((site, sql))
        return [("closed", None)]

    ctx = ProgramContext(read_page, query_db)
    checks = [
        {"url": "last", "locator": "document.querySelector('.labels').outerText",
         "required_contents": {"must_include": ["ui", "feature |OR| bug"]}},
        {"url": "__TRACKER__", "locator": "sql:SELECT state, assignee FROM issues",
         "required_contents": {"exact_match": "closed | "}},
        {"url": "http://x/", "locator": "", "required_contents": {"must_include": ["& whole"]}},
    ]  # fmt: skip
    assert await program_html(_cfg(program_html=checks), ctx) == 1.0
    assert seen[1] == ("__TRACKER__", "SELECT state, assignee FROM issues")
    checks[0]["required_contents"] = {"must_include": ["security"]}
    assert await program_html(_cfg(program_html=checks), ctx) == 0.0
    with pytest.raises(EvaluationError, match="func"):
        await program_html(
            _cfg(program_html=[{"url": "func:f()", "locator": "", "required_contents": {}}]), ctx
        )
    with pytest.raises(EvaluationError, match="locator"):
        await program_html(
            _cfg(program_html=[{"url": "last", "locator": "xpath://a", "required_contents": {}}]), ctx
        )
    cfg = _cfg(
        eval_types=["string_match", "url_match"],
        reference_answers={"exact_match": "a"},
        reference_url="http://u/p",
    )
    score, parts = await evaluate(cfg, answer="a", url="http://u/p?x=1")
    assert score == 1.0 and parts == {"string_match": 1.0, "url_match": 1.0}
    score, parts = await evaluate(cfg, answer="b", url="http://u/p")
    assert score == 0.0 and parts["url_match"] == 1.0


@given(st.text(max_size=40))
def test_clean_answer_properties(text):
    once = clean_answer(text)
    assert once == once.lower()
    assert exact_match(text, text) == 1.0
    assert must_include(text, "prefix " + text + " suffix") == 1.0


def test_generated_tasks_follow_the_format(site_dir):
    tasks = generate_tasks(seed=0, per_template=3, data_dir=site_dir)
    assert len(tasks) == 3 * len(TEMPLATES) and [t["task_id"] for t in tasks] == list(range(len(tasks)))
    kinds = {k for t in tasks for k in t["eval"]["eval_types"]}
    assert kinds == {"string_match", "url_match", "program_html"}
    for t in tasks:
        assert set(t) >= {"sites", "task_id", "require_login", "start_url", "intent_template", "instantiation_dict",
                          "intent", "require_reset", "eval", "intent_template_id"}  # fmt: skip
        assert "{{" not in t["intent"] and t["start_url"].startswith(("__FORUM__", "__TRACKER__"))
    locs = [c["locator"] for t in tasks for c in t["eval"]["program_html"]]
    assert any(loc.startswith("sql:") for loc in locs) and any(loc.startswith("document.") for loc in locs)
    assert any(t["sites"] == ["forum", "tracker"] for t in tasks)  # cross-site tasks
    assert generate_tasks(seed=0, per_template=3, data_dir=site_dir) == tasks


def test_load_tasks_formats(tmp_path, site_dir):
    tasks = generate_tasks(seed=0, per_template=1, data_dir=site_dir)
    assert load_tasks(save_tasks(tasks, tmp_path / "all.json")) == tasks
    (tmp_path / "all.jsonl").write_text("\n".join(json.dumps(t) for t in tasks))
    assert load_tasks(tmp_path / "all.jsonl") == tasks
    folder = tmp_path / "config_files"
    folder.mkdir()
    for t in tasks:
        (folder / f"{t['task_id']}.json").write_text(json.dumps(t))
    assert load_tasks(folder) == tasks
    shopping = {"task_id": 99, "sites": ["shopping"], "start_url": "__SHOPPING__", "intent": "x",
                "eval": {"eval_types": ["url_match"], "reference_url": "__SHOPPING__/a"}}  # fmt: skip
    save_tasks([*tasks, shopping], tmp_path / "mixed.json")
    with pytest.raises(TaskFormatError, match="not served"):
        load_tasks(tmp_path / "mixed.json")
    assert load_tasks(tmp_path / "mixed.json", skip_unsupported=True) == tasks


def test_webarena_site_names_and_placeholders_map_to_local_sites():
    raw = {
        "task_id": 3, "sites": ["reddit"], "start_url": "__REDDIT__/f/books", "intent": "open it",
        "eval": {"eval_types": ["url_match"], "reference_url": "__REDDIT__/f/books?sort=top"},
    }  # fmt: skip
    t = check_task(raw)
    assert t["sites"] == ["forum"]
    filled = fill_placeholders(t)
    assert filled["start_url"] == "http://forum.local/f/books"
    assert filled["eval"]["reference_url"] == "http://forum.local/f/books?sort=top"
    assert (
        fill_placeholders("__GITLAB__/x", {"forum": "a", "tracker": "http://127.0.0.1:9"})
        == "http://127.0.0.1:9/x"
    )
    assert (
        site_for("__GITLAB__") == "tracker"
        and site_for("http://forum.local/x") == "forum"
        and site_for("zz") is None
    )
    no_sites = dict(raw, sites=[])
    assert check_task(no_sites)["sites"] == ["forum"]


@pytest.mark.parametrize(
    "patch, message",
    [
        ({"sites": ["shopping"]}, "not served"),
        ({"eval": {"eval_types": []}}, "eval_types"),
        ({"eval": {"eval_types": ["screenshot_match"]}}, "eval_types"),
        ({"eval": {"eval_types": ["string_match"]}}, "reference_answers"),
        ({"eval": {"eval_types": ["url_match"]}}, "reference_url"),
        ({"eval": {"eval_types": ["program_html"]}}, "program_html"),
        ({"intent": None}, None),
    ],
)
def test_bad_tasks_are_rejected(patch, message):
    raw = {"task_id": 1, "sites": ["gitlab"], "start_url": "__GITLAB__", "intent": "x",
           "eval": {"eval_types": ["url_match"], "reference_url": "__GITLAB__/a"}}  # fmt: skip
    raw.update(patch)
    if patch.get("intent", "") is None:
        del raw["intent"]
        message = "intent"
    with pytest.raises(TaskFormatError, match=message):
        check_task(raw)


def test_registered_site_subsets():
    import turngym

    for env_id, site in (("web-forum-v0", "forum"), ("web-tracker-v0", "tracker")):
        env = turngym.make(env_id, per_template=1)
        try:
            assert {s for t in env.tasks for s in t["sites"]} == {site} and len(env.tasks) == 8
            assert env.instances == {}  # sites start lazily, at the first reset
        finally:
            env.close()
    with pytest.raises(ValueError, match="unknown sites"):
        turngym.make("web-arena-lite-v0", sites=["wikipedia"])
    with pytest.raises(ValueError, match="no tasks"):
        turngym.make("web-arena-lite-v0", template_ids=[999])

"""Arena-style tasks generated from the sites' databases, in WebArena's JSON format.

Eighteen intent templates (eight per site, two that need both sites and two tabs), each instantiated from the pristine database with a
seed, cover WebArena's three evaluator kinds: information seeking (``string_match``: counts,
authors, titles, assignees), navigation (``url_match``: sorted or filtered listings, a given page)
and site changes (``program_html``: page checks through JavaScript locators and database checks
through ``sql:`` locators). Every task is solvable on the site it starts from.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from turngym.core.cache import cache_root
from turngym.envs.webarena.sites import forum, pristine_db, tracker
from turngym.envs.webarena.tasks import check_task, load_tasks, save_tasks

TASKS_VERSION = 2
Row = dict[str, Any]
Maker = Callable[[Any, np.random.Generator], tuple[Row, str, Row]]
_WORDS = ("maple", "harbor", "quartz", "meadow", "lantern", "pebble", "orchid", "summit", "velvet", "comet")


def q(text: str) -> str:
    """An SQL string literal."""
    return "'" + str(text).replace("'", "''") + "'"


def _sql_check(site: str, sql: str, **required: Any) -> Row:
    return {"url": site, "locator": "sql:" + sql, "required_contents": required}


def _answer(**reference: Any) -> Row:
    """The eval of an information-seeking task: the answer matches ``reference`` (``string_match``)."""
    return {"eval_types": ["string_match"], "reference_answers": reference}


def _url(url: str) -> Row:
    """The eval of a navigation task: the final page is ``url`` (``url_match``)."""
    return {"eval_types": ["url_match"], "reference_url": url}


def _program(*checks: Row) -> Row:
    """The eval of a site change: every check holds (``program_html``)."""
    return {"eval_types": ["program_html"], "program_html": list(checks)}


def _phrase(rng: np.random.Generator, n: int) -> str:
    return " ".join(_WORDS[int(i)] for i in rng.choice(len(_WORDS), size=n, replace=False))


def _post(c: Any, rng: np.random.Generator, where: str = "1") -> Row:
    rows = c.execute(
        f"SELECT p.*, (SELECT count(*) FROM comments k WHERE k.post_id = p.id) ncom FROM posts p WHERE {where}"
    ).fetchall()
    return dict(rows[int(rng.integers(len(rows)))])


def _issue(c: Any, rng: np.random.Generator, where: str = "1") -> Row:
    rows = c.execute(f"SELECT * FROM issues WHERE {where}").fetchall()
    return dict(rows[int(rng.integers(len(rows)))])


def _top_title(c: Any, forum_name: str) -> str:
    """The title of the forum's top post (highest score, then oldest)."""
    row = c.execute("SELECT title FROM posts WHERE forum = ? ORDER BY score DESC, id LIMIT 1", (forum_name,))
    return row.fetchone()[0]


def _open_count(c: Any, project: str) -> int:
    """How many issues of the project are open."""
    return c.execute(
        "SELECT count(*) FROM issues WHERE project = ? AND state = 'opened'", (project,)
    ).fetchone()[0]


# ------------------------------------------------------------------ forum (__FORUM__)
def f_comments(c, rng):
    p = _post(c, rng)
    inst = {"title": p["title"], "forum": p["forum"], "post_id": p["id"]}
    return inst, "__FORUM__", _answer(exact_match=str(p["ncom"]))


def f_author(c, rng):
    p = _post(c, rng)
    inst = {"title": p["title"], "forum": p["forum"], "post_id": p["id"]}
    return inst, "__FORUM__", _answer(must_include=[p["author"]])


def f_top_sorted(c, rng):
    f = str(rng.choice(list(forum.FORUMS)))
    return {"forum": f}, "__FORUM__", _url(f"__FORUM__/f/{f}?sort=top")


def f_upvote(c, rng):
    p = _post(c, rng)
    sql = f"SELECT value FROM votes WHERE user = {q(forum.ME)} AND post_id = {p['id']}"
    inst = {"title": p["title"], "forum": p["forum"], "post_id": p["id"]}
    return inst, "__FORUM__", _program(_sql_check("__FORUM__", sql, exact_match="1"))


def f_reply(c, rng):
    p = _post(c, rng)
    text = f"Thanks, this {_phrase(rng, 2)} tip helped!"
    inst = {"title": p["title"], "forum": p["forum"], "post_id": p["id"], "text": text}
    check = {
        "url": f"__FORUM__/f/{p['forum']}/{p['id']}",
        "locator": "document.querySelector('.comments').outerText",
        "required_contents": {"must_include": [text]},
    }
    return inst, "__FORUM__", _program(check)


def f_create(c, rng):
    f = str(rng.choice(list(forum.FORUMS)))
    title, body = f"My {_phrase(rng, 2)} question", f"Has anyone tried the {_phrase(rng, 1)} approach?"
    sql = f"SELECT body FROM posts WHERE forum = {q(f)} AND title = {q(title)} AND author = {q(forum.ME)}"
    checks = [
        _sql_check("__FORUM__", sql, exact_match=body),
        {"url": "last", "locator": "document.querySelector('.post-title').outerText",
         "required_contents": {"must_include": [title]}},
    ]  # fmt: skip
    inst = {"forum": f, "title": title, "body": body}
    return inst, "__FORUM__", _program(*checks)


def f_subscribe(c, rng):
    f = str(rng.choice(list(forum.FORUMS)))
    sql = f"SELECT count(*) FROM subscriptions WHERE user = {q(forum.ME)} AND forum = {q(f)}"
    return {"forum": f}, "__FORUM__", _program(_sql_check("__FORUM__", sql, exact_match="1"))


def f_top_title(c, rng):
    f = str(rng.choice(list(forum.FORUMS)))
    return {"forum": f}, "__FORUM__", _answer(exact_match=_top_title(c, f))


# ------------------------------------------------------------------ tracker (__TRACKER__)
def t_open_count(c, rng):
    p = str(rng.choice(list(tracker.PROJECTS)))
    return {"project": p}, "__TRACKER__", _answer(exact_match=str(_open_count(c, p)))


def t_assignee(c, rng):
    i = _issue(c, rng, "assignee IS NOT NULL")
    inst = {"project": i["project"], "iid": i["iid"]}
    ref = {"must_include": [i["assignee"]]}
    return inst, "__TRACKER__", _answer(**ref)


def t_label_list(c, rng):
    p, lab = str(rng.choice(list(tracker.PROJECTS))), str(rng.choice(tracker.LABELS))
    url = f"__TRACKER__/{p}/-/issues?state=opened&label_name={lab.replace(' ', '+')}"
    return {"project": p, "label": lab}, "__TRACKER__", _url(url)


def t_close(c, rng):
    i = _issue(c, rng, "state = 'opened'")
    sql = f"SELECT state FROM issues WHERE project = {q(i['project'])} AND iid = {i['iid']}"
    inst = {"project": i["project"], "title": i["title"], "iid": i["iid"]}
    return inst, "__TRACKER__", _program(_sql_check("__TRACKER__", sql, exact_match="closed"))


def t_assign(c, rng):
    i = _issue(c, rng)
    members = [
        r[0] for r in c.execute("SELECT user FROM members WHERE project = ? ORDER BY user", (i["project"],))
    ]
    user = str(rng.choice([m for m in members if m != i["assignee"]]))
    sql = f"SELECT assignee FROM issues WHERE project = {q(i['project'])} AND iid = {i['iid']}"
    inst = {"project": i["project"], "iid": i["iid"], "user": user}
    return inst, "__TRACKER__", _program(_sql_check("__TRACKER__", sql, exact_match=user))


def t_label(c, rng):
    i = _issue(c, rng)
    have = {
        r[0]
        for r in c.execute(
            "SELECT label FROM issue_labels WHERE project=? AND iid=?", (i["project"], i["iid"])
        )
    }
    lab = str(rng.choice([x for x in tracker.LABELS if x not in have]))
    check = {
        "url": f"__TRACKER__/{i['project']}/-/issues/{i['iid']}",
        "locator": "document.querySelector('.labels').outerText",
        "required_contents": {"must_include": [lab]},
    }
    inst = {"project": i["project"], "iid": i["iid"], "label": lab}
    return inst, "__TRACKER__", _program(check)


def t_new_issue(c, rng):
    p = str(rng.choice(list(tracker.PROJECTS)))
    title, desc = f"Support {_phrase(rng, 2)} mode", f"It would help to have {_phrase(rng, 1)} support."
    sql = f"SELECT body, state, author FROM issues WHERE project = {q(p)} AND title = {q(title)}"
    inst = {"project": p, "title": title, "description": desc}
    checks = [_sql_check("__TRACKER__", sql, exact_match=f"{desc} | opened | {tracker.ME}")]
    return inst, "__TRACKER__", _program(*checks)


def t_open_issue_page(c, rng):
    i = _issue(c, rng)
    inst = {"project": i["project"], "title": i["title"], "iid": i["iid"]}
    url = f"__TRACKER__/{i['project']}/-/issues/{i['iid']}"
    return inst, "__TRACKER__", _url(url)


# ------------------------------------------------------------------ both sites
def x_comment_count(conns, rng):
    inst, _, _ = f_reply(conns["forum"], rng)
    del inst["text"]
    project = str(rng.choice(list(tracker.PROJECTS)))
    text = f"{project} has {_open_count(conns['tracker'], project)} open issues"
    sql = f"SELECT body FROM comments WHERE post_id = {inst['post_id']} AND author = {q(forum.ME)}"
    inst["project"] = project
    return inst, "__FORUM__", _program(_sql_check("__FORUM__", sql, must_include=[text]))


def x_issue_from_post(conns, rng):
    inst, _, _ = t_new_issue(conns["tracker"], rng)
    del inst["description"]
    f = str(rng.choice(list(forum.FORUMS)))
    sql = f"SELECT body FROM issues WHERE project = {q(inst['project'])} AND title = {q(inst['title'])}"
    inst["forum"] = f
    check = _sql_check("__TRACKER__", sql, exact_match=_top_title(conns["forum"], f))
    return inst, "__TRACKER__", _program(check)


#: intent_template_id -> (site or "forum+tracker", intent template, maker)
TEMPLATES: dict[int, tuple[str, str, Maker]] = {
    100: ("forum", 'How many comments does the post "{{title}}" in f/{{forum}} have?', f_comments),
    101: ("forum", 'Who submitted the post "{{title}}" in f/{{forum}}?', f_author),
    102: ("forum", "Show me the posts of f/{{forum}} sorted by top score.", f_top_sorted),
    103: ("forum", 'Upvote the post "{{title}}" in f/{{forum}}.', f_upvote),
    104: ("forum", 'Reply "{{text}}" to the post "{{title}}" in f/{{forum}}.', f_reply),
    105: ("forum", 'Create a post in f/{{forum}} titled "{{title}}" with the text "{{body}}".', f_create),
    106: ("forum", "Subscribe to f/{{forum}}.", f_subscribe),
    107: ("forum", "What is the title of the highest-scored post in f/{{forum}}?", f_top_title),
    200: ("tracker", "How many open issues does the project {{project}} have?", t_open_count),
    201: ("tracker", "Who is assigned to issue #{{iid}} of {{project}}?", t_assignee),
    202: ("tracker", 'Show me the open issues of {{project}} labelled "{{label}}".', t_label_list),
    203: ("tracker", 'Close the issue "{{title}}" in {{project}}.', t_close),
    204: ("tracker", "Assign issue #{{iid}} of {{project}} to {{user}}.", t_assign),
    205: ("tracker", 'Add the label "{{label}}" to issue #{{iid}} of {{project}}.', t_label),
    206: (
        "tracker",
        'Open a new issue in {{project}} titled "{{title}}" with the description "{{description}}".',
        t_new_issue,
    ),
    207: ("tracker", 'Open the page of the issue "{{title}}" in {{project}}.', t_open_issue_page),
    300: (
        "forum+tracker",
        'Comment on the post "{{title}}" in f/{{forum}}: "{{project}} has N open issues", with N the number of '
        "open issues of the project {{project}} on the tracker.",
        x_comment_count,
    ),
    301: (
        "forum+tracker",
        'Open an issue in {{project}} titled "{{title}}" whose description is the title of the highest-scored '
        "post in f/{{forum}} on the forum.",
        x_issue_from_post,
    ),
}
_WRITES = {103, 104, 105, 106, 203, 204, 205, 206, 300, 301}


def instantiate(template: str, inst: dict[str, Any]) -> str:
    for k, v in inst.items():
        template = template.replace("{{" + k + "}}", str(v))
    return template


def generate_tasks(
    seed: int = 0, per_template: int = 10, *, data_dir: str | Path | None = None
) -> list[dict[str, Any]]:
    """``per_template`` tasks of every template, task ids in template-major order."""
    tasks: list[dict[str, Any]] = []
    conns = {}
    try:
        for name in ("forum", "tracker"):
            conns[name] = sqlite3.connect(
                f"file:{pristine_db(name, seed, directory=data_dir)}?mode=ro", uri=True
            )
            conns[name].row_factory = sqlite3.Row
        for tid, (site, template, make) in TEMPLATES.items():
            sites = site.split("+")
            for k in range(per_template):
                rng = np.random.default_rng([seed, tid, k])
                inst, start, ev = make(conns[site] if len(sites) == 1 else conns, rng)
                ev = {
                    "reference_answers": None,
                    "reference_url": "",
                    "program_html": [],
                    "url_note": "GOLD in PRED",
                    **ev,
                }
                task = {
                    "sites": sites,
                    "task_id": len(tasks),
                    "require_login": True,
                    "storage_state": None,
                    "start_url": start,
                    "geolocation": None,
                    "intent_template": template,
                    "instantiation_dict": json.loads(json.dumps(inst)),
                    "intent": instantiate(template, inst),
                    "require_reset": tid in _WRITES,
                    "eval": ev,
                    "intent_template_id": tid,
                }
                tasks.append(check_task(task))
    finally:
        for c in conns.values():
            c.close()
    return tasks


def default_tasks(seed: int = 0, per_template: int = 10) -> list[dict[str, Any]]:
    """The generated task set for ``seed``, cached as a WebArena-format JSON file."""
    path = cache_root() / "webarena" / f"tasks-v{TASKS_VERSION}-s{seed}-k{per_template}.json"
    if not path.exists():
        tmp = path.with_suffix(f".{np.random.default_rng().integers(1 << 30)}.tmp")
        save_tasks(generate_tasks(seed, per_template), tmp)
        tmp.replace(path)
    return load_tasks(path)

"""End to end on the real Docker daemon: ``turngym rollout swe-docker --tree`` from the command line, then
``turngym view`` over its directory.

The policy is the env's scripted expert, except that a session forked at a branch point first writes a
note of its own into the work tree (``note-<node>.txt``) and lists what the work tree holds; so at every
branch point child 0 fixes the bug and child 1 writes its note, and every node's observation shows that
branch's files. Checked on the saved records: the node/parent ids of every tree, each branch's work tree
after the fork (its path's notes and edits, none of its siblings'), the graded rewards of every leaf
(the path that runs out of turns before submitting gets 0), the fork counters, no container left, and the
report's SVG tree of every task with the node values of the records.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections import defaultdict

import pytest
from typer.testing import CliRunner

from turngym.agents.base import AgentStep, TextSession
from turngym.agents.factory import agent_kind
from turngym.cli import app
from turngym.core.types import Message
from turngym.rollout.store import load_trajectories
from turngym.sandboxes.docker import LABEL_PID, managed_containers

pytestmark = [pytest.mark.docker]

N_TASKS = 3
NOTE_CMD = re.compile(r"^echo (\S+) > note-\1\.txt")


class _ExploreSession(TextSession):
    """The expert's actions; a forked session first writes its own note (its node id, from its route)."""

    def __init__(self, env, prompt):
        super().__init__(prompt)
        self.env = env
        self.note: str | None = None

    def _forked(self, seed, route):
        self.note = route.rsplit("#", 1)[-1]  # "<env>/<seed>#root.1" -> "root.1"

    async def act(self) -> AgentStep:
        base = self.env.unwrapped
        if self.note is not None:
            note, self.note = self.note, None
            command = f"echo {note} > note-{note}.txt && ls note-*.txt && echo --- && git diff --name-only"
            action = base.format_call("bash", {"command": command})
        else:
            action = base.expert_action()
        message = action if isinstance(action, Message) else Message(role="assistant", content=action)
        return AgentStep(message, "stop")


class ExploreExpert:
    name = "explore-expert"

    def start(self, env, prompt, *, seed, route):
        return _ExploreSession(env, prompt)


async def _build(spec, stack):
    return ExploreExpert()


def mine() -> set[str]:
    """This process's containers (other engineers share the daemon)."""
    return {c.name for c in managed_containers() if c.labels.get(LABEL_PID) == str(os.getpid())}


def call_of(turn) -> tuple[str, dict]:
    body = json.loads(turn.action.content.split("<tool_call>", 1)[1].split("</tool_call>", 1)[0])
    return body["name"], body["arguments"]


@pytest.fixture(scope="module")
def explore_kind():
    """``--backend explore-expert``, registered for this module only (the registry is process-wide:
    other tests list its kinds)."""
    from turngym.agents import factory

    agent_kind("explore-expert")(_build)
    yield "explore-expert"
    factory._KINDS.pop("explore-expert", None)


@pytest.fixture(scope="module")
def run(tmp_path_factory, explore_kind):
    """The CLI rollout (3 tasks, k=2 at turns 0 and 1, at most 3 turns, a pool of 4 containers: one
    tree of 4 paths at a time) and the report over it."""
    from turngym.envs.swe.tasks import load_instances
    from turngym.sandboxes.images import base_image

    base_image()
    tasks = [t.instance_id for t in load_instances() if t.package.startswith("inflection")][:N_TASKS]
    out = tmp_path_factory.mktemp("swe-tree")
    before = mine()
    t0 = time.monotonic()
    res = CliRunner().invoke(
        app,
        [
            "rollout", "swe-docker", "--backend", explore_kind, "-n", str(N_TASKS),
            "--tree", "--tree-k", "2", "--tree-turns", "0,1",
            "--env-arg", f"task_ids={json.dumps(tasks)}", "--env-arg", "max_turns=3",
            "--env-arg", "max_active=4", "--env-arg", "command_timeout=30",
            "--out", str(out),
        ],
    )  # fmt: skip
    wall = time.monotonic() - t0
    assert res.exit_code == 0, res.output
    deadline = time.monotonic() + 30  # grading containers are removed in the background
    while mine() - before and time.monotonic() < deadline:
        time.sleep(0.2)
    left = mine() - before
    view = CliRunner().invoke(app, ["view", str(out)])
    assert view.exit_code == 0, view.output
    return {
        "out": out,
        "wall": wall,
        "left": left,
        "leaves": load_trajectories(out),  # the parquet file, as the trainer reads it
        "stats": json.loads((out / "stats.json").read_text()),
        "html": (out / "report.html").read_text(),
    }


def trees(leaves) -> dict[str, list]:
    by_group = defaultdict(list)
    for leaf in leaves:
        by_group[leaf.group].append(leaf)
    return dict(by_group)


def test_every_tree_is_whole_and_nothing_is_left_behind(run):
    stats, groups = run["stats"], trees(run["leaves"])
    assert run["left"] == set(), "the tree rollout left containers behind"
    assert len(groups) == N_TASKS and stats["masked"] == 0
    assert stats["tree"]["trees"] == N_TASKS and stats["tree"]["fork_errors"] == 0
    assert stats["tree"]["forks"] == 3 * N_TASKS  # one fork at turn 0, one per child at turn 1
    for leaves in groups.values():
        assert len({leaf.task_id for leaf in leaves}) == 1
        nodes = {t.node_id: t for leaf in leaves for t in leaf.turns}
        for node, turn in nodes.items():  # every child has its parent in the same tree
            assert turn.parent_id == "root" or turn.parent_id in nodes
            assert node.rsplit(".", 1)[0] == turn.parent_id and node.rsplit(".", 1)[1].isdigit()
        for leaf in leaves:
            parent = "root"
            for turn in leaf.turns:  # a leaf is a path: each turn the child of the one before
                assert turn.parent_id == parent
                assert nodes[turn.node_id].action.content == turn.action.content  # one node, one turn
                parent = turn.node_id
            assert leaf.metadata["tree"]["leaf"] == parent
        assert sorted(leaf.metadata["tree"]["leaf"] for leaf in leaves) == [
            "root.0.0", "root.0.1.0", "root.1.0.0", "root.1.1.0"
        ]  # fmt: skip
        assert [leaf.sample for leaf in sorted(leaves, key=lambda t: t.sample)] == [0, 1, 2, 3]
        assert leaves[0].metadata["tree"]["nodes"] == len(nodes) == 9


def test_branches_diverge_from_the_fork_point(run):
    """Every observation of the work tree shows exactly its path's notes and edits: what the prefix did
    before the fork, what the branch did after it, nothing of a sibling's."""
    for leaves in trees(run["leaves"]).values():
        seen_notes: dict[str, set[str]] = {}
        for leaf in leaves:
            notes: set[str] = set()
            edited: list[str] = []
            for turn in leaf.turns:
                name, args = call_of(turn)
                text = turn.observation[0].content
                if name == "bash":
                    note = NOTE_CMD.match(args["command"]).group(1)
                    assert note == turn.node_id  # a forked session writes first, under its own node
                    notes.add(note)
                    listed, _, diff = text.split("<output>\n", 1)[1].split("</output>")[0].partition("---\n")
                    assert listed.split() == sorted(f"note-{n}.txt" for n in notes), turn.node_id
                    assert diff.split() == edited, turn.node_id
                elif name == "file_editor":
                    assert turn.node_id.endswith(".0")  # child 0 (or a path that did not branch) fixes
                    assert "has been edited" in text
                    edited = [args["path"].removeprefix("/testbed/")]
                else:
                    assert name == "submit"
                    # the branch's own work tree went into its patch; new files at the repository
                    # root are left out of grading, and the submit says which
                    assert f"changes {len(edited)} file(s): {', '.join(edited)}." in text
                    dropped = ", ".join(sorted(f"note-{n}.txt" for n in notes))
                    assert (f"were dropped: {dropped}." in text) if notes else ("dropped" not in text)
                seen_notes.setdefault(turn.node_id, set(notes))
        # siblings acted differently at each branch point, and so hold different work trees after it
        for parent in {n.rsplit(".", 1)[0] for n in seen_notes if n.count(".") <= 2}:
            zero, one = seen_notes[f"{parent}.0"], seen_notes[f"{parent}.1"]
            assert one == zero | {f"{parent}.1"} and f"{parent}.1" not in zero


def test_every_leaf_is_graded(run):
    for leaves in trees(run["leaves"]).values():
        by_leaf = {leaf.metadata["tree"]["leaf"]: leaf for leaf in leaves}
        for leaf in leaves:
            last = leaf.turns[-1]
            assert not leaf.masked and "outcome_level" in last.reward_components
            assert all("format_ok" in t.reward_components for t in leaf.turns)
        for name in ("root.0.0", "root.0.1.0", "root.1.0.0"):  # fixed, then submitted: resolved
            leaf = by_leaf[name]
            assert leaf.terminated and leaf.total_reward == 1.0
            assert leaf.turns[-1].reward_components["outcome_level"] == 3.0
            assert leaf.turns[-1].info["grade"]["resolved"] is True
        late = by_leaf["root.1.1.0"]  # two notes, then the fix on its last turn: no submit
        assert late.truncated and not late.terminated and late.total_reward == 0.0
        assert late.turns[-1].reward_components["outcome_level"] == 0.0


def test_the_report_draws_every_tree_with_its_values(run):
    html, groups = run["html"], trees(run["leaves"])
    assert html.count('<svg class="tree"') == N_TASKS
    sections = html.split('<section class="group"')[1:]
    assert len(sections) == N_TASKS
    drawn = sorted(tuple(sorted(set(re.findall(r'data-node="([^"]+)"', s)))) for s in sections)
    expected = sorted(
        tuple(sorted({"root"} | {t.node_id for leaf in leaves for t in leaf.turns}))
        for leaves in groups.values()
    )
    assert drawn == expected
    for s in sections:
        assert "4 leaves · 3 branch points" in s and "branch @ turn 0 ×2" in s and "branch @ turn 1 ×2" in s
        # the root's value is the mean return of the tree's leaves (3 resolved, 1 out of turns)
        assert re.search(r"<title>root · value 0\.75 · 4 leaves", s)
        assert re.search(r"<title>root\.1\.1 · value 0 · 1 leaves", s)

"""Task files: the shipped set, the SWE-bench format round trip, snapshot loading, synthesis."""

from __future__ import annotations

import io
import json
import tarfile

import pytest

from turngym.envs.swe.packages import PACKAGES
from turngym.envs.swe.tasks import SweTask, load_instances, read_snapshot, save_instances

SWEBENCH_KEYS = {
    "instance_id",
    "repo",
    "base_commit",
    "patch",
    "test_patch",
    "problem_statement",
    "FAIL_TO_PASS",
    "PASS_TO_PASS",
    "version",
    "hints_text",
    "created_at",
}


def test_shipped_task_set(shipped_tasks):
    assert len(shipped_tasks) >= 60
    packages = {t.package for t in shipped_tasks}
    assert len(packages) >= 3
    kinds = {t.mutation["kind"] for t in shipped_tasks}
    assert len(kinds) >= 4
    for t in shipped_tasks:
        assert t.fail_to_pass and not set(t.fail_to_pass) & set(t.pass_to_pass)
        assert t.patch.startswith("diff --git") and len(t.expert_edits) == 1
        assert "def test_" not in t.problem_statement  # written from behaviour, not test source
        assert t.expert_edits[0]["path"] in t.patch


def test_buggy_files_differ_from_the_sdist_exactly_by_the_mutation(shipped_tasks):
    from turngym.envs.swe.packages import sdist_files

    task = shipped_tasks[0]
    pristine = sdist_files(task.spec)
    buggy = task.files()
    changed = [p for p in pristine if pristine[p] != buggy[p]]
    assert changed == [task.expert_edits[0]["path"]]


def test_swebench_round_trip(tmp_path, shipped_tasks):
    path = save_instances(shipped_tasks[:3], tmp_path / "t.json")
    raw = json.loads(path.read_text())
    assert SWEBENCH_KEYS <= set(raw[0])
    assert isinstance(raw[0]["FAIL_TO_PASS"], str)  # JSON-encoded list, as in SWE-bench
    again = load_instances(path)
    assert [t.to_swebench() for t in again] == raw


def test_plain_swebench_instance_needs_a_snapshot(tmp_path):
    inst = {
        "instance_id": "o__r-1",
        "repo": "o/r",
        "base_commit": "abc",
        "patch": "",
        "test_patch": "",
        "problem_statement": "bug",
        "FAIL_TO_PASS": '["t.py::a"]',
        "PASS_TO_PASS": "[]",
    }
    p = tmp_path / "i.jsonl"
    p.write_text(json.dumps(inst) + "\n")
    with pytest.raises(ValueError, match="snapshot"):
        load_instances(p)
    snap = tmp_path / "repo"
    (snap / "pkg").mkdir(parents=True)
    (snap / "pkg" / "m.py").write_text("x = 1\n")
    (snap / "t.py").write_text("def test_a(): pass\n")
    with pytest.raises(ValueError, match="o__r-1: names base_commit abc, but the snapshot .* is not a git"):
        load_instances(p, snapshot=str(snap))
    with pytest.warns(UserWarning, match="not a git checkout"):
        (task,) = load_instances(p, snapshot=str(snap), allow_unpinned=True)
    assert task.files() == {"pkg/m.py": b"x = 1\n", "t.py": b"def test_a(): pass\n"}
    assert task.test_files == ["t.py"] and task.is_test_path("t.py") and not task.is_test_path("pkg/m.py")
    with pytest.raises(ValueError, match="missing"):
        SweTask.from_swebench({"instance_id": "x"})


def test_snapshot_tarball_with_top_directory(tmp_path):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in {"repo-abc/a.py": b"a", "repo-abc/sub/b.py": b"b"}.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    p = tmp_path / "snap.tar.gz"
    p.write_bytes(buf.getvalue())
    assert read_snapshot(p) == {"a.py": b"a", "sub/b.py": b"b"}


def test_known_packages_ship_tests():
    assert len(PACKAGES) >= 3
    for spec in PACKAGES.values():
        assert spec.sha256 and spec.sources and spec.tests


@pytest.mark.docker
@pytest.mark.slow
def test_synthesis_validates_mutations():
    from turngym.envs.swe.synthesis import synthesize

    tasks = synthesize(PACKAGES["inflection"], max_tasks=2, max_candidates=6, seed=7)
    assert tasks
    for t in tasks:
        assert t.fail_to_pass and t.pass_to_pass and t.test_files == ["test_inflection.py"]
        assert t.instance_id.startswith("inflection-0.5.1__")
        assert "Observed behaviour" in t.problem_statement


@pytest.mark.docker
@pytest.mark.slow
def test_tasks_run_in_the_images_sandbox_build_makes(one_task_per_package):
    from turngym.envs.swe.packages import package_image

    for task in one_task_per_package:
        assert task.image_tag() == package_image(task.spec)

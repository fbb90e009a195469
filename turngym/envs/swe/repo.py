"""The repository inside a sandbox: seed it, run its tests, take the agent's patch, grade a patch.

The repository never lives in the image: the host uploads the task's files into the ``/testbed``
tmpfs at reset and commits them as the base commit (fixed author and date, so the commit is the
same every time). The image therefore never holds a fixed copy an agent could diff against, and
grading starts a fresh container with pristine tests, so edits to tests, ``conftest.py`` or a
broken sandbox cannot change the verdict; the graded tests run through
:mod:`turngym.envs.swe.grading`, so source code that tampers with the test run cannot either.
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from turngym.envs.swe.diffs import split_patch
from turngym.envs.swe.grading import TestRun, machinery_edits, run_graded_tests, watched_files
from turngym.envs.swe.packages import PLUGIN_DIR, PLUGIN_NAME, REPO_DIR, plugin_source
from turngym.sandboxes.docker import DockerSandbox, ExecResult, SandboxError, tar_of

_GIT_ENV = (
    "GIT_AUTHOR_NAME=turngym GIT_AUTHOR_EMAIL=turngym@localhost GIT_COMMITTER_NAME=turngym "
    "GIT_COMMITTER_EMAIL=turngym@localhost GIT_AUTHOR_DATE='2024-01-01T00:00:00Z' "
    "GIT_COMMITTER_DATE='2024-01-01T00:00:00Z'"
)
_REPORT = "/tmp/.turngym-report.json"
_GIT_INIT = (
    f"cd {REPO_DIR} && git init -q -b main && "
    "printf '__pycache__/\\n*.pyc\\n*.egg-info/\\n.pytest_cache/\\n' > .git/info/exclude"
)


def stage_repo(sb: DockerSandbox, files: Mapping[str, bytes], *, timeout: float = 120.0) -> None:
    """Upload ``files`` to ``/testbed`` and ``git init`` (nothing added: no blob of them is stored).

    Pools run this on warm containers with a package's pristine files; :func:`seed_repo` then only
    writes what a task changes.
    """
    upload = {f"{REPO_DIR}/{rel}": data for rel, data in files.items()}
    upload[f"{PLUGIN_DIR}/{PLUGIN_NAME}.py"] = plugin_source()
    res = sb.exec(f"tar -x -C / -f - && {_GIT_INIT}", timeout=timeout, stdin=tar_of(upload))
    if res.exit_code != 0:
        raise SandboxError(f"could not stage the repository: {res.output[-2000:]}")


def seed_repo(
    sb: DockerSandbox,
    files: Mapping[str, bytes],
    *,
    staged: Mapping[str, bytes] | None = None,
    timeout: float = 120.0,
) -> str:
    """Make ``/testbed`` hold exactly ``files`` and commit them as the base commit; returns HEAD.

    With ``staged`` (what :func:`stage_repo` already uploaded) only the differences travel.
    """
    if staged is None:
        upload = {f"{REPO_DIR}/{rel}": data for rel, data in files.items()}
        upload[f"{PLUGIN_DIR}/{PLUGIN_NAME}.py"] = plugin_source()
        prefix = f"tar -x -C / -f - && {_GIT_INIT} && "
    else:
        upload = {f"{REPO_DIR}/{rel}": data for rel, data in files.items() if staged.get(rel) != data}
        gone = [f"{REPO_DIR}/{rel}" for rel in staged if rel not in files]
        prefix = (f"rm -f -- {' '.join(shlex.quote(p) for p in gone)} && " if gone else "") + (
            "tar -x -C / -f - && " if upload else ""
        )
    script = (
        prefix
        + f"cd {REPO_DIR} && git add -A && {_GIT_ENV} git commit -q --no-verify --allow-empty -m 'base' && git rev-parse HEAD"
    )
    res = sb.exec(script, timeout=timeout, stdin=tar_of(upload) if upload else None)
    if res.exit_code != 0:
        raise SandboxError(f"could not seed the repository: {res.output[-2000:]}")
    return res.output.strip().splitlines()[-1]


def current_patch(sb: DockerSandbox, *, timeout: float = 60.0) -> str:
    """The agent's changes against the base commit (new files included), as a binary git diff."""
    res = sb.exec(
        f"cd {REPO_DIR} && git add -A >/dev/null 2>&1; git diff --cached --binary HEAD",
        timeout=timeout,
        max_output_bytes=16 << 20,
    )
    if res.exit_code != 0:
        raise SandboxError(f"git diff failed: {res.output[-2000:]}")
    return res.output


#: Files that configure or replace the test runner; a submitted patch never changes them (an agent
#: could otherwise fake a pass: a /testbed/pytest.py shadows pytest, a pytest.ini loads a plugin).
RUNNER_FILES = frozenset(
    {
        "pytest.py",
        "conftest.py",
        "pytest.ini",
        "tox.ini",
        "setup.cfg",
        "pyproject.toml",
        "noxfile.py",
        "sitecustomize.py",
        "usercustomize.py",
        ".pytest_cache",
    }
)
RUNNER_PACKAGES = frozenset({"pytest", "_pytest", "pluggy", "py"})


def gradable_patch(
    patch: str, is_test_path: Callable[[str], bool], original_paths: Iterable[str]
) -> tuple[str, list[str]]:
    """The part of ``patch`` that is graded, and the paths dropped from it.

    Kept: changes to source files — files of the original repository, or new files in a
    directory that already held some — that are neither test files (grading uses pristine tests)
    nor test-runner files (``RUNNER_FILES``, ``*.pth``, or anything under a ``pytest``/``_pytest``/
    ``pluggy`` package). New files at the repository root are dropped too: a fix does not need them,
    and Python would import them before the installed test runner.
    """
    original = set(original_paths)
    source_dirs = {os.path.dirname(p) for p in original if os.path.dirname(p)}
    kept, dropped = [], []
    for path, section in split_patch(patch):
        parts = path.split("/")
        allowed = (
            not is_test_path(path)
            and parts[-1] not in RUNNER_FILES
            and not path.endswith(".pth")
            and not RUNNER_PACKAGES & set(parts[:-1])
            and parts[0] not in RUNNER_PACKAGES
            and (path in original or os.path.dirname(path) in source_dirs)
        )
        (kept if allowed else dropped).append(section if allowed else path)
    return "".join(kept), dropped


def changed_paths(patch: str) -> list[str]:
    return [path for path, _ in split_patch(patch)]


def run_tests(
    sb: DockerSandbox,
    targets: list[str],
    *,
    timeout: float = 300.0,
    extra_env: Mapping[str, str] | None = None,
) -> TestRun:
    """Run pytest on ``targets`` (files or node ids) in ``/testbed`` and read the per-test report."""
    env = {"TURNGYM_REPORT": _REPORT, "PYTHONPATH": PLUGIN_DIR, **dict(extra_env or {})}
    assigns = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    args = " ".join(shlex.quote(t) for t in targets)
    res = sb.exec(
        f"rm -f {_REPORT}; cd {REPO_DIR} && {assigns} python3 -m pytest -p {PLUGIN_NAME} -q --tb=line "
        f"-p no:cacheprovider {args}",
        timeout=timeout,
        max_output_bytes=200_000,
    )
    try:
        report = json.loads(sb.get_file(_REPORT))
    except (SandboxError, ValueError):
        return TestRun({}, output=res.output, timed_out=res.timed_out, exit_code=res.exit_code)
    tests: dict[str, Any] = report.get("tests", {})
    return TestRun(
        outcomes={k: v["outcome"] for k, v in tests.items()},
        messages={k: v.get("message", "") for k, v in tests.items() if v.get("message")},
        output=res.output,
        timed_out=res.timed_out,
        exit_code=res.exit_code,
    )


#: pytest outcomes (of the report plugin) as the ``swebench`` package's ``TestStatus`` values
TEST_STATUS = {
    "passed": "PASSED",
    "failed": "FAILED",
    "error": "ERROR",
    "skipped": "SKIPPED",
    "xfail": "XFAIL",
}
RESOLVED_FULL, RESOLVED_PARTIAL, RESOLVED_NO = "RESOLVED_FULL", "RESOLVED_PARTIAL", "RESOLVED_NO"

#: a grader: (status map, FAIL_TO_PASS, PASS_TO_PASS) -> (F2P that succeeded, P2P that succeeded,
#: resolution status); a task names its grader (``SweTask.grader``)
Grader = Callable[[Mapping[str, str], list[str], list[str]], tuple[list[str], list[str], str]]
GRADERS: dict[str, Grader] = {}
#: grader name -> the module it needs (checked when tasks load, not first at grading)
GRADER_NEEDS: dict[str, str] = {}


def grader(name: str, needs: str = "") -> Callable[[Grader], Grader]:
    """Register a grader under ``name`` (``needs``: a module it imports, checked by :func:`check_grader`)."""

    def register(fn: Grader) -> Grader:
        GRADERS[name] = fn
        if needs:
            GRADER_NEEDS[name] = needs
        return fn

    return register


def check_grader(name: str) -> None:
    """Raise now, with what to do, if grader ``name`` is unknown or its package is missing."""
    import importlib.util

    if name not in GRADERS:
        raise KeyError(f"unknown grader {name!r}; known: {', '.join(GRADERS)}")
    module = GRADER_NEEDS.get(name)
    if module and importlib.util.find_spec(module) is None:
        raise ImportError(
            f"the {name!r} grader needs the {module} package, which is not installed: "
            "pip install 'turngym[interop]'"
        )


@grader("strict")
def strict_grader(sm: Mapping[str, str], f2p: list[str], p2p: list[str]) -> tuple[list[str], list[str], str]:
    """Every FAIL_TO_PASS and PASS_TO_PASS test must pass (synthesised tasks: a skip is a failure)."""
    f2p_ok = [t for t in f2p if sm.get(t) == "PASSED"]
    p2p_ok = [t for t in p2p if sm.get(t) == "PASSED"]
    full = len(f2p_ok) == len(f2p) and len(p2p_ok) == len(p2p)
    return f2p_ok, p2p_ok, RESOLVED_FULL if full else RESOLVED_NO


@grader("swebench", needs="swebench")
def swebench_grader(
    sm: Mapping[str, str], f2p: list[str], p2p: list[str]
) -> tuple[list[str], list[str], str]:
    """SWE-bench's own verdict (``swebench.harness.grading``): FAIL_TO_PASS must pass (or xfail),
    PASS_TO_PASS must pass or be skipped; RESOLVED_FULL only when both hold for every test."""
    try:
        from swebench.harness.constants import FAIL_TO_PASS, PASS_TO_PASS
        from swebench.harness.grading import get_eval_tests_report, get_resolution_status
    except ImportError as e:
        raise RuntimeError(
            f"grading a SWE-bench instance as SWE-bench does needs the swebench package ({e}): "
            "pip install 'turngym[interop]'"
        ) from e
    report = get_eval_tests_report(dict(sm), {FAIL_TO_PASS: list(f2p), PASS_TO_PASS: list(p2p)})
    return report[FAIL_TO_PASS]["success"], report[PASS_TO_PASS]["success"], get_resolution_status(report)


def status_map(run: TestRun) -> dict[str, str]:
    """A test run's outcomes as SWE-bench status names."""
    return {t: TEST_STATUS.get(o, "ERROR") for t, o in run.outcomes.items()}


@dataclass
class Grade:
    """The verdict on a patch: ``resolved`` iff the grader says RESOLVED_FULL (``status``)."""

    resolved: bool
    applied: bool
    f2p_passed: int = 0
    f2p_total: int = 0
    p2p_passed: int = 0
    p2p_total: int = 0
    detail: str = ""
    failing: list[str] = field(default_factory=list)
    status: str = RESOLVED_NO
    grader: str = "strict"
    #: the verifier's own reward (Harbor tasks); None when the verdict is pass/fail by tests
    score: float | None = None
    #: why the patch was refused as tampering with the test machinery (``grading``); empty if not
    tampering: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "resolved": self.resolved,
            "score": self.score,
            "status": self.status,
            "grader": self.grader,
            "applied": self.applied,
            "FAIL_TO_PASS": f"{self.f2p_passed}/{self.f2p_total}",
            "PASS_TO_PASS": f"{self.p2p_passed}/{self.p2p_total}",
            "detail": self.detail,
            "failing": self.failing[:20],
            "tampering": self.tampering[:20],
        }

    def components(self) -> dict[str, float]:
        """Fractions of FAIL_TO_PASS / PASS_TO_PASS tests that succeeded (1.0 when there are none);
        a verifier's score has no test lists (empty)."""
        if self.score is not None:
            return {}
        return {
            "fail_to_pass": self.f2p_passed / self.f2p_total if self.f2p_total else 1.0,
            "pass_to_pass": self.p2p_passed / self.p2p_total if self.p2p_total else 1.0,
        }


def apply_diff(sb: DockerSandbox, diff: str, name: str = "patch") -> ExecResult | None:
    """``git apply`` ``diff`` (uploaded as ``/tmp/.turngym-<name>.diff``) in the repository: None when
    it applied or is empty, else the failed command's result."""
    if not diff.strip():
        return None
    sb.put_files({f"/tmp/.turngym-{name}.diff": diff})
    res = sb.exec(
        f"cd {REPO_DIR} && git apply --binary --whitespace=nowarn /tmp/.turngym-{name}.diff", timeout=60
    )
    return res if res.exit_code != 0 else None


def grade_patch(
    sb: DockerSandbox,
    files: Mapping[str, bytes],
    patch: str,
    *,
    fail_to_pass: list[str],
    pass_to_pass: list[str],
    test_files: list[str],
    test_patch: str = "",
    timeout: float = 300.0,
    staged: Mapping[str, bytes] | None = None,
    grader: str = "strict",
    is_test_path: Callable[[str], bool] | None = None,
) -> Grade:
    """Seed a fresh sandbox with the task's files, apply ``patch`` (+ ``test_patch``) and run the tests;
    ``grader`` (a name in :data:`GRADERS`) turns the per-test statuses into the verdict.

    With ``is_test_path`` the patch is cut to :func:`gradable_patch` here too (test and runner files
    stay pristine whoever calls). A patch that reaches for the test machinery is refused unrun, and the
    tests run through :func:`~turngym.envs.swe.grading.run_graded_tests`: a pass needs the harness's
    evidence, and tampering it saw refuses the patch (``Grade.tampering``)."""
    if grader not in GRADERS:
        raise KeyError(f"unknown grader {grader!r}; known: {', '.join(GRADERS)}")
    if is_test_path is not None:
        patch, _ = gradable_patch(patch, is_test_path, files)
    totals = {"f2p_total": len(fail_to_pass), "p2p_total": len(pass_to_pass), "grader": grader}
    refused = machinery_edits(patch, files)
    if refused:
        detail = "refused: the patch reaches for the test machinery (" + "; ".join(refused[:10]) + ")"
        return Grade(False, applied=True, detail=detail, tampering=refused, **totals)  # type: ignore[arg-type]
    seed_repo(sb, files, staged=staged)
    for name, p in (("patch", patch), ("test_patch", test_patch)):
        res = apply_diff(sb, p, name)
        if res is not None:
            detail = f"{name} does not apply: {res.output.strip()[:1000]}"
            return Grade(False, applied=False, detail=detail, **totals)  # type: ignore[arg-type]
    targets = test_files or sorted({t.split("::")[0] for t in fail_to_pass})
    watch = watched_files(files, list(test_files), test_patch, is_test_path)
    run = run_graded_tests(sb, targets, watch, timeout=timeout)
    if run.problems:
        detail = "refused: the test run was tampered with (" + "; ".join(run.problems[:10]) + ")"
        return Grade(False, applied=True, detail=detail, tampering=run.problems, **totals)  # type: ignore[arg-type]
    f2p, p2p, status = GRADERS[grader](status_map(run), list(fail_to_pass), list(pass_to_pass))
    ok = set(f2p) | set(p2p)
    failing = [t for t in fail_to_pass + pass_to_pass if t not in ok]
    detail = "tests timed out" if run.timed_out else ("" if run.outcomes else run.output[-1000:])
    return Grade(
        resolved=status == RESOLVED_FULL,
        status=status,
        grader=grader,
        applied=True,
        f2p_passed=len(f2p),
        f2p_total=len(fail_to_pass),
        p2p_passed=len(p2p),
        p2p_total=len(pass_to_pass),
        detail=detail,
        failing=failing,
    )


VERIFIER_LOGS = "/logs/verifier"
TESTS_DIR = "/tests"


def read_reward(text: str, name: str) -> float:
    """The reward a Harbor verifier wrote: a number (``reward.txt``), or ``{"reward": x}`` or a
    single numeric value (``reward.json``). Raises ``ValueError`` saying what was found."""
    text = text.strip()
    if name.endswith(".json"):
        data = json.loads(text)
        if isinstance(data, dict):
            if "reward" in data:
                data = data["reward"]
            elif len(data) == 1:
                (data,) = data.values()
        if isinstance(data, bool) or not isinstance(data, int | float):
            raise ValueError(f"{name} holds no single numeric reward: {text[:200]}")
        return float(data)
    return float(text)


def run_verifier(
    sb: DockerSandbox,
    files: Mapping[str, bytes],
    patch: str,
    *,
    tests: Mapping[str, bytes],
    env: Mapping[str, str] | None = None,
    timeout: float = 600.0,
    workdir: str = REPO_DIR,
) -> Grade:
    """Grade a Harbor task: seed a fresh sandbox with its files plus ``patch``, upload ``tests`` to
    ``/tests``, run ``bash /tests/test.sh`` and read ``/logs/verifier/reward.txt`` (or ``.json``)."""
    seed_repo(sb, files)
    res = apply_diff(sb, patch, "patch")
    if res is not None:
        return Grade(
            False,
            applied=False,
            grader="harbor",
            score=0.0,
            detail=f"patch does not apply: {res.output[-1000:]}",
        )
    sb.exec(f"rm -rf {TESTS_DIR}/* {VERIFIER_LOGS} && mkdir -p {VERIFIER_LOGS} /logs/agent", timeout=30)
    sb.put_files({f"{TESTS_DIR}/{rel}": data for rel, data in tests.items()})
    assigns = " ".join(f"{k}={shlex.quote(v)}" for k, v in dict(env or {}).items())
    res = sb.exec(
        f"cd {shlex.quote(workdir)} && {assigns} bash {TESTS_DIR}/test.sh > {VERIFIER_LOGS}/test-stdout.txt 2>&1; "
        f"echo $? ; tail -c 2000 {VERIFIER_LOGS}/test-stdout.txt",
        timeout=timeout,
        max_output_bytes=8000,
    )
    if res.timed_out:
        return Grade(False, applied=True, grader="harbor", score=0.0, detail=f"test.sh ran past {timeout:g}s")
    for name in ("reward.txt", "reward.json"):
        try:
            raw = sb.get_file(f"{VERIFIER_LOGS}/{name}").decode(errors="replace")
        except SandboxError:
            continue
        try:
            score = read_reward(raw, name)
        except ValueError as e:
            return Grade(False, applied=True, grader="harbor", score=0.0, detail=f"bad {name}: {e}")
        full = score >= 1.0
        return Grade(
            full,
            applied=True,
            grader="harbor",
            score=score,
            status=RESOLVED_FULL if full else (RESOLVED_PARTIAL if score > 0 else RESOLVED_NO),
            detail=res.output[-1000:],
        )
    return Grade(
        False,
        applied=True,
        grader="harbor",
        score=0.0,
        detail=f"test.sh wrote no {VERIFIER_LOGS}/reward.txt or reward.json; its exit code and output: {res.output[-1000:]}",
    )

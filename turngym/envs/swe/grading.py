"""Graded test runs that the agent's code cannot fake: a refusal of edits that reach for the test
machinery, a hardened test process, and per-test evidence checked on the host.

The agent's source files are imported by the tests, so its code runs inside the test process; the
verdict therefore never rests on what that process *says* alone:

* :func:`machinery_edits` refuses a patch whose added lines name the test machinery or process
  internals (``pytest``, ``unittest``, ``settrace``, ``os._exit``, ``builtins``, frames, ...) where the
  pristine file never did, and any binary change (a ``.so`` or a NUL-laden ``.py`` cannot be read);
* :func:`run_graded_tests` runs pytest through ``grade_harness.py`` in ``python3 -I -S -B`` with an
  empty environment (no ``PYTHONPATH``, user site, ``sitecustomize``/``usercustomize``, cache or
  assertion rewriting), the site directories of the read-only image only;
* :func:`verified_outcomes` counts a test as passed only when the harness's tracer, installed before
  the repository was imported, saw the pristine test function's own code (fingerprinted from the
  test file) return normally during that test's call phase; any replaced runner object, removed
  tracer or forged test-file code refuses the whole run (``Grade.tampering``).

What is still possible is documented in docs/envs/swe-docker.md (grading).
"""

from __future__ import annotations

import json
import re
import shlex
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from turngym.envs.swe.diffs import split_patch
from turngym.envs.swe.packages import PLUGIN_DIR, PLUGIN_NAME, REPO_DIR, plugin_source
from turngym.sandboxes.docker import DockerSandbox, SandboxError

#: words a source fix has no business adding unless the file already used them: the test runner,
#: tracing, process exit, builtins, import hooks, frame and object-graph walking, native calls
MACHINERY = re.compile(
    r"\b(_?pytest|pluggy|unittest|doctest|settrace|setprofile|gettrace|getprofile|_exit|builtins|"
    r"__builtins__|meta_path|path_hooks|path_importer_cache|_getframe|f_back|f_locals|f_globals|f_code|"
    r"__code__|get_referrers|get_objects|ctypes|atexit|faulthandler|turngym)\b"
)
HARNESS = "grade_harness.py"
#: the clean environment of the graded test process (everything else of the image's is dropped)
#: (``PATH`` is the image's own, e.g. a conda env's ``bin`` first; the grading container is fresh)
CLEAN_ENV = 'PATH="$PATH" HOME=/root LANG=C.UTF-8'
NO_EVIDENCE = "the grader saw no run of this test's own code to its end (the test machinery was bypassed)"


@dataclass
class TestRun:
    """Per-test outcomes of one pytest run (``passed``/``failed``/``error``/``skipped``)."""

    outcomes: dict[str, str]
    messages: dict[str, str] = field(default_factory=dict)
    output: str = ""
    timed_out: bool = False
    exit_code: int = 0
    #: tampering the graded run found (``grading.run_graded_tests``); any refuses the verdict
    problems: list[str] = field(default_factory=list)

    def passed(self, nodeid: str) -> bool:
        return self.outcomes.get(nodeid) == "passed"


def watched_files(
    files: Mapping[str, bytes], test_files: list[str], test_patch: str, is_test_path: Any = None
) -> list[str]:
    """The Python files of the test suite (pristine, or from ``test_patch``) the harness fingerprints:
    ``is_test_path``'s, else files named like tests, plus ``test_files``."""

    def looks_like_test(path: str) -> bool:
        name = path.rsplit("/", 1)[-1]
        return (
            name.startswith("test")
            or name.endswith("_test.py")
            or name == "conftest.py"
            or "/tests/" in f"/{path}"
        )

    candidates = set(files) | {p for p, _ in split_patch(test_patch)}
    chosen = is_test_path or looks_like_test
    return sorted({p for p in candidates if p.endswith(".py") and chosen(p)} | set(test_files))


def machinery_edits(patch: str, files: Mapping[str, bytes]) -> list[str]:
    """Why ``patch`` is refused before any test runs: ``path: word`` for each test-machinery word its
    added lines bring into a file that never used it, and ``path: binary change`` for binary sections."""
    found: list[str] = []
    for path, section in split_patch(patch):
        if "\nGIT binary patch\n" in section or "\nBinary files " in section:
            found.append(f"{path}: binary change")
            continue
        added = "\n".join(
            line[1:] for line in section.splitlines() if line.startswith("+") and not line.startswith("+++")
        )
        pristine = files.get(path, b"").decode("utf-8", errors="replace")
        before = set(MACHINERY.findall(pristine))
        for word in sorted(set(MACHINERY.findall(added)) - before):
            found.append(f"{path}: {word}")
    return found


def run_graded_tests(
    sb: DockerSandbox, targets: list[str], watch: list[str], *, timeout: float = 300.0
) -> Any:
    """Run ``targets`` through the harness; a :class:`~turngym.envs.swe.repo.TestRun` whose outcomes
    are :func:`verified_outcomes` and whose ``problems`` list any tampering the harness saw. ``watch``:
    the test-suite files (relative, pristine) whose functions the harness fingerprints and traces."""
    nonce, name = uuid.uuid4().hex, uuid.uuid4().hex
    canaries = write_canaries(sb, targets)
    targets = [*targets, canaries[0].split("::")[0]]
    report = f"{PLUGIN_DIR}/grade-{name}.json"
    harness = f"{PLUGIN_DIR}/{HARNESS}"
    plugin = f"{PLUGIN_DIR}/{PLUGIN_NAME}.py"
    sb.put_files({harness: Path(__file__).with_name(HARNESS).read_bytes(), plugin: plugin_source()})
    files = sorted(set(watch) | {t.split("::")[0] for t in targets})
    cfg = {
        "nonce": nonce,
        "report": report,
        "plugin": plugin,
        "root": REPO_DIR,
        "targets": targets,
        "test_files": files,
    }
    res = sb.exec(
        f"cd {REPO_DIR} && exec env -i {CLEAN_ENV} python3 -I -S -B {shlex.quote(harness)}",
        timeout=timeout,
        max_output_bytes=200_000,
        stdin=(json.dumps(cfg) + "\n").encode(),
    )
    try:
        data = json.loads(sb.get_file(report))
    except (SandboxError, ValueError):
        data = None
    if not isinstance(data, dict) or data.get("nonce") != nonce:
        why = "the test process ended without the grader's report" if data is None else "a forged report"
        run = TestRun({}, output=f"{why}\n{res.output}", timed_out=res.timed_out, exit_code=res.exit_code)
        run.problems = [] if data is None else [why]
        return run
    outcomes, messages, problems = verified_outcomes(data, canaries)
    run = TestRun(outcomes, messages, output=res.output, timed_out=res.timed_out, exit_code=res.exit_code)
    run.problems = problems
    return run


def write_canaries(sb: DockerSandbox, targets: list[str]) -> list[str]:
    """Write two tests that must fail (false asserts, random names) next to the first target: a
    ``unittest.TestCase`` method (collected whatever the project's name patterns) and a plain test
    function; their ids. A run in which one passes, or that collected tests but not the first, was
    faked wholesale (every report forced to pass, every test marked as run, a rerun elsewhere)."""
    tag = uuid.uuid4().hex[:12]
    first = targets[0].split("::")[0] if targets else ""
    folder = first.rsplit("/", 1)[0] + "/" if "/" in first else ""
    path = f"{folder}test_zz_{tag}.py"
    source = (
        f"import unittest\n\n\nclass Zz{tag}(unittest.TestCase):\n    def test_u{tag}(self):\n"
        f"        assert {tag!r} == 'u'\n\n\ndef test_f{tag}():\n    assert {tag!r} == 'f'\n"
    )
    sb.put_files({f"{REPO_DIR}/{path}": source})
    return [f"{path}::Zz{tag}::test_u{tag}", f"{path}::test_f{tag}"]


def verified_outcomes(
    report: Mapping[str, Any], canaries: Sequence[str] = ()
) -> tuple[dict[str, str], dict[str, str], list[str]]:
    """Per-test outcomes where "passed" needs evidence, the messages, and the tampering problems.

    A test passed when pytest says so *and* the harness saw its function (the last part of the test
    id, parameters dropped) return normally during its call phase. A test whose function no watched
    file defines by that name (generated tests, helpers outside the test suite) keeps pytest's outcome:
    there is no pristine code to look for, so only the harness's integrity checks cover it.
    ``canaries`` (:func:`write_canaries`) must not pass, and the first must have run when anything
    did; they are left out of the outcomes.
    """
    tests = dict(report.get("tests") or {})
    returned: Mapping[str, list[str]] = report.get("returned") or {}
    names = set(report.get("names") or ())
    problems = [str(p) for p in report.get("problems") or ()]
    problems += [f"test-file code that is not the test file's own: {f}" for f in report.get("foreign") or ()]
    ran_any = any(c not in canaries for c in tests)
    for i, canary in enumerate(canaries):  # judged on pytest's own word, before the evidence check
        rec = tests.pop(canary, None)
        if rec is None and ran_any and i == 0:
            problems.append("the grader's canary test (written to fail) was not run")
        elif rec is not None and rec.get("outcome") == "passed":
            problems.append("the grader's canary test (written to fail) passed")
        elif canary.rsplit("::", 1)[-1] in (returned.get(canary) or ()):
            problems.append("the grader's canary test (written to fail) returned normally")
    outcomes: dict[str, str] = {}
    messages: dict[str, str] = {}
    for nodeid, rec in tests.items():
        outcome = str(rec.get("outcome", "error"))
        if rec.get("message"):
            messages[nodeid] = str(rec["message"])
        if outcome == "passed":
            func = nodeid.split("::")[-1].split("[")[0]
            ran = set(returned.get(nodeid) or ())
            if func in names and func not in ran:
                outcome, messages[nodeid] = "failed", NO_EVIDENCE
        outcomes[nodeid] = outcome
    return outcomes, messages, problems

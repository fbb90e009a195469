"""The host side of tamper-proof grading (``turngym.envs.swe.grading``), without Docker: what a patch
is refused for, and how the harness's report becomes verified outcomes."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from turngym.envs.swe.grading import NO_EVIDENCE, machinery_edits, verified_outcomes

PRISTINE = {"pkg/__init__.py": b"import os\n\ndef f():\n    return 1\n", "pkg/util.py": b"import unittest\n"}


def added(path: str, *lines: str) -> str:
    body = "".join(f"+{line}\n" for line in lines)
    return f"diff --git a/{path} b/{path}\n--- a/{path}\n+++ b/{path}\n@@ -1,0 +1,{len(lines)} @@\n{body}"


def test_new_machinery_words_are_refused():
    patch = added("pkg/__init__.py", "import _pytest.python", "_pytest.python.Function.runtest = None")
    assert machinery_edits(patch, PRISTINE) == ["pkg/__init__.py: _pytest"]
    exits = added("pkg/__init__.py", "os._exit(0)", "import builtins", "sys.settrace(None)")
    assert machinery_edits(exits, PRISTINE) == [
        "pkg/__init__.py: _exit",
        "pkg/__init__.py: builtins",
        "pkg/__init__.py: settrace",
    ]


def test_words_the_file_already_used_are_not_refused():
    assert machinery_edits(added("pkg/util.py", "class T(unittest.TestCase): pass"), PRISTINE) == []
    assert machinery_edits(added("pkg/__init__.py", "def g():", "    return os.sep"), PRISTINE) == []


def test_binary_changes_are_refused():
    patch = "diff --git a/pkg/x.so b/pkg/x.so\nnew file mode 100644\nGIT binary patch\nliteral 3\nKcmZ?\n\n"
    assert machinery_edits(patch, PRISTINE) == ["pkg/x.so: binary change"]


def report(outcome: str, returned=(), raised=(), **extra):
    node = "t.py::test_a[1]"
    return {
        "tests": {node: {"outcome": outcome, "message": ""}},
        "returned": {node: list(returned)},
        "raised": {node: list(raised)},
        "names": ["test_a"],
        **extra,
    }


def test_a_pass_needs_its_body_returning():
    assert verified_outcomes(report("passed", returned=["test_a"]))[0] == {"t.py::test_a[1]": "passed"}
    outcomes, messages, _ = verified_outcomes(report("passed"))
    assert outcomes == {"t.py::test_a[1]": "failed"} and messages["t.py::test_a[1]"] == NO_EVIDENCE
    assert verified_outcomes(report("passed", raised=["test_a"]))[0]["t.py::test_a[1]"] == "failed"
    assert verified_outcomes(report("passed", returned=["helper"]))[0]["t.py::test_a[1]"] == "failed"


def test_problems_and_forged_test_code_are_reported():
    _, _, problems = verified_outcomes(
        report("failed", problems=["os._exit was replaced"], foreign=["t.py:f"])
    )
    assert problems == ["os._exit was replaced", "test-file code that is not the test file's own: t.py:f"]


def test_canaries_must_run_and_must_not_pass():
    canaries = ["c.py::Zz::test_u", "c.py::test_f"]
    ok = report("passed", returned=["test_a"])
    ok["tests"].update({c: {"outcome": "failed"} for c in canaries})
    outcomes, _, problems = verified_outcomes(ok, canaries)
    assert problems == [] and set(outcomes) == {"t.py::test_a[1]"}
    faked = report("passed", returned=["test_a"])
    faked["tests"].update({c: {"outcome": "passed"} for c in canaries})
    assert verified_outcomes(faked, canaries)[2] == ["the grader's canary test (written to fail) passed"] * 2
    missing = report("passed", returned=["test_a"])
    assert verified_outcomes(missing, canaries)[2] == [
        "the grader's canary test (written to fail) was not run"
    ]


@given(st.dictionaries(st.text(min_size=1), st.sampled_from(["passed", "failed", "error", "skipped"])))
def test_nothing_passes_without_evidence(tests):
    """Whatever pytest claims, with no evidence at all no test whose function is known passes."""
    rep = {
        "tests": {k: {"outcome": v} for k, v in tests.items()},
        "names": [k.split("::")[-1].split("[")[0] for k in tests],
    }
    outcomes, _, _ = verified_outcomes(rep)
    assert "passed" not in outcomes.values()

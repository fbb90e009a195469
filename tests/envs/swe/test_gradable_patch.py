"""What part of a submitted patch is graded: source changes only, never tests or the test runner."""

from turngym.envs.swe.repo import gradable_patch


def section(path: str) -> str:
    return f"diff --git a/{path} b/{path}\n--- a/{path}\n+++ b/{path}\n@@ -1 +1 @@\n-x\n+y\n"


def is_test(path: str) -> bool:
    return path.startswith("tests/") or path.rsplit("/", 1)[-1].startswith("test_")


ORIGINAL = ["pkg/__init__.py", "pkg/core.py", "tests/test_core.py", "setup.py", "pytest.ini"]


def test_source_changes_kept_everything_else_dropped():
    paths = [
        "pkg/core.py",  # kept: an original source file
        "pkg/helpers.py",  # kept: a new module beside the sources
        "tests/test_core.py",  # test file
        "pkg/conftest.py",  # runner hook
        "pytest.ini",  # runner config, even though it existed
        "pytest.py",  # shadows pytest
        "fakepass_plugin.py",  # new file at the root
        "pkg/evil.pth",  # site hook
        "_pytest/main.py",  # runner package
        "setup.py",  # kept: an original non-runner file
    ]
    patch = "".join(section(p) for p in paths)
    kept, dropped = gradable_patch(patch, is_test, ORIGINAL)
    assert [p for p in paths if section(p) in kept] == ["pkg/core.py", "pkg/helpers.py", "setup.py"]
    assert sorted(dropped) == sorted(set(paths) - {"pkg/core.py", "pkg/helpers.py", "setup.py"})


def test_empty_patch():
    assert gradable_patch("", is_test, ORIGINAL) == ("", [])

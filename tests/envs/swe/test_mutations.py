"""Mutation operators on a sample module: every mutant parses, reverts exactly, and patches apply."""

from __future__ import annotations

import shutil
import subprocess
import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turngym.envs.swe.mutations import OPERATORS, mutations_of, still_parses, unified_patch

SAMPLE = textwrap.dedent(
    '''
    """Docstring with 3 numbers."""


    def clamp(value, low=0, high=10, strict=False):
        """Clamp ``value``."""
        if value < low:
            return low
        if strict and value > high:
            raise ValueError("too big")
        return min(value, high)


    class Box:
        def get(self, items, index=1):
            if not items:
                return None
            return items[index - 1] + items[0] * 2

        def has(self, items, item):
            return item in items and len(items) >= 1


    def pick(seq, key):
        result = sorted(seq, key=key)
        return result
    '''
)


def all_mutations():
    return mutations_of("pkg/mod.py", SAMPLE)


def test_every_operator_is_exercised():
    kinds = {m.kind for m in all_mutations()}
    assert kinds == set(OPERATORS)


def test_coverage_filter_limits_functions():
    only = {m.line for m in mutations_of("pkg/mod.py", SAMPLE, only_lines={5})}
    assert only and all(5 <= line <= 11 for line in only)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_mutants_parse_and_revert_exactly(data):
    muts = all_mutations()
    m = data.draw(st.sampled_from(muts))
    mutated = m.apply(SAMPLE)
    assert mutated != SAMPLE and still_parses(mutated)
    edit = m.revert_edit(SAMPLE)
    assert mutated.count(edit["old_str"]) == 1
    assert mutated.replace(edit["old_str"], edit["new_str"], 1) == SAMPLE


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_gold_patches_apply_with_git(tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "pkg").mkdir()
    for m in all_mutations()[:15]:
        target = tmp_path / "pkg" / "mod.py"
        target.write_text(m.apply(SAMPLE))
        patch = tmp_path / "fix.diff"
        patch.write_text(unified_patch("pkg/mod.py", m.apply(SAMPLE), SAMPLE))
        subprocess.run(["git", "-C", str(tmp_path), "apply", "fix.diff"], check=True)
        assert target.read_text() == SAMPLE

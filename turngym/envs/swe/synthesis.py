"""Synthesised SWE tasks from real packages (:func:`synthesize`, CLI ``turngym swe synth``), after
SWE-smith: run a package's own test suite in a sandbox (recording which functions the tests
execute), inject one AST mutation into a covered function (:mod:`turngym.envs.swe.mutations`), run the
suite again, and keep the mutation only if some tests now fail (FAIL_TO_PASS) and every other test of
those test files still passes (PASS_TO_PASS). Collection errors (the module no longer imports) are
rejected. The issue text is written from the failing behaviour (exception messages), never from the
test source.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from collections.abc import Callable, Iterable
from typing import Any

from turngym.envs.swe.mutations import Mutation, mutations_of, still_parses, unified_patch
from turngym.envs.swe.packages import PACKAGES, PackageSpec, package_image, sdist_files
from turngym.envs.swe.tasks import DEFAULT_TASKS, SweTask, save_instances


def issue_text(spec: PackageSpec, failing: dict[str, str], total_failing: int) -> str:
    """An issue written from the observed failures (exception messages), not from the test code."""
    lines = [
        f"`{spec.name}` ({spec.version}) misbehaves: {total_failing} test(s) of its own test suite fail.",
        "",
        "Observed behaviour:",
        "",
    ]
    for nodeid, message in list(failing.items())[:3]:
        test = nodeid.split("::", 1)[-1]
        msg = "\n".join(message.strip().splitlines()[:12])[:800] or "(no message)"
        lines += [f"* `{test}`:", "", "```", msg, "```", ""]
    lines.append(
        "The rest of the test suite passes. The tests describe the intended behaviour; please fix the "
        "library code so that they pass."
    )
    return "\n".join(lines)


def _order_candidates(cands: list[Mutation], rng: random.Random) -> list[Mutation]:
    """Round-robin over functions (shuffled), one candidate per function per round, kinds varied."""
    by_fn: dict[tuple[str, str], list[Mutation]] = {}
    for m in cands:
        by_fn.setdefault((m.path, m.function), []).append(m)
    keys = sorted(by_fn)
    rng.shuffle(keys)
    for k in keys:
        rng.shuffle(by_fn[k])
    out: list[Mutation] = []
    while any(by_fn.values()):
        for k in keys:
            if by_fn[k]:
                out.append(by_fn[k].pop())
    return out


def synthesize(
    spec: PackageSpec,
    *,
    max_tasks: int = 25,
    max_candidates: int = 80,
    max_per_function: int = 2,
    max_fail_to_pass: int = 40,
    seed: int = 0,
    base: str | None = None,
    test_timeout: float = 180.0,
    log: Callable[[str], None] | None = None,
) -> list[SweTask]:
    """Validated tasks for one package (see the module docstring for the procedure)."""
    from turngym.envs.swe.repo import run_tests, seed_repo
    from turngym.sandboxes.docker import DockerSandbox
    from turngym.sandboxes.limits import Limits

    say = log or (lambda s: None)
    files = sdist_files(spec)
    image = package_image(spec, base=base)
    limits = Limits(cpus=2.0, memory_mb=2048, pids=1024, disk_mb=1024)
    tasks: list[SweTask] = []
    with DockerSandbox.create(image, limits=limits, run_id="swe-synth") as sb:
        seed_repo(sb, files)
        profile = "/tmp/.turngym-profile.json"
        base_run = run_tests(
            sb, list(spec.tests), timeout=test_timeout, extra_env={"TURNGYM_PROFILE": profile}
        )
        passing = {t for t, o in base_run.outcomes.items() if o == "passed"}
        if not passing:
            raise RuntimeError(
                f"{spec.key}: no test passes on the pristine package:\n{base_run.output[-2000:]}"
            )
        covered: dict[str, set[int]] = {}
        for fname, line in json.loads(sb.get_file(profile)):
            covered.setdefault(os.path.relpath(fname, "/testbed"), set()).add(int(line))
        say(f"{spec.key}: {len(passing)} passing tests, {sum(map(len, covered.values()))} covered functions")
        cands: list[Mutation] = []
        for path in spec.sources:
            source = files[path].decode()
            cands += [
                m
                for m in mutations_of(path, source, covered.get(path, set()))
                if still_parses(m.apply(source))
            ]
        ordered = _order_candidates(cands, random.Random(f"{spec.key}:{seed}"))
        per_fn: dict[str, int] = {}
        tried = 0
        for m in ordered:
            if len(tasks) >= max_tasks or tried >= max_candidates:
                break
            if per_fn.get(f"{m.path}:{m.function}", 0) >= max_per_function:
                continue
            original = files[m.path].decode()
            try:
                edit = m.revert_edit(original)
            except ValueError:
                continue
            tried += 1
            sb.put_files({f"/testbed/{m.path}": m.apply(original)})
            run = run_tests(sb, list(spec.tests), timeout=test_timeout)
            sb.put_files({f"/testbed/{m.path}": original})
            broke = sorted(t for t in passing if run.outcomes.get(t) != "passed")
            collection_error = any("::" not in t for t, o in run.outcomes.items() if o == "error")
            if run.timed_out or collection_error or not broke or len(broke) > max_fail_to_pass:
                continue
            test_files = sorted({t.split("::")[0] for t in broke})
            p2p = sorted(t for t in passing if t.split("::")[0] in test_files and t not in broke)
            digest = hashlib.sha1(f"{m.path}:{m.start}:{m.replacement}".encode()).hexdigest()[:8]
            fn_id = m.function.replace(".", "_")
            task = SweTask(
                instance_id=f"{spec.name}-{spec.version}__{m.kind}__{fn_id}__{digest}",
                repo=spec.name,
                problem_statement=issue_text(spec, {t: run.messages.get(t, "") for t in broke}, len(broke)),
                patch=unified_patch(m.path, m.apply(original), original),
                fail_to_pass=broke,
                pass_to_pass=p2p,
                test_files=test_files,
                version=spec.version,
                package=spec.key,
                mutation={
                    "kind": m.kind,
                    "function": m.function,
                    "path": m.path,
                    "line": m.line,
                    "description": m.description,
                },
                expert_edits=[edit],
            )
            tasks.append(task)
            per_fn[f"{m.path}:{m.function}"] = per_fn.get(f"{m.path}:{m.function}", 0) + 1
            say(f"  + {task.instance_id}: {len(broke)} FAIL_TO_PASS, {len(p2p)} PASS_TO_PASS")
        say(f"{spec.key}: {len(tasks)} tasks from {tried} candidates")
    return tasks


def synthesize_all(
    packages: Iterable[str] | None = None, *, out: str | os.PathLike[str] | None = None, **kwargs: Any
) -> list[SweTask]:
    """Synthesise tasks for several packages and write them to ``out`` (default: the shipped set)."""
    tasks: list[SweTask] = []
    for name in packages or PACKAGES:
        if name not in PACKAGES:
            raise KeyError(f"unknown package {name!r}; known: {', '.join(PACKAGES)}")
        tasks += synthesize(PACKAGES[name], **kwargs)
    save_instances(tasks, out or DEFAULT_TASKS)
    return tasks

"""SWE tasks: the SWE-bench instance format, loaders, and synthesis from real packages.

Synthesis (:func:`synthesize`, CLI ``turngym swe synth``) follows SWE-smith: run a package's own test
suite in a sandbox (recording which functions the tests execute), inject one AST mutation into a
covered function (:mod:`turngym.envs.swe.mutations`), run the suite again, and keep the mutation
only if some tests now fail (FAIL_TO_PASS) and every other test of those test files still passes
(PASS_TO_PASS). Collection errors (the module no longer imports) are rejected. The issue text is
written from the failing behaviour (exception messages), never from the test source.

Instances are stored in SWE-bench's JSON format (``instance_id, repo, base_commit, patch,
test_patch, problem_statement, FAIL_TO_PASS, PASS_TO_PASS`` ...) plus a ``turngym`` field holding
what synthesis knows (package, mutation, the expert's revert edit). :func:`load_instances` also reads
plain SWE-bench instances given the repository snapshot (a directory or tarball at
``base_commit``) and, optionally, an image with the repository's dependencies.

A snapshot that is a git checkout (a directory holding ``.git``) is pinned to the instance's
``base_commit``: the files graded are that commit's, read from git's object store (the checkout
itself is never changed), whatever the checkout's HEAD, and the resolved commit is recorded as
``SweTask.graded_commit``. A ``base_commit`` the repository lacks is an error. A snapshot that is
not a git checkout (a plain directory or a tarball) cannot be checked against ``base_commit``: an
instance that names one is refused, unless the caller opts out with ``allow_unpinned=True`` (then
the snapshot is used as given, with a warning).

Malformed instances (bad JSON, a missing field, FAIL_TO_PASS that is not a list of test ids) raise
:class:`InstanceError`, a ``ValueError`` whose message names the file, the instance and the field.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import os
import random
import subprocess
import tarfile
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from turngym.envs.swe.mutations import Mutation, mutations_of, still_parses, unified_patch
from turngym.envs.swe.packages import PACKAGES, PackageSpec, env_image, package_image, sdist_files

DEFAULT_TASKS = Path(__file__).with_name("data") / "tasks.json"
SWEBENCH_FIELDS = (
    "instance_id",
    "repo",
    "base_commit",
    "patch",
    "test_patch",
    "problem_statement",
    "hints_text",
    "created_at",
    "version",
    "FAIL_TO_PASS",
    "PASS_TO_PASS",
    "environment_setup_commit",
)


#: fields a plain SWE-bench instance must have (the ``swebench`` package's ``SWEbenchInstance``
#: minus the descriptive ones); a synthesised instance (with a ``turngym`` field) needs the same
REQUIRED_FIELDS = ("instance_id", "problem_statement", "patch", "FAIL_TO_PASS", "PASS_TO_PASS")
_STRING_FIELDS = ("instance_id", "repo", "base_commit", "patch", "test_patch", "problem_statement", "version")


class InstanceError(ValueError):
    """A SWE-bench instance (or its file) that cannot be used; the message names where and which field."""


@dataclass
class SweTask:
    """One task: the repository at its buggy state, the tests that decide it, and the gold patch."""

    instance_id: str
    repo: str
    problem_statement: str
    patch: str
    fail_to_pass: list[str]
    pass_to_pass: list[str]
    test_files: list[str] = field(default_factory=list)
    test_patch: str = ""
    base_commit: str = ""
    version: str = ""
    hints_text: str = ""
    created_at: str = ""
    package: str | None = None
    snapshot: str | None = None
    image: str | None = None
    src_root: str = ""
    test_requires: tuple[str, ...] = ()
    mutation: dict[str, Any] | None = None
    expert_edits: list[dict[str, str]] = field(default_factory=list)
    #: the commit whose files are graded: ``base_commit`` resolved in a git snapshot; None when the
    #: files come from a package or a snapshot that is not a git checkout (see the module docstring)
    graded_commit: str | None = None
    #: use a snapshot that is not a git checkout although the instance names a ``base_commit``
    allow_unpinned: bool = False
    #: how test statuses become the verdict (a name in ``repo.GRADERS``): ``swebench`` (the swebench
    #: package's rules) for loaded instances, ``strict`` (every test passes) for synthesised ones
    grader: str = ""
    #: a Harbor task's verifier, solution and settings (``turngym.envs.swe.harbor``); None otherwise
    harbor: dict[str, Any] | None = None
    _files: dict[str, bytes] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.grader:
            self.grader = "strict" if self.package is not None else "swebench"
        if self.snapshot and self.package is None and self.graded_commit is None:
            self.graded_commit = pin_snapshot(
                self.snapshot, self.base_commit, self.instance_id, allow_unpinned=self.allow_unpinned
            )

    # ------------------------------------------------------------ the repository
    @property
    def spec(self) -> PackageSpec | None:
        if self.package is None:
            return None
        for spec in PACKAGES.values():
            if spec.key == self.package:
                return spec
        raise KeyError(f"task {self.instance_id}: unknown package {self.package!r}")

    def files(self) -> dict[str, bytes]:
        """The repository at the task's base commit (with the bug), as repo-relative path -> bytes."""
        if self._files is None:
            spec = self.spec
            if spec is not None:
                files = sdist_files(spec)
                for edit in self.expert_edits:  # the synthetic bug = the expert's edit, reversed
                    text = files[edit["path"]].decode()
                    if text.count(edit["new_str"]) != 1:
                        raise ValueError(f"task {self.instance_id}: cannot place the bug in {edit['path']}")
                    files[edit["path"]] = text.replace(edit["new_str"], edit["old_str"], 1).encode()
            elif self.snapshot and self.graded_commit:
                files = read_git_tree(self.snapshot, self.graded_commit)
            elif self.snapshot:
                files = read_snapshot(self.snapshot)
            else:
                raise ValueError(f"task {self.instance_id} has neither a package nor a repository snapshot")
            self._files = files
        return self._files

    def is_test_path(self, path: str) -> bool:
        if self.harbor is not None:  # a Harbor task's tests live outside the repository (/tests)
            return False
        spec = self.spec
        if spec is not None:
            return spec.is_test_path(path)
        patched = {p for p, _ in _diff_paths(self.test_patch)}
        name = os.path.basename(path)
        return path in patched or path in self.test_files or name == "conftest.py" or name.startswith("test_")

    def image_tag(self, base: str | None = None) -> str:
        """The image this task runs in (built and cached on first use)."""
        if self.image:
            return self.image
        spec = self.spec
        if spec is not None:
            return package_image(spec, base=base)
        return env_image(base=base, src_root=self.src_root, test_requires=self.test_requires)

    # ------------------------------------------------------------ SWE-bench format
    def to_swebench(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "instance_id": self.instance_id,
            "repo": self.repo,
            "base_commit": self.base_commit,
            "patch": self.patch,
            "test_patch": self.test_patch,
            "problem_statement": self.problem_statement,
            "hints_text": self.hints_text,
            "created_at": self.created_at,
            "version": self.version,
            "FAIL_TO_PASS": json.dumps(self.fail_to_pass),
            "PASS_TO_PASS": json.dumps(self.pass_to_pass),
            "environment_setup_commit": "",
        }
        out["turngym"] = {
            "package": self.package,
            "test_files": self.test_files,
            "mutation": self.mutation,
            "expert_edits": self.expert_edits,
        }
        if self.package is None and self.snapshot:  # an imported instance: where its repository is
            out["turngym"].update(
                snapshot=str(Path(self.snapshot).resolve()),
                graded_commit=self.graded_commit,
                src_root=self.src_root,
                image=self.image,
                test_requires=list(self.test_requires),
            )
        return out

    @classmethod
    def from_swebench(
        cls,
        d: dict[str, Any],
        *,
        snapshot: str | None = None,
        image: str | None = None,
        src_root: str = "",
        test_requires: Iterable[str] = (),
        allow_unpinned: bool = False,
    ) -> SweTask:
        if not isinstance(d, dict):
            raise InstanceError(
                f"a SWE-bench instance must be a JSON object, got {type(d).__name__}: {str(d)[:100]}"
            )
        iid = d.get("instance_id", "?")
        missing = [k for k in REQUIRED_FIELDS if k not in d or d[k] is None]
        if missing:
            raise InstanceError(
                f"instance {iid}: missing field(s) {', '.join(missing)} (a SWE-bench instance has "
                f"{', '.join(REQUIRED_FIELDS)}, and usually repo, base_commit, test_patch)"
            )
        for k in _STRING_FIELDS:
            if k in d and d[k] is not None and not isinstance(d[k], str):
                raise InstanceError(f"instance {iid}: field {k} must be a string, got {type(d[k]).__name__}")
        extra = d.get("turngym") or {}
        f2p = _json_list(d["FAIL_TO_PASS"], "FAIL_TO_PASS", iid)
        p2p = _json_list(d["PASS_TO_PASS"], "PASS_TO_PASS", iid)
        if not f2p:
            raise InstanceError(
                f"instance {iid}: FAIL_TO_PASS is empty: nothing would tell a fix from no fix"
            )
        test_files = list(extra.get("test_files") or [])
        if not test_files:
            test_files = sorted(
                {t.split("::")[0] for t in f2p + p2p if "::" in t}
                | set(_diff_paths_only(d.get("test_patch", "")))
            )
        return cls(
            instance_id=str(d["instance_id"]),
            repo=str(d.get("repo", "")),
            problem_statement=str(d.get("problem_statement", "")),
            patch=str(d["patch"]),
            fail_to_pass=f2p,
            pass_to_pass=p2p,
            test_files=test_files,
            test_patch=str(d.get("test_patch", "") or ""),
            base_commit=str(d.get("base_commit", "") or ""),
            version=str(d.get("version", "") or ""),
            hints_text=str(d.get("hints_text", "") or ""),
            created_at=str(d.get("created_at", "") or ""),
            package=extra.get("package"),
            snapshot=snapshot,
            image=image,
            src_root=src_root,
            test_requires=tuple(test_requires),
            allow_unpinned=allow_unpinned,
            mutation=extra.get("mutation"),
            expert_edits=list(extra.get("expert_edits") or []),
        )


def _json_list(value: Any, name: str = "FAIL_TO_PASS / PASS_TO_PASS", instance_id: Any = "?") -> list[str]:
    """A test-id list, given as a list or (as SWE-bench stores it) a JSON string holding one."""
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else []
        except json.JSONDecodeError as e:
            raise InstanceError(
                f"instance {instance_id}: field {name} is a string but not a JSON list of test ids "
                f"({e.msg} at column {e.colno}): {value[:100]!r}"
            ) from None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InstanceError(
            f"instance {instance_id}: field {name} must be a list of test ids (strings) or a JSON string "
            f"of one, got {type(value).__name__}: {str(value)[:100]}"
        )
    return list(value)


def _diff_paths(patch: str) -> list[tuple[str, str]]:
    from turngym.envs.swe.diffs import split_patch

    return split_patch(patch)


def _diff_paths_only(patch: str) -> list[str]:
    return [p for p, _ in _diff_paths(patch)]


def read_snapshot(path: str | os.PathLike[str]) -> dict[str, bytes]:
    """A repository snapshot (a directory, or a tarball whose single top directory is stripped)."""
    p = Path(path)
    files: dict[str, bytes] = {}
    if p.is_dir():
        for f in sorted(p.rglob("*")):
            rel = f.relative_to(p).as_posix()
            if f.is_file() and not f.is_symlink() and not rel.startswith(".git/"):
                files[rel] = f.read_bytes()
        return files
    with tarfile.open(p) as tar:
        members = [m for m in tar.getmembers() if m.isfile()]
        tops = {m.name.lstrip("./").split("/", 1)[0] for m in members}
        strip = len(tops) == 1 and all("/" in m.name.lstrip("./") for m in members)
        for m in members:
            name = m.name.lstrip("./")
            rel = name.split("/", 1)[1] if strip else name
            if rel.startswith(".git/") or ".." in rel.split("/"):
                continue
            fobj = tar.extractfile(m)
            files[rel] = fobj.read() if fobj else b""
    return files


def is_git_checkout(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is the top directory of a git checkout (it holds ``.git``, a folder or a
    worktree's ``.git`` file); a folder *inside* a checkout is not one."""
    p = Path(path)
    return p.is_dir() and (p / ".git").exists()


def _git(repo: str | os.PathLike[str], *args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(repo), *args], input=stdin, capture_output=True, check=False)


def pin_snapshot(
    snapshot: str | os.PathLike[str], base_commit: str, instance_id: str = "", *, allow_unpinned: bool = False
) -> str | None:
    """The full id of ``base_commit`` in a git snapshot (the commit to grade), or None.

    Raises ``ValueError`` when the snapshot is a git checkout that lacks ``base_commit`` (or that git
    cannot read), and when an instance names a ``base_commit`` but the snapshot is not a git
    checkout, so the commit cannot be checked; with ``allow_unpinned`` the latter only warns (once
    per snapshot). Nothing in the checkout is changed.
    """
    if not base_commit:
        return None
    if not is_git_checkout(snapshot):
        if not allow_unpinned:
            raise InstanceError(
                f"instance {instance_id or '?'}: names base_commit {base_commit}, but the snapshot {snapshot} "
                "is not a git checkout, so turngym cannot check out that commit and could grade the wrong "
                "code. Pass a git checkout of the repository that has the commit (it is pinned "
                "automatically), or opt out with allow_unpinned=True (CLI: --allow-unpinned) if the "
                "snapshot is known to be at base_commit."
            )
        _warn_unpinned(str(snapshot))
        return None
    return _resolve_commit(str(Path(snapshot).resolve()), base_commit, instance_id)


@functools.cache
def _warn_unpinned(snapshot: str) -> None:
    warnings.warn(
        f"snapshot {snapshot} is not a git checkout, so it cannot be checked out at the instances' "
        "base_commit: its files are graded as they are (allow_unpinned). Make sure it holds the "
        "repository at base_commit (or pass a git checkout that has the commit: it is pinned).",
        stacklevel=3,
    )


@functools.lru_cache(maxsize=4096)
def _resolve_commit(repo: str, commit: str, instance_id: str) -> str:
    res = _git(repo, "rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}")
    if res.returncode != 0:
        why = res.stderr.decode(errors="replace").strip()
        raise InstanceError(
            f"instance {instance_id or '?'}: base_commit {commit} is not a commit of the git snapshot {repo}"
            + (f" (git: {why})" if why else "")
            + f"; fetch it (git -C {repo} fetch origin {commit}) or pass a snapshot at base_commit"
        )
    return res.stdout.decode().strip()


def read_git_tree(repo: str | os.PathLike[str], commit: str) -> dict[str, bytes]:
    """The files of ``commit`` in the git repository ``repo``, read from its object store (the
    checkout is not touched; symlinks and submodules are skipped, like :func:`read_snapshot`)."""
    listing = _git(repo, "ls-tree", "-r", "-z", "--full-tree", commit)
    if listing.returncode != 0:
        raise ValueError(f"cannot list {commit} in {repo}: {listing.stderr.decode(errors='replace').strip()}")
    entries: list[tuple[str, bytes]] = []
    for record in listing.stdout.split(b"\0"):
        if not record:
            continue
        meta, name = record.split(b"\t", 1)
        mode, kind, sha = meta.split()
        if kind == b"blob" and mode != b"120000":
            entries.append((name.decode(), sha))
    blobs = _git(repo, "cat-file", "--batch", stdin=b"".join(sha + b"\n" for _, sha in entries))
    if blobs.returncode != 0:
        raise ValueError(f"cannot read {commit} in {repo}: {blobs.stderr.decode(errors='replace').strip()}")
    out, pos, files = blobs.stdout, 0, {}
    for name, _ in entries:  # each blob: "<sha> blob <size>\n<content>\n"
        end = out.index(b"\n", pos)
        size = int(out[pos:end].split()[2])
        files[name] = out[end + 1 : end + 1 + size]
        pos = end + 1 + size + 1
    return files


def read_instance_file(path: str | os.PathLike[str]) -> list[tuple[str, Any]]:
    """The raw entries of a JSON (one object or a list) or JSONL file, each with where it came from
    (``FILE line N`` / ``FILE entry N``); invalid JSON raises :class:`InstanceError` with the line."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise InstanceError(f"cannot read SWE-bench instances from {p}: {e.strerror or e}") from None
    if p.suffix == ".jsonl":
        out = []
        for n, line in enumerate(text.split("\n"), 1):  # not splitlines: JSON strings may hold U+2028
            if not line.strip():
                continue
            try:
                out.append((f"{p} line {n}", json.loads(line)))
            except json.JSONDecodeError as e:
                raise InstanceError(f"{p} line {n}: not valid JSON ({e.msg} at column {e.colno})") from None
        return out
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        hint = " (a JSONL file? name it .jsonl)" if e.msg == "Extra data" else ""
        raise InstanceError(
            f"{p}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno}){hint}"
        ) from None
    entries = data if isinstance(data, list) else [data]
    return [(f"{p} entry {i}", d) for i, d in enumerate(entries)]


def save_instances(tasks: Iterable[SweTask], path: str | os.PathLike[str]) -> Path:
    """Write tasks as a JSON list of SWE-bench instances."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps([t.to_swebench() for t in tasks], indent=1) + "\n")
    return out


def load_instances(
    path: str | os.PathLike[str] | None = None,
    *,
    snapshot: str | None = None,
    snapshots: dict[str, str] | None = None,
    image: str | None = None,
    src_root: str = "",
    test_requires: Iterable[str] = (),
    allow_unpinned: bool = False,
) -> list[SweTask]:
    """Tasks from a JSON list or JSONL file of SWE-bench instances (default: the shipped task set).

    For plain SWE-bench instances give the repository: ``snapshot`` (one for all) or ``snapshots``
    (instance id -> directory or tarball); a git checkout is pinned to each instance's
    ``base_commit``, a plain directory or tarball must already be at it (see the module docstring).
    ``image`` names an image that has the repository's dependencies (else one is built from
    ``test_requires``). Errors name the file, the instance and the field (:class:`InstanceError`).
    """
    p = Path(path) if path is not None else DEFAULT_TASKS
    raw = read_instance_file(p)
    tasks = []
    for where, d in raw:
        snap = (snapshots or {}).get(str(d.get("instance_id")), snapshot) if isinstance(d, dict) else None
        extra = d.get("turngym") if isinstance(d, dict) and isinstance(d.get("turngym"), dict) else {}
        try:
            task = SweTask.from_swebench(
                d,
                snapshot=snap or extra.get("snapshot"),
                image=image or extra.get("image"),
                src_root=src_root or extra.get("src_root", ""),
                test_requires=tuple(test_requires) or tuple(extra.get("test_requires") or ()),
                allow_unpinned=allow_unpinned,
            )
        except InstanceError as e:
            raise InstanceError(f"{where}: {e}") from None
        if task.package is None and task.snapshot is None and task.image is None:
            raise InstanceError(
                f"instance {task.instance_id}: a SWE-bench instance needs the repository at base_commit "
                "(snapshot=DIR_OR_TARBALL or snapshots={id: path})"
            )
        tasks.append(task)
    return tasks


def check_instance(task: SweTask) -> list[str]:
    """Problems of a loaded instance found without Docker: its ``patch`` or ``test_patch`` does not
    apply to the repository at ``base_commit`` (checked with ``git apply --check`` in a temporary
    copy), or a FAIL_TO_PASS / PASS_TO_PASS test lives in a file that neither exists nor is added."""
    import tempfile

    problems: list[str] = []
    files = task.files()
    with tempfile.TemporaryDirectory(prefix="turngym-check-") as tmp:
        for rel, data in files.items():
            dest = Path(tmp, rel)
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(data)
        for name in ("patch", "test_patch"):
            text = getattr(task, name)
            if not text.strip():
                if name == "patch":
                    problems.append(f"instance {task.instance_id}: field patch is empty (no gold patch)")
                continue
            res = subprocess.run(
                ["git", "apply", "--check", "--whitespace=nowarn", "-"],
                cwd=tmp,
                input=text.encode() if text.endswith("\n") else (text + "\n").encode(),
                capture_output=True,
                check=False,
            )
            if res.returncode != 0:
                why = res.stderr.decode(errors="replace").strip().splitlines()
                problems.append(
                    f"instance {task.instance_id}: field {name} does not apply at "
                    f"{task.graded_commit or 'the snapshot'}: {'; '.join(why[:3])}"
                )
    known = set(files) | set(_diff_paths_only(task.test_patch))
    for name, tests in (("FAIL_TO_PASS", task.fail_to_pass), ("PASS_TO_PASS", task.pass_to_pass)):
        missing = sorted({t.split("::")[0] for t in tests if "::" in t} - known)
        if missing:
            problems.append(
                f"instance {task.instance_id}: {name} names tests in files the repository at base_commit "
                f"does not have and test_patch does not add: {', '.join(missing[:5])}"
            )
    return problems


def import_swebench(
    path: str | os.PathLike[str], repo: str | os.PathLike[str], **load: Any
) -> tuple[list[SweTask], list[str]]:
    """Load SWE-bench instances against the local checkout ``repo`` and check each one
    (:func:`check_instance`); returns the tasks and the problems found (empty when all are usable)."""
    tasks = load_instances(path, snapshot=str(repo), **load)
    problems = [p for t in tasks for p in check_instance(t)]
    return tasks, problems


# ---------------------------------------------------------------- synthesis
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
    from turngym.sandboxes.docker import DockerSandbox, Limits

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


def snapshot_tarball(files: dict[str, bytes]) -> bytes:
    """A ``.tar`` of a repository's files (a convenient way to hand a snapshot to the loader)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for rel, data in sorted(files.items()):
            info = tarfile.TarInfo(rel)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()

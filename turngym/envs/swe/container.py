"""What the ``swe-docker`` env does with whole containers: grade a patch in a fresh one, digest the
repository in the episode's own (its state key), and copy one into a new slot of the pool for a fork."""

from __future__ import annotations

from typing import Any

from turngym.core.env import ForkError
from turngym.envs.swe.packages import REPO_DIR
from turngym.envs.swe.tasks import SweTask

#: one command, run in /testbed after each reset and step, whose output is a sha256 of the repository's
#: state: HEAD, the index (modes, blob ids, paths), the working tree against the index (binary diff,
#: modes included) and the path and content hash of every untracked file git does not ignore (a file
#: sha256sum cannot read, e.g. a dangling symlink, adds its error line instead). Only the 64-hex digest
#: comes back, whatever the repository's size; git reads files it finds stat-dirty.
REPO_DIGEST = (
    "set -o pipefail; { git rev-parse HEAD && git ls-files -s -z && printf '\\0--\\0' && "
    "git diff --binary --no-color --no-ext-diff --no-renames && printf '\\0--\\0' && "
    "{ git ls-files -z -o --exclude-standard | xargs -0 -r sha256sum -- 2>&1; true; }; } | sha256sum"
)


async def grade_in_fresh_container(
    pool: Any, task: SweTask, patch: str, *, staged: Any, timeout: float
) -> Any:
    """The verdict on ``patch`` from a fresh container of ``pool`` (a Harbor task: its verifier; else
    the graded test run). A grading container the patch's own code runs out of memory is a failed
    grade (``SandboxDead`` with cause ``"oom"``); a container killed from outside raises, and the
    rollout engine masks the episode."""
    from turngym.envs.swe.repo import Grade, grade_patch, run_verifier
    from turngym.sandboxes.docker import SandboxDead, run_blocking

    sb = await pool.aacquire(bounded=False)
    try:
        if task.harbor is not None:
            return await run_blocking(
                run_verifier,
                sb,
                task.files(),
                patch,
                tests=task.harbor["tests"],
                env=task.harbor["verifier_env"],
                timeout=task.harbor["verifier_timeout"],
                workdir=task.harbor["workdir"],
            )
        return await run_blocking(
            grade_patch,
            sb,
            task.files(),
            patch,
            fail_to_pass=task.fail_to_pass,
            pass_to_pass=task.pass_to_pass,
            test_files=task.test_files,
            test_patch=task.test_patch,
            timeout=timeout,
            staged=staged,
            grader=task.grader,
            is_test_path=task.is_test_path,
        )
    except SandboxDead as e:
        if e.cause != "oom":
            raise
        return Grade(False, applied=True, grader=task.grader, detail=f"the grading container died: {e}")
    finally:
        pool.release_later(sb)


async def repository_digest(sb: Any, timeout: float) -> tuple[str, str | None]:
    """``(digest, None)`` of the repository in ``sb`` as it is now (:data:`REPO_DIGEST`), or
    ``("", why)`` when it cannot be made. However a change was made (the editor, ``sed -i`` or
    ``echo >`` through bash, ``git add``), equal repositories give equal digests and different ones
    different digests; ignored files (``__pycache__``, ``*.pyc``) and files outside ``/testbed`` are
    not part of it. A dead container raises ``SandboxDead``."""
    from turngym.sandboxes.docker import SandboxDead, SandboxError, run_blocking

    try:
        res = await run_blocking(sb.exec, REPO_DIGEST, timeout=timeout, workdir=REPO_DIR)
    except SandboxDead:
        raise
    except SandboxError as e:
        return "", f"the repository digest failed ({e})"
    digest = res.output.split()[0] if res.exit_code == 0 and res.output.strip() else ""
    if not digest:
        return "", f"the repository digest failed (exit {res.exit_code}): {res.output[-300:]}"
    return digest, None


async def copy_container(parent_sb: Any, pool: Any, *, wait: float, name: str) -> Any:
    """A new container of ``pool`` (one of its ``max_active`` slots, waited for ``wait`` seconds at
    most) whose writable mounts (``/testbed``, ``/tmp``, ``/root``; a Harbor task's ``/tests``,
    ``/logs``) hold what ``parent_sb``'s hold now. The root file system is read-only and the same
    image, so that is the whole file system; processes are not copied. The snapshot is a tar archive
    made inside the parent (``docker commit`` does not see tmpfs mounts): nothing is written to the
    parent and no image is made, so a failure (a :class:`ForkError` naming ``name``) leaves nothing."""
    from turngym.sandboxes.docker import SandboxDead, SandboxError, run_blocking

    if not await run_blocking(parent_sb.alive):
        raise ForkError(
            f"{name}: cannot fork, its container {parent_sb.name} is not running (killed or removed "
            "from outside); the parent's next step ends its episode with a sandbox error"
        )
    try:
        sb = await pool.aacquire(timeout=wait)
    except SandboxError as e:
        raise ForkError(
            f"{name}: cannot fork, no container slot for the fork ({e}); every fork holds one of the "
            "pool's max_active containers until it is closed"
        ) from e
    paths = list(pool.limits.writable)
    try:
        try:
            archive = await run_blocking(
                parent_sb.snapshot, paths, max_bytes=(pool.limits.tmpfs_mb << 20) * len(paths)
            )
        except SandboxDead as e:
            raise ForkError(f"{name}: cannot fork, its container died during the snapshot ({e})") from e
        except SandboxError as e:
            raise ForkError(f"{name}: cannot fork, the snapshot of its container failed ({e})") from e
        try:
            await run_blocking(sb.restore, paths, archive)
        except SandboxError as e:
            raise ForkError(f"{name}: cannot fork, the fork's new container {sb.name} failed ({e})") from e
    except BaseException:
        pool.release_later(sb)
        raise
    return sb

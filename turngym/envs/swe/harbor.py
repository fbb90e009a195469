"""Harbor tasks (the task format of Harbor and Terminal-Bench 2) as swe-docker tasks.

A Harbor task is a directory::

    task.toml            configuration (TOML, read with tomllib; harbor itself is not needed)
    instruction.md       what the agent is asked to do
    environment/         the Docker build context: a Dockerfile and the files it copies
    tests/test.sh        the verifier; it writes the reward to /logs/verifier/reward.txt (or .json)
    solution/solve.sh    optional reference solution (the scripted expert runs it)

How turngym runs one (see docs/envs/swe-docker.md, "Harbor tasks", for the supported fields):

* The image is built locally from ``environment/Dockerfile``. Nothing is pulled: every ``FROM``
  image must already exist locally, or be ``${BASE_IMAGE}`` (an ``ARG``), which turngym sets to its
  local Debian base image (``turngym sandbox build``). A missing image, Dockerfile, instruction or
  test script is an :class:`HarborTaskError` naming the task and what is missing. The image needs
  ``python3`` and ``git`` (the sandbox's command server and the repository snapshot use them).
* The agent works in the Dockerfile's ``WORKDIR``: its files become the task's repository (uploaded
  to ``/testbed`` at reset like any swe-docker task) and the ``WORKDIR`` path is a link to
  ``/testbed``, so paths in the instruction and in ``test.sh`` still work.
* Grading runs in a fresh container: the pristine ``WORKDIR`` plus the agent's changes under it
  (all of them: the tests live outside, in ``/tests``), then ``tests/`` is uploaded to ``/tests``
  and ``bash /tests/test.sh`` runs in ``WORKDIR`` with no network, under ``[verifier] timeout_sec``
  and ``[verifier] env``. The reward is the number in ``/logs/verifier/reward.txt``, or the
  ``reward`` value of ``/logs/verifier/reward.json``; no reward file means reward 0 with the
  verifier's output in ``info["grade"]``. Changes outside ``WORKDIR`` are not carried over.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import tarfile
import tomllib
from pathlib import Path
from typing import Any

from turngym.envs.swe.packages import REPO_DIR
from turngym.envs.swe.tasks import InstanceError, SweTask

HARBOR_IMAGE_REPO = "turngym-harbor"
BASE_IMAGE_ARG = "BASE_IMAGE"
#: the task.toml fields turngym reads (anything else, e.g. [metadata], is kept but not used)
SUPPORTED = {
    "version": "schema version (kept in the task's metadata)",
    "schema_version": "schema version (kept in the task's metadata)",
    "task.name": "the task id (default: the directory name)",
    "metadata": "kept as SweTask.harbor['metadata']",
    "verifier.timeout_sec": "time limit of test.sh (default 600 s)",
    "verifier.env": "environment variables of test.sh",
    "environment.docker_image": "a prebuilt local image to use when there is no environment/Dockerfile",
    "environment.build_timeout_sec": "time limit of the image build (default 900 s)",
}


class HarborTaskError(InstanceError):
    """A Harbor task that cannot be loaded; the message names the task and what is missing."""


def is_harbor_task(path: str | os.PathLike[str]) -> bool:
    return (Path(path) / "task.toml").is_file()


def harbor_task_dirs(path: str | os.PathLike[str]) -> list[Path]:
    """``path`` itself when it is a Harbor task, else its sub-directories that are (sorted)."""
    p = Path(path)
    if is_harbor_task(p):
        return [p]
    found = sorted(d for d in p.iterdir() if d.is_dir() and is_harbor_task(d)) if p.is_dir() else []
    if not found:
        raise HarborTaskError(f"{p}: not a Harbor task (no task.toml) and holds no task directories")
    return found


def load_harbor_tasks(path: str | os.PathLike[str], *, base_image: str | None = None) -> list[SweTask]:
    """Every Harbor task under ``path`` (a task directory, or a directory of them) as a SweTask;
    builds each task's image (cached by content)."""
    return [load_harbor_task(d, base_image=base_image) for d in harbor_task_dirs(path)]


def read_task_toml(task_dir: Path) -> dict[str, Any]:
    name = task_dir.name
    try:
        return tomllib.loads((task_dir / "task.toml").read_text())
    except FileNotFoundError:
        raise HarborTaskError(f"Harbor task {name}: task.toml is missing ({task_dir})") from None
    except tomllib.TOMLDecodeError as e:
        raise HarborTaskError(f"Harbor task {name}: task.toml is not valid TOML: {e}") from None


def _section(config: dict[str, Any], key: str, name: str) -> dict[str, Any]:
    value = config.get(key, {})
    if not isinstance(value, dict):
        raise HarborTaskError(f"Harbor task {name}: [{key}] in task.toml must be a table")
    return value


def _number(section: dict[str, Any], key: str, default: float, name: str, where: str) -> float:
    value = section.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise HarborTaskError(f"Harbor task {name}: {where}.{key} must be a positive number, got {value!r}")
    return float(value)


def load_harbor_task(task_dir: str | os.PathLike[str], *, base_image: str | None = None) -> SweTask:
    """One Harbor task as a SweTask (grader ``harbor``); see the module docstring."""
    d = Path(task_dir)
    config = read_task_toml(d)
    task_meta = _section(config, "task", d.name)
    name = str(task_meta.get("name") or d.name)
    verifier = _section(config, "verifier", name)
    environment = _section(config, "environment", name)
    env_vars = verifier.get("env", {})
    if not isinstance(env_vars, dict) or not all(isinstance(v, str | int | float) for v in env_vars.values()):
        raise HarborTaskError(f"Harbor task {name}: verifier.env must be a table of strings")
    instruction_path = d / "instruction.md"
    if not instruction_path.is_file():
        raise HarborTaskError(f"Harbor task {name}: instruction.md is missing ({d})")
    instruction = instruction_path.read_text().strip()
    if not instruction:
        raise HarborTaskError(f"Harbor task {name}: instruction.md is empty")
    tests_dir = d / "tests"
    if not (tests_dir / "test.sh").is_file():
        raise HarborTaskError(f"Harbor task {name}: tests/test.sh is missing (the verifier) ({d})")
    tests = {
        f.relative_to(tests_dir).as_posix(): f.read_bytes()
        for f in sorted(tests_dir.rglob("*"))
        if f.is_file() and not f.is_symlink()
    }
    solve = d / "solution" / "solve.sh"
    built, workdir = build_harbor_image(
        d,
        name,
        prebuilt=environment.get("docker_image"),
        base_image=base_image,
        timeout=_number(environment, "build_timeout_sec", 900.0, name, "environment"),
    )
    image, files = link_workdir(built, workdir, name)
    task = SweTask(
        instance_id=name,
        repo=f"harbor:{name}",
        problem_statement=instruction,
        patch="",
        fail_to_pass=[],
        pass_to_pass=[],
        image=image,
        grader="harbor",
        version=str(config.get("schema_version") or config.get("version") or ""),
    )
    task._files = files
    task.harbor = {
        "dir": str(d.resolve()),
        "workdir": workdir,
        "tests": tests,
        "solution": solve.read_text() if solve.is_file() else None,
        "verifier_timeout": _number(verifier, "timeout_sec", 600.0, name, "verifier"),
        "verifier_env": {k: str(v) for k, v in env_vars.items()},
        "metadata": _section(config, "metadata", name),
    }
    return task


# ---------------------------------------------------------------- images
_ARG = re.compile(r"^\s*ARG\s+([A-Za-z_][A-Za-z0-9_]*)(?:=(\S*))?", re.I)
_FROM = re.compile(r"^\s*FROM\s+(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?", re.I)
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)")


def from_images(dockerfile: str, build_args: dict[str, str]) -> list[str]:
    """The images a Dockerfile builds ``FROM`` (``ARG`` defaults and build args substituted; ``scratch``
    and earlier stages left out)."""
    args: dict[str, str] = {}
    stages: set[str] = set()
    out: list[str] = []
    for line in dockerfile.splitlines():
        if m := _ARG.match(line):
            args.setdefault(m.group(1), m.group(2) or "")
            continue
        if m := _FROM.match(line):

            def sub(v: re.Match[str]) -> str:
                var = v.group(1) or v.group(3)
                return build_args.get(var) or args.get(var) or (v.group(2) or "")

            image = _VAR.sub(sub, m.group(1))
            if image.lower() != "scratch" and image not in stages and image not in out:
                out.append(image)
            if m.group(2):
                stages.add(m.group(2))
    return out


def _context_hash(context: Path, extra: str) -> str:
    h = hashlib.sha256(extra.encode())
    for f in sorted(context.rglob("*")):
        if f.is_file():
            h.update(f.relative_to(context).as_posix().encode() + b"\0")
            h.update(hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()[:16]


def build_harbor_image(
    task_dir: Path,
    name: str,
    *,
    prebuilt: str | None = None,
    base_image: str | None = None,
    timeout: float = 900.0,
) -> tuple[str, str]:
    """The task's image (built from ``environment/Dockerfile``, cached by content) and its WORKDIR."""
    import docker.errors

    from turngym.sandboxes.docker import docker_client
    from turngym.sandboxes.images import base_image as local_base

    client = docker_client()
    context = task_dir / "environment"
    dockerfile = context / "Dockerfile"
    if dockerfile.is_file():
        text = dockerfile.read_text()
        needs_base = any(BASE_IMAGE_ARG in m.group(1) for m in map(_FROM.match, text.splitlines()) if m)
        build_args = {BASE_IMAGE_ARG: local_base(base_image)} if needs_base else {}
        missing = []
        for ref in from_images(text, build_args):
            try:
                client.images.get(ref)
            except docker.errors.ImageNotFound:
                missing.append(ref)
        if missing:
            raise HarborTaskError(
                f"Harbor task {name}: environment/Dockerfile builds FROM {', '.join(missing)}, which "
                "is not a local Docker image (turngym never pulls from a registry): docker load or build "
                f"it first, or start the Dockerfile with `ARG {BASE_IMAGE_ARG}` / `FROM ${{{BASE_IMAGE_ARG}}}` "
                "to build on turngym's local base image (turngym sandbox build)"
            )
        parents = "|".join(client.images.get(r).id for r in from_images(text, build_args))
        tag = f"{HARBOR_IMAGE_REPO}:{_context_hash(context, parents + repr(sorted(build_args.items())))}"
        try:
            client.images.get(tag)
        except docker.errors.ImageNotFound:
            try:
                client.images.build(
                    path=str(context),
                    tag=tag,
                    buildargs=build_args,
                    rm=True,
                    forcerm=True,
                    pull=False,
                    timeout=int(timeout),
                    labels={"turngym.harbor-task": name},
                )
            except docker.errors.BuildError as e:
                log = "".join(str(c.get("stream", c.get("error", ""))) for c in e.build_log)[-2000:]
                raise HarborTaskError(
                    f"Harbor task {name}: environment/Dockerfile does not build: {e}\n{log}"
                ) from None
    elif prebuilt:
        tag = str(prebuilt)
        try:
            client.images.get(tag)
        except docker.errors.ImageNotFound:
            raise HarborTaskError(
                f"Harbor task {name}: environment.docker_image {tag} is not a local Docker image "
                "(turngym never pulls from a registry); docker load or build it first"
            ) from None
    else:
        raise HarborTaskError(
            f"Harbor task {name}: environment/Dockerfile is missing and task.toml names no "
            "environment.docker_image"
        )
    workdir = client.images.get(tag).attrs.get("Config", {}).get("WorkingDir") or ""
    if workdir in ("", "/"):
        raise HarborTaskError(
            f"Harbor task {name}: the image sets no WORKDIR (or WORKDIR /); turngym needs the directory "
            "the agent works in (add e.g. `WORKDIR /app` to environment/Dockerfile)"
        )
    return tag, workdir


def _workdir_files(client: Any, image: str, workdir: str) -> dict[str, bytes]:
    from turngym.sandboxes.docker import owner_labels

    container = client.containers.create(
        image, command=["true"], network_mode="none", labels=owner_labels("harbor-load")
    )
    try:
        stream, _ = container.get_archive(workdir.rstrip("/") + "/.")
        data = b"".join(stream)
    finally:
        container.remove(force=True)
    files: dict[str, bytes] = {}
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for m in tar.getmembers():
            parts = m.name.split("/")[1:]  # the archive's top entry is the directory itself
            rel = "/".join(parts)
            if m.isfile() and rel and ".." not in parts and not rel.startswith(".git/"):
                fobj = tar.extractfile(m)
                files[rel] = fobj.read() if fobj else b""
    return files


def link_workdir(image: str, workdir: str, name: str) -> tuple[str, dict[str, bytes]]:
    """The image with ``workdir`` replaced by a link to ``/testbed`` (the task's repository), and the
    files ``workdir`` held (they are uploaded at reset). Checks that the image has python3 and git."""
    import docker.errors

    from turngym.sandboxes.docker import docker_client, owner_labels
    from turngym.sandboxes.images import build_layer

    client = docker_client()
    try:
        client.containers.run(
            image,
            ["sh", "-c", "command -v python3 >/dev/null && command -v git >/dev/null"],
            remove=True,
            network_mode="none",
            labels=owner_labels("harbor-load"),
        )
    except docker.errors.ContainerError:
        raise HarborTaskError(
            f"Harbor task {name}: its image {image} lacks python3 or git, which turngym's sandbox needs; "
            f"build it FROM ${{{BASE_IMAGE_ARG}}} (turngym's base has both) or install them"
        ) from None
    files = _workdir_files(client, image, workdir)
    if workdir.rstrip("/") == REPO_DIR:
        link = []
    else:
        w = workdir.rstrip("/")
        link = [f"rm -rf {w} && mkdir -p $(dirname {w}) && ln -s {REPO_DIR} {w}"]
    report = build_layer(
        image, HARBOR_IMAGE_REPO, commands=link, workdir=REPO_DIR, labels={"turngym.harbor-task": name}
    )
    return report.tag, files

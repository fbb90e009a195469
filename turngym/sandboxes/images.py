"""Images for sandboxes, built locally and cached by content hash.

* The **base image** comes from Debian packages: ``debootstrap`` (or ``mmdebstrap``) with the mirror
  of the machine's own apt configuration, then ``docker import``. Its tag carries a hash of the
  recipe (suite, variant, packages), so it is built once; ``TURNGYM_BASE_IMAGE`` (or the ``base=``
  argument) names an existing image instead, for users with a registry.
* **Layers** (:func:`build_layer`) add files and run commands on top of an image in a throw-away
  build container, then ``docker commit``. Build containers may use the default bridge network and
  get the host's CA bundle mounted read-only (``PIP_CERT``/``SSL_CERT_FILE`` point at it), so ``pip``
  reaches the package index through TLS-intercepting proxies. Their tag hashes the parent image id,
  the files and the commands.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from turngym.sandboxes.docker import LABEL_MANAGED, SandboxError, docker_client, owner_labels
from turngym.sandboxes.limits import Limits

LABEL_HASH = "turngym.content-hash"
LABEL_RECIPE = "turngym.recipe"
BASE_REPO = "turngym-base"
HOST_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
CONTAINER_CA_PATH = "/etc/turngym-host-ca.crt"


@dataclass(frozen=True)
class BaseRecipe:
    """What goes into the base image (everything here is part of its content hash)."""

    suite: str = "bookworm"
    variant: str = "minbase"
    packages: tuple[str, ...] = (
        "python3",
        "python3-pytest",
        "python3-pip",
        "git",
        "ca-certificates",
        "procps",
    )

    def content_hash(self) -> str:
        payload = json.dumps(
            {"suite": self.suite, "variant": self.variant, "packages": sorted(self.packages)}
        )
        return hashlib.sha256(payload.encode()).hexdigest()[:16]

    @property
    def tag(self) -> str:
        return f"{BASE_REPO}:{self.suite}-{self.content_hash()}"


@dataclass
class BuildReport:
    """What a build did: the tag, whether it came from the cache, and how long it took."""

    tag: str
    cached: bool
    seconds: float
    log: list[str] = field(default_factory=list)


def apt_mirror(sources_dir: str = "/etc/apt") -> str:
    """The Debian mirror of this machine's apt configuration (deb822 ``URIs:`` or one-line ``deb``)."""
    root = Path(sources_dir)
    candidates = sorted(root.glob("sources.list.d/*.sources")) + [root / "sources.list"]
    candidates += sorted(root.glob("sources.list.d/*.list"))
    for path in candidates:
        try:
            text = path.read_text()
        except OSError:
            continue
        for line in text.splitlines():
            line = line.strip()
            m = re.match(r"URIs:\s*(\S+)", line)
            if m and "security" not in m.group(1):
                return m.group(1)
            m = re.match(r"deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+\S+", line)
            if m and "security" not in m.group(1):
                return m.group(1)
    raise SandboxError(f"no Debian mirror found in the apt configuration under {sources_dir}")


def image_exists(tag: str, client: Any = None) -> bool:
    import docker.errors

    try:
        (client or docker_client()).images.get(tag)
    except docker.errors.ImageNotFound:
        return False
    return True


def base_image(base: str | None = None, *, build: bool = True, recipe: BaseRecipe | None = None) -> str:
    """The base image to use: ``base``, else ``$TURNGYM_BASE_IMAGE``, else the locally built one."""
    named = base or os.environ.get("TURNGYM_BASE_IMAGE")
    if named:
        if not image_exists(named):
            raise SandboxError(f"base image {named!r} does not exist locally (pull or build it first)")
        return named
    recipe = recipe or BaseRecipe()
    if image_exists(recipe.tag):
        return recipe.tag
    if not build:
        raise SandboxError(f"base image {recipe.tag} is not built; run `turngym sandbox build`")
    return build_base_image(recipe).tag


def build_base_image(
    recipe: BaseRecipe | None = None, *, mirror: str | None = None, force: bool = False, log: Any = None
) -> BuildReport:
    """Build the base image with debootstrap (or mmdebstrap) + ``docker import``; cached by recipe hash."""
    recipe = recipe or BaseRecipe()
    client = docker_client()
    t0 = time.perf_counter()
    if not force and image_exists(recipe.tag, client):
        return BuildReport(recipe.tag, cached=True, seconds=time.perf_counter() - t0)
    if os.geteuid() != 0:
        raise SandboxError("building the base image needs root (debootstrap); or set TURNGYM_BASE_IMAGE")
    mirror = mirror or apt_mirror()
    tool = shutil.which("mmdebstrap") or shutil.which("debootstrap")
    if tool is None:
        raise SandboxError("neither mmdebstrap nor debootstrap is installed (apt-get install debootstrap)")
    lines: list[str] = []
    with tempfile.TemporaryDirectory(prefix="turngym-rootfs-") as tmp:
        rootfs = os.path.join(tmp, "rootfs")
        include = ",".join(recipe.packages)
        cmd = [tool, f"--variant={recipe.variant}", f"--include={include}", recipe.suite, rootfs, mirror]
        _run(cmd, lines, log)
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists", "var/log"):
            for p in Path(rootfs, junk).glob("*"):
                if p.is_file():
                    p.unlink()
        labels = {
            LABEL_MANAGED: "1",
            LABEL_HASH: recipe.content_hash(),
            LABEL_RECIPE: json.dumps(recipe.__dict__),
        }
        changes = [f"LABEL {k}={json.dumps(v)}" for k, v in labels.items()]
        changes += ['CMD ["python3"]', "ENV LANG=C.UTF-8", "ENV PYTHONDONTWRITEBYTECODE=1"]
        tar = subprocess.Popen(["tar", "-C", rootfs, "-c", "."], stdout=subprocess.PIPE)
        repo, tag = recipe.tag.split(":")
        try:
            client.api.import_image_from_stream(tar.stdout, repository=repo, tag=tag, changes=changes)
        finally:
            tar.stdout.close()  # type: ignore[union-attr]
            tar.wait()
        if tar.returncode != 0:
            raise SandboxError(f"tar of the root file system failed ({tar.returncode})")
    if not image_exists(recipe.tag, client):
        raise SandboxError(f"docker import did not produce {recipe.tag}")
    return BuildReport(recipe.tag, cached=False, seconds=time.perf_counter() - t0, log=lines)


def _run(cmd: Sequence[str], lines: list[str], log: Any) -> None:
    proc = subprocess.run(list(cmd), capture_output=True, text=True)
    out = (proc.stdout + proc.stderr).splitlines()
    lines.extend(out)
    if log is not None:
        for line in out[-20:]:
            log(line)
    if proc.returncode != 0:
        tail = "\n".join(out[-30:])
        raise SandboxError(f"{cmd[0]} failed with exit code {proc.returncode}:\n{tail}")


def layer_hash(parent_id: str, files: Mapping[str, bytes | str], commands: Sequence[str], extra: Any) -> str:
    h = hashlib.sha256()
    h.update(parent_id.encode())
    for path in sorted(files):
        data = files[path]
        h.update(path.encode() + b"\0")
        h.update(hashlib.sha256(data.encode() if isinstance(data, str) else data).digest())
    h.update(json.dumps([list(commands), extra], sort_keys=True, default=str).encode())
    return h.hexdigest()[:16]


def build_layer(
    parent: str,
    repository: str,
    *,
    files: Mapping[str, bytes | str] | None = None,
    commands: Sequence[str] = (),
    workdir: str = "/",
    env: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    network: bool = False,
    timeout: float = 900.0,
    force: bool = False,
) -> BuildReport:
    """Commit ``parent`` + ``files`` + the effect of ``commands`` as ``repository:<content hash>``.

    Commands run with bash in ``workdir``; with ``network`` the build container uses the default
    bridge and trusts the host's CA bundle. Any failing command aborts the build with its output.
    """
    from turngym.sandboxes.docker import DockerSandbox

    client = docker_client()
    t0 = time.perf_counter()
    files = dict(files or {})
    env = dict(env or {})
    parent_id = client.images.get(parent).id
    digest = layer_hash(
        parent_id, files, commands, {"workdir": workdir, "env": env, "labels": dict(labels or {})}
    )
    tag = f"{repository}:{digest}"
    if not force and image_exists(tag, client):
        return BuildReport(tag, cached=True, seconds=time.perf_counter() - t0)
    build_env = dict(env)
    if network and os.path.exists(HOST_CA_BUNDLE):
        build_env.update(
            PIP_CERT=CONTAINER_CA_PATH, SSL_CERT_FILE=CONTAINER_CA_PATH, REQUESTS_CA_BUNDLE=CONTAINER_CA_PATH
        )
    limits = Limits(
        cpus=2.0,
        memory_mb=4096,
        pids=4096,
        read_only=False,
        writable=(),
        network="bridge" if network else "none",
    )
    sb = DockerSandbox.create(
        parent, limits=limits, run_id="image-build", client=client, environment=build_env
    )
    lines: list[str] = []
    try:
        to_put = dict(files)
        if network and os.path.exists(HOST_CA_BUNDLE):
            to_put[CONTAINER_CA_PATH] = Path(HOST_CA_BUNDLE).read_bytes()
        sb.put_files(to_put)
        sb.exec(f"mkdir -p {workdir}", timeout=60)
        for command in commands:
            res = sb.exec(f"mkdir -p {workdir} && cd {workdir} && {command}", timeout=timeout)
            lines.append(f"$ {command}\n{res.output}")
            if not res.ok:
                raise SandboxError(f"build step failed ({res.exit_code}): {command}\n{res.output[-3000:]}")
        if network:
            sb.exec(f"rm -f {CONTAINER_CA_PATH}", timeout=30)
        all_labels = {**dict(labels or {}), LABEL_MANAGED: "1", LABEL_HASH: digest}
        changes = [f"LABEL {k}={json.dumps(v)}" for k, v in all_labels.items()]
        changes += [f"ENV {k}={json.dumps(v)}" for k, v in env.items()]
        changes += [f"WORKDIR {workdir}", 'CMD ["python3"]']
        # the build container's own owner labels must not stick to the image
        changes += [f"LABEL {k}=" for k in owner_labels()]
        repo, tagname = tag.split(":")
        sb.container.commit(repository=repo, tag=tagname, changes=changes)
    finally:
        sb.close()
    return BuildReport(tag, cached=False, seconds=time.perf_counter() - t0, log=lines)

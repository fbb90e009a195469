"""Real pure-Python packages whose PyPI sdists ship their tests, and their task images.

The sdist is downloaded on the host (PyPI JSON API, sha256-checked, cached under
``$TURNGYM_CACHE_DIR/sdists``; written to a temporary file and renamed into place, so concurrent
first resets, threads or processes, never read a torn archive). ``turngym sandbox build`` fetches
every known package's sdist up front, so episodes need no network.
A package's image = base image + its test dependencies (``pip`` at build time) + a ``.pth`` file
that puts ``/testbed`` on ``sys.path``; the source itself is uploaded into ``/testbed`` at reset
(see :mod:`turngym.envs.swe.repo`), so no image ever holds a fixed copy of a task's bug.
"""

from __future__ import annotations

import hashlib
import os
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

from turngym.core.cache import cache_root
from turngym.sandboxes.images import base_image, build_layer

REPO_DIR = "/testbed"
PLUGIN_DIR = "/tmp/.turngym"
PLUGIN_NAME = "turngym_pytest_report"
TASK_IMAGE_REPO = "turngym-swe"


def cache_dir() -> Path:
    """:func:`turngym.core.cache.cache_root`, created."""
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    return root


@dataclass(frozen=True)
class PackageSpec:
    """A PyPI package pinned by version and sdist hash; paths are relative to the sdist's root."""

    name: str
    version: str
    sha256: str
    sources: tuple[str, ...]
    tests: tuple[str, ...]
    src_root: str = ""
    test_requires: tuple[str, ...] = ()
    skip_tests: tuple[str, ...] = field(default=())

    @property
    def key(self) -> str:
        return f"{self.name}-{self.version}"

    def is_test_path(self, path: str) -> bool:
        """Whether ``path`` (relative to the repo) belongs to the test suite (never editable by a patch)."""
        name = os.path.basename(path)
        return (
            any(path == t or path.startswith(t.rstrip("/") + "/") for t in self.tests)
            or name == "conftest.py"
            or name.startswith("test_")
            or "/tests/" in f"/{path}"
        )


#: Small, fast, well-tested pure-Python libraries whose sdists include their test suites.
PACKAGES: dict[str, PackageSpec] = {
    p.name: p
    for p in (
        PackageSpec(
            name="inflection",
            version="0.5.1",
            sha256="1a29730d366e996aaacffb2f1f1cb9593dc38e2ddd30c91250c6dde09ea9b417",
            sources=("inflection/__init__.py",),
            tests=("test_inflection.py",),
        ),
        PackageSpec(
            name="cachetools",
            version="8.0.2",
            sha256="30ac523adfc118b51d2b2e7bad8a0ddb31370dfe2700c7f10ca224f36ccf81e0",
            sources=("src/cachetools/__init__.py", "src/cachetools/keys.py", "src/cachetools/func.py"),
            tests=("tests",),
            src_root="src",
        ),
        PackageSpec(
            name="toolz",
            version="1.0.0",
            sha256="2c86e3d9a04798ac556793bced838816296a2f085017664e4995cb40a1047a02",
            sources=(
                "toolz/itertoolz.py",
                "toolz/functoolz.py",
                "toolz/dicttoolz.py",
                "toolz/recipes.py",
                "toolz/utils.py",
            ),
            tests=("toolz/tests",),
        ),
    )
}


def download_sdist(spec: PackageSpec) -> Path:
    """The sdist of ``spec`` from PyPI (cached; the sha256 is checked when the spec pins one)."""
    import httpx

    dest = cache_dir() / "sdists"
    dest.mkdir(parents=True, exist_ok=True)
    cached = sorted(dest.glob(f"{spec.name}-{spec.version}.tar.gz")) + sorted(
        dest.glob(f"{spec.name.replace('-', '_')}-{spec.version}.tar.gz")
    )
    if cached and _sha_ok(cached[0], spec.sha256):
        return cached[0]
    index = os.environ.get("TURNGYM_PYPI_SIMPLE", "https://pypi.org/simple")
    meta = httpx.get(
        f"{index}/{spec.name}/",
        headers={"Accept": "application/vnd.pypi.simple.v1+json"},
        timeout=60,
        follow_redirects=True,
    )
    meta.raise_for_status()
    stems = {f"{n}-{spec.version}.tar.gz" for n in (spec.name, spec.name.replace("-", "_"))}
    files = [f for f in meta.json()["files"] if f["filename"] in stems]
    if not files:
        raise RuntimeError(f"{spec.key} has no sdist on the package index")
    info = files[0]
    expected = spec.sha256 or info["hashes"]["sha256"]
    if expected != info["hashes"]["sha256"]:
        raise RuntimeError(f"{spec.key}: the index's sdist hash differs from the pinned one")
    data = httpx.get(info["url"], timeout=120, follow_redirects=True).content
    if hashlib.sha256(data).hexdigest() != expected:
        raise RuntimeError(f"{spec.key}: downloaded sdist fails its sha256 check")
    path = dest / info["filename"]
    _write_atomic(path, data)
    return path


def _write_atomic(path: Path, data: bytes) -> None:
    """``path`` holds ``data`` whole or keeps what it held: a private temporary file in the same
    directory, flushed, then renamed over it (readers never see a partial file)."""
    import tempfile

    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _sha_ok(path: Path, sha256: str) -> bool:
    return not sha256 or hashlib.sha256(path.read_bytes()).hexdigest() == sha256


def sdist_files(spec: PackageSpec) -> dict[str, bytes]:
    """The sdist's regular files, keyed by path relative to its top directory."""
    out: dict[str, bytes] = {}
    with tarfile.open(download_sdist(spec)) as tar:
        for m in tar.getmembers():
            if not m.isfile() or "/" not in m.name:
                continue
            rel = m.name.split("/", 1)[1]
            if rel.endswith((".pyc", ".so")) or "/__pycache__/" in f"/{rel}":
                continue
            f = tar.extractfile(m)
            out[rel] = f.read() if f else b""
    return out


def plugin_source() -> bytes:
    """The pytest report plugin that ``run_tests`` loads in the sandbox."""
    return (Path(__file__).with_name("pytest_report.py")).read_bytes()


def env_image(
    *,
    base: str | None = None,
    src_root: str = "",
    test_requires: tuple[str, ...] = (),
    labels: dict[str, str] | None = None,
) -> str:
    """The image tasks of a repository run in: the base image + test requirements + a ``.pth`` file
    that puts ``/testbed/<src_root>`` on ``sys.path``. The repository itself is uploaded at reset.

    Test requirements are pip-installed at build time (the build container has network access and
    the host's CA bundle). Cached by content hash: building twice is free.
    """
    put = {
        "/usr/local/lib/python3.11/dist-packages/turngym-testbed.pth": f"{REPO_DIR}/{src_root}".rstrip("/")
        + "\n"
    }
    commands: list[str] = []
    if test_requires:
        reqs = " ".join(f"'{r}'" for r in test_requires)
        commands.append(f"python3 -m pip install --no-cache-dir --break-system-packages {reqs}")
    env = {
        "PYTHONDONTWRITEBYTECODE": "1",
        "HOME": "/root",
        "PYTHONPATH": PLUGIN_DIR,
    }
    report = build_layer(
        base_image(base),
        TASK_IMAGE_REPO,
        files=put,
        commands=commands,
        workdir=REPO_DIR,
        env=env,
        labels=labels or {},
        network=bool(test_requires),
    )
    return report.tag


def package_image(spec: PackageSpec, base: str | None = None) -> str:
    """The task image of a package (built once per content hash)."""
    return env_image(
        base=base,
        src_root=spec.src_root,
        test_requires=spec.test_requires,
        labels={"turngym.package": spec.key},
    )

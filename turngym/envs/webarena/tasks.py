"""WebArena's JSON task format: loading, checking and URL placeholders.

A task is WebArena's config dict::

    {"task_id": 7, "sites": ["tracker"], "require_login": true, "storage_state": null,
     "start_url": "__TRACKER__/payments-api", "geolocation": null, "require_reset": true,
     "intent_template": "Close the issue \"{{title}}\" in {{project}}", "instantiation_dict": {...},
     "intent": "Close the issue \"Login page crashes on Safari\" in payments-api", "intent_template_id": 104,
     "eval": {"eval_types": ["program_html"], "reference_answers": null, "reference_url": "",
              "program_html": [{"url": "__TRACKER__", "locator": "sql:SELECT state FROM issues ...",
                                "required_contents": {"exact_match": "closed"}}]}}

``load_tasks`` reads a JSON list, JSON lines, or a directory of ``<id>.json`` files (WebArena's
``config_files/``). Site names and URL placeholders of WebArena (``reddit``/``__REDDIT__``,
``gitlab``/``__GITLAB__``) map to the local forum and tracker.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from turngym.envs.webarena.sites import SITE_ALIASES, SITES

EVAL_TYPES = ("string_match", "url_match", "program_html")


class TaskFormatError(ValueError):
    """A task file does not follow WebArena's format (or names a site we do not have)."""


def check_task(task: dict[str, Any]) -> dict[str, Any]:
    """Validate one task and normalise its site names; returns a copy."""
    task = json.loads(json.dumps(task))
    for key in ("task_id", "intent", "start_url", "eval"):
        if key not in task:
            raise TaskFormatError(f"task {task.get('task_id', '?')}: missing {key!r}")
    sites = []
    for s in task.get("sites") or []:
        if s not in SITE_ALIASES:
            raise TaskFormatError(
                f"task {task['task_id']}: site {s!r} is not served locally (have {sorted(SITES)})"
            )
        sites.append(SITE_ALIASES[s])
    task["sites"] = sites or [name for name, spec in SITES.items() if _mentions(task, spec.placeholders)]
    if not task["sites"]:
        raise TaskFormatError(f"task {task['task_id']}: no site (neither 'sites' nor a URL placeholder)")
    ev = task["eval"]
    kinds = ev.get("eval_types") or []
    if not kinds or any(k not in EVAL_TYPES for k in kinds):
        raise TaskFormatError(
            f"task {task['task_id']}: eval_types must be a non-empty subset of {EVAL_TYPES}"
        )
    if "string_match" in kinds and not ev.get("reference_answers"):
        raise TaskFormatError(f"task {task['task_id']}: string_match needs reference_answers")
    if "url_match" in kinds and not ev.get("reference_url"):
        raise TaskFormatError(f"task {task['task_id']}: url_match needs reference_url")
    if "program_html" in kinds and not ev.get("program_html"):
        raise TaskFormatError(f"task {task['task_id']}: program_html needs a list of checks")
    return task


def _mentions(obj: Any, placeholders: tuple[str, ...]) -> bool:
    text = json.dumps(obj)
    return any(p in text for p in placeholders)


def load_tasks(path: str | Path, *, skip_unsupported: bool = False) -> list[dict[str, Any]]:
    """Tasks from a JSON list, JSON lines, or a directory of one-task JSON files (sorted by task_id).

    ``skip_unsupported`` drops tasks on sites that are not served locally (WebArena's shopping,
    map, wikipedia, ...) instead of raising :class:`TaskFormatError`.
    """
    path = Path(path)
    if path.is_dir():
        raw = [json.loads(p.read_text()) for p in sorted(path.glob("*.json"))]
    else:
        text = path.read_text()
        try:
            data = json.loads(text)
            raw = data if isinstance(data, list) else [data]
        except json.JSONDecodeError:
            raw = [json.loads(line) for line in text.splitlines() if line.strip()]
    tasks = []
    for t in raw:
        if skip_unsupported and any(s not in SITE_ALIASES for s in t.get("sites") or []):
            continue
        tasks.append(check_task(t))
    return sorted(tasks, key=lambda t: t["task_id"])


def save_tasks(tasks: list[dict[str, Any]], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(tasks, indent=1))
    return path


def fill_placeholders(obj: Any, origins: dict[str, str] | None = None) -> Any:
    """Replace site placeholders in every string of ``obj`` by the sites' origins (default: virtual ones)."""
    origins = origins or {name: spec.origin for name, spec in SITES.items()}
    if isinstance(obj, str):
        for name, spec in SITES.items():
            for ph in spec.placeholders:
                obj = obj.replace(ph, origins[name])
        return obj
    if isinstance(obj, list):
        return [fill_placeholders(x, origins) for x in obj]
    if isinstance(obj, dict):
        return {k: fill_placeholders(v, origins) for k, v in obj.items()}
    return obj


def site_for(url_or_placeholder: str) -> str | None:
    """The site a URL (virtual origin) or placeholder belongs to."""
    for name, spec in SITES.items():
        if url_or_placeholder.startswith(spec.placeholders) or url_or_placeholder.startswith(spec.origin):
            return name
    return None

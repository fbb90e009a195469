"""Fixtures for the web/gui tests: a folder of hostile task pages next to the wheel's ``core``."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from turngym.envs.web.tasks import html_dir

PAGES = Path(__file__).parent / "pages"


@pytest.fixture(scope="session")
def hostile_html(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An ``html`` folder whose ``miniwob/`` holds the test pages and whose ``core/`` is the wheel's."""
    root = tmp_path_factory.mktemp("html")
    (root / "core").symlink_to(html_dir() / "core")
    (root / "miniwob").mkdir()
    for page in PAGES.glob("*.html"):
        shutil.copy(page, root / "miniwob" / page.name)
    return root

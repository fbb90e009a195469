"""Fixtures of the web-sites tests: a small catalog and site data in a temporary cache."""

from __future__ import annotations

import pytest

from turngym.envs.webshop.catalog import Catalog, build_catalog


@pytest.fixture(scope="session")
def small_catalog(tmp_path_factory) -> Catalog:
    return Catalog(build_catalog(seed=3, n=1500, directory=tmp_path_factory.mktemp("catalog")))


@pytest.fixture(scope="session")
def site_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("sites")

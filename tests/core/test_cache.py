"""One cache root for every family: ``turngym.core.cache.cache_root`` and who uses it."""

from pathlib import Path

import pytest

from turngym.core.cache import cache_root


@pytest.fixture
def clean_env(monkeypatch):
    for var in ("TURNGYM_CACHE_DIR", "TURNGYM_CACHE", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def test_precedence_argument_then_new_name_then_old_name_then_xdg_then_home(clean_env, tmp_path):
    home = Path.home() / ".cache" / "turngym"
    assert cache_root() == home
    clean_env.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "turngym"
    clean_env.setenv("TURNGYM_CACHE", str(tmp_path / "old"))
    assert cache_root() == tmp_path / "old"
    clean_env.setenv("TURNGYM_CACHE_DIR", str(tmp_path / "new"))
    assert cache_root() == tmp_path / "new"
    assert cache_root(tmp_path / "given") == tmp_path / "given"
    assert cache_root("~/x") == Path.home() / "x"


def test_an_empty_variable_counts_as_unset(clean_env, tmp_path):
    clean_env.setenv("TURNGYM_CACHE_DIR", "")
    clean_env.setenv("TURNGYM_CACHE", str(tmp_path / "old"))
    assert cache_root() == tmp_path / "old"


def test_every_family_builds_under_the_same_root(clean_env, tmp_path):
    """Models, search, travel, the sites and swe sdists all follow one variable (they used to read
    two different ones, so a user's ``TURNGYM_CACHE_DIR`` moved only half of the cache)."""
    from turngym.agents import pretrained
    from turngym.envs.swe import packages
    from turngym.envs.travel.database import database_dir

    clean_env.setenv("TURNGYM_CACHE_DIR", str(tmp_path))
    assert pretrained.cache_root() == tmp_path / "models"
    assert packages.cache_dir() == tmp_path
    assert database_dir(0, None, 31).parent == tmp_path / "travel"
    clean_env.setenv("TURNGYM_CACHE_DIR", str(tmp_path / "other"))
    assert database_dir(0, None, 31).parent == tmp_path / "other" / "travel"


def test_the_tiny_model_and_the_shop_catalog_land_under_the_root(clean_env, tmp_path):
    from turngym.agents.tiny import TinyConfig, tiny_model_path
    from turngym.envs.webshop.catalog import build_catalog

    clean_env.setenv("TURNGYM_CACHE_DIR", str(tmp_path))
    cfg = TinyConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2)
    assert tiny_model_path(cfg).parent == tmp_path / "tiny"
    path = build_catalog(seed=5, n=20)
    assert Path(path).parent == tmp_path / "webshop"

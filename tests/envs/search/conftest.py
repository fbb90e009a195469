"""Fixtures for the search-qa tests: an isolated cache directory and a small generated world."""

from __future__ import annotations

import os

import pytest

from turngym.envs.search.questions import generate_questions
from turngym.envs.search.retriever import BM25Retriever
from turngym.envs.search.world import World, WorldConfig


@pytest.fixture(scope="module", autouse=True)
def search_cache(tmp_path_factory):
    """Each search test module writes its worlds and indexes to a fresh cache, never ~/.cache.

    Module scope (not session): the variable is restored before other areas' tests run.
    """
    path = tmp_path_factory.mktemp("turngym-cache")
    old = os.environ.get("TURNGYM_CACHE_DIR")
    os.environ["TURNGYM_CACHE_DIR"] = str(path)
    yield path
    if old is None:
        os.environ.pop("TURNGYM_CACHE_DIR", None)
    else:
        os.environ["TURNGYM_CACHE_DIR"] = old


@pytest.fixture(scope="session")
def world() -> World:
    return World.generate(WorldConfig(seed=3, n_passages=3000))


@pytest.fixture(scope="session")
def questions(world):
    return generate_questions(world, 300, seed=1)


@pytest.fixture(scope="session")
def retriever(world) -> BM25Retriever:
    return BM25Retriever(world.corpus, use_cache=False)

"""Fixtures: tiny models (built once, cached on disk), their tokenizers, an HF backend."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_dir():
    from turngym.agents.tiny import tiny_model_path

    return tiny_model_path()


@pytest.fixture(scope="session")
def tokenizer(tiny_dir):
    from turngym.agents.models import load_tokenizer

    return load_tokenizer(tiny_dir)


@pytest.fixture(scope="session")
def thinking_tokenizer():
    from turngym.agents.models import load_tokenizer

    return load_tokenizer("tiny:thinking")


@pytest.fixture(scope="session")
def strip_tokenizer():
    from turngym.agents.models import load_tokenizer

    return load_tokenizer("tiny:thinking_strip")


@pytest.fixture(scope="module")
def hf_backend(tiny_dir, tokenizer):
    from turngym.agents.hf import HFBackend

    return HFBackend(tiny_dir, tokenizer, max_batch_size=16, max_wait_ms=20)

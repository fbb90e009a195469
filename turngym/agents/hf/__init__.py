"""The in-process HF engines, cut the way a serving engine is cut:

* ``engine``: ``HFBackend``, the front end (requests in, results out) and the busy loop that runs
  one scheduler iteration after another; ``slots``: ``HFSlotBackend``, the same front end composed
  with the slots engine's parts;
* ``scheduler``: admit, plan, park, retire (``continuous``, ``slots``, with ``sharing`` for forks);
  it emits plain step plans (``plan``) that its runner carries out;
* ``kv``: the KV managers (``padded``: one growing left-padded cache; ``slots``: fixed row slots);
* ``runner``: inputs, forward, CUDA graphs and compile (``eager``, ``slots``, ``graphs``,
  ``prefill_graphs``, ``attention``);
* ``sampling``: per-request settings and seeds, raw logprobs; ``kernels``: the fast forward and its
  Triton kernels;
* ``worker``: ``HFProcessBackend``, an engine in a worker process with its own GIL;
* ``registry``: engines by name (``continuous``, ``slots``, ``auto``) and ``make_hf_backend``.

Design notes and measurements: docs/engines.md.
"""

from turngym.agents.hf.engine import HFBackend
from turngym.agents.hf.registry import (
    COMPILE_SETTINGS,
    ENGINE_CHOICES,
    HF_ENGINES,
    compile_setting,
    hf_backend_class,
    make_hf_backend,
    register_hf_engine,
    resolve_hf_engine,
)
from turngym.agents.hf.slots import EngineAsleep, HFSlotBackend, KVSlotsTooLarge
from turngym.agents.hf.worker import HFProcessBackend

__all__ = [
    "COMPILE_SETTINGS",
    "EngineAsleep",
    "ENGINE_CHOICES",
    "HF_ENGINES",
    "HFBackend",
    "HFProcessBackend",
    "HFSlotBackend",
    "KVSlotsTooLarge",
    "compile_setting",
    "hf_backend_class",
    "make_hf_backend",
    "register_hf_engine",
    "resolve_hf_engine",
]

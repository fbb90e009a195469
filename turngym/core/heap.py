"""Keeping CPython's cyclic garbage collector off a process's long-lived heap (``freeze_heap``).

A process that has imported torch and transformers and loaded a model tracks some 400k objects, and
a full (generation 2) collection scans every one: 215 ms with SmolLM2-135M loaded on the CPU machine.
A rollout allocates enough small objects (messages, records, futures) to set one off every few
runs, and while it runs nothing else does: on the GPU hosts such pauses (270-315 ms) stalled every
trajectory on the rollout engine's event loop, and in the HF worker process they stall the GPU's
scheduler (benchmarks/gpu_results.md, issue 19, session 15). ``gc.freeze()`` moves the objects alive
now into a permanent generation the collector no longer scans (CPython's advice for servers that
load once and then serve; inference servers do the same after their startup): with the model's heap
frozen the full collections of the same runs took 7-16 ms.

The cost: cycles among frozen objects are never collected (objects that die without a cycle are
still freed at once by reference counting). Freezing once, after the libraries and the model are
loaded and a collection has run, keeps that to what was alive at that point.
"""

from __future__ import annotations

import gc
import threading

_lock = threading.Lock()
_frozen = False


def freeze_heap() -> bool:
    """Once per process: collect, then freeze every object alive now (``gc.freeze``), so later full
    collections scan only what was made after. True when this call froze; later calls do nothing
    (``gc.unfreeze()`` undoes it)."""
    global _frozen
    with _lock:
        if _frozen:
            return False
        gc.collect()
        gc.freeze()
        _frozen = True
        return True

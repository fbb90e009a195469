"""``HFSlotBackend``: the HF engine on a static KV cache of fixed row slots, its decode steps
replayed as CUDA graphs.

    backend = HFSlotBackend("smollm2-135m", device="cuda", max_batch_size=64, max_context=4096)

The front end and busy loop are ``HFBackend``'s (continuous batching, per-request settings, prefix
reuse per route, forks, cancellation, ``update_weights`` between steps, the trace, the stats and the
ledger's times); what differs is composed: the KV manager (``kv.slots``: one static buffer per layer,
a slot per request), the scheduler (``scheduler.slots``: slots, prefill passes, decode blocks) and the
runner (``runner.slots``: static inputs, the fast forward ``kernels.fast``, sampling inside the step,
CUDA graphs of decode blocks and of prefill passes, an optional ``torch.compile`` of the step).

* **Limits**: a prompt longer than ``max_context`` fails with ``BackendError``; a generation that
  reaches ``max_context`` ends with ``finish_reason="length"``. Full-attention decoders only (Llama,
  Qwen2, SmolLM2, ...): sliding-window, soft-capped or recurrent attention raises at construction.
  The slots take ``max_batch_size x (max_context + 1)`` tokens of KV up front (``kv_bytes``); more
  than half the device's free memory raises ``KVSlotsTooLarge`` (``make_hf_backend`` with engine
  ``auto`` then uses the continuous engine).
* **Fallbacks**: on CPU, or with ``cuda_graphs=False``, decode steps run the same code eagerly; a
  capture or compile that fails turns graphs or compiling off with a warning and a stats counter.
* It runs in a worker process too (``HFProcessBackend(..., engine="slots")``).
* **Sleep** (``sleep(level)``/``wake()``, scheduler stopped): ``"kv"`` gives the KV slots back and
  keeps the graphs, which ``wake()`` keeps only if the slots come back at the address they read
  (else they are captured again on use); ``"kv+graphs"`` also gives back the graphs and their pool.
  A request while asleep raises ``EngineAsleep``. Measurements: docs/scaling.md.

``stats`` adds ``graph_captures``, ``graph_replays``, ``eager_decodes``, ``graph_fallbacks``,
``capture_s``, ``compiles``, ``compile_s``, ``compile_fallbacks``, ``decode_blocks``,
``block_steps_unused``, ``sleeps``/``wakes`` (``_s``, ``wake_graphs_kept``/``_dropped``) and the prefill
graphs' counters to ``HFBackend``'s. Design notes and measurements: docs/engines.md.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from turngym.agents.backend import BackendError, SamplingParams
from turngym.agents.hf.engine import HFBackend
from turngym.agents.hf.kernels import fast as fast_forward
from turngym.agents.hf.kv.slots import SlotKV, free_device_bytes
from turngym.agents.hf.registry import compile_setting
from turngym.agents.hf.request import Request, release_cuda_cache
from turngym.agents.hf.runner.slots import SlotRunner
from turngym.agents.hf.scheduler.slots import SlotScheduler

KV_SHARE = 0.5  # the KV slots may take at most this share of the device's free memory
#: what ``HFSlotBackend.sleep`` gives back: the KV slots, or the slots and the captured graphs
SLEEP_LEVELS = ("kv", "kv+graphs")


class KVSlotsTooLarge(ValueError):
    """The KV slots would not fit the device (``make_hf_backend`` with ``auto`` falls back)."""


class EngineAsleep(BackendError):
    """A request to an engine whose KV slots were given back (``sleep``): ``wake()`` it first."""


class HFSlotBackend(HFBackend):
    """``HFBackend`` on fixed KV slots with CUDA-graph decode steps (see the module doc).

    ``max_context``: cache columns per slot (default: the model's limit, at most 4096);
    ``cuda_graphs``: capture decode steps (default: on CUDA); ``compile``: fuse the decode step with
    ``torch.compile`` (a name in ``COMPILE_SETTINGS``, ``True`` for ``default``; default off);
    ``prefill_tokens``: rows x longest feed per prefill pass; ``overlap_prefill``: queue the decode
    block behind a prefill pass without reading its first tokens first; ``decode_block``: steps a
    replay runs; ``prefill_graph_tokens``: the largest prefill pass captured (0: none); ``fast``:
    turngym's own forward (``kernels.fast``; None: where the model allows it); ``kernels``: that
    forward's attention, rotary and SwiGLU as Triton kernels (``"triton"``) or torch ops
    (``"torch"``); None: Triton on CUDA where it is installed. Other arguments as ``HFBackend``
    (``fuse_tokens`` and ``cudnn_attention`` do not apply)."""

    sized_context = True  # ``make_hf_backend`` passes ``max_context`` on
    compiles = True  # ... and ``compile``

    def __init__(
        self,
        model: str | Path | Any,
        tokenizer: Any = None,
        *,
        max_context: int | None = None,
        cuda_graphs: bool | None = None,
        compile: bool | str | None = None,
        prefill_tokens: int = 16384,
        fast: bool | None = None,
        decode_block: int = 8,
        prefill_graph_tokens: int = 16384,
        kernels: str | None = None,
        overlap_prefill: bool = True,
        **kwargs: Any,
    ):
        setting = compile_setting(compile)  # a bad name fails before the model loads
        if kernels is not None and kernels not in fast_forward.KERNELS:
            raise ValueError(
                f"kernels must be one of {', '.join(fast_forward.KERNELS)} or None, got {kernels!r}"
            )
        super().__init__(model, tokenizer, **kwargs)
        config = self.model.config
        problem = attention_problem(config)
        if problem:
            raise self._refusal(
                ValueError(f"HFSlotBackend needs a full-attention decoder: {problem}; use HFBackend")
            )
        limit = getattr(config, "max_position_embeddings", None) or 4096
        max_context = int(max_context or min(limit, 4096))
        if not 1 <= max_context <= limit:
            raise ValueError(f"max_context must be in [1, {limit}] (the model's limit), got {max_context}")
        if prefill_tokens < 1:
            raise ValueError(f"prefill_tokens must be >= 1, got {prefill_tokens}")
        if decode_block < 1 or decode_block & (decode_block - 1):
            raise ValueError(f"decode_block must be a power of two >= 1, got {decode_block}")
        on_cuda = self.device.type == "cuda"
        if cuda_graphs and not on_cuda:
            raise ValueError("cuda_graphs needs the model on a CUDA device")
        self.decode_block, self.max_context, self.prefill_tokens = decode_block, max_context, prefill_tokens
        self.overlap_prefill = bool(overlap_prefill)
        kv = SlotKV(self.model, self.max_batch_size, max_context, self.device)
        self.kv_bytes = kv.bytes
        free = free_device_bytes(self.device)
        if free is not None and self.kv_bytes > KV_SHARE * free:
            raise self._refusal(
                KVSlotsTooLarge(
                    f"the KV slots ({self.max_batch_size} x {max_context} tokens) take "
                    f"{self.kv_bytes / 2**30:.1f} GiB, over {KV_SHARE:.0%} of the device's free "
                    f"{free / 2**30:.1f} GiB: lower max_batch_size or max_context, or use the continuous engine"
                )
            )
        # the pass: turngym's own few-kernel forward where the model allows it (``kernels.fast``)
        self.fast_problem = fast_forward.problem(self.model) if fast is not False else "fast=False"
        if fast and self.fast_problem:
            raise self._refusal(
                ValueError(f"fast=True, but the fast forward cannot run this model: {self.fast_problem}")
            )
        forward = (
            None
            if self.fast_problem
            else fast_forward.FastForward(self.model, max_context + 1, kernels=kernels)
        )
        self.stats.update(
            graph_captures=0,
            graph_replays=0,
            eager_decodes=0,
            graph_fallbacks=0,
            capture_s=0.0,
            compiles=0,
            compile_s=0.0,
            compile_fallbacks=0,
            decode_blocks=0,
            block_steps_unused=0,
            sleeps=0,
            sleep_s=0.0,
            wakes=0,
            wake_s=0.0,
            wake_graphs_kept=0,
            wake_graphs_dropped=0,
        )
        self.asleep: str | None = None  # the level of the last ``sleep()`` until ``wake()``
        self._slept_at: int | None = None  # the slots' address when a "kv" sleep kept the graphs
        self.kv = kv
        self.runner = SlotRunner(
            self,
            kv,
            forward,
            decode_block=decode_block,
            cuda_graphs=on_cuda if cuda_graphs is None else bool(cuda_graphs),
            compile=setting,
            prefill_graph_tokens=prefill_graph_tokens,
        )
        self.scheduler = SlotScheduler(
            self, kv, self.runner, prefill_tokens=prefill_tokens, overlap_prefill=self.overlap_prefill
        )

    # ------------------------------------------------------------- settings that can fall back
    @property
    def cuda_graphs(self) -> bool:
        """Whether decode blocks are captured (off after a failed capture)."""
        return self.runner.graphs.enabled

    @property
    def compile(self) -> str | None:
        """The decode step's compile setting (None: off, or after a failed compile)."""
        return self.runner.graphs.compile

    @property
    def prefill_graph_tokens(self) -> int:
        """The largest prefill pass captured (0: none, or after a failed capture)."""
        return self.runner.prefill_graphs.tokens

    # ------------------------------------------------------------- front end
    def update_weights(self, state_dict: dict[str, Any], strict: bool = True) -> None:
        """``HFBackend.update_weights``; forks waiting for their first request forget their donors
        (the donors' KV came from the old weights)."""
        super().update_weights(state_dict, strict)
        self.scheduler.sharing.forget()

    def release(self, route: str) -> None:
        """``HFBackend.release``; forks of ``route`` that have not started yet will prefill in full."""
        super().release(route)
        self.scheduler.sharing.forget(route)

    def reset_prefix_cache(self) -> None:
        """Also rebuild the fast forward's concatenated weights at the next pass (for in-place
        changes that bypass the parameters' version counters, e.g. through ``.data``)."""
        super().reset_prefix_cache()
        self.scheduler.sharing.forget()
        if self.runner.fast is not None:
            self.runner.fast.invalidate()

    def precapture(self, context: int | None = None, filtered: tuple[bool, ...] = (False,)) -> int:
        """Capture now the decode graphs of every width and context bucket up to ``context``
        (``runner.graphs.DecodeGraphs.precapture``); how many it captured (0 without CUDA graphs)."""
        self._check_awake()
        return self.runner.graphs.precapture(context, filtered)

    def sleep(self, level: str = "kv+graphs") -> int:
        """Give the KV slots (``"kv"``), or the slots and the captured graphs with their memory pool
        (``"kv+graphs"``), back to the device until ``wake()``; parked rows are gone with them.
        Only while the scheduler is stopped (after ``aclose``). Sleeping again is harmless (a deeper
        level gives the graphs back too). Returns the KV bytes given back now."""
        if level not in SLEEP_LEVELS:
            raise ValueError(f"sleep level must be one of {', '.join(SLEEP_LEVELS)}, got {level!r}")
        self._check_stopped("sleep()")
        if self.asleep == "kv+graphs" or self.asleep == level:
            return 0
        t0 = time.perf_counter()
        freed = 0
        if self.asleep is None:
            self._slept_at = self.kv.address
            freed = self.kv.release()
        if level == "kv+graphs":
            self.runner.free()  # also the static inputs and the graphs (and so their pool)
        self.scheduler.sharing.forget()
        self.asleep = level
        release_cuda_cache()
        self.stats["sleeps"] += 1
        self.stats["sleep_s"] += time.perf_counter() - t0
        return freed

    def wake(self) -> None:
        """Take the KV slots back (zeroed) after ``sleep()``; the graphs a ``"kv"`` sleep kept are kept
        only if the slots came back at the address they read (else dropped, captured again on use).
        Waking an awake engine is harmless."""
        if self.asleep is None:
            return
        t0 = time.perf_counter()
        runner = self.runner
        kept = self.asleep == "kv" and bool(runner.graphs.graphs or runner.prefill_graphs.graphs)
        if kept:  # the update's cached blocks back to the device first: the old address may be free again
            release_cuda_cache()
        runner.inputs()
        if kept:
            if self.kv.address == self._slept_at:
                self.stats["wake_graphs_kept"] += 1
            else:
                runner.graphs.clear()
                runner.prefill_graphs.clear()
                self.stats["wake_graphs_dropped"] += 1
        self.asleep, self._slept_at = None, None
        self.stats["wakes"] += 1
        self.stats["wake_s"] += time.perf_counter() - t0

    def _check_stopped(self, what: str) -> None:
        if self._thread is not None and self._thread.is_alive():
            raise RuntimeError(f"{what} while the backend is serving: aclose() it first")

    def _check_awake(self) -> None:
        if self.asleep is not None:
            raise EngineAsleep(
                f"the slots engine is asleep (sleep({self.asleep!r}) gave its KV slots back): wake() it "
                "before generating"
            )

    def free_buffers(self) -> None:
        """Give the KV slots and the captured graphs back to the device (the trainer calls this
        after each rollout, so its update has the room); the next pass makes them again. Only while
        the scheduler is stopped (after ``aclose``, which also ends every parked row)."""
        self._check_stopped("free_buffers()")
        self.runner.free()
        release_cuda_cache()

    def _refusal(self, e: ValueError) -> ValueError:
        """``e`` carrying the loaded model and tokenizer, so a fallback need not load them again."""
        e.model, e.tokenizer = self.model, self.tokenizer  # type: ignore[attr-defined]
        return e

    def _request(
        self, prompt_ids: list[int], sampling: SamplingParams, done: Any, gave_up: Any = lambda: False
    ) -> Request:
        self._check_awake()
        if len(prompt_ids) > self.max_context:
            raise BackendError(
                f"a prompt of {len(prompt_ids)} tokens does not fit the backend's context of {self.max_context}"
            )
        return super()._request(prompt_ids, sampling, done, gave_up)


def attention_problem(config: Any) -> str | None:
    """Why a model's attention cannot run on the slots (None: it can)."""
    kinds = set(getattr(config, "layer_types", None) or [])
    if kinds - {"full_attention"}:
        return f"its layers include {sorted(kinds - {'full_attention'})}"
    if getattr(config, "use_sliding_window", False) and getattr(config, "sliding_window", None):
        return "it uses sliding-window attention"
    if getattr(config, "attn_logit_softcapping", None):
        return "it soft-caps attention logits"
    if not hasattr(config, "num_hidden_layers") or not hasattr(config, "num_attention_heads"):
        return "its config has no num_hidden_layers/num_attention_heads"
    return None

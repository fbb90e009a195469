"""The HF engines' runners: inputs, forward, CUDA graphs, compile (``eager`` for the continuous engine; ``slots``, ``graphs``, ``prefill_graphs``, ``attention`` for the slots engine)."""

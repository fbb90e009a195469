"""The HF engines' KV managers: ``padded`` (the continuous engine's growing left-padded cache) and ``slots`` (fixed row slots)."""

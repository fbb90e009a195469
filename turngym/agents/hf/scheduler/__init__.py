"""The HF engines' schedulers: admit, plan, park, retire (``continuous``; ``slots`` with ``sharing`` for forks)."""

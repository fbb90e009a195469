"""Trainer adapters: turngym envs driven by other RL libraries (trainer layer).

* :mod:`turngym.interop.trl`: TRL's ``GRPOTrainer`` through its ``environment_factory`` hook (turngym
  tools as TRL tools, the episode's return as the environment-owned reward, reward components as
  reward functions, a prompt dataset built from env seeds); ``grpo_trainer(env_id, model, ...)``.
* :mod:`turngym.interop.verifiers`: a turngym env as a ``verifiers`` (v1) taskset and environment that
  steps the turngym env as the model's user; ``load_environment(env_id=...)``.

The submodules import their library only when imported (``pip install 'turngym[interop]'``); nothing
in turngym imports this package except the CLI.
"""

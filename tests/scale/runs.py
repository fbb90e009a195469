"""The tiny training run the scale tests launch under torchrun (arith, two tasks of two samples, a
two-step warm start, two RL steps): its config overrides, shared by the DDP and FSDP tests."""

TINY_ARITH_RUN = [
    "rollout.env=arith",
    "rollout.env_kwargs={depth: 1, max_turns: 2}",
    "rollout.tasks_per_step=2",
    "rollout.group_size=2",
    "rollout.max_tokens=8",
    "sft.steps=2",
    "sft.tasks=4",
    "steps=2",
    "log.progress=false",
    "log.tensorboard=false",
]

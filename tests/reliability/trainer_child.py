"""A trainer process that SIGKILLs itself at a chosen point (run by test_trainer_durability).

    python -m tests.reliability.trainer_child RUN_DIR STEPS [--kill-in-update N | --kill-in-checkpoint N]

``--kill-in-update N``: SIGKILL inside the PPO update of step N (after rollout and credit).
``--kill-in-checkpoint N``: SIGKILL while step N's checkpoint is being written (after its first file).
Prints the train summary as JSON when it is not killed.
"""

from __future__ import annotations

import argparse
import json
import os
import signal

#: The tiny CPU configuration of the trainer's own tests (arith, 2 tasks x 2 samples, 12 new tokens).
OVERRIDES = [
    "rollout.env=arith",
    "rollout.env_kwargs={depth: 1, max_turns: 2}",
    "rollout.tasks_per_step=2",
    "rollout.group_size=2",
    "rollout.max_tokens=12",
    "optim.lr=1e-3",
    "log.progress=false",
    "checkpoint_every=1",
    "keep_checkpoints=2",
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("run_dir")
    ap.add_argument("steps", type=int)
    ap.add_argument("--kill-in-update", type=int)
    ap.add_argument("--kill-in-checkpoint", type=int)
    a = ap.parse_args()

    import torch

    from turngym.trainer.config import load_config
    from turngym.trainer.loop import Trainer

    trainer = Trainer(load_config(None, [f"run_dir={a.run_dir}", f"steps={a.steps}", *OVERRIDES]))
    die = lambda: os.kill(os.getpid(), signal.SIGKILL)  # noqa: E731

    if a.kill_in_update is not None:
        import turngym.trainer.update as update_module

        update = update_module.policy_update

        def killing_update(*args, **kwargs):
            if trainer.step + 1 == a.kill_in_update:  # the step is counted after the update
                die()
            return update(*args, **kwargs)

        update_module.policy_update = killing_update
    if a.kill_in_checkpoint is not None:
        save, calls = torch.save, [0]

        def killing_save(obj, f, *args, **kwargs):
            save(obj, f, *args, **kwargs)
            if trainer.step == a.kill_in_checkpoint and "checkpoints" in str(f):
                calls[0] += 1
                if calls[0] == 1:  # trainable.pt is on disk, optimizer.pt and state.json are not
                    die()

        torch.save = killing_save
    print(json.dumps(trainer.train()))


if __name__ == "__main__":
    main()

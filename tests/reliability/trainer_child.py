"""A trainer process that SIGKILLs itself at a chosen point (run by test_trainer_durability).

    python -m tests.reliability.trainer_child RUN_DIR STEPS [--kill-in-update N | --kill-in-checkpoint N]
        [--fill-disk-after N] [--config FILE] [--set KEY=VALUE ...]

``--kill-in-update N``: SIGKILL inside the PPO update of step N (after rollout and credit).
``--kill-in-checkpoint N``: SIGKILL while step N's checkpoint is being written (after its first file).
``--fill-disk-after N``: once step N's checkpoint is written, fill the run directory's filesystem with
``RUN_DIR/../filler`` (a real ENOSPC: run it on a small tmpfs), leaving room for a ``trainable.pt``
and 256 KiB more (the next step's metrics and trajectories) but not for an ``optimizer.pt``.
``--config FILE``: that config (e.g. a shipped example) instead of the tiny built-in one.
Prints the train summary as JSON when it is not killed.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import signal
from pathlib import Path

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
    ap.add_argument("--fill-disk-after", type=int)
    ap.add_argument("--config")
    ap.add_argument("--set", action="append", default=[])
    a = ap.parse_args()

    import torch

    from turngym.trainer.config import load_config
    from turngym.trainer.loop import Trainer

    overrides = ["log.progress=false"] if a.config else OVERRIDES
    trainer = Trainer(load_config(a.config, [f"run_dir={a.run_dir}", f"steps={a.steps}", *overrides, *a.set]))
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
    if a.fill_disk_after is not None:
        trainer.setup()  # the run state (which saves checkpoints) exists from here on
        save_checkpoint = trainer.run.save

        def filling_save():
            path = save_checkpoint()
            if trainer.step == a.fill_disk_after:
                fill_disk(Path(a.run_dir).parent / "filler", (path / "trainable.pt").stat().st_size + 2**18)
            return path

        trainer.run.save = filling_save
    print(json.dumps(trainer.train()))


def fill_disk(path: Path, leave: int) -> None:
    """Write ``path`` until the filesystem is full, then give back ``leave`` bytes of it."""
    block = b"\0" * 2**16
    with open(path, "wb", buffering=0) as f:
        try:
            while f.write(block):
                pass
        except OSError as e:
            if e.errno != errno.ENOSPC:
                raise
        f.truncate(max(f.tell() - leave, 0))


if __name__ == "__main__":
    main()

"""Faults between ranks, under torchrun with 2 processes (gloo on CPU).

    torchrun --standalone --nproc-per-node 2 tests/scale/dist_faults.py mismatch OUT
    torchrun --standalone --nproc-per-node 2 tests/scale/dist_faults.py stuck OUT
    torchrun --standalone --nproc-per-node 2 tests/scale/dist_faults.py killed OUT

``mismatch``: each rank builds a Trainer whose config differs by its ``seed`` (rank-dependent); setup
must refuse. Each rank writes ``OUT/rank-R.txt`` with the error it got (or ``started``).

``stuck``: ``Trainer.setup`` with ``cluster.timeout_s=2``; rank 1 then stops answering (sleeps far
longer than the timeout) while rank 0 enters a collective: rank 0 writes ``OUT/rank-0.txt`` with
the error its collective raised instead of waiting forever, and exits non-zero (torchrun then ends
rank 1).

``killed``: as ``stuck``, but rank 1 is killed (SIGKILL) instead: the job ends with an error.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from turngym.trainer.config import load_config
from turngym.trainer.loop import Trainer


def main() -> None:
    mode, out = sys.argv[1], Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    rank = int(os.environ["RANK"])
    base = [f"run_dir={out / 'run'}", "model.path=tiny", "log.tensorboard=false", "cluster.timeout_s=2"]
    if mode == "mismatch":
        trainer = Trainer(load_config(None, [*base, f"seed={rank}"]))
        try:
            trainer.setup()
        except Exception as e:  # noqa: BLE001 - the refusal is what this mode records
            (out / f"rank-{rank}.txt").write_text(f"{type(e).__name__}: {e}")
            raise SystemExit(3) from None
        (out / f"rank-{rank}.txt").write_text("started")
        return
    trainer = Trainer(load_config(None, base))
    trainer.setup()
    if rank == 1 and mode == "killed":
        os.kill(os.getpid(), signal.SIGKILL)
    if rank == 1:
        time.sleep(120)  # a rank that stopped answering (torchrun ends it when rank 0 fails)
        return
    try:
        trainer.dist.all_sum([1.0])
    except Exception as e:  # noqa: BLE001 - the collective's failure is what this mode records
        (out / "rank-0.txt").write_text(f"{type(e).__name__}: {e}")
        raise SystemExit(4) from None
    (out / "rank-0.txt").write_text("no error")


if __name__ == "__main__":
    main()

"""The learner's process entry point under torchrun (one process per rank):

    torchrun --standalone --nproc-per-node 2 -m turngym.trainer.torchrun_entry config.yaml key=value ...

``turngym train --nproc N`` runs exactly this. It sits above both ``turngym.trainer.loop`` and
``turngym.trainer.distributed`` (which the loop uses), so neither imports the other back;
``-m turngym.trainer.distributed`` still works and runs this module.
"""

from __future__ import annotations

import sys

from turngym.trainer.config import load_config
from turngym.trainer.loop import Trainer


def main(argv: list[str] | None = None) -> None:
    """Train from ``[CONFIG] [key=value ...]`` (``sys.argv[1:]`` by default); rank 0 prints the summary."""
    args = list(sys.argv[1:] if argv is None else argv)
    config = args.pop(0) if args and "=" not in args[0] else None
    trainer = Trainer(load_config(config, args))
    summary = trainer.train()
    if trainer.dist.is_main:
        print(f"done at step {summary['step']}: {summary['run_dir']}")
    if trainer.dist.enabled:
        import torch.distributed as dist

        dist.destroy_process_group()


if __name__ == "__main__":
    main()

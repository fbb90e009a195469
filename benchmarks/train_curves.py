"""Learning curves of credit methods on search-qa: one shared SFT warm start, then one RL run per
(method, seed), all as parallel processes on one device; prints steps-to-target and final F1.

    python benchmarks/train_curves.py --out runs/curves --methods grpo igpo --seeds 0 1 2 --steps 20

The model is a tiny random-init Qwen2 (``--hidden``/``--layers``) built in place; eval is greedy F1 on
the env's test split. Keep ``--sft-tasks`` well below the number of training tasks: a warm start on
(nearly) all of them lets the model memorise their answers, and RL then measures recall, not search. Writes ``OUT/summary.json`` (curves and numbers) and, with matplotlib,
``OUT/curves.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ENV_KWARGS = {
    "n_passages": 10000,
    "n_tasks": 4000,
    "hops": [2],
    "reward": "f1",
    "max_turns": 5,
    "split": "train",
}


def build_model(hidden: int, layers: int) -> str:
    from turngym.agents.tiny import TinyConfig, tiny_model_path

    heads = hidden // 64
    cfg = TinyConfig(
        hidden_size=hidden,
        intermediate_size=3 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=max(heads // 2, 1),
    )
    return str(tiny_model_path(cfg))


def warm_start(model: str, out: Path, steps: int, tasks: int, lr: float) -> tuple[str, dict]:
    from turngym.agents.models import load_model, load_tokenizer
    from turngym.trainer.sft import expert_sequences, sft_train

    tok = load_tokenizer(model)
    m = load_model(model, dtype="float32")
    t0 = time.time()
    seqs = expert_sequences("search-qa", tok, range(2_000_000, 2_000_000 + tasks), ENV_KWARGS)
    losses = sft_train(m, seqs, steps=steps, batch_size=16, lr=lr)
    path = out / "sft"
    m.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path), {
        "sequences": len(seqs),
        "loss_first": losses[0],
        "loss_last": losses[-1],
        "seconds": time.time() - t0,
    }


def child(args: argparse.Namespace) -> None:
    from turngym.trainer.config import load_config
    from turngym.trainer.loop import Trainer

    overrides = [
        f"run_dir={args.run_dir}",
        f"seed={args.seed}",
        f"steps={args.steps}",
        f"model.path={args.model}",
        "model.dtype=float32",
        f"credit.method={args.method}",
        "rollout.env=search-qa",
        f"rollout.env_kwargs={json.dumps(ENV_KWARGS)}",
        f"rollout.eval_env_kwargs={json.dumps({'split': 'test'})}",
        f"rollout.tasks_per_step={args.tasks}",
        f"rollout.group_size={args.group}",
        "rollout.max_tokens=64",
        "rollout.max_context=2048",
        "rollout.max_batch_size=256",
        f"rollout.eval_tasks={args.eval_tasks}",
        f"rollout.eval_every={args.eval_every}",
        f"rollout.task_seed_offset={args.seed * 100_000}",
        f"optim.lr={args.lr}",
        "optim.micro_batch_tokens=16384",  # padded eager attention: keep six processes within one GPU
        "credit.igpo.batch_tokens=16384",
        "log.tensorboard=false",
        "log.save_trajectories=false",
        "log.progress=false",
    ]
    Trainer(load_config(None, overrides)).train()


def curve(run_dir: Path) -> list[dict]:
    lines = (
        (run_dir / "metrics.jsonl").read_text().splitlines() if (run_dir / "metrics.jsonl").exists() else []
    )
    return [json.loads(x) for x in lines]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="runs/curves")
    ap.add_argument("--methods", nargs="+", default=["grpo", "igpo"])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--tasks", type=int, default=16)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--eval-tasks", type=int, default=64)
    ap.add_argument("--eval-every", type=int, default=4)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--sft-steps", type=int, default=600)
    ap.add_argument("--sft-tasks", type=int, default=512)
    ap.add_argument("--sft-lr", type=float, default=1e-3)
    ap.add_argument("--hidden", type=int, default=384)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--target", type=float, default=None, help="target eval F1 (default: SFT F1 + 0.05)")
    ap.add_argument("--deadline-s", type=float, default=1e9, help="stop the RL runs after this many seconds")
    ap.add_argument("--stagger-s", type=float, default=3.0)
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--run-dir")
    ap.add_argument("--model")
    ap.add_argument("--method")
    ap.add_argument("--seed", type=int)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    import torch

    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    model, sft = warm_start(
        build_model(args.hidden, args.layers), out, args.sft_steps, args.sft_tasks, args.sft_lr
    )
    print(f"device {device}; SFT {sft}", flush=True)
    procs = {}
    for method in args.methods:
        for seed in args.seeds:
            run_dir = out / f"{method}-s{seed}"
            cmd = [
                sys.executable,
                __file__,
                "--child",
                "--run-dir",
                str(run_dir),
                "--model",
                model,
                "--method",
                method,
                "--seed",
                str(seed),
            ]
            for k in ("steps", "tasks", "group", "eval_tasks", "eval_every", "lr"):
                cmd += [f"--{k.replace('_', '-')}", str(getattr(args, k))]
            log = open(out / f"{method}-s{seed}.log", "w")
            time.sleep(args.stagger_s)  # children load the model and the search index one after another
            procs[(method, seed)] = (
                subprocess.Popen(
                    cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "2"}
                ),
                run_dir,
            )
    deadline = t0 + args.deadline_s
    for (method, seed), (p, _) in procs.items():
        try:
            p.wait(timeout=max(deadline - time.time(), 1))
        except subprocess.TimeoutExpired:  # out of time: keep the steps logged so far
            p.terminate()
            p.wait()
        print(f"{method} seed {seed} exited {p.returncode}", flush=True)
    runs = {f"{m}-s{s}": curve(rd) for (m, s), (_, rd) in procs.items()}
    evals = {
        k: [(r["step"], r["eval/reward/outcome"]) for r in v if "eval/reward/outcome" in r]
        for k, v in runs.items()
    }
    base = [e[0][1] for e in evals.values() if e and e[0][0] == 0]
    target = args.target if args.target is not None else (sum(base) / len(base) + 0.05 if base else 0.1)
    summary = {
        "device": device,
        "sft": sft,
        "target_f1": target,
        "args": vars(args),
        "wall_s": time.time() - t0,
        "methods": {},
    }
    for method in args.methods:
        finals, reach, train_last = [], [], []
        for seed in args.seeds:
            e = evals.get(f"{method}-s{seed}", [])
            if e:
                finals.append(e[-1][1])
                reach.append(next((s for s, v in e if v >= target), None))
            tr = [r["reward/outcome"] for r in runs.get(f"{method}-s{seed}", []) if "reward/outcome" in r]
            if tr:
                train_last.append(sum(tr[-3:]) / len(tr[-3:]))
        summary["methods"][method] = {
            "final_eval_f1": finals,
            "steps_to_target": reach,
            "train_f1_last3": train_last,
        }
    summary["eval_curves"] = evals
    summary["train_curves"] = {
        k: [(r["step"], r.get("reward/outcome")) for r in v if "reward/outcome" in r] for k, v in runs.items()
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(
        json.dumps({k: v for k, v in summary.items() if k not in ("eval_curves", "train_curves")}, indent=1)
    )
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for k, e in evals.items():
            axes[0].plot(
                [s for s, _ in e], [v for _, v in e], label=k, color="C0" if k.startswith("grpo") else "C1"
            )
        for k, c in summary["train_curves"].items():
            axes[1].plot(
                [s for s, _ in c],
                [v for _, v in c],
                label=k,
                color="C0" if k.startswith("grpo") else "C1",
                alpha=0.7,
            )
        axes[0].set(title=f"eval F1 (greedy, test split) — {device}", xlabel="RL step")
        axes[1].set(title="train reward (F1, sampled)", xlabel="RL step")
        axes[0].legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / "curves.png", dpi=110)
    except ImportError:
        pass


if __name__ == "__main__":
    main()

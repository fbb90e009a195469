"""TRL's GRPOTrainer on a turngym env, through TRL's ``environment_factory`` hook.

    python examples/trl_grpo_arith.py                        # tiny random model, 2 steps on CPU
    python examples/trl_grpo_arith.py --model Qwen/Qwen2.5-0.5B-Instruct --no-steer --steps 50

The tiny model (``--model tiny``) is random and never calls a tool by itself: by default its sampling is
steered (a generation ``sequence_bias``, ``tool_call_bias``) towards two well-formed calls, so TRL has tool
calls to run. A real instruct model calls tools itself: pass ``--no-steer``.
The last line printed is a JSON summary (steps, mean reward, tool calls per completion, turngym steps).
"""

from __future__ import annotations

import argparse
import json


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--env", default="arith", help="turngym env id")
    ap.add_argument("--model", default="tiny", help="'tiny' (turngym's random demo model) or a model path/id")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--seeds", type=int, default=8, help="tasks: env seeds 0..N-1")
    ap.add_argument("--generations", type=int, default=4, help="GRPO group size")
    ap.add_argument("--max-completion-length", type=int, default=64)
    ap.add_argument("--no-steer", action="store_true", help="do not steer sampling towards tool calls")
    ap.add_argument("--depth", type=int, default=1, help="arith: operations per expression")
    ap.add_argument("--max-turns", type=int, default=1)
    ap.add_argument("--out", default="runs/trl-grpo-arith")
    args = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig

    from turngym.interop.trl import grpo_trainer, tool_call_bias

    env_kwargs = {"max_turns": args.max_turns, **({"depth": args.depth} if args.env == "arith" else {})}
    path = args.model
    if path == "tiny":
        from turngym.agents.tiny import tiny_model_path

        path = str(tiny_model_path())
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(path, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    seeds = range(args.seeds)
    generation_kwargs = None
    if not args.no_steer and args.env == "arith":
        calls = [
            {"name": "calculate", "arguments": {"a": 2, "op": "+", "b": 2}},
            {"name": "answer", "arguments": {"value": 4}},
        ]
        generation_kwargs = {"sequence_bias": tool_call_bias(tok, calls)}

    config = GRPOConfig(
        output_dir=args.out,
        max_steps=args.steps,
        per_device_train_batch_size=args.generations,
        num_generations=args.generations,
        max_completion_length=args.max_completion_length,
        learning_rate=1e-3,
        logging_steps=1,
        report_to="none",
        use_cpu=not torch.cuda.is_available(),
        save_strategy="no",
        beta=0.0,
        generation_kwargs=generation_kwargs,
    )
    trainer = grpo_trainer(
        args.env,
        model,
        seeds=seeds,
        args=config,
        components=["correct"] if args.env == "arith" else [],
        env_kwargs=env_kwargs,
        processing_class=tok,
    )
    trainer.train()
    name = f"rewards/{type(trainer._environment_pool[None][0]).__name__}/mean"
    rows = [r for r in trainer.state.log_history if name in r]
    for r in rows:
        print(
            f"step {r['step']}: reward {r[name]:.3f}  tool calls/completion {r['tools/call_frequency']:.2f}  "
            f"turngym steps {r['turngym/steps']:.2f}"
        )
    summary = {
        "steps": len(rows),
        "mean_reward": sum(r[name] for r in rows) / max(len(rows), 1),
        "tool_calls": sum(r["tools/call_frequency"] for r in rows),
        "turngym_steps": sum(r["turngym/steps"] for r in rows),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()

"""IGPO's information gain per tool turn on scripted-expert multi-hop search-qa trajectories, scored on
the gold answer alone (``gain_targets=answer``, the paper) and on every hop's target (``hops``): does
the first, bridge, search get credit? Prints the mean gain per turn, the scored tokens and seconds.

    python benchmarks/ig_targets.py --model smollm2-135m --episodes 10
"""

from __future__ import annotations

import argparse
import statistics
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m", help="pretrained name, folder, or 'tiny'")
    ap.add_argument("--episodes", type=int, default=10)
    ap.add_argument("--hops", nargs="+", type=int, default=[2, 3])
    ap.add_argument("--n-passages", type=int, default=10_000)
    args = ap.parse_args()

    from turngym.agents.models import load_model, load_tokenizer, resolve_model
    from turngym.trainer.credit.info_gain import InfoGainScorer
    from turngym.trainer.sft import expert_trajectories

    path = resolve_model(args.model)
    model, tok = load_model(path, device="cpu", dtype="float32"), load_tokenizer(path)
    kw = {
        "n_passages": args.n_passages,
        "n_tasks": 2 * args.n_passages,
        "mix": "default",
        "kinds": ["bridge"],
        "hops": args.hops,
        "max_turns": 6,
        "split": "train",
    }
    trajs = expert_trajectories("search-qa", range(args.episodes), kw)
    print(f"{len(trajs)} expert trajectories, turns {[len(t.turns) for t in trajs]}")
    for targets in ("answer", "hops", "answer"):  # the first pass also warms up
        scorer = InfoGainScorer(model, tok, gain_targets=targets)
        t0 = time.perf_counter()
        found = scorer.score(trajs)
        metrics = found.metrics
        seconds = time.perf_counter() - t0
        per_turn: dict[int, list[float]] = {}
        for gains in found.gains:
            for k, g in enumerate(gains or []):
                per_turn.setdefault(k, []).append(g)
        means = {k: round(statistics.mean(v), 3) for k, v in sorted(per_turn.items())}
        print(f"{targets:>6}: mean IG by turn {means}, tokens {metrics['ig/tokens']:.0f}, {seconds:.1f} s")


if __name__ == "__main__":
    main()

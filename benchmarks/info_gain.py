"""IGPO information-gain scoring: a trajectory's contexts packed over their shared prefix (one forward
per trajectory) against one forward per context (the baseline), on scripted-expert search-qa
trajectories with the tiny model; same values, fewer tokens, less time.

    python benchmarks/info_gain.py --trajectories 32 --hops 2 3 4 --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trajectories", type=int, default=32)
    ap.add_argument("--hops", nargs="+", type=int, default=[2, 3, 4])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--model", default="tiny")
    args = ap.parse_args()

    import torch

    from turngym.agents.models import load_model, load_tokenizer
    from turngym.trainer.credit.info_gain import InfoGainScorer
    from turngym.trainer.sft import expert_trajectories

    torch.set_num_threads(1)
    model, tok = load_model(args.model), load_tokenizer(args.model)
    env_kwargs = {"n_passages": 2000, "n_tasks": 1000, "hops": args.hops}
    trajs = expert_trajectories("search-qa", range(args.trajectories), env_kwargs)
    print(
        f"{len(trajs)} expert trajectories, {sum(len(t.turns) for t in trajs)} turns, device {model.device}"
    )
    times: dict[str, list[float]] = {"separate": [], "packed": []}
    metrics = {}
    for _ in range(args.repeats):  # interleaved, so machine load hits both alike
        for mode in ("separate", "packed"):
            scorer = InfoGainScorer(model, tok, share_prefix=mode == "packed")
            copies = [t.model_copy(deep=True) for t in trajs]
            t0 = time.perf_counter()
            metrics[mode] = scorer.score(copies).metrics
            times[mode].append(time.perf_counter() - t0)
    for mode in ("separate", "packed"):
        m = metrics[mode]
        print(
            f"{mode:8s}: contexts {m['ig/contexts']:.0f}, tokens {m['ig/tokens']:.0f}, "
            f"median {statistics.median(times[mode]):.3f} s, ig/mean {m['ig/mean']:.5f}"
        )
    tok_ratio = metrics["packed"]["ig/tokens"] / metrics["separate"]["ig/tokens"]
    speed = statistics.median(times["separate"]) / statistics.median(times["packed"])
    print(f"packed vs separate: tokens {tok_ratio:.2f}x the baseline, speed-up {speed:.2f}x")


if __name__ == "__main__":
    main()

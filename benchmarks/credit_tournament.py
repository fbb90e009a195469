"""Tournament topologies on synthetic groups: rank agreement with the true quality and matches played.

    python benchmarks/credit_tournament.py --trials 300 --noise 0.5

Each trial draws N true qualities ~ U(0, 1); the judge scores a pair as quality + Gaussian noise
(sd ``--noise``) per side and per order, with a position bias added to whoever is shown first
(both orders are summed, as the arena judges do). Reports Kendall's τ between each topology's
ranking and the truth, τ against round-robin's ranking on the same judge, and matches per group.
Round-robin is the baseline measured in the same run.
"""

from __future__ import annotations

import argparse

import numpy as np

from turngym.trainer.credit.arena import TOPOLOGIES, run_tournament


def noisy_judge(quality: np.ndarray, noise: float, bias: float, rng: np.random.Generator):
    def one_order(first: int, second: int) -> tuple[float, float]:
        return (quality[first] + bias + rng.normal(0, noise), quality[second] + rng.normal(0, noise))

    def judge(i: int, j: int) -> tuple[float, float]:
        a1, b1 = one_order(i, j)
        b2, a2 = one_order(j, i)
        return a1 + a2, b1 + b2

    return judge


def kendall_tau(x: np.ndarray, y: np.ndarray) -> float:
    """Kendall's τ-a of two untied score vectors (N <= a few dozen: the O(N²) form is fine)."""
    dx = np.sign(x[:, None] - x[None, :])
    dy = np.sign(y[:, None] - y[None, :])
    n = len(x)
    return float((dx * dy).sum() / (n * (n - 1))) if n > 1 else 1.0


def tau_vs(ranking: list[int], score_of: np.ndarray) -> float:
    position = np.empty(len(ranking))
    position[ranking] = np.arange(len(ranking))
    return kendall_tau(-position, score_of)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=300)
    ap.add_argument("--noise", type=float, default=0.3)
    ap.add_argument("--bias", type=float, default=0.2)
    ap.add_argument("--sizes", nargs="+", type=int, default=[8, 16])
    args = ap.parse_args()
    print(f"noise sd {args.noise}, position bias {args.bias}, {args.trials} trials per size")
    print(
        f"{'N':>3} {'topology':<20} {'tau(truth)':>10} {'±se':>6} {'tau(RR)':>8} {'top-1':>6} {'matches':>8} {'vs RR':>7}"
    )
    for n in args.sizes:
        rows = {t: {"tau": [], "tau_rr": [], "top1": [], "matches": []} for t in TOPOLOGIES}
        for trial in range(args.trials):
            q = np.random.default_rng(trial).uniform(0, 1, n)
            rr_ranking = None
            for topo in ["round_robin", *[t for t in TOPOLOGIES if t != "round_robin"]]:
                judge = noisy_judge(q, args.noise, args.bias, np.random.default_rng(10_000 + trial))
                res = run_tournament(topo, n, judge, seed=trial)
                if topo == "round_robin":
                    rr_ranking = res.ranking
                rr_pos = np.empty(n)
                rr_pos[rr_ranking] = np.arange(n)
                r = rows[topo]
                r["tau"].append(tau_vs(res.ranking, q))
                r["tau_rr"].append(tau_vs(res.ranking, -rr_pos))
                r["top1"].append(float(res.ranking[0] == int(np.argmax(q))))
                r["matches"].append(res.num_matches)
        rr_matches = np.mean(rows["round_robin"]["matches"])
        for topo, r in rows.items():
            tau = np.array(r["tau"])
            print(
                f"{n:>3} {topo:<20} {tau.mean():>10.3f} {tau.std() / np.sqrt(len(tau)):>6.3f} "
                f"{np.mean(r['tau_rr']):>8.3f} {np.mean(r['top1']):>6.2f} {np.mean(r['matches']):>8.1f} "
                f"{np.mean(r['matches']) / rr_matches:>6.2f}x"
            )


if __name__ == "__main__":
    main()

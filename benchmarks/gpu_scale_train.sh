#!/usr/bin/env bash
# Issue 37: random-init models of Qwen2.5's 1.5B and 7B shapes through `turngym train` (FSDP2, the slots
# engine colocated on every rank) on a machine of 4 GPUs (device tool). Runs after
# `benchmarks/gpu_learning.sh setup` + `start` (which install the wheels under /root/smol/site and prepare
# SmolLM2, whose tokenizer and chat template the shapes use). Sub-commands:
#   models CARD               write /root/shapes/{1.5b,7b} (random bf16 weights) from card CARD
#   run NAME CARDS SHAPE TASKS [KEY=VALUE...]   one `turngym train` run in the background (setsid):
#                             --nproc = number of CARDS, TASKS tasks a step over all ranks, group 8
#   wait SECS                 until every launched run has written its summary or SECS pass; report
#   report                    one row a run: peak GiB (metrics and nvidia-smi), rollout tok/s, update s,
#                             MFU (6 * params * tokens / update s / (ranks * 989e12)), refresh s, fallbacks
# Everything lands in $OUT/scale/ (logs, metrics.jsonl, smi.csv). Results: benchmarks/gpu_results.md.
set -uo pipefail
ROOT=/root/smol
SH=/root/shapes
export PYTHONPATH=$ROOT/site:$ROOT/tg PYTHONUNBUFFERED=1 TURNGYM_CACHE_DIR=$ROOT/cache TOKENIZERS_PARALLELISM=false
mkdir -p "$OUT/scale" $SH/runs

case "${1:-}" in
models)
  cd $ROOT/tg || exit 5
  for s in 1.5b 7b; do
    [[ -f $SH/$s/shape.json ]] || CUDA_VISIBLE_DEVICES=$2 python3 benchmarks/shape_model.py --shape $s \
      --tokenizer smollm2-135m --out $SH/$s --device cuda 2>&1 | grep -v "Writing model" | tail -n 2
  done
  df -h /root | tail -n 1
  ;;
run)
  name=$2 cards=$3 shape=$4 tasks=$5
  shift 5
  nproc=$(awk -F, '{print NF}' <<<"$cards")
  cp -r examples $ROOT/tg/ && cd $ROOT/tg || exit 5
  rm -rf $SH/runs/$name
  # the search-qa recipe's env; a random model never answers, so every episode runs its 6 turns
  CUDA_VISIBLE_DEVICES=$cards setsid nohup python3 -m turngym.cli train \
    examples/configs/grpo_search_qa_7b_fsdp.yaml --nproc "$nproc" model.path=$SH/$shape \
    run_dir=$SH/runs/$name steps=4 checkpoint_every=0 rollout.eval_tasks=0 rollout.tasks_per_step="$tasks" \
    log.save_trajectories=false "$@" > $SH/runs/$name.log 2>&1 < /dev/null &
  echo "$name: cards $cards, $nproc ranks, $shape, $tasks tasks a step"
  ;;
wait)
  until=$2
  while ((SECONDS < until)); do
    busy=$(pgrep -fc "turngym.cli train" || true)
    ((busy == 0)) && break
    sleep 10
  done
  bash "$0" report
  ;;
report)
  for f in $SH/runs/*.log; do
    n=$(basename "$f" .log)
    mkdir -p "$OUT/scale/$n"
    cp "$f" "$OUT/scale/"
    cp $SH/runs/$n/metrics.jsonl "$OUT/scale/$n/" 2>/dev/null
    grep -iE "error|Traceback|fallback|out of memory" "$f" | tail -n 4
  done
  cp $SH/smi.csv "$OUT/scale/" 2>/dev/null
  python3 - $SH/runs <<'EOF'
import json, pathlib, statistics, sys
for d in sorted(p for p in pathlib.Path(sys.argv[1]).iterdir() if p.is_dir()):
    f = d / "metrics.jsonl"
    if not f.exists():
        print(d.name, "no metrics"); continue
    rows = [json.loads(x) for x in f.read_text().splitlines() if x.strip()]
    tr = [r for r in rows if "time/update" in r][1:] or [r for r in rows if "time/update" in r]  # step 1 warms up
    if not tr:
        print(d.name, "no steps"); continue
    cfg = json.loads((d / "config.json").read_text())
    ranks = cfg["cluster"]["nproc"]
    med = lambda k: statistics.median(r.get(k, float("nan")) for r in tr)
    mx = lambda k: max(r.get(k, float("nan")) for r in rows if k in r) if any(k in r for r in rows) else float("nan")
    trajs = cfg["rollout"]["tasks_per_step"] * cfg["rollout"]["group_size"]
    print(f"{d.name}: ranks {ranks} steps {len(tr)} | peak GiB rollout {mx('memory/rollout_peak_gib'):.1f} "
          f"update {mx('memory/update_peak_gib'):.1f} | step {med('time/step'):.2f} s, rollout {med('time/rollout'):.2f} s "
          f"({med('rollout/tokens_per_s'):.0f} tok/s all ranks, {med('rollout/tokens_per_s') / ranks:.0f}/GPU), "
          f"update {med('time/update'):.2f} s, {med('throughput/update_tflops'):.0f} TFLOP/s = "
          f"MFU {100 * med('throughput/update_tflops') * 1e12 / (ranks * 989e12):.1f} %, refresh {med('time/refresh'):.3f} s, "
          f"traj/s {trajs / med('time/step'):.2f}, graph fallbacks {mx('rollout/backend/graph_fallbacks')} "
          f"eager decodes {mx('rollout/backend/eager_decodes')} captures {mx('rollout/backend/graph_captures')}")
EOF
  awk -F', ' 'NR>1 {gsub(" MiB","",$2); if ($2+0 > m[$1]) m[$1] = $2+0} END {for (g in m) printf "nvidia-smi peak, GPU %s: %.1f GiB\n", g, m[g]/1024}' \
    $SH/smi.csv 2>/dev/null
  ;;
smi)  # sample every card's used memory each second until the machine goes back (setsid)
  setsid nohup nvidia-smi --query-gpu=index,memory.used --format=csv -lms 1000 > $SH/smi.csv 2>/dev/null < /dev/null &
  ;;
*)
  echo "usage: $0 models CARD | run NAME CARDS SHAPE TASKS [K=V...] | wait SECS | report | smi" >&2
  exit 2
  ;;
esac

#!/usr/bin/env bash
# Issue 41 on a GPU machine (device tool, 1 or 2 H200s, ~10 minutes), after `bash benchmarks/gpu_learning.sh
# setup` (carry [.smol/a, .whl]) in the same lease:
#   bash benchmarks/gpu_credit.sh run SECS      carry [.smol/b]   GGUF_SHA256=... (as gpu_learning.sh start)
#     1. two warm starts of SmolLM2-135M-Instruct (train_curves.py --sft-only), side by side:
#        standard: 2+3-hop bridge search-qa, the last SFT checkpoint (the recipe of gpu_results.md);
#        sparse:   the "sparse" mix (bridge 3/4/5 hops), the last early checkpoint with held-out F1 <= 0.15
#     2. the credit audit of each (turngym credit audit: N = 8 tasks x 4 = 32 trajectories, K = 8, vine_k 2)
#        for grpo, the igpo variants, gigpo, turn, tree, tree_gigpo and vine -> $OUT/audit-{standard,sparse}/
#     3. the sparse-regime curves: grpo vs two methods (SPARSE_METHODS), SEEDS in parallel, from the sparse
#        warm start, until SECS; every run logs credit/zero_groups and rollout/generated_tokens (forks
#        included), and tokens.json puts each eval on the cumulative-token axis (equal-budget reading)
#   bash benchmarks/gpu_credit.sh wait SECS                    more time for the curves; packs again
#   bash benchmarks/gpu_credit.sh travel SECS                  travel-planner from a warm start that rarely passes
# Everything lands in $OUT: audit-*/{audit.json,audit.md}, curves/*/metrics.jsonl.gz, summary.json,
# tokens.json, *.log, commit.txt (COMMIT=<git commit of the tree sent>: the device copy has no .git).
# Overrides: GPUS (1|2), SPARSE_METHODS, SEEDS, STEPS, LR, AUDIT_N, AUDIT_G, AUDIT_K, AUDIT_BUDGET, SFT_STEPS.
set -uo pipefail
# shellcheck source=benchmarks/gpu_learning.sh
source benchmarks/gpu_learning.sh  # ROOT, PYTHONPATH, prepare (GGUF join, tree copy, model conversion)
C=$ROOT/credit
GPUS=${GPUS:-1}
CARD2=$((GPUS > 1 ? 1 : 0))
SEARCH="--model smollm2-135m --kinds bridge --max-turns 6 --n-passages 10000 --n-tasks 20000 --sft-tasks 3000
  --workers 14 --sft-batch 8 --sft-lr 5e-5 --max-tokens 64 --eval-tasks 64 --micro-batch-tokens 8192 --grad-ckpt"
SPARSE_METHODS=${SPARSE_METHODS:-"grpo vine:k=4,turns=tool igpo:gain_targets=hops,returns=depth_zscore"}

env_args() {  # MIX HOPS: the audit's env, as train_curves.py builds it for training
  echo "--env-arg n_passages=10000 --env-arg n_tasks=20000 --env-arg mix=$1 --env-arg kinds=[\"bridge\"]
    --env-arg hops=$2 --env-arg reward=f1 --env-arg max_turns=6 --env-arg split=train"
}

commit() {  # the audit's JSON records it too (TURNGYM_COMMIT)
  export TURNGYM_COMMIT=${COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
  echo "$TURNGYM_COMMIT" > "$OUT/commit.txt"
}

warm_starts() {
  # shellcheck disable=SC2086
  CUDA_VISIBLE_DEVICES=0 python3 benchmarks/train_curves.py --out $C/standard-sft $SEARCH --mix default --hops 2 3 \
    --sft-steps ${SFT_STEPS:-200} --sft-checkpoints ${SFT_STEPS:-200} --start-f1 0 1 --sft-only \
    --export $C/standard-start > $C/standard-sft.log 2>&1 &
  # shellcheck disable=SC2086
  CUDA_VISIBLE_DEVICES=$CARD2 python3 benchmarks/train_curves.py --out $C/sparse-sft $SEARCH --mix sparse \
    --hops 3 4 5 --sft-steps ${SFT_STEPS:-200} --sft-checkpoints 25 50 100 ${SFT_STEPS:-200} --start-f1 0 0.15 \
    --sft-only --export $C/sparse-start > $C/sparse-sft.log 2>&1 &
  wait
  tail -n 3 $C/standard-sft.log $C/sparse-sft.log
}

audit() {  # NAME CARD MIX HOPS
  set -f  # the JSON lists of env_args are words, not globs
  # shellcheck disable=SC2046,SC2086
  CUDA_VISIBLE_DEVICES=$2 python3 -m turngym.cli credit audit search-qa -b hf --model $C/$1-start \
    -n ${AUDIT_N:-8} -g ${AUDIT_G:-4} --k ${AUDIT_K:-8} --vine-k 2 --max-tokens 64 --max-context 2048 \
    --max-turns 6 --budget ${AUDIT_BUDGET:-4000000} $(env_args $3 $4) --out "$OUT/audit-$1" > "$OUT/audit-$1.log" 2>&1
  set +f
}

audits() {
  mkdir -p $C && cp $C/*-start/sft.json "$OUT/" 2>/dev/null
  audit standard 0 default "[2,3]" &
  audit sparse $CARD2 sparse "[3,4,5]" &
  wait
  tail -n 20 "$OUT"/audit-*.log
}

curves() {  # SECS: the sparse-regime curves in the background until SECS after the call began
  # shellcheck disable=SC2086
  setsid nohup python3 benchmarks/train_curves.py --out $C/curves $SEARCH --mix sparse --hops 3 4 5 \
    --start-from $C/sparse-start --methods $SPARSE_METHODS --seeds ${SEEDS:-0 1 2} --tasks 16 --group 8 \
    --lr ${LR:-5e-6} --steps ${STEPS:-40} --eval-every 4 --max-batch 64 --gpu-fraction 0.1 --gpus $GPUS \
    --deadline-s $(($1 - SECONDS - 60)) > $C/curves.log 2>&1 < /dev/null &
}

pack_credit() {  # [DIR]: metrics.jsonl (gzip) of every run, summary, the token axis, logs
  local dir=${1:-$C/curves}
  [[ -d $dir ]] || return 0
  python3 - "$dir" "$OUT" <<'EOF'
import gzip, json, pathlib, shutil, sys
src, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
tokens = {}
for f in sorted(src.glob("*/metrics.jsonl")):
    dest = out / "curves" / f.parent.name
    dest.mkdir(parents=True, exist_ok=True)
    with f.open("rb") as a, gzip.open(dest / "metrics.jsonl.gz", "wb") as b:
        shutil.copyfileobj(a, b)
    total, curve = 0.0, []
    for line in f.read_text().splitlines():
        try:
            r = json.loads(line)
        except ValueError:
            continue
        total += r.get("rollout/generated_tokens", 0.0)
        if "eval/reward/outcome" in r:
            curve.append({"step": r.get("step"), "tokens": total, "eval": r["eval/reward/outcome"],
                          "zero_groups": r.get("credit/zero_groups")})
    tokens[f.parent.name] = curve
(out / "tokens.json").write_text(json.dumps(tokens, indent=1))
for name in ("summary.json", "curves.png"):
    if (src / name).exists():
        shutil.copy(src / name, out / name)
EOF
  cp $C/*.log "$OUT/" 2>/dev/null
  # one archive of the many small files (the device tool returns only so many files a call)
  (cd "$OUT" && tar czf credit.tgz --remove-files $(ls -d audit-*/ curves tokens.json summary.json 2>/dev/null))
}

[[ ${BASH_SOURCE[0]} == "$0" ]] || return 0  # sourced: the functions only

case "${1:-}" in
run)
  commit
  prepare || exit $?
  mkdir -p $C
  warm_starts
  audits
  curves "${2:-540}"
  while ((SECONDS < ${2:-540} - 30)) && pgrep -f "train_curves.py --out $C/curves" > /dev/null; do sleep 15; done
  pack_credit
  ;;
wait)
  commit
  while ((SECONDS < ${2:-540} - 30)) && pgrep -f "train_curves.py --out $C/curves" > /dev/null; do sleep 15; done
  pack_credit
  tail -n 5 $C/curves.log
  ;;
travel)  # travel-planner's sparse regime: an early warm start (pass rate <= 0.1), grpo vs gated, zero_groups logged
  commit
  prepare || exit $?
  mkdir -p $C
  # shellcheck disable=SC2086
  python3 benchmarks/train_curves.py --out $C/travel --model smollm2-135m --env travel-planner \
    --env-kwargs "{\"level\":\"easy\",\"days\":3,\"max_rows\":5,\"tools_in_prompt\":false}" --eval-breakdown none \
    --max-turns 10 --max-context 4096 --max-tokens 448 --sft-tasks 2000 --sft-steps 150 --sft-checkpoints 50 100 150 \
    --sft-batch 8 --sft-lr 5e-5 --start-f1 0 0.1 --workers 12 --seeds ${SEEDS:-0 1 2} --tasks 8 --group 4 --lr 1e-5 \
    --eval-tasks 32 --eval-every 5 --micro-batch-tokens 8192 --max-batch 32 --grad-ckpt --gpu-fraction 0.15 \
    --gpus $GPUS --methods grpo "gated:high_component=pass,low_components=[tool_ok,verifier],delta=1.0" vine:k=2,turns=tool \
    --deadline-s $((${2:-540} - SECONDS - 60)) > $C/travel.log 2>&1
  pack_credit $C/travel
  ;;
*)
  echo "usage: $0 run SECS | wait SECS | travel SECS" >&2
  exit 2
  ;;
esac

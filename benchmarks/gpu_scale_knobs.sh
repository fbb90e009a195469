#!/usr/bin/env bash
# Issue 37's memory knobs at the 7B shape on one machine of 4 GPUs (device tool, carry .whl):
#   two 2-rank runs side by side (GPUs 0-1, 2-3), then one 4-rank run; tables in $OUT/k{2,3,4}.log.
# Results: benchmarks/gpu_results.md (issue 37, session 2), docs/scaling.md section 4a.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH TOKENIZERS_PARALLELISM=false
nvidia-smi -L
B="benchmarks/fsdp.py --shape 7b --strategies fsdp --gradient-checkpointing --steps 2"
(CUDA_VISIBLE_DEVICES=0,1 torchrun --standalone --master-port 29501 --nproc-per-node 2 $B --seqs 4 --variants nochunk,8bit+release+chunk1024,8bit+release+liger --out $OUT/k2.json > $OUT/k2.log 2>&1) &
(CUDA_VISIBLE_DEVICES=2,3 torchrun --standalone --master-port 29502 --nproc-per-node 2 $B --seqs 8 --variants 8bit+release+liger,8bit+release+liger+every --out $OUT/k3.json > $OUT/k3.log 2>&1) &
wait
torchrun --standalone --master-port 29503 --nproc-per-node 4 $B --seqs 4 --variants nochunk,8bit+release+liger --out $OUT/k4.json > $OUT/k4.log 2>&1
tail -n 15 $OUT/k2.log $OUT/k3.log $OUT/k4.log

#!/usr/bin/env bash
# Issue 37's "one GPU, two phases" on one GPU (device tool, carry .whl: the wheels the other GPU scripts
# carry, gymnasium, pydantic, ...; no model weights: random-init Qwen2 shapes from benchmarks/fsdp.py).
#   bash benchmarks/gpu_sleep_wake.sh   # ~2-3 min on an H200 (capped: 150 s a shape, 120 s the tests): 1.5B, 7B, tests
# For each mode (awake = keep_backend, kv, kv+graphs) and cycle: free memory when the update starts, the
# update's peak, sleep and wake seconds, whether a kv wake kept the CUDA graphs, the rollout's recaptures
# and whether its greedy tokens equal the first rollout's. Tables in $OUT/sleep_wake_*.log, JSON beside.
# Then the gpu-marked tests of tests/agents/test_hf_slots_sleep.py ($OUT/pytest_gpu.log).
# Results: benchmarks/gpu_results.md (issue 37, session 3), docs/scaling.md ("One GPU, two phases").
set -uo pipefail
if ls .whl/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH TOKENIZERS_PARALLELISM=false
nvidia-smi -L
# 1.5B: 128 slots x 4096 columns (14 GiB of KV); the update: 8 x 1024 tokens, AdamW at lr 0
timeout 150 python3 benchmarks/sleep_wake.py --shape 1.5b --rows 128 --max-context 4096 --cycles 3 \
  --out $OUT/sleep_wake_1.5b.json > $OUT/sleep_wake_1.5b.log 2>&1
# 7B: 64 slots x 4096 columns (14 GiB of KV), a smaller update (4 x 512 tokens): bf16 weights + AdamW state
timeout 150 python3 benchmarks/sleep_wake.py --shape 7b --rows 64 --max-context 4096 --cycles 2 \
  --update-seqs 4 --update-len 512 --out $OUT/sleep_wake_7b.json > $OUT/sleep_wake_7b.log 2>&1
# the CUDA side of the engine's sleep tests (marker gpu: graphs kept only at the same address, recaptured
# otherwise, greedy tokens unchanged; the tiny model, built locally)
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/agents/test_hf_slots_sleep.py -m gpu \
  > $OUT/pytest_gpu.log 2>&1
tail -n 14 $OUT/sleep_wake_1.5b.log $OUT/sleep_wake_7b.log
tail -n 5 $OUT/pytest_gpu.log

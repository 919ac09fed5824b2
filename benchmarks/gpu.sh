#!/usr/bin/env bash
# The GPU figures of docs/performance.md, in one run on a machine with an NVIDIA GPU and JAX:
# the Pallas kernels compiled by Triton against the dense reference, jax.nn and cuDNN
# (tests/test_pallas_gpu.py), then benchmarks/attention.py for bf16 at T=8192 (H=128, block
# sizes tried), float32 at T=2048 (with additive scoring), additive scoring at T=32768, and
# benchmarks/mods.py (its GPU group: the kernel with softcap + ALiBi against without mods).
#
#   bash benchmarks/gpu.sh [RESULTS_DIR]     # default: gpu_results/
set -uo pipefail
out=${1:-gpu_results}
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
bench() { timeout 180 python3 benchmarks/attention.py --repeats 10 "$@"; }

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/env.txt"
python3 -c "import jax, flax; print('jax', jax.__version__, 'flax', flax.__version__)" \
  | tee -a "$out/env.txt"
timeout 180 python3 -m pytest -p no:cacheprovider -n 0 -rA tests/test_pallas_gpu.py \
  > "$out/tests.txt" 2>&1
grep -E "^(PASSED|FAILED|ERROR)|passed|failed|max relative error" "$out/tests.txt"
bench --dtype bfloat16 --head-dim 128 --batch 2 --heads 16 --lengths 8192 \
  --max-grad-length 8192 --max-temp-gib 60 --additive-max-length 0 \
  --impls jax.nn pallas "pallas 64x64" "pallas 128x128" "jax pallas mha" cudnn \
  --pallas-blocks 64x64 128x128 2>&1 | tee "$out/bf16_t8192.md"
bench --dtype float32 --lengths 2048 --max-temp-gib 60 2>&1 | tee "$out/fp32_t2048.md"
bench --dtype float32 --lengths 32768 --causal 0 --passes fwd --additive-max-length 32768 \
  --max-temp-gib 100 --impls "additive dense" "additive pallas" 2>&1 | tee "$out/additive_t32768.md"
timeout 300 python3 benchmarks/mods.py 2>&1 | tee "$out/mods.md"

#!/usr/bin/env bash
# For a machine with a TPU and JAX's TPU build (pip install "jax[tpu]"): attnjax's Mosaic kernel
# (implementation="pallas_tpu") compiled on the chip and checked against the dense path and
# JAX's TPU flash kernel (tests/test_pallas_tpu.py: interpret mode only off TPU; float32
# matmuls at "highest" so the dense reference is exact enough for the parity tolerances), then
# timed against JAX's TPU flash and splash kernels with benchmarks/attention.py (bfloat16 at
# T=8192 with H=128, float32 at T=2048). None of this has run on a TPU yet.
#
#   bash benchmarks/tpu.sh [RESULTS_DIR]     # default: tpu_results/
set -uo pipefail
out=${1:-tpu_results}
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
bench() { timeout 600 python3 benchmarks/attention.py --repeats 10 "$@"; }

python3 -c "import jax; print('jax', jax.__version__, jax.devices())" | tee "$out/env.txt"
JAX_DEFAULT_MATMUL_PRECISION=highest timeout 600 python3 -m pytest -p no:cacheprovider -n 0 \
  -rA tests/test_pallas_tpu.py > "$out/tests.txt" 2>&1
grep -E "^(PASSED|FAILED|ERROR)|passed|failed|max relative error" "$out/tests.txt"
bench --dtype bfloat16 --head-dim 128 --batch 2 --heads 16 --lengths 8192 \
  --max-grad-length 8192 --max-temp-gib 12 --additive-max-length 0 \
  --impls jax.nn pallas_tpu "jax tpu flash" "jax splash" 2>&1 | tee "$out/bf16_t8192.md"
bench --dtype float32 --lengths 2048 --max-temp-gib 12 --additive-max-length 0 \
  --impls jax.nn chunked pallas_tpu "jax tpu flash" "jax splash" 2>&1 | tee "$out/fp32_t2048.md"

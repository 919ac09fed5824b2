#!/usr/bin/env bash
# The GPU figures of docs/performance.md, in one run on a machine with an NVIDIA GPU and JAX:
# the GPU tests (tests/test_pallas_gpu.py: the Triton kernels, the Mosaic GPU kernel and cuDNN
# against the dense path), then benchmarks/attention.py in bfloat16 with H=128 at T=8192
# (B=2, N=16) and T=32768 (B=1, N=16): jax.nn's XLA path, the Pallas kernel, JAX's Pallas
# mha and cuDNN, forward and forward+backward, causal and not; the Mosaic GPU kernel against
# cuDNN in a run of its own; benchmarks/mods.py's GPU groups (mods and a document block mask
# on the Pallas kernel); the tiled additive kernel at T=32768, where the dense path cannot run.
#
#   bash benchmarks/gpu.sh [RESULTS_DIR]     # default: gpu_results/
set -uo pipefail
out=${1:-gpu_results}
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export XLA_PYTHON_CLIENT_PREALLOCATE=false  # several test processes share the GPU
gpu_tests() {  # seconds, then pytest arguments
  timeout "$1" python3 -m pytest -p no:cacheprovider -o addopts="-rA --import-mode=importlib" \
    "${@:2}"
}
bench() {  # seconds, then benchmarks/attention.py arguments
  timeout "$1" python3 benchmarks/attention.py --dtype bfloat16 --head-dim 128 --heads 16 \
    --repeats 10 --max-temp-gib 60 --additive-max-length 0 "${@:2}"
}
dot_impls=(--impls jax.nn pallas "pallas 128x128" "jax pallas mha" cudnn --pallas-blocks 128x128)

{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import jax, flax; print('jax', jax.__version__, 'flax', flax.__version__)"
} | tee "$out/env.txt"
gpu_tests 100 --timeout 45 tests/test_pallas_gpu.py -k mosaic > "$out/tests_mosaic.txt" 2>&1
gpu_tests 300 -n 6 --dist load tests/test_pallas_gpu.py -k "not mosaic" > "$out/tests.txt" 2>&1
grep -hE "^(PASSED|FAILED|ERROR)|passed|failed" "$out/tests_mosaic.txt" "$out/tests.txt"
bench 200 --batch 2 --lengths 8192 --max-grad-length 8192 "${dot_impls[@]}" 2>&1 \
  | tee "$out/bf16_t8192.md"
bench 200 --batch 1 --lengths 32768 --max-grad-length 32768 "${dot_impls[@]}" 2>&1 \
  | tee "$out/bf16_t32768.md"
timeout 150 python3 benchmarks/mods.py --length 8192 --repeats 10 2>&1 | tee "$out/mods.md"
timeout 120 python3 benchmarks/attention.py --lengths 32768 --causal 0 --passes fwd --repeats 3 \
  --additive-max-length 32768 --max-temp-gib 100 --impls "additive dense" "additive pallas" \
  2>&1 | tee "$out/additive_t32768.md"
# last: a kernel that hangs the GPU must not cost the figures above
{
  bench 90 --batch 2 --lengths 8192 --max-grad-length 8192 --impls cudnn mosaic_gpu
  bench 90 --batch 1 --lengths 32768 --max-grad-length 32768 --impls cudnn mosaic_gpu
} 2>&1 | tee "$out/mosaic.md"

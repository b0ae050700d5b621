#!/usr/bin/env bash
# The GPU check, for a machine with a GPU (CUDA driver; no Rust needed).
# Build here, carry the tree (with target/release and .cache/cuda) there:
#   cargo build --release -p ccl-kernels --features cuda --bin ccl-gpu-check
#   eval "$(scripts/deps.sh cuda)"      # NVRTC + headers, if the GPU machine lacks a toolkit
# then, on the GPU machine, from the repository root:
#   integration/gpu/check.sh
# It runs every CUDA kernel (copy, reduce, fused receive-reduce-send; every
# type and operator) on GPU 0 against a host reference on fresh random data
# with poisoned outputs, measures device-to-device copy bandwidth, and prints
# the table last. Well under 8 minutes. Exit 0: all right; 1: wrong
# elements; 2: no driver, no GPU, or NVRTC missing (a clear message).
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${CCL_GPU_CHECK:-target/release/ccl-gpu-check}
[ -x "$bin" ] || { echo "check.sh: $bin missing: cargo build --release -p ccl-kernels --features cuda --bin ccl-gpu-check" >&2; exit 2; }
# NVRTC and the headers: the CUDA toolkit's, else PyPI's in .cache/cuda
for d in .cache/cuda/nvidia/cuda_nvrtc/lib /usr/local/cuda/lib64; do
    if [ -d "$d" ]; then export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; fi
done
if [ -z "${CCL_CUDA_INCLUDE:-}" ]; then
    for d in /usr/local/cuda/include .cache/cuda/nvidia/cuda_runtime/include; do
        if [ -e "$d/cuda_fp16.h" ]; then export CCL_CUDA_INCLUDE=$d; break; fi
    done
fi
if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
fi
exec timeout 480 "$bin"

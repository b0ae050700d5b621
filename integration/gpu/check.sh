#!/usr/bin/env bash
# The GPU check, for a machine with a GPU (CUDA driver; no Rust or network needed).
# Build here, carry the tree (with target/release and .cache/cuda) there:
#   integration/gpu/check.sh --build     # cargo build --release of the four binaries with feature cuda
#   eval "$(scripts/deps.sh cuda)"       # NVRTC + headers, if the GPU machine lacks a toolkit
# then, on the GPU machine, from the repository root:
#   integration/gpu/check.sh
# Steps (each under its own time limit, and all within 470 s: a step that
# would start later is skipped and counts as a failure):
#  1. ccl-gpu-check: every CUDA kernel (copy, reduce, fused receive-reduce-send;
#     every type and operator) against a host reference on fresh random data,
#     outputs poisoned; device-to-device copy bandwidth (the ceiling).
#  2. gpu_matrix under cclrun with 1, 2 and 4 ranks sharing GPU 0 (CUDA IPC
#     between the processes), 2 ranks staged over tcp and over soft RDMA, 2 whose calls all go
#     through the proxy thread (CCL_GPU_PROXY=1): every blocking
#     collective × types × counts on device buffers against the host reference;
#     then collectives captured into CUDA graphs and replayed (2 ranks), and
#     the matrix with flags polled by kernels instead of stream memory ops.
#  3. ccl-perf all_reduce on device buffers, 8 B - 1 GiB, 2 and 4 ranks, with
#     the host time per call and the device-to-device copy ceiling; and,
#     where there are 2 or more GPUs, NCCL's all_reduce by the same tool.
# Prints a short table last. Exit 0: all right; 1: something wrong;
# 2: no driver, no GPU, or binaries/NVRTC missing (a clear message).
# CCL_GPU_CHECK_EMULATED=1 runs steps 2 and 3 on emulated GPUs (no driver
# needed; step 1 is skipped): how CI checks this script's own logic.
set -uo pipefail
cd "$(dirname "$0")/../.."
bins=${CCL_GPU_BIN_DIR:-target/release}
if [ "${1:-}" = "--build" ]; then
    exec cargo build --release -p cclrun -p ccl-kernels -p ccl-integration -p ccl-examples \
        --features ccl-kernels/cuda,ccl-integration/cuda,ccl-examples/cuda,ccl-examples/nccl \
        --bin cclrun --bin ccl-gpu-check --bin gpu_matrix --bin ccl-perf
fi
for b in ccl-gpu-check gpu_matrix ccl-perf cclrun; do
    [ -x "$bins/$b" ] || { echo "check.sh: $bins/$b missing: run integration/gpu/check.sh --build first" >&2; exit 2; }
done
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
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
summary=()
fail=0
BUDGET=470
# limit STEP_SECONDS: the step's own limit, cut to what is left of the budget (0: none left)
limit() {
    local left=$((BUDGET - SECONDS))
    if [ "$left" -lt 15 ]; then echo 0; elif [ "$left" -lt "$1" ]; then echo "$left"; else echo "$1"; fi
}

emulated=${CCL_GPU_CHECK_EMULATED:-0}
matrix_flag=() device=cuda max=1G
if [ "$emulated" = 1 ]; then matrix_flag=(--emulated) device=emulated max=4M; fi

# 1. the kernels (exit 2 here means no driver or GPU: nothing else can run)
if [ "$emulated" = 1 ]; then
    summary+=("kernels: skipped (emulated GPUs)")
else
    timeout "$(limit 90)" "$bins/ccl-gpu-check" | tee "$out/kernels"
    rc=${PIPESTATUS[0]}
    if [ "$rc" -eq 2 ]; then exit 2; fi
    [ "$rc" -eq 0 ] || fail=1
    summary+=("kernels: $(grep -o 'wrong elements in all: .*' "$out/kernels" || echo "exit $rc")")
    summary+=("$(grep -o 'device-to-device copy: .*' "$out/kernels" || echo 'device-to-device copy: not measured')")
fi

# 2. the collectives on device buffers, ranks sharing the GPU (MATRIX_ARGS:
# --graphs captures them into CUDA graphs and replays those instead)
matrix() {
    local label=$1
    shift
    local t0=$SECONDS t done="all device collectives correct"
    if [ "${MATRIX_ARGS:-}" = --graphs ]; then done="graph replays correct"; fi
    t=$(limit 90)
    if [ "$t" -eq 0 ]; then fail=1; summary+=("matrix $label: skipped (time budget spent)"); return; fi
    timeout "$t" "$bins/cclrun" "$@" -x CCL_BUFFSIZE=262144 -x CCL_GPU_SLOT=65536 -x CCL_TIMEOUT=60 "$bins/gpu_matrix" "${matrix_flag[@]}" ${MATRIX_ARGS:-} >"$out/m" 2>&1
    local rc=$? ok np
    ok=$(grep -c "$done" "$out/m")
    np=$(printf '%s\n' "$@" | grep -A1 -x -- -np | tail -n 1)
    tail -n 3 "$out/m"
    [ "$rc" -eq 0 ] && [ "$ok" -eq "$np" ] || fail=1
    summary+=("$(printf 'matrix %-22s exit %d, %d ranks correct, %d s' "$label" "$rc" "$ok" $((SECONDS - t0)))")
}
matrix "1 rank" -np 1
matrix "2 ranks (IPC)" -np 2
matrix "4 ranks (IPC)" -np 4
matrix "2 ranks (tcp staged)" -np 2 -x CCL_SHM_DISABLE=1
matrix "2 ranks (soft rdma staged)" -np 2 -x CCL_SHM_DISABLE=1 -x CCL_IB_SOFT=1
matrix "2 ranks (IPC, proxied)" -np 2 -x CCL_GPU_PROXY=1
MATRIX_ARGS=--graphs matrix "graphs, 2 ranks (IPC)" -np 2
# the fallback for GPUs whose streams cannot wait on memory: flags polled by kernels
if [ "$emulated" != 1 ]; then matrix "2 ranks (flag kernels)" -np 2 -x CCL_GPU_FLAG_KERNELS=1; fi

# 3. bandwidth on device buffers (BACKEND=nccl: NCCL's, by the same tool)
perf() {
    local np=$1 t backend=${BACKEND:-ccl}
    t=$(limit 90)
    if [ "$t" -eq 0 ]; then fail=1; summary+=("ccl-perf np $np: skipped (time budget spent)"); return; fi
    timeout "$t" "$bins/cclrun" -np "$np" "$bins/ccl-perf" --backend "$backend" --device "$device" \
        -b 8 -e "$max" -f 8 -n 10 -w 3 >"$out/p$np" 2>&1
    local rc=$?
    cat "$out/p$np"
    [ "$rc" -eq 0 ] || fail=1
    summary+=("$backend all_reduce np $np: exit $rc; out of place, by size: time (us), busbw (GB/s), host time per call (us)")
    while read -r size _ _ _ _ time _ busbw _ host _; do
        summary+=("$(printf '    %12s B  %10s  %8s  %8s' "$size" "$time" "$busbw" "$host")")
    done < <(grep -E '^ +[0-9]+ ' "$out/p$np")
    summary+=("    $(grep -o 'device-to-device copy of .*' "$out/p$np" || echo 'device-to-device copy: not measured')")
}
perf 2
perf 4
# NCCL beside it, where there are GPUs enough for a rank each (NCCL refuses two ranks on one)
gpus=$( (nvidia-smi -L 2>/dev/null || true) | grep -c '^GPU')
if [ "$emulated" != 1 ] && [ "$gpus" -ge 2 ]; then
    BACKEND=nccl perf 2
else
    summary+=("nccl: not run ($gpus GPUs here; it needs 2 or more, one per rank)")
fi

echo
echo "# ccl GPU check summary"
printf '%s\n' "${summary[@]}"
echo "# result: $([ $fail -eq 0 ] && echo OK || echo FAILED)"
exit $fail

#!/usr/bin/env bash
# Installs the Debian packages ccl needs, if missing.
#   scripts/deps.sh build   compiler, pkg-config, OpenSSL headers (libssh2 for cclrun's SSH)
#   scripts/deps.sh test    + sshd and iproute2 (namespace cluster tests), Open MPI and
#                           libclang (mpirun tests, the `mpi` feature), Gloo (ccl-perf's
#                           `gloo` feature), libibverbs' headers (the `rdma` feature)
#   scripts/deps.sh cuda    NVRTC and the CUDA headers from PyPI's nvidia-cuda-nvrtc-cu12 and
#                           nvidia-cuda-runtime-cu12 wheels into .cache/cuda (no GPU or driver
#                           needed), then prints the variables that point ccl at them
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = cuda ]; then
    dir=.cache/cuda
    if [ ! -e "$dir/nvidia/cuda_nvrtc/lib/libnvrtc.so.12" ] || [ ! -e "$dir/nvidia/cuda_runtime/include/cuda_fp16.h" ]; then
        echo "deps: installing NVRTC and the CUDA headers into $dir (PyPI)" >&2
        if ! python3 -m pip --version >/dev/null 2>&1; then
            sudo=""
            [ "$(id -u)" -eq 0 ] || sudo="sudo"
            $sudo apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q python3-pip >&2
        fi
        # --target keeps it out of the system's packages (PEP 668 allows that)
        PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install -q --disable-pip-version-check --target "$dir" \
            nvidia-cuda-nvrtc-cu12 nvidia-cuda-runtime-cu12 >&2
    fi
    root=$(pwd)/$dir/nvidia
    echo "export LD_LIBRARY_PATH=$root/cuda_nvrtc/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
    echo "export CCL_CUDA_INCLUDE=$root/cuda_runtime/include"
    exit 0
fi
want=(build-essential pkg-config libssl-dev)
if [ "${1:-build}" = test ]; then
    want+=(openssh-server openssh-client iproute2 openmpi-bin libopenmpi-dev libclang-dev libgloo-dev libibverbs-dev)
fi
missing=()
for p in "${want[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "deps: installing ${missing[*]}" >&2
$sudo apt-get update -q
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"

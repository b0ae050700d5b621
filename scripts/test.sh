#!/usr/bin/env bash
# Every check, as CI runs it: formatting, lints, all tests (unit, symbolic
# schedule proofs for 1..64 ranks, proptest, thread-rank collectives,
# compile-fail, processes through cclrun, the fault suite, examples, doc
# tests, hosts in network namespaces over SSH, mpirun), loom on the slot
# FIFO and the doorbell, the MPI bootstrap
# (feature `mpi`), ccl-perf's Gloo backend (feature `gloo`), the CUDA
# kernels compiled by NVRTC (feature `cuda`, NVRTC from PyPI into
# .cache/cuda), then every fuzz target for CCL_FUZZ_SECONDS (default 30;
# 0 skips). Installs missing Debian packages first (scripts/deps.sh).
# Tests that need root (namespaces) or mpirun skip without them; run as
# root (as CI does) they are required (CCL_TEST_REQUIRE_ALL=1, unless set).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" -eq 0 ]; then
    export CCL_TEST_REQUIRE_ALL="${CCL_TEST_REQUIRE_ALL:-1}"
fi
rustup component add rustfmt clippy >/dev/null 2>&1 || true
scripts/deps.sh test
cargo fmt --all --check
cargo clippy --workspace --all-targets -q -- -D warnings
# the library as programs see it: without the `internals` feature that the
# workspace's tools turn on, and its docs without a warning
cargo clippy -p ccl -p cclrun -q -- -D warnings
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --workspace -q
cargo clippy -p ccl-integration -p ccl-examples --all-targets --features ccl-integration/mpi,ccl-examples/mpi,ccl-integration/gloo,ccl-examples/gloo -q -- -D warnings
cargo test --workspace
# the slot FIFO and the doorbell under loom (--cfg loom, target/loom)
scripts/loom.sh
# ccl-perf with --backend mpi, then the MPI bootstrap and backend tests
cargo build -p ccl-examples --features mpi --bin ccl-perf
cargo test -p ccl-integration --features mpi --test mpi_feature
# ccl-perf with --backend gloo (Debian's libgloo-dev), then its test
cargo build -p ccl-examples --features gloo --bin ccl-perf
cargo test -p ccl-integration --features gloo --test gloo_feature
# the libibverbs provider: built, linted, and its unit tests (no device here: it finds none)
cargo clippy -p ccl --features rdma --all-targets -q -- -D warnings
cargo test -p ccl --features rdma --lib transport::rdma
# the RDMA check script skips (exit 2) without its binaries or rdma_rxe
set +e
rdma=$(integration/rdma/check.sh 2>&1)
rc=$?
set -e
if [ "$rc" -ne 0 ] && { [ "$rc" -ne 2 ] || ! grep -q "SKIPPED" <<<"$rdma"; }; then
    echo "RDMA check: unexpected exit $rc: $rdma" >&2
    exit 1
fi
# the CUDA kernels, and the kernels of derived structs, through NVRTC for
# sm_80 and sm_90 (no GPU needed); the GPU path's host side on emulated GPUs
# runs in `cargo test --workspace` above
eval "$(scripts/deps.sh cuda)"
cargo clippy --workspace --all-targets --features ccl-kernels/cuda,ccl/cuda,ccl-integration/cuda,ccl-examples/cuda,ccl-examples/nccl -q -- -D warnings
cargo test -p ccl-kernels --features cuda --lib cuda
cargo test -p ccl --features cuda --test gpu_codegen --test gpu
# the GPU check's host half: built, and without a driver it says so (exit 2)
cargo build -q -p cclrun -p ccl-kernels -p ccl-integration -p ccl-examples \
    --features ccl-kernels/cuda,ccl-integration/cuda,ccl-examples/cuda \
    --bin cclrun --bin ccl-gpu-check --bin gpu_matrix --bin ccl-perf
set +e
gpu=$(CCL_GPU_BIN_DIR=target/debug integration/gpu/check.sh 2>&1)
rc=$?
set -e
if [ "$rc" -ne 2 ] || ! grep -q "no CUDA driver" <<<"$gpu"; then
    if [ "$rc" -ne 0 ]; then echo "GPU check: unexpected exit $rc: $gpu" >&2; exit 1; fi
fi
# ... and its steps run through on emulated GPUs (matrix at 1, 2, 4 ranks, staged, device ccl-perf)
CCL_GPU_CHECK_EMULATED=1 CCL_GPU_BIN_DIR=target/debug integration/gpu/check.sh >/tmp/ccl-gpu-check.$$ 2>&1 \
    || { cat /tmp/ccl-gpu-check.$$ >&2; rm -f /tmp/ccl-gpu-check.$$; exit 1; }
tail -n 20 /tmp/ccl-gpu-check.$$
rm -f /tmp/ccl-gpu-check.$$
secs="${CCL_FUZZ_SECONDS:-30}"
if [ "$secs" != 0 ]; then
    scripts/fuzz.sh "$secs"
fi

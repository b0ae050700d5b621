#!/usr/bin/env bash
# The slot FIFO and the doorbell's wait/wake path under loom
# (ccl/src/transport/loom_tests.rs), in a target directory of their own:
# the whole crate builds with `--cfg loom`.
set -euo pipefail
cd "$(dirname "$0")/.."
RUSTFLAGS="--cfg loom ${RUSTFLAGS:-}" CARGO_TARGET_DIR=target/loom \
    cargo test -p ccl --lib --release transport::loom_tests -- "$@"

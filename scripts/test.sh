#!/usr/bin/env bash
# Every check CI runs: formatting, lints, and all tests (unit, symbolic
# schedule proofs for 1..64 ranks, proptest, thread-rank collectives,
# compile-fail, examples, doc tests).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo fmt --all --check
cargo clippy --workspace --all-targets -q -- -D warnings
cargo test --workspace

#!/usr/bin/env bash
# Every check, as CI runs it: formatting, lints, all tests (unit, symbolic
# schedule proofs for 1..64 ranks, proptest, thread-rank collectives,
# compile-fail, processes through cclrun, the fault suite, examples, doc
# tests), then every fuzz target for CCL_FUZZ_SECONDS (default 30; 0 skips).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo fmt --all --check
cargo clippy --workspace --all-targets -q -- -D warnings
cargo test --workspace
secs="${CCL_FUZZ_SECONDS:-30}"
if [ "$secs" != 0 ]; then
    scripts/fuzz.sh "$secs"
fi

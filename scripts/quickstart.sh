#!/usr/bin/env bash
# Installs what ccl needs on a fresh Debian machine (with the Rust toolchain),
# builds it in release mode, and runs the all-reduce benchmark on 4 ranks
# through cclrun: `cclrun -np 4 target/release/ccl-perf -b 8 -e 64M -f 4`.
# Usage: scripts/quickstart.sh [ranks] [ccl-perf flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh build
if ! command -v cargo >/dev/null 2>&1; then
    echo "quickstart: cargo not found; install the Rust toolchain (rustup) first" >&2
    exit 1
fi
cargo build --release -q -p cclrun -p ccl-examples
ranks="${1:-4}"
shift || true
[ $# -gt 0 ] || set -- -b 8 -e 64M -f 4
exec target/release/cclrun -np "$ranks" target/release/ccl-perf "$@"

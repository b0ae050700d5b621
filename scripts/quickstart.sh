#!/usr/bin/env bash
# Installs what ccl needs on a fresh Debian machine (with the Rust toolchain),
# builds it in release mode, and runs a multi-rank all-reduce benchmark.
# Usage: scripts/quickstart.sh [ranks] [max bytes]
set -euo pipefail
cd "$(dirname "$0")/.."
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
if ! command -v cc >/dev/null 2>&1; then
    $sudo apt-get update -q && $sudo apt-get install -y -q build-essential
fi
if ! command -v cargo >/dev/null 2>&1; then
    echo "quickstart: cargo not found; install the Rust toolchain (rustup) first" >&2
    exit 1
fi
cargo build --release -q -p ccl-examples
exec target/release/bench_threads "${1:-4}" "${2:-67108864}"

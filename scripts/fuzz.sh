#!/usr/bin/env bash
# Runs every fuzz target (fuzz/fuzz_targets: hostfile and -H parser, UniqueId
# parser, bootstrap frames and hello decoder, rendezvous table decoder, CCL_*
# values) for a bounded time each, starting from the seeds in fuzz/corpus,
# and prints the executions per target. A crash fails the run and leaves the
# input in fuzz/artifacts/<target>/.
#   scripts/fuzz.sh          # 30 s per target (what CI runs)
#   scripts/fuzz.sh 3600     # an hour per target
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-30}"
if ! command -v cargo-fuzz >/dev/null 2>&1; then
    if ! cargo install --locked cargo-fuzz >/dev/null 2>&1; then
        echo "fuzz: cargo-fuzz cannot be installed here; skipping the fuzz targets"
        exit 0
    fi
fi
cd fuzz
# cargo-fuzz passes nightly-only flags; this lets the stable toolchain accept them
export RUSTC_BOOTSTRAP=1
cargo fuzz build -O >/dev/null 2>&1 || cargo fuzz build -O
for t in $(cargo fuzz list); do
    work="$(mktemp -d)"
    cp corpus/"$t"/* "$work"/ 2>/dev/null || true
    if ! cargo fuzz run -O "$t" "$work" -- -max_total_time="$secs" -print_final_stats=1 >"$work.log" 2>&1; then
        tail -40 "$work.log"
        echo "fuzz: $t FAILED (input saved under fuzz/artifacts/$t/)"
        exit 1
    fi
    runs="$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$work.log" | grep -o '[0-9]*$' || echo '?')"
    echo "fuzz: $t: $runs executions in $secs s, no crash"
    rm -rf "$work" "$work.log"
done

#!/usr/bin/env bash
# The RDMA check, for a machine whose kernel has soft-RoCE (rdma_rxe) or
# real RDMA: two network namespaces joined by a veth pair (scripts/cluster.sh),
# a soft-RoCE device on each end (`rdma link add`), make two hosts with
# real verbs on one machine. Needs root, iproute2's `rdma`, openssh-server
# and, for the comparison, perftest's ib_write_bw.
#   integration/rdma/check.sh --build    # cargo build --release, feature rdma
#   integration/rdma/check.sh            # then, as root, from the repository root
# Steps:
#  1. lists the RDMA devices each host sees (devices bound to their
#     namespace: `rdma system set netns exclusive` while it runs);
#  2. the collective matrix across the two hosts over the libibverbs
#     provider (4 ranks, 2 per host; then 2 channels), each connection
#     said at INFO, which must name an rxe device; each host has two (on
#     eth0 and eth1), and on 2 channels rank 0 must reach rank 2 through
#     both;
#  3. faults over it: a rank killed mid all-reduce (every survivor names a
#     lost rank, exit 137);
#  4. all-reduce between the hosts, 1 rank each, 8 B - 256 MiB (ccl-perf;
#     again at 64-256 MiB from registered buffers, --register),
#     against ib_write_bw's bandwidth on the same link.
# Prints a table last (docs/performance.md shows its format). Exit 0: all
# right; 1: something wrong; 2: skipped (not root, no rdma_rxe, or the
# binaries missing), with a message.
set -uo pipefail
cd "$(dirname "$0")/../.."
bins=${CCL_RDMA_BIN_DIR:-target/release}
if [ "${1:-}" = "--build" ]; then
    exec cargo build --release -p cclrun -p ccl-integration -p ccl-examples --features ccl/rdma \
        --bin cclrun --bin coll_matrix --bin fault --bin ccl-perf
fi
skip() { echo "rdma check: SKIPPED: $*"; exit 2; }
[ "$(id -u)" -eq 0 ] || skip "needs root (network namespaces, rdma link add)"
command -v rdma >/dev/null || skip "no \`rdma\` tool (apt install iproute2)"
for b in cclrun coll_matrix fault ccl-perf; do
    [ -x "$bins/$b" ] || skip "$bins/$b missing: run integration/rdma/check.sh --build first"
done
modprobe rdma_rxe 2>/dev/null
[ -d /sys/module/rdma_rxe ] || skip "this kernel has no rdma_rxe (soft-RoCE): no RDMA to test with"

dir=$(mktemp -d)
mode=$(rdma system show 2>/dev/null | grep -o 'netns [a-z]*' | cut -d' ' -f2)
cleanup() {
    for ns in $(cat "$dir/namespaces" 2>/dev/null); do
        for k in 0 1; do ip netns exec "$ns" rdma link del "rxe${ns##*-h}n$k" 2>/dev/null; done
    done
    scripts/cluster.sh down "$dir"
    [ -n "$mode" ] && rdma system set netns "$mode" 2>/dev/null
    rm -rf "$dir"
}
trap cleanup EXIT
rdma system set netns exclusive || echo "rdma check: could not bind devices to namespaces; both hosts see both"
scripts/cluster.sh up "$dir" 2 2 2 >/dev/null || { echo "rdma check: the namespace hosts did not start"; exit 1; }
for ns in $(cat "$dir/namespaces"); do
    for k in 0 1; do
        ip netns exec "$ns" rdma link add "rxe${ns##*-h}n$k" type rxe netdev "eth$k" ||
            { echo "rdma check: rdma link add on eth$k in $ns failed"; exit 1; }
    done
done
# shellcheck disable=SC1091
source "$dir/env"
read -r -a ssh <<<"$CCLRUN_SSH_ARGS"
run() { timeout 300 "$bins/cclrun" --hostfile "$dir/hostfile" "${ssh[@]}" "$@"; }
fail=0 rows=()
row() { rows+=("$(printf '| %-44s | %-8s | %s' "$1" "$2" "$3")"); [ "$2" = ok ] || fail=1; }

echo "== 1. devices"
for ns in $(cat "$dir/namespaces"); do
    echo "$ns: $(ip netns exec "$ns" rdma link show | tr '\n' ' ')"
done

echo "== 2. matrix over libibverbs"
for extra in "" "-x CCL_NCHANNELS=2 -x CCL_TEST_LARGE=1"; do
    # shellcheck disable=SC2086
    out=$(run -np 4 -x CCL_DEBUG=INFO -x CCL_TIMEOUT=120 $extra "$bins/coll_matrix" 2>&1)
    rc=$?
    ok=$(grep -c "all collectives correct" <<<"$out")
    via=$(grep -c ": rdma rxe" <<<"$out")
    fell=$(grep -m1 "no RDMA" <<<"$out")
    echo "$out" | grep -E "rdma|RDMA|error" | head -8
    # on 2 channels, rank 0's sends to rank 2 (the other host) use both ports
    ports=$(grep "ccl INFO rank 0 send rank 2: rdma rxe" <<<"$out" | awk '{print $NF}' | sort -u | wc -l)
    want=$([ -n "$extra" ] && echo 2 || echo 1)
    if [ "$rc" -eq 0 ] && [ "$ok" -eq 4 ] && [ "$via" -gt 0 ] && [ "$ports" -ge "$want" ]; then
        row "matrix, 4 ranks on 2 hosts ${extra:+($extra)}" ok "$via connections over rxe, $ports port(s) 0 -> 2"
    elif [ "$ports" -lt "$want" ]; then
        row "matrix, 4 ranks on 2 hosts ${extra:+($extra)}" WRONG "rank 0 reached rank 2 through $ports port(s)"
    else
        row "matrix, 4 ranks on 2 hosts ${extra:+($extra)}" WRONG "exit $rc, $ok correct, $via over rxe ${fell}"
    fi
done

echo "== 3. faults"
t0=$(date +%s%N)
out=$(run -np 4 "$bins/fault" kill 1 2>&1)
rc=$?
took=$(awk -v a="$t0" -v b="$(date +%s%N)" 'BEGIN { printf "%.2f", (b - a) / 1e9 }')
errs=$(grep -c " error: " <<<"$out")
named=$(grep " error: " <<<"$out" | grep -c "lost rank")
echo "$out" | grep " error: "
if [ "$rc" -eq 137 ] && [ "$errs" -gt 0 ] && [ "$errs" -eq "$named" ]; then
    row "kill -9 a rank mid all_reduce" ok "$errs survivors named a lost rank in ${took} s"
else
    row "kill -9 a rank mid all_reduce" WRONG "exit $rc, $named of $errs named a lost rank"
fi

echo "== 4. all-reduce against ib_write_bw"
perf=$(run -np 2 --map-by node "$bins/ccl-perf" -C all_reduce -b 8 -e 256M -f 4 -n 20 -w 5 2>&1)
echo "$perf" | grep -E "^ +[0-9]"
# busbw (out of place) at 64 MiB and above, and the 8 B time
top() { awk '$1 ~ /^[0-9]+$/ && $1 >= 67108864 { if ($8 > m) m = $8 } END { print m + 0 }'; }
busbw=$(top <<<"$perf")
lat=$(awk '$1 == 8 { print $6 }' <<<"$perf")
# the same from registered buffers (sent without the copy into slots)
reg=$(run -np 2 --map-by node "$bins/ccl-perf" -C all_reduce -b 64M -e 256M -f 4 -n 20 -w 5 --register 2>&1)
echo "$reg" | grep -E "^ +[0-9]"
regbw=$(top <<<"$reg")
row "all_reduce busbw >= 64 MiB, registered buffers" "$([ "$regbw" != 0 ] && echo ok || echo WRONG)" \
    "$regbw GB/s (from slots: $busbw GB/s)"
wbw=
if command -v ib_write_bw >/dev/null; then
    ns1=$(sed -n 1p "$dir/namespaces") ns2=$(sed -n 2p "$dir/namespaces")
    server=$(head -1 "$dir/hostfile" | cut -d' ' -f1)
    ip netns exec "$ns1" timeout 60 ib_write_bw -d rxe1 -F --report_gbits -s 8388608 -n 200 >/dev/null 2>&1 &
    srv=$!
    sleep 1
    wbw=$(ip netns exec "$ns2" timeout 60 ib_write_bw -d rxe2 -F --report_gbits -s 8388608 -n 200 "$server" 2>&1 |
        awk '$1 == 8388608 { print $4 / 8 }')
    kill "$srv" 2>/dev/null
    wait "$srv" 2>/dev/null
fi
if [ -n "$wbw" ] && [ "$busbw" != 0 ]; then
    pct=$(awk -v a="$busbw" -v b="$wbw" 'BEGIN { printf "%d", 100 * a / b }')
    row "all_reduce busbw >= 64 MiB / ib_write_bw" "$([ "$pct" -ge 90 ] && echo ok || echo SLOW)" \
        "$busbw GB/s / $wbw GB/s = $pct % (goal 90 %); 8 B: $lat us"
else
    row "all_reduce busbw >= 64 MiB" "$([ "$busbw" != 0 ] && echo ok || echo WRONG)" \
        "$busbw GB/s; 8 B: $lat us; ib_write_bw: ${wbw:-not installed (apt install perftest)}"
fi

echo
echo "| step                                         | outcome  | detail"
printf '%s\n' "${rows[@]}"
exit "$fail"

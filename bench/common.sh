# Shared by the bench scripts, which source it from the repository root.

# Sets `bind` to cclrun's options for RANKS ranks on this machine: each
# bound to a core when there are no more ranks than cores (as Open MPI
# binds its ranks; runs are steadier), none otherwise.
bind_ranks() {
    bind=()
    if [ "$1" -le "$(nproc)" ]; then bind=(--bind-to core); fi
}

# awk functions the scripts' programs start with: the median of a
# space-separated list of numbers, the numeric keys of an array sorted
# into order[1..n] (n returned), and the placement of each run.
# shellcheck disable=SC2034 # used by the scripts that source this file
stats_awk='
    function median(s,   a, n, i, j, t) {
        n = split(s, a, " ")
        for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
        return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
    }
    function sorted_keys(set, order,   k, i, j, t, s) {
        k = 0
        for (s in set) order[++k] = s + 0
        for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++) if (order[j] < order[i]) { t = order[i]; order[i] = order[j]; order[j] = t }
        return k
    }
    # a run of key `run` read `before` and `after` (ns; see `placed`):
    # near_run[run] says whether both are under near_ns (an awk variable)
    function placed(run, before, after) {
        near_run[run] = before < near_ns + 0 && after < near_ns + 0
        runs++; near_runs += near_run[run]; readings = readings " " before "/" after
    }
    function placement_report() {
        printf "# runs in the near placement (core-latency under %d ns before and after): %d of %d\n", near_ns, near_runs, runs
        printf "# core-latency before/after each run (ns):%s\n", readings
    }
'

# The host places this VM's vCPUs near each other or far apart, changing
# every few seconds to minutes, and small collectives run 3-4x slower in
# the far placement. `placement` prints the round trip of a cache line
# between CPUs 0 and 1 (core-latency, in ns; 0 on a machine with one CPU).
# The scripts take it before and after each run: a run is in the near
# placement when both are under `near_ns` (about 80 against 330 ns on the
# project's 2-core machine).
near_ns=200
placement() {
    target/release/core-latency 2>/dev/null || echo 0
}

# Runs "$@" (its redirections are the caller's) between two readings of
# `placement`, which go to FILE as "before after".
placed() {
    local file=$1 before
    shift
    before=$(placement)
    "$@"
    echo "$before $(placement)" >"$file"
}

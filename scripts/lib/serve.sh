# Waiting for an `atou serve` the benchmarks started on loopback (sourced
# by scripts/bench-crypto.sh, scripts/bench-loopback.sh and
# scripts/bench-transfer.sh).
#
#   serve_wait PID ERR LABEL [SECS]   wait until the server writing its
#                                     stderr to ERR prints `listening`;
#                                     die, with the end of ERR, if it exits
#                                     first or says nothing for SECS seconds
#                                     (default 30)
#   kill_tree PID                     stop PID and everything it started:
#                                     a server run under /usr/bin/time or
#                                     timeout outlives its wrapper's kill
#                                     (one, left listening after a failed
#                                     CI run, held the next run's port)
# The caller's die() reports failures.
#
# A fixed 5 s and then going on regardless once sent a probe to a port
# nobody listened on yet (CI, bench-crypto, with the machine busy): the
# probe's "connection refused" named the wrong culprit.

serve_wait() {
    local pid=$1 err=$2 label=$3 secs=${4:-30} i
    for i in $(seq $((secs * 10))); do
        grep -q listening "$err" 2>/dev/null && return 0
        if ! kill -0 "$pid" 2>/dev/null; then
            wait "$pid" 2>/dev/null || true
            die "$label: atou serve exited before listening: $(tail -n 2 "$err" 2>/dev/null)"
        fi
        sleep 0.1
    done
    die "$label: atou serve not listening after $secs s: $(tail -n 2 "$err" 2>/dev/null)"
}

kill_tree() {
    local child
    for child in $(pgrep -P "$1" 2>/dev/null); do kill_tree "$child"; done
    kill "$1" 2>/dev/null || true
}

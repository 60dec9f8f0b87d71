# Stopping an `atou netem` bridge a benchmark started (sourced by
# scripts/bench-netem.sh and scripts/bench-compress.sh).
#
#   stop_bridge    TERM the bridge in $bridge_pid (KILL after 10 s), reap it,
#                  clear $bridge_pid, and wait up to 10 s for its two hosts,
#                  the namespaces ${hosts[0]} and ${hosts[1]}, to be gone
#
# Notes go to stderr under the name in $bridge_who (default: bench).

stop_bridge() {
    [ -n "$bridge_pid" ] || return 0
    kill -TERM "$bridge_pid" 2>/dev/null || true
    for _ in $(seq 100); do
        kill -0 "$bridge_pid" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$bridge_pid" 2>/dev/null; then
        echo "${bridge_who:-bench}: note: the bridge did not stop within 10 s; killed" >&2
        kill -KILL "$bridge_pid" 2>/dev/null || true
    fi
    wait "$bridge_pid" 2>/dev/null || true
    bridge_pid=
    # The hosts are gone before the next bridge makes them again (a host
    # that vanished under a transfer once ended a run).
    for _ in $(seq 100); do
        [ -e "/run/netns/${hosts[0]}" ] || [ -e "/run/netns/${hosts[1]}" ] || return 0
        sleep 0.1
    done
    echo "${bridge_who:-bench}: note: the hosts outlived their bridge; the next bridge removes them" >&2
}

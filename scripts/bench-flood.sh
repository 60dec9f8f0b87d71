#!/usr/bin/env bash
# What a hello flood costs `atou serve --dir` on loopback, and what it
# costs an authorized transfer, in one run:
#   1. an authorized SIZE send (default 50M), unloaded: ROUNDS rounds after
#      a warm-up, median;
#   2. examples/hello_flood replaying one hello of a key the server does
#      not authorize, as fast as one thread sends, for FLOOD_SECS (default
#      12) s from one address: the server's CPU over the flood, as a share
#      of one core (/proc/PID/stat; target <= 35 %), what came back per
#      byte sent, and then the same flood again with an authorized send
#      started 2 s into it: its time against the unloaded median (target
#      <= 5x);
#   3. the same from SOURCES addresses (default 1000, 127.1.x.y: each a
#      source address of its own on loopback, no raw sockets needed);
#   4. the same from SOURCES addresses with distinct hellos (hello_flood's
#      `distinct`: each a new one, its source's cookie spliced in), so that
#      every hello the budgets let through (1,000 a second) costs the
#      server two X25519 operations: the authorized send's time against
#      the unloaded median shows whether established connections wait
#      behind hellos' work (they should not: it runs on a thread of its
#      own);
#   5. the same from one address with `varied` hellos (the one hello with
#      a client id of its own each time): as cheap to send as a replay,
#      but nothing a lookup or the kernel filter recognises, so the server
#      reads every one; what that costs it.
# With REF_ATOU (another atou binary), the same against that build's serve
# and send first, for a before and after in one run; REF_FLOOD is
# hello_flood built from that build's source, when its handshake's wire
# version differs. Figures only; fails if a send does not arrive intact.
#
# Environment: SIZE (50M), ROUNDS (3), FLOOD_SECS (12), SOURCES (1000),
# PORT (7897), REF_ATOU and REF_FLOOD (optional).
set -euo pipefail
cd "$(dirname "$0")/.."

size=${SIZE:-50M}
rounds=${ROUNDS:-3}
flood_secs=${FLOOD_SECS:-12}
sources=${SOURCES:-1000}
port=${PORT:-7897}
ref=${REF_ATOU:-}
ref_flood=${REF_FLOOD:-}
work=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill_tree "$p"; done
    rm -rf "$work"
}
trap cleanup EXIT
die() { echo "bench-flood: $*" >&2; exit 1; }
# shellcheck source=scripts/lib/serve.sh
. scripts/lib/serve.sh

cargo build --release --quiet
cargo build --release --quiet --example hello_flood
atou=$PWD/target/release/atou
flood=$PWD/target/release/examples/hello_flood
[ -z "$ref" ] || [ -x "$ref" ] || die "REF_ATOU=$ref is not an executable"

"$atou" keygen -f "$work/server" >/dev/null
"$atou" keygen -f "$work/client" >/dev/null
cp "$work/client.pub" "$work/authorized_keys"
head -c "$(numfmt --from=iec "${size%B}")" /dev/urandom >"$work/data"
key=$(cut -d' ' -f1-2 "$work/server.pub")
ticks=$(getconf CLK_TCK)

# calc EXPR: its value, in floating point.
calc() { awk "BEGIN { print $1 }"; }

# cpu_ticks PID: user + system clock ticks of PID so far.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# worker_ticks PID: the same for PID's handshake thread (0 if it has none:
# a build from before the handshake worker thread works hellos on its I/O thread). The comm
# field has no spaces here, so the fields count as in cpu_ticks.
worker_ticks() {
    local t
    for t in /proc/"$1"/task/*; do
        [ "$(cat "$t/comm" 2>/dev/null)" = atou-handshakes ] && awk '{print $14 + $15}' "$t/stat" && return
    done
    echo 0
}

# send_once ATOU NAME: one authorized send into DEST/NAME; prints seconds.
send_once() {
    local bin=$1 name=$2 t0 t1
    t0=$(date +%s.%N)
    "$bin" send "$work/data" "127.0.0.1:$port:$name" --identity "$work/client" \
        --server-key "$work/server.pub" --quiet >"$work/send.out" 2>"$work/send.err" ||
        die "send $name failed: $(tail -n 2 "$work/send.err")"
    t1=$(date +%s.%N)
    cmp -s "$work/data" "$work/dest/$name/data" || die "send $name: the file differs"
    rm -rf "${work:?}/dest/$name"
    calc "$t1 - $t0"
}

# run LABEL ATOU FLOOD: the whole measurement against one build.
run() {
    local label=$1 bin=$2 flood=$3 s times=() unloaded n mode kind cpu0 cpu1 w0 w1 f t fp
    rm -rf "$work/dest" && mkdir -p "$work/dest"
    "$bin" serve --bind "127.0.0.1:$port" --dir "$work/dest" --identity "$work/server" \
        --authorized-keys "$work/authorized_keys" --no-fsync >"$work/serve.out" 2>"$work/serve.err" &
    s=$!
    pids+=("$s")
    serve_wait "$s" "$work/serve.err" "$label"
    send_once "$bin" warmup >/dev/null
    for n in $(seq "$rounds"); do times+=("$(send_once "$bin" "unloaded$n")"); done
    unloaded=$(printf '%s\n' "${times[@]}" | sort -n | sed -n "$(( (rounds + 1) / 2 ))p")
    printf '%s: authorized %s send, unloaded: %s s (median of %s: %s)\n' \
        "$label" "$size" "$unloaded" "$rounds" "$(printf '%.3f ' "${times[@]}")"
    for kind in "1 same" "$sources same" "$sources distinct" "1 varied"; do
        set -- $kind
        n=$1 mode=$2
        cpu0=$(cpu_ticks "$s") w0=$(worker_ticks "$s")
        f=$("$flood" "127.0.0.1:$port" "$key" "$flood_secs" "$n" "$mode")
        cpu1=$(cpu_ticks "$s") w1=$(worker_ticks "$s")
        printf '%s: %s\n' "$label" "$f"
        printf '%s: server CPU during the %s flood from %s address(es): %.1f %% of one core (target <= 35 %%), of which the handshake thread %.1f %%\n' \
            "$label" "$mode" "$n" "$(calc "($cpu1 - $cpu0) * 100 / $ticks / $flood_secs")" \
            "$(calc "($w1 - $w0) * 100 / $ticks / $flood_secs")"
        "$flood" "127.0.0.1:$port" "$key" "$flood_secs" "$n" "$mode" >"$work/flood.out" &
        fp=$!
        pids+=("$fp")
        sleep 2
        t=$(send_once "$bin" "flooded$n$mode")
        wait "$fp" 2>/dev/null || true
        printf '%s: authorized send during the %s flood from %s address(es): %.3f s, %.2fx unloaded (target <= 5x)\n' \
            "$label" "$mode" "$n" "$t" "$(calc "$t / $unloaded")"
    done
    kill_tree "$s"
    wait "$s" 2>/dev/null || true
}

[ -z "$ref" ] || run ref "$ref" "${ref_flood:-$flood}"
run atou "$atou" "$flood"

#!/usr/bin/env bash
# A 20 MB `atou send` across two network namespaces, clean and through a
# hop that drops IP packets over 1,400 bytes (nft at the receiver's
# input; the sender's veth segments GSO batches, as a wire would), RUNS
# times each: the path MTU each run found, its goodput and its wall time
# (the search included); then through the same hop with the path cache
# holding the clean path's size, as when the hop appears after a search:
# the send steps down during the transfer; last, through the same hop
# with `--mss 1472` forced, which is not stepped down: each such send
# must fail with exit 10 and the message naming `--mss 1372`, and its
# time to failure is printed. Needs root, ip and nft.
#   scripts/bench-pmtu.sh [ATOU] [RUNS]
set -euo pipefail
atou=${1:-target/release/atou}
runs=${2:-3}
a=atou-bpm-a b=atou-bpm-b
work=$(mktemp -d)
serve=
cleanup() {
    [ -n "$serve" ] && kill "$serve" 2>/dev/null || true
    ip netns del "$a" 2>/dev/null || true
    ip netns del "$b" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
ip netns add "$a"
ip netns add "$b"
ip -n "$a" link add bpm1 type veth peer name bpm2 netns "$b"
ip -n "$a" addr add 10.80.0.1/24 dev bpm1
ip -n "$b" addr add 10.80.0.2/24 dev bpm2
for ns in "$a" "$b"; do ip -n "$ns" link set lo up; done
ip -n "$a" link set bpm1 up gso_max_segs 1
ip -n "$b" link set bpm2 up
head -c 20000000 /dev/urandom >"$work/f"
mkdir "$work/dest"
ip netns exec "$b" "$atou" serve --bind 10.80.0.2:7890 --dir "$work/dest" --no-auth >/dev/null 2>&1 &
serve=$!
sleep 1
run() {
    local label=$1 i cache=${2:-}
    for i in $(seq "$runs"); do
        rm -f "$work/dest/f"
        local t0 t1 out
        if [ -n "$cache" ]; then
            rm -rf "$work/cache" && cp -r "$cache" "$work/cache"
            t0=$(date +%s.%N)
            out=$(XDG_CACHE_HOME="$work/cache" ip netns exec "$a" "$atou" send --quiet --json --no-auth "$work/f" 10.80.0.2:7890)
        else
            t0=$(date +%s.%N)
            out=$(ip netns exec "$a" "$atou" send --quiet --json --no-auth --no-path-cache "$work/f" 10.80.0.2:7890)
        fi
        t1=$(date +%s.%N)
        echo "$out" | python3 -c "
import json, sys
r = json.load(sys.stdin)
print('$label run $i: path MTU %d (%s) goodput %.0f Mbit/s, wall %.3f s' % (
    r['path_mtu']['path_mtu'], r['path_mtu']['from'], r['goodput_bps'] / 1e6, $t1 - $t0))"
        cmp -s "$work/f" "$work/dest/f" || { echo "$label run $i: not intact"; exit 1; }
    done
}
run clean
# The path cache learns the clean path's size.
rm -f "$work/dest/f"
XDG_CACHE_HOME="$work/seed" ip netns exec "$a" "$atou" send --quiet --no-auth "$work/f" 10.80.0.2:7890
rm -f "$work/dest/f"
ip netns exec "$b" nft add table inet bh
ip netns exec "$b" nft add chain inet bh in '{ type filter hook input priority 0 ; }'
ip netns exec "$b" nft add rule inet bh in ip length gt 1400 drop
run blackhole
run stepped-down "$work/seed"
# A forced size is the user's: the send fails, saying what to try.
for i in $(seq "$runs"); do
    rm -f "$work/dest/f"
    t0=$(date +%s.%N)
    status=0
    said=$(ip netns exec "$a" timeout 120 "$atou" send --quiet --no-auth --no-path-cache --mss 1472 \
        "$work/f" 10.80.0.2:7890 2>&1) || status=$?
    t1=$(date +%s.%N)
    want="the path stopped carrying 1472-byte datagrams (UDP payload) during the transfer; 1372-byte ones still get through: try --mss 1372"
    case "$said" in *"$want"*) ;; *) echo "forced run $i: exit $status, not the message: $said"; exit 1 ;; esac
    [ "$status" = 10 ] || { echo "forced run $i: exit $status, not 10: $said"; exit 1; }
    python3 -c "print('forced --mss 1472 run $i: exit $status after %.3f s' % ($t1 - $t0))"
done

#!/usr/bin/env bash
# Real-socket speed on loopback, all in one run:
#   iperf3 UDP blast (-u -b 0 -l 1472): the rate its receiver got;
#   iperf3 TCP: the kernel's reliable stream;
#   atou probe --bytes 4G --mss 1472 --no-auth against atou serve: goodput
#   (the transport against iperf3; scripts/bench-crypto.sh measures what
#   encryption costs).
# Prints atou's goodput as a ratio of each (target: >= 1.0x iperf3's UDP
# received rate, stretch 2x) and atou's CPU seconds per GB at each end.
#
# Environment: BYTES (default 4G), SECS (iperf3 seconds, default 5),
# PORT (atou, default 7890), IPERF_PORT (default 5201).
set -euo pipefail
cd "$(dirname "$0")/.."

bytes=${BYTES:-4G}
secs=${SECS:-5}
port=${PORT:-7890}
iperf_port=${IPERF_PORT:-5201}
work=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill_tree "$p"; done
    rm -rf "$work"
}
trap cleanup EXIT
die() { echo "bench-loopback: $*" >&2; exit 1; }
# shellcheck source=scripts/lib/serve.sh
. scripts/lib/serve.sh

if ! command -v iperf3 >/dev/null; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "bench-loopback: iperf3 is missing; install it (apt-get install iperf3) or run as root" >&2
        exit 1
    fi
    echo "bench-loopback: installing iperf3" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq iperf3 >/dev/null 2>&1 ||
        { apt-get update -qq && apt-get install -y -qq iperf3 >/dev/null; }
fi
cargo build --release --quiet
atou=target/release/atou

# iperf3 [client args...]: one server per test, JSON out.
iperf() {
    iperf3 -s -1 -p "$iperf_port" >/dev/null 2>&1 &
    local server=$!
    sleep 0.3
    iperf3 -c 127.0.0.1 -p "$iperf_port" -t "$secs" -J "$@" >"$work/iperf.json"
    wait "$server" || true
    python3 - "$work/iperf.json" <<'PY'
import json, sys
end = json.load(open(sys.argv[1]))["end"]
recv = end.get("sum_received") or end["sum"]
lost = end.get("sum", {}).get("lost_percent")
print(f'{recv["bits_per_second"]:.0f} {lost if lost is not None else 0:.3f}')
PY
}

read -r udp_bps udp_lost < <(iperf -u -b 0 -l 1472)
read -r tcp_bps _ < <(iperf)

# atou: the server's and the probe's CPU (user + system) from /usr/bin/time.
/usr/bin/time -f '%U %S' -o "$work/serve.time" \
    "$atou" serve --bind "127.0.0.1:$port" --once --json >"$work/serve.json" 2>"$work/serve.err" &
serve_pid=$!
pids+=("$serve_pid")
serve_wait "$serve_pid" "$work/serve.err" "loopback"
/usr/bin/time -f '%U %S' -o "$work/probe.time" \
    "$atou" probe "127.0.0.1:$port" --bytes "$bytes" --mss 1472 --no-auth --json >"$work/probe.json"
wait "$serve_pid"

python3 - "$work" "$udp_bps" "$udp_lost" "$tcp_bps" "$bytes" "$secs" <<'PY'
import json, sys
work, udp, udp_lost, tcp, nbytes = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
p = json.load(open(f"{work}/probe.json"))
r = json.loads(open(f"{work}/serve.json").readline())
assert p["status"] == "finished", p["status"]
assert r["corrupt_bytes"] == 0 and r["stats"]["bytes"] == p["bytes"], r
cpu = lambda f: sum(map(float, open(f"{work}/{f}").read().split()[-2:]))
gb = p["bytes"] / 1e9
atou = p["goodput_bps"]
print(f"loopback, one run; atou sends {nbytes}, iperf3 runs {sys.argv[6]} s each")
print(f"  iperf3 UDP -b 0 -l 1472, received: {udp/1e9:8.3f} Gbit/s (lost {udp_lost:.2f}%)")
print(f"  iperf3 TCP:                        {tcp/1e9:8.3f} Gbit/s")
print(f"  atou probe --mss 1472, goodput:    {atou/1e9:8.3f} Gbit/s "
      f"({p['bytes']} bytes in {p['secs']:.3f} s; rxmts {p['rxmts']} timeouts {p['timeouts']} enobufs {p['enobufs']})")
print(f"  atou / iperf3 UDP: {atou/udp:.2f}x  (target >= 1.0x, stretch 2x)")
print(f"  atou / iperf3 TCP: {atou/tcp:.2f}x")
print(f"  atou CPU per GB (user+sys): probe {cpu('probe.time')/gb:.3f} s, server {cpu('serve.time')/gb:.3f} s")
PY

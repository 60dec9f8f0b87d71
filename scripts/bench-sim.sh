#!/usr/bin/env bash
# Simulator speed: 100 MB over `rate 100mbit delay 50ms limit 1000 loss 1%`
# (target: under 2 s of CPU in release). A loss-free run
# of the same 100 MB in the same invocation is the reference the ratio is
# taken against, so the figure means something on any machine.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet
atou=target/release/atou
bytes=${BYTES:-100MB}
lossy=${FWD:-"rate 100mbit delay 50ms limit 1000 loss 1%"}
clean="rate 100mbit delay 50ms limit 1000"
rev="delay 50ms"

# Runs atou sim with SPEC; prints "cpu_seconds pkts_out pkts_in virtual_secs goodput_bps".
run() {
    local spec=$1 out cpu
    local TIMEFORMAT='%U %S'
    exec 3>&1
    cpu=$( { time "$atou" sim --bytes "$bytes" --fwd "$spec" --rev "$rev" --json > /tmp/atou-bench-sim.json; } 2>&1 )
    exec 3>&-
    python3 - "$cpu" <<'PY'
import json, sys
u, s = map(float, sys.argv[1].split())
j = json.load(open("/tmp/atou-bench-sim.json"))
assert j["status"] == "finished", j["status"]
assert j["sim"]["first_error"] is None
print(f'{u + s:.3f} {j["pkts_out"]} {j["pkts_in"]} {j["secs"]:.1f} {j["goodput_bps"]:.0f}')
PY
}

read -r cpu out in vsecs goodput < <(run "$lossy")
read -r ref_cpu ref_out ref_in ref_vsecs ref_goodput < <(run "$clean")

python3 - "$cpu" "$out" "$in" "$vsecs" "$goodput" "$ref_cpu" "$ref_out" "$ref_in" "$bytes" "$lossy" <<'PY'
import sys
cpu, out, acks, vsecs, goodput, ref_cpu, ref_out, ref_in = map(float, sys.argv[1:9])
bytes_, spec = sys.argv[9], sys.argv[10]
print(f"atou sim, {bytes_} over '{spec}' (rev 'delay 50ms')")
print(f"  simulated: {vsecs:.1f} s of virtual time, {out:.0f} data segments, {acks:.0f} ACKs, goodput {goodput/1e6:.3f} Mbit/s")
print(f"  CPU: {cpu:.3f} s  ({out/cpu:,.0f} data segments/s, {(out+acks)/cpu:,.0f} packets/s)")
print(f"  target: under 2 s of CPU -> {'MET' if cpu < 2 else 'MISSED'} ({cpu/2:.2f} of the budget)")
print(f"reference, same run: {bytes_} loss-free: CPU {ref_cpu:.3f} s ({ref_out/ref_cpu:,.0f} data segments/s)")
print(f"  lossy/loss-free CPU ratio: {cpu/ref_cpu:.2f}")
PY

# BBR on a gigabit path: a 1 Gbit/s, 100 ms, 0.1 % path in the
# simulator (the bridge cannot carry it here); target: atou bbr >= 0.8 x
# rate in steady state (after Startup: the window from 5 s to the end).
# The delay stages get a limit above the 4250 datagrams a 50 ms delay
# line holds at 1 Gbit/s (netem's default limit, 1000, would drop them).
# Windows: atou's 8192 segments (965 Mbit/s at 100 ms, one BDP), what a
# config file means, and the commands' defaults, 32768, sized for BBR's
# two BDPs with room for out-of-order data.
gfwd=${GFWD:-"rate 1gbit limit 10000 | delay 50ms limit 100000 loss 0.1%"}
grev="delay 50ms limit 100000"
gsecs=${GSECS:-30}
echo
echo "atou sim, bbr over '$gfwd' (rev '$grev'), ${gsecs} s, goodput from 5 s"
for windows in ",rcvwin=8192,rcvsegs=8192" ""; do
    "$atou" sim --fwd "$gfwd" --rev "$grev" --flow "cc=bbr$windows" \
        --duration "${gsecs}s" --measure-from 5s --json > /tmp/atou-bench-sim-1g.json
    python3 - "${windows#,}" <<'PY'
import json, sys
j = json.load(open("/tmp/atou-bench-sim-1g.json"))
f = j["flows"][0]
s = f["summary"]
assert s["sim"]["first_error"] is None
ratio = f["goodput_bps"] / j["bottleneck_bps"]
windows = sys.argv[1] + " (atou's, a config file's)" if sys.argv[1] else "rcvwin=32768,rcvsegs=32768 (the commands' defaults)"
print(f"  {windows}: goodput {f['goodput_bps']/1e6:.1f} Mbit/s = {ratio:.3f} x rate "
      f"(target 0.8: {'MET' if ratio >= 0.8 else 'MISSED'}), mean RTT {s['avgrtt']*1e3:.1f} ms, "
      f"{s['rxmts']} retransmissions, {s['timeouts']} timeouts")
PY
done

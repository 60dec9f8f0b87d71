#!/usr/bin/env bash
# The plots of the papers' scenarios in docs/plots/ (docs/congestion.md,
# "Plots of the papers' scenarios"), each made by a real simulated run with
# `atou sim --plot`. Every run is seeded (--seed 1, the default), so the same
# build makes the same SVGs; rerun after a change to the protocol and commit
# what changed. The commands are the ones the doc shows.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --quiet --release
atou=target/release/atou
out=docs/plots
mkdir -p "$out"

# Hoe §2.2.2, scenario H1: slow start overflows a 10-packet queue at
# 1.6 Mbit/s; Reno needs timeouts, NewReno repairs every loss by partial ACKs.
for variant in reno newreno; do
  "$atou" sim --bytes 1MiB --fwd 'rate 1.6mbit limit 10 | delay 50ms' --rev 'delay 50ms' \
    --cc aimd --undo 0 --recovery "$variant" --mss 1049 --rcvwin 50 --thresh-init 1.28 --initsegs 1 \
    --plot "$out/hoe-h1-$variant.svg" >/dev/null
done

# Mathis §3.1 at 1 % random loss, no standing queue: cwnd's sawtooth.
"$atou" sim --bytes 0 --maxpkts 6000 --fwd 'rate 100mbit delay 50ms limit 100000 loss 1%' \
  --rev 'delay 50ms' --cc aimd --undo 0 --recovery sack --mss 1493 --rcvwin 1048576 \
  --rcvsegs 1048576 --delack 0 --plot "$out/mathis-1pct.svg" >/dev/null

# atou appendix B: FACK with rampdown, segment 200 dropped twice.
"$atou" sim --bytes 1MiB --fwd 'rate 10mbit delay 20ms' --rev 'delay 20ms' \
  --cc aimd --undo 0 --recovery fack --rampdown 1 --rcvwin 26 --droplist 200,200 \
  --plot "$out/fack-rampdown.svg" >/dev/null

# BBR's Startup at 1 % random loss on the bench path, its first two seconds
# (docs/congestion.md, "Startup under random loss"). Its pair,
# bbr-startup-1pct-before.svg, is the same run by the build of main at
# 1a09e5f, before fast recovery stopped holding Startup to packet
# conservation; it is not redrawn here.
"$atou" sim --cc bbr --bytes 0 --maxtime 2 --fwd 'rate 100mbit limit 1000 | delay 50ms loss 1%' \
  --rev 'delay 50ms' --plot "$out/bbr-startup-1pct.svg" >/dev/null

# BBR alone on the bench path's 1000-packet queue, its first six seconds:
# Startup, then a ProbeBW cycle whose Up ends once a min_rtt has passed
# with 1.25 BDP in flight (docs/congestion.md, "A short queue on deep
# buffers"). Its pair, bbr-deep-buffer-before.svg, is the same run by the
# build of 18432cc, before that exit; it is not redrawn here.
"$atou" sim --cc bbr --bytes 0 --maxtime 6 --fwd 'rate 100mbit limit 1000 | delay 50ms' \
  --rev 'delay 50ms' --plot "$out/bbr-deep-buffer.svg" >/dev/null

ls -l "$out"

#!/usr/bin/env bash
# `atou copy` push over ssh with UDP open, then with UDP dropped (the ssh
# tunnel, issue 29): two network namespaces (atou-tun-n, atou-tun-f)
# joined by a veth, a private sshd in the far one (scripts/lib/ssh.sh),
# 64 MiB of random bytes pushed 3 times each way; nft drops UDP coming in
# from the veth at both ends for the second set. Prints one line per run:
# the path the report names, wall time of the command, the send's own
# seconds and goodput. Needs root, ip and nft; ATOU (default
# target/release/atou) is both ends' binary. Figures for docs/transfer.md
# ("Over ssh", step 5).
set -euo pipefail
die() { echo "bench-tunnel: $*" >&2; exit 1; }
note() { echo "bench-tunnel: $*" >&2; }
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib/ssh.sh"
ATOU=$(realpath "${ATOU:-$here/../target/release/atou}")
[ -x "$ATOU" ] || die "no $ATOU: cargo build --release first"
[ "$(id -u)" -eq 0 ] || die "needs root (network namespaces)"
command -v nft >/dev/null || die "needs nft (apt-get install nftables)"
ssh_tools_install note die
N=atou-tun-n F=atou-tun-f
D=$(mktemp -d /tmp/atou-bench-tunnel.XXXXXX)
chmod 755 "$D"
cleanup() { sshd_stop; ip netns del $N 2>/dev/null || true; ip netns del $F 2>/dev/null || true; rm -rf "$D"; }
trap cleanup EXIT
ip netns add $N
ip netns add $F
ip link add atou-tun-vn type veth peer name atou-tun-vf
ip link set atou-tun-vn netns $N
ip link set atou-tun-vf netns $F
ip -n $N addr add 10.78.0.1/24 dev atou-tun-vn
ip -n $F addr add 10.78.0.2/24 dev atou-tun-vf
for ns in $N $F; do ip -n $ns link set lo up; done
ip -n $N link set atou-tun-vn up
ip -n $F link set atou-tun-vf up
head -c $((64 << 20)) /dev/urandom >"$D/big"
sshd_start "$D/ssh" 10.78.0.2 2222 ip netns exec $F
sshd_wait 10.78.0.2 ip netns exec $N
for mode in udp ssh; do
  if [ $mode = ssh ]; then
    for ns in $N $F; do
      ip netns exec $ns nft add table inet f
      ip netns exec $ns nft add chain inet f input '{ type filter hook input priority 0; }'
      ip netns exec $ns nft add rule inet f input iifname != lo meta l4proto udp drop
    done
  fi
  for _ in 1 2 3; do
    rm -rf "$D/out"
    start=$(date +%s.%N)
    ip netns exec $N "$ATOU" copy "$D/big" "$ssh_user@10.78.0.2:$D/out" --ssh "$ssh_cmd" \
      --remote-atou "$ATOU" --no-path-cache --json >"$D/report" 2>"$D/err" ||
      die "copy failed: $(tail -n 2 "$D/err")"
    end=$(date +%s.%N)
    cmp -s "$D/big" "$D/out/big" || die "the copy differs"
    python3 - "$D/report" "$mode" "$start" "$end" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
wall = float(sys.argv[4]) - float(sys.argv[3])
print(f"blocked udp: {sys.argv[2] == 'ssh'}  path {r.get('path')}  wall {wall:.2f} s  "
      f"send {r['secs']:.2f} s  {r['goodput_bps'] / 1e6:.0f} Mbit/s")
PY
  done
done

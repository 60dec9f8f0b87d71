#!/usr/bin/env bash
# What compression buys on a slow path (issue 30 point 4): a source tree
# and a random file pushed from host A to host B over `atou netem bridge`
# at 10 Mbit/s and at 100 Mbit/s (DELAY_MS, 10 ms, each way), by
#   atou send to atou serve --dir (authenticated and encrypted, as users run it),
#   atou send --compress, once `atou send --help` has the flag (skipped before),
#   rsync -a -z over ssh, scp -C (-r for the tree) and, for reference,
#   rsync -a without compression (a private sshd in B, scripts/lib/ssh.sh).
# Plain scp is left out: scp -C shows what scp does, and each one of the
# tree's files costs scp -r round trips (bench-netem.sh: ~0.6 s a file).
# Per path and data: one uncounted warm-up per tool, then ROUNDS rounds with
# the tools rotated; the whole command's wall clock, min / median / max, and
# each tool's median against plain atou's.
#
# The tree: this repo's src/, docs/ and tests/ and files of 64 KB or more
# of /usr/share/doc (in name order) up to TREE_MB in all, the text a source
# tree holds, in a few hundred files (scp -r pays round trips per file); the
# random file: RANDOM_MB from a fixed seed, which no compressor shrinks.
#
# Run as root:  sudo scripts/bench-compress.sh      (about 10 minutes)
# Environment: ROUNDS (3), TREE_MB (24), RANDOM_MB (8), RATES ("10 100",
# Mbit/s), DELAY_MS (10: a round trip of 20 ms; scp -r's cost grows with it), ATOU_BIN (target/release/atou, built here if not given).
# Its own host names and addresses (atou-bz-a/-b, 10.77.202.0/24), so it may
# run beside scripts/bench-netem.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "bench-compress: $*" >&2; exit 1; }
note() { echo "bench-compress: note: $*" >&2; }
# shellcheck source=scripts/lib/ssh.sh
. scripts/lib/ssh.sh
# shellcheck source=scripts/lib/serve.sh
. scripts/lib/serve.sh
# shellcheck source=scripts/lib/bridge.sh
. scripts/lib/bridge.sh

[ "$(id -u)" -eq 0 ] || die "run as root (network namespaces)"
rounds=${ROUNDS:-3}
tree_mb=${TREE_MB:-24}
random_mb=${RANDOM_MB:-8}
rates=${RATES:-10 100}
delay_ms=${DELAY_MS:-10}
hosts=(atou-bz-a atou-bz-b)
addrs=(10.77.202.1 10.77.202.2)
port=7990
for n in "$rounds" "$tree_mb" "$random_mb" "$delay_ms"; do
    [[ "$n" =~ ^[1-9][0-9]*$ ]] || die "ROUNDS, TREE_MB, RANDOM_MB and DELAY_MS are whole numbers >= 1, got '$n'"
done

ssh_tools_install note die
command -v python3 >/dev/null || die "python3 is missing"
if [ -z "${ATOU_BIN:-}" ]; then
    cargo build --release --quiet
fi
atou=$(realpath "${ATOU_BIN:-target/release/atou}")
tools=(atou rsync-z scp-C rsync)
if grep -q -- "--compress" <<<"$("$atou" send --help)"; then
    tools=(atou atou-z rsync-z scp-C rsync)
else
    note "this atou has no send --compress: its row is left out"
fi

work=$(mktemp -d)
chmod 755 "$work"
pids=()
bridge_pid=
bridge_who=bench-compress
cleanup() {
    for p in "${pids[@]}"; do kill_tree "$p"; done
    sshd_stop
    stop_bridge
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

! grep -q ' 10\.77\.202\.' <<<"$(ip -4 -o addr show)" ||
    die "an interface here already has an address in 10.77.202.0/24"

# The data, in A's view (the namespaces share the file system).
src=$work/src
mkdir -p "$src/tree" "$work/dst"
cp -r src docs tests "$src/tree/"
python3 - "$src/tree/doc" "$tree_mb" "$src/tree" "$src/random" "$random_mb" <<'PY'
import os, random, shutil, sys
dst, limit_mb, tree, rnd, random_mb = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])
have = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(tree) for f in fs)
limit = limit_mb << 20
for root, dirs, files in os.walk("/usr/share/doc"):
    dirs.sort()
    for f in sorted(files):
        p = os.path.join(root, f)
        if have >= limit:
            break
        if os.path.islink(p) or not os.path.isfile(p):
            continue
        size = os.path.getsize(p)
        if size < 65536 or have + size > limit:
            continue
        out = os.path.join(dst, os.path.relpath(p, "/usr/share/doc"))
        os.makedirs(os.path.dirname(out), exist_ok=True)
        shutil.copyfile(p, out)
        have += size
with open(rnd, "wb") as f:
    f.write(random.Random(1).randbytes(random_mb << 20))
PY
tree_bytes=$(du -sb "$src/tree" | cut -f1)
random_bytes=$(stat -c %s "$src/random")
gz_share=$(python3 - "$src/tree" <<'PY'
import os, sys
tot = gz = 0
for d, _, fs in os.walk(sys.argv[1]):
    for f in fs:
        s = os.path.getsize(os.path.join(d, f))
        tot += s
        gz += s if f.endswith((".gz", ".xz", ".bz2", ".zst")) else 0
print(f"{gz / tot:.2f}")
PY
)
"$atou" keygen -f "$work/server" -C bench-server >/dev/null
"$atou" keygen -f "$work/client" -C bench-client >/dev/null
cp "$work/client.pub" "$work/authorized_keys"

in_a() { ip netns exec "${hosts[0]}" "$@"; }

# one TOOL DATA: push DATA (tree or random) with TOOL into a fresh
# directory in B; prints the wall clock in seconds.
one() {
    local tool=$1 data=$2 dst=$work/dst/$1 b="$ssh_user@${addrs[1]}" r=() t="timeout 900" start end
    # Not DEST itself: atou serve holds it open.
    rm -rf "$dst"
    mkdir -p "$dst"
    [ "$data" = random ] || r=(-r)
    start=$(date +%s.%N)
    case $tool in
        atou) in_a $t "$atou" send --quiet --identity "$work/client" --server-key "$work/server.pub" \
                  "$src/$data" "${addrs[1]}:$port:$tool" ;;
        atou-z) in_a $t "$atou" send --quiet --compress --identity "$work/client" \
                    --server-key "$work/server.pub" "$src/$data" "${addrs[1]}:$port:$tool" ;;
        rsync-z) in_a $t rsync -a -z -e "$ssh_cmd" "$src/$data" "$b:$dst/" ;;
        rsync) in_a $t rsync -a -e "$ssh_cmd" "$src/$data" "$b:$dst/" ;;
        scp-C) in_a $t scp -q -C "${r[@]}" "${ssh_opts[@]}" -P "$ssh_port" "$src/$data" "$b:$dst/" ;;
    esac >"$work/one.out" 2>"$work/one.err" || die "$tool $data failed: $(tail -n 2 "$work/one.err")"
    end=$(date +%s.%N)
    # Whole, or it does not count.
    local got
    got=$(du -sb "$dst/$data" | cut -f1)
    [ "$got" = "$(du -sb "$src/$data" | cut -f1)" ] || die "$tool $data: $got bytes arrived"
    awk "BEGIN { print $end - $start }"
}

results=$work/results   # lines: rate data tool seconds
: >"$results"
for rate in $rates; do
    link="rate ${rate}mbit delay ${delay_ms}ms"
    "$atou" netem bridge --fwd "$link" --rev "$link" --seed 1 \
        --hosts "${hosts[0]},${hosts[1]}" --addrs "${addrs[0]},${addrs[1]}" \
        >"$work/bridge.out" 2>"$work/bridge.err" &
    bridge_pid=$!
    for _ in $(seq 150); do
        grep -qx ready "$work/bridge.err" 2>/dev/null && break
        kill -0 "$bridge_pid" 2>/dev/null || die "bridge exited: $(tail -n 1 "$work/bridge.err")"
        sleep 0.1
    done
    grep -qx ready "$work/bridge.err" || die "bridge not ready after 15 s"
    sleep 0.5
    sshd_start "$work/ssh" "${addrs[1]}" 2222 ip netns exec "${hosts[1]}"
    sshd_wait "${addrs[1]}" in_a
    ip netns exec "${hosts[1]}" "$atou" serve --bind "${addrs[1]}:$port" --dir "$work/dst" \
        --identity "$work/server" --authorized-keys "$work/authorized_keys" \
        >"$work/serve.out" 2>"$work/serve.err" &
    pids+=("$!")
    serve_wait "$!" "$work/serve.err" "$rate Mbit/s"
    for data in tree random; do
        for tool in "${tools[@]}"; do one "$tool" "$data" >/dev/null; done
        for r in $(seq "$rounds"); do
            # Rotated: each tool goes first once in a while.
            for k in $(seq 0 $((${#tools[@]} - 1))); do
                tool=${tools[$(((k + r) % ${#tools[@]}))]}
                echo "$rate $data $tool $(one "$tool" "$data")" >>"$results"
            done
        done
    done
    kill_tree "${pids[-1]}"
    sshd_stop
    stop_bridge
done

python3 - "$results" "$tree_bytes" "$random_bytes" "$gz_share" "$(find "$src/tree" -type f | wc -l)" "$delay_ms" <<'PY'
import statistics, sys
from collections import defaultdict
path, tree_bytes, random_bytes, gz, files = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
runs = defaultdict(list)
for line in open(path):
    rate, data, tool, secs = line.split()
    runs[(int(rate), data, tool)].append(float(secs))
size = {"tree": tree_bytes, "random": random_bytes}
print(f"tree {tree_bytes / 1e6:.1f} MB in {files} files ({gz} of it already compressed: .gz/.xz), random {random_bytes / 1e6:.1f} MB")
print(f"one-way delay {sys.argv[6]} ms")
print("rate Mbit/s  data    tool      min s  median s  max s  Mbit/s (median)  median / atou's")
for (rate, data, tool), xs in sorted(runs.items()):
    med = statistics.median(xs)
    base = runs.get((rate, data, "atou"))
    ratio = f"{med / statistics.median(base):.2f}" if base else "-"
    print(f"{rate:>11}  {data:<6}  {tool:<8} {min(xs):6.2f}  {med:8.2f}  {max(xs):5.2f}"
          f"  {size[data] * 8 / med / 1e6:15.1f}  {ratio:>15}")
PY

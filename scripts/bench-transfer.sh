#!/usr/bin/env bash
# File transfer on loopback: atou send/serve against cp, scp and rsync over
# ssh, all in one run, on two data sets:
#   big:  one file of BIG_SIZE (default 4G) of random content;
#   tree: SMALL_FILES files (default 10000) of 1-64 KiB (random sizes,
#         random content) spread over 100 directories.
# Each data set is copied, one tool after another, into a fresh destination,
# in an uncounted warm-up round and then ROUNDS rounds (default 3), the
# tools taking turns to go first (the order rotates each round); each tool's
# figure is its median round, with its min and max:
#   cp -r (the page-cache baseline);
#   scp -r over a private sshd on 127.0.0.1;
#   rsync -a over ssh to the same sshd;
#   atou send --quiet --json to `atou serve --dir DST --once --no-fsync`
#   (no tool here syncs, so neither does atou in the comparison),
#   authenticated and encrypted as by default (keys made for the run, the
#   server's pinned with --server-key; cipher auto);
#   atou-copy: `atou copy SRC user@127.0.0.1:DST` over the same sshd, the
#   command a scp user would type (ssh starts the far end; keys exchanged
#   over ssh; the data over UDP, encrypted);
#   atou-plain: the same as atou with --no-auth at both ends, for what
#   authentication and encryption cost (target: atou >= 0.85x
#   atou-plain).
# And the cost of `atou serve`'s default, which syncs every file and
# directory before it reports a transfer verified, measured where syncing
# costs something (FSYNC_DIR, default /var/tmp, on disk): atou-disk with
# --no-fsync against atou-disk-fsync with the default, reported apart from
# the targets.
# The sources are read once beforehand and stay in the page cache; each copy
# starts after a `sync` so that earlier writeback does not bill it, is checked
# (cmp, diff -r) and then deleted. Timings are wall clock around the copying
# command (for atou, the sender; it exits once the receiver has verified every
# file). Rounds, because on this VM fresh memory is slow and uneven: the
# first 4 GiB written to a tmpfs ran at 393 MB/s with dd, the same again
# right after at 1.1 and then 2.7 GB/s, and atou send of a 4 GiB file took
# 15.8, 10.5 and 7.3 s in three runs in a row; the rounds give every tool the
# same mix of cold and warm memory. Prints seconds and MB/s (10^6 bytes/s of
# the data set) of the median round and MB/s of every round, atou's ratio to
# each tool and atou's peak RSS at both ends (/usr/bin/time -v), then the
# targets as PASS/MISS: big atou and atou-copy >= 2x scp, big atou >= 0.5x
# cp, tree atou >= 1.0x rsync. A MISS is only reported; the script fails when a tool fails or
# a copy is wrong.
#
# Run as root (installs openssh-server/-client, rsync and time when missing,
# creates /run/sshd):   scripts/bench-transfer.sh
# Quick run:            BIG_SIZE=256M SMALL_FILES=1000 scripts/bench-transfer.sh
# Environment: BIG_SIZE (head -c size, default 4G), SMALL_FILES (default 10000),
# ROUNDS (default 3),
# BENCH_DIR (where data and destinations go; default /dev/shm when it has
# room for 2.5 x BIG_SIZE + 1 GiB, else /tmp), STREAMS (atou send
# --streams), ATOU_ARGS (extra atou send arguments), PORT (atou, default 7890),
# SSH_PORT (default: the first free port from 2222), TIMEOUT (seconds per
# copy, default 3600), FSYNC_DIR (on disk, for the fsync cost; default
# /var/tmp; FSYNC_DIR=none skips those runs), REF_ATOU (another atou binary,
# e.g. an earlier release's, run as one more tool, "atou-ref", with its own
# serve defaults: the same-run ratio of this build to it; a reference with
# keys runs with --no-auth, and is then set against atou-plain, like for
# like).
set -euo pipefail
cd "$(dirname "$0")/.."

big_size=${BIG_SIZE:-4G}
rounds=${ROUNDS:-3}
small_files=${SMALL_FILES:-10000}
# Default: a tmpfs, so that every tool writes to the page cache only (the
# baseline the targets are stated against) and this machine's disk, whose
# writeback throttles every tool alike after a few GB, stays out of it.
# Needs room for the data and one copy; otherwise /tmp.
if [ -n "${BENCH_DIR:-}" ]; then
  bench_dir=$BENCH_DIR
else
  bench_dir=/tmp
  want_kib=$(( $(numfmt --from=iec "${big_size}") * 5 / 2 / 1024 + 1024 * 1024 ))
  shm_kib=$(df -k --output=avail /dev/shm 2>/dev/null | tail -1 || echo 0)
  [ "${shm_kib:-0}" -gt "$want_kib" ] && bench_dir=/dev/shm
fi
port=${PORT:-7890}
limit=${TIMEOUT:-3600}
read -r -a atou_extra <<<"${ATOU_ARGS:-}"
[ -z "${STREAMS:-}" ] || atou_extra=(--streams "$STREAMS" "${atou_extra[@]}")

die() { echo "bench-transfer: $*" >&2; exit 1; }
note() { echo "bench-transfer: $*" >&2; }
# shellcheck source=scripts/lib/ssh.sh
. scripts/lib/ssh.sh
# shellcheck source=scripts/lib/serve.sh
. scripts/lib/serve.sh

[[ "$big_size" =~ ^[1-9][0-9]*[KMGT]?$ ]] || die "BIG_SIZE must be a size like 4G, 256M or 1000000, got '$big_size'"
[[ "$small_files" =~ ^[1-9][0-9]*$ ]] || die "SMALL_FILES must be a positive whole number, got '$small_files'"
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || die "ROUNDS must be a positive whole number, got '$rounds'"
[[ "$limit" =~ ^[1-9][0-9]*$ ]] || die "TIMEOUT must be a positive whole number of seconds, got '$limit'"
[ -d "$bench_dir" ] || die "BENCH_DIR $bench_dir is not a directory"
fsync_dir=${FSYNC_DIR:-/var/tmp}
[ "$fsync_dir" = none ] || [ -d "$fsync_dir" ] || die "FSYNC_DIR $fsync_dir is not a directory"
ref_atou=${REF_ATOU:-}
[ -z "$ref_atou" ] || [ -x "$ref_atou" ] || die "REF_ATOU $ref_atou is not an executable"

work=
disk_work=
serve_pid=
cleanup() {
    if [ -n "$serve_pid" ]; then kill_tree "$serve_pid"; wait "$serve_pid" 2>/dev/null || true; fi
    sshd_stop
    [ -z "$work" ] || rm -rf "$work"
    [ -z "$disk_work" ] || rm -rf "$disk_work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Tools: install what is missing (Debian/Ubuntu package names).
ssh_tools_install note die
for c in python3 openssl cmp diff timeout; do
    command -v "$c" >/dev/null || die "$c is missing"
done

cargo build --release --quiet
work=$(mktemp -d "$bench_dir/atou-bench-transfer.XXXXXX")
[ "$fsync_dir" = none ] || disk_work=$(mktemp -d "$fsync_dir/atou-bench-fsync.XXXXXX")
[[ "$work" != *[[:space:]]* ]] || die "the work directory '$work' has white space in it (remote paths would split)"
chmod 755 "$work"
mkdir "$work/data" "$work/log" "$work/bin"
# One binary for the whole run, even if target/release/atou is rebuilt meanwhile.
cp target/release/atou "$work/bin/atou"
[ -z "$ref_atou" ] || cp "$ref_atou" "$work/bin/atou-ref"
atou=$work/bin/atou
"$atou" keygen -f "$work/bin/server" -C bench-server >/dev/null
"$atou" keygen -f "$work/bin/client" -C bench-client >/dev/null
cp "$work/bin/client.pub" "$work/bin/authorized_keys"
# A REF_ATOU from before encryption has no keys; one from after needs --no-auth.
ref_plain=()
if [ -n "$ref_atou" ] && "$work/bin/atou-ref" serve --help 2>/dev/null | grep -q -- --no-auth; then
    ref_plain=(--no-auth)
fi
rev=$(git describe --always --dirty 2>/dev/null || echo unknown)
results=$work/log/results   # lines: set tool secs bytes
: >"$results"

free_port() {  # free_port tcp|udp FIRST: the first port from FIRST nobody holds on 127.0.0.1
    python3 - "$1" "$2" <<'PY'
import socket, sys
kind = socket.SOCK_STREAM if sys.argv[1] == "tcp" else socket.SOCK_DGRAM
for p in range(int(sys.argv[2]), int(sys.argv[2]) + 200):
    s = socket.socket(socket.AF_INET, kind)
    try:
        s.bind(("127.0.0.1", p))
    except OSError:
        continue
    finally:
        s.close()
    print(p)
    break
else:
    sys.exit(f"no free {sys.argv[1]} port from {sys.argv[2]}")
PY
}

# A private sshd on 127.0.0.1 with its own host key and one authorized key.
sshd_start "$work/ssh" 127.0.0.1 "${SSH_PORT:-$(free_port tcp 2222)}"
remote=$ssh_user@127.0.0.1
sshd_wait 127.0.0.1
port=$(free_port udp "$port")
note "sshd on 127.0.0.1:$ssh_port (user $ssh_user), atou on udp 127.0.0.1:$port, data in $work"

# Data: the big file and the tree.
src=$work/data
t0=$(date +%s.%N)
openssl enc -aes-128-ctr -pass pass:atou-bench -nosalt -pbkdf2 </dev/zero 2>/dev/null |
    head -c "$big_size" >"$src/big.bin" || true   # head closes the pipe: openssl's SIGPIPE is expected
big_bytes=$(stat -c %s "$src/big.bin")
want=${big_size%[KMGT]}
case $big_size in
*K) want=$((want << 10)) ;; *M) want=$((want << 20)) ;; *G) want=$((want << 30)) ;; *T) want=$((want << 40)) ;;
esac
[ "$big_bytes" -eq "$want" ] || die "big.bin has $big_bytes bytes, not $want (disk full?)"
python3 - "$src/tree" "$small_files" <<'PY'
import os, random, sys
root, n = sys.argv[1], int(sys.argv[2])
ndirs = min(100, n)
rng = random.Random(1)
for d in range(ndirs):
    os.makedirs(os.path.join(root, f"d{d:03d}"))
for i in range(n):
    with open(os.path.join(root, f"d{i % ndirs:03d}", f"f{i:05d}.bin"), "wb") as f:
        f.write(os.urandom(rng.randint(1024, 65536)))
PY
tree_bytes=$(find "$src/tree" -type f -printf '%s\n' | awk '{s += $1} END {print s}')
t1=$(date +%s.%N)
note "generated big.bin ($big_bytes bytes) and tree/ ($small_files files, $tree_bytes bytes) in $(python3 -c "print(f'{$t1 - $t0:.1f}')") s"
# Warm the page cache with the sources, then flush the generator's writeback.
cat "$src/big.bin" >/dev/null
find "$src/tree" -type f -print0 | xargs -0 cat >/dev/null
sync
read -r load_before _ </proc/loadavg

# exit_why RC: "exit RC", and what timeout's 124 means.
exit_why() { if [ "$1" -eq 124 ]; then echo "timed out after $limit s"; else echo "exit $1"; fi; }

elapsed() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.6f}')" "$1" "$2"; }

# verify SET DST: the copy DST/NAME of the set's source is exact; then delete DST.
verify() {
    local set=$1 dst=$2 tool=$3
    case $set in
    big)
        [ -f "$dst/big.bin" ] || die "$tool: $dst/big.bin is missing"
        cmp "$src/big.bin" "$dst/big.bin" || die "$tool: big.bin differs from the source"
        ;;
    tree)
        [ -d "$dst/tree" ] || die "$tool: $dst/tree is missing"
        diff -r "$src/tree" "$dst/tree" >"$work/log/diff.out" 2>&1 ||
            die "$tool: tree differs from the source: $(head -n 3 "$work/log/diff.out")"
        ;;
    esac
    rm -rf "$dst"
}

# timed SET TOOL CMD...: run CMD (which copies SET, $bytes bytes) and record its wall time.
timed() {
    local set=$1 tool=$2 t0 t1 rc=0
    shift 2
    note "round $round: $set: $tool"
    sync
    t0=$(date +%s.%N)
    timeout "$limit" "$@" </dev/null >"$work/log/out" 2>"$work/log/err" || rc=$?
    t1=$(date +%s.%N)
    [ "$rc" -eq 0 ] || die "$set: $tool failed ($(exit_why "$rc")): $(tail -n 3 "$work/log/err")"
    echo "$set $tool $(elapsed "$t0" "$t1") $bytes" >>"$results"
}

rss_kib() { sed -n 's/^[[:space:]]*Maximum resident set size (kbytes): //p' "$1"; }

# atou_run SET NAME DST TOOL [SERVE_ARG...]: atou serve --dir DST --once in the
# background, atou send SRC/NAME to it (timed), the server's exit and the
# sender's report checked; the result is recorded as TOOL.
atou_run() {
    local set=$1 name=$2 dst=$3 tool=$4 t0 t1 rc=0 atou=$atou
    shift 4
    local serve_keys=(--identity "$work/bin/server" --authorized-keys "$work/bin/authorized_keys")
    local send_keys=(--identity "$work/bin/client" --server-key "$work/bin/server.pub")
    case $tool in
    atou-ref) atou=$work/bin/atou-ref; serve_keys=("${ref_plain[@]}"); send_keys=("${ref_plain[@]}") ;;
    atou-plain) serve_keys=(--no-auth); send_keys=(--no-auth) ;;
    esac
    : >"$work/log/serve.err"
    timeout "$limit" /usr/bin/time -v -o "$work/log/serve.time" \
        "$atou" serve --bind "127.0.0.1:$port" --dir "$dst" --once --json "${serve_keys[@]}" "$@" \
        </dev/null >"$work/log/serve.json" 2>"$work/log/serve.err" &
    serve_pid=$!
    serve_wait "$serve_pid" "$work/log/serve.err" "$set"
    note "round $round: $set: atou send${atou_extra[*]:+ ${atou_extra[*]}}"
    sync
    t0=$(date +%s.%N)
    timeout "$limit" /usr/bin/time -v -o "$work/log/send.time" \
        "$atou" send "$src/$name" "127.0.0.1:$port" --quiet --json "${send_keys[@]}" "${atou_extra[@]}" \
        </dev/null >"$work/log/send.json" 2>"$work/log/send.err" || rc=$?
    t1=$(date +%s.%N)
    [ "$rc" -eq 0 ] || die "$set: atou send failed ($(exit_why "$rc")): $(grep -v '^[[:space:]]' "$work/log/send.err" | tail -n 3)"
    # The server ends with the transfer (--once); give it a while.
    for _ in $(seq 300); do
        kill -0 "$serve_pid" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$serve_pid" 2>/dev/null; then
        note "$set: atou serve --once still running 30 s after the send; stopping it"
        kill "$serve_pid" 2>/dev/null || true
    fi
    rc=0
    wait "$serve_pid" || rc=$?
    serve_pid=
    [ "$rc" -eq 0 ] || die "$set: atou serve exited with status $rc: $(grep -v '^[[:space:]]' "$work/log/serve.err" | tail -n 3)"
    python3 - "$work/log/send.json" "$bytes" <<'PY' || die "$set: atou send's report does not add up"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["verified"] is True, f"verified {r['verified']!r}"
assert r["bytes_total"] == int(sys.argv[2]), f"bytes_total {r['bytes_total']}, data set {sys.argv[2]}"
bad = [s["status"] for s in r["streams"] if s["status"] != "finished"]
assert not bad, f"stream status {bad}"
PY
    local rss_send rss_serve extra
    rss_send=$(rss_kib "$work/log/send.time")
    rss_serve=$(rss_kib "$work/log/serve.time")
    extra=$(python3 - "$work/log/send.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
s = r["streams"]
rx, to = sum(x["rxmts"] for x in s), sum(x["timeouts"] for x in s)
print(f"streams={len(s)} rxmts={rx} timeouts={to} chunks_resent={r['chunks_resent']} rounds={r['rounds']}")
PY
)
    echo "$set $tool $(elapsed "$t0" "$t1") $bytes $rss_send $rss_serve $extra" >>"$results"
}

# run_tool SET NAME TOOL: one copy of SET by TOOL into a fresh destination, checked.
run_tool() {
    local set=$1 name=$2 tool=$3 dst=$work/dst-$1
    case $tool in
    atou-disk*) dst=$disk_work/dst-$set ;;
    esac
    mkdir "$dst"
    case $tool in
    cp) timed "$set" cp cp -r "$src/$name" "$dst/" ;;
    scp) timed "$set" scp scp -q -r "${ssh_opts[@]}" -P "$ssh_port" "$src/$name" "$remote:$dst/" ;;
    rsync) timed "$set" rsync rsync -a -e "$ssh_cmd" "$src/$name" "$remote:$dst/" ;;
    atou-copy) timed "$set" atou-copy "$atou" copy --quiet --ssh "$ssh_cmd" --remote-atou "$atou" \
                   "$src/$name" "$remote:$dst/" ;;
    atou | atou-plain | atou-disk) atou_run "$set" "$name" "$dst" "$tool" --no-fsync ;;
    atou-disk-fsync | atou-ref) atou_run "$set" "$name" "$dst" "$tool" ;;
    esac
    verify "$set" "$dst" "$tool"
}

# Round 0 is a warm-up, not counted: every tool meets the page cache and
# fresh memory once before anything is timed. Then the tools take turns
# going first (the order rotates every round), so none always finds the
# memory another one warmed.
tools_in_order=(cp scp rsync atou atou-copy atou-plain)
[ -z "$ref_atou" ] || tools_in_order+=(atou-ref)
[ "$fsync_dir" = none ] || tools_in_order+=(atou-disk atou-disk-fsync)
all_results=$results
for round in $(seq 0 "$rounds"); do
    if [ "$round" -eq 0 ]; then results=/dev/null; else results=$all_results; fi
    n=${#tools_in_order[@]}
    for set in big tree; do
        case $set in
        big) name=big.bin; bytes=$big_bytes ;;
        tree) name=tree; bytes=$tree_bytes ;;
        esac
        for k in $(seq 0 $((n - 1))); do
            run_tool "$set" "$name" "${tools_in_order[$(((k + round) % n))]}"
        done
    done
done
results=$all_results

read -r load_after _ </proc/loadavg
python3 - "$results" "$big_size" "$small_files" "${STREAMS:-}" "${ATOU_ARGS:-}" "$rev" "$load_before" "$load_after" "$(nproc)" "$rounds" "$fsync_dir" "${ref_plain[*]:-}" <<'PY'
import statistics, sys
rows, big_size, small_files, streams, atou_args, rev, load0, load1, ncpu, rounds, fsync_dir, ref_plain = sys.argv[1:13]
runs, rss, extra = {}, {}, {}
for line in open(rows):
    f = line.split()
    s, tool, secs, nbytes = f[0], f[1], float(f[2]), int(f[3])
    runs.setdefault((s, tool), []).append((secs, nbytes))
    if len(f) > 4:  # atou send and serve, under /usr/bin/time -v
        sender, receiver = rss.get(s, (0, 0))
        rss[s] = (max(sender, int(f[4]) / 1024), max(receiver, int(f[5]) / 1024))
    if tool in ("atou",):
        extra.setdefault(s, []).append(" ".join(f[6:]))
# The median of the rounds' seconds (every round copies the same bytes).
res = {}
for key, rs in runs.items():
    secs, nbytes = statistics.median(t for t, _ in rs), rs[0][1]
    ts = [t for t, _ in rs]
    res[key] = (secs, nbytes, nbytes / secs / 1e6, [n / t / 1e6 for t, n in rs], min(ts), max(ts))
sets = {"big": f"big ({big_size} file)", "tree": f"tree ({small_files} files)"}
tools = ["cp", "scp", "rsync", "atou", "atou-copy", "atou-plain"] + (["atou-ref"] if any(t == "atou-ref" for _, t in runs) else [])
args = " ".join(x for x in ([f"--streams {streams}"] if streams else []) + ([atou_args] if atou_args else []))
print(f"loopback file transfer, {rounds} round(s) after an uncounted warm-up, tools in rotating order; atou {rev}, atou send {args or '(defaults)'}")
print(f"{ncpu} cores; 1-minute load average {load0} before the copies, {load1} after (other work skews the figures)")
print("MB/s = 10^6 bytes/s of the data set; atou/tool = atou MB/s / tool MB/s, medians")
print()
print(f"  {'data set':<22} {'tool':<10} {'bytes':>12} {'s min':>7} {'s median':>9} {'s max':>7} {'MB/s':>9} {'atou/tool':>10}   MB/s by round")
for s in ("big", "tree"):
    a = res[(s, "atou")][2]
    for t in tools:
        secs, nbytes, mbps, each, lo, hi = res[(s, t)]
        ratio = "" if t == "atou" else f"{a / mbps:9.2f}x"
        rounds_text = " ".join(f"{x:.1f}" for x in each)
        print(f"  {sets[s]:<22} {t:<10} {nbytes:>12} {lo:7.2f} {secs:9.2f} {hi:7.2f} {mbps:9.1f} {ratio:>10}   {rounds_text}")
print()
print("atou peak RSS over the rounds (/usr/bin/time -v, maximum resident set size)")
for s in ("big", "tree"):
    print(f"  {sets[s]:<22} sender {rss[s][0]:8.1f} MiB   receiver {rss[s][1]:8.1f} MiB")
    for i, e in enumerate(extra[s], 1):
        print(f"  {'':<22} run {i}: {e}")
print()
if "atou-ref" in tools:
    print()
    # Like for like: a reference that runs with --no-auth is set
    # against this build's --no-auth run.
    mine = "atou-plain" if ref_plain else "atou"
    print(f"this build ({mine}) against REF_ATOU (atou-ref{', --no-auth' if ref_plain else ''}), same run, medians")
    for s in ("big", "tree"):
        print(f"  {sets[s]:<22} {res[(s, mine)][2] / res[(s, 'atou-ref')][2]:6.2f}x")
print()
print(f"fsync at the receiver (atou serve's default; --no-fsync above), into {fsync_dir} on disk, medians")
for s in ("big", "tree"):
    if (s, "atou-disk") not in res:
        print("  not measured (FSYNC_DIR=none)")
        break
    plain, synced = res[(s, "atou-disk")][0], res[(s, "atou-disk-fsync")][0]
    print(f"  {sets[s]:<22} {plain:8.2f} s with --no-fsync, {synced:8.2f} s syncing: {synced / plain:5.2f}x the time")
print()
print("targets, on the medians (figures only; a MISS does not fail the script)")
def target(label, s, t, want):
    r = res[(s, "atou")][2] / res[(s, t)][2]
    print(f"  {label:<28} {r:6.2f}x  (target >= {want}x): {'PASS' if r >= want else 'MISS'}")
target("big file: atou / scp", "big", "scp", 2.0)
r = res[("big", "atou-copy")][2] / res[("big", "scp")][2]
print(f"  {'big file: atou-copy / scp':<28} {r:6.2f}x  (target >= 2.0x): {'PASS' if r >= 2.0 else 'MISS'}")
target("big file: atou / cp", "big", "cp", 0.5)
target("tree: atou / rsync", "tree", "rsync", 1.0)
target("big file: atou / atou-plain", "big", "atou-plain", 0.85)
PY

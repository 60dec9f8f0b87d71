#!/usr/bin/env bash
# The Debian package, built, installed and run (docs/service.md):
#   1. cargo-deb (installed with `cargo install cargo-deb --locked` if
#      missing, timed), the release binary and its shell completions;
#   2. `cargo deb --no-build`, then `dpkg -i` of the package made;
#   3. the installed unit checked with `systemd-analyze verify` and scored
#      with `systemd-analyze security --offline=yes` (where systemd-analyze
#      is there; the unit is not started: CI has no systemd as PID 1);
#   4. the installed /usr/bin/atou's `serve --dir --metrics` on loopback,
#      a SIZE file (default 16M) sent to it, its metrics scraped during and
#      after: fails unless transfers_done_total is 1, files_written_total
#      1 and written_bytes_total the file's size.
# Run as root (dpkg -i); leaves the package installed.
set -euo pipefail
cd "$(dirname "$0")/.."
SIZE=${SIZE:-16M}
target=${CARGO_TARGET_DIR:-target}

step() { printf '\n-- %s\n' "$*"; }

if ! command -v cargo-deb >/dev/null; then
  step "cargo install cargo-deb --locked"
  start=$(date +%s)
  cargo install cargo-deb --locked
  echo "cargo-deb installed in $(( $(date +%s) - start )) s"
fi

step "release binary, completions"
cargo build --release --quiet
mkdir -p packaging/completions
"$target/release/atou" completions bash > packaging/completions/atou.bash
"$target/release/atou" completions zsh > packaging/completions/_atou
"$target/release/atou" completions fish > packaging/completions/atou.fish

step "cargo deb, dpkg -i"
deb=$(cargo deb --no-build --strip --quiet | tail -n 1)
dpkg-deb --info "$deb" | sed -n '/Package:/,/Description:/p'
dpkg-deb --contents "$deb" | awk '{print $6}'
dpkg -i "$deb"
getent passwd atou >/dev/null || { echo "postinst made no user atou" >&2; exit 1; }

work=$(mktemp -d /tmp/atou-package-XXXXXX)
pid=
cleanup() {
  if [ -n "$pid" ]; then kill -INT "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

if command -v systemd-analyze >/dev/null; then
  step "systemd-analyze verify and security (offline) of the installed unit"
  # A template is checked as an instance: a copy named for one.
  mkdir -p "$work/unit"
  cp /lib/systemd/system/atou-serve@.service "$work/unit/atou-serve@ci.service"
  systemd-analyze verify --man=no "$work/unit/atou-serve@ci.service"
  systemd-analyze security --offline=yes "$work/unit/atou-serve@ci.service" | tail -n 1
fi

step "installed atou serve --metrics, a $SIZE file sent to it"
export XDG_CACHE_HOME=$work/cache XDG_CONFIG_HOME=$work/config
mkdir -p "$work/keys" "$work/dest" "$work/src"
/usr/bin/atou keygen -C server -f "$work/keys/server" >/dev/null
/usr/bin/atou keygen -C client -f "$work/keys/client" >/dev/null
cp "$work/keys/client.pub" "$work/keys/authorized_keys"
head -c "$SIZE" /dev/urandom > "$work/src/f"
size=$(stat -c %s "$work/src/f")
metrics_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
metrics=127.0.0.1:$metrics_port
/usr/bin/atou serve --bind 127.0.0.1:0 --dir "$work/dest" --no-fsync \
  --identity "$work/keys/server" --authorized-keys "$work/keys/authorized_keys" \
  --metrics "$metrics" > "$work/serve.out" 2> "$work/serve.err" &
pid=$!
for _ in $(seq 100); do grep -q 'metrics on' "$work/serve.err" 2>/dev/null && break; sleep 0.1; done
addr=$(sed -n 's/^atou serve: listening on \([^ ]*\) .*/\1/p' "$work/serve.err")
[ -n "$addr" ] || { cat "$work/serve.err" >&2; exit 1; }
scrape() { python3 -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen("http://'"$metrics"'/metrics", timeout=5).read().decode())'; }
sample() { awk -v n="$1" '$1 == n { print $2 }' <<<"$2"; }
/usr/bin/atou send --quiet --json --identity "$work/keys/client" \
  --server-key "$work/keys/server.pub" "$work/src/f" "$addr" > "$work/send.json" &
send=$!
during=$(scrape)
echo "during the send: transfers_done_total $(sample atou_serve_transfers_done_total "$during")"
wait "$send"
after=
for _ in $(seq 100); do
  after=$(scrape)
  [ "$(sample atou_serve_handshakes_total "$after")" -ge 1 ] && break
  sleep 0.1
done
grep -E '^atou_serve_(transfers|files|written|handshakes|hellos|refusals)' <<<"$after"
cmp "$work/src/f" "$work/dest/f"
fail=0
[ "$(sample atou_serve_transfers_done_total "$after")" = 1 ] || { echo "transfers_done_total is not 1" >&2; fail=1; }
[ "$(sample atou_serve_files_written_total "$after")" = 1 ] || { echo "files_written_total is not 1" >&2; fail=1; }
[ "$(sample atou_serve_written_bytes_total "$after")" = "$size" ] || { echo "written_bytes_total is not $size" >&2; fail=1; }
[ "$fail" = 0 ] && echo "package installed and served; metrics counted the $size-byte transfer"
exit "$fail"

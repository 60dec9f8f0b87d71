# A private sshd for the benchmarks that compare atou with scp and rsync
# (sourced by scripts/bench-transfer.sh and scripts/bench-netem.sh).
#
#   ssh_tools_install NOTE_FN DIE_FN   install sshd, ssh/scp, rsync and time
#                                      when missing (root; Debian/Ubuntu names)
#   sshd_start DIR ADDR PORT [WRAP...] start sshd on ADDR:PORT with its own host
#                                      key and one client key, all under DIR; WRAP
#                                      (e.g. ip netns exec HOST) runs it elsewhere.
#                                      Sets sshd_pid, ssh_opts (array, without the
#                                      port: scp takes -P, ssh -p), ssh_port,
#                                      ssh_cmd (for rsync -e and atou --ssh), ssh_user.
#   sshd_wait HOST [WRAP...]           wait until a login to HOST works (from WRAP)
#   sshd_stop                          stop it
# The caller's die() reports failures.

ssh_tools_install() {
    local note=$1 die=$2 need=() policy_rc=
    [ -x /usr/sbin/sshd ] || need+=(openssh-server)
    { command -v ssh && command -v scp && command -v ssh-keygen; } >/dev/null || need+=(openssh-client)
    command -v rsync >/dev/null || need+=(rsync)
    [ -x /usr/bin/time ] || need+=(time)
    [ ${#need[@]} -gt 0 ] || return 0
    [ "$(id -u)" -eq 0 ] || "$die" "missing ${need[*]}; install them (apt-get install ${need[*]}) or run as root"
    "$note" "installing ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    # Keep the package's own sshd from starting on port 22 (as Docker images do).
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        policy_rc=/usr/sbin/policy-rc.d
        printf '#!/bin/sh\nexit 101\n' >"$policy_rc"
        chmod +x "$policy_rc"
    fi
    local ok=0
    apt-get install -y -qq "${need[@]}" </dev/null >/dev/null 2>&1 ||
        { apt-get update -qq </dev/null && apt-get install -y -qq "${need[@]}" </dev/null >/dev/null; } ||
        ok=1
    [ -z "$policy_rc" ] || rm -f "$policy_rc"
    [ "$ok" -eq 0 ] || "$die" "could not install ${need[*]}"
}

sshd_pid=
ssh_opts=()
ssh_port=
ssh_cmd=
ssh_dir=
ssh_user=$(id -un)

sshd_start() {
    local dir=$1 addr=$2 port=$3
    shift 3
    mkdir -p "$dir"
    chmod 700 "$dir"
    rm -f "$dir/host_key" "$dir/host_key.pub" "$dir/client_key" "$dir/client_key.pub"
    ssh-keygen -q -t ed25519 -N '' -C atou-bench-host -f "$dir/host_key"
    ssh-keygen -q -t ed25519 -N '' -C atou-bench-client -f "$dir/client_key"
    cp "$dir/client_key.pub" "$dir/authorized_keys"
    local sftp=internal-sftp s
    for s in /usr/lib/openssh/sftp-server /usr/libexec/openssh/sftp-server /usr/libexec/sftp-server; do
        [ -x "$s" ] && { sftp=$s; break; }
    done
    cat >"$dir/sshd_config" <<EOF
Port $port
ListenAddress $addr
HostKey $dir/host_key
PidFile $dir/sshd.pid
AuthorizedKeysFile $dir/authorized_keys
PermitRootLogin yes
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
UseDNS no
PrintMotd no
Subsystem sftp $sftp
EOF
    [ "$(id -u)" -ne 0 ] || { mkdir -p /run/sshd; chmod 755 /run/sshd; }
    "$@" /usr/sbin/sshd -t -f "$dir/sshd_config" 2>"$dir/sshd-t.err" ||
        die "sshd rejects its config: $(tail -n 1 "$dir/sshd-t.err")"
    "$@" /usr/sbin/sshd -D -f "$dir/sshd_config" -E "$dir/sshd.log" &
    sshd_pid=$!
    ssh_opts=(-i "$dir/client_key" -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null
              -o BatchMode=yes -o LogLevel=ERROR)
    ssh_port=$port
    ssh_dir=$dir
    ssh_cmd="ssh ${ssh_opts[*]} -p $port"
}

sshd_wait() {
    local host=$1 i
    shift
    for i in $(seq 50); do
        "$@" ssh "${ssh_opts[@]}" -p "$ssh_port" "$ssh_user@$host" true </dev/null 2>"$ssh_dir/ssh.err" && return 0
        kill -0 "$sshd_pid" 2>/dev/null || die "sshd exited: $(tail -n 1 "$ssh_dir/sshd.log" 2>/dev/null)"
        sleep 0.1
    done
    die "cannot log in to the private sshd at $host:$ssh_port: $(tail -n 1 "$ssh_dir/ssh.err")"
}

sshd_stop() {
    [ -n "$sshd_pid" ] || return 0
    kill "$sshd_pid" 2>/dev/null || true
    wait "$sshd_pid" 2>/dev/null || true
    sshd_pid=
}

//! `atou copy` with a remote end, over ssh (issue 13, point 4), and the
//! hidden `atou __remote receive|send` that ssh runs at the far end.
//!
//! Push (`atou copy SRC... [USER@]HOST:PATH`): the remote end receives.
//! It binds a UDP port of `--port`, answers the bootstrap line with it,
//! and serves one transfer into PATH; the local end sends to it.
//!
//! Pull (`atou copy [USER@]HOST:PATH... DEST`): the remote end sends. The
//! local end receives on a socket S; the remote binds one socket per
//! stream; S sends each a punch datagram with the token, which opens the
//! way in through a NAT or firewall at the local end; each remote socket
//! then connects back from itself to where its punch came from.
//!
//! The line protocol is `atou::transfer::bootstrap`; docs/security.md,
//! "The ssh bootstrap, step by step", says why it is safe.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitCode, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};
use clap::{Args, Subcommand};

use atou::io::{self, ProbeError, ServeConfig};
use atou::keys::{format_public_key, AuthorizedKeys};
use atou::proto::client::Stage;
use atou::proto::crypto::{Cipher, ClientAuth, PublicKey, ServerAuth, StaticKeypair};
use atou::proto::ConnError;
use atou::text::{escape, shown_path};
use atou::transfer::bootstrap::{
    bind_in_range, is_punch, punch, random_token, shell_quote, split_ssh_target, ssh_server_ip,
    Answer, Hello, PortRange, MAX_LINE, PUNCH_LEN, READY,
};
use atou::transfer::dest::{ReceivePolicy, Requested};
use atou::transfer::receive::{
    check_root, FileReceiver, ReceiveConfig, ReceiveEvent, ReceiveLimits, TransferReport,
};
use atou::transfer::send::{Bound, Progress, SendError};
use atou::units::{format_rate, format_size, parse_size};

use super::exit::{self, Exit};
use super::net::runtime;
use super::transfer::{ctrlc_hook, is_remote, readers, run_send_from, ReceivingArgs, TransferArgs};
use super::UsageError;

/// How often a pull's punch datagrams are sent until the remote has them.
const PUNCH_EVERY: Duration = Duration::from_millis(200);
/// How long the remote end waits for its process to be asked to exit
/// once the transfer is over, before it is killed.
const EXIT_GRACE: Duration = Duration::from_secs(10);

/// `atou copy`'s flags for a remote end.
#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Remote end (a SRC or DEST of the form [USER@]HOST:PATH)")]
pub struct SshArgs {
    /// Command that runs the remote end, split on white space as rsync's -e (e.g. "ssh -p 2222 -i ~/.ssh/lab"); ~/.ssh/config, agents, ProxyJump and known_hosts apply as for ssh itself
    #[arg(long = "ssh", value_name = "CMD", default_value = "ssh")]
    ssh: String,
    /// atou on the remote host: a command looked up in its PATH, or a path there
    #[arg(long, value_name = "PATH", default_value = "atou")]
    remote_atou: String,
    /// UDP ports the remote end binds, LOW-HIGH or one port (one port for a push, one per stream for a pull); 0: any port. Open these in a firewall in front of the remote host
    #[arg(long, value_name = "LOW[-HIGH]", default_value = "0")]
    port: PortRange,
}

/// `atou __remote`: what ssh runs at the far end.
#[derive(Args, Debug)]
pub struct RemoteArgs {
    #[command(subcommand)]
    role: Role,
}

// Parsed once per process: the size of the larger variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
enum Role {
    /// Receive one transfer into PATH (a push)
    Receive(RemoteReceiveArgs),
    /// Send SRC... (a pull)
    Send(RemoteSendArgs),
}

#[derive(Args, Debug)]
struct RemoteReceiveArgs {
    #[arg(long, value_name = "LOW[-HIGH]", default_value = "0")]
    port: PortRange,
    /// The sender's --buffer: the largest window a stream may ask for
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    buffer: u64,
    /// Socket receive buffer, bytes
    #[arg(long, value_name = "BYTES")]
    rcvbuf: u32,
    /// Answer a dry run only, leaving PATH exactly as it is
    #[arg(long)]
    dry_run: bool,
    /// One of several shards sending into PATH at once: leave the staging
    /// directory (and a PATH this run created) for the others, even empty
    #[arg(long)]
    shard: bool,
    /// Where the files go, relative to the home directory unless absolute
    #[arg(value_name = "PATH")]
    path: String,
    #[command(flatten)]
    receiving: ReceivingArgs,
}

#[derive(Args, Debug)]
struct RemoteSendArgs {
    #[arg(long, value_name = "LOW[-HIGH]", default_value = "0")]
    port: PortRange,
    #[arg(value_name = "SRC", required = true, num_args = 1..)]
    sources: Vec<String>,
    #[command(flatten)]
    transfer: TransferArgs,
}

/// A remote path as scp reads it: relative to the home directory (where
/// ssh starts the command), `~` and `~/` meaning that directory.
fn remote_path(p: &str) -> PathBuf {
    let p = if p == "~" {
        ""
    } else {
        p.strip_prefix("~/").unwrap_or(p)
    };
    PathBuf::from(if p.is_empty() { "." } else { p })
}

// ---------------------------------------------------------------------
// The local end.

/// The remote end, running under ssh.
struct RemoteEnd {
    /// `[USER@]HOST` as the user wrote it.
    target: String,
    /// The command that was run there, for messages.
    remote_atou: String,
    child: Child,
    stdin: Option<ChildStdin>,
    /// Lines the remote printed on stdout.
    lines: mpsc::Receiver<String>,
    /// The last lines of ssh's stderr (the remote's included), for messages.
    tail: Arc<Mutex<VecDeque<String>>>,
    /// Once set, stderr lines are passed to ours as they come.
    live: Arc<AtomicBool>,
    stderr: Option<thread::JoinHandle<()>>,
}

impl RemoteEnd {
    /// Runs `REMOTE_ATOU __remote ARGS...` on `target` with the ssh command.
    fn start(ssh: &SshArgs, target: &str, args: &[String]) -> Result<RemoteEnd> {
        let mut words = ssh.ssh.split_ascii_whitespace();
        let program = words
            .next()
            .ok_or_else(|| UsageError("--ssh names no command".into()))?;
        let mut command = vec![shell_quote(&ssh.remote_atou), "__remote".to_string()];
        command.extend(args.iter().map(|a| shell_quote(a)));
        // `--`: nothing after it is an option of ssh's.
        let mut child = Command::new(program)
            .args(words)
            .arg("--")
            .arg(target)
            .arg(command.join(" "))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| anyhow!("cannot run `{program}` (--ssh): {e}"))?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().expect("piped");
        let stderr = child.stderr.take().expect("piped");
        let (tx, lines) = mpsc::channel();
        thread::spawn(move || {
            let mut r = BufReader::new(stdout);
            loop {
                let mut line = Vec::new();
                match (&mut r).take(MAX_LINE as u64).read_until(b'\n', &mut line) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        let text = String::from_utf8_lossy(&line).trim_end().to_string();
                        if tx.send(text).is_err() {
                            break;
                        }
                    }
                }
            }
        });
        let tail = Arc::new(Mutex::new(VecDeque::new()));
        let live = Arc::new(AtomicBool::new(false));
        let stderr = {
            let (tail, live, shown) = (tail.clone(), live.clone(), target.to_string());
            thread::spawn(move || {
                for line in BufReader::new(stderr).split(b'\n').map_while(|l| l.ok()) {
                    let line = escape(line.trim_ascii_end());
                    let line = line.strip_prefix("atou: ").unwrap_or(&line).to_string();
                    if live.load(Ordering::Relaxed) {
                        eprintln!("atou: {shown}: {line}");
                    }
                    let mut t = tail.lock().expect("tail lock");
                    if t.len() == 5 {
                        t.pop_front();
                    }
                    t.push_back(line);
                }
            })
        };
        Ok(RemoteEnd {
            target: target.to_string(),
            remote_atou: ssh.remote_atou.clone(),
            child,
            stdin,
            lines,
            tail,
            live,
            stderr: Some(stderr),
        })
    }
}

impl RemoteEnd {
    /// HOST, without the user.
    fn host(&self) -> &str {
        self.target.rsplit('@').next().unwrap_or(&self.target)
    }

    fn tail(&self) -> String {
        let t = self.tail.lock().expect("tail lock");
        let lines: Vec<&str> = t.iter().map(String::as_str).collect();
        if lines.is_empty() {
            "no message".to_string()
        } else {
            lines.join(" / ")
        }
    }

    /// `: LAST LINES` of stderr, or nothing if there were none.
    fn last_words(&self) -> String {
        if self.tail.lock().expect("tail lock").is_empty() {
            String::new()
        } else {
            format!(": {}", self.tail())
        }
    }

    /// Waits for ssh to exit (its output is all read by then) and says why
    /// the remote end stopped early.
    fn failure(&mut self, before: &str) -> anyhow::Error {
        self.stdin = None;
        let status = self.wait_for(EXIT_GRACE);
        if let Some(h) = self.stderr.take() {
            let _ = h.join();
        }
        let host = self.host().to_string();
        let tail = self.tail();
        match status.and_then(|s| s.code()) {
            Some(255) => anyhow!("ssh to {host} failed: {tail}"),
            Some(127) => anyhow!(
                "no atou on {host} (tried `{}`; install it there or pass --remote-atou PATH): {tail}",
                self.remote_atou
            ),
            Some(126) => anyhow!(
                "`{}` on {host} is not a program it can run (--remote-atou): {tail}",
                self.remote_atou
            ),
            Some(code) => anyhow!("atou on {host} exited with status {code} {before}: {tail}"),
            None => anyhow!("ssh to {host} ended {before} (killed by a signal): {tail}"),
        }
    }

    /// Sends the hello, reads the answer.
    fn bootstrap(&mut self, hello: &Hello) -> Result<Answer> {
        if let Some(stdin) = self.stdin.as_mut() {
            // A failed write means ssh is gone; its status says why.
            let _ = stdin
                .write_all(hello.encode().as_bytes())
                .and_then(|()| stdin.flush());
        }
        match self.lines.recv() {
            Ok(line) => match Answer::decode(&line) {
                Ok(a) if !a.ports.is_empty() => {
                    // From now on the remote's messages go to the user.
                    for line in self.tail.lock().expect("tail lock").iter() {
                        eprintln!("atou: {}: {line}", self.target);
                    }
                    self.live.store(true, Ordering::Relaxed);
                    Ok(a)
                }
                Ok(_) => Err(anyhow!("atou on {} answered no UDP port", self.host())),
                Err(why) => {
                    let _ = self.child.kill();
                    Err(anyhow!(
                        "{} did not answer the bootstrap ({why}): it printed `{}`; is `{}` there \
                         the same atou release, and does a login script print to stdout?",
                        self.host(),
                        escape(line.as_bytes()),
                        self.remote_atou
                    ))
                }
            },
            Err(_) => Err(self.failure("before the bootstrap")),
        }
    }

    /// Waits up to `grace` for ssh to exit, then kills it.
    fn wait_for(&mut self, grace: Duration) -> Option<ExitStatus> {
        let until = Instant::now() + grace;
        loop {
            match self.child.try_wait() {
                Ok(Some(s)) => return Some(s),
                Ok(None) if Instant::now() < until => thread::sleep(Duration::from_millis(20)),
                _ => {
                    let _ = self.child.kill();
                    return self.child.wait().ok();
                }
            }
        }
    }

    /// The transfer is over: closes the remote's stdin and waits for it.
    fn finish(&mut self) -> Option<ExitStatus> {
        self.stdin = None;
        let status = self.wait_for(EXIT_GRACE);
        if let Some(h) = self.stderr.take() {
            let _ = h.join();
        }
        status
    }
}

impl Drop for RemoteEnd {
    fn drop(&mut self) {
        // An early return (an error, Ctrl-C): ssh goes, and with it the
        // remote end, which exits when its stdin closes.
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Where this end sends UDP: an address of the host ssh reached, resolved
/// here (through `ssh -G` when --ssh is ssh, so ~/.ssh/config's HostName
/// applies). The remote's word on its own address only picks among them
/// (on a host with IPv4 and IPv6, the one ssh used): a remote cannot turn
/// this end's punches or hellos on a third party.
fn peer_ip(remote: &RemoteEnd, ssh: &SshArgs, answer: &Answer) -> Result<IpAddr> {
    let name = ssh_hostname(ssh, &remote.target).unwrap_or_else(|| remote.host().to_string());
    let bare = name.trim_start_matches('[').trim_end_matches(']');
    let ours: Vec<IpAddr> = match bare.parse::<IpAddr>() {
        Ok(ip) => vec![ip],
        Err(_) => (bare, 0u16)
            .to_socket_addrs()
            .map_err(|e| {
                UsageError(format!(
                    "cannot resolve `{bare}` here (the host ssh reached as {}): {e}; atou sends \
                     UDP to that host's address",
                    remote.host()
                ))
            })?
            .map(|a| a.ip())
            .collect(),
    };
    if let Some(named) = answer.addr.filter(|a| ours.contains(a)) {
        return Ok(named);
    }
    ours.iter()
        .find(|a| a.is_ipv4())
        .or(ours.first())
        .copied()
        .ok_or_else(|| anyhow!("`{bare}` resolves to no address"))
}

/// The `hostname` that `ssh -G` gives `target` under the --ssh command's
/// options, when --ssh runs ssh; `None` otherwise or if it says nothing.
fn ssh_hostname(ssh: &SshArgs, target: &str) -> Option<String> {
    let mut words = ssh.ssh.split_ascii_whitespace();
    let program = words.next()?;
    if Path::new(program).file_name()? != "ssh" {
        return None;
    }
    let out = Command::new(program)
        .arg("-G")
        .args(words)
        .arg("--")
        .arg(target)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("hostname "))
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
}

/// What a pull's receiver lets the remote sender make it hold: this end's
/// own --streams and --buffer, whatever the remote opens. Two connections
/// beyond the streams leave room for the plan and the finish, each on a
/// connection of its own, while the last streams close.
fn pull_limits(streams: usize, buffer: u64) -> atou::proto::ServerLimits {
    let connections = streams + 2;
    atou::proto::ServerLimits {
        max_connections: connections,
        max_connections_per_ip: connections,
        max_window_bytes: buffer,
        // One address may hold half of this: all of it is one sender's.
        total_window_bytes: (connections as u64)
            .saturating_mul(buffer)
            .saturating_mul(2),
        ..Default::default()
    }
}

fn one_time_key() -> Result<StaticKeypair> {
    StaticKeypair::generate().map_err(|e| anyhow!("cannot make a one-time key: {e}"))
}

/// An `authorized_keys` holding exactly `key`, with `overwrite` when the
/// receiving end's own flags allow replacing files.
fn only(key: &PublicKey, overwrite: bool) -> Result<Arc<AuthorizedKeys>> {
    let line = format!(
        "{}{}\n",
        if overwrite { "overwrite " } else { "" },
        format_public_key(key, "atou-copy-over-ssh")
    );
    AuthorizedKeys::parse(line.as_bytes(), Path::new("(the ssh bootstrap)"))
        .map(Arc::new)
        .map_err(|e| anyhow!("{e}"))
}

/// The server side of a bootstrap: this one-time key, and only the
/// peer's one-time key accepted; nothing unauthenticated.
fn server_auth(identity: StaticKeypair, peer: &PublicKey, overwrite: bool) -> Result<ServerAuth> {
    Ok(ServerAuth {
        identity: Some(identity),
        authorized: Some(only(peer, overwrite)?),
        allow_plain: false,
    })
}

fn client_auth(identity: StaticKeypair, server_key: PublicKey) -> ClientAuth {
    ClientAuth {
        identity,
        server_key,
        cipher: Cipher::for_this_cpu(),
    }
}

/// `HOST:PORT`, with the address tried if HOST is not that address.
fn udp_target(host: &str, peer: SocketAddr) -> String {
    if host.trim_start_matches('[').trim_end_matches(']') == peer.ip().to_string() {
        format!("{peer}")
    } else {
        format!("{host}:{} ({})", peer.port(), peer.ip())
    }
}

fn udp_blocked(host: &str, peer: SocketAddr, secs: f64) -> String {
    format!(
        "UDP to {} blocked? tried {secs:.0} s, no datagram arrived; \
         open the --port range in the firewall",
        udp_target(host, peer)
    )
}

/// After a transfer that did not finish: the staging directory goes if
/// empty, and so does the destination if this run created it and it is
/// empty, so a failed run leaves nothing behind but resumable partial files.
fn tidy(root: &Path, created: bool) {
    let _ = std::fs::remove_dir(root.join(atou::io::dest_dir::STAGING_DIR));
    if created {
        let _ = std::fs::remove_dir(root);
    }
}

/// `atou copy` with a remote SRC or DEST.
pub fn copy(
    sources: &[PathBuf],
    dest: &str,
    transfer: &TransferArgs,
    receiving: &ReceivingArgs,
    ssh: &SshArgs,
) -> Result<ExitCode> {
    ssh.check()?;
    let remote: Vec<Option<&str>> = sources
        .iter()
        .map(|s| s.to_str().filter(|s| is_remote(s)))
        .collect();
    let pulls = remote.iter().filter(|r| r.is_some()).count();
    if pulls == 0 {
        let (target, path) = split_ssh_target(dest).map_err(UsageError)?;
        check_target(&target)?;
        return push(sources, &target, &path, transfer, receiving, ssh);
    }
    if is_remote(dest) {
        return Err(UsageError(format!(
            "both SRC and DEST are remote (`{dest}`); copy through this host in two steps"
        ))
        .into());
    }
    if pulls < sources.len() {
        return Err(UsageError(
            "some SRCs are remote and some local; give local ones in a separate `atou copy` \
             (or as ./NAME if a name has a colon)"
                .into(),
        )
        .into());
    }
    let mut target = None;
    let mut paths = Vec::new();
    for r in remote.into_iter().flatten() {
        let (t, p) = split_ssh_target(r).map_err(UsageError)?;
        match &target {
            Some(first) if *first != t => {
                return Err(UsageError(format!(
                    "every remote SRC must be on one host: `{first}` and `{t}`"
                ))
                .into())
            }
            _ => target = Some(t),
        }
        paths.push(p);
    }
    let target = target.expect("one remote SRC at least");
    check_target(&target)?;
    pull(&target, &paths, dest, transfer, receiving, ssh)
}

/// A user or host that ssh would read as an option is refused (the host
/// also goes after `--`, which ends ssh's options).
fn check_target(target: &str) -> Result<()> {
    let (user, host) = match target.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, target),
    };
    if host.is_empty() || host.starts_with('-') || user.is_some_and(|u| u.starts_with('-')) {
        return Err(UsageError(format!(
            "`{target}` is not a [USER@]HOST: neither may begin with `-`"
        ))
        .into());
    }
    Ok(())
}

impl SshArgs {
    /// Values that ssh or the remote shell would read as options are
    /// refused: `--remote-atou=-oProxyCommand=sh` would run a command here.
    fn check(&self) -> Result<()> {
        if self.remote_atou.starts_with('-') {
            return Err(UsageError(format!(
                "--remote-atou `{}` begins with `-`; name a command or a path (./{} for a file \
                 of that name)",
                self.remote_atou, self.remote_atou
            ))
            .into());
        }
        Ok(())
    }
}

fn push(
    sources: &[PathBuf],
    target: &str,
    path: &str,
    transfer: &TransferArgs,
    receiving: &ReceivingArgs,
    ssh: &SshArgs,
) -> Result<ExitCode> {
    let (tuning, _) = transfer.tuning().resolve()?;
    let identity = one_time_key()?;
    let hello = Hello {
        key: identity.public(),
        token: None,
    };
    let mut args = vec![
        "receive".to_string(),
        "--port".to_string(),
        ssh.port.to_string(),
        "--buffer".to_string(),
        transfer.buffer().to_string(),
        "--rcvbuf".to_string(),
        tuning.rcvbuf.to_string(),
    ];
    if transfer.dry_run() {
        // An atou there that predates --dry-run refuses the flag: no
        // receiver that would write starts.
        args.push("--dry-run".to_string());
    }
    if transfer.shard().is_some() {
        // An atou there that predates --shard refuses the flag.
        args.push("--shard".to_string());
    }
    args.extend(receiving.remote_args());
    args.extend(["--".to_string(), path.to_string()]);
    let mut remote = RemoteEnd::start(ssh, target, &args)?;
    let answer = remote.bootstrap(&hello)?;
    let peer = SocketAddr::new(peer_ip(&remote, ssh, &answer)?, answer.ports[0]);
    let shown = format!("{target}:{path}");
    let mut config = transfer.send_config(peer, shown, None)?;
    config.auth = Some(client_auth(identity, answer.key));
    let host = remote.host().to_string();
    let shared = Mutex::new(&mut remote);
    let code = run_send_from(
        sources,
        config,
        transfer,
        None,
        &[],
        Arc::new(Progress::default()),
        |e| {
            // The remote end died: that, not the silence after it, is news.
            if let SendError::Conn(ProbeError::Conn { .. }) = e {
                let mut r = shared.lock().expect("remote lock");
                if let Some(status) = r.child.try_wait().ok().flatten().filter(|s| !s.success()) {
                    return Some(format!(
                        "atou on {host} ended during the transfer (ssh: {status}){}; run the \
                         same command again to resume",
                        r.last_words()
                    ));
                }
            }
            match e {
                SendError::Conn(ProbeError::Conn {
                    error:
                        ConnError::Idle {
                            stage: Stage::Hello,
                            idle,
                        },
                    ..
                }) => Some(udp_blocked(&host, peer, idle.as_secs_f64())),
                SendError::Conn(ProbeError::Unreachable { .. }) => Some(format!(
                    "UDP to {} was refused: the host or a firewall answered ICMP unreachable; \
                     open the --port range in the firewall",
                    udp_target(&host, peer)
                )),
                _ => None,
            }
        },
    )?;
    if code != ExitCode::SUCCESS {
        // The reason is said; what the remote adds as it goes is noise.
        remote.live.store(false, Ordering::Relaxed);
    }
    match remote.finish() {
        Some(s) if s.success() || code != ExitCode::SUCCESS => Ok(code),
        Some(s) => Err(anyhow!(
            "the transfer was verified, but atou on {host} then failed ({s}): {}",
            remote.tail()
        )),
        None => Ok(code),
    }
}

fn pull(
    target: &str,
    paths: &[String],
    dest: &str,
    transfer: &TransferArgs,
    receiving: &ReceivingArgs,
    ssh: &SshArgs,
) -> Result<ExitCode> {
    let (tuning, notes) = transfer.tuning().resolve()?;
    for note in notes {
        eprintln!("atou: {note}");
    }
    let identity = one_time_key()?;
    let token = random_token().map_err(|e| anyhow!(e))?;
    let hello = Hello {
        key: identity.public(),
        token: Some(token),
    };
    let mut args = vec![
        "send".to_string(),
        "--port".to_string(),
        ssh.port.to_string(),
    ];
    args.extend(transfer.remote_send_args()?);
    args.push("--".to_string());
    args.extend(paths.iter().cloned());
    let mut remote = RemoteEnd::start(ssh, target, &args)?;
    let answer = remote.bootstrap(&hello)?;
    let ip = peer_ip(&remote, ssh, &answer)?;
    // This end's rules, from its own flags: the remote only asks.
    let policy = receiving.policy(
        transfer.overwrite(),
        transfer.fsync(),
        Some(Requested::from_paths(paths)),
    );
    // Created only now: a failed bootstrap leaves nothing behind.
    let root = Path::new(dest);
    let created = !root.exists();
    atou::transfer::dest::create_destination(root).map_err(UsageError)?;
    let root = check_root(root).map_err(UsageError)?;
    let result = pull_into(
        &mut remote,
        &answer,
        ip,
        &root,
        identity,
        token,
        transfer,
        policy,
        &tuning,
    );
    // Other shards may be receiving into the same DEST.
    if transfer.shard().is_none() {
        tidy(&root, created);
    }
    result
}

/// A pull once the remote end has answered: receive into `root`.
#[allow(clippy::too_many_arguments)]
fn pull_into(
    remote: &mut RemoteEnd,
    answer: &Answer,
    ip: IpAddr,
    root: &Path,
    identity: StaticKeypair,
    token: [u8; 32],
    transfer: &TransferArgs,
    policy: ReceivePolicy,
    tuning: &atou::proto::Tuning,
) -> Result<ExitCode> {
    let host = remote.host().to_string();
    let target = remote.target.clone();
    let root = root.to_path_buf();
    let any: IpAddr = match ip {
        IpAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
        IpAddr::V6(_) => Ipv6Addr::UNSPECIFIED.into(),
    };
    let sock = UdpSocket::bind(SocketAddr::new(any, 0))?;
    let local = sock.local_addr()?;

    // The receiver, on the socket the punches leave from.
    let outcome: Arc<Mutex<Option<Result<TransferReport, String>>>> = Arc::new(Mutex::new(None));
    let mut receiver = FileReceiver::new(
        ReceiveConfig {
            root: root.clone(),
            writers: readers(None),
            once: true,
            policy,
            limits: ReceiveLimits {
                max_sessions: 1,
                max_sessions_per_ip: 1,
                ..ReceiveLimits::default()
            },
            // The other end's one-time key, which may replace files only
            // if this end was given --overwrite.
            authorized: Some(only(&answer.key, transfer.overwrite())?),
        },
        {
            let outcome = outcome.clone();
            move |e| {
                let r = match e {
                    ReceiveEvent::Done(r) => Ok(r),
                    ReceiveEvent::Failed { why, .. } => Err(why),
                    // A pull's dry run is refused before it starts; a
                    // copy's receiver keeps its staging directory.
                    ReceiveEvent::Planned { .. } | ReceiveEvent::StagingCleaned { .. } => return,
                };
                outcome.lock().expect("lock").get_or_insert(r);
            }
        },
    )
    .map_err(UsageError)?;
    let stop = Arc::new(tokio::sync::Notify::new());
    let auth = server_auth(identity, &answer.key, transfer.overwrite())?;
    let server = {
        let stop = stop.clone();
        let sock = sock.try_clone()?;
        let limits = pull_limits(transfer.streams(), transfer.buffer());
        let rcvbuf = tuning.rcvbuf;
        thread::spawn(move || -> Result<()> {
            runtime()?.block_on(io::serve_from(
                Some(sock),
                ServeConfig {
                    bind: local,
                    once: false,
                    sndbuf: 4 << 20,
                    rcvbuf,
                    limits,
                    auth,
                    // One-time keys: no hello outlives this run.
                    hello_timestamps: None,
                },
                &mut receiver,
                |_| {},
                async move { stop.notified().await },
            ))?;
            Ok(())
        })
    };
    let interrupted = Arc::new(AtomicBool::new(false));
    {
        let i = interrupted.clone();
        let _ = ctrlc_hook(move || i.store(true, Ordering::Relaxed));
    }
    let stop_server = |server: thread::JoinHandle<Result<()>>| {
        stop.notify_one();
        let _ = server.join();
    };

    // Punch until the remote has heard from us on every port.
    let wait = tuning.maxidle;
    let started = Instant::now();
    let datagram = punch(&token);
    loop {
        for &p in &answer.ports {
            // A send error (no route) is as good as a lost punch: the
            // deadline decides.
            let _ = sock.send_to(&datagram, SocketAddr::new(ip, p));
        }
        match remote.lines.recv_timeout(PUNCH_EVERY) {
            Ok(line) if line == READY => break,
            Ok(line) => {
                stop_server(server);
                return Err(anyhow!(
                    "{host} said `{}` where the bootstrap expected {READY}",
                    escape(line.as_bytes())
                ));
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if interrupted.load(Ordering::Relaxed) {
                    stop_server(server);
                    eprintln!("atou: interrupted; run the same command again to resume");
                    return Ok(Exit::Interrupted.into());
                }
                if started.elapsed() >= wait {
                    stop_server(server);
                    return Err(exit::Failure(
                        Exit::Network,
                        udp_blocked(
                            &host,
                            SocketAddr::new(ip, answer.ports[0]),
                            started.elapsed().as_secs_f64(),
                        ),
                    )
                    .into());
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                stop_server(server);
                return Err(remote.failure("before the transfer"));
            }
        }
    }

    // The remote sends; wait for the receiver to finish, or the remote
    // to fail, or Ctrl-C.
    let mut remote_status = None;
    let mut until = None;
    while !server.is_finished() {
        if interrupted.load(Ordering::Relaxed) {
            stop_server(server);
            eprintln!("atou: interrupted; run the same command again to resume");
            return Ok(Exit::Interrupted.into());
        }
        if remote_status.is_none() {
            if let Ok(Some(s)) = remote.child.try_wait() {
                remote_status = Some(s);
                // The receiver hears the sender's last word (its finish,
                // or an abort) within moments; a sender killed says none.
                let grace = if s.success() { 10 } else { 2 };
                until = Some(Instant::now() + Duration::from_secs(grace));
            }
        }
        if until.is_some_and(|t| Instant::now() >= t) {
            break;
        }
        thread::sleep(Duration::from_millis(20));
    }
    stop_server(server);
    let status = match remote_status {
        Some(s) => {
            remote.finish();
            Some(s)
        }
        None => remote.finish(),
    };
    let result = outcome.lock().expect("lock").take();
    match result {
        Some(Ok(r)) => {
            if transfer.json() {
                super::print_stdout(&exit::json_text(&exit::json_report(&r, Exit::Ok)?, false))?;
            } else if !transfer.quiet() {
                eprint!("{}", received_text(&r, &target));
            }
            Ok(Exit::Ok.into())
        }
        // Either way the partial files stay here for a resume.
        Some(Err(why)) => {
            let why = format!(
                "the transfer from {host} into {} failed: {}",
                shown_path(&root),
                escape(why.as_bytes())
            );
            eprintln!("atou: {why}");
            if transfer.json() {
                let v = exit::json_failure(Exit::Partial, &host, &why);
                super::print_stdout(&exit::json_text(&v, false))?;
            }
            Ok(Exit::Partial.into())
        }
        None => {
            let status = status.map_or("no status".to_string(), |s| s.to_string());
            let why = format!(
                "the transfer from {host} did not finish: atou there ended (ssh: {status}){}; \
                 run the same command again to resume",
                remote.last_words()
            );
            eprintln!("atou: {why}");
            if transfer.json() {
                let v = exit::json_failure(Exit::Partial, &host, &why);
                super::print_stdout(&exit::json_text(&v, false))?;
            }
            Ok(Exit::Partial.into())
        }
    }
}

fn received_text(r: &TransferReport, from: &str) -> String {
    let rate = if r.secs > 0.0 {
        r.bytes_written as f64 * 8.0 / r.secs
    } else {
        0.0
    };
    let mut s = format!(
        "atou: received {} file{} ({} dir{}, {} symlink{}) from {from} into {}: {} in {:.2} s, {}",
        r.files,
        if r.files == 1 { "" } else { "s" },
        r.dirs,
        if r.dirs == 1 { "" } else { "s" },
        r.symlinks,
        if r.symlinks == 1 { "" } else { "s" },
        shown_path(&r.dest),
        format_size(r.bytes_written),
        r.secs,
        format_rate(rate),
    );
    s += &super::transfer::not_sent_and_resent(r.bytes_resumed, r.skipped, r.chunks_rejected);
    s + "\natou: every file verified here (BLAKE3 per chunk and per file)\n"
}

// ---------------------------------------------------------------------
// The remote end.

pub fn remote(args: RemoteArgs) -> Result<ExitCode> {
    let mut stdin = BufReader::new(std::io::stdin());
    let mut line = Vec::new();
    (&mut stdin)
        .take(MAX_LINE as u64)
        .read_until(b'\n', &mut line)?;
    let hello = Hello::decode(&String::from_utf8_lossy(&line))
        .map_err(|e| anyhow!("the bootstrap hello on stdin: {e}"))?;
    // Where the ssh client reached us: the address to give back.
    let ip = std::env::var("SSH_CONNECTION")
        .ok()
        .and_then(|c| ssh_server_ip(&c));
    // The local end gone (ssh closed, Ctrl-C there): stop.
    let gone = Arc::new(tokio::sync::Notify::new());
    let gone_flag = Arc::new(AtomicBool::new(false));
    let watch = {
        let (gone, flag) = (gone.clone(), gone_flag.clone());
        move || {
            let mut sink = [0u8; 256];
            while matches!(stdin.read(&mut sink), Ok(n) if n > 0) {}
            flag.store(true, Ordering::Relaxed);
            gone.notify_one();
        }
    };
    match args.role {
        Role::Receive(a) => remote_receive(a, hello, ip, watch, gone),
        Role::Send(a) => remote_send(a, hello, ip, watch, gone_flag),
    }
}

/// Prints the bootstrap answer on stdout.
fn answer(ports: Vec<u16>, key: PublicKey, addr: Option<IpAddr>) -> Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(Answer { ports, key, addr }.encode().as_bytes())?;
    out.flush()?;
    Ok(())
}

fn remote_receive(
    args: RemoteReceiveArgs,
    hello: Hello,
    ip: Option<IpAddr>,
    watch: impl FnOnce() + Send + 'static,
    gone: Arc<tokio::sync::Notify>,
) -> Result<ExitCode> {
    let root = remote_path(&args.path);
    if args.dry_run {
        let dry = super::transfer::DryRunRoot::new(&root)?;
        let root = check_root(dry.path()).map_err(|e| anyhow!(e))?;
        // No tidying: nothing was created, and an empty staging directory
        // that was there before stays.
        return receive_into(&root, args, hello, ip, watch, gone);
    }
    let created = !root.exists();
    atou::transfer::dest::create_destination(&root).map_err(|e| anyhow!(e))?;
    let root = check_root(&root).map_err(|e| anyhow!(e))?;
    let shard = args.shard;
    let result = receive_into(&root, args, hello, ip, watch, gone);
    if !shard {
        tidy(&root, created);
    }
    result
}

fn receive_into(
    root: &Path,
    args: RemoteReceiveArgs,
    hello: Hello,
    ip: Option<IpAddr>,
    watch: impl FnOnce() + Send + 'static,
    gone: Arc<tokio::sync::Notify>,
) -> Result<ExitCode> {
    let root = root.to_path_buf();
    let sock = bind_in_range(ip.unwrap_or(Ipv4Addr::UNSPECIFIED.into()), args.port, 1)
        .map_err(|e| anyhow!(e))?
        .remove(0);
    let local = sock.local_addr()?;
    let identity = one_time_key()?;
    let key = identity.public();
    // The far end of a push takes the local user's own rules, passed on
    // its command line; the one sender is that user.
    let auth = server_auth(identity, &hello.key, true)?;
    let policy = args.receiving.policy(true, false, None);
    let outcome: Arc<Mutex<Option<Result<(), String>>>> = Arc::new(Mutex::new(None));
    let new_receiver = if args.dry_run {
        FileReceiver::dry_run
    } else {
        FileReceiver::new
    };
    let mut receiver = new_receiver(
        ReceiveConfig {
            root,
            writers: readers(None),
            once: true,
            policy,
            limits: ReceiveLimits::default(),
            // The other end's one-time key: its --overwrite decides.
            authorized: Some(only(&hello.key, true)?),
        },
        {
            let outcome = outcome.clone();
            move |e| {
                let r = match e {
                    ReceiveEvent::Done(_)
                    | ReceiveEvent::Planned { .. }
                    | ReceiveEvent::StagingCleaned { .. } => Ok(()),
                    ReceiveEvent::Failed { why, .. } => Err(why),
                };
                outcome.lock().expect("lock").get_or_insert(r);
            }
        },
    )
    .map_err(|e| anyhow!(e))?;
    answer(vec![local.port()], key, ip)?;
    thread::spawn(watch);
    runtime()?.block_on(io::serve_from(
        Some(sock),
        ServeConfig {
            bind: local,
            once: false,
            sndbuf: 4 << 20,
            rcvbuf: args.rcvbuf,
            // The one sender is the user: its windows are what it asked
            // for (--buffer per stream at most).
            limits: atou::proto::ServerLimits {
                max_window_bytes: args.buffer,
                total_window_bytes: u64::MAX / 2,
                ..Default::default()
            },
            auth,
            // One-time keys: no hello outlives this run.
            hello_timestamps: None,
        },
        &mut receiver,
        |_| {},
        async move { gone.notified().await },
    ))?;
    let result = outcome.lock().expect("lock").take();
    match result {
        Some(Ok(())) => Ok(ExitCode::SUCCESS),
        // The sender has the reason too, in its answer.
        Some(Err(why)) => {
            eprintln!("atou: receiving failed: {}", escape(why.as_bytes()));
            Ok(ExitCode::from(1))
        }
        None => {
            eprintln!("atou: the local end went away before the transfer was over; the partial files stay for a rerun");
            Ok(ExitCode::from(1))
        }
    }
}

fn remote_send(
    args: RemoteSendArgs,
    hello: Hello,
    ip: Option<IpAddr>,
    watch: impl FnOnce() + Send + 'static,
    gone: Arc<AtomicBool>,
) -> Result<ExitCode> {
    let Some(token) = hello.token else {
        return Err(anyhow!(
            "the bootstrap hello for a pull carries no punch token"
        ));
    };
    let (tuning, _) = args.transfer.tuning().resolve()?;
    // A SRC that is not there fails the bootstrap, with its reason.
    let sources: Vec<PathBuf> = args.sources.iter().map(|s| remote_path(s)).collect();
    for s in &sources {
        if let Err(e) = std::fs::symlink_metadata(s) {
            return Err(anyhow!("cannot read {}: {e}", shown_path(s)));
        }
    }
    let streams = args.transfer.streams();
    let socks = bind_in_range(
        ip.unwrap_or(Ipv4Addr::UNSPECIFIED.into()),
        args.port,
        streams,
    )
    .map_err(|e| anyhow!(e))?;
    let ports = socks
        .iter()
        .map(|s| s.local_addr().map(|a| a.port()))
        .collect::<std::io::Result<Vec<u16>>>()?;
    let identity = one_time_key()?;
    answer(ports, identity.public(), ip)?;
    thread::spawn(watch);

    // Each socket waits for its punch; where it came from is the peer.
    for s in &socks {
        s.set_nonblocking(true)?;
    }
    let mut peers: Vec<Option<SocketAddr>> = vec![None; socks.len()];
    let deadline = Instant::now() + tuning.maxidle + Duration::from_secs(5);
    let mut buf = [0u8; 2048];
    while peers.iter().any(Option::is_none) {
        if gone.load(Ordering::Relaxed) {
            return Ok(ExitCode::from(1));
        }
        if Instant::now() >= deadline {
            eprintln!(
                "atou: no punch datagram arrived in {:.0} s",
                (tuning.maxidle + Duration::from_secs(5)).as_secs_f64()
            );
            return Ok(ExitCode::from(1));
        }
        let mut any = false;
        for (s, peer) in socks.iter().zip(peers.iter_mut()) {
            while let Ok((n, from)) = s.recv_from(&mut buf) {
                any = true;
                // Anything but the token is ignored: a stranger on the
                // path cannot pick where this end sends.
                if peer.is_none() && n == PUNCH_LEN && is_punch(&buf[..n], &token) {
                    *peer = Some(from);
                }
            }
        }
        if !any {
            thread::sleep(Duration::from_millis(10));
        }
    }
    {
        let mut out = std::io::stdout().lock();
        out.write_all(format!("{READY}\n").as_bytes())?;
        out.flush()?;
    }
    let from: Vec<Bound> = socks
        .into_iter()
        .zip(peers)
        .map(|(socket, peer)| Bound {
            socket,
            peer: peer.expect("every socket was punched"),
        })
        .collect();
    let local = std::env::var("SSH_CONNECTION")
        .ok()
        .and_then(|c| c.split_ascii_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "the local end".to_string());
    let mut config = args.transfer.send_config(from[0].peer, local, None)?;
    config.auth = Some(client_auth(identity, hello.key));
    let progress = Arc::new(Progress::default());
    {
        let p = progress.clone();
        thread::spawn(move || {
            while !gone.load(Ordering::Relaxed) {
                thread::sleep(Duration::from_millis(50));
            }
            p.stop.store(true, Ordering::Relaxed);
        });
    }
    run_send_from(
        &sources,
        config,
        &args.transfer,
        None,
        &from,
        progress,
        |_| None,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Local {
        #[command(flatten)]
        transfer: TransferArgs,
    }

    #[derive(Parser)]
    struct Far {
        #[command(subcommand)]
        role: Role,
    }

    #[test]
    fn a_pull_forwards_the_senders_flags_and_every_knob_exactly() {
        let local = Local::try_parse_from([
            "copy",
            "--streams",
            "3",
            "--buffer",
            "32MiB",
            "--overwrite",
            "--follow",
            "--delack",
            "1ms",
            "--recovery",
            "newreno",
            "--rcvwin",
            "7",
            "--exclude",
            "*.tmp",
            "--exclude=-odd/***",
            "--shard",
            "3/8",
        ])
        .unwrap();
        let mut argv = vec!["__remote".to_string(), "send".to_string()];
        argv.extend(local.transfer.remote_send_args().unwrap());
        argv.extend(["--".to_string(), "-odd name".to_string()]);
        let Far {
            role: Role::Send(far),
        } = Far::try_parse_from(&argv).unwrap()
        else {
            panic!("not a send")
        };
        assert_eq!(far.sources, vec!["-odd name".to_string()]);
        assert_eq!(far.transfer.streams(), 3);
        assert_eq!(far.transfer.buffer(), 32 << 20);
        assert_eq!(
            far.transfer.shard().map(|s| s.to_string()),
            Some("3/8".into())
        );
        assert!(!far.transfer.quiet() && far.transfer.json());
        let (a, _) = local.transfer.tuning().resolve().unwrap();
        let (b, _) = far.transfer.tuning().resolve().unwrap();
        assert_eq!(a, b);
        assert_ne!(a, atou::proto::Tuning::default());
        let config = far
            .transfer
            .send_config("127.0.0.1:1".parse().unwrap(), "h".into(), None)
            .unwrap();
        assert!(config.options.overwrite && config.follow && !config.options.fsync);
        let here = local
            .transfer
            .send_config("127.0.0.1:1".parse().unwrap(), "h".into(), None)
            .unwrap();
        assert_eq!(config.excludes, here.excludes);
        assert!(config.excludes.excludes(b"t/-odd/x", false));
    }

    #[test]
    fn remote_paths_are_relative_to_home() {
        assert_eq!(remote_path(""), PathBuf::from("."));
        assert_eq!(remote_path("~"), PathBuf::from("."));
        assert_eq!(remote_path("~/a/b"), PathBuf::from("a/b"));
        assert_eq!(remote_path("/abs"), PathBuf::from("/abs"));
        assert_eq!(remote_path("rel"), PathBuf::from("rel"));
    }
}

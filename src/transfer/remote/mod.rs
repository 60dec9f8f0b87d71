//! `atou copy` with a remote end, over ssh: the library side of a push
//! and a pull. The CLI (`src/cli/remote.rs`) parses the flags, calls
//! these and prints what they report.
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
//! Third-party (`atou copy [USER@]A:PATH... [USER@]B:PATH`): both ends
//! are remote; [`third_party`] starts them and the data goes from A to B.
//!
//! The line protocol is [`super::bootstrap`]; docs/security.md,
//! "The ssh bootstrap, step by step", says why it is safe.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crate::io::{self, ProbeError, ServeApp, ServeConfig, ServeError};
use crate::proto::crypto::{
    format_public_key, AuthorizedKeys, Cipher, ClientAuth, PublicKey, ServerAuth, StaticKeypair,
};
use crate::proto::endpoint::client::Stage;
use crate::proto::endpoint::server::{Arrival, SessionEvent};
use crate::proto::{ConnError, Server, ServerLimits};
use crate::transfer::bootstrap::{
    bind_in_range, is_punch, punch, random_token, shell_quote, Answer, Hello, PortRange, MAX_LINE,
    PUNCH_LEN, READY,
};
use crate::transfer::dest::{DryRunRoot, ReceivePolicy};
use crate::transfer::receive::{
    check_root, FileReceiver, ReceiveConfig, ReceiveEvent, ReceiveLimits, TransferReport,
};
use crate::transfer::send::{Bound, Progress, SendError};
use crate::transfer::tunnel::{self, ClientSide, ServerSide, Tunnel};
use crate::util::text::escape;

mod third_party;
pub(crate) use third_party::{
    FarSendTo, Ordered, ThirdParty, ThirdPartyOutcome, PROGRESS_LINE, UNREACHED,
};

/// Most bytes of the remote's stdout lines kept for this end to read;
/// the rest are read and dropped.
const MAX_KEPT: usize = 1 << 20;
/// How long a copy waits for a UDP answer from the remote before it
/// carries its datagrams over the ssh connection instead (issue 29).
const DETECT_UDP: Duration = Duration::from_secs(3);
/// How often a pull's punch datagrams are sent until the remote has them.
const PUNCH_EVERY: Duration = Duration::from_millis(200);
/// How long the remote end waits for its process to be asked to exit
/// once the transfer is over, before it is killed.
const EXIT_GRACE: Duration = Duration::from_secs(10);

/// Why a copy over ssh failed. Each says what failed, on which host, and
/// what to do; the kind tells the CLI which exit status it is.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    /// What was asked for cannot work as written: fix the command.
    #[error("{0}")]
    Usage(String),
    /// No datagram crossed between the two hosts.
    #[error("{0}")]
    Network(String),
    /// ssh, the remote atou or this end failed otherwise.
    #[error("{0}")]
    Failed(String),
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Serve(#[from] ServeError),
}

fn failed(why: impl Into<String>) -> RemoteError {
    RemoteError::Failed(why.into())
}

/// DEST cannot be used as the command named it: fix the command.
fn usage(e: crate::transfer::Error) -> RemoteError {
    RemoteError::Usage(e.to_string())
}

/// How the remote end is run: `--ssh` and `--remote-atou`.
#[derive(Debug, Clone)]
pub(crate) struct SshCommand {
    /// The command that runs the remote end, split on white space as
    /// rsync's -e.
    pub ssh: String,
    /// atou on the remote host: a command in its PATH, or a path there.
    pub remote_atou: String,
}

impl SshCommand {
    /// Values that ssh or the remote shell would read as options are
    /// refused: `--remote-atou=-oProxyCommand=sh` would run a command here.
    pub(crate) fn check(&self) -> Result<(), RemoteError> {
        if self.remote_atou.starts_with('-') {
            return Err(RemoteError::Usage(format!(
                "--remote-atou `{}` begins with `-`; name a command or a path (./{} for a file \
                 of that name)",
                self.remote_atou, self.remote_atou
            )));
        }
        Ok(())
    }
}

/// A user or host that ssh would read as an option is refused (the host
/// also goes after `--`, which ends ssh's options).
pub(crate) fn check_target(target: &str) -> Result<(), RemoteError> {
    let (user, host) = match target.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, target),
    };
    if host.is_empty() || host.starts_with('-') || user.is_some_and(|u| u.starts_with('-')) {
        return Err(RemoteError::Usage(format!(
            "`{target}` is not a [USER@]HOST: neither may begin with `-`"
        )));
    }
    Ok(())
}

/// A remote path as scp reads it: relative to the home directory (where
/// ssh starts the command), `~` and `~/` meaning that directory.
pub(crate) fn remote_path(p: &str) -> PathBuf {
    let p = if p == "~" {
        ""
    } else {
        p.strip_prefix("~/").unwrap_or(p)
    };
    PathBuf::from(if p.is_empty() { "." } else { p })
}

/// After a transfer that did not finish: the staging directory goes if
/// empty, and so does the destination if this run created it and it is
/// empty, so a failed run leaves nothing behind but resumable partial files.
pub(crate) fn tidy(root: &Path, created: bool) {
    let _ = std::fs::remove_dir(root.join(crate::io::dest_dir::STAGING_DIR));
    if created {
        let _ = std::fs::remove_dir(root);
    }
}

fn runtime() -> Result<tokio::runtime::Runtime, RemoteError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| failed(format!("cannot start the I/O runtime: {e}")))
}

fn one_time_key() -> Result<StaticKeypair, RemoteError> {
    StaticKeypair::generate().map_err(|e| failed(format!("cannot make a one-time key: {e}")))
}

/// An `authorized_keys` holding exactly `key`, with `overwrite` and
/// `delete` where the receiving end's own flags allow replacing files and
/// deleting.
fn only(
    key: &PublicKey,
    overwrite: bool,
    delete: bool,
) -> Result<Arc<AuthorizedKeys>, RemoteError> {
    // Owners and attributes: the receiving end's policy, built from its
    // user's flags, says whether; the one-time key does not forbid them.
    let options: Vec<&str> = [
        (overwrite, "overwrite"),
        (delete, "delete"),
        (true, "owners"),
        (true, "xattrs"),
        (true, "acls"),
    ]
    .into_iter()
    .filter_map(|(on, name)| on.then_some(name))
    .collect();
    let line = format!(
        "{}{}{}\n",
        options.join(","),
        if options.is_empty() { "" } else { " " },
        format_public_key(key, "atou-copy-over-ssh")
    );
    AuthorizedKeys::parse(line.as_bytes())
        .map(Arc::new)
        .map_err(|e| failed(e.to_string()))
}

/// The server side of a bootstrap: this one-time key, and only the
/// peer's one-time key accepted; nothing unauthenticated.
fn server_auth(
    identity: StaticKeypair,
    peer: &PublicKey,
    overwrite: bool,
    delete: bool,
) -> Result<ServerAuth, RemoteError> {
    Ok(ServerAuth {
        identity: Some(identity),
        authorized: Some(only(peer, overwrite, delete)?),
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

/// No UDP got through and the remote did not answer the switch to the
/// ssh tunnel: an atou there from before the tunnel reads stdin only for
/// its end.
fn no_tunnel(host: &str, peer: SocketAddr, tried: Duration) -> String {
    format!(
        "UDP to {} blocked? tried {:.0} s, no datagram arrived, and atou on {host} did not take \
         the ssh tunnel (an older release?); open the --port range in the firewall, or run this \
         atou release there",
        udp_target(host, peer),
        tried.as_secs_f64()
    )
}

/// Says, on one line, that the transfer goes through the ssh connection.
fn say_detour(host: &str, peer: SocketAddr) {
    eprintln!(
        "atou: no UDP reply from {} in {:.0} s (a firewall?); the transfer goes through the ssh \
         connection",
        udp_target(host, peer),
        DETECT_UDP.as_secs_f64()
    );
}

// ---------------------------------------------------------------------
// The remote end as the local end sees it: ssh running `atou __remote`.

/// The remote end, running under ssh.
pub(crate) struct RemoteEnd {
    /// `[USER@]HOST` as the user wrote it.
    target: String,
    /// The command that was run there, for messages.
    remote_atou: String,
    child: Child,
    stdin: Option<ChildStdin>,
    /// Lines the remote printed on stdout.
    lines: Lines,
    /// The rest of its stdout, once it switched to the tunnel.
    frames: mpsc::Receiver<BufReader<ChildStdout>>,
    /// The last lines of ssh's stderr (the remote's included), for messages.
    tail: Arc<Mutex<VecDeque<String>>>,
    /// Once set, stderr lines are passed to ours as they come.
    live: Arc<AtomicBool>,
    stderr: Option<thread::JoinHandle<()>>,
    /// The transfer was verified and ssh was left to end by itself.
    detached: bool,
}

impl RemoteEnd {
    /// Runs `REMOTE_ATOU __remote ARGS...` on `target` with the ssh command.
    pub(crate) fn start(
        ssh: &SshCommand,
        target: &str,
        hello: &Hello,
        args: &[String],
    ) -> Result<RemoteEnd, RemoteError> {
        // The hello on the command line, not stdin: ssh would send stdin
        // only once the command has started, a round trip later.
        RemoteEnd::spawn(ssh, target, Some(hello), args)
    }

    /// [`RemoteEnd::start`] before the hello is known: ssh logs in
    /// meanwhile, and the remote waits for the hello as the first line
    /// on its stdin ([`RemoteEnd::say_hello_first`]).
    pub(crate) fn start_hello_later(
        ssh: &SshCommand,
        target: &str,
        args: &[String],
    ) -> Result<RemoteEnd, RemoteError> {
        RemoteEnd::spawn(ssh, target, None, args)
    }

    fn spawn(
        ssh: &SshCommand,
        target: &str,
        hello: Option<&Hello>,
        args: &[String],
    ) -> Result<RemoteEnd, RemoteError> {
        let mut words = ssh.ssh.split_ascii_whitespace();
        let program = words
            .next()
            .ok_or_else(|| RemoteError::Usage("--ssh names no command".into()))?;
        let mut command = vec![shell_quote(&ssh.remote_atou), "__remote".to_string()];
        match hello {
            Some(hello) => {
                command.push("--hello".to_string());
                command.push(shell_quote(&hello.encode()));
            }
            None => command.push("--hello-stdin".to_string()),
        }
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
            .map_err(|e| failed(format!("cannot run `{program}` (--ssh): {e}")))?;
        let stdin = child.stdin.take();
        let (lines, frames) = read_lines(child.stdout.take().expect("piped"));
        let tail = Arc::new(Mutex::new(VecDeque::new()));
        let live = Arc::new(AtomicBool::new(false));
        let stderr = keep_stderr(
            child.stderr.take().expect("piped"),
            target,
            tail.clone(),
            live.clone(),
        );
        Ok(RemoteEnd {
            target: target.to_string(),
            remote_atou: ssh.remote_atou.clone(),
            child,
            stdin,
            lines,
            frames,
            tail,
            live,
            stderr: Some(stderr),
            detached: false,
        })
    }

    /// `[USER@]HOST` as the user wrote it.
    pub(crate) fn target(&self) -> &str {
        &self.target
    }

    /// HOST, without the user.
    pub(crate) fn host(&self) -> &str {
        self.target.rsplit('@').next().unwrap_or(&self.target)
    }

    /// The last lines of ssh's stderr, joined, for a message.
    pub(crate) fn tail(&self) -> String {
        let t = self.tail.lock().expect("tail lock");
        let lines: Vec<&str> = t.iter().map(String::as_str).collect();
        if lines.is_empty() {
            "no message".to_string()
        } else {
            lines.join(" / ")
        }
    }

    /// `: LAST LINES` of stderr, or nothing if there were none.
    pub(crate) fn last_words(&self) -> String {
        if self.tail.lock().expect("tail lock").is_empty() {
            String::new()
        } else {
            format!(": {}", self.tail())
        }
    }

    /// The remote's stderr lines stop being passed to ours: once the
    /// reason for a failure is said, what the remote adds is noise.
    pub(crate) fn quiet(&self) {
        self.live.store(false, Ordering::Relaxed);
    }

    /// ssh's status if it has already exited.
    fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Waits for ssh to exit (its output is all read by then) and says why
    /// the remote end stopped early.
    pub(crate) fn failure(&mut self, before: &str) -> RemoteError {
        self.stdin = None;
        let status = self.wait_for(EXIT_GRACE);
        if let Some(h) = self.stderr.take() {
            let _ = h.join();
        }
        let host = self.host().to_string();
        let tail = self.tail();
        failed(match status.and_then(|s| s.code()) {
            Some(255) => format!("ssh to {host} failed: {tail}"),
            Some(127) => format!(
                "no atou on {host} (tried `{}`; install it there or pass --remote-atou PATH): {tail}",
                self.remote_atou
            ),
            Some(126) => format!(
                "`{}` on {host} is not a program it can run (--remote-atou): {tail}",
                self.remote_atou
            ),
            // clap's usage error: an atou that predates bootstrap 2.
            Some(2) if tail.contains("'--hello'") => format!(
                "atou on {host} (`{}`) is an older release that does not know the bootstrap's \
                 --hello: run the same atou release at both ends: {tail}",
                self.remote_atou
            ),
            Some(code) => format!("atou on {host} exited with status {code} {before}: {tail}"),
            None => format!("ssh to {host} ended {before} (killed by a signal): {tail}"),
        })
    }

    /// Reads the answer to the hello [`RemoteEnd::start`] put on the
    /// remote's command line.
    pub(crate) fn bootstrap(&mut self) -> Result<Answer, RemoteError> {
        let Ok(line) = self.lines.recv() else {
            return Err(self.failure("before the bootstrap"));
        };
        match Answer::decode(&line) {
            Ok(a) if !a.ports.is_empty() => {
                // From now on the remote's messages go to the user.
                for line in self.tail.lock().expect("tail lock").iter() {
                    eprintln!("atou: {}: {line}", self.target);
                }
                self.live.store(true, Ordering::Relaxed);
                Ok(a)
            }
            Ok(_) => Err(failed(format!(
                "atou on {} answered no UDP port",
                self.host()
            ))),
            Err(why) => {
                let _ = self.child.kill();
                Err(failed(format!(
                    "{} did not answer the bootstrap ({why}): it printed `{}`; is `{}` there \
                     the same atou release, and does a login script print to stdout?",
                    self.host(),
                    escape(line.as_bytes()),
                    self.remote_atou
                )))
            }
        }
    }

    /// Writes `line` on the remote's stdin.
    fn say(&mut self, line: &str) -> Result<(), RemoteError> {
        let stdin = self
            .stdin
            .as_mut()
            .ok_or_else(|| failed("ssh's stdin is closed"))?;
        stdin.write_all(line.as_bytes())?;
        stdin.flush()?;
        Ok(())
    }

    /// Writes what the remote's arguments announced on its stdin, before
    /// the bootstrap, from a thread of its own: a remote that does not
    /// read it cannot hold this end here (the bootstrap's own wait
    /// decides), and one that refused its arguments has closed its
    /// stdin, which the bootstrap then explains. The remote answers the
    /// bootstrap only once it has read all of it, so nothing this end
    /// says after the bootstrap can come between.
    fn say_first(&mut self, preamble: &[u8]) {
        use std::os::fd::AsFd;
        let Some(stdin) = &self.stdin else { return };
        if preamble.is_empty() {
            return;
        }
        let Ok(fd) = stdin.as_fd().try_clone_to_owned() else {
            return;
        };
        let mut to_remote = std::fs::File::from(fd);
        let preamble = preamble.to_vec();
        thread::spawn(move || {
            let _ = to_remote.write_all(&preamble);
        });
    }

    /// For a remote started by [`RemoteEnd::start_hello_later`]: the hello
    /// as the first line on its stdin, then `preamble` (as
    /// [`Self::say_first`]).
    pub(crate) fn say_hello_first(&mut self, hello: &Hello, preamble: &[u8]) {
        let mut first = hello.encode().into_bytes();
        if first.last() != Some(&b'\n') {
            first.push(b'\n');
        }
        first.extend_from_slice(preamble);
        self.say_first(&first);
    }

    /// Waits for ssh to exit however long it takes, unless `interrupted`
    /// is set (then kills it), and for its stderr to be read; gives
    /// `each` the stdout lines' channel every 20 ms meanwhile.
    fn wait_for_exit_with(
        &mut self,
        interrupted: &AtomicBool,
        mut each: impl FnMut(&Lines),
    ) -> Option<ExitStatus> {
        loop {
            each(&self.lines);
            match self.child.try_wait() {
                Ok(Some(s)) => {
                    if let Some(h) = self.stderr.take() {
                        let _ = h.join();
                    }
                    return Some(s);
                }
                Ok(None) if !interrupted.load(Ordering::Relaxed) => {
                    thread::sleep(Duration::from_millis(20))
                }
                _ => {
                    let _ = self.child.kill();
                    return self.child.wait().ok();
                }
            }
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

    /// The transfer is verified: closes the remote's stdin, which ends it,
    /// and leaves ssh to end by itself, without waiting the round trip of
    /// its tear-down (the stdin's EOF there, the exit status back): the
    /// remote end's last step, tidying its staging directory, ran before
    /// its answer left. Its status if it has already exited.
    pub(crate) fn detach(&mut self) -> Option<ExitStatus> {
        self.stdin = None;
        self.detached = true;
        self.exited()
    }

    /// The transfer is over: closes the remote's stdin and waits for it.
    pub(crate) fn finish(&mut self) -> Option<ExitStatus> {
        self.stdin = None;
        let status = self.wait_for(EXIT_GRACE);
        if let Some(h) = self.stderr.take() {
            let _ = h.join();
        }
        status
    }

    /// Where this end sends UDP: an address of the host ssh reached,
    /// resolved here (through `ssh -G` when --ssh is ssh, so
    /// ~/.ssh/config's HostName applies). The remote's word on its own
    /// address only picks among them (on a host with IPv4 and IPv6, the
    /// one ssh used): a remote cannot turn this end's punches or hellos on
    /// a third party.
    fn peer_ip(&self, ssh: &SshCommand, answer: &Answer) -> Result<IpAddr, RemoteError> {
        let name = ssh_hostname(ssh, &self.target).unwrap_or_else(|| self.host().to_string());
        let bare = name.trim_start_matches('[').trim_end_matches(']');
        let ours: Vec<IpAddr> = match bare.parse::<IpAddr>() {
            Ok(ip) => vec![ip],
            Err(_) => (bare, 0u16)
                .to_socket_addrs()
                .map_err(|e| {
                    RemoteError::Usage(format!(
                        "cannot resolve `{bare}` here (the host ssh reached as {}): {e}; atou \
                         sends UDP to that host's address",
                        self.host()
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
            .ok_or_else(|| failed(format!("`{bare}` resolves to no address")))
    }
}

impl RemoteEnd {
    /// Asks the remote to carry the datagrams over the ssh channel: says
    /// [`tunnel::SWITCH`] on its stdin and waits for it to say the same on
    /// its stdout. The two halves of the channel, for the tunnel; `None`
    /// when it did not answer within [`DETECT_UDP`] (an atou there that
    /// predates the tunnel reads stdin only for its end).
    fn switch_to_tunnel(
        &mut self,
    ) -> Result<Option<(BufReader<ChildStdout>, ChildStdin)>, RemoteError> {
        let mut stdin = self
            .stdin
            .take()
            .ok_or_else(|| failed("ssh's stdin is closed"))?;
        stdin.write_all(format!("{}\n", tunnel::SWITCH).as_bytes())?;
        stdin.flush()?;
        let mut answer = self.lines.recv_timeout(DETECT_UDP);
        // A pull's remote may have heard a late punch as the switch left.
        if matches!(&answer, Ok(line) if line == READY) {
            answer = self.lines.recv_timeout(DETECT_UDP);
        }
        match answer {
            Ok(line) if line == tunnel::SWITCH => {}
            Ok(line) => {
                return Err(failed(format!(
                    "{} said `{}` where the switch to the ssh tunnel expected {}: is atou there \
                     the same release?",
                    self.host(),
                    escape(line.as_bytes()),
                    tunnel::SWITCH
                )))
            }
            Err(mpsc::RecvTimeoutError::Timeout) => return Ok(None),
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err(self.failure("before the switch to the ssh tunnel"))
            }
        }
        let frames = self
            .frames
            .recv_timeout(EXIT_GRACE)
            .map_err(|_| failed("ssh's stdout closed at the switch to the tunnel"))?;
        Ok(Some((frames, stdin)))
    }
}

impl Drop for RemoteEnd {
    fn drop(&mut self) {
        // An early return (an error, Ctrl-C): ssh goes, and with it the
        // remote end, which exits when its stdin closes.
        if self.detached {
            return;
        }
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The remote's stdout lines as [`read_lines`] passes them on. What waits
/// unread is bounded ([`MAX_KEPT`] bytes; lines past it are dropped): a
/// remote that prints without end costs this end no more than that,
/// while one whose lines are read as they come (a third-party source's
/// progress, hours of it) loses none.
pub(crate) struct Lines {
    rx: mpsc::Receiver<String>,
    unread: Arc<AtomicUsize>,
}

impl Lines {
    fn taken(&self, line: String) -> String {
        self.unread.fetch_sub(line.len(), Ordering::Relaxed);
        line
    }

    fn recv(&self) -> Result<String, mpsc::RecvError> {
        self.rx.recv().map(|l| self.taken(l))
    }

    fn recv_timeout(&self, wait: Duration) -> Result<String, mpsc::RecvTimeoutError> {
        self.rx.recv_timeout(wait).map(|l| self.taken(l))
    }

    fn try_iter(&self) -> impl Iterator<Item = String> + '_ {
        self.rx.try_iter().map(|l| self.taken(l))
    }
}

/// The lines the remote prints on stdout, each cut at [`MAX_LINE`], as
/// they come; once the remote says [`tunnel::SWITCH`], the frames that
/// follow it are the tunnel's: the reader, with what it has buffered,
/// goes on the second channel, after the line itself on the first.
fn read_lines<R: Read + Send + 'static>(stdout: R) -> (Lines, mpsc::Receiver<BufReader<R>>) {
    let (tx, rx) = mpsc::channel();
    let (hand_over, frames) = mpsc::channel();
    let unread = Arc::new(AtomicUsize::new(0));
    let lines = Lines {
        rx,
        unread: unread.clone(),
    };
    thread::spawn(move || {
        let mut r = BufReader::new(stdout);
        loop {
            let mut line = Vec::new();
            match (&mut r).take(MAX_LINE as u64).read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    let text = String::from_utf8_lossy(&line).trim_end().to_string();
                    let switch = text == tunnel::SWITCH;
                    if unread.load(Ordering::Relaxed) + text.len() > MAX_KEPT && !switch {
                        continue;
                    }
                    unread.fetch_add(text.len(), Ordering::Relaxed);
                    if tx.send(text).is_err() {
                        break;
                    }
                    if switch {
                        let _ = hand_over.send(r);
                        break;
                    }
                }
            }
        }
    });
    (lines, frames)
}

/// Keeps the last five lines of ssh's stderr in `tail`, escaped, and
/// passes each on to ours, marked with `target`, while `live` is set.
fn keep_stderr(
    stderr: impl Read + Send + 'static,
    target: &str,
    tail: Arc<Mutex<VecDeque<String>>>,
    live: Arc<AtomicBool>,
) -> thread::JoinHandle<()> {
    let shown = target.to_string();
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
}

/// The `hostname` that `ssh -G` gives `target` under the --ssh command's
/// options, when --ssh runs ssh; `None` otherwise or if it says nothing.
fn ssh_hostname(ssh: &SshCommand, target: &str) -> Option<String> {
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

// ---------------------------------------------------------------------
// A push: the remote receives, this end sends.

/// A push whose remote end has answered: send to [`Push::peer`] with
/// the [`ClientAuth`] that [`Push::start`] gave.
pub(crate) struct Push {
    remote: Mutex<RemoteEnd>,
    host: String,
    /// Where the remote receives: its port at the address ssh reached.
    pub peer: SocketAddr,
    /// The relay over the ssh channel, once no UDP got through
    /// ([`Push::detour`]); dropped at the end, which closes the remote's
    /// stdin.
    tunnel: Mutex<Option<Tunnel>>,
    /// No UDP got through and the remote did not take the tunnel.
    no_tunnel: AtomicBool,
}

/// Where a send that heard nothing over UDP goes again: a stand-in for
/// its receiver at this end of the ssh tunnel, and the sockets to send
/// from (none: a fresh one).
pub(crate) struct Detoured {
    pub peer: SocketAddr,
    pub from: Vec<Bound>,
}

/// Watches a send for its first datagram from the receiver: none within
/// [`DETECT_UDP`], and it stops the send, which goes again through the
/// ssh tunnel ([`Push::detour`]). Beside the send, not before it: a push
/// over open UDP costs no round trip more (issue 28 point 1).
pub(crate) struct FirstContact {
    silent: Arc<AtomicBool>,
    over: Arc<AtomicBool>,
    thread: thread::JoinHandle<()>,
}

impl FirstContact {
    pub(crate) fn watch(progress: Arc<Progress>) -> FirstContact {
        let silent = Arc::new(AtomicBool::new(false));
        let over = Arc::new(AtomicBool::new(false));
        let thread = {
            let (silent, over) = (silent.clone(), over.clone());
            thread::spawn(move || {
                let until = Instant::now() + DETECT_UDP;
                while Instant::now() < until {
                    if progress.heard.load(Ordering::Relaxed) || over.load(Ordering::Relaxed) {
                        return;
                    }
                    thread::sleep(Duration::from_millis(20));
                }
                if !progress.heard.load(Ordering::Relaxed) && !over.load(Ordering::Relaxed) {
                    silent.store(true, Ordering::Relaxed);
                    progress.stop.store(true, Ordering::Relaxed);
                }
            })
        };
        FirstContact {
            silent,
            over,
            thread,
        }
    }

    /// Ends the watch: whether it stopped the send.
    pub(crate) fn end(self) -> bool {
        self.over.store(true, Ordering::Relaxed);
        let _ = self.thread.join();
        self.silent.load(Ordering::Relaxed)
    }
}

impl Push {
    /// Runs `atou __remote receive ARGS...` on `target` and exchanges the
    /// bootstrap lines: one-time keys both ways.
    pub(crate) fn start(
        ssh: &SshCommand,
        target: &str,
        args: &[String],
    ) -> Result<(Push, ClientAuth), RemoteError> {
        let identity = one_time_key()?;
        let hello = Hello {
            key: identity.public(),
        };
        let mut remote = RemoteEnd::start(ssh, target, &hello, args)?;
        let answer = remote.bootstrap()?;
        let peer = SocketAddr::new(remote.peer_ip(ssh, &answer)?, answer.ports[0]);
        let push = Push {
            host: remote.host().to_string(),
            remote: Mutex::new(remote),
            peer,
            tunnel: Mutex::new(None),
            no_tunnel: AtomicBool::new(false),
        };
        Ok((push, client_auth(identity, answer.key)))
    }

    /// Where a send that failed (`e`) without one datagram from the
    /// receiver goes again: this end's stand-in for the receiver, through
    /// the ssh connection. `silent`: [`FirstContact`] stopped it. `None`:
    /// the failure is not UDP's silence. An error: the remote did not take
    /// the tunnel, or it could not start.
    pub(crate) fn detour(
        &self,
        e: &SendError,
        silent: bool,
    ) -> Option<Result<Detoured, SendError>> {
        let unanswered = matches!(
            e,
            SendError::Conn(
                ProbeError::Unreachable { .. }
                    | ProbeError::Conn {
                        error: ConnError::Idle {
                            stage: Stage::Hello | Stage::Handshake,
                            ..
                        },
                        ..
                    }
            )
        );
        if !(unanswered || silent && matches!(e, SendError::Interrupted)) {
            return None;
        }
        let failed = |e: RemoteError| SendError::Failed {
            host: self.host.clone(),
            why: format!("the switch to the ssh tunnel: {e}"),
        };
        let side = match ClientSide::bind(1, self.peer) {
            Ok(side) => side,
            Err(e) => return Some(Err(failed(e.into()))),
        };
        let mut remote = self.remote.lock().expect("remote lock");
        let switched = side
            .addrs()
            .map_err(RemoteError::from)
            .and_then(|addrs| Ok((addrs[0], remote.switch_to_tunnel()?)));
        Some(match switched {
            Err(e) => Err(failed(e)),
            Ok((_, None)) => {
                self.no_tunnel.store(true, Ordering::Relaxed);
                Err(SendError::Conn(ProbeError::Conn {
                    peer: self.peer,
                    error: ConnError::Idle {
                        stage: Stage::Hello,
                        idle: DETECT_UDP,
                    },
                    hint: String::new(),
                }))
            }
            Ok((stand_in, Some((from_remote, to_remote)))) => {
                say_detour(&self.host, self.peer);
                match side.run(from_remote, to_remote) {
                    Ok(tunnel) => {
                        *self.tunnel.lock().expect("tunnel lock") = Some(tunnel);
                        Ok(Detoured {
                            peer: stand_in,
                            from: Vec::new(),
                        })
                    }
                    Err(e) => Err(failed(e.into())),
                }
            }
        })
    }

    /// What a send error means for a push, where it says more than the
    /// error itself: the remote end died, or UDP does not get through.
    pub(crate) fn explain(&self, e: &SendError) -> Option<String> {
        let (host, peer) = (&self.host, self.peer);
        // The remote end died: that, not the silence after it, is news.
        if let SendError::Conn(ProbeError::Conn { .. }) = e {
            let mut r = self.remote.lock().expect("remote lock");
            if let Some(status) = r.exited().filter(|s| !s.success()) {
                return Some(format!(
                    "atou on {host} ended during the transfer (ssh: {status}){}; run the \
                     same command again to resume",
                    r.last_words()
                ));
            }
        }
        let tunneled = self.tunnel.lock().expect("tunnel lock").is_some();
        match e {
            // Through the tunnel UDP is not on the way: what went quiet is
            // the ssh connection, or the relay at either end.
            SendError::Conn(ProbeError::Conn {
                error: ConnError::Idle { idle, .. },
                ..
            }) if tunneled => Some(format!(
                "nothing came back through the ssh tunnel to {host} for {:.1} s (maxidle): the \
                 ssh connection stalled, or atou there stopped relaying; run the same command \
                 again to resume",
                idle.as_secs_f64()
            )),
            SendError::Conn(ProbeError::Conn {
                error:
                    ConnError::Idle {
                        stage: Stage::Hello,
                        idle,
                    },
                ..
            }) if self.no_tunnel.load(Ordering::Relaxed) => Some(no_tunnel(host, peer, *idle)),
            SendError::Conn(ProbeError::Conn {
                error:
                    ConnError::Idle {
                        stage: Stage::Hello,
                        idle,
                    },
                ..
            }) => Some(udp_blocked(host, peer, idle.as_secs_f64())),
            SendError::Conn(ProbeError::Unreachable { .. }) => Some(format!(
                "UDP to {} was refused: the host or a firewall answered ICMP unreachable; \
                 open the --port range in the firewall",
                udp_target(host, peer)
            )),
            _ => None,
        }
    }

    /// The send is over (`sent`: it succeeded, every file verified): ssh
    /// is left to end by itself ([`RemoteEnd::detach`]); a remote end
    /// that has already failed is an error of its own. Otherwise waits for
    /// it.
    pub(crate) fn finish(self, sent: bool) -> Result<(), RemoteError> {
        // The tunnel's end closes the remote's stdin, as `finish` and
        // `detach` would have.
        drop(self.tunnel.into_inner().expect("tunnel lock"));
        let mut remote = self.remote.into_inner().expect("remote lock");
        if !sent {
            // The reason is said; what the remote adds as it goes is noise.
            remote.quiet();
        }
        // Verified: the remote's answer said every file is in place.
        let status = if sent {
            remote.detach()
        } else {
            remote.finish()
        };
        match status {
            Some(s) if !s.success() && sent => Err(failed(format!(
                "the transfer was verified, but atou on {} then failed ({s}): {}",
                self.host,
                remote.tail()
            ))),
            _ => Ok(()),
        }
    }
}

// ---------------------------------------------------------------------
// A pull: the remote sends, this end receives.

/// What a pull's receiver is: this end's own rules and budgets, from its
/// own flags; the remote only asks.
pub(crate) struct PullConfig {
    /// The local destination, created once the remote has answered.
    pub dest: PathBuf,
    pub policy: ReceivePolicy,
    /// Whether the remote's one-time key may replace files.
    pub overwrite: bool,
    /// `--delete` was given here: the remote sender may ask it.
    pub delete: bool,
    /// One of several shards receiving into `dest` at once: leave the
    /// staging directory and `dest` for the others.
    pub shard: bool,
    pub streams: usize,
    /// The largest window a stream may hold, bytes.
    pub buffer: u64,
    pub rcvbuf: u32,
    /// How long a remote that took the ssh tunnel may stay silent in it.
    pub maxidle: Duration,
    pub writers: usize,
    /// Set (by a Ctrl-C handler) to give up, leaving the partial files.
    pub interrupted: Arc<AtomicBool>,
    /// `--dry-run`: the receiver answers a dry run's plan only and
    /// writes nothing; `dest` is neither created nor changed.
    pub dry_run: bool,
}

/// How a pull ended, when nothing failed before its transfer started.
#[derive(Debug)]
pub(crate) enum PullOutcome {
    /// Every file arrived and was verified, over `route`: `"udp"`, or
    /// `"ssh"` through the tunnel.
    Received {
        report: TransferReport,
        route: &'static str,
    },
    /// The receiver failed, for this reason (the remote's words, as
    /// they came: escape them before printing).
    Failed(String),
    /// The remote ended before the transfer was over: ssh's status, and
    /// the remote's last words.
    Unfinished {
        status: Option<ExitStatus>,
        last_words: String,
    },
    /// Interrupted (`PullConfig::interrupted`); the partial files stay.
    Interrupted,
    /// A dry run was answered here: `files` would come (whole or in
    /// part), `skipped` are here already. `said`: what the remote printed
    /// on stdout after it (its listing, or its `--json` report), as it
    /// came: the remote's word, to be escaped or checked. Nothing of it
    /// comes through the ssh tunnel (`route` "ssh"), whose stdout the
    /// frames hold.
    Planned {
        files: u64,
        skipped: u64,
        said: Vec<String>,
        route: &'static str,
    },
}

/// What a pull's receiver ended with, short of a failure.
#[derive(Debug)]
enum Received {
    Done(TransferReport),
    /// A dry run's plan was answered: files that would come, and skipped.
    Planned(u64, u64),
}

/// How a pull's first contact over UDP ended, short of an error.
enum Contact {
    /// The receiver heard the remote's authenticated hello, or the
    /// remote or the receiver ended first: the transfer goes on (or ends)
    /// over UDP, as it began.
    Udp,
    /// No datagram crossed one way or the other within [`DETECT_UDP`].
    Silent,
    Interrupted,
    /// ssh closed the remote's stdout before it said [`READY`]: its
    /// status says why.
    RemoteGone,
}

/// A pull whose remote end has answered.
pub(crate) struct Pull {
    remote: RemoteEnd,
    answer: Answer,
    /// The address of the host ssh reached: every punch goes there.
    ip: IpAddr,
    identity: StaticKeypair,
    token: [u8; 32],
}

/// What a receiver thread leaves: the report, or why it failed.
type Outcome<T> = Arc<Mutex<Option<Result<T, String>>>>;

/// The pull's receiver, serving on the socket the punches leave from.
struct LocalReceiver {
    sock: UdpSocket,
    /// The remote's one-time key opened a connection: an authenticated
    /// hello got through (a datagram that merely claims the remote's
    /// address does not count).
    heard: Arc<AtomicBool>,
    server: thread::JoinHandle<()>,
    stop: Arc<tokio::sync::Notify>,
    outcome: Outcome<Received>,
}

impl LocalReceiver {
    fn stop(self) -> Outcome<Received> {
        self.stop.notify_one();
        let _ = self.server.join();
        self.outcome
    }
}

/// A server app that notes the first session connection an authorized
/// key opened: the one-time key's hello, authenticated (Noise IK's first
/// message), not any datagram from the remote's address.
struct Heard<A> {
    app: A,
    heard: Arc<AtomicBool>,
}

impl<A: ServeApp> ServeApp for Heard<A> {
    fn on_arrival(&mut self, server: &mut Server, arrival: Arrival<'_>) {
        self.app.on_arrival(server, arrival);
    }

    fn on_event(&mut self, server: &mut Server, event: SessionEvent) {
        if matches!(
            event,
            SessionEvent::Opened {
                peer_key: Some(_),
                ..
            }
        ) {
            self.heard.store(true, Ordering::Relaxed);
        }
        self.app.on_event(server, event);
    }

    fn poll(&mut self, server: &mut Server) {
        self.app.poll(server);
    }

    fn waker(&self) -> Option<Arc<tokio::sync::Notify>> {
        self.app.waker()
    }

    fn finished(&self) -> bool {
        self.app.finished()
    }
}

impl Pull {
    /// Runs `atou __remote send ARGS...` on `target`, writes `preamble`
    /// on its stdin (a --files-from list, which ARGS announce), and
    /// exchanges the bootstrap lines: one-time keys both ways, and the
    /// punch token.
    pub(crate) fn start(
        ssh: &SshCommand,
        target: &str,
        args: &[String],
        preamble: &[u8],
    ) -> Result<Pull, RemoteError> {
        let identity = one_time_key()?;
        let hello = Hello {
            key: identity.public(),
        };
        let mut remote = RemoteEnd::start(ssh, target, &hello, args)?;
        remote.say_first(preamble);
        let answer = remote.bootstrap()?;
        let Some(token) = answer.token else {
            return Err(failed(format!(
                "atou on {} answered a pull without a punch token: is it the same atou release?",
                remote.host()
            )));
        };
        let ip = remote.peer_ip(ssh, &answer)?;
        Ok(Pull {
            remote,
            answer,
            ip,
            identity,
            token,
        })
    }

    /// `[USER@]HOST` as the user wrote it.
    pub(crate) fn target(&self) -> &str {
        self.remote.target()
    }

    /// HOST, without the user.
    pub(crate) fn host(&self) -> &str {
        self.remote.host()
    }

    /// Receives into `config.dest`, created only now: a failed bootstrap
    /// leaves nothing behind, and a failed transfer nothing but partial
    /// files.
    pub(crate) fn receive(self, config: PullConfig) -> Result<PullOutcome, RemoteError> {
        if config.dry_run {
            let dry = DryRunRoot::new(&config.dest).map_err(usage)?;
            let root = check_root(dry.path()).map_err(usage)?;
            return self.receive_into(root, config);
        }
        let dest = config.dest.as_path();
        let created = !dest.exists();
        crate::transfer::dest::create_destination(dest).map_err(usage)?;
        let root = check_root(dest).map_err(usage)?;
        let shard = config.shard;
        let result = self.receive_into(root.clone(), config);
        // Other shards may be receiving into the same DEST.
        if !shard {
            tidy(&root, created);
        }
        result
    }

    fn receive_into(
        mut self,
        root: PathBuf,
        config: PullConfig,
    ) -> Result<PullOutcome, RemoteError> {
        let receiver = self.start_receiver(root, &config)?;
        let interrupted = config.interrupted;
        let contact = self.first_contact(&receiver, &interrupted);
        let tunnel = match contact {
            Ok(Contact::Udp) => None,
            Ok(Contact::Silent) => match self.tunnel_to(&receiver, config.maxidle, &interrupted) {
                Ok(Some(tunnel)) => Some(tunnel),
                Ok(None) => {
                    receiver.stop();
                    return Ok(PullOutcome::Interrupted);
                }
                Err(e) => {
                    receiver.stop();
                    return Err(e);
                }
            },
            Ok(Contact::Interrupted) => {
                receiver.stop();
                return Ok(PullOutcome::Interrupted);
            }
            Ok(Contact::RemoteGone) => {
                receiver.stop();
                return Err(self.remote.failure("before the transfer"));
            }
            Err(e) => {
                receiver.stop();
                return Err(e);
            }
        };
        let route = if tunnel.is_some() { "ssh" } else { "udp" };
        // The remote sends; wait for the receiver to finish, or the
        // remote (or the tunnel) to end, or Ctrl-C.
        let Some(remote_status) =
            self.await_transfer(&receiver.server, tunnel.as_ref(), &interrupted)
        else {
            receiver.stop();
            return Ok(PullOutcome::Interrupted);
        };
        let outcome = receiver.stop();
        let result = outcome.lock().expect("lock").take();
        let failure = match result {
            Some(Ok(Received::Done(report))) => {
                // Verified here: ssh's tear-down is not waited for.
                self.remote.detach();
                return Ok(PullOutcome::Received { report, route });
            }
            Some(Ok(Received::Planned(files, skipped))) => {
                // The remote prints its listing once it has the answer,
                // then exits: its stdout is read to the end.
                let status = remote_status.or_else(|| self.remote.wait_for(EXIT_GRACE));
                if let Some(h) = self.remote.stderr.take() {
                    let _ = h.join();
                }
                let said = if tunnel.is_some() {
                    Vec::new()
                } else {
                    self.remote.lines.try_iter().collect()
                };
                if status.is_some_and(|s| !s.success()) {
                    return Ok(PullOutcome::Unfinished {
                        status,
                        last_words: self.remote.last_words(),
                    });
                }
                return Ok(PullOutcome::Planned {
                    files,
                    skipped,
                    said,
                    route,
                });
            }
            Some(Err(why)) => Some(why),
            None => None,
        };
        // A tunnel that ended on a frame out of range: that is the news.
        if let Some(Err(e)) = tunnel.filter(Tunnel::is_finished).map(Tunnel::join) {
            self.remote.quiet();
            return Err(failed(format!(
                "the ssh tunnel from {} failed: {e}",
                self.host()
            )));
        }
        let status = match remote_status {
            Some(s) => {
                self.remote.finish();
                Some(s)
            }
            None => self.remote.finish(),
        };
        Ok(match failure {
            Some(why) => PullOutcome::Failed(why),
            None => PullOutcome::Unfinished {
                status,
                last_words: self.remote.last_words(),
            },
        })
    }

    /// The receiver on a socket of its own, in a thread of its own:
    /// only the remote's one-time key, under this end's policy and limits.
    fn start_receiver(
        &self,
        root: PathBuf,
        config: &PullConfig,
    ) -> Result<LocalReceiver, RemoteError> {
        let any: IpAddr = match self.ip {
            IpAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
            IpAddr::V6(_) => Ipv6Addr::UNSPECIFIED.into(),
        };
        let sock = UdpSocket::bind(SocketAddr::new(any, 0))?;
        let local = sock.local_addr()?;
        let outcome: Outcome<Received> = Arc::new(Mutex::new(None));
        // A dry run's receiver refuses any plan but a dry run's: a remote
        // that ignores --dry-run writes nothing here.
        let new_receiver = if config.dry_run {
            FileReceiver::dry_run
        } else {
            FileReceiver::new
        };
        let receiver = new_receiver(
            ReceiveConfig {
                root,
                writers: config.writers,
                once: true,
                policy: config.policy.clone(),
                limits: ReceiveLimits {
                    max_sessions: 1,
                    max_sessions_per_ip: 1,
                    ..ReceiveLimits::default()
                },
                // The other end's one-time key, which may replace files
                // only if this end was given --overwrite.
                authorized: Some(only(&self.answer.key, config.overwrite, config.delete)?),
            },
            {
                let outcome = outcome.clone();
                move |e| {
                    let r = match e {
                        ReceiveEvent::Done(r) => Ok(Received::Done(r)),
                        ReceiveEvent::Planned { files, skipped, .. } => {
                            Ok(Received::Planned(files, skipped))
                        }
                        ReceiveEvent::Failed { why, .. } => Err(why),
                        // A copy's receiver keeps its staging directory.
                        ReceiveEvent::StagingCleaned { .. } => return,
                    };
                    outcome.lock().expect("lock").get_or_insert(r);
                }
            },
        )
        .map_err(usage)?;
        let heard = Arc::new(AtomicBool::new(false));
        let mut receiver = Heard {
            app: receiver,
            heard: heard.clone(),
        };
        let stop = Arc::new(tokio::sync::Notify::new());
        let serve = ServeConfig {
            bind: local,
            once: false,
            sndbuf: 4 << 20,
            rcvbuf: config.rcvbuf,
            limits: pull_limits(config.streams, config.buffer),
            auth: server_auth(
                self.identity.clone(),
                &self.answer.key,
                config.overwrite,
                config.delete,
            )?,
            // One-time keys: no hello outlives this run.
            hello_timestamps: None,
        };
        let server = {
            let stop = stop.clone();
            let sock = sock.try_clone()?;
            thread::spawn(move || {
                let Ok(rt) = runtime() else { return };
                let _ = rt.block_on(io::serve_from(
                    Some(sock),
                    serve,
                    &mut receiver,
                    |_| {},
                    async move { stop.notified().await },
                ));
            })
        };
        Ok(LocalReceiver {
            sock,
            heard,
            server,
            stop,
            outcome,
        })
    }

    /// Punches until the remote says it has heard from us on every port,
    /// then waits for its first authenticated hello at the receiver:
    /// beside the transfer, not before it, so a pull over open UDP costs
    /// no round trip more (issue 28 point 1). [`Contact::Silent`] if
    /// either step takes [`DETECT_UDP`]: UDP is blocked one way or both.
    fn first_contact(
        &mut self,
        receiver: &LocalReceiver,
        interrupted: &AtomicBool,
    ) -> Result<Contact, RemoteError> {
        let mut since = Instant::now();
        let mut ready = false;
        let datagram = punch(&self.token);
        loop {
            if receiver.heard.load(Ordering::Relaxed) || receiver.server.is_finished() {
                return Ok(Contact::Udp);
            }
            if interrupted.load(Ordering::Relaxed) {
                return Ok(Contact::Interrupted);
            }
            if since.elapsed() >= DETECT_UDP {
                return Ok(Contact::Silent);
            }
            if ready {
                // The remote ended before it sent: its status says why.
                if self.remote.exited().is_some() {
                    return Ok(Contact::Udp);
                }
                thread::sleep(Duration::from_millis(20));
                continue;
            }
            for &p in &self.answer.ports {
                // A send error (no route) is as good as a lost punch: the
                // deadline decides.
                let _ = receiver
                    .sock
                    .send_to(&datagram, SocketAddr::new(self.ip, p));
            }
            match self.remote.lines.recv_timeout(PUNCH_EVERY) {
                Ok(line) if line == READY => {
                    ready = true;
                    since = Instant::now();
                }
                Ok(line) => {
                    return Err(failed(format!(
                        "{} said `{}` where the bootstrap expected {READY}",
                        self.host(),
                        escape(line.as_bytes())
                    )))
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => return Ok(Contact::RemoteGone),
            }
        }
    }

    /// No UDP got through: asks the remote to send through the ssh
    /// connection instead, relays what comes to the receiver, and waits
    /// for the remote's first authenticated hello through it, at most
    /// `wait`. `None`: interrupted.
    fn tunnel_to(
        &mut self,
        receiver: &LocalReceiver,
        wait: Duration,
        interrupted: &AtomicBool,
    ) -> Result<Option<Tunnel>, RemoteError> {
        let peer = SocketAddr::new(self.ip, self.answer.ports[0]);
        let Some((from_remote, to_remote)) = self.remote.switch_to_tunnel()? else {
            self.remote.quiet();
            return Err(RemoteError::Network(no_tunnel(
                self.host(),
                peer,
                DETECT_UDP,
            )));
        };
        say_detour(self.host(), peer);
        let tunnel =
            ServerSide::new(vec![receiver.sock.local_addr()?]).run(from_remote, to_remote)?;
        // A remote that took the tunnel and sends nothing through it must
        // not hold this end: the receiver has no connection to time out.
        let since = Instant::now();
        while !receiver.heard.load(Ordering::Relaxed) && !receiver.server.is_finished() {
            if interrupted.load(Ordering::Relaxed) {
                return Ok(None);
            }
            if tunnel.is_finished() || self.remote.exited().is_some() {
                break;
            }
            if since.elapsed() >= wait {
                self.remote.quiet();
                return Err(failed(format!(
                    "atou on {} took the ssh tunnel but sent nothing through it in {:.0} s \
                     (--maxidle)",
                    self.host(),
                    wait.as_secs_f64()
                )));
            }
            thread::sleep(Duration::from_millis(20));
        }
        Ok(Some(tunnel))
    }

    /// Waits for the receiver to finish, or the remote to end and the
    /// receiver to hear its last word; `None` if interrupted, else the
    /// remote's status if it ended first.
    fn await_transfer(
        &mut self,
        server: &thread::JoinHandle<()>,
        tunnel: Option<&Tunnel>,
        interrupted: &AtomicBool,
    ) -> Option<Option<ExitStatus>> {
        let mut remote_status = None;
        let mut until = None;
        while !server.is_finished() {
            if interrupted.load(Ordering::Relaxed) {
                return None;
            }
            if remote_status.is_none() {
                if let Some(s) = self.remote.exited() {
                    remote_status = Some(s);
                    // The receiver hears the sender's last word (its
                    // finish, or an abort) within moments; a sender killed
                    // says none.
                    let grace = if s.success() { 10 } else { 2 };
                    until = Some(Instant::now() + Duration::from_secs(grace));
                }
            }
            // Through an ended tunnel nothing more can come.
            if until.is_none() && tunnel.is_some_and(Tunnel::is_finished) {
                until = Some(Instant::now() + Duration::from_secs(2));
            }
            if until.is_some_and(|t| Instant::now() >= t) {
                break;
            }
            thread::sleep(Duration::from_millis(20));
        }
        Some(remote_status)
    }
}

/// What a pull's receiver lets the remote sender make it hold: this end's
/// own --streams and --buffer, whatever the remote opens. Two connections
/// beyond the streams leave room for the plan and the finish, each on a
/// connection of its own, while the last streams close.
fn pull_limits(streams: usize, buffer: u64) -> ServerLimits {
    let connections = streams + 2;
    ServerLimits {
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

// ---------------------------------------------------------------------
// The far end: `atou __remote receive|send`, which ssh runs.

/// The bootstrap hello, as `--hello` gave it.
pub(crate) fn read_hello(arg: &str) -> Result<Hello, RemoteError> {
    Hello::decode(arg).map_err(|e| failed(format!("the bootstrap hello (--hello): {e}")))
}

/// One line of the local end's on `input`, at most [`MAX_LINE`] bytes,
/// read a byte at a time so that nothing after it is taken (what follows
/// stays there: a preamble, the tunnel's frames); `what` names it in the
/// error for a longer one. `None`: the input ended first.
pub(crate) fn read_bootstrap_line(
    input: &mut impl std::io::Read,
    what: &str,
) -> Result<Option<String>, RemoteError> {
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    loop {
        match input.read(&mut byte) {
            Ok(0) => return Ok(None),
            Ok(_) if byte[0] == b'\n' => break,
            Ok(_) if line.len() < MAX_LINE => line.push(byte[0]),
            Ok(_) => return Err(failed(format!("{what} is longer than a bootstrap line"))),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(Some(String::from_utf8_lossy(&line).into_owned()))
}

/// The bootstrap hello as the first line on `input` (`--hello-stdin`);
/// `None`: the input ended first.
pub(crate) fn read_hello_line(
    input: &mut impl std::io::Read,
) -> Result<Option<Hello>, RemoteError> {
    let Some(line) = read_bootstrap_line(input, "the bootstrap hello on stdin")? else {
        return Ok(None);
    };
    Hello::decode(&line)
        .map(Some)
        .map_err(|e| failed(format!("the bootstrap hello (stdin): {e}")))
}

/// Prints the bootstrap answer on stdout.
fn answer(
    ports: Vec<u16>,
    key: PublicKey,
    addr: Option<IpAddr>,
    token: Option<[u8; 32]>,
) -> Result<(), RemoteError> {
    let mut out = std::io::stdout().lock();
    let line = Answer {
        ports,
        key,
        addr,
        token,
    };
    out.write_all(line.encode().as_bytes())?;
    out.flush()?;
    Ok(())
}

/// What the far end of a push serves with.
pub(crate) struct FarReceiveConfig {
    /// Where the files go, checked ([`check_root`]).
    pub root: PathBuf,
    pub port: PortRange,
    /// The sender's --buffer: the largest window a stream may ask for.
    pub buffer: u64,
    pub rcvbuf: u32,
    /// Plan only, writing nothing.
    pub dry_run: bool,
    /// The local user's own rules, passed on its command line.
    pub policy: ReceivePolicy,
    /// Whether the sender's key may replace files and delete: in a push
    /// the sender is the user's own command (yes: its flags decide); in a
    /// third-party copy another host, which gets what the user's flags
    /// said.
    pub sender_may_overwrite: bool,
    pub sender_may_delete: bool,
    pub writers: usize,
}

/// The far end of a push: answers the hello with a port of the range at
/// `ip` (where ssh reached this host) and serves one transfer from the
/// hello's key until it is over or `gone` is told. `watch` runs once the
/// answer is out, given the receiver's address (for a tunnel to it).
/// `Ok(None)`: the local end went away first. `Ok(Some(Ok(report)))`:
/// the transfer is in place (no report for a dry run).
pub(crate) fn receive_push(
    config: FarReceiveConfig,
    hello: &Hello,
    ip: Option<IpAddr>,
    watch: impl FnOnce(SocketAddr) + Send + 'static,
    gone: Arc<tokio::sync::Notify>,
) -> Result<Option<Result<Option<TransferReport>, String>>, RemoteError> {
    let sock = bind_in_range(ip.unwrap_or(Ipv4Addr::UNSPECIFIED.into()), config.port, 1)?.remove(0);
    let local = sock.local_addr()?;
    let identity = one_time_key()?;
    let key = identity.public();
    // The far end takes the local user's own rules, passed on its command
    // line.
    let (may_overwrite, may_delete) = (config.sender_may_overwrite, config.sender_may_delete);
    let auth = server_auth(identity, &hello.key, may_overwrite, may_delete)?;
    let outcome: Outcome<Option<TransferReport>> = Arc::new(Mutex::new(None));
    let new_receiver = if config.dry_run {
        FileReceiver::dry_run
    } else {
        FileReceiver::new
    };
    let mut receiver = new_receiver(
        ReceiveConfig {
            root: config.root,
            writers: config.writers,
            once: true,
            policy: config.policy,
            limits: ReceiveLimits::default(),
            // The other end's one-time key.
            authorized: Some(only(&hello.key, may_overwrite, may_delete)?),
        },
        {
            let outcome = outcome.clone();
            move |e| {
                let mut o = outcome.lock().expect("lock");
                // The first transfer's end; a tidying of abandoned
                // partial files says nothing of it.
                match e {
                    ReceiveEvent::Done(report) => {
                        o.get_or_insert(Ok(Some(report)));
                    }
                    ReceiveEvent::Planned { .. } => {
                        o.get_or_insert(Ok(None));
                    }
                    ReceiveEvent::Failed { why, .. } => {
                        o.get_or_insert(Err(why));
                    }
                    ReceiveEvent::StagingCleaned { .. } => {}
                }
            }
        },
    )
    .map_err(|e| failed(e.to_string()))?;
    answer(vec![local.port()], key, ip, None)?;
    thread::spawn(move || watch(local));
    runtime()?.block_on(io::serve_from(
        Some(sock),
        ServeConfig {
            bind: local,
            once: false,
            sndbuf: 4 << 20,
            rcvbuf: config.rcvbuf,
            // The one sender is the user: its windows are what it asked
            // for (--buffer per stream at most).
            limits: ServerLimits {
                max_window_bytes: config.buffer,
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
    Ok(result)
}

/// A sending far end's start (a pull's, a third-party copy's source):
/// every SRC must be there (one that is not fails the bootstrap, with its
/// reason); binds one socket per stream in the range at `ip` (where ssh
/// reached this host) and answers with their ports, a one-time key and
/// `token`.
fn bind_and_answer(
    ip: Option<IpAddr>,
    port: PortRange,
    streams: usize,
    sources: &[PathBuf],
    token: Option<[u8; 32]>,
) -> Result<(Vec<UdpSocket>, StaticKeypair), RemoteError> {
    for s in sources {
        if let Err(e) = std::fs::symlink_metadata(s) {
            return Err(failed(format!(
                "cannot read {}: {e}",
                crate::util::text::shown_path(s)
            )));
        }
    }
    let socks = bind_in_range(ip.unwrap_or(Ipv4Addr::UNSPECIFIED.into()), port, streams)?;
    let ports = socks
        .iter()
        .map(|s| s.local_addr().map(|a| a.port()))
        .collect::<std::io::Result<Vec<u16>>>()?;
    let identity = one_time_key()?;
    answer(ports, identity.public(), ip, token)?;
    Ok((socks, identity))
}

/// The far end of a pull, bound and answered, waiting for its punches.
pub(crate) struct FarSend {
    socks: Vec<UdpSocket>,
    token: [u8; 32],
    identity: StaticKeypair,
    peer_key: PublicKey,
}

/// How the wait for a pull's punches ended.
pub(crate) enum Punched {
    /// Every socket heard the token: send from each to where it came from.
    Ready(Vec<Bound>, ClientAuth),
    /// The local end went away.
    Gone,
    /// No punch arrived on some socket in this long.
    TimedOut(Duration),
    /// The local end asked for the ssh tunnel first: send through it.
    Switched(ClientAuth),
}

impl FarSend {
    /// Binds one socket per stream in the range at `ip` (where ssh reached
    /// this host) and answers the hello with their ports. Every SRC must
    /// be there: one that is not fails the bootstrap, with its reason.
    pub(crate) fn answer(
        hello: &Hello,
        ip: Option<IpAddr>,
        port: PortRange,
        streams: usize,
        sources: &[PathBuf],
    ) -> Result<FarSend, RemoteError> {
        let token = random_token()?;
        let (socks, identity) = bind_and_answer(ip, port, streams, sources, Some(token))?;
        Ok(FarSend {
            socks,
            token,
            identity,
            peer_key: hello.key,
        })
    }

    /// Each socket waits for its punch; where it came from is the peer.
    /// Once all have one, says [`READY`] on stdout. `switch`: the local
    /// end heard nothing and asked for the ssh tunnel.
    pub(crate) fn await_punches(
        self,
        wait: Duration,
        gone: &AtomicBool,
        switch: &AtomicBool,
    ) -> Result<Punched, RemoteError> {
        for s in &self.socks {
            s.set_nonblocking(true)?;
        }
        let mut peers: Vec<Option<SocketAddr>> = vec![None; self.socks.len()];
        let deadline = Instant::now() + wait;
        let mut buf = [0u8; 2048];
        while peers.iter().any(Option::is_none) {
            if gone.load(Ordering::Relaxed) {
                return Ok(Punched::Gone);
            }
            if switch.load(Ordering::Relaxed) {
                return Ok(Punched::Switched(client_auth(self.identity, self.peer_key)));
            }
            if Instant::now() >= deadline {
                return Ok(Punched::TimedOut(wait));
            }
            let mut any = false;
            for (s, peer) in self.socks.iter().zip(peers.iter_mut()) {
                while let Ok((n, from)) = s.recv_from(&mut buf) {
                    any = true;
                    // Anything but the token is ignored: a stranger on the
                    // path cannot pick where this end sends.
                    if peer.is_none() && n == PUNCH_LEN && is_punch(&buf[..n], &self.token) {
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
        let from = self
            .socks
            .into_iter()
            .zip(peers)
            .map(|(socket, peer)| Bound {
                socket,
                peer: peer.expect("every socket was punched"),
            })
            .collect();
        Ok(Punched::Ready(
            from,
            client_auth(self.identity, self.peer_key),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lines read as they come are never dropped, however many in all (a
    /// third-party source's progress for hours); lines left unread are
    /// kept up to MAX_KEPT bytes, the rest dropped.
    #[test]
    fn only_lines_left_unread_count_against_the_budget() {
        use std::io::Write;
        let line = format!("{} 1 2 {}\n", PROGRESS_LINE, "x".repeat(90));
        let per_batch = (100 << 10) / line.len();
        let batches = 3 * MAX_KEPT / (100 << 10);
        let (mut to, from) = std::os::unix::net::UnixStream::pair().unwrap();
        let (lines, _) = read_lines(from);
        let (drained_tx, drained) = mpsc::channel::<()>();
        let writer = thread::spawn(move || {
            for _ in 0..batches {
                to.write_all(line.repeat(per_batch).as_bytes()).unwrap();
                drained.recv().unwrap();
            }
        });
        let mut got = 0;
        for _ in 0..batches {
            for _ in 0..per_batch {
                lines.recv_timeout(Duration::from_secs(10)).unwrap();
                got += 1;
            }
            drained_tx.send(()).unwrap();
        }
        writer.join().unwrap();
        assert_eq!(got, batches * per_batch);

        // Nobody reading: the first MAX_KEPT bytes' lines wait, the rest
        // are dropped.
        let text = "y".repeat(99) + "\n";
        let (lines, _) = read_lines(std::io::Cursor::new(text.repeat(3 * MAX_KEPT / 100)));
        // Until the reader is through (what waits has stopped growing).
        let mut waiting = 0;
        loop {
            thread::sleep(Duration::from_millis(200));
            let now = lines.unread.load(Ordering::Relaxed);
            if now == waiting && now > 0 {
                break;
            }
            waiting = now;
        }
        let mut kept = 0;
        while let Ok(l) = lines.recv_timeout(Duration::from_secs(10)) {
            kept += l.len();
        }
        assert!(kept <= MAX_KEPT && kept > MAX_KEPT - 100, "{kept}");
    }

    #[test]
    fn remote_paths_are_relative_to_home() {
        assert_eq!(remote_path(""), PathBuf::from("."));
        assert_eq!(remote_path("~"), PathBuf::from("."));
        assert_eq!(remote_path("~/a/b"), PathBuf::from("a/b"));
        assert_eq!(remote_path("/abs"), PathBuf::from("/abs"));
        assert_eq!(remote_path("rel"), PathBuf::from("rel"));
    }

    #[test]
    fn option_like_targets_are_refused() {
        assert!(check_target("host").is_ok());
        assert!(check_target("user@host").is_ok());
        assert!(check_target("-oProxyCommand=sh").is_err());
        assert!(check_target("-u@host").is_err());
        assert!(check_target("user@").is_err());
    }
}

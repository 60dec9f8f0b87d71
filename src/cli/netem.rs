//! `atou netem relay` and `atou netem bridge`: the netem model on real
//! packets.

use std::fmt::Write as _;
use std::net::{SocketAddr, UdpSocket};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::process::{Command as StdCommand, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Subcommand, ValueEnum};
use serde::Serialize;

use crate::io::netem::{Direction, SourceStats, SourceTable};
use crate::io::tun::Tun;
use crate::netem::{mix_seed, Datagram, Distribution, Netem, NetemSpec, NetemStats, SlotDelay};

use super::net::{resolve, runtime};
use super::UsageError;

#[derive(Args, Debug)]
pub(super) struct NetemArgs {
    #[command(subcommand)]
    command: NetemCommand,
}

#[derive(Subcommand, Debug)]
enum NetemCommand {
    /// Relay UDP between clients and one server, impairing each direction in real time
    Relay(RelayArgs),
    /// Make two test hosts (network namespaces) joined by an impaired path; needs root
    Bridge(BridgeArgs),
}

const SPEC_HELP: &str = "SPECs are tc-netem(8) options with the kernel's meaning (limit, delay, \
    distribution, loss random|state|gemodel, corrupt, duplicate, reorder, gap, rate, slot, seed); \
    stages joined by `|` feed each other. A bare probability is a percentage and a bare time is \
    microseconds, as in tc. See docs/netem.md.";

/// The impaired path and its record, for the relay and the bridge alike.
#[derive(Args, Debug)]
struct PathArgs {
    /// Impairment in the forward direction (relay: clients to server;
    /// bridge: host A to host B), in tc-netem words; default: none
    #[arg(long, value_name = "SPEC", default_value = "", value_parser = parse_spec)]
    fwd: NetemSpec,
    /// Impairment in the reverse direction; default: none
    #[arg(long, value_name = "SPEC", default_value = "", value_parser = parse_spec)]
    rev: NetemSpec,
    /// Seed for every random choice (a `seed` inside a SPEC wins for its
    /// stage; the tc backend passes it as netem's `seed`); default: drawn
    /// from the clock and printed
    #[arg(long, value_name = "N")]
    seed: Option<u64>,
    /// Print the final counts as one JSON object
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
#[command(after_help = SPEC_HELP)]
struct RelayArgs {
    /// Address clients send to, e.g. 127.0.0.1:9000
    #[arg(long, value_name = "ADDR")]
    listen: SocketAddr,
    /// Where their datagrams go: HOST:PORT (the port is required)
    #[arg(long, value_name = "HOST:PORT")]
    to: String,
    #[command(flatten)]
    path: PathArgs,
    /// Stop by itself after this long (e.g. 30s); default: run until Ctrl-C or SIGTERM
    #[arg(long = "for", value_name = "TIME", value_parser = parse_seconds)]
    run_for: Option<Duration>,
    /// Forget a source address (its socket and thread towards the server)
    /// after this long without a datagram from it, e.g. 30s or 500ms; a
    /// bare number is seconds
    #[arg(long, value_name = "TIME", default_value = "60s", value_parser = parse_seconds)]
    idle: Duration,
    /// Most source addresses held at once (each has a socket and a thread);
    /// datagrams from further sources are dropped and counted until one
    /// goes idle
    #[arg(long, value_name = "N", default_value_t = 256,
          value_parser = clap::value_parser!(u32).range(1..=65_536))]
    max_sources: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Backend {
    /// tc when the kernel has sch_netem, else tun
    Auto,
    /// TUN devices and atou's own model, in this process
    Tun,
    /// A veth pair and the kernel's netem qdisc
    Tc,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Side {
    A,
    B,
}

#[derive(Args, Debug)]
#[command(after_help = SPEC_HELP)]
struct BridgeArgs {
    #[command(flatten)]
    path: PathArgs,
    /// Who impairs the packets
    #[arg(long, value_enum, default_value_t = Backend::Auto)]
    backend: Backend,
    /// Names of the two network namespaces (hosts A and B)
    #[arg(long, value_name = "A,B", default_value = "atou-a,atou-b", value_parser = parse_pair)]
    hosts: (String, String),
    /// IPv4 addresses of hosts A and B, each with an optional /PREFIX (default /24)
    #[arg(long, value_name = "A,B", default_value = "10.77.0.1,10.77.0.2", value_parser = parse_pair)]
    addrs: (String, String),
    /// MTU of the link between them, bytes
    #[arg(long, value_name = "BYTES", default_value_t = 1500)]
    mtu: u32,
    /// Host that runs CMD
    #[arg(long = "in", value_enum, default_value_t = Side::A)]
    run_in: Side,
    /// Command to run inside a host; the bridge is torn down when it exits
    /// and atou exits with its status. Without one, runs until Ctrl-C or SIGTERM
    #[arg(last = true, value_name = "CMD")]
    command: Vec<String>,
}

fn parse_spec(s: &str) -> Result<NetemSpec, crate::netem::SpecError> {
    s.parse()
}

fn parse_seconds(s: &str) -> Result<Duration, crate::util::units::UnitError> {
    crate::util::units::parse_duration(s, crate::util::units::TimeUnit::Seconds)
}

fn parse_pair(s: &str) -> Result<(String, String), String> {
    match s.split_once(',') {
        Some((a, b)) if !a.trim().is_empty() && !b.trim().is_empty() => {
            Ok((a.trim().to_string(), b.trim().to_string()))
        }
        _ => Err(format!("`{s}`: give two values separated by a comma")),
    }
}

pub(super) fn netem(args: NetemArgs) -> Result<ExitCode> {
    match args.command {
        NetemCommand::Relay(a) => relay(a),
        NetemCommand::Bridge(a) => bridge(a),
    }
}

fn clock_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64 % 1_000_000_000)
}

/// A datagram and where it goes next.
#[derive(Clone)]
struct Routed<T: Clone> {
    bytes: Vec<u8>,
    to: T,
}

impl<T: Clone> Datagram for Routed<T> {
    fn wire_len(&self) -> usize {
        self.bytes.len()
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.bytes
    }
}

/// Packets waiting for a direction's thread; beyond this the reader blocks,
/// as a full NIC queue would.
const CHANNEL_DEPTH: usize = 65_536;
const READ_WAKE: Duration = Duration::from_millis(100);
/// The receive buffer each relay socket asks for: with the kernel's
/// default (about 200 KB) a relay thread descheduled for ten milliseconds
/// loses datagrams at its own socket, where its counts cannot see them.
/// The kernel grants at most net.core.rmem_max.
const RELAY_RCVBUF: usize = 4 << 20;

/// Asks for [`RELAY_RCVBUF`]; a smaller buffer still works, only less well
/// on a loaded host, so a refusal is not an error.
fn grow_rcvbuf(sock: &UdpSocket) {
    let _ = socket2::SockRef::from(sock).set_recv_buffer_size(RELAY_RCVBUF);
}

/// Final counts, as printed.
#[derive(Serialize)]
struct DirectionReport {
    spec: String,
    #[serde(flatten)]
    stats: NetemStats,
}

fn report_line(name: &str, spec: &NetemSpec, s: &NetemStats) -> String {
    format!(
        "{name} \"{spec}\": offered {} passed {} dropped {} (loss {} limit {}) duplicated {} reordered {} corrupted {}",
        s.offered, s.delivered, s.dropped(), s.lost, s.limit_drops, s.duplicated, s.reordered, s.corrupted
    )
}

/// The final counts; the relay's include what it did with sources.
fn print_report(
    json: bool,
    seed: u64,
    backend: &str,
    dirs: &[(&str, &NetemSpec, NetemStats)],
    sources: Option<SourceStats>,
) {
    if json {
        let mut obj = serde_json::Map::new();
        obj.insert("seed".into(), seed.into());
        obj.insert("backend".into(), backend.into());
        for (name, spec, stats) in dirs {
            let r = DirectionReport {
                spec: spec.to_string(),
                stats: *stats,
            };
            obj.insert((*name).into(), serde_json::to_value(r).unwrap_or_default());
        }
        if let Some(s) = sources {
            obj.insert(
                "sources".into(),
                serde_json::to_value(s).unwrap_or_default(),
            );
        }
        println!("{}", serde_json::Value::Object(obj));
    } else {
        for (name, spec, stats) in dirs {
            println!("{}", report_line(name, spec, stats));
        }
        if let Some(s) = sources {
            println!(
                "sources: opened {} reclaimed {} live {} refused {} datagrams",
                s.opened, s.reclaimed, s.live, s.refused
            );
        }
    }
}

/// Ctrl-C and SIGTERM, caught from the moment this exists: made before a
/// program prints `ready`, so that whoever starts it may stop it the
/// moment it says so and still get its clean-up (hosts removed, report
/// printed), instead of the default action of a signal that arrives
/// before a handler is there (death, hosts left behind).
struct StopSignals {
    interrupt: Option<tokio::signal::unix::Signal>,
    terminate: Option<tokio::signal::unix::Signal>,
}

impl StopSignals {
    /// Inside `rt`: tokio's signal handling needs its runtime's driver.
    fn catch(rt: &tokio::runtime::Runtime) -> StopSignals {
        use tokio::signal::unix::{signal, SignalKind};
        let _inside = rt.enter();
        StopSignals {
            interrupt: signal(SignalKind::interrupt()).ok(),
            terminate: signal(SignalKind::terminate()).ok(),
        }
    }

    /// Waits for Ctrl-C, SIGTERM or `limit`.
    async fn until_stopped(&mut self, limit: Option<Duration>) {
        async fn next(s: Option<&mut tokio::signal::unix::Signal>) {
            match s {
                Some(s) => {
                    s.recv().await;
                }
                None => std::future::pending::<()>().await,
            }
        }
        let limit = async {
            match limit {
                Some(d) => tokio::time::sleep(d).await,
                None => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            _ = next(self.interrupt.as_mut()) => {}
            _ = next(self.terminate.as_mut()) => {}
            _ = limit => {}
        }
    }
}

fn relay(args: RelayArgs) -> Result<ExitCode> {
    if !args.to.contains(':') {
        return Err(UsageError(format!("--to `{}` needs a port: HOST:PORT", args.to)).into());
    }
    if args.idle.is_zero() {
        return Err(UsageError("--idle must be longer than 0 (e.g. 60s)".into()).into());
    }
    let to = resolve(&args.to)?;
    let seed = args.path.seed.unwrap_or_else(clock_seed);
    let listen = UdpSocket::bind(args.listen)
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    grow_rcvbuf(&listen);
    listen.set_read_timeout(Some(READ_WAKE))?;
    let listen = Arc::new(listen);
    let stop = Arc::new(AtomicBool::new(false));
    let epoch = Instant::now();
    let (fwd_tx, fwd_rx) = sync_channel::<Routed<Arc<UdpSocket>>>(CHANNEL_DEPTH);
    let (rev_tx, rev_rx) = sync_channel::<Routed<SocketAddr>>(CHANNEL_DEPTH);
    let fwd = Direction::spawn(
        "netem-fwd",
        Netem::new(args.path.fwd.clone(), mix_seed(seed, 1)),
        fwd_rx,
        |p: Routed<Arc<UdpSocket>>| {
            let _ = p.to.send(&p.bytes);
        },
        epoch,
        Arc::clone(&stop),
    )?;
    let out = Arc::clone(&listen);
    let rev = Direction::spawn(
        "netem-rev",
        Netem::new(args.path.rev.clone(), mix_seed(seed, 2)),
        rev_rx,
        move |p: Routed<SocketAddr>| {
            let _ = out.send_to(&p.bytes, p.to);
        },
        epoch,
        Arc::clone(&stop),
    )?;
    let clients = {
        let (listen, stop) = (Arc::clone(&listen), Arc::clone(&stop));
        let table = SourceTable::new(args.max_sources as usize, args.idle);
        std::thread::Builder::new()
            .name("relay-listen".into())
            .spawn(move || relay_clients(&listen, to, table, &fwd_tx, &rev_tx, &stop))?
    };
    let rt = runtime()?;
    let mut signals = StopSignals::catch(&rt);
    eprintln!(
        "atou netem relay: {} -> {to}, seed {seed}\n  fwd \"{}\"\n  rev \"{}\"\nready",
        listen.local_addr()?,
        args.path.fwd,
        args.path.rev
    );
    rt.block_on(signals.until_stopped(args.run_for));
    stop.store(true, Ordering::Relaxed);
    let (f, r) = (fwd.join(), rev.join());
    let sources = clients.join().unwrap_or_default();
    print_report(
        args.path.json,
        seed,
        "relay",
        &[("fwd", &args.path.fwd, f), ("rev", &args.path.rev, r)],
        Some(sources),
    );
    Ok(ExitCode::SUCCESS)
}

/// How often at most the relay says it is dropping new sources.
const REFUSAL_NOTICE_EVERY: Duration = Duration::from_secs(10);

/// A source's way to the server: its socket, and a flag that ends its
/// reader thread.
struct Upstream {
    sock: Arc<UdpSocket>,
    gone: Arc<AtomicBool>,
}

/// A message said at most every [`REFUSAL_NOTICE_EVERY`], with how many
/// times it happened since it was last said.
#[derive(Default)]
struct Throttle {
    last: Option<Instant>,
    unsaid: u64,
}

impl Throttle {
    /// Counts one more; `Some(count)` when it is time to say so.
    fn happened(&mut self, now: Instant) -> Option<u64> {
        self.unsaid += 1;
        if self
            .last
            .is_some_and(|t| now.saturating_duration_since(t) < REFUSAL_NOTICE_EVERY)
        {
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.unsaid))
    }
}

fn plural(n: u64) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// Reads from clients; each new client gets its own socket towards the
/// server, so replies can be told apart, up to the table's cap; sources
/// idle past its timeout are forgotten (their threads end). Returns what
/// it did with sources once `stop` is set.
fn relay_clients(
    listen: &UdpSocket,
    to: SocketAddr,
    mut table: SourceTable<Upstream>,
    fwd: &SyncSender<Routed<Arc<UdpSocket>>>,
    rev: &SyncSender<Routed<SocketAddr>>,
    stop: &Arc<AtomicBool>,
) -> SourceStats {
    let mut buf = vec![0u8; 65_536];
    let (max, idle) = (table.max(), table.idle());
    let sweep_every = (idle / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
    let mut next_sweep = Instant::now() + sweep_every;
    let (mut refusals, mut failures) = (Throttle::default(), Throttle::default());
    while !stop.load(Ordering::Relaxed) {
        let received = listen.recv_from(&mut buf);
        let now = Instant::now();
        if now >= next_sweep {
            for gone in table.reclaim(now) {
                gone.gone.store(true, Ordering::Relaxed);
            }
            next_sweep = now + sweep_every;
        }
        let (n, client) = match received {
            Ok(x) => x,
            // Timeouts, and ICMP errors from a client that went away;
            // keep relaying.
            Err(_) => continue,
        };
        let admitted = table.admit(now, client, || open_upstream(to, client, rev, stop));
        let sock = match admitted {
            Ok(Some(up)) => Arc::clone(&up.sock),
            Ok(None) => {
                if let Some(n) = refusals.happened(now) {
                    eprintln!(
                        "atou netem relay: dropped {n} datagram{} from new sources: {max} \
                         sources are held already (--max-sources); one is forgotten after {} \
                         without a datagram (--idle)",
                        plural(n),
                        crate::util::units::format_time_tc(idle),
                    );
                }
                continue;
            }
            Err(e) => {
                if let Some(n) = failures.happened(now) {
                    eprintln!(
                        "atou netem relay: cannot open a socket and a thread towards {to} for \
                         {client}: {e} ({n} datagram{} dropped for this since the last message)",
                        plural(n)
                    );
                }
                continue;
            }
        };
        if fwd
            .send(Routed {
                bytes: buf[..n].to_vec(),
                to: sock,
            })
            .is_err()
        {
            break;
        }
    }
    let stats = table.stats();
    for up in table.drain() {
        up.gone.store(true, Ordering::Relaxed);
    }
    stats
}

fn open_upstream(
    to: SocketAddr,
    client: SocketAddr,
    rev: &SyncSender<Routed<SocketAddr>>,
    stop: &Arc<AtomicBool>,
) -> std::io::Result<Upstream> {
    let any: SocketAddr = if to.is_ipv4() {
        "0.0.0.0:0".parse().expect("literal")
    } else {
        "[::]:0".parse().expect("literal")
    };
    let sock = UdpSocket::bind(any)?;
    grow_rcvbuf(&sock);
    sock.connect(to)?;
    sock.set_read_timeout(Some(READ_WAKE))?;
    let sock = Arc::new(sock);
    let gone = Arc::new(AtomicBool::new(false));
    let (reader, rev, stop, mine) = (
        Arc::clone(&sock),
        rev.clone(),
        Arc::clone(stop),
        Arc::clone(&gone),
    );
    std::thread::Builder::new()
        .name("relay-upstream".into())
        .spawn(move || {
            let mut buf = vec![0u8; 65_536];
            while !stop.load(Ordering::Relaxed) && !mine.load(Ordering::Relaxed) {
                match reader.recv(&mut buf) {
                    Ok(n) => {
                        let p = Routed {
                            bytes: buf[..n].to_vec(),
                            to: client,
                        };
                        if rev.send(p).is_err() {
                            return;
                        }
                    }
                    // Timeouts, and ICMP unreachable while the server is down.
                    Err(_) => continue,
                }
            }
        })?;
    Ok(Upstream { sock, gone })
}

// ---------------------------------------------------------------------------
// The bridge
// ---------------------------------------------------------------------------

/// Where the bridge records which namespaces it made, by pid, so that a
/// later run can tell its own stale leftovers from someone else's.
const STATE_DIR: &str = "/run/atou-netem";
/// The link's name inside each host.
const LINK: &str = "atou0";
/// netem on a veth counts the Ethernet header; the TUN model adds the same.
const ETHERNET_HEADER: usize = 14;

fn is_root() -> bool {
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// Runs a command, failing with its stderr.
fn run(program: &str, args: &[&str]) -> Result<()> {
    let out = StdCommand::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => anyhow!(
                "`{program}` is not installed (it comes with iproute2: apt-get install iproute2)"
            ),
            _ => anyhow!("cannot run `{program}`: {e}"),
        })?;
    if out.status.success() {
        Ok(())
    } else {
        bail!(
            "`{program} {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )
    }
}

fn ip(args: &[&str]) -> Result<()> {
    run("ip", args)
}

fn pid_file(ns: &str) -> PathBuf {
    PathBuf::from(STATE_DIR).join(format!("{ns}.pid"))
}

fn namespace_exists(ns: &str) -> bool {
    std::path::Path::new("/run/netns").join(ns).exists()
}

/// True when `pid` is a live atou process. A pid file can outlive its
/// process, and a later process (after a reboot, or in a container restored
/// from a snapshot) can reuse the number.
fn is_running_atou(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|comm| comm.trim_end() == "atou")
}

/// Removes `ns` if an earlier bridge left it behind; refuses if it is in
/// use or not ours.
fn clear_stale(ns: &str) -> Result<()> {
    let file = pid_file(ns);
    let owner: Option<u32> = std::fs::read_to_string(&file)
        .ok()
        .and_then(|s| s.trim().parse().ok());
    if !namespace_exists(ns) {
        let _ = std::fs::remove_file(&file);
        return Ok(());
    }
    match owner {
        None => Err(UsageError(format!(
            "network namespace `{ns}` exists and was not made by atou; remove it \
             (ip netns del {ns}) or pick other names with --hosts"
        ))
        .into()),
        Some(pid) if is_running_atou(pid) => Err(UsageError(format!(
            "network namespace `{ns}` belongs to a running atou netem bridge (pid {pid}); \
                 stop it or pick other names with --hosts"
        ))
        .into()),
        Some(pid) => {
            eprintln!("atou netem bridge: removing `{ns}`, left behind by pid {pid}");
            ip(&["netns", "del", ns])?;
            let _ = std::fs::remove_file(&file);
            Ok(())
        }
    }
}

/// Deletes what the bridge made, whatever way it ends.
struct Namespaces {
    names: Vec<String>,
}

impl Namespaces {
    fn add(&mut self, ns: &str) -> Result<()> {
        std::fs::create_dir_all(STATE_DIR).with_context(|| format!("cannot create {STATE_DIR}"))?;
        ip(&["netns", "add", ns])?;
        self.names.push(ns.to_string());
        std::fs::write(pid_file(ns), std::process::id().to_string())
            .with_context(|| format!("cannot write {}", pid_file(ns).display()))?;
        Ok(())
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        for ns in self.names.drain(..).rev() {
            if let Err(e) = ip(&["netns", "del", &ns]) {
                eprintln!("atou netem bridge: could not remove namespace `{ns}`: {e:#}");
            }
            let _ = std::fs::remove_file(pid_file(&ns));
        }
    }
}

/// True when the kernel's netem qdisc can be attached here.
fn kernel_netem_available() -> bool {
    let ns = format!("atou-probe-{}", std::process::id());
    let mut guard = Namespaces { names: Vec::new() };
    if guard.add(&ns).is_err() {
        return false;
    }
    ip(&[
        "-n", &ns, "link", "add", "p0", "type", "veth", "peer", "name", "p1",
    ])
    .is_ok()
        && run(
            "ip",
            &[
                "netns", "exec", &ns, "tc", "qdisc", "add", "dev", "p0", "root", "netem", "delay",
                "1ms",
            ],
        )
        .is_ok()
}

fn with_prefix(addr: &str) -> Result<String> {
    let (host, prefix) = addr.split_once('/').unwrap_or((addr, "24"));
    host.parse::<std::net::Ipv4Addr>()
        .map_err(|_| UsageError(format!("`{host}` is not an IPv4 address")))?;
    match prefix.parse::<u8>() {
        Ok(p) if p <= 32 => Ok(format!("{host}/{p}")),
        _ => Err(UsageError(format!("`/{prefix}` is not a prefix length")).into()),
    }
}

/// Moves `dev` into `ns` as [`LINK`], addresses it and brings it up.
fn configure_host(dev: &str, ns: &str, addr: &str, mtu: u32) -> Result<()> {
    ip(&["link", "set", "dev", dev, "netns", ns])?;
    ip(&["-n", ns, "link", "set", "dev", dev, "name", LINK])?;
    ip(&["-n", ns, "addr", "add", addr, "dev", LINK])?;
    ip(&[
        "-n",
        ns,
        "link",
        "set",
        "dev",
        LINK,
        "mtu",
        &mtu.to_string(),
        "up",
    ])?;
    ip(&["-n", ns, "link", "set", "dev", "lo", "up"])?;
    // Keep IPv6 chatter (router solicitations) off the impaired link.
    let _ = run(
        "ip",
        &[
            "netns",
            "exec",
            ns,
            "sysctl",
            "-qw",
            &format!("net.ipv6.conf.{LINK}.disable_ipv6=1"),
        ],
    );
    Ok(())
}

/// Whether this `tc` parses netem's `seed` (iproute2 6.4 and later; 6.1
/// answers `What is "seed"?`). The trailing `help` makes tc print its usage
/// and stop before it talks to the kernel, so nothing is added.
fn tc_knows_netem_seed() -> bool {
    StdCommand::new("tc")
        .args([
            "qdisc", "add", "dev", "lo", "root", "netem", "seed", "1", "help",
        ])
        .stdin(Stdio::null())
        .output()
        .is_ok_and(|out| {
            let text = [out.stdout, out.stderr].concat();
            !String::from_utf8_lossy(&text).contains("What is \"seed\"")
        })
}

/// `tc` arguments for a chain: the root netem, then each stage as the
/// previous one's child. Seeds are left out when `tc_has_seed` is false.
fn tc_commands(spec: &NetemSpec, seed: Option<u64>, tc_has_seed: bool) -> Result<Vec<Vec<String>>> {
    let mut cmds = Vec::new();
    for (i, stage) in spec.stages.iter().enumerate() {
        if let Some(why) = stage.kernel_unsupported() {
            bail!(UsageError(format!(
                "--backend tc: {why}; use --backend tun"
            )));
        }
        let mut stage = stage.clone();
        if stage.seed.is_none() {
            stage.seed = seed.map(|s| mix_seed(s, i as u64));
        }
        if !tc_has_seed {
            stage.seed = None;
        }
        // iproute2 ships no uniform table (`distribution uniform` fails with
        // "No distribution data"): without a table the kernel's tabledist()
        // is uniform already, and a uniform slot is the range MIN..MAX.
        if stage.distribution == Some(Distribution::Uniform) {
            stage.distribution = None;
        }
        if let Some(slot) = &mut stage.slot {
            if let SlotDelay::Distribution {
                dist: Distribution::Uniform,
                delay,
                jitter,
            } = slot.delay
            {
                slot.delay = SlotDelay::Range {
                    min: delay.saturating_sub(jitter),
                    max: delay + jitter,
                };
            }
        }
        let mut args: Vec<String> = vec!["qdisc".into(), "add".into(), "dev".into(), LINK.into()];
        if i == 0 {
            args.extend(["root".into(), "handle".into(), "1:".into()]);
        } else {
            args.extend([
                "parent".into(),
                format!("{i}:1"),
                "handle".into(),
                format!("{}:", i + 1),
            ]);
        }
        args.push("netem".into());
        args.extend(stage.to_string().split_whitespace().map(String::from));
        cmds.push(args);
    }
    Ok(cmds)
}

fn bridge(args: BridgeArgs) -> Result<ExitCode> {
    if !is_root() {
        bail!(
            "atou netem bridge needs root: it makes network namespaces and TUN or veth devices. \
             Run it as root (sudo atou netem bridge ...)"
        );
    }
    // Caught before any host exists: a signal during the set-up stops the
    // bridge once it is up, and the hosts go with it.
    let rt = runtime()?;
    let mut signals = StopSignals::catch(&rt);
    let (ns_a, ns_b) = (&args.hosts.0, &args.hosts.1);
    if ns_a == ns_b {
        return Err(UsageError("--hosts: the two names must differ".into()).into());
    }
    let addr_a = with_prefix(&args.addrs.0)?;
    let addr_b = with_prefix(&args.addrs.1)?;
    clear_stale(ns_a)?;
    clear_stale(ns_b)?;
    let backend = match args.backend {
        Backend::Auto if kernel_netem_available() => Backend::Tc,
        Backend::Auto => Backend::Tun,
        b => b,
    };
    let seed = args.path.seed.unwrap_or_else(clock_seed);
    let mut hosts = Namespaces { names: Vec::new() };
    hosts.add(ns_a)?;
    hosts.add(ns_b)?;
    // Devices are made in this namespace under names unique to this run,
    // then moved into the hosts and renamed.
    let temp = |side: char| format!("atnm{}{side}", std::process::id() % 1_000_000);
    let link = BridgeLink {
        ns: [ns_a, ns_b],
        addr: [&addr_a, &addr_b],
        dev: [temp('a'), temp('b')],
    };
    let stop = Arc::new(AtomicBool::new(false));
    let directions = match backend {
        Backend::Tc => {
            bridge_tc(&args, &link)?;
            Vec::new()
        }
        Backend::Tun | Backend::Auto => bridge_tun(&args, &link, seed, &stop)?,
    };
    let backend_name = if backend == Backend::Tc { "tc" } else { "tun" };
    eprintln!("{}", bridge_banner(&args, &link, backend_name, seed));
    let status = run_in_bridge(&rt, &mut signals, &args, &link)?;
    stop.store(true, Ordering::Relaxed);
    let stats: Vec<NetemStats> = directions.into_iter().map(Direction::join).collect();
    if backend == Backend::Tc {
        for ns in [ns_a, ns_b] {
            let out = StdCommand::new("ip")
                .args([
                    "netns", "exec", ns, "tc", "-s", "qdisc", "show", "dev", LINK,
                ])
                .output();
            if let Ok(out) = out {
                eprintln!("{ns}: {}", String::from_utf8_lossy(&out.stdout).trim());
            }
        }
    } else {
        print_report(
            args.path.json,
            seed,
            backend_name,
            &[
                ("fwd", &args.path.fwd, stats[0]),
                ("rev", &args.path.rev, stats[1]),
            ],
            None,
        );
    }
    drop(hosts);
    Ok(match status {
        None => ExitCode::SUCCESS,
        Some(s) => ExitCode::from(s.code().map_or(1, |c| c.clamp(0, 255) as u8)),
    })
}

/// The bridge's two hosts: namespace, address and (until moved into
/// the namespace and renamed) device of each, A first.
struct BridgeLink<'a> {
    ns: [&'a String; 2],
    addr: [&'a String; 2],
    dev: [String; 2],
}

/// The tc backend: a veth pair, and the kernel's netem on each end.
fn bridge_tc(args: &BridgeArgs, link: &BridgeLink) -> Result<()> {
    let [ns_a, ns_b] = link.ns;
    let [addr_a, addr_b] = link.addr;
    let [dev_a, dev_b] = &link.dev;
    let tc_has_seed = tc_knows_netem_seed();
    let seeded = args.path.seed.is_some()
        || [&args.path.fwd, &args.path.rev]
            .iter()
            .any(|spec| spec.stages.iter().any(|stage| stage.seed.is_some()));
    if seeded && !tc_has_seed {
        eprintln!(
            "atou netem bridge: note: this tc has no netem `seed` (iproute2 before 6.4), \
             so the kernel's random draws differ from run to run; \
             --backend tun repeats them from the seed"
        );
    }
    ip(&["link", "add", dev_a, "type", "veth", "peer", "name", dev_b])?;
    let moved = configure_host(dev_a, ns_a, addr_a, args.mtu)
        .and_then(|()| configure_host(dev_b, ns_b, addr_b, args.mtu));
    if let Err(e) = moved {
        // An end still in this namespace outlives the hosts; deleting
        // either end deletes the pair.
        for dev in [dev_a, dev_b] {
            let _ = ip(&["link", "del", dev]);
        }
        return Err(e);
    }
    for (ns, spec, stream) in [(ns_a, &args.path.fwd, 1), (ns_b, &args.path.rev, 2)] {
        let seed = args.path.seed.map(|s| mix_seed(s, stream));
        for cmd in tc_commands(spec, seed, tc_has_seed)? {
            let mut full = vec!["netns", "exec", ns.as_str(), "tc"];
            full.extend(cmd.iter().map(String::as_str));
            ip(&full).map_err(|e| {
                if format!("{e}").contains("qdisc kind is unknown") {
                    anyhow!(
                        "{e:#}\nthis kernel has no netem qdisc (sch_netem); \
                         use --backend tun (or auto, which picks it)"
                    )
                } else {
                    e
                }
            })?;
        }
    }
    Ok(())
}

/// The TUN backend: a TUN device in each host, and atou's netem model
/// between them, one thread per direction.
fn bridge_tun(
    args: &BridgeArgs,
    link: &BridgeLink,
    seed: u64,
    stop: &Arc<AtomicBool>,
) -> Result<Vec<Direction>> {
    let [ns_a, ns_b] = link.ns;
    let [addr_a, addr_b] = link.addr;
    let [dev_a, dev_b] = &link.dev;
    let mut directions = Vec::new();
    let tun_a = Tun::create(dev_a).context("cannot create a TUN device")?;
    let tun_b = Tun::create(dev_b).context("cannot create a TUN device")?;
    configure_host(dev_a, ns_a, addr_a, args.mtu)?;
    configure_host(dev_b, ns_b, addr_b, args.mtu)?;
    let epoch = Instant::now();
    for (name, from, to, spec, stream) in [
        ("netem-fwd", &tun_a, &tun_b, &args.path.fwd, 1),
        ("netem-rev", &tun_b, &tun_a, &args.path.rev, 2),
    ] {
        let mut netem: Netem<Vec<u8>> = Netem::new(spec.clone(), mix_seed(seed, stream));
        netem.set_frame_overhead(ETHERNET_HEADER);
        let (tx, rx) = sync_channel::<Vec<u8>>(CHANNEL_DEPTH);
        let mut out = to.try_clone()?;
        directions.push(Direction::spawn(
            name,
            netem,
            rx,
            move |p: Vec<u8>| {
                let _ = out.send(&p);
            },
            epoch,
            Arc::clone(stop),
        )?);
        let mut reader = from.try_clone()?;
        let mtu = args.mtu as usize;
        std::thread::Builder::new()
            .name(format!("tun-{}", reader.name()))
            .spawn(move || {
                let mut buf = vec![0u8; mtu.max(1500) + 64];
                while let Ok(n) = reader.recv(&mut buf) {
                    if tx.send(buf[..n].to_vec()).is_err() {
                        return;
                    }
                }
            })?;
    }
    Ok(directions)
}

/// What the bridge says once it is up: the backend, the seed, each
/// direction's impairment, and how to use it; `ready` last.
fn bridge_banner(args: &BridgeArgs, link: &BridgeLink, backend_name: &str, seed: u64) -> String {
    let [ns_a, ns_b] = link.ns;
    let [addr_a, addr_b] = link.addr;
    let mut banner = String::new();
    let _ = writeln!(
        banner,
        "atou netem bridge: backend {backend_name}, seed {seed}\n  \
         host {ns_a} {addr_a} (dev {LINK}) -> host {ns_b} {addr_b}: fwd \"{}\"\n  \
         host {ns_b} -> host {ns_a}: rev \"{}\"",
        args.path.fwd, args.path.rev
    );
    if args.command.is_empty() {
        let _ = write!(
            banner,
            "  run programs with: ip netns exec {ns_a} CMD (or {ns_b}); Ctrl-C removes both hosts\nready"
        );
    } else {
        let _ = write!(banner, "ready");
    }
    banner
}

/// Runs the bridge's command in its host until it exits, or, with none,
/// waits for a signal; a signal kills the command. Its status, if any.
fn run_in_bridge(
    rt: &tokio::runtime::Runtime,
    signals: &mut StopSignals,
    args: &BridgeArgs,
    link: &BridgeLink,
) -> Result<Option<std::process::ExitStatus>> {
    if args.command.is_empty() {
        rt.block_on(signals.until_stopped(None));
        return Ok(None);
    }
    let ns = if args.run_in == Side::A {
        link.ns[0]
    } else {
        link.ns[1]
    };
    let mut child = tokio::process::Command::new("ip");
    child.args(["netns", "exec", ns]).args(&args.command);
    Ok(Some(rt.block_on(async {
        let mut child = child
            .spawn()
            .with_context(|| format!("cannot run `{}` in {ns}", args.command.join(" ")))?;
        tokio::select! {
            s = child.wait() => s.context("waiting for the command"),
            _ = signals.until_stopped(None) => {
                let _ = child.kill().await;
                child.wait().await.context("waiting for the command")
            }
        }
    })?))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a test does when this host cannot run it, shared with the
    /// integration suites.
    #[allow(dead_code, unreachable_pub)]
    mod ci {
        include!("../../tests/common/ci.rs");
    }

    fn spec(s: &str) -> NetemSpec {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    /// Every keyword the tc backend passes on, alone and in a chain.
    const TC_SPECS: &[&str] = &[
        "limit 1000 delay 50ms 10ms 25% distribution normal",
        "delay 20ms 5ms distribution pareto",
        "delay 20ms 5ms distribution paretonormal",
        "delay 20ms 5ms distribution uniform",
        "loss random 1% 25%",
        "loss state 1% 30% 5% 40% 0.1%",
        "loss gemodel 1% 10% 70% 0.1%",
        "corrupt 0.1% 10% duplicate 1%",
        "delay 10ms reorder 25% 50% gap 5",
        "rate 100mbit 20 100 5",
        "rate 1.6mbit limit 10",
        "slot 800us 8.5ms packets 42 bytes 16384",
        "slot distribution pareto 10ms 2ms packets 8",
        "slot distribution uniform 10ms 2ms",
        "delay 10ms seed 7",
        "rate 100mbit limit 1000 | delay 50ms loss 1%",
    ];

    #[test]
    fn a_chain_hangs_each_stage_below_the_one_before() {
        let cmds = tc_commands(&spec("rate 1mbit | delay 10ms | loss 1%"), None, true).unwrap();
        let netem = |c: &Vec<String>| c.iter().position(|w| w == "netem").unwrap();
        let heads: Vec<String> = cmds.iter().map(|c| c[4..netem(c)].join(" ")).collect();
        assert_eq!(
            heads,
            [
                "root handle 1:",
                "parent 1:1 handle 2:",
                "parent 2:1 handle 3:"
            ]
        );
        assert!(cmds.iter().all(|c| c[..4] == ["qdisc", "add", "dev", LINK]));
        assert_eq!(cmds[2][netem(&cmds[2]) + 1..], ["loss", "1%"]);
    }

    #[test]
    fn uniform_becomes_what_the_kernel_does_without_a_table() {
        let words = |s: &str| tc_commands(&spec(s), None, true).unwrap()[0].join(" ");
        assert!(words("delay 20ms 5ms distribution uniform").ends_with("netem delay 20ms 5ms"));
        assert!(words("slot distribution uniform 10ms 2ms packets 4")
            .ends_with("netem slot 8ms 12ms packets 4"));
    }

    #[test]
    fn seeds_reach_tc_only_when_it_parses_them() {
        let chain = spec("delay 10ms | loss 1% seed 9");
        let with = tc_commands(&chain, Some(5), true).unwrap();
        let without = tc_commands(&chain, Some(5), false).unwrap();
        let seeds = |cmds: &[Vec<String>]| -> Vec<Option<String>> {
            cmds.iter()
                .map(|c| c.iter().position(|w| w == "seed").map(|i| c[i + 1].clone()))
                .collect()
        };
        assert_eq!(
            seeds(&with),
            [Some(mix_seed(5, 0).to_string()), Some("9".to_string())]
        );
        assert_eq!(seeds(&without), [None, None]);
        assert!(tc_commands(&spec("loss every 10"), None, true).is_err());
    }

    /// Runs each stage's words through the real `tc` in a scratch namespace.
    /// A kernel without sch_netem rejects the qdisc only after tc's parser
    /// accepted the words, so that answer counts as parsed.
    #[test]
    fn the_real_tc_parses_every_command_the_tc_backend_makes() {
        if !is_root() {
            ci::cannot_run(
                "the_real_tc_parses_every_command_the_tc_backend_makes",
                "not root (needs a scratch network namespace)",
            );
            return;
        }
        if StdCommand::new("tc").arg("-V").output().is_err() {
            ci::cannot_run(
                "the_real_tc_parses_every_command_the_tc_backend_makes",
                "no `tc` (apt-get install iproute2)",
            );
            return;
        }
        let ns = format!("atou-tcparse-{}", std::process::id());
        let mut scratch = Namespaces { names: Vec::new() };
        scratch.add(&ns).unwrap();
        let has_seed = tc_knows_netem_seed();
        let mut refused = Vec::new();
        for s in TC_SPECS {
            for cmd in tc_commands(&spec(s), Some(1), has_seed).unwrap() {
                let netem = cmd.iter().position(|w| w == "netem").unwrap();
                let mut args = vec!["netns", "exec", &ns, "tc", "qdisc", "add", "dev", "lo"];
                args.push("root");
                args.extend(cmd[netem..].iter().map(String::as_str));
                let out = StdCommand::new("ip").args(&args).output().unwrap();
                let err = String::from_utf8_lossy(&out.stderr);
                if !out.status.success() && !err.contains("qdisc kind is unknown") {
                    refused.push(format!("`{}`: {}", args[3..].join(" "), err.trim()));
                }
                let _ = StdCommand::new("ip")
                    .args([
                        "netns", "exec", &ns, "tc", "qdisc", "del", "dev", "lo", "root",
                    ])
                    .output();
            }
        }
        assert!(refused.is_empty(), "tc refused:\n{}", refused.join("\n"));
    }
}

//! `atou serve` and `atou probe`: atou's server and client on real UDP.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs};
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;

use crate::io::{
    self, ClientEnd, ProbeConfig, ProbeError, ServeApp, ServeConfig, ServeEvent, DEFAULT_PORT,
};
use crate::proto::crypto::{PublicKey, ServerAuth};
use crate::proto::ServerLimits;
use crate::proto::{ConnEnd, ConnReport, ServerStats, Tuning};
use crate::report::summary::{SocketReport, Summary};
use crate::transfer::dest::policy::XattrGrant;
use crate::transfer::dest::{ReceivePolicy, SymlinkPolicy};
use crate::transfer::receive::{
    check_root, FileReceiver, NoFiles, ReceiveConfig, ReceiveEvent, ReceiveLimits, TransferReport,
};
use crate::transfer::send::probe_fault;
use crate::util::text::shown_path;
use crate::util::units::{format_size, parse_duration, parse_size, TimeUnit};

use super::exit::Exit;
use super::metrics::{serve_metrics, ServeMetrics};
use super::path_hint::PathHint;
use super::{finish_trace, print_stdout, Output, OutputArgs, TuningArgs, UsageError};

#[derive(Args, Debug)]
#[command(after_help = "Examples:\n  \
    atou probe 10.0.0.2 --bytes 1GiB\n  \
    atou probe server.example.org:7891 --maxtime 30 --recovery newreno --delack 200ms\n  \
    atou probe 10.0.0.2 --config atou.conf --dup-thresh 9 --json\n\n\
    Without --bytes, --maxtime or --maxpkts the probe sends for 10 s, as atou's client. \
    Exit status: 0 finished, 1 the transfer failed (the reason is on stderr), 2 usage error.")]
pub(super) struct ProbeArgs {
    /// The server: HOST or HOST:PORT (default port 7890); IPv6 as [ADDR]:PORT
    #[arg(value_name = "HOST[:PORT]")]
    host: String,
    /// Bytes to send: 100MB (10^6), 64MiB or 64M (2^20); 0 sends until --maxtime/--maxpkts
    #[arg(long, value_name = "SIZE", default_value = "0", value_parser = parse_bytes)]
    bytes: u64,
    #[command(flatten)]
    output: OutputArgs,
    #[command(flatten)]
    tuning: TuningArgs,
    #[command(flatten)]
    auth: super::auth::ClientAuthArgs,
    /// Neither use nor update the path cache ($XDG_CACHE_HOME/atou/paths, else ~/.cache/atou/paths): what the last transfer or probe to this host learnt of its path (RTT, ssthresh, bandwidth), kept an hour and used to start the next one faster (default: use it)
    #[arg(long)]
    no_path_cache: bool,
}

#[derive(Args, Debug)]
#[command(
    after_help = "Prints one line per connection on stdout (JSON Lines with --json), \
    like atousrv's report, and notices on stderr (on stdout as JSON with --json). What a sender \
    may do with --dir and what it may make the server hold are the server's to set: see \
    docs/security.md. The receiver-side tuning (delack, SACK, \
    rcvsegs, rcvbuf) comes from each client's hello. Ctrl-C stops it.\n\n\
    Exit status: 0 stopped (Ctrl-C, or --once and the connection or transfer ended well); \
    1 the server could not run (the reason is on stderr); 2 usage error; with --once --dir, \
    23 (partial) when the one transfer failed: the sender's status says why, and what was \
    written stays for its resume. `atou --help` lists every status."
)]
pub(super) struct ServeArgs {
    /// Address to listen on: ADDR, ADDR:PORT, :PORT or [IPV6]:PORT. On 0.0.0.0 or [::] (every address of this host; [::] takes IPv4 clients too), each client is answered from the address it sent to
    #[arg(long, value_name = "ADDR", default_value = "0.0.0.0:7890", value_parser = parse_bind)]
    bind: SocketAddr,
    /// Receive files into DEST (an existing directory): what `atou send` sends
    #[arg(long, value_name = "DEST")]
    dir: Option<std::path::PathBuf>,
    /// Writer threads for --dir (default: one per core, at least 2)
    #[arg(long, value_name = "N")]
    writers: Option<usize>,
    /// Exit after the first connection (with --dir, the first transfer) ends; with --dir, exit 23 if that transfer failed
    #[arg(long)]
    once: bool,
    /// Print every report, transfer, failure and notice as one JSON object per line on stdout
    #[arg(long)]
    json: bool,
    /// Where the data received is opened: off (the protocol's thread) or on (a thread of its own, a batch at a time, so that the protocol's thread does no AEAD work for it; experimental: slower where two cores run both ends, see docs/security.md)
    #[arg(
        long,
        value_name = "WHERE",
        default_value = "off",
        value_enum,
        hide_possible_values = true
    )]
    open_thread: crate::io::SealAside,
    /// UDP socket send buffer in bytes (SO_SNDBUF), e.g. 4MiB
    #[arg(long, value_name = "BYTES", default_value = "4MiB", value_parser = parse_sockbuf)]
    sndbuf: u32,
    /// UDP socket receive buffer in bytes (SO_RCVBUF, atousrv -b); never grown past this, whatever a client asks
    #[arg(long, value_name = "BYTES", default_value = "4MiB", value_parser = parse_sockbuf)]
    rcvbuf: u32,
    /// Serve Prometheus metrics (transfers, bytes and files written, refusals by reason, hellos answered and rate-limited, per-connection summaries) over HTTP at http://ADDR:PORT/metrics; off by default. Bind it to loopback or a management network: it must not face the internet (docs/security.md)
    #[arg(long, value_name = "ADDR:PORT")]
    metrics: Option<SocketAddr>,
    #[command(flatten)]
    receiver: ReceiverArgs,
    #[command(flatten)]
    auth: super::auth::ServeAuthArgs,
}

/// What `atou serve --dir` lets senders do, and what it lets them make it hold.
#[derive(Args, Debug)]
#[command(next_help_heading = "Receiver policy (with --dir) and budgets")]
pub(super) struct ReceiverArgs {
    /// Let a sender that asks (`--overwrite`) replace existing files and re-mode existing directories (default: refuse)
    #[arg(long)]
    allow_overwrite: bool,
    /// Let a sender that asks (`--delete`) remove, in the directories it sends, what it does not send (default: refuse the transfer). With --authorized-keys, a key needs `delete` on its line too
    #[arg(long)]
    allow_delete: bool,
    /// Give what a sender sends with -o / -g its sender's owner and group (by name where this host knows it, as rsync); needs the server to run as root (default: refuse such a transfer). With --authorized-keys, a key needs `owners` on its line too
    #[arg(long)]
    allow_owners: bool,
    /// Set the extended attributes a sender sends with -X: `user` (also the value without `=`), `user.*` alone; `all`, also `security.*` and `trusted.*`, as root only (`security.capability` gives a program privileges: as --allow-special-bits). Default: refuse such a transfer. Other namespaces are always refused. With --authorized-keys, a key needs `xattrs` on its line too
    #[arg(long, value_name = "NAMESPACES", value_enum, num_args = 0..=1, require_equals = true, default_missing_value = "user", default_value = "none")]
    allow_xattrs: XattrGrant,
    /// Set the POSIX ACLs a sender sends with -A (named users and groups by number; the mode's group bits, after --umask, cap the ACL's mask). Default: refuse such a transfer. With --authorized-keys, a key needs `acls` on its line too
    #[arg(long)]
    allow_acls: bool,
    /// Permission bits cleared from every mode that arrives, in octal
    #[arg(long, value_name = "OCTAL", default_value = "022", value_parser = parse_umask)]
    umask: u32,
    /// Keep setuid, setgid and sticky bits as sent (default: cleared)
    #[arg(long)]
    allow_special_bits: bool,
    /// Do not sync files and directories to disk before a transfer is reported verified (default: sync, so "verified" survives a power cut); a sender's --fsync still syncs
    #[arg(long)]
    no_fsync: bool,
    /// Symlinks a sender may create: `safe` only relative ones that stay inside DEST (rsync's --safe-links), `all` any, `none` no symlinks
    #[arg(long, value_name = "POLICY", default_value = "safe", value_parser = parse_symlinks)]
    symlinks: SymlinkPolicy,
    /// Memory for receive windows over all connections, in bytes
    #[arg(long, value_name = "SIZE", default_value = "1GiB", value_parser = parse_bytes)]
    buffer: u64,
    /// Largest receive window of one connection, in bytes (at most --buffer)
    #[arg(long, value_name = "SIZE", default_value = "64MiB", value_parser = parse_bytes)]
    max_window: u64,
    /// Connections open at once, in all
    #[arg(long, value_name = "N", default_value_t = 1024)]
    max_connections: usize,
    /// Connections open at once from one IP address
    #[arg(long, value_name = "N", default_value_t = 64)]
    max_connections_per_ip: usize,
    /// Transfers in progress at once, in all
    #[arg(long, value_name = "N", default_value_t = 64)]
    max_sessions: usize,
    /// Transfers in progress at once from one IP address
    #[arg(long, value_name = "N", default_value_t = 8)]
    max_sessions_per_ip: usize,
    /// Largest plan request (the manifest of a transfer), in bytes
    #[arg(long, value_name = "SIZE", default_value = "64MiB", value_parser = parse_bytes)]
    max_request: u64,
    /// Most entries (files, directories, symlinks) in one transfer; also the most files one key's unfinished transfers may have staged at once (see --max-staged-per-key)
    #[arg(long, value_name = "N", default_value_t = 1_000_000)]
    max_files: usize,
    /// Threads that check plans against the disk and finish transfers
    #[arg(long, value_name = "N", default_value_t = 2)]
    planners: usize,
    /// Most bytes of existing files one `--checksum` transfer may make this server read and hash to compare them by content; such plans also take at most all but one planner at once (others are told busy and come back)
    #[arg(long, value_name = "SIZE", default_value = "1TiB", value_parser = parse_bytes)]
    max_checksum: u64,
    /// Remove partial files of abandoned transfers that nothing has touched for this long, at start and every hour (a time with a unit: 7d, 12h, 90m; a bare number is seconds); 0: keep them until resumed
    #[arg(long, value_name = "TIME", default_value = "7d", value_parser = parse_ttl)]
    staging_ttl: Duration,
    /// Hellos worked through with public-key operations (five X25519 each) per second, from all sources together, up to a quarter of it at once; past it a hello is dropped before any, and clients resend
    #[arg(long, value_name = "N", default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    hellos_per_sec: u32,
    /// The same from one source (an IPv4 address or an IPv6 /64), up to 5 at once (WireGuard's budget). Counted twice over: once the hellos without a cookie have spent it, the source is sent a cookie (at most 64 a second to one address and port) and its hellos that carry it get the same budget again, which a spoofer sending in the source's name cannot spend
    #[arg(long, value_name = "N", default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    hellos_per_sec_per_source: u32,
    /// Most bytes of partial files one client key's unfinished transfers may hold in DEST's staging directory at once, abandoned ones included until resumed or removed by --staging-ttl; counted at the sizes their plans announce (a sparse file at its full size), a resumed file once; a plan that would go over it is refused. A size: 1TiB, 500GiB, 64MiB; 0 or none: no quota. Clients without a key (--no-auth) are counted by address
    #[arg(long, value_name = "SIZE", default_value = "1TiB", value_parser = parse_quota)]
    max_staged_per_key: u64,
}

/// A size, or `none` (or 0): no quota.
fn parse_quota(s: &str) -> Result<u64, crate::util::units::UnitError> {
    match s {
        "none" => Ok(0),
        _ => parse_size(s),
    }
}

fn parse_ttl(s: &str) -> Result<Duration, crate::util::units::UnitError> {
    crate::util::units::parse_duration(s, crate::util::units::TimeUnit::Seconds)
}

fn parse_umask(s: &str) -> Result<u32, String> {
    match u32::from_str_radix(s.trim_start_matches("0o"), 8) {
        Ok(m) if m <= 0o777 => Ok(m),
        _ => Err(format!("`{s}` is not an octal umask from 000 to 777")),
    }
}

/// The `--symlinks` value that names `p`.
pub(super) fn symlinks_name(p: SymlinkPolicy) -> &'static str {
    match p {
        SymlinkPolicy::Safe => "safe",
        SymlinkPolicy::All => "all",
        SymlinkPolicy::None => "none",
    }
}

pub(super) fn parse_symlinks(s: &str) -> Result<SymlinkPolicy, String> {
    match s {
        "safe" => Ok(SymlinkPolicy::Safe),
        "all" => Ok(SymlinkPolicy::All),
        "none" => Ok(SymlinkPolicy::None),
        _ => Err(format!("`{s}` is not a symlink policy: safe, all or none")),
    }
}

impl ReceiverArgs {
    fn policy(&self) -> ReceivePolicy {
        ReceivePolicy {
            allow_overwrite: self.allow_overwrite,
            allow_delete: self.allow_delete,
            allow_owners: self.allow_owners,
            allow_xattrs: self.allow_xattrs,
            allow_acls: self.allow_acls,
            umask: self.umask,
            special_bits: self.allow_special_bits,
            fsync: !self.no_fsync,
            symlinks: self.symlinks,
            ..ReceivePolicy::server()
        }
    }

    fn limits(&self) -> ReceiveLimits {
        ReceiveLimits {
            max_sessions: self.max_sessions,
            max_sessions_per_ip: self.max_sessions_per_ip,
            max_request: self.max_request,
            max_entries: self.max_files,
            planners: self.planners.max(1),
            staging_ttl: Some(self.staging_ttl).filter(|t| !t.is_zero()),
            max_checksum_bytes: self.max_checksum,
            max_staged_per_key: Some(self.max_staged_per_key).filter(|&q| q > 0),
            ..ReceiveLimits::default()
        }
    }

    fn server_limits(&self, rcvbuf: u32) -> ServerLimits {
        ServerLimits {
            max_connections: self.max_connections,
            max_connections_per_ip: self.max_connections_per_ip,
            max_window_bytes: self.max_window.min(self.buffer),
            total_window_bytes: self.buffer,
            max_socket_rcvbuf: rcvbuf,
            hellos_per_sec: self.hellos_per_sec,
            hellos_per_sec_per_source: self.hellos_per_sec_per_source,
            ..ServerLimits::default()
        }
    }
}

fn parse_bytes(s: &str) -> Result<u64, crate::util::units::UnitError> {
    parse_size(s)
}

fn parse_sockbuf(s: &str) -> Result<u32, String> {
    let mut t = Tuning::default();
    t.set("rcvbuf", s).map_err(|e| e.message)?;
    Ok(t.rcvbuf)
}

fn parse_bind(s: &str) -> Result<SocketAddr, String> {
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(a);
    }
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, DEFAULT_PORT));
    }
    if let Some(port) = s.strip_prefix(':').or(Some(s)) {
        if let Ok(port) = port.parse::<u16>() {
            return Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port));
        }
    }
    Err(format!(
        "`{s}` is not an address to listen on (ADDR, ADDR:PORT, :PORT or [IPV6]:PORT)"
    ))
}

/// Resolves HOST or HOST:PORT, port 7890 by default.
pub(crate) fn resolve(host: &str) -> Result<SocketAddr> {
    if let Ok(a) = host.parse::<SocketAddr>() {
        return Ok(a);
    }
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = bare.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, DEFAULT_PORT));
    }
    let target = match host.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') => {
            let port: u16 = p
                .parse()
                .map_err(|_| UsageError(format!("`{p}` in `{host}` is not a port number")))?;
            (h.to_string(), port)
        }
        _ => (host.to_string(), DEFAULT_PORT),
    };
    let addrs = (target.0.as_str(), target.1)
        .to_socket_addrs()
        .map_err(|e| UsageError(format!("cannot resolve `{}`: {e}", target.0)))?;
    let addrs: Vec<SocketAddr> = addrs.collect();
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or(addrs.first())
        .copied()
        .ok_or_else(|| UsageError(format!("`{}` has no address", target.0)).into())
}

pub(crate) fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the I/O runtime")
}

async fn ctrl_c() {
    if tokio::signal::ctrl_c().await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Notes a socket buffer the kernel granted below what was asked, once.
fn note_buffer(what: &str, asked: u32, granted: u32, sysctl: &str) {
    // Linux reports twice the size it set; half of that is comparable.
    if granted / 2 < asked {
        eprintln!(
            "atou: note: UDP {what} buffer: asked for {asked} bytes, the kernel granted {}; \
             raise it with `sysctl -w {sysctl}={asked}` (or run as root)",
            granted / 2
        );
    }
}

pub(super) fn probe(args: ProbeArgs) -> Result<ExitCode> {
    let (mut tuning, notes) = args.tuning.resolve()?;
    for note in notes {
        eprintln!("atou: {note}");
    }
    let peer = resolve(&args.host)?;
    let bytes = (args.bytes > 0).then_some(args.bytes);
    if bytes.is_none() && tuning.maxtime.is_zero() && tuning.maxpkts == 0 {
        // atou's client default.
        tuning.maxtime = parse_duration("10", TimeUnit::Seconds).expect("a valid duration");
    }
    args.auth.choose_threads();
    let auth = args.auth.resolve(&args.host, peer, tuning.maxidle, true)?;
    let payload =
        crate::proto::endpoint::client::segment_payload(&tuning, auth.as_ref().map(|a| a.cipher));
    let mut out = Output::open(
        args.output.events,
        args.output.trace.as_deref(),
        vec![
            format!(
                "atou {} probe {} ({peer})",
                env!("CARGO_PKG_VERSION"),
                args.host
            ),
            format!("bytes {}", args.bytes),
            crate::report::trace::payload_line(payload),
        ],
        &tuning,
    )?
    .plot_to(args.output.plot.as_deref());
    let mut config = ProbeConfig {
        peer,
        tuning: tuning.clone(),
        bytes,
        trace: args.output.wants_trace(),
        conn_id: io::fresh_conn_id(),
        session: 0,
        reply_limit: 0,
        auth,
        close_unacknowledged: false,
        path_memory: None,
        stream_len_later: false,
        heard: None,
    };
    let pinned_key = config.auth.as_ref().map(|a| a.server_key.0);
    let hint = PathHint::new(args.no_path_cache, peer.ip(), pinned_key);
    config.path_memory = hint.recall();
    let result = runtime()?.block_on(io::probe(config, &mut out, ctrl_c()));
    let summary = result.report.map(|r| {
        Summary::from_client(
            &r,
            &ClientEnd::of(&result.outcome, true),
            &args.host,
            &tuning,
        )
    });
    hint.remember(&summary);
    finish_trace(&mut out)?;
    let defaults = Tuning::default();
    if tuning.sndbuf != defaults.sndbuf {
        note_buffer(
            "send",
            tuning.sndbuf,
            result.buffers.sndbuf,
            "net.core.wmem_max",
        );
    }
    if tuning.rcvbuf != defaults.rcvbuf {
        note_buffer(
            "receive",
            tuning.rcvbuf,
            result.buffers.rcvbuf,
            "net.core.rmem_max",
        );
    }
    if let Some(mut summary) = summary {
        summary.sockets = Some(SocketReport {
            sndbuf: result.buffers.sndbuf,
            rcvbuf: result.buffers.rcvbuf,
            server_rcvbuf: result.granted.map(|g| g.rcvbuf),
            txtime: result.txtime,
        });
        let text = if args.output.json {
            serde_json::to_string_pretty(&summary)? + "\n"
        } else {
            summary.to_string()
        };
        print_stdout(&text)?;
    }
    match result.outcome {
        Ok(_) => Ok(ExitCode::SUCCESS),
        Err(ProbeError::Interrupted) => {
            eprintln!("atou: probe to {} interrupted", args.host);
            Ok(Exit::Interrupted.into())
        }
        Err(e) => {
            eprintln!("atou: probe to {} failed: {e}", args.host);
            Ok(Exit::from(probe_fault(&e)).into())
        }
    }
}

fn report_line(r: &ConnReport, server: &ServerStats) -> String {
    let s = &r.stats;
    let mbs = if r.secs > 0.0 {
        s.bytes as f64 * 8.0 / r.secs / 1e6
    } else {
        0.0
    };
    let end = match r.end {
        ConnEnd::Closed => "closed".to_string(),
        ConnEnd::Idle => format!("idle {:.0} s (maxidle), dropped", r.maxidle_secs),
    };
    let sent = r
        .client_segments
        .map_or(String::new(), |n| format!(" (client sent {n})"));
    format!(
        "{} conn {:016x} {end} after {:.6} s: bytes {} segments {}{sent} acks {} dups {} \
         out-of-order {} beyond-window {} corrupt {} {mbs:.6} Mbs; \
         server dropped undecodable {} unknown-connection {} unexpected {}",
        r.peer,
        r.conn_id,
        r.secs,
        s.bytes,
        s.segments,
        s.acks,
        s.duplicates,
        s.out_of_order,
        s.beyond_window,
        r.corrupt_bytes,
        server.undecodable,
        server.unknown_connection,
        server.unexpected,
    )
}

pub(super) fn serve(args: ServeArgs) -> Result<ExitCode> {
    args.open_thread.choose();
    let json = args.json;
    let auth = args.auth.resolve(args.dir.is_some())?;
    let transfer_failed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let hello_timestamps = hello_timestamps(&args, &auth)?;
    let (metrics, metrics_at) = match args.metrics {
        None => (None, None),
        Some(addr) => {
            let metrics = std::sync::Arc::new(ServeMetrics::new());
            let bound = serve_metrics(addr, metrics.clone())
                .with_context(|| format!("cannot serve metrics on {addr}"))?;
            (Some(metrics), Some(bound))
        }
    };
    let mut app: Box<dyn ServeApp> = match &args.dir {
        None => Box::new(NoFiles),
        Some(dir) => file_receiver(dir, &args, &auth, transfer_failed.clone(), metrics.clone())?,
    };
    let server_key = auth.identity.as_ref().map(|k| k.public());
    let allow_plain = auth.allow_plain;
    let config = ServeConfig {
        bind: args.bind,
        // With --dir, `once` means one transfer, which the receiver decides.
        once: args.once && args.dir.is_none(),
        sndbuf: args.sndbuf,
        rcvbuf: args.rcvbuf,
        limits: ServerLimits {
            // The key is read from a file and outlives this run: hellos
            // made before it started are refused (a replay across a
            // restart), less a skew for clocks a little behind.
            replay_floor_ns: crate::proto::endpoint::server::replay_floor(io::wall_clock_ns()),
            ..args.receiver.server_limits(args.rcvbuf)
        },
        auth,
        hello_timestamps,
    };
    let mut write_error = None;
    // Reports carry the server-wide counters at the time they print.
    let mut totals = ServerStats::default();
    let stats = runtime()?.block_on(io::serve(
        config,
        app.as_mut(),
        |event| match event {
            ServeEvent::Listening { addr, buffers } => {
                print_listening(addr, buffers, server_key.as_ref(), allow_plain, &args);
                // After the listening line, which scripts read first.
                if let Some(bound) = metrics_at {
                    eprintln!("atou serve: metrics on http://{bound}/metrics");
                }
            }
            ServeEvent::Report(r) => {
                totals = r.server;
                if let Some(m) = &metrics {
                    m.connection_ended(&r);
                }
                // A transfer's connections are reported by its own lines
                // (the receiver's events), not one by one.
                if r.session != 0 {
                    return;
                }
                let line = if json {
                    serde_json::to_string(&r).unwrap_or_default()
                } else {
                    report_line(&r, &totals)
                };
                if let Err(e) = print_stdout(&(line + "\n")) {
                    write_error.get_or_insert(e);
                }
            }
            ServeEvent::Notice(n) if json => {
                let line = serde_json::json!({"notice": n.to_string()}).to_string();
                let _ = print_stdout(&(line + "\n"));
            }
            ServeEvent::Notice(n) => eprintln!("atou serve: {n}"),
            ServeEvent::HelloTimestampsNotSaved(why) => eprintln!("atou serve: {why}"),
            ServeEvent::RcvbufGrown { asked, granted } => {
                eprintln!("atou serve: socket receive buffer grown for a client: asked {asked}, granted {granted}");
            }
            ServeEvent::ReplayFilterRefused(e) => eprintln!(
                "atou serve: the kernel refused the socket filter that drops replayed hellos \
                 unread ({e}): their copies are read and dropped after a lookup"
            ),
        },
        ctrl_c(),
    ))?;
    if let Some(e) = write_error {
        return Err(e);
    }
    eprintln!("{}", stopped_line(&stats));
    // `--once --dir`: the status says how the one transfer went.
    if args.once && transfer_failed.load(std::sync::atomic::Ordering::Relaxed) {
        return Ok(Exit::Partial.into());
    }
    Ok(ExitCode::SUCCESS)
}

/// The key is read from a file and outlives this run: so does the
/// newest hello timestamp of each client key, kept in DEST's private
/// staging directory, so that a hello accepted before a restart is
/// refused after it. A file that cannot be used stops the server here,
/// before it could accept such a hello (exit 1: it could not run).
fn hello_timestamps(
    args: &ServeArgs,
    auth: &ServerAuth,
) -> Result<Option<crate::io::hello_timestamps::HelloTimestampFile>> {
    match (&args.dir, &auth.identity) {
        (Some(dir), Some(_)) => {
            let root = check_root(dir).map_err(|e| UsageError(e.to_string()))?;
            Ok(Some(crate::io::hello_timestamps::HelloTimestampFile::load(
                &root,
            )?))
        }
        _ => Ok(None),
    }
}

/// `atou serve --dir`'s receiver: a line on stdout as each transfer ends
/// or plans, and `failed` set when one fails.
fn file_receiver(
    dir: &Path,
    args: &ServeArgs,
    auth: &ServerAuth,
    failed: std::sync::Arc<std::sync::atomic::AtomicBool>,
    metrics: Option<std::sync::Arc<ServeMetrics>>,
) -> Result<Box<dyn ServeApp>> {
    let json = args.json;
    let root = check_root(dir).map_err(|e| UsageError(e.to_string()))?;
    let staging = root.join(crate::io::dest_dir::STAGING_DIR);
    let receiver = FileReceiver::new(
        ReceiveConfig {
            root,
            writers: args.writers.unwrap_or_else(|| {
                std::thread::available_parallelism()
                    .map_or(2, |n| n.get())
                    .max(2)
            }),
            once: args.once,
            policy: args.receiver.policy(),
            limits: args.receiver.limits(),
            authorized: auth.authorized.clone(),
        },
        move |event| {
            if let ReceiveEvent::Failed { .. } = event {
                failed.store(true, std::sync::atomic::Ordering::Relaxed);
            }
            if let Some(m) = &metrics {
                m.receive_event(&event);
            }
            let line = receive_event_line(&event, json, &staging);
            let _ = print_stdout(&(line + "\n"));
        },
    )
    .map_err(|e| UsageError(e.to_string()))?;
    Ok(Box::new(receiver))
}

/// What `atou serve --dir` prints of a receiver's event, as a line of
/// text or of JSON.
fn receive_event_line(event: &ReceiveEvent, json: bool, staging: &Path) -> String {
    match (event, json) {
        (ReceiveEvent::Done(r), true) => serde_json::json!({"transfer": r}).to_string(),
        (ReceiveEvent::Done(r), false) => transfer_line(r),
        (ReceiveEvent::Failed { peer, dest, why }, true) => serde_json::json!({
            "failed": {"peer": peer, "dest": dest, "why": why}
        })
        .to_string(),
        (ReceiveEvent::Failed { peer, dest, why }, false) => {
            format!("{peer} transfer into {} failed: {why}", shown_path(dest))
        }
        (
            ReceiveEvent::Planned {
                peer,
                dest,
                files,
                skipped,
            },
            true,
        ) => serde_json::json!({
            "dry_run": {"peer": peer, "dest": dest, "files": files, "skipped": skipped}
        })
        .to_string(),
        (
            ReceiveEvent::StagingCleaned {
                entries,
                bytes,
                ttl,
            },
            true,
        ) => serde_json::json!({
            "staging_cleaned": {"entries": entries, "bytes": bytes, "ttl_secs": ttl.as_secs()}
        })
        .to_string(),
        (
            ReceiveEvent::StagingCleaned {
                entries,
                bytes,
                ttl,
            },
            false,
        ) => {
            format!(
                "removed {entries} abandoned partial files and records ({}) untouched for over {} (--staging-ttl) from {}",
                crate::util::units::format_size(*bytes),
                crate::util::units::format_whole_duration(*ttl),
                shown_path(staging)
            )
        }
        (
            ReceiveEvent::Planned {
                peer,
                dest,
                files,
                skipped,
            },
            false,
        ) => {
            format!(
                "{peer} dry run into {}: {files} files would be sent, {skipped} skipped; nothing written",
                shown_path(dest)
            )
        }
    }
}

/// What `atou serve` says once it listens: where, with which buffers,
/// and under which key.
fn print_listening(
    addr: SocketAddr,
    buffers: io::SocketBuffers,
    server_key: Option<&PublicKey>,
    allow_plain: bool,
    args: &ServeArgs,
) {
    eprintln!(
        "atou serve: listening on {addr} (socket buffers granted: sndbuf {} rcvbuf {})",
        buffers.sndbuf, buffers.rcvbuf
    );
    match server_key {
        Some(key) => eprintln!(
            "atou serve: key {} ({})",
            crate::proto::crypto::format_public_key(key, ""),
            if allow_plain {
                "authenticated clients pin it; plain clients accepted too"
            } else {
                "clients pin it with --server-key or record it on first use"
            }
        ),
        None => eprintln!(
            "atou serve: no key (`atou keygen` makes one): unauthenticated, \
             unencrypted clients only"
        ),
    }
    note_buffer("send", args.sndbuf, buffers.sndbuf, "net.core.wmem_max");
    note_buffer("receive", args.rcvbuf, buffers.rcvbuf, "net.core.rmem_max");
}

/// The line `atou serve` prints when it stops: the whole run's counters.
fn stopped_line(stats: &ServerStats) -> String {
    format!(
        "atou serve: stopped after {} connections; datagrams {} undecodable {} unknown-connection {} \
         unexpected {} refused hellos {}; handshakes {} refused keys {} unopened {} cookies {} \
         unanswered (over an address's share) {} replays {} (dropped unread: {} hellos) over the work queue {} moves {}",
        stats.connections,
        stats.datagrams,
        stats.undecodable,
        stats.unknown_connection,
        stats.unexpected,
        stats.version_rejects + stats.bad_hellos + stats.busy_rejects + stats.plain_refused,
        stats.handshakes,
        stats.auth_refused,
        stats.crypto_dropped + stats.bad_handshakes,
        stats.cookies_sent,
        stats.answers_limited,
        stats.hellos_seen,
        stats.hellos_dropped_unread,
        stats.hellos_queue_full,
        stats.migrations,
    )
}

/// The line `atou serve --dir` prints when a transfer ends.
fn transfer_line(r: &TransferReport) -> String {
    let verified = if r.skipped > 0 && r.skipped_by_checksum {
        "every file verified, the skipped ones found identical by BLAKE3"
    } else if r.skipped > 0 {
        "every file sent verified, the skipped ones on size and mtime alone"
    } else {
        "every file verified"
    };
    let waiting = match r.files_waiting {
        0 => String::new(),
        n => format!(
            " (and {n} file part{} in, waiting for other shards' parts)",
            if n == 1 { "" } else { "s" }
        ),
    };
    format!(
        "{} transfer {:016x} into {}: {} files{waiting}, {} dirs, {} symlinks, {} skipped; {} written, {} resumed; \
         {} chunks rejected and re-sent; {:.2} s; {verified}",
        r.peer,
        r.session,
        shown_path(&r.dest),
        r.files,
        r.dirs,
        r.symlinks,
        r.skipped,
        format_size(r.bytes_written),
        format_size(r.bytes_resumed),
        r.chunks_rejected,
        r.secs
    ) + &if r.xattrs_set + r.xattrs_not_set > 0 {
        format!(
            "; {} xattrs set, {} not set",
            r.xattrs_set, r.xattrs_not_set
        )
    } else {
        String::new()
    }
}

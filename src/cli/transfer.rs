//! `atou send`, `atou copy` and the file side of `atou serve --dir`.

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::Result;
use clap::Args;

use crate::io::xattr::Wanted;
use crate::io::{self, ServeConfig, DEFAULT_PORT};
use crate::report::summary::Summary;
use crate::transfer::dest::{DryRunRoot, ReceivePolicy, Requested, SymlinkPolicy, UserFlags};
use crate::transfer::exclude::Filters;
use crate::transfer::manifest::RelPath;
use crate::transfer::manifest::{read_files_from, Listed};
use crate::transfer::messages::Options;
use crate::transfer::receive::{FileReceiver, ReceiveConfig, ReceiveEvent, ReceiveLimits};
use crate::transfer::remote::{Detoured, PROGRESS_LINE};
use crate::transfer::send::{Progress, SendConfig, SendError, SendReport};
use crate::transfer::shard::Shard;
use crate::util::text::shown_path;
use crate::util::units::{format_rate, format_size, parse_size};

use super::exit::{self, Exit};
use super::net::{resolve, runtime};
use super::path_hint::PathHint;
use super::path_size::{self, PathSize, SizeFrom};
use super::{print_stdout, TuningArgs, UsageError};

/// Read-ahead (sender) and window (receiver) per transfer, over all streams.
pub(super) const DEFAULT_BUFFER: &str = "64MiB";
/// Datagram size when the receiver is on this host (`atou copy` to a
/// local directory, or a send or ssh copy to an address of this host),
/// unless --mss says otherwise: a jumbo frame's, as kernel TCP sizes its
/// MSS from lo's 64 KiB MTU, so that the per-datagram costs (system
/// calls, ACKs, and each seal and open) are paid a sixth as often as at
/// 1472 bytes. Elsewhere the first link's MTU says nothing of the
/// path's: the path is searched for its size (src/cli/path_size.rs).
pub(super) const LOOPBACK_MSS: u32 = 8972;
/// Transport connections per transfer; see docs/transfer.md for how it was chosen.
pub(super) const DEFAULT_STREAMS: usize = 2;

#[derive(Args, Debug)]
pub(super) struct TransferArgs {
    /// Neither use nor update the path cache ($XDG_CACHE_HOME/atou/paths, else ~/.cache/atou/paths): what the last transfer to this host learnt of its path (RTT, ssthresh, bandwidth), kept an hour and used to start the next one faster (default: use it)
    #[arg(long)]
    no_path_cache: bool,
    /// Transport connections at once; chunks are shared out over them, largest files first
    #[arg(long, value_name = "N", default_value_t = DEFAULT_STREAMS, value_parser = parse_streams)]
    streams: usize,
    /// Flows' share the streams take together, beside other traffic on the path: the streams are coupled as N flows (stream i in flow i mod N; N at or above --streams: each stream a flow of its own); bbr only, other --cc are a flow per stream
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = parse_flows)]
    flows: usize,
    /// Memory for data in flight, in bytes (e.g. 64MiB): the sender's read-ahead and the receive window, shared by the streams; at least 2 MiB per stream
    #[arg(long, value_name = "SIZE", default_value = DEFAULT_BUFFER, value_parser = parse_bytes)]
    buffer: u64,
    /// Replace files that already exist at the destination (default: refuse the transfer)
    #[arg(long)]
    overwrite: bool,
    /// Make each directory sent a mirror (rsync's --delete): at the end, once every file is in place, remove from the destination's copy of each directory sent whatever the sender does not send, except what --exclude/--filter rules exclude (protected, as rsync protects it). Only within the directories sent, never DEST itself; nothing is removed if the transfer fails. With -n, lists what it would remove. A server must allow it (`atou serve --allow-delete`, and `delete` on the key's line). Not with --shard or --files-from
    #[arg(long, conflicts_with_all = ["shard", "files_from"])]
    delete: bool,
    /// Leave alone existing files of the same size and modification time (and identical symlinks)
    #[arg(long)]
    skip_existing: bool,
    /// With --skip-existing: skip files whose BLAKE3 matches at the receiver, comparing existing files of the same size by content instead of mtime (as rsync -c); the receiver reads them whole, and of a file that differs only the chunks that differ are sent
    #[arg(long, short = 'c', requires = "skip_existing")]
    checksum: bool,
    /// Leave out entries matching PATTERN (repeatable), by rsync's rules: `*` within a name, `**` across `/`, `?`, `[a-z]`; a trailing `/` matches directories only (not descended into); a leading `/` anchors at the transfer root (SRC's own name first: /data/tmp/); otherwise a PATTERN without `/` matches names at any depth, and one with `/` the end of the path. With --include and --filter: the first rule that matches an entry decides, in command-line order, and an entry no rule matches is sent
    #[arg(long, value_name = "PATTERN", value_parser = in_order)]
    exclude: Vec<InOrder>,
    /// Send entries matching PATTERN even where a later --exclude matches them (repeatable; rsync's rules and order, as --exclude). An excluded directory is not descended into, so to send only `*.c` at any depth: --include='*/' --include='*.c' --exclude='*'
    #[arg(long, value_name = "PATTERN", value_parser = in_order)]
    include: Vec<InOrder>,
    /// One filter rule (repeatable, in order with --exclude and --include): `- PATTERN`, `+ PATTERN`, `exclude PATTERN`, `include PATTERN`, or `!` (also `clear`) to drop every rule before it. rsync's merge files, modifiers and receiver-side rules are refused
    #[arg(long, value_name = "RULE", value_parser = in_order)]
    filter: Vec<InOrder>,
    /// Read exclude patterns from FILE, one per line, in order at this flag's place; blank lines and lines starting with `#` or `;` are skipped, a `+ ` prefix makes a line an include, `- ` an exclude, and `!` clears; `-` reads stdin
    #[arg(long, value_name = "FILE", value_parser = in_order)]
    exclude_from: Vec<InOrder>,
    /// Read include patterns from FILE, as --exclude-from reads excludes
    #[arg(long, value_name = "FILE", value_parser = in_order)]
    include_from: Vec<InOrder>,
    /// Send the paths listed in FILE, one a line, relative to the one SRC (a directory), as `rsync -a -r --files-from`: each arrives as DEST/PATH, the directories on its way as directories (without their other contents), a listed directory whole; blank lines and lines starting with `#` or `;` are skipped, and `DIR/./PATH` sends PATH from SRC/DIR. `-` reads stdin. In a pull or a third-party copy (`HOST:DIR`) the list is read here and sent to the remote sender
    #[arg(long, value_name = "FILE")]
    files_from: Option<PathBuf>,
    /// The --files-from list as read, once (stdin can be read only once).
    #[arg(skip)]
    files_from_text: std::sync::OnceLock<Vec<u8>>,
    /// Send only part K of N of the tree (1 <= K <= N <= 1024), so that N runs with the same SRCs and DEST (on N hosts, or the tasks of a Slurm array or a Kubernetes indexed Job) together send it all: every directory is in every part; a file above total/N (and over 1 MiB) is split by 1 MiB chunk ranges, one range per shard, and takes its name at the receiver when every range is in; every other file and symlink is in exactly one part, whole, dealt out largest first to balance bytes. Default: the whole tree. `auto` takes K and N from a Slurm array task (SLURM_ARRAY_TASK_ID of SLURM_ARRAY_TASK_COUNT, an array 1-N); `auto/N` gives N and takes K from SLURM_ARRAY_TASK_ID or a Kubernetes indexed Job's JOB_COMPLETION_INDEX + 1. See docs/scale-out.md
    #[arg(long, value_name = "K/N", value_parser = shard_from_spec)]
    shard: Option<Shard>,
    /// Ask the receiver what it would do and print it (what would be sent, skipped or refused, and the bytes), then stop: no file data is sent and nothing changes at the destination. The exit status is the real run's (5 if refused); with --json, a list. For sends, pushes, pulls and third-party copies: the source's plan, answered by the destination (in a pull, this end answers and the remote lists)
    #[arg(long, short = 'n')]
    dry_run: bool,
    /// Sync each file to disk at the receiver before renaming it into place
    #[arg(long)]
    fsync: bool,
    /// Compress each 1 MiB chunk with zstd on the reader threads, at a level from 1 to 9 stepped by the measured send rate against the compressors' own; a chunk that does not shrink by a twentieth goes as it is, flagged, and a round whose sample (16 pieces of 32 KiB spread over its bytes) does not shrink by a twentieth goes plain, unframed. BLAKE3 still checks the raw bytes. Files whose bytes are another's of the transfer (same size, then sampled, then hashed whole before sending) are sent once: the receiver writes the others from those chunks, each with its own name, mode and mtime. The receiver's atou must know it, else it refuses the transfer (nothing written). Default: off
    #[arg(long)]
    compress: bool,
    /// Send what symlinks point to instead of the symlinks
    #[arg(long)]
    follow: bool,
    /// Keep hard links (as rsync -H): files sent that are one file (same device and inode) arrive as one file with several names, its bytes sent once; links to files outside what is sent are sent as copies. Not with --shard
    #[arg(long, short = 'H', conflicts_with = "shard")]
    hard_links: bool,
    /// Give each file, directory and symlink its owner at the receiver (as rsync -o): by user name where the receiving host knows the name, by number otherwise. The receiving end must run as root and allow it (`atou serve --allow-owners`; the receiving end of a copy, its own -o). Directories get it where they get their mode: where the transfer creates them, or with --overwrite
    #[arg(long, short = 'o')]
    owner: bool,
    /// Give each entry its group at the receiver (as rsync -g), by name as -o; needs what -o needs
    #[arg(long, short = 'g')]
    group: bool,
    /// With -o / -g: owners and groups by number, never mapped by name (as rsync --numeric-ids)
    #[arg(long)]
    numeric_ids: bool,
    /// Keep extended attributes (as rsync -X): `user.*` always, and `security.*` and `trusted.*` where this end runs as root; set at the receiver on each file, directory and symlink before it takes its name (Linux refuses `user.*` on a symlink: a warning). An attribute the receiving file system refuses is a warning, counted, not a failed transfer. The receiving end must allow it (`atou serve --allow-xattrs`; the receiving end of a copy, its own -X, and -p too for `security.*` and `trusted.*`: `security.capability` grants privileges as a setuid bit does). At most 64 KiB a value, 1 MiB an entry, 16 MiB a transfer
    #[arg(long, short = 'X')]
    xattrs: bool,
    /// Keep POSIX ACLs (as rsync -A), access and default, as their binary attributes: named users and groups by number (as --numeric-ids; rsync maps them by name). An ACL of only owner, group and other is the mode and carries nothing. The receiving end must allow it (`atou serve --allow-acls`; the receiving end of a copy, its own -A)
    #[arg(long, short = 'A')]
    acls: bool,
    /// Reader threads (default: one per core, at least 2)
    #[arg(long, value_name = "N")]
    readers: Option<usize>,
    /// No progress display, and no report text (errors still show)
    #[arg(long, short)]
    quiet: bool,
    /// Progress for people (auto: bars on a terminal, a line every 5 s otherwise) or for
    /// machines (json: JSON Lines on stdout every --progress-interval, even with --quiet; see below)
    #[arg(long, value_name = "MODE", value_enum, default_value_t = ProgressMode::Auto)]
    progress: ProgressMode,
    /// Time between --progress json lines (bare number = seconds; e.g. 0.5 or 500ms)
    #[arg(long, value_name = "SECS", default_value = "1", value_parser = parse_interval)]
    progress_interval: Duration,
    /// A third-party copy's source: progress as `ATOU-PROGRESS DONE TOTAL
    /// STAGE` lines on stdout, for the host running the copy to draw
    #[arg(long, hide = true)]
    progress_lines: bool,
    /// How long to keep trying, in seconds (or with a unit: 5min), while the receiver says it is busy (at its limit of transfers or connections), with pauses of 0.5 s growing to 8 s, jittered; progress shows "waiting for the server"; then exit 10. 0: give up at once
    #[arg(long, value_name = "SECS", default_value = "300", value_parser = parse_wait)]
    wait_busy: Duration,
    /// Print the final report as JSON on stdout
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    tuning: TuningArgs,
    #[command(flatten)]
    auth: super::auth::ClientAuthArgs,
}

#[derive(Args, Debug)]
#[command(after_help = format!("Examples:\n  \
    atou send data/ results.tar server.example.org\n  \
    atou send big.img 10.0.0.2:7891:incoming --streams 4 --recovery sack\n  \
    atou send tree/ '[2001:db8::2]:7890:backup' --skip-existing\n\n\
    Each SRC arrives as DEST/SUBDIR/NAME, NAME being its last component, with modes and mtimes \
    kept. The tuning flags apply to each connection; --rcvsegs defaults to each stream's share \
    of --buffer (and may only be smaller), and --maxtime/--maxpkts do not apply. A numeric SUBDIR needs the port spelled out (host:7890:2024). \
    With --json, the report on stdout carries the status as a word (\"status\": \"ok\", \"refused\", ...) \
    and a number (\"exit\"), also when the transfer fails. A failed or interrupted transfer \
    resumes when the same command is run again. \
    Flags can be set per host: `Host` blocks in ~/.config/atou/config, then /etc/atou/config, as \
    ssh_config (`streams 8`, `cc cubic`); typed flags win, and --show-config HOST lists what \
    applies.\n\n\
    --progress json makes stdout JSON Lines, as iperf3 --json-stream: every --progress-interval \
    an {{\"event\": \"interval\"}} object (time in s since the start, stage, bytes acknowledged \
    and total to send this run, rate_bps since the line before, the files being sent, and per \
    stream its bytes, cwnd and ssthresh in segments, srtt_ms and rxmts), then an \"end\" object \
    (rate_bps over the run, status and exit), then the --json report, if asked, on one line. \
    People's messages and errors stay on stderr.\n\n{}", Exit::table()))]
pub(super) struct SendArgs {
    /// Files and directories to send
    #[arg(value_name = "SRC", required = true, num_args = 1..)]
    sources: Vec<PathBuf>,
    /// The receiver, an `atou serve --dir DEST`: HOST, HOST:PORT or HOST:PORT:SUBDIR (default port 7890)
    #[arg(value_name = "HOST[:PORT][:SUBDIR]")]
    dest: String,
    /// Print the per-host settings that apply to HOST (`Host` blocks of
    /// ~/.config/atou/config, then /etc/atou/config) and the file and line
    /// each comes from, then exit
    #[arg(long, value_name = "HOST", exclusive = true)]
    show_config: Option<String>,
    #[command(flatten)]
    transfer: TransferArgs,
    #[command(flatten)]
    output: super::plot::SendOutputArgs,
}

#[derive(Args, Debug)]
#[command(after_help = format!("Examples:\n  \
    atou copy dataset/ /mnt/scratch\n  \
    atou copy a.bin b.bin alice@server.example.org:incoming      # push over ssh\n  \
    atou copy server.example.org:results/run7 ./runs             # pull over ssh\n  \
    atou copy dtn1:/data/run7 dtn2:/archive                      # third-party: dtn1 to dtn2\n  \
    atou copy tree/ gpu1:/scratch --ssh 'ssh -p 2222' --port 7000-7010\n\n\
    A SRC or DEST with a colon before any slash is remote, as in scp: [USER@]HOST:PATH, PATH \
    relative to the remote user's home (`./a:b` is a local name). atou runs the other end \
    with ssh (`--ssh`; ~/.ssh/config, agents, ProxyJump and known_hosts apply), which needs \
    atou installed there (`--remote-atou`); the two ends trade one-time keys over ssh and \
    move the data over UDP (`--port`), each end pinning the other's key. Every SRC of a \
    pull is on one host. With SRC and DEST both remote it is a third-party copy: the source \
    host sends straight to the destination over UDP, started and watched from here (or \
    through here: --via-local). Anything else is a local directory (created if missing): atou \
    runs the receiver itself over loopback UDP. Each SRC arrives as DEST/NAME. Flags as for \
    `atou send`, per-host settings too (--show-config HOST); to send to a running \
    `atou serve --dir`, use `atou send`.\n\n{}", Exit::table()))]
pub(super) struct CopyArgs {
    /// Files and directories to copy: local paths, or [USER@]HOST:PATH on one host (a pull, or a third-party copy when DEST is remote too)
    #[arg(value_name = "SRC", required = true, num_args = 1..)]
    sources: Vec<PathBuf>,
    /// A local directory, or [USER@]HOST:PATH (a push, or a third-party copy)
    #[arg(value_name = "DEST")]
    dest: String,
    /// Print the per-host settings that apply to HOST (`Host` blocks of
    /// ~/.config/atou/config, then /etc/atou/config) and the file and line
    /// each comes from, then exit
    #[arg(long, value_name = "HOST", exclusive = true)]
    show_config: Option<String>,
    #[command(flatten)]
    transfer: TransferArgs,
    #[command(flatten)]
    receiving: ReceivingArgs,
    #[command(flatten)]
    ssh: super::remote::SshArgs,
}

/// `atou copy`'s flags for the end that receives: this host for a local
/// copy or a pull, the remote for a push. They are that end's own rules,
/// whatever the sending end asks.
#[derive(Args, Debug, Clone, Copy)]
#[command(next_help_heading = "The receiving end's rules (a local DEST, or the remote of a push)")]
pub(super) struct ReceivingArgs {
    /// Keep setuid, setgid and sticky bits as sent, as rsync's -p does for root (default: cleared; other permission bits are kept as sent)
    #[arg(long, short = 'p')]
    pub perms: bool,
    /// Symlinks the receiving end creates: `safe` only relative ones that stay inside DEST, judged where they lead (rsync's --safe-links), `all` any, `none` no symlinks; others refuse the copy
    #[arg(long, value_name = "POLICY", default_value = "safe", value_parser = super::net::parse_symlinks)]
    pub symlinks: SymlinkPolicy,
}

impl ReceivingArgs {
    /// The receiving end's policy, from its own flags alone: these, and
    /// whether it lets files be replaced (`--overwrite`) or removed
    /// (`--delete`) and syncs them.
    pub(super) fn policy(
        &self,
        overwrite: bool,
        delete: bool,
        owners: bool,
        xattrs: Wanted,
        fsync: bool,
        requested: Option<Requested>,
    ) -> ReceivePolicy {
        ReceivePolicy::user(
            UserFlags {
                overwrite,
                special_bits: self.perms,
                symlinks: self.symlinks,
                fsync,
                delete,
                owners,
                xattrs: xattrs.xattrs,
                acls: xattrs.acls,
            },
            requested,
        )
    }

    /// The flags that give the far end of a push the same rules; only
    /// those that differ from the default, so an older atou there that
    /// knows none of them still takes a default copy.
    pub(super) fn remote_args(&self) -> Vec<String> {
        let mut a = Vec::new();
        if self.perms {
            a.push("--perms".to_string());
        }
        if self.symlinks != SymlinkPolicy::Safe {
            a.push(format!(
                "--symlinks={}",
                super::net::symlinks_name(self.symlinks)
            ));
        }
        a
    }
}

/// `--progress`: who the progress is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(super) enum ProgressMode {
    Auto,
    Json,
}

fn parse_interval(s: &str) -> Result<Duration, String> {
    match crate::util::units::parse_duration(s, crate::util::units::TimeUnit::Seconds)
        .map_err(|e| e.to_string())?
    {
        d if d >= Duration::from_millis(10) => Ok(d),
        _ => Err(format!("`{s}`: a progress interval is at least 10ms")),
    }
}

fn parse_wait(s: &str) -> Result<Duration, crate::util::units::UnitError> {
    crate::util::units::parse_duration(s, crate::util::units::TimeUnit::Seconds)
}

/// `--shard`: K/N, or `auto` read from this process's scheduler
/// ([`Shard::from_spec`]), when the command line is parsed, so that a bad
/// variable is a usage error (exit 2) before anything is walked.
fn shard_from_spec(s: &str) -> Result<Shard, String> {
    Shard::from_spec(s, |name| std::env::var(name).ok())
}

fn parse_streams(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n @ 1..=64) => Ok(n),
        _ => Err(format!("`{s}` is not a number of streams from 1 to 64")),
    }
}

fn parse_flows(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n @ 1..=64) => Ok(n),
        _ => Err(format!("`{s}` is not a number of flows from 1 to 64")),
    }
}

fn parse_bytes(s: &str) -> Result<u64, crate::util::units::UnitError> {
    parse_size(s)
}

/// `HOST[:PORT][:SUBDIR]` split into the host (with port) and the subdir.
fn split_remote(dest: &str) -> Result<(String, Option<RelPath>)> {
    let (host, rest) = if let Some(inner) = dest.strip_prefix('[') {
        let (addr, rest) = inner.split_once(']').ok_or_else(|| {
            UsageError(format!("`{dest}`: an IPv6 address needs its closing `]`"))
        })?;
        (format!("[{addr}]"), rest.strip_prefix(':').unwrap_or(rest))
    } else {
        match dest.split_once(':') {
            Some((h, rest)) => (h.to_string(), rest),
            None => (dest.to_string(), ""),
        }
    };
    if host.is_empty() || host == "[]" {
        return Err(UsageError(format!("`{dest}` names no host")).into());
    }
    let (port, subdir) = match rest.split_once(':') {
        Some((p, s)) if p.chars().all(|c| c.is_ascii_digit()) && !p.is_empty() => (Some(p), s),
        Some(_) => (None, rest),
        None if !rest.is_empty() && rest.chars().all(|c| c.is_ascii_digit()) => (Some(rest), ""),
        None => (None, rest),
    };
    let port: u16 = match port {
        Some(p) => p
            .parse()
            .map_err(|_| UsageError(format!("`{p}` in `{dest}` is not a port number")))?,
        None => DEFAULT_PORT,
    };
    let subdir = subdir.trim_start_matches("./").trim_end_matches('/');
    let subdir = if subdir.is_empty() || subdir == "." {
        None
    } else {
        Some(
            RelPath::new(subdir.as_bytes().to_vec())
                .map_err(|e| UsageError(format!("destination subdirectory in `{dest}`: {e}")))?,
        )
    };
    Ok((format!("{host}:{port}"), subdir))
}

/// scp's rule: a colon before any slash makes DEST remote.
pub(super) fn is_remote(dest: &str) -> bool {
    match dest.find(':') {
        Some(colon) => !dest[..colon].contains('/'),
        None => false,
    }
}

/// [`LOOPBACK_MSS`] when `peer` is an address of this host whose route
/// carries datagrams that large.
fn this_host_mss(peer: SocketAddr) -> Option<u32> {
    let ip_udp_header = if peer.is_ipv6() { 48 } else { 28 };
    crate::io::this_host_mtu(peer)
        .filter(|mtu| *mtu >= LOOPBACK_MSS + ip_udp_header)
        .map(|_| LOOPBACK_MSS)
}

pub(super) fn readers(n: Option<usize>) -> usize {
    n.unwrap_or_else(|| {
        thread::available_parallelism()
            .map_or(2, |n| n.get())
            .max(2)
    })
}

/// A value of a flag whose place among other flags matters (the filter
/// rules): clap parses the command line from left to right, calling the
/// value parser as it meets each value, so a count taken there is the
/// value's place on the line.
#[derive(Debug, Clone)]
pub(crate) struct InOrder {
    place: u64,
    text: String,
}

fn in_order(text: &str) -> std::result::Result<InOrder, String> {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    Ok(InOrder {
        place: NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        text: text.to_string(),
    })
}

/// A --files-from list for a remote sender ([`TransferArgs::remote_list`]).
pub(super) struct RemoteList {
    /// The list as read here.
    pub text: Vec<u8>,
    /// The names the sender may send: the list's first components.
    pub names: Vec<Vec<u8>>,
}

impl TransferArgs {
    /// The paths of --files-from, relative to the one SRC; `None` without it.
    fn listed(&self, sources: &[PathBuf]) -> Result<Option<Vec<Listed>>> {
        let Some(list) = &self.files_from else {
            return Ok(None);
        };
        let base =
            match sources {
                [base] if base.is_dir() => base,
                _ => return Err(UsageError(
                    "--files-from: give one SRC, the directory the listed paths are relative to"
                        .into(),
                )
                .into()),
            };
        let text = self.files_from_text(list)?;
        let listed = read_files_from(text, base, list)
            .map_err(|e| UsageError(format!("--files-from: {e}")))?;
        if listed.is_empty() {
            return Err(
                UsageError(format!("--files-from: {} lists no path", shown_path(list))).into(),
            );
        }
        Ok(Some(listed))
    }

    /// The --files-from list `list` as read, read once (stdin can be read
    /// only once).
    fn files_from_text(&self, list: &Path) -> Result<&[u8]> {
        if let Some(text) = self.files_from_text.get() {
            return Ok(text);
        }
        let text = if list.as_os_str() == "-" {
            let mut text = Vec::new();
            std::io::Read::read_to_end(&mut std::io::stdin(), &mut text)
                .map_err(|e| UsageError(format!("--files-from -: cannot read stdin: {e}")))?;
            text
        } else {
            std::fs::read(list).map_err(|e| {
                UsageError(format!(
                    "--files-from: cannot read {}: {e}",
                    shown_path(list)
                ))
            })?
        };
        Ok(self.files_from_text.get_or_init(|| text))
    }

    /// --files-from with a remote SRC (a pull, a third-party copy): the
    /// list's text, for the remote sender, and the names it may send (the
    /// list's first components, as the remote's walk gives them); `None`
    /// without --files-from. `paths`: the remote SRCs, of which there
    /// must be one, the directory the list is relative to.
    pub(super) fn remote_list(&self, paths: &[String]) -> Result<Option<RemoteList>> {
        let Some(list) = &self.files_from else {
            return Ok(None);
        };
        let [base] = paths else {
            return Err(UsageError(
                "--files-from: give one remote SRC, the directory the listed paths are relative to"
                    .into(),
            )
            .into());
        };
        let text = self.files_from_text(list)?;
        let listed = read_files_from(text, Path::new(base), list)
            .map_err(|e| UsageError(format!("--files-from: {e}")))?;
        if listed.is_empty() {
            return Err(
                UsageError(format!("--files-from: {} lists no path", shown_path(list))).into(),
            );
        }
        let tops = crate::transfer::manifest::listed_tops(&listed);
        Ok(Some(RemoteList {
            text: text.to_vec(),
            names: tops,
        }))
    }

    /// The far end of a pull: the --files-from list the local end sent
    /// on stdin, in place of a file here.
    pub(super) fn set_files_from_sent(&mut self, text: Vec<u8>) {
        self.files_from = Some(PathBuf::from(
            "(the --files-from list sent by the local end)",
        ));
        self.files_from_text = std::sync::OnceLock::from(text);
    }

    /// --exclude, --include, --filter and the rule files, in their order
    /// on the command line (rsync's: the first rule that matches decides).
    fn filters(&self) -> Result<Filters> {
        #[derive(Clone, Copy)]
        enum Flag {
            Exclude,
            Include,
            Filter,
            ExcludeFrom,
            IncludeFrom,
        }
        let mut given: Vec<(Flag, &InOrder)> = [
            (Flag::Exclude, &self.exclude),
            (Flag::Include, &self.include),
            (Flag::Filter, &self.filter),
            (Flag::ExcludeFrom, &self.exclude_from),
            (Flag::IncludeFrom, &self.include_from),
        ]
        .into_iter()
        .flat_map(|(flag, values)| values.iter().map(move |v| (flag, v)))
        .collect();
        given.sort_by_key(|(_, v)| v.place);
        let mut filters = Filters::default();
        for (flag, v) in given {
            let text = v.text.as_str();
            let (added, name) = match flag {
                Flag::Exclude => (filters.add_exclude(text), "--exclude"),
                Flag::Include => (filters.add_include(text), "--include"),
                Flag::Filter => (filters.add_rule(text), "--filter"),
                Flag::ExcludeFrom | Flag::IncludeFrom => {
                    let include = matches!(flag, Flag::IncludeFrom);
                    let name = if include {
                        "--include-from"
                    } else {
                        "--exclude-from"
                    };
                    let file = Path::new(text);
                    let lines = if text == "-" {
                        std::io::read_to_string(std::io::stdin())
                            .map_err(|e| UsageError(format!("{name} -: cannot read stdin: {e}")))?
                    } else {
                        std::fs::read_to_string(file).map_err(|e| {
                            UsageError(format!("{name}: cannot read {}: {e}", shown_path(file)))
                        })?
                    };
                    let shown = shown_path(file).to_string();
                    (filters.add_lines(&lines, &shown, include), name)
                }
            };
            added.map_err(|e| UsageError(format!("{name}: {e}")))?;
        }
        Ok(filters)
    }

    /// The transfer's settings; the datagram size is [`LOOPBACK_MSS`]
    /// when `peer` is this host and the user did not set one.
    fn config(
        &self,
        peer: SocketAddr,
        host: String,
        subdir: Option<RelPath>,
    ) -> Result<SendConfig> {
        let (mut tuning, notes) = self.tuning.resolve()?;
        if !self.tuning.sets("mss") {
            if let Some(mss) = this_host_mss(peer) {
                tuning.mss = mss;
            }
        }
        for note in notes {
            eprintln!("atou: {note}");
        }
        if !tuning.maxtime.is_zero() || tuning.maxpkts != 0 {
            return Err(UsageError(
                "--maxtime and --maxpkts end a probe early; a transfer ends when its files are sent"
                    .to_string(),
            )
            .into());
        }
        // --bwlimit caps the transfer: each connection gets its share.
        if tuning.bwlimit > 0 {
            tuning.bwlimit = (tuning.bwlimit / self.streams as u64).max(1);
        }
        let per_stream = self.buffer / self.streams as u64;
        let min = 2 * (crate::transfer::hash::CHUNK_SIZE + 32);
        if per_stream < min {
            return Err(UsageError(format!(
                "--buffer {} is too small for {} streams: at least {} each (two 1 MiB chunks)",
                format_size(self.buffer),
                self.streams,
                format_size(min)
            ))
            .into());
        }
        // The window each stream asks for is its share of the buffer,
        // unless --rcvsegs asked for less.
        let payload = tuning.payload_size() as u64;
        let want = (per_stream / payload).min(u64::from(u32::MAX)) as u32;
        if tuning.rcvsegs != crate::proto::Tuning::command_default().rcvsegs {
            let need = min.div_ceil(payload) as u32;
            if tuning.rcvsegs < need {
                return Err(UsageError(format!(
                    "--rcvsegs {} is too small for a file transfer: the window must hold two \
                     1 MiB chunks, {need} segments of {payload} bytes",
                    tuning.rcvsegs
                ))
                .into());
            }
            tuning.rcvsegs = tuning.rcvsegs.min(want.max(need));
        } else {
            tuning.rcvsegs = want;
        }
        Ok(SendConfig {
            peer,
            host,
            subdir,
            tuning,
            options: Options {
                overwrite: self.overwrite,
                skip_existing: self.skip_existing,
                fsync: self.fsync,
                checksum: self.checksum,
                dry_run: self.dry_run,
                // The plan sets it from SendConfig::shard: one place.
                shard: false,
                // The plan sets it where the finish can go ahead.
                finish_ahead: false,
                compress: self.compress,
                delete: self.delete,
            },
            follow: self.follow,
            hard_links: self.hard_links,
            keep_owners: crate::transfer::send::KeepOwners {
                user: self.owner,
                group: self.group,
                numeric: self.numeric_ids,
            },
            keep_xattrs: self.keeps_xattrs(),
            filters: self.filters()?,
            // Set with the sources, in run_send_from.
            files_from: None,
            shard: self.shard,
            streams: self.streams,
            flows: self.flows,
            buffer: self.buffer,
            readers: readers(self.readers),
            auth: None,
            trace: None,
            path_memory: None,
            wait_busy: self.wait_busy,
            route: None,
        })
    }
}

/// `--progress-lines`: a [`PROGRESS_LINE`] line on stdout every 250 ms
/// until `done` is set.
fn progress_lines(progress: Arc<Progress>, done: Arc<Mutex<bool>>) {
    while !*done.lock().expect("progress lock") {
        thread::sleep(Duration::from_millis(250));
        let line = format!(
            "{PROGRESS_LINE} {} {} {}\n",
            progress.done.load(Ordering::Relaxed),
            progress.total.load(Ordering::Relaxed),
            progress.stage.lock().expect("progress lock"),
        );
        // A reader that went away does not stop the transfer.
        let _ = print_stdout(&line);
    }
}

/// Shows progress on stderr until `done` is set: bars on a terminal, a
/// line every few seconds otherwise.
pub(super) fn show_progress(progress: Arc<Progress>, done: Arc<Mutex<bool>>, tty: bool) {
    let started = Instant::now();
    if tty {
        use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
        let multi = MultiProgress::new();
        let bar = multi.add(ProgressBar::new(0));
        bar.set_style(
            ProgressStyle::with_template(
                "{msg:>12} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} ETA {eta}",
            )
            .expect("a valid template")
            .progress_chars("=> "),
        );
        let files = multi.add(ProgressBar::new_spinner());
        while !*done.lock().expect("progress lock") {
            bar.set_length(progress.total.load(Ordering::Relaxed));
            bar.set_position(progress.done.load(Ordering::Relaxed));
            bar.set_message(progress.stage.lock().expect("progress lock").clone());
            let mut current = progress.current.lock().expect("progress lock").clone();
            current.dedup();
            let current = current.join(", ");
            files.set_message(current);
            files.tick();
            thread::sleep(Duration::from_millis(100));
        }
        bar.finish_and_clear();
        files.finish_and_clear();
        return;
    }
    let mut last = Instant::now();
    let mut last_done = 0;
    while !*done.lock().expect("progress lock") {
        thread::sleep(Duration::from_millis(100));
        if last.elapsed() < Duration::from_secs(5) {
            continue;
        }
        let d = progress.done.load(Ordering::Relaxed);
        let t = progress.total.load(Ordering::Relaxed);
        let rate = (d - last_done.min(d)) as f64 * 8.0 / last.elapsed().as_secs_f64();
        eprintln!(
            "atou: {:.0} s: {} of {} sent, {} ({})",
            started.elapsed().as_secs_f64(),
            format_size(d),
            format_size(t),
            format_rate(rate),
            progress.stage.lock().expect("progress lock")
        );
        last = Instant::now();
        last_done = d;
    }
}

/// One `--progress json` line: what [`show_progress`] shows, and each
/// stream's transport (as iperf3 --json-stream's intervals). `rate_bps`
/// is over the time since the line before.
fn progress_line(p: &Progress, event: &str, secs: f64, rate_bps: f64) -> serde_json::Value {
    let streams: Vec<serde_json::Value> = p
        .streams
        .lock()
        .expect("progress lock")
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let ssthresh = s.ssthresh.load(Ordering::Relaxed);
            serde_json::json!({
                "stream": i + 1,
                "bytes": s.bytes.load(Ordering::Relaxed),
                "cwnd": s.cwnd.load(Ordering::Relaxed),
                // None yet (still in slow start): null.
                "ssthresh": (ssthresh != u64::MAX).then_some(ssthresh),
                "srtt_ms": s.srtt_us.load(Ordering::Relaxed) as f64 / 1e3,
                "rxmts": s.rxmts.load(Ordering::Relaxed),
            })
        })
        .collect();
    let mut files = p.current.lock().expect("progress lock").clone();
    files.dedup();
    serde_json::json!({
        "event": event,
        "time": (secs * 1e3).round() / 1e3,
        "stage": p.stage.lock().expect("progress lock").clone(),
        "bytes": p.done.load(Ordering::Relaxed),
        "total": p.total.load(Ordering::Relaxed),
        "rate_bps": rate_bps.round(),
        "streams": streams,
        "files": files,
    })
}

/// `--progress json`: a line on stdout every `every` until `done` is set.
fn json_progress(
    progress: Arc<Progress>,
    done: Arc<Mutex<bool>>,
    started: Instant,
    every: Duration,
) {
    let mut last = (started, 0u64);
    loop {
        let next = last.0 + every;
        while Instant::now() < next {
            if *done.lock().expect("progress lock") {
                return;
            }
            thread::sleep((next - Instant::now()).min(Duration::from_millis(50)));
        }
        let now = Instant::now();
        let d = progress.done.load(Ordering::Relaxed);
        let rate = (d - last.1.min(d)) as f64 * 8.0 / (now - last.0).as_secs_f64();
        let line = progress_line(&progress, "interval", (now - started).as_secs_f64(), rate);
        // A reader that went away does not stop the transfer.
        let _ = print_stdout(&format!("{line}\n"));
        last = (now, d);
    }
}

/// The clauses a report line adds for what was already there and what
/// was sent again, at either end.
pub(super) fn not_sent_and_resent(
    bytes_there: u64,
    files_skipped: u64,
    chunks_again: u64,
) -> String {
    let mut s = String::new();
    if bytes_there > 0 || files_skipped > 0 {
        s += &format!(
            "; {} not sent (already there: {} file{} skipped, the rest resumed)",
            format_size(bytes_there),
            files_skipped,
            if files_skipped == 1 { "" } else { "s" }
        );
    }
    if chunks_again > 0 {
        s += &format!("; {chunks_again} chunks failed their check and were sent again");
    }
    s
}

/// A send's `--json` report with its connections' summaries as `streams`.
fn with_streams(mut report: serde_json::Value, streams: &[Summary]) -> Result<serde_json::Value> {
    if let Some(m) = report.as_object_mut() {
        m.insert("streams".into(), serde_json::to_value(streams)?);
    }
    Ok(report)
}

/// The `--json` report's `path_mtu`: the size the transfer used, and how
/// it was chosen.
fn with_path(mut report: serde_json::Value, path: &PathSize) -> Result<serde_json::Value> {
    if let Some(m) = report.as_object_mut() {
        m.insert("path_mtu".into(), serde_json::to_value(path)?);
    }
    Ok(report)
}

fn report_text(r: &SendReport, streams: &[Summary], path: &PathSize) -> String {
    let mut s = format!(
        "atou: sent {} file{}{} ({} dir{}, {} symlink{}) to {}: {} in {:.2} s, {}",
        r.files,
        if r.files == 1 { "" } else { "s" },
        r.shard
            .as_ref()
            .map_or(String::new(), |k| format!(" of shard {k}")),
        r.dirs,
        if r.dirs == 1 { "" } else { "s" },
        r.symlinks,
        if r.symlinks == 1 { "" } else { "s" },
        r.host,
        format_size(r.bytes_sent),
        r.secs,
        format_rate(r.goodput_bps),
    );
    s += &not_sent_and_resent(r.bytes_skipped, r.skipped_files, r.chunks_resent);
    if let Some(c) = &r.compress {
        s += &format!(
            "; compressed to {} on the wire ({:.2}x)",
            format_size(c.wire_bytes),
            c.ratio
        );
        if c.sent_plain > 0 {
            s += &format!(
                ", {} of it sent as it is (a sample did not shrink)",
                format_size(c.sent_plain)
            );
        }
    }
    s += &xattrs_sent(r, "; ");
    if r.copied_files > 0 {
        s += &format!(
            "; {} file{} ({}) the same as another sent once, written there from it",
            r.copied_files,
            if r.copied_files == 1 { "" } else { "s" },
            format_size(r.bytes_copied)
        );
    }
    if r.files_in_part > 0 {
        s += &format!(
            "; {} of them in part (split across the shards: {} takes its name when every \
             shard's part is in)",
            r.files_in_part,
            if r.files_in_part == 1 { "it" } else { "each" }
        );
    }
    if r.skipped_files > 0 {
        // --skip-existing compared size and mtime, not contents: say so.
        s += &format!(
            "\natou: every file sent was verified at the receiver (BLAKE3 per chunk and per file); \
             {} file{} already there {} skipped on size and mtime alone (contents not compared)\n",
            r.skipped_files,
            if r.skipped_files == 1 { "" } else { "s" },
            if r.skipped_files == 1 { "was" } else { "were" },
        );
    } else if r.files_in_part > 0 {
        s += "\natou: every file verified at the receiver (BLAKE3 per chunk and per file; a \
              file's part per chunk and as a whole)\n";
    } else {
        s += "\natou: every file verified at the receiver (BLAKE3 per chunk and per file)\n";
    }
    if let Some(d) = &r.deleted {
        s += &format!(
            "atou: deleted {} entr{} at the destination that the sender does not have (--delete)\n",
            d.total,
            if d.total == 1 { "y" } else { "ies" }
        );
    }
    s += &format!("atou: {}\n", path.text());
    for (i, t) in streams.iter().enumerate() {
        s += &format!(
            "stream {}: {} in {:.2} s, {}; segments {} rxmts {} timeouts {} srtt {:.3} ms cwnd {}",
            i + 1,
            format_size(t.bytes),
            t.secs,
            format_rate(t.goodput_bps),
            t.pkts_out,
            t.rxmts,
            t.timeouts,
            t.srtt.as_secs_f64() * 1e3,
            t.cwnd,
        );
        if t.spurious_rxmts > 0 {
            s += &format!(" spurious {}", t.spurious_rxmts);
        }
        s += "\n";
    }
    s
}

/// A dry run's answer for people, on stdout as rsync -n lists it: one
/// line per file (what, how much, name), then the totals. Names come
/// escaped from the report: a name cannot drive the terminal.
fn dry_run_text(r: &SendReport) -> String {
    let files = r.dry_run.as_deref().unwrap_or_default();
    let mut s = String::new();
    for f in files {
        let how = if f.action == "send" && f.send_bytes < f.size {
            format!("{} of {}", format_size(f.send_bytes), format_size(f.size))
        } else {
            format_size(f.size)
        };
        let part = f.part.map_or(String::new(), |[first, end]| {
            format!(
                "  (chunks {first}..{end} of {}: its part)",
                f.size.div_ceil(crate::transfer::hash::CHUNK_SIZE)
            )
        });
        s += &format!("{:<5} {:>22}  {}{part}\n", f.action, how, f.path);
    }
    let mut deleting = String::new();
    if let Some(d) = &r.deleted {
        // rsync -n --delete's words, before the summary.
        for path in &d.listed {
            s += &format!("deleting {path}\n");
        }
        let more = d.total.saturating_sub(d.listed.len() as u64);
        if more > 0 {
            s += &format!("deleting … and {more} more\n");
        }
        deleting = format!(
            ", delete {} entr{} the sender does not have",
            d.total,
            if d.total == 1 { "y" } else { "ies" }
        );
    }
    let sent = files.iter().filter(|f| f.action == "send").count();
    let part = r.shard.as_ref().map_or(String::new(), |k| {
        format!(" (shard {k}, its part of the tree)")
    });
    let copying = if r.copied_files > 0 {
        format!(
            ", write {} from the same bytes sent for another ({})",
            r.copied_files,
            format_size(r.bytes_copied)
        )
    } else {
        String::new()
    };
    let copying = copying + &xattrs_sent(r, ", ");
    s += &format!(
        "dry run{part}: would send {} of {} file{} ({} of {}){copying}, skip {} ({} already \
         there), with {} dir{} and {} symlink{}, to {}{deleting}; nothing was sent\n",
        sent,
        files.len(),
        if files.len() == 1 { "" } else { "s" },
        format_size(r.bytes_sent),
        format_size(r.bytes_total),
        files.len() - sent - r.copied_files as usize,
        format_size(r.bytes_skipped),
        r.dirs,
        if r.dirs == 1 { "" } else { "s" },
        r.symlinks,
        if r.symlinks == 1 { "" } else { "s" },
        crate::util::text::escape(r.host.as_bytes()),
    );
    s
}

/// `-X` / `-A`: what the plan carried, for the summary (the receiver
/// says what it set).
fn xattrs_sent(r: &SendReport, sep: &str) -> String {
    if r.xattrs_sent == 0 {
        return String::new();
    }
    format!(
        "{sep}with {} extended attribute{} or ACL{} of {} entr{}",
        r.xattrs_sent,
        if r.xattrs_sent == 1 { "" } else { "s" },
        if r.xattrs_sent == 1 { "" } else { "s" },
        r.xattr_entries,
        if r.xattr_entries == 1 { "y" } else { "ies" },
    )
}

/// Runs a send and reports it; the exit code.
fn run_send(
    sources: &[PathBuf],
    config: SendConfig,
    args: &TransferArgs,
    pinned_key: Option<[u8; 32]>,
) -> Result<ExitCode> {
    let host = config.host.clone();
    run_send_from(
        sources,
        config,
        args,
        pinned_key,
        &[],
        Arc::new(Progress::default()),
        OnFailure::explain(|e| {
            silent_from_the_start(e).then(|| format!("{}; {e}", io::no_udp_reply(&host)))
        }),
    )
}

/// Whether the receiver never answered the hello: not one datagram came
/// back from it.
fn silent_from_the_start(e: &SendError) -> bool {
    use crate::proto::endpoint::client::Stage;
    matches!(
        e,
        SendError::Conn(io::ProbeError::Conn {
            error: crate::proto::ConnError::Idle {
                stage: Stage::Hello | Stage::Handshake,
                ..
            },
            ..
        })
    )
}

/// What a caller of [`run_send_from`] makes of a failure.
pub(super) struct OnFailure<'a> {
    /// A better message than the error's own, if it has one.
    explain: Explain<'a>,
    /// Given a failure before any datagram from the receiver: where to
    /// send again (the ssh tunnel's stand-in for the receiver, issue 29),
    /// or the error to report instead.
    detour: Detour<'a>,
}

type Explain<'a> = Box<dyn Fn(&SendError) -> Option<String> + 'a>;
type Detour<'a> = Box<dyn FnOnce(&SendError) -> Option<Result<Detoured, SendError>> + 'a>;

impl<'a> OnFailure<'a> {
    pub(super) fn explain(explain: impl Fn(&SendError) -> Option<String> + 'a) -> OnFailure<'a> {
        OnFailure {
            explain: Box::new(explain),
            detour: Box::new(|_| None),
        }
    }

    pub(super) fn detour(
        mut self,
        detour: impl FnOnce(&SendError) -> Option<Result<Detoured, SendError>> + 'a,
    ) -> OnFailure<'a> {
        self.detour = Box::new(detour);
        self
    }
}

/// [`run_send`] from sockets already bound (`from`, see
/// [`crate::transfer::send::send_from`]); `on_failure` may replace an
/// error's message with a better one. `pinned_key`: the server's key if
/// it is the one known for it (not a one-time key), for the path cache.
pub(super) fn run_send_from(
    sources: &[PathBuf],
    mut config: SendConfig,
    args: &TransferArgs,
    pinned_key: Option<[u8; 32]>,
    from: &[crate::transfer::send::Bound],
    progress: Arc<Progress>,
    on_failure: OnFailure<'_>,
) -> Result<ExitCode> {
    config.files_from = args.listed(sources)?;
    let OnFailure { explain, detour } = on_failure;
    let done = Arc::new(Mutex::new(false));
    let started = Instant::now();
    let machine = args.progress == ProgressMode::Json;
    progress.detail.store(machine, Ordering::Relaxed);
    let shower = if machine {
        let (p, d, every) = (progress.clone(), done.clone(), args.progress_interval);
        Some(thread::spawn(move || json_progress(p, d, started, every)))
    } else if args.progress_lines {
        let (p, d) = (progress.clone(), done.clone());
        Some(thread::spawn(move || progress_lines(p, d)))
    } else {
        (!args.quiet).then(|| {
            let (p, d) = (progress.clone(), done.clone());
            let tty = std::io::stderr().is_terminal();
            thread::spawn(move || show_progress(p, d, tty))
        })
    };
    {
        let p = progress.clone();
        // Ctrl-C: stop the connections; the partial files stay for a resume.
        let _ = ctrlc_hook(move || p.stop.store(true, Ordering::Relaxed));
    }
    // Through the ssh tunnel the peer is a loopback stand-in: what its
    // path teaches is the ssh channel's, of no use to the next run.
    let mut hint = PathHint::new(args.no_path_cache, config.peer.ip(), pinned_key);
    config.path_memory = hint.recall();
    let fixed = if args.tuning.sets("mss") {
        Some(SizeFrom::Forced)
    } else {
        this_host_mss(config.peer).map(|_| SizeFrom::ThisHost)
    };
    let mut path = path_size::choose(
        &mut config.tuning,
        config.peer,
        fixed,
        config.path_memory.as_ref(),
        from.is_empty(),
    );
    let mut result = crate::transfer::send::send_from(sources, &config, progress.clone(), from);
    let unheard = !progress.heard.load(Ordering::Relaxed);
    let tunneled_from: Vec<crate::transfer::send::Bound>;
    match result.as_ref().err().filter(|_| unheard).and_then(detour) {
        Some(Ok(Detoured {
            peer: stand_in,
            from: tunnel_sockets,
        })) => {
            // Through the ssh tunnel the peer is a loopback stand-in: what
            // its path teaches is the ssh channel's, of no use to the next
            // run.
            hint = PathHint::new(true, stand_in.ip(), None);
            config.path_memory = None;
            config.peer = stand_in;
            config.route = Some("ssh");
            if fixed.is_none() {
                if let Some(mss) = this_host_mss(stand_in) {
                    path = path_size::through_tunnel(&mut config.tuning, stand_in, mss);
                }
            }
            progress.stop.store(false, Ordering::Relaxed);
            tunneled_from = tunnel_sockets;
            let from = if tunneled_from.is_empty() {
                from
            } else {
                &tunneled_from
            };
            result = crate::transfer::send::send_from(sources, &config, progress.clone(), from);
        }
        Some(Err(e)) => result = Err(e),
        None => {}
    }
    // A black hole opened during the transfer (RFC 8899 §4.3): the
    // connection ended with the size its probes found, and the rest goes
    // at it, resumed. Each step is smaller, so this ends.
    while let Some(next) = shrank_to(&result)
        .and_then(|carried| path.step_down(&mut config.tuning, config.peer, carried))
    {
        if !args.quiet {
            eprintln!(
                "atou: the path stopped carrying {}-byte datagrams; going on at {}",
                path.path_mtu, next.path_mtu
            );
        }
        path = next;
        // The bytes acknowledged so far stay counted, and the total
        // becomes them plus what the resumed send finds left to send
        // (its rounds add that), so the display goes on from where it
        // was rather than from 0; the aborted round's unsent rest is
        // dropped from the total, not counted twice.
        progress
            .total
            .store(progress.done.load(Ordering::Relaxed), Ordering::Relaxed);
        result = crate::transfer::send::send_from(sources, &config, progress.clone(), from);
    }
    // The end-of-run summary of each connection, from what it measured.
    let mut streams: Vec<Summary> = result.as_ref().map_or_else(
        |_| Vec::new(),
        |report| {
            report
                .streams
                .iter()
                .map(|s| Summary::from_client(&s.transport, &s.end, &config.host, &config.tuning))
                .collect()
        },
    );
    for s in &mut streams {
        if let Some(m) = s.path_memory.as_mut() {
            m.datagram_size = path.to_remember();
        }
    }
    hint.remember(&streams);
    let status = match &result {
        Ok(_) => Exit::Ok,
        Err(e) => e.fault().into(),
    };
    *done.lock().expect("progress lock") = true;
    if let Some(h) = shower {
        let _ = h.join();
    }
    if machine {
        // The last line: the whole run's figures and how it ended.
        let secs = started.elapsed().as_secs_f64();
        let rate = progress.done.load(Ordering::Relaxed) as f64 * 8.0 / secs.max(1e-9);
        let mut line = progress_line(&progress, "end", secs, rate);
        line["status"] = status.word().into();
        line["exit"] = status.code().into();
        print_stdout(&format!("{line}\n"))?;
    }
    // With --progress json, stdout is JSON Lines: the report is one more.
    match result {
        Ok(report) => {
            if args.json {
                let mut v = with_path(
                    with_streams(exit::json_report(&report, status)?, &streams)?,
                    &path,
                )?;
                if let (Some(route), Some(m)) = (config.route, v.as_object_mut()) {
                    m.insert("path".into(), route.into());
                }
                print_stdout(&exit::json_text(&v, machine))?;
            } else if !args.quiet {
                if report.dry_run.is_some() {
                    print_stdout(&dry_run_text(&report))?;
                } else {
                    eprint!("{}", report_text(&report, &streams, &path));
                    if let Some(route) = config.route {
                        eprintln!("atou: path: {}", route_text(route));
                    }
                }
            }
        }
        Err(e) => {
            let why = match e {
                SendError::Interrupted => {
                    "interrupted; run the same command again to resume".to_string()
                }
                // The reason may quote the server's words: escaped, so a
                // hostile server cannot drive the terminal.
                e => crate::util::text::escape(
                    explain(&e).unwrap_or_else(|| e.to_string()).as_bytes(),
                ),
            };
            eprintln!("atou: {why}");
            if args.json {
                let v = exit::json_failure(status, &config.host, &why);
                print_stdout(&exit::json_text(&v, machine))?;
            }
        }
    }
    Ok(status.into())
}

/// The size a connection's probes still found carried, where the send
/// failed because the path stopped carrying its datagrams.
fn shrank_to(result: &Result<SendReport, SendError>) -> Option<u32> {
    match result {
        Err(SendError::Conn(io::ProbeError::Conn {
            error: crate::proto::ConnError::PathShrank { carried, .. },
            ..
        })) => Some(*carried),
        _ => None,
    }
}

/// A copy over ssh's path, as its report says it.
pub(super) fn route_text(route: &str) -> &'static str {
    if route == "ssh" {
        "ssh (no UDP datagram got through: atou's sealed datagrams went over the ssh connection)"
    } else {
        "udp"
    }
}

/// Calls `f` on the first Ctrl-C, from a thread of its own.
pub(super) fn ctrlc_hook(f: impl FnOnce() + Send + 'static) -> Result<()> {
    let rt = runtime()?;
    thread::spawn(move || {
        rt.block_on(async {
            if tokio::signal::ctrl_c().await.is_ok() {
                f();
            }
        })
    });
    Ok(())
}

pub(super) fn send_cmd(args: SendArgs) -> Result<ExitCode> {
    args.transfer.auth.choose_threads();
    let (host, subdir) = split_remote(&args.dest)?;
    // A list that does not read is a usage error before any contact.
    args.transfer.listed(&args.sources)?;
    let peer = resolve(&host)?;
    let mut config = args.transfer.config(peer, host, subdir)?;
    config.auth = args
        .transfer
        .auth
        .resolve(&config.host, peer, config.tuning.maxidle, false)?;
    let traces = args.output.sink(&config);
    config.trace = traces.as_ref().map(|t| t.0.clone());
    let pinned_key = config.auth.as_ref().map(|a| a.server_key.0);
    let code = run_send(&args.sources, config, &args.transfer, pinned_key)?;
    if let Some((_, left)) = traces {
        left.finish()?;
    }
    Ok(code)
}

pub(super) fn copy_cmd(args: CopyArgs) -> Result<ExitCode> {
    args.transfer.auth.choose_threads();
    // A remote SRC or DEST: the other end is run over ssh.
    let remote_source = args
        .sources
        .iter()
        .any(|s| s.to_str().is_some_and(is_remote));
    if remote_source {
        refuse_for_a_pull(&args.transfer)?;
    } else {
        args.transfer.listed(&args.sources)?;
    }
    if remote_source || is_remote(&args.dest) {
        return super::remote::copy(
            &args.sources,
            &args.dest,
            &args.transfer,
            &args.receiving,
            &args.ssh,
        );
    }
    let root = Path::new(&args.dest);
    let dry = if args.transfer.dry_run {
        Some(DryRunRoot::new(root).map_err(usage)?)
    } else {
        crate::transfer::dest::create_destination(root).map_err(usage)?;
        None
    };
    let root = dry.as_ref().map_or(root, |d| d.path());
    let root = crate::transfer::receive::check_root(root).map_err(usage)?;
    let (client_auth, server_auth) = if args.transfer.auth.no_auth() {
        (None, crate::proto::crypto::ServerAuth::plain())
    } else {
        let (c, s) = args.transfer.auth.ephemeral_pair()?;
        (Some(c), s)
    };
    let receiver = LocalReceiver::start(&args, root.clone(), dry.is_some(), server_auth)?;
    let shown = dry.as_ref().map_or(root.as_path(), |d| d.dest.as_path());
    let mut config = args
        .transfer
        .config(receiver.addr, format!("{}", shown.display()), None)?;
    config.auth = client_auth;
    // The key is a one-time key: not part of the destination.
    let code = run_send(&args.sources, config, &args.transfer, None);
    receiver.stop();
    drop(dry);
    code
}

/// A destination a local copy cannot use is the command's to fix.
fn usage(e: crate::transfer::Error) -> UsageError {
    UsageError(e.to_string())
}

/// What a copy from a remote SRC (a pull, a third-party copy) cannot do.
fn refuse_for_a_pull(transfer: &TransferArgs) -> Result<()> {
    if transfer.progress == ProgressMode::Json {
        // The sender of a pull is the remote end; its progress is ssh's stderr.
        return Err(UsageError(
            "--progress json is for sends; a pull over ssh (a remote SRC) shows the remote \
             sender's progress on stderr: leave --progress out"
                .into(),
        )
        .into());
    }
    Ok(())
}

/// A local copy's receiver, in-process on loopback, in a thread of its own.
struct LocalReceiver {
    addr: SocketAddr,
    stop: Arc<tokio::sync::Notify>,
    server: thread::JoinHandle<Result<()>>,
}

/// The local copy's server: one sender, the user, whose windows are
/// what it asked for (--buffer per stream at most).
fn loopback_serve_config(
    bind: SocketAddr,
    rcvbuf: u32,
    buffer: u64,
    auth: crate::proto::crypto::ServerAuth,
) -> ServeConfig {
    ServeConfig {
        bind,
        once: false,
        sndbuf: 4 << 20,
        rcvbuf,
        limits: crate::proto::ServerLimits {
            max_window_bytes: buffer,
            total_window_bytes: u64::MAX / 2,
            ..Default::default()
        },
        auth,
        // One-time keys: no hello outlives this run.
        hello_timestamps: None,
    }
}

impl LocalReceiver {
    /// Starts it on a free loopback port and waits until it listens.
    fn start(
        args: &CopyArgs,
        root: PathBuf,
        dry_run: bool,
        server_auth: crate::proto::crypto::ServerAuth,
    ) -> Result<LocalReceiver> {
        let sock = std::net::UdpSocket::bind("127.0.0.1:0")?;
        let addr = sock.local_addr()?;
        drop(sock);
        let failure: Arc<Mutex<Option<String>>> = Arc::new(Mutex::new(None));
        let new_receiver = if dry_run {
            FileReceiver::dry_run
        } else {
            FileReceiver::new
        };
        let mut receiver = new_receiver(
            ReceiveConfig {
                root,
                writers: readers(args.transfer.readers),
                once: true,
                // The user's own directory, under the user's own flags; the
                // manifest may hold only the SRCs named.
                policy: args.receiving.policy(
                    args.transfer.overwrite,
                    args.transfer.delete,
                    args.transfer.keeps_owners(),
                    args.transfer.keeps_xattrs(),
                    args.transfer.fsync,
                    Some(local_requested(&args.sources, &args.transfer)?),
                ),
                limits: ReceiveLimits::default(),
                authorized: None,
            },
            {
                let failure = failure.clone();
                move |e| {
                    if let ReceiveEvent::Failed { why, .. } = e {
                        failure.lock().expect("lock").get_or_insert(why);
                    }
                }
            },
        )
        .map_err(usage)?;
        let stop = Arc::new(tokio::sync::Notify::new());
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let server = {
            let stop = stop.clone();
            let rcvbuf = args.transfer.tuning.resolve()?.0.rcvbuf;
            let buffer = args.transfer.buffer;
            thread::spawn(move || -> Result<()> {
                let rt = runtime()?;
                rt.block_on(io::serve(
                    loopback_serve_config(addr, rcvbuf, buffer, server_auth),
                    &mut receiver,
                    |e| {
                        if let io::ServeEvent::Listening { .. } = e {
                            let _ = ready_tx.send(());
                        }
                    },
                    async move { stop.notified().await },
                ))?;
                Ok(())
            })
        };
        if ready_rx.recv_timeout(Duration::from_secs(10)).is_err() {
            return match server.join() {
                Ok(Err(e)) => Err(e.context("cannot start the local receiver")),
                _ => Err(anyhow::anyhow!("the local receiver did not start")),
            };
        }
        Ok(LocalReceiver { addr, stop, server })
    }

    fn stop(self) {
        self.stop.notify_one();
        let _ = self.server.join();
    }
}

/// The names a local copy's sender gives its SRCs, as its walk will.
fn local_requested(sources: &[PathBuf], args: &TransferArgs) -> Result<Requested> {
    if let Some(listed) = args.listed(sources)? {
        return Ok(Requested::exactly(&crate::transfer::manifest::listed_tops(
            &listed,
        )));
    }
    let mut names = Vec::with_capacity(sources.len());
    for src in sources {
        names.push(
            crate::transfer::manifest::top_name(src)
                .map_err(|e| UsageError(e.to_string()))?
                .1,
        );
    }
    Ok(Requested::exactly(&names))
}

/// What a copy over ssh (`cli/remote.rs`) needs of the transfer flags.
impl TransferArgs {
    pub(super) fn send_config(
        &self,
        peer: SocketAddr,
        host: String,
        subdir: Option<RelPath>,
    ) -> Result<SendConfig> {
        self.config(peer, host, subdir)
    }

    pub(super) fn streams(&self) -> usize {
        self.streams
    }

    pub(super) fn quiet(&self) -> bool {
        self.quiet
    }

    /// Progress for people, on this end's terminal.
    pub(super) fn shows_a_bar(&self) -> bool {
        !self.quiet
            && !self.json
            && self.progress == ProgressMode::Auto
            && std::io::stderr().is_terminal()
    }

    pub(super) fn json(&self) -> bool {
        self.json
    }

    pub(super) fn dry_run(&self) -> bool {
        self.dry_run
    }

    pub(super) fn shard(&self) -> Option<Shard> {
        self.shard
    }

    pub(super) fn overwrite(&self) -> bool {
        self.overwrite
    }

    pub(super) fn delete(&self) -> bool {
        self.delete
    }

    /// `-o` or `-g`: the receiving end may give entries owners or groups.
    pub(super) fn keeps_owners(&self) -> bool {
        self.owner || self.group
    }

    /// `-X` / `-A`: which attributes the sending end reads, and the
    /// receiving end may set.
    pub(super) fn keeps_xattrs(&self) -> Wanted {
        Wanted {
            xattrs: self.xattrs,
            acls: self.acls,
            root: rustix::process::geteuid().is_root(),
        }
    }

    pub(super) fn fsync(&self) -> bool {
        self.fsync
    }

    pub(super) fn buffer(&self) -> u64 {
        self.buffer
    }

    #[cfg(test)]
    pub(super) fn flows(&self) -> usize {
        self.flows
    }

    pub(super) fn tuning(&self) -> &TuningArgs {
        &self.tuning
    }

    /// The flags the remote sender of a pull needs, as arguments: what
    /// the sender asks of the receiver, its streams and buffer, whether
    /// it shows progress, and every knob (from flags or --config) that is
    /// not at its default.
    pub(super) fn remote_send_args(&self) -> Result<Vec<String>> {
        // Its progress lines come through ssh's stderr; its report (JSON,
        // on the channel's stdout) is not shown: the local end reports
        // what it received. A dry run's listing is shown, as it printed
        // it: JSON for --json, its words otherwise.
        let report = if self.quiet {
            Some("--quiet")
        } else if self.json || !self.dry_run {
            Some("--json")
        } else {
            None
        };
        let mut a: Vec<String> = report.into_iter().map(str::to_string).collect();
        a.extend(self.sender_args()?);
        Ok(a)
    }

    /// The flags that make a far sender send as this one would, but for
    /// how it reports.
    pub(super) fn sender_args(&self) -> Result<Vec<String>> {
        let mut a = vec![
            "--streams".to_string(),
            self.streams.to_string(),
            "--buffer".to_string(),
            self.buffer.to_string(),
        ];
        for (on, flag) in [
            (self.overwrite, "--overwrite"),
            (self.delete, "--delete"),
            (self.owner, "--owner"),
            (self.group, "--group"),
            (self.numeric_ids, "--numeric-ids"),
            (self.xattrs, "--xattrs"),
            (self.acls, "--acls"),
            (self.skip_existing, "--skip-existing"),
            (self.checksum, "--checksum"),
            (self.fsync, "--fsync"),
            (self.compress, "--compress"),
            (self.follow, "--follow"),
            (self.hard_links, "--hard-links"),
            (self.no_path_cache, "--no-path-cache"),
        ] {
            if on {
                a.push(flag.to_string());
            }
        }
        // Rule files are read here: they are on this host.
        for rule in self.filters()?.rules() {
            a.push(format!("--filter={rule}"));
        }
        if let Some(shard) = self.shard {
            a.push(format!("--shard={shard}"));
        }
        // Only where asked: a far end that predates --flows refuses it,
        // and its streams are each a flow anyway.
        if self.flows != 1 {
            a.push(format!("--flows={}", self.flows));
        }
        let (tuning, _) = self.tuning.resolve()?;
        let defaults = crate::proto::Tuning::default();
        for k in crate::proto::tuning::KNOBS {
            let value = tuning.get(k.name);
            if value != defaults.get(k.name) {
                if let Some(v) = value {
                    a.push(format!("--{}", k.name.replace('_', "-")));
                    a.push(v);
                }
            }
        }
        Ok(a)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_destinations() {
        let s = |d: &str| split_remote(d).map(|(h, s)| (h, s.map(|s| s.to_string())));
        assert_eq!(s("h").unwrap(), ("h:7890".into(), None));
        assert_eq!(s("h:7891").unwrap(), ("h:7891".into(), None));
        assert_eq!(s("h:in/x").unwrap(), ("h:7890".into(), Some("in/x".into())));
        assert_eq!(
            s("h:7891:2024").unwrap(),
            ("h:7891".into(), Some("2024".into()))
        );
        assert_eq!(
            s("h:7891:a:b/").unwrap(),
            ("h:7891".into(), Some("a:b".into()))
        );
        assert_eq!(
            s("[::1]:7891:x").unwrap(),
            ("[::1]:7891".into(), Some("x".into()))
        );
        assert_eq!(s("[::1]").unwrap(), ("[::1]:7890".into(), None));
        assert!(s("h:../up").is_err());
        assert!(s("h:99999:x").is_err());
        assert!(s(":x").is_err());
        assert!(is_remote("host:dir"));
        assert!(!is_remote("./a:b"));
        assert!(!is_remote("/tmp/x"));
    }
}

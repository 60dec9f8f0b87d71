//! The sending end of a transfer.
//!
//! 1. Walk the sources and send the manifest (the plan request); the
//!    receiver answers what to send for each file.
//! 2. For files the receiver holds part of, hash our chunks and keep only
//!    those that differ (resume).
//! 3. Share the chunks out over `streams` connections, largest files
//!    first, balancing bytes. Each connection's thread asks a pool of
//!    reader threads to read chunks ahead (positioned reads, BLAKE3 of
//!    each chunk computed as it is read), at most its share of `buffer`
//!    at a time; a chunk's memory is freed once the receiver has
//!    acknowledged all of it.
//! 4. Chunks the receiver found corrupt are sent again, in a new round.
//! 5. Send every file's hash (the finish request): the receiver checks
//!    them and puts the files in place.
//!
//! `session::SendSession` walks these steps; `readers.rs` reads and
//! hashes chunks for the data streams (steps 2 and 3); `conn.rs` runs one
//! transport connection, a request or a data stream.

mod conn;
mod readers;
mod same;
mod session;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use thiserror::Error;

use super::exclude::Filters;
use super::manifest::{RelPath, WalkError};
use super::messages::{encode_abort, Options, Outcome};
use super::shard::Shard;
use crate::io::{ClientEnd, ClientReport, ProbeError};
use crate::proto::Tuning;

/// Why [`send`] failed; [`SendError::fault`] is its kind.
#[derive(Debug, Error)]
pub enum SendError {
    /// The source tree could not be walked: an unreadable path, a name
    /// the manifest cannot carry, a loop, two sources of one name.
    #[error("{0}")]
    Walk(#[from] WalkError),
    /// A connection to the receiver failed.
    #[error("{0}")]
    Conn(ProbeError),
    /// The receiver refused the plan: a conflict, its policy, its key's
    /// options or its budgets.
    #[error("{host} refused the transfer: {why}")]
    Refused {
        /// The receiver, as the command line named it.
        host: String,
        /// The receiver's reason.
        why: String,
    },
    /// The receiver failed partway; what it wrote stays for a resume.
    #[error("the transfer to {host} failed: {why}")]
    Failed {
        /// The receiver, as the command line named it.
        host: String,
        /// What failed there.
        why: String,
    },
    /// A file being sent, as the transport's feed reported it.
    #[error("{0}")]
    Source(String),
    /// A file being sent, read while comparing chunks.
    #[error(transparent)]
    Read(#[from] crate::transfer::Error),
    /// A reply that does not decode: the ends are different releases, or
    /// the peer is not atou.
    #[error(
        "a reply from {host} that does not decode ({why}); are both ends the same atou release?"
    )]
    BadReply {
        /// The receiver, as the command line named it.
        host: String,
        /// What the decoder found wrong.
        why: String,
    },
    /// [`Progress::stop`] was set (Ctrl-C).
    #[error("interrupted")]
    Interrupted,
    /// The receiver was at one of its limits for the whole of
    /// `--wait-busy`.
    #[error(
        "{host} was still busy after waiting {waited:.0} s (--wait-busy): {why}; try again later"
    )]
    Busy {
        /// The receiver, as the command line named it.
        host: String,
        /// Which of its limits it was at.
        why: String,
        /// Seconds waited before giving up.
        waited: f64,
    },
    /// What the receiver holds is not what was sent: its final check
    /// failed, or chunks kept failing theirs.
    #[error("the transfer to {host} failed verification: {why}")]
    Unverified {
        /// The receiver, as the command line named it.
        host: String,
        /// What failed its check, as a person reads it.
        why: String,
    },
}

/// What kind of failure a [`SendError`] (or a [`ProbeError`]) is, so that
/// a caller can act on it (the CLI's exit status): try again later, fix
/// the command or the server, or look at the data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The receiver said no: a conflict, its policy or permissions, or
    /// authentication.
    Refused,
    /// No server answered, the host or path is unreachable, or the
    /// server is busy: worth trying again.
    Network,
    /// The peer went silent for maxidle once the connection was up.
    Timeout,
    /// The ends do not understand each other: releases, malformed replies.
    Protocol,
    /// What arrived is not what was sent.
    Verify,
    /// The receiver failed partway; what it wrote stays for a resume.
    Partial,
    /// A local file could not be read, or changed while it was sent.
    Io,
    Interrupted,
    /// None of the above (a bad knob that got past the command line).
    Other,
}

impl SendError {
    /// What kind of failure this is: the one classification a caller
    /// acts on (the CLI's exit status).
    pub fn fault(&self) -> Fault {
        match self {
            SendError::Walk(_) | SendError::Source(_) => Fault::Io,
            SendError::Read(e) => e.fault(),
            SendError::Conn(e) => probe_fault(e),
            SendError::Refused { .. } => Fault::Refused,
            SendError::Failed { .. } => Fault::Partial,
            SendError::Unverified { .. } => Fault::Verify,
            SendError::BadReply { .. } => Fault::Protocol,
            SendError::Interrupted => Fault::Interrupted,
            SendError::Busy { .. } => Fault::Network,
        }
    }
}

/// The kind of a connection's failure (see [`Fault`]).
pub fn probe_fault(e: &ProbeError) -> Fault {
    use crate::proto::crypto::handshake::HandshakeError as H;
    use crate::proto::crypto::RefuseReason;
    use crate::proto::endpoint::client::Stage;
    use crate::proto::ConnError as C;
    match e {
        ProbeError::Socket { .. }
        | ProbeError::Unreachable { .. }
        | ProbeError::TooBig { .. }
        | ProbeError::Send { .. }
        | ProbeError::Recv { .. }
        // No answer before the hello: nobody there (yet).
        | ProbeError::NoKey { .. } => Fault::Network,
        ProbeError::Interrupted => Fault::Interrupted,
        ProbeError::Source(_) => Fault::Io,
        ProbeError::Tuning(_) => Fault::Other,
        ProbeError::Conn { error, .. } => match error {
            // Silent from the start: no server there; silent after the
            // hello was answered: the path or the peer failed (rsync's
            // "timeout in data send/receive").
            C::Idle {
                stage: Stage::Hello | Stage::Handshake,
                ..
            } => Fault::Network,
            C::Idle { .. } | C::Stalled { .. } => Fault::Timeout,
            C::Busy
            | C::PathShrank { .. }
            | C::AuthRefused(RefuseReason::Busy)
            | C::Handshake(H::Refused(RefuseReason::Busy)) => Fault::Network,
            C::Refused | C::AuthRefused(_) | C::AuthRequired | C::NoIdentity => Fault::Refused,
            C::Handshake(H::Refused(_) | H::Undecryptable | H::Replayed) => Fault::Refused,
            C::Handshake(_) | C::VersionMismatch { .. } | C::ReplyTooLong { .. } => {
                Fault::Protocol
            }
        },
    }
}

/// How [`send`] sends: the receiver, the transport's tuning and budgets.
/// Built with [`SendConfig::new`] and its setters.
#[derive(Debug, Clone)]
pub struct SendConfig {
    /// The receiver's address.
    pub(crate) peer: SocketAddr,
    /// The receiver as the user named it, for messages.
    pub(crate) host: String,
    /// Where under the receiver's directory the files go; `None`: its top.
    pub(crate) subdir: Option<RelPath>,
    /// Every data connection's transport knobs.
    pub(crate) tuning: Tuning,
    /// What the receiver is asked to do with existing files.
    pub(crate) options: Options,
    /// Follow symlinks among the sources instead of sending them as links.
    pub(crate) follow: bool,
    /// Entries the walk leaves out (`--exclude`).
    pub(crate) filters: Filters,
    /// Files that are one file go as one file and links to it (`-H`).
    pub(crate) hard_links: bool,
    /// `-o` / `-g` / `--numeric-ids`: whose each entry is goes with the plan.
    pub(crate) keep_owners: KeepOwners,
    /// `-X` / `-A`: which extended attributes go with the plan.
    pub(crate) keep_xattrs: crate::io::xattr::Wanted,
    /// The paths of `--files-from`, sent instead of the sources whole.
    pub(crate) files_from: Option<Vec<super::manifest::Listed>>,
    /// Send only this shard's part of the tree (`--shard K/N`).
    pub(crate) shard: Option<Shard>,
    /// Transport connections at once.
    pub(crate) streams: usize,
    /// The flows' share the streams take together: they are coupled as
    /// this many flows (docs/congestion.md, "Coupled streams"); at least 1.
    pub(crate) flows: usize,
    /// Bytes read ahead, over all streams.
    pub(crate) buffer: u64,
    /// Threads reading the source files.
    pub(crate) readers: usize,
    /// Authenticate and encrypt with these keys; `None`: plain (`--no-auth`).
    pub(crate) auth: Option<crate::proto::crypto::ClientAuth>,
    /// What to do with each data connection's packet trace (`--trace`,
    /// `--plot`); `None`: no trace.
    pub(crate) trace: Option<TraceSink>,
    /// What an earlier transfer learnt about the path to `peer`, for every
    /// connection's start ([`crate::config::path_cache`]); `None`: none.
    pub(crate) path_memory: Option<crate::proto::PathMemory>,
    /// How long to keep coming back, with jittered growing pauses, to a
    /// receiver that says it is busy, from its first such answer; zero:
    /// give up at once.
    pub(crate) wait_busy: Duration,
    /// How a copy over ssh carries its datagrams, for its report: `udp`,
    /// or `ssh` where no UDP got through ([`crate::transfer::tunnel`]);
    /// `None`: not a copy over ssh.
    pub(crate) route: Option<&'static str>,
}

impl SendConfig {
    /// Sends to `peer`, named by its address in messages, with the default
    /// tuning, one stream, the smallest read-ahead (2 MiB), one reader
    /// thread, no authentication and no waiting on a busy receiver.
    pub fn new(peer: SocketAddr) -> SendConfig {
        SendConfig {
            peer,
            host: peer.to_string(),
            subdir: None,
            tuning: Tuning::default(),
            options: Options::default(),
            follow: false,
            filters: Filters::default(),
            files_from: None,
            hard_links: false,
            keep_owners: KeepOwners::default(),
            keep_xattrs: Default::default(),
            shard: None,
            streams: 1,
            flows: 1,
            buffer: 0,
            readers: 1,
            auth: None,
            trace: None,
            path_memory: None,
            wait_busy: Duration::ZERO,
            route: None,
        }
    }

    /// The receiver as the user named it, for messages. Default: `peer`.
    #[must_use]
    pub fn host(mut self, host: impl Into<String>) -> Self {
        self.host = host.into();
        self
    }

    /// Every data connection's transport knobs. Default: [`Tuning::default`].
    #[must_use]
    pub fn tuning(mut self, tuning: Tuning) -> Self {
        self.tuning = tuning;
        self
    }

    /// Follow symlinks among the sources. Default: `false`.
    #[must_use]
    pub fn follow(mut self, follow: bool) -> Self {
        self.follow = follow;
        self
    }

    /// Transport connections at once, at least 1 (0 counts as 1). Default: 1.
    #[must_use]
    pub fn streams(mut self, streams: usize) -> Self {
        self.streams = streams.max(1);
        self
    }

    /// Bytes read ahead over all streams, at least 2 MiB per stream.
    /// Default: 0 (that least).
    #[must_use]
    pub fn buffer(mut self, bytes: u64) -> Self {
        self.buffer = bytes;
        self
    }

    /// Threads reading the source files, at least 1 (0 counts as 1).
    /// Default: 1.
    #[must_use]
    pub fn readers(mut self, readers: usize) -> Self {
        self.readers = readers.max(1);
        self
    }

    /// Authenticate and encrypt with these keys. Default: `None`, plain.
    #[must_use]
    pub fn auth(mut self, auth: Option<crate::proto::crypto::ClientAuth>) -> Self {
        self.auth = auth;
        self
    }

    /// How long to keep coming back to a receiver that says it is busy.
    /// Default: zero, give up at once.
    #[must_use]
    pub fn wait_busy(mut self, wait: Duration) -> Self {
        self.wait_busy = wait;
        self
    }
}

/// Called as each data connection starts, with its round (1 for the
/// first; later ones re-send chunks that failed their check) and stream
/// (from 1): returns what takes that connection's trace records, as they
/// come. It is dropped when the connection ends.
#[derive(Clone)]
pub struct TraceSink(pub Arc<dyn Fn(usize, usize) -> TraceTaker + Send + Sync>);

/// Takes one connection's trace records.
pub type TraceTaker = Box<dyn FnMut(&crate::proto::TraceRecord)>;

impl std::fmt::Debug for TraceSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TraceSink")
    }
}

/// Counters a progress display reads while the transfer runs.
#[derive(Debug, Default)]
pub struct Progress {
    /// File bytes to send (after skips and resume): each round adds its
    /// own. A caller that goes on with a resumed send (a step down of the
    /// datagram size) may set it to `done` first, for that send to add
    /// what it has left.
    pub total: AtomicU64,
    /// File bytes acknowledged by the receiver.
    pub done: AtomicU64,
    /// What is happening, for the display.
    pub stage: Mutex<String>,
    /// Files being sent, by name.
    pub current: Mutex<Vec<String>>,
    /// Set by the caller (a Ctrl-C handler) to end the transfer early:
    /// [`send`] returns [`SendError::Interrupted`].
    pub stop: AtomicBool,
    /// Keep [`Progress::streams`] up to date (it costs a trace record per
    /// segment and per ACK, so only a display that shows it asks).
    pub detail: AtomicBool,
    /// The data streams of the current round, with `detail`.
    pub streams: Mutex<Vec<Arc<StreamLive>>>,
    /// Set by the receiver's first answer in its own words (its
    /// authenticated handshake answer, or a refusal): UDP gets through
    /// both ways.
    pub heard: Arc<AtomicBool>,
}

impl Progress {
    fn set_stage(&self, s: impl Into<String>) {
        *self.stage.lock().expect("progress lock") = s.into();
    }
}

/// One data stream's transport as it runs, for a progress display: what
/// `atou send`'s report says of each stream at the end, while it runs.
#[derive(Debug)]
pub struct StreamLive {
    /// File bytes this stream has had acknowledged.
    pub bytes: AtomicU64,
    /// Congestion window and slow-start threshold, in segments, after the
    /// last ACK.
    pub cwnd: AtomicU64,
    pub ssthresh: AtomicU64,
    /// Smoothed RTT in microseconds: RFC 6298's average (gain 1/8) of the
    /// ACKs' RTT samples, as the sender keeps it.
    pub srtt_us: AtomicU64,
    /// Segments sent again.
    pub rxmts: AtomicU64,
}

impl Default for StreamLive {
    fn default() -> StreamLive {
        StreamLive {
            bytes: AtomicU64::new(0),
            cwnd: AtomicU64::new(0),
            // No threshold until the first loss, as the sender's own.
            ssthresh: AtomicU64::new(u64::MAX),
            srtt_us: AtomicU64::new(0),
            rxmts: AtomicU64::new(0),
        }
    }
}

/// What [`send`] did: what it sent, resent and skipped, and how long it took.
#[derive(Debug, Clone, serde::Serialize)]
#[non_exhaustive]
pub struct SendReport {
    /// The receiver as the user named it.
    pub host: String,
    /// `--shard K/N`: every figure below is of this shard's part.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shard: Option<String>,
    /// Files in the manifest (regular files).
    pub files: u64,
    /// Of `files`, those split across shards that this shard sent a part
    /// of: each takes its name at the receiver when every part is in.
    pub files_in_part: u64,
    /// Directories in the manifest.
    pub dirs: u64,
    /// Symbolic links in the manifest.
    pub symlinks: u64,
    /// Files the receiver already had (`--skip-existing`).
    pub skipped_files: u64,
    /// Files the receiver wrote from another file's chunks, their bytes
    /// being that file's (`--compress`): none of theirs was sent.
    pub copied_files: u64,
    /// File bytes in the manifest (of a file sent in part, the part's).
    pub bytes_total: u64,
    /// File bytes sent (chunks; a chunk sent twice counts twice).
    pub bytes_sent: u64,
    /// File bytes not sent: skipped files and chunks the receiver held.
    pub bytes_skipped: u64,
    /// File bytes of `copied_files`, not sent either.
    pub bytes_copied: u64,
    /// `-X` / `-A`: the attributes the plan carried (an ACL counts as
    /// one); the receiver's policy decides which it sets.
    pub xattrs_sent: u64,
    /// `-X` / `-A`: the entries that had any.
    pub xattr_entries: u64,
    /// Chunks sent again after failing the receiver's check.
    pub chunks_resent: u64,
    /// Wall time of the whole run, in seconds.
    pub secs: f64,
    /// File bytes sent per second of the whole run, in bits/s.
    pub goodput_bps: f64,
    /// Rounds of sending: 1, plus one per round that re-sent failed chunks.
    pub rounds: usize,
    /// Every file verified by the receiver (BLAKE3 per chunk and per file).
    pub verified: bool,
    /// One transport report per connection that carried data, for the
    /// caller's summary (`--json` prints them as summaries).
    #[serde(skip)]
    pub streams: Vec<StreamReport>,
    /// A dry run's answer, file by file in manifest order; `None` for a
    /// real run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dry_run: Option<Vec<PlannedFile>>,
    /// With `--compress`: the file bytes sent and what they took on the
    /// wire.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compress: Option<CompressReport>,
    /// What `--delete` removed at the receiver (in a dry run: would
    /// remove); `None` without `--delete`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deleted: Option<Deleted>,
}

/// What `--compress` made of the file bytes sent.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CompressReport {
    /// File bytes sent, as in `bytes_sent`.
    pub raw_bytes: u64,
    /// What they took in the data streams: compressed chunks' frames,
    /// and the bytes of chunks that went raw.
    pub wire_bytes: u64,
    /// `raw_bytes / wire_bytes`.
    pub ratio: f64,
    /// Of `raw_bytes`, those sent plain, unframed: rounds whose samples
    /// did not shrink by a twentieth (random or already compressed data).
    pub sent_plain: u64,
}

/// rsync's `-o`, `-g` and `--numeric-ids`, as the sender asks them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KeepOwners {
    pub user: bool,
    pub group: bool,
    pub numeric: bool,
}

/// What `--delete` removed (or, in a dry run, would): the receiver's list,
/// for the user.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Deleted {
    /// Entries removed, each named once (a directory with what it held).
    pub total: u64,
    /// The first of them as the receiver listed them, escaped for a
    /// terminal, a directory's with a trailing `/`; the rest only counted.
    pub listed: Vec<String>,
}

impl From<&crate::transfer::messages::Deletions> for Deleted {
    fn from(d: &crate::transfer::messages::Deletions) -> Deleted {
        Deleted {
            total: d.total,
            listed: d
                .listed
                .iter()
                .map(|(path, is_dir)| format!("{path}{}", if *is_dir { "/" } else { "" }))
                .collect(),
        }
    }
}

/// One data connection's transport figures and how it ended: what the
/// caller builds its end-of-run summary from
/// (`report::summary::Summary::from_client`).
#[derive(Debug, Clone)]
pub struct StreamReport {
    /// What the connection measured, from its first hello to its end.
    pub transport: ClientReport,
    /// How it ended.
    pub end: ClientEnd,
}

/// What a dry run found the receiver would do with one file.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PlannedFile {
    /// The path under the destination, escaped for a terminal.
    pub path: String,
    pub size: u64,
    /// Of a file split across shards, the chunks this shard sends,
    /// `[first, end)` (1 MiB each).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub part: Option<[u64; 2]>,
    /// `send` (some or all of it) or `skip` (all of it is there).
    pub action: &'static str,
    /// Bytes that would be sent: the size, or with a partial or
    /// (`--checksum`) differing file there, the chunks that differ.
    pub send_bytes: u64,
}

/// Sends `sources` to the receiver; `progress` is updated as it goes.
/// A transfer that fails after the plan tells the receiver why (if it
/// can), so the receiver ends the session at once.
pub fn send(
    sources: &[PathBuf],
    config: &SendConfig,
    progress: Arc<Progress>,
) -> Result<SendReport, SendError> {
    send_from(sources, config, progress, &[])
}

/// A socket already bound and the peer it sends to (the ssh bootstrap's
/// pull: the socket a punch datagram arrived on, and where it came from).
#[derive(Debug)]
pub struct Bound {
    pub socket: std::net::UdpSocket,
    pub peer: SocketAddr,
}

/// [`send`], each connection from one of `from` (stream `i` from
/// `from[i % len]`, the plan and the finish from `from[0]`) to its peer,
/// instead of from a fresh socket to `config.peer`. Connections on one
/// socket follow each other; the receiver tells them apart by id.
pub fn send_from(
    sources: &[PathBuf],
    config: &SendConfig,
    progress: Arc<Progress>,
    from: &[Bound],
) -> Result<SendReport, SendError> {
    let mut session = None;
    let result = session::send_session(sources, config, from, &progress, &mut session);
    // A receiver never heard from cannot be told either: an abort to it
    // would only wait out its maxidle.
    let heard = progress.heard.load(Ordering::Relaxed);
    if let (Err(e), Some(id), true) = (&result, session, heard) {
        let mut quick = config.clone();
        quick.tuning.maxidle = Duration::from_secs(2);
        let link = conn::Link {
            config: &quick,
            from: from.first(),
            session: id,
            stop: &Progress::default(),
        };
        // Best effort: the receiver may be what failed.
        let _ = conn::ask(link, encode_abort(&abort_reason(e)), Outcome::max_len(0));
    }
    result
}

/// What the receiver is told of a session that failed after its plan.
fn abort_reason(e: &SendError) -> String {
    match e {
        SendError::Interrupted => "interrupted".to_string(),
        other => other.to_string(),
    }
}

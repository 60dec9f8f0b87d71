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

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use thiserror::Error;
use tokio::sync::Notify;

use super::exclude::Excludes;
use super::hash::{chunk_count, chunk_cv, chunk_len, file_hash, part_digest, Cv, CHUNK_SIZE};
use super::layout::{header_for, Layout, CV_LEN};
use super::manifest::{manifest_of, walk, EntryKind, LocalEntry, RelPath, WalkError};
use super::messages::{
    encode_abort, encode_finish, ChunkRef, FilePart, FilePlan, Options, Outcome, PlanReply,
    PlanRequest,
};
use super::shard::{part_bytes, Selected, Shard};
use super::source::{SourceSpec, Sources};
use crate::io::{self, fresh_conn_id, ProbeConfig, ProbeError, StreamFeed};
use crate::proto::Observer;
use crate::proto::{PayloadSource, Tuning};
use crate::summary::Summary;
use crate::text::shown_path;

/// Most rounds of re-sending chunks that failed their check.
const MAX_ROUNDS: usize = 16;

#[derive(Debug, Error)]
pub enum SendError {
    #[error("{0}")]
    Walk(#[from] WalkError),
    #[error("{0}")]
    Conn(ProbeError),
    #[error("{host} refused the transfer: {why}")]
    Refused { host: String, why: String },
    #[error("the transfer to {host} failed: {why}")]
    Failed { host: String, why: String },
    #[error("{0}")]
    Source(String),
    #[error(
        "a reply from {host} that does not decode ({why}); are both ends the same atou release?"
    )]
    BadReply { host: String, why: String },
    #[error("interrupted")]
    Interrupted,
    /// The receiver was at one of its limits for the whole of
    /// `--wait-busy`.
    #[error(
        "{host} was still busy after waiting {waited:.0} s (--wait-busy): {why}; try again later"
    )]
    Busy {
        host: String,
        why: String,
        waited: f64,
    },
    /// What the receiver holds is not what was sent: its final check
    /// failed, or chunks kept failing theirs.
    #[error("the transfer to {host} failed verification: {why}")]
    Unverified { host: String, why: String },
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
    pub fn fault(&self) -> Fault {
        match self {
            SendError::Walk(_) | SendError::Source(_) => Fault::Io,
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
    use crate::proto::client::Stage;
    use crate::proto::crypto::handshake::HandshakeError as H;
    use crate::proto::crypto::RefuseReason;
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
            C::Idle { .. } => Fault::Timeout,
            C::Busy
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

#[derive(Debug, Clone)]
pub struct SendConfig {
    pub peer: SocketAddr,
    /// The receiver as the user named it, for messages.
    pub host: String,
    pub subdir: Option<RelPath>,
    pub tuning: Tuning,
    pub options: Options,
    pub follow: bool,
    /// Entries the walk leaves out (`--exclude`).
    pub excludes: Excludes,
    /// Send only this shard's part of the tree (`--shard K/N`).
    pub shard: Option<Shard>,
    /// Transport connections at once.
    pub streams: usize,
    /// Bytes read ahead, over all streams.
    pub buffer: u64,
    pub readers: usize,
    /// Authenticate and encrypt with these keys; `None`: plain (`--no-auth`).
    pub auth: Option<crate::proto::crypto::ClientAuth>,
    /// What to do with each data connection's packet trace (`--trace`,
    /// `--plot`); `None`: no trace.
    pub trace: Option<TraceSink>,
    /// What an earlier transfer learnt about the path to `peer`, for every
    /// connection's start ([`crate::path_cache`]); `None`: none.
    pub path_memory: Option<crate::proto::PathMemory>,
    /// How long to keep coming back, with jittered growing pauses, to a
    /// receiver that says it is busy, from its first such answer; zero:
    /// give up at once.
    pub wait_busy: Duration,
}

/// Coming back to a busy receiver: pauses of 0.5, 1, 2, 4, then 8 s (or
/// the receiver's hint, if longer), each stretched by a random factor
/// from 0.5 to 1.5 so that senders turned away together come back apart,
/// all within [`SendConfig::wait_busy`] of the first refusal. Nothing is
/// held at the receiver meanwhile: each try is a new connection.
#[derive(Debug, Default)]
struct BusyWait {
    /// The first busy answer.
    since: Option<Instant>,
    tries: u32,
}

impl BusyWait {
    /// Pauses before the next try, saying so in `progress`; false when
    /// the wait is spent or the transfer was interrupted.
    fn pause(
        &mut self,
        config: &SendConfig,
        progress: &Progress,
        hint: Duration,
        why: &str,
    ) -> bool {
        let now = Instant::now();
        let until = *self.since.get_or_insert(now) + config.wait_busy;
        if now >= until {
            return false;
        }
        let base = Duration::from_millis(500 << self.tries.min(4)).max(hint);
        let stretch = 0.5 + (crate::io::fresh_conn_id() % 1000) as f64 / 1000.0;
        let pause = base.mul_f64(stretch).min(until - now);
        self.tries += 1;
        progress.set_stage(format!(
            "waiting for the server, busy ({why}): again in {:.1} s",
            pause.as_secs_f64()
        ));
        let end = now + pause;
        while Instant::now() < end {
            if progress.stop.load(Ordering::Relaxed) {
                return false;
            }
            std::thread::sleep((end - Instant::now()).min(Duration::from_millis(50)));
        }
        true
    }

    /// Seconds since the first busy answer.
    fn waited(&self) -> f64 {
        self.since.map_or(0.0, |s| s.elapsed().as_secs_f64())
    }
}

/// A connection turned away because the receiver is at a limit, before
/// anything was sent on it.
fn refused_busy(e: &SendError) -> bool {
    use crate::proto::crypto::handshake::HandshakeError as H;
    use crate::proto::crypto::RefuseReason;
    use crate::proto::ConnError as C;
    matches!(
        e,
        SendError::Conn(ProbeError::Conn {
            error: C::Busy
                | C::AuthRefused(RefuseReason::Busy)
                | C::Handshake(H::Refused(RefuseReason::Busy)),
            ..
        })
    )
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
    /// File bytes to send in this round (after skips and resume).
    pub total: AtomicU64,
    /// File bytes acknowledged by the receiver.
    pub done: AtomicU64,
    /// What is happening, for the display.
    pub stage: Mutex<String>,
    /// Files being sent, by name.
    pub current: Mutex<Vec<String>>,
    pub stop: AtomicBool,
    /// Keep [`Progress::streams`] up to date (it costs a trace record per
    /// segment and per ACK, so only a display that shows it asks).
    pub detail: AtomicBool,
    /// The data streams of the current round, with `detail`.
    pub streams: Mutex<Vec<Arc<StreamLive>>>,
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

/// Fills a [`StreamLive`] from a connection's trace records.
struct Live<'a> {
    live: &'a StreamLive,
    /// Highest segment sent so far: one sent again is at or below it.
    top: Option<u64>,
}

impl Observer for Live<'_> {
    fn on_trace(&mut self, record: &crate::proto::TraceRecord) {
        use crate::proto::TraceRecord;
        match *record {
            TraceRecord::Xmt { seg, .. } => {
                if self.top.is_some_and(|t| seg <= t) {
                    self.live.rxmts.fetch_add(1, Ordering::Relaxed);
                } else {
                    self.top = Some(seg);
                }
            }
            TraceRecord::Ack { cwnd, ssthresh, .. } => {
                self.live.cwnd.store(cwnd, Ordering::Relaxed);
                self.live.ssthresh.store(ssthresh, Ordering::Relaxed);
            }
            // The sender's own smoothed RTT, not one recomputed here.
            TraceRecord::State { srtt, .. } => {
                self.live
                    .srtt_us
                    .store(srtt.as_micros() as u64, Ordering::Relaxed);
            }
            TraceRecord::Sack { .. } => {}
        }
    }
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct SendReport {
    pub host: String,
    /// `--shard K/N`: every figure below is of this shard's part.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shard: Option<String>,
    pub files: u64,
    /// Of `files`, those split across shards that this shard sent a part
    /// of: each takes its name at the receiver when every part is in.
    pub files_in_part: u64,
    pub dirs: u64,
    pub symlinks: u64,
    /// Files the receiver already had (`--skip-existing`).
    pub skipped_files: u64,
    /// File bytes in the manifest (of a file sent in part, the part's).
    pub bytes_total: u64,
    /// File bytes sent (chunks; a chunk sent twice counts twice).
    pub bytes_sent: u64,
    /// File bytes not sent: skipped files and chunks the receiver held.
    pub bytes_skipped: u64,
    pub chunks_resent: u64,
    pub secs: f64,
    /// File bytes sent per second of the whole run, in bits/s.
    pub goodput_bps: f64,
    pub rounds: usize,
    /// Every file verified by the receiver (BLAKE3 per chunk and per file).
    pub verified: bool,
    /// One transport summary per connection that carried data.
    pub streams: Vec<Summary>,
    /// A dry run's answer, file by file in manifest order; `None` for a
    /// real run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dry_run: Option<Vec<PlannedFile>>,
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

/// A stream whose bytes are all in memory: a plan or finish request.
struct BytesFeed(Vec<u8>);

impl PayloadSource for BytesFeed {
    fn read_at(&mut self, offset: u64, buf: &mut [u8]) {
        let at = offset as usize;
        buf.copy_from_slice(&self.0[at..at + buf.len()]);
    }
}

impl StreamFeed for BytesFeed {
    fn refill(&mut self, _acked: u64) -> Result<Option<u64>, String> {
        Ok(None)
    }

    fn waker(&self) -> Option<Arc<Notify>> {
        None
    }
}

/// What a connection's trace records feed: the figures of `--progress
/// json` ([`Live`]) and the `--trace`/`--plot` file, either, both or
/// neither.
struct Watch<'a> {
    live: Option<Live<'a>>,
    take: Option<TraceTaker>,
}

impl Observer for Watch<'_> {
    fn on_event(&mut self, _: &crate::proto::TimedEvent) {}
    fn on_trace(&mut self, r: &crate::proto::TraceRecord) {
        if let Some(live) = self.live.as_mut() {
            live.on_trace(r);
        }
        if let Some(take) = self.take.as_mut() {
            take(r);
        }
    }
}

/// A data connection: its place (repair round, stream number from 1) for
/// its trace file, and where `--progress json` reads its figures.
#[derive(Clone, Copy)]
struct DataConn<'a> {
    round: usize,
    stream: usize,
    live: Option<&'a StreamLive>,
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("cannot start the I/O runtime")
}

/// What a connection waits for at its end.
#[derive(Clone, Copy)]
struct Ending {
    /// The longest reply the request can be answered with; a longer one
    /// is refused.
    reply_limit: u64,
    /// Done once the reply is in, without the close's acknowledgement
    /// (and the server's counters it carries): a round trip saved.
    close_unacknowledged: bool,
}

/// Runs one connection of `session` carrying `feed`; returns the reply
/// and the transport's summary. A connection turned away busy is tried
/// again, within `--wait-busy`.
#[allow(clippy::too_many_arguments)]
fn run_conn<F: StreamFeed>(
    config: &SendConfig,
    from: Option<&Bound>,
    session: u64,
    len: u64,
    feed: &mut F,
    stop: &Progress,
    ending: Ending,
    data: Option<DataConn<'_>>,
) -> (Result<Vec<u8>, SendError>, Option<Summary>) {
    let mut busy = BusyWait::default();
    loop {
        let (result, summary) = run_conn_once(config, from, session, len, feed, stop, ending, data);
        match &result {
            Err(e)
                if refused_busy(e) && busy.pause(config, stop, Duration::ZERO, &e.to_string()) => {}
            _ => return (result, summary),
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn run_conn_once<F: StreamFeed>(
    config: &SendConfig,
    from: Option<&Bound>,
    session: u64,
    len: u64,
    feed: &mut F,
    stop: &Progress,
    ending: Ending,
    data: Option<DataConn<'_>>,
) -> (Result<Vec<u8>, SendError>, Option<Summary>) {
    let socket = match from.map(|b| b.socket.try_clone()).transpose() {
        Ok(s) => s,
        Err(error) => {
            let peer = from.map_or(config.peer, |b| b.peer);
            return (
                Err(SendError::Conn(ProbeError::Socket { peer, error })),
                None,
            );
        }
    };
    let probe = ProbeConfig {
        auth: config.auth.clone(),
        peer: from.map_or(config.peer, |b| b.peer),
        peer_name: config.host.clone(),
        tuning: config.tuning.clone(),
        bytes: Some(len),
        trace: data
            .as_ref()
            .is_some_and(|d| d.live.is_some() || config.trace.is_some()),
        conn_id: fresh_conn_id(),
        session,
        reply_limit: u32::try_from(ending.reply_limit).unwrap_or(u32::MAX),
        close_unacknowledged: ending.close_unacknowledged,
        path_memory: config.path_memory,
    };
    let stopped = async {
        while !stop.stop.load(Ordering::Relaxed) {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    };
    let mut watch = Watch {
        live: data
            .as_ref()
            .and_then(|d| d.live)
            .map(|live| Live { live, top: None }),
        take: config
            .trace
            .as_ref()
            .zip(data.as_ref())
            .map(|(sink, d)| (sink.0)(d.round, d.stream)),
    };
    let result = runtime().block_on(io::connect_from(socket, probe, feed, &mut watch, stopped));
    // The connection's trace is complete: its taker may finish it.
    drop(watch);
    let reply = match result.outcome {
        Ok(closed) => closed.reply.ok_or_else(|| SendError::Failed {
            host: config.host.clone(),
            why: "the connection closed without a reply".into(),
        }),
        Err(ProbeError::Interrupted) => Err(SendError::Interrupted),
        Err(ProbeError::Source(why)) => Err(SendError::Source(why)),
        Err(e) => Err(SendError::Conn(e)),
    };
    (reply, result.summary)
}

/// Sends a request held in memory (a plan or a finish) on a connection of
/// its own and returns the reply, at most `reply_limit` bytes.
fn ask(
    config: &SendConfig,
    from: Option<&Bound>,
    session: u64,
    request: Vec<u8>,
    stop: &Progress,
    reply_limit: u64,
) -> Result<Vec<u8>, SendError> {
    let len = request.len() as u64;
    // The reply is all a request wants (the data streams keep waiting
    // for the close's acknowledgement: its receiver counters go in the
    // report).
    let ending = Ending {
        reply_limit,
        close_unacknowledged: true,
    };
    run_conn(
        config,
        from,
        session,
        len,
        &mut BytesFeed(request),
        stop,
        ending,
        None,
    )
    .0
}

fn outcome(config: &SendConfig, reply: &[u8]) -> Result<Vec<ChunkRef>, SendError> {
    match Outcome::decode(reply) {
        Ok(Outcome::Done { bad }) => Ok(bad),
        Ok(Outcome::Failed(why)) => Err(SendError::Failed {
            host: config.host.clone(),
            why,
        }),
        Ok(Outcome::Refused(why)) => Err(SendError::Refused {
            host: config.host.clone(),
            why,
        }),
        Ok(Outcome::Mismatch(why)) => Err(SendError::Unverified {
            host: config.host.clone(),
            why,
        }),
        Err(e) => Err(SendError::BadReply {
            host: config.host.clone(),
            why: e.to_string(),
        }),
    }
}

/// The chunks a data stream's answer names as bad, each checked to be one
/// the stream carried (the server chose these numbers), once each.
fn carried(
    config: &SendConfig,
    share: &[ChunkRef],
    bad: Vec<ChunkRef>,
) -> Result<Vec<ChunkRef>, SendError> {
    let sent: HashSet<ChunkRef> = share.iter().copied().collect();
    let mut seen = HashSet::with_capacity(bad.len().min(sent.len()));
    for c in &bad {
        if !sent.contains(c) {
            return Err(SendError::BadReply {
                host: config.host.clone(),
                why: format!(
                    "it names chunk {} of file {}, which that stream did not carry",
                    c.chunk, c.file
                ),
            });
        }
        seen.insert(*c);
    }
    let mut bad: Vec<ChunkRef> = seen.into_iter().collect();
    bad.sort_unstable();
    Ok(bad)
}

/// A chunk read from disk: its data followed by its BLAKE3 value.
struct ReadDone {
    slot: usize,
    result: Result<Vec<u8>, String>,
}

struct ReadJob {
    sources: Arc<Sources>,
    file: usize,
    chunk: u64,
    slot: usize,
    done: mpsc::Sender<ReadDone>,
    notify: Arc<Notify>,
}

/// Chunk buffers handed back once the receiver has acknowledged them, so
/// that a reader neither zeroes nor faults in a fresh megabyte for every
/// chunk (a 1 GiB copy spent 4 % of its CPU in memset doing so).
#[derive(Default)]
struct ChunkPool(Mutex<Vec<Vec<u8>>>);

impl ChunkPool {
    /// Enough for the read-ahead of a few streams; past it buffers are
    /// freed, so an idle pool holds at most this many megabytes.
    const KEEP: usize = 32;

    fn take(&self, len: usize) -> Vec<u8> {
        let mut buf = self.0.lock().expect("pool lock").pop().unwrap_or_default();
        // Zeroes only what the buffer did not hold already.
        buf.resize(len, 0);
        buf
    }

    fn give(&self, buf: Vec<u8>) {
        let mut pool = self.0.lock().expect("pool lock");
        if pool.len() < Self::KEEP {
            pool.push(buf);
        }
    }
}

/// Reads a chunk from its file's one descriptor (see [`Sources`]) and
/// appends its BLAKE3 value.
fn read_chunk(job: &ReadJob, pool: &ChunkPool) -> Result<Vec<u8>, String> {
    let size = job.sources.size(job.file);
    let len = chunk_len(size, job.chunk);
    let mut buf = pool.take(len + CV_LEN as usize);
    job.sources
        .read_chunk(job.file, job.chunk, &mut buf[..len])?;
    let cv = chunk_cv(size, job.chunk, &buf[..len]);
    buf[len..].copy_from_slice(&cv);
    Ok(buf)
}

/// Reader threads: read and hash chunks for whichever stream asks.
struct Readers {
    jobs: mpsc::Sender<ReadJob>,
    pool: Arc<ChunkPool>,
}

impl Readers {
    fn start(n: usize) -> Readers {
        let (jobs, rx) = mpsc::channel::<ReadJob>();
        let rx = Arc::new(Mutex::new(rx));
        let pool = Arc::new(ChunkPool::default());
        for i in 0..n.max(1) {
            let rx = rx.clone();
            let pool = pool.clone();
            thread::Builder::new()
                .name(format!("atou-reader-{i}"))
                .spawn(move || loop {
                    let job = match rx.lock().expect("a reader panicked").recv() {
                        Ok(j) => j,
                        Err(_) => return,
                    };
                    let result = read_chunk(&job, &pool);
                    let _ = job.done.send(ReadDone {
                        slot: job.slot,
                        result,
                    });
                    job.notify.notify_one();
                })
                .expect("cannot start a reader thread");
        }
        Readers { jobs, pool }
    }
}

/// One data stream's bytes: its header, then chunks read ahead by the
/// readers, each freed once acknowledged.
struct FileFeed {
    header: Vec<u8>,
    layout: Layout,
    sources: Arc<Sources>,
    jobs: mpsc::Sender<ReadJob>,
    pool: Arc<ChunkPool>,
    done_tx: mpsc::Sender<ReadDone>,
    done_rx: mpsc::Receiver<ReadDone>,
    notify: Arc<Notify>,
    /// Chunks read and not yet acknowledged, by slot.
    ready: BTreeMap<usize, Vec<u8>>,
    /// Next slot to ask the readers for.
    next_request: usize,
    /// Bytes asked for or held, not yet freed.
    held_bytes: u64,
    budget: u64,
    /// Every slot below this one is acknowledged and freed.
    first_held: usize,
    /// Every stream byte below this is ready.
    contiguous: u64,
    cvs: Vec<(ChunkRef, Cv)>,
    progress: Arc<Progress>,
    /// Stream bytes of acknowledged data counted into progress so far.
    counted: u64,
    /// This stream's place in `progress.current`, and the files' names.
    index: usize,
    names: Arc<Vec<String>>,
    live: Arc<StreamLive>,
    siblings: Siblings,
}

/// The streams of one round, as each sees the others finish: once every
/// byte of a stream is acknowledged, the rest hear of it once each
/// (`StreamFeed::sibling_done`).
#[derive(Debug, Clone, Default)]
struct Siblings {
    /// Streams of the round whose every byte is acknowledged.
    finished: Arc<AtomicUsize>,
    /// How many of them this stream has heard of, itself included.
    heard: usize,
    done: bool,
}

impl Siblings {
    /// This stream has `acked` of its `total` bytes acknowledged.
    fn acked(&mut self, acked: u64, total: u64) {
        if !self.done && acked >= total {
            self.done = true;
            self.finished.fetch_add(1, Ordering::Relaxed);
            self.heard += 1;
        }
    }

    /// True when another stream has finished since the last call.
    fn news(&mut self) -> bool {
        let finished = self.finished.load(Ordering::Relaxed);
        let news = finished > self.heard;
        self.heard = finished;
        news
    }
}

impl FileFeed {
    fn slot_bytes(&self, i: usize) -> u64 {
        u64::from(self.layout.slots[i].len) + CV_LEN
    }
}

impl PayloadSource for FileFeed {
    fn read_at(&mut self, mut offset: u64, mut buf: &mut [u8]) {
        while !buf.is_empty() {
            let (src, at): (&[u8], u64) = if offset < self.layout.header_len {
                (&self.header, offset)
            } else {
                let i = self
                    .layout
                    .slot_at(offset)
                    .expect("the sender reads inside the stream");
                let data = self
                    .ready
                    .get(&i)
                    .expect("the sender reads only bytes made available");
                (data, offset - self.layout.slots[i].offset)
            };
            let n = (src.len() - at as usize).min(buf.len());
            buf[..n].copy_from_slice(&src[at as usize..at as usize + n]);
            buf = &mut buf[n..];
            offset += n as u64;
        }
    }
}

impl StreamFeed for FileFeed {
    fn refill(&mut self, acked: u64) -> Result<Option<u64>, String> {
        self.siblings.acked(acked, self.layout.total_len());
        while let Ok(done) = self.done_rx.try_recv() {
            let buf = done.result?;
            let slot = self.layout.slots[done.slot];
            let len = slot.len as usize;
            let cv: Cv = buf[len..].try_into().expect("32 bytes");
            self.cvs.push((slot.chunk, cv));
            self.ready.insert(done.slot, buf);
        }
        // Free what the receiver has acknowledged.
        while self.first_held < self.next_request
            && self.layout.slots[self.first_held].end() <= acked
        {
            let Some(buf) = self.ready.remove(&self.first_held) else {
                break;
            };
            self.pool.give(buf);
            self.held_bytes -= self.slot_bytes(self.first_held);
            let len = u64::from(self.layout.slots[self.first_held].len);
            self.progress.done.fetch_add(len, Ordering::Relaxed);
            self.live.bytes.fetch_add(len, Ordering::Relaxed);
            self.counted += len;
            self.first_held += 1;
            if let Some(next) = self.layout.slots.get(self.first_held) {
                let name = &self.names[next.chunk.file as usize];
                let mut current = self.progress.current.lock().expect("progress lock");
                if current.get(self.index) != Some(name) {
                    if let Some(c) = current.get_mut(self.index) {
                        c.clone_from(name);
                    }
                }
            }
        }
        // Read ahead within the budget (always at least one chunk).
        while self.next_request < self.layout.slots.len()
            && (self.held_bytes == 0
                || self.held_bytes + self.slot_bytes(self.next_request) <= self.budget)
        {
            let i = self.next_request;
            let slot = self.layout.slots[i];
            let file = slot.chunk.file as usize;
            let _ = self.jobs.send(ReadJob {
                sources: self.sources.clone(),
                file,
                chunk: slot.chunk.chunk,
                slot: i,
                done: self.done_tx.clone(),
                notify: self.notify.clone(),
            });
            self.held_bytes += self.slot_bytes(i);
            self.next_request += 1;
        }
        let mut end = self.contiguous.max(self.layout.header_len);
        let mut i = self.layout.slot_at(end).unwrap_or(self.layout.slots.len());
        while i < self.layout.slots.len() && self.ready.contains_key(&i) {
            end = self.layout.slots[i].end();
            i += 1;
        }
        self.contiguous = end;
        Ok(Some(end))
    }

    fn waker(&self) -> Option<Arc<Notify>> {
        Some(self.notify.clone())
    }

    fn sibling_done(&mut self) -> bool {
        self.siblings.news()
    }
}

/// What one data stream gives back.
struct StreamResult {
    bad: Result<Vec<ChunkRef>, SendError>,
    cvs: Vec<(ChunkRef, Cv)>,
    summary: Option<Summary>,
    sent: u64,
}

struct Plan {
    entries: Vec<LocalEntry>,
    /// Per file: the chunks this session sends of a file split across
    /// shards, `None` for a file sent whole.
    parts: Vec<Option<Range<u64>>>,
    /// Per file: where it is here, opened for reading as chunks are read.
    sources: Arc<Sources>,
    sizes: Arc<Vec<u64>>,
    names: Arc<Vec<String>>,
}

impl Plan {
    /// The chunks of file `f` this session sends: all of them, or its part.
    fn chunks(&self, f: usize) -> Range<u64> {
        self.parts[f]
            .clone()
            .unwrap_or(0..chunk_count(self.sizes[f]))
    }

    /// The bytes of file `f` this session sends: its size, or its part's.
    fn bytes(&self, f: usize) -> u64 {
        match &self.parts[f] {
            Some(part) => part_bytes(self.sizes[f], part),
            None => self.sizes[f],
        }
    }
}

/// Shares chunks out over `n` streams: largest files first, each chunk
/// to the stream with the fewest bytes so far.
fn share_out(chunks: &[ChunkRef], sizes: &[u64], n: usize) -> Vec<Vec<ChunkRef>> {
    let mut order: Vec<ChunkRef> = chunks.to_vec();
    order.sort_by_key(|c| (std::cmp::Reverse(sizes[c.file as usize]), c.file, c.chunk));
    let mut streams: Vec<(u64, Vec<ChunkRef>)> = vec![(0, Vec::new()); n.max(1)];
    for c in order {
        let s = streams
            .iter_mut()
            .min_by_key(|(bytes, _)| *bytes)
            .expect("at least one stream");
        s.0 += chunk_len(sizes[c.file as usize], c.chunk) as u64;
        s.1.push(c);
    }
    streams
        .into_iter()
        .map(|(_, c)| c)
        .filter(|c| !c.is_empty())
        .collect()
}

/// Chunks the receiver holds, split by comparing them with ours.
struct Compared {
    /// Different from ours: to send.
    differ: Vec<ChunkRef>,
    /// The same as ours, with their values.
    same: Vec<(ChunkRef, Cv)>,
}

/// Hashes our copy of the chunks the receiver already holds, on the
/// reader threads, and compares.
fn compare_held(
    plan: &Plan,
    held: &[(usize, Vec<Cv>)],
    readers: &Readers,
) -> Result<Compared, SendError> {
    let (tx, rx) = mpsc::channel();
    let notify = Arc::new(Notify::new());
    let mut jobs = Vec::new();
    for (file, _) in held {
        // Of a file sent in part, only the part's chunks are ours to send.
        for chunk in plan.chunks(*file) {
            jobs.push(ChunkRef {
                file: *file as u32,
                chunk,
            });
        }
    }
    for c in &jobs {
        plan.sources.expect(c.file as usize, 1);
    }
    for (slot, c) in jobs.iter().enumerate() {
        let _ = readers.jobs.send(ReadJob {
            sources: plan.sources.clone(),
            file: c.file as usize,
            chunk: c.chunk,
            slot,
            done: tx.clone(),
            notify: notify.clone(),
        });
    }
    drop(tx);
    let theirs: BTreeMap<ChunkRef, Cv> = held
        .iter()
        .flat_map(|(f, cvs)| {
            cvs.iter().enumerate().map(move |(k, cv)| {
                (
                    ChunkRef {
                        file: *f as u32,
                        chunk: k as u64,
                    },
                    *cv,
                )
            })
        })
        .collect();
    let mut differ = Vec::new();
    let mut same = Vec::new();
    for done in rx {
        let buf = done.result.map_err(SendError::Source)?;
        let c = jobs[done.slot];
        let len = buf.len() - CV_LEN as usize;
        let ours: Cv = buf[len..].try_into().expect("32 bytes");
        if theirs.get(&c) == Some(&ours) {
            same.push((c, ours));
        } else {
            differ.push(c);
        }
    }
    differ.sort();
    Ok(Compared { differ, same })
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
    let result = send_session(sources, config, from, &progress, &mut session);
    if let (Err(e), Some(id)) = (&result, session) {
        let why = match e {
            SendError::Interrupted => "interrupted".to_string(),
            other => other.to_string(),
        };
        let mut quick = config.clone();
        quick.tuning.maxidle = std::time::Duration::from_secs(2);
        // Best effort: the receiver may be what failed.
        let _ = ask(
            &quick,
            from.first(),
            id,
            encode_abort(&why),
            &Progress::default(),
            Outcome::max_len(0),
        );
    }
    result
}

fn send_session(
    sources: &[PathBuf],
    config: &SendConfig,
    from: &[Bound],
    progress: &Arc<Progress>,
    session_out: &mut Option<u64>,
) -> Result<SendReport, SendError> {
    let progress = progress.clone();
    let started = Instant::now();
    progress.set_stage("reading the sources");
    let walked = walk(sources, config.follow, &config.excludes)?;
    let selected = match config.shard {
        Some(shard) => shard.select(walked),
        None => walked
            .into_iter()
            .map(|entry| Selected { entry, part: None })
            .collect(),
    };
    let mut entries = Vec::with_capacity(selected.len());
    let mut parts = Vec::new();
    for Selected { entry, part } in selected {
        if matches!(entry.entry.kind, EntryKind::File { .. }) {
            parts.push(part);
        }
        entries.push(entry);
    }
    let manifest = manifest_of(&entries);
    let mut specs = Vec::new();
    let mut sizes = Vec::new();
    let mut names = Vec::new();
    let (mut dirs, mut symlinks) = (0, 0);
    for e in &entries {
        match &e.entry.kind {
            EntryKind::File { size } => {
                let Some(stamp) = e.stamp else {
                    let shown = shown_path(&e.source);
                    return Err(SendError::Source(format!(
                        "{shown} was not read by the walk"
                    )));
                };
                specs.push(SourceSpec {
                    top: e.top.clone(),
                    path: e.entry.path.clone(),
                    shown: e.source.clone(),
                    stamp,
                    follow: config.follow,
                });
                sizes.push(*size);
                names.push(e.entry.path.to_string());
            }
            EntryKind::Dir => dirs += 1,
            EntryKind::Symlink { .. } => symlinks += 1,
        }
    }
    let plan = Plan {
        entries,
        parts,
        sources: Arc::new(Sources::new(specs)),
        sizes: Arc::new(sizes),
        names: Arc::new(names),
    };
    let bytes_total: u64 = (0..plan.sizes.len()).map(|f| plan.bytes(f)).sum();
    let files_in_part = plan.parts.iter().filter(|p| p.is_some()).count() as u64;
    let session = fresh_conn_id() | 1;

    // 1. The plan.
    progress.set_stage(format!(
        "sending the manifest ({} entries)",
        plan.entries.len()
    ));
    let request = PlanRequest {
        // The receiver learns it is one shard of several from this bit.
        options: Options {
            shard: config.shard.is_some(),
            ..config.options
        },
        subdir: config.subdir.clone(),
        manifest,
        parts: plan
            .parts
            .iter()
            .enumerate()
            .filter_map(|(f, p)| {
                p.clone().map(|chunks| FilePart {
                    file: f as u32,
                    chunks,
                })
            })
            .collect(),
    }
    .encode();
    let mut busy = BusyWait::default();
    let plans = loop {
        let reply = ask(
            config,
            from.first(),
            session,
            request.clone(),
            &progress,
            PlanReply::max_len(&plan.sizes),
        )?;
        match PlanReply::decode(&reply, &plan.sizes) {
            Ok(PlanReply::Accepted(p)) => {
                *session_out = Some(session);
                break p;
            }
            Ok(PlanReply::Busy { retry_after, why }) => {
                if busy.pause(config, &progress, retry_after, &why) {
                    continue;
                }
                if progress.stop.load(Ordering::Relaxed) {
                    return Err(SendError::Interrupted);
                }
                return Err(SendError::Busy {
                    host: config.host.clone(),
                    why,
                    waited: busy.waited(),
                });
            }
            Ok(PlanReply::Refused(why)) => {
                return Err(SendError::Refused {
                    host: config.host.clone(),
                    why,
                })
            }
            Err(e) => {
                return Err(SendError::BadReply {
                    host: config.host.clone(),
                    why: e.to_string(),
                })
            }
        }
    };

    // 2. What to send.
    let readers = Readers::start(config.readers);
    let mut cvs: Vec<Vec<Option<Cv>>> = plan
        .sizes
        .iter()
        .map(|&s| vec![None; chunk_count(s) as usize])
        .collect();
    let mut to_send = Vec::new();
    let mut held = Vec::new();
    let mut skipped_files = 0;
    let mut bytes_skipped = 0;
    for (f, p) in plans.iter().enumerate() {
        match p {
            FilePlan::SendAll => to_send.extend(plan.chunks(f).map(|chunk| ChunkRef {
                file: f as u32,
                chunk,
            })),
            FilePlan::Skip => {
                skipped_files += 1;
                bytes_skipped += plan.bytes(f);
            }
            FilePlan::Held(theirs) => held.push((f, theirs.clone())),
        }
    }
    if !held.is_empty() {
        progress.set_stage(format!(
            "comparing {} partial file{} at the receiver",
            held.len(),
            if held.len() == 1 { "" } else { "s" }
        ));
        let Compared { differ, same } = compare_held(&plan, &held, &readers)?;
        for (c, cv) in same {
            bytes_skipped += chunk_len(plan.sizes[c.file as usize], c.chunk) as u64;
            cvs[c.file as usize][c.chunk as usize] = Some(cv);
        }
        to_send.extend(differ);
    }

    if config.options.dry_run {
        // The receiver has answered and kept nothing: no data, no finish.
        return Ok(dry_run_report(
            config,
            &plan,
            &plans,
            &to_send,
            (dirs, symlinks),
            started,
        ));
    }

    // 3–4. Data, in rounds.
    let mut summaries = Vec::new();
    let mut bytes_sent = 0;
    let mut chunks_resent = 0;
    let mut rounds = 0;
    // Chunks the previous repair round re-sent.
    let mut repaired: Option<u64> = None;
    while !to_send.is_empty() {
        rounds += 1;
        // A repair round of more than a few chunks must fix a tenth of
        // them, or the path corrupts (past the UDP checksum) too much for
        // 1 MiB chunks; a few chunks get every chance up to MAX_ROUNDS.
        let bad = to_send.len() as u64;
        if rounds > MAX_ROUNDS || repaired.is_some_and(|r| bad > 16 && bad * 10 > r * 9) {
            return Err(SendError::Unverified {
                host: config.host.clone(),
                why: format!(
                    "{bad} chunks still failed their BLAKE3 check after {} rounds; \
                     the path corrupts data faster than it can be repaired",
                    rounds - 1
                ),
            });
        }
        if rounds > 1 {
            repaired = Some(bad);
        }
        let total: u64 = to_send
            .iter()
            .map(|c| chunk_len(plan.sizes[c.file as usize], c.chunk) as u64)
            .sum();
        progress.total.fetch_add(total, Ordering::Relaxed);
        progress.set_stage(if rounds == 1 {
            "sending".to_string()
        } else {
            format!("sending {} chunks again", to_send.len())
        });
        for c in &to_send {
            plan.sources.expect(c.file as usize, 1);
        }
        let shares = share_out(&to_send, &plan.sizes, config.streams);
        let budget = (config.buffer / shares.len().max(1) as u64).max(2 * (CHUNK_SIZE + CV_LEN));
        {
            let mut current = progress.current.lock().expect("progress lock");
            current.clear();
            for share in &shares {
                if let Some(c) = share.first() {
                    current.push(plan.names[c.file as usize].clone());
                }
            }
        }
        let lives: Vec<Arc<StreamLive>> = shares.iter().map(|_| Arc::default()).collect();
        let siblings = Siblings::default();
        let detail = progress.detail.load(Ordering::Relaxed);
        if detail {
            *progress.streams.lock().expect("progress lock") = lives.clone();
        }
        let results: Vec<StreamResult> = thread::scope(|scope| {
            let handles: Vec<_> = shares
                .iter()
                .enumerate()
                .map(|(index, share)| {
                    let header = header_for(share);
                    let layout = Layout::new(&header, &plan.sizes);
                    let (done_tx, done_rx) = mpsc::channel();
                    let mut feed = FileFeed {
                        header: header.encode(),
                        layout,
                        sources: plan.sources.clone(),
                        jobs: readers.jobs.clone(),
                        pool: readers.pool.clone(),
                        done_tx,
                        done_rx,
                        notify: Arc::new(Notify::new()),
                        ready: BTreeMap::new(),
                        next_request: 0,
                        held_bytes: 0,
                        budget,
                        first_held: 0,
                        contiguous: 0,
                        cvs: Vec::new(),
                        progress: progress.clone(),
                        counted: 0,
                        index,
                        names: plan.names.clone(),
                        live: lives[index].clone(),
                        siblings: siblings.clone(),
                    };
                    let sent: u64 = feed.layout.slots.iter().map(|s| u64::from(s.len)).sum();
                    let progress = &progress;
                    scope.spawn(move || {
                        let len = feed.layout.total_len();
                        let limit = Outcome::max_len(feed.layout.slots.len() as u64);
                        let bound = (!from.is_empty()).then(|| &from[index % from.len()]);
                        let live = detail.then(|| feed.live.clone());
                        let data = DataConn {
                            round: rounds,
                            stream: index + 1,
                            live: live.as_deref(),
                        };
                        let (reply, summary) = run_conn(
                            config,
                            bound,
                            session,
                            len,
                            &mut feed,
                            progress,
                            Ending {
                                reply_limit: limit,
                                close_unacknowledged: false,
                            },
                            Some(data),
                        );
                        // Whatever was acknowledged but not yet counted.
                        let rest = sent.saturating_sub(feed.counted);
                        progress.done.fetch_add(rest, Ordering::Relaxed);
                        feed.live.bytes.fetch_add(rest, Ordering::Relaxed);
                        StreamResult {
                            bad: reply
                                .and_then(|r| outcome(config, &r))
                                .and_then(|bad| carried(config, share, bad)),
                            cvs: std::mem::take(&mut feed.cvs),
                            summary,
                            sent,
                        }
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("a stream thread panicked"))
                .collect()
        });
        let mut bad = Vec::new();
        let mut first_error = None;
        for r in results {
            summaries.extend(r.summary);
            bytes_sent += r.sent;
            for (c, cv) in r.cvs {
                cvs[c.file as usize][c.chunk as usize] = Some(cv);
            }
            match r.bad {
                Ok(b) => bad.extend(b),
                Err(e) => {
                    if first_error.is_none() {
                        first_error = Some(e);
                    }
                }
            }
        }
        if let Some(e) = first_error {
            return Err(e);
        }
        chunks_resent += bad.len() as u64;
        to_send = bad;
    }

    // 5. The finish.
    progress.set_stage("verifying at the receiver");
    progress.current.lock().expect("progress lock").clear();
    let mut hashes = Vec::with_capacity(plan.sizes.len());
    for (f, file_cvs) in cvs.iter().enumerate() {
        if plans[f] == FilePlan::Skip {
            hashes.push([0; 32]);
            continue;
        }
        let range = plan.chunks(f);
        let first = range.start;
        let ours: Option<Vec<Cv>> = file_cvs[range.start as usize..range.end as usize]
            .iter()
            .copied()
            .collect();
        let ours = ours.expect("every chunk was read or compared");
        hashes.push(match plan.parts[f] {
            Some(_) => part_digest(plan.sizes[f], first, &ours),
            None => *file_hash(plan.sizes[f], &ours)
                .expect("one per chunk")
                .as_bytes(),
        });
    }
    let request = encode_finish(&hashes);
    let reply = ask(
        config,
        from.first(),
        session,
        request,
        &progress,
        Outcome::max_len(0),
    )?;
    outcome(config, &reply)?;
    let secs = started.elapsed().as_secs_f64();
    let files = plan.sizes.len() as u64;
    Ok(SendReport {
        host: config.host.clone(),
        shard: config.shard.map(|s| s.to_string()),
        files,
        files_in_part,
        dirs,
        symlinks,
        skipped_files,
        bytes_total,
        bytes_sent,
        bytes_skipped,
        chunks_resent,
        secs,
        goodput_bps: if secs > 0.0 {
            bytes_sent as f64 * 8.0 / secs
        } else {
            0.0
        },
        rounds,
        verified: true,
        streams: summaries,
        dry_run: None,
    })
}

/// A dry run's report: per file what the receiver's plan means. Every
/// figure is counted from our own files and the chunks we would send;
/// the reply (decoded against our sizes) only chose among them.
fn dry_run_report(
    config: &SendConfig,
    plan: &Plan,
    plans: &[FilePlan],
    to_send: &[ChunkRef],
    (dirs, symlinks): (u64, u64),
    started: Instant,
) -> SendReport {
    let mut send_bytes = vec![0u64; plan.sizes.len()];
    for c in to_send {
        if let Some(b) = send_bytes.get_mut(c.file as usize) {
            *b += chunk_len(plan.sizes[c.file as usize], c.chunk) as u64;
        }
    }
    let files: Vec<PlannedFile> = plans
        .iter()
        .zip(plan.sizes.iter().zip(plan.names.iter()))
        .zip(&send_bytes)
        .enumerate()
        .map(|(f, ((p, (&size, name)), &bytes))| PlannedFile {
            path: name.clone(),
            size,
            part: plan.parts[f].clone().map(|r| [r.start, r.end]),
            // An empty file is sent (created) unless the plan skips it.
            action: if *p == FilePlan::Skip || (bytes == 0 && matches!(p, FilePlan::Held(_))) {
                "skip"
            } else {
                "send"
            },
            send_bytes: bytes,
        })
        .collect();
    let bytes_total: u64 = (0..plan.sizes.len()).map(|f| plan.bytes(f)).sum();
    let bytes_sent: u64 = send_bytes.iter().sum();
    let skipped = files.iter().filter(|f| f.action == "skip").count() as u64;
    SendReport {
        host: config.host.clone(),
        shard: config.shard.map(|s| s.to_string()),
        files: files.len() as u64,
        files_in_part: plan.parts.iter().filter(|p| p.is_some()).count() as u64,
        dirs,
        symlinks,
        skipped_files: skipped,
        bytes_total,
        bytes_sent,
        bytes_skipped: bytes_total - bytes_sent.min(bytes_total),
        chunks_resent: 0,
        secs: started.elapsed().as_secs_f64(),
        goodput_bps: 0.0,
        rounds: 0,
        verified: false,
        streams: Vec::new(),
        dry_run: Some(files),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each stream hears of every other stream's finish once, and never
    /// of its own.
    #[test]
    fn a_stream_hears_once_of_each_other_stream_finishing() {
        let a = Siblings::default();
        let (mut a, mut b, mut c) = (a.clone(), a.clone(), a);
        a.acked(50, 100);
        assert!(!a.news() && !b.news() && !c.news());
        a.acked(100, 100);
        a.acked(100, 100);
        assert!(!a.news(), "its own finish");
        assert!(b.news());
        assert!(!b.news(), "once");
        b.acked(100, 100);
        assert!(a.news());
        assert!(!b.news());
        assert!(c.news(), "two finishes, heard as news");
        assert!(!c.news());
    }

    #[test]
    fn chunks_are_shared_largest_files_first_and_balanced() {
        let sizes = [CHUNK_SIZE, 3 * CHUNK_SIZE, 10];
        let chunks: Vec<ChunkRef> = [(0, 0), (1, 0), (1, 1), (1, 2), (2, 0)]
            .iter()
            .map(|&(file, chunk)| ChunkRef { file, chunk })
            .collect();
        let shares = share_out(&chunks, &sizes, 2);
        assert_eq!(shares.len(), 2);
        // The big file's chunks lead both streams.
        assert_eq!(shares[0][0], ChunkRef { file: 1, chunk: 0 });
        assert_eq!(shares[1][0], ChunkRef { file: 1, chunk: 1 });
        let bytes = |s: &[ChunkRef]| -> u64 {
            s.iter()
                .map(|c| chunk_len(sizes[c.file as usize], c.chunk) as u64)
                .sum()
        };
        assert_eq!(bytes(&shares[0]) + bytes(&shares[1]), 4 * CHUNK_SIZE + 10);
        assert!(bytes(&shares[0]).abs_diff(bytes(&shares[1])) <= CHUNK_SIZE);
        // More streams than chunks: no empty stream.
        assert_eq!(share_out(&chunks[..1], &sizes, 4).len(), 1);
    }
}

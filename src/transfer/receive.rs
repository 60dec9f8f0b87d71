//! The receiving end of a transfer, as the server's application.
//!
//! Runs on the server's driver thread, so it only copies and counts:
//! each arriving segment is copied into the buffer of the chunk it belongs
//! to (whatever order segments come in); a full chunk goes to a pool of
//! writer threads, which check its BLAKE3 value and write it at its place
//! with a positioned write. The connection's window opens only as chunks
//! are written, so the memory held is at most one window per connection
//! and a slow disk slows the sender rather than dropping data. Checking a
//! manifest against the disk and putting files in place are slower still
//! and run on threads of their own.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use super::dest::{self, DestError, FileTarget, Finished, Prepared, ReceivePolicy, NOT_HELD};
use super::hash::{chunk_count, chunk_cv, Cv};
use super::layout::{Layout, CV_LEN};
use super::messages::{
    data_header_len, ChunkRef, DataHeader, FilePlan, MessageError, Outcome, PlanReply, Request,
};
use super::shard::part_bytes;
use super::staged::{Owner, StagedQuota};
use crate::io::dest_dir::DestDir;
use crate::io::ServeApp;
use crate::proto::server::{Arrival, ConnEnd, SessionEvent};
use crate::proto::Server;

/// When a sender turned away busy is told to come back: about the time a
/// small transfer takes to finish and free its place.
const BUSY_RETRY_AFTER: Duration = Duration::from_secs(1);

/// A session with no connection for this long is forgotten.
const SESSION_IDLE: Duration = Duration::from_secs(120);

/// What a receiver tells its operator.
#[derive(Debug, Clone)]
pub enum ReceiveEvent {
    /// A transfer finished: every file verified and in place.
    Done(TransferReport),
    /// A dry run was answered: nothing was created, nothing is kept.
    Planned {
        peer: SocketAddr,
        dest: PathBuf,
        /// Files the sender would send (whole or in part), and skip.
        files: u64,
        skipped: u64,
    },
    /// A transfer was refused or failed.
    Failed {
        peer: SocketAddr,
        dest: PathBuf,
        why: String,
    },
    /// Partial files and records in the staging directory that nothing
    /// had touched for `ttl` (abandoned transfers) were removed.
    StagingCleaned {
        entries: u64,
        bytes: u64,
        ttl: Duration,
    },
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct TransferReport {
    pub session: u64,
    pub peer: SocketAddr,
    pub dest: PathBuf,
    pub files: u64,
    /// Files split across shards whose part is in, waiting for the other
    /// shards' parts before they take their name.
    pub files_waiting: u64,
    pub dirs: u64,
    pub symlinks: u64,
    pub skipped: u64,
    /// The skipped files were compared by BLAKE3 (`--checksum`), not by
    /// size and mtime.
    pub skipped_by_checksum: bool,
    /// Chunk bytes received, verified and written.
    pub bytes_written: u64,
    /// Bytes already there from an earlier attempt and not sent again.
    pub bytes_resumed: u64,
    /// Chunks that failed their check and were sent again.
    pub chunks_rejected: u64,
    pub secs: f64,
}

#[derive(Debug, Clone)]
pub struct ReceiveConfig {
    /// Where files go (it exists and is a directory).
    pub root: PathBuf,
    /// Writer threads.
    pub writers: usize,
    /// Stop after the first transfer ends, well or not (`atou copy`).
    pub once: bool,
    /// What senders may do here.
    pub policy: ReceivePolicy,
    pub limits: ReceiveLimits,
    /// The server's authorized keys: a key's `subdir=` and `overwrite`
    /// restrict what its transfers may do (`None`: no restrictions).
    pub authorized: Option<Arc<crate::keys::AuthorizedKeys>>,
}

/// What one receiver lets its peers make it hold: the operator's budgets.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct ReceiveLimits {
    /// Transfers in progress at once.
    pub max_sessions: usize,
    /// Transfers in progress at once from one IP address.
    pub max_sessions_per_ip: usize,
    /// Largest plan request (the manifest), in bytes; a finish request is
    /// held to 32 bytes per file of its plan.
    pub max_request: u64,
    /// Most entries (files, directories, symlinks) one transfer may plan.
    pub max_entries: usize,
    /// Threads that check plans against the disk and finish transfers.
    pub planners: usize,
    /// Plans and finishes waiting for a planner; past this a sender is
    /// told the server is busy.
    pub plan_queue: usize,
    /// The most bytes of existing files one `--checksum` plan may make
    /// the receiver read and hash; such plans also take at most all but
    /// one planner at a time, so plans without it always have one.
    pub max_checksum_bytes: u64,
    /// Partial files that nothing has touched for this long are removed,
    /// at start and every hour (`atou serve --staging-ttl`); `None`: kept
    /// until resumed (the user's own copies).
    pub staging_ttl: Option<Duration>,
    /// The most bytes of partial files one key's unfinished transfers,
    /// abandoned ones included, may stage at once, at the sizes their
    /// plans announce; the most files is `max_entries`
    /// (`atou serve --max-staged-per-key`, src/transfer/staged.rs).
    /// `None`: no quota (the user's own copies).
    pub max_staged_per_key: Option<u64>,
}

impl Default for ReceiveLimits {
    fn default() -> Self {
        ReceiveLimits {
            max_sessions: 64,
            max_sessions_per_ip: 8,
            max_request: 64 << 20,
            max_entries: 1_000_000,
            planners: 2,
            plan_queue: 16,
            max_checksum_bytes: 1 << 40,
            staging_ttl: None,
            max_staged_per_key: None,
        }
    }
}

/// Work done by other threads.
/// A session, by a serial number of ours: results of work on other
/// threads for a session that is gone never land on a later one. Peers
/// name sessions by who they are and the id the sender chose, looked up
/// in `FileReceiver::session_ids`: a peer that is not the session's
/// cannot join or end it by guessing the id.
type SessionKey = u64;

/// Who a peer is: its authenticated key (issue 13), or, for a plain
/// connection, its IP address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Who {
    Key(crate::proto::crypto::PublicKey),
    Addr(IpAddr),
}

impl From<Who> for Owner {
    fn from(who: Who) -> Owner {
        match who {
            Who::Key(key) => Owner::Key(key.0),
            // One address, however the socket wrote it.
            Who::Addr(ip) => Owner::Addr(ip.to_canonical()),
        }
    }
}

/// What an authorized key's options allow its transfers.
#[derive(Debug, Clone)]
struct Grant {
    /// Everything the key sends goes beneath this, in DEST.
    subdir: Option<Vec<u8>>,
    /// The key may replace files (where the server allows replacing).
    overwrite: bool,
}

enum Done {
    Write {
        session: SessionKey,
        conn_id: u64,
        /// The connection's key, so a result never lands on a later
        /// connection that reused the client's id.
        conn_key: u64,
        slot: usize,
        result: Result<Cv, WriteFailure>,
        buf: Vec<u8>,
    },
    Plan {
        session: SessionKey,
        conn_id: u64,
        result: Result<Prepared, String>,
    },
    /// A plan that must wait for a place (a `--checksum` plan while
    /// others take their share of the planners).
    PlanBusy {
        session: SessionKey,
        conn_id: u64,
        why: String,
    },
    Finish {
        session: SessionKey,
        conn_id: u64,
        result: Result<Finished, DestError>,
    },
    Ready {
        session: SessionKey,
        result: Result<(), DestError>,
    },
    /// The staging directory's abandoned entries were removed.
    StagingCleaned {
        entries: u64,
        bytes: u64,
        ttl: Duration,
    },
}

enum Job {
    Write(WriteJob),
    /// A file whose every chunk is written and verified: give it its
    /// length, mode and mtime (it is renamed at the finish).
    MakeReady {
        session: SessionKey,
        target: Arc<FileTarget>,
        fsync: bool,
    },
}

/// Slow work on the disk, done by the planner pool.
enum PlanJob {
    Plan {
        session: SessionKey,
        conn_id: u64,
        bytes: Vec<u8>,
        grant: Option<Grant>,
        /// Whose quota of staged files the plan counts against.
        owner: Owner,
    },
    Finish {
        session: SessionKey,
        conn_id: u64,
        prepared: Arc<Prepared>,
        verified: Vec<Vec<Option<Cv>>>,
        hashes: Vec<Cv>,
    },
}

enum WriteFailure {
    /// The chunk's data does not match its value: send it again.
    Corrupt,
    Io(DestError),
}

struct WriteJob {
    session: SessionKey,
    conn_id: u64,
    conn_key: u64,
    slot: usize,
    target: Arc<FileTarget>,
    chunk: u64,
    /// Data then the sender's 32-byte value.
    buf: Vec<u8>,
    fsync: bool,
    /// The file's only chunk, of a file sent whole: put it in place too.
    whole: bool,
}

#[derive(Debug)]
enum SlotState {
    Empty,
    Filling { buf: Vec<u8>, got: u64 },
    Writing,
    Written,
}

struct DataConn {
    /// The session's files, looked up once rather than per segment.
    prepared: Arc<Prepared>,
    layout: Layout,
    slots: Vec<SlotState>,
    /// Every slot below this one is written.
    first_unwritten: usize,
    /// Stream offset last passed to `Server::release`.
    released: u64,
    bad: Vec<ChunkRef>,
}

/// Stream bytes as they arrive: the contiguous start, and pieces past a
/// hole (within the window, so bounded by it).
#[derive(Default)]
struct Assembly {
    prefix: Vec<u8>,
    pieces: BTreeMap<u64, Vec<u8>>,
    /// Bytes in `pieces`.
    held: u64,
}

impl Assembly {
    /// Takes `data` at `offset`; returns whether the prefix grew. Each
    /// stream byte arrives once (the transport drops duplicates), and
    /// pieces are moved into the prefix once: O(new bytes).
    fn add(&mut self, offset: u64, data: &[u8]) -> bool {
        let before = self.prefix.len();
        if offset == before as u64 {
            self.prefix.extend_from_slice(data);
        } else if offset > before as u64 {
            self.held += data.len() as u64;
            self.pieces.insert(offset, data.to_vec());
        }
        while let Some(piece) = self.pieces.remove(&(self.prefix.len() as u64)) {
            self.held -= piece.len() as u64;
            self.prefix.extend_from_slice(&piece);
        }
        self.prefix.len() > before
    }

    fn bytes(&self) -> u64 {
        self.prefix.len() as u64 + self.held
    }
}

enum ConnState {
    /// Until the stream's first bytes say what it is.
    Opening(Assembly),
    /// A plan or finish request, taken in whole; its bytes grow only with
    /// what arrived, up to the request's budget.
    Message(Assembly),
    Data(Box<DataConn>),
    /// Answered, or its session is gone: data is let through unread.
    Drained,
}

struct Conn {
    session: SessionKey,
    /// The id its sender chose for the session.
    session_id: u64,
    peer: SocketAddr,
    who: Who,
    /// Ours, never the client's: results of work on another thread carry
    /// it and are dropped if the connection is not the same one.
    key: u64,
    state: ConnState,
}

struct Session {
    peer: SocketAddr,
    who: Who,
    /// The id its sender chose.
    id: u64,
    prepared: Option<Arc<Prepared>>,
    file_sizes: Vec<u64>,
    /// Per file, per chunk: the value of the verified data now in place.
    verified: Vec<Vec<Option<Cv>>>,
    /// Per file sent whole: chunks not yet verified. At zero the file is
    /// put in place at once, so a later failure leaves it whole.
    unverified: Vec<u64>,
    /// Files being made ready; the finish waits for them.
    readying: usize,
    /// A finish request that waits for those.
    finish_waiting: Option<(u64, Vec<Cv>)>,
    failed: Option<Outcome>,
    started: Instant,
    open_conns: usize,
    last_active: Instant,
    bytes_written: u64,
    chunks_rejected: u64,
}

pub struct FileReceiver {
    config: ReceiveConfig,
    dest: Arc<DestDir>,
    sessions: HashMap<SessionKey, Session>,
    /// A peer's (address, session id) to our key, from a connection's
    /// hello until the session and its connections are gone.
    session_ids: HashMap<(Who, u64), SessionKey>,
    next_session_key: SessionKey,
    conns: HashMap<u64, Conn>,
    next_conn_key: u64,
    jobs: mpsc::Sender<Job>,
    plan_jobs: mpsc::SyncSender<PlanJob>,
    done_rx: mpsc::Receiver<Done>,
    notify: Arc<Notify>,
    /// Chunk buffers to reuse.
    spare: Vec<Vec<u8>>,
    on_event: Box<dyn FnMut(ReceiveEvent) + Send>,
    /// With `once`: the transfer is over; stop when its connections are.
    over: bool,
    finished: bool,
}

/// A planner's orders: what its receiver lets plans do.
#[derive(Debug, Clone)]
struct PlanRules {
    policy: ReceivePolicy,
    max_entries: usize,
    max_checksum_bytes: u64,
    /// `--checksum` plans being checked now, over every planner, and how
    /// many may be.
    checksumming: Arc<AtomicUsize>,
    max_checksumming: usize,
    /// Answer dry runs only, refusing any other plan (the receiver of a
    /// dry run, which must change nothing at its destination).
    dry_runs_only: bool,
    /// Each sender's quota of staged files, shared by every planner.
    quota: Option<Arc<StagedQuota>>,
}

fn writer(jobs: Arc<Mutex<mpsc::Receiver<Job>>>, done: mpsc::Sender<Done>, notify: Arc<Notify>) {
    loop {
        let job = match jobs.lock().expect("a writer panicked").recv() {
            Ok(Job::Write(job)) => job,
            Ok(Job::MakeReady {
                session,
                target,
                fsync,
            }) => {
                let result = target.make_ready(fsync);
                let _ = done.send(Done::Ready { session, result });
                notify.notify_one();
                continue;
            }
            Err(_) => return,
        };
        let t = &job.target;
        let len = job.buf.len() - CV_LEN as usize;
        let (data, sent_cv) = job.buf.split_at(len);
        let result = if chunk_cv(t.size, job.chunk, data)[..] != *sent_cv {
            Err(WriteFailure::Corrupt)
        } else {
            let cv: Cv = sent_cv.try_into().expect("32 bytes");
            let written = if job.whole {
                t.write_whole(data, job.fsync)
            } else {
                t.write_chunk(job.chunk, data)
            };
            written.map(|()| cv).map_err(WriteFailure::Io)
        };
        // Every outcome hands the chunk back, so the last one closes the file.
        let closed = t.chunk_done(job.fsync);
        let result =
            result.and_then(|cv| closed.map(|()| cv).map_err(|e| WriteFailure::Io(e.into())));
        let _ = done.send(Done::Write {
            session: job.session,
            conn_id: job.conn_id,
            conn_key: job.conn_key,
            slot: job.slot,
            result,
            buf: job.buf,
        });
        notify.notify_one();
    }
}

/// A plan as its key's grant allows it: beneath the key's subdirectory,
/// replacing files only if the key may.
fn granted(
    mut plan: crate::transfer::messages::PlanRequest,
    policy: &ReceivePolicy,
    grant: Option<Grant>,
) -> Result<(crate::transfer::messages::PlanRequest, ReceivePolicy), String> {
    let Some(grant) = grant else {
        return Ok((plan, policy.clone()));
    };
    let mut policy = policy.clone();
    policy.key_forbids_overwrite |= !grant.overwrite;
    if let Some(base) = grant.subdir {
        policy.confined_to = Some(base.clone());
        let mut path = base;
        if let Some(sub) = &plan.subdir {
            path.push(b'/');
            path.extend_from_slice(sub.as_bytes());
        }
        plan.subdir = Some(
            crate::transfer::manifest::RelPath::new(path)
                .map_err(|e| format!("the key's subdir= with the plan's: {e}"))?,
        );
    }
    Ok((plan, policy))
}

/// How often the staging directory is looked at for abandoned entries.
const STAGING_SWEEP_EVERY: Duration = Duration::from_secs(3600);

/// Removes abandoned partial files now and every hour on a thread of its
/// own, for as long as the receiver holds DEST; what went is reported
/// through `done`.
fn start_staging_cleaner(
    dest: &Arc<DestDir>,
    ttl: Duration,
    quota: Option<Arc<StagedQuota>>,
    done: mpsc::Sender<Done>,
    notify: Arc<Notify>,
) -> std::io::Result<()> {
    let sweep = move |dest: &DestDir| {
        let before = std::time::SystemTime::now()
            .checked_sub(ttl)
            .unwrap_or(std::time::UNIX_EPOCH);
        let swept = dest.remove_staged_unchanged_since(before);
        // Claims go as their partial files do, and stop counting.
        if let Some(quota) = &quota {
            quota.forget_swept(dest);
        }
        if let Ok((entries, bytes)) = swept {
            if entries > 0 {
                let _ = done.send(Done::StagingCleaned {
                    entries,
                    bytes,
                    ttl,
                });
                notify.notify_one();
            }
        }
    };
    let held = Arc::downgrade(dest);
    sweep(dest);
    thread::Builder::new()
        .name("atou-staging".into())
        .spawn(move || loop {
            // Wakes often to see the receiver gone; sweeps hourly.
            let next = Instant::now() + STAGING_SWEEP_EVERY;
            while Instant::now() < next {
                thread::sleep(Duration::from_secs(1));
                if held.strong_count() == 0 {
                    return;
                }
            }
            match held.upgrade() {
                Some(dest) => sweep(&dest),
                None => return,
            }
        })?;
    Ok(())
}

/// A planner: checks plans against the disk and finishes transfers, off
/// the I/O thread. Plans are decoded here too: a manifest's decode is
/// work in proportion to its size.
fn planner(
    jobs: Arc<Mutex<mpsc::Receiver<PlanJob>>>,
    dest: Arc<DestDir>,
    rules: PlanRules,
    done: mpsc::Sender<Done>,
    notify: Arc<Notify>,
) {
    loop {
        let job = match jobs.lock().expect("a planner panicked").recv() {
            Ok(job) => job,
            Err(_) => return,
        };
        let result = match job {
            PlanJob::Plan {
                session,
                conn_id,
                bytes,
                grant,
                owner,
            } => match plan_one(&dest, &rules, &bytes, grant, owner) {
                Planned::Ready(result) => Done::Plan {
                    session,
                    conn_id,
                    result,
                },
                Planned::Busy(why) => Done::PlanBusy {
                    session,
                    conn_id,
                    why,
                },
            },
            PlanJob::Finish {
                session,
                conn_id,
                prepared,
                verified,
                hashes,
            } => {
                let result = dest::finish(&prepared, &verified, &hashes);
                if let (Ok(_), Some(quota), Some(claim)) = (&result, &rules.quota, prepared.claim) {
                    quota.release(&dest, claim, prepared.unstaged_by_finish());
                }
                Done::Finish {
                    session,
                    conn_id,
                    result,
                }
            }
        };
        let _ = done.send(result);
        notify.notify_one();
    }
}

/// What a plan request comes to.
// One a plan, moved at once into a `Done`: its size costs nothing.
#[allow(clippy::large_enum_variant)]
enum Planned {
    /// Checked against the disk: prepared, or refused and why.
    Ready(Result<Prepared, String>),
    /// Not now: come back later.
    Busy(String),
}

/// Decodes and checks one plan request from `owner` under `rules`.
fn plan_one(
    dest: &Arc<DestDir>,
    rules: &PlanRules,
    bytes: &[u8],
    grant: Option<Grant>,
    owner: Owner,
) -> Planned {
    let plan = match Request::decode(bytes) {
        Ok(Request::Plan(plan)) => plan,
        Ok(_) => {
            let why = "a request that is not a plan where a plan belongs";
            return Planned::Ready(Err(why.to_string()));
        }
        Err(e) => return Planned::Ready(Err(format!("a malformed plan: {e}"))),
    };
    if rules.dry_runs_only && !plan.options.dry_run {
        let why = "this receiver answers dry runs only (--dry-run) and writes nothing";
        return Planned::Ready(Err(why.to_string()));
    }
    if plan.manifest.entries.len() > rules.max_entries {
        return Planned::Ready(Err(format!(
            "a transfer of {} entries, over this server's limit of {} (--max-files); send it \
             in parts",
            plan.manifest.entries.len(),
            rules.max_entries
        )));
    }
    // A --checksum plan reads existing files whole: it may hold a planner
    // only while another is left for plans without it.
    let _place = if plan.options.checksum && plan.options.skip_existing {
        match ChecksumPlace::take(&rules.checksumming, rules.max_checksumming) {
            Some(place) => Some(place),
            None => {
                return Planned::Busy(format!(
                    "this server is busy: {} --checksum plans are being checked, its limit \
                     (one fewer than --planners)",
                    rules.max_checksumming
                ))
            }
        }
    } else {
        None
    };
    let policy = &rules.policy;
    let record = !plan.options.dry_run;
    let mut claim = None;
    let admit = |files: &[super::staged::ToStage<'_>]| match &rules.quota {
        Some(quota) => quota.admit(dest, owner, files, record).map(|c| claim = c),
        None => Ok(()),
    };
    let prepared = policy
        .requested
        .as_ref()
        .map_or(Ok(()), |r| r.check(&plan))
        .and_then(|()| granted(plan, policy, grant))
        .and_then(|(plan, policy)| {
            fits(dest, &plan)?;
            dest::prepare(dest, &policy, plan, rules.max_checksum_bytes, admit)
        });
    Planned::Ready(match (prepared, &rules.quota, claim) {
        (Ok(mut p), _, claim) => {
            p.claim = claim;
            Ok(p)
        }
        // Admitted, then failed (creating its directories): nothing of
        // it is staged.
        (Err(why), Some(quota), Some(claim)) => {
            quota.withdraw(dest, claim);
            Err(why)
        }
        (Err(why), ..) => Err(why),
    })
}

/// One of the places `--checksum` plans share; given back when dropped.
struct ChecksumPlace<'a>(&'a AtomicUsize);

impl<'a> ChecksumPlace<'a> {
    fn take(taken: &'a AtomicUsize, places: usize) -> Option<ChecksumPlace<'a>> {
        if taken.fetch_add(1, Ordering::AcqRel) >= places {
            taken.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(ChecksumPlace(taken))
    }
}

impl Drop for ChecksumPlace<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The session keeps a value per chunk it is told of: a manifest cannot
/// claim more than DEST's whole file system, checked before anything is
/// allocated or written.
fn fits(dest: &DestDir, plan: &super::messages::PlanRequest) -> Result<(), String> {
    let total = super::file_sizes(&plan.manifest)
        .iter()
        .fold(0u64, |a, &s| a.saturating_add(s));
    match dest.filesystem_size() {
        Ok(fs_size) if total > fs_size => Err(format!(
            "the files add up to {}, more than the whole file system of {} ({})",
            crate::units::format_size(total),
            dest.shown(b"").display(),
            crate::units::format_size(fs_size)
        )),
        _ => Ok(()),
    }
}

impl FileReceiver {
    /// A receiver into `config.root`, with its writer and planner threads;
    /// why not, if DEST cannot be opened or the threads cannot start.
    pub fn new(
        config: ReceiveConfig,
        on_event: impl FnMut(ReceiveEvent) + Send + 'static,
    ) -> Result<FileReceiver, String> {
        Self::with_mode(config, on_event, false)
    }

    /// A receiver for a dry run (`--dry-run` of `atou copy`): it answers
    /// dry-run plans only, and leaves `config.root` exactly as it is: not
    /// even the staging directory is created.
    pub fn dry_run(
        config: ReceiveConfig,
        on_event: impl FnMut(ReceiveEvent) + Send + 'static,
    ) -> Result<FileReceiver, String> {
        Self::with_mode(config, on_event, true)
    }

    fn with_mode(
        config: ReceiveConfig,
        on_event: impl FnMut(ReceiveEvent) + Send + 'static,
        dry_runs_only: bool,
    ) -> Result<FileReceiver, String> {
        let open = if dry_runs_only {
            DestDir::open_unchanged(&config.root)
        } else {
            DestDir::open(&config.root)
        };
        let dest = open.map_err(|e| dest::io_error("use destination", &config.root, &e))?;
        // A server's refusals go to its peers: they name paths from DEST,
        // not where DEST is on this host.
        let dest = Arc::new(if config.policy.users_own {
            dest
        } else {
            dest.shown_as("DEST")
        });
        // What earlier runs' transfers left staged counts from the start.
        let quota = match (config.limits.max_staged_per_key, dry_runs_only) {
            (Some(max_bytes), false) => Some(Arc::new(
                StagedQuota::load(
                    &dest,
                    max_bytes,
                    config.limits.max_entries as u64,
                    config.limits.staging_ttl,
                )
                .map_err(|e| {
                    let staging = dest.path().join(crate::io::dest_dir::STAGING_DIR);
                    dest::io_error("read the claims of staged files in", &staging, &e)
                })?,
            )),
            _ => None,
        };
        let (jobs, job_rx) = mpsc::channel::<Job>();
        let (plan_jobs, plan_rx) = mpsc::sync_channel::<PlanJob>(config.limits.plan_queue);
        let (done_tx, done_rx) = mpsc::channel();
        let notify = Arc::new(Notify::new());
        let job_rx = Arc::new(Mutex::new(job_rx));
        let plan_rx = Arc::new(Mutex::new(plan_rx));
        let cannot = |e: std::io::Error| format!("cannot start a receiver thread: {e}");
        for i in 0..config.writers.max(1) {
            let (j, d, n) = (job_rx.clone(), done_tx.clone(), notify.clone());
            thread::Builder::new()
                .name(format!("atou-writer-{i}"))
                .spawn(move || writer(j, d, n))
                .map_err(cannot)?;
        }
        let checksumming = Arc::new(AtomicUsize::new(0));
        for i in 0..config.limits.planners.max(1) {
            let (j, d, n) = (plan_rx.clone(), done_tx.clone(), notify.clone());
            let dest = dest.clone();
            let rules = PlanRules {
                policy: config.policy.clone(),
                max_entries: config.limits.max_entries,
                max_checksum_bytes: config.limits.max_checksum_bytes,
                checksumming: checksumming.clone(),
                max_checksumming: config.limits.planners.max(2) - 1,
                dry_runs_only,
                quota: quota.clone(),
            };
            thread::Builder::new()
                .name(format!("atou-planner-{i}"))
                .spawn(move || planner(j, dest, rules, d, n))
                .map_err(cannot)?;
        }
        if let (Some(ttl), false) = (config.limits.staging_ttl, dry_runs_only) {
            start_staging_cleaner(&dest, ttl, quota, done_tx.clone(), notify.clone())
                .map_err(cannot)?;
        }
        Ok(FileReceiver {
            config,
            dest,
            sessions: HashMap::new(),
            session_ids: HashMap::new(),
            next_session_key: 0,
            conns: HashMap::new(),
            next_conn_key: 0,
            jobs,
            plan_jobs,
            done_rx,
            notify,
            spare: Vec::new(),
            on_event: Box::new(on_event),
            over: false,
            finished: false,
        })
    }

    /// With `once`, the one transfer is over: serving stops once its
    /// connections have fetched their replies and closed.
    fn end_once(&mut self) {
        if self.config.once {
            self.over = true;
            self.finished = self.conns.is_empty();
        }
    }

    fn answer(&mut self, server: &mut Server, conn_id: u64, reply: Vec<u8>) {
        server.respond(conn_id, reply);
        if let Some(c) = self.conns.get_mut(&conn_id) {
            c.state = ConnState::Drained;
        }
        server.release(conn_id, u64::MAX);
    }

    /// Ends a session that failed (`why`: a [`DestError`], or a string
    /// for one that failed here), telling each of its connections.
    fn fail_session(
        &mut self,
        server: &mut Server,
        session: SessionKey,
        why: impl Into<DestError>,
    ) {
        let Some(s) = self.sessions.get_mut(&session) else {
            return;
        };
        if s.failed.is_some() {
            return;
        }
        let error: DestError = why.into();
        let reply = error.outcome();
        let why = error.to_string();
        s.failed = Some(reply.clone());
        let dest = s
            .prepared
            .as_ref()
            .map_or_else(|| self.config.root.clone(), |p| p.dest.clone());
        (self.on_event)(ReceiveEvent::Failed {
            peer: s.peer,
            dest,
            why: why.clone(),
        });
        self.end_once();
        // Every connection of the session gets the reason at once, even
        // before its stream is in: the sender stops sending.
        let ids: Vec<u64> = self
            .conns
            .iter()
            .filter(|(_, c)| c.session == session && !matches!(c.state, ConnState::Drained))
            .map(|(&id, _)| id)
            .collect();
        for id in ids {
            self.answer(server, id, reply.encode());
        }
    }

    /// Forgets a session (done, refused or stale), and its peer's name for
    /// it once no connection of it is left.
    fn remove_session(&mut self, session: SessionKey) -> Option<Session> {
        let s = self.sessions.remove(&session)?;
        self.forget_session_id(session, s.who, s.id);
        Some(s)
    }

    /// Drops a peer's name for a session once neither the session nor any
    /// connection of it is left: a later hello with the same id starts
    /// afresh, under a new key.
    fn forget_session_id(&mut self, session: SessionKey, who: Who, id: u64) {
        if !self.sessions.contains_key(&session)
            && !self.conns.values().any(|c| c.session == session)
        {
            self.session_ids.remove(&(who, id));
        }
    }

    /// What `who` may do, from its authorized key's options; `Err` if the
    /// key is not (or no longer) authorized.
    fn grant(&self, who: Who) -> Result<Option<Grant>, String> {
        let (Who::Key(key), Some(keys)) = (who, &self.config.authorized) else {
            return Ok(None);
        };
        let Some(entry) = keys.find(&key) else {
            return Err("its key is not in this server's authorized keys".to_string());
        };
        Ok(Some(Grant {
            subdir: entry
                .options
                .subdir
                .as_ref()
                .map(|p| p.as_os_str().as_encoded_bytes().to_vec()),
            overwrite: entry.options.overwrite,
        }))
    }

    /// Why a new session from `ip` cannot start now, if it cannot.
    fn session_budget(&self, ip: IpAddr) -> Option<String> {
        let limits = &self.config.limits;
        let from_ip = self.sessions.values().filter(|s| s.peer.ip() == ip).count();
        if self.sessions.len() >= limits.max_sessions {
            Some(format!(
                "this server is busy: {} transfers in progress, its limit (--max-sessions)",
                limits.max_sessions
            ))
        } else if from_ip >= limits.max_sessions_per_ip {
            Some(format!(
                "this server is busy: {} transfers from {ip} in progress, its limit per address \
                 (--max-sessions-per-ip)",
                limits.max_sessions_per_ip
            ))
        } else {
            None
        }
    }

    /// A whole plan, finish or abort request has arrived.
    fn on_request(&mut self, server: &mut Server, conn_id: u64, bytes: Vec<u8>) {
        let Some(conn) = self.conns.get(&conn_id) else {
            return;
        };
        let (session, peer, conn_session_id, who) =
            (conn.session, conn.peer, conn.session_id, conn.who);
        if bytes.first() == Some(&b'P') {
            let grant = match self.grant(who) {
                Ok(g) => g,
                Err(why) => {
                    self.refuse(server, conn_id, peer, why);
                    return;
                }
            };
            if self.sessions.contains_key(&session) {
                let why = "a second plan for one session".to_string();
                self.refuse(server, conn_id, peer, why);
                return;
            }
            if let Some(why) = self.session_budget(peer.ip()) {
                self.busy(server, conn_id, why);
                return;
            }
            let job = PlanJob::Plan {
                session,
                conn_id,
                bytes,
                grant,
                owner: who.into(),
            };
            if self.plan_jobs.try_send(job).is_err() {
                let why = "this server is busy: too many plans waiting to be checked".to_string();
                self.busy(server, conn_id, why);
                return;
            }
            let now = Instant::now();
            self.sessions.insert(
                session,
                Session {
                    peer,
                    who,
                    id: conn_session_id,
                    prepared: None,
                    verified: Vec::new(),
                    unverified: Vec::new(),
                    readying: 0,
                    finish_waiting: None,
                    file_sizes: Vec::new(),
                    failed: None,
                    started: now,
                    open_conns: 1,
                    last_active: now,
                    bytes_written: 0,
                    chunks_rejected: 0,
                },
            );
            return;
        }
        let request = match Request::decode(&bytes) {
            Ok(r) => r,
            Err(e) => {
                let why = format!("a malformed request from {peer}: {e}");
                self.refuse(server, conn_id, peer, why);
                return;
            }
        };
        match request {
            Request::Finish(hashes) => {
                let Some(s) = self.sessions.get_mut(&session) else {
                    self.unknown_session(server, conn_id);
                    return;
                };
                if let Some(failed) = &s.failed {
                    let reply = failed.encode();
                    self.answer(server, conn_id, reply);
                    return;
                }
                if s.prepared.is_none() {
                    self.unknown_session(server, conn_id);
                    return;
                }
                s.finish_waiting = Some((conn_id, hashes));
                self.start_finish(session);
            }
            Request::Abort(why) => {
                if self.sessions.contains_key(&session) {
                    let why = format!(
                        "the sender gave up: {}",
                        crate::text::escape(why.as_bytes())
                    );
                    self.fail_session(server, session, why);
                }
                self.answer(server, conn_id, Outcome::Done { bad: Vec::new() }.encode());
            }
            Request::Plan(_) | Request::Data(_) => {
                unreachable!("plans go to a planner, data streams are read as they arrive")
            }
        }
    }

    /// Starts a waiting finish once no file is still being made ready.
    fn start_finish(&mut self, session: SessionKey) {
        let Some(s) = self.sessions.get_mut(&session) else {
            return;
        };
        if s.readying > 0 {
            return;
        }
        let (Some((conn_id, hashes)), Some(prepared)) =
            (s.finish_waiting.take(), s.prepared.clone())
        else {
            return;
        };
        let job = PlanJob::Finish {
            session,
            conn_id,
            prepared,
            verified: s.verified.clone(),
            hashes,
        };
        if let Err(mpsc::TrySendError::Full(PlanJob::Finish { hashes, .. })) =
            self.plan_jobs.try_send(job)
        {
            // Busy: the finish waits, and is tried again when a planner
            // has finished something.
            s.finish_waiting = Some((conn_id, hashes));
        }
    }

    fn refuse(&mut self, server: &mut Server, conn_id: u64, peer: SocketAddr, why: String) {
        (self.on_event)(ReceiveEvent::Failed {
            peer,
            dest: self.config.root.clone(),
            why: why.clone(),
        });
        self.answer(server, conn_id, Outcome::Failed(why).encode());
    }

    /// A plan that cannot start now, at one of the budgets: the sender is
    /// told when to come back, and nothing of it is kept (its connection
    /// closes with the answer).
    fn busy(&mut self, server: &mut Server, conn_id: u64, why: String) {
        let reply = PlanReply::Busy {
            retry_after: BUSY_RETRY_AFTER,
            why,
        };
        self.answer(server, conn_id, reply.encode());
    }

    fn unknown_session(&mut self, server: &mut Server, conn_id: u64) {
        let why = "this server has no record of the transfer (it restarted, or the transfer \
                   was idle too long); run it again: verified data is kept"
            .to_string();
        self.answer(server, conn_id, Outcome::Failed(why).encode());
    }

    /// The most bytes a request on this session's stream may take: a plan
    /// up to `max_request`; once planned, a finish of 32 bytes per file
    /// (or an abort).
    fn request_budget(&self, session: &SessionKey) -> u64 {
        match self.sessions.get(session).and_then(|s| s.prepared.as_ref()) {
            Some(p) => (p.files.len() as u64 * 32 + 64).max(8 << 10),
            None => self.config.limits.max_request,
        }
    }

    /// New bytes of a stream that has not said what it is yet.
    fn on_opening_bytes(&mut self, server: &mut Server, conn_id: u64, offset: u64, data: &[u8]) {
        let budget = self
            .conns
            .get(&conn_id)
            .map_or(0, |c| self.request_budget(&c.session));
        let Some(conn) = self.conns.get_mut(&conn_id) else {
            return;
        };
        let ConnState::Opening(asm) = &mut conn.state else {
            return;
        };
        if !asm.add(offset, data) {
            return;
        }
        let Some(&first) = asm.prefix.first() else {
            return;
        };
        if first != b'D' {
            let asm = std::mem::take(asm);
            conn.state = ConnState::Message(asm);
            self.on_message_bytes(server, conn_id, budget);
            return;
        }
        // The header's length is in its first five bytes: parse it once,
        // when all of it is in, not on every arrival.
        let Some(count) = asm.prefix.get(1..5) else {
            return;
        };
        let count = u32::from_be_bytes(count.try_into().expect("4 bytes")) as usize;
        let header_len = data_header_len(count) as u64;
        let session = conn.session;
        if header_len > self.config.limits.max_request {
            let why = format!(
                "a data header of {header_len} bytes, over this server's limit of {} (--max-request)",
                self.config.limits.max_request
            );
            self.fail_session(server, session, why);
            return;
        }
        if (asm.prefix.len() as u64) < header_len {
            return;
        }
        self.classify_data(server, conn_id);
    }

    /// A data stream's header is in: check it and start placing.
    fn classify_data(&mut self, server: &mut Server, conn_id: u64) {
        let Some(conn) = self.conns.get_mut(&conn_id) else {
            return;
        };
        let ConnState::Opening(asm) = &mut conn.state else {
            return;
        };
        let session = conn.session;
        let header = match DataHeader::parse(&asm.prefix) {
            Ok(Some((h, _))) => h,
            Ok(None) => return,
            Err(e) => {
                self.fail_session(server, session, format!("a malformed data stream: {e}"));
                return;
            }
        };
        let Some(s) = self.sessions.get(&session) else {
            self.unknown_session(server, conn_id);
            return;
        };
        if let Err(e) = header.check(&s.file_sizes) {
            self.fail_session(server, session, format!("a bad data stream: {e}"));
            return;
        }
        let Some(prepared) = s.prepared.clone() else {
            self.unknown_session(server, conn_id);
            return;
        };
        // Of a file sent in part, the chunks of other parts belong to
        // other sessions: never written, never recorded by this one.
        let outside = header.ranges.iter().find(|r| {
            prepared.files[r.file as usize]
                .part
                .as_ref()
                .is_some_and(|p| {
                    r.first < p.chunks.start || r.first.saturating_add(r.count) > p.chunks.end
                })
        });
        if let Some(r) = outside {
            let t = &prepared.files[r.file as usize];
            let why = format!(
                "a bad data stream: chunks {}..{} of `{}`, outside the part this session sends",
                r.first,
                r.first.saturating_add(r.count),
                t.rel
            );
            self.fail_session(server, session, why);
            return;
        }
        let layout = Layout::new(&header, &s.file_sizes);
        for slot in &layout.slots {
            prepared.files[slot.chunk.file as usize]
                .writing
                .fetch_add(1, Ordering::AcqRel);
        }
        let slots = (0..layout.slots.len()).map(|_| SlotState::Empty).collect();
        let ConnState::Opening(asm) = std::mem::replace(
            &mut self.conns.get_mut(&conn_id).expect("looked up above").state,
            ConnState::Data(Box::new(DataConn {
                prepared,
                layout,
                slots,
                first_unwritten: 0,
                released: 0,
                bad: Vec::new(),
            })),
        ) else {
            unreachable!()
        };
        self.place(conn_id, 0, &asm.prefix);
        for (offset, piece) in asm.pieces {
            self.place(conn_id, offset, &piece);
        }
        self.advance(server, conn_id);
    }

    /// A request's bytes grew: the window moves with its contiguous start,
    /// and a request over its budget is refused.
    fn on_message_bytes(&mut self, server: &mut Server, conn_id: u64, budget: u64) {
        let Some(conn) = self.conns.get(&conn_id) else {
            return;
        };
        let ConnState::Message(asm) = &conn.state else {
            return;
        };
        if asm.bytes() > budget {
            let peer = conn.peer;
            let why = format!(
                "a request of more than {budget} bytes, over this server's limit (--max-request)"
            );
            self.refuse(server, conn_id, peer, why);
            return;
        }
        let contiguous = asm.prefix.len() as u64;
        server.release(conn_id, contiguous);
    }

    /// Copies stream bytes into their chunks' buffers; full chunks go to
    /// the writers.
    fn place(&mut self, conn_id: u64, mut offset: u64, mut data: &[u8]) {
        // One lookup per segment; the spare buffers and the job queue are
        // other fields, borrowed alongside.
        let FileReceiver {
            conns, spare, jobs, ..
        } = self;
        let Some(Conn {
            session,
            key,
            state: ConnState::Data(dc),
            ..
        }) = conns.get_mut(&conn_id)
        else {
            return;
        };
        while !data.is_empty() {
            let Some(i) = dc.layout.slot_at(offset) else {
                if offset >= dc.layout.header_len {
                    // Past the last chunk: nothing of ours.
                    return;
                }
                // Header bytes, already read.
                let skip = ((dc.layout.header_len - offset) as usize).min(data.len());
                offset += skip as u64;
                data = &data[skip..];
                continue;
            };
            let slot = dc.layout.slots[i];
            let slot_len = u64::from(slot.len) + CV_LEN;
            if matches!(dc.slots[i], SlotState::Empty) {
                let mut buf = spare.pop().unwrap_or_default();
                buf.resize(slot_len as usize, 0);
                dc.slots[i] = SlotState::Filling { buf, got: 0 };
            }
            let at = offset - slot.offset;
            let n = ((slot_len - at) as usize).min(data.len());
            offset += n as u64;
            let (piece, rest) = data.split_at(n);
            data = rest;
            // Each stream byte arrives once, so a chunk past filling gets
            // nothing more; nothing to do if it somehow does.
            let SlotState::Filling { buf, got } = &mut dc.slots[i] else {
                continue;
            };
            buf[at as usize..at as usize + n].copy_from_slice(piece);
            *got += n as u64;
            if *got == slot_len {
                let SlotState::Filling { buf, .. } =
                    std::mem::replace(&mut dc.slots[i], SlotState::Writing)
                else {
                    unreachable!("matched above")
                };
                let file = slot.chunk.file as usize;
                let target = dc.prepared.files[file].clone();
                let whole =
                    dc.prepared.plans[file] == FilePlan::SendAll && chunk_count(target.size) == 1;
                let _ = jobs.send(Job::Write(WriteJob {
                    session: *session,
                    conn_id,
                    conn_key: *key,
                    slot: i,
                    target,
                    chunk: slot.chunk.chunk,
                    buf,
                    fsync: dc.prepared.options.fsync,
                    whole,
                }));
            }
        }
    }

    /// Moves a data connection's window past written chunks, and answers
    /// it once its stream is in and written.
    fn advance(&mut self, server: &mut Server, conn_id: u64) {
        let Some(conn) = self.conns.get_mut(&conn_id) else {
            return;
        };
        let ConnState::Data(dc) = &mut conn.state else {
            return;
        };
        while dc.first_unwritten < dc.slots.len()
            && matches!(dc.slots[dc.first_unwritten], SlotState::Written)
        {
            dc.first_unwritten += 1;
        }
        let released = dc
            .layout
            .slots
            .get(dc.first_unwritten)
            .map_or(u64::MAX, |s| s.offset);
        if released != dc.released {
            dc.released = released;
            server.release(conn_id, released);
        }
        // Answered once every chunk is written, whatever the transport
        // says of the stream's end: a FIN bit flipped on the way (set or
        // cleared) must neither answer early nor never.
        if dc.first_unwritten == dc.slots.len() {
            let bad = std::mem::take(&mut dc.bad);
            self.answer(server, conn_id, Outcome::Done { bad }.encode());
        }
    }

    fn on_write_done(
        &mut self,
        server: &mut Server,
        session: SessionKey,
        conn_id: u64,
        conn_key: u64,
        slot: usize,
        result: Result<Cv, WriteFailure>,
    ) {
        let s = self.sessions.get_mut(&session);
        let Some(conn) = self.conns.get_mut(&conn_id).filter(|c| c.key == conn_key) else {
            return;
        };
        let ConnState::Data(dc) = &mut conn.state else {
            return;
        };
        let (Some(state), Some(&info)) = (dc.slots.get_mut(slot), dc.layout.slots.get(slot)) else {
            return;
        };
        *state = SlotState::Written;
        match result {
            Ok(cv) => {
                if let Some(s) = s {
                    let file = info.chunk.file as usize;
                    let was = s.verified[file][info.chunk.chunk as usize].replace(cv);
                    s.bytes_written += u64::from(info.len);
                    if was.is_none() && s.unverified[file] > 0 {
                        s.unverified[file] -= 1;
                        let ready = s
                            .prepared
                            .as_ref()
                            .is_some_and(|p| p.files[file].ready.load(Ordering::Acquire));
                        if s.unverified[file] == 0 && !ready {
                            if let Some(p) = &s.prepared {
                                s.readying += 1;
                                let _ = self.jobs.send(Job::MakeReady {
                                    session,
                                    target: p.files[file].clone(),
                                    fsync: p.options.fsync,
                                });
                            }
                        }
                    }
                }
            }
            Err(WriteFailure::Corrupt) => {
                dc.bad.push(info.chunk);
                if let Some(s) = s {
                    s.chunks_rejected += 1;
                }
            }
            Err(WriteFailure::Io(why)) => {
                self.fail_session(server, session, why);
                return;
            }
        }
        self.advance(server, conn_id);
    }

    fn on_plan_done(
        &mut self,
        server: &mut Server,
        session: SessionKey,
        conn_id: u64,
        result: Result<Prepared, String>,
    ) {
        let prepared = result.map(|p| {
            let sizes: Vec<u64> = p.files.iter().map(|t| t.size).collect();
            (p, sizes)
        });
        match prepared {
            Err(why) => {
                let peer = self.sessions.get(&session).map(|s| s.peer);
                if let Some(peer) = peer {
                    (self.on_event)(ReceiveEvent::Failed {
                        peer,
                        dest: self.config.root.clone(),
                        why: why.clone(),
                    });
                }
                self.remove_session(session);
                server.respond(conn_id, PlanReply::Refused(why).encode());
                self.end_once();
            }
            Ok((prepared, _)) if prepared.options.dry_run => {
                // The answer is all a dry run asks for: no data follows,
                // so the session ends with it.
                server.respond(
                    conn_id,
                    PlanReply::Accepted(prepared.plans.clone()).encode(),
                );
                if let Some(s) = self.remove_session(session) {
                    let skipped = prepared.plans.iter().filter(|p| **p == FilePlan::Skip);
                    let skipped = skipped.count() as u64;
                    (self.on_event)(ReceiveEvent::Planned {
                        peer: s.peer,
                        dest: prepared.dest.clone(),
                        files: prepared.plans.len() as u64 - skipped,
                        skipped,
                    });
                }
                self.end_once();
            }
            Ok((prepared, file_sizes)) => {
                let Some(s) = self.sessions.get_mut(&session) else {
                    return;
                };
                s.verified = file_sizes
                    .iter()
                    .map(|&size| vec![None; chunk_count(size) as usize])
                    .collect();
                // A file sent in part is made ready by the session that
                // completes it, at its finish (src/transfer/parts.rs).
                s.unverified = prepared
                    .plans
                    .iter()
                    .zip(&prepared.files)
                    .map(|(p, t)| match p {
                        FilePlan::SendAll if t.part.is_none() => chunk_count(t.size),
                        _ => 0,
                    })
                    .collect();
                s.file_sizes = file_sizes;
                for (n, cvs) in prepared.held.iter().enumerate() {
                    // Held chunks count as verified until data replaces them.
                    for (k, cv) in cvs.iter().enumerate() {
                        if *cv != NOT_HELD {
                            s.verified[n][k] = Some(*cv);
                        }
                    }
                }
                server.respond(
                    conn_id,
                    PlanReply::Accepted(prepared.plans.clone()).encode(),
                );
                s.prepared = Some(Arc::new(prepared));
            }
        }
    }

    fn on_finish_done(
        &mut self,
        server: &mut Server,
        session: SessionKey,
        conn_id: u64,
        result: Result<Finished, DestError>,
    ) {
        let Some(s) = self.sessions.get(&session) else {
            return;
        };
        match result {
            Ok(f) => {
                // Every chunk of a file not skipped is written once,
                // unless its partial file already held it.
                let resumed = s.prepared.as_ref().map_or(0, |p| {
                    p.files
                        .iter()
                        .zip(&p.plans)
                        .filter(|(_, plan)| **plan != FilePlan::Skip)
                        .map(|(t, _)| match &t.part {
                            Some(p) => part_bytes(t.size, &p.chunks),
                            None => t.size,
                        })
                        .sum::<u64>()
                        .saturating_sub(s.bytes_written)
                });
                let report = TransferReport {
                    session: s.id,
                    peer: s.peer,
                    dest: s
                        .prepared
                        .as_ref()
                        .map(|p| p.dest.clone())
                        .unwrap_or_default(),
                    files: f.files,
                    files_waiting: f.waiting,
                    dirs: f.dirs,
                    symlinks: f.symlinks,
                    skipped: f.skipped,
                    skipped_by_checksum: s.prepared.as_ref().is_some_and(|p| p.options.checksum),
                    bytes_written: s.bytes_written,
                    bytes_resumed: resumed,
                    chunks_rejected: s.chunks_rejected,
                    secs: s.started.elapsed().as_secs_f64(),
                };
                let shard = s.prepared.as_ref().is_some_and(|p| p.options.shard);
                (self.on_event)(ReceiveEvent::Done(report));
                server.respond(conn_id, Outcome::Done { bad: Vec::new() }.encode());
                self.remove_session(session);
                if self.config.once && !shard {
                    // The one transfer is over and nothing else uses DEST
                    // (unless other shards of the tree are sending into it).
                    self.dest.remove_staging_if_empty();
                }
                self.end_once();
            }
            Err(why) => {
                let reply = why.outcome().encode();
                self.fail_session(server, session, why);
                server.respond(conn_id, reply);
            }
        }
    }

    fn on_done(&mut self, server: &mut Server, done: Done) {
        match done {
            Done::Write {
                session,
                conn_id,
                conn_key,
                slot,
                result,
                buf,
            } => {
                if self.spare.len() < 64 {
                    self.spare.push(buf);
                }
                self.on_write_done(server, session, conn_id, conn_key, slot, result);
            }
            Done::Plan {
                session,
                conn_id,
                result,
            } => self.on_plan_done(server, session, conn_id, result),
            Done::PlanBusy {
                session,
                conn_id,
                why,
            } => {
                self.remove_session(session);
                self.busy(server, conn_id, why);
            }
            Done::Ready { session, result } => {
                let Some(s) = self.sessions.get_mut(&session) else {
                    return;
                };
                s.readying = s.readying.saturating_sub(1);
                match result {
                    Ok(()) => self.start_finish(session),
                    Err(why) => self.fail_session(server, session, why),
                }
            }
            Done::Finish {
                session,
                conn_id,
                result,
            } => self.on_finish_done(server, session, conn_id, result),
            Done::StagingCleaned {
                entries,
                bytes,
                ttl,
            } => (self.on_event)(ReceiveEvent::StagingCleaned {
                entries,
                bytes,
                ttl,
            }),
        }
    }
}

impl ServeApp for FileReceiver {
    fn on_arrival(&mut self, server: &mut Server, a: Arrival<'_>) {
        let Some(conn) = self.conns.get_mut(&a.conn_id) else {
            return;
        };
        match &mut conn.state {
            ConnState::Opening(_) => self.on_opening_bytes(server, a.conn_id, a.offset, a.payload),
            ConnState::Message(asm) => {
                asm.add(a.offset, a.payload);
                let session = conn.session;
                let budget = self.request_budget(&session);
                self.on_message_bytes(server, a.conn_id, budget);
            }
            ConnState::Data(_) => {
                self.place(a.conn_id, a.offset, a.payload);
                self.advance(server, a.conn_id);
            }
            ConnState::Drained => server.release(a.conn_id, u64::MAX),
        }
    }

    fn on_event(&mut self, server: &mut Server, event: SessionEvent) {
        match event {
            SessionEvent::Opened {
                conn_id,
                session,
                peer,
                peer_key,
                ..
            } => {
                let session_id = session;
                let who = peer_key.map_or(Who::Addr(peer.ip()), Who::Key);
                let session = *self
                    .session_ids
                    .entry((who, session_id))
                    .or_insert_with(|| {
                        self.next_session_key += 1;
                        self.next_session_key
                    });
                let key = self.next_conn_key;
                self.next_conn_key += 1;
                self.conns.insert(
                    conn_id,
                    Conn {
                        session,
                        session_id,
                        peer,
                        who,
                        key,
                        state: ConnState::Opening(Assembly::default()),
                    },
                );
                if let Some(s) = self.sessions.get_mut(&session) {
                    s.open_conns += 1;
                    s.last_active = Instant::now();
                    if let Some(failed) = s.failed.clone() {
                        self.answer(server, conn_id, failed.encode());
                    }
                }
            }
            SessionEvent::Complete { conn_id } => {
                let Some(conn) = self.conns.get_mut(&conn_id) else {
                    return;
                };
                match &mut conn.state {
                    ConnState::Message(asm) => {
                        if asm.pieces.is_empty() {
                            let bytes = std::mem::take(&mut asm.prefix);
                            conn.state = ConnState::Drained;
                            self.on_request(server, conn_id, bytes);
                        }
                    }
                    // Answered when its last chunk is written (advance).
                    ConnState::Data(_) => {}
                    ConnState::Opening(_) => {
                        // A stream too short to say what it is.
                        let reply = Outcome::Failed(MessageError::Truncated.to_string()).encode();
                        self.answer(server, conn_id, reply);
                    }
                    ConnState::Drained => {}
                }
            }
            SessionEvent::Ended { conn_id, end } => {
                let Some(conn) = self.conns.remove(&conn_id) else {
                    return;
                };
                let session = conn.session;
                let unfinished = !matches!(conn.state, ConnState::Drained);
                if let Some(s) = self.sessions.get_mut(&session) {
                    s.open_conns = s.open_conns.saturating_sub(1);
                    s.last_active = Instant::now();
                }
                self.forget_session_id(session, conn.who, conn.session_id);
                if self.over && self.conns.is_empty() {
                    self.finished = true;
                }
                if end == ConnEnd::Idle && unfinished {
                    let why = "the sender went quiet (killed, or the path failed); \
                               run the same transfer again to resume"
                        .to_string();
                    self.fail_session(server, session, why);
                }
            }
        }
    }

    fn poll(&mut self, server: &mut Server) {
        let mut any = false;
        while let Ok(done) = self.done_rx.try_recv() {
            any = true;
            self.on_done(server, done);
        }
        // Finishes that found the planners busy: only worth a look when
        // other threads finished something (called on every loop).
        if any {
            let waiting: Vec<SessionKey> = self
                .sessions
                .iter()
                .filter(|(_, s)| s.finish_waiting.is_some() && s.readying == 0)
                .map(|(&k, _)| k)
                .collect();
            for k in waiting {
                self.start_finish(k);
            }
        }
        let stale: Vec<SessionKey> = self
            .sessions
            .iter()
            .filter(|(_, s)| s.open_conns == 0 && s.last_active.elapsed() > SESSION_IDLE)
            .map(|(&id, _)| id)
            .collect();
        for id in stale {
            if let Some(s) = self.remove_session(id) {
                if s.failed.is_none() {
                    (self.on_event)(ReceiveEvent::Failed {
                        peer: s.peer,
                        dest: s.prepared.map_or_else(|| self.config.root.clone(), |p| p.dest.clone()),
                        why: "the sender stopped before finishing; run the same transfer again to resume"
                            .to_string(),
                    });
                    self.end_once();
                }
            }
        }
    }

    fn waker(&self) -> Option<Arc<Notify>> {
        Some(self.notify.clone())
    }

    fn finished(&self) -> bool {
        self.finished
    }
}

/// For `atou serve` without `--dir`: every transfer is refused, politely.
pub struct NoFiles;

impl ServeApp for NoFiles {
    fn on_arrival(&mut self, server: &mut Server, a: Arrival<'_>) {
        server.release(a.conn_id, u64::MAX);
    }

    fn on_event(&mut self, server: &mut Server, event: SessionEvent) {
        if let SessionEvent::Complete { conn_id } = event {
            let why = "this server receives no files: start it with `atou serve --dir DEST`";
            server.respond(conn_id, Outcome::Failed(why.to_string()).encode());
        }
    }

    fn poll(&mut self, _server: &mut Server) {}

    fn waker(&self) -> Option<Arc<Notify>> {
        None
    }
}

/// Checks that `root` can receive files.
pub fn check_root(root: &Path) -> Result<PathBuf, String> {
    let meta = std::fs::metadata(root).map_err(|e| dest::io_error("use destination", root, &e))?;
    if !meta.is_dir() {
        return Err(format!("{} is not a directory", root.display()));
    }
    root.canonicalize()
        .map_err(|e| dest::io_error("use destination", root, &e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksum_plans_share_their_places_and_give_them_back() {
        let taken = AtomicUsize::new(0);
        let first = ChecksumPlace::take(&taken, 1).expect("a place");
        assert!(ChecksumPlace::take(&taken, 1).is_none(), "only one place");
        assert_eq!(taken.load(Ordering::Relaxed), 1);
        drop(first);
        let again = ChecksumPlace::take(&taken, 1);
        assert!(again.is_some(), "given back when dropped");
    }
}

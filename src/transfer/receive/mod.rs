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
//!
//! `session.rs` decides (a state machine with no threads, files or
//! clock), `workers.rs` holds the threads that touch the disk, and
//! [`FileReceiver`] here carries one to the other and to the server.

mod session;
mod workers;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use self::session::{Action, Sessions, Who};
use self::workers::{Done, Workers};
use super::dest::{Prepared, ReceivePolicy};
use super::messages::Outcome;
use super::staged::StagedQuota;
use crate::io::dest_dir::DestDir;
use crate::io::ServeApp;
use crate::proto::endpoint::server::{Arrival, ConnEnd, SessionEvent};
use crate::proto::Server;
use crate::transfer::Error;

/// What a receiver tells its operator.
#[derive(Debug, Clone)]
pub enum ReceiveEvent {
    /// A transfer finished: every file verified and in place.
    Done(TransferReport),
    /// A dry run was answered: nothing was created, nothing is kept.
    Planned {
        /// The sender's address.
        peer: SocketAddr,
        /// The directory the files would go into.
        dest: PathBuf,
        /// Files the sender would send (whole or in part).
        files: u64,
        /// Files the receiver already has, which would be skipped.
        skipped: u64,
    },
    /// A transfer was refused or failed.
    Failed {
        /// The sender's address.
        peer: SocketAddr,
        /// The directory the files were to go into.
        dest: PathBuf,
        /// What failed, as a person reads it.
        why: String,
    },
    /// Partial files and records in the staging directory that nothing
    /// had touched for `ttl` (abandoned transfers) were removed.
    StagingCleaned {
        /// Partial files and records removed.
        entries: u64,
        /// Bytes they held.
        bytes: u64,
        /// How long untouched makes one abandoned.
        ttl: Duration,
    },
}

/// What one transfer into a [`FileReceiver`] did, once it ended.
#[derive(Debug, Clone, serde::Serialize)]
#[non_exhaustive]
pub struct TransferReport {
    /// The transfer's session id.
    pub session: u64,
    /// The sender's address.
    pub peer: SocketAddr,
    /// The directory the files went into.
    pub dest: PathBuf,
    /// Files received and in place.
    pub files: u64,
    /// Files split across shards whose part is in, waiting for the other
    /// shards' parts before they take their name.
    pub files_waiting: u64,
    /// Directories made.
    pub dirs: u64,
    /// Symbolic links made.
    pub symlinks: u64,
    /// Files the receiver already had and skipped.
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
    /// Entries `--delete` removed.
    pub deleted: u64,
    /// `-X` / `-A`: extended attributes (ACLs included) set.
    pub xattrs_set: u64,
    /// `-X` / `-A`: attributes not set: refused by the file system (each
    /// a warning) or left out by this receiver's policy.
    pub xattrs_not_set: u64,
    /// Wall time of the transfer's session at the receiver, in seconds.
    pub secs: f64,
}

/// How a [`FileReceiver`] receives: where, with how many writers, under
/// which policy and budgets. Built with [`ReceiveConfig::new`] and its
/// setters.
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
    /// The operator's budgets: what senders may make this receiver hold.
    pub limits: ReceiveLimits,
    /// The server's authorized keys: a key's `subdir=` and `overwrite`
    /// restrict what its transfers may do (`None`: no restrictions).
    pub authorized: Option<Arc<crate::proto::crypto::AuthorizedKeys>>,
}

impl ReceiveConfig {
    /// Receives into `root` (an existing directory) with one writer thread,
    /// serving transfers until stopped, under [`ReceivePolicy::server`], the
    /// default [`ReceiveLimits`] and no authorized keys' restrictions.
    pub fn new(root: impl Into<PathBuf>) -> ReceiveConfig {
        ReceiveConfig {
            root: root.into(),
            writers: 1,
            once: false,
            policy: ReceivePolicy::server(),
            limits: ReceiveLimits::default(),
            authorized: None,
        }
    }

    /// Writer threads, at least 1 (0 counts as 1). Default: 1.
    #[must_use]
    pub fn writers(mut self, writers: usize) -> Self {
        self.writers = writers.max(1);
        self
    }

    /// Stop after the first transfer ends, well or not. Default: `false`.
    #[must_use]
    pub fn once(mut self, once: bool) -> Self {
        self.once = once;
        self
    }

    /// What senders may do here. Default: [`ReceivePolicy::server`].
    #[must_use]
    pub fn policy(mut self, policy: ReceivePolicy) -> Self {
        self.policy = policy;
        self
    }

    /// The operator's budgets. Default: [`ReceiveLimits::default`].
    #[must_use]
    pub fn limits(mut self, limits: ReceiveLimits) -> Self {
        self.limits = limits;
        self
    }

    /// The server's authorized keys, whose `subdir=` and `overwrite`
    /// restrict what each key's transfers may do. Default: `None`.
    #[must_use]
    pub fn authorized(mut self, keys: Option<Arc<crate::proto::crypto::AuthorizedKeys>>) -> Self {
        self.authorized = keys;
        self
    }
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

/// The receiving side of file transfers, as the application [`crate::io::serve`]
/// runs.
pub struct FileReceiver {
    sessions: Sessions<Prepared>,
    dest: Arc<DestDir>,
    workers: Workers,
    on_event: Box<dyn FnMut(ReceiveEvent) + Send>,
}

impl FileReceiver {
    /// A receiver into `config.root`, with its writer and planner threads;
    /// why not, if DEST cannot be opened or the threads cannot start.
    pub fn new(
        config: ReceiveConfig,
        on_event: impl FnMut(ReceiveEvent) + Send + 'static,
    ) -> Result<FileReceiver, Error> {
        Self::with_mode(config, on_event, false)
    }

    /// A receiver for a dry run (`--dry-run` of `atou copy`): it answers
    /// dry-run plans only, and leaves `config.root` exactly as it is: not
    /// even the staging directory is created.
    pub(crate) fn dry_run(
        config: ReceiveConfig,
        on_event: impl FnMut(ReceiveEvent) + Send + 'static,
    ) -> Result<FileReceiver, Error> {
        Self::with_mode(config, on_event, true)
    }

    fn with_mode(
        config: ReceiveConfig,
        on_event: impl FnMut(ReceiveEvent) + Send + 'static,
        dry_runs_only: bool,
    ) -> Result<FileReceiver, Error> {
        let open = if dry_runs_only {
            DestDir::open_unchanged(&config.root)
        } else {
            DestDir::open(&config.root)
        };
        let dest = open.map_err(|e| Error::disk("use destination", &config.root, e))?;
        // A server's refusals go to its peers: they name paths from DEST,
        // not where DEST is on this host.
        let dest = Arc::new(if config.policy.users_own {
            dest
        } else {
            dest.shown_as("DEST")
        });
        let quota = match (config.limits.max_staged_per_key, dry_runs_only) {
            (Some(max_bytes), false) => Some(load_quota(&config, &dest, max_bytes)?),
            _ => None,
        };
        let workers = Workers::start(&config, &dest, quota, dry_runs_only)?;
        Ok(FileReceiver {
            sessions: Sessions::new(config.root, config.once, config.limits, config.authorized),
            dest,
            workers,
            on_event: Box::new(on_event),
        })
    }

    /// Does what the sessions asked, in order.
    fn carry_out(&mut self, server: &mut Server) {
        while let Some(action) = self.sessions.poll_action() {
            match action {
                Action::Reply { conn_id, bytes } => server.respond(conn_id, bytes),
                Action::OpenWindow { conn_id, upto } => server.release(conn_id, upto),
                Action::Write(job) => self.workers.write(job),
                Action::Plan(job) => {
                    if let Err(job) = self.workers.plan(job) {
                        self.sessions.on_plan_refused(job);
                    }
                }
                Action::Report(event) => (self.on_event)(event),
                Action::TidyStaging => self.dest.remove_staging_if_empty(),
            }
        }
    }

    /// Hands the sessions what another thread finished.
    fn on_done(&mut self, done: Done) {
        let sessions = &mut self.sessions;
        match done {
            Done::Write(written) => sessions.on_written(written),
            Done::Plan {
                session,
                conn_id,
                result,
            } => sessions.on_planned(session, conn_id, *result),
            Done::PlanBusy {
                session,
                conn_id,
                why,
            } => sessions.on_plan_busy(session, conn_id, why),
            Done::Ready { session, result } => sessions.on_ready(session, result),
            Done::Finish {
                session,
                conn_id,
                result,
            } => sessions.on_finished(Instant::now(), session, conn_id, result),
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

/// What earlier runs' transfers left staged counts from the start.
fn load_quota(
    config: &ReceiveConfig,
    dest: &DestDir,
    max_bytes: u64,
) -> Result<Arc<StagedQuota>, Error> {
    let limits = &config.limits;
    let quota = StagedQuota::load(
        dest,
        max_bytes,
        limits.max_entries as u64,
        limits.staging_ttl,
    )
    .map_err(|e| {
        let staging = dest.path().join(crate::io::dest_dir::STAGING_DIR);
        Error::disk("read the claims of staged files in", &staging, e)
    })?;
    Ok(Arc::new(quota))
}

impl ServeApp for FileReceiver {
    fn on_arrival(&mut self, server: &mut Server, a: Arrival<'_>) {
        self.sessions.on_bytes(a.conn_id, a.offset, a.payload);
        self.carry_out(server);
    }

    fn on_event(&mut self, server: &mut Server, event: SessionEvent) {
        let now = Instant::now();
        match event {
            SessionEvent::Opened {
                conn_id,
                session,
                peer,
                peer_key,
                ..
            } => {
                let who = peer_key.map_or(Who::Addr(peer.ip()), Who::Key);
                self.sessions.on_opened(now, conn_id, session, peer, who);
            }
            SessionEvent::Complete { conn_id } => self.sessions.on_complete(now, conn_id),
            SessionEvent::Ended {
                conn_id,
                end,
                confirmed,
            } => self
                .sessions
                .on_ended(now, conn_id, end == ConnEnd::Idle, confirmed),
        }
        self.carry_out(server);
    }

    fn poll(&mut self, server: &mut Server) {
        let mut any = false;
        while let Some(done) = self.workers.done() {
            any = true;
            self.on_done(done);
            self.carry_out(server);
        }
        self.sessions.on_tick(Instant::now(), any);
        self.carry_out(server);
    }

    fn waker(&self) -> Option<Arc<Notify>> {
        Some(self.workers.waker())
    }

    fn finished(&self) -> bool {
        self.sessions.is_finished()
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
pub fn check_root(root: &Path) -> Result<PathBuf, Error> {
    let meta = std::fs::metadata(root).map_err(|e| Error::disk("use destination", root, e))?;
    if !meta.is_dir() {
        return Err(Error::DestNotDir {
            path: root.to_path_buf(),
        });
    }
    root.canonicalize()
        .map_err(|e| Error::disk("use destination", root, e))
}

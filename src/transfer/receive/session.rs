//! The receiver's sessions as a value driven by what happens to them, in
//! the manner of `proto`: a connection opening, its stream's bytes at
//! their offsets, its stream complete, its end, the work other threads
//! finished, and the time, in; answers, window moves, jobs for the
//! workers and the operator's events, out. Feed one input, then drain
//! [`Sessions::poll_action`] before the next: a plan or finish job the
//! planners' queue turns away comes back through
//! [`Sessions::on_plan_refused`].
//!
//! No threads, no files, no clock: `super::FileReceiver` carries the
//! actions to the server and the workers, and the tests drive the
//! machine with hand-built messages.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{ReceiveEvent, ReceiveLimits, TransferReport};
use crate::proto::crypto::AuthorizedKeys;
use crate::transfer::chunk_buf::ChunkBuf;
use crate::transfer::compress::Encoding;
use crate::transfer::dest::{DestError, Finished, ReceivePolicy, NOT_HELD};
use crate::transfer::hash::{chunk_count, Cv};
use crate::transfer::layout::Layout;
use crate::transfer::manifest::RelPath;
use crate::transfer::messages::{
    data_header_len_of, is_data_kind, ChunkRef, DataHeader, Deletions, FilePlan, MessageError,
    Options, Outcome, PlanReply, PlanRequest, Request,
};
use crate::transfer::shard::part_bytes;
use crate::transfer::staged::Owner;
use crate::transfer::Error;

/// When a sender turned away busy is told to come back: about the time a
/// small transfer takes to finish and free its place.
pub(super) const BUSY_RETRY_AFTER: Duration = Duration::from_secs(1);

/// A session with no connection for this long is forgotten.
pub(super) const SESSION_IDLE: Duration = Duration::from_secs(120);

/// Chunk buffers kept for reuse.
const SPARE_BUFFERS: usize = 64;

/// A session, by a serial number of ours: results of work on other
/// threads for a session that is gone never land on a later one. Peers
/// name sessions by who they are and the id the sender chose, looked up
/// in `Sessions::session_ids`: a peer that is not the session's cannot
/// join or end it by guessing the id.
pub(super) type SessionKey = u64;

/// Who a peer is: its authenticated key, or, for a plain connection, its
/// IP address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Who {
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

/// The plan reply that accepts `plan`.
fn accepted(plan: &impl PlanView) -> Vec<u8> {
    PlanReply::Accepted {
        plans: plan.plans().to_vec(),
        deletions: plan.deletions(),
    }
    .encode()
}

/// What an authorized key's options allow its transfers.
#[derive(Debug, Clone)]
pub(super) struct Grant {
    /// Everything the key sends goes beneath this, in DEST.
    pub(super) subdir: Option<Vec<u8>>,
    /// The key may replace files (where the server allows replacing).
    pub(super) overwrite: bool,
    /// The key may ask `--delete` (where the server allows deleting).
    pub(super) delete: bool,
    /// The key may ask `-o`/`-g`, `-X`, `-A` (where the server allows).
    pub(super) owners: bool,
    pub(super) xattrs: bool,
    pub(super) acls: bool,
}

/// A plan as its key's grant allows it: beneath the key's subdirectory,
/// replacing files only if the key may.
pub(super) fn granted(
    mut plan: PlanRequest,
    policy: &ReceivePolicy,
    grant: Option<Grant>,
) -> Result<(PlanRequest, ReceivePolicy), Error> {
    let Some(grant) = grant else {
        return Ok((plan, policy.clone()));
    };
    let mut policy = policy.clone();
    policy.key_forbids_overwrite |= !grant.overwrite;
    policy.key_forbids_delete |= !grant.delete;
    policy.key_forbids_owners |= !grant.owners;
    policy.key_forbids_xattrs |= !grant.xattrs;
    policy.key_forbids_acls |= !grant.acls;
    if let Some(base) = grant.subdir {
        policy.confined_to = Some(base.clone());
        let mut path = base;
        if let Some(sub) = &plan.subdir {
            path.push(b'/');
            path.extend_from_slice(sub.as_bytes());
        }
        plan.subdir = Some(RelPath::new(path).map_err(Error::KeySubdir)?);
    }
    Ok((plan, policy))
}

/// A plan the planners checked against the disk, as the sessions see it:
/// the receiver's is `dest::Prepared`, the tests' a plain list of files.
pub(super) trait PlanView {
    /// DEST/SUBDIR, for messages and reports.
    fn dest(&self) -> &Path;
    /// One per file, in file order.
    fn plans(&self) -> &[FilePlan];
    fn options(&self) -> Options;
    /// What `--delete` removes at the finish; `None` without it.
    fn deletions(&self) -> Option<Deletions>;
    /// Per file, per chunk: the value of what its partial file already
    /// holds, [`NOT_HELD`] where it holds nothing.
    fn held(&self) -> &[Vec<Cv>];
    fn size(&self, file: usize) -> u64;
    /// Of a file split across shards, the chunks this session sends.
    fn part(&self, file: usize) -> Option<Range<u64>>;
    /// The files written from this one's chunks ([`FilePlan::Copy`]).
    fn copies(&self, file: usize) -> &[u32];
    /// The file's path, for messages.
    fn rel(&self, file: usize) -> String;
    /// A writer gave the file its length, mode and mtime.
    fn is_ready(&self, file: usize) -> bool;
    /// A chunk of the file goes to the writers: the file stays open until
    /// every such chunk is handed back.
    fn start_writing(&self, file: usize);
}

/// Work for the writer pool.
pub(super) enum Job<P> {
    Write(WriteJob<P>),
    /// A file whose every chunk is written and verified: give it its
    /// length, mode and mtime (it is renamed at the finish).
    MakeReady {
        session: SessionKey,
        plan: Arc<P>,
        file: usize,
        fsync: bool,
    },
}

pub(super) struct WriteJob<P> {
    pub(super) to: Slot,
    pub(super) plan: Arc<P>,
    pub(super) file: usize,
    pub(super) chunk: u64,
    /// Data as sent then the sender's 32-byte value.
    pub(super) buf: ChunkBuf,
    /// How the data was sent: compressed data is expanded to `raw_len`
    /// bytes before its value is checked.
    pub(super) encoding: Encoding,
    pub(super) raw_len: u32,
    pub(super) fsync: bool,
    /// The file's only chunk, of a file sent whole: put it in place too.
    pub(super) whole: bool,
}

/// Where a chunk's result lands: a slot of one connection of one session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Slot {
    pub(super) session: SessionKey,
    pub(super) conn_id: u64,
    /// The connection's key, so a result never lands on a later
    /// connection that reused the client's id.
    pub(super) conn_key: u64,
    pub(super) slot: usize,
}

/// Slow work on the disk, for the planner pool.
pub(super) enum PlanJob<P> {
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
        plan: Arc<P>,
        verified: Vec<Vec<Option<Cv>>>,
        hashes: Vec<Cv>,
    },
}

pub(super) enum WriteFailure {
    /// The chunk's data does not match its value: send it again.
    Corrupt,
    Io(DestError),
}

/// A chunk the writers are done with, and its buffer to reuse.
pub(super) struct Written {
    pub(super) to: Slot,
    pub(super) result: Result<Cv, WriteFailure>,
    pub(super) buf: ChunkBuf,
}

/// What the receiver is to do, in order.
pub(super) enum Action<P> {
    /// Answer connection `conn_id` (it closes once the client has it).
    Reply {
        conn_id: u64,
        bytes: Vec<u8>,
    },
    /// Let the connection's stream in up to this offset.
    OpenWindow {
        conn_id: u64,
        upto: u64,
    },
    Write(Job<P>),
    /// For the planners; a full queue hands it back
    /// ([`Sessions::on_plan_refused`]).
    Plan(PlanJob<P>),
    Report(ReceiveEvent),
    /// The one transfer of a receiver with `once` is over and nothing
    /// else uses DEST: its staging directory may go if empty.
    TidyStaging,
}

#[derive(Debug)]
enum SlotState {
    Empty,
    Filling { buf: ChunkBuf, got: u64 },
    Writing,
    Written,
}

struct DataConn<P> {
    /// The session's files, looked up once rather than per segment.
    plan: Arc<P>,
    layout: Layout,
    slots: Vec<SlotState>,
    /// Every slot below this one is written.
    first_unwritten: usize,
    /// Stream offset last let in ([`Action::OpenWindow`]).
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

enum ConnState<P> {
    /// Until the stream's first bytes say what it is.
    Opening(Assembly),
    /// A plan or finish request, taken in whole; its bytes grow only with
    /// what arrived, up to the request's budget.
    Message(Assembly),
    Data(Box<DataConn<P>>),
    /// Answered, or its session is gone: data is let through unread.
    Drained,
}

struct Conn<P> {
    session: SessionKey,
    /// The id its sender chose for the session.
    session_id: u64,
    peer: SocketAddr,
    who: Who,
    /// Ours, never the client's: results of work on another thread carry
    /// it and are dropped if the connection is not the same one.
    key: u64,
    state: ConnState<P>,
}

struct Session<P> {
    peer: SocketAddr,
    who: Who,
    /// The id its sender chose.
    id: u64,
    plan: Option<Arc<P>>,
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
    /// A connection of it ended confirmed: its sender heard this end.
    confirmed: bool,
    bytes_written: u64,
    chunks_rejected: u64,
}

impl<P> Session<P> {
    fn new(peer: SocketAddr, who: Who, id: u64, now: Instant) -> Session<P> {
        Session {
            peer,
            who,
            id,
            plan: None,
            file_sizes: Vec::new(),
            verified: Vec::new(),
            unverified: Vec::new(),
            readying: 0,
            finish_waiting: None,
            failed: None,
            started: now,
            open_conns: 1,
            last_active: now,
            confirmed: false,
            bytes_written: 0,
            chunks_rejected: 0,
        }
    }
}

/// Every session and connection of one receiver.
pub(super) struct Sessions<P> {
    /// DEST, named in the events of sessions that have no plan.
    root: PathBuf,
    /// Stop after the first transfer ends, well or not.
    once: bool,
    limits: ReceiveLimits,
    authorized: Option<Arc<AuthorizedKeys>>,
    sessions: HashMap<SessionKey, Session<P>>,
    /// A peer's (address, session id) to our key, from a connection's
    /// hello until the session and its connections are gone.
    session_ids: HashMap<(Who, u64), SessionKey>,
    next_session_key: SessionKey,
    conns: HashMap<u64, Conn<P>>,
    next_conn_key: u64,
    /// Chunk buffers to reuse.
    spare: Vec<ChunkBuf>,
    actions: VecDeque<Action<P>>,
    /// With `once`: the transfer is over; stop when its connections are.
    over: bool,
    finished: bool,
}

impl<P: PlanView> Sessions<P> {
    pub(super) fn new(
        root: PathBuf,
        once: bool,
        limits: ReceiveLimits,
        authorized: Option<Arc<AuthorizedKeys>>,
    ) -> Sessions<P> {
        Sessions {
            root,
            once,
            limits,
            authorized,
            sessions: HashMap::new(),
            session_ids: HashMap::new(),
            next_session_key: 0,
            conns: HashMap::new(),
            next_conn_key: 0,
            spare: Vec::new(),
            actions: VecDeque::new(),
            over: false,
            finished: false,
        }
    }

    /// The next thing to do, in the order the inputs asked for them.
    pub(super) fn poll_action(&mut self) -> Option<Action<P>> {
        self.actions.pop_front()
    }

    /// With `once`: the transfer is over and its connections are gone.
    pub(super) fn is_finished(&self) -> bool {
        self.finished
    }

    /// A hello opened connection `conn_id` for the session its sender
    /// calls `session_id`.
    pub(super) fn on_opened(
        &mut self,
        now: Instant,
        conn_id: u64,
        session_id: u64,
        peer: SocketAddr,
        who: Who,
    ) {
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
            s.last_active = now;
            if let Some(failed) = s.failed.clone() {
                self.answer(conn_id, failed.encode());
            }
        }
    }

    /// New bytes of a connection's stream, at their stream offset.
    pub(super) fn on_bytes(&mut self, conn_id: u64, offset: u64, data: &[u8]) {
        let Some(conn) = self.conns.get_mut(&conn_id) else {
            return;
        };
        match &mut conn.state {
            ConnState::Opening(_) => self.on_opening_bytes(conn_id, offset, data),
            ConnState::Message(asm) => {
                asm.add(offset, data);
                let session = conn.session;
                let budget = self.request_budget(&session);
                self.on_message_bytes(conn_id, budget);
            }
            ConnState::Data(_) => {
                self.place(conn_id, offset, data);
                self.advance(conn_id);
            }
            ConnState::Drained => self.open_window(conn_id, u64::MAX),
        }
    }

    /// Every byte of the connection's stream has arrived.
    pub(super) fn on_complete(&mut self, now: Instant, conn_id: u64) {
        let Some(conn) = self.conns.get_mut(&conn_id) else {
            return;
        };
        match &mut conn.state {
            ConnState::Message(asm) => {
                if asm.pieces.is_empty() {
                    let bytes = std::mem::take(&mut asm.prefix);
                    conn.state = ConnState::Drained;
                    self.on_request(now, conn_id, bytes);
                }
            }
            // Answered when its last chunk is written (advance).
            ConnState::Data(_) => {}
            ConnState::Opening(_) => {
                // A stream too short to say what it is.
                let reply = Outcome::Failed(MessageError::Truncated.to_string()).encode();
                self.answer(conn_id, reply);
            }
            ConnState::Drained => {}
        }
    }

    /// The connection is gone; `idle`: it went quiet rather than closed;
    /// `confirmed`: its sender had this end's answers.
    pub(super) fn on_ended(&mut self, now: Instant, conn_id: u64, idle: bool, confirmed: bool) {
        let Some(conn) = self.conns.remove(&conn_id) else {
            return;
        };
        let session = conn.session;
        let unfinished = !matches!(conn.state, ConnState::Drained);
        if let Some(s) = self.sessions.get_mut(&session) {
            s.open_conns = s.open_conns.saturating_sub(1);
            s.last_active = now;
            s.confirmed |= confirmed;
        }
        self.forget_session_id(session, conn.who, conn.session_id);
        if self.over && self.conns.is_empty() {
            self.finished = true;
        }
        if self.unheard_once(session) {
            // Its sender never heard this end (UDP dropped on the way
            // back): it comes again as a new session, through the ssh
            // tunnel (issue 29), and this one must neither end the one
            // transfer nor be its outcome.
            if self
                .sessions
                .get(&session)
                .is_some_and(|s| s.open_conns == 0)
            {
                self.remove_session(session);
            }
        } else if idle && unfinished {
            let why = "the sender went quiet (killed, or the path failed); \
                       run the same transfer again to resume"
                .to_string();
            self.fail_session(session, why);
        } else if unfinished {
            // A finish may have waited for this stream.
            self.start_finish(session);
        }
    }

    /// The time passed: sessions with no connection for [`SESSION_IDLE`]
    /// are forgotten. `workers_finished`: other threads finished something
    /// since the last tick, so finishes that found the planners busy are
    /// worth another try.
    pub(super) fn on_tick(&mut self, now: Instant, workers_finished: bool) {
        if workers_finished {
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
            .filter(|(_, s)| {
                s.open_conns == 0 && now.saturating_duration_since(s.last_active) > SESSION_IDLE
            })
            .map(|(&id, _)| id)
            .collect();
        for id in stale {
            let unheard = self.unheard_once(id);
            let Some(s) = self.remove_session(id) else {
                continue;
            };
            if s.failed.is_none() && !unheard {
                let why = "the sender stopped before finishing; run the same transfer again to \
                           resume";
                self.report_failed(s.peer, s.plan.as_deref(), why.to_string());
                self.end_once();
            }
        }
    }

    /// A job the planners' queue had no room for.
    pub(super) fn on_plan_refused(&mut self, job: PlanJob<P>) {
        match job {
            PlanJob::Plan {
                session, conn_id, ..
            } => {
                // Nothing of it is kept: as if it had never been asked.
                self.remove_session(session);
                let why = "this server is busy: too many plans waiting to be checked".to_string();
                self.busy(conn_id, why);
            }
            PlanJob::Finish {
                session,
                conn_id,
                hashes,
                ..
            } => {
                // The finish waits, and is tried again when a planner has
                // finished something.
                if let Some(s) = self.sessions.get_mut(&session) {
                    s.finish_waiting = Some((conn_id, hashes));
                }
            }
        }
    }

    /// A plan was checked against the disk: prepared, or refused and why.
    pub(super) fn on_planned(
        &mut self,
        session: SessionKey,
        conn_id: u64,
        result: Result<P, Error>,
    ) {
        match result {
            Err(e) => {
                let why = e.to_string();
                if let Some(peer) = self.sessions.get(&session).map(|s| s.peer) {
                    self.report_failed(peer, None, why.clone());
                }
                self.remove_session(session);
                self.reply(conn_id, PlanReply::Refused(why).encode());
                self.end_once();
            }
            Ok(plan) if plan.options().dry_run => {
                // The answer is all a dry run asks for: no data follows,
                // so the session ends with it.
                self.reply(conn_id, accepted(&plan));
                if let Some(s) = self.remove_session(session) {
                    let skipped = plan.plans().iter().filter(|p| **p == FilePlan::Skip);
                    let skipped = skipped.count() as u64;
                    self.report(ReceiveEvent::Planned {
                        peer: s.peer,
                        dest: plan.dest().to_path_buf(),
                        files: plan.plans().len() as u64 - skipped,
                        skipped,
                    });
                }
                self.end_once();
            }
            Ok(plan) => self.accept_plan(session, conn_id, plan),
        }
    }

    /// A plan that must wait for a planner (a `--checksum` plan while
    /// others take their share of the planners).
    pub(super) fn on_plan_busy(&mut self, session: SessionKey, conn_id: u64, why: String) {
        self.remove_session(session);
        self.busy(conn_id, why);
    }

    /// A file was made ready, or could not be.
    pub(super) fn on_ready(&mut self, session: SessionKey, result: Result<(), DestError>) {
        let Some(s) = self.sessions.get_mut(&session) else {
            return;
        };
        s.readying = s.readying.saturating_sub(1);
        match result {
            Ok(()) => self.start_finish(session),
            Err(why) => self.fail_session(session, why),
        }
    }

    /// A chunk was checked and written, or not.
    pub(super) fn on_written(&mut self, written: Written) {
        let Written { to, result, buf } = written;
        if self.spare.len() < SPARE_BUFFERS {
            self.spare.push(buf);
        }
        let s = self.sessions.get_mut(&to.session);
        let Some(conn) = self
            .conns
            .get_mut(&to.conn_id)
            .filter(|c| c.key == to.conn_key)
        else {
            return;
        };
        let ConnState::Data(dc) = &mut conn.state else {
            return;
        };
        let (Some(state), Some(&info)) = (dc.slots.get_mut(to.slot), dc.layout.slots.get(to.slot))
        else {
            return;
        };
        *state = SlotState::Written;
        match result {
            Ok(cv) => {
                if let Some(s) = s {
                    let copies = s
                        .plan
                        .as_ref()
                        .map_or(0, |p| p.copies(info.chunk.file as usize).len());
                    s.bytes_written += u64::from(info.len) * (1 + copies as u64);
                    for job in s.verify(to.session, info.chunk, cv) {
                        self.actions.push_back(Action::Write(job));
                    }
                }
            }
            Err(WriteFailure::Corrupt) => {
                dc.bad.push(info.chunk);
                if let Some(s) = s {
                    s.chunks_rejected += 1;
                    // What a partial file held there is not the sender's
                    // chunk either: the finish names it as missing.
                    if let Some(v) = s.verified.get_mut(info.chunk.file as usize) {
                        if let Some(v) = v.get_mut(info.chunk.chunk as usize) {
                            *v = None;
                        }
                    }
                }
            }
            Err(WriteFailure::Io(why)) => {
                self.fail_session(to.session, why);
                return;
            }
        }
        self.advance(to.conn_id);
    }

    /// The finish ran: every file in place, or why not.
    pub(super) fn on_finished(
        &mut self,
        now: Instant,
        session: SessionKey,
        conn_id: u64,
        result: Result<Finished, DestError>,
    ) {
        let Some(s) = self.sessions.get(&session) else {
            return;
        };
        match result {
            Ok(f) => {
                let report = s.report(now, &f);
                let shard = s.plan.as_ref().is_some_and(|p| p.options().shard);
                self.report(ReceiveEvent::Done(report));
                self.reply(conn_id, Outcome::Done { bad: Vec::new() }.encode());
                self.remove_session(session);
                if self.once && !shard {
                    // The one transfer is over and nothing else uses DEST
                    // (unless other shards of the tree are sending into it).
                    self.actions.push_back(Action::TidyStaging);
                }
                self.end_once();
            }
            Err(why) => {
                let reply = why.outcome().encode();
                self.fail_session(session, why);
                self.reply(conn_id, reply);
            }
        }
    }
}

impl<P: PlanView> Session<P> {
    /// Records the value of a chunk now in place, in its file and in each
    /// file written from it (the writer wrote them all). Each file sent
    /// whole that this completes is for a writer to make ready.
    fn verify(&mut self, session: SessionKey, chunk: ChunkRef, cv: Cv) -> Vec<Job<P>> {
        let Some(plan) = self.plan.as_ref() else {
            return Vec::new();
        };
        let file = chunk.file as usize;
        let mut jobs = Vec::new();
        for f in std::iter::once(file).chain(plan.copies(file).iter().map(|&c| c as usize)) {
            let Some(slot) = self
                .verified
                .get_mut(f)
                .and_then(|v| v.get_mut(chunk.chunk as usize))
            else {
                continue;
            };
            let was = slot.replace(cv);
            if was.is_some() || self.unverified[f] == 0 {
                continue;
            }
            self.unverified[f] -= 1;
            if self.unverified[f] > 0 || plan.is_ready(f) {
                continue;
            }
            self.readying += 1;
            jobs.push(Job::MakeReady {
                session,
                plan: plan.clone(),
                file: f,
                fsync: plan.options().fsync,
            });
        }
        jobs
    }

    /// The chunks the plan expects that hold no verified data: of each
    /// file not skipped, its part's chunks, or all.
    fn missing(&self) -> Vec<ChunkRef> {
        let Some(plan) = self.plan.as_ref() else {
            return Vec::new();
        };
        let mut missing = Vec::new();
        for (file, cvs) in self.verified.iter().enumerate() {
            // A copy's chunks come with its original's, named missing there.
            if matches!(plan.plans()[file], FilePlan::Skip | FilePlan::Copy) {
                continue;
            }
            let chunks = plan.part(file).unwrap_or(0..cvs.len() as u64);
            for chunk in chunks {
                if cvs.get(chunk as usize).is_some_and(Option::is_none) {
                    missing.push(ChunkRef {
                        file: file as u32,
                        chunk,
                    });
                }
            }
        }
        missing
    }

    fn report(&self, now: Instant, f: &Finished) -> TransferReport {
        // Every chunk of a file not skipped is written once, unless its
        // partial file already held it.
        let resumed = self.plan.as_ref().map_or(0, |p| {
            (0..p.plans().len())
                .filter(|&n| p.plans()[n] != FilePlan::Skip)
                .map(|n| match p.part(n) {
                    Some(chunks) => part_bytes(p.size(n), &chunks),
                    None => p.size(n),
                })
                .sum::<u64>()
                .saturating_sub(self.bytes_written)
        });
        TransferReport {
            session: self.id,
            peer: self.peer,
            dest: self
                .plan
                .as_ref()
                .map(|p| p.dest().to_path_buf())
                .unwrap_or_default(),
            files: f.files,
            files_waiting: f.waiting,
            dirs: f.dirs,
            symlinks: f.symlinks,
            skipped: f.skipped,
            skipped_by_checksum: self.plan.as_ref().is_some_and(|p| p.options().checksum),
            bytes_written: self.bytes_written,
            bytes_resumed: resumed,
            chunks_rejected: self.chunks_rejected,
            deleted: f.deleted,
            xattrs_set: f.xattrs_set,
            xattrs_not_set: f.xattrs_not_set,
            secs: now.saturating_duration_since(self.started).as_secs_f64(),
        }
    }
}

/// Requests, refusals and the bookkeeping of sessions.
impl<P: PlanView> Sessions<P> {
    fn report(&mut self, event: ReceiveEvent) {
        self.actions.push_back(Action::Report(event));
    }

    /// Tells the operator that a transfer to `plan`'s destination (DEST
    /// if it has none yet) failed.
    fn report_failed(&mut self, peer: SocketAddr, plan: Option<&P>, why: String) {
        let dest = plan.map_or_else(|| self.root.clone(), |p| p.dest().to_path_buf());
        self.report(ReceiveEvent::Failed { peer, dest, why });
    }

    fn reply(&mut self, conn_id: u64, bytes: Vec<u8>) {
        self.actions.push_back(Action::Reply { conn_id, bytes });
    }

    fn open_window(&mut self, conn_id: u64, upto: u64) {
        self.actions.push_back(Action::OpenWindow { conn_id, upto });
    }

    /// Replies, and lets the rest of the stream through unread.
    fn answer(&mut self, conn_id: u64, bytes: Vec<u8>) {
        self.reply(conn_id, bytes);
        if let Some(c) = self.conns.get_mut(&conn_id) {
            c.state = ConnState::Drained;
        }
        self.open_window(conn_id, u64::MAX);
    }

    /// With `once`: a session none of whose connections ended confirmed
    /// (see [`Sessions::on_ended`]), so not the one transfer's.
    fn unheard_once(&self, session: SessionKey) -> bool {
        self.once && self.sessions.get(&session).is_some_and(|s| !s.confirmed)
    }

    /// With `once`, the one transfer is over: serving stops once its
    /// connections have fetched their replies and closed.
    fn end_once(&mut self) {
        if self.once {
            self.over = true;
            self.finished = self.conns.is_empty();
        }
    }

    /// Ends a session that failed (`why`: a [`DestError`], or a string
    /// for one that failed here), telling each of its connections.
    fn fail_session(&mut self, session: SessionKey, why: impl Into<DestError>) {
        let Some(s) = self.sessions.get_mut(&session) else {
            return;
        };
        if s.failed.is_some() {
            return;
        }
        let error: DestError = why.into();
        let reply = error.outcome();
        s.failed = Some(reply.clone());
        let waiting = s.finish_waiting.take();
        let (peer, plan) = (s.peer, s.plan.clone());
        self.report_failed(peer, plan.as_deref(), error.to_string());
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
            self.answer(id, reply.encode());
        }
        if let Some((finish, _)) = waiting {
            self.reply(finish, reply.encode());
        }
    }

    /// Forgets a session (done, refused or stale), and its peer's name for
    /// it once no connection of it is left.
    fn remove_session(&mut self, session: SessionKey) -> Option<Session<P>> {
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
    fn grant(&self, who: Who) -> Result<Option<Grant>, Error> {
        let (Who::Key(key), Some(keys)) = (who, &self.authorized) else {
            return Ok(None);
        };
        let Some(entry) = keys.find(&key) else {
            return Err(Error::KeyNotAuthorized);
        };
        Ok(Some(Grant {
            subdir: entry
                .options
                .subdir
                .as_ref()
                .map(|p| p.as_os_str().as_encoded_bytes().to_vec()),
            overwrite: entry.options.overwrite,
            delete: entry.options.delete,
            owners: entry.options.owners,
            xattrs: entry.options.xattrs,
            acls: entry.options.acls,
        }))
    }

    /// Why a new session from `ip` cannot start now, if it cannot.
    fn session_budget(&self, ip: IpAddr) -> Option<String> {
        let limits = &self.limits;
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
    fn on_request(&mut self, now: Instant, conn_id: u64, bytes: Vec<u8>) {
        let Some(conn) = self.conns.get(&conn_id) else {
            return;
        };
        let (session, peer) = (conn.session, conn.peer);
        if bytes.first() == Some(&b'P') {
            self.on_plan_request(now, conn_id, bytes);
            return;
        }
        let request = match Request::decode(&bytes) {
            Ok(r) => r,
            Err(e) => {
                let why = format!("a malformed request from {peer}: {e}");
                self.refuse(conn_id, peer, why);
                return;
            }
        };
        match request {
            Request::Finish(hashes) => self.on_finish_request(session, conn_id, hashes),
            Request::Abort(why) => {
                if self.sessions.contains_key(&session) {
                    let why = format!(
                        "the sender gave up: {}",
                        crate::util::text::escape(why.as_bytes())
                    );
                    self.fail_session(session, why);
                }
                self.answer(conn_id, Outcome::Done { bad: Vec::new() }.encode());
            }
            Request::Plan(_) | Request::Data(_) => {
                unreachable!("plans go to a planner, data streams are read as they arrive")
            }
        }
    }

    /// A plan request: to the planners, if its sender may make one now.
    /// Decoding it is theirs too: a manifest's decode is work in
    /// proportion to its size.
    fn on_plan_request(&mut self, now: Instant, conn_id: u64, bytes: Vec<u8>) {
        let Some(conn) = self.conns.get(&conn_id) else {
            return;
        };
        let (session, peer, id, who) = (conn.session, conn.peer, conn.session_id, conn.who);
        let grant = match self.grant(who) {
            Ok(g) => g,
            Err(e) => return self.refuse(conn_id, peer, e.to_string()),
        };
        if self.sessions.contains_key(&session) {
            let why = "a second plan for one session".to_string();
            return self.refuse(conn_id, peer, why);
        }
        if let Some(why) = self.session_budget(peer.ip()) {
            return self.busy(conn_id, why);
        }
        let mut s = Session::new(peer, who, id, now);
        // A sender opens its data connections while the plan is in
        // flight: those that came first are the session's too.
        s.open_conns = self.conns.values().filter(|c| c.session == session).count();
        self.sessions.insert(session, s);
        self.actions.push_back(Action::Plan(PlanJob::Plan {
            session,
            conn_id,
            bytes,
            grant,
            owner: who.into(),
        }));
    }

    fn on_finish_request(&mut self, session: SessionKey, conn_id: u64, hashes: Vec<Cv>) {
        let Some(s) = self.sessions.get_mut(&session) else {
            return self.unknown_session(conn_id);
        };
        if let Some(failed) = &s.failed {
            let reply = failed.encode();
            return self.answer(conn_id, reply);
        }
        if s.plan.is_none() {
            return self.unknown_session(conn_id);
        }
        s.finish_waiting = Some((conn_id, hashes));
        self.start_finish(session);
    }

    /// Starts a waiting finish once no data stream of the session is
    /// open (none has bytes in, unanswered) and no file is still being
    /// made ready. A sender sends its
    /// finish as soon as its last data is sent, not answered: the finish
    /// waits for the streams, each held to the idle rules (one gone quiet
    /// fails the session, and the finish hears why). Chunks still missing
    /// then (a chunk failed its check) are the answer: the sender sends
    /// them again, as after a data stream's answer, and finishes again.
    fn start_finish(&mut self, session: SessionKey) {
        // A connection held with nothing sent (one its sender abandoned,
        // its close lost) is no stream to wait for.
        let streaming = self.conns.values().any(|c| {
            c.session == session
                && match &c.state {
                    ConnState::Opening(asm) => asm.bytes() > 0,
                    ConnState::Data(_) => true,
                    ConnState::Message(_) | ConnState::Drained => false,
                }
        });
        let Some(s) = self.sessions.get_mut(&session) else {
            return;
        };
        if s.readying > 0 || streaming {
            return;
        }
        let (Some((conn_id, hashes)), Some(plan)) = (s.finish_waiting.take(), s.plan.clone())
        else {
            return;
        };
        // Only a sender that asked for the finish ahead reads its answer
        // as a verdict; an older one takes any `Done` as the end, so its
        // finish with chunks missing is refused by the planners, as before.
        if plan.options().finish_ahead {
            let missing = s.missing();
            if !missing.is_empty() {
                return self.reply(conn_id, Outcome::Done { bad: missing }.encode());
            }
        }
        let job = PlanJob::Finish {
            session,
            conn_id,
            plan,
            verified: s.verified.clone(),
            hashes,
        };
        self.actions.push_back(Action::Plan(job));
    }

    /// A plan accepted: the session now expects data for its files.
    fn accept_plan(&mut self, session: SessionKey, conn_id: u64, plan: P) {
        let Some(s) = self.sessions.get_mut(&session) else {
            return;
        };
        let files = plan.plans().len();
        s.file_sizes = (0..files).map(|n| plan.size(n)).collect();
        s.verified = s
            .file_sizes
            .iter()
            .map(|&size| vec![None; chunk_count(size) as usize])
            .collect();
        // A file sent in part is made ready by the session that completes
        // it, at its finish (src/transfer/parts.rs).
        s.unverified = (0..files)
            .map(|n| match plan.plans()[n] {
                FilePlan::SendAll | FilePlan::Copy if plan.part(n).is_none() => {
                    chunk_count(plan.size(n))
                }
                _ => 0,
            })
            .collect();
        for (n, cvs) in plan.held().iter().enumerate() {
            // Held chunks count as verified until data replaces them.
            for (k, cv) in cvs.iter().enumerate() {
                if *cv != NOT_HELD {
                    s.verified[n][k] = Some(*cv);
                }
            }
        }
        let reply = accepted(&plan);
        s.plan = Some(Arc::new(plan));
        self.reply(conn_id, reply);
    }

    fn refuse(&mut self, conn_id: u64, peer: SocketAddr, why: String) {
        self.report_failed(peer, None, why.clone());
        self.answer(conn_id, Outcome::Failed(why).encode());
    }

    /// A plan that cannot start now, at one of the budgets: the sender is
    /// told when to come back, and nothing of it is kept (its connection
    /// closes with the answer).
    fn busy(&mut self, conn_id: u64, why: String) {
        let reply = PlanReply::Busy {
            retry_after: BUSY_RETRY_AFTER,
            why,
        };
        self.answer(conn_id, reply.encode());
    }

    fn unknown_session(&mut self, conn_id: u64) {
        let why = "this server has no record of the transfer (it restarted, or the transfer \
                   was idle too long); run it again: verified data is kept"
            .to_string();
        self.answer(conn_id, Outcome::Failed(why).encode());
    }

    /// The most bytes a request on this session's stream may take: a plan
    /// up to `max_request`; once planned, a finish of 32 bytes per file
    /// (or an abort).
    fn request_budget(&self, session: &SessionKey) -> u64 {
        match self.sessions.get(session).and_then(|s| s.plan.as_ref()) {
            Some(p) => (p.plans().len() as u64 * 32 + 64).max(8 << 10),
            None => self.limits.max_request,
        }
    }
}

/// Streams: telling requests from data, and placing data in chunks.
impl<P: PlanView> Sessions<P> {
    /// New bytes of a stream that has not said what it is yet.
    fn on_opening_bytes(&mut self, conn_id: u64, offset: u64, data: &[u8]) {
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
        if !is_data_kind(first) {
            let asm = std::mem::take(asm);
            conn.state = ConnState::Message(asm);
            self.on_message_bytes(conn_id, budget);
            return;
        }
        // The header's length is in its first bytes (its first five, or
        // a framed header's ranges): parse it once, when all of it is in,
        // not on every arrival.
        let Some(header_len) = data_header_len_of(&asm.prefix) else {
            return;
        };
        let session = conn.session;
        if header_len > self.limits.max_request {
            let why = format!(
                "a data header of {header_len} bytes, over this server's limit of {} (--max-request)",
                self.limits.max_request
            );
            self.fail_session(session, why);
            return;
        }
        if (asm.prefix.len() as u64) < header_len {
            return;
        }
        self.classify_data(conn_id);
    }

    /// A data stream's header is in: check it and start placing.
    fn classify_data(&mut self, conn_id: u64) {
        let Some(conn) = self.conns.get_mut(&conn_id) else {
            return;
        };
        let ConnState::Opening(asm) = &mut conn.state else {
            return;
        };
        let session = conn.session;
        let parsed = if asm.prefix.first() == Some(&b'D') {
            DataHeader::parse(&asm.prefix).map(|h| h.map(|(h, _)| (h, None)))
        } else {
            DataHeader::parse_framed(&asm.prefix).map(|h| h.map(|(h, f, _)| (h, Some(f))))
        };
        let (header, frames) = match parsed {
            Ok(Some(h)) => h,
            Ok(None) => return,
            Err(e) => return self.fail_session(session, format!("a malformed data stream: {e}")),
        };
        let Some(s) = self.sessions.get(&session) else {
            return self.unknown_session(conn_id);
        };
        if let Err(e) = header.check(&s.file_sizes) {
            return self.fail_session(session, format!("a bad data stream: {e}"));
        }
        let Some(plan) = s.plan.clone() else {
            return self.unknown_session(conn_id);
        };
        if let Some(why) = outside_parts(&*plan, &header) {
            return self.fail_session(session, why);
        }
        let layout = match frames {
            None => Layout::new(&header, &s.file_sizes),
            Some(_) if !plan.options().compress => return self.fail_session(
                session,
                "a bad data stream: compressed chunks in a session that did not ask for --compress"
                    .to_string(),
            ),
            Some(frames) => match Layout::framed(&header, &frames, &s.file_sizes) {
                Ok(layout) => layout,
                Err(e) => return self.fail_session(session, format!("a bad data stream: {e}")),
            },
        };
        for slot in &layout.slots {
            plan.start_writing(slot.chunk.file as usize);
        }
        let slots = (0..layout.slots.len()).map(|_| SlotState::Empty).collect();
        let ConnState::Opening(asm) = std::mem::replace(
            &mut self.conns.get_mut(&conn_id).expect("looked up above").state,
            ConnState::Data(Box::new(DataConn {
                plan,
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
        self.advance(conn_id);
    }

    /// A request's bytes grew: the window moves with its contiguous start,
    /// and a request over its budget is refused.
    fn on_message_bytes(&mut self, conn_id: u64, budget: u64) {
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
            self.refuse(conn_id, peer, why);
            return;
        }
        let contiguous = asm.prefix.len() as u64;
        self.open_window(conn_id, contiguous);
    }

    /// Copies stream bytes into their chunks' buffers; full chunks go to
    /// the writers.
    fn place(&mut self, conn_id: u64, mut offset: u64, mut data: &[u8]) {
        // One lookup per segment; the spare buffers and the actions are
        // other fields, borrowed alongside.
        let Sessions {
            conns,
            spare,
            actions,
            ..
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
            let slot_len = slot.wire_bytes();
            if matches!(dc.slots[i], SlotState::Empty) {
                // A spare's old bytes are overwritten by this chunk's
                // before the chunk is complete (`got`) and goes anywhere.
                let mut buf = spare.pop().unwrap_or_default();
                buf.set_len(slot_len as usize);
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
                let to = Slot {
                    session: *session,
                    conn_id,
                    conn_key: *key,
                    slot: i,
                };
                actions.push_back(Action::Write(Job::Write(dc.write_job(to, buf))));
            }
        }
    }

    /// Moves a data connection's window past written chunks, and answers
    /// it once its stream is in and written.
    fn advance(&mut self, conn_id: u64) {
        let Some(conn) = self.conns.get_mut(&conn_id) else {
            return;
        };
        let session = conn.session;
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
        let moved = released != dc.released;
        dc.released = released;
        // Answered once every chunk is written, whatever the transport
        // says of the stream's end: a FIN bit flipped on the way (set or
        // cleared) must neither answer early nor never.
        let answer = (dc.first_unwritten == dc.slots.len()).then(|| std::mem::take(&mut dc.bad));
        if moved {
            self.open_window(conn_id, released);
        }
        if let Some(bad) = answer {
            self.answer(conn_id, Outcome::Done { bad }.encode());
            self.start_finish(session);
        }
    }
}

impl<P: PlanView> DataConn<P> {
    /// The write job for slot `to.slot`, whose buffer is full.
    fn write_job(&self, to: Slot, buf: ChunkBuf) -> WriteJob<P> {
        let slot = self.layout.slots[to.slot];
        let file = slot.chunk.file as usize;
        let size = self.plan.size(file);
        let whole = self.plan.plans()[file] == FilePlan::SendAll && chunk_count(size) == 1;
        WriteJob {
            to,
            plan: self.plan.clone(),
            file,
            chunk: slot.chunk.chunk,
            buf,
            encoding: slot.encoding,
            raw_len: slot.len,
            fsync: self.plan.options().fsync,
            whole,
        }
    }
}

/// Of a file sent in part, the chunks of other parts belong to other
/// sessions: never written, never recorded by this one. Why a header
/// names such chunks, if it does.
fn outside_parts<P: PlanView>(plan: &P, header: &DataHeader) -> Option<String> {
    let r = header.ranges.iter().find(|r| {
        plan.part(r.file as usize)
            .is_some_and(|p| r.first < p.start || r.first.saturating_add(r.count) > p.end)
    })?;
    Some(format!(
        "a bad data stream: chunks {}..{} of `{}`, outside the part this session sends",
        r.first,
        r.first.saturating_add(r.count),
        plan.rel(r.file as usize)
    ))
}

#[cfg(test)]
mod tests {
    //! Scripted at message level: hand-built requests and data streams in,
    //! the actions the receiver is to carry out asserted. Files of a few
    //! bytes keep every chunk one small buffer.
    use super::*;
    use crate::transfer::manifest::{Entry, EntryKind, Manifest};
    use crate::transfer::messages::{
        data_header_len, encode_abort, encode_finish, ChunkRange, Options,
    };
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    const SID: u64 = 77;
    const DEST: &str = "/srv/dest";

    fn peer(last: u8) -> SocketAddr {
        SocketAddr::from(([192, 0, 2, last], 4000))
    }

    /// A plan as the planners would have prepared it: every file sent.
    struct Files {
        sizes: Vec<u64>,
        plans: Vec<FilePlan>,
        parts: Vec<Option<Range<u64>>>,
        held: Vec<Vec<Cv>>,
        options: Options,
        ready: Vec<AtomicBool>,
        writing: Vec<AtomicU64>,
        copies: Vec<Vec<u32>>,
    }

    fn files(sizes: &[u64]) -> Files {
        Files {
            sizes: sizes.to_vec(),
            plans: vec![FilePlan::SendAll; sizes.len()],
            parts: vec![None; sizes.len()],
            copies: vec![Vec::new(); sizes.len()],
            held: Vec::new(),
            options: Options::default(),
            ready: sizes.iter().map(|_| AtomicBool::new(false)).collect(),
            writing: sizes.iter().map(|_| AtomicU64::new(0)).collect(),
        }
    }

    impl PlanView for Files {
        fn dest(&self) -> &Path {
            Path::new(DEST)
        }
        fn plans(&self) -> &[FilePlan] {
            &self.plans
        }
        fn options(&self) -> Options {
            self.options
        }
        fn deletions(&self) -> Option<Deletions> {
            None
        }
        fn held(&self) -> &[Vec<Cv>] {
            &self.held
        }
        fn size(&self, file: usize) -> u64 {
            self.sizes[file]
        }
        fn part(&self, file: usize) -> Option<Range<u64>> {
            self.parts[file].clone()
        }
        fn copies(&self, file: usize) -> &[u32] {
            &self.copies[file]
        }
        fn rel(&self, file: usize) -> String {
            format!("f{file}")
        }
        fn is_ready(&self, file: usize) -> bool {
            self.ready[file].load(Ordering::Relaxed)
        }
        fn start_writing(&self, file: usize) {
            self.writing[file].fetch_add(1, Ordering::Relaxed);
        }
    }

    fn limits() -> ReceiveLimits {
        ReceiveLimits {
            max_sessions: 4,
            max_sessions_per_ip: 2,
            max_request: 1 << 16,
            ..ReceiveLimits::default()
        }
    }

    fn plan_bytes(sizes: &[u64]) -> Vec<u8> {
        let entries = sizes
            .iter()
            .enumerate()
            .map(|(n, &size)| Entry {
                path: RelPath::new(format!("f{n}").into_bytes()).unwrap(),
                kind: EntryKind::File { size },
                mode: 0o644,
                mtime_sec: 0,
                mtime_nsec: 0,
            })
            .collect();
        PlanRequest {
            options: Options::default(),
            subdir: None,
            manifest: Manifest { entries },
            parts: Vec::new(),
            protect: Vec::new(),
            owners: None,
            xattrs: None,
            same: Vec::new(),
        }
        .encode()
    }

    /// A data stream: its header, then each chunk's data and a value.
    fn data_stream(ranges: &[(u32, u64, u64)], chunks: &[&[u8]]) -> Vec<u8> {
        let ranges = ranges
            .iter()
            .map(|&(file, first, count)| ChunkRange { file, first, count })
            .collect();
        let mut out = DataHeader { ranges }.encode();
        for data in chunks {
            out.extend_from_slice(data);
            out.extend_from_slice(&[0xcc; 32]);
        }
        out
    }

    struct Rig {
        s: Sessions<Files>,
        t0: Instant,
        next_conn: u64,
    }

    impl Rig {
        fn new(limits: ReceiveLimits, once: bool) -> Rig {
            Rig {
                s: Sessions::new(PathBuf::from("/srv"), once, limits, None),
                t0: Instant::now(),
                next_conn: 1,
            }
        }

        fn at(&self, secs: u64) -> Instant {
            self.t0 + Duration::from_secs(secs)
        }

        /// A new connection for session `sid` from `from`.
        fn open(&mut self, sid: u64, from: SocketAddr) -> u64 {
            let conn = self.next_conn;
            self.next_conn += 1;
            self.s
                .on_opened(self.t0, conn, sid, from, Who::Addr(from.ip()));
            conn
        }

        /// A whole request on its own connection.
        fn request(
            &mut self,
            sid: u64,
            from: SocketAddr,
            bytes: &[u8],
        ) -> (u64, Vec<Action<Files>>) {
            let conn = self.open(sid, from);
            self.s.on_bytes(conn, 0, bytes);
            self.s.on_complete(self.t0, conn);
            (conn, self.drain())
        }

        /// Whether a one-file plan for session `sid` from `from`, on its
        /// own connection, goes to the planners.
        fn plan_goes_to_planners(&mut self, sid: u64, from: SocketAddr) -> bool {
            let (_, actions) = self.request(sid, from, &plan_bytes(&[10]));
            plan_job(&actions).is_some()
        }

        /// A new connection of the session that carries file 0's first
        /// 10-byte chunk; the actions that followed.
        fn first_chunk_in(&mut self) -> (u64, Vec<Action<Files>>) {
            let conn = self.open(SID, peer(1));
            self.s
                .on_bytes(conn, 0, &data_stream(&[(0, 0, 1)], &[&[3; 10]]));
            (conn, self.drain())
        }

        fn drain(&mut self) -> Vec<Action<Files>> {
            std::iter::from_fn(|| self.s.poll_action()).collect()
        }

        /// A session whose plan of `plan` is accepted; its connection ended.
        fn planned(&mut self, plan: Files) -> SessionKey {
            let (sizes, plans) = (plan.sizes.clone(), plan.plans.clone());
            let (conn, actions) = self.request(SID, peer(1), &plan_bytes(&sizes));
            let session = plan_job(&actions).expect("a plan for the planners");
            self.s.on_planned(session, conn, Ok(plan));
            let accepted = plan_reply(&self.drain(), conn, &sizes);
            let deletions = None;
            assert_eq!(accepted, PlanReply::Accepted { plans, deletions });
            self.s.on_ended(self.t0, conn, false, true);
            self.drain();
            session
        }
    }

    fn plan_job(actions: &[Action<Files>]) -> Option<SessionKey> {
        actions.iter().find_map(|a| match a {
            Action::Plan(PlanJob::Plan { session, .. }) => Some(*session),
            _ => None,
        })
    }

    fn finish_job(actions: &[Action<Files>]) -> Option<Vec<Cv>> {
        actions.iter().find_map(|a| match a {
            Action::Plan(PlanJob::Finish { hashes, .. }) => Some(hashes.clone()),
            _ => None,
        })
    }

    #[track_caller]
    fn replies(actions: &[Action<Files>], conn: u64) -> Vec<&[u8]> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Reply { conn_id, bytes } if *conn_id == conn => Some(&bytes[..]),
                _ => None,
            })
            .collect()
    }

    #[track_caller]
    fn reply_to(actions: &[Action<Files>], conn: u64) -> &[u8] {
        let replies = replies(actions, conn);
        assert_eq!(replies.len(), 1, "one reply to connection {conn}");
        replies[0]
    }

    #[track_caller]
    fn outcome(actions: &[Action<Files>], conn: u64) -> Outcome {
        Outcome::decode(reply_to(actions, conn)).unwrap()
    }

    #[track_caller]
    fn plan_reply(actions: &[Action<Files>], conn: u64, sizes: &[u64]) -> PlanReply {
        PlanReply::decode(reply_to(actions, conn), sizes, false).unwrap()
    }

    fn writes(actions: &[Action<Files>]) -> Vec<&WriteJob<Files>> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Write(Job::Write(w)) => Some(w),
                _ => None,
            })
            .collect()
    }

    fn windows(actions: &[Action<Files>], conn: u64) -> Vec<u64> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::OpenWindow { conn_id, upto } if *conn_id == conn => Some(*upto),
                _ => None,
            })
            .collect()
    }

    fn failures(actions: &[Action<Files>]) -> Vec<String> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Report(ReceiveEvent::Failed { why, .. }) => Some(why.clone()),
                _ => None,
            })
            .collect()
    }

    fn written(w: &WriteJob<Files>, result: Result<Cv, WriteFailure>) -> Written {
        Written {
            to: w.to,
            result,
            buf: ChunkBuf::default(),
        }
    }

    #[test]
    fn a_finish_for_an_unknown_session_is_answered_unknown_session() {
        let mut rig = Rig::new(limits(), false);
        let (conn, actions) = rig.request(SID, peer(1), &encode_finish(&[[7; 32]]));
        let Outcome::Failed(why) = outcome(&actions, conn) else {
            panic!("not a failure");
        };
        assert!(why.contains("no record of the transfer"), "{why}");
        assert_eq!(
            windows(&actions, conn),
            [encode_finish(&[[7; 32]]).len() as u64, u64::MAX],
            "the request in, then the rest let through"
        );
        assert!(finish_job(&actions).is_none());
    }

    #[test]
    fn a_plan_goes_to_the_planners_and_a_second_one_is_refused() {
        let mut rig = Rig::new(limits(), false);
        let (first, actions) = rig.request(SID, peer(1), &plan_bytes(&[10]));
        assert!(plan_job(&actions).is_some());
        assert!(actions.iter().all(|a| !matches!(a, Action::Reply { .. })));
        let (second, actions) = rig.request(SID, peer(1), &plan_bytes(&[10]));
        assert!(plan_job(&actions).is_none());
        let Outcome::Failed(why) = outcome(&actions, second) else {
            panic!("not a refusal");
        };
        assert_eq!(why, "a second plan for one session");
        assert_eq!(failures(&actions), [why]);
        assert_ne!(first, second);
    }

    #[test]
    fn too_many_sessions_from_one_address_are_told_to_come_back() {
        let mut rig = Rig::new(limits(), false);
        for sid in 1..=2 {
            assert!(
                rig.plan_goes_to_planners(sid, peer(1)),
                "session {sid} is within the budget"
            );
        }
        let (conn, actions) = rig.request(3, peer(1), &plan_bytes(&[10]));
        assert!(plan_job(&actions).is_none());
        let PlanReply::Busy { retry_after, why } = plan_reply(&actions, conn, &[10]) else {
            panic!("not busy");
        };
        assert_eq!(retry_after, BUSY_RETRY_AFTER);
        assert!(why.contains("--max-sessions-per-ip"), "{why}");
        assert!(failures(&actions).is_empty(), "busy is not a failure");
        assert!(
            rig.plan_goes_to_planners(3, peer(2)),
            "another address has its own budget"
        );
    }

    #[test]
    fn a_plan_the_planners_queue_turns_away_is_busy_and_nothing_of_it_is_kept() {
        let mut rig = Rig::new(limits(), false);
        let (conn, mut actions) = rig.request(SID, peer(1), &plan_bytes(&[10]));
        let Some(Action::Plan(job)) = actions.pop() else {
            panic!("the plan is the last action");
        };
        rig.s.on_plan_refused(job);
        let actions = rig.drain();
        assert!(matches!(
            plan_reply(&actions, conn, &[10]),
            PlanReply::Busy { .. }
        ));
        assert!(
            rig.plan_goes_to_planners(SID, peer(1)),
            "not a second plan: the first is gone"
        );
    }

    #[test]
    fn a_refused_plan_is_reported_and_its_session_forgotten() {
        let mut rig = Rig::new(limits(), false);
        let (conn, actions) = rig.request(SID, peer(1), &plan_bytes(&[10]));
        let session = plan_job(&actions).unwrap();
        rig.s.on_planned(
            session,
            conn,
            Err(Error::Refused {
                why: "a file in the way".into(),
            }),
        );
        let actions = rig.drain();
        assert_eq!(
            plan_reply(&actions, conn, &[10]),
            PlanReply::Refused("a file in the way".to_string())
        );
        assert_eq!(failures(&actions), ["a file in the way"]);
        let (conn, actions) = rig.request(SID, peer(1), &encode_finish(&[[7; 32]]));
        let Outcome::Failed(why) = outcome(&actions, conn) else {
            panic!("not a failure");
        };
        assert!(why.contains("no record"), "{why}");
    }

    #[test]
    fn a_request_over_its_budget_is_refused_before_it_is_whole() {
        let mut rig = Rig::new(
            ReceiveLimits {
                max_request: 100,
                ..limits()
            },
            false,
        );
        let conn = rig.open(SID, peer(1));
        let plan = plan_bytes(&[10; 8]);
        assert!(plan.len() > 100);
        rig.s.on_bytes(conn, 0, &plan[..60]);
        assert_eq!(
            windows(&rig.drain(), conn),
            [60],
            "the window follows the request"
        );
        // Past a hole: held bytes count too.
        rig.s.on_bytes(conn, 80, &plan[80..]);
        let actions = rig.drain();
        let Outcome::Failed(why) = outcome(&actions, conn) else {
            panic!("not a refusal");
        };
        assert!(why.contains("more than 100 bytes"), "{why}");
        rig.s.on_complete(rig.t0, conn);
        assert!(plan_job(&rig.drain()).is_none(), "never planned");
    }

    #[test]
    fn segments_out_of_order_assemble_one_chunk_and_one_write() {
        let mut rig = Rig::new(limits(), false);
        rig.planned(files(&[10]));
        let stream = data_stream(&[(0, 0, 1)], &[b"0123456789"]);
        let conn = rig.open(SID, peer(1));
        let pieces = [(30, stream.len()), (10, 30), (0, 10)];
        for (n, &(start, end)) in pieces.iter().enumerate() {
            rig.s.on_bytes(conn, start as u64, &stream[start..end]);
            let actions = rig.drain();
            let w = writes(&actions);
            if n + 1 < pieces.len() {
                assert!(w.is_empty(), "a write after piece {n} of {}", pieces.len());
                continue;
            }
            assert_eq!(w.len(), 1);
            let header = stream.len() - 10 - 32;
            assert_eq!(*w[0].buf, stream[header..], "data then value, in order");
            assert_eq!((w[0].file, w[0].chunk, w[0].to.slot), (0, 0, 0));
            assert!(w[0].whole, "the only chunk of a file sent whole");
        }
    }

    /// A framed stream (`--compress`) places each chunk by its wire
    /// length and hands the writers its bytes as sent, with how to expand
    /// them; in a session that did not ask for it, it fails the session.
    #[test]
    fn a_framed_stream_hands_the_writers_each_chunk_as_sent() {
        use crate::transfer::compress::FrameHeader;
        let framed = || {
            let header = DataHeader {
                ranges: vec![ChunkRange {
                    file: 0,
                    first: 0,
                    count: 2,
                }],
            };
            let frames = [
                FrameHeader {
                    encoding: Encoding::Zstd,
                    wire_len: 6,
                }
                .encode(),
                FrameHeader {
                    encoding: Encoding::Raw,
                    wire_len: 10,
                }
                .encode(),
            ];
            let mut out = header.encode_framed(&frames);
            for data in [&b"zstd.."[..], b"0123456789"] {
                out.extend_from_slice(data);
                out.extend_from_slice(&[0xcc; 32]);
            }
            out
        };
        let size = crate::transfer::hash::CHUNK_SIZE + 10;
        let mut rig = Rig::new(limits(), false);
        rig.planned(Files {
            options: Options {
                compress: true,
                ..Options::default()
            },
            ..files(&[size])
        });
        let conn = rig.open(SID, peer(1));
        rig.s.on_bytes(conn, 0, &framed());
        let actions = rig.drain();
        let w = writes(&actions);
        assert_eq!(w.len(), 2, "two chunks of {} stream bytes", framed().len());
        assert_eq!((w[0].encoding, w[0].raw_len), (Encoding::Zstd, 1 << 20));
        assert_eq!(&w[0].buf[..6], b"zstd..");
        assert_eq!(w[0].buf.len(), 6 + 32);
        assert_eq!((w[1].encoding, w[1].raw_len), (Encoding::Raw, 10));
        assert_eq!(&w[1].buf[..10], b"0123456789");

        let mut rig = Rig::new(limits(), false);
        rig.planned(files(&[size]));
        let conn = rig.open(SID, peer(1));
        rig.s.on_bytes(conn, 0, &framed());
        let actions = rig.drain();
        assert!(writes(&actions).is_empty());
        let why = failures(&actions).join("; ");
        assert!(why.contains("did not ask for --compress"), "{why}");
    }

    /// A chunk buffer comes back from the writers and is reused, not
    /// zeroed, for a shorter chunk: what goes to the writers (to be hashed
    /// and written) is that chunk's bytes and value only, never the bytes
    /// the buffer held past them.
    #[test]
    fn a_reused_buffer_hands_the_writers_only_the_shorter_chunks_bytes() {
        let mut rig = Rig::new(limits(), false);
        rig.planned(files(&[100, 10]));
        let stream = data_stream(&[(0, 0, 1), (1, 0, 1)], &[&[1; 100], &[2; 10]]);
        let first_end = data_header_len(2) + 100 + 32;
        let conn = rig.open(SID, peer(1));
        rig.s.on_bytes(conn, 0, &stream[..first_end]);
        let first = rig
            .drain()
            .into_iter()
            .find_map(|a| match a {
                Action::Write(Job::Write(w)) => Some(w),
                _ => None,
            })
            .expect("the first chunk's write");
        let mut buf = first.buf;
        buf.fill(0xee);
        let reused = buf.as_ptr();
        rig.s.on_written(Written {
            to: first.to,
            result: Ok([1; 32]),
            buf,
        });
        rig.s.on_bytes(conn, first_end as u64, &stream[first_end..]);
        let actions = rig.drain();
        let w = writes(&actions);
        assert_eq!(w.len(), 1);
        assert_eq!(w[0].buf.as_ptr(), reused, "the spare buffer, reused");
        assert_eq!(*w[0].buf, stream[first_end..], "10 bytes and the value");
    }

    #[test]
    fn written_chunks_open_the_window_and_the_last_answers_the_stream() {
        let mut rig = Rig::new(limits(), false);
        rig.planned(files(&[10, 20]));
        let stream = data_stream(&[(0, 0, 1), (1, 0, 1)], &[&[1; 10], &[2; 20]]);
        let conn = rig.open(SID, peer(1));
        rig.s.on_bytes(conn, 0, &stream);
        let actions = rig.drain();
        let jobs: Vec<Slot> = writes(&actions).iter().map(|w| w.to).collect();
        assert_eq!(jobs.len(), 2);
        let header = data_header_len(2) as u64;
        assert_eq!(windows(&actions, conn), [header], "nothing written yet");
        // The second chunk first: the window waits for the first.
        rig.s.on_written(Written {
            to: jobs[1],
            result: Ok([2; 32]),
            buf: ChunkBuf::default(),
        });
        let actions = rig.drain();
        assert!(windows(&actions, conn).is_empty());
        assert!(actions.iter().all(|a| !matches!(a, Action::Reply { .. })));
        rig.s.on_written(Written {
            to: jobs[0],
            result: Ok([1; 32]),
            buf: ChunkBuf::default(),
        });
        let actions = rig.drain();
        assert_eq!(windows(&actions, conn), [u64::MAX, u64::MAX]);
        assert_eq!(outcome(&actions, conn), Outcome::Done { bad: Vec::new() });
    }

    #[test]
    fn a_chunk_that_fails_its_check_is_named_in_the_answer() {
        let mut rig = Rig::new(limits(), false);
        rig.planned(files(&[10]));
        let (conn, actions) = rig.first_chunk_in();
        let job = written(writes(&actions)[0], Err(WriteFailure::Corrupt));
        rig.s.on_written(job);
        let actions = rig.drain();
        let bad = vec![ChunkRef { file: 0, chunk: 0 }];
        assert_eq!(outcome(&actions, conn), Outcome::Done { bad });
        assert!(failures(&actions).is_empty(), "sent again, not failed");
    }

    #[test]
    fn a_failed_write_fails_the_session_and_every_connection_hears_why() {
        let mut rig = Rig::new(limits(), false);
        rig.planned(files(&[10, 10]));
        let conn = rig.open(SID, peer(1));
        let other = rig.open(SID, peer(1));
        rig.s
            .on_bytes(conn, 0, &data_stream(&[(0, 0, 1)], &[&[3; 10]]));
        let actions = rig.drain();
        let why = DestError::Refused("`f0` is in the way".to_string());
        rig.s
            .on_written(written(writes(&actions)[0], Err(WriteFailure::Io(why))));
        let actions = rig.drain();
        let refused = Outcome::Refused("`f0` is in the way".to_string());
        assert_eq!(outcome(&actions, conn), refused);
        assert_eq!(
            outcome(&actions, other),
            refused,
            "even before its stream is in"
        );
        assert_eq!(failures(&actions), ["`f0` is in the way"]);
        let late = rig.open(SID, peer(1));
        assert_eq!(
            outcome(&rig.drain(), late),
            refused,
            "a later hello is told at once"
        );
    }

    /// A sender sends its finish as soon as its last data is sent: the
    /// finish waits for the session's data streams to be answered.
    #[test]
    fn a_finish_that_comes_before_the_data_is_written_waits_for_it() {
        let mut rig = Rig::new(limits(), false);
        let session = rig.planned(files(&[10]));
        let (data, actions) = rig.first_chunk_in();
        let write = writes(&actions)[0].to;
        let (finish, actions) = rig.request(SID, peer(1), &encode_finish(&[[5; 32]]));
        assert!(finish_job(&actions).is_none(), "waits for the data");
        assert!(replies(&actions, finish).is_empty());
        rig.s.on_written(Written {
            to: write,
            result: Ok([9; 32]),
            buf: ChunkBuf::default(),
        });
        let actions = rig.drain();
        assert_eq!(outcome(&actions, data), Outcome::Done { bad: Vec::new() });
        assert!(finish_job(&actions).is_none(), "waits for the file");
        rig.s.on_ready(session, Ok(()));
        assert_eq!(finish_job(&rig.drain()), Some(vec![[5; 32]]));
    }

    /// A finish that finds chunks missing once the streams are answered
    /// sends the sender to another round, as a data stream's answer does;
    /// the session goes on, and the round's finish is taken.
    #[test]
    fn a_finish_with_chunks_missing_names_them_and_the_session_goes_on() {
        let mut rig = Rig::new(limits(), false);
        let mut plan = files(&[10]);
        plan.options.finish_ahead = true;
        let session = rig.planned(plan);
        let (data, actions) = rig.first_chunk_in();
        let write = writes(&actions)[0].to;
        let (finish, _) = rig.request(SID, peer(1), &encode_finish(&[[5; 32]]));
        rig.s.on_written(Written {
            to: write,
            result: Err(WriteFailure::Corrupt),
            buf: ChunkBuf::default(),
        });
        let actions = rig.drain();
        let bad = vec![ChunkRef { file: 0, chunk: 0 }];
        assert_eq!(outcome(&actions, data), Outcome::Done { bad: bad.clone() });
        assert_eq!(outcome(&actions, finish), Outcome::Done { bad });
        assert!(finish_job(&actions).is_none());
        assert!(failures(&actions).is_empty(), "sent again, not failed");
        // The repair round, then its finish.
        let (_, actions) = rig.first_chunk_in();
        rig.s.on_written(written(writes(&actions)[0], Ok([9; 32])));
        rig.drain();
        rig.s.on_ready(session, Ok(()));
        rig.drain();
        let (_, actions) = rig.request(SID, peer(1), &encode_finish(&[[5; 32]]));
        assert_eq!(finish_job(&actions), Some(vec![[5; 32]]));
    }

    /// To a sender that did not ask for the finish ahead (an older one,
    /// which takes any answer to its finish as the end) missing chunks
    /// are no verdict: its finish goes to the planners, which refuse it.
    #[test]
    fn a_finish_without_the_ahead_bit_is_never_answered_with_chunks_to_send() {
        let mut rig = Rig::new(limits(), false);
        rig.planned(files(&[10]));
        let (_, actions) = rig.first_chunk_in();
        let write = writes(&actions)[0].to;
        rig.s.on_written(Written {
            to: write,
            result: Err(WriteFailure::Corrupt),
            buf: ChunkBuf::default(),
        });
        rig.drain();
        let (finish, actions) = rig.request(SID, peer(1), &encode_finish(&[[5; 32]]));
        assert!(replies(&actions, finish).is_empty(), "no chunks to send");
        assert_eq!(finish_job(&actions), Some(vec![[5; 32]]));
    }

    /// A file written from another's chunks (FilePlan::Copy): each chunk
    /// of the original verified is the copy's too, which is then made
    /// ready and counted written; while the original's chunk fails, the
    /// finish names it there alone, never the copy's (no chunk of it is
    /// sent).
    #[test]
    fn a_copy_is_verified_with_its_originals_chunks_and_never_named_missing() {
        let mut rig = Rig::new(limits(), false);
        let mut plan = files(&[10, 10]);
        plan.plans = vec![FilePlan::SendAll, FilePlan::Copy];
        plan.copies = vec![vec![1], Vec::new()];
        plan.options.finish_ahead = true;
        let session = rig.planned(plan);
        let (_, actions) = rig.first_chunk_in();
        rig.s
            .on_written(written(writes(&actions)[0], Err(WriteFailure::Corrupt)));
        rig.drain();
        let (_, actions) = rig.request(SID, peer(1), &encode_finish(&[[5; 32]; 2]));
        let bad = actions.iter().find_map(|a| match a {
            Action::Reply { bytes, .. } => Outcome::decode(bytes).ok(),
            _ => None,
        });
        let missing = vec![ChunkRef { file: 0, chunk: 0 }];
        assert_eq!(bad, Some(Outcome::Done { bad: missing }));

        let (_, actions) = rig.first_chunk_in();
        rig.s.on_written(written(writes(&actions)[0], Ok([9; 32])));
        let actions = rig.drain();
        let mut ready: Vec<usize> = actions
            .iter()
            .filter_map(|a| match a {
                Action::Write(Job::MakeReady { file, .. }) => Some(*file),
                _ => None,
            })
            .collect();
        ready.sort_unstable();
        assert_eq!(ready, [0, 1], "the original and its copy are made ready");
        let (finish, actions) = rig.request(SID, peer(1), &encode_finish(&[[5; 32]; 2]));
        assert!(finish_job(&actions).is_none(), "waits for both");
        rig.s.on_ready(session, Ok(()));
        assert!(finish_job(&rig.drain()).is_none(), "waits for the copy");
        rig.s.on_ready(session, Ok(()));
        let actions = rig.drain();
        let verified = actions.iter().find_map(|a| match a {
            Action::Plan(PlanJob::Finish { verified, .. }) => Some(verified.clone()),
            _ => None,
        });
        assert_eq!(verified, Some(vec![vec![Some([9; 32])]; 2]));
        rig.s.on_finished(
            rig.at(1),
            session,
            finish,
            Ok(Finished {
                files: 2,
                ..Finished::default()
            }),
        );
        let report = rig.drain().into_iter().find_map(|a| match a {
            Action::Report(ReceiveEvent::Done(r)) => Some(r),
            _ => None,
        });
        let report = report.expect("a report");
        assert_eq!((report.bytes_written, report.bytes_resumed), (20, 0));
    }

    /// A connection of the session with nothing in (held, then abandoned
    /// by its sender with its close lost) is no stream: the finish does
    /// not wait for it to go idle, which would fail the session.
    #[test]
    fn a_finish_does_not_wait_for_a_connection_with_nothing_in() {
        let mut rig = Rig::new(limits(), false);
        let session = rig.planned(files(&[10]));
        let (_, actions) = rig.first_chunk_in();
        rig.s.on_written(written(writes(&actions)[0], Ok([9; 32])));
        rig.drain();
        rig.s.on_ready(session, Ok(()));
        rig.open(SID, peer(1));
        let (_, actions) = rig.request(SID, peer(1), &encode_finish(&[[5; 32]]));
        assert_eq!(finish_job(&actions), Some(vec![[5; 32]]));
    }

    /// A finish waits for a data stream no longer than the session's idle
    /// rules keep it: a stream gone quiet fails the session, and the
    /// waiting finish hears why.
    #[test]
    fn a_finish_waiting_for_a_stream_that_went_quiet_hears_the_failure() {
        let mut rig = Rig::new(limits(), false);
        rig.planned(files(&[10, 10]));
        let (data, _) = rig.first_chunk_in();
        let (finish, actions) = rig.request(SID, peer(1), &encode_finish(&[[5; 32]; 2]));
        assert!(replies(&actions, finish).is_empty());
        rig.s.on_ended(rig.at(30), data, true, true);
        let actions = rig.drain();
        assert!(
            matches!(outcome(&actions, finish), Outcome::Failed(why) if why.contains("quiet")),
            "{:?}",
            outcome(&actions, finish)
        );
        assert!(finish_job(&actions).is_none());
    }

    #[test]
    fn a_finish_starts_only_once_every_file_is_made_ready() {
        let mut rig = Rig::new(limits(), false);
        rig.planned(files(&[10]));
        let (_, actions) = rig.first_chunk_in();
        let session = writes(&actions)[0].to.session;
        rig.s.on_written(written(writes(&actions)[0], Ok([9; 32])));
        let actions = rig.drain();
        let ready = actions
            .iter()
            .any(|a| matches!(a, Action::Write(Job::MakeReady { file: 0, .. })));
        assert!(ready, "its last chunk verified, the file is made ready");
        let (finish, actions) = rig.request(SID, peer(1), &encode_finish(&[[5; 32]]));
        assert!(finish_job(&actions).is_none(), "waits for the file");
        rig.s.on_ready(session, Ok(()));
        let actions = rig.drain();
        assert_eq!(finish_job(&actions), Some(vec![[5; 32]]));
        rig.s.on_finished(
            rig.at(3),
            session,
            finish,
            Ok(Finished {
                files: 1,
                ..Finished::default()
            }),
        );
        let actions = rig.drain();
        assert_eq!(outcome(&actions, finish), Outcome::Done { bad: Vec::new() });
        let report = actions.iter().find_map(|a| match a {
            Action::Report(ReceiveEvent::Done(r)) => Some(r),
            _ => None,
        });
        let report = report.expect("a report");
        assert_eq!(
            (report.files, report.bytes_written, report.bytes_resumed),
            (1, 10, 0)
        );
        assert_eq!(report.secs, 3.0, "from the plan to the finish");
    }

    #[test]
    fn a_finish_the_planners_turn_away_waits_for_them_to_finish_something() {
        let mut rig = Rig::new(limits(), false);
        let mut plan = files(&[10]);
        plan.plans = vec![FilePlan::Skip];
        rig.planned(plan);
        let (_, mut actions) = rig.request(SID, peer(1), &encode_finish(&[[5; 32]]));
        let Some(Action::Plan(job)) = actions.pop() else {
            panic!("a finish for the planners");
        };
        rig.s.on_plan_refused(job);
        assert!(rig.drain().is_empty(), "no answer: the finish waits");
        rig.s.on_tick(rig.at(1), false);
        assert!(
            finish_job(&rig.drain()).is_none(),
            "the planners are as busy"
        );
        rig.s.on_tick(rig.at(2), true);
        assert_eq!(finish_job(&rig.drain()), Some(vec![[5; 32]]));
    }

    #[test]
    fn a_session_idle_past_session_idle_is_forgotten() {
        let mut rig = Rig::new(limits(), false);
        rig.planned(files(&[10]));
        let idle = SESSION_IDLE.as_secs();
        rig.s.on_tick(rig.at(idle), false);
        assert!(rig.drain().is_empty(), "not yet");
        rig.s.on_tick(rig.at(idle + 1), false);
        let why = failures(&rig.drain());
        assert_eq!(why.len(), 1);
        assert!(why[0].contains("stopped before finishing"), "{why:?}");
        let (conn, actions) = rig.request(SID, peer(1), &encode_finish(&[[5; 32]]));
        assert!(matches!(outcome(&actions, conn), Outcome::Failed(w) if w.contains("no record")));
    }

    #[test]
    fn a_session_with_a_connection_is_never_idle() {
        let mut rig = Rig::new(limits(), false);
        rig.planned(files(&[10]));
        let conn = rig.open(SID, peer(1));
        rig.s.on_tick(rig.at(SESSION_IDLE.as_secs() * 10), false);
        assert!(rig.drain().is_empty());
        // It went quiet without a word: the session fails.
        rig.s.on_ended(rig.at(1000), conn, true, true);
        let why = failures(&rig.drain());
        assert!(why.len() == 1 && why[0].contains("went quiet"), "{why:?}");
    }

    #[test]
    fn a_header_naming_chunks_the_file_does_not_have_fails_the_session() {
        let mut rig = Rig::new(limits(), false);
        rig.planned(files(&[10]));
        let conn = rig.open(SID, peer(1));
        // A 10-byte file has one chunk: chunk 1 is past its end.
        rig.s
            .on_bytes(conn, 0, &data_stream(&[(0, 1, 1)], &[&[3; 10]]));
        let actions = rig.drain();
        assert!(writes(&actions).is_empty());
        let Outcome::Failed(why) = outcome(&actions, conn) else {
            panic!("not a failure");
        };
        assert!(why.starts_with("a bad data stream"), "{why}");
    }

    #[test]
    fn chunks_outside_the_part_a_session_sends_fail_it() {
        let mut rig = Rig::new(limits(), false);
        let mut plan = files(&[3 * crate::transfer::hash::CHUNK_SIZE]);
        plan.parts = vec![Some(1..2)];
        rig.planned(plan);
        let conn = rig.open(SID, peer(1));
        let header = DataHeader {
            ranges: vec![ChunkRange {
                file: 0,
                first: 0,
                count: 2,
            }],
        };
        rig.s.on_bytes(conn, 0, &header.encode());
        let actions = rig.drain();
        let Outcome::Failed(why) = outcome(&actions, conn) else {
            panic!("not a failure");
        };
        assert!(
            why.contains("chunks 0..2 of `f0`, outside the part"),
            "{why}"
        );
    }

    #[test]
    fn bytes_past_the_last_chunk_are_not_placed() {
        let mut rig = Rig::new(limits(), false);
        let plan = files(&[10]);
        rig.planned(plan);
        let conn = rig.open(SID, peer(1));
        let mut stream = data_stream(&[(0, 0, 1)], &[&[3; 10]]);
        stream.extend_from_slice(&[4; 50]);
        rig.s.on_bytes(conn, 0, &stream);
        let actions = rig.drain();
        let w = writes(&actions);
        assert_eq!(w.len(), 1);
        assert_eq!(w[0].buf.len(), 10 + 32, "the chunk and its value only");
        assert_eq!(
            w[0].plan.writing[0].load(Ordering::Relaxed),
            1,
            "one chunk on its way"
        );
    }

    #[test]
    fn an_abort_fails_the_session_with_the_senders_reason() {
        let mut rig = Rig::new(limits(), true);
        rig.planned(files(&[10]));
        let (conn, actions) = rig.request(SID, peer(1), &encode_abort("disk full"));
        assert_eq!(outcome(&actions, conn), Outcome::Done { bad: Vec::new() });
        assert_eq!(failures(&actions), ["the sender gave up: disk full"]);
        assert!(!rig.s.is_finished(), "its connection is still open");
        rig.s.on_ended(rig.t0, conn, false, true);
        assert!(rig.s.is_finished(), "once: the one transfer is over");
    }

    /// The `once` trap of issue 29: UDP dropped only on its way back, the
    /// receiver took a session's plan from its hello, but the sender never
    /// heard it and came again through the ssh tunnel. The first session
    /// going quiet neither ends the one transfer nor is its outcome.
    #[test]
    fn once_a_session_whose_sender_never_heard_this_end_is_forgotten_quietly() {
        let mut rig = Rig::new(limits(), true);
        let (unheard, actions) = rig.request(SID, peer(1), &plan_bytes(&[10]));
        let session = plan_job(&actions).expect("a plan for the planners");
        rig.s.on_planned(session, unheard, Ok(files(&[10])));
        rig.drain();
        rig.s.on_ended(rig.at(10), unheard, true, false);
        rig.s
            .on_tick(rig.at(10 + SESSION_IDLE.as_secs() + 1), false);
        assert!(failures(&rig.drain()).is_empty(), "no outcome from it");
        assert!(!rig.s.is_finished(), "the one transfer is still to come");
        // The same sender's session through the tunnel ends the transfer.
        rig.planned(files(&[10]));
        let (conn, actions) = rig.request(SID, peer(1), &encode_abort("stop"));
        assert_eq!(failures(&actions), ["the sender gave up: stop"]);
        rig.s.on_ended(rig.t0, conn, false, true);
        assert!(rig.s.is_finished(), "once: the one transfer is over");
    }

    #[test]
    fn a_grant_confines_a_plan_to_its_subdir_and_may_forbid_replacing() {
        let mut plan = match Request::decode(&plan_bytes(&[10])).unwrap() {
            Request::Plan(p) => p,
            _ => unreachable!(),
        };
        plan.subdir = Some(RelPath::new(b"inner".to_vec()).unwrap());
        let grant = Grant {
            subdir: Some(b"keys/alice".to_vec()),
            overwrite: false,
            delete: false,
            owners: false,
            xattrs: true,
            acls: false,
        };
        let (plan, policy) = granted(*plan, &ReceivePolicy::server(), Some(grant)).unwrap();
        assert_eq!(plan.subdir.unwrap().as_bytes(), b"keys/alice/inner");
        assert_eq!(policy.confined_to.as_deref(), Some(&b"keys/alice"[..]));
        assert!(policy.key_forbids_overwrite);
        assert!(policy.key_forbids_owners && policy.key_forbids_acls);
        assert!(!policy.key_forbids_xattrs);
    }
}

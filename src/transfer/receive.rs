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
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use super::dest::{self, FileTarget, Finished, Prepared};
use super::hash::{chunk_count, chunk_cv, Cv};
use super::layout::{Layout, CV_LEN};
use super::messages::{ChunkRef, DataHeader, FilePlan, MessageError, Outcome, PlanReply, Request};
use crate::io::ServeApp;
use crate::proto::server::{Arrival, ConnEnd, SessionEvent};
use crate::proto::Server;

/// Largest plan or finish request taken into memory.
const REQUEST_MAX: u64 = 256 << 20;
/// A session with no connection for this long is forgotten.
const SESSION_IDLE: Duration = Duration::from_secs(120);

/// What a receiver tells its operator.
#[derive(Debug, Clone)]
pub enum ReceiveEvent {
    /// A transfer finished: every file verified and in place.
    Done(TransferReport),
    /// A transfer was refused or failed.
    Failed {
        peer: SocketAddr,
        dest: PathBuf,
        why: String,
    },
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct TransferReport {
    pub session: u64,
    pub peer: SocketAddr,
    pub dest: PathBuf,
    pub files: u64,
    pub dirs: u64,
    pub symlinks: u64,
    pub skipped: u64,
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
}

/// Work done by other threads.
enum Done {
    Write {
        session: u64,
        conn_id: u64,
        slot: usize,
        result: Result<Cv, WriteFailure>,
        buf: Vec<u8>,
    },
    Plan {
        session: u64,
        conn_id: u64,
        result: Result<Prepared, String>,
    },
    Finish {
        session: u64,
        conn_id: u64,
        result: Result<Finished, String>,
    },
    InPlace {
        session: u64,
        result: Result<(), String>,
    },
}

enum Job {
    Write(WriteJob),
    /// A file whose every chunk is written and verified: rename it.
    PutInPlace {
        session: u64,
        target: Arc<FileTarget>,
        fsync: bool,
    },
}

enum WriteFailure {
    /// The chunk's data does not match its value: send it again.
    Corrupt,
    Io(String),
}

struct WriteJob {
    session: u64,
    conn_id: u64,
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

enum ConnState {
    /// Until the stream's first bytes say what it is: pieces by offset.
    Opening {
        pieces: BTreeMap<u64, Vec<u8>>,
    },
    /// A plan or finish request, taken in whole.
    Message {
        bytes: Vec<u8>,
        len: u64,
    },
    Data(Box<DataConn>),
    /// Answered, or its session is gone: data is let through unread.
    Drained,
}

struct Conn {
    session: u64,
    peer: SocketAddr,
    state: ConnState,
}

struct Session {
    peer: SocketAddr,
    prepared: Option<Arc<Prepared>>,
    file_sizes: Vec<u64>,
    /// Per file, per chunk: the value of the verified data now in place.
    verified: Vec<Vec<Option<Cv>>>,
    /// Per file sent whole: chunks not yet verified. At zero the file is
    /// put in place at once, so a later failure leaves it whole.
    unverified: Vec<u64>,
    /// Files being put in place; the finish waits for them.
    putting_in_place: usize,
    /// A finish request that waits for those.
    finish_waiting: Option<(u64, Vec<Cv>)>,
    failed: Option<String>,
    started: Instant,
    open_conns: usize,
    last_active: Instant,
    bytes_written: u64,
    chunks_rejected: u64,
}

pub struct FileReceiver {
    config: ReceiveConfig,
    sessions: HashMap<u64, Session>,
    conns: HashMap<u64, Conn>,
    jobs: mpsc::Sender<Job>,
    done_tx: mpsc::Sender<Done>,
    done_rx: mpsc::Receiver<Done>,
    notify: Arc<Notify>,
    /// Chunk buffers to reuse.
    spare: Vec<Vec<u8>>,
    on_event: Box<dyn FnMut(ReceiveEvent) + Send>,
    /// With `once`: the transfer is over; stop when its connections are.
    over: bool,
    finished: bool,
}

fn writer(jobs: Arc<Mutex<mpsc::Receiver<Job>>>, done: mpsc::Sender<Done>, notify: Arc<Notify>) {
    loop {
        let job = match jobs.lock().expect("a writer panicked").recv() {
            Ok(Job::Write(job)) => job,
            Ok(Job::PutInPlace {
                session,
                target,
                fsync,
            }) => {
                let result = target.put_in_place(fsync);
                let _ = done.send(Done::InPlace { session, result });
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
        let result = result.and_then(|cv| closed.map(|()| cv).map_err(WriteFailure::Io));
        let _ = done.send(Done::Write {
            session: job.session,
            conn_id: job.conn_id,
            slot: job.slot,
            result,
            buf: job.buf,
        });
        notify.notify_one();
    }
}

impl FileReceiver {
    pub fn new(
        config: ReceiveConfig,
        on_event: impl FnMut(ReceiveEvent) + Send + 'static,
    ) -> FileReceiver {
        let (jobs, job_rx) = mpsc::channel::<Job>();
        let (done_tx, done_rx) = mpsc::channel();
        let notify = Arc::new(Notify::new());
        let job_rx = Arc::new(Mutex::new(job_rx));
        for i in 0..config.writers.max(1) {
            let (j, d, n) = (job_rx.clone(), done_tx.clone(), notify.clone());
            thread::Builder::new()
                .name(format!("atou-writer-{i}"))
                .spawn(move || writer(j, d, n))
                .expect("cannot start a writer thread");
        }
        FileReceiver {
            config,
            sessions: HashMap::new(),
            conns: HashMap::new(),
            jobs,
            done_tx,
            done_rx,
            notify,
            spare: Vec::new(),
            on_event: Box::new(on_event),
            over: false,
            finished: false,
        }
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

    fn fail_session(&mut self, server: &mut Server, session: u64, why: String) {
        let Some(s) = self.sessions.get_mut(&session) else {
            return;
        };
        if s.failed.is_some() {
            return;
        }
        s.failed = Some(why.clone());
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
            self.answer(server, id, Outcome::Failed(why.clone()).encode());
        }
    }

    /// A whole plan or finish request has arrived.
    fn on_request(&mut self, server: &mut Server, conn_id: u64, bytes: &[u8]) {
        let Some(conn) = self.conns.get(&conn_id) else {
            return;
        };
        let (session, peer) = (conn.session, conn.peer);
        let request = match Request::decode(bytes) {
            Ok(r) => r,
            Err(e) => {
                let why = format!("a malformed request from {peer}: {e}");
                self.refuse(server, conn_id, peer, why);
                return;
            }
        };
        match request {
            Request::Plan(plan) => {
                if self.sessions.contains_key(&session) {
                    let why = "a second plan for one session".to_string();
                    self.refuse(server, conn_id, peer, why);
                    return;
                }
                let file_sizes = super::file_sizes(&plan.manifest);
                // The session keeps a value per chunk it is told of: a
                // manifest cannot claim more than the file system holds.
                let total = file_sizes.iter().fold(0u64, |a, &s| a.saturating_add(s));
                match crate::io::fs::filesystem_size(&self.config.root) {
                    Ok(fs_size) if total > fs_size => {
                        let why = format!(
                            "the files add up to {}, more than the whole file system of {} ({})",
                            crate::units::format_size(total),
                            self.config.root.display(),
                            crate::units::format_size(fs_size)
                        );
                        self.refuse(server, conn_id, peer, why);
                        return;
                    }
                    _ => {}
                }
                let now = Instant::now();
                self.sessions.insert(
                    session,
                    Session {
                        peer,
                        prepared: None,
                        verified: file_sizes
                            .iter()
                            .map(|&s| vec![None; chunk_count(s) as usize])
                            .collect(),
                        unverified: Vec::new(),
                        putting_in_place: 0,
                        finish_waiting: None,
                        file_sizes,
                        failed: None,
                        started: now,
                        open_conns: 1,
                        last_active: now,
                        bytes_written: 0,
                        chunks_rejected: 0,
                    },
                );
                let root = self.config.root.clone();
                let (done, notify) = (self.done_tx.clone(), self.notify.clone());
                thread::spawn(move || {
                    let result = dest::prepare(&root, plan);
                    let _ = done.send(Done::Plan {
                        session,
                        conn_id,
                        result,
                    });
                    notify.notify_one();
                });
            }
            Request::Finish(hashes) => {
                let Some(s) = self.sessions.get_mut(&session) else {
                    self.unknown_session(server, conn_id);
                    return;
                };
                if let Some(why) = &s.failed {
                    let reply = Outcome::Failed(why.clone()).encode();
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
                    self.fail_session(server, session, format!("the sender gave up: {why}"));
                }
                self.answer(server, conn_id, Outcome::Done { bad: Vec::new() }.encode());
            }
            Request::Data(_) => unreachable!("data streams are read as they arrive"),
        }
    }

    /// Starts a waiting finish once no file is still being put in place.
    fn start_finish(&mut self, session: u64) {
        let Some(s) = self.sessions.get_mut(&session) else {
            return;
        };
        if s.putting_in_place > 0 {
            return;
        }
        let (Some((conn_id, hashes)), Some(prepared)) =
            (s.finish_waiting.take(), s.prepared.clone())
        else {
            return;
        };
        let verified = s.verified.clone();
        let (done, notify) = (self.done_tx.clone(), self.notify.clone());
        thread::spawn(move || {
            let result = dest::finish(&prepared, &verified, &hashes);
            let _ = done.send(Done::Finish {
                session,
                conn_id,
                result,
            });
            notify.notify_one();
        });
    }

    fn refuse(&mut self, server: &mut Server, conn_id: u64, peer: SocketAddr, why: String) {
        (self.on_event)(ReceiveEvent::Failed {
            peer,
            dest: self.config.root.clone(),
            why: why.clone(),
        });
        self.answer(server, conn_id, Outcome::Failed(why).encode());
    }

    fn unknown_session(&mut self, server: &mut Server, conn_id: u64) {
        let why = "this server has no record of the transfer (it restarted, or the transfer \
                   was idle too long); run it again: verified data is kept"
            .to_string();
        self.answer(server, conn_id, Outcome::Failed(why).encode());
    }

    /// The first bytes of a stream are in: decide what it is.
    fn classify(&mut self, server: &mut Server, conn_id: u64) {
        let Some(conn) = self.conns.get_mut(&conn_id) else {
            return;
        };
        let ConnState::Opening { pieces } = &mut conn.state else {
            return;
        };
        let Some(first) = pieces.get(&0).and_then(|p| p.first().copied()) else {
            return;
        };
        if first != b'D' {
            let mut pieces = std::mem::take(pieces);
            conn.state = ConnState::Message {
                bytes: Vec::new(),
                len: 0,
            };
            server.release(conn_id, u64::MAX);
            for (offset, piece) in std::mem::take(&mut pieces) {
                self.on_message_bytes(server, conn_id, offset, &piece);
            }
            return;
        }
        // The contiguous start of the stream, enough for the header?
        let mut prefix = Vec::new();
        for (&offset, piece) in pieces.iter() {
            if offset as usize != prefix.len() {
                break;
            }
            prefix.extend_from_slice(piece);
        }
        let session = conn.session;
        let header = match DataHeader::parse(&prefix) {
            Ok(None) => return,
            Ok(Some((h, _))) => h,
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
        let layout = Layout::new(&header, &s.file_sizes);
        for slot in &layout.slots {
            prepared.files[slot.chunk.file as usize]
                .writing
                .fetch_add(1, Ordering::AcqRel);
        }
        let slots = (0..layout.slots.len()).map(|_| SlotState::Empty).collect();
        let ConnState::Opening { pieces } = std::mem::replace(
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
        for (offset, piece) in pieces {
            self.place(conn_id, offset, &piece);
        }
        self.advance(server, conn_id);
    }

    fn on_message_bytes(&mut self, server: &mut Server, conn_id: u64, offset: u64, data: &[u8]) {
        let Some(conn) = self.conns.get_mut(&conn_id) else {
            return;
        };
        let ConnState::Message { bytes, len } = &mut conn.state else {
            return;
        };
        let end = offset + data.len() as u64;
        if end > REQUEST_MAX {
            let (session, peer) = (conn.session, conn.peer);
            let why = format!("a request of more than {} MiB", REQUEST_MAX >> 20);
            self.refuse(server, conn_id, peer, why);
            let _ = session;
            return;
        }
        if bytes.len() < end as usize {
            bytes.resize(end as usize, 0);
        }
        bytes[offset as usize..end as usize].copy_from_slice(data);
        *len += data.len() as u64;
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
            state: ConnState::Data(dc),
            ..
        }) = conns.get_mut(&conn_id)
        else {
            return;
        };
        while !data.is_empty() {
            let Some(i) = dc.layout.slot_at(offset) else {
                // Header bytes, already read.
                let skip =
                    (dc.layout.header_len.saturating_sub(offset) as usize).clamp(1, data.len());
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

    fn on_done(&mut self, server: &mut Server, done: Done) {
        match done {
            Done::Write {
                session,
                conn_id,
                slot,
                result,
                buf,
            } => {
                if self.spare.len() < 64 {
                    self.spare.push(buf);
                }
                let s = self.sessions.get_mut(&session);
                let Some(conn) = self.conns.get_mut(&conn_id) else {
                    return;
                };
                let ConnState::Data(dc) = &mut conn.state else {
                    return;
                };
                dc.slots[slot] = SlotState::Written;
                let info = dc.layout.slots[slot];
                match result {
                    Ok(cv) => {
                        if let Some(s) = s {
                            let file = info.chunk.file as usize;
                            let was = s.verified[file][info.chunk.chunk as usize].replace(cv);
                            s.bytes_written += u64::from(info.len);
                            if was.is_none() && s.unverified[file] > 0 {
                                s.unverified[file] -= 1;
                                let done_already = s.prepared.as_ref().is_some_and(|p| {
                                    p.files[file].in_place.load(Ordering::Acquire)
                                });
                                if s.unverified[file] == 0 && !done_already {
                                    if let Some(p) = &s.prepared {
                                        s.putting_in_place += 1;
                                        let _ = self.jobs.send(Job::PutInPlace {
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
            Done::Plan {
                session,
                conn_id,
                result,
            } => match result {
                Err(why) => {
                    let peer = self.sessions.get(&session).map(|s| s.peer);
                    if let Some(peer) = peer {
                        (self.on_event)(ReceiveEvent::Failed {
                            peer,
                            dest: self.config.root.clone(),
                            why: why.clone(),
                        });
                    }
                    self.sessions.remove(&session);
                    server.respond(conn_id, PlanReply::Refused(why).encode());
                    self.end_once();
                }
                Ok(prepared) => {
                    let Some(s) = self.sessions.get_mut(&session) else {
                        return;
                    };
                    s.unverified = prepared
                        .plans
                        .iter()
                        .zip(&s.file_sizes)
                        .map(|(p, &size)| match p {
                            FilePlan::SendAll => chunk_count(size),
                            _ => 0,
                        })
                        .collect();
                    for (n, cvs) in prepared.held.iter().enumerate() {
                        // Held chunks count as verified until data replaces them.
                        for (k, cv) in cvs.iter().enumerate() {
                            s.verified[n][k] = Some(*cv);
                        }
                    }
                    server.respond(
                        conn_id,
                        PlanReply::Accepted(prepared.plans.clone()).encode(),
                    );
                    s.prepared = Some(Arc::new(prepared));
                }
            },
            Done::InPlace { session, result } => {
                let Some(s) = self.sessions.get_mut(&session) else {
                    return;
                };
                s.putting_in_place -= 1;
                match result {
                    Ok(()) => self.start_finish(session),
                    Err(why) => self.fail_session(server, session, why),
                }
            }
            Done::Finish {
                session,
                conn_id,
                result,
            } => {
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
                                .map(|(t, _)| t.size)
                                .sum::<u64>()
                                .saturating_sub(s.bytes_written)
                        });
                        let report = TransferReport {
                            session,
                            peer: s.peer,
                            dest: s
                                .prepared
                                .as_ref()
                                .map(|p| p.dest.clone())
                                .unwrap_or_default(),
                            files: f.files,
                            dirs: f.dirs,
                            symlinks: f.symlinks,
                            skipped: f.skipped,
                            bytes_written: s.bytes_written,
                            bytes_resumed: resumed,
                            chunks_rejected: s.chunks_rejected,
                            secs: s.started.elapsed().as_secs_f64(),
                        };
                        (self.on_event)(ReceiveEvent::Done(report));
                        server.respond(conn_id, Outcome::Done { bad: Vec::new() }.encode());
                        self.sessions.remove(&session);
                        self.end_once();
                    }
                    Err(why) => {
                        self.fail_session(server, session, why.clone());
                        server.respond(conn_id, Outcome::Failed(why).encode());
                    }
                }
            }
        }
    }
}

impl ServeApp for FileReceiver {
    fn on_arrival(&mut self, server: &mut Server, a: Arrival<'_>) {
        let Some(conn) = self.conns.get_mut(&a.conn_id) else {
            return;
        };
        match &mut conn.state {
            ConnState::Opening { pieces } => {
                pieces.insert(a.offset, a.payload.to_vec());
                if a.offset == 0 || pieces.contains_key(&0) {
                    self.classify(server, a.conn_id);
                }
            }
            ConnState::Message { .. } => {
                self.on_message_bytes(server, a.conn_id, a.offset, a.payload);
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
                ..
            } => {
                self.conns.insert(
                    conn_id,
                    Conn {
                        session,
                        peer,
                        state: ConnState::Opening {
                            pieces: BTreeMap::new(),
                        },
                    },
                );
                if let Some(s) = self.sessions.get_mut(&session) {
                    s.open_conns += 1;
                    s.last_active = Instant::now();
                    if let Some(why) = s.failed.clone() {
                        self.answer(server, conn_id, Outcome::Failed(why).encode());
                    }
                }
            }
            SessionEvent::Complete { conn_id } => {
                let Some(conn) = self.conns.get_mut(&conn_id) else {
                    return;
                };
                match &mut conn.state {
                    ConnState::Message { bytes, len } => {
                        if *len as usize == bytes.len() {
                            let bytes = std::mem::take(bytes);
                            self.on_request(server, conn_id, &bytes);
                        }
                    }
                    // Answered when its last chunk is written (advance).
                    ConnState::Data(_) => {}
                    ConnState::Opening { .. } => {
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
        while let Ok(done) = self.done_rx.try_recv() {
            self.on_done(server, done);
        }
        let stale: Vec<u64> = self
            .sessions
            .iter()
            .filter(|(_, s)| s.open_conns == 0 && s.last_active.elapsed() > SESSION_IDLE)
            .map(|(&id, _)| id)
            .collect();
        for id in stale {
            if let Some(s) = self.sessions.remove(&id) {
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

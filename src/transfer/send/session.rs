//! One send session, step by step: [`SendSession`] keeps what the session
//! learns (the plan, every chunk's value, the rounds' figures) and each
//! step is a method. The bookkeeping between the steps (what the plan
//! leaves to send, how chunks are shared out, what a round's answers
//! mean, when repairs are hopeless, the hashes of the finish) is plain
//! functions and small types, tested here without a socket.

use std::collections::{BTreeMap, HashSet};
use std::ops::Range;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use super::conn::{
    ask, ask_busy, open_early, run_conn, BusyWait, BytesFeed, DataConn, Early, EarlyEnd, Ending,
    Link,
};
use super::readers::{FileFeed, Readers, Shown, Siblings};
use super::{
    Bound, CompressReport, Deleted, PlannedFile, Progress, SendConfig, SendError, SendReport,
    StreamLive, StreamReport,
};
use crate::io::coupling::GroupMember;
use crate::io::xattr::Wanted;
use crate::io::{fresh_conn_id, StreamFeed};
use crate::transfer::compress;
use crate::transfer::hash::{chunk_count, chunk_len, file_hash, part_digest, Cv, CHUNK_SIZE};
use crate::transfer::layout::CV_LEN;
use crate::transfer::manifest::{
    keep_hard_links, manifest_of, walk, walk_listed, EntryKind, LocalEntry, Manifest,
};
use crate::transfer::messages::{
    encode_finish, ChunkRef, Deletions, FilePart, FilePlan, Options, Outcome, PlanReply,
    PlanRequest, SameFile, Xattrs, OPT2_SAME, XATTR_ENTRY_BYTES_MAX, XATTR_PLAN_BYTES_MAX,
};
use crate::transfer::shard::{part_bytes, Selected};
use crate::transfer::source::{SourceSpec, Sources};
use crate::util::text::shown_path;

/// Most rounds of re-sending chunks that failed their check.
const MAX_ROUNDS: usize = 16;

/// Runs a session to its end: walk, plan, select, rounds, finish.
/// `session_out` gets the session's id once the receiver holds it (the
/// plan was accepted), so that a failure after it can be told.
pub(super) fn send_session(
    sources: &[PathBuf],
    config: &SendConfig,
    from: &[Bound],
    progress: &Arc<Progress>,
    session_out: &mut Option<u64>,
) -> Result<SendReport, SendError> {
    let mut session = SendSession::start(sources, config, from, progress)?;
    let opened = EarlyOpened::for_session(&session);
    let id = session.id;
    thread::scope(|scope| {
        let mut early = opened.open(scope, config, progress, id);
        let finisher = Finisher {
            scope,
            link: Link {
                config,
                from: None,
                session: id,
                stop: progress,
            },
            // As the data connections: only on fresh sockets.
            ahead: from.is_empty(),
        };
        let (plans, deletions) = session.plan(&mut early)?;
        session.deletions = deletions.map(|d| Deleted::from(&d));
        *session_out = Some(session.id);
        let readers = Readers::start(config.readers);
        let mut selection = session.select(&plans, &readers)?;
        if config.options.dry_run {
            // The receiver has answered and kept nothing: no data, no finish.
            return Ok(session.dry_run_report(&plans, &selection.to_send));
        }
        let to_send = std::mem::take(&mut selection.to_send);
        let closing = session.send_rounds(to_send, &readers, early, &finisher, &plans)?;
        session.closed(closing);
        Ok(session.report(&selection))
    })
}

/// The data connections of the first round, opened while the plan is in
/// flight so that their hello (and handshake) round trip overlaps the
/// plan's: as many as the streams the round can have. Only on fresh
/// sockets (connections that share a bound socket follow each other),
/// and not for a dry run, which sends no data.
struct EarlyOpened {
    lives: Vec<Arc<StreamLive>>,
    detail: bool,
}

impl EarlyOpened {
    fn for_session(session: &SendSession<'_>) -> EarlyOpened {
        let config = session.config;
        let chunks: u64 = session.plan.sizes.iter().map(|&s| chunk_count(s)).sum();
        let count = if !session.from.is_empty() || config.options.dry_run {
            0
        } else {
            config
                .streams
                .min(usize::try_from(chunks).unwrap_or(usize::MAX))
        };
        EarlyOpened {
            lives: (0..count).map(|_| Arc::default()).collect(),
            detail: session.progress.detail.load(Ordering::Relaxed),
        }
    }

    /// Opens the connections, each run on a thread of `scope`.
    fn open<'scope, 'env>(
        &'env self,
        scope: &'scope thread::Scope<'scope, 'env>,
        config: &'env SendConfig,
        progress: &'env Progress,
        session: u64,
    ) -> Vec<EarlyStream<'scope>> {
        self.lives
            .iter()
            .enumerate()
            .map(|(index, live)| {
                let link = Link {
                    config,
                    from: None,
                    session,
                    stop: progress,
                };
                let data = DataConn {
                    round: 1,
                    stream: index + 1,
                    live: self.detail.then_some(&**live),
                };
                // Its close is not waited for: the finish may be answered by then.
                let (early, run) = open_early(link, true, Some(data));
                let (tell, heard) = mpsc::channel();
                let ended = tell.clone();
                let done = scope.spawn(move || {
                    let end = run();
                    let _ = ended.send(Heard::Ended);
                    end
                });
                EarlyStream {
                    early,
                    done,
                    live: live.clone(),
                    tell,
                    heard,
                }
            })
            .collect()
    }
}

/// Opens the finish's connection while a round runs, so that it is
/// welcomed by the time the round's last verdict comes and the finish
/// costs one round trip, not two.
struct Finisher<'scope, 'env> {
    scope: &'scope thread::Scope<'scope, 'env>,
    link: Link<'env>,
    ahead: bool,
}

/// A request's connection opened ahead of it ([`Finisher`]).
struct EarlyRequest<'scope> {
    early: Early<BytesFeed>,
    done: thread::ScopedJoinHandle<'scope, EarlyEnd<BytesFeed>>,
}

impl<'scope> Finisher<'scope, '_> {
    fn open(&self) -> Option<EarlyRequest<'scope>> {
        if !self.ahead {
            return None;
        }
        let (early, run) = open_early(self.link, true, None);
        Some(EarlyRequest {
            early,
            done: self.scope.spawn(run),
        })
    }
}

/// A data connection opened ahead of its round ([`EarlyOpened`]).
struct EarlyStream<'scope> {
    early: Early<Answered>,
    done: Closing<'scope>,
    live: Arc<StreamLive>,
    /// Where its stream's [`Answered`] tells the verdict.
    tell: mpsc::Sender<Heard>,
    heard: mpsc::Receiver<Heard>,
}

/// A data connection whose verdict is in, closing on its thread: joined
/// for its transport report once the finish is answered (its close is
/// not waited for, so that is at once).
type Closing<'scope> = thread::ScopedJoinHandle<'scope, EarlyEnd<Answered>>;

/// What a data connection opened ahead of its round tells the session:
/// that its stream's last byte went (with the values of its chunks), then
/// its verdict; or that it is over without them.
enum Heard {
    Sent(Vec<(ChunkRef, Cv)>),
    Verdict(Box<StreamResult>),
    Ended,
}

/// A round's finish: sent on its connection as soon as the round's last
/// data went, or held for after the round's verdicts (`None`: none was
/// opened ahead).
enum RoundFinish<'scope> {
    Launched(thread::ScopedJoinHandle<'scope, EarlyEnd<BytesFeed>>),
    Held(Option<EarlyRequest<'scope>>),
}

/// A data stream's feed that tells the session when the stream's last
/// byte went (the round's finish may go then) and hands it the stream's
/// verdict as soon as it is in, while the connection closes.
struct Answered {
    feed: FileFeed,
    host: String,
    share: Vec<ChunkRef>,
    tell: mpsc::Sender<Heard>,
    /// The verdict was told, with every byte counted into progress: the
    /// feed is done with.
    told: bool,
    /// Its last byte went: the round's finish may go.
    sent_told: bool,
}

impl crate::proto::PayloadSource for Answered {
    fn read_at(&mut self, offset: u64, buf: &mut [u8]) {
        self.feed.read_at(offset, buf);
        // Every chunk was read, and its value known, before its last
        // byte could go.
        if !self.sent_told && offset + buf.len() as u64 >= self.feed.stream_len() {
            self.sent_told = true;
            let _ = self.tell.send(Heard::Sent(self.feed.values().to_vec()));
        }
    }
}

impl StreamFeed for Answered {
    fn refill(&mut self, acked: u64) -> Result<Option<u64>, crate::io::FeedError> {
        if self.told {
            return Ok(None);
        }
        self.feed.refill(acked)
    }

    fn waker(&self) -> Option<Arc<tokio::sync::Notify>> {
        self.feed.waker()
    }

    fn sibling_done(&mut self) -> bool {
        self.feed.sibling_done()
    }

    fn coupling(&mut self, delivered: u64) -> Option<(u64, f64, u64)> {
        self.feed.coupling(delivered)
    }

    fn on_reply(&mut self, reply: &[u8]) {
        // Every byte was acknowledged before the reply came.
        self.feed.count_rest();
        let result = StreamResult {
            bad: outcome(&self.host, reply).and_then(|bad| carried(&self.host, &self.share, bad)),
            cvs: self.feed.take_values(),
            stream: None,
            sent: self.feed.file_bytes(),
            wire: self.feed.wire_bytes(),
        };
        self.told = true;
        let _ = self.tell.send(Heard::Verdict(Box::new(result)));
    }
}

/// What a session keeps from its walk to its report.
pub(super) struct SendSession<'a> {
    config: &'a SendConfig,
    from: &'a [Bound],
    progress: Arc<Progress>,
    started: Instant,
    /// The session's id at the receiver: odd, so never a probe's 0.
    id: u64,
    plan: Plan,
    /// The plan request, sent again while the receiver is busy.
    request: Vec<u8>,
    /// The receiver takes a finish sent before the data streams'
    /// answers: asked in the plan, and so until one predating it refuses.
    finish_ahead: bool,
    /// The plan names the files whose bytes are another's, until a
    /// receiver predating that refuses it.
    same_asked: bool,
    dirs: u64,
    symlinks: u64,
    values: ChunkValues,
    tally: Tally,
    /// What the receiver's plan said `--delete` removes.
    deletions: Option<Deleted>,
}

impl<'a> SendSession<'a> {
    /// Walks the sources into a plan and its request.
    fn start(
        sources: &[PathBuf],
        config: &'a SendConfig,
        from: &'a [Bound],
        progress: &Arc<Progress>,
    ) -> Result<SendSession<'a>, SendError> {
        let started = Instant::now();
        progress.set_stage("reading the sources");
        let Walked {
            plan,
            manifest,
            dirs,
            symlinks,
        } = Plan::walk(sources, config)?;
        // As the data connections opened ahead: only on fresh sockets.
        let finish_ahead = from.is_empty() && !config.options.dry_run;
        let request = plan_request(config, &plan, manifest, finish_ahead, true);
        Ok(SendSession {
            config,
            from,
            progress: progress.clone(),
            started,
            id: fresh_conn_id() | 1,
            values: ChunkValues::new(&plan.sizes),
            plan,
            request,
            finish_ahead,
            same_asked: true,
            dirs,
            symlinks,
            tally: Tally::default(),
            deletions: None,
        })
    }

    /// The connection of stream `stream` (from 0; the plan and the finish
    /// go as stream 0): from `from[stream % len]`, or a fresh socket.
    fn link(&self, stream: usize) -> Link<'_> {
        Link {
            config: self.config,
            from: (!self.from.is_empty()).then(|| &self.from[stream % self.from.len()]),
            session: self.id,
            stop: &self.progress,
        }
    }

    /// Asks the receiver what to send of each file, coming back while it
    /// is busy (within `--wait-busy`); a busy answer, or a plan
    /// connection turned away busy, closes the `early` connections, so
    /// that nothing is held at the receiver meanwhile.
    /// A receiver that predates the finish ahead (`Options::finish_ahead`)
    /// refuses the plan that asks it: it is asked again without.
    fn plan(
        &mut self,
        early: &mut Vec<EarlyStream<'_>>,
    ) -> Result<(Vec<FilePlan>, Option<Deletions>), SendError> {
        self.progress.set_stage(format!(
            "sending the manifest ({} entries)",
            self.plan.entries.len()
        ));
        let host = &self.config.host;
        let mut busy = BusyWait::default();
        loop {
            let delete = self.config.options.delete;
            let limit = PlanReply::max_len(&self.plan.sizes, delete);
            let request = self.request.clone();
            let reply = ask_busy(self.link(0), request, limit, &mut || early.clear())?;
            let (retry_after, why) = match plan_answer(host, &reply, &self.plan.sizes, delete) {
                Ok(PlanAnswer::Accepted { plans, deletions }) => {
                    self.check_copies(&plans)?;
                    return Ok((plans, deletions));
                }
                Err(SendError::Refused { why, .. })
                    if self.same_asked && !self.plan.same.is_empty() && predates_same(&why) =>
                {
                    self.same_asked = false;
                    self.request = self.request_again();
                    continue;
                }
                Ok(PlanAnswer::Busy { retry_after, why }) => (retry_after, why),
                Err(SendError::Refused { host, why })
                    if delete && why.contains("session protocol version") =>
                {
                    return Err(SendError::Refused {
                        host,
                        why: format!(
                            "{why} (its atou predates --delete: run the same release at both \
                             ends, or leave --delete out)"
                        ),
                    });
                }
                Err(SendError::Refused { host, why })
                    if self.config.options.compress && predates_compress(&why) =>
                {
                    return Err(SendError::Refused {
                        host,
                        why: format!(
                            "{why} (its atou predates --compress: upgrade it there, or send \
                             without --compress)"
                        ),
                    });
                }
                Err(e) if self.finish_ahead && predates_finish_ahead(&e) => {
                    self.finish_ahead = false;
                    self.request = self.request_again();
                    continue;
                }
                Err(e) => return Err(e),
            };
            early.clear();
            if busy.pause(self.config, &self.progress, retry_after, &why) {
                continue;
            }
            if self.progress.stop.load(Ordering::Relaxed) {
                return Err(SendError::Interrupted);
            }
            return Err(SendError::Busy {
                host: host.clone(),
                why,
                waited: busy.waited(),
            });
        }
    }

    /// The plan request again, as `finish_ahead` and `same_asked` now say.
    fn request_again(&self) -> Vec<u8> {
        let manifest = manifest_of(&self.plan.entries);
        plan_request(
            self.config,
            &self.plan,
            manifest,
            self.finish_ahead,
            self.same_asked,
        )
    }

    /// A receiver writes a file from another's chunks only where the plan
    /// said their bytes are the same: any other such answer is refused.
    fn check_copies(&self, plans: &[FilePlan]) -> Result<(), SendError> {
        let offered: &[SameFile] = if self.same_asked {
            &self.plan.same
        } else {
            &[]
        };
        match unoffered_copy(plans, offered) {
            Some(f) => Err(SendError::BadReply {
                host: self.config.host.clone(),
                why: format!(
                    "it would write {} from another file, which this plan did not offer",
                    self.plan.names[f]
                ),
            }),
            None => Ok(()),
        }
    }

    /// What to send: every chunk of the files the receiver wants, and of
    /// those it holds part of, the chunks that differ from ours (resume).
    fn select(&mut self, plans: &[FilePlan], readers: &Readers) -> Result<Selection, SendError> {
        let mut selection = Selection::of(&self.plan, plans);
        let held = std::mem::take(&mut selection.held);
        if held.is_empty() {
            return Ok(selection);
        }
        self.progress.set_stage(format!(
            "comparing {} partial file{} at the receiver",
            held.len(),
            if held.len() == 1 { "" } else { "s" }
        ));
        let ours = held_chunks(&self.plan, &held);
        let ours = readers.values(&self.plan.sources, &ours)?;
        selection.take_compared(compare(&held, ours), &self.plan, &mut self.values);
        Ok(selection)
    }

    /// Sends `to_send`, then the chunks the receiver found corrupt again,
    /// round after round, until every chunk passed its check and the
    /// finish is answered. The first round's streams go on `early`
    /// connections, as many as there are; the rest of `early` is closed
    /// unused. Each round's finish goes on a connection opened while the
    /// round runs: as soon as the round's last data went, where every
    /// stream of the round is on such a connection (the receiver answers
    /// it once the streams are answered, naming the chunks still
    /// missing), else once the verdicts are in and clean. Returns the
    /// data connections still closing.
    fn send_rounds<'scope>(
        &mut self,
        mut to_send: Vec<ChunkRef>,
        readers: &Readers,
        mut early: Vec<EarlyStream<'scope>>,
        finisher: &Finisher<'scope, '_>,
        plans: &[FilePlan],
    ) -> Result<Vec<Closing<'scope>>, SendError> {
        let mut closing = Vec::new();
        if to_send.is_empty() {
            self.finish(plans, None)?;
            return Ok(closing);
        }
        loop {
            let ahead = finisher.open();
            let early = std::mem::take(&mut early);
            let (mut bad, finish) =
                self.run_round(&to_send, readers, early, &mut closing, ahead, plans)?;
            match finish {
                RoundFinish::Launched(done) => {
                    self.progress.set_stage("verifying at the receiver");
                    let host = &self.config.host;
                    let reply = finish_reply(host, done)?;
                    let named = outcome(host, &reply).and_then(|b| carried(host, &to_send, b))?;
                    self.tally.also_bad(&mut bad, named);
                }
                // A round that leaves chunks to repair closes its finish's.
                RoundFinish::Held(ahead) if bad.is_empty() => {
                    self.finish(plans, ahead)?;
                }
                RoundFinish::Held(_) => {}
            }
            if bad.is_empty() {
                return Ok(closing);
            }
            to_send = bad;
        }
    }

    /// Takes in the transport reports of the data connections that
    /// were closing while the finish ran.
    fn closed(&mut self, closing: Vec<Closing<'_>>) {
        for c in closing {
            if let Some((_, _, Some(stream))) = c.join().expect("a stream thread panicked") {
                self.tally.streams.push(stream);
            }
        }
    }

    /// One round: `chunks` shared out over the streams, each stream a
    /// connection of its own; returns the chunks that failed their check.
    /// Connections still closing once their verdict is in go in
    /// `closing`; the round's finish, opened `ahead`, goes as
    /// [`SendSession::run_streams`] can.
    fn run_round<'scope>(
        &mut self,
        chunks: &[ChunkRef],
        readers: &Readers,
        early: Vec<EarlyStream<'scope>>,
        closing: &mut Vec<Closing<'scope>>,
        ahead: Option<EarlyRequest<'scope>>,
        plans: &[FilePlan],
    ) -> Result<(Vec<ChunkRef>, RoundFinish<'scope>), SendError> {
        let round = self
            .tally
            .next_round(chunks.len() as u64, &self.config.host)?;
        let total: u64 = chunks.iter().map(|&c| self.plan.chunk_bytes(c)).sum();
        self.progress.total.fetch_add(total, Ordering::Relaxed);
        self.progress.set_stage(round_stage(round, chunks.len()));
        for c in chunks {
            self.plan.sources.expect(c.file as usize, 1);
        }
        let shares = share_out(chunks, &self.plan.sizes, self.config.streams);
        *self.progress.current.lock().expect("progress lock") =
            first_names(&shares, &self.plan.names);
        let framed = self.config.options.compress && self.framing_pays(chunks);
        if !framed {
            let (mut results, finish) =
                self.run_streams(round, &shares, readers, early, closing, ahead, plans, false);
            if self.config.options.compress {
                for r in &mut results {
                    self.tally.bytes_plain += r.sent;
                    r.wire.get_or_insert(r.sent);
                }
            }
            let bad = self.tally.take(results, &mut self.values)?;
            return Ok((bad, finish));
        }
        // Framed streams: each wave's streams carry at most their share of
        // --buffer, compressed before their header goes; the finish opened
        // ahead goes after the last (docs/transfer.md, "Compression").
        let budget = stream_budget(self.config.buffer, shares.len());
        let waves = waves(&shares, &self.plan.sizes, budget);
        let mut early = Some(early);
        let mut ahead = ahead;
        let mut results = Vec::new();
        let mut finish = RoundFinish::Held(None);
        let count = waves.len();
        for (k, wave) in waves.iter().enumerate() {
            let started = Instant::now();
            let done_before = self.progress.done.load(Ordering::Relaxed);
            let last = k + 1 == count;
            let wave_ahead = if last { ahead.take() } else { None };
            let (r, f) = self.run_streams(
                round,
                wave,
                readers,
                early.take().unwrap_or_default(),
                closing,
                wave_ahead,
                plans,
                true,
            );
            results.extend(r);
            finish = f;
            let acked = self.progress.done.load(Ordering::Relaxed) - done_before;
            readers.step_level(acked as f64 / started.elapsed().as_secs_f64());
            if results.iter().any(|r: &StreamResult| r.bad.is_err()) {
                break;
            }
        }
        let bad = self.tally.take(results, &mut self.values)?;
        Ok((bad, finish))
    }

    /// Whether a round of `chunks` goes framed (`--compress`): whether
    /// pieces read at evenly spaced byte positions of them shrink
    /// ([`compress::samples_pay`]), so that a tree weighs by its bytes,
    /// not its file count. A piece that cannot be read says nothing;
    /// its stream will say why.
    fn framing_pays(&self, chunks: &[ChunkRef]) -> bool {
        let total: u64 = chunks.iter().map(|&c| self.plan.chunk_bytes(c)).sum();
        let mut samples = Vec::new();
        let mut chunks_in = chunks.iter().map(|&c| (c, self.plan.chunk_bytes(c)));
        let (mut current, mut end) = (None, 0u64);
        let mut taken_to = 0;
        for k in 0..compress::SAMPLES as u64 {
            let at = total * (2 * k + 1) / (2 * compress::SAMPLES as u64);
            while end <= at {
                let Some((c, len)) = chunks_in.next() else {
                    break;
                };
                current = Some((c, len));
                end += len;
            }
            let Some((c, len)) = current else {
                break;
            };
            // The piece around `at` within its chunk, not overlapping the
            // last one: a chunk's start is no better a sample than its
            // middle (file headers, half-random chunks).
            let piece_len = len.min(compress::SAMPLE_BYTES as u64);
            let chunk_start = end - len;
            let start = at.max(taken_to).min(end - piece_len).max(chunk_start);
            if start < taken_to || end <= at {
                continue;
            }
            taken_to = start + piece_len;
            let mut piece = vec![0; piece_len as usize];
            let offset = c.chunk * CHUNK_SIZE + (start - chunk_start);
            if self
                .plan
                .sources
                .read_once(c.file as usize, offset, &mut piece)
                .is_ok()
            {
                samples.push(piece);
            }
        }
        samples.is_empty() || compress::samples_pay(&samples)
    }

    /// Runs one stream per share, each on a thread of its own, and
    /// gathers what each gives back: on a connection opened ahead, as
    /// soon as its verdict is in (the connection goes in `closing`).
    /// Where every stream is on such a connection, the finish, opened
    /// `ahead`, goes as soon as every stream's last byte went.
    #[allow(clippy::too_many_arguments)]
    fn run_streams<'scope>(
        &self,
        round: usize,
        shares: &[Vec<ChunkRef>],
        readers: &Readers,
        early: Vec<EarlyStream<'scope>>,
        closing: &mut Vec<Closing<'scope>>,
        ahead: Option<EarlyRequest<'scope>>,
        plans: &[FilePlan],
        framed: bool,
    ) -> (Vec<StreamResult>, RoundFinish<'scope>) {
        let budget = stream_budget(self.config.buffer, shares.len());
        let mut early = early.into_iter();
        let mut opened = Vec::new();
        let lives: Vec<Arc<StreamLive>> = shares
            .iter()
            .map(|_| match early.next() {
                Some(e) => {
                    let live = e.live.clone();
                    opened.push(e);
                    live
                }
                None => Arc::default(),
            })
            .collect();
        // Connections the round has no stream for close unused.
        for unused in early {
            drop(unused.early);
            let _ = unused.done.join();
        }
        let mut opened = opened.into_iter();
        let siblings = Siblings::default();
        let mut members =
            GroupMember::of_streams(shares.len(), self.config.flows, fresh_conn_id()).into_iter();
        let detail = self.progress.detail.load(Ordering::Relaxed);
        if detail {
            *self.progress.streams.lock().expect("progress lock") = lives.clone();
        }
        thread::scope(|scope| {
            let handles: Vec<_> = shares
                .iter()
                .zip(lives)
                .enumerate()
                .map(|(index, (share, live))| {
                    let shown = Shown {
                        progress: self.progress.clone(),
                        index,
                        names: self.plan.names.clone(),
                        live,
                    };
                    let member = members.next().flatten();
                    let feed = if framed {
                        FileFeed::framed(share, &self.plan, readers, shown, siblings.clone())
                    } else {
                        Ok(FileFeed::new(
                            share,
                            &self.plan,
                            readers,
                            budget,
                            shown,
                            siblings.clone(),
                        ))
                    };
                    let feed = match feed {
                        Ok(feed) => feed.coupled(member),
                        Err(e) => {
                            let early = opened.next();
                            return Err(scope.spawn(move || {
                                if let Some(e) = early {
                                    drop(e.early);
                                    let _ = e.done.join();
                                }
                                StreamResult {
                                    bad: Err(SendError::Read(e)),
                                    cvs: Vec::new(),
                                    stream: None,
                                    sent: 0,
                                    wire: None,
                                }
                            }));
                        }
                    };
                    let link = self.link(index);
                    if let Some(e) = opened.next() {
                        let len = feed.stream_len();
                        let reply_limit = Outcome::max_len(feed.chunks() as u64);
                        let feed = Answered {
                            feed,
                            host: self.config.host.clone(),
                            share: share.clone(),
                            tell: e.tell,
                            told: false,
                            sent_told: false,
                        };
                        e.early.launch(len, reply_limit, feed);
                        return Ok((e.done, e.heard));
                    }
                    Err(scope
                        .spawn(move || run_stream(link, feed, share, round, index + 1, detail)))
                })
                .collect();
            let heard: Vec<_> = handles
                .iter()
                .map(|h| h.as_ref().ok().map(|(_, heard)| heard))
                .collect();
            let (finish, mut firsts) = self.finish_ahead(&heard, shares, ahead, plans);
            let results = handles
                .into_iter()
                .zip(shares)
                .zip(&mut firsts)
                .map(|((h, share), first)| match h {
                    Ok((done, heard)) => match first.take().or_else(|| told(&heard)) {
                        Some(Heard::Verdict(result)) => {
                            closing.push(done);
                            *result
                        }
                        _ => {
                            let end = done.join().expect("a stream thread panicked");
                            early_result(&self.config.host, share, end)
                        }
                    },
                    Err(h) => h.join().expect("a stream thread panicked"),
                })
                .collect();
            (results, finish)
        })
    }

    /// Launches the round's finish, opened `ahead`, once every stream's
    /// last byte went, where every stream of the round is on
    /// a connection opened ahead and says so. Returns the finish and, per
    /// stream, what it told instead of that (it ended first).
    fn finish_ahead<'scope>(
        &self,
        heard: &[Option<&mpsc::Receiver<Heard>>],
        shares: &[Vec<ChunkRef>],
        ahead: Option<EarlyRequest<'scope>>,
        plans: &[FilePlan],
    ) -> (RoundFinish<'scope>, Vec<Option<Heard>>) {
        let mut firsts: Vec<Option<Heard>> = heard.iter().map(|_| None).collect();
        let ahead = match ahead {
            Some(a) if self.finish_ahead && heard.iter().all(Option::is_some) => a,
            held => return (RoundFinish::Held(held), firsts),
        };
        let mut values = self.values.clone();
        let mut all_sent = true;
        for (heard, first) in heard.iter().flatten().zip(&mut firsts) {
            match heard.recv() {
                Ok(Heard::Sent(cvs)) => {
                    for (c, cv) in cvs {
                        values.record(c, cv);
                    }
                }
                told => {
                    all_sent = false;
                    *first = told.ok();
                }
            }
        }
        if !all_sent {
            return (RoundFinish::Held(Some(ahead)), firsts);
        }
        let request = encode_finish(&values.file_hashes(&self.plan, plans));
        let chunks: usize = shares.iter().map(Vec::len).sum();
        let limit = Outcome::max_len(chunks as u64);
        ahead
            .early
            .launch(request.len() as u64, limit, BytesFeed(request));
        (RoundFinish::Launched(ahead.done), firsts)
    }

    /// Sends every file's hash, on `early` if the last round opened it:
    /// the receiver checks them and puts the files in place.
    fn finish(&self, plans: &[FilePlan], early: Option<EarlyRequest<'_>>) -> Result<(), SendError> {
        self.progress.set_stage("verifying at the receiver");
        self.progress.current.lock().expect("progress lock").clear();
        let hashes = self.values.file_hashes(&self.plan, plans);
        let request = encode_finish(&hashes);
        let limit = Outcome::max_len(0);
        let reply = match early {
            Some(e) => {
                e.early
                    .launch(request.len() as u64, limit, BytesFeed(request));
                finish_reply(&self.config.host, e.done)?
            }
            None => ask(self.link(0), request, limit)?,
        };
        outcome(&self.config.host, &reply)?;
        Ok(())
    }

    /// The report of a session whose every file was verified.
    fn report(self, selection: &Selection) -> SendReport {
        let secs = self.started.elapsed().as_secs_f64();
        let tally = self.tally;
        SendReport {
            host: self.config.host.clone(),
            shard: self.config.shard.map(|s| s.to_string()),
            files: self.plan.sizes.len() as u64,
            files_in_part: self.plan.files_in_part(),
            dirs: self.dirs,
            symlinks: self.symlinks,
            skipped_files: selection.skipped_files,
            copied_files: selection.copied_files,
            bytes_total: self.plan.bytes_total(),
            bytes_sent: tally.bytes_sent,
            bytes_skipped: selection.bytes_skipped,
            bytes_copied: selection.bytes_copied,
            xattrs_sent: self.plan.xattrs_sent(),
            xattr_entries: self.plan.xattr_entries(),
            chunks_resent: tally.chunks_resent,
            secs,
            goodput_bps: goodput_bps(tally.bytes_sent, secs),
            rounds: tally.rounds,
            verified: true,
            streams: tally.streams,
            dry_run: None,
            compress: tally.bytes_wire.map(|wire| CompressReport {
                raw_bytes: tally.bytes_sent,
                wire_bytes: wire,
                ratio: tally.bytes_sent as f64 / wire.max(1) as f64,
                sent_plain: tally.bytes_plain,
            }),
            deleted: self.deletions,
        }
    }

    /// A dry run's report: per file what the receiver's plan means. Every
    /// figure is counted from our own files and the chunks we would send;
    /// the reply (decoded against our sizes) only chose among them.
    fn dry_run_report(&self, plans: &[FilePlan], to_send: &[ChunkRef]) -> SendReport {
        let files = planned_files(&self.plan, plans, to_send);
        let bytes_total = self.plan.bytes_total();
        let bytes_sent: u64 = files.iter().map(|f| f.send_bytes).sum();
        let skipped = files.iter().filter(|f| f.action == "skip").count() as u64;
        let copied = files.iter().filter(|f| f.action == "copy");
        let (copied_files, bytes_copied) = copied.fold((0, 0), |(n, b), f| (n + 1, b + f.size));
        SendReport {
            host: self.config.host.clone(),
            shard: self.config.shard.map(|s| s.to_string()),
            files: files.len() as u64,
            files_in_part: self.plan.files_in_part(),
            dirs: self.dirs,
            symlinks: self.symlinks,
            skipped_files: skipped,
            copied_files,
            bytes_total,
            bytes_sent,
            bytes_skipped: (bytes_total - bytes_sent.min(bytes_total)).saturating_sub(bytes_copied),
            bytes_copied,
            xattrs_sent: self.plan.xattrs_sent(),
            xattr_entries: self.plan.xattr_entries(),
            chunks_resent: 0,
            secs: self.started.elapsed().as_secs_f64(),
            goodput_bps: 0.0,
            rounds: 0,
            verified: false,
            streams: Vec::new(),
            dry_run: Some(files),
            compress: None,
            deleted: self.deletions.clone(),
        }
    }
}

/// The reply to a finish launched on a connection opened ahead of it.
fn finish_reply(
    host: &str,
    done: thread::ScopedJoinHandle<'_, EarlyEnd<BytesFeed>>,
) -> Result<Vec<u8>, SendError> {
    match done.join().expect("the finish's thread panicked") {
        Some((_, reply, _)) => reply,
        // Cannot be: the request was launched while it waited.
        None => Err(SendError::Failed {
            host: host.to_string(),
            why: "the finish's connection ended before its request".into(),
        }),
    }
}

/// What a data connection opened ahead tells after its stream's last
/// byte went: its verdict, or that it ended (`None` too).
fn told(heard: &mpsc::Receiver<Heard>) -> Option<Heard> {
    heard.iter().find(|h| !matches!(h, Heard::Sent(_)))
}

/// Runs data stream `stream` (from 1) of round `round` to its end.
fn run_stream(
    link: Link<'_>,
    mut feed: FileFeed,
    share: &[ChunkRef],
    round: usize,
    stream: usize,
    detail: bool,
) -> StreamResult {
    let sent = feed.file_bytes();
    let len = feed.stream_len();
    let ending = Ending {
        reply_limit: Outcome::max_len(feed.chunks() as u64),
        close_unacknowledged: false,
    };
    let live = detail.then(|| feed.live().clone());
    let data = DataConn {
        round,
        stream,
        live: live.as_deref(),
    };
    let (reply, stream) = run_conn(link, len, &mut feed, ending, Some(data));
    stream_result(&link.config.host, share, feed, reply, stream, sent)
}

/// What a data stream on a connection opened ahead of it gave back.
fn early_result(host: &str, share: &[ChunkRef], end: EarlyEnd<Answered>) -> StreamResult {
    match end {
        Some((Answered { feed, .. }, reply, stream)) => {
            let sent = feed.file_bytes();
            stream_result(host, share, feed, reply, stream, sent)
        }
        // Cannot be: the stream was launched while its thread waited.
        None => StreamResult {
            bad: Err(SendError::Failed {
                host: host.to_string(),
                why: "a data connection ended before its stream".into(),
            }),
            cvs: Vec::new(),
            stream: None,
            sent: 0,
            wire: None,
        },
    }
}

/// What data stream `share` gave back, from its feed and its reply.
fn stream_result(
    host: &str,
    share: &[ChunkRef],
    mut feed: FileFeed,
    reply: Result<Vec<u8>, SendError>,
    stream: Option<StreamReport>,
    sent: u64,
) -> StreamResult {
    // A reply means every byte was acknowledged: whatever was not yet
    // counted is. A stream that failed (a black hole's step-down among
    // such failures, whose send goes on resumed) counts only what its
    // acks said, so the progress shown then is not its whole share.
    if reply.is_ok() {
        feed.count_rest();
    }
    StreamResult {
        bad: reply
            .and_then(|r| outcome(host, &r))
            .and_then(|bad| carried(host, share, bad)),
        wire: feed.wire_bytes(),
        cvs: feed.take_values(),
        stream,
        sent,
    }
}

/// What one data stream gives back.
struct StreamResult {
    /// The chunks that failed their check at the receiver, or why the
    /// stream failed.
    bad: Result<Vec<ChunkRef>, SendError>,
    cvs: Vec<(ChunkRef, Cv)>,
    stream: Option<StreamReport>,
    /// File bytes the stream carried.
    sent: u64,
    /// Of a framed stream, what they took in it (compressed chunks'
    /// frames, raw chunks' bytes).
    wire: Option<u64>,
}

/// The files this session sends, in manifest order.
pub(super) struct Plan {
    entries: Vec<LocalEntry>,
    /// Per file: the chunks this session sends of a file split across
    /// shards, `None` for a file sent whole.
    parts: Vec<Option<Range<u64>>>,
    /// Per file: where it is here, opened for reading as chunks are read.
    pub(super) sources: Arc<Sources>,
    pub(super) sizes: Arc<Vec<u64>>,
    names: Arc<Vec<String>>,
    /// `-X` / `-A`: the entries' attributes, read at the walk.
    xattrs: Option<Xattrs>,
    /// `--compress`: the files whose bytes are an earlier file's, by
    /// file, ascending (src/transfer/send/same.rs).
    same: Vec<SameFile>,
}

/// The sources walked: the plan, the manifest that names every entry,
/// and how many of the entries are directories and symlinks.
struct Walked {
    plan: Plan,
    manifest: Manifest,
    dirs: u64,
    symlinks: u64,
}

impl Plan {
    /// Walks `sources` (with `--shard`, this shard's part of them).
    fn walk(sources: &[PathBuf], config: &SendConfig) -> Result<Walked, SendError> {
        let mut walked = match &config.files_from {
            Some(listed) => walk_listed(listed, config.follow, &config.filters)?,
            None => walk(sources, config.follow, &config.filters)?,
        };
        if config.hard_links {
            keep_hard_links(&mut walked);
        }
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
        let files = Files::of(&entries, config.follow)?;
        let xattrs = read_xattrs(&entries, config.keep_xattrs, config.follow)?;
        let sources = Arc::new(Sources::new(files.specs));
        let same = if config.options.compress {
            super::same::find(&sources, &files.sizes, &parts)?
        } else {
            Vec::new()
        };
        let plan = Plan {
            entries,
            parts,
            sources,
            sizes: Arc::new(files.sizes),
            names: Arc::new(files.names),
            xattrs,
            same,
        };
        Ok(Walked {
            plan,
            manifest,
            dirs: files.dirs,
            symlinks: files.symlinks,
        })
    }

    /// The chunks of file `f` this session sends: all of them, or its part.
    fn chunks(&self, f: usize) -> Range<u64> {
        self.parts[f]
            .clone()
            .unwrap_or(0..chunk_count(self.sizes[f]))
    }

    /// `-X` / `-A`: the attributes the plan carries.
    fn xattrs_sent(&self) -> u64 {
        let entries = self.xattrs.as_ref().map_or(&[][..], |x| &x.entries[..]);
        entries.iter().map(|(_, a)| a.len() as u64).sum()
    }

    /// `-X` / `-A`: the entries that have any.
    fn xattr_entries(&self) -> u64 {
        self.xattrs.as_ref().map_or(0, |x| x.entries.len() as u64)
    }

    /// The file whose bytes file `f` has, if the walk found one.
    fn same_as(&self, f: usize) -> Option<usize> {
        let i = self
            .same
            .binary_search_by_key(&(f as u32), |s| s.file)
            .ok()?;
        Some(self.same[i].of as usize)
    }

    /// The bytes of file `f` this session sends: its size, or its part's.
    fn bytes(&self, f: usize) -> u64 {
        match &self.parts[f] {
            Some(part) => part_bytes(self.sizes[f], part),
            None => self.sizes[f],
        }
    }

    fn bytes_total(&self) -> u64 {
        (0..self.sizes.len()).map(|f| self.bytes(f)).sum()
    }

    fn chunk_bytes(&self, c: ChunkRef) -> u64 {
        chunk_len(self.sizes[c.file as usize], c.chunk) as u64
    }

    /// Files split across shards, of which this session sends a part.
    fn files_in_part(&self) -> u64 {
        self.parts.iter().filter(|p| p.is_some()).count() as u64
    }
}

/// The walk's files, each opened as it is first read, and the count of
/// the other entries.
struct Files {
    specs: Vec<SourceSpec>,
    sizes: Vec<u64>,
    names: Vec<String>,
    dirs: u64,
    symlinks: u64,
}

impl Files {
    fn of(entries: &[LocalEntry], follow: bool) -> Result<Files, SendError> {
        let mut files = Files {
            specs: Vec::new(),
            sizes: Vec::new(),
            names: Vec::new(),
            dirs: 0,
            symlinks: 0,
        };
        for e in entries {
            match &e.entry.kind {
                EntryKind::File { size } => {
                    let Some(stamp) = e.stamp else {
                        let shown = shown_path(&e.source);
                        return Err(SendError::Source(format!(
                            "{shown} was not read by the walk"
                        )));
                    };
                    files.specs.push(SourceSpec {
                        top: e.top.clone(),
                        path: e.entry.path.clone(),
                        shown: e.source.clone(),
                        stamp,
                        follow,
                    });
                    files.sizes.push(*size);
                    files.names.push(e.entry.path.to_string());
                }
                EntryKind::Dir => files.dirs += 1,
                EntryKind::Symlink { .. } => files.symlinks += 1,
                // Made at the receiver from a file sent: nothing to read.
                EntryKind::HardLink { .. } => {}
            }
        }
        Ok(files)
    }
}

/// With `-X` / `-A`, the attributes of `entries` (hard links: their file
/// carries them), each entry's and the plan's within the caps a receiver
/// checks.
fn read_xattrs(
    entries: &[LocalEntry],
    wanted: Wanted,
    follow: bool,
) -> Result<Option<Xattrs>, SendError> {
    if !wanted.xattrs && !wanted.acls {
        return Ok(None);
    }
    let mut out = Xattrs {
        xattrs: wanted.xattrs,
        acls: wanted.acls,
        entries: Vec::new(),
    };
    let mut plan_bytes = 0;
    let mut reader = crate::io::xattr::Reader::new(wanted);
    for (i, e) in entries.iter().enumerate() {
        if matches!(e.entry.kind, EntryKind::HardLink { .. }) {
            continue;
        }
        // Read on the entry the walk saw, opened beneath its source one
        // component at a time: never on whatever its path leads to now.
        let reading = |err: &dyn std::fmt::Display| {
            SendError::Source(format!(
                "{}: reading its extended attributes: {err}",
                shown_path(&e.source)
            ))
        };
        let opened = crate::transfer::source::open_walked(&e.top, &e.entry.path, follow, e.id);
        let fd = opened
            .map_err(|err| reading(&err))?
            .ok_or_else(|| reading(&"it was replaced since the walk (send it again)"))?;
        let attrs = reader.read_fd(&fd).map_err(|err| reading(&err))?;
        let bytes: usize = attrs.iter().map(|(n, v)| n.len() + v.len()).sum();
        plan_bytes += bytes;
        if bytes > XATTR_ENTRY_BYTES_MAX || plan_bytes > XATTR_PLAN_BYTES_MAX {
            return Err(SendError::Source(format!(
                "{}: its extended attributes pass the caps a receiver takes \
                 ({XATTR_ENTRY_BYTES_MAX} bytes an entry, {XATTR_PLAN_BYTES_MAX} a transfer)",
                shown_path(&e.source)
            )));
        }
        if !attrs.is_empty() {
            out.entries.push((i as u32, attrs));
        }
    }
    Ok(Some(out))
}

fn plan_request(
    config: &SendConfig,
    plan: &Plan,
    manifest: Manifest,
    finish_ahead: bool,
    same: bool,
) -> Vec<u8> {
    PlanRequest {
        // The receiver learns it is one shard of several from this bit.
        options: Options {
            shard: config.shard.is_some(),
            finish_ahead,
            ..config.options
        },
        subdir: config.subdir.clone(),
        manifest,
        protect: if config.options.delete {
            config.filters.rules().collect()
        } else {
            Vec::new()
        },
        xattrs: plan.xattrs.clone(),
        same: if same { plan.same.clone() } else { Vec::new() },
        owners: {
            let keep = config.keep_owners;
            (keep.user || keep.group).then(|| {
                let ids = plan.entries.iter().map(|e| e.owner).collect();
                crate::transfer::dest::owners::ownership(ids, keep.user, keep.group, keep.numeric)
            })
        },
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
    .encode()
}

/// The receiver's answer to the plan request, once a refusal and a reply
/// that does not decode are errors.
#[derive(Debug, PartialEq)]
enum PlanAnswer {
    Accepted {
        /// One plan per file, in file order.
        plans: Vec<FilePlan>,
        /// What `--delete` removes, when it was asked.
        deletions: Option<Deletions>,
    },
    Busy {
        retry_after: Duration,
        why: String,
    },
}

fn plan_answer(
    host: &str,
    reply: &[u8],
    sizes: &[u64],
    delete: bool,
) -> Result<PlanAnswer, SendError> {
    match PlanReply::decode(reply, sizes, delete) {
        Ok(PlanReply::Accepted { plans, deletions }) => {
            Ok(PlanAnswer::Accepted { plans, deletions })
        }
        Ok(PlanReply::Busy { retry_after, why }) => Ok(PlanAnswer::Busy { retry_after, why }),
        Ok(PlanReply::Refused(why)) => Err(SendError::Refused {
            host: host.to_string(),
            why,
        }),
        Err(e) => Err(SendError::BadReply {
            host: host.to_string(),
            why: e.to_string(),
        }),
    }
}

/// A refusal of a plan with `--compress` by a receiver that predates it:
/// one from before the second options byte refuses the version, one from
/// after it the bit (`OPT2_COMPRESS`, 0x04).
fn predates_compress(why: &str) -> bool {
    why.contains("session protocol version 2,") || why.contains("unknown option bits 0x04")
}

/// What the receiver's plan leaves to send.
#[derive(Debug, Default, PartialEq)]
struct Selection {
    to_send: Vec<ChunkRef>,
    /// Files the receiver holds part of, with the values of its chunks:
    /// to compare with ours.
    held: Vec<(usize, Vec<Cv>)>,
    skipped_files: u64,
    /// File bytes not sent: skipped files and chunks the receiver holds.
    bytes_skipped: u64,
    /// Files the receiver writes from another file's chunks, and their bytes.
    copied_files: u64,
    bytes_copied: u64,
}

impl Selection {
    /// Sorts the files by their plans: every chunk of a file sent whole
    /// or in part is to send, a skipped file's bytes are skipped, a held
    /// file waits for the compare.
    fn of(plan: &Plan, plans: &[FilePlan]) -> Selection {
        let mut selection = Selection::default();
        for (f, p) in plans.iter().enumerate() {
            match p {
                FilePlan::SendAll => {
                    let file = f as u32;
                    let chunks = plan.chunks(f).map(|chunk| ChunkRef { file, chunk });
                    selection.to_send.extend(chunks);
                }
                FilePlan::Skip => {
                    selection.skipped_files += 1;
                    selection.bytes_skipped += plan.bytes(f);
                }
                FilePlan::Held(theirs) => selection.held.push((f, theirs.clone())),
                FilePlan::Copy => {
                    selection.copied_files += 1;
                    selection.bytes_copied += plan.bytes(f);
                }
            }
        }
        selection
    }

    /// Takes in the compare: chunks that differ are to send; those the
    /// receiver holds already are skipped, their values ours.
    fn take_compared(&mut self, compared: Compared, plan: &Plan, values: &mut ChunkValues) {
        for (c, cv) in compared.same {
            self.bytes_skipped += plan.chunk_bytes(c);
            values.record(c, cv);
        }
        self.to_send.extend(compared.differ);
    }
}

/// Of each file the receiver holds part of, the chunks ours to send (of a
/// file sent in part, only the part's).
fn held_chunks(plan: &Plan, held: &[(usize, Vec<Cv>)]) -> Vec<ChunkRef> {
    held.iter()
        .flat_map(|&(f, _)| {
            let file = f as u32;
            plan.chunks(f).map(move |chunk| ChunkRef { file, chunk })
        })
        .collect()
}

/// Chunks the receiver holds, split by comparing them with ours.
#[derive(Debug)]
struct Compared {
    /// Different from ours: to send.
    differ: Vec<ChunkRef>,
    /// The same as ours, with their values.
    same: Vec<(ChunkRef, Cv)>,
}

/// Compares our values of the chunks the receiver holds with its own.
fn compare(held: &[(usize, Vec<Cv>)], ours: Vec<(ChunkRef, Cv)>) -> Compared {
    let theirs: BTreeMap<ChunkRef, Cv> = held
        .iter()
        .flat_map(|(f, cvs)| {
            cvs.iter().enumerate().map(move |(k, cv)| {
                let file = *f as u32;
                (
                    ChunkRef {
                        file,
                        chunk: k as u64,
                    },
                    *cv,
                )
            })
        })
        .collect();
    let mut differ = Vec::new();
    let mut same = Vec::new();
    for (c, cv) in ours {
        if theirs.get(&c) == Some(&cv) {
            same.push((c, cv));
        } else {
            differ.push(c);
        }
    }
    differ.sort();
    Compared { differ, same }
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

/// The shares of a round of framed streams (`--compress`) cut into
/// waves: wave k holds the k-th run of each share's chunks of at most
/// `budget` raw bytes (one chunk at least), so the chunks a wave's
/// streams compress before they start stay within `--buffer`.
fn waves(shares: &[Vec<ChunkRef>], sizes: &[u64], budget: u64) -> Vec<Vec<Vec<ChunkRef>>> {
    let mut waves: Vec<Vec<Vec<ChunkRef>>> = Vec::new();
    for share in shares {
        let mut k = 0;
        let mut bytes = 0;
        for &c in share {
            let len = chunk_len(sizes[c.file as usize], c.chunk) as u64 + CV_LEN;
            if bytes > 0 && bytes + len > budget {
                k += 1;
                bytes = 0;
            }
            if waves.len() <= k {
                waves.push(Vec::new());
            }
            if bytes == 0 {
                waves[k].push(Vec::new());
            }
            waves[k].last_mut().expect("pushed above").push(c);
            bytes += len;
        }
    }
    waves
}

/// Each stream's share of `--buffer`, and never less than two chunks with
/// their values, so that one is read while the other is sent.
fn stream_budget(buffer: u64, streams: usize) -> u64 {
    (buffer / streams.max(1) as u64).max(2 * (CHUNK_SIZE + CV_LEN))
}

/// The file each stream starts with, for the display.
fn first_names(shares: &[Vec<ChunkRef>], names: &[String]) -> Vec<String> {
    shares
        .iter()
        .filter_map(|share| share.first())
        .map(|c| names[c.file as usize].clone())
        .collect()
}

fn round_stage(round: usize, chunks: usize) -> String {
    if round == 1 {
        "sending".to_string()
    } else {
        format!("sending {chunks} chunks again")
    }
}

/// The answer to a data stream or a finish: the chunks that failed their
/// check, or the receiver's no as an error.
fn outcome(host: &str, reply: &[u8]) -> Result<Vec<ChunkRef>, SendError> {
    let host = host.to_string();
    match Outcome::decode(reply) {
        Ok(Outcome::Done { bad }) => Ok(bad),
        Ok(Outcome::Failed(why)) => Err(SendError::Failed { host, why }),
        Ok(Outcome::Refused(why)) => Err(SendError::Refused { host, why }),
        Ok(Outcome::Mismatch(why)) => Err(SendError::Unverified { host, why }),
        Err(e) => Err(SendError::BadReply {
            host,
            why: e.to_string(),
        }),
    }
}

/// The first file a reply would write from another's chunks that the plan
/// did not name as another's bytes (`offered`, ascending by file).
fn unoffered_copy(plans: &[FilePlan], offered: &[SameFile]) -> Option<usize> {
    plans.iter().enumerate().position(|(f, p)| {
        *p == FilePlan::Copy
            && offered
                .binary_search_by_key(&(f as u32), |s| s.file)
                .is_err()
    })
}

/// A plan refused for naming files sent once ([`OPT2_SAME`]), by a
/// receiver that predates it: the unknown bits it names include it.
fn predates_same(why: &str) -> bool {
    why.split("unknown option bits 0x")
        .nth(1)
        .and_then(|rest| u8::from_str_radix(rest.get(..2)?, 16).ok())
        .is_some_and(|bits| bits & OPT2_SAME != 0)
}

/// A plan refused for the finish-ahead bit, by a receiver that predates
/// it (its refusal names the unknown bits: `MessageError::UnknownOptions`).
fn predates_finish_ahead(e: &SendError) -> bool {
    matches!(e, SendError::Refused { why, .. } if why.contains("unknown option bits"))
}

/// The chunks a data stream's answer names as bad, each checked to be one
/// the stream carried (the server chose these numbers), once each.
fn carried(host: &str, share: &[ChunkRef], bad: Vec<ChunkRef>) -> Result<Vec<ChunkRef>, SendError> {
    let sent: HashSet<ChunkRef> = share.iter().copied().collect();
    let mut seen = HashSet::with_capacity(bad.len().min(sent.len()));
    for c in &bad {
        if !sent.contains(c) {
            return Err(SendError::BadReply {
                host: host.to_string(),
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

/// What the rounds have done so far, for the report.
#[derive(Default)]
struct Tally {
    rounds: usize,
    /// Chunks the previous repair round re-sent.
    repaired: Option<u64>,
    /// File bytes sent (a chunk sent twice counts twice).
    bytes_sent: u64,
    /// What they took on the wire, of sessions with `--compress`.
    bytes_wire: Option<u64>,
    /// Of those, sent plain: rounds whose samples did not shrink.
    bytes_plain: u64,
    chunks_resent: u64,
    /// One transport report per connection that carried data.
    streams: Vec<StreamReport>,
}

impl Tally {
    /// Starts a round of `pending` chunks and returns its number, from 1;
    /// or gives up, past [`MAX_ROUNDS`] or when repairs fall behind.
    fn next_round(&mut self, pending: u64, host: &str) -> Result<usize, SendError> {
        self.rounds += 1;
        // A repair round of more than a few chunks must fix a tenth of
        // them, or the path corrupts (past the UDP checksum) too much for
        // 1 MiB chunks; a few chunks get every chance up to MAX_ROUNDS.
        let bad = pending;
        if self.rounds > MAX_ROUNDS || self.repaired.is_some_and(|r| bad > 16 && bad * 10 > r * 9) {
            return Err(SendError::Unverified {
                host: host.to_string(),
                why: format!(
                    "{bad} chunks still failed their BLAKE3 check after {} rounds; \
                     the path corrupts data faster than it can be repaired",
                    self.rounds - 1
                ),
            });
        }
        if self.rounds > 1 {
            self.repaired = Some(bad);
        }
        Ok(self.rounds)
    }

    /// Takes in a round's streams: their figures, their chunks' values
    /// into `values`; returns the chunks to send again, or the first
    /// stream's error.
    fn take(
        &mut self,
        results: Vec<StreamResult>,
        values: &mut ChunkValues,
    ) -> Result<Vec<ChunkRef>, SendError> {
        let mut bad = Vec::new();
        let mut first_error = None;
        for r in results {
            self.streams.extend(r.stream);
            self.bytes_sent += r.sent;
            if let Some(wire) = r.wire {
                *self.bytes_wire.get_or_insert(0) += wire;
            }
            for (c, cv) in r.cvs {
                values.record(c, cv);
            }
            match r.bad {
                Ok(b) => bad.extend(b),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        if let Some(e) = first_error {
            return Err(e);
        }
        self.chunks_resent += bad.len() as u64;
        Ok(bad)
    }

    /// Adds to a round's `bad` chunks those the finish `named` missing
    /// that no stream's answer named.
    fn also_bad(&mut self, bad: &mut Vec<ChunkRef>, named: Vec<ChunkRef>) {
        let known: HashSet<ChunkRef> = bad.iter().copied().collect();
        for c in named {
            if !known.contains(&c) {
                bad.push(c);
                self.chunks_resent += 1;
            }
        }
    }
}

/// File bytes per second of `secs`, in bits/s.
fn goodput_bps(bytes: u64, secs: f64) -> f64 {
    if secs > 0.0 {
        bytes as f64 * 8.0 / secs
    } else {
        0.0
    }
}

/// Our BLAKE3 value of every chunk, by file then chunk, as each is read
/// or compared.
#[derive(Clone)]
struct ChunkValues(Vec<Vec<Option<Cv>>>);

impl ChunkValues {
    fn new(sizes: &[u64]) -> ChunkValues {
        ChunkValues(
            sizes
                .iter()
                .map(|&s| vec![None; chunk_count(s) as usize])
                .collect(),
        )
    }

    fn record(&mut self, c: ChunkRef, cv: Cv) {
        self.0[c.file as usize][c.chunk as usize] = Some(cv);
    }

    /// The finish's hash of each file: the BLAKE3 hash of a file sent
    /// whole, the digest of a part, zeros for a file skipped.
    fn file_hashes(&self, plan: &Plan, plans: &[FilePlan]) -> Vec<Cv> {
        let mut hashes = Vec::with_capacity(plan.sizes.len());
        for (f, file_cvs) in self.0.iter().enumerate() {
            if plans[f] == FilePlan::Skip {
                hashes.push([0; 32]);
                continue;
            }
            // Read as its original's bytes, it has their values.
            let file_cvs = match (&plans[f], plan.same_as(f)) {
                (FilePlan::Copy, Some(of)) => &self.0[of],
                _ => file_cvs,
            };
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
        hashes
    }
}

/// Per file, what the receiver's plan means: the bytes of `to_send` that
/// are the file's, and whether it is sent at all.
fn planned_files(plan: &Plan, plans: &[FilePlan], to_send: &[ChunkRef]) -> Vec<PlannedFile> {
    let mut send_bytes = vec![0u64; plan.sizes.len()];
    for c in to_send {
        if let Some(b) = send_bytes.get_mut(c.file as usize) {
            *b += chunk_len(plan.sizes[c.file as usize], c.chunk) as u64;
        }
    }
    plans
        .iter()
        .zip(plan.sizes.iter().zip(plan.names.iter()))
        .zip(&send_bytes)
        .enumerate()
        .map(|(f, ((p, (&size, name)), &bytes))| PlannedFile {
            path: name.clone(),
            size,
            part: plan.parts[f].clone().map(|r| [r.start, r.end]),
            // An empty file is sent (created) unless the plan skips it.
            action: match p {
                FilePlan::Copy => "copy",
                FilePlan::Skip => "skip",
                FilePlan::Held(_) if bytes == 0 => "skip",
                _ => "send",
            },
            send_bytes: bytes,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transfer::send::Fault;

    const HOST: &str = "there";

    fn chunk(file: u32, chunk: u64) -> ChunkRef {
        ChunkRef { file, chunk }
    }

    /// `-X` reads the attributes of the entry the walk saw, never of what
    /// its path leads to later: a directory on its way swapped for a
    /// symlink to another tree (a local user racing the sender) fails the
    /// send, naming the entry, where reading by path gave the other
    /// tree's file's attributes.
    #[test]
    fn attributes_are_read_on_the_entry_the_walk_saw() {
        let dir = tempfile::tempdir().unwrap();
        let top = dir.path().join("top");
        let other = dir.path().join("other");
        for d in [top.join("d"), other.clone()] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(top.join("d/f"), "mine").unwrap();
        std::fs::write(other.join("f"), "theirs").unwrap();
        let set = |path: &std::path::Path, value: &[u8]| {
            rustix::fs::setxattr(path, "user.who", value, rustix::fs::XattrFlags::empty())
        };
        if set(&top.join("d/f"), b"mine").is_err() || set(&other.join("f"), b"theirs").is_err() {
            eprintln!("skipped: the temporary directory's file system takes no user.* attributes");
            return;
        }
        let wanted = Wanted {
            xattrs: true,
            ..Wanted::default()
        };
        let walked =
            crate::transfer::manifest::walk(std::slice::from_ref(&top), false, &Default::default())
                .unwrap();
        let read = read_xattrs(&walked, wanted, false).unwrap().unwrap();
        let f = walked
            .iter()
            .position(|e| e.entry.path.to_string() == "top/d/f")
            .unwrap();
        let want = vec![(b"user.who".to_vec(), b"mine".to_vec())];
        assert_eq!(read.entries, [(f as u32, want)]);

        std::fs::rename(top.join("d"), dir.path().join("d.old")).unwrap();
        std::os::unix::fs::symlink(&other, top.join("d")).unwrap();
        let err = read_xattrs(&walked, wanted, false).unwrap_err().to_string();
        assert!(err.contains("reading its extended attributes"), "{err}");
        assert!(!err.contains("theirs"));
    }

    /// A plan of files of `sizes`, never opened.
    fn plan_of(sizes: &[u64], parts: Vec<Option<Range<u64>>>) -> Plan {
        Plan {
            entries: Vec::new(),
            parts,
            sources: Arc::new(Sources::new(Vec::new())),
            sizes: Arc::new(sizes.to_vec()),
            names: Arc::new((0..sizes.len()).map(|f| format!("f{f}")).collect()),
            xattrs: None,
            same: Vec::new(),
        }
    }

    fn stream_result(
        bad: Result<Vec<ChunkRef>, SendError>,
        cvs: Vec<(ChunkRef, Cv)>,
    ) -> StreamResult {
        StreamResult {
            bad,
            cvs,
            stream: None,
            sent: 1000,
            wire: None,
        }
    }

    fn failed(why: &str) -> SendError {
        SendError::Failed {
            host: HOST.into(),
            why: why.into(),
        }
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

    #[test]
    fn each_stream_shows_the_file_it_starts_with() {
        let names = vec!["a".to_string(), "b".to_string()];
        let shares = vec![vec![chunk(1, 0), chunk(0, 0)], vec![chunk(0, 1)]];
        assert_eq!(first_names(&shares, &names), ["b", "a"]);
    }

    #[test]
    fn a_plan_reply_that_refuses_or_does_not_decode_is_an_error() {
        let sizes = [10];
        let plans = vec![FilePlan::SendAll];
        let deletions = None;
        let accepted = PlanReply::Accepted { plans, deletions }.encode();
        assert_eq!(
            plan_answer(HOST, &accepted, &sizes, false).unwrap(),
            PlanAnswer::Accepted {
                plans: vec![FilePlan::SendAll],
                deletions: None
            }
        );
        let busy = PlanReply::Busy {
            retry_after: Duration::from_secs(3),
            why: "full".into(),
        };
        assert_eq!(
            plan_answer(HOST, &busy.encode(), &sizes, false).unwrap(),
            PlanAnswer::Busy {
                retry_after: Duration::from_secs(3),
                why: "full".into()
            }
        );
        let refused = PlanReply::Refused("no".into()).encode();
        match plan_answer(HOST, &refused, &sizes, false) {
            Err(SendError::Refused { host, why }) => assert_eq!((&*host, &*why), (HOST, "no")),
            other => panic!("{other:?}"),
        }
        let garbage = plan_answer(HOST, &[0xff, 1, 2], &sizes, false).unwrap_err();
        assert_eq!(garbage.fault(), Fault::Protocol, "{garbage}");
    }

    /// An older receiver's refusal of the bit, as it words it, and no
    /// other refusal, makes the plan go again without it.
    #[test]
    fn a_receiver_that_predates_compress_is_told_by_its_refusal() {
        for why in [
            "a malformed plan: session protocol version 2, this atou speaks 1",
            "a malformed plan: unknown option bits 0x04",
        ] {
            assert!(predates_compress(why), "{why}");
        }
        assert!(!predates_compress("unknown option bits 0x80"));
        assert!(!predates_compress("no room"));
    }

    /// A hostile receiver's answer that would write a file from another's
    /// chunks where the plan named no such file is caught; a receiver that
    /// predates the bit is told by its refusal naming it.
    #[test]
    fn a_copy_the_plan_did_not_offer_is_refused_and_an_old_receiver_is_asked_without() {
        let offered = [SameFile { file: 2, of: 0 }];
        let plans = |p: [FilePlan; 3]| p.to_vec();
        use FilePlan::{Copy, SendAll};
        assert_eq!(
            unoffered_copy(&plans([SendAll, SendAll, Copy]), &offered),
            None
        );
        assert_eq!(
            unoffered_copy(&plans([SendAll, SendAll, SendAll]), &offered),
            None
        );
        assert_eq!(
            unoffered_copy(&plans([SendAll, Copy, Copy]), &offered),
            Some(1)
        );
        assert_eq!(
            unoffered_copy(&plans([Copy, SendAll, SendAll]), &offered),
            Some(0)
        );
        assert_eq!(
            unoffered_copy(&plans([SendAll, SendAll, Copy]), &[]),
            Some(2)
        );
        assert!(predates_same("a malformed plan: unknown option bits 0x10"));
        assert!(predates_same("a malformed plan: unknown option bits 0x14"));
        assert!(!predates_same("a malformed plan: unknown option bits 0x04"));
        assert!(!predates_same("unknown option bits 0x80"));
        assert!(!predates_same("no room"));
    }

    #[test]
    fn only_a_refusal_of_unknown_option_bits_drops_the_finish_ahead() {
        use crate::transfer::messages::MessageError;
        let old = format!("a malformed plan: {}", MessageError::UnknownOptions(0x80));
        let refused = |why: &str| SendError::Refused {
            host: HOST.into(),
            why: why.into(),
        };
        assert!(predates_finish_ahead(&refused(&old)));
        assert!(!predates_finish_ahead(&refused("a file is in the way")));
        assert!(!predates_finish_ahead(&failed(&old)));
    }

    #[test]
    fn an_outcome_is_the_bad_chunks_or_an_error_of_its_kind() {
        let done = Outcome::Done {
            bad: vec![chunk(0, 2)],
        };
        assert_eq!(outcome(HOST, &done.encode()).unwrap(), [chunk(0, 2)]);
        let fault = |o: Outcome| outcome(HOST, &o.encode()).unwrap_err().fault();
        assert_eq!(fault(Outcome::Failed("disk".into())), Fault::Partial);
        assert_eq!(fault(Outcome::Refused("in the way".into())), Fault::Refused);
        assert_eq!(fault(Outcome::Mismatch("hash".into())), Fault::Verify);
        let garbage = outcome(HOST, b"nonsense").unwrap_err();
        assert_eq!(garbage.fault(), Fault::Protocol);
    }

    /// The server chose the chunk numbers: only those the stream carried
    /// are taken, each once, in order.
    #[test]
    fn a_stream_answers_only_for_chunks_it_carried() {
        let share = [chunk(0, 0), chunk(0, 1), chunk(3, 7)];
        let bad = carried(HOST, &share, vec![chunk(3, 7), chunk(0, 0), chunk(3, 7)]).unwrap();
        assert_eq!(bad, [chunk(0, 0), chunk(3, 7)]);
        assert_eq!(carried(HOST, &share, Vec::new()).unwrap(), []);
        let stranger = carried(HOST, &share, vec![chunk(0, 1), chunk(1, 0)]).unwrap_err();
        assert!(matches!(stranger, SendError::BadReply { .. }), "{stranger}");
        assert!(
            stranger.to_string().contains("chunk 0 of file 1"),
            "{stranger}"
        );
    }

    #[test]
    fn the_plan_sorts_files_into_sent_skipped_and_held() {
        let sizes = [
            2 * CHUNK_SIZE + 1,
            100,
            CHUNK_SIZE,
            5 * CHUNK_SIZE,
            4 * CHUNK_SIZE,
        ];
        let parts = vec![None, None, None, Some(1..3), Some(0..2)];
        let plan = plan_of(&sizes, parts);
        let theirs = vec![[7; 32]];
        let plans = [
            FilePlan::SendAll,
            FilePlan::Skip,
            FilePlan::Held(theirs.clone()),
            FilePlan::SendAll,
            FilePlan::Skip,
        ];
        let selection = Selection::of(&plan, &plans);
        assert_eq!(
            selection.to_send,
            [
                chunk(0, 0),
                chunk(0, 1),
                chunk(0, 2),
                chunk(3, 1),
                chunk(3, 2)
            ],
            "of a file sent in part, only the part"
        );
        assert_eq!(selection.held, [(2, theirs)]);
        assert_eq!(selection.skipped_files, 2);
        assert_eq!(selection.bytes_skipped, 100 + 2 * CHUNK_SIZE);
    }

    #[test]
    fn resume_sends_only_chunks_that_differ_from_the_receivers() {
        let sizes = [3 * CHUNK_SIZE + 10, 4 * CHUNK_SIZE];
        let plan = plan_of(&sizes, vec![None, Some(2..4)]);
        // It holds two chunks of the first file and one of the second
        // (which is not in our part).
        let held = vec![(0, vec![[1; 32], [2; 32]]), (1, vec![[5; 32]])];
        let ours_to_read = held_chunks(&plan, &held);
        assert_eq!(
            ours_to_read,
            [
                chunk(0, 0),
                chunk(0, 1),
                chunk(0, 2),
                chunk(0, 3),
                chunk(1, 2),
                chunk(1, 3)
            ]
        );
        let ours = vec![
            (chunk(0, 3), [4; 32]),
            (chunk(0, 1), [9; 32]),
            (chunk(0, 0), [1; 32]),
            (chunk(0, 2), [3; 32]),
            (chunk(1, 2), [5; 32]),
            (chunk(1, 3), [6; 32]),
        ];
        let compared = compare(&held, ours);
        assert_eq!(
            compared.differ,
            [
                chunk(0, 1),
                chunk(0, 2),
                chunk(0, 3),
                chunk(1, 2),
                chunk(1, 3)
            ]
        );
        assert_eq!(compared.same, [(chunk(0, 0), [1; 32])]);

        let mut selection = Selection {
            to_send: vec![chunk(9, 0)],
            bytes_skipped: 1,
            ..Selection::default()
        };
        let mut values = ChunkValues::new(&sizes);
        selection.take_compared(compared, &plan, &mut values);
        assert_eq!(selection.bytes_skipped, 1 + CHUNK_SIZE);
        assert_eq!(selection.to_send.len(), 6);
        assert_eq!(values.0[0][0], Some([1; 32]));
        assert_eq!(
            values.0[0][1], None,
            "a chunk that differs is read as it is sent"
        );
    }

    #[test]
    fn repairs_that_fix_too_few_chunks_give_up() {
        let mut tally = Tally::default();
        assert_eq!(tally.next_round(1000, HOST).unwrap(), 1);
        // The first repair round is always tried.
        assert_eq!(tally.next_round(100, HOST).unwrap(), 2);
        assert_eq!(tally.next_round(80, HOST).unwrap(), 3, "a fifth fixed");
        let e = tally.next_round(73, HOST).unwrap_err();
        assert_eq!(e.fault(), Fault::Verify);
        assert!(e.to_string().contains("73 chunks still failed"), "{e}");
        assert!(e.to_string().contains("after 3 rounds"), "{e}");
    }

    #[test]
    fn a_few_bad_chunks_get_every_round_there_is() {
        let mut tally = Tally::default();
        for round in 1..=MAX_ROUNDS {
            assert_eq!(tally.next_round(16, HOST).unwrap(), round);
        }
        let e = tally.next_round(1, HOST).unwrap_err();
        assert!(
            e.to_string()
                .contains(&format!("after {MAX_ROUNDS} rounds")),
            "{e}"
        );
    }

    #[test]
    fn a_round_takes_every_stream_in_then_its_first_error() {
        let sizes = [3 * CHUNK_SIZE];
        let mut values = ChunkValues::new(&sizes);
        let mut tally = Tally::default();
        let again = tally
            .take(
                vec![
                    stream_result(Ok(vec![chunk(0, 2)]), vec![(chunk(0, 0), [1; 32])]),
                    stream_result(Ok(vec![chunk(0, 1)]), vec![(chunk(0, 1), [2; 32])]),
                ],
                &mut values,
            )
            .unwrap();
        assert_eq!(again, [chunk(0, 2), chunk(0, 1)]);
        assert_eq!((tally.bytes_sent, tally.chunks_resent), (2000, 2));

        let e = tally
            .take(
                vec![
                    stream_result(Ok(vec![chunk(0, 1)]), Vec::new()),
                    stream_result(Err(failed("first")), vec![(chunk(0, 2), [3; 32])]),
                    stream_result(Err(failed("second")), Vec::new()),
                ],
                &mut values,
            )
            .unwrap_err();
        assert!(e.to_string().contains("first"), "{e}");
        assert_eq!(tally.bytes_sent, 5000, "every stream's bytes");
        assert_eq!(tally.chunks_resent, 2, "no round after an error");
        assert_eq!(values.0[0], [Some([1; 32]), Some([2; 32]), Some([3; 32])]);
    }

    #[test]
    fn the_finish_hashes_whole_files_parts_and_zeros_for_skipped() {
        let sizes = [CHUNK_SIZE + 5, 7, 3 * CHUNK_SIZE];
        let plan = plan_of(&sizes, vec![None, None, Some(1..3)]);
        let plans = [FilePlan::SendAll, FilePlan::Skip, FilePlan::SendAll];
        let mut values = ChunkValues::new(&sizes);
        values.record(chunk(0, 0), [1; 32]);
        values.record(chunk(0, 1), [2; 32]);
        values.record(chunk(2, 1), [3; 32]);
        values.record(chunk(2, 2), [4; 32]);
        let hashes = values.file_hashes(&plan, &plans);
        assert_eq!(hashes.len(), 3);
        let whole = file_hash(sizes[0], &[[1; 32], [2; 32]]).unwrap();
        assert_eq!(hashes[0], *whole.as_bytes());
        assert_eq!(hashes[1], [0; 32]);
        assert_eq!(hashes[2], part_digest(sizes[2], 1, &[[3; 32], [4; 32]]));
    }

    #[test]
    fn a_dry_run_counts_each_files_bytes_and_skips_what_is_all_there() {
        let sizes = [2 * CHUNK_SIZE, 0, 50, CHUNK_SIZE + 1, 3 * CHUNK_SIZE];
        let plan = plan_of(&sizes, vec![None, None, None, None, Some(1..2)]);
        let plans = [
            FilePlan::SendAll,
            FilePlan::SendAll,
            FilePlan::Skip,
            FilePlan::Held(vec![[0; 32]]),
            FilePlan::Held(Vec::new()),
        ];
        let to_send = [chunk(0, 0), chunk(0, 1), chunk(3, 1)];
        let files = planned_files(&plan, &plans, &to_send);
        let seen: Vec<(&str, u64)> = files.iter().map(|f| (f.action, f.send_bytes)).collect();
        assert_eq!(
            seen,
            [
                ("send", 2 * CHUNK_SIZE),
                ("send", 0),
                ("skip", 0),
                ("send", 1),
                ("skip", 0)
            ]
        );
        assert_eq!(files[4].part, Some([1, 2]));
        assert_eq!(files[2].path, "f2");
    }

    /// Each wave takes at most the budget of each share, in order, and
    /// every chunk goes in exactly one wave.
    #[test]
    fn framed_streams_go_in_waves_within_the_budget() {
        let sizes = [5 * CHUNK_SIZE, 10];
        let a: Vec<ChunkRef> = (0..5).map(|i| chunk(0, i)).collect();
        let b = vec![chunk(1, 0)];
        let full = CHUNK_SIZE + CV_LEN;
        let w = waves(&[a.clone(), b.clone()], &sizes, 2 * full);
        assert_eq!(w.len(), 3);
        assert_eq!(w[0], vec![a[0..2].to_vec(), b.clone()]);
        assert_eq!(w[1], vec![a[2..4].to_vec()]);
        assert_eq!(w[2], vec![a[4..].to_vec()]);
        let one = waves(std::slice::from_ref(&a), &sizes, 1);
        assert_eq!(one.len(), 5, "a chunk a wave at least");
        assert_eq!(
            waves(std::slice::from_ref(&a), &sizes, 5 * full),
            vec![vec![a]]
        );
    }

    #[test]
    fn each_stream_reads_ahead_its_share_of_the_buffer_and_two_chunks_at_least() {
        let two = 2 * (CHUNK_SIZE + CV_LEN);
        assert_eq!(stream_budget(64 * CHUNK_SIZE, 4), 16 * CHUNK_SIZE);
        assert_eq!(stream_budget(64 * CHUNK_SIZE, 64), two);
        assert_eq!(stream_budget(0, 0), two);
        assert_eq!(goodput_bps(1000, 2.0), 4000.0);
        assert_eq!(goodput_bps(1000, 0.0), 0.0);
    }
}

//! One transport connection of a session: a request held in memory (the
//! plan, the finish, an abort) or a data stream, tried again while the
//! receiver turns it away busy.

use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use super::{Bound, Progress, SendConfig, SendError, StreamLive, StreamReport, TraceTaker};
use crate::io::{self, fresh_conn_id, ClientEnd, Launch, ProbeConfig, ProbeError, StreamFeed};
use crate::proto::{Observer, PayloadSource};

/// Coming back to a busy receiver: pauses of 0.5, 1, 2, 4, then 8 s (or
/// the receiver's hint, if longer), each stretched by a random factor
/// from 0.5 to 1.5 so that senders turned away together come back apart,
/// all within [`SendConfig::wait_busy`] of the first refusal. Nothing is
/// held at the receiver meanwhile: each try is a new connection.
#[derive(Debug, Default)]
pub(super) struct BusyWait {
    /// The first busy answer.
    since: Option<Instant>,
    tries: u32,
}

impl BusyWait {
    /// Pauses before the next try, saying so in `progress`; false when
    /// the wait is spent or the transfer was interrupted.
    pub(super) fn pause(
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
    pub(super) fn waited(&self) -> f64 {
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
            TraceRecord::Ack(ack) => {
                self.live.cwnd.store(ack.cwnd, Ordering::Relaxed);
                self.live.ssthresh.store(ack.ssthresh, Ordering::Relaxed);
            }
            // The sender's own smoothed RTT, not one recomputed here.
            TraceRecord::State(state) => {
                self.live
                    .srtt_us
                    .store(state.srtt.as_micros() as u64, Ordering::Relaxed);
            }
            TraceRecord::Sack { .. } => {}
        }
    }
}

/// A stream whose bytes are all in memory: a plan or finish request.
pub(super) struct BytesFeed(pub(super) Vec<u8>);

impl PayloadSource for BytesFeed {
    fn read_at(&mut self, offset: u64, buf: &mut [u8]) {
        let at = offset as usize;
        buf.copy_from_slice(&self.0[at..at + buf.len()]);
    }
}

impl StreamFeed for BytesFeed {
    fn refill(&mut self, _acked: u64) -> Result<Option<u64>, crate::io::FeedError> {
        Ok(None)
    }

    fn waker(&self) -> Option<Arc<Notify>> {
        None
    }

    fn all_ready(&self) -> bool {
        true
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
pub(super) struct DataConn<'a> {
    pub(super) round: usize,
    pub(super) stream: usize,
    pub(super) live: Option<&'a StreamLive>,
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("cannot start the I/O runtime")
}

/// What a connection waits for at its end.
#[derive(Clone, Copy)]
pub(super) struct Ending {
    /// The longest reply the request can be answered with; a longer one
    /// is refused.
    pub(super) reply_limit: u64,
    /// Done once the reply is in, without the close's acknowledgement
    /// (and the server's counters it carries): a round trip saved.
    pub(super) close_unacknowledged: bool,
}

/// What every connection of a session shares: where it goes, from which
/// socket, the session's id, and the flag that interrupts it.
#[derive(Clone, Copy)]
pub(super) struct Link<'a> {
    pub(super) config: &'a SendConfig,
    /// The socket to send from, and its peer; `None`: a fresh socket to
    /// `config.peer`.
    pub(super) from: Option<&'a Bound>,
    pub(super) session: u64,
    pub(super) stop: &'a Progress,
}

/// Runs one connection of the session carrying `len` bytes of `feed`;
/// returns the reply and the transport's report. A connection turned
/// away busy is tried again, within `--wait-busy`.
pub(super) fn run_conn<F: StreamFeed>(
    link: Link<'_>,
    len: u64,
    feed: &mut F,
    ending: Ending,
    data: Option<DataConn<'_>>,
) -> (Result<Vec<u8>, SendError>, Option<StreamReport>) {
    run_conn_busy(link, len, feed, ending, data, &mut || {})
}

/// [`run_conn`], calling `on_busy` each time the receiver turns it away
/// busy, before the pause.
fn run_conn_busy<F: StreamFeed>(
    link: Link<'_>,
    len: u64,
    feed: &mut F,
    ending: Ending,
    data: Option<DataConn<'_>>,
    on_busy: &mut dyn FnMut(),
) -> (Result<Vec<u8>, SendError>, Option<StreamReport>) {
    let mut busy = BusyWait::default();
    loop {
        let Link { config, from, .. } = link;
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
        let probe = probe_config(link, len, ending, data.as_ref());
        let (reply, stream) = attempt(link, socket, probe, feed, data.as_ref());
        match &reply {
            Err(e)
                if refused_busy(e) && {
                    on_busy();
                    busy.pause(link.config, link.stop, Duration::ZERO, &e.to_string())
                } => {}
            _ => return (reply, stream),
        }
    }
}

/// One try of a connection, from `socket` (or a fresh one), to its end.
fn attempt<F: StreamFeed>(
    link: Link<'_>,
    socket: Option<std::net::UdpSocket>,
    probe: ProbeConfig,
    feed: &mut F,
    data: Option<&DataConn<'_>>,
) -> (Result<Vec<u8>, SendError>, Option<StreamReport>) {
    let Link { config, stop, .. } = link;
    let close_awaited = !probe.close_unacknowledged;
    let stopped = async {
        while !stop.stop.load(Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let mut watch = Watch {
        live: data
            .and_then(|d| d.live)
            .map(|live| Live { live, top: None }),
        take: config
            .trace
            .as_ref()
            .zip(data)
            .map(|(sink, d)| (sink.0)(d.round, d.stream)),
    };
    let result = runtime().block_on(io::connect_from(socket, probe, feed, &mut watch, stopped));
    // The connection's trace is complete: its taker may finish it.
    drop(watch);
    let stream = result.report.map(|transport| StreamReport {
        transport,
        end: ClientEnd::of(&result.outcome, close_awaited),
    });
    let reply = match result.outcome {
        Ok(closed) => closed.reply.ok_or_else(|| SendError::Failed {
            host: config.host.clone(),
            why: "the connection closed without a reply".into(),
        }),
        Err(ProbeError::Interrupted) => Err(SendError::Interrupted),
        Err(ProbeError::Source(why)) => Err(SendError::Source(why)),
        Err(e) => Err(SendError::Conn(e)),
    };
    (reply, stream)
}

fn probe_config(
    link: Link<'_>,
    len: u64,
    ending: Ending,
    data: Option<&DataConn<'_>>,
) -> ProbeConfig {
    let config = link.config;
    ProbeConfig {
        auth: config.auth.clone(),
        peer: link.from.map_or(config.peer, |b| b.peer),
        tuning: config.tuning.clone(),
        bytes: Some(len),
        trace: data.is_some_and(|d| d.live.is_some() || config.trace.is_some()),
        conn_id: fresh_conn_id(),
        session: link.session,
        reply_limit: u32::try_from(ending.reply_limit).unwrap_or(u32::MAX),
        close_unacknowledged: ending.close_unacknowledged,
        path_memory: config.path_memory,
        stream_len_later: false,
        heard: Some(link.stop.heard.clone()),
    }
}

/// Sends a request held in memory (a plan, a finish, an abort) on a
/// connection of its own and returns the reply, at most `reply_limit`
/// bytes.
pub(super) fn ask(
    link: Link<'_>,
    request: Vec<u8>,
    reply_limit: u64,
) -> Result<Vec<u8>, SendError> {
    ask_busy(link, request, reply_limit, &mut || {})
}

/// [`ask`], calling `on_busy` each time the receiver turns the
/// connection away busy (the plan closes its connections opened ahead).
pub(super) fn ask_busy(
    link: Link<'_>,
    request: Vec<u8>,
    reply_limit: u64,
    on_busy: &mut dyn FnMut(),
) -> Result<Vec<u8>, SendError> {
    let len = request.len() as u64;
    // The reply is all a request wants (the data streams keep waiting
    // for the close's acknowledgement: its receiver counters go in the
    // report).
    let ending = Ending {
        reply_limit,
        close_unacknowledged: true,
    };
    run_conn_busy(link, len, &mut BytesFeed(request), ending, None, on_busy).0
}

/// A stream for a connection opened ahead of it: its length, the
/// longest reply it may have, and its bytes.
struct Job<F> {
    len: u64,
    reply_limit: u64,
    feed: F,
}

/// The application's end of a connection opened ahead of its stream
/// ([`open_early`]): [`Early::launch`] hands it the stream; dropped
/// unlaunched, it closes the connection.
pub(super) struct Early<F> {
    jobs: Option<mpsc::Sender<Job<F>>>,
    notify: Arc<Notify>,
}

impl<F> Early<F> {
    /// The connection's stream: `len` bytes of `feed`, answered with at
    /// most `reply_limit` bytes.
    pub(super) fn launch(mut self, len: u64, reply_limit: u64, feed: F) {
        if let Some(jobs) = self.jobs.take() {
            // A connection already over takes its stream on a fresh one.
            let _ = jobs.send(Job {
                len,
                reply_limit,
                feed,
            });
        }
    }
}

impl<F> Drop for Early<F> {
    fn drop(&mut self) {
        // Wakes the connection to take its stream, or to close without.
        self.jobs = None;
        self.notify.notify_one();
    }
}

/// The connection's end of an [`Early`]: no stream until one arrives.
struct LateFeed<F> {
    jobs: mpsc::Receiver<Job<F>>,
    notify: Arc<Notify>,
    /// The stream, once launched.
    job: Option<Job<F>>,
    /// Launched or abandoned: nothing more to tell the driver.
    told: bool,
}

impl<F: StreamFeed> PayloadSource for LateFeed<F> {
    fn read_at(&mut self, offset: u64, buf: &mut [u8]) {
        self.job
            .as_mut()
            .expect("nothing is sent before the stream is known")
            .feed
            .read_at(offset, buf);
    }
}

impl<F: StreamFeed> StreamFeed for LateFeed<F> {
    fn refill(&mut self, acked: u64) -> Result<Option<u64>, crate::io::FeedError> {
        match self.job.as_mut() {
            Some(j) => j.feed.refill(acked),
            None => Ok(None),
        }
    }

    fn waker(&self) -> Option<Arc<Notify>> {
        match &self.job {
            Some(j) => j.feed.waker(),
            None => Some(self.notify.clone()),
        }
    }

    fn sibling_done(&mut self) -> bool {
        self.job.as_mut().is_some_and(|j| j.feed.sibling_done())
    }

    fn coupling(&mut self, delivered: u64) -> Option<(u64, f64, u64)> {
        self.job.as_mut().and_then(|j| j.feed.coupling(delivered))
    }

    fn launch(&mut self) -> Option<Launch> {
        if self.told {
            return None;
        }
        let launch = match self.jobs.try_recv() {
            Err(mpsc::TryRecvError::Empty) => return None,
            Err(mpsc::TryRecvError::Disconnected) => Launch::Abandon,
            Ok(job) => {
                let launch = Launch::Stream {
                    len: job.len,
                    reply_limit: u32::try_from(job.reply_limit).unwrap_or(u32::MAX),
                };
                self.job = Some(job);
                launch
            }
        };
        self.told = true;
        Some(launch)
    }

    fn on_reply(&mut self, reply: &[u8]) {
        if let Some(j) = self.job.as_mut() {
            j.feed.on_reply(reply);
        }
    }
}

/// What a connection opened ahead of its stream gave back: the stream's
/// feed, its reply and its transport report; `None`: no stream came.
pub(super) type EarlyEnd<F> = Option<(F, Result<Vec<u8>, SendError>, Option<StreamReport>)>;

/// Opens a connection of the session now, before its stream is known,
/// so that its hello (and handshake) round trip overlaps the request
/// before it: returns the [`Early`] that launches its stream, and what
/// runs the connection to its end (on a thread of the caller's).
/// A connection that failed before its stream came, or held longer than
/// a server keeps a connection without data (`Client::abandon`), carries
/// it on a fresh connection instead, as
/// [`run_conn`] does (busy receivers included); while it waits it sends
/// nothing and its idle clock is stopped.
pub(super) fn open_early<'a, F: StreamFeed + 'a>(
    link: Link<'a>,
    close_unacknowledged: bool,
    data: Option<DataConn<'a>>,
) -> (Early<F>, impl FnOnce() -> EarlyEnd<F> + 'a) {
    let (jobs_tx, jobs) = mpsc::channel();
    let notify = Arc::new(Notify::new());
    let early = Early {
        jobs: Some(jobs_tx),
        notify: notify.clone(),
    };
    // The reply's limit comes with the stream.
    let ending = Ending {
        reply_limit: 0,
        close_unacknowledged,
    };
    let run = move || {
        let mut late = LateFeed {
            jobs,
            notify,
            job: None,
            told: false,
        };
        let mut job = loop {
            let probe = ProbeConfig {
                stream_len_later: true,
                ..probe_config(link, 0, ending, data.as_ref())
            };
            let socket = None;
            let (reply, stream) = attempt(link, socket, probe, &mut late, data.as_ref());
            // Opened in vain (it failed, or its hold ran out, before the
            // stream came; or the receiver turned it away busy, having
            // taken nothing): the stream goes on a connection of its own.
            match late.job.take() {
                Some(job) if !matches!(&reply, Err(e) if refused_busy(e)) => {
                    return Some((job.feed, reply, stream));
                }
                Some(job) => break job,
                None => {}
            }
            // Its hold ran out (closed without a reply, never told a
            // stream) while the stream is still to come (a round longer
            // than the hold: a finish waits for the whole round): hold a
            // fresh one, so that the stream, when it comes, still finds
            // its connection welcomed and costs no hello's round trip.
            let held_out = !late.told && matches!(reply, Err(SendError::Failed { .. }));
            if !held_out || link.stop.stop.load(Ordering::Relaxed) {
                break late.jobs.recv().ok()?;
            }
            match late.jobs.try_recv() {
                Ok(job) => break job,
                Err(mpsc::TryRecvError::Disconnected) => return None,
                Err(mpsc::TryRecvError::Empty) => {}
            }
        };
        let ending = Ending {
            reply_limit: job.reply_limit,
            ..ending
        };
        let (reply, stream) = run_conn(link, job.len, &mut job.feed, ending, data);
        let feed = job.feed;
        Some((feed, reply, stream))
    };
    (early, run)
}

//! Drives the sans-IO endpoints over real UDP: tokio for readiness and
//! timers, quinn-udp for batched receive (recvmmsg, GRO) and segmentation
//! offload on send (GSO).
//!
//! Each driver runs on one thread: a current-thread runtime, a loop that
//! drains transmits into a `TxBatch` (sent as GSO runs), reads what is
//! waiting in one recvmmsg, and otherwise sleeps until the socket is
//! readable or the endpoint's next timer. The endpoint is polled after
//! every datagram so the ACK policy stays per segment.
//!
//! Pacing: a paced sender's next timer includes the time its pacer lets
//! the next datagram go (`proto::congestion::pacer`). tokio's timers fire
//! on millisecond ticks, so each wake-up finds at least a millisecond of
//! credit (the pacer's quantum) and the loop below sends it as one burst,
//! one GSO run where the kernel offers it. Where the socket takes
//! departure times (SO_TXTIME), the burst goes as shorter runs, each
//! timed to leave at the pacing rate, which an fq qdisc honours
//! (docs/congestion.md, Pacing).

pub(crate) mod coupling;
pub(crate) mod dest_dir;
pub(crate) mod error_queue;
pub(crate) mod hello_timestamps;
pub(crate) mod netem;
pub(crate) mod pmtu;
pub(crate) mod socket;
pub(crate) mod tun;
pub(crate) mod xattr;

use std::fmt;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use thiserror::Error;
use tokio::sync::Notify;

pub use socket::SocketBuffers;
pub(crate) use socket::{route_mtu, this_host_mtu, RecvBatch, TxBatch, TxQueue, UdpIo};

use crate::io::hello_timestamps::SaveError;
use crate::proto::crypto::protect::BadTag;
use crate::proto::crypto::{Cipher, DropCounters, HandshakeError};
use crate::proto::endpoint::server::{
    Arrival, HandshakeDone, HandshakeWork, OpenJob, Opening, SessionEvent,
};
use crate::proto::wire::{ReceiverParams, RejectReason, ACK_MAX_LEN, CONTROL_MAX_LEN};
use crate::proto::{
    Client, Closed, ConnError, ConnReport, Notice, PatternSource, PayloadSource, Server,
    ServerLimits, ServerStats, Time, Tuning,
};
use crate::proto::{Observer, PathMemory, ReceiverStats, SenderSnapshot, SenderStats};

/// What the OS gives the drivers and the transfer layer: the wall clock
/// and fresh ids. Not an API: atou's own tests reach them through
/// `atou::internals::io`.
pub(crate) mod os {
    /// The wall clock in nanoseconds since the Unix epoch (0 before it): what
    /// hello timestamps are, and what a server's replay floor is made of.
    pub fn wall_clock_ns() -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
    }

    /// A client's connection (or session) id, from the OS CSPRNG: a plain
    /// server knows the connection by it, so one that could be guessed (as a
    /// hash of the time and process id could) lets another host aim packets
    /// at it. That hash only if the OS generator fails.
    pub fn fresh_conn_id() -> u64 {
        if let Ok(id) = crate::proto::crypto::handshake::random_id() {
            return id;
        }
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        h.write_u32(std::process::id());
        h.finish()
    }
}

pub(crate) use os::{fresh_conn_id, wall_clock_ns};

/// Default UDP port, as atou's.
pub(crate) const DEFAULT_PORT: u16 = 7890;
/// Most datagrams queued before they are sent, so that receiving (ACKs)
/// is not starved by a wide-open window.
const TX_BURST: usize = 256;

/// The endpoints' clock: nanoseconds since the driver started.
#[derive(Debug, Clone, Copy)]
struct Clock {
    base: Instant,
}

impl Clock {
    fn new() -> Clock {
        Clock {
            base: Instant::now(),
        }
    }

    fn now(&self) -> Time {
        Time::from_nanos(u64::try_from(self.base.elapsed().as_nanos()).unwrap_or(u64::MAX))
    }

    fn instant(&self, t: Time) -> tokio::time::Instant {
        tokio::time::Instant::from_std(self.base + Duration::from_nanos(t.as_nanos()))
    }
}

/// Waits for a notification, or forever.
async fn notified(waker: Option<&Notify>) {
    match waker {
        Some(n) => n.notified().await,
        None => std::future::pending().await,
    }
}

/// A thread beside the serving loop that turns each job sent to it into a
/// result, and wakes the loop when one is ready. Jobs go through a
/// bounded channel; it ends when dropped, once the job in hand is done.
struct SideThread<In, Out> {
    jobs: Option<std::sync::mpsc::SyncSender<In>>,
    done: std::sync::mpsc::Receiver<Out>,
    /// Told when a result is ready, to wake the serve loop.
    ready: Arc<Notify>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl<In: Send + 'static, Out: Send + 'static> SideThread<In, Out> {
    fn start(
        name: &str,
        capacity: usize,
        mut work: impl FnMut(In) -> Out + Send + 'static,
    ) -> io::Result<SideThread<In, Out>> {
        let (jobs, queue) = std::sync::mpsc::sync_channel::<In>(capacity.max(1));
        let (results, done) = std::sync::mpsc::channel();
        let ready = Arc::new(Notify::new());
        let wake = Arc::clone(&ready);
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                for job in queue {
                    if results.send(work(job)).is_err() {
                        break;
                    }
                    // A permit is kept if the loop is not waiting yet, so
                    // no result is left until the next datagram.
                    wake.notify_one();
                }
            })?;
        Ok(SideThread {
            jobs: Some(jobs),
            done,
            ready,
            thread: Some(thread),
        })
    }

    /// Hands `job` over; gives it back if the channel is full or the
    /// thread is gone (only by a panic).
    fn send(&self, job: In) -> Result<(), In> {
        use std::sync::mpsc::TrySendError;
        match self.jobs.as_ref() {
            Some(jobs) => jobs.try_send(job).map_err(|e| match e {
                TrySendError::Full(job) | TrySendError::Disconnected(job) => job,
            }),
            None => Err(job),
        }
    }
}

impl<In, Out> SideThread<In, Out> {
    /// The next result; `wait`: blocks until there is one. Disconnected
    /// only when the thread is gone (by a panic).
    fn result(&self, wait: bool) -> Result<Out, std::sync::mpsc::TryRecvError> {
        if wait {
            self.done
                .recv()
                .map_err(|_| std::sync::mpsc::TryRecvError::Disconnected)
        } else {
            self.done.try_recv()
        }
    }
}

impl<In, Out> Drop for SideThread<In, Out> {
    fn drop(&mut self) {
        // Closing the channel ends the thread's loop.
        self.jobs = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Runs a server's handshake work ([`Server::offload_handshakes`]) on a
/// thread of its own, so that the thread that carries established
/// connections' datagrams never waits behind a hello's X25519 operations.
/// One thread: the budgets let through at most
/// [`ServerLimits::hellos_per_sec`] hellos a second, a fraction of what
/// one core works. Its channel holds [`ServerLimits::handshake_queue`]
/// jobs, as many as the server ever has out.
struct HandshakeWorker(SideThread<HandshakeWork, HandshakeDone>);

impl HandshakeWorker {
    fn start(capacity: usize) -> io::Result<HandshakeWorker> {
        SideThread::start("atou-handshakes", capacity, HandshakeWork::run).map(HandshakeWorker)
    }

    /// Gives the server the results that are ready and the worker the
    /// jobs the server has (those the results made included).
    fn exchange(&self, server: &mut Server, now: Time) {
        while let Ok(done) = self.0.done.try_recv() {
            server.handshake_done(now, done);
        }
        while let Some(work) = server.poll_handshake_work() {
            // Never full (the server holds no more jobs out than the
            // channel holds) and never gone but by a panic: then the work
            // is done here rather than lost.
            if let Err(refused) = self.0.send(work) {
                server.handshake_done(now, refused.run());
            }
        }
    }
}

/// Saves `atou serve --dir`'s table of hello timestamps on a thread of its
/// own: a save is a write and two fsyncs (about 15 ms on this project's
/// VM), which the thread that carries established connections' datagrams
/// must not wait for; only the accepted responses the save covers wait
/// (held by the server until [`Server::hello_timestamps_saved`]). One
/// save at a time.
struct TimestampSaver(SideThread<Vec<(crate::proto::crypto::PublicKey, u64)>, io::Result<()>>);

impl TimestampSaver {
    fn start(file: hello_timestamps::HelloTimestampFile) -> io::Result<TimestampSaver> {
        SideThread::start("atou-timestamps", 1, move |table: Vec<_>| file.save(&table))
            .map(TimestampSaver)
    }

    /// Reports the save that finished, if one did, and starts the next
    /// the server has; `Err` with what to tell the operator of a save
    /// that failed.
    fn exchange(&self, server: &mut Server, path: &std::path::Path) -> Result<(), SaveError> {
        let mut told = Ok(());
        if let Ok(saved) = self.0.done.try_recv() {
            server.hello_timestamps_saved(saved.is_ok());
            if let Err(error) = saved {
                told = Err(SaveError::Write {
                    path: path.to_path_buf(),
                    error,
                });
            }
        }
        if let Some(table) = server.hello_timestamps_to_save() {
            if self.0.send(table).is_err() {
                // Never full (one save at a time) and never gone but by a
                // panic: then the responses it covers are not sent.
                server.hello_timestamps_saved(false);
                told = Err(SaveError::SaverGone {
                    path: path.to_path_buf(),
                });
            }
        }
        told
    }
}

/// Why a [`StreamFeed`] cannot go on (a file that cannot be read): the
/// feed's own error, whatever layer it comes from; its message ends the
/// connection as [`ProbeError::Source`].
pub type FeedError = Box<dyn std::error::Error + Send + Sync>;

/// A connection's stream as the client's driver sees it: bytes that other
/// threads may still be producing.
pub trait StreamFeed: PayloadSource {
    /// Takes in what other threads produced, given the stream bytes
    /// acknowledged so far (which it may forget). Returns the stream bytes
    /// ready to send, or `None` when all of them always are; an error
    /// ends the connection.
    fn refill(&mut self, acked: u64) -> Result<Option<u64>, FeedError>;
    /// Notified when [`StreamFeed::refill`] may have more.
    fn waker(&self) -> Option<Arc<Notify>>;
    /// True once for each other connection of the same transfer that has
    /// sent its last byte since the last call (`Sender::on_sibling_done`).
    fn sibling_done(&mut self) -> bool {
        false
    }
    /// For a connection coupled with others of the same transfer as one
    /// flow (docs/congestion.md, "Coupled streams"), given the segments
    /// this one has delivered: what the others of its group have
    /// delivered, its share of the group, and the group's seed
    /// (`Sender::set_group`); `None` for a connection on its own.
    fn coupling(&mut self, _delivered: u64) -> Option<(u64, f64, u64)> {
        None
    }
    /// For a connection opened before its stream was known
    /// ([`ProbeConfig`] with its stream's length to come later): once, what
    /// became of it.
    fn launch(&mut self) -> Option<Launch> {
        None
    }
    /// Whether every byte of the stream can be read now
    /// ([`PayloadSource::read_at`], without [`StreamFeed::refill`]): then
    /// a stream short enough rides the hello (`Client::with_early_stream`).
    fn all_ready(&self) -> bool {
        false
    }
    /// Once, the server's reply to the stream, as soon as it is in: before
    /// the close and its acknowledgement, which the connection then goes
    /// on with. A caller that wants only the reply need not wait for them.
    fn on_reply(&mut self, _reply: &[u8]) {}
}

/// What a connection opened ahead of its stream learns
/// ([`StreamFeed::launch`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Launch {
    /// The stream is known: send it.
    Stream {
        /// The stream's bytes.
        len: u64,
        /// The longest reply it may be answered with, in bytes.
        reply_limit: u32,
    },
    /// There is no stream for it: close it.
    Abandon,
}

impl StreamFeed for PatternSource {
    fn refill(&mut self, _acked: u64) -> Result<Option<u64>, FeedError> {
        Ok(None)
    }

    fn waker(&self) -> Option<Arc<Notify>> {
        None
    }
}

/// Sleeps until `at`, or forever.
async fn sleep_until(clock: Clock, at: Option<Time>) {
    match at {
        Some(t) => tokio::time::sleep_until(clock.instant(t)).await,
        None => std::future::pending().await,
    }
}

fn is_unreachable(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ECONNREFUSED | libc::EHOSTUNREACH | libc::ENETUNREACH)
    )
}

/// Why a probe failed.
#[derive(Debug, Error)]
pub enum ProbeError {
    /// No UDP socket could be opened, bound or connected towards the server.
    #[error("cannot open a UDP socket for {peer}: {error}")]
    Socket {
        /// The server's address.
        peer: SocketAddr,
        /// What the operating system said.
        error: io::Error,
    },
    /// The connection itself failed (refused, idle, handshake, version).
    #[error("{peer}: {error}{hint}")]
    Conn {
        /// The server's address.
        peer: SocketAddr,
        /// Why the client endpoint gave up.
        error: ConnError,
        /// What else was seen, e.g. ICMP errors from the host.
        hint: String,
    },
    /// The host answered the hello (or the key query) with ICMP
    /// unreachable: nothing listens on that port. During a transfer such
    /// errors only count, and `maxidle` decides.
    #[error(
        "no atou server at {peer}: the host answered ICMP unreachable ({error}); \
         start `atou serve` there or check the host and port"
    )]
    Unreachable {
        /// The server's address.
        peer: SocketAddr,
        /// The ICMP error as the socket reported it.
        error: io::Error,
    },
    /// The kernel refused a datagram as larger than the path takes
    /// (EMSGSIZE): `--mss` is too large for the route.
    #[error("datagrams of {mss} bytes do not fit the path to {peer} ({error}); lower --mss")]
    TooBig {
        /// The server's address.
        peer: SocketAddr,
        /// The datagram size tried, in bytes (the `mss` knob).
        mss: u32,
        /// The socket's error.
        error: io::Error,
    },
    /// A send on the socket failed for a reason other than the above.
    #[error("sending to {peer} failed: {error}")]
    Send {
        /// The server's address.
        peer: SocketAddr,
        /// The socket's error.
        error: io::Error,
    },
    /// A receive on the socket failed for a reason other than the above.
    #[error("receiving from {peer} failed: {error}")]
    Recv {
        /// The server's address.
        peer: SocketAddr,
        /// The socket's error.
        error: io::Error,
    },
    /// The query for the server's key had no answer: nothing seems to serve there.
    #[error(
        "{}: no answer within {:.1} s (maxidle) to a query for its key, before the hello; or \
         is `atou serve` not running there? (or pass the server's key with --server-key)",
        no_udp_reply(peer),
        wait.as_secs_f64()
    )]
    NoKey {
        /// The server's address.
        peer: SocketAddr,
        /// How long the query was repeated (every 250 ms).
        wait: Duration,
    },
    /// The caller's `stop` future resolved (Ctrl-C) before the end.
    #[error("interrupted")]
    Interrupted,
    /// The stream's data could not be produced (a file could not be read).
    #[error("{0}")]
    Source(String),
    /// The tuning is inconsistent (checked before anything is sent).
    #[error("bad tuning: {0}")]
    Tuning(crate::proto::tuning::TuningError),
}

/// A probe: memory-to-memory transfer of the test pattern to a server.
/// Built with [`ProbeConfig::new`] and its setters.
#[derive(Debug, Clone)]
pub struct ProbeConfig {
    pub(crate) peer: SocketAddr,
    pub(crate) tuning: Tuning,
    /// Bytes to send; `None` sends until `maxtime`/`maxpkts`.
    pub(crate) bytes: Option<u64>,
    pub(crate) trace: bool,
    /// Connection id; fresh per run.
    pub(crate) conn_id: u64,
    /// File-transfer session; 0 for a probe.
    pub(crate) session: u64,
    /// Longest reply the session's request can be answered with (see
    /// [`Client::with_reply_limit`]).
    pub(crate) reply_limit: u32,
    /// Authenticate and encrypt with these keys; `None`: plain.
    pub(crate) auth: Option<crate::proto::crypto::ClientAuth>,
    /// Done once the reply is in and the close sent, without waiting for
    /// the close's acknowledgement ([`Client::with_close_unacknowledged`]):
    /// for requests, whose reply is all that is wanted.
    pub(crate) close_unacknowledged: bool,
    /// What an earlier connection to this destination learnt
    /// ([`crate::config::path_cache`]); `None`: start from the tuning alone.
    pub(crate) path_memory: Option<PathMemory>,
    /// Open the connection now, its stream's length to come from
    /// [`StreamFeed::launch`] (`bytes` is ignored).
    pub(crate) stream_len_later: bool,
    /// Set once the peer answered in its own words ([`Client::answered`]):
    /// UDP gets through both ways (a copy over ssh goes through its
    /// tunnel otherwise).
    pub(crate) heard: Option<Arc<std::sync::atomic::AtomicBool>>,
}

impl ProbeConfig {
    /// Probes `peer` on a fresh connection id with the default tuning,
    /// plain, untraced, until the tuning's `maxtime`/`maxpkts`.
    pub fn new(peer: SocketAddr) -> ProbeConfig {
        ProbeConfig {
            peer,
            tuning: Tuning::default(),
            bytes: None,
            trace: false,
            conn_id: fresh_conn_id(),
            session: 0,
            reply_limit: 0,
            auth: None,
            close_unacknowledged: false,
            path_memory: None,
            stream_len_later: false,
            heard: None,
        }
    }

    /// The connection's transport knobs. Default: [`Tuning::default`].
    #[must_use]
    pub fn tuning(mut self, tuning: Tuning) -> Self {
        self.tuning = tuning;
        self
    }

    /// Bytes of the test pattern to send. Default: `None`, until the
    /// tuning's `maxtime`/`maxpkts`.
    #[must_use]
    pub fn bytes(mut self, bytes: Option<u64>) -> Self {
        self.bytes = bytes;
        self
    }

    /// Record the packet trace (passed to the observer). Default: `false`.
    #[must_use]
    pub fn trace(mut self, trace: bool) -> Self {
        self.trace = trace;
        self
    }

    /// Authenticate and encrypt with these keys. Default: `None`, plain.
    #[must_use]
    pub fn auth(mut self, auth: Option<crate::proto::crypto::ClientAuth>) -> Self {
        self.auth = auth;
        self
    }

    /// Opens file-transfer session `session` instead of a probe, whose
    /// request may be answered with up to `reply_limit` bytes: what atou's
    /// own tests of a session's requests send.
    #[cfg(any(feature = "internals", fuzzing))]
    #[must_use]
    pub fn session(mut self, session: u64, reply_limit: u32) -> Self {
        self.session = session;
        self.reply_limit = reply_limit;
        self
    }
}

/// How a [`probe`] run ended, with the socket buffers it got and the
/// window the server granted.
#[derive(Debug)]
pub struct ProbeResult {
    /// The connection's end: closed (with the server's counters and
    /// reply, if any) or why it failed.
    pub outcome: Result<Closed, ProbeError>,
    /// `None` when the server never answered.
    pub report: Option<ClientReport>,
    /// The socket buffer sizes the kernel granted this client.
    pub buffers: SocketBuffers,
    /// The receiver settings (window, buffer, delayed ACK) the server
    /// applied; `None` when it never accepted the hello.
    pub granted: Option<ReceiverParams>,
    /// Paced runs carried departure times (SO_TXTIME) to the end.
    pub txtime: bool,
}

/// What a client's connection measured, from its first hello to its end:
/// the caller turns it into the end-of-run summary
/// (`report::summary::Summary::from_client`), with the outcome.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct ClientReport {
    /// The sender's counters: segments sent and retransmitted, timeouts,
    /// atou's events.
    pub stats: SenderStats,
    /// The sender's windows and RTT figures when the connection ended.
    pub snapshot: SenderSnapshot,
    /// Datagrams the socket refused for want of buffer space (ENOBUFS).
    pub enobufs: u64,
    /// Datagrams the client dropped as undecodable before they reached
    /// its sender (the sender counts its own in `stats`).
    pub bad_packets: u64,
    /// The packet cipher; `None`: a plain (`--no-auth`) connection.
    pub cipher: Option<Cipher>,
    /// From the first hello to the server's accepting answer.
    pub handshake: Option<Duration>,
    /// Datagrams that failed to open, by reason.
    pub crypto_drops: DropCounters,
    /// Datagrams sealed on a thread beside the protocol's (`--seal-thread`).
    pub sealed_aside: u64,
}

/// How a client's connection ended, as its summary tells it: kept apart
/// from the outcome, which carries the reply and an error the caller
/// consumes.
#[derive(Debug, Clone)]
pub enum ClientEnd {
    /// The data was all acknowledged; `peer` holds the server's counters
    /// from its close acknowledgement, `None` when the close went
    /// unanswered.
    Closed {
        /// The server's counters, when it acknowledged the close.
        peer: Option<ReceiverStats>,
    },
    /// The reply came and the close went without waiting for its
    /// acknowledgement (a transfer's data connection, whose verdict
    /// already said the data arrived): finished, without the server's
    /// counters.
    Answered,
    /// The connection failed, for this reason.
    Failed {
        /// The error, as a person reads it.
        why: String,
    },
}

impl ClientEnd {
    /// How `outcome` ended, without taking it; `close_awaited`: whether
    /// the connection waited for its close's acknowledgement.
    pub(crate) fn of<E: fmt::Display>(
        outcome: &Result<Closed, E>,
        close_awaited: bool,
    ) -> ClientEnd {
        match outcome {
            Ok(closed) if !close_awaited && closed.reply.is_some() => ClientEnd::Answered,
            Ok(closed) => ClientEnd::Closed { peer: closed.peer },
            Err(e) => ClientEnd::Failed { why: e.to_string() },
        }
    }
}

/// The address tokens `--no-auth` servers gave this process (their retry,
/// RFC 9000 §8.1.2), by server: the next plain connection to the same
/// server starts with its token and saves the retry's round trip while
/// the token is valid (2 to 4 minutes; one that is not is answered with a
/// retry and a new token, as if there were none).
mod address_tokens {
    use std::collections::HashMap;
    use std::net::SocketAddr;
    use std::sync::{Mutex, OnceLock};

    use crate::proto::wire::AddressToken;

    /// Servers remembered at once: a process talks to a handful.
    const MAX: usize = 64;

    fn table() -> &'static Mutex<HashMap<SocketAddr, AddressToken>> {
        static TABLE: OnceLock<Mutex<HashMap<SocketAddr, AddressToken>>> = OnceLock::new();
        TABLE.get_or_init(|| Mutex::new(HashMap::new()))
    }

    pub(super) fn get(server: SocketAddr) -> Option<AddressToken> {
        table().lock().ok()?.get(&server).copied()
    }

    pub(super) fn put(server: SocketAddr, token: AddressToken) {
        if let Ok(mut t) = table().lock() {
            if t.len() >= MAX && !t.contains_key(&server) {
                t.clear();
            }
            t.insert(server, token);
        }
    }
}

/// What a client says when not one datagram came back from `server`
/// (issue 29): UDP may be blocked on the way, and a copy over ssh does not
/// need it.
pub(crate) fn no_udp_reply(server: impl std::fmt::Display) -> String {
    format!("no UDP reply from {server} — a firewall? `atou copy` over ssh can go through TCP")
}

/// Asks the server at `peer` for its public key (trust on first use: the
/// answer is not authenticated; the caller records it and says so).
/// Asks every 250 ms for `wait`.
pub(crate) async fn query_server_key(
    peer: SocketAddr,
    wait: Duration,
) -> Result<crate::proto::crypto::PublicKey, ProbeError> {
    use crate::proto::crypto::handshake;
    let local: SocketAddr = if peer.is_ipv4() {
        (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let sock = tokio::net::UdpSocket::bind(local)
        .await
        .map_err(|error| ProbeError::Socket { peer, error })?;
    sock.connect(peer)
        .await
        .map_err(|error| ProbeError::Socket { peer, error })?;
    let id = fresh_conn_id();
    let query = handshake::key_query(id);
    let deadline = tokio::time::Instant::now() + wait;
    let mut buf = vec![0u8; 2048];
    loop {
        match sock.send(&query).await {
            Err(e) if is_unreachable(&e) => return Err(ProbeError::Unreachable { peer, error: e }),
            Err(error) => return Err(ProbeError::Send { peer, error }),
            Ok(_) => {}
        }
        let round = (tokio::time::Instant::now() + Duration::from_millis(250)).min(deadline);
        loop {
            match tokio::time::timeout_at(round, sock.recv(&mut buf)).await {
                Err(_) => break,
                Ok(Err(e)) if is_unreachable(&e) => {
                    return Err(ProbeError::Unreachable { peer, error: e })
                }
                Ok(Err(error)) => return Err(ProbeError::Recv { peer, error }),
                Ok(Ok(n)) => {
                    if let Some(key) = handshake::parse_key_answer(&buf[..n], id) {
                        return Ok(key);
                    }
                    let decoded = crate::proto::wire::Packet::decode(&buf[..n]);
                    if let Err(crate::proto::wire::WireError::UnsupportedVersion(theirs)) = decoded
                    {
                        if n >= 12 && buf[4..12] == id.to_be_bytes() {
                            return Err(ProbeError::Conn {
                                peer,
                                error: ConnError::VersionMismatch { theirs },
                                hint: String::new(),
                            });
                        }
                    }
                    if let Ok(crate::proto::wire::Packet::Reject(r)) = decoded {
                        if r.conn_id == id {
                            return Err(match r.reason {
                                RejectReason::NoIdentity => ProbeError::Conn {
                                    peer,
                                    error: ConnError::NoIdentity,
                                    hint: String::new(),
                                },
                                _ => ProbeError::Conn {
                                    peer,
                                    error: ConnError::VersionMismatch { theirs: r.version },
                                    hint: String::new(),
                                },
                            });
                        }
                    }
                }
            }
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(ProbeError::NoKey { peer, wait });
        }
    }
}

/// Runs a probe to the end on the current tokio runtime. `stop` ends it
/// early (Ctrl-C), with the summary so far.
pub async fn probe(
    config: ProbeConfig,
    observer: &mut dyn Observer,
    stop: impl std::future::Future<Output = ()>,
) -> ProbeResult {
    connect(config, &mut PatternSource, observer, stop).await
}

/// Runs one connection to the end, sending the stream `feed` produces.
pub async fn connect<F: StreamFeed>(
    config: ProbeConfig,
    feed: &mut F,
    observer: &mut dyn Observer,
    stop: impl std::future::Future<Output = ()>,
) -> ProbeResult {
    connect_from(None, config, feed, observer, stop).await
}

/// [`connect`] from `socket` if given, a socket already bound (the ssh
/// bootstrap's pull: the one a punch datagram came in on, so the
/// connection leaves through the mapping the peer's NAT opened); else
/// from a fresh one.
pub(crate) async fn connect_from<F: StreamFeed>(
    socket: Option<std::net::UdpSocket>,
    config: ProbeConfig,
    feed: &mut F,
    observer: &mut dyn Observer,
    stop: impl std::future::Future<Output = ()>,
) -> ProbeResult {
    let peer = config.peer;
    let local: SocketAddr = if peer.is_ipv4() {
        (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let fail = |e: ProbeError| ProbeResult {
        outcome: Err(e),
        report: None,
        buffers: SocketBuffers {
            sndbuf: 0,
            rcvbuf: 0,
        },
        granted: None,
        txtime: false,
    };
    // The tuning first: a bad one should not cost a socket.
    let clock = Clock::new();
    let mut client = match new_client(&config, clock.now()) {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    // A stream no longer than a segment, all in memory (a plan, a finish):
    // offered in the hello, which takes it if it fits.
    match config.bytes {
        Some(len) if feed.all_ready() && len <= u64::from(config.tuning.mss) => {
            let mut stream = vec![0u8; len as usize];
            feed.read_at(0, &mut stream);
            client = client.with_early_stream(&stream);
        }
        _ => {}
    }
    let (io, buffers) = match client_socket(socket, local, peer, &config.tuning).await {
        Ok(opened) => opened,
        Err(e) => return fail(e),
    };
    if config.trace {
        client.enable_trace();
    }
    let io = Arc::new(io);
    let mut driver = ClientDriver {
        seal: SealThread::start(&io),
        io,
        clock,
        peer,
        mss: config.tuning.mss,
        client,
        tx: TxBatch::new(),
        rx: RecvBatch::new(),
        unreachable: 0,
        heard: config.heard.clone(),
    };
    let outcome = driver.run(feed, observer, stop).await;
    let txtime = driver.io.txtime();
    let ClientDriver {
        mut client,
        clock,
        tx,
        seal,
        ..
    } = driver;
    let sealed_aside = seal.map_or(0, |s| s.sealed);
    let now = clock.now();
    if let Some(token) = client.address_token() {
        address_tokens::put(peer, token);
    }
    let granted = client.granted();
    let report = client_report(&mut client, tx.enobufs, sealed_aside, now);
    ProbeResult {
        outcome,
        report,
        buffers,
        granted,
        txtime,
    }
}

/// The client a probe or a send runs: its tuning, session and limits,
/// with the address token or the keys it proves itself with.
fn new_client(config: &ProbeConfig, now: Time) -> Result<Client, ProbeError> {
    let peer = config.peer;
    let client = Client::new(&config.tuning, config.conn_id, config.bytes, now)
        .map(|c| c.with_path_memory(config.path_memory));
    let mut client = match client {
        Ok(c) if config.close_unacknowledged => c
            .with_session(config.session)
            .with_reply_limit(config.reply_limit)
            .with_close_unacknowledged(),
        Ok(c) => c
            .with_session(config.session)
            .with_reply_limit(config.reply_limit),
        Err(e) => return Err(ProbeError::Tuning(e)),
    };
    if config.stream_len_later {
        client = client.with_stream_len_later();
    }
    let ip_udp_header = if peer.is_ipv6() { 48 } else { 28 };
    client = client.with_size_watch(fresh_conn_id(), ip_udp_header);
    if config.auth.is_none() {
        client = client.with_address_token(address_tokens::get(peer));
    }
    if let Some(auth) = config.auth.clone() {
        client = client
            .with_auth(auth, wall_clock_ns())
            .map_err(|error| ProbeError::Conn {
                peer,
                error,
                hint: String::new(),
            })?;
    }
    Ok(client)
}

/// `socket`, or a fresh one bound to `local`, connected to `peer` with
/// the tuning's buffers; and the buffers the kernel granted.
async fn client_socket(
    socket: Option<std::net::UdpSocket>,
    local: SocketAddr,
    peer: SocketAddr,
    tuning: &Tuning,
) -> Result<(UdpIo, SocketBuffers), ProbeError> {
    let socket_error = |error| ProbeError::Socket { peer, error };
    let io = socket
        .map_or_else(|| UdpIo::bind(local), UdpIo::from_std)
        .map_err(socket_error)?;
    io.connect(peer).await.map_err(socket_error)?;
    let buffers = io
        .set_buffers(tuning.sndbuf, tuning.rcvbuf)
        .map_err(socket_error)?;
    Ok((io, buffers))
}

/// What a client that got as far as sending measured.
fn client_report(
    client: &mut Client,
    enobufs: u64,
    sealed_aside: u64,
    now: Time,
) -> Option<ClientReport> {
    let bad_packets = client.bad_packets();
    let cipher = client.cipher();
    let handshake = client.handshake_time();
    let crypto_drops = client.crypto_drops();
    client.sender_mut().map(|sender| ClientReport {
        stats: *sender.stats(),
        snapshot: sender.snapshot(now),
        enobufs,
        bad_packets,
        cipher,
        handshake,
        crypto_drops,
        sealed_aside,
    })
}

/// Seals a client's data and sends it on a thread of its own, so that
/// the thread that runs the protocol does neither the AEAD work nor the
/// `sendmsg` copy for it (issue 28, point 4): the protocol thread prepares
/// a batch (packet numbers taken in order,
/// [`Client::poll_transmit_unsealed`]) and hands it here with the pacing
/// rate and schedule, and fills the next while this one is sealed and
/// sent by the core that just wrote its bytes (a Xeon run of a thread
/// that only sealed found the hand-back to the protocol thread's send
/// cost as much as the sealing saved: docs/security.md). One batch at a
/// time is away, so batches leave in the order they were filled and
/// nothing is sent from the protocol thread meanwhile.
struct SealThread {
    side: SideThread<SendJob, SendDone>,
    /// A batch is at the thread.
    away: bool,
    /// The last batch that came back, emptied, to fill next.
    spare: Option<TxQueue>,
    /// Datagrams sealed (and sent) on the thread.
    sealed: u64,
}

/// A batch for the sealing thread: the datagrams, the pacing rate, and
/// where the pacing schedule stands.
struct SendJob {
    queue: TxQueue,
    pacing: Option<u64>,
    departure: u64,
}

/// What the sealing thread gives back: the batch emptied, where the
/// schedule ended, the datagrams the kernel refused, and the send's error.
struct SendDone {
    queue: TxQueue,
    departure: u64,
    enobufs: u64,
    sent: io::Result<()>,
}

/// Where a client seals and sends its data (`--seal-thread`) and a server
/// opens what it receives (`--open-thread`): chosen once for the process,
/// as a thread pool's size is. Off by default: where two
/// cores run both ends it is slower, and no machine with more has measured
/// it yet (docs/security.md, "Sealing and opening off the protocol's thread");
/// `scripts/bench-crypto.sh` measures it beside inline sealing every run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub(crate) enum SealAside {
    /// On the protocol's thread.
    #[default]
    Off,
    /// On a thread of its own, a batch at a time ([`SealThread`]).
    On,
}

static SEAL_ASIDE: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

impl SealAside {
    /// Sets where this process's clients seal, from here on.
    pub(crate) fn choose(self) {
        SEAL_ASIDE.store(self as u8, std::sync::atomic::Ordering::Relaxed);
    }

    fn chosen() -> SealAside {
        match SEAL_ASIDE.load(std::sync::atomic::Ordering::Relaxed) {
            1 => SealAside::On,
            _ => SealAside::Off,
        }
    }
}

/// Less than this much AEAD work is sealed on the protocol thread: the
/// hand-over (a channel and a wake-up each way, some microseconds) would
/// cost more than it saves. 64 KiB seals in about 15 us with AES-GCM here.
const SEAL_ASIDE_MIN_BYTES: usize = 64 * 1024;

impl SealThread {
    /// A sealing thread sending on `io`, where [`SealAside`] says so.
    fn start(io: &Arc<UdpIo>) -> Option<SealThread> {
        if SealAside::chosen() == SealAside::Off {
            return None;
        }
        let io = Arc::clone(io);
        let side = SideThread::start("atou-seal", 1, move |job: SendJob| {
            let SendJob {
                mut queue,
                pacing,
                mut departure,
            } = job;
            let (enobufs, sent) = queue.send_blocking(&io, pacing, &mut departure);
            SendDone {
                queue,
                departure,
                enobufs,
                sent,
            }
        })
        .ok()?;
        Some(SealThread {
            side,
            away: false,
            spare: None,
            sealed: 0,
        })
    }

    /// Hands `tx`'s batch over, to be sealed and sent, when it has enough
    /// to seal and none is away; `tx` goes on with an empty one.
    fn hand_over(&mut self, tx: &mut TxBatch, pacing: Option<u64>) {
        if self.away || tx.queue().unsealed_bytes() < SEAL_ASIDE_MIN_BYTES {
            return;
        }
        let mut queue = self.spare.take().unwrap_or_default();
        tx.swap_queue(&mut queue);
        let datagrams = queue.len() as u64;
        let job = SendJob {
            queue,
            pacing,
            departure: tx.departure(),
        };
        match self.side.send(job) {
            Ok(()) => {
                self.away = true;
                self.sealed += datagrams;
            }
            // Gone only by a panic: sealed and sent here instead.
            Err(mut job) => tx.swap_queue(&mut job.queue),
        }
    }

    /// The batch away, once sent: its schedule and refusals go back into
    /// `tx`, and the send's outcome comes out. `wait`: blocks until then.
    /// `None` while it is away.
    fn take_back(&mut self, tx: &mut TxBatch, wait: bool) -> Option<io::Result<()>> {
        use std::sync::mpsc::TryRecvError;
        if !self.away {
            return None;
        }
        let back = self.side.result(wait);
        match back {
            Ok(done) => {
                self.away = false;
                tx.sent_elsewhere(done.departure, done.enobufs);
                self.spare = Some(done.queue);
                Some(done.sent)
            }
            Err(TryRecvError::Empty) => None,
            // The thread is gone (only by a panic) with the batch: its
            // datagrams never left, and loss recovery sends them again;
            // what comes next is sent from here (`hand_over` finds it gone).
            Err(TryRecvError::Disconnected) => {
                self.away = false;
                Some(Ok(()))
            }
        }
    }
}

struct ClientDriver {
    io: Arc<UdpIo>,
    clock: Clock,
    peer: SocketAddr,
    mss: u32,
    client: Client,
    tx: TxBatch,
    /// Where the data's sealing goes when it leaves the protocol thread.
    seal: Option<SealThread>,
    rx: RecvBatch,
    /// ICMP unreachable errors seen.
    unreachable: u64,
    /// [`ProbeConfig::heard`].
    heard: Option<Arc<std::sync::atomic::AtomicBool>>,
}

impl ClientDriver {
    fn conn_error(&self, error: ConnError) -> ProbeError {
        let hint = if self.unreachable > 0 {
            format!(
                "; the host answered {} datagrams with ICMP unreachable: is `atou serve` still running there?",
                self.unreachable
            )
        } else {
            String::new()
        };
        ProbeError::Conn {
            peer: self.peer,
            error,
            hint,
        }
    }

    fn in_hello(&self) -> bool {
        self.client.sender().is_none()
    }

    /// An error from the socket: ICMP unreachable fails a hello at once
    /// (nobody is listening) but only counts during a transfer, where
    /// maxidle decides (a server restart is not fatal until then). So does
    /// any other ICMP report (IP_RECVERR passes on soft ones too) but
    /// "too big": anyone can forge one, and one must not end a transfer.
    /// During a transfer an ICMP "too big" is a hint only (RFC 8899
    /// §4.6): a valid one starts the size probes, whose acks decide.
    fn socket_error(&mut self, e: io::Error, sending: bool) -> Option<ProbeError> {
        // An ICMP report that raised this error also sits in the queue.
        let drained = self.io.drain_errors();
        let from_icmp = drained.count > 0;
        let too_big = quinn_udp::is_msg_size_err(&e);
        if from_icmp && too_big && !self.in_hello() {
            // Never the end of a transfer: one not valid for this
            // connection changes nothing, and the data's own losses and
            // the probes' acks (or maxidle and stall) decide.
            for report in &drained.too_big {
                if let Some(mtu) = report.too_big {
                    self.client.size_hint(mtu, report.quote());
                }
            }
            return None;
        }
        if is_unreachable(&e) || (from_icmp && !too_big) {
            self.unreachable += 1;
            return self.in_hello().then_some(ProbeError::Unreachable {
                peer: self.peer,
                error: e,
            });
        }
        let peer = self.peer;
        Some(if too_big {
            ProbeError::TooBig {
                peer,
                mss: self.mss,
                error: e,
            }
        } else if sending {
            ProbeError::Send { peer, error: e }
        } else {
            ProbeError::Recv { peer, error: e }
        })
    }

    async fn run<F: StreamFeed>(
        &mut self,
        feed: &mut F,
        observer: &mut dyn Observer,
        stop: impl std::future::Future<Output = ()>,
    ) -> Result<Closed, ProbeError> {
        let max_len = self.client.max_transmit_len();
        tokio::pin!(stop);
        let mut reply_told = false;
        loop {
            let now = self.clock.now();
            if !reply_told {
                if let Some(reply) = self.client.reply() {
                    feed.on_reply(reply);
                    reply_told = true;
                }
            }
            match feed.launch() {
                Some(Launch::Stream { len, reply_limit }) => {
                    self.client.set_stream_len(now, len, reply_limit);
                }
                Some(Launch::Abandon) => self.client.abandon(now),
                None => {}
            }
            let acked = self.client.sender().map_or(0, |s| s.good_bytes());
            match feed.refill(acked) {
                Ok(Some(ready)) => self.client.set_available(now, ready),
                Ok(None) => {}
                Err(why) => return Err(ProbeError::Source(why.to_string())),
            }
            if feed.sibling_done() {
                if let Some(sender) = self.client.sender_mut() {
                    sender.on_sibling_done(now);
                }
            }
            if let Some(sender) = self.client.sender_mut() {
                if let Some((others, share, seed)) = feed.coupling(sender.delivered()) {
                    sender.set_group(others, share, seed);
                }
            }
            if self.client.poll_timeout().is_some_and(|t| t <= now) {
                // The ACKs that answer a due timer may be waiting in the
                // socket: this thread is woken by their arrival, but on a
                // busy machine runs only later, past a probe timeout of
                // 2 x SRTT (RFC 8985 §7.2) or even the RTO. A kernel's TCP
                // takes ACKs in as they arrive; read them before the
                // timers, so that none fires for data delivered in time
                // (tests/descheduled.rs). The pacer's release waits on no
                // reply: it costs no read.
                if self.client.reply_timer_due(now) {
                    if let Err(e) = self.receive() {
                        if let Some(err) = self.socket_error(e, false) {
                            return Err(err);
                        }
                    }
                }
                if self.client.poll_timeout().is_some_and(|t| t <= now) {
                    self.client.handle_timeout(now);
                }
            }
            let peer = self.peer;
            let mut more = false;
            loop {
                if self.tx.len() >= TX_BURST {
                    more = true;
                    break;
                }
                let client = &mut self.client;
                let pushed = if client.size_probe_due() {
                    self.tx.push_alone_with(max_len, |b| {
                        client.poll_transmit(now, b, feed).map(|n| (peer, n))
                    })
                } else if self.seal.is_some() {
                    self.tx.push_unsealed_with(max_len, |b| {
                        let (n, job) = client.poll_transmit_unsealed(now, b, feed)?;
                        Some((peer, n, job))
                    })
                } else {
                    self.tx.push_with(max_len, |b| {
                        client.poll_transmit(now, b, feed).map(|n| (peer, n))
                    })
                };
                if !pushed {
                    break;
                }
            }
            while let Some(e) = self.client.poll_event() {
                observer.on_event(&e);
            }
            while let Some(r) = self.client.poll_trace() {
                observer.on_trace(&r);
            }
            let refused = self.tx.enobufs;
            let pacing = self.client.sender().and_then(|s| s.pacing_rate());
            let finishing = self.client.outcome().is_some();
            if let Err(e) = self.send(pacing, finishing).await {
                if let Some(err) = self.socket_error(e, true) {
                    return Err(err);
                }
            }
            // A full batch waiting behind the one being sealed waits for
            // the sealing thread's wake-up, not in a loop.
            let more = more && !self.seal.as_ref().is_some_and(|s| s.away);
            if self.tx.enobufs > refused {
                // The kernel's queue to the device overflowed: CWR.
                if let Some(sender) = self.client.sender_mut() {
                    sender.on_local_congestion(now);
                }
            }
            if let Some(outcome) = self.client.outcome() {
                return outcome.clone().map_err(|e| self.conn_error(e));
            }
            let received = match self.receive() {
                Ok(n) => n,
                Err(e) => match self.socket_error(e, false) {
                    Some(err) => return Err(err),
                    None => 0,
                },
            };
            if received > 0 || more {
                continue;
            }
            let deadline = self.client.poll_timeout();
            // Asked each time: a connection opened ahead of its stream
            // is woken by one feed, then by the stream's.
            let waker = feed.waker();
            let sealed = self
                .seal
                .as_ref()
                .filter(|s| s.away)
                .map(|s| Arc::clone(&s.side.ready));
            tokio::select! {
                () = notified(sealed.as_deref()) => {}
                r = self.io.readable() => {
                    if let Err(e) = r {
                        return Err(ProbeError::Recv { peer: self.peer, error: e });
                    }
                }
                () = sleep_until(self.clock, deadline) => {}
                () = notified(waker.as_deref()) => {}
                () = &mut stop => return Err(ProbeError::Interrupted),
            }
        }
    }

    /// Sends what is ready, in the order it was filled: once the batch at
    /// the sealing thread is sent, what was filled meanwhile, handed to the
    /// thread when it is enough to seal (and none is away), else sealed
    /// and sent here. `finishing`: the connection is over; the batch away
    /// is waited for and everything goes now.
    async fn send(&mut self, pacing: Option<u64>, finishing: bool) -> io::Result<()> {
        let Some(seal) = self.seal.as_mut() else {
            return self.tx.flush(&self.io, pacing).await;
        };
        if let Some(sent) = seal.take_back(&mut self.tx, finishing) {
            sent?;
        }
        if seal.away {
            return Ok(());
        }
        if !finishing {
            seal.hand_over(&mut self.tx, pacing);
        }
        if self.tx.is_empty() {
            return Ok(());
        }
        self.tx.flush(&self.io, pacing).await
    }

    fn receive(&mut self) -> io::Result<usize> {
        let now = self.clock.now();
        let client = &mut self.client;
        let peer = self.peer;
        let heard = self.heard.as_deref();
        self.io.try_recv(&mut self.rx, |from, datagram| {
            if from == peer {
                // Undecodable or stray datagrams are counted by the client.
                let _ = client.handle_datagram(now, datagram);
                if let Some(heard) = heard.filter(|_| client.answered()) {
                    heard.store(true, std::sync::atomic::Ordering::Relaxed);
                }
            }
        })
    }
}

/// What `atou serve` was asked to do. Built with [`ServeConfig::new`] and
/// its setters.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub(crate) bind: SocketAddr,
    /// Stop after the first connection ends.
    pub(crate) once: bool,
    pub(crate) sndbuf: u32,
    pub(crate) rcvbuf: u32,
    /// The operator's budgets for what clients may make the server hold.
    pub(crate) limits: ServerLimits,
    /// Keys: the server's, and which clients it accepts.
    pub(crate) auth: crate::proto::crypto::ServerAuth,
    /// Where the server keeps its hello timestamps across restarts
    /// (`atou serve --dir`, whose key outlives it), and what it kept last
    /// time; `None`: in memory only (a key made for one run needs no
    /// more).
    pub(crate) hello_timestamps: Option<hello_timestamps::HelloTimestampFile>,
}

impl ServeConfig {
    /// Listens on `bind`, plain, with 4 MiB socket buffers and the default
    /// [`ServerLimits`], until stopped.
    pub fn new(bind: SocketAddr) -> ServeConfig {
        ServeConfig {
            bind,
            once: false,
            sndbuf: 4 << 20,
            rcvbuf: 4 << 20,
            limits: ServerLimits::default(),
            auth: crate::proto::crypto::ServerAuth::plain(),
            hello_timestamps: None,
        }
    }

    /// Stop after the first connection ends. Default: `false`.
    #[must_use]
    pub fn once(mut self, once: bool) -> Self {
        self.once = once;
        self
    }

    /// The socket's send buffer (SO_SNDBUF), in bytes. Default: 4 MiB.
    #[must_use]
    pub fn sndbuf(mut self, bytes: u32) -> Self {
        self.sndbuf = bytes;
        self
    }

    /// The socket's receive buffer (SO_RCVBUF), in bytes, never grown past
    /// this whatever a client asks. Default: 4 MiB.
    #[must_use]
    pub fn rcvbuf(mut self, bytes: u32) -> Self {
        self.rcvbuf = bytes;
        self
    }

    /// The operator's budgets for what clients may make the server hold.
    /// Default: [`ServerLimits::default`].
    #[must_use]
    pub fn limits(mut self, limits: ServerLimits) -> Self {
        self.limits = limits;
        self
    }

    /// The server's key and which clients it accepts. Default:
    /// [`ServerAuth::plain`](crate::ServerAuth::plain), no key.
    #[must_use]
    pub fn auth(mut self, auth: crate::proto::crypto::ServerAuth) -> Self {
        self.auth = auth;
        self
    }
}

/// What the server tells its operator as it runs.
#[derive(Debug)]
pub enum ServeEvent {
    /// The socket is bound and the server is ready; told once, first.
    Listening {
        /// The address bound (with the port the kernel chose for port 0).
        addr: SocketAddr,
        /// The socket buffer sizes the kernel granted.
        buffers: SocketBuffers,
    },
    /// A connection ended: atousrv's one line about it.
    /// Boxed: the server's counters make it many times the others' size.
    Report(Box<ConnReport>),
    /// A refusal or other news for the operator (rate-limited).
    Notice(Notice),
    /// The table of hello timestamps could not be saved (the message
    /// says where and why): the clients whose hellos waited for it were
    /// not answered.
    HelloTimestampsNotSaved(SaveError),
    /// The socket receive buffer grew for a client that asked for more.
    RcvbufGrown {
        /// The client's `rcvbuf`, in bytes.
        asked: u32,
        /// What the kernel reports it set, in bytes (Linux: twice the
        /// value set).
        granted: u32,
    },
    /// The kernel refused the filter that drops replayed hellos unread
    /// (told once): their copies are read and dropped after a lookup.
    ReplayFilterRefused(io::Error),
}

/// Why [`serve`] could not start or stopped on a socket error.
#[derive(Debug, Error)]
pub enum ServeError {
    /// The address could not be bound (in use, not local, no permission).
    #[error("cannot listen on {addr}: {error}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// What the operating system said.
        error: io::Error,
    },
    /// Setting the socket's buffers, or receiving on it, failed.
    #[error("socket error on {addr}: {error}")]
    Socket {
        /// The address bound.
        addr: SocketAddr,
        /// What the operating system said.
        error: io::Error,
    },
    /// The server's keys could not be set up for the handshake.
    #[error("cannot set up authentication: {0}")]
    Auth(HandshakeError),
    /// The thread that saves hello timestamps could not be started.
    #[error(
        "cannot set up authentication: cannot start the thread that saves hello timestamps: {0}"
    )]
    TimestampSaver(io::Error),
}

/// What a server does with session connections (file transfers): placed
/// on the driver's thread, so each call must be quick; slow work goes to
/// other threads, which call the waker when there is something to
/// [`ServeApp::poll`].
pub trait ServeApp {
    /// Places a session connection's new stream bytes; `server` is there
    /// to move the connection's window once they are taken.
    fn on_arrival(&mut self, server: &mut Server, arrival: Arrival<'_>);
    /// Acts on a session connection opening, completing its stream or
    /// ending (a complete one waits for [`Server::respond`]).
    fn on_event(&mut self, server: &mut Server, event: SessionEvent);
    /// Takes in what other threads finished.
    fn poll(&mut self, server: &mut Server);
    /// What the application's other threads notify to wake the driver
    /// for [`ServeApp::poll`]; `None`: it has none.
    fn waker(&self) -> Option<Arc<Notify>>;
    /// Stop serving (the in-process receiver of `atou copy`, once its one
    /// transfer is over).
    fn finished(&self) -> bool {
        false
    }
}

/// Serves probes (and, through `app`, file transfers) until `stop`
/// resolves, `app` is finished, or, with `once`, the first connection
/// ends. Returns the server's counters.
pub async fn serve(
    config: ServeConfig,
    app: &mut dyn ServeApp,
    on_event: impl FnMut(ServeEvent),
    stop: impl std::future::Future<Output = ()>,
) -> Result<ServerStats, ServeError> {
    serve_from(None, config, app, on_event, stop).await
}

/// [`serve`] on `socket` if given, a socket already bound (the ssh
/// bootstrap's: on a port of `--port`'s range, or the one the punch
/// datagrams left from), instead of binding `config.bind`.
pub(crate) async fn serve_from(
    socket: Option<std::net::UdpSocket>,
    config: ServeConfig,
    app: &mut dyn ServeApp,
    mut on_event: impl FnMut(ServeEvent),
    stop: impl std::future::Future<Output = ()>,
) -> Result<ServerStats, ServeError> {
    let addr = config.bind;
    let io = socket
        .map_or_else(|| UdpIo::bind(addr), UdpIo::from_std)
        .map_err(|error| ServeError::Bind { addr, error })?;
    let addr = io.local_addr().unwrap_or(addr);
    let sock_err = |error| ServeError::Socket { addr, error };
    let buffers = io
        .set_buffers(config.sndbuf, config.rcvbuf)
        .map_err(sock_err)?;
    on_event(ServeEvent::Listening { addr, buffers });
    let clock = Clock::new();
    let mut serving = Serving::start(&config, buffers)?;
    let mut rx = RecvBatch::new();
    let mut opening = OpenThread::start();
    let waker = app.waker();
    tokio::pin!(stop);
    loop {
        let done = serving.poll(clock.now(), app, &io, &config, &mut on_event);
        // Send errors to one client (its host unreachable, say) must not
        // stop the server; they are as good as lost datagrams.
        let _ = serving.tx.flush(&io, None).await;
        if done || app.finished() {
            return Ok(*serving.server.stats());
        }
        let received = match opening.as_mut() {
            Some(opening) => opening.receive(&io, &mut serving, clock, app, &mut on_event),
            None => io.try_recv_at(&mut rx, |from, local, datagram| {
                serving.on_datagram(
                    clock.now(),
                    (from, local),
                    datagram,
                    app,
                    &io,
                    &mut on_event,
                );
            }),
        }
        .or_else(|e| if is_unreachable(&e) { Ok(0) } else { Err(e) })
        .map_err(sock_err)?;
        if received > 0 || !serving.tx.is_empty() {
            continue;
        }
        let deadline = serving.server.poll_timeout();
        let opened = opening
            .as_ref()
            .filter(|o| o.away)
            .map(|o| Arc::clone(&o.side.ready));
        tokio::select! {
            () = notified(opened.as_deref()) => {}
            r = io.readable() => r.map_err(sock_err)?,
            () = sleep_until(clock, deadline) => {}
            () = notified(waker.as_deref()) => {}
            () = notified(serving.handshakes.as_ref().map(|w| &*w.0.ready)) => {}
            () = notified(serving.saver.as_ref().map(|s| &*s.0.ready)) => {}
            () = &mut stop => return Ok(*serving.server.stats()),
        }
    }
}

/// A serving loop's server, its helper threads, and what it has to send.
/// The server's session events and early arrivals, in their order, to
/// the application.
fn tell_app(server: &mut Server, app: &mut dyn ServeApp) {
    loop {
        while let Some(e) = server.poll_session_event() {
            app.on_event(server, e);
        }
        let Some(early) = server.poll_early_arrival() else {
            break;
        };
        app.on_arrival(server, early.as_arrival());
    }
}

/// Opens a server's protected datagrams on a thread of its own
/// (`--open-thread on`; issue 28 point 4), so that the thread that runs
/// the protocol does not do the AEAD work for the data it receives. The
/// protocol thread reads a batch and takes each protected datagram's
/// ticket in arrival order ([`Server::open_job`]: keys, replay window,
/// key phase), hands the batch here, reads the next while this one is
/// opened, and handles each datagram of the batch when it comes back, in
/// order ([`Server::handle_opened`]: the opener settles, the window
/// moves). A batch with little to open is opened and handled at once.
/// One batch at a time is away, and handled before any later one.
struct OpenThread {
    side: SideThread<OpenBatch, OpenBatch>,
    /// A batch is at the thread.
    away: bool,
    /// Batches back and emptied, to read into next (two at most: one
    /// being read while the other is away). A fresh one is 4 MiB zeroed.
    spares: Vec<RecvBatch>,
}

/// A batch read, what the server made of each datagram, and, once at the
/// thread, how each job's opening went.
struct OpenBatch {
    batch: RecvBatch,
    openings: Vec<Opening>,
    results: Vec<Option<Result<std::ops::Range<usize>, BadTag>>>,
}

impl OpenBatch {
    /// Opens each job's datagram in place: the AEAD, and nothing else.
    fn open(&mut self) {
        self.results.clear();
        for ((_, datagram), opening) in self.batch.datagrams_mut().zip(&self.openings) {
            self.results.push(match opening {
                Opening::Job(job) => Some(job.open(datagram)),
                Opening::Dropped | Opening::Whole => None,
            });
        }
    }
}

/// Less than this much opening in a batch is done on the protocol
/// thread: the hand-over would cost more than it saves.
const OPEN_ASIDE_MIN_BYTES: usize = 64 * 1024;

impl OpenThread {
    /// An opening thread, where `--open-thread` says so.
    fn start() -> Option<OpenThread> {
        if SealAside::chosen() == SealAside::Off {
            return None;
        }
        let side = SideThread::start("atou-open", 1, |mut batch: OpenBatch| {
            batch.open();
            batch
        })
        .ok()?;
        Some(OpenThread {
            side,
            away: false,
            spares: Vec::new(),
        })
    }

    /// [`UdpIo::try_recv`] for a server whose opening goes aside: reads a
    /// batch and takes its tickets; handles the batch away first (waiting
    /// for it); then hands the new batch over if it has enough to open,
    /// else opens and handles it here. Returns the datagrams handled.
    fn receive(
        &mut self,
        io: &UdpIo,
        serving: &mut Serving,
        clock: Clock,
        app: &mut dyn ServeApp,
        on_event: &mut impl FnMut(ServeEvent),
    ) -> io::Result<usize> {
        let mut batch = self.spares.pop().unwrap_or_default();
        let read = match io.try_recv_batch(&mut batch) {
            Ok(n) => n,
            Err(e) => {
                self.spare(batch);
                return Err(e);
            }
        };
        let mut openings = Vec::new();
        let mut work = 0;
        for (_, datagram) in batch.datagrams_mut() {
            let opening = serving.server.open_job(datagram);
            if matches!(opening, Opening::Job(_)) {
                work += datagram.len();
            }
            openings.push(opening);
        }
        // The batch away goes first; waited for only when there is a new
        // one behind it.
        let back = self.take_back(read > 0);
        let mut fresh = OpenBatch {
            batch,
            openings,
            results: Vec::new(),
        };
        let mut handled = 0;
        if read > 0 && work >= OPEN_ASIDE_MIN_BYTES && !self.away {
            let datagrams = fresh.openings.len() as u64;
            match self.side.send(fresh) {
                Ok(()) => {
                    self.away = true;
                    serving.server.opened_aside(datagrams);
                    if let Some(back) = back {
                        handled += self.handle(back, serving, clock, app, io, on_event);
                    }
                    return Ok(handled);
                }
                // Gone only by a panic: opened here instead.
                Err(refused) => fresh = refused,
            }
        }
        if let Some(back) = back {
            handled += self.handle(back, serving, clock, app, io, on_event);
        }
        if read > 0 {
            fresh.open();
            handled += self.handle(fresh, serving, clock, app, io, on_event);
        } else {
            self.spare(fresh.batch);
        }
        Ok(handled)
    }

    /// Keeps `batch` to read into later.
    fn spare(&mut self, batch: RecvBatch) {
        if self.spares.len() < 2 {
            self.spares.push(batch);
        }
    }

    /// The batch away, once opened; `wait`: blocks until it is.
    fn take_back(&mut self, wait: bool) -> Option<OpenBatch> {
        use std::sync::mpsc::TryRecvError;
        if !self.away {
            return None;
        }
        let back = self.side.result(wait);
        match back {
            Ok(batch) => {
                self.away = false;
                Some(batch)
            }
            Err(TryRecvError::Empty) => None,
            // Gone (only by a panic) with the batch: its datagrams are
            // lost, as on a full socket buffer; the next are opened here.
            Err(TryRecvError::Disconnected) => {
                self.away = false;
                None
            }
        }
    }

    /// Each datagram of an opened batch to the server, in order; the
    /// batch's buffers become the next read's. Returns how many.
    fn handle(
        &mut self,
        mut done: OpenBatch,
        serving: &mut Serving,
        clock: Clock,
        app: &mut dyn ServeApp,
        io: &UdpIo,
        on_event: &mut impl FnMut(ServeEvent),
    ) -> usize {
        let mut count = 0;
        let mut openings = done.openings.drain(..);
        let mut results = done.results.drain(..);
        for (from, local, datagram) in done.batch.datagrams_at_mut() {
            let (Some(opening), Some(result)) = (openings.next(), results.next()) else {
                break;
            };
            count += 1;
            let now = clock.now();
            let at = (from, io.answer_from(local));
            match (opening, result) {
                (Opening::Job(job), Some(opened)) => {
                    serving.on_opened(now, at, datagram, job, opened, app, io, on_event);
                }
                (Opening::Whole, _) => serving.on_datagram(now, at, datagram, app, io, on_event),
                (Opening::Dropped, _) | (Opening::Job(_), None) => {}
            }
        }
        drop((openings, results));
        self.spare(done.batch);
        count
    }
}

struct Serving {
    server: Server,
    /// Saves the newest hello timestamp of each key, when kept.
    saver: Option<TimestampSaver>,
    /// Does hellos' public-key work off this thread.
    handshakes: Option<HandshakeWorker>,
    tx: TxBatch,
    /// The largest datagram the server sends.
    max_len: usize,
    /// The kernel refused the replay filter: said once, not again.
    filter_refused: bool,
}

impl Serving {
    fn start(config: &ServeConfig, buffers: SocketBuffers) -> Result<Serving, ServeError> {
        let limits = ServerLimits {
            max_socket_rcvbuf: config.limits.max_socket_rcvbuf.min(config.rcvbuf),
            ..config.limits
        };
        let mut server = Server::new(limits, config.rcvbuf, buffers.rcvbuf)
            .with_auth(config.auth.clone())
            .map_err(ServeError::Auth)?;
        let saver = match &config.hello_timestamps {
            Some(kept) => {
                server = server.keeping_hello_timestamps(kept.loaded().to_vec());
                Some(TimestampSaver::start(kept.clone()).map_err(ServeError::TimestampSaver)?)
            }
            None => None,
        };
        // Hellos' public-key work goes to a thread of its own; a server with
        // no key has none, and one whose thread cannot start does its own.
        let handshakes = match server.public_key() {
            Some(_) => HandshakeWorker::start(limits.handshake_queue).ok(),
            None => None,
        };
        if handshakes.is_some() {
            server = server.offload_handshakes();
        }
        Ok(Serving {
            server,
            saver,
            handshakes,
            tx: TxBatch::new(),
            max_len: (ACK_MAX_LEN + crate::proto::crypto::frame::overhead(16))
                .max(CONTROL_MAX_LEN + crate::proto::crypto::frame::overhead(16))
                .max(Server::MAX_TRANSMIT_LEN),
            filter_refused: false,
        })
    }

    /// Drives the server at `now`: timers, the app, the hello timestamps,
    /// what to send, notices and reports. `true` once a report ends a
    /// `once` server.
    fn poll(
        &mut self,
        now: Time,
        app: &mut dyn ServeApp,
        io: &UdpIo,
        config: &ServeConfig,
        on_event: &mut impl FnMut(ServeEvent),
    ) -> bool {
        let server = &mut self.server;
        if let Some(worker) = &self.handshakes {
            worker.exchange(server, now);
        }
        if server.poll_timeout().is_some_and(|t| t <= now) {
            server.handle_timeout(now);
        }
        app.poll(server);
        tell_app(server, app);
        // Before any response to the hellos just accepted goes out: once
        // a client has its session, a restart must refuse its hello. One
        // save covers every hello accepted while the last was made.
        if let (Some(saver), Some(kept)) = (&self.saver, &config.hello_timestamps) {
            if let Err(why) = saver.exchange(server, &kept.path()) {
                on_event(ServeEvent::HelloTimestampsNotSaved(why));
            }
            // A save sends the responses it held, and places the requests
            // that rode their hellos: their application hears of them now.
            tell_app(server, app);
        }
        while self
            .tx
            .push_from_with(self.max_len, |b| server.poll_transmit_from(now, b))
        {}
        while let Some(n) = server.poll_notice() {
            on_event(ServeEvent::Notice(n));
        }
        if let Some(ids) = server.poll_dropped_hellos(now) {
            if let Err(e) = io.drop_hellos(&ids) {
                if !self.filter_refused {
                    self.filter_refused = true;
                    on_event(ServeEvent::ReplayFilterRefused(e));
                }
            }
        }
        let mut done = false;
        while let Some(r) = server.poll_report() {
            on_event(ServeEvent::Report(Box::new(r)));
            done |= config.once;
        }
        done
    }

    /// One datagram in, from a peer and at the local address its answers
    /// leave from: to the server, then whatever it answers.
    fn on_datagram(
        &mut self,
        now: Time,
        (from, local): (SocketAddr, Option<IpAddr>),
        datagram: &mut [u8],
        app: &mut dyn ServeApp,
        io: &UdpIo,
        on_event: &mut impl FnMut(ServeEvent),
    ) {
        let server = &mut self.server;
        if let Some(arrival) = server.handle_datagram_at(now, from, local, datagram) {
            app.on_arrival(server, arrival);
        }
        self.answer(now, app, io, on_event);
    }

    /// One datagram opened elsewhere ([`OpenThread`]), in its turn: to the
    /// server, then whatever it answers.
    #[allow(clippy::too_many_arguments)]
    fn on_opened(
        &mut self,
        now: Time,
        (from, local): (SocketAddr, Option<IpAddr>),
        datagram: &mut [u8],
        job: OpenJob,
        opened: Result<std::ops::Range<usize>, BadTag>,
        app: &mut dyn ServeApp,
        io: &UdpIo,
        on_event: &mut impl FnMut(ServeEvent),
    ) {
        let server = &mut self.server;
        if let Some(arrival) = server.handle_opened(now, from, local, datagram, job, opened) {
            app.on_arrival(server, arrival);
        }
        self.answer(now, app, io, on_event);
    }

    /// After a datagram: the handshake worker's results, the app's
    /// events, the socket's buffer, and what the server answers.
    fn answer(
        &mut self,
        now: Time,
        app: &mut dyn ServeApp,
        io: &UdpIo,
        on_event: &mut impl FnMut(ServeEvent),
    ) {
        let server = &mut self.server;
        if let Some(worker) = &self.handshakes {
            worker.exchange(server, now);
        }
        tell_app(server, app);
        if let Some(asked) = server.wanted_rcvbuf() {
            let granted = io.set_rcvbuf(asked).unwrap_or(asked);
            server.set_socket_rcvbuf(granted);
            on_event(ServeEvent::RcvbufGrown { asked, granted });
        }
        while self
            .tx
            .push_from_with(self.max_len, |b| server.poll_transmit_from(now, b))
        {}
    }
}

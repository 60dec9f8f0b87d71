//! The client's side of a connection: hello, the transfer, close.
//!
//! Driven like the [`Sender`] it wraps: feed [`Client::handle_datagram`] and
//! [`Client::handle_timeout`], drain [`Client::poll_transmit`],
//! [`Client::poll_event`] and [`Client::poll_trace`], sleep until
//! [`Client::poll_timeout`], and stop once [`Client::outcome`] is `Some`.
//!
//! The hello carries the protocol version, a connection id the caller chose
//! fresh, and the receiver-side tuning (`rcvsegs`, `rcvbuf`, `delack`, SACK);
//! the server answers with what it applied. The hello is repeated with
//! back-off until the welcome arrives or `maxidle` passes. When everything
//! sent is acknowledged the client sends a close, repeated the same way,
//! and finishes when the server acknowledges it with its counters.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use thiserror::Error;

use crate::proto::crypto::{
    frame, handshake, ClientAuth, HandshakeError, Initiator, Opener, Progress, Protection,
    RefuseReason, Sealer,
};
use crate::proto::endpoint::server::{reply_fragment_len, Purpose};
use crate::proto::events::{TimedEvent, TraceRecord};
use crate::proto::path_memory::PathMemory;
use crate::proto::payload::PayloadSource;
use crate::proto::pmtu::BlackHoleWatch;
use crate::proto::stream::sender::{Sender, SenderState};
use crate::proto::time::Time;
use crate::proto::tuning::{Tuning, TuningError};
use crate::proto::wire::ReceiverStats;
use crate::proto::wire::{
    split_welcome_params, AddressToken, Close, DataFlags, DataHeader, DataSegment, Fetch,
    HeaderPeek, Hello, Packet, PathProbe, ReceiverParams, RejectReason, Reply, WireError,
    CONTROL_MAX_LEN, DATA_HEADER_LEN, HELLO_LEN, SIZE_ACK_LEN, VERSION,
};
use crate::proto::InputError;

/// First interval between hellos (and closes); doubled after each, up to
/// [`CONTROL_RETRY_MAX`].
const CONTROL_RETRY_FIRST: Duration = Duration::from_millis(250);
const CONTROL_RETRY_MAX: Duration = Duration::from_secs(2);
/// How long to wait for the close to be acknowledged when `maxidle` is 0.
const CLOSE_WAIT_DEFAULT: Duration = Duration::from_secs(10);
/// Reply fragments asked for at once.
const FETCH_WINDOW: usize = 64;
/// How far past the first missing reply fragment a fragment is kept
/// (4 × 64 fragments of at most 1200 bytes: 300 KiB).
const FETCH_AHEAD: u32 = 4 * FETCH_WINDOW as u32;
/// After "not ready yet", ask again after this long, growing by half each
/// time up to [`FETCH_PENDING_MAX`]: quick for a reply that is nearly
/// done, gentle for one that takes minutes (hashing a large partial file).
const FETCH_PENDING_FIRST: Duration = Duration::from_millis(5);
const FETCH_PENDING_MAX: Duration = Duration::from_secs(1);
/// Path challenges held for an answer at once (a burst of new addresses).
const PATH_RESPONSES_MAX: usize = 4;
/// Copies of a close that is not waited for ([`Client::with_close_unacknowledged`]):
/// at 1 % independent loss all three are lost once in a million closes.
pub(crate) const UNACKNOWLEDGED_CLOSES: u32 = 3;

/// The longest reply any request may have; a caller that knows its
/// request sets a tighter limit ([`Client::with_reply_limit`]).
pub(crate) const REPLY_MAX: u32 = 256 << 20;

/// Where a connection was when it failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// A plain hello, not yet welcomed.
    Hello,
    /// The authenticated hello (a Noise IK handshake).
    Handshake,
    /// Welcomed, sending the stream.
    Transfer,
    /// The stream all acknowledged, waiting for the server's reply.
    Reply,
}

impl std::fmt::Display for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Stage::Hello => "waiting for the server to answer the hello",
            Stage::Handshake => {
                "waiting for the server to answer the hello (a server stays silent to a key \
                 that is not in its authorized keys, and cannot read a hello to a key it does \
                 not hold: check that this client's public key is in the server's authorized \
                 keys, and the server's key)"
            }
            Stage::Transfer => "during the transfer",
            Stage::Reply => "waiting for the server's reply",
        })
    }
}

/// Why a connection failed. The I/O layer adds the peer's address.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ConnError {
    /// Nothing came from the server for `maxidle`.
    #[error("no packet from the peer for {:.1} s (maxidle) {stage}", idle.as_secs_f64())]
    Idle {
        /// Where the connection was: hello, handshake, transfer or reply.
        stage: Stage,
        /// How long nothing came: at least the `maxidle` knob.
        idle: Duration,
    },
    /// The server speaks another protocol version (wire header's version
    /// byte).
    #[error(
        "the peer speaks atou protocol version {theirs}, this atou speaks version {VERSION}; \
         run the same atou release at both ends"
    )]
    VersionMismatch {
        /// The server's protocol version.
        theirs: u8,
    },
    /// The server refused the hello's parameters (`mss` or buffer sizes
    /// out of its range).
    #[error("the server refused the hello (mss or buffer sizes out of its range)")]
    Refused,
    /// The server is at one of its limits (connections, receive memory).
    #[error(
        "the server is busy (at its limit of connections or receive memory); try again later, \
         or ask its operator to raise --max-connections or --buffer"
    )]
    Busy,
    /// The server authenticated this client and refused it (its key is
    /// not authorized, or the key's options forbid the request).
    #[error("the server refused this client: {0}")]
    AuthRefused(RefuseReason),
    /// A plain hello to a server that takes authenticated clients only.
    #[error(
        "the server accepts authenticated clients only; give this client its key \
         (--server-key, or the host's line in known_hosts) and an identity (--identity, \
         made by `atou keygen`)"
    )]
    AuthRequired,
    /// An authenticated hello (or key query) to a server that has no key.
    #[error(
        "the server has no key, so it cannot authenticate (it serves unauthenticated clients \
         only); give the server a key (`atou keygen`, `atou serve --identity`), or connect \
         with --no-auth on a network you trust"
    )]
    NoIdentity,
    /// The Noise IK handshake failed (a bad answer, a key that does not
    /// match the pinned one, or an `mss` too small once packets are
    /// protected).
    #[error("the handshake failed: {0}")]
    Handshake(HandshakeError),
    /// The server announced a reply longer than this request allows
    /// ([`Client::with_reply_limit`]).
    #[error(
        "the server announced a reply of {total} bytes, more than the {limit} this request \
         can be answered with; is the server a compatible atou?"
    )]
    ReplyTooLong {
        /// The reply's length the server announced, in bytes.
        total: u32,
        /// The longest reply this client takes, in bytes.
        limit: u32,
    },
    /// A black hole opened during the transfer (RFC 8899 §4.3): the
    /// connection's full-size datagrams were lost, timeout after timeout,
    /// while smaller size probes were acked (`src/proto/pmtu.rs`,
    /// `BlackHoleWatch`). Its segments cannot be cut smaller: the caller
    /// goes on at `carried` on a new connection, or, with the size
    /// forced, says so.
    #[error(
        "the path stopped carrying {stopped}-byte datagrams (UDP payload) during the transfer; \
         {carried}-byte ones still get through: try --mss {carried}"
    )]
    PathShrank {
        /// The UDP payload of the datagrams lost.
        stopped: u32,
        /// The largest probe's UDP payload the server acked.
        carried: u32,
    },
    /// The peer kept answering, but no byte was delivered for the
    /// `stall` knob's time from its first answer that took nothing: a
    /// path that carries acks and small datagrams but not the data's size
    /// where no smaller probe got through either, or a peer that never
    /// opens its window.
    #[error(
        "the peer kept answering for {:.1} s without taking a byte (stall; {delivered} bytes \
         delivered before); if the path drops large datagrams, try a smaller --mss (1200, \
         the size every path is expected to carry), or wait longer with --stall",
        stall.as_secs_f64()
    )]
    Stalled {
        /// The `stall` knob: how long nothing was delivered.
        stall: Duration,
        /// The bytes delivered before the stall.
        delivered: u64,
    },
}

/// The handshake and packet protection of an authenticated client
/// (`src/proto/crypto`).
struct Secure {
    config: handshake::ClientConfig,
    /// Wall-clock nanoseconds at `Client::started`: hello timestamps are
    /// this plus the time since, so each new hello is newer (the server
    /// refuses one that is not: the replay rule).
    wall_start_ns: u64,
    initiator: Option<Initiator>,
    /// The server asked for a cookie: send the hello again at once.
    hello_again: bool,
    keys: Option<(Sealer, Opener)>,
    /// The server's id for this connection, once established.
    server_id: u64,
    /// Where a protected datagram is opened.
    scratch: Vec<u8>,
    /// When the server's answer established the session.
    established_at: Option<Time>,
    /// The hello's parameters carry the stream's one segment
    /// ([`Client::with_early_stream`]).
    early_offered: bool,
}

impl std::fmt::Debug for Secure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Secure")
            .field("cipher", &self.config.cipher)
            .field("server_id", &self.server_id)
            .field("established", &self.keys.is_some())
            .finish_non_exhaustive()
    }
}

/// How a finished connection ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Closed {
    /// The server's counters from its close acknowledgement; `None` when
    /// the close went unanswered (the data itself was all acknowledged).
    pub peer: Option<ReceiverStats>,
    /// The server's reply to the stream, for a session connection.
    pub reply: Option<Vec<u8>>,
}

/// A reply being fetched: fragments asked for a window at a time, asked
/// again when they do not come within a retransmission timeout.
///
/// Everything about the reply comes from the server, so nothing is
/// allocated for what it announces: the buffer grows with the fragments
/// that arrive, in order, and fragments that arrive ahead of the first
/// missing one are kept only within [`FETCH_AHEAD`] of it.
#[derive(Debug)]
struct Fetching {
    /// The reply's length, from its first fragment; at most `limit`.
    total: Option<u32>,
    /// Most bytes the request can legitimately be answered with.
    limit: u32,
    fragment: u32,
    /// The reply's first `done` fragments, in order.
    bytes: Vec<u8>,
    done: u32,
    /// Fragments received past `done`, by number (each below
    /// `done + FETCH_AHEAD`).
    early: BTreeMap<u32, Vec<u8>>,
    /// Fragment numbers asked for and not yet answered.
    asked: BTreeSet<u32>,
    /// Fetches to put on the wire.
    queue: VecDeque<u32>,
    /// When to ask again for what was asked and not answered.
    again_at: Time,
    pending_wait: Duration,
    last_heard: Time,
}

impl Fetching {
    fn new(now: Time, mss: u32, limit: u32) -> Fetching {
        Fetching {
            total: None,
            limit,
            fragment: reply_fragment_len(mss) as u32,
            bytes: Vec::new(),
            done: 0,
            early: BTreeMap::new(),
            asked: BTreeSet::new(),
            queue: VecDeque::from([0]),
            again_at: now,
            pending_wait: FETCH_PENDING_FIRST,
            last_heard: now,
        }
    }

    /// Fragments in the reply, once its length is known.
    fn count(&self) -> Option<u32> {
        Some(self.total?.div_ceil(self.fragment))
    }

    fn is_done(&self) -> bool {
        self.count() == Some(self.done)
    }

    /// Fragment numbers a fragment may have and be kept.
    fn wanted(&self) -> std::ops::Range<u32> {
        let end = self.done.saturating_add(FETCH_AHEAD);
        self.done..self.count().map_or(0, |c| c.min(end))
    }

    /// Tops the window up with fragments not yet asked for.
    fn fill_window(&mut self) {
        let mut room = FETCH_WINDOW.saturating_sub(self.asked.len() + self.queue.len());
        for k in self.wanted() {
            if room == 0 {
                break;
            }
            if !self.early.contains_key(&k) && !self.asked.contains(&k) && !self.queue.contains(&k)
            {
                self.queue.push_back(k);
                room -= 1;
            }
        }
    }

    /// Takes in fragment `offset` of a reply of `total` bytes. Fragments
    /// that do not fit what is known of the reply (another length, not on
    /// a fragment boundary, the wrong size, already held, or too far ahead)
    /// are ignored: a path may corrupt or repeat them. `Err` when the reply
    /// is longer than the request can produce.
    fn take(&mut self, offset: u32, total: u32, data: &[u8]) -> Result<(), ConnError> {
        if self.total.is_none() {
            if total > self.limit {
                return Err(ConnError::ReplyTooLong {
                    total,
                    limit: self.limit,
                });
            }
            self.total = Some(total);
        }
        if self.total != Some(total) || offset % self.fragment != 0 {
            return Ok(());
        }
        let k = offset / self.fragment;
        // Inside the reply, since k < count.
        let expected = self.fragment.min(total.saturating_sub(offset)) as usize;
        if !self.wanted().contains(&k) || self.early.contains_key(&k) || data.len() != expected {
            return Ok(());
        }
        self.asked.remove(&k);
        if k != self.done {
            self.early.insert(k, data.to_vec());
            return Ok(());
        }
        self.bytes.extend_from_slice(data);
        self.done += 1;
        while let Some(next) = self.early.remove(&self.done) {
            self.bytes.extend_from_slice(&next);
            self.done += 1;
        }
        Ok(())
    }

    /// Bytes held for the reply so far.
    #[cfg(any(test, fuzzing))]
    fn held(&self) -> usize {
        self.bytes.capacity() + self.early.values().map(Vec::capacity).sum::<usize>()
    }
}

#[derive(Debug)]
enum State {
    Hello,
    /// Welcomed (and, authenticated, keyed), but the application has not
    /// said what its stream is yet ([`Client::with_stream_len_later`]):
    /// nothing to send and nothing in flight, so no idle timer runs; only
    /// the hold's own limit ([`hold_limit`]).
    Held,
    Transfer,
    /// Everything acknowledged; fetching the server's reply.
    Fetching(Box<Fetching>),
    /// Everything acknowledged; waiting for the close acknowledgement.
    Closing {
        deadline: Time,
    },
    Done(Result<Closed, ConnError>),
}

/// Repeats a control packet with back-off.
#[derive(Debug, Clone, Copy)]
struct Retry {
    next: Time,
    interval: Duration,
}

impl Retry {
    fn now(now: Time) -> Retry {
        Retry {
            next: now,
            interval: CONTROL_RETRY_FIRST,
        }
    }

    fn due(&mut self, now: Time) -> bool {
        if now < self.next {
            return false;
        }
        self.next = now + self.interval;
        self.interval = (self.interval * 2).min(CONTROL_RETRY_MAX);
        true
    }
}

/// The connecting endpoint, sans I/O: the handshake, packet protection and
/// the sending stream, driven by `handle_*` and drained by `poll_*`.
#[derive(Debug)]
pub struct Client {
    conn_id: u64,
    purpose: Purpose,
    /// Longest reply accepted for this connection's stream.
    reply_limit: u32,
    reply: Option<Vec<u8>>,
    /// Finish once the close is sent, without its acknowledgement.
    close_unacknowledged: bool,
    /// Copies of that close sent so far.
    closes_sent: u32,
    /// Stream bytes ready to send, when the application limits them.
    available: Option<u64>,
    tuning: Tuning,
    stream_len: Option<u64>,
    state: State,
    started: Time,
    retry: Retry,
    sender: Option<Sender>,
    /// What the server applied, from its welcome.
    granted: Option<ReceiverParams>,
    trace: bool,
    /// Datagrams that did not decode or were not for this connection.
    bad_packets: u64,
    secure: Option<Box<Secure>>,
    /// Path challenges to answer.
    path_responses: VecDeque<u64>,
    /// What an earlier connection to this destination learnt, for the
    /// sender ([`Client::with_path_memory`]).
    path_memory: Option<PathMemory>,
    /// A plain hello's proof of address, from the server's retry (or an
    /// earlier connection's: [`Client::with_address_token`]).
    address_token: Option<AddressToken>,
    /// A retry brought a token: send the hello again at once.
    hello_now: bool,
    /// The stream's length comes after the welcome
    /// ([`Client::with_stream_len_later`]).
    stream_len_later: bool,
    /// Closed without a stream ([`Client::abandon`]): its closes are not
    /// waited for.
    abandoned: bool,
    /// The server took the stream's segment from the hello: the stream
    /// is delivered, nothing of it is sent after the welcome.
    early_taken: bool,
    /// Black hole detection during the transfer
    /// ([`Client::with_size_watch`]).
    size_watch: Option<BlackHoleWatch>,
    /// The largest datagram sent: the size a black hole would swallow.
    largest_sent: u32,
}

/// How long a connection opened ahead of its stream may hold after its
/// first hello: half of what a server gives a connection that has sent
/// no data (its default `hello_idle`, and at most the client's
/// `maxidle`), so that it closes itself well before the server would
/// forget it, which would end it as idle (and with it the session).
fn hold_limit(tuning: &Tuning) -> Duration {
    let mut server_wait = crate::proto::ServerLimits::default().hello_idle;
    if !tuning.maxidle.is_zero() {
        server_wait = server_wait.min(tuning.maxidle);
    }
    server_wait / 2
}

/// The `mss` a connection's segments are cut to once `cipher` protects
/// them (none: plain), so that a protected datagram keeps to `mss`.
pub(crate) fn protected_mss(mss: u32, cipher: Option<crate::proto::crypto::Cipher>) -> u32 {
    match cipher {
        Some(c) => mss.saturating_sub(frame::overhead(Protection::Aead(c).tag_len()) as u32),
        None => mss,
    }
}

/// Stream bytes one data segment carries on a connection of `tuning`,
/// protected by `cipher` or plain: what a trace's `payload:` line says.
pub(crate) fn segment_payload(
    tuning: &Tuning,
    cipher: Option<crate::proto::crypto::Cipher>,
) -> u64 {
    u64::from(protected_mss(tuning.mss, cipher))
        .saturating_sub(crate::proto::wire::DATA_HEADER_LEN as u64)
}

impl Client {
    /// A client that will send `stream_len` bytes (or pattern data until
    /// `maxtime`/`maxpkts`) on connection `conn_id`, starting with a hello.
    pub fn new(
        tuning: &Tuning,
        conn_id: u64,
        stream_len: Option<u64>,
        now: Time,
    ) -> Result<Client, TuningError> {
        // Checks the tuning now rather than after the handshake.
        Sender::new(tuning, conn_id, stream_len, now)?;
        Ok(Client {
            conn_id,
            purpose: Purpose::Probe,
            reply_limit: REPLY_MAX,
            reply: None,
            close_unacknowledged: false,
            closes_sent: 0,
            available: None,
            tuning: tuning.clone(),
            stream_len,
            state: State::Hello,
            started: now,
            retry: Retry::now(now),
            sender: None,
            granted: None,
            trace: false,
            bad_packets: 0,
            secure: None,
            path_responses: VecDeque::new(),
            path_memory: None,
            address_token: None,
            hello_now: false,
            stream_len_later: false,
            abandoned: false,
            early_taken: false,
            size_watch: None,
            largest_sent: 0,
        })
    }

    /// Watches the transfer for a black hole (`src/proto/pmtu.rs`,
    /// `BlackHoleWatch`): full-size datagrams lost while smaller probes
    /// pass end the connection with [`ConnError::PathShrank`]. `nonce`
    /// from a CSPRNG; `ip_udp_header` 28 on IPv4, 48 on IPv6.
    pub(crate) fn with_size_watch(mut self, nonce: u64, ip_udp_header: u32) -> Client {
        self.size_watch = Some(BlackHoleWatch::new(self.conn_id, nonce, ip_udp_header));
        self
    }

    /// Starts a plain connection with the address token an earlier one to
    /// the same server got (a server of `--no-auth` asks for one before it
    /// keeps anything: RFC 9000 §8.1.2's Retry), saving the round trip of
    /// the retry while the token is valid (2 to 4 minutes, from any port of
    /// this host's address).
    pub fn with_address_token(mut self, token: Option<AddressToken>) -> Client {
        self.address_token = token;
        self
    }

    /// The address token the server gave, for the next connection to it.
    pub fn address_token(&self) -> Option<AddressToken> {
        self.address_token
    }

    /// Starts the sender from what an earlier connection to the same
    /// destination learnt (its RTT, bandwidth and window: where slow start
    /// begins).
    pub fn with_path_memory(mut self, memory: Option<PathMemory>) -> Client {
        self.path_memory = memory;
        self
    }

    /// Authenticates both ends and protects every packet: the
    /// hello becomes a Noise IK handshake to `auth.server_key`, carrying
    /// the hello's parameters, and every packet after it is sealed.
    /// Segments shrink by protection's overhead (an 8-byte packet number
    /// and a 16-byte tag) so datagrams keep to `mss`.
    /// `wall_clock_ns`: the wall clock now, in nanoseconds since the Unix
    /// epoch (the hello's timestamp, by which the server refuses a
    /// replayed hello).
    pub fn with_auth(mut self, auth: ClientAuth, wall_clock_ns: u64) -> Result<Client, ConnError> {
        let mut inner = self.tuning.clone();
        inner.mss = protected_mss(inner.mss, Some(auth.cipher));
        Sender::new(&inner, self.conn_id, self.stream_len, self.started).map_err(|e| {
            ConnError::Handshake(HandshakeError::Noise(format!(
                "--mss {} leaves too little room once packets are protected: {e}",
                self.tuning.mss
            )))
        })?;
        self.tuning = inner;
        let mut params = vec![0u8; CONTROL_MAX_LEN];
        let n = self
            .hello()
            .emit(&mut params)
            .expect("a hello fits CONTROL_MAX_LEN");
        params.truncate(n);
        self.secure = Some(Box::new(Secure {
            config: handshake::ClientConfig {
                identity: auth.identity,
                server_key: auth.server_key,
                cipher: auth.cipher,
                params,
            },
            wall_start_ns: wall_clock_ns,
            initiator: None,
            hello_again: false,
            keys: None,
            server_id: 0,
            scratch: Vec::new(),
            established_at: None,
            early_offered: false,
        }));
        Ok(self)
    }

    /// The packet cipher, `None` for a plain connection.
    pub(crate) fn cipher(&self) -> Option<crate::proto::crypto::Cipher> {
        self.secure.as_ref().map(|s| s.config.cipher)
    }

    /// From the client's start to the session's establishment.
    pub fn handshake_time(&self) -> Option<Duration> {
        let at = self.secure.as_ref()?.established_at?;
        Some(at.saturating_since(self.started))
    }

    /// The longest datagram [`Client::poll_transmit`] writes: `mss`, or a
    /// padded hello.
    pub(crate) fn max_transmit_len(&self) -> usize {
        let overhead = frame::overhead(16);
        (self.tuning.mss as usize + overhead)
            .max(CONTROL_MAX_LEN + overhead)
            .max(handshake::HELLO_MIN_LEN)
    }

    /// Datagrams dropped because they failed to open (forged, corrupted,
    /// replayed), by reason; zeros for a plain connection.
    pub fn crypto_drops(&self) -> crate::proto::crypto::DropCounters {
        self.secure
            .as_ref()
            .and_then(|s| s.keys.as_ref())
            .map(|(_, o)| o.counters())
            .unwrap_or_default()
    }

    /// Makes this a connection of file-transfer session `session`: the
    /// server hands its stream to the session, and once all of it is
    /// acknowledged the client fetches the server's reply before closing.
    /// Session 0 is a probe's id on the wire: it makes the client a probe.
    pub fn with_session(mut self, session: u64) -> Client {
        self.purpose = Purpose::of_wire(session);
        self
    }

    /// Refuses a reply longer than `bytes` (at most 256 MiB): what
    /// the request can legitimately be answered with. The reply's memory
    /// grows only with the fragments that arrive, whatever the limit.
    pub fn with_reply_limit(mut self, bytes: u32) -> Client {
        self.reply_limit = bytes.min(REPLY_MAX);
        self
    }

    /// Finishes a session connection once its reply is in and its close
    /// sent, without waiting a round trip for the close's
    /// acknowledgement: for a request (a plan, a finish) the reply is all
    /// the caller wants. The close goes [`UNACKNOWLEDGED_CLOSES`] times,
    /// back to back: the server forgets the connection when one arrives,
    /// and only if all are lost after its idle time, which a receiver
    /// that ends with its last connection (`serve --once`, the far end of
    /// `atou copy` over ssh) would wait out. The server's counters
    /// ([`Closed::peer`]) are then `None`.
    pub(crate) fn with_close_unacknowledged(mut self) -> Client {
        self.close_unacknowledged = true;
        self
    }

    /// Sends `stream`, the connection's whole stream, inside the hello
    /// when it fits one segment and the hello's room
    /// (`HELLO_PARAMS_ROOM` in `crypto::handshake`: the hello stays 1200 bytes),
    /// so that a server that takes it answers a round trip sooner; the
    /// stream is still given to the [`PayloadSource`] as usual, for a
    /// server that does not take it (an older one refuses the hello's
    /// longer parameters: the hello then goes again without it).
    /// Authenticated session connections only, after
    /// [`Client::with_auth`] and [`Client::with_session`]: in a plain
    /// hello it would be neither confidential nor bound to a client.
    /// Otherwise, or when it does not fit, this changes nothing.
    pub fn with_early_stream(mut self, stream: &[u8]) -> Client {
        let Some(secure) = self.secure.as_mut() else {
            return self;
        };
        let payload = segment_payload(&self.tuning, None);
        let fits = self.purpose != Purpose::Probe
            && !self.stream_len_later
            && self.stream_len == Some(stream.len() as u64)
            && stream.len() as u64 <= payload
            && secure.config.params.len() + DATA_HEADER_LEN + stream.len()
                <= handshake::HELLO_PARAMS_ROOM;
        if !fits || secure.early_offered {
            return self;
        }
        let segment = DataSegment {
            header: DataHeader {
                conn_id: self.conn_id,
                seg: 0,
                timestamp: 0,
                flags: DataFlags {
                    fin: true,
                    retransmission: false,
                },
            },
            payload: stream,
        };
        secure.config.params.extend_from_slice(&segment.to_vec());
        secure.early_offered = true;
        self
    }

    /// Whether the server took the stream from the hello
    /// ([`Client::with_early_stream`]).
    #[cfg(test)]
    pub(crate) fn early_taken(&self) -> bool {
        self.early_taken
    }

    /// Opens the connection before its stream is known: the hello (and
    /// the handshake) go now, and once welcomed the client holds, sending
    /// nothing, until [`Client::set_stream_len`] says how long the stream
    /// is or [`Client::abandon`] closes it. A transfer opens its data and
    /// finish connections this way while the request before them is in
    /// flight, so their hello round trip overlaps it.
    pub(crate) fn with_stream_len_later(mut self) -> Client {
        self.stream_len_later = true;
        self
    }

    /// The stream of a client made [`Client::with_stream_len_later`] is
    /// `len` bytes, its reply at most `reply_limit` bytes
    /// ([`Client::with_reply_limit`]): a held connection starts sending
    /// at once.
    pub(crate) fn set_stream_len(&mut self, now: Time, len: u64, reply_limit: u32) {
        if !std::mem::take(&mut self.stream_len_later) {
            return;
        }
        self.stream_len = Some(len);
        self.reply_limit = reply_limit.min(REPLY_MAX);
        if matches!(self.state, State::Held) {
            self.start_sending(now);
        }
    }

    /// Closes a connection that never got its stream (see
    /// [`Client::with_stream_len_later`]), as it does itself once held
    /// past [`hold_limit`]: a held one sends its close
    /// three times without waiting for the acknowledgement, so the server
    /// frees its slot at once; one not yet welcomed just ends (the server
    /// forgets a connection without data after its hello time).
    pub(crate) fn abandon(&mut self, now: Time) {
        match self.state {
            State::Held => {
                self.abandoned = true;
                self.start_closing(now);
            }
            State::Hello => {
                self.state = State::Done(Ok(Closed {
                    peer: None,
                    reply: None,
                }));
            }
            _ => {}
        }
    }

    /// Held after its welcome, waiting for its stream.
    #[cfg(test)]
    pub(crate) fn is_held(&self) -> bool {
        matches!(self.state, State::Held)
    }

    /// Limits the data sent to the stream's first `bytes` (see
    /// [`Sender::set_available`]); kept for the sender made at the welcome.
    pub(crate) fn set_available(&mut self, now: Time, bytes: u64) {
        self.available = Some(self.available.map_or(bytes, |a| a.max(bytes)));
        if let Some(s) = self.sender.as_mut() {
            s.set_available(now, bytes);
        }
    }

    /// Records atou's packet trace (see [`Sender::enable_trace`]).
    pub(crate) fn enable_trace(&mut self) {
        self.trace = true;
        if let Some(s) = self.sender.as_mut() {
            s.enable_trace();
        }
    }

    /// Whether the server has answered in its own words: the handshake's
    /// answer opened under the pinned key (plain: its welcome), or a
    /// refusal that ended the connection. A datagram that only comes from
    /// the server's address, which anyone on the path can forge, does not
    /// count: a copy over ssh that hears nothing else goes through its
    /// tunnel (issue 29).
    pub fn answered(&self) -> bool {
        let welcomed = match &self.secure {
            Some(s) => s.keys.is_some(),
            None => self.sender.is_some(),
        };
        welcomed
            || matches!(
                self.state,
                State::Done(Err(ConnError::VersionMismatch { .. }
                    | ConnError::NoIdentity
                    | ConnError::AuthRefused(_)
                    | ConnError::AuthRequired
                    | ConnError::Busy
                    | ConnError::Refused))
            )
    }

    /// The sender, once the server has answered.
    pub fn sender(&self) -> Option<&Sender> {
        self.sender.as_ref()
    }

    pub(crate) fn sender_mut(&mut self) -> Option<&mut Sender> {
        self.sender.as_mut()
    }

    /// The receiver settings the server applied.
    pub fn granted(&self) -> Option<ReceiverParams> {
        self.granted
    }

    pub(crate) fn bad_packets(&self) -> u64 {
        self.bad_packets
    }

    /// The server's whole reply to the stream, once it is in and until
    /// the connection's end hands it over (`Closed::reply`).
    pub fn reply(&self) -> Option<&[u8]> {
        self.reply.as_deref()
    }

    /// Bytes held for the server's reply while it is fetched (the unit
    /// tests' and the fuzz target's check of the reply's memory).
    #[cfg(any(test, fuzzing))]
    pub fn reply_bytes_held(&self) -> usize {
        match &self.state {
            State::Fetching(f) => f.held(),
            _ => 0,
        }
    }

    /// `Some` once the connection is over.
    pub fn outcome(&self) -> Option<&Result<Closed, ConnError>> {
        match &self.state {
            State::Done(r) => Some(r),
            _ => None,
        }
    }

    fn hello(&self) -> Hello {
        let t = &self.tuning;
        Hello {
            conn_id: self.conn_id,
            mss: t.mss,
            maxidle_ms: u32::try_from(t.maxidle.as_millis()).unwrap_or(u32::MAX),
            session: self.purpose.to_wire(),
            receiver: ReceiverParams {
                rcvsegs: t.rcvsegs,
                rcvbuf: t.rcvbuf,
                delack_us: u32::try_from(t.delack.as_micros()).unwrap_or(u32::MAX),
                quickack: u16::try_from(t.quickack).unwrap_or(u16::MAX),
                sack: t.recovery.uses_sack(),
            },
        }
    }

    fn fail(&mut self, e: ConnError) {
        self.state = State::Done(Err(e));
    }

    /// Handles one datagram from the server.
    pub fn handle_datagram(&mut self, now: Time, datagram: &[u8]) -> Result<(), InputError> {
        // A size ack is plain even on an authenticated connection (the
        // server acks probes without a connection); its nonce is what
        // makes it ours.
        if let Some(watch) = self
            .size_watch
            .as_mut()
            .filter(|_| datagram.len() == SIZE_ACK_LEN)
        {
            if let Ok(Packet::SizeAck(ack)) = Packet::decode(datagram) {
                watch.on_ack(&ack);
                return Ok(());
            }
        }
        let Some(secure) = self.secure.as_mut() else {
            return self.handle_plain(now, datagram);
        };
        if secure.keys.is_none() {
            return self.handle_handshake(now, datagram);
        }
        if !frame::is_protected(datagram) {
            self.bad_packets += 1;
            return Err(InputError::Unexpected("unprotected"));
        }
        let mut scratch = std::mem::take(&mut secure.scratch);
        scratch.clear();
        scratch.extend_from_slice(datagram);
        let (_, opener) = secure.keys.as_mut().expect("established");
        let result = match frame::open(opener, self.conn_id, &mut scratch) {
            Ok(inner) => self.handle_plain(now, &scratch[inner]),
            Err(_) => {
                // Counted by the opener; never answered.
                self.bad_packets += 1;
                Ok(())
            }
        };
        if let Some(s) = self.secure.as_mut() {
            s.scratch = scratch;
        }
        result
    }

    /// A datagram while the handshake runs: the server's response or
    /// cookie reply; a plain reject only to say the server speaks another
    /// version. Anything else (forgeries included) changes nothing.
    fn handle_handshake(&mut self, now: Time, datagram: &[u8]) -> Result<(), InputError> {
        let secure = self.secure.as_mut().expect("a secure client");
        if let Ok(Packet::Reject(r)) = Packet::decode(datagram) {
            if r.conn_id == self.conn_id {
                match r.reason {
                    RejectReason::UnsupportedVersion => {
                        self.fail(ConnError::VersionMismatch { theirs: r.version });
                        return Ok(());
                    }
                    RejectReason::NoIdentity => {
                        self.fail(ConnError::NoIdentity);
                        return Ok(());
                    }
                    _ => {}
                }
            }
        }
        if let Err(WireError::UnsupportedVersion(theirs)) = Packet::decode(datagram) {
            if datagram.len() >= 12 && datagram[4..12] == self.conn_id.to_be_bytes() {
                self.fail(ConnError::VersionMismatch { theirs });
                return Ok(());
            }
        }
        let Some(initiator) = secure.initiator.as_mut() else {
            self.bad_packets += 1;
            return Err(InputError::Unexpected("handshake answer before a hello"));
        };
        match initiator.on_datagram(datagram) {
            Ok(Progress::SendHelloAgain) => {
                secure.hello_again = true;
                Ok(())
            }
            Ok(Progress::Established(e)) => {
                let established = *e;
                let params = established.peer_params.clone();
                secure.server_id = established.server_id;
                secure.established_at = Some(now);
                secure.keys = Some(established.into_protection());
                secure.initiator = None;
                let offered = secure.early_offered;
                match split_welcome_params(&params) {
                    Ok((w, taken)) if w.conn_id == self.conn_id => {
                        self.on_welcome(now, w.receiver);
                        if taken && offered {
                            self.on_early_taken(now);
                        }
                        Ok(())
                    }
                    _ => {
                        self.fail(ConnError::Handshake(HandshakeError::Malformed(
                            "the server's parameters are not a welcome",
                        )));
                        Ok(())
                    }
                }
            }
            // A server without early data refuses parameters longer than
            // a hello: say the hello again at once, as before early data.
            Err(HandshakeError::Refused(RefuseReason::ParamsRefused)) if secure.early_offered => {
                secure.early_offered = false;
                secure.config.params.truncate(HELLO_LEN);
                secure.initiator = None;
                self.retry = Retry::now(now);
                Ok(())
            }
            Err(HandshakeError::Refused(reason)) => {
                self.fail(ConnError::AuthRefused(reason));
                Ok(())
            }
            Err(HandshakeError::Version { got, .. }) => {
                self.fail(ConnError::VersionMismatch { theirs: got });
                Ok(())
            }
            Err(_) => {
                self.bad_packets += 1;
                Err(InputError::Unexpected(
                    "handshake message that does not open",
                ))
            }
        }
    }

    fn handle_plain(&mut self, now: Time, datagram: &[u8]) -> Result<(), InputError> {
        let packet = match Packet::decode(datagram) {
            Ok(p) => p,
            Err(WireError::UnsupportedVersion(theirs)) if matches!(self.state, State::Hello) => {
                self.fail(ConnError::VersionMismatch { theirs });
                return Ok(());
            }
            Err(e) => {
                self.bad_packets += 1;
                return Err(e.into());
            }
        };
        let conn_id = match packet {
            Packet::Ack(a) => a.conn_id,
            Packet::Welcome(w) => w.conn_id,
            Packet::CloseAck(c) => c.conn_id,
            Packet::Reject(r) => r.conn_id,
            Packet::Reply(r) => r.conn_id(),
            Packet::Retry(r) => r.conn_id,
            Packet::PathChallenge(p) if self.secure.is_some() => p.conn_id,
            other => {
                self.bad_packets += 1;
                return Err(InputError::Unexpected(other.kind_name()));
            }
        };
        if conn_id != self.conn_id {
            self.bad_packets += 1;
            return Err(InputError::WrongConnection {
                expected: self.conn_id,
                got: conn_id,
            });
        }
        match (packet, &self.state) {
            (Packet::Reject(r), State::Hello) => self.fail(match r.reason {
                RejectReason::UnsupportedVersion => {
                    ConnError::VersionMismatch { theirs: r.version }
                }
                RejectReason::BadHello => ConnError::Refused,
                RejectReason::Busy => ConnError::Busy,
                RejectReason::AuthRequired => ConnError::AuthRequired,
                RejectReason::NoIdentity => ConnError::NoIdentity,
            }),
            (Packet::Welcome(w), State::Hello) if self.secure.is_none() => {
                self.on_welcome(now, w.receiver)
            }
            // RFC 9000 §8.1.2: the server keeps nothing until the hello
            // comes back with this token. A token already held is not sent
            // again at once (the usual back-off repeats it), so no stream
            // of retries makes this client send more than it gets.
            (Packet::Retry(r), State::Hello)
                if self.secure.is_none() && self.address_token != Some(r.token) =>
            {
                self.address_token = Some(r.token);
                self.hello_now = true;
            }
            // Authenticated (a secure client decodes only what opened):
            // echo it from wherever this client now is (RFC 9000 §8.2.2).
            (Packet::PathChallenge(p), _) if self.path_responses.len() < PATH_RESPONSES_MAX => {
                self.path_responses.push_back(p.token);
            }
            (Packet::Reply(reply), State::Fetching(_)) => self.on_reply(now, reply),
            // The server answered before all was sent (it failed): stop
            // sending and fetch the answer.
            (Packet::Reply(reply @ Reply::Fragment { .. }), State::Transfer | State::Held)
                if self.purpose != Purpose::Probe =>
            {
                self.state = State::Fetching(Box::new(Fetching::new(
                    now,
                    self.tuning.mss,
                    self.reply_limit,
                )));
                self.on_reply(now, reply);
            }
            // The server's acknowledgement of the hello's segment: the
            // sender never sent it.
            (Packet::Ack(_), _) if self.early_taken => {}
            (Packet::Ack(ack), State::Transfer | State::Fetching(_) | State::Closing { .. }) => {
                let sender = self
                    .sender
                    .as_mut()
                    .expect("sender exists after the welcome");
                sender.handle_ack(now, &ack)?;
                self.after_sender(now);
            }
            (Packet::CloseAck(c), State::Closing { .. }) => {
                self.state = State::Done(Ok(Closed {
                    peer: Some(c.stats),
                    reply: self.reply.take(),
                }));
            }
            // Late copies of a welcome or an ACK, or a reject after the
            // welcome: harmless, ignored.
            _ => {}
        }
        Ok(())
    }

    fn on_welcome(&mut self, now: Time, granted: ReceiverParams) {
        if !matches!(self.state, State::Hello) {
            return;
        }
        self.granted = Some(granted);
        if self.stream_len_later {
            self.state = State::Held;
            return;
        }
        self.start_sending(now);
    }

    /// The server took the stream from the hello: it is delivered, so the
    /// client fetches the reply at once (its first fetch also confirms
    /// the session to the server, which until then sends no more than 3×
    /// the hello).
    fn on_early_taken(&mut self, now: Time) {
        if !matches!(self.state, State::Transfer) {
            return;
        }
        self.early_taken = true;
        self.state = State::Fetching(Box::new(Fetching::new(
            now,
            self.tuning.mss,
            self.reply_limit,
        )));
    }

    /// The welcome is in and the stream known: the sender starts.
    fn start_sending(&mut self, now: Time) {
        let Some(granted) = self.granted else {
            return;
        };
        let mut tuning = self.tuning.clone();
        tuning.rcvsegs = granted.rcvsegs.max(1);
        let mut sender = Sender::new(&tuning, self.conn_id, self.stream_len, now)
            .expect("tuning was checked when the client was made");
        if let Some(memory) = &self.path_memory {
            sender = sender.with_path_memory(memory);
        }
        if self.trace {
            sender.enable_trace();
        }
        if let Some(bytes) = self.available {
            sender.set_available(now, bytes);
        }
        self.sender = Some(sender);
        self.state = State::Transfer;
    }

    fn on_reply(&mut self, now: Time, reply: Reply<'_>) {
        let timeout = self.fetch_timeout();
        let State::Fetching(f) = &mut self.state else {
            return;
        };
        f.last_heard = now;
        match reply {
            Reply::Pending { .. } => {
                f.asked.clear();
                f.queue.clear();
                f.again_at = now + f.pending_wait;
                f.pending_wait = (f.pending_wait * 3 / 2).min(FETCH_PENDING_MAX);
            }
            Reply::Fragment {
                offset,
                total,
                data,
                ..
            } => {
                let before = (f.done, f.early.len());
                if let Err(e) = f.take(offset, total, data) {
                    self.fail(e);
                    return;
                }
                if (f.done, f.early.len()) != before {
                    f.pending_wait = FETCH_PENDING_FIRST;
                }
                if f.is_done() {
                    self.reply = Some(std::mem::take(&mut f.bytes));
                    self.start_closing(now);
                } else {
                    f.fill_window();
                    f.again_at = now + timeout;
                }
            }
        }
    }

    /// An ICMP "too big" naming `next_hop_mtu`, taken as a hint only
    /// ([`BlackHoleWatch::on_too_big`]), `quote` the start of the datagram
    /// it is about; whether the size watch took it (false: no watch, no
    /// transfer, or the report is not valid for this connection). Valid
    /// (RFC 8899 §4.6.1): the kernel matched the quoted addresses and
    /// ports to the connected socket, and the quote is a datagram this
    /// connection sent ([`Client::sent_this`]). The kernel does not pass
    /// on the quoted datagram's length, so that is taken to be the full
    /// size.
    pub(crate) fn size_hint(&mut self, next_hop_mtu: u32, quote: &[u8]) -> bool {
        if !self.sent_this(quote) {
            return false;
        }
        match (self.size_watch.as_mut(), &self.state) {
            (Some(watch), State::Transfer) => {
                watch.on_too_big(next_hop_mtu, self.largest_sent, self.largest_sent)
            }
            _ => false,
        }
    }

    /// Whether `quote` starts as a datagram this connection sent: a
    /// protected one naming the server's id for it and a packet number
    /// already sealed, or a plain one (a size probe, or any datagram of a
    /// connection without keys) naming this connection's id. A forger off
    /// the path knows neither id (64 random bits each).
    fn sent_this(&self, quote: &[u8]) -> bool {
        if frame::is_protected(quote) {
            return match self.secure.as_deref() {
                Some(Secure {
                    keys: Some((sealer, _)),
                    server_id,
                    ..
                }) => {
                    frame::recipient_id(quote) == *server_id
                        && frame::packet_number(quote) < sealer.next_pn()
                }
                _ => false,
            };
        }
        HeaderPeek::read(quote).is_some_and(|h| h.version == VERSION && h.conn_id == self.conn_id)
    }

    /// After the sender's timers: whether a black hole swallows the
    /// full-size datagrams (RFC 8899 §4.3).
    fn watch_size(&mut self) {
        let (Some(watch), Some(sender), State::Transfer) =
            (self.size_watch.as_mut(), self.sender.as_ref(), &self.state)
        else {
            return;
        };
        let stats = sender.stats();
        if let Some(step) = watch.on_sender(stats.good_bytes, stats.timeouts, self.largest_sent) {
            self.fail(ConnError::PathShrank {
                stopped: step.stopped,
                carried: step.carried,
            });
        }
    }

    /// How long a fetched fragment may take before it is asked for again.
    fn fetch_timeout(&self) -> Duration {
        self.sender
            .as_ref()
            .map_or(CONTROL_RETRY_FIRST, |s| s.rto())
    }

    fn start_closing(&mut self, now: Time) {
        let wait = if self.tuning.maxidle.is_zero() {
            CLOSE_WAIT_DEFAULT
        } else {
            self.tuning.maxidle
        };
        self.retry = Retry::now(now);
        self.state = State::Closing {
            deadline: now + wait,
        };
    }

    fn after_sender(&mut self, now: Time) {
        let Some(sender) = self.sender.as_ref() else {
            return;
        };
        match (sender.state(), &self.state) {
            (SenderState::Finished, State::Transfer) if self.purpose != Purpose::Probe => {
                self.state = State::Fetching(Box::new(Fetching::new(
                    now,
                    self.tuning.mss,
                    self.reply_limit,
                )));
            }
            (SenderState::Finished, State::Transfer) => self.start_closing(now),
            (SenderState::Stalled, State::Transfer) => {
                let delivered = sender.good_bytes();
                let stall = self.tuning.stall;
                self.fail(ConnError::Stalled { stall, delivered });
            }
            (SenderState::Failed, State::Transfer) => {
                let idle = self.tuning.maxidle;
                self.fail(ConnError::Idle {
                    stage: Stage::Transfer,
                    idle,
                });
            }
            _ => {}
        }
    }

    /// Acts on the timers due by `now` ([`Client::poll_timeout`]): the
    /// sender's retransmission timer, reply fragments asked again, and
    /// `maxidle`, which fails the connection. What they send comes out of
    /// [`Client::poll_transmit`].
    pub fn handle_timeout(&mut self, now: Time) {
        match self.state {
            State::Hello => {
                let waited = now.saturating_since(self.started);
                if !self.tuning.maxidle.is_zero() && waited >= self.tuning.maxidle {
                    let stage = if self.secure.is_some() {
                        Stage::Handshake
                    } else {
                        Stage::Hello
                    };
                    self.fail(ConnError::Idle {
                        stage,
                        idle: waited,
                    });
                }
            }
            State::Transfer => {
                if let Some(s) = self.sender.as_mut() {
                    s.handle_timeout(now);
                }
                self.after_sender(now);
                self.watch_size();
            }
            State::Fetching(ref mut f) => {
                let idle = now.saturating_since(f.last_heard);
                if !self.tuning.maxidle.is_zero() && idle >= self.tuning.maxidle {
                    self.fail(ConnError::Idle {
                        stage: Stage::Reply,
                        idle,
                    });
                } else if now >= f.again_at {
                    // Ask again for everything unanswered (or, before the
                    // first fragment, for the first).
                    f.asked.clear();
                    f.queue.clear();
                    if f.total.is_none() {
                        f.queue.push_back(0);
                    }
                    f.fill_window();
                    let wait = self
                        .sender
                        .as_ref()
                        .map_or(CONTROL_RETRY_FIRST, |s| s.rto());
                    if let State::Fetching(f) = &mut self.state {
                        f.again_at = now + wait;
                    }
                }
            }
            State::Closing { deadline } if now >= deadline => {
                self.state = State::Done(Ok(Closed {
                    peer: None,
                    reply: self.reply.take(),
                }));
            }
            State::Held if now >= self.started + hold_limit(&self.tuning) => self.abandon(now),
            State::Held | State::Closing { .. } | State::Done(_) => {}
        }
    }

    /// Whether the next datagram [`Client::poll_transmit`] writes is a
    /// size probe, which the I/O sends alone (never in a GSO run).
    pub(crate) fn size_probe_due(&self) -> bool {
        matches!(
            (self.size_watch.as_ref(), &self.state),
            (Some(watch), State::Transfer) if watch.has_probe_due()
        )
    }

    /// Writes the next datagram into `buf` and returns its length; `None`:
    /// nothing to send now. `buf` holds at least `mss` plus protection's
    /// 24 bytes, and at least a padded hello (the crate's
    /// `max_transmit_len`).
    pub fn poll_transmit(
        &mut self,
        now: Time,
        buf: &mut [u8],
        source: &mut dyn PayloadSource,
    ) -> Option<usize> {
        let (n, job) = self.poll_any(now, buf, source, false)?;
        debug_assert!(job.is_none());
        Some(n)
    }

    /// As [`Client::poll_transmit`], but a protected datagram comes back
    /// prepared and not yet sealed, with the [`frame::SealJob`] that seals
    /// it: the packet number is taken here, in order, and the AEAD work
    /// may be done on another thread. The datagram must not leave before
    /// its job has sealed `buf[..n]`. Datagrams without a job (hellos,
    /// size probes, a plain client's) go as they are.
    pub(crate) fn poll_transmit_unsealed(
        &mut self,
        now: Time,
        buf: &mut [u8],
        source: &mut dyn PayloadSource,
    ) -> Option<(usize, Option<frame::SealJob>)> {
        self.poll_any(now, buf, source, true)
    }

    fn poll_any(
        &mut self,
        now: Time,
        buf: &mut [u8],
        source: &mut dyn PayloadSource,
        defer_seal: bool,
    ) -> Option<(usize, Option<frame::SealJob>)> {
        debug_assert!(buf.len() >= CONTROL_MAX_LEN);
        if let (Some(watch), State::Transfer) = (self.size_watch.as_mut(), &self.state) {
            // Plain, as the server answers probes outside any connection.
            if let Some(n) = watch.poll_probe(buf) {
                return Some((n, None));
            }
        }
        let (n, job) = self.poll_protected(now, buf, source, defer_seal)?;
        self.largest_sent = self.largest_sent.max(n as u32);
        Some((n, job))
    }

    /// [`Client::poll_transmit`]'s datagrams other than size probes.
    fn poll_protected(
        &mut self,
        now: Time,
        buf: &mut [u8],
        source: &mut dyn PayloadSource,
        defer_seal: bool,
    ) -> Option<(usize, Option<frame::SealJob>)> {
        let Some(secure) = self.secure.as_mut() else {
            return self.poll_inner(now, buf, source).map(|n| (n, None));
        };
        if secure.keys.is_none() {
            if !matches!(self.state, State::Hello) {
                return None;
            }
            let again = std::mem::take(&mut secure.hello_again) && secure.initiator.is_some();
            if !again {
                if !self.retry.due(now) {
                    return None;
                }
                // A new handshake each time (new ephemeral key, newer
                // timestamp): the server refuses a hello it has seen, so
                // repeating the same bytes after a lost response would
                // never be answered (WireGuard does the same).
                let timestamp =
                    secure.wall_start_ns + now.saturating_since(self.started).as_nanos() as u64;
                match Initiator::new(&secure.config, self.conn_id, timestamp) {
                    Ok(i) => secure.initiator = Some(i),
                    Err(e) => {
                        self.fail(ConnError::Handshake(e));
                        return None;
                    }
                }
            }
            let hello = secure.initiator.as_ref()?.hello();
            let n = hello.len().min(buf.len());
            buf[..n].copy_from_slice(&hello[..n]);
            return Some((n, None));
        }
        let n = self.poll_inner(now, &mut buf[frame::PN_LEN..], source)?;
        let secure = self.secure.as_mut().expect("secure");
        let server_id = secure.server_id;
        let (sealer, _) = secure.keys.as_mut().expect("established");
        let sealed = if defer_seal {
            frame::prepare(sealer, server_id, buf, n).map(|job| (job.len(), Some(job)))
        } else {
            frame::seal(sealer, server_id, buf, n).map(|len| (len, None))
        };
        match sealed {
            Ok(done) => Some(done),
            Err(e) => {
                self.fail(ConnError::Handshake(HandshakeError::Noise(e.to_string())));
                None
            }
        }
    }

    fn poll_inner(
        &mut self,
        now: Time,
        buf: &mut [u8],
        source: &mut dyn PayloadSource,
    ) -> Option<usize> {
        if let Some(token) = self.path_responses.pop_front() {
            return PathProbe {
                conn_id: self.conn_id,
                token,
            }
            .emit_response(buf)
            .ok();
        }
        match self.state {
            State::Hello if std::mem::take(&mut self.hello_now) || self.retry.due(now) => self
                .hello()
                .emit_with_token(self.address_token.as_ref(), buf)
                .ok(),
            State::Transfer => {
                let n = self.sender.as_mut()?.poll_transmit(now, buf, source);
                self.after_sender(now);
                n
            }
            State::Fetching(ref mut f) => {
                let k = f.queue.pop_front()?;
                f.asked.insert(k);
                Fetch {
                    conn_id: self.conn_id,
                    offset: k * f.fragment,
                }
                .emit(buf)
                .ok()
            }
            State::Closing { .. } if self.retry.due(now) => {
                // A held connection closes having sent nothing.
                let (mut segments, mut bytes) = self
                    .sender
                    .as_ref()
                    .map_or((0, 0), |s| (s.stats().pkts_out, s.good_bytes()));
                if self.early_taken {
                    segments += 1;
                    bytes += self.stream_len.unwrap_or(0);
                }
                let n = Close {
                    conn_id: self.conn_id,
                    segments,
                    bytes,
                }
                .emit(buf)
                .ok();
                let unacknowledged =
                    (self.close_unacknowledged && self.reply.is_some()) || self.abandoned;
                if n.is_some() && unacknowledged {
                    self.closes_sent += 1;
                    if self.closes_sent >= UNACKNOWLEDGED_CLOSES {
                        self.state = State::Done(Ok(Closed {
                            peer: None,
                            reply: self.reply.take(),
                        }));
                    } else {
                        self.retry = Retry::now(now);
                    }
                }
                n
            }
            _ => None,
        }
    }

    /// When to call [`Client::handle_timeout`] next; `None`: no timer
    /// (the connection is over).
    pub fn poll_timeout(&self) -> Option<Time> {
        match self.state {
            State::Hello => {
                let give_up =
                    (!self.tuning.maxidle.is_zero()).then(|| self.started + self.tuning.maxidle);
                let next = match &self.secure {
                    Some(s) if s.hello_again => self.started,
                    None if self.hello_now => self.started,
                    _ => self.retry.next,
                };
                [Some(next), give_up].into_iter().flatten().min()
            }
            State::Transfer => self.sender.as_ref()?.poll_timeout(),
            State::Held => Some(self.started + hold_limit(&self.tuning)),
            State::Fetching(ref f) => {
                let give_up =
                    (!self.tuning.maxidle.is_zero()).then(|| f.last_heard + self.tuning.maxidle);
                [Some(f.again_at), give_up].into_iter().flatten().min()
            }
            State::Closing { deadline } => Some(self.retry.next.min(deadline)),
            State::Done(_) => None,
        }
    }

    /// Whether a due timer is one that the peer's next datagram may
    /// cancel: any but the data sender's pacer (see
    /// [`Sender::ack_timer_due`]).
    pub(crate) fn reply_timer_due(&self, now: Time) -> bool {
        match (&self.state, &self.sender) {
            (State::Transfer, Some(sender)) => sender.ack_timer_due(now),
            _ => self.poll_timeout().is_some_and(|t| t <= now),
        }
    }

    /// The next of atou's events (`3duprxmit`, `timerxmit`, ...) the
    /// sender recorded, with its time; `None` when none is waiting.
    pub fn poll_event(&mut self) -> Option<TimedEvent> {
        self.sender.as_mut()?.poll_event()
    }

    pub(crate) fn poll_trace(&mut self) -> Option<TraceRecord> {
        self.sender.as_mut()?.poll_trace()
    }
}

#[cfg(test)]
mod tests {
    //! A hostile server, sans-IO: crafted reply fragments built with the
    //! wire encoders, fed straight to a client that is fetching.
    use super::*;
    use crate::proto::payload::PatternSource;
    use crate::proto::wire::Welcome;

    const CONN: u64 = 41;

    /// A session client past its welcome, with `mss` 200 (179-byte
    /// fragments).
    fn client() -> (Client, Time) {
        let tuning = Tuning {
            mss: 200,
            ..Tuning::default()
        };
        let now = Time::ZERO;
        let mut c = Client::new(&tuning, CONN, Some(1000), now)
            .unwrap()
            .with_session(7);
        let mut buf = [0u8; 256];
        let n = Welcome {
            conn_id: CONN,
            receiver: ReceiverParams {
                rcvsegs: 16,
                rcvbuf: 1 << 20,
                delack_us: 0,
                quickack: 0,
                sack: true,
            },
        }
        .emit(&mut buf)
        .unwrap();
        c.handle_datagram(now, &buf[..n]).unwrap();
        assert!(c.sender().is_some());
        (c, now)
    }

    #[track_caller]
    fn fragment(c: &mut Client, now: Time, offset: u32, total: u32, data: &[u8]) {
        let mut buf = vec![0u8; 2048];
        let n = Reply::Fragment {
            conn_id: CONN,
            offset,
            total,
            data,
        }
        .emit(&mut buf)
        .unwrap();
        let _ = c.handle_datagram(now, &buf[..n]);
    }

    fn frag_len() -> u32 {
        reply_fragment_len(200) as u32
    }

    /// The server announces one length, then sends a fragment of a longer
    /// reply that lies past the first one's end: `bytes.len() - offset`
    /// must not underflow.
    #[test]
    fn a_server_that_changes_the_reply_length_cannot_panic_the_client() {
        let (mut c, now) = client();
        let f = frag_len();
        fragment(&mut c, now, 0, 3 * f, &vec![1; f as usize]);
        fragment(&mut c, now, 10 * f, 20 * f, &vec![2; f as usize]);
        fragment(&mut c, now, f, 20 * f, &vec![2; f as usize]);
        assert!(c.outcome().is_none(), "stray fragments are ignored");
        // The honest rest still completes the reply.
        fragment(&mut c, now, f, 3 * f, &vec![3; f as usize]);
        fragment(&mut c, now, 2 * f, 3 * f, &vec![4; f as usize]);
        let mut buf = [0u8; 256];
        let _ = c.poll_transmit(now, &mut buf, &mut PatternSource);
        let mut want = vec![1; f as usize];
        want.extend(vec![3; f as usize]);
        want.extend(vec![4; f as usize]);
        assert!(matches!(c.state, State::Closing { .. }), "{:?}", c.state);
        assert_eq!(c.reply.as_deref(), Some(&want[..]));
    }

    /// The server announces a reply of 256 MiB and sends one fragment,
    /// then one near the end: the client holds what arrived, not what
    /// was announced.
    #[test]
    fn a_server_announcing_a_huge_reply_does_not_make_the_client_allocate_it() {
        let (mut c, now) = client();
        let f = frag_len();
        let total = REPLY_MAX / f * f;
        fragment(&mut c, now, 0, total, &vec![1; f as usize]);
        fragment(&mut c, now, total - f, total, &vec![1; f as usize]);
        assert!(c.outcome().is_none());
        let held = c.reply_bytes_held();
        assert!(held <= 64 << 10, "{held} bytes held for 2 fragments");
    }

    /// A reply longer than the request can produce ends the connection
    /// with an error that says so, before anything is held for it.
    #[test]
    fn a_reply_longer_than_the_request_allows_is_refused() {
        let (c, now) = client();
        let mut c = c.with_reply_limit(4096);
        let f = frag_len();
        fragment(&mut c, now, 0, 1 << 20, &vec![1; f as usize]);
        let Some(Err(e)) = c.outcome() else {
            panic!("{:?}", c.outcome())
        };
        assert_eq!(
            *e,
            ConnError::ReplyTooLong {
                total: 1 << 20,
                limit: 4096
            }
        );
        assert!(e.to_string().contains("1048576 bytes"), "{e}");
    }

    /// Fragments out of order (last first) and repeated still make the
    /// reply, and the fetches ask only for what is missing.
    #[test]
    fn fragments_out_of_order_and_repeated_make_the_reply() {
        let (mut c, now) = client();
        let f = frag_len() as usize;
        let reply: Vec<u8> = (0..5 * f - 7).map(|i| (i % 251) as u8).collect();
        let total = reply.len() as u32;
        let pieces: Vec<(u32, &[u8])> = reply
            .chunks(f)
            .enumerate()
            .map(|(k, d)| ((k * f) as u32, d))
            .collect();
        fragment(&mut c, now, pieces[4].0, total, pieces[4].1);
        let mut asked = Vec::new();
        let mut buf = [0u8; 256];
        while let Some(n) = c.poll_transmit(now, &mut buf, &mut PatternSource) {
            if let Ok(Packet::Fetch(fetch)) = Packet::decode(&buf[..n]) {
                asked.push(fetch.offset);
            }
        }
        let want: Vec<u32> = pieces[..4].iter().map(|p| p.0).collect();
        assert_eq!(asked, want, "the missing fragments, once each");
        for k in [2, 2, 0, 3, 0, 1] {
            fragment(&mut c, now, pieces[k].0, total, pieces[k].1);
        }
        assert_eq!(c.reply.as_deref(), Some(&reply[..]));
    }

    proptest::proptest! {
        /// Any sequence of reply fragments a server may craft (any offset,
        /// total and length the wire decoder lets through, repeated, out of
        /// order, changing length): no panic, and the client holds no more
        /// than its limit plus the fragments it keeps ahead.
        #[test]
        fn hostile_reply_fragments_never_panic_and_stay_bounded(
            limit in 1u32..20_000,
            frags in proptest::collection::vec(
                (0u32..30_000, 0u32..30_000, 0usize..400), 1..60),
        ) {
            let (c, now) = client();
            let mut c = c.with_reply_limit(limit);
            let mut most = 0;
            for (offset, total, len) in frags {
                let total = total.max(offset.saturating_add(len as u32));
                fragment(&mut c, now, offset, total, &vec![9; len]);
                most = most.max(c.reply_bytes_held());
                let mut buf = [0u8; 256];
                while c.poll_transmit(now, &mut buf, &mut PatternSource).is_some() {}
            }
            let ahead = FETCH_AHEAD as usize * frag_len() as usize;
            proptest::prop_assert!(most <= 2 * limit as usize + ahead, "{most} held");
            if let Some(Ok(closed)) = c.outcome() {
                proptest::prop_assert!(closed.reply.as_ref().is_none_or(|r| r.len() <= limit as usize));
            }
        }
    }
}

//! The server's side: many connections behind one socket, sans I/O.
//!
//! [`Server`] demultiplexes datagrams by connection id (and checks they come
//! from the address that opened the connection), answers hellos, runs one
//! sink [`Receiver`] per connection, and reports each connection when it
//! closes or goes idle. Datagrams that do not decode, or that belong to no
//! connection, are counted and dropped; nothing a peer sends can make it
//! panic or stall.
//!
//! Drive it like the other endpoints: [`Server::handle_datagram`], then
//! drain [`Server::poll_transmit`] (after every datagram, so that ACKs are
//! not merged: the ACK policy is per segment), [`Server::handle_timeout`]
//! at [`Server::poll_timeout`], and collect [`Server::poll_report`].
//!
//! A server that keeps its hello timestamps across restarts
//! ([`Server::keeping_hello_timestamps`]) holds each accepted hello's
//! response until its driver has saved the table
//! ([`Server::hello_timestamps_to_save`], then
//! [`Server::hello_timestamps_saved`]), so no client is answered with a
//! session whose hello a restart would accept again.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::num::NonZeroU64;
use std::time::Duration;

use rand_chacha::ChaCha20Rng;
use rand_core::{Rng, SeedableRng};
use serde::Serialize;

use crate::proto::crypto::amplification::Budget;
use crate::proto::crypto::protect::{BadTag, OpenTicket};
use crate::proto::crypto::ratelimit::{Buckets, Rate, RateLimiter};
use crate::proto::crypto::replayed::{self, ReplayedHellos};
use crate::proto::crypto::{
    frame, handshake, CookieSecret, Decision, HandshakeError, Opener, PublicKey, RefuseReason,
    Responder, Screened, Sealer, ServerAuth,
};
use crate::proto::payload::pattern_mismatch;
use crate::proto::stream::receiver::{Receiver, ReceiverConfig};
use crate::proto::time::Time;
use crate::proto::wire::ReceiverStats;
use crate::proto::wire::{
    early_segment, hello_token, split_hello_params, AddressToken, CloseAck, DataSegment,
    HeaderPeek, Hello, Packet, PathProbe, ReceiverParams, Reject, RejectReason, Reply, Retry,
    SizeAck, SizeProbe, Welcome, CONTROL_MAX_LEN, DATA_HEADER_LEN, EARLY_TAKEN, REPLY_HEADER_LEN,
    VERSION,
};

/// A client that asked for `maxidle 0` is still forgotten after this long
/// without a packet: a persistent server must not keep state forever.
const MAXIDLE_CAP: Duration = Duration::from_secs(600);
/// Refusals told to the operator per second; the rest are counted and
/// summed up in one line, so a flood of hellos cannot flood the log.
const NOTICES_PER_SEC: u32 = 10;
/// How long a closed connection stays to answer repeated closes.
const LINGER: Duration = Duration::from_secs(2);
/// Largest datagram a client may announce (IPv4's UDP limit).
const MSS_MAX: u32 = 65_507;
/// Largest reply fragment (smaller when the client's mss is).
pub const REPLY_FRAGMENT_MAX: usize = 1200;
/// Fetches remembered per connection until answered; a client asks for a
/// window of fragments at a time, and asks again for those lost.
const FETCH_QUEUE_MAX: usize = 256;

/// Fragments of an answer pushed unasked, at once: a flight no larger
/// than a TCP sender's initial window on a path it knows nothing of
/// (RFC 6928: ten segments). A plan's answer for a few thousand files
/// then comes whole with the last acknowledgement, not a fetch's round
/// trip later; the rest of a longer one is fetched.
const REPLY_PUSHED_FRAGMENTS: usize = 10;
/// Authenticated hellos (each costs up to five X25519 operations) worked
/// through per second before hellos must carry a cookie: past this the
/// server is under load (WireGuard's cookie reply; RFC 9000 §8.1.2).
const HANDSHAKES_PER_SEC: u32 = 200;
/// WireGuard's ratelimiter.c: PACKETS_PER_SECOND, PACKETS_BURSTABLE.
const HELLOS_PER_SEC_PER_SOURCE: u32 = 20;
const HELLO_BURST_PER_SOURCE: u32 = 5;
/// Answers sent before anyone proved anything (cookie replies, rejects,
/// retries, key answers, size-probe acks) to one address (IP and port) a
/// second, and at once. None is larger than what it answers, but one for
/// every datagram would make the server a reflector at a spoofer's packet
/// rate. A client's connection needs a few (its key, a cookie, its size
/// probes' acks). Keyed by port too, so that a spoofer who sends in a
/// victim's IP, but cannot know the port the victim sends from, cannot
/// spend the victim's share.
const UNPROVEN_ANSWERS_PER_SEC: u32 = 64;
const UNPROVEN_ANSWERS_BURST: u32 = 64;
/// Hellos in, or waiting for, their public-key work at once. At the
/// default 1,000 worked a second, 64 is 64 ms of work: more would only
/// answer hellos later than their clients' first resend.
const HANDSHAKE_QUEUE: usize = 64;
/// A path challenge is sent again this often until answered (RFC 9000
/// §8.2.1), and a new path that has not answered in [`PATH_GIVE_UP`] is
/// abandoned for the last validated one (§9.3.2).
const PATH_CHALLENGE_EVERY: Duration = Duration::from_millis(500);
const PATH_GIVE_UP: Duration = Duration::from_secs(3);

/// A fresh 32-byte secret (a cookie or token secret) from the server's
/// CSPRNG.
fn draw_secret(random: &mut ChaCha20Rng) -> [u8; 32] {
    let mut secret = [0u8; 32];
    random.fill_bytes(&mut secret);
    secret
}

/// Bytes of reply carried by one fragment to a client of `mss`.
pub fn reply_fragment_len(mss: u32) -> usize {
    (mss as usize)
        .saturating_sub(REPLY_HEADER_LEN)
        .clamp(1, REPLY_FRAGMENT_MAX)
}
/// What the server counts across all connections.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ServerStats {
    pub datagrams: u64,
    /// Not an atou packet, or malformed.
    pub undecodable: u64,
    /// For a connection the server does not have (or from another address).
    pub unknown_connection: u64,
    /// A packet kind a server never receives.
    pub unexpected: u64,
    /// Hellos refused: foreign protocol version.
    pub version_rejects: u64,
    /// Hellos refused: parameters out of range.
    pub bad_hellos: u64,
    /// Hellos turned away: the server is at a limit (connections, windows).
    pub busy_rejects: u64,
    pub connections: u64,
    /// Authenticated handshakes completed (sessions made).
    pub handshakes: u64,
    /// Hellos answered with a cookie (under load, or their source's
    /// budget for hellos without one spent).
    pub cookies_sent: u64,
    /// Datagrams that would have been answered before anyone proved
    /// anything (with a cookie, a reject, a retry, the server's key, a
    /// size-probe ack), left unanswered: their address had been sent its
    /// share that second.
    pub answers_limited: u64,
    /// Protected datagrams opened on a thread beside the protocol's
    /// (`atou serve --open-thread on`), as the I/O layer counts them.
    pub opened_aside: u64,
    /// Hellos worked through with public-key operations (two X25519 to
    /// read one, three more to answer it): at most the per-source and
    /// global budgets ([`ServerLimits::hellos_per_sec`]).
    pub hellos_worked: u64,
    /// Hellos dropped unread: their source, or all sources together, had
    /// spent the budget of public-key operations.
    pub hellos_limited: u64,
    /// Copies of hellos already worked through (replays), dropped after
    /// a lookup.
    pub hellos_seen: u64,
    /// Hellos dropped unread because [`ServerLimits::handshake_queue`]
    /// hellos were already waiting for, or in, their public-key work;
    /// not remembered, so the client's resend is read.
    pub hellos_queue_full: u64,
    /// Hellos whose copies came so fast that the driver was asked to drop
    /// them before reading ([`Server::poll_dropped_hellos`]).
    pub hellos_dropped_unread: u64,
    /// Authenticated clients refused (busy, bad parameters) or, unknown
    /// keys, not answered.
    pub auth_refused: u64,
    /// Handshake messages that did not open or parse (dropped, unanswered).
    pub bad_handshakes: u64,
    /// Plain hellos refused because the server requires authentication.
    pub plain_refused: u64,
    /// Plain hellos without a valid address token answered with a retry
    /// (a token to send the hello again with), nothing kept.
    pub retries_sent: u64,
    /// Path-MTU probes answered with a 24-byte ack (docs/security.md: a
    /// fiftieth of the probe, no state kept).
    pub size_probes_acked: u64,
    /// Datagrams not sent to an address that has not proved it receives:
    /// they would have passed 3× what came from it.
    pub unvalidated_held_back: u64,
    /// Protected datagrams that failed to open (forged, corrupted,
    /// replayed), dropped unanswered.
    pub crypto_dropped: u64,
    /// Connections moved to a new client address (NAT rebinding).
    pub migrations: u64,
    /// New addresses that answered their path challenge.
    pub paths_validated: u64,
    /// New addresses that never answered: the connection went back.
    pub paths_abandoned: u64,
}

/// How a connection ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ConnEnd {
    /// The client closed it.
    Closed,
    /// No packet for `maxidle`.
    Idle,
}

/// One line per connection, like atousrv's report.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct ConnReport {
    /// The connection id the client chose for it.
    pub conn_id: u64,
    /// The file-transfer session, 0 for a probe.
    pub session: u64,
    /// The client's address when the connection ended (after any
    /// migration).
    pub peer: SocketAddr,
    /// Closed by the client, or idle.
    pub end: ConnEnd,
    /// From the hello to the close (or the last packet).
    pub secs: f64,
    /// The receiver's counters (atousrv's): segments and bytes in,
    /// duplicates, out-of-order arrivals, ACKs sent.
    pub stats: ReceiverStats,
    /// Segments the client said it sent, from its close.
    pub client_segments: Option<u64>,
    /// Bytes that were not the test pattern (0 on an intact path).
    pub corrupt_bytes: u64,
    /// The idle limit the connection ran under, in seconds: the client's
    /// `maxidle`, at most 600 (0 asked for counts as 600).
    pub maxidle_secs: f64,
    /// The server-wide counters when this report was made.
    pub server: ServerStats,
}

/// Something for the operator that is not a connection report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    /// A hello in a protocol version this server does not speak.
    VersionRejected {
        /// Where the hello came from.
        peer: SocketAddr,
        /// The version it spoke.
        theirs: u8,
    },
    /// A hello that could not be read (too short, malformed, failing its
    /// handshake).
    BadHello {
        /// Where it came from.
        peer: SocketAddr,
        /// What was wrong with it.
        why: String,
    },
    /// A hello refused because the server is at one of its limits.
    Busy {
        /// Where it came from.
        peer: SocketAddr,
        /// Which limit.
        why: String,
    },
    /// An authenticated client refused.
    AuthRefused {
        /// Where it came from.
        peer: SocketAddr,
        /// The key it proved it holds.
        key: PublicKey,
        /// Why it was refused (not authorized, a replayed hello, ...).
        why: String,
    },
    /// A plain hello to a server that requires authentication.
    PlainRefused {
        /// Where it came from.
        peer: SocketAddr,
    },
    /// One hello's copies arrive faster than any client resends it: its
    /// further copies are dropped before they are read, for a while.
    ReplayDropped {
        /// Where the copies came from.
        peer: SocketAddr,
        /// The connection id the hello names.
        client_id: u64,
        /// Copies seen.
        copies: u32,
    },
    /// A connection moved to a new address.
    Migrated {
        /// Its address before.
        from: SocketAddr,
        /// Its address now.
        to: SocketAddr,
    },
    /// Refusals not shown in the last second (over `NOTICES_PER_SEC`, 10).
    Suppressed {
        /// How many.
        count: u64,
    },
}

impl std::fmt::Display for Notice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Notice::VersionRejected { peer, theirs } => write!(
                f,
                "refused {peer}: it speaks atou protocol version {theirs}, this server speaks {VERSION}"
            ),
            Notice::BadHello { peer, why } => write!(f, "refused {peer}: {why}"),
            Notice::Busy { peer, why } => write!(f, "turned away {peer}: busy ({why})"),
            Notice::AuthRefused { peer, key, why } => write!(
                f,
                "refused {peer} (key {}): {why}",
                crate::proto::crypto::format_public_key(key, "").trim_end()
            ),
            Notice::PlainRefused { peer } => write!(
                f,
                "refused {peer}: an unauthenticated hello, and this server requires keys \
                 (it runs with --authorized-keys; --no-auth would allow plain clients)"
            ),
            Notice::ReplayDropped {
                peer,
                client_id,
                copies,
            } => write!(
                f,
                "a hello (client id {client_id:016x}) came {copies} times in a second, \
                 last from {peer}: a replay; its copies are dropped unread for {} s",
                crate::proto::crypto::replayed::DROP_FOR.as_secs()
            ),
            Notice::Migrated { from, to } => {
                write!(f, "a connection moved from {from} to {to} (authenticated)")
            }
            Notice::Suppressed { count } => {
                write!(f, "{count} more refusals in the last second not shown")
            }
        }
    }
}

/// Stream bytes per data segment for a hello's `mss`, which
/// [`Server::admission`] keeps above the data header's length.
fn payload_size(mss: u32) -> u64 {
    u64::from(mss) - DATA_HEADER_LEN as u64
}

/// Where a segment's payload starts in the stream: its number times the
/// payload size (the header does not carry it). `None` when that or its
/// end overflows, or the length is wrong: only the last segment (FIN) may
/// be short.
fn stream_offset(seg: &crate::proto::wire::DataSegment<'_>, payload_size: u64) -> Option<u64> {
    let len = seg.payload.len() as u64;
    let fits = len == payload_size || (seg.header.flags.fin && len <= payload_size);
    let offset = seg.header.seg.checked_mul(payload_size)?;
    (fits && offset.checked_add(len).is_some()).then_some(offset)
}

/// Something a session connection's application must act on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionEvent {
    /// A hello opened connection `conn_id` in `session`.
    Opened {
        conn_id: u64,
        session: u64,
        peer: SocketAddr,
        /// The client's authenticated key; `None` for a plain connection.
        peer_key: Option<PublicKey>,
        /// Stream bytes per segment, for [`Server::release`].
        payload_size: u64,
    },
    /// Every byte of the connection's stream has arrived; the client now
    /// waits for the reply ([`Server::respond`]).
    Complete { conn_id: u64 },
    /// The connection is gone: closed after its reply, or idle.
    /// `confirmed`: a packet from the client opened under its keys, so
    /// it had the server's response (RFC 9000 §8.1); an unconfirmed one
    /// may have sent its hello (and its early data) over a path whose
    /// answers never reached it. A plain connection counts as confirmed.
    Ended {
        conn_id: u64,
        end: ConnEnd,
        confirmed: bool,
    },
}

/// New stream bytes of a session connection, for its application to place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arrival<'a> {
    pub conn_id: u64,
    pub session: u64,
    pub offset: u64,
    pub payload: &'a [u8],
}

/// Stream bytes that rode an accepted hello (early data), owned: they
/// come out of [`Server::poll_early_arrival`], in their place among the
/// session events (after the connection's `Opened`, before its
/// `Complete`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EarlyArrival {
    pub conn_id: u64,
    pub session: u64,
    pub payload: Vec<u8>,
}

impl EarlyArrival {
    /// As an [`Arrival`] at the stream's start, for the application.
    pub fn as_arrival(&self) -> Arrival<'_> {
        Arrival {
            conn_id: self.conn_id,
            session: self.session,
            offset: 0,
            payload: &self.payload,
        }
    }
}

/// What the session application is told, in order.
#[derive(Debug)]
enum Queued {
    Event(SessionEvent),
    Early(EarlyArrival),
}

/// What a connection is for: a probe (a sink, its data only counted) or
/// a file-transfer session (its data handed to the application). On the
/// wire a hello names it by one id, 0 for a probe; it is decoded once,
/// where a hello is taken in ([`Purpose::of_wire`]), and matched after.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    Probe,
    Session(NonZeroU64),
}

impl Purpose {
    /// The purpose a hello's session id names (0: a probe).
    pub fn of_wire(session: u64) -> Purpose {
        NonZeroU64::new(session).map_or(Purpose::Probe, Purpose::Session)
    }

    /// The session id a hello carries for this purpose.
    pub fn to_wire(self) -> u64 {
        match self {
            Purpose::Probe => 0,
            Purpose::Session(id) => id.get(),
        }
    }
}

#[derive(Debug)]
struct Conn {
    peer: SocketAddr,
    /// The local address the peer's datagrams arrive at, which answers
    /// leave from ([`Server::handle_datagram_at`]); `None`: the kernel's
    /// choice.
    local: Option<IpAddr>,
    purpose: Purpose,
    mss: u32,
    /// The application's answer to the stream, once given.
    reply: Option<Vec<u8>>,
    /// Reply offsets asked for and not yet answered.
    fetches: VecDeque<u32>,
    complete_told: bool,
    receiver: Receiver,
    params: ReceiverParams,
    opened: Time,
    last_heard: Time,
    maxidle: Duration,
    phase: ConnPhase,
    corrupt_bytes: u64,
    /// Receive window held for a session connection, in bytes.
    window_bytes: u64,
    link: Link,
    /// Waiting in the server's [`ReadyQueue`].
    queued: bool,
}

/// Whether a connection is plain or authenticated, with what is true only
/// of that kind: a plain one owes welcomes and may be unvalidated, an
/// authenticated one has keys.
#[derive(Debug)]
enum Link {
    Plain {
        /// Its welcome is to be sent (again, when a repeated hello says
        /// it was lost); an authenticated one's rides in the handshake's
        /// response.
        welcome_pending: bool,
        /// Opened without an address token: what is sent to its address
        /// is held to 3× what came from it (RFC 9000 §8.1).
        unvalidated: Option<Budget>,
    },
    /// Keys and peer of an authenticated connection.
    Secure(Box<ConnSecure>),
}

impl Link {
    fn secure(&self) -> Option<&ConnSecure> {
        match self {
            Link::Secure(s) => Some(s),
            Link::Plain { .. } => None,
        }
    }

    fn secure_mut(&mut self) -> Option<&mut ConnSecure> {
        match self {
            Link::Secure(s) => Some(s),
            Link::Plain { .. } => None,
        }
    }

    fn unvalidated_mut(&mut self) -> Option<&mut Budget> {
        match self {
            Link::Plain { unvalidated, .. } => unvalidated.as_mut(),
            Link::Secure(_) => None,
        }
    }
}

/// Where a connection is in its life: each phase holds what is true only
/// in it, so that no combination of flags can say two things at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ConnPhase {
    /// Admitted, and no data segment yet: a hello that may go nowhere,
    /// forgotten at `expires` (counted from the first hello, not the
    /// last: repeating a hello does not keep a connection that never
    /// sends).
    Hello { expires: Time },
    /// Data has arrived: kept while the client is heard within maxidle.
    Open,
    /// The client closed, having sent `client_segments`: the connection
    /// lingers only to answer repeated closes, and its window is back in
    /// the budget. Data after the close is a late copy; the close said
    /// all was acknowledged.
    Closed {
        at: Time,
        client_segments: u64,
        close_ack_pending: bool,
    },
}

/// An authenticated connection's keys, as its handshake goes on.
enum Keying {
    /// The handshake's response, which makes the keys, is being worked
    /// ([`Server::poll_handshake_work`]) by job `ticket`: the connection
    /// holds its place in the budgets from the moment it is admitted, so
    /// hellos decided meanwhile cannot oversubscribe them, and accepts no
    /// packet (a plain one never, a protected one has nothing to open
    /// it). A late response for a connection that was replaced, re-keyed
    /// by its hello said again, or expired meanwhile installs nothing.
    Awaiting { ticket: u64 },
    /// Keys installed, and no packet from the client opened yet: nothing
    /// but the response goes to it.
    Unconfirmed(SessionKeys),
    /// A packet from the client has opened: its keys are confirmed and
    /// its address validated (RFC 9000 §8.1).
    Confirmed(SessionKeys),
}

impl Keying {
    fn awaits(&self, job: u64) -> bool {
        matches!(self, Keying::Awaiting { ticket } if *ticket == job)
    }

    fn keys_mut(&mut self) -> Option<&mut SessionKeys> {
        match self {
            Keying::Awaiting { .. } => None,
            Keying::Unconfirmed(keys) | Keying::Confirmed(keys) => Some(keys),
        }
    }

    /// A packet from the client opened under the keys. Called for every
    /// packet opened: the keys move only the first time (moving them out
    /// and back each time copied the whole `SessionKeys` twice a datagram).
    fn confirm(&mut self) {
        if !matches!(self, Keying::Unconfirmed(_)) {
            return;
        }
        if let Keying::Unconfirmed(keys) = std::mem::replace(self, Keying::Awaiting { ticket: 0 }) {
            *self = Keying::Confirmed(keys);
        }
    }
}

/// A protected datagram of a keyed connection that passed the checks
/// before opening ([`Server::open_job`]): opening it needs nothing more
/// from the server, so the I/O layer may do it on another thread; then
/// [`Server::handle_opened`] takes it back, in arrival order.
pub(crate) struct OpenJob {
    /// The server's id of the connection (the datagram's recipient id).
    conn_id: u64,
    /// The client's id, which the opened inner packet carries.
    inner_id: u64,
    /// Its packet number, read before opening rewrites the header.
    pn: u64,
    ticket: OpenTicket,
}

impl OpenJob {
    /// Opens the datagram in place (the AEAD): where its inner packet now
    /// is, or the failed tag. Pure: the server learns the outcome in
    /// [`Server::handle_opened`].
    pub(crate) fn open(&self, datagram: &mut [u8]) -> Result<std::ops::Range<usize>, BadTag> {
        frame::open_with(&self.ticket, self.inner_id, datagram)
    }
}

/// What [`Server::open_job`] made of a datagram.
pub(crate) enum Opening {
    /// Open it (anywhere), then hand it to [`Server::handle_opened`].
    Job(OpenJob),
    /// Refused before opening, and counted: nothing more to do.
    Dropped,
    /// Not one to open elsewhere: [`Server::handle_datagram`] it.
    Whole,
}

/// An authenticated connection's keys and peer.
struct ConnSecure {
    keys: Keying,
    peer_key: PublicKey,
    /// The client's id for the connection: what its packets carry inside,
    /// and the recipient id of everything sent to it.
    client_id: u64,
    /// Largest packet number opened: only a packet newer than all before
    /// it may move the connection (a reordered old one must not).
    largest_pn: Option<u64>,
    /// A new address being validated (RFC 9000 §8.2, §9).
    path: Option<PathCheck>,
    /// Its hello's early segment was taken.
    early: Option<EarlyData>,
    /// A response was made and its application told `Opened`: until its
    /// keys are confirmed, its hello said again re-keys it in place
    /// ([`Server::answered_conn`]); it is never replaced.
    answered: bool,
}

/// A request that rode an accepted hello.
struct EarlyData {
    /// The data packet, until it is placed: once the response goes out
    /// ([`Server::take_early`]), so never before the table that refuses
    /// the hello's replay is saved.
    segment: Option<Vec<u8>>,
    /// Until the client confirms its keys (RFC 9000 §8.1): what goes to
    /// it, the response included, is at most 3× its hello.
    budget: Budget,
}

struct SessionKeys {
    sealer: Sealer,
    opener: Opener,
}

/// A client's new address, on probation: what is sent there is held to
/// 3× what came from it (RFC 9000 §9.3) until it echoes `token`.
struct PathCheck {
    token: u64,
    budget: Budget,
    /// The last address that was validated, to return to if this one
    /// never answers, and the local address it reached this server at.
    fallback: SocketAddr,
    fallback_local: Option<IpAddr>,
    started: Time,
    /// When to send the challenge (again).
    challenge_at: Time,
}

impl std::fmt::Debug for ConnSecure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnSecure")
            .field("peer_key", &self.peer_key)
            .field("client_id", &self.client_id)
            .field("confirmed", &matches!(self.keys, Keying::Confirmed(_)))
            .field("keyed", &!matches!(self.keys, Keying::Awaiting { .. }))
            .finish_non_exhaustive()
    }
}

/// What a hello was granted, before its connection exists.
struct Admission {
    params: ReceiverParams,
    window_bytes: u64,
    maxidle: Duration,
}

/// What [`Server::decide_hello`] made of an authenticated hello, beside
/// the decision it gives the handshake: what was admitted if it was, and
/// why it was refused if it was, for the operator.
#[derive(Default)]
struct Verdict {
    admitted: Option<(Hello, Admission)>,
    /// The hello's early segment, taken (a data packet).
    early: Option<Vec<u8>>,
    why: String,
}

/// A hello's public-key work, handed out by
/// [`Server::poll_handshake_work`]: the X25519 operations of one Noise
/// message and nothing of the server's state but its key, so it can run
/// on any thread; its result goes back through
/// [`Server::handshake_done`].
#[derive(Debug)]
pub struct HandshakeWork {
    ticket: u64,
    job: Job,
}

#[derive(Debug)]
enum Job {
    /// Read the hello (two X25519).
    Open(handshake::HelloWork),
    /// Make the response (three X25519 and the split).
    Respond(handshake::ResponseWork),
}

impl HandshakeWork {
    /// Does the work: pure, the same result on any thread.
    pub fn run(self) -> HandshakeDone {
        let outcome = match self.job {
            Job::Open(work) => Outcome::Opened(work.open()),
            Job::Respond(work) => Outcome::Responded(work.respond()),
        };
        HandshakeDone {
            ticket: self.ticket,
            outcome,
        }
    }
}

/// The result of a [`HandshakeWork`], for [`Server::handshake_done`].
#[derive(Debug)]
pub struct HandshakeDone {
    ticket: u64,
    outcome: Outcome,
}

#[derive(Debug)]
enum Outcome {
    Opened(Result<handshake::OpenedHello, HandshakeError>),
    Responded(Result<handshake::Reply, HandshakeError>),
}

/// What the server keeps of a job while it is out.
#[derive(Debug)]
enum InFlight {
    Open {
        from: SocketAddr,
        local: Option<IpAddr>,
        hello_len: usize,
    },
    Respond {
        from: SocketAddr,
        local: Option<IpAddr>,
        hello_len: usize,
        /// The connection waiting for the keys, if the hello was accepted.
        conn: Option<u64>,
        /// Why it was refused, for the operator.
        why: String,
    },
}

/// Where a datagram goes, by its header alone.
enum Route {
    Undecodable,
    /// A hello or key query of another version: answered with ours.
    ForeignVersion,
    /// A Noise hello.
    SecureHello,
    /// A query for the server's public key.
    KeyQuery,
    /// A packet of this version, plain or protected.
    Packet,
}

fn route(peek: &HeaderPeek) -> Route {
    let handshake_kind =
        peek.kind == handshake::KIND_HELLO || peek.kind == handshake::KIND_KEY_QUERY;
    if peek.version != VERSION {
        return if peek.is_hello() || handshake_kind {
            Route::ForeignVersion
        } else {
            Route::Undecodable
        };
    }
    if peek.kind == handshake::KIND_HELLO {
        Route::SecureHello
    } else if peek.kind == handshake::KIND_KEY_QUERY {
        Route::KeyQuery
    } else {
        Route::Packet
    }
}

/// Nothing to send for a connection's packet: it was dropped (and
/// counted where it was), or needs no answer.
struct NothingToSend;

/// What a connection has to send next.
enum Next {
    Packet(usize),
    /// Nothing this time; ask again.
    Skip,
    /// Nothing until something happens.
    Idle,
}

impl Conn {
    fn payload_size(&self) -> u64 {
        payload_size(self.mss)
    }

    /// Plain, or authenticated with its keys installed.
    /// Whether a packet from the client opened under its keys (a plain
    /// connection has none: counted as confirmed).
    fn confirmed(&self) -> bool {
        self.link
            .secure()
            .is_none_or(|s| matches!(s.keys, Keying::Confirmed(_)))
    }

    fn keyed(&self) -> bool {
        self.link
            .secure()
            .is_none_or(|s| !matches!(s.keys, Keying::Awaiting { .. }))
    }

    /// What its application is told of a session connection opened.
    fn opened_event(&self, conn_id: u64, session: NonZeroU64) -> SessionEvent {
        SessionEvent::Opened {
            conn_id,
            session: session.get(),
            peer: self.peer,
            peer_key: self.link.secure().map(|s| s.peer_key),
            payload_size: self.payload_size(),
        }
    }

    /// Writes the connection's next packet (cleartext) into `buf`.
    fn next_inner(&mut self, conn_id: u64, granted_rcvbuf: u32, now: Time, buf: &mut [u8]) -> Next {
        let packet = |r: Result<usize, _>| r.map_or(Next::Skip, Next::Packet);
        if let Link::Plain {
            welcome_pending: pending @ true,
            ..
        } = &mut self.link
        {
            *pending = false;
            let welcome = Welcome {
                conn_id,
                receiver: ReceiverParams {
                    rcvbuf: granted_rcvbuf,
                    ..self.params
                },
            };
            return packet(welcome.emit(buf));
        }
        if let Some(n) = self.receiver.poll_transmit(now, buf) {
            return Next::Packet(n);
        }
        if let Some(offset) = self.fetches.pop_front() {
            let reply = match &self.reply {
                None => {
                    // One "not yet" answers every fetch queued.
                    self.fetches.clear();
                    Reply::Pending { conn_id }
                }
                Some(bytes) => {
                    let total = u32::try_from(bytes.len()).unwrap_or(u32::MAX);
                    let start = (offset as usize).min(bytes.len());
                    let end = (start + reply_fragment_len(self.mss)).min(bytes.len());
                    if start == end && total != 0 {
                        return Next::Skip;
                    }
                    Reply::Fragment {
                        conn_id,
                        offset,
                        total,
                        data: &bytes[start..end],
                    }
                }
            };
            return packet(reply.emit(buf));
        }
        if let ConnPhase::Closed {
            close_ack_pending: pending @ true,
            ..
        } = &mut self.phase
        {
            *pending = false;
            let ack = CloseAck {
                conn_id,
                stats: *self.receiver.stats(),
            };
            return packet(ack.emit(buf));
        }
        Next::Idle
    }

    fn deadline(&self) -> Time {
        match self.phase {
            ConnPhase::Hello { expires } => expires,
            ConnPhase::Open => self.last_heard + self.maxidle,
            ConnPhase::Closed { at, .. } => self.last_heard.max(at) + LINGER,
        }
    }

    fn is_closed(&self) -> bool {
        matches!(self.phase, ConnPhase::Closed { .. })
    }

    fn poll_timeout(&self) -> Time {
        let d = self.deadline();
        let d = match self.link.secure().and_then(|s| s.path.as_ref()) {
            Some(c) => d.min(c.challenge_at).min(c.started + PATH_GIVE_UP),
            None => d,
        };
        self.receiver.poll_timeout().map_or(d, |t| t.min(d))
    }

    fn report(&self, conn_id: u64, end: ConnEnd, until: Time, server: ServerStats) -> ConnReport {
        ConnReport {
            conn_id,
            session: self.purpose.to_wire(),
            peer: self.peer,
            end,
            secs: until.saturating_since(self.opened).as_secs_f64(),
            stats: *self.receiver.stats(),
            client_segments: match self.phase {
                ConnPhase::Closed {
                    client_segments, ..
                } => Some(client_segments),
                _ => None,
            },
            corrupt_bytes: self.corrupt_bytes,
            maxidle_secs: self.maxidle.as_secs_f64(),
            server,
        }
    }
}

/// Connections with something to send, served in turn. Whether one waits
/// here already is its own [`Conn::queued`] flag, so a datagram's enqueue
/// costs the one lookup of its connection.
#[derive(Debug, Default)]
struct ReadyQueue {
    order: VecDeque<u64>,
}

impl ReadyQueue {
    fn push(&mut self, conn: &mut Conn, conn_id: u64) {
        if !conn.queued {
            conn.queued = true;
            self.order.push_back(conn_id);
        }
    }

    fn front(&self) -> Option<u64> {
        self.order.front().copied()
    }

    fn pop_front(&mut self) {
        self.order.pop_front();
    }
}

/// Bounds on what a client may ask for: the operator's budgets. Built
/// from [`ServerLimits::default`] and its setters, one per budget.
#[derive(Debug, Clone, Copy)]
pub struct ServerLimits {
    pub(crate) max_rcvsegs: u32,
    pub(crate) max_connections: usize,
    pub(crate) max_connections_per_ip: usize,
    pub(crate) max_window_bytes: u64,
    pub(crate) total_window_bytes: u64,
    pub(crate) hello_idle: Duration,
    pub(crate) max_socket_rcvbuf: u32,
    pub(crate) hellos_per_sec_per_source: u32,
    pub(crate) hello_burst_per_source: u32,
    pub(crate) hellos_per_sec: u32,
    pub(crate) max_rate_sources: usize,
    pub(crate) unvalidated_plain: usize,
    pub(crate) replay_floor_ns: u64,
    pub(crate) replayed_copies_before_drop: u32,
    pub(crate) handshake_queue: usize,
}

impl ServerLimits {
    /// Largest receiver buffer granted to one connection, in segments.
    /// Default: 2^20.
    #[must_use]
    pub fn max_rcvsegs(mut self, segments: u32) -> Self {
        self.max_rcvsegs = segments;
        self
    }

    /// Most connections open at once. Default: 1024.
    #[must_use]
    pub fn max_connections(mut self, connections: usize) -> Self {
        self.max_connections = connections;
        self
    }

    /// Most connections open at once from one IP address. Default: 64.
    #[must_use]
    pub fn max_connections_per_ip(mut self, connections: usize) -> Self {
        self.max_connections_per_ip = connections;
        self
    }

    /// Largest receive window of one session connection, in bytes: what
    /// its application may have to hold for it. Default: 64 MiB.
    #[must_use]
    pub fn max_window_bytes(mut self, bytes: u64) -> Self {
        self.max_window_bytes = bytes;
        self
    }

    /// All session connections' windows together, in bytes. Default: 1 GiB.
    #[must_use]
    pub fn total_window_bytes(mut self, bytes: u64) -> Self {
        self.total_window_bytes = bytes;
        self
    }

    /// A connection that has sent no data expires after this long.
    /// Default: 10 s.
    #[must_use]
    pub fn hello_idle(mut self, idle: Duration) -> Self {
        self.hello_idle = idle;
        self
    }

    /// The socket receive buffer is never grown past this many bytes,
    /// whatever a hello asks (the operator's own setting). Default: 8 MiB.
    #[must_use]
    pub fn max_socket_rcvbuf(mut self, bytes: u32) -> Self {
        self.max_socket_rcvbuf = bytes;
        self
    }

    /// Hellos one source (an IPv4 address, an IPv6 /64) may have
    /// public-key operations spent on, a second; past its budget its
    /// hellos are dropped unread. A hello that makes a session gives its
    /// token back, so a client's parallel streams are never held back.
    /// Default: 20.
    #[must_use]
    pub fn hellos_per_sec_per_source(mut self, hellos: u32) -> Self {
        self.hellos_per_sec_per_source = hellos;
        self
    }

    /// The same source's hellos at once (its bucket's size). Default: 5.
    #[must_use]
    pub fn hello_burst_per_source(mut self, hellos: u32) -> Self {
        self.hello_burst_per_source = hellos;
        self
    }

    /// Hellos a second from all sources together (at once: a quarter
    /// second's worth), however many addresses a flood comes from.
    /// Default: 1000.
    #[must_use]
    pub fn hellos_per_sec(mut self, hellos: u32) -> Self {
        self.hellos_per_sec = hellos;
        self
    }

    /// Sources whose budget is tracked at once; a new one past this takes
    /// the place of the one with the fullest bucket. Default: 4096.
    #[must_use]
    pub fn max_rate_sources(mut self, sources: usize) -> Self {
        self.max_rate_sources = sources;
        self
    }

    /// Plain connections opened without an address token that may be
    /// open at once, each held to 3× what its address sent. Default: 0,
    /// a plain hello must carry a valid token (RFC 9000 §8.1.2's Retry,
    /// one round trip more) and nothing is kept for one that does not,
    /// so spoofed hellos hold no slot and can make the server send
    /// nothing larger than they are.
    #[must_use]
    pub fn unvalidated_plain(mut self, connections: usize) -> Self {
        self.unvalidated_plain = connections;
        self
    }

    /// Authenticated hellos timestamped before this (wall-clock
    /// nanoseconds since the Unix epoch) are refused: a server whose key
    /// outlives it sets its start, less a skew for clients whose clocks
    /// are a little behind, so that a hello captured before a restart is
    /// not accepted once more. Default: 0, none (a server whose key is
    /// made for its one run needs none). A server that also keeps its
    /// hello timestamps ([`Server::keeping_hello_timestamps`]) refuses
    /// the hellos of the 2 minutes before its start too, for the keys in
    /// its table; the floor covers the rest
    /// (`Responder::with_timestamp_floor` says which).
    #[must_use]
    pub fn replay_floor_ns(mut self, wall_clock_ns: u64) -> Self {
        self.replay_floor_ns = wall_clock_ns;
        self
    }

    /// Copies of one hello within a second after which its further copies
    /// are dropped before they are read (`proto::crypto::replayed`).
    /// Default: 64; 0: never.
    #[must_use]
    pub fn replayed_copies_before_drop(mut self, copies: u32) -> Self {
        self.replayed_copies_before_drop = copies;
        self
    }

    /// Hellos whose public-key work may be outstanding at once (handed
    /// out by [`Server::poll_handshake_work`] and not yet given back); a
    /// hello past this is dropped and counted
    /// (`ServerStats::hellos_queue_full`). At least 1 (0 counts as 1).
    /// Default: 64.
    #[must_use]
    pub fn handshake_queue(mut self, hellos: usize) -> Self {
        self.handshake_queue = hellos.max(1);
        self
    }
}

/// The [`ServerLimits::replay_floor_ns`] of a server started at
/// `wall_clock_ns`: its start less [`handshake::RESTART_SKEW`], for clients
/// whose clocks are a little behind.
pub fn replay_floor(wall_clock_ns: u64) -> u64 {
    wall_clock_ns.saturating_sub(handshake::RESTART_SKEW.as_nanos() as u64)
}

impl Default for ServerLimits {
    fn default() -> Self {
        ServerLimits {
            max_rcvsegs: 1 << 20,
            max_connections: 1024,
            max_connections_per_ip: 64,
            max_window_bytes: 64 << 20,
            total_window_bytes: 1 << 30,
            hello_idle: Duration::from_secs(10),
            max_socket_rcvbuf: 8 << 20,
            hellos_per_sec_per_source: HELLOS_PER_SEC_PER_SOURCE,
            hello_burst_per_source: HELLO_BURST_PER_SOURCE,
            hellos_per_sec: 1000,
            max_rate_sources: 4096,
            unvalidated_plain: 0,
            replay_floor_ns: 0,
            replayed_copies_before_drop: replayed::DEFAULT_COPIES_BEFORE_DROP,
            handshake_queue: HANDSHAKE_QUEUE,
        }
    }
}

/// An accepted hello's response held until the table of hello timestamps
/// is saved: to whom, from which local address, the datagram, and the
/// connection it opens.
type HeldResponse = (SocketAddr, Option<IpAddr>, Vec<u8>, u64);

/// The listening endpoint, sans I/O: address validation, handshakes and
/// every connection's receiving stream, within its [`ServerLimits`].
#[derive(Debug)]
pub struct Server {
    limits: ServerLimits,
    auth: ServerAuth,
    /// The handshake's server side, when the server has a key.
    responder: Option<Responder>,
    /// Handshake answers (responses, cookie replies) to send.
    handshake_out: VecDeque<(SocketAddr, Option<IpAddr>, Vec<u8>)>,
    /// Authenticated hellos worked through in the current second.
    hello_second: Time,
    hellos_this_second: u32,
    /// The price of public-key operations, per source and in all.
    rate: RateLimiter,
    /// Answers before any proof each address may still be sent
    /// ([`Server::may_answer_unproven`]).
    unproven_answers: Buckets<SocketAddr>,
    /// Hellos replayed in bulk, whose copies the driver drops unread.
    replayed: ReplayedHellos,
    /// The driver runs the handshakes' public-key work
    /// ([`Server::offload_handshakes`]); otherwise the server runs it
    /// itself before each call returns.
    offload: bool,
    /// Public-key work not yet handed out.
    handshake_work: VecDeque<HandshakeWork>,
    /// Every job handed out or waiting, by ticket, with what its result
    /// needs: at most [`ServerLimits::handshake_queue`].
    in_flight: HashMap<u64, InFlight>,
    next_ticket: u64,
    /// Every random number the server uses once running: connection
    /// ids, path challenges, cookie and token secrets. A CSPRNG seeded
    /// once, from the OS by [`Server::new`] or from the caller by
    /// [`Server::with_seed`], so that handling datagrams never asks the
    /// OS and a run fed the same seed and datagrams is the same run.
    /// `None` if the OS random generator failed: then no token is valid
    /// and no key can be served.
    random: Option<ChaCha20Rng>,
    /// The secret of plain hellos' address tokens (`None` without
    /// `random`).
    tokens: Option<CookieSecret>,
    tokens_rotated: Time,
    /// Retries to send: bounded like the rejects.
    retries: VecDeque<(SocketAddr, Option<IpAddr>, Retry)>,
    /// Acks owed to path-MTU probes, bounded as the rejects are.
    size_acks: VecDeque<(SocketAddr, Option<IpAddr>, SizeAck)>,
    /// Plain connections open without an address token.
    unvalidated: usize,
    cookie_rotated: Time,
    conns: HashMap<u64, Conn>,
    ready: ReadyQueue,
    rejects: VecDeque<(SocketAddr, Option<IpAddr>, Reject)>,
    /// The local address the datagram being handled arrived at (or the
    /// hello whose handshake result is being handled): where every
    /// answer queued meanwhile, and a connection opened or moved, leaves
    /// from. On a host with several addresses the kernel would pick the
    /// source by route, and a client that sent to another address of this
    /// host (an alias, a second interface) drops what comes from the
    /// wrong one: its socket is connected.
    answering_at: Option<IpAddr>,
    reports: VecDeque<ConnReport>,
    notices: VecDeque<Notice>,
    session_events: VecDeque<Queued>,
    /// Behaves as a server from before early data (its hello decoder
    /// wants a hello's exact length), for the tests of the fallback.
    #[cfg(test)]
    without_early: bool,
    stats: ServerStats,
    /// Largest receive buffer set on the socket so far, in the bytes
    /// asked for (the server's own setting, then clients' hellos).
    largest_rcvbuf_asked: u32,
    /// A larger size a hello asked for, not yet set on the socket.
    pending_rcvbuf: Option<u32>,
    /// What the kernel reports for the socket (Linux: twice the size set,
    /// capped), passed on in welcomes.
    granted_rcvbuf: u32,
    /// Session windows granted and not yet given back, in bytes.
    windows_held: u64,
    /// Open connections and session windows held, per IP address.
    per_ip: HashMap<std::net::IpAddr, (usize, u64)>,
    /// Notices told in the current second, and refusals not told.
    notice_second: Time,
    notices_told: u32,
    notices_suppressed: u64,
    /// The driver keeps hello timestamps across restarts.
    keeping_timestamps: bool,
    /// What the run before remembered, for a responder not made yet.
    remembered_hellos: Vec<(PublicKey, u64)>,
    /// The responder's table changed since the driver last saved it.
    timestamps_unsaved: bool,
    /// Responses to accepted hellos (to, datagram, connection) held until
    /// the table that refuses their replay is saved.
    held_responses: Vec<HeldResponse>,
    /// Responses waiting for the save in progress (the driver's), taken
    /// from `held_responses` when its table was.
    saving: Option<Vec<HeldResponse>>,
    /// The table changed since the save in progress took it.
    changed_since_taken: bool,
}

impl Server {
    /// A server whose socket was given `rcvbuf_set` bytes of receive
    /// buffer, which the kernel reports as `rcvbuf_granted`.
    pub fn new(limits: ServerLimits, rcvbuf_set: u32, rcvbuf_granted: u32) -> Server {
        let mut seed = [0u8; 32];
        let os = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut seed);
        let server = Server::unseeded(limits, rcvbuf_set, rcvbuf_granted);
        match os {
            Ok(()) => server.with_seed(seed),
            Err(_) => server,
        }
    }

    /// The server's randomness comes from `seed` (32 bytes from a
    /// CSPRNG, or a simulation's seed): its connection ids, path
    /// challenges and cookie and token secrets. Before
    /// [`with_auth`](Self::with_auth), which draws the responder's
    /// cookie secret.
    pub(crate) fn with_seed(mut self, seed: [u8; 32]) -> Server {
        let mut random = ChaCha20Rng::from_seed(seed);
        self.tokens = Some(CookieSecret::new(draw_secret(&mut random)));
        self.random = Some(random);
        self
    }

    fn unseeded(limits: ServerLimits, rcvbuf_set: u32, rcvbuf_granted: u32) -> Server {
        Server {
            limits,
            auth: ServerAuth::plain(),
            responder: None,
            handshake_out: VecDeque::new(),
            hello_second: Time::ZERO,
            hellos_this_second: 0,
            rate: RateLimiter::new(
                Rate::new(
                    limits.hellos_per_sec_per_source,
                    limits.hello_burst_per_source,
                ),
                Rate::new(limits.hellos_per_sec, (limits.hellos_per_sec / 4).max(1)),
                limits.max_rate_sources,
            ),
            unproven_answers: Buckets::new(
                Rate::new(UNPROVEN_ANSWERS_PER_SEC, UNPROVEN_ANSWERS_BURST),
                limits.max_rate_sources,
            ),
            replayed: ReplayedHellos::new(limits.replayed_copies_before_drop),
            offload: false,
            handshake_work: VecDeque::new(),
            in_flight: HashMap::new(),
            next_ticket: 0,
            random: None,
            tokens: None,
            tokens_rotated: Time::ZERO,
            retries: VecDeque::new(),
            size_acks: VecDeque::new(),
            unvalidated: 0,
            cookie_rotated: Time::ZERO,
            conns: HashMap::new(),
            ready: ReadyQueue::default(),
            rejects: VecDeque::new(),
            answering_at: None,
            reports: VecDeque::new(),
            notices: VecDeque::new(),
            session_events: VecDeque::new(),
            stats: ServerStats::default(),
            largest_rcvbuf_asked: rcvbuf_set,
            pending_rcvbuf: None,
            granted_rcvbuf: rcvbuf_granted,
            windows_held: 0,
            per_ip: HashMap::new(),
            notice_second: Time::ZERO,
            notices_told: 0,
            notices_suppressed: 0,
            keeping_timestamps: false,
            remembered_hellos: Vec::new(),
            timestamps_unsaved: false,
            held_responses: Vec::new(),
            saving: None,
            changed_since_taken: false,
            #[cfg(test)]
            without_early: false,
        }
    }

    /// Serves authenticated clients as `auth` says: hellos
    /// become Noise IK handshakes under the server's key, and every packet
    /// of such a connection is sealed. Plain hellos are served only if
    /// `auth.allow_plain`.
    pub fn with_auth(mut self, auth: ServerAuth) -> Result<Server, HandshakeError> {
        self.responder = match &auth.identity {
            Some(id) => {
                let random = self.random.as_mut().ok_or_else(|| {
                    HandshakeError::Noise("the OS random generator failed".into())
                })?;
                let cookies = CookieSecret::new(draw_secret(random));
                Some(
                    Responder::new(id.clone(), cookies)
                        .with_timestamp_floor(self.limits.replay_floor_ns)
                        .with_remembered(std::mem::take(&mut self.remembered_hellos)),
                )
            }
            None => None,
        };
        self.auth = auth;
        Ok(self)
    }

    /// The driver keeps the responder's hello timestamps across restarts
    /// (WireGuard keeps them in memory, whitepaper §5.1; a restart would
    /// forget them): the responder starts from `remembered`, what the run
    /// before saved, and from now on each accepted hello's response is
    /// held until the driver has saved the table again
    /// ([`hello_timestamps_to_save`](Self::hello_timestamps_to_save)).
    /// Before or after [`with_auth`](Self::with_auth); a server without
    /// a key has no table and holds nothing.
    pub fn keeping_hello_timestamps(mut self, remembered: Vec<(PublicKey, u64)>) -> Server {
        self.keeping_timestamps = true;
        match self.responder.take() {
            Some(r) => self.responder = Some(r.with_remembered(remembered)),
            None => self.remembered_hellos = remembered,
        }
        self
    }

    /// When responses are held for it, the table of hello timestamps to
    /// save (each key, the newest hello accepted from it; at most
    /// 65,536 keys by default). Call after handling
    /// datagrams and before [`poll_transmit`](Self::poll_transmit), save
    /// it where the next run will find it (durably: a restart after a
    /// crash must find it too), then call
    /// [`hello_timestamps_saved`](Self::hello_timestamps_saved). One save
    /// covers every hello handled since the last, and one is in progress
    /// at a time: until it is reported, `None`. The save may take as long
    /// as it takes (a driver runs it on another thread): only the
    /// responses it covers wait for it.
    pub fn hello_timestamps_to_save(&mut self) -> Option<Vec<(PublicKey, u64)>> {
        if self.saving.is_some() || self.held_responses.is_empty() {
            return None;
        }
        let table = self.responder.as_ref()?.remembered().collect();
        self.saving = Some(std::mem::take(&mut self.held_responses));
        self.changed_since_taken = false;
        Some(table)
    }

    /// The table from [`hello_timestamps_to_save`](Self::hello_timestamps_to_save)
    /// is saved (`true`): the responses it covers go out. Or it could not
    /// be (`false`): they never do, and their connections end at once
    /// (reported as idle, as one that never heard from its client), since
    /// after a restart their hellos could be replayed; the clients time
    /// out. The next accepted hello tries the save again. Responses held
    /// while the save was in progress wait for the next one.
    pub fn hello_timestamps_saved(&mut self, saved: bool) {
        let held = self.saving.take().unwrap_or_default();
        self.timestamps_unsaved = !saved || self.changed_since_taken;
        for (to, local, datagram, conn_id) in held {
            if saved {
                self.answering_at = local;
                self.queue_handshake(to, datagram);
                self.take_early(conn_id);
                continue;
            }
            self.end_unheard(conn_id);
        }
    }

    /// Ends connection `conn_id` before its client was heard under its
    /// keys: reported as idle, and its application, told `Opened`, told
    /// `Ended`.
    fn end_unheard(&mut self, conn_id: u64) {
        let Some(conn) = self.remove_conn(conn_id) else {
            return;
        };
        self.reports
            .push_back(conn.report(conn_id, ConnEnd::Idle, conn.last_heard, self.stats));
        if let Purpose::Session(_) = conn.purpose {
            self.session_events
                .push_back(Queued::Event(SessionEvent::Ended {
                    conn_id,
                    end: ConnEnd::Idle,
                    confirmed: false,
                }));
        }
    }

    /// Queues a handshake answer; bounded like the rejects, by what
    /// arrived since the last drain.
    fn queue_handshake(&mut self, to: SocketAddr, bytes: Vec<u8>) {
        if self.handshake_out.len() < FETCH_QUEUE_MAX {
            self.handshake_out.push_back((to, self.answering_at, bytes));
        }
    }

    /// The server's public key, if it has one.
    pub(crate) fn public_key(&self) -> Option<PublicKey> {
        self.responder.as_ref().map(Responder::public)
    }

    /// Queues a notice for the operator, at most [`NOTICES_PER_SEC`] a
    /// second; the rest are counted and reported as one line.
    fn notice(&mut self, now: Time, notice: Notice) {
        if now.saturating_since(self.notice_second) >= Duration::from_secs(1) {
            if self.notices_suppressed > 0 {
                self.notices.push_back(Notice::Suppressed {
                    count: self.notices_suppressed,
                });
            }
            self.notice_second = now;
            self.notices_told = 0;
            self.notices_suppressed = 0;
        }
        if self.notices_told < NOTICES_PER_SEC {
            self.notices_told += 1;
            self.notices.push_back(notice);
        } else {
            self.notices_suppressed += 1;
        }
    }

    /// Takes a connection out, giving back what it held.
    fn remove_conn(&mut self, conn_id: u64) -> Option<Conn> {
        let conn = self.conns.remove(&conn_id)?;
        if let Link::Plain {
            unvalidated: Some(_),
            ..
        } = conn.link
        {
            self.unvalidated -= 1;
        }
        self.windows_held = self.windows_held.saturating_sub(conn.window_bytes);
        if let Some((n, bytes)) = self.per_ip.get_mut(&conn.peer.ip()) {
            *n -= 1;
            *bytes = bytes.saturating_sub(conn.window_bytes);
            if *n == 0 {
                self.per_ip.remove(&conn.peer.ip());
            }
        }
        Some(conn)
    }

    /// Session windows granted and not given back, in bytes.
    #[cfg(any(feature = "internals", fuzzing))]
    pub fn windows_held(&self) -> u64 {
        self.windows_held
    }

    /// The server-wide counters so far: hellos, refusals, drops, budgets
    /// hit.
    pub fn stats(&self) -> &ServerStats {
        &self.stats
    }

    /// Sources whose budget of public-key operations is tracked now (at
    /// most [`ServerLimits::max_rate_sources`]).
    #[cfg(any(feature = "internals", fuzzing))]
    pub fn rate_sources_tracked(&self) -> usize {
        self.rate.tracked()
    }

    /// Connections held now, from a welcomed hello to their end.
    #[cfg(any(feature = "internals", fuzzing))]
    pub fn open_connections(&self) -> usize {
        self.conns.len()
    }

    /// A socket receive buffer larger than any set before, asked for by a
    /// hello; the I/O layer sets it and calls [`Server::set_socket_rcvbuf`]
    /// before draining transmits, so the welcome reports the result. Each
    /// size is asked for once: a kernel that capped it would cap it again.
    pub(crate) fn wanted_rcvbuf(&self) -> Option<u32> {
        self.pending_rcvbuf
    }

    /// Records what the kernel reports after the socket was resized.
    pub(crate) fn set_socket_rcvbuf(&mut self, granted: u32) {
        self.granted_rcvbuf = granted;
        self.pending_rcvbuf = None;
    }

    fn enqueue(&mut self, conn_id: u64) {
        if let Some(conn) = self.conns.get_mut(&conn_id) {
            self.ready.push(conn, conn_id);
        }
    }

    /// Handles one datagram from `from`. New data of a session connection
    /// is returned for the application to place; a probe's is only counted
    /// and checked against the test pattern.
    ///
    /// A protected datagram is opened in place, in `datagram`.
    pub fn handle_datagram<'a>(
        &mut self,
        now: Time,
        from: SocketAddr,
        datagram: &'a mut [u8],
    ) -> Option<Arrival<'a>> {
        self.handle_datagram_at(now, from, None, datagram)
    }

    /// [`Server::handle_datagram`] for a datagram that arrived at `local`,
    /// an address of this host (IP_PKTINFO on a socket bound to a
    /// wildcard): the answers to it, and a connection it opens or moves,
    /// leave from there ([`Server::poll_transmit_from`]).
    pub(crate) fn handle_datagram_at<'a>(
        &mut self,
        now: Time,
        from: SocketAddr,
        local: Option<IpAddr>,
        datagram: &'a mut [u8],
    ) -> Option<Arrival<'a>> {
        self.answering_at = local;
        self.stats.datagrams += 1;
        let Some(peek) = HeaderPeek::read(datagram) else {
            self.stats.undecodable += 1;
            return None;
        };
        match route(&peek) {
            Route::Undecodable => self.stats.undecodable += 1,
            Route::ForeignVersion => self.on_foreign_version(now, from, &peek),
            Route::SecureHello => self.on_secure_hello(now, from, datagram),
            Route::KeyQuery => self.on_key_query(now, from, peek.conn_id, datagram),
            Route::Packet => return self.on_packet(now, from, peek.conn_id, datagram),
        }
        None
    }

    /// Counts `datagrams` handed to another thread to be opened.
    pub(crate) fn opened_aside(&mut self, datagrams: u64) {
        self.stats.opened_aside += datagrams;
    }

    /// The first half of [`Server::handle_datagram`] for a batch opened
    /// elsewhere: a protected datagram of a keyed connection gets its
    /// checks before opening here (in arrival order) and comes back as a
    /// job; one refused there is counted and dropped; anything else is to
    /// be handled whole, in its turn.
    pub(crate) fn open_job(&mut self, datagram: &[u8]) -> Opening {
        let Some(peek) = HeaderPeek::read(datagram) else {
            return Opening::Whole;
        };
        if !matches!(route(&peek), Route::Packet) || !frame::is_protected(datagram) {
            return Opening::Whole;
        }
        self.stats.datagrams += 1;
        match self.open_ticket(peek.conn_id, datagram) {
            Some(job) => Opening::Job(job),
            None => Opening::Dropped,
        }
    }

    /// The second half: `job`'s datagram from `from`, `opened` (or not)
    /// in place, handled as [`Server::handle_datagram`] would have.
    pub(crate) fn handle_opened<'a>(
        &mut self,
        now: Time,
        from: SocketAddr,
        local: Option<IpAddr>,
        datagram: &'a mut [u8],
        job: OpenJob,
        opened: Result<std::ops::Range<usize>, BadTag>,
    ) -> Option<Arrival<'a>> {
        self.answering_at = local;
        let conn_id = job.conn_id;
        let len = datagram.len();
        let inner = self.settle_open(now, from, job, opened, len)?;
        let datagram: &'a [u8] = datagram;
        self.on_inner(now, from, conn_id, &datagram[inner], true, len)
    }

    /// A hello or key query of another version: answered with ours.
    fn on_foreign_version(&mut self, now: Time, from: SocketAddr, peek: &HeaderPeek) {
        self.stats.version_rejects += 1;
        self.notice(
            now,
            Notice::VersionRejected {
                peer: from,
                theirs: peek.version,
            },
        );
        self.reject(now, from, peek.conn_id, RejectReason::UnsupportedVersion);
    }

    fn on_key_query(&mut self, now: Time, from: SocketAddr, client_id: u64, datagram: &[u8]) {
        match self
            .public_key()
            .and_then(|key| handshake::answer_key_query(datagram, &key))
        {
            Some(answer) => {
                if self.may_answer_unproven(now, from) {
                    self.queue_handshake(from, answer);
                }
            }
            // No key to tell: say so (a reject is shorter than the
            // padded query), so the client need not wait.
            None if self.responder.is_none() && datagram.len() >= handshake::HELLO_MIN_LEN => {
                self.reject(now, from, client_id, RejectReason::NoIdentity);
            }
            None => self.stats.bad_handshakes += 1,
        }
    }

    /// A packet of this version, plain or protected: a plain hello, or
    /// one for a connection, handled by its kind.
    fn on_packet<'a>(
        &mut self,
        now: Time,
        from: SocketAddr,
        conn_id: u64,
        datagram: &'a mut [u8],
    ) -> Option<Arrival<'a>> {
        let len = datagram.len();
        let protected = frame::is_protected(datagram);
        let datagram: &'a [u8] = if protected {
            self.open(now, from, conn_id, datagram)?
        } else {
            datagram
        };
        self.on_inner(now, from, conn_id, datagram, protected, len)
    }

    /// A packet, opened if it came protected (`len` bytes as it came),
    /// handled by its kind.
    fn on_inner<'a>(
        &mut self,
        now: Time,
        from: SocketAddr,
        conn_id: u64,
        datagram: &'a [u8],
        protected: bool,
        len: usize,
    ) -> Option<Arrival<'a>> {
        let Ok(packet) = Packet::decode(datagram) else {
            self.stats.undecodable += 1;
            return None;
        };
        if let Packet::Hello(hello) = packet {
            if protected {
                // A hello has no business inside a session's keys.
                self.stats.unexpected += 1;
            } else if !self.auth.allow_plain {
                self.stats.plain_refused += 1;
                self.notice(now, Notice::PlainRefused { peer: from });
                self.reject(now, from, hello.conn_id, RejectReason::AuthRequired);
            } else {
                self.on_hello(now, from, &hello, hello_token(datagram), len);
            }
            return None;
        }
        if let Packet::SizeProbe(probe) = packet {
            if protected {
                self.stats.unexpected += 1;
            } else {
                self.on_size_probe(now, from, &probe);
            }
            return None;
        }
        // A plain packet never belongs to an authenticated connection,
        // whatever id it names: only what opened may reach it.
        let Some(conn) = self
            .conns
            .get_mut(&conn_id)
            .filter(|c| c.peer == from && (c.link.secure().is_some() == protected))
        else {
            self.stats.unknown_connection += 1;
            return None;
        };
        conn.last_heard = now;
        if matches!(packet, Packet::Data(_)) && matches!(conn.phase, ConnPhase::Hello { .. }) {
            conn.phase = ConnPhase::Open;
        }
        if let Some(budget) = conn.link.unvalidated_mut() {
            budget.on_received(len);
        }
        let handled = match packet {
            Packet::Data(seg) => self.on_data(now, conn_id, &seg),
            Packet::PathResponse(p) => self.on_path_response(conn_id, p.token),
            Packet::Fetch(f) => self.on_fetch(conn_id, f.offset),
            Packet::Close(close) => self.on_close(now, conn_id, close.segments),
            _ => {
                self.stats.unexpected += 1;
                Err(NothingToSend)
            }
        };
        let arrival = handled.ok()?;
        self.enqueue(conn_id);
        arrival
    }

    /// A data segment of connection `conn_id`: placed by its receiver, and
    /// its new bytes handed to the session or checked against the probe's
    /// pattern.
    fn on_data<'a>(
        &mut self,
        now: Time,
        conn_id: u64,
        seg: &DataSegment<'a>,
    ) -> Result<Option<Arrival<'a>>, NothingToSend> {
        let conn = self.conns.get_mut(&conn_id).ok_or(NothingToSend)?;
        // A segment the stream cannot hold (a short one before the end,
        // or one numbered past 2^64 bytes) is as good as lost.
        let Some(offset) = stream_offset(seg, conn.payload_size()) else {
            self.stats.undecodable += 1;
            return Err(NothingToSend);
        };
        if conn.is_closed() {
            return Ok(None);
        }
        // Answered early: say so again, now and then, until the client
        // stops sending and fetches.
        if conn.reply.is_some() && seg.header.seg % 32 == 0 && conn.fetches.is_empty() {
            conn.fetches.push_back(0);
        }
        let mut arrival = None;
        if let Ok(Some(new)) = conn.receiver.handle_segment(now, seg) {
            match conn.purpose {
                Purpose::Session(session) => {
                    arrival = Some(Arrival {
                        conn_id,
                        session: session.get(),
                        offset,
                        payload: new.payload,
                    });
                }
                Purpose::Probe => {
                    if pattern_mismatch(offset, new.payload).is_some() {
                        conn.corrupt_bytes += new.payload.len() as u64;
                    }
                }
            }
        }
        if conn.purpose != Purpose::Probe && !conn.complete_told && conn.receiver.is_complete() {
            conn.complete_told = true;
            self.session_events
                .push_back(Queued::Event(SessionEvent::Complete { conn_id }));
        }
        Ok(arrival)
    }

    /// The client's echo of a path challenge: the new path is validated
    /// if it echoes the one outstanding (RFC 9000 §8.2.2). Nothing to
    /// send for it.
    fn on_path_response(
        &mut self,
        conn_id: u64,
        token: u64,
    ) -> Result<Option<Arrival<'static>>, NothingToSend> {
        let conn = self.conns.get_mut(&conn_id).ok_or(NothingToSend)?;
        let Some(secure) = conn.link.secure_mut() else {
            self.stats.unexpected += 1;
            return Err(NothingToSend);
        };
        if secure.path.as_ref().is_some_and(|c| c.token == token) {
            secure.path = None;
            self.stats.paths_validated += 1;
        }
        Err(NothingToSend)
    }

    /// A session client asks for its reply from `offset`.
    fn on_fetch(
        &mut self,
        conn_id: u64,
        offset: u32,
    ) -> Result<Option<Arrival<'static>>, NothingToSend> {
        let conn = self.conns.get_mut(&conn_id).ok_or(NothingToSend)?;
        if conn.purpose == Purpose::Probe {
            self.stats.unexpected += 1;
            return Err(NothingToSend);
        }
        if conn.fetches.len() < FETCH_QUEUE_MAX && !conn.fetches.contains(&offset) {
            conn.fetches.push_back(offset);
        }
        Ok(None)
    }

    /// The client closed, having sent `client_segments`: reported at the
    /// first close, acknowledged at every one.
    fn on_close(
        &mut self,
        now: Time,
        conn_id: u64,
        client_segments: u64,
    ) -> Result<Option<Arrival<'static>>, NothingToSend> {
        let conn = self.conns.get_mut(&conn_id).ok_or(NothingToSend)?;
        if let ConnPhase::Closed {
            close_ack_pending, ..
        } = &mut conn.phase
        {
            *close_ack_pending = true;
            return Ok(None);
        }
        conn.phase = ConnPhase::Closed {
            at: now,
            client_segments,
            close_ack_pending: true,
        };
        let report = conn.report(conn_id, ConnEnd::Closed, now, self.stats);
        self.reports.push_back(report);
        // A closed connection lingers only to answer repeated closes: its
        // window goes back to the budget now.
        let freed = std::mem::take(&mut conn.window_bytes);
        self.windows_held -= freed;
        if let Some((_, bytes)) = self.per_ip.get_mut(&conn.peer.ip()) {
            *bytes = bytes.saturating_sub(freed);
        }
        if let Purpose::Session(_) = conn.purpose {
            self.session_events
                .push_back(Queued::Event(SessionEvent::Ended {
                    conn_id,
                    end: ConnEnd::Closed,
                    confirmed: true,
                }));
        }
        Ok(None)
    }

    /// Opens a protected datagram for connection `conn_id` in place and
    /// returns its inner packet; `None` (counted) if it does not open.
    /// [`Server::open_job`]'s three steps at once, on this thread.
    fn open<'a>(
        &mut self,
        now: Time,
        from: SocketAddr,
        conn_id: u64,
        datagram: &'a mut [u8],
    ) -> Option<&'a [u8]> {
        let job = self.open_ticket(conn_id, datagram)?;
        let opened = job.open(datagram);
        let inner = self.settle_open(now, from, job, opened, datagram.len())?;
        let datagram: &'a [u8] = datagram;
        Some(&datagram[inner])
    }

    /// The checks before a protected datagram of connection `conn_id` is
    /// opened (its keys, the replay window, which key by its phase bit):
    /// the job that opens it, or `None`, counted.
    fn open_ticket(&mut self, conn_id: u64, datagram: &[u8]) -> Option<OpenJob> {
        let Some(conn) = self.conns.get_mut(&conn_id) else {
            self.stats.unknown_connection += 1;
            return None;
        };
        let Some(secure) = conn.link.secure_mut() else {
            self.stats.unknown_connection += 1;
            return None;
        };
        let Some(keys) = secure.keys.keys_mut() else {
            // Its response is still being made: nothing can open yet.
            self.stats.unknown_connection += 1;
            return None;
        };
        let pn = frame::packet_number(datagram);
        let Ok(ticket) = frame::open_ticket(&mut keys.opener, datagram) else {
            self.stats.crypto_dropped += 1;
            return None;
        };
        Some(OpenJob {
            conn_id,
            inner_id: secure.client_id,
            pn,
            ticket,
        })
    }

    /// After `job` opened its datagram (`opened`; `len` bytes as it came)
    /// or failed to: the opener learns the outcome (a failure is counted
    /// and dropped), and an authenticated packet from a new address moves
    /// the connection there (WireGuard's roaming), under the 3x limit
    /// until the new path has proved itself. The inner packet's range, or
    /// `None`.
    fn settle_open(
        &mut self,
        now: Time,
        from: SocketAddr,
        job: OpenJob,
        opened: Result<std::ops::Range<usize>, BadTag>,
        len: usize,
    ) -> Option<std::ops::Range<usize>> {
        let OpenJob {
            conn_id,
            pn,
            ticket,
            ..
        } = job;
        // Gone since the ticket (closed by a packet before it in a batch).
        let Some(conn) = self.conns.get_mut(&conn_id) else {
            self.stats.unknown_connection += 1;
            return None;
        };
        let Some(keys) = conn
            .link
            .secure_mut()
            .and_then(|secure| secure.keys.keys_mut())
        else {
            self.stats.unknown_connection += 1;
            return None;
        };
        if keys.opener.settle(ticket, opened.is_ok()).is_err() {
            self.stats.crypto_dropped += 1;
            return None;
        }
        let Ok(inner) = opened else {
            self.stats.crypto_dropped += 1;
            return None;
        };
        let secure = conn.link.secure_mut().expect("keyed above");
        secure.keys.confirm();
        let newest = secure.largest_pn.is_none_or(|l| pn > l);
        if newest {
            secure.largest_pn = Some(pn);
        }
        let late = !newest && conn.peer != from;
        let mut moved = None;
        if conn.peer == from {
            if let Some(check) = secure.path.as_mut() {
                check.budget.on_received(len);
            }
            if newest {
                conn.local = self.answering_at;
            }
        } else if newest {
            // RFC 9000 §9.3: send to the new address at once, under the
            // 3× limit, and validate it; a path already being validated
            // keeps its fallback (the last validated address).
            let mut budget = Budget::new();
            budget.on_received(len);
            let (fallback, fallback_local) = secure
                .path
                .as_ref()
                .map_or((conn.peer, conn.local), |c| (c.fallback, c.fallback_local));
            secure.path = Some(PathCheck {
                token: self.random.as_mut().map_or(pn ^ 0x5bd1_e995, Rng::next_u64),
                budget,
                fallback,
                fallback_local,
                started: now,
                challenge_at: now,
            });
            moved = Some(std::mem::replace(&mut conn.peer, from));
            conn.local = self.answering_at;
        }
        let window = conn.window_bytes;
        if late {
            // A late packet from an address the connection left.
            self.stats.unknown_connection += 1;
            return None;
        }
        if let Some(old) = moved {
            self.move_per_ip(old, from, window);
            self.stats.migrations += 1;
            self.notice(
                now,
                Notice::Migrated {
                    from: old,
                    to: from,
                },
            );
        }
        Some(inner)
    }

    /// A connection moved from `old` to `new`: its count and window go
    /// with it in the per-address budgets.
    fn move_per_ip(&mut self, old: SocketAddr, new: SocketAddr, window: u64) {
        if let Some((n, bytes)) = self.per_ip.get_mut(&old.ip()) {
            *n -= 1;
            *bytes = bytes.saturating_sub(window);
            if *n == 0 {
                self.per_ip.remove(&old.ip());
            }
        }
        let ip = self.per_ip.entry(new.ip()).or_insert((0, 0));
        ip.0 += 1;
        ip.1 += window;
    }

    /// A Noise hello. Nothing is kept for it unless it opens,
    /// its key is authorized and the hello's parameters are admitted;
    /// under load, nothing at all without a valid cookie. No public-key
    /// operation is spent on a copy of a hello already read, nor past the
    /// source's or everyone's budget; a key not authorized is not
    /// answered.
    fn on_secure_hello(&mut self, now: Time, from: SocketAddr, datagram: &[u8]) {
        let Some(responder) = self.responder.as_mut() else {
            // No key to answer with: say so, in no more than arrived.
            if datagram.len() >= handshake::HELLO_MIN_LEN {
                let client_id = HeaderPeek::read(datagram).map_or(0, |p| p.conn_id);
                self.reject(now, from, client_id, RejectReason::NoIdentity);
            } else {
                self.stats.bad_handshakes += 1;
            }
            return;
        };
        if now.saturating_since(self.cookie_rotated) >= crate::proto::crypto::cookie::BUCKET {
            if let Some(random) = self.random.as_mut() {
                responder.rotate_cookie_secret(draw_secret(random));
                self.cookie_rotated = now;
            }
        }
        if now.saturating_since(self.hello_second) >= Duration::from_secs(1) {
            self.hello_second = now;
            self.hellos_this_second = 0;
        }
        // Under load for everyone, or for this source: its budget for
        // hellos without a cookie spent (by it, or by a spoofer sending
        // in its name), it is asked to prove its address and is then
        // held to the budget for hellos with one, which no spoofer can
        // spend.
        let under_load = self.hellos_this_second >= HANDSHAKES_PER_SEC
            || self.rate.unvalidated_spent(now, from.ip())
            || self.conns.len() >= self.limits.max_connections * 3 / 4
            || self
                .per_ip
                .get(&from.ip())
                .is_some_and(|(n, _)| *n >= self.limits.max_connections_per_ip * 3 / 4);
        // Everything before the first Diffie-Hellman is cheap: the frame,
        // a lookup for a copy, the cookie under load, then the price.
        let hello = match responder.screen(now, from, datagram, under_load) {
            Ok(Screened::Fresh(hello)) => hello,
            Ok(Screened::NeedsCookie { client_id }) => {
                if !self.may_answer_unproven(now, from) {
                    return;
                }
                let Some(responder) = self.responder.as_ref() else {
                    return;
                };
                let bytes = responder.cookie_reply(now, from, client_id);
                self.stats.cookies_sent += 1;
                self.answer_hello(from, datagram.len(), bytes);
                return;
            }
            Ok(Screened::Seen { client_id }) => {
                self.stats.hellos_seen += 1;
                if self.replayed.on_copy(now, client_id) {
                    self.stats.hellos_dropped_unread += 1;
                    self.notice(
                        now,
                        Notice::ReplayDropped {
                            peer: from,
                            client_id,
                            copies: self.limits.replayed_copies_before_drop,
                        },
                    );
                }
                return;
            }
            Err(_) => {
                self.stats.bad_handshakes += 1;
                return;
            }
        };
        // A hello past the queue is dropped before it is charged or
        // remembered: its client's resend, once the queue has room, is
        // read as if this one had been lost.
        if self.in_flight.len() >= self.limits.handshake_queue.max(1) {
            self.stats.hellos_queue_full += 1;
            return;
        }
        // WireGuard's ratelimiter.c, before any public-key operation
        // (whitepaper §5.3: under load, the cookie first, then the rate).
        if self
            .rate
            .allow(now, from.ip(), hello.address_validated())
            .is_err()
        {
            self.stats.hellos_limited += 1;
            return;
        }
        self.stats.hellos_worked += 1;
        self.hellos_this_second += 1;
        let work = responder.work_on(hello);
        let ticket = self.take_ticket();
        self.hand_out(
            ticket,
            Job::Open(work),
            InFlight::Open {
                from,
                local: self.answering_at,
                hello_len: datagram.len(),
            },
        );
        if !self.offload {
            self.run_own_handshake_work(now);
        }
    }

    /// Answers a hello of `hello_len` bytes from `to`: at most 3× what
    /// came from an address not yet validated (RFC 9000 §8.1).
    fn answer_hello(&mut self, to: SocketAddr, hello_len: usize, bytes: Vec<u8>) {
        self.answer_hello_held(to, hello_len, bytes, None);
    }

    /// [`answer_hello`](Self::answer_hello), or, `held_for` an accepted
    /// hello's connection, held until the table of hello timestamps that
    /// refuses its replay is saved. `true` if it goes out now.
    fn answer_hello_held(
        &mut self,
        to: SocketAddr,
        hello_len: usize,
        bytes: Vec<u8>,
        held_for: Option<u64>,
    ) -> bool {
        let mut budget = Budget::new();
        budget.on_received(hello_len);
        if !budget.may_send(bytes.len()) {
            return false;
        }
        match held_for {
            Some(conn_id) if self.held_responses.len() < FETCH_QUEUE_MAX => {
                self.held_responses
                    .push((to, self.answering_at, bytes, conn_id));
                false
            }
            // Past the bound, as a lost response: the client times out;
            // the connection expires unconfirmed.
            Some(_) => false,
            None => {
                self.queue_handshake(to, bytes);
                true
            }
        }
    }

    /// Places the early segment of connection `conn_id`'s hello, as if
    /// it had arrived with the hello (it did): its bytes go to the
    /// application ([`Server::poll_early_arrival`]), and its completion
    /// and acknowledgement follow as for any segment. Called when the
    /// response goes out, so that a hello whose replay a restart could
    /// not refuse yet has had no effect.
    fn take_early(&mut self, conn_id: u64) {
        let Some(conn) = self.conns.get_mut(&conn_id) else {
            return;
        };
        let Some(segment) = conn
            .link
            .secure_mut()
            .and_then(|s| s.early.as_mut())
            .and_then(|e| e.segment.take())
        else {
            return;
        };
        let Ok(Packet::Data(seg)) = Packet::decode(&segment) else {
            return;
        };
        if matches!(conn.phase, ConnPhase::Hello { .. }) {
            conn.phase = ConnPhase::Open;
        }
        let (now, at) = (conn.last_heard, self.session_events.len());
        if let Ok(Some(arrival)) = self.on_data(now, conn_id, &seg) {
            let early = EarlyArrival {
                conn_id,
                session: arrival.session,
                payload: arrival.payload.to_vec(),
            };
            self.session_events.insert(at, Queued::Early(early));
        }
        self.enqueue(conn_id);
    }

    fn take_ticket(&mut self) -> u64 {
        self.next_ticket = self.next_ticket.wrapping_add(1);
        self.next_ticket
    }

    fn hand_out(&mut self, ticket: u64, job: Job, waiting: InFlight) {
        self.in_flight.insert(ticket, waiting);
        self.handshake_work.push_back(HandshakeWork { ticket, job });
    }

    /// The driver runs hellos' public-key work itself, off the thread
    /// that calls [`Server::handle_datagram`]: it takes each job from
    /// [`Server::poll_handshake_work`], runs it anywhere
    /// (its `run`) and gives the result back with
    /// [`Server::handshake_done`]. Without this (the default) the server
    /// runs its jobs before each call returns, which is the same path,
    /// in the order a driver with one worker would see it.
    pub fn offload_handshakes(mut self) -> Server {
        self.offload = true;
        self
    }

    /// The next hello's public-key work to run (only with
    /// [`Server::offload_handshakes`]; poll after every call that may
    /// have received a hello or a result).
    pub fn poll_handshake_work(&mut self) -> Option<HandshakeWork> {
        self.handshake_work.pop_front()
    }

    /// Jobs handed out or waiting to be, whose results have not come
    /// back (at most [`ServerLimits::handshake_queue`]).
    #[cfg(any(feature = "internals", fuzzing))]
    pub fn handshakes_in_flight(&self) -> usize {
        self.in_flight.len()
    }

    fn run_own_handshake_work(&mut self, now: Time) {
        while let Some(work) = self.handshake_work.pop_front() {
            let done = work.run();
            self.handshake_done(now, done);
        }
    }

    /// The result of a job from [`Server::poll_handshake_work`]. A hello
    /// read is decided here, on the server's thread (the replay window,
    /// authorization, the budgets), and an admitted one's connection is
    /// made at once, without keys, so that it counts in the budgets while
    /// its response is worked; the response's result installs the keys
    /// and sends it. A result whose ticket is unknown is ignored.
    pub fn handshake_done(&mut self, now: Time, done: HandshakeDone) {
        let Some(waiting) = self.in_flight.remove(&done.ticket) else {
            return;
        };
        // Its answers leave from where its hello arrived.
        self.answering_at = match &waiting {
            InFlight::Open { local, .. } | InFlight::Respond { local, .. } => *local,
        };
        match (waiting, done.outcome) {
            (
                InFlight::Open {
                    from, hello_len, ..
                },
                Outcome::Opened(Ok(opened)),
            ) => {
                self.judge_hello(now, from, hello_len, opened);
            }
            (waiting, Outcome::Responded(Ok(reply))) => {
                self.on_response(now, done.ticket, waiting, reply);
            }
            (waiting, _) => {
                self.stats.bad_handshakes += 1;
                match waiting {
                    InFlight::Respond { conn: Some(id), .. }
                        if self.conn_awaits(id, done.ticket) && self.conn_answered(id) =>
                    {
                        self.end_unheard(id)
                    }
                    InFlight::Respond { conn: Some(id), .. } => {
                        self.remove_conn_awaiting(id, done.ticket);
                    }
                    _ => {}
                }
            }
        }
        if !self.offload {
            self.run_own_handshake_work(now);
        }
    }

    /// Connection `id`'s application was told `Opened`.
    fn conn_answered(&self, id: u64) -> bool {
        self.conns
            .get(&id)
            .is_some_and(|c| c.link.secure().is_some_and(|s| s.answered))
    }

    /// Connection `id` waits for the keys of job `ticket`.
    fn conn_awaits(&self, id: u64, ticket: u64) -> bool {
        self.conns
            .get(&id)
            .is_some_and(|c| c.link.secure().is_some_and(|s| s.keys.awaits(ticket)))
    }

    /// Removes connection `id` if it still waits for the keys of job
    /// `ticket`.
    fn remove_conn_awaiting(&mut self, id: u64, ticket: u64) -> bool {
        let awaiting = self.conn_awaits(id, ticket);
        if awaiting {
            self.remove_conn(id);
        }
        awaiting
    }

    /// Decides about a hello whose first message was read: the replay
    /// window ([`Responder::judge`]), authorization, then the budgets
    /// ([`Server::admission`]). No public-key operation.
    fn judge_hello(
        &mut self,
        now: Time,
        from: SocketAddr,
        hello_len: usize,
        opened: handshake::OpenedHello,
    ) {
        let Some(mut responder) = self.responder.take() else {
            return;
        };
        let (key, client_id) = opened.client();
        let said_again = self.answered_conn(from, &key, client_id);
        let server_id = said_again.unwrap_or_else(|| self.fresh_server_id());
        let mut verdict = Verdict::default();
        let judged = responder.judge(opened, server_id, |key, params| {
            let decision;
            (decision, verdict) = self.decide_hello(from, key, params, said_again);
            decision
        });
        self.responder = Some(responder);
        let work = match judged {
            Ok(handshake::Judged::Respond(work)) => work,
            Ok(handshake::Judged::Ignored { peer }) => {
                self.stats.auth_refused += 1;
                self.notice(
                    now,
                    Notice::AuthRefused {
                        peer: from,
                        key: peer,
                        why: verdict.why,
                    },
                );
                return;
            }
            Err(_) => {
                self.stats.bad_handshakes += 1;
                return;
            }
        };
        let ticket = self.take_ticket();
        // A refusal for the clock (the floor) was admitted by the budgets
        // and makes no connection.
        let admitted = verdict.admitted.filter(|_| work.accepts());
        let conn = admitted.map(|(hello, admission)| match said_again {
            // The hello's timestamp was newer (judged), and only the
            // key's holder could make it (ss): the connection awaits the
            // new handshake's keys, and a late response to the old one
            // installs nothing ([`Keying::awaits`]). Its receiver, reply
            // and budgets stay as they are.
            Some(id) => {
                if let Some(c) = self.conns.get_mut(&id) {
                    c.last_heard = now;
                    if let Some(secure) = c.link.secure_mut() {
                        secure.keys = Keying::Awaiting { ticket };
                    }
                }
                id
            }
            None => {
                let (peer_key, client_id) = work.client();
                let secure = ConnSecure {
                    keys: Keying::Awaiting { ticket },
                    peer_key,
                    client_id,
                    largest_pn: None,
                    path: None,
                    answered: false,
                    early: verdict.early.take().map(|segment| EarlyData {
                        segment: Some(segment),
                        budget: Budget::new(),
                    }),
                };
                self.insert_awaiting(now, from, server_id, &hello, admission, secure);
                server_id
            }
        });
        self.hand_out(
            ticket,
            Job::Respond(work),
            InFlight::Respond {
                from,
                local: self.answering_at,
                hello_len,
                conn,
                why: verdict.why,
            },
        );
    }

    /// The connection a hello from `from` says again, if a response to
    /// it was made: the same key and client id, its keys not confirmed,
    /// its application told `Opened` (a request that rode its hello
    /// placed, or held for the timestamps' save). Such a hello means the
    /// response was lost; it re-keys that connection in place rather than
    /// replace it, so the application acts on the request once. One whose
    /// keys are confirmed is no hello's to touch; one whose first
    /// response is still being made has told its application nothing and
    /// may be replaced ([`Server::insert_awaiting`]).
    fn answered_conn(&self, from: SocketAddr, key: &PublicKey, client_id: u64) -> Option<u64> {
        self.unconfirmed_of(key, client_id)
            .find(|(_, c, s)| c.peer == from && s.answered)
            .map(|(id, ..)| id)
    }

    /// The connections of `key`'s client `client_id` whose keys no packet
    /// has confirmed: what a hello of that client may re-key or replace.
    fn unconfirmed_of<'a>(
        &'a self,
        key: &'a PublicKey,
        client_id: u64,
    ) -> impl Iterator<Item = (u64, &'a Conn, &'a ConnSecure)> + 'a {
        self.conns.iter().filter_map(move |(&id, c)| {
            let s = c.link.secure()?;
            (!matches!(s.keys, Keying::Confirmed(_))
                && s.peer_key == *key
                && s.client_id == client_id)
                .then_some((id, c, s))
        })
    }

    /// The server's decision about an authenticated client's key and
    /// hello parameters, for [`Responder::judge`].
    /// `said_again`: the connection the hello says again
    /// ([`Server::answered_conn`]), which holds its place in the budgets
    /// already and keeps what it was granted.
    fn decide_hello(
        &self,
        from: SocketAddr,
        key: &PublicKey,
        params: &[u8],
        said_again: Option<u64>,
    ) -> (Decision, Verdict) {
        let refused = |decision, why: &str| {
            let why = why.to_string();
            (
                decision,
                Verdict {
                    admitted: None,
                    early: None,
                    why,
                },
            )
        };
        if let Some(keys) = &self.auth.authorized {
            if keys.find(key).is_none() {
                return refused(
                    Decision::Ignore,
                    "its key is not in the authorized keys (not answered)",
                );
            }
        }
        let split = split_hello_params(params);
        // A server from before early data decodes the parameters as
        // exactly a hello.
        #[cfg(test)]
        let split = split.and_then(|(hello, early)| match early {
            Some(extra) if self.without_early => {
                Err(crate::proto::wire::WireError::TrailingBytes(extra.len()))
            }
            _ => Ok((hello, early)),
        });
        let Ok((hello, early)) = split else {
            return refused(
                Decision::Refuse(RefuseReason::ParamsRefused),
                "its parameters are not a hello",
            );
        };
        let admitted = match said_again.and_then(|id| self.conns.get(&id)) {
            Some(conn) => self.grant(&hello).and_then(|admission| {
                let same = conn.mss == hello.mss
                    && conn.purpose == Purpose::of_wire(hello.session)
                    && conn.params == admission.params
                    && conn.window_bytes == admission.window_bytes
                    && conn.maxidle == admission.maxidle;
                if same {
                    Ok(admission)
                } else {
                    Err((
                        RejectReason::BadHello,
                        "a hello said again with other parameters than its connection's"
                            .to_string(),
                    ))
                }
            }),
            None => self.admission(from, &hello),
        };
        // Said again, the request that rode the hello is its connection's
        // already (placed, or held for the save): taken iff it was then,
        // so it is never placed twice, nor lost.
        let taken_before = said_again
            .and_then(|id| self.conns.get(&id))
            .map(|c| c.link.secure().is_some_and(|s| s.early.is_some()));
        match admitted {
            Ok(admission) => {
                let welcome = Welcome {
                    conn_id: hello.conn_id,
                    receiver: ReceiverParams {
                        rcvbuf: self.granted_rcvbuf,
                        ..admission.params
                    },
                };
                let mut bytes = vec![0u8; CONTROL_MAX_LEN];
                let n = welcome.emit(&mut bytes).unwrap_or(0);
                bytes.truncate(n);
                // Taken only where the connection could have received it
                // after the welcome: a session's, one whole segment.
                let early = early
                    .filter(|_| taken_before.is_none())
                    .filter(|_| matches!(Purpose::of_wire(hello.session), Purpose::Session(_)))
                    .filter(|e| early_segment(&hello, e, payload_size(hello.mss)).is_some())
                    .map(<[u8]>::to_vec);
                if early.is_some() || taken_before == Some(true) {
                    bytes.push(EARLY_TAKEN);
                }
                let verdict = Verdict {
                    admitted: Some((hello, admission)),
                    early,
                    why: String::new(),
                };
                (Decision::Accept(bytes), verdict)
            }
            Err((reason, why)) => {
                let reason = if reason == RejectReason::Busy {
                    RefuseReason::Busy
                } else {
                    RefuseReason::ParamsRefused
                };
                (
                    Decision::Refuse(reason),
                    Verdict {
                        admitted: None,
                        early: None,
                        why,
                    },
                )
            }
        }
    }

    /// Makes the connection of an accepted authenticated hello, waiting
    /// for its keys. A hello repeated before its first response was made
    /// (or from another address) made a session the client will never
    /// use: the newer one replaces it (one answered is re-keyed instead:
    /// [`Server::answered_conn`]).
    fn insert_awaiting(
        &mut self,
        now: Time,
        from: SocketAddr,
        server_id: u64,
        hello: &Hello,
        admission: Admission,
        secure: ConnSecure,
    ) {
        let stale: Vec<(u64, bool)> = self
            .unconfirmed_of(&secure.peer_key, secure.client_id)
            .map(|(id, _, s)| (id, s.answered))
            .collect();
        for (id, answered) in stale {
            // One answered (from another address: not re-keyed) had its
            // application told `Opened`: it is told `Ended` too.
            if answered {
                self.end_unheard(id);
            } else {
                self.remove_conn(id);
            }
        }
        let secure = Some(Box::new(secure));
        self.insert_conn(now, from, server_id, hello, admission, secure);
    }

    /// An id for a new authenticated connection: random, never 0, and not
    /// one in use.
    fn fresh_server_id(&mut self) -> u64 {
        let mut server_id = self.random.as_mut().map_or(0, Rng::next_u64);
        while server_id == 0 || self.conns.contains_key(&server_id) {
            server_id = server_id.wrapping_add(0x9E37_79B9_7F4A_7C15);
        }
        server_id
    }

    /// A response made: a refusal is sent; an acceptance installs its
    /// keys in the connection made when it was decided, if that is still
    /// there, and is sent.
    fn on_response(&mut self, now: Time, ticket: u64, waiting: InFlight, reply: handshake::Reply) {
        let InFlight::Respond {
            from,
            hello_len,
            conn,
            why,
            ..
        } = waiting
        else {
            self.stats.bad_handshakes += 1;
            return;
        };
        match reply {
            handshake::Reply::Refused {
                datagram,
                peer,
                reason,
            } => {
                self.stats.auth_refused += 1;
                let why = if reason == RefuseReason::ClockBehind {
                    "its hello is timestamped more than 2 min before this server \
                     started (a replay, or a client clock behind)"
                        .to_string()
                } else {
                    why
                };
                if reason == RefuseReason::Busy {
                    self.stats.busy_rejects += 1;
                }
                self.notice(
                    now,
                    Notice::AuthRefused {
                        peer: from,
                        key: peer,
                        why,
                    },
                );
                self.answer_hello(from, hello_len, datagram);
            }
            handshake::Reply::Accepted {
                datagram,
                session,
                timestamp_advanced,
                address_validated,
            } => {
                let Some(id) = conn else {
                    return;
                };
                let Some(c) = self.conns.get_mut(&id) else {
                    return;
                };
                let Some(secure) = c.link.secure_mut().filter(|s| s.keys.awaits(ticket)) else {
                    return;
                };
                let (sealer, opener) = session.into_protection();
                secure.keys = Keying::Unconfirmed(SessionKeys { sealer, opener });
                // Re-keyed, the budget counts the earlier hellos and
                // responses too: 3x all its hellos, all its responses in.
                if let Some(early) = secure.early.as_mut() {
                    early.budget.on_received(hello_len);
                    early.budget.on_sent(datagram.len());
                }
                let rekeyed = std::mem::replace(&mut secure.answered, true);
                match (c.purpose, rekeyed) {
                    (Purpose::Session(session), false) => {
                        self.session_events
                            .push_back(Queued::Event(c.opened_event(id, session)));
                    }
                    // Told once: what was lost under the old keys (ACKs,
                    // the reply) goes again under the new.
                    (_, true) => self.enqueue(id),
                    (Purpose::Probe, false) => {}
                }
                // Worth its price: the source's token goes back.
                self.rate.refund(now, from.ip(), address_validated);
                self.rate.prove(now, from.ip());
                self.stats.handshakes += 1;
                // Held while the table is unsaved, advanced by this hello
                // or an earlier one: a restart before the save would take
                // this hello again.
                self.timestamps_unsaved |= timestamp_advanced;
                self.changed_since_taken |= timestamp_advanced;
                let held_for = (self.keeping_timestamps && self.timestamps_unsaved).then_some(id);
                if self.answer_hello_held(from, hello_len, datagram, held_for) {
                    self.take_early(id);
                }
            }
            handshake::Reply::Cookie(_) | handshake::Reply::Ignored { .. } => {}
        }
    }

    /// What a hello may have, under the operator's budgets; `Err` with
    /// the reject and the operator's explanation.
    fn admission(
        &self,
        from: SocketAddr,
        hello: &Hello,
    ) -> Result<Admission, (RejectReason, String)> {
        let admission = self.grant(hello)?;
        match self.busy(from, admission.window_bytes) {
            Some(why) => Err((RejectReason::Busy, why)),
            None => Ok(admission),
        }
    }

    /// What a hello's parameters would be granted, budgets aside.
    fn grant(&self, hello: &Hello) -> Result<Admission, (RejectReason, String)> {
        let p = hello.receiver;
        if !(DATA_HEADER_LEN as u32 + 1..=MSS_MAX).contains(&hello.mss) {
            return Err((
                RejectReason::BadHello,
                format!(
                    "mss {} outside {}..={MSS_MAX}",
                    hello.mss,
                    DATA_HEADER_LEN + 1
                ),
            ));
        }
        if p.rcvsegs == 0 {
            return Err((
                RejectReason::BadHello,
                "a receiver buffer of 0 segments".to_string(),
            ));
        }
        let payload = payload_size(hello.mss);
        let limits = self.limits;
        // A session connection's window is memory its application holds:
        // granted from the operator's budget, never more than asked.
        let rcvsegs = u64::from(p.rcvsegs.min(limits.max_rcvsegs))
            .min(limits.max_window_bytes / payload)
            .max(1);
        let window_bytes = match Purpose::of_wire(hello.session) {
            Purpose::Probe => 0,
            Purpose::Session(_) => rcvsegs * payload,
        };
        let maxidle = match Duration::from_millis(u64::from(hello.maxidle_ms)) {
            d if d.is_zero() => MAXIDLE_CAP,
            d => d.min(MAXIDLE_CAP),
        };
        Ok(Admission {
            params: ReceiverParams {
                rcvsegs: rcvsegs as u32,
                ..p
            },
            window_bytes,
            maxidle,
        })
    }

    /// Which budget a new connection from `from` holding `window_bytes`
    /// would overrun, if any, for the operator.
    fn busy(&self, from: SocketAddr, window_bytes: u64) -> Option<String> {
        let limits = self.limits;
        let (from_ip, ip_window) = self.per_ip.get(&from.ip()).copied().unwrap_or((0, 0));
        // One address may hold half the window budget (at least
        // one connection's worth), so a flood from one cannot starve the rest.
        let ip_window_cap = (limits.total_window_bytes / 2).max(limits.max_window_bytes);
        if self.conns.len() >= limits.max_connections {
            Some(format!(
                "already serving {} connections",
                limits.max_connections
            ))
        } else if from_ip >= limits.max_connections_per_ip {
            Some(format!(
                "{} connections from {} already",
                limits.max_connections_per_ip,
                from.ip()
            ))
        } else if ip_window + window_bytes > ip_window_cap {
            Some(format!(
                "{} holds its share of the receive windows ({ip_window_cap} bytes)",
                from.ip()
            ))
        } else if self.windows_held + window_bytes > limits.total_window_bytes {
            Some(format!(
                "its receive windows are all in use ({} bytes)",
                limits.total_window_bytes
            ))
        } else {
            None
        }
    }

    /// A plain hello of `len` bytes, with the address token after it if
    /// it has one.
    fn on_hello(
        &mut self,
        now: Time,
        from: SocketAddr,
        hello: &Hello,
        token: Option<AddressToken>,
        len: usize,
    ) {
        if let Some(conn) = self.conns.get_mut(&hello.conn_id) {
            match &mut conn.link {
                Link::Plain {
                    welcome_pending,
                    unvalidated,
                } if conn.peer == from => {
                    // Our welcome was lost: say it again.
                    conn.last_heard = now;
                    *welcome_pending = true;
                    if let Some(budget) = unvalidated {
                        budget.on_received(len);
                    }
                    self.enqueue(hello.conn_id);
                }
                _ => self.stats.unknown_connection += 1,
            }
            return;
        }
        if now.saturating_since(self.tokens_rotated) >= crate::proto::crypto::cookie::BUCKET {
            if let Some(random) = self.random.as_mut() {
                if let Some(t) = self.tokens.as_mut() {
                    t.rotate(draw_secret(random));
                }
                self.tokens_rotated = now;
            }
        }
        // RFC 9000 §8.1: an address is validated by a token only a
        // datagram to it could have carried; §8.1.2: without one, a
        // Retry, and nothing kept.
        let validated = token.is_some_and(|t| {
            self.tokens
                .as_ref()
                .is_some_and(|s| s.verify_token(&t, from.ip(), now))
        });
        let budget = if validated {
            None
        } else if self.unvalidated < self.limits.unvalidated_plain {
            let mut b = Budget::new();
            b.on_received(len);
            Some(b)
        } else {
            if let Some(secret) = &self.tokens {
                let retry = Retry {
                    conn_id: hello.conn_id,
                    token: secret.issue_token(from.ip(), now),
                };
                if self.retries.len() < FETCH_QUEUE_MAX && self.may_answer_unproven(now, from) {
                    self.stats.retries_sent += 1;
                    self.retries.push_back((from, self.answering_at, retry));
                }
            }
            return;
        };
        match self.admission(from, hello) {
            Ok(admission) => {
                self.insert_conn(now, from, hello.conn_id, hello, admission, None);
                if let Some(Link::Plain { unvalidated, .. }) =
                    self.conns.get_mut(&hello.conn_id).map(|c| &mut c.link)
                {
                    if budget.is_some() {
                        self.unvalidated += 1;
                    }
                    *unvalidated = budget;
                }
            }
            Err((RejectReason::Busy, why)) => {
                self.stats.busy_rejects += 1;
                self.notice(now, Notice::Busy { peer: from, why });
                self.reject(now, from, hello.conn_id, RejectReason::Busy);
            }
            Err((reason, why)) => {
                self.stats.bad_hellos += 1;
                self.notice(now, Notice::BadHello { peer: from, why });
                self.reject(now, from, hello.conn_id, reason);
            }
        }
    }

    /// Opens connection `key` for an admitted hello. A plain connection
    /// answers with a welcome; an authenticated one's welcome was in the
    /// handshake's response.
    fn insert_conn(
        &mut self,
        now: Time,
        from: SocketAddr,
        key: u64,
        hello: &Hello,
        admission: Admission,
        secure: Option<Box<ConnSecure>>,
    ) {
        let Admission {
            params,
            window_bytes,
            maxidle,
        } = admission;
        if params.rcvbuf > self.largest_rcvbuf_asked
            && params.rcvbuf <= self.limits.max_socket_rcvbuf
        {
            self.largest_rcvbuf_asked = params.rcvbuf;
            self.pending_rcvbuf = Some(params.rcvbuf);
        }
        let config = ReceiverConfig {
            sack: params.sack,
            delack: Duration::from_micros(u64::from(params.delack_us)),
            rcvsegs: params.rcvsegs,
            quickack: u32::from(params.quickack),
        };
        self.stats.connections += 1;
        let purpose = Purpose::of_wire(hello.session);
        let receiver = match purpose {
            Purpose::Probe => Receiver::sink(config, hello.conn_id),
            Purpose::Session(_) => Receiver::placing(config, hello.conn_id),
        };
        let link = match secure {
            Some(secure) => Link::Secure(secure),
            None => Link::Plain {
                welcome_pending: true,
                unvalidated: None,
            },
        };
        let conn = Conn {
            peer: from,
            local: self.answering_at,
            purpose,
            mss: hello.mss,
            reply: None,
            fetches: VecDeque::new(),
            complete_told: false,
            receiver,
            params,
            opened: now,
            last_heard: now,
            maxidle,
            phase: ConnPhase::Hello {
                expires: now + maxidle.min(self.limits.hello_idle),
            },
            corrupt_bytes: 0,
            window_bytes,
            link,
            queued: false,
        };
        // An authenticated connection is opened for its application when
        // its keys arrive ([`Server::on_response`]).
        if let (Purpose::Session(session), true) = (conn.purpose, conn.keyed()) {
            self.session_events
                .push_back(Queued::Event(conn.opened_event(key, session)));
        }
        self.conns.insert(key, conn);
        self.windows_held += window_bytes;
        let ip = self.per_ip.entry(from.ip()).or_insert((0, 0));
        ip.0 += 1;
        ip.1 += window_bytes;
        self.enqueue(key);
    }

    /// RFC 8899 §4.1: a probe that arrived is acked, whoever sent it. The
    /// ack is 24 bytes for a probe of at least 1,200 (decoding refuses
    /// shorter ones) and nothing is kept, so a spoofed source gains a
    /// fiftieth of what it sent; the queue is bounded by what arrived.
    fn on_size_probe(&mut self, now: Time, from: SocketAddr, probe: &SizeProbe) {
        if self.size_acks.len() < FETCH_QUEUE_MAX && self.may_answer_unproven(now, from) {
            self.stats.size_probes_acked += 1;
            self.size_acks
                .push_back((from, self.answering_at, probe.ack()));
        }
    }

    /// Whether `to` may be sent one more answer before it has proved
    /// anything: its share is [`UNPROVEN_ANSWERS_PER_SEC`]; past it the
    /// datagram goes unanswered and counted.
    fn may_answer_unproven(&mut self, now: Time, to: SocketAddr) -> bool {
        if self.unproven_answers.take(now, to) {
            return true;
        }
        self.stats.answers_limited += 1;
        false
    }

    fn reject(&mut self, now: Time, to: SocketAddr, conn_id: u64, reason: RejectReason) {
        // Rejects are sent once per hello and are no longer than it: no
        // amplification, and a queue bounded by what arrived; and no
        // more than the address's share.
        if self.rejects.len() < FETCH_QUEUE_MAX && self.may_answer_unproven(now, to) {
            self.rejects.push_back((
                to,
                self.answering_at,
                Reject {
                    conn_id,
                    reason,
                    version: VERSION,
                },
            ));
        }
    }

    /// Writes the next datagram into `buf` (at least the wire's
    /// `CONTROL_MAX_LEN` and `ACK_MAX_LEN` bytes; any datagram fits in
    /// [`Server::MAX_TRANSMIT_LEN`]); returns where to send it and its
    /// length.
    pub fn poll_transmit(&mut self, now: Time, buf: &mut [u8]) -> Option<(SocketAddr, usize)> {
        self.poll_transmit_from(now, buf).map(|(to, _, n)| (to, n))
    }

    /// [`Server::poll_transmit`], with the local address the datagram is
    /// to leave from: the one its peer's datagrams arrive at, as
    /// [`Server::handle_datagram_at`] was told (`None`: any).
    pub(crate) fn poll_transmit_from(
        &mut self,
        now: Time,
        buf: &mut [u8],
    ) -> Option<(SocketAddr, Option<IpAddr>, usize)> {
        if let Some((to, local, bytes)) = self.handshake_out.pop_front() {
            let n = bytes.len().min(buf.len());
            buf[..n].copy_from_slice(&bytes[..n]);
            return Some((to, local, n));
        }
        if let Some((to, local, reject)) = self.rejects.pop_front() {
            return reject.emit(buf).ok().map(|n| (to, local, n));
        }
        if let Some((to, local, retry)) = self.retries.pop_front() {
            return retry.emit(buf).ok().map(|n| (to, local, n));
        }
        if let Some((to, local, ack)) = self.size_acks.pop_front() {
            return ack.emit(buf).ok().map(|n| (to, local, n));
        }
        while let Some(conn_id) = self.ready.front() {
            let granted_rcvbuf = self.granted_rcvbuf;
            let Some(conn) = self.conns.get_mut(&conn_id) else {
                self.ready.pop_front();
                continue;
            };
            // A protected packet is written at PN_LEN, then sealed around.
            let at = if conn.link.secure().is_some() {
                frame::PN_LEN
            } else {
                0
            };
            let challenge = conn.link.secure_mut().and_then(|s| {
                let check = s.path.as_mut().filter(|c| now >= c.challenge_at)?;
                check.challenge_at = now + PATH_CHALLENGE_EVERY;
                Some(PathProbe {
                    conn_id: s.client_id,
                    token: check.token,
                })
            });
            let next = match challenge {
                Some(probe) => probe
                    .emit_challenge(&mut buf[at..])
                    .map_or(Next::Skip, Next::Packet),
                None => conn.next_inner(conn_id, granted_rcvbuf, now, &mut buf[at..]),
            };
            match next {
                Next::Packet(n) => {
                    let (to, local) = (conn.peer, conn.local);
                    let Some(secure) = conn.link.secure_mut() else {
                        // RFC 9000 §8.1: at most 3× what the address sent
                        // until it proves it receives (a plain connection
                        // opened without a token never does).
                        if let Some(budget) = conn.link.unvalidated_mut() {
                            if !budget.may_send(n) {
                                self.stats.unvalidated_held_back += 1;
                                continue;
                            }
                            budget.on_sent(n);
                        }
                        return Some((to, local, n));
                    };
                    // Nothing goes to an unconfirmed client but its hello's
                    // response and, for a request that rode the hello, its
                    // answer within 3× the hello (RFC 9000 §8.1); nothing
                    // past the 3× limit on a new path.
                    let keys = match (&mut secure.keys, secure.early.as_mut()) {
                        (Keying::Confirmed(keys), _) => keys,
                        (Keying::Unconfirmed(keys), Some(early)) => {
                            let len = n + frame::overhead(keys.sealer.tag_len());
                            if !early.budget.may_send(len) {
                                self.stats.unvalidated_held_back += 1;
                                continue;
                            }
                            early.budget.on_sent(len);
                            keys
                        }
                        _ => continue,
                    };
                    let len = n + frame::overhead(keys.sealer.tag_len());
                    if let Some(check) = secure.path.as_mut() {
                        if !check.budget.may_send(len) {
                            continue;
                        }
                        check.budget.on_sent(len);
                    }
                    match frame::seal(&mut keys.sealer, secure.client_id, buf, n) {
                        Ok(len) => return Some((to, local, len)),
                        // Packet numbers exhausted (2^62): the connection
                        // cannot go on; the client's maxidle ends it.
                        Err(_) => continue,
                    }
                }
                Next::Skip => continue,
                Next::Idle => {
                    conn.queued = false;
                    self.ready.pop_front();
                }
            }
        }
        None
    }

    /// The earliest timer of any connection (delayed ACK, path
    /// challenge, idle expiry): when to call [`Server::handle_timeout`];
    /// `None` with no connection open.
    pub fn poll_timeout(&self) -> Option<Time> {
        self.conns.values().map(Conn::poll_timeout).min()
    }

    /// The longest datagram [`Server::poll_transmit`] writes (a reply
    /// fragment, protected).
    pub const MAX_TRANSMIT_LEN: usize = REPLY_HEADER_LEN + REPLY_FRAGMENT_MAX + frame::overhead(16);

    /// The application has placed every byte of `conn_id`'s stream below
    /// `offset`: its window may move on.
    pub fn release(&mut self, conn_id: u64, offset: u64) {
        let Some(conn) = self.conns.get_mut(&conn_id) else {
            return;
        };
        conn.receiver.release(offset / conn.payload_size());
        self.enqueue(conn_id);
    }

    /// The application's answer to `conn_id`'s stream. Its first
    /// fragments (ten: RFC 6928's initial window) are pushed to the client at
    /// once, unasked, so that a client that has sent everything has them
    /// with the last acknowledgement instead of a round trip later; the
    /// rest, and anything lost, is sent as the client fetches it. Replies longer than 4 GiB are not
    /// representable.
    ///
    /// A reply before the stream is complete (the application failed) is
    /// pushed again now and then while data keeps coming: the client
    /// stops sending and fetches the rest.
    pub fn respond(&mut self, conn_id: u64, reply: Vec<u8>) {
        debug_assert!(u32::try_from(reply.len()).is_ok());
        let Some(conn) = self.conns.get_mut(&conn_id) else {
            return;
        };
        let fragment = reply_fragment_len(conn.mss);
        let pushed = reply
            .len()
            .div_ceil(fragment)
            .clamp(1, REPLY_PUSHED_FRAGMENTS);
        conn.reply = Some(reply);
        for k in 0..pushed {
            let offset = u32::try_from(k * fragment).unwrap_or(u32::MAX);
            if !conn.fetches.contains(&offset) {
                conn.fetches.push_back(offset);
            }
        }
        self.enqueue(conn_id);
    }

    /// The next session connection's event (opened, stream complete,
    /// ended), for its application; `None` when none is waiting.
    /// Stops before an early arrival: take it with
    /// [`poll_early_arrival`](Self::poll_early_arrival), then go on.
    pub fn poll_session_event(&mut self) -> Option<SessionEvent> {
        match self.session_events.front()? {
            Queued::Event(_) => match self.session_events.pop_front() {
                Some(Queued::Event(e)) => Some(e),
                _ => None,
            },
            Queued::Early(_) => None,
        }
    }

    /// Stream bytes that rode an accepted hello, when they are next in
    /// line among the session events (a driver drains both, in turn,
    /// until neither has more).
    pub fn poll_early_arrival(&mut self) -> Option<EarlyArrival> {
        match self.session_events.front()? {
            Queued::Early(_) => match self.session_events.pop_front() {
                Some(Queued::Early(a)) => Some(a),
                _ => None,
            },
            Queued::Event(_) => None,
        }
    }

    /// Acts on the timers due by `now`: delayed ACKs, path challenges
    /// (and paths given up after no answer, RFC 9000 §9.3.2) and
    /// connections idle past their `maxidle`, which end with a report.
    pub fn handle_timeout(&mut self, now: Time) {
        let mut expired = Vec::new();
        let mut woken = Vec::new();
        let mut abandoned = Vec::new();
        for (&id, conn) in &mut self.conns {
            if let Some(secure) = conn.link.secure_mut() {
                match &secure.path {
                    // RFC 9000 §9.3.2: a new path that never answered is
                    // left for the last one validated.
                    Some(c) if now >= c.started + PATH_GIVE_UP => {
                        let (fallback, fallback_local) = (c.fallback, c.fallback_local);
                        secure.path = None;
                        let gone = std::mem::replace(&mut conn.peer, fallback);
                        conn.local = fallback_local;
                        abandoned.push((gone, fallback, conn.window_bytes));
                    }
                    Some(c) if now >= c.challenge_at => woken.push(id),
                    _ => {}
                }
            }
            if conn.receiver.poll_timeout().is_some_and(|t| t <= now) {
                conn.receiver.handle_timeout(now);
                woken.push(id);
            }
            if conn.deadline() <= now {
                expired.push(id);
            }
        }
        for id in woken {
            self.enqueue(id);
        }
        for (gone, back, window) in abandoned {
            self.move_per_ip(gone, back, window);
            self.stats.paths_abandoned += 1;
            self.notice(
                now,
                Notice::Migrated {
                    from: gone,
                    to: back,
                },
            );
        }
        for id in expired {
            let conn = self.remove_conn(id).expect("listed above");
            if !conn.is_closed() {
                self.reports
                    .push_back(conn.report(id, ConnEnd::Idle, conn.last_heard, self.stats));
                if conn.purpose != Purpose::Probe && conn.keyed() {
                    self.session_events
                        .push_back(Queued::Event(SessionEvent::Ended {
                            conn_id: id,
                            end: ConnEnd::Idle,
                            confirmed: conn.confirmed(),
                        }));
                }
            }
        }
    }

    /// The next ended connection's report; `None` when none is waiting.
    pub fn poll_report(&mut self) -> Option<ConnReport> {
        self.reports.pop_front()
    }

    /// The next notice for the operator (refusals, replays, migrations);
    /// `None` when none is waiting.
    pub fn poll_notice(&mut self) -> Option<Notice> {
        self.notices.pop_front()
    }

    /// The client ids of the hellos whose copies the driver should drop
    /// before reading them (a socket filter), when the list changed: the
    /// whole list, which replaces the last.
    pub fn poll_dropped_hellos(&mut self, now: Time) -> Option<Vec<u64>> {
        self.replayed.expire(now);
        self.replayed.poll_changed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netem::NetemSpec;
    use crate::proto::endpoint::client::{Client, Closed, UNACKNOWLEDGED_CLOSES};
    use crate::proto::payload::{PatternSource, PayloadSource};
    use crate::proto::wire::{DataFlags, DataHeader};
    use crate::proto::Tuning;
    use crate::sim::pair::{Dir, Pair, SessionApp, TapFn};
    use crate::sim::RunEnd;

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    /// These tests are about what a connection does once open: plain
    /// hellos open one without an address token (tests/unvalidated.rs
    /// and `a_plain_hello_without_a_token_gets_a_retry_and_nothing_is_kept`
    /// are about who may).
    fn open_limits() -> ServerLimits {
        ServerLimits {
            unvalidated_plain: 64,
            ..ServerLimits::default()
        }
    }

    /// A plain hello of 10-segment window, SACK and no delayed ACK.
    fn hello(conn_id: u64, mss: u32, session: u64, rcvbuf: u32) -> Vec<u8> {
        let mut b = [0u8; 64];
        let n = Hello {
            conn_id,
            mss,
            maxidle_ms: 1000,
            session,
            receiver: ReceiverParams {
                rcvsegs: 10,
                rcvbuf,
                delack_us: 0,
                quickack: 0,
                sack: true,
            },
        }
        .emit(&mut b)
        .unwrap();
        b[..n].to_vec()
    }

    /// Runs `pair` until its client is done, every datagram through `tap`
    /// and `app` on the server's sessions; false if it is not done by
    /// `limit`.
    fn serve_one(
        pair: &mut Pair,
        limit: Duration,
        tap: &mut TapFn<'_>,
        app: &mut dyn SessionApp,
    ) -> bool {
        pair.set_time_limit(limit);
        pair.run_serving(&mut (), tap, app, |_| false) == RunEnd::Finished
    }

    /// [`serve_one`], which must end within `limit` with the client
    /// closed and holding `reply`: its close.
    fn served_reply(
        pair: &mut Pair,
        limit: Duration,
        tap: &mut TapFn<'_>,
        app: &mut dyn SessionApp,
        reply: &[u8],
    ) -> Closed {
        assert!(serve_one(pair, limit, tap, app), "not done in {limit:?}");
        let closed = pair.client.outcome().unwrap().clone().unwrap();
        assert_eq!(closed.reply.as_deref(), Some(reply));
        closed
    }

    /// `client`, its datagrams from `addr(1)`, and `server` back to back
    /// over `path` (a netem description) each way.
    fn pair(client: Client, server: Server, path: &str) -> Pair {
        let path: NetemSpec = path.parse().unwrap();
        Pair::between(client, addr(1), server, path.clone(), path, 1)
    }

    fn straight(_: Time, _: Dir, d: Vec<u8>) -> Vec<(SocketAddr, Vec<u8>)> {
        vec![(addr(1), d)]
    }

    /// An application that answers each complete request with its reply.
    struct Replies(Vec<u8>);

    impl SessionApp for Replies {
        fn on_event(&mut self, _: Time, server: &mut Server, event: SessionEvent) {
            if let SessionEvent::Complete { conn_id } = event {
                server.respond(conn_id, self.0.clone());
            }
        }
    }

    /// Between its decision and its keys an authenticated connection holds
    /// its place in the budgets and nothing else: no packet reaches it,
    /// plain or protected, nothing is sent for it, and its application
    /// hears of it only once the keys are in.
    #[test]
    fn a_connection_waiting_for_its_keys_takes_no_packet_and_sends_nothing() {
        use crate::proto::crypto::frame::PROTECTED;
        use crate::proto::crypto::{Cipher, ClientConfig, Initiator, ServerAuth, StaticKeypair};
        let server_key = StaticKeypair::generate().unwrap();
        let mut server = Server::new(open_limits(), 1 << 20, 2 << 20)
            .with_auth(ServerAuth {
                identity: Some(server_key.clone()),
                authorized: None,
                allow_plain: false,
            })
            .unwrap()
            .offload_handshakes();
        let config = ClientConfig {
            identity: StaticKeypair::generate().unwrap(),
            server_key: server_key.public(),
            cipher: Cipher::Aes256Gcm,
            params: hello(7, 1200, 1, 1 << 20),
        };
        let client = Initiator::new(&config, 7, 1).unwrap();
        let t0 = Time::ZERO;
        server.handle_datagram(t0, addr(1), &mut client.hello().to_vec());
        let open = server.poll_handshake_work().expect("the hello's work");
        server.handshake_done(t0, open.run());
        let (&id, conn) = server.conns.iter().next().expect("admitted");
        assert!(!conn.keyed());
        assert_eq!(server.windows_held(), 10 * payload_size(1200));
        let mut close = [0u8; 64];
        let n = crate::proto::wire::Close {
            conn_id: id,
            segments: 1,
            bytes: 0,
        }
        .emit(&mut close)
        .unwrap();
        let mut protected = [0u8; 128];
        protected[..n].copy_from_slice(&close[..n]);
        protected[3] |= PROTECTED;
        server.handle_datagram(t0, addr(1), &mut close[..n].to_vec());
        server.handle_datagram(t0, addr(1), &mut protected[..n + 32].to_vec());
        assert_eq!(server.stats().unknown_connection, 2);
        assert!(!server.conns[&id].is_closed());
        let mut buf = vec![0u8; 2048];
        assert!(server.poll_transmit(t0, &mut buf).is_none());
        assert!(server.poll_session_event().is_none());
        let respond = server.poll_handshake_work().expect("the response's work");
        server.handshake_done(t0, respond.run());
        assert!(server.conns[&id].keyed());
        assert!(matches!(
            server.poll_session_event(),
            Some(SessionEvent::Opened { conn_id, .. }) if conn_id == id
        ));
        assert!(matches!(server.poll_transmit(t0, &mut buf), Some((to, _)) if to == addr(1)));
        assert_eq!(server.handshakes_in_flight(), 0);
    }

    #[test]
    fn session_id_0_on_the_wire_is_a_probe_and_every_other_a_session() {
        assert_eq!(Purpose::of_wire(0), Purpose::Probe);
        assert_eq!(Purpose::Probe.to_wire(), 0);
        for id in [1, 77, u64::MAX] {
            let purpose = Purpose::of_wire(id);
            assert!(matches!(purpose, Purpose::Session(s) if s.get() == id));
            assert_eq!(purpose.to_wire(), id);
        }
    }

    /// Client and server wired back to back, no loss: the whole life of a
    /// connection, and garbage in between.
    #[test]
    fn hello_transfer_close_with_garbage_in_between() {
        let tuning = Tuning {
            mss: 200,
            ..Tuning::default()
        };
        let client = Client::new(&tuning, 42, Some(10_000), Time::ZERO).unwrap();
        let server = Server::new(open_limits(), 1 << 20, 2 << 20);
        let mut pair = pair(client, server, "");
        pair.set_time_limit(Duration::from_secs(10));
        let mut garbage_between = |_: Time, dir: Dir, at: SocketAddr, d: Vec<u8>| match dir {
            // Garbage and a stranger's packet between real ones.
            Dir::ToServer => vec![
                (at, d.clone()),
                (at, b"not atou at all".to_vec()),
                (addr(2), d),
            ],
            // Every answer goes to the client, none to the stranger.
            Dir::ToClient => {
                assert_eq!(at, addr(1));
                vec![(at, d)]
            }
        };
        let end = pair.run_addressed(&mut (), &mut garbage_between, &mut (), |_| false);
        assert_eq!(end, RunEnd::Finished, "did not finish");
        assert_eq!(pair.misaddressed, 0);
        let now = pair.now();
        let (client, server) = (&pair.client, &mut pair.server);
        let closed = client.outcome().unwrap().clone().unwrap();
        let peer = closed.peer.expect("close acknowledged");
        assert_eq!(peer.bytes, 10_000);
        let report = server.poll_report().unwrap();
        assert_eq!(report.end, ConnEnd::Closed);
        assert_eq!(report.stats.bytes, 10_000);
        assert_eq!(report.corrupt_bytes, 0);
        let s = server.stats();
        assert_eq!(s.undecodable, s.unknown_connection);
        assert!(s.undecodable > 50);
        // The closed connection lingers, then goes without a second report.
        server.handle_timeout(now + LINGER + Duration::from_secs(1));
        assert_eq!(server.open_connections(), 0);
        assert!(server.poll_report().is_none());
    }

    /// RFC 9000 §8.1.2: by default a plain hello without a valid address
    /// token is answered with a retry, no larger than it, and nothing is
    /// kept; the same hello with the token opens the connection, from
    /// another port too; a token for another address, or forged, is
    /// another retry.
    /// The server's randomness is an input: the same seed and datagrams
    /// give the same answers (a reproducible run), another seed others.
    #[test]
    fn a_seeded_server_answers_the_same_hello_the_same_way_and_another_seed_does_not() {
        let retry_from = |seed: [u8; 32]| {
            let mut server = Server::new(ServerLimits::default(), 1 << 20, 2 << 20).with_seed(seed);
            server.handle_datagram(Time::ZERO, addr(1), &mut hello(5, 1472, 0, 1024));
            let mut out = [0u8; 128];
            let (_, n) = server.poll_transmit(Time::ZERO, &mut out).unwrap();
            assert!(matches!(Packet::decode(&out[..n]), Ok(Packet::Retry(_))));
            out[..n].to_vec()
        };
        assert_eq!(retry_from([7; 32]), retry_from([7; 32]));
        assert_ne!(retry_from([7; 32]), retry_from([8; 32]));
    }

    /// RFC 8899 §4.1: a path-MTU probe from anyone gets one 24-byte ack
    /// of the size that arrived, and nothing is kept; a probe shorter
    /// than 1,200 bytes, or a flood past the queue, gets nothing: a
    /// hostile client's probes are never amplified.
    #[test]
    fn a_size_probe_gets_one_small_ack_and_nothing_is_kept() {
        let mut server = Server::new(ServerLimits::default(), 1 << 20, 2 << 20);
        let probe = SizeProbe {
            conn_id: 9,
            nonce: 0xabc,
            size: 1372,
        };
        let mut datagram = vec![0u8; 1372];
        probe.emit(&mut datagram).unwrap();
        server.handle_datagram(Time::ZERO, addr(1), &mut datagram.clone());
        let mut out = [0u8; 128];
        let (to, n) = server.poll_transmit(Time::ZERO, &mut out).unwrap();
        assert_eq!(to, addr(1));
        assert_eq!(Packet::decode(&out[..n]), Ok(Packet::SizeAck(probe.ack())));
        assert_eq!(n, 24);
        assert!(server.poll_transmit(Time::ZERO, &mut out).is_none());
        assert_eq!(server.open_connections(), 0);
        assert_eq!(server.rate_sources_tracked(), 0);
        // Cut to 1,199 bytes it is no probe, and nothing answers it.
        server.handle_datagram(Time::ZERO, addr(1), &mut datagram[..1199].to_vec());
        assert!(server.poll_transmit(Time::ZERO, &mut out).is_none());
        // A flood from one address: its share of answers, each a
        // fiftieth of its probe (the share's bucket is all that is kept
        // for it, in a bounded table).
        for _ in 0..FETCH_QUEUE_MAX + 100 {
            server.handle_datagram(Time::ZERO, addr(2), &mut datagram.clone());
        }
        let mut sent = 0;
        while let Some((_, n)) = server.poll_transmit(Time::ZERO, &mut out) {
            sent += n;
        }
        let share = UNPROVEN_ANSWERS_BURST as usize;
        assert_eq!(sent, share * 24);
        assert_eq!(server.stats().size_probes_acked, 1 + share as u64);
        assert_eq!(
            server.stats().answers_limited,
            (FETCH_QUEUE_MAX + 100 - share) as u64
        );
    }

    #[test]
    fn a_plain_hello_without_a_token_gets_a_retry_and_nothing_is_kept() {
        let mut server = Server::new(ServerLimits::default(), 1 << 20, 2 << 20);
        let bare = hello(5, 1472, 0, 1024);
        server.handle_datagram(Time::ZERO, addr(1), &mut bare.clone());
        assert_eq!(server.open_connections(), 0);
        let mut out = [0u8; 128];
        let (to, n) = server.poll_transmit(Time::ZERO, &mut out).unwrap();
        assert_eq!(to, addr(1));
        assert!(n <= bare.len(), "{n} bytes for {}", bare.len());
        let Ok(Packet::Retry(retry)) = Packet::decode(&out[..n]) else {
            panic!("{:?}", Packet::decode(&out[..n]));
        };
        assert_eq!(retry.conn_id, 5);
        assert!(server.poll_transmit(Time::ZERO, &mut out).is_none());
        let with = |token: &AddressToken| {
            let h = Hello {
                conn_id: 5,
                mss: 1472,
                maxidle_ms: 1000,
                session: 0,
                receiver: ReceiverParams {
                    rcvsegs: 10,
                    rcvbuf: 1024,
                    delack_us: 0,
                    quickack: 0,
                    sack: true,
                },
            };
            let mut b = vec![0u8; 128];
            let n = h.emit_with_token(Some(token), &mut b).unwrap();
            b.truncate(n);
            b
        };
        let elsewhere = SocketAddr::from(([127, 0, 0, 2], 1));
        server.handle_datagram(Time::ZERO, elsewhere, &mut with(&retry.token));
        let mut forged = retry.token;
        forged[3] ^= 1;
        server.handle_datagram(Time::ZERO, addr(1), &mut with(&forged));
        assert_eq!(server.open_connections(), 0);
        assert_eq!(server.stats().retries_sent, 3);
        while server.poll_transmit(Time::ZERO, &mut out).is_some() {}
        // From another port of the same address: in.
        server.handle_datagram(Time::ZERO, addr(2), &mut with(&retry.token));
        assert_eq!(server.open_connections(), 1);
        let (to, n) = server.poll_transmit(Time::ZERO, &mut out).unwrap();
        assert_eq!(to, addr(2));
        assert!(matches!(Packet::decode(&out[..n]), Ok(Packet::Welcome(_))));
        // And the client follows a retry by itself.
        let mut client = Client::new(&Tuning::default(), 6, Some(1), Time::ZERO).unwrap();
        let mut buf = vec![0u8; 2048];
        let n = client
            .poll_transmit(Time::ZERO, &mut buf, &mut PatternSource)
            .unwrap();
        server.handle_datagram(Time::ZERO, addr(3), &mut buf[..n].to_vec());
        let (_, m) = server.poll_transmit(Time::ZERO, &mut out).unwrap();
        client.handle_datagram(Time::ZERO, &out[..m]).unwrap();
        let n = client
            .poll_transmit(Time::ZERO, &mut buf, &mut PatternSource)
            .expect("the hello again at once");
        assert_eq!(
            hello_token(&buf[..n]),
            Some(client.address_token().unwrap())
        );
        server.handle_datagram(Time::ZERO, addr(3), &mut buf[..n].to_vec());
        assert_eq!(server.open_connections(), 2);
    }

    #[test]
    fn foreign_version_hello_is_rejected_with_our_version() {
        let mut server = Server::new(open_limits(), 1 << 20, 2 << 20);
        let mut hello = hello(5, 1472, 0, 1024);
        hello[2] = VERSION + 1;
        server.handle_datagram(Time::ZERO, addr(9), &mut hello);
        let mut out = [0u8; 64];
        let (to, m) = server.poll_transmit(Time::ZERO, &mut out).unwrap();
        assert_eq!(to, addr(9));
        match Packet::decode(&out[..m]).unwrap() {
            Packet::Reject(r) => {
                assert_eq!(r.reason, RejectReason::UnsupportedVersion);
                assert_eq!(r.version, VERSION);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(server.stats().version_rejects, 1);
        assert_eq!(server.open_connections(), 0);
        assert!(matches!(
            server.poll_notice(),
            Some(Notice::VersionRejected { theirs, .. }) if theirs == VERSION + 1
        ));

        // And the client side turns that reject into a clear error.
        let mut client = Client::new(&Tuning::default(), 5, Some(1), Time::ZERO).unwrap();
        client.handle_datagram(Time::ZERO, &out[..m]).unwrap();
        assert!(matches!(
            client.outcome(),
            Some(Err(crate::proto::endpoint::client::ConnError::VersionMismatch { theirs })) if *theirs == VERSION
        ));
    }

    #[test]
    fn an_idle_connection_is_reported_and_forgotten() {
        let tuning = Tuning {
            maxidle: Duration::from_secs(3),
            ..Tuning::default()
        };
        let mut client = Client::new(&tuning, 7, Some(1_000_000), Time::ZERO).unwrap();
        let mut server = Server::new(open_limits(), 1 << 20, 2 << 20);
        let mut buf = vec![0u8; 2048];
        let n = client
            .poll_transmit(Time::ZERO, &mut buf, &mut PatternSource)
            .unwrap();
        server.handle_datagram(Time::ZERO, addr(1), &mut buf[..n].to_vec());
        assert_eq!(server.open_connections(), 1);
        let at = server.poll_timeout().unwrap();
        assert_eq!(at, Time::ZERO + Duration::from_secs(3));
        server.handle_timeout(at);
        assert_eq!(server.open_connections(), 0);
        assert_eq!(server.poll_report().unwrap().end, ConnEnd::Idle);
        // The client, never welcomed, gives up after maxidle too.
        client.handle_timeout(at);
        assert!(matches!(
            client.outcome(),
            Some(Err(crate::proto::endpoint::client::ConnError::Idle { .. }))
        ));
    }

    #[test]
    fn each_larger_socket_buffer_is_asked_for_once_and_never_past_the_operators_cap() {
        let limits = ServerLimits {
            max_socket_rcvbuf: 16 << 20,
            ..open_limits()
        };
        let mut server = Server::new(limits, 4 << 20, 8 << 20);
        let hello = |conn_id, rcvbuf| hello(conn_id, 1472, 0, rcvbuf);
        let mut out = [0u8; 128];
        let welcome_rcvbuf = |server: &mut Server, out: &mut [u8]| {
            let (_, n) = server.poll_transmit(Time::ZERO, out).unwrap();
            match Packet::decode(&out[..n]).unwrap() {
                Packet::Welcome(w) => w.receiver.rcvbuf,
                other => panic!("{other:?}"),
            }
        };
        // No more than the server's own setting: nothing to do.
        server.handle_datagram(Time::ZERO, addr(1), &mut hello(1, 4 << 20));
        assert_eq!(server.wanted_rcvbuf(), None);
        assert_eq!(welcome_rcvbuf(&mut server, &mut out), 8 << 20);
        // More: asked once; the welcome carries what the kernel granted.
        server.handle_datagram(Time::ZERO, addr(2), &mut hello(2, 16 << 20));
        assert_eq!(server.wanted_rcvbuf(), Some(16 << 20));
        server.set_socket_rcvbuf(12 << 20);
        assert_eq!(welcome_rcvbuf(&mut server, &mut out), 12 << 20);
        // The same size again, though capped: not asked again.
        server.handle_datagram(Time::ZERO, addr(3), &mut hello(3, 16 << 20));
        assert_eq!(server.wanted_rcvbuf(), None);
        // Past the operator's cap (2 GiB, as SO_RCVBUFFORCE would give
        // root): never asked for.
        let _ = welcome_rcvbuf(&mut server, &mut out);
        server.handle_datagram(Time::ZERO, addr(4), &mut hello(4, 2 << 30));
        assert_eq!(server.wanted_rcvbuf(), None);
    }

    /// The data header carries no stream offset (version 5): the server
    /// places a segment at its number times the payload size, so it drops
    /// one that would sit short before the end, or past 2^64 bytes.
    #[test]
    fn a_segment_the_stream_cannot_hold_is_dropped_and_one_it_can_is_placed_by_its_number() {
        let mut server = Server::new(open_limits(), 1 << 20, 2 << 20);
        assert!(server
            .handle_datagram(Time::ZERO, addr(1), &mut hello(5, 200, 77, 0))
            .is_none());
        let Some(SessionEvent::Opened { payload_size, .. }) = server.poll_session_event() else {
            panic!("no session opened");
        };
        assert_eq!(payload_size, 200 - DATA_HEADER_LEN as u64);
        let segment = |seg: u64, len: usize, fin: bool| {
            let mut d = vec![0x5a; DATA_HEADER_LEN + len];
            DataHeader {
                conn_id: 5,
                seg,
                timestamp: 0,
                flags: DataFlags {
                    fin,
                    retransmission: false,
                },
            }
            .emit(&mut d)
            .unwrap();
            d
        };
        let dropped = server.stats().undecodable;
        // Short and not the last.
        let mut short = segment(1, 10, false);
        assert!(server
            .handle_datagram(Time::ZERO, addr(1), &mut short)
            .is_none());
        // Its offset would pass 2^64 bytes.
        let mut far = segment(u64::MAX / payload_size + 1, payload_size as usize, false);
        assert!(server
            .handle_datagram(Time::ZERO, addr(1), &mut far)
            .is_none());
        // Its end would.
        let mut end = segment(u64::MAX / payload_size, payload_size as usize, true);
        assert!(server
            .handle_datagram(Time::ZERO, addr(1), &mut end)
            .is_none());
        assert_eq!(server.stats().undecodable, dropped + 3);
        // Full-size, and short with FIN: placed where their numbers say.
        let mut full = segment(1, payload_size as usize, false);
        let a = server
            .handle_datagram(Time::ZERO, addr(1), &mut full)
            .unwrap();
        assert_eq!(
            (a.offset, a.payload.len() as u64),
            (payload_size, payload_size)
        );
        let mut last = segment(2, 10, true);
        let a = server
            .handle_datagram(Time::ZERO, addr(1), &mut last)
            .unwrap();
        assert_eq!((a.offset, a.payload.len()), (2 * payload_size, 10));
        assert_eq!(server.stats().undecodable, dropped + 3);
    }

    /// A session connection end to end over a link that loses every
    /// seventh datagram each way: the application gets every stream byte
    /// once, at its offset, holds the window shut until it releases, and its
    /// reply (several fragments) reaches the client intact.
    #[test]
    fn a_session_stream_is_placed_released_and_answered_through_loss() {
        const LEN: usize = 30_000;
        let tuning = Tuning {
            mss: 200,
            rcvsegs: 20,
            ..Tuning::default()
        };
        let client = Client::new(&tuning, 9, Some(LEN as u64), Time::ZERO)
            .unwrap()
            .with_session(77);
        let server = Server::new(open_limits(), 1 << 20, 2 << 20);
        struct SlowReader {
            placed: Vec<Option<u8>>,
            released: u64,
            next_release: Time,
            reply: Vec<u8>,
        }
        impl SessionApp for SlowReader {
            fn on_arrival(&mut self, _: Time, _: &mut Server, a: Arrival<'_>) {
                assert_eq!((a.conn_id, a.session), (9, 77));
                for (i, &b) in a.payload.iter().enumerate() {
                    let at = a.offset as usize + i;
                    assert!(self.placed[at].replace(b).is_none(), "byte {at} twice");
                }
            }
            fn on_event(&mut self, _: Time, server: &mut Server, e: SessionEvent) {
                match e {
                    SessionEvent::Opened { payload_size, .. } => assert_eq!(payload_size, 175),
                    SessionEvent::Complete { conn_id } => {
                        server.respond(conn_id, self.reply.clone())
                    }
                    SessionEvent::Ended { end, .. } => assert_eq!(end, ConnEnd::Closed),
                }
            }
            // The application frees its buffer slowly: a window's worth
            // every 5 ms, up to what has arrived in order.
            fn poll_timeout(&self) -> Option<Time> {
                Some(self.next_release)
            }
            fn on_timeout(&mut self, now: Time, server: &mut Server) {
                let in_order = self.placed.iter().take_while(|b| b.is_some()).count() as u64;
                self.released = in_order.min(self.released + 2000);
                server.release(9, self.released);
                self.next_release = now + Duration::from_millis(5);
            }
        }
        let mut app = SlowReader {
            placed: vec![None; LEN],
            released: 0,
            next_release: Time::ZERO,
            reply: (0..5000u32).map(|i| (i % 251) as u8).collect(),
        };
        let (mut to_server, mut to_client) = (0u64, 0u64);
        let mut every_seventh_lost = |_: Time, dir: Dir, d: Vec<u8>| {
            let sent = match dir {
                Dir::ToServer => &mut to_server,
                Dir::ToClient => &mut to_client,
            };
            *sent += 1;
            if *sent % 7 == 0 {
                Vec::new()
            } else {
                vec![(addr(1), d)]
            }
        };
        let mut pair = pair(client, server, "");
        let done = serve_one(
            &mut pair,
            Duration::from_secs(100),
            &mut every_seventh_lost,
            &mut app,
        );
        assert!(done, "did not finish");
        let now = pair.now();
        let (client, server) = (&pair.client, &mut pair.server);
        let (placed, reply) = (app.placed, app.reply);
        let closed = client.outcome().unwrap().clone().unwrap();
        assert_eq!(closed.reply.as_deref(), Some(&reply[..]));
        let mut want = vec![0u8; LEN];
        PatternSource.read_at(0, &mut want);
        let got: Vec<u8> = placed
            .iter()
            .map(|b| b.expect("every byte placed"))
            .collect();
        assert_eq!(got, want);
        let report = server.poll_report().unwrap();
        assert_eq!((report.session, report.stats.bytes), (77, LEN as u64));
        // The sender kept inside the window, and the window held it back:
        // 2000 bytes released per 5 ms make at least 70 ms for 30 000.
        assert_eq!(report.stats.beyond_window, 0);
        assert!(now >= Time::ZERO + Duration::from_millis(70), "{now:?}");
    }

    /// An application that fails answers before the stream is in: the
    /// client stops sending, fetches the answer and closes.
    #[test]
    fn an_early_reply_stops_the_sender() {
        let tuning = Tuning {
            mss: 200,
            ..Tuning::default()
        };
        let client = Client::new(&tuning, 3, Some(10_000_000), Time::ZERO)
            .unwrap()
            .with_session(5);
        let server = Server::new(open_limits(), 1 << 20, 2 << 20);
        /// Answers as soon as the first bytes arrive.
        struct FailsAtOnce {
            answered: bool,
        }
        impl SessionApp for FailsAtOnce {
            fn on_arrival(&mut self, _: Time, server: &mut Server, _: Arrival<'_>) {
                if !self.answered {
                    self.answered = true;
                    server.respond(3, b"disk full".to_vec());
                }
            }
        }
        let mut pair = pair(client, server, "");
        let mut app = FailsAtOnce { answered: false };
        let done = serve_one(&mut pair, Duration::from_secs(10), &mut straight, &mut app);
        assert!(done, "did not finish");
        let (client, server) = (&pair.client, &mut pair.server);
        let closed = client.outcome().unwrap().clone().unwrap();
        assert_eq!(closed.reply.as_deref(), Some(&b"disk full"[..]));
        let report = server.poll_report().unwrap();
        assert!(
            report.stats.bytes < 1_000_000,
            "{} bytes sent",
            report.stats.bytes
        );
    }

    /// A request (a plan, a finish) over a 100 ms round trip: one for the
    /// hello, one for the request and its reply, which the server pushes
    /// with its last acknowledgement instead of waiting to be fetched; a
    /// client that does not wait for its close's acknowledgement is done
    /// then, one that does a round trip later. (Fetched and acknowledged,
    /// it took four.)
    #[test]
    fn a_request_is_answered_in_two_round_trips_its_reply_pushed() {
        let finished_at = |close_unacknowledged: bool| {
            let tuning = Tuning::default();
            let client = Client::new(&tuning, 11, Some(3000), Time::ZERO)
                .unwrap()
                .with_session(21);
            let client = if close_unacknowledged {
                client.with_close_unacknowledged()
            } else {
                client
            };
            let server = Server::new(open_limits(), 1 << 20, 2 << 20);
            let mut pair = pair(client, server, "delay 50ms");
            let mut app = Replies(b"plan".to_vec());
            let closed = served_reply(
                &mut pair,
                Duration::from_secs(2),
                &mut straight,
                &mut app,
                b"plan",
            );
            assert_eq!(closed.peer.is_none(), close_unacknowledged);
            pair.now()
        };
        let rtt = Duration::from_millis(100);
        let quick = finished_at(true).saturating_since(Time::ZERO);
        assert!(
            quick >= 2 * rtt && quick <= 2 * rtt + Duration::from_millis(5),
            "{quick:?}"
        );
        let acked = finished_at(false).saturating_since(Time::ZERO);
        assert!(
            acked >= 3 * rtt && acked <= 3 * rtt + Duration::from_millis(5),
            "{acked:?}"
        );
    }

    /// An answer of several fragments (a plan's for some thousand
    /// files) is pushed whole: the request still takes two round trips,
    /// not a third for fetching the rest (it did with only the first
    /// fragment pushed).
    #[test]
    fn an_answer_of_a_few_fragments_is_pushed_whole() {
        let client = Client::new(&Tuning::default(), 11, Some(3000), Time::ZERO)
            .unwrap()
            .with_session(21)
            .with_close_unacknowledged();
        let server = Server::new(open_limits(), 1 << 20, 2 << 20);
        let mut pair = pair(client, server, "delay 50ms");
        let answer: Vec<u8> = (0..3 * REPLY_FRAGMENT_MAX).map(|i| i as u8).collect();
        let mut app = Replies(answer.clone());
        let done = serve_one(&mut pair, Duration::from_secs(2), &mut straight, &mut app);
        assert!(done, "not done in 2 s");
        let closed = pair.client.outcome().unwrap().clone().unwrap();
        assert_eq!(closed.reply.as_deref(), Some(&answer[..]));
        let took = pair.now().saturating_since(Time::ZERO);
        let rtt = Duration::from_millis(100);
        assert!(
            took >= 2 * rtt && took <= 2 * rtt + Duration::from_millis(5),
            "{took:?}"
        );
    }

    /// A connection opened ahead of its request (a transfer's data or
    /// finish, while the plan is in flight) is welcomed and then holds,
    /// with no timer, sending nothing; once its stream is known, the
    /// request and its pushed reply take one round trip, not the two of
    /// a connection opened then.
    #[test]
    fn a_connection_opened_ahead_of_its_request_answers_it_in_one_round_trip() {
        let rtt = Duration::from_millis(100);
        let client = Client::new(&Tuning::default(), 13, Some(0), Time::ZERO)
            .unwrap()
            .with_session(23)
            .with_close_unacknowledged()
            .with_stream_len_later();
        let server = Server::new(open_limits(), 1 << 20, 2 << 20);
        let mut pair = pair(client, server, "delay 50ms");
        let mut app = Replies(b"verdict".to_vec());
        pair.set_time_limit(Duration::from_secs(2));
        let end = pair.run_serving(&mut (), &mut straight, &mut app, |p| p.client.is_held());
        assert_eq!(end, RunEnd::Finished);
        let held = pair.now();
        assert!(held.saturating_since(Time::ZERO) <= rtt + Duration::from_millis(5));
        assert_eq!(
            pair.client.poll_timeout(),
            Some(Time::ZERO + Duration::from_secs(5)),
            "a held connection's one timer is its hold's limit"
        );
        assert_eq!(pair.server.open_connections(), 1);
        pair.client.set_stream_len(held, 3000, 64);
        served_reply(
            &mut pair,
            Duration::from_secs(2),
            &mut straight,
            &mut app,
            b"verdict",
        );
        let took = pair.now().saturating_since(held);
        assert!(
            took >= rtt && took <= rtt + Duration::from_millis(5),
            "{took:?} from the stream to the reply"
        );
    }

    /// A server's key, and a session client of a `len`-byte pattern
    /// stream authenticated to it, its stream offered in its hello.
    fn early_client(len: usize) -> (crate::proto::crypto::StaticKeypair, Client) {
        use crate::proto::crypto::StaticKeypair;
        let server_key = StaticKeypair::generate().unwrap();
        let mut request = vec![0u8; len];
        crate::proto::payload::fill_pattern(0, &mut request);
        let client = Client::new(&Tuning::default(), 17, Some(len as u64), Time::ZERO)
            .unwrap()
            .with_session(31)
            .with_close_unacknowledged()
            .with_auth(client_auth(&server_key), 1_000_000_000)
            .unwrap()
            .with_early_stream(&request);
        (server_key, client)
    }

    /// A fresh client identity, pinning `server_key` (AES-256-GCM).
    fn client_auth(
        server_key: &crate::proto::crypto::StaticKeypair,
    ) -> crate::proto::crypto::ClientAuth {
        use crate::proto::crypto::{Cipher, ClientAuth, StaticKeypair};
        ClientAuth {
            identity: StaticKeypair::generate().unwrap(),
            server_key: server_key.public(),
            cipher: Cipher::Aes256Gcm,
        }
    }

    fn keyed_server(key: &crate::proto::crypto::StaticKeypair) -> Server {
        Server::new(open_limits(), 1 << 20, 2 << 20)
            .with_auth(ServerAuth {
                identity: Some(key.clone()),
                authorized: None,
                allow_plain: false,
            })
            .unwrap()
    }

    /// RFC 8899 §4.6.1: an ICMP "too big" starts the size probes only
    /// when the datagram it quotes is one this connection sent. The kernel
    /// checks the quoted addresses and ports; a forger who knows those
    /// but not what the connection wrote (the server's id for it and a
    /// packet number already used, in a protected datagram; this
    /// connection's id in a plain one) starts nothing.
    #[test]
    fn a_too_big_is_a_hint_only_when_it_quotes_a_datagram_of_this_connection() {
        use crate::proto::crypto::frame::{AAD_LEN, PROTECTED};
        use crate::proto::crypto::StaticKeypair;
        use std::cell::RefCell;
        for keyed in [true, false] {
            let server_key = StaticKeypair::generate().unwrap();
            let mut client = Client::new(&Tuning::default(), 17, Some(100 << 20), Time::ZERO)
                .unwrap()
                .with_size_watch(5, 28);
            let server = if keyed {
                client = client
                    .with_auth(client_auth(&server_key), 1_000_000_000)
                    .unwrap();
                keyed_server(&server_key)
            } else {
                Server::new(open_limits(), 1 << 20, 2 << 20)
            };
            let mut pair = pair(client, server, "delay 5ms");
            let sent: RefCell<Vec<Vec<u8>>> = RefCell::new(Vec::new());
            let mut tap = |_: Time, dir: Dir, d: Vec<u8>| {
                if dir == Dir::ToServer && d.len() > 1000 {
                    sent.borrow_mut().push(d.clone());
                }
                vec![(addr(1), d)]
            };
            pair.set_time_limit(Duration::from_millis(300));
            pair.run_until(&mut (), &mut tap, |_| false);
            let full = sent.borrow().last().expect("full-size data sent").clone();
            assert_eq!(full[3] & PROTECTED != 0, keyed);
            let quote = &full[..32];
            let altered = |at: usize| {
                let mut q = quote.to_vec();
                q[at] ^= 1;
                q
            };
            let c = &mut pair.client;
            // The recipient id (a protected datagram's) or the connection
            // id (a plain one's), wrong by one bit; a quote too short to
            // hold a header; what no datagram of atou starts with.
            assert!(!c.size_hint(1400, &altered(11)), "keyed {keyed}");
            assert!(!c.size_hint(1400, &quote[..8]), "keyed {keyed}");
            assert!(!c.size_hint(1400, &altered(0)), "keyed {keyed}");
            if keyed {
                // A packet number not yet sealed.
                let mut ahead = quote.to_vec();
                ahead[12..AAD_LEN].copy_from_slice(&(1u64 << 40).to_be_bytes());
                assert!(!c.size_hint(1400, &ahead));
            }
            // The datagram as it was sent: the probes start, once.
            assert!(c.size_hint(1400, quote), "keyed {keyed}");
            assert!(!c.size_hint(1400, quote), "keyed {keyed}");
        }
    }

    /// Opening a batch elsewhere ([`Server::open_job`], then
    /// [`Server::handle_opened`] in arrival order) keeps the replay rule:
    /// two copies of one datagram in a batch both get a ticket (the window
    /// moves only when one settles), and the second is dropped when it
    /// settles; a copy of a datagram already handled is refused at its
    /// ticket; a forged one fails its tag. Each is counted once.
    #[test]
    fn a_batch_opened_elsewhere_drops_its_replays_and_forgeries_once_each() {
        use crate::proto::crypto::StaticKeypair;
        let server_key = StaticKeypair::generate().unwrap();
        let (mut pair, held) = held_back_after_four(&server_key);
        let server = &mut pair.server;
        let before = *server.stats();
        let now = Time::ZERO + Duration::from_millis(200);
        let mut forged = held[1].clone();
        let last = forged.len() - 1;
        forged[last] ^= 1;
        let mut batch = [held[0].clone(), held[0].clone(), forged];
        let jobs: Vec<Opening> = batch.iter().map(|d| server.open_job(d)).collect();
        assert!(jobs.iter().all(|j| matches!(j, Opening::Job(_))));
        for (d, job) in batch.iter_mut().zip(jobs) {
            let Opening::Job(job) = job else {
                unreachable!()
            };
            let opened = job.open(d);
            server.handle_opened(now, addr(1), None, d, job, opened);
        }
        let after = *server.stats();
        assert_eq!(after.datagrams - before.datagrams, 3);
        // The second copy at its settle, the forgery at its tag.
        assert_eq!(after.crypto_dropped - before.crypto_dropped, 2);
        // The first copy again, in a later batch: refused at its ticket.
        assert!(matches!(server.open_job(&held[0]), Opening::Dropped));
        assert_eq!(server.stats().crypto_dropped - before.crypto_dropped, 3);
        // The real one the forgery stood for still opens.
        let mut real = held[1].clone();
        let Opening::Job(job) = server.open_job(&real) else {
            panic!("the real datagram was refused")
        };
        let opened = job.open(&mut real);
        assert!(opened.is_ok());
        server.handle_opened(now, addr(1), None, &mut real, job, opened);
        assert_eq!(server.stats().crypto_dropped - before.crypto_dropped, 3);
    }

    /// A keyed client and server 5 ms apart for 200 ms, the client's
    /// protected data past its first four datagrams held back (at least
    /// two): the pair, and those datagrams, to be handed to the server by
    /// hand.
    fn held_back_after_four(
        server_key: &crate::proto::crypto::StaticKeypair,
    ) -> (Pair, Vec<Vec<u8>>) {
        use std::cell::RefCell;
        let client = Client::new(&Tuning::default(), 17, Some(1 << 20), Time::ZERO)
            .unwrap()
            .with_auth(client_auth(server_key), 1_000_000_000)
            .unwrap();
        let mut pair = pair(client, keyed_server(server_key), "delay 5ms");
        let held: RefCell<Vec<Vec<u8>>> = RefCell::new(Vec::new());
        let mut delivered = 0;
        let mut tap = |_: Time, dir: Dir, d: Vec<u8>| {
            if dir == Dir::ToServer && frame::is_protected(&d) && d.len() > 1000 {
                delivered += 1;
                if delivered > 4 {
                    held.borrow_mut().push(d);
                    return vec![];
                }
            }
            vec![(addr(1), d)]
        };
        pair.set_time_limit(Duration::from_millis(200));
        pair.run_until(&mut (), &mut tap, |_| false);
        let held = held.into_inner();
        assert!(held.len() >= 2, "{} held back", held.len());
        (pair, held)
    }

    /// Answers leave from the address of this host their datagrams
    /// arrived at: a retry from the one its hello reached; a plain
    /// connection's welcome from the one its hello reached; an
    /// authenticated one's from the one its client's datagrams reach, and
    /// once it moved, from the one its new address reaches (its path
    /// challenge too), and from the old one again with the old address
    /// when the new path never answers (RFC 9000 §9.3.2).
    #[test]
    fn answers_leave_from_the_address_their_datagrams_arrived_at() {
        use crate::proto::crypto::StaticKeypair;
        let here = |last: u8| Some(IpAddr::from([127, 0, 0, last]));
        let mut out = [0u8; 2048];
        let mut strict = Server::new(ServerLimits::default(), 1 << 20, 2 << 20);
        strict.handle_datagram_at(Time::ZERO, addr(1), here(2), &mut hello(5, 1472, 0, 1024));
        let (to, local, n) = strict.poll_transmit_from(Time::ZERO, &mut out).unwrap();
        assert_eq!((to, local), (addr(1), here(2)));
        assert!(matches!(Packet::decode(&out[..n]), Ok(Packet::Retry(_))));
        let mut open = Server::new(open_limits(), 1 << 20, 2 << 20);
        open.handle_datagram_at(Time::ZERO, addr(1), here(3), &mut hello(5, 1472, 0, 1024));
        let (to, local, n) = open.poll_transmit_from(Time::ZERO, &mut out).unwrap();
        assert_eq!((to, local), (addr(1), here(3)));
        assert!(matches!(Packet::decode(&out[..n]), Ok(Packet::Welcome(_))));

        let server_key = StaticKeypair::generate().unwrap();
        let (mut pair, held) = held_back_after_four(&server_key);
        let server = &mut pair.server;
        let now = Time::ZERO + Duration::from_millis(200);
        let local_of = |server: &Server| {
            let conn = server.conns.values().next().expect("the connection");
            (conn.peer, conn.local)
        };
        assert_eq!(local_of(server), (addr(1), None));
        // The same address, arriving at another of this host's: answers
        // follow it (its ACK says so).
        server.handle_datagram_at(now, addr(1), here(2), &mut held[0].clone());
        assert_eq!(local_of(server), (addr(1), here(2)));
        let (to, local, _) = server.poll_transmit_from(now, &mut out).expect("an ACK");
        assert_eq!((to, local), (addr(1), here(2)));
        while server.poll_transmit_from(now, &mut out).is_some() {}
        // A move to another address, at a third address of this host.
        server.handle_datagram_at(now, addr(7), here(4), &mut held[1].clone());
        assert_eq!(server.stats().migrations, 1);
        assert_eq!(local_of(server), (addr(7), here(4)));
        let mut sent = Vec::new();
        while let Some((to, local, _)) = server.poll_transmit_from(now, &mut out) {
            sent.push((to, local));
        }
        assert!(!sent.is_empty());
        assert!(sent.iter().all(|&s| s == (addr(7), here(4))), "{sent:?}");
        // The new path never answers: back to the last one validated,
        // and the address it reached.
        server.handle_timeout(now + PATH_GIVE_UP + Duration::from_millis(1));
        assert_eq!(local_of(server), (addr(1), here(2)));
    }

    /// Counts what a session's application is told.
    #[derive(Default)]
    struct Told {
        opened: usize,
        arrived: u64,
        completed: usize,
        /// The connection ids of the events told, in order.
        ids: Vec<u64>,
    }

    impl SessionApp for Told {
        fn on_arrival(&mut self, _: Time, _: &mut Server, a: Arrival<'_>) {
            self.arrived += a.payload.len() as u64;
            self.ids.push(a.conn_id);
        }
        fn on_event(&mut self, _: Time, server: &mut Server, e: SessionEvent) {
            match e {
                SessionEvent::Opened { conn_id, .. } => {
                    self.opened += 1;
                    self.ids.push(conn_id);
                }
                SessionEvent::Complete { conn_id } => {
                    self.completed += 1;
                    self.ids.push(conn_id);
                    server.respond(conn_id, b"plan".to_vec());
                }
                SessionEvent::Ended { conn_id, .. } => self.ids.push(conn_id),
            }
        }
    }

    /// Runs an authenticated request of `len` bytes over a 100 ms round
    /// trip to a server of `key` (`without_early`: one from before early
    /// data); returns when the client had the reply, whether the server
    /// took the stream from the hello, the longest datagram the client
    /// sent, and what the application was told.
    fn early_request(len: usize, without_early: bool) -> (Duration, bool, usize, Told) {
        let (key, client) = early_client(len);
        let mut server = keyed_server(&key);
        server.without_early = without_early;
        let mut pair = pair(client, server, "delay 50ms");
        let mut longest = 0;
        let mut tap = |_: Time, dir: Dir, d: Vec<u8>| {
            if dir == Dir::ToServer {
                longest = longest.max(d.len());
            }
            vec![(addr(1), d)]
        };
        let mut told = Told::default();
        served_reply(
            &mut pair,
            Duration::from_secs(3),
            &mut tap,
            &mut told,
            b"plan",
        );
        let took = pair.now().saturating_since(Time::ZERO);
        (took, pair.client.early_taken(), longest, told)
    }

    /// A request of `len` bytes to a server with or `without_early`
    /// data: whether the hello's segment was `taken`, the reply in
    /// `round_trips` of 100 ms from the first hello, and the application
    /// told of the whole request once. Returns the longest datagram the
    /// client sent.
    #[track_caller]
    fn check_early(len: usize, without_early: bool, taken: bool, round_trips: u32) -> usize {
        let rtt = Duration::from_millis(100);
        let (took, was_taken, longest, told) = early_request(len, without_early);
        assert_eq!(was_taken, taken);
        assert!(
            took >= round_trips * rtt && took <= round_trips * rtt + Duration::from_millis(5),
            "{took:?}"
        );
        assert_eq!(
            (told.opened, told.arrived, told.completed),
            (1, len as u64, 1)
        );
        longest
    }

    /// A request that fits the hello rides it: the server places it as
    /// the connection's stream when it accepts the hello and pushes its
    /// answer after the welcome, so the reply is in one round trip after
    /// the first hello (two without: see
    /// `a_request_is_answered_in_two_round_trips_its_reply_pushed`), and
    /// the hello is still 1200 bytes.
    #[test]
    fn a_request_in_the_hello_is_answered_in_one_round_trip() {
        let longest = check_early(125, false, true, 1);
        assert_eq!(longest, handshake::HELLO_MIN_LEN);
    }

    /// A request longer than the hello's room goes after the welcome, as
    /// before: two round trips, and the hello's size unchanged.
    #[test]
    fn a_request_too_long_for_the_hello_goes_after_the_welcome() {
        let longest = check_early(1000, false, false, 2);
        assert!(longest <= handshake::HELLO_MIN_LEN);
    }

    /// A server from before early data refuses a hello whose parameters
    /// are longer than a hello: the client says its hello again without
    /// the request and goes on as before, a round trip later.
    #[test]
    fn a_server_without_early_data_gets_the_hello_again_without_the_request() {
        check_early(125, true, false, 3);
    }

    /// The first datagram `client` sends: its hello.
    fn first_hello(client: &mut Client) -> Vec<u8> {
        let mut buf = vec![0u8; 2048];
        let n = client
            .poll_transmit(Time::ZERO, &mut buf, &mut PatternSource)
            .unwrap();
        buf.truncate(n);
        buf
    }

    /// Drains what `server` tells its application into `told`.
    fn tell(server: &mut Server, told: &mut Told) {
        loop {
            while let Some(e) = server.poll_session_event() {
                told.on_event(Time::ZERO, server, e);
            }
            let Some(early) = server.poll_early_arrival() else {
                break;
            };
            told.on_arrival(Time::ZERO, server, early.as_arrival());
        }
    }

    /// The attack on early data: a hello carrying a request, captured and
    /// sent again, to the server that took it or to the same server
    /// restarted with its table of hello timestamps. Neither copy may
    /// have any effect: no connection opened, no byte of the request
    /// placed, nothing answered. And where the server keeps that table,
    /// the request takes effect only once the table that refuses its
    /// replay is saved, and never if it is not.
    #[test]
    fn a_replayed_hello_with_a_request_does_nothing() {
        let (key, mut client) = early_client(125);
        let hello = first_hello(&mut client);
        let from = addr(1);
        let mut buf = vec![0u8; 2048];
        let mut server = keyed_server(&key).keeping_hello_timestamps(Vec::new());
        let mut told = Told::default();
        server.handle_datagram(Time::ZERO, from, &mut hello.clone());
        tell(&mut server, &mut told);
        assert_eq!(told.arrived, 0, "placed before the table was saved");
        assert_eq!(told.completed, 0);
        let table = server.hello_timestamps_to_save().expect("a table to save");
        server.hello_timestamps_saved(true);
        tell(&mut server, &mut told);
        assert_eq!((told.opened, told.arrived, told.completed), (1, 125, 1));
        while server.poll_transmit(Time::ZERO, &mut buf).is_some() {}

        let at = Time::ZERO + Duration::from_millis(10);
        server.handle_datagram(at, from, &mut hello.clone());
        tell(&mut server, &mut told);
        assert_eq!((told.opened, told.arrived, told.completed), (1, 125, 1));
        assert!(server.hello_timestamps_to_save().is_none());
        assert!(
            server.poll_transmit(at, &mut buf).is_none(),
            "a copy answered"
        );
        assert_eq!(server.open_connections(), 1);

        let mut restarted = keyed_server(&key).keeping_hello_timestamps(table);
        let mut told = Told::default();
        restarted.handle_datagram(at, from, &mut hello.clone());
        tell(&mut restarted, &mut told);
        assert_eq!((told.opened, told.arrived, told.completed), (0, 0, 0));
        assert!(restarted.hello_timestamps_to_save().is_none());
        assert!(restarted.poll_transmit(at, &mut buf).is_none());
        assert_eq!(restarted.open_connections(), 0);

        // Not saved: the request never takes effect.
        let (key, mut client) = early_client(125);
        let hello = first_hello(&mut client);
        let mut server = keyed_server(&key).keeping_hello_timestamps(Vec::new());
        let mut told = Told::default();
        server.handle_datagram(Time::ZERO, from, &mut hello.clone());
        assert!(server.hello_timestamps_to_save().is_some());
        server.hello_timestamps_saved(false);
        tell(&mut server, &mut told);
        assert_eq!((told.arrived, told.completed), (0, 0));
        assert_eq!(server.open_connections(), 0);
    }

    /// Until the client's first packet confirms its keys, a connection
    /// whose request rode the hello is sent at most 3× the hello's bytes
    /// (RFC 9000 §8.1), the response included, however often its
    /// application pushes its answer; once confirmed, the rest goes.
    #[test]
    fn an_unconfirmed_client_is_sent_at_most_three_times_its_hello() {
        let (key, mut client) = early_client(125);
        let hello = first_hello(&mut client);
        let mut server = keyed_server(&key);
        let mut told = Told::default();
        server.handle_datagram(Time::ZERO, addr(1), &mut hello.clone());
        tell(&mut server, &mut told);
        assert_eq!(told.completed, 1);
        let (id, _) = server.conns.iter().next().map(|(&id, c)| (id, c)).unwrap();
        for _ in 0..8 {
            server.respond(id, vec![7; 5000]);
        }
        let mut buf = vec![0u8; 2048];
        let (mut sent, mut datagrams) = (0, 0);
        while let Some((_, n)) = server.poll_transmit(Time::ZERO, &mut buf) {
            sent += n;
            datagrams += 1;
        }
        assert!(datagrams >= 3, "response, ACK and answer: {datagrams}");
        assert!(
            sent <= 3 * hello.len(),
            "{sent} bytes to an unconfirmed client"
        );
        assert!(server.stats().unvalidated_held_back > 0);
    }

    /// A hello said again after its response was lost (a new Noise
    /// message, newer timestamp, same key and client id, same request)
    /// re-keys the connection that response made, in place: its
    /// application, told `Opened` and given the request once, is told
    /// nothing again; the one connection keeps its id and budgets, and
    /// the reply reaches the client under the new keys.
    #[test]
    fn a_hello_said_again_after_a_lost_response_re_keys_its_connection() {
        let (key, client) = early_client(125);
        let mut pair = pair(client, keyed_server(&key), "delay 50ms");
        let mut lost = false;
        let mut tap = |_: Time, dir: Dir, d: Vec<u8>| {
            if dir == Dir::ToClient && !lost {
                lost = true;
                return Vec::new();
            }
            vec![(addr(1), d)]
        };
        let mut told = Told::default();
        served_reply(
            &mut pair,
            Duration::from_secs(3),
            &mut tap,
            &mut told,
            b"plan",
        );
        assert!(pair.client.early_taken());
        assert_eq!((told.opened, told.arrived, told.completed), (1, 125, 1));
        assert!(told.ids.windows(2).all(|w| w[0] == w[1]), "{:?}", told.ids);
        let stats = pair.server.stats();
        assert_eq!((stats.connections, stats.handshakes), (1, 2));
    }

    /// The server's jobs waiting, run by hand (an offloading driver).
    fn run_jobs(server: &mut Server, now: Time) {
        while let Some(work) = server.poll_handshake_work() {
            server.handshake_done(now, work.run());
        }
    }

    /// The client's next hello, said again once its timer fires.
    fn hello_again(client: &mut Client, now: &mut Time) -> Vec<u8> {
        *now = client.poll_timeout().expect("a resend timer");
        client.handle_timeout(*now);
        let mut buf = vec![0u8; 2048];
        let n = client
            .poll_transmit(*now, &mut buf, &mut PatternSource)
            .expect("the hello again");
        buf.truncate(n);
        buf
    }

    /// A hello said twice more: the second re-key's keys are the ones
    /// installed, and the first re-key's response, made late, installs
    /// nothing and sends nothing; the application was told once.
    #[test]
    fn a_late_response_to_a_hello_said_again_installs_nothing() {
        let (key, mut client) = early_client(125);
        let mut server = keyed_server(&key).offload_handshakes();
        let mut told = Told::default();
        let mut buf = vec![0u8; 2048];
        let mut now = Time::ZERO;
        server.handle_datagram(now, addr(1), &mut first_hello(&mut client));
        run_jobs(&mut server, now);
        tell(&mut server, &mut told);
        assert_eq!((told.opened, told.arrived, told.completed), (1, 125, 1));
        // Its response, ACK and reply are lost.
        while server.poll_transmit(now, &mut buf).is_some() {}

        let mut second = hello_again(&mut client, &mut now);
        server.handle_datagram(now, addr(1), &mut second);
        let open = server.poll_handshake_work().expect("the hello's reading");
        server.handshake_done(now, open.run());
        let late = server.poll_handshake_work().expect("the response's making");

        let mut third = hello_again(&mut client, &mut now);
        server.handle_datagram(now, addr(1), &mut third);
        run_jobs(&mut server, now);
        server.handshake_done(now, late.run());
        tell(&mut server, &mut told);
        assert_eq!((told.opened, told.arrived, told.completed), (1, 125, 1));
        assert_eq!(server.open_connections(), 1);
        assert_eq!(server.stats().handshakes, 2, "the late one counted");

        // What goes out is the third hello's response, which the client
        // reads (taken), then the reply under its keys.
        let mut sent = Vec::new();
        while let Some((_, n)) = server.poll_transmit(now, &mut buf) {
            sent.push(buf[..n].to_vec());
        }
        assert!(!sent.is_empty());
        for d in &sent {
            client.handle_datagram(now, d).unwrap();
        }
        assert!(client.early_taken());
    }

    /// Notes when the connection ended, and how.
    struct Ends(Option<(Time, ConnEnd)>);

    impl SessionApp for Ends {
        fn on_event(&mut self, now: Time, _: &mut Server, e: SessionEvent) {
            if let SessionEvent::Ended { end, .. } = e {
                self.0 = Some((now, end));
            }
        }
    }

    /// A connection opened ahead of a stream that never comes (the plan
    /// was refused, or the round has fewer streams) closes without one:
    /// the server forgets it at once, not after its hello time.
    #[test]
    fn a_held_connection_abandoned_is_closed_at_once() {
        let client = Client::new(&Tuning::default(), 14, Some(0), Time::ZERO)
            .unwrap()
            .with_session(24)
            .with_stream_len_later();
        let server = Server::new(open_limits(), 1 << 20, 2 << 20);
        let mut pair = pair(client, server, "delay 50ms");
        pair.set_time_limit(Duration::from_secs(30));
        let mut app = Ends(None);
        pair.run_serving(&mut (), &mut straight, &mut app, |p| p.client.is_held());
        let held = pair.now();
        pair.client.abandon(held);
        let end = pair.run_past_client(&mut (), &mut straight, &mut app, |_| false);
        assert_eq!(end, RunEnd::Stalled);
        let closed = pair.client.outcome().unwrap().clone().unwrap();
        assert_eq!(closed.reply, None);
        let (at, end) = app.0.expect("the server ended the connection");
        assert_eq!(end, ConnEnd::Closed);
        let after = at.saturating_since(held);
        assert!(after <= Duration::from_millis(55), "ended {after:?} after");
    }

    /// A connection held longer than a server keeps one without data
    /// closes itself before the server would forget it as idle (which
    /// would fail the transfer's session): half the server's hello time.
    #[test]
    fn a_held_connection_closes_itself_before_the_server_forgets_it() {
        let tuning = Tuning {
            maxidle: Duration::from_secs(4),
            ..Tuning::default()
        };
        let client = Client::new(&tuning, 15, Some(0), Time::ZERO)
            .unwrap()
            .with_session(25)
            .with_stream_len_later();
        let server = Server::new(open_limits(), 1 << 20, 2 << 20);
        let mut pair = pair(client, server, "delay 50ms");
        pair.set_time_limit(Duration::from_secs(30));
        let mut app = Ends(None);
        let end = pair.run_past_client(&mut (), &mut straight, &mut app, |_| false);
        assert_eq!(end, RunEnd::Stalled);
        let closed = pair.client.outcome().unwrap().clone().unwrap();
        assert_eq!(closed.reply, None);
        let (at, end) = app.0.expect("the server ended the connection");
        assert_eq!(end, ConnEnd::Closed, "not forgotten as idle");
        let after = at.saturating_since(Time::ZERO);
        assert!(
            after >= Duration::from_secs(2) && after <= Duration::from_millis(2055),
            "ended after {after:?}"
        );
    }

    /// A request's client does not wait for its close to be acknowledged,
    /// so it sends it three times: with the first two lost the server
    /// still ends the connection on the third, at once, rather than after
    /// its idle time (which `serve --once` and the far end of an ssh copy
    /// would wait out before exiting).
    #[test]
    fn an_unacknowledged_close_goes_three_times_and_one_is_enough() {
        let tuning = Tuning::default();
        let client = Client::new(&tuning, 12, Some(3000), Time::ZERO)
            .unwrap()
            .with_session(22)
            .with_close_unacknowledged();
        let server = Server::new(open_limits(), 1 << 20, 2 << 20);
        /// Answers each request, and notes when its connection ended.
        struct Ends(Option<(Time, ConnEnd)>);
        impl SessionApp for Ends {
            fn on_event(&mut self, now: Time, server: &mut Server, e: SessionEvent) {
                match e {
                    SessionEvent::Complete { conn_id } => server.respond(conn_id, b"ok".to_vec()),
                    SessionEvent::Ended { end, .. } => self.0 = Some((now, end)),
                    SessionEvent::Opened { .. } => {}
                }
            }
        }
        let mut closes = 0;
        let mut first_two_closes_lost = |_: Time, dir: Dir, d: Vec<u8>| {
            if dir == Dir::ToServer && matches!(Packet::decode(&d), Ok(Packet::Close(_))) {
                closes += 1;
                if closes <= 2 {
                    return Vec::new();
                }
            }
            vec![(addr(1), d)]
        };
        let mut pair = pair(client, server, "");
        pair.set_time_limit(Duration::from_secs(30));
        let mut app = Ends(None);
        // On until the server too is done: the third close reaches it
        // after the client's end.
        let end = pair.run_past_client(&mut (), &mut first_two_closes_lost, &mut app, |p| {
            p.client.outcome().is_some() && p.server.open_connections() == 0
        });
        assert_eq!(end, RunEnd::Finished);
        assert_eq!(closes, UNACKNOWLEDGED_CLOSES);
        let closed = pair.client.outcome().unwrap().clone().unwrap();
        assert_eq!(closed.reply.as_deref(), Some(&b"ok"[..]));
        let (at, end) = app.0.expect("the server ended the connection");
        assert_eq!(end, ConnEnd::Closed);
        assert!(at < Time::ZERO + Duration::from_millis(50), "{at:?}");
    }
}

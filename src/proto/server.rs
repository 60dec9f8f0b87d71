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

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::time::Duration;

use serde::Serialize;

use super::payload::pattern_mismatch;
use super::receiver::{Receiver, ReceiverConfig, ReceiverStats};
use super::time::Time;
use super::wire::{
    CloseAck, HeaderPeek, Hello, Packet, ReceiverParams, Reject, RejectReason, Reply, Welcome,
    DATA_HEADER_LEN, REPLY_HEADER_LEN, VERSION,
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
pub struct ConnReport {
    pub conn_id: u64,
    /// The file-transfer session, 0 for a probe.
    pub session: u64,
    pub peer: SocketAddr,
    pub end: ConnEnd,
    /// From the hello to the close (or the last packet).
    pub secs: f64,
    pub stats: ReceiverStats,
    /// Segments the client said it sent, from its close.
    pub client_segments: Option<u64>,
    /// Bytes that were not the test pattern (0 on an intact path).
    pub corrupt_bytes: u64,
    pub maxidle_secs: f64,
    /// The server-wide counters when this report was made.
    pub server: ServerStats,
}

/// Something for the operator that is not a connection report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    /// A hello in a protocol version this server does not speak.
    VersionRejected {
        peer: SocketAddr,
        theirs: u8,
    },
    BadHello {
        peer: SocketAddr,
        why: String,
    },
    /// A hello refused because the server is at one of its limits.
    Busy {
        peer: SocketAddr,
        why: String,
    },
    /// Refusals not shown in the last second (over [`NOTICES_PER_SEC`]).
    Suppressed {
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
            Notice::Suppressed { count } => {
                write!(f, "{count} more refusals in the last second not shown")
            }
        }
    }
}

/// A segment's offset is its number times the payload size, and only the
/// last one (FIN) may be short.
fn placement_ok(seg: &super::wire::DataSegment<'_>, payload_size: u64) -> bool {
    let h = &seg.header;
    let len = seg.payload.len() as u64;
    h.seg.checked_mul(payload_size) == Some(h.offset)
        && (len == payload_size || (h.flags.fin && len <= payload_size))
}

/// Something a session connection's application must act on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionEvent {
    /// A hello opened connection `conn_id` in `session`.
    Opened {
        conn_id: u64,
        session: u64,
        peer: SocketAddr,
        /// Stream bytes per segment, for [`Server::release`].
        payload_size: u64,
    },
    /// Every byte of the connection's stream has arrived; the client now
    /// waits for the reply ([`Server::respond`]).
    Complete { conn_id: u64 },
    /// The connection is gone: closed after its reply, or idle.
    Ended { conn_id: u64, end: ConnEnd },
}

/// New stream bytes of a session connection, for its application to place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arrival<'a> {
    pub conn_id: u64,
    pub session: u64,
    pub offset: u64,
    pub payload: &'a [u8],
}

#[derive(Debug)]
struct Conn {
    peer: SocketAddr,
    /// 0 for a probe (a sink), else the session its data is for.
    session: u64,
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
    welcome_pending: bool,
    close_ack_pending: bool,
    closed_at: Option<Time>,
    client_segments: Option<u64>,
    corrupt_bytes: u64,
    /// In the ready queue.
    queued: bool,
    /// A data segment has arrived: until then the connection is a hello
    /// that may go nowhere, and expires after `hello_idle`.
    heard_data: bool,
    /// Receive window held for a session connection, in bytes.
    window_bytes: u64,
}

impl Conn {
    fn deadline(&self, hello_idle: Duration) -> Time {
        match self.closed_at {
            Some(at) => self.last_heard.max(at) + LINGER,
            // Counted from the first hello, not the last: repeating a
            // hello does not keep a connection that never sends.
            None if !self.heard_data => self.opened + self.maxidle.min(hello_idle),
            None => self.last_heard + self.maxidle,
        }
    }

    fn poll_timeout(&self, hello_idle: Duration) -> Time {
        let d = self.deadline(hello_idle);
        self.receiver.poll_timeout().map_or(d, |t| t.min(d))
    }

    fn report(&self, conn_id: u64, end: ConnEnd, until: Time, server: ServerStats) -> ConnReport {
        ConnReport {
            conn_id,
            session: self.session,
            peer: self.peer,
            end,
            secs: until.saturating_since(self.opened).as_secs_f64(),
            stats: *self.receiver.stats(),
            client_segments: self.client_segments,
            corrupt_bytes: self.corrupt_bytes,
            maxidle_secs: self.maxidle.as_secs_f64(),
            server,
        }
    }
}

/// Bounds on what a client may ask for: the operator's budgets.
#[derive(Debug, Clone, Copy)]
pub struct ServerLimits {
    /// Largest receiver buffer, in segments, granted to one connection.
    pub max_rcvsegs: u32,
    /// Most connections open at once.
    pub max_connections: usize,
    /// Most connections open at once from one IP address.
    pub max_connections_per_ip: usize,
    /// Largest receive window of one session connection, in bytes: what
    /// its application may have to hold for it.
    pub max_window_bytes: u64,
    /// All session connections' windows together, in bytes.
    pub total_window_bytes: u64,
    /// A connection that has sent no data expires after this long.
    pub hello_idle: Duration,
    /// The socket receive buffer is never grown past this, whatever a
    /// hello asks (the operator's own setting).
    pub max_socket_rcvbuf: u32,
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
        }
    }
}

#[derive(Debug)]
pub struct Server {
    limits: ServerLimits,
    conns: HashMap<u64, Conn>,
    ready: VecDeque<u64>,
    rejects: VecDeque<(SocketAddr, Reject)>,
    reports: VecDeque<ConnReport>,
    notices: VecDeque<Notice>,
    session_events: VecDeque<SessionEvent>,
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
}

impl Server {
    /// A server whose socket was given `rcvbuf_set` bytes of receive
    /// buffer, which the kernel reports as `rcvbuf_granted`.
    pub fn new(limits: ServerLimits, rcvbuf_set: u32, rcvbuf_granted: u32) -> Server {
        Server {
            limits,
            conns: HashMap::new(),
            ready: VecDeque::new(),
            rejects: VecDeque::new(),
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
        }
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
    pub fn windows_held(&self) -> u64 {
        self.windows_held
    }

    pub fn stats(&self) -> &ServerStats {
        &self.stats
    }

    pub fn open_connections(&self) -> usize {
        self.conns.len()
    }

    /// A socket receive buffer larger than any set before, asked for by a
    /// hello; the I/O layer sets it and calls [`Server::set_socket_rcvbuf`]
    /// before draining transmits, so the welcome reports the result. Each
    /// size is asked for once: a kernel that capped it would cap it again.
    pub fn wanted_rcvbuf(&self) -> Option<u32> {
        self.pending_rcvbuf
    }

    /// Records what the kernel reports after the socket was resized.
    pub fn set_socket_rcvbuf(&mut self, granted: u32) {
        self.granted_rcvbuf = granted;
        self.pending_rcvbuf = None;
    }

    fn enqueue(&mut self, conn_id: u64) {
        if let Some(c) = self.conns.get_mut(&conn_id) {
            if !c.queued {
                c.queued = true;
                self.ready.push_back(conn_id);
            }
        }
    }

    /// Handles one datagram from `from`. New data of a session connection
    /// is returned for the application to place; a probe's is only counted
    /// and checked against the test pattern.
    pub fn handle_datagram<'a>(
        &mut self,
        now: Time,
        from: SocketAddr,
        datagram: &'a [u8],
    ) -> Option<Arrival<'a>> {
        self.stats.datagrams += 1;
        let Some(peek) = HeaderPeek::read(datagram) else {
            self.stats.undecodable += 1;
            return None;
        };
        if peek.version != VERSION {
            if peek.is_hello() {
                self.stats.version_rejects += 1;
                self.notice(
                    now,
                    Notice::VersionRejected {
                        peer: from,
                        theirs: peek.version,
                    },
                );
                self.reject(from, peek.conn_id, RejectReason::UnsupportedVersion);
            } else {
                self.stats.undecodable += 1;
            }
            return None;
        }
        let packet = match Packet::decode(datagram) {
            Ok(p) => p,
            Err(_) => {
                self.stats.undecodable += 1;
                return None;
            }
        };
        if let Packet::Hello(hello) = packet {
            self.on_hello(now, from, &hello);
            return None;
        }
        let conn_id = peek.conn_id;
        let Some(conn) = self.conns.get_mut(&conn_id).filter(|c| c.peer == from) else {
            self.stats.unknown_connection += 1;
            return None;
        };
        conn.last_heard = now;
        conn.heard_data |= matches!(packet, Packet::Data(_));
        let mut arrival = None;
        match packet {
            // A session's data must sit where its number says: a header
            // changed on the way (the UDP checksum missed it, or a relay
            // corrupted after it) must not place bytes at the wrong
            // offset. Such a segment is as good as lost.
            Packet::Data(seg)
                if conn.session != 0
                    && !placement_ok(&seg, u64::from(conn.mss) - DATA_HEADER_LEN as u64) =>
            {
                self.stats.undecodable += 1;
                return None;
            }
            Packet::Data(seg) if conn.closed_at.is_none() => {
                // Answered early: say so again, now and then, until the
                // client stops sending and fetches.
                if conn.reply.is_some() && seg.header.seg % 32 == 0 && conn.fetches.is_empty() {
                    conn.fetches.push_back(0);
                }
                if let Ok(Some(new)) = conn.receiver.handle_segment(now, &seg) {
                    if conn.session != 0 {
                        arrival = Some(Arrival {
                            conn_id,
                            session: conn.session,
                            offset: new.offset,
                            payload: new.payload,
                        });
                    } else if pattern_mismatch(new.offset, new.payload).is_some() {
                        conn.corrupt_bytes += new.payload.len() as u64;
                    }
                }
                if conn.session != 0 && !conn.complete_told && conn.receiver.is_complete() {
                    conn.complete_told = true;
                    self.session_events
                        .push_back(SessionEvent::Complete { conn_id });
                }
            }
            Packet::Fetch(f) if conn.session != 0 => {
                if conn.fetches.len() < FETCH_QUEUE_MAX && !conn.fetches.contains(&f.offset) {
                    conn.fetches.push_back(f.offset);
                }
            }
            // Data after the close is a late copy; the close said all was acknowledged.
            Packet::Data(_) => {}
            Packet::Close(close) => {
                conn.close_ack_pending = true;
                if conn.closed_at.is_none() {
                    conn.closed_at = Some(now);
                    conn.client_segments = Some(close.segments);
                    let report = conn.report(conn_id, ConnEnd::Closed, now, self.stats);
                    self.reports.push_back(report);
                    // A closed connection lingers only to answer repeated
                    // closes: its window goes back to the budget now.
                    let freed = std::mem::take(&mut conn.window_bytes);
                    self.windows_held -= freed;
                    if let Some((_, bytes)) = self.per_ip.get_mut(&from.ip()) {
                        *bytes = bytes.saturating_sub(freed);
                    }
                    if conn.session != 0 {
                        self.session_events.push_back(SessionEvent::Ended {
                            conn_id,
                            end: ConnEnd::Closed,
                        });
                    }
                }
            }
            _ => {
                self.stats.unexpected += 1;
                return None;
            }
        }
        self.enqueue(conn_id);
        arrival
    }

    fn on_hello(&mut self, now: Time, from: SocketAddr, hello: &Hello) {
        if let Some(conn) = self.conns.get_mut(&hello.conn_id) {
            if conn.peer == from {
                // Our welcome was lost: say it again.
                conn.last_heard = now;
                conn.welcome_pending = true;
                self.enqueue(hello.conn_id);
            } else {
                self.stats.unknown_connection += 1;
            }
            return;
        }
        let p = hello.receiver;
        let bad = if !(DATA_HEADER_LEN as u32 + 1..=MSS_MAX).contains(&hello.mss) {
            Some(format!(
                "mss {} outside {}..={MSS_MAX}",
                hello.mss,
                DATA_HEADER_LEN + 1
            ))
        } else if p.rcvsegs == 0 {
            Some("a receiver buffer of 0 segments".to_string())
        } else {
            None
        };
        let payload = u64::from(hello.mss.saturating_sub(DATA_HEADER_LEN as u32).max(1));
        let limits = self.limits;
        // A session connection's window is memory its application holds:
        // granted from the operator's budget, never more than asked.
        let rcvsegs = u64::from(p.rcvsegs.min(limits.max_rcvsegs))
            .min(limits.max_window_bytes / payload)
            .max(1);
        let window_bytes = if hello.session == 0 {
            0
        } else {
            rcvsegs * payload
        };
        let (from_ip, ip_window) = self.per_ip.get(&from.ip()).copied().unwrap_or((0, 0));
        // One address may hold half the window budget (at least
        // one connection's worth), so a flood from one cannot starve the rest.
        let ip_window_cap = (limits.total_window_bytes / 2).max(limits.max_window_bytes);
        let busy = if bad.is_some() {
            None
        } else if self.conns.len() >= limits.max_connections {
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
        };
        if let Some(why) = bad {
            self.stats.bad_hellos += 1;
            self.notice(now, Notice::BadHello { peer: from, why });
            self.reject(from, hello.conn_id, RejectReason::BadHello);
            return;
        }
        if let Some(why) = busy {
            self.stats.busy_rejects += 1;
            self.notice(now, Notice::Busy { peer: from, why });
            self.reject(from, hello.conn_id, RejectReason::Busy);
            return;
        }
        let params = ReceiverParams {
            rcvsegs: rcvsegs as u32,
            ..p
        };
        if p.rcvbuf > self.largest_rcvbuf_asked && p.rcvbuf <= limits.max_socket_rcvbuf {
            self.largest_rcvbuf_asked = p.rcvbuf;
            self.pending_rcvbuf = Some(p.rcvbuf);
        }
        let config = ReceiverConfig {
            sack: params.sack,
            delack: Duration::from_micros(u64::from(params.delack_us)),
            rcvsegs: params.rcvsegs,
        };
        let maxidle = match Duration::from_millis(u64::from(hello.maxidle_ms)) {
            d if d.is_zero() => MAXIDLE_CAP,
            d => d.min(MAXIDLE_CAP),
        };
        self.stats.connections += 1;
        let receiver = if hello.session == 0 {
            Receiver::sink(config, hello.conn_id)
        } else {
            self.session_events.push_back(SessionEvent::Opened {
                conn_id: hello.conn_id,
                session: hello.session,
                peer: from,
                payload_size: u64::from(hello.mss) - DATA_HEADER_LEN as u64,
            });
            Receiver::placing(config, hello.conn_id)
        };
        self.conns.insert(
            hello.conn_id,
            Conn {
                peer: from,
                session: hello.session,
                mss: hello.mss,
                reply: None,
                fetches: VecDeque::new(),
                complete_told: false,
                receiver,
                params,
                opened: now,
                last_heard: now,
                maxidle,
                welcome_pending: true,
                close_ack_pending: false,
                closed_at: None,
                client_segments: None,
                corrupt_bytes: 0,
                queued: false,
                heard_data: false,
                window_bytes,
            },
        );
        self.windows_held += window_bytes;
        let ip = self.per_ip.entry(from.ip()).or_insert((0, 0));
        ip.0 += 1;
        ip.1 += window_bytes;
        self.enqueue(hello.conn_id);
    }

    fn reject(&mut self, to: SocketAddr, conn_id: u64, reason: RejectReason) {
        // Rejects are sent once per hello and are no longer than it: no
        // amplification, and a queue bounded by what arrived.
        if self.rejects.len() < FETCH_QUEUE_MAX {
            self.rejects.push_back((
                to,
                Reject {
                    conn_id,
                    reason,
                    version: VERSION,
                },
            ));
        }
    }

    /// Writes the next datagram into `buf` (at least
    /// [`super::wire::CONTROL_MAX_LEN`] and [`super::wire::ACK_MAX_LEN`]
    /// bytes); returns where to send it and its length.
    pub fn poll_transmit(&mut self, now: Time, buf: &mut [u8]) -> Option<(SocketAddr, usize)> {
        if let Some((to, reject)) = self.rejects.pop_front() {
            return reject.emit(buf).ok().map(|n| (to, n));
        }
        while let Some(&conn_id) = self.ready.front() {
            let granted_rcvbuf = self.granted_rcvbuf;
            let Some(conn) = self.conns.get_mut(&conn_id) else {
                self.ready.pop_front();
                continue;
            };
            if conn.welcome_pending {
                conn.welcome_pending = false;
                let welcome = Welcome {
                    conn_id,
                    receiver: ReceiverParams {
                        rcvbuf: granted_rcvbuf,
                        ..conn.params
                    },
                };
                return welcome.emit(buf).ok().map(|n| (conn.peer, n));
            }
            if let Some(n) = conn.receiver.poll_transmit(now, buf) {
                return Some((conn.peer, n));
            }
            if let Some(offset) = conn.fetches.pop_front() {
                let reply = match &conn.reply {
                    None => {
                        // One "not yet" answers every fetch queued.
                        conn.fetches.clear();
                        Reply::Pending { conn_id }
                    }
                    Some(bytes) => {
                        let total = u32::try_from(bytes.len()).unwrap_or(u32::MAX);
                        let start = (offset as usize).min(bytes.len());
                        let end = (start + reply_fragment_len(conn.mss)).min(bytes.len());
                        if start == end && total != 0 {
                            continue;
                        }
                        Reply::Fragment {
                            conn_id,
                            offset,
                            total,
                            data: &bytes[start..end],
                        }
                    }
                };
                return reply.emit(buf).ok().map(|n| (conn.peer, n));
            }
            if conn.close_ack_pending {
                conn.close_ack_pending = false;
                let ack = CloseAck {
                    conn_id,
                    stats: *conn.receiver.stats(),
                };
                return ack.emit(buf).ok().map(|n| (conn.peer, n));
            }
            conn.queued = false;
            self.ready.pop_front();
        }
        None
    }

    pub fn poll_timeout(&self) -> Option<Time> {
        let hello_idle = self.limits.hello_idle;
        self.conns
            .values()
            .map(|c| c.poll_timeout(hello_idle))
            .min()
    }

    /// The longest datagram [`Server::poll_transmit`] writes.
    pub const MAX_TRANSMIT_LEN: usize = REPLY_HEADER_LEN + REPLY_FRAGMENT_MAX;

    /// The application has placed every byte of `conn_id`'s stream below
    /// `offset`: its window may move on.
    pub fn release(&mut self, conn_id: u64, offset: u64) {
        let Some(conn) = self.conns.get_mut(&conn_id) else {
            return;
        };
        let payload = u64::from(conn.mss) - DATA_HEADER_LEN as u64;
        conn.receiver.release(offset / payload);
        self.enqueue(conn_id);
    }

    /// The application's answer to `conn_id`'s stream, sent as the client
    /// fetches it. Replies longer than 4 GiB are not representable.
    ///
    /// A reply before the stream is complete (the application failed) is
    /// pushed to the client unasked, and again now and then while data
    /// keeps coming: the client stops sending and fetches the rest.
    pub fn respond(&mut self, conn_id: u64, reply: Vec<u8>) {
        debug_assert!(u32::try_from(reply.len()).is_ok());
        let Some(conn) = self.conns.get_mut(&conn_id) else {
            return;
        };
        conn.reply = Some(reply);
        if !conn.receiver.is_complete() {
            conn.fetches.push_back(0);
            self.enqueue(conn_id);
        }
    }

    pub fn poll_session_event(&mut self) -> Option<SessionEvent> {
        self.session_events.pop_front()
    }

    pub fn handle_timeout(&mut self, now: Time) {
        let mut expired = Vec::new();
        let mut woken = Vec::new();
        for (&id, conn) in &mut self.conns {
            if conn.receiver.poll_timeout().is_some_and(|t| t <= now) {
                conn.receiver.handle_timeout(now);
                woken.push(id);
            }
            if conn.deadline(self.limits.hello_idle) <= now {
                expired.push(id);
            }
        }
        for id in woken {
            self.enqueue(id);
        }
        for id in expired {
            let conn = self.remove_conn(id).expect("listed above");
            if conn.closed_at.is_none() {
                self.reports
                    .push_back(conn.report(id, ConnEnd::Idle, conn.last_heard, self.stats));
                if conn.session != 0 {
                    self.session_events.push_back(SessionEvent::Ended {
                        conn_id: id,
                        end: ConnEnd::Idle,
                    });
                }
            }
        }
    }

    pub fn poll_report(&mut self) -> Option<ConnReport> {
        self.reports.pop_front()
    }

    pub fn poll_notice(&mut self) -> Option<Notice> {
        self.notices.pop_front()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::client::Client;
    use crate::proto::payload::{PatternSource, PayloadSource};
    use crate::proto::Tuning;

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    /// True once the client is done; else a millisecond passes for both.
    fn done_or_tick(now: &mut Time, client: &mut Client, server: &mut Server) -> bool {
        if client.outcome().is_some() {
            return true;
        }
        *now += Duration::from_millis(1);
        client.handle_timeout(*now);
        server.handle_timeout(*now);
        false
    }

    /// Client and server wired back to back, no loss: the whole life of a
    /// connection, and garbage in between.
    #[test]
    fn hello_transfer_close_with_garbage_in_between() {
        let tuning = Tuning {
            mss: 200,
            ..Tuning::default()
        };
        let mut now = Time::ZERO;
        let mut client = Client::new(&tuning, 42, Some(10_000), now).unwrap();
        let mut server = Server::new(ServerLimits::default(), 1 << 20, 2 << 20);
        let mut buf = vec![0u8; 2048];
        for round in 0..10_000 {
            while let Some(n) = client.poll_transmit(now, &mut buf, &mut PatternSource) {
                server.handle_datagram(now, addr(1), &buf[..n]);
                // Garbage and a stranger's packet between real ones.
                server.handle_datagram(now, addr(1), b"not atou at all");
                server.handle_datagram(now, addr(2), &buf[..n]);
                let mut out = vec![0u8; 2048];
                while let Some((to, m)) = server.poll_transmit(now, &mut out) {
                    assert_eq!(to, addr(1));
                    let _ = client.handle_datagram(now, &out[..m]);
                }
            }
            if done_or_tick(&mut now, &mut client, &mut server) {
                break;
            }
            assert!(round < 9_999, "did not finish");
        }
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

    #[test]
    fn foreign_version_hello_is_rejected_with_our_version() {
        let mut server = Server::new(ServerLimits::default(), 1 << 20, 2 << 20);
        let mut hello = vec![0u8; 64];
        let n = Hello {
            conn_id: 5,
            mss: 1472,
            maxidle_ms: 1000,
            session: 0,
            receiver: ReceiverParams {
                rcvsegs: 10,
                rcvbuf: 1024,
                delack_us: 0,
                sack: true,
            },
        }
        .emit(&mut hello)
        .unwrap();
        hello[2] = VERSION + 1;
        server.handle_datagram(Time::ZERO, addr(9), &hello[..n]);
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
            Some(Err(crate::proto::client::ConnError::VersionMismatch { theirs })) if *theirs == VERSION
        ));
    }

    #[test]
    fn an_idle_connection_is_reported_and_forgotten() {
        let tuning = Tuning {
            maxidle: Duration::from_secs(3),
            ..Tuning::default()
        };
        let mut client = Client::new(&tuning, 7, Some(1_000_000), Time::ZERO).unwrap();
        let mut server = Server::new(ServerLimits::default(), 1 << 20, 2 << 20);
        let mut buf = vec![0u8; 2048];
        let n = client
            .poll_transmit(Time::ZERO, &mut buf, &mut PatternSource)
            .unwrap();
        server.handle_datagram(Time::ZERO, addr(1), &buf[..n]);
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
            Some(Err(crate::proto::client::ConnError::Idle { .. }))
        ));
    }

    #[test]
    fn each_larger_socket_buffer_is_asked_for_once_and_never_past_the_operators_cap() {
        let limits = ServerLimits {
            max_socket_rcvbuf: 16 << 20,
            ..ServerLimits::default()
        };
        let mut server = Server::new(limits, 4 << 20, 8 << 20);
        let hello = |conn_id, rcvbuf| {
            let mut b = [0u8; 64];
            let n = Hello {
                conn_id,
                mss: 1472,
                maxidle_ms: 1000,
                session: 0,
                receiver: ReceiverParams {
                    rcvsegs: 10,
                    rcvbuf,
                    delack_us: 0,
                    sack: true,
                },
            }
            .emit(&mut b)
            .unwrap();
            b[..n].to_vec()
        };
        let mut out = [0u8; 128];
        let welcome_rcvbuf = |server: &mut Server, out: &mut [u8]| {
            let (_, n) = server.poll_transmit(Time::ZERO, out).unwrap();
            match Packet::decode(&out[..n]).unwrap() {
                Packet::Welcome(w) => w.receiver.rcvbuf,
                other => panic!("{other:?}"),
            }
        };
        // No more than the server's own setting: nothing to do.
        server.handle_datagram(Time::ZERO, addr(1), &hello(1, 4 << 20));
        assert_eq!(server.wanted_rcvbuf(), None);
        assert_eq!(welcome_rcvbuf(&mut server, &mut out), 8 << 20);
        // More: asked once; the welcome carries what the kernel granted.
        server.handle_datagram(Time::ZERO, addr(2), &hello(2, 16 << 20));
        assert_eq!(server.wanted_rcvbuf(), Some(16 << 20));
        server.set_socket_rcvbuf(12 << 20);
        assert_eq!(welcome_rcvbuf(&mut server, &mut out), 12 << 20);
        // The same size again, though capped: not asked again.
        server.handle_datagram(Time::ZERO, addr(3), &hello(3, 16 << 20));
        assert_eq!(server.wanted_rcvbuf(), None);
        // Past the operator's cap (2 GiB, as SO_RCVBUFFORCE would give
        // root): never asked for.
        let _ = welcome_rcvbuf(&mut server, &mut out);
        server.handle_datagram(Time::ZERO, addr(4), &hello(4, 2 << 30));
        assert_eq!(server.wanted_rcvbuf(), None);
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
        let mut now = Time::ZERO;
        let mut client = Client::new(&tuning, 9, Some(LEN as u64), now)
            .unwrap()
            .with_session(77);
        let mut server = Server::new(ServerLimits::default(), 1 << 20, 2 << 20);
        let mut placed = vec![None::<u8>; LEN];
        let mut released = 0u64;
        let reply: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
        let (mut to_server, mut to_client) = (0u64, 0u64);
        let mut buf = vec![0u8; 2048];
        let mut out = vec![0u8; 2048];
        for round in 0..100_000 {
            while let Some(n) = client.poll_transmit(now, &mut buf, &mut PatternSource) {
                to_server += 1;
                if to_server % 7 == 0 {
                    continue;
                }
                if let Some(a) = server.handle_datagram(now, addr(1), &buf[..n]) {
                    assert_eq!((a.conn_id, a.session), (9, 77));
                    for (i, &b) in a.payload.iter().enumerate() {
                        let at = a.offset as usize + i;
                        assert!(placed[at].replace(b).is_none(), "byte {at} twice");
                    }
                }
                while let Some((_, m)) = server.poll_transmit(now, &mut out) {
                    to_client += 1;
                    if to_client % 7 != 0 {
                        let _ = client.handle_datagram(now, &out[..m]);
                    }
                }
            }
            // The application frees its buffer slowly: a window's worth
            // every 5 ms, up to what has arrived in order.
            if round % 5 == 0 {
                let in_order = placed.iter().take_while(|b| b.is_some()).count() as u64;
                released = in_order.min(released + 2000);
                server.release(9, released);
            }
            while let Some(e) = server.poll_session_event() {
                match e {
                    SessionEvent::Opened { payload_size, .. } => assert_eq!(payload_size, 167),
                    SessionEvent::Complete { conn_id } => server.respond(conn_id, reply.clone()),
                    SessionEvent::Ended { end, .. } => assert_eq!(end, ConnEnd::Closed),
                }
            }
            while let Some((_, m)) = server.poll_transmit(now, &mut out) {
                to_client += 1;
                if to_client % 7 != 0 {
                    let _ = client.handle_datagram(now, &out[..m]);
                }
            }
            if done_or_tick(&mut now, &mut client, &mut server) {
                break;
            }
            assert!(round < 99_999, "did not finish");
        }
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
        let mut now = Time::ZERO;
        let mut client = Client::new(&tuning, 3, Some(10_000_000), now)
            .unwrap()
            .with_session(5);
        let mut server = Server::new(ServerLimits::default(), 1 << 20, 2 << 20);
        let mut buf = vec![0u8; 2048];
        let mut out = vec![0u8; 2048];
        let mut answered = false;
        for round in 0..10_000 {
            while let Some(n) = client.poll_transmit(now, &mut buf, &mut PatternSource) {
                if server.handle_datagram(now, addr(1), &buf[..n]).is_some() && !answered {
                    answered = true;
                    server.respond(3, b"disk full".to_vec());
                }
                while let Some((_, m)) = server.poll_transmit(now, &mut out) {
                    let _ = client.handle_datagram(now, &out[..m]);
                }
            }
            if done_or_tick(&mut now, &mut client, &mut server) {
                break;
            }
            assert!(round < 9_999, "did not finish");
        }
        let closed = client.outcome().unwrap().clone().unwrap();
        assert_eq!(closed.reply.as_deref(), Some(&b"disk full"[..]));
        let report = server.poll_report().unwrap();
        assert!(
            report.stats.bytes < 1_000_000,
            "{} bytes sent",
            report.stats.bytes
        );
    }
}

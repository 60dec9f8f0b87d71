//! The control packets: hello, retry, welcome, close, close-ack, reject,
//! fetch, reply, path challenge and response.

use super::codec::{Reader, SliceWriter, Writer};
use super::header::{self, emit_header, HeaderPeek, HEADER_LEN};
use super::header::{
    KIND_CLOSE, KIND_CLOSE_ACK, KIND_FETCH, KIND_HELLO, KIND_PATH_CHALLENGE, KIND_PATH_RESPONSE,
    KIND_REJECT, KIND_REPLY, KIND_RETRY, KIND_WELCOME,
};
use super::{check_len, exact_len, WireError};

/// Bytes of an address token: a MAC the server alone can make, of the
/// client's IP address and the time (`crypto::cookie`).
pub const TOKEN_LEN: usize = 16;
/// An address token, as a retry carries it and a hello echoes it.
pub type AddressToken = [u8; TOKEN_LEN];

/// Lengths of the control packets.
pub const HELLO_LEN: usize = field::hello::PARAMS.end;
pub const WELCOME_LEN: usize = field::welcome::PARAMS.end;
pub const CLOSE_LEN: usize = field::close::BYTES.end;
pub const CLOSE_ACK_LEN: usize = field::close_ack::STATS.end;
pub const REJECT_LEN: usize = field::reject::VERSION.end;
pub const FETCH_LEN: usize = field::fetch::OFFSET.end;
pub const PATH_LEN: usize = field::path::TOKEN.end;
/// A hello with an address token after it.
pub const HELLO_WITH_TOKEN_LEN: usize = field::hello::TOKEN.end;
pub const RETRY_LEN: usize = field::retry::TOKEN.end;
/// Bytes of a reply before its fragment.
pub const REPLY_HEADER_LEN: usize = field::reply::DATA;
/// The longest control packet.
pub const CONTROL_MAX_LEN: usize = CLOSE_ACK_LEN;

/// Every fixed field of every control packet, named once.
mod field {
    use super::super::codec::Field;
    use super::HEADER_LEN;

    /// Inside a hello or a welcome: the receiver's parameters.
    pub(super) mod params {
        use super::Field;

        pub(crate) const RCVSEGS: Field = 0..4;
        pub(crate) const RCVBUF: Field = RCVSEGS.end..RCVSEGS.end + 4;
        pub(crate) const DELACK_US: Field = RCVBUF.end..RCVBUF.end + 4;
        pub(crate) const FLAGS: Field = DELACK_US.end..DELACK_US.end + 1;
        pub(crate) const QUICKACK: Field = FLAGS.end..FLAGS.end + 2;
        pub(crate) const LEN: usize = QUICKACK.end;
    }

    pub(super) mod hello {
        use super::{params, Field, HEADER_LEN};

        pub(crate) const MSS: Field = HEADER_LEN..HEADER_LEN + 4;
        pub(crate) const MAXIDLE_MS: Field = MSS.end..MSS.end + 4;
        pub(crate) const SESSION: Field = MAXIDLE_MS.end..MAXIDLE_MS.end + 8;
        pub(crate) const PARAMS: Field = SESSION.end..SESSION.end + params::LEN;
        /// Only in a hello sent again after a retry.
        pub(crate) const TOKEN: Field = PARAMS.end..PARAMS.end + super::super::TOKEN_LEN;
    }

    pub(super) mod welcome {
        use super::{params, Field, HEADER_LEN};

        pub(crate) const PARAMS: Field = HEADER_LEN..HEADER_LEN + params::LEN;
    }

    pub(super) mod close {
        use super::{Field, HEADER_LEN};

        pub(crate) const SEGMENTS: Field = HEADER_LEN..HEADER_LEN + 8;
        pub(crate) const BYTES: Field = SEGMENTS.end..SEGMENTS.end + 8;
    }

    pub(super) mod close_ack {
        use super::{Field, HEADER_LEN};

        /// The receiver's seven counters, a u64 each, in the order of
        /// `ReceiverStats::fields`.
        pub(crate) const STATS: Field = HEADER_LEN..HEADER_LEN + 8 * 7;
    }

    pub(super) mod reject {
        use super::{Field, HEADER_LEN};

        pub(crate) const REASON: Field = HEADER_LEN..HEADER_LEN + 1;
        /// The header's version again, so a reader of any version can
        /// check the header it read.
        pub(crate) const VERSION: Field = REASON.end..REASON.end + 1;
    }

    pub(super) mod fetch {
        use super::{Field, HEADER_LEN};

        pub(crate) const OFFSET: Field = HEADER_LEN..HEADER_LEN + 4;
    }

    pub(super) mod reply {
        use super::{Field, HEADER_LEN};

        pub(crate) const OFFSET: Field = HEADER_LEN..HEADER_LEN + 4;
        pub(crate) const TOTAL: Field = OFFSET.end..OFFSET.end + 4;
        pub(crate) const STATUS: Field = TOTAL.end..TOTAL.end + 1;
        pub(crate) const DATA: usize = STATUS.end;
    }

    pub(super) mod path {
        use super::{Field, HEADER_LEN};

        pub(crate) const TOKEN: Field = HEADER_LEN..HEADER_LEN + 8;
    }

    pub(super) mod retry {
        use super::{Field, HEADER_LEN};

        pub(crate) const TOKEN: Field = HEADER_LEN..HEADER_LEN + super::super::TOKEN_LEN;
    }
}

const HELLO_FLAG_SACK: u8 = 0x01;

/// The receiver-side settings a client asks for and the server applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReceiverParams {
    /// Receiver buffer in segments (the advertised window).
    pub rcvsegs: u32,
    /// Socket receive buffer in bytes.
    pub rcvbuf: u32,
    /// Delayed-ACK timer in microseconds; 0 ACKs every segment.
    pub delack_us: u32,
    pub sack: bool,
    /// Segments ACKed one by one at the start and after an idle period,
    /// before delayed ACKs (Linux's quick ACKs, Sarolahti §3); 0 never.
    pub quickack: u16,
}

impl ReceiverParams {
    /// Writes the parameters into their slot of a hello or a welcome.
    fn emit(&self, slot: &mut SliceWriter<'_>) {
        use field::params as f;
        slot.put_u32_at(f::RCVSEGS, self.rcvsegs);
        slot.put_u32_at(f::RCVBUF, self.rcvbuf);
        slot.put_u32_at(f::DELACK_US, self.delack_us);
        slot.put_u8_at(f::FLAGS, if self.sack { HELLO_FLAG_SACK } else { 0 });
        slot.put_u16_at(f::QUICKACK, self.quickack);
    }

    fn decode(slot: &[u8]) -> Result<ReceiverParams, WireError> {
        use field::params as f;
        let r = Reader::new(slot);
        let flags = r.u8_at(f::FLAGS)?;
        if flags & !HELLO_FLAG_SACK != 0 {
            return Err(WireError::UnknownFlags(flags));
        }
        Ok(ReceiverParams {
            rcvsegs: r.u32_at(f::RCVSEGS)?,
            rcvbuf: r.u32_at(f::RCVBUF)?,
            delack_us: r.u32_at(f::DELACK_US)?,
            sack: flags & HELLO_FLAG_SACK != 0,
            quickack: r.u16_at(f::QUICKACK)?,
        })
    }
}
/// Client to server: opens connection `conn_id` (chosen fresh by the
/// client) in the header's protocol version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    pub conn_id: u64,
    /// Largest datagram the client will send.
    pub mss: u32,
    /// The connection ends after this long without a packet; 0 never.
    pub maxidle_ms: u32,
    /// The file-transfer session this connection belongs to; 0 for a
    /// probe, whose data the server only counts.
    pub session: u64,
    pub receiver: ReceiverParams,
}

/// Server to client: the connection is open with these settings (the
/// server may have granted less than asked, e.g. a smaller socket buffer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Welcome {
    pub conn_id: u64,
    pub receiver: ReceiverParams,
}

/// Client to server: everything sent was acknowledged; the connection ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Close {
    pub conn_id: u64,
    /// Segments the sender sent (its `snd_max`).
    pub segments: u64,
    /// Stream bytes acknowledged.
    pub bytes: u64,
}

/// atousrv's counters, reported after each connection: the receiver
/// counts them, its close acknowledgement carries them to the client.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct ReceiverStats {
    /// Data segments accepted (new, in window).
    pub segments: u64,
    /// Payload bytes accepted.
    pub bytes: u64,
    /// ACKs sent.
    pub acks: u64,
    /// Segments that had arrived before.
    pub duplicates: u64,
    /// Segments that arrived above a hole.
    pub out_of_order: u64,
    /// Segments beyond the advertised window, discarded.
    pub beyond_window: u64,
    /// Datagrams that failed to decode or belonged to another connection.
    pub bad_packets: u64,
}

/// Server to client: the close arrived; the receiver's counters at that point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CloseAck {
    pub conn_id: u64,
    pub stats: ReceiverStats,
}

/// Why a hello was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RejectReason {
    /// The hello's protocol version is not the server's; `version` in the
    /// reject is the server's.
    UnsupportedVersion,
    /// The hello asked for something the server cannot give.
    BadHello,
    /// The server is at one of its limits (connections, memory); the same
    /// hello may succeed later.
    Busy,
    /// The server serves authenticated clients only (the Noise
    /// handshake); a plain hello is answered with this.
    AuthRequired,
    /// The server has no key, so it cannot answer an authenticated hello
    /// (it serves plain clients only).
    NoIdentity,
}

/// Refuses a connection. Its layout is the same in every protocol version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reject {
    pub conn_id: u64,
    pub reason: RejectReason,
    /// The protocol version the sender of the reject speaks.
    pub version: u8,
}

/// Client to server, once all its data is acknowledged: send the reply to
/// this connection's stream from byte `offset`. Only session connections
/// have replies; the client asks for several fragments at once and asks
/// again for those that do not come.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fetch {
    pub conn_id: u64,
    pub offset: u32,
}

/// Server to client: a fragment of the reply, or word that it is not
/// ready yet (the server is still writing or checking the data).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply<'a> {
    Pending {
        conn_id: u64,
    },
    Fragment {
        conn_id: u64,
        /// Where `data` starts in the reply.
        offset: u32,
        /// The reply's whole length.
        total: u32,
        data: &'a [u8],
    },
}

impl Reply<'_> {
    pub fn conn_id(&self) -> u64 {
        match *self {
            Reply::Pending { conn_id } | Reply::Fragment { conn_id, .. } => conn_id,
        }
    }
}

/// Server to client, for a plain hello without a valid address token:
/// send the hello again with this token after it (RFC 9000 §8.1.2). The
/// server keeps nothing; the token proves the client receives at its
/// address, so a spoofed hello opens nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retry {
    pub conn_id: u64,
    pub token: AddressToken,
}

/// A path challenge or its response: an unpredictable token, echoed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PathProbe {
    pub conn_id: u64,
    pub token: u64,
}

impl Hello {
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        let mut w = emit_header(buf, HELLO_LEN, KIND_HELLO, self.conn_id)?;
        self.emit_fields(&mut w);
        Ok(HELLO_LEN)
    }

    fn emit_fields(&self, w: &mut SliceWriter<'_>) {
        w.put_u32_at(field::hello::MSS, self.mss);
        w.put_u32_at(field::hello::MAXIDLE_MS, self.maxidle_ms);
        w.put_u64_at(field::hello::SESSION, self.session);
        self.receiver.emit(&mut w.field(field::hello::PARAMS));
    }

    /// The hello with an address token after it, when there is one (the
    /// server's [`Retry`] gave it).
    pub fn emit_with_token(
        &self,
        token: Option<&AddressToken>,
        buf: &mut [u8],
    ) -> Result<usize, WireError> {
        let Some(token) = token else {
            return self.emit(buf);
        };
        let mut w = emit_header(buf, HELLO_WITH_TOKEN_LEN, KIND_HELLO, self.conn_id)?;
        self.emit_fields(&mut w);
        w.put_at(field::hello::TOKEN, token);
        Ok(HELLO_WITH_TOKEN_LEN)
    }
}

/// The address token after a hello, if `buf` is a hello that has one.
pub fn hello_token(buf: &[u8]) -> Option<AddressToken> {
    let peek = HeaderPeek::read(buf)?;
    if !peek.is_hello() || buf.len() != HELLO_WITH_TOKEN_LEN {
        return None;
    }
    Reader::new(buf).array_at(field::hello::TOKEN).ok()
}

impl Welcome {
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        let mut w = emit_header(buf, WELCOME_LEN, KIND_WELCOME, self.conn_id)?;
        self.receiver.emit(&mut w.field(field::welcome::PARAMS));
        Ok(WELCOME_LEN)
    }
}

impl Close {
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        let mut w = emit_header(buf, CLOSE_LEN, KIND_CLOSE, self.conn_id)?;
        w.put_u64_at(field::close::SEGMENTS, self.segments);
        w.put_u64_at(field::close::BYTES, self.bytes);
        Ok(CLOSE_LEN)
    }
}

impl ReceiverStats {
    /// The counters in their order on the wire.
    fn fields(&mut self) -> [&mut u64; 7] {
        [
            &mut self.segments,
            &mut self.bytes,
            &mut self.acks,
            &mut self.duplicates,
            &mut self.out_of_order,
            &mut self.beyond_window,
            &mut self.bad_packets,
        ]
    }
}

impl CloseAck {
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        let mut w = emit_header(buf, CLOSE_ACK_LEN, KIND_CLOSE_ACK, self.conn_id)?;
        let mut counters = w.field(field::close_ack::STATS);
        let mut stats = self.stats;
        for v in stats.fields() {
            counters.put_u64(*v);
        }
        Ok(CLOSE_ACK_LEN)
    }
}

const REASONS: [(RejectReason, u8); 5] = [
    (RejectReason::UnsupportedVersion, 1),
    (RejectReason::BadHello, 2),
    (RejectReason::Busy, 3),
    (RejectReason::AuthRequired, 4),
    (RejectReason::NoIdentity, 5),
];

impl Reject {
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        let mut w = emit_header(buf, REJECT_LEN, KIND_REJECT, self.conn_id)?;
        // Written in the version it names, so an older or newer peer reads
        // both the same way.
        w.put_u8_at(header::field::VERSION, self.version);
        let code = REASONS.iter().find(|(r, _)| *r == self.reason).map(|p| p.1);
        w.put_u8_at(
            field::reject::REASON,
            code.expect("every reason has a code"),
        );
        w.put_u8_at(field::reject::VERSION, self.version);
        Ok(REJECT_LEN)
    }
}

impl Fetch {
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        let mut w = emit_header(buf, FETCH_LEN, KIND_FETCH, self.conn_id)?;
        w.put_u32_at(field::fetch::OFFSET, self.offset);
        Ok(FETCH_LEN)
    }
}

const REPLY_PENDING: u8 = 0;
const REPLY_FRAGMENT: u8 = 1;

impl Reply<'_> {
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        let (conn_id, status, offset, total, data) = match *self {
            Reply::Pending { conn_id } => (conn_id, REPLY_PENDING, 0, 0, &[][..]),
            Reply::Fragment {
                conn_id,
                offset,
                total,
                data,
            } => (conn_id, REPLY_FRAGMENT, offset, total, data),
        };
        let len = REPLY_HEADER_LEN + data.len();
        let mut w = emit_header(buf, len, KIND_REPLY, conn_id)?;
        w.put_u32_at(field::reply::OFFSET, offset);
        w.put_u32_at(field::reply::TOTAL, total);
        w.put_u8_at(field::reply::STATUS, status);
        w.put_at(field::reply::DATA..len, data);
        Ok(len)
    }
}

impl Retry {
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        let mut w = emit_header(buf, RETRY_LEN, KIND_RETRY, self.conn_id)?;
        w.put_at(field::retry::TOKEN, &self.token);
        Ok(RETRY_LEN)
    }
}

impl PathProbe {
    fn emit_as(&self, kind: u8, buf: &mut [u8]) -> Result<usize, WireError> {
        let mut w = emit_header(buf, PATH_LEN, kind, self.conn_id)?;
        w.put_u64_at(field::path::TOKEN, self.token);
        Ok(PATH_LEN)
    }

    pub fn emit_challenge(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        self.emit_as(KIND_PATH_CHALLENGE, buf)
    }

    pub fn emit_response(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        self.emit_as(KIND_PATH_RESPONSE, buf)
    }
}

pub(super) fn decode_hello(buf: &[u8], conn_id: u64) -> Result<Hello, WireError> {
    // With or without an address token after it ([`hello_token`]).
    if buf.len() != HELLO_WITH_TOKEN_LEN {
        exact_len(buf, HELLO_LEN)?;
    }
    let r = Reader::new(buf);
    Ok(Hello {
        conn_id,
        mss: r.u32_at(field::hello::MSS)?,
        maxidle_ms: r.u32_at(field::hello::MAXIDLE_MS)?,
        session: r.u64_at(field::hello::SESSION)?,
        receiver: ReceiverParams::decode(r.at(field::hello::PARAMS)?)?,
    })
}

pub(super) fn decode_welcome(buf: &[u8], conn_id: u64) -> Result<Welcome, WireError> {
    exact_len(buf, WELCOME_LEN)?;
    let params = Reader::new(buf).at(field::welcome::PARAMS)?;
    Ok(Welcome {
        conn_id,
        receiver: ReceiverParams::decode(params)?,
    })
}

pub(super) fn decode_close(buf: &[u8], conn_id: u64) -> Result<Close, WireError> {
    exact_len(buf, CLOSE_LEN)?;
    let r = Reader::new(buf);
    Ok(Close {
        conn_id,
        segments: r.u64_at(field::close::SEGMENTS)?,
        bytes: r.u64_at(field::close::BYTES)?,
    })
}

pub(super) fn decode_close_ack(buf: &[u8], conn_id: u64) -> Result<CloseAck, WireError> {
    exact_len(buf, CLOSE_ACK_LEN)?;
    let mut counters = Reader::new(Reader::new(buf).at(field::close_ack::STATS)?);
    let mut stats = ReceiverStats::default();
    for v in stats.fields() {
        *v = counters.u64()?;
    }
    Ok(CloseAck { conn_id, stats })
}

pub(super) fn decode_reject(buf: &[u8], conn_id: u64) -> Result<Reject, WireError> {
    exact_len(buf, REJECT_LEN)?;
    let r = Reader::new(buf);
    let version = r.u8_at(field::reject::VERSION)?;
    if r.u8_at(header::field::VERSION)? != version {
        return Err(WireError::InconsistentVersion);
    }
    let code = r.u8_at(field::reject::REASON)?;
    let Some(&(reason, _)) = REASONS.iter().find(|(_, c)| *c == code) else {
        return Err(WireError::UnknownReason(code));
    };
    Ok(Reject {
        conn_id,
        reason,
        version,
    })
}

pub(super) fn decode_fetch(buf: &[u8], conn_id: u64) -> Result<Fetch, WireError> {
    exact_len(buf, FETCH_LEN)?;
    let offset = Reader::new(buf).u32_at(field::fetch::OFFSET)?;
    Ok(Fetch { conn_id, offset })
}

pub(super) fn decode_reply(buf: &[u8], conn_id: u64) -> Result<Reply<'_>, WireError> {
    check_len(buf, REPLY_HEADER_LEN)?;
    let r = Reader::new(buf);
    let offset = r.u32_at(field::reply::OFFSET)?;
    let total = r.u32_at(field::reply::TOTAL)?;
    let data = &buf[field::reply::DATA..];
    match r.u8_at(field::reply::STATUS)? {
        REPLY_PENDING => {
            if offset != 0 || total != 0 || !data.is_empty() {
                return Err(WireError::BadReply);
            }
            Ok(Reply::Pending { conn_id })
        }
        REPLY_FRAGMENT => {
            // A fragment lies inside its reply, and only an empty reply
            // has an empty fragment.
            let end = u64::from(offset) + data.len() as u64;
            if end > u64::from(total) || (data.is_empty() && total != 0) {
                return Err(WireError::BadReply);
            }
            Ok(Reply::Fragment {
                conn_id,
                offset,
                total,
                data,
            })
        }
        other => Err(WireError::UnknownFlags(other)),
    }
}

pub(super) fn decode_retry(buf: &[u8], conn_id: u64) -> Result<Retry, WireError> {
    exact_len(buf, RETRY_LEN)?;
    let token = Reader::new(buf).array_at(field::retry::TOKEN)?;
    Ok(Retry { conn_id, token })
}

pub(super) fn decode_path_probe(buf: &[u8], conn_id: u64) -> Result<PathProbe, WireError> {
    exact_len(buf, PATH_LEN)?;
    let token = Reader::new(buf).u64_at(field::path::TOKEN)?;
    Ok(PathProbe { conn_id, token })
}

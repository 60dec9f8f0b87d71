//! The wire format. Documented byte by byte in `docs/protocol.md`.
//!
//! Every packet starts with the same 12-byte header (magic, version, kind,
//! connection id). Parsing is strict: lengths are checked against the buffer
//! before anything is read, unknown flag bits and trailing bytes are errors,
//! and nothing is allocated, so no input can panic or exhaust memory.

use thiserror::Error;

pub mod codec;

/// `"AT"`: lets a receiver discard stray datagrams cheaply.
pub const MAGIC: [u8; 2] = *b"AT";
/// Bumped on any incompatible change to the layout below.
pub const VERSION: u8 = 6;
/// Bytes of the header common to every packet.
pub const HEADER_LEN: usize = 12;
/// Bytes before the payload of a data segment.
pub const DATA_HEADER_LEN: usize = HEADER_LEN + 8 + 4 + 1;
/// Bytes of an ACK without SACK or D-SACK blocks.
pub const ACK_MIN_LEN: usize = HEADER_LEN + 4 + 8 + 4 + 1 + 1;
/// Most SACK blocks one ACK carries (atou carried three; RFC 2018 allows four
/// when no timestamp option competes for space, and ours has room).
pub const MAX_SACK_BLOCKS: usize = 4;
const DSACK_LEN: usize = 8 + 4;
const SACK_BLOCK_LEN: usize = 4 + 4;
/// Largest ACK on the wire.
pub const ACK_MAX_LEN: usize = ACK_MIN_LEN + DSACK_LEN + MAX_SACK_BLOCKS * SACK_BLOCK_LEN;

const KIND_DATA: u8 = 1;
const KIND_ACK: u8 = 2;
const KIND_HELLO: u8 = 3;
const KIND_WELCOME: u8 = 4;
const KIND_CLOSE: u8 = 5;
const KIND_CLOSE_ACK: u8 = 6;
/// The header and this kind's body are the same in every protocol version,
/// so a peer can always say which version it speaks.
const KIND_REJECT: u8 = 7;
const KIND_FETCH: u8 = 8;
const KIND_REPLY: u8 = 9;
/// Path validation (RFC 9000 §8.2), only inside protected datagrams.
const KIND_PATH_CHALLENGE: u8 = 10;
const KIND_PATH_RESPONSE: u8 = 11;
/// Address validation for plain hellos (RFC 9000 §8.1.2's Retry).
const KIND_RETRY: u8 = 12;

/// Bytes of an address token: a MAC the server alone can make, of the
/// client's IP address and the time (`crypto::cookie`).
pub const TOKEN_LEN: usize = 16;
/// An address token, as a retry carries it and a hello echoes it.
pub type AddressToken = [u8; TOKEN_LEN];

/// Lengths of the control packets.
pub const HELLO_LEN: usize = HEADER_LEN + 4 * 5 + 8 + 1 + 2;
pub const WELCOME_LEN: usize = HEADER_LEN + 4 * 3 + 1 + 2;
pub const CLOSE_LEN: usize = HEADER_LEN + 8 + 8;
pub const CLOSE_ACK_LEN: usize = HEADER_LEN + 8 * 7;
pub const REJECT_LEN: usize = HEADER_LEN + 2;
pub const FETCH_LEN: usize = HEADER_LEN + 4;
pub const PATH_LEN: usize = HEADER_LEN + 8;
/// A hello with an address token after it.
pub const HELLO_WITH_TOKEN_LEN: usize = HELLO_LEN + TOKEN_LEN;
pub const RETRY_LEN: usize = HEADER_LEN + TOKEN_LEN;
/// Bytes of a reply before its fragment.
pub const REPLY_HEADER_LEN: usize = HEADER_LEN + 4 + 4 + 1;
/// The longest control packet.
pub const CONTROL_MAX_LEN: usize = CLOSE_ACK_LEN;

const HELLO_FLAG_SACK: u8 = 0x01;

const DATA_FLAG_FIN: u8 = 0x01;
const DATA_FLAG_RETRANSMISSION: u8 = 0x02;
const DATA_FLAGS_KNOWN: u8 = DATA_FLAG_FIN | DATA_FLAG_RETRANSMISSION;
const ACK_FLAG_DSACK: u8 = 0x01;
const ACK_FLAGS_KNOWN: u8 = ACK_FLAG_DSACK;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum WireError {
    #[error("datagram too short: {needed} bytes needed, {actual} present")]
    Truncated { needed: usize, actual: usize },
    #[error("not an atou packet (bad magic)")]
    BadMagic,
    #[error("protocol version {0} is not supported (this build speaks version {VERSION})")]
    UnsupportedVersion(u8),
    #[error("unknown packet kind {0}")]
    UnknownKind(u8),
    #[error("unknown reject reason {0}")]
    UnknownReason(u8),
    #[error("a reject whose header and body name different versions")]
    InconsistentVersion,
    #[error("unknown flag bits {0:#04x}")]
    UnknownFlags(u8),
    #[error("{0} SACK blocks (at most {MAX_SACK_BLOCKS} allowed)")]
    TooManySackBlocks(u8),
    #[error("empty SACK block")]
    EmptySackBlock,
    #[error("SACK block does not lie above the cumulative ACK")]
    SackBlockNotAboveAck,
    #[error("sequence number overflow")]
    SequenceOverflow,
    #[error("{0} unexpected bytes after the end of the packet")]
    TrailingBytes(usize),
    #[error("a reply fragment that does not lie inside its reply")]
    BadReply,
    #[error("buffer of {actual} bytes too small for a {needed}-byte packet")]
    BufferTooSmall { needed: usize, actual: usize },
}

/// Flags of a data segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DataFlags {
    /// The last segment of the stream: the receiver knows the stream length.
    pub fin: bool,
    /// Sent before; informational (the receiver counts them).
    pub retransmission: bool,
}

impl DataFlags {
    fn to_byte(self) -> u8 {
        (if self.fin { DATA_FLAG_FIN } else { 0 })
            | (if self.retransmission {
                DATA_FLAG_RETRANSMISSION
            } else {
                0
            })
    }

    fn from_byte(b: u8) -> Result<Self, WireError> {
        if b & !DATA_FLAGS_KNOWN != 0 {
            return Err(WireError::UnknownFlags(b));
        }
        Ok(DataFlags {
            fin: b & DATA_FLAG_FIN != 0,
            retransmission: b & DATA_FLAG_RETRANSMISSION != 0,
        })
    }
}

/// The header of a data segment; the payload follows it on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataHeader {
    pub conn_id: u64,
    /// Segment number, counted from 0. Its payload starts at stream byte
    /// `seg × payload size`: the receiver knows the size from the hello,
    /// so the offset is not sent (version 4 sent it, 8 bytes a segment).
    pub seg: u64,
    /// Sender's clock in microseconds (wrapping), echoed by the ACK.
    pub timestamp: u32,
    pub flags: DataFlags,
}

impl DataHeader {
    /// Writes the header into `buf`; the caller writes the payload after it.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        check_room(buf, DATA_HEADER_LEN)?;
        emit_header(buf, KIND_DATA, self.conn_id);
        buf[12..20].copy_from_slice(&self.seg.to_be_bytes());
        buf[20..24].copy_from_slice(&self.timestamp.to_be_bytes());
        buf[24] = self.flags.to_byte();
        Ok(DATA_HEADER_LEN)
    }
}

/// A data segment as parsed from a datagram, borrowing its payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataSegment<'a> {
    pub header: DataHeader,
    pub payload: &'a [u8],
}

/// A block of segments `[start, end)`, never empty.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SackBlock {
    pub start: u64,
    pub end: u64,
}

impl SackBlock {
    pub fn new(start: u64, end: u64) -> Option<SackBlock> {
        (end > start).then_some(SackBlock { start, end })
    }

    pub fn len(&self) -> u64 {
        self.end - self.start
    }

    pub fn is_empty(&self) -> bool {
        self.end == self.start
    }

    pub fn contains(&self, seg: u64) -> bool {
        (self.start..self.end).contains(&seg)
    }
}

/// An acknowledgement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ack {
    pub conn_id: u64,
    /// Timestamp of the data segment that triggered this ACK.
    pub echo_timestamp: u32,
    /// Next segment expected: every segment below it has arrived.
    pub cum_ack: u64,
    /// Segments the receiver can accept beyond `cum_ack`.
    pub window: u32,
    sack: [SackBlock; MAX_SACK_BLOCKS],
    sack_len: u8,
    /// A duplicate that arrived (RFC 2883); may lie below `cum_ack`.
    pub dsack: Option<SackBlock>,
}

impl Ack {
    pub fn new(conn_id: u64, echo_timestamp: u32, cum_ack: u64, window: u32) -> Ack {
        Ack {
            conn_id,
            echo_timestamp,
            cum_ack,
            window,
            sack: [SackBlock { start: 0, end: 1 }; MAX_SACK_BLOCKS],
            sack_len: 0,
            dsack: None,
        }
    }

    /// SACK blocks in RFC 2018 order: the block holding the newest segment first.
    pub fn sack_blocks(&self) -> &[SackBlock] {
        &self.sack[..usize::from(self.sack_len)]
    }

    /// Appends a SACK block; returns false when the ACK is already full or
    /// the block does not lie above the cumulative ACK.
    pub fn push_sack(&mut self, block: SackBlock) -> bool {
        if usize::from(self.sack_len) == MAX_SACK_BLOCKS || block.start <= self.cum_ack {
            return false;
        }
        self.sack[usize::from(self.sack_len)] = block;
        self.sack_len += 1;
        true
    }

    pub fn encoded_len(&self) -> usize {
        ACK_MIN_LEN
            + if self.dsack.is_some() { DSACK_LEN } else { 0 }
            + usize::from(self.sack_len) * SACK_BLOCK_LEN
    }

    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        let len = self.encoded_len();
        check_room(buf, len)?;
        emit_header(buf, KIND_ACK, self.conn_id);
        buf[12..16].copy_from_slice(&self.echo_timestamp.to_be_bytes());
        buf[16..24].copy_from_slice(&self.cum_ack.to_be_bytes());
        buf[24..28].copy_from_slice(&self.window.to_be_bytes());
        buf[28] = if self.dsack.is_some() {
            ACK_FLAG_DSACK
        } else {
            0
        };
        buf[29] = self.sack_len;
        let mut at = ACK_MIN_LEN;
        if let Some(d) = self.dsack {
            buf[at..at + 8].copy_from_slice(&d.start.to_be_bytes());
            buf[at + 8..at + 12].copy_from_slice(&clamp_u32(d.len()).to_be_bytes());
            at += DSACK_LEN;
        }
        for b in self.sack_blocks() {
            // Blocks lie within the receive window, which is a u32 of segments.
            buf[at..at + 4].copy_from_slice(&clamp_u32(b.start - self.cum_ack).to_be_bytes());
            buf[at + 4..at + 8].copy_from_slice(&clamp_u32(b.len()).to_be_bytes());
            at += SACK_BLOCK_LEN;
        }
        Ok(len)
    }
}

fn clamp_u32(v: u64) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

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
/// counts them, a [`CloseAck`] carries them to the client.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct ReceiverStats {
    /// Data segments accepted (new, in window).
    pub segments: u64,
    /// Payload bytes accepted.
    pub bytes: u64,
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

/// A parsed packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Packet<'a> {
    Data(DataSegment<'a>),
    Ack(Ack),
    Hello(Hello),
    Welcome(Welcome),
    Close(Close),
    CloseAck(CloseAck),
    Reject(Reject),
    Fetch(Fetch),
    Reply(Reply<'a>),
    /// Server to client, to a new address: echo `token` (RFC 9000 §8.2.1).
    PathChallenge(PathProbe),
    /// Client to server: the token of a challenge (RFC 9000 §8.2.2).
    PathResponse(PathProbe),
    Retry(Retry),
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

impl Retry {
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        check_room(buf, RETRY_LEN)?;
        emit_header(buf, KIND_RETRY, self.conn_id);
        buf[HEADER_LEN..RETRY_LEN].copy_from_slice(&self.token);
        Ok(RETRY_LEN)
    }
}

/// A path challenge or its response: an unpredictable token, echoed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PathProbe {
    pub conn_id: u64,
    pub token: u64,
}

impl PathProbe {
    fn emit_as(&self, kind: u8, buf: &mut [u8]) -> Result<usize, WireError> {
        check_room(buf, PATH_LEN)?;
        emit_header(buf, kind, self.conn_id);
        buf[12..20].copy_from_slice(&self.token.to_be_bytes());
        Ok(PATH_LEN)
    }

    pub fn emit_challenge(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        self.emit_as(KIND_PATH_CHALLENGE, buf)
    }

    pub fn emit_response(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        self.emit_as(KIND_PATH_RESPONSE, buf)
    }
}

impl<'a> Packet<'a> {
    /// The kind's name, for messages.
    pub fn kind_name(&self) -> &'static str {
        match self {
            Packet::Data(_) => "data",
            Packet::Ack(_) => "ack",
            Packet::Hello(_) => "hello",
            Packet::Welcome(_) => "welcome",
            Packet::Close(_) => "close",
            Packet::CloseAck(_) => "close-ack",
            Packet::Reject(_) => "reject",
            Packet::Fetch(_) => "fetch",
            Packet::Reply(_) => "reply",
            Packet::PathChallenge(_) => "path-challenge",
            Packet::PathResponse(_) => "path-response",
            Packet::Retry(_) => "retry",
        }
    }

    /// Parses one datagram. Never panics; every field is validated.
    pub fn decode(buf: &'a [u8]) -> Result<Packet<'a>, WireError> {
        let (kind, conn_id) = decode_header(buf)?;
        match kind {
            KIND_DATA => decode_data(buf, conn_id).map(Packet::Data),
            KIND_ACK => decode_ack(buf, conn_id).map(Packet::Ack),
            KIND_HELLO => decode_hello(buf, conn_id).map(Packet::Hello),
            KIND_WELCOME => decode_welcome(buf, conn_id).map(Packet::Welcome),
            KIND_CLOSE => {
                exact_len(buf, CLOSE_LEN)?;
                Ok(Packet::Close(Close {
                    conn_id,
                    segments: read_u64(buf, 12),
                    bytes: read_u64(buf, 20),
                }))
            }
            KIND_CLOSE_ACK => {
                exact_len(buf, CLOSE_ACK_LEN)?;
                let f = |i: usize| read_u64(buf, HEADER_LEN + 8 * i);
                Ok(Packet::CloseAck(CloseAck {
                    conn_id,
                    stats: ReceiverStats {
                        segments: f(0),
                        bytes: f(1),
                        acks: f(2),
                        duplicates: f(3),
                        out_of_order: f(4),
                        beyond_window: f(5),
                        bad_packets: f(6),
                    },
                }))
            }
            KIND_REJECT => decode_reject(buf, conn_id).map(Packet::Reject),
            KIND_FETCH => {
                exact_len(buf, FETCH_LEN)?;
                Ok(Packet::Fetch(Fetch {
                    conn_id,
                    offset: read_u32(buf, 12),
                }))
            }
            KIND_REPLY => decode_reply(buf, conn_id).map(Packet::Reply),
            KIND_RETRY => {
                exact_len(buf, RETRY_LEN)?;
                Ok(Packet::Retry(Retry {
                    conn_id,
                    token: buf[HEADER_LEN..RETRY_LEN]
                        .try_into()
                        .expect("TOKEN_LEN bytes"),
                }))
            }
            KIND_PATH_CHALLENGE | KIND_PATH_RESPONSE => {
                exact_len(buf, PATH_LEN)?;
                let probe = PathProbe {
                    conn_id,
                    token: read_u64(buf, 12),
                };
                Ok(if kind == KIND_PATH_CHALLENGE {
                    Packet::PathChallenge(probe)
                } else {
                    Packet::PathResponse(probe)
                })
            }
            other => Err(WireError::UnknownKind(other)),
        }
    }
}

/// The fixed header fields, read without validating the rest: for
/// demultiplexing by connection and for answering a foreign version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeaderPeek {
    pub version: u8,
    pub kind: u8,
    pub conn_id: u64,
}

impl HeaderPeek {
    /// `None` unless the datagram starts with atou's magic and a full header.
    pub fn read(buf: &[u8]) -> Option<HeaderPeek> {
        (buf.len() >= HEADER_LEN && buf[0..2] == MAGIC).then(|| HeaderPeek {
            version: buf[2],
            kind: buf[3],
            conn_id: read_u64(buf, 4),
        })
    }

    pub fn is_hello(&self) -> bool {
        self.kind == KIND_HELLO
    }
}

fn write_params(buf: &mut [u8], at: usize, p: &ReceiverParams) -> usize {
    buf[at..at + 4].copy_from_slice(&p.rcvsegs.to_be_bytes());
    buf[at + 4..at + 8].copy_from_slice(&p.rcvbuf.to_be_bytes());
    buf[at + 8..at + 12].copy_from_slice(&p.delack_us.to_be_bytes());
    buf[at + 12] = if p.sack { HELLO_FLAG_SACK } else { 0 };
    buf[at + 13..at + 15].copy_from_slice(&p.quickack.to_be_bytes());
    at + 15
}

fn read_params(buf: &[u8], at: usize) -> Result<ReceiverParams, WireError> {
    let flags = buf[at + 12];
    if flags & !HELLO_FLAG_SACK != 0 {
        return Err(WireError::UnknownFlags(flags));
    }
    Ok(ReceiverParams {
        rcvsegs: read_u32(buf, at),
        rcvbuf: read_u32(buf, at + 4),
        delack_us: read_u32(buf, at + 8),
        sack: flags & HELLO_FLAG_SACK != 0,
        quickack: u16::from_be_bytes([buf[at + 13], buf[at + 14]]),
    })
}

fn exact_len(buf: &[u8], len: usize) -> Result<(), WireError> {
    check_len(buf, len)?;
    if buf.len() > len {
        return Err(WireError::TrailingBytes(buf.len() - len));
    }
    Ok(())
}

fn decode_hello(buf: &[u8], conn_id: u64) -> Result<Hello, WireError> {
    // With or without an address token after it ([`hello_token`]).
    if buf.len() != HELLO_WITH_TOKEN_LEN {
        exact_len(buf, HELLO_LEN)?;
    }
    Ok(Hello {
        conn_id,
        mss: read_u32(buf, 12),
        maxidle_ms: read_u32(buf, 16),
        session: read_u64(buf, 20),
        receiver: read_params(buf, 28)?,
    })
}

fn decode_welcome(buf: &[u8], conn_id: u64) -> Result<Welcome, WireError> {
    exact_len(buf, WELCOME_LEN)?;
    Ok(Welcome {
        conn_id,
        receiver: read_params(buf, 12)?,
    })
}

fn decode_reject(buf: &[u8], conn_id: u64) -> Result<Reject, WireError> {
    exact_len(buf, REJECT_LEN)?;
    if buf[2] != buf[13] {
        return Err(WireError::InconsistentVersion);
    }
    let reason = match buf[12] {
        1 => RejectReason::UnsupportedVersion,
        2 => RejectReason::BadHello,
        3 => RejectReason::Busy,
        4 => RejectReason::AuthRequired,
        5 => RejectReason::NoIdentity,
        other => return Err(WireError::UnknownReason(other)),
    };
    Ok(Reject {
        conn_id,
        reason,
        version: buf[13],
    })
}

impl Hello {
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        check_room(buf, HELLO_LEN)?;
        emit_header(buf, KIND_HELLO, self.conn_id);
        buf[12..16].copy_from_slice(&self.mss.to_be_bytes());
        buf[16..20].copy_from_slice(&self.maxidle_ms.to_be_bytes());
        buf[20..28].copy_from_slice(&self.session.to_be_bytes());
        Ok(write_params(buf, 28, &self.receiver))
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
        check_room(buf, HELLO_WITH_TOKEN_LEN)?;
        let n = self.emit(buf)?;
        buf[n..n + TOKEN_LEN].copy_from_slice(token);
        Ok(n + TOKEN_LEN)
    }
}

/// The address token after a hello, if `buf` is a hello that has one.
pub fn hello_token(buf: &[u8]) -> Option<AddressToken> {
    let peek = HeaderPeek::read(buf)?;
    (peek.is_hello() && buf.len() == HELLO_WITH_TOKEN_LEN)
        .then(|| buf[HELLO_LEN..].try_into().expect("TOKEN_LEN bytes"))
}

impl Welcome {
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        check_room(buf, WELCOME_LEN)?;
        emit_header(buf, KIND_WELCOME, self.conn_id);
        Ok(write_params(buf, 12, &self.receiver))
    }
}

impl Close {
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        check_room(buf, CLOSE_LEN)?;
        emit_header(buf, KIND_CLOSE, self.conn_id);
        buf[12..20].copy_from_slice(&self.segments.to_be_bytes());
        buf[20..28].copy_from_slice(&self.bytes.to_be_bytes());
        Ok(CLOSE_LEN)
    }
}

impl CloseAck {
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        check_room(buf, CLOSE_ACK_LEN)?;
        emit_header(buf, KIND_CLOSE_ACK, self.conn_id);
        let s = &self.stats;
        let fields = [
            s.segments,
            s.bytes,
            s.acks,
            s.duplicates,
            s.out_of_order,
            s.beyond_window,
            s.bad_packets,
        ];
        for (i, v) in fields.iter().enumerate() {
            let at = HEADER_LEN + 8 * i;
            buf[at..at + 8].copy_from_slice(&v.to_be_bytes());
        }
        Ok(CLOSE_ACK_LEN)
    }
}

impl Reject {
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        check_room(buf, REJECT_LEN)?;
        emit_header(buf, KIND_REJECT, self.conn_id);
        // Written in the version it names, so an older or newer peer reads
        // both the same way.
        buf[2] = self.version;
        buf[12] = match self.reason {
            RejectReason::UnsupportedVersion => 1,
            RejectReason::BadHello => 2,
            RejectReason::Busy => 3,
            RejectReason::AuthRequired => 4,
            RejectReason::NoIdentity => 5,
        };
        buf[13] = self.version;
        Ok(REJECT_LEN)
    }
}

impl Fetch {
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        check_room(buf, FETCH_LEN)?;
        emit_header(buf, KIND_FETCH, self.conn_id);
        buf[12..16].copy_from_slice(&self.offset.to_be_bytes());
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
        check_room(buf, len)?;
        emit_header(buf, KIND_REPLY, conn_id);
        buf[12..16].copy_from_slice(&offset.to_be_bytes());
        buf[16..20].copy_from_slice(&total.to_be_bytes());
        buf[20] = status;
        buf[REPLY_HEADER_LEN..len].copy_from_slice(data);
        Ok(len)
    }
}

fn decode_reply(buf: &[u8], conn_id: u64) -> Result<Reply<'_>, WireError> {
    check_len(buf, REPLY_HEADER_LEN)?;
    let offset = read_u32(buf, 12);
    let total = read_u32(buf, 16);
    let data = &buf[REPLY_HEADER_LEN..];
    match buf[20] {
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

fn check_room(buf: &[u8], needed: usize) -> Result<(), WireError> {
    if buf.len() < needed {
        return Err(WireError::BufferTooSmall {
            needed,
            actual: buf.len(),
        });
    }
    Ok(())
}

fn check_len(buf: &[u8], needed: usize) -> Result<(), WireError> {
    if buf.len() < needed {
        return Err(WireError::Truncated {
            needed,
            actual: buf.len(),
        });
    }
    Ok(())
}

fn emit_header(buf: &mut [u8], kind: u8, conn_id: u64) {
    buf[0..2].copy_from_slice(&MAGIC);
    buf[2] = VERSION;
    buf[3] = kind;
    buf[4..12].copy_from_slice(&conn_id.to_be_bytes());
}

fn decode_header(buf: &[u8]) -> Result<(u8, u64), WireError> {
    check_len(buf, HEADER_LEN)?;
    if buf[0..2] != MAGIC {
        return Err(WireError::BadMagic);
    }
    if buf[2] != VERSION && buf[3] != KIND_REJECT {
        return Err(WireError::UnsupportedVersion(buf[2]));
    }
    Ok((buf[3], read_u64(buf, 4)))
}

fn decode_data(buf: &[u8], conn_id: u64) -> Result<DataSegment<'_>, WireError> {
    check_len(buf, DATA_HEADER_LEN)?;
    let header = DataHeader {
        conn_id,
        seg: read_u64(buf, 12),
        timestamp: read_u32(buf, 20),
        flags: DataFlags::from_byte(buf[24])?,
    };
    let payload = &buf[DATA_HEADER_LEN..];
    header
        .seg
        .checked_add(1)
        .ok_or(WireError::SequenceOverflow)?;
    Ok(DataSegment { header, payload })
}

fn decode_ack(buf: &[u8], conn_id: u64) -> Result<Ack, WireError> {
    check_len(buf, ACK_MIN_LEN)?;
    let flags = buf[28];
    if flags & !ACK_FLAGS_KNOWN != 0 {
        return Err(WireError::UnknownFlags(flags));
    }
    let nsack = buf[29];
    if usize::from(nsack) > MAX_SACK_BLOCKS {
        return Err(WireError::TooManySackBlocks(nsack));
    }
    let has_dsack = flags & ACK_FLAG_DSACK != 0;
    let total =
        ACK_MIN_LEN + if has_dsack { DSACK_LEN } else { 0 } + usize::from(nsack) * SACK_BLOCK_LEN;
    check_len(buf, total)?;
    if buf.len() > total {
        return Err(WireError::TrailingBytes(buf.len() - total));
    }
    let mut ack = Ack::new(
        conn_id,
        read_u32(buf, 12),
        read_u64(buf, 16),
        read_u32(buf, 24),
    );
    let mut at = ACK_MIN_LEN;
    if has_dsack {
        let start = read_u64(buf, at);
        let len = u64::from(read_u32(buf, at + 8));
        ack.dsack = Some(block_from(start, len)?);
        at += DSACK_LEN;
    }
    for _ in 0..nsack {
        let delta = u64::from(read_u32(buf, at));
        let len = u64::from(read_u32(buf, at + 4));
        if delta == 0 {
            return Err(WireError::SackBlockNotAboveAck);
        }
        let start = ack
            .cum_ack
            .checked_add(delta)
            .ok_or(WireError::SequenceOverflow)?;
        let block = block_from(start, len)?;
        ack.sack[usize::from(ack.sack_len)] = block;
        ack.sack_len += 1;
        at += SACK_BLOCK_LEN;
    }
    Ok(ack)
}

fn block_from(start: u64, len: u64) -> Result<SackBlock, WireError> {
    if len == 0 {
        return Err(WireError::EmptySackBlock);
    }
    let end = start.checked_add(len).ok_or(WireError::SequenceOverflow)?;
    Ok(SackBlock { start, end })
}

fn read_u64(buf: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&buf[at..at + 8]);
    u64::from_be_bytes(b)
}

fn read_u32(buf: &[u8], at: usize) -> u32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&buf[at..at + 4]);
    u32::from_be_bytes(b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const DATA: DataHeader = DataHeader {
        conn_id: 0x0102_0304_0506_0708,
        seg: 300,
        timestamp: 123_456,
        flags: DataFlags {
            fin: false,
            retransmission: false,
        },
    };

    fn encode_data(h: &DataHeader, payload: &[u8]) -> Vec<u8> {
        let mut buf = vec![0u8; DATA_HEADER_LEN + payload.len()];
        let n = h.emit(&mut buf).unwrap();
        buf[n..].copy_from_slice(payload);
        buf
    }

    fn encode_ack(ack: &Ack) -> Vec<u8> {
        let mut buf = vec![0u8; ACK_MAX_LEN];
        let n = ack.emit(&mut buf).unwrap();
        buf.truncate(n);
        buf
    }

    #[test]
    fn data_layout_is_as_documented() {
        let buf = encode_data(&DATA, b"xy");
        assert_eq!(&buf[0..4], b"AT\x06\x01");
        assert_eq!(&buf[12..20], &300u64.to_be_bytes());
        assert_eq!(&buf[20..24], &123_456u32.to_be_bytes());
        assert_eq!(buf[24], 0);
        assert_eq!(buf.len(), 25 + 2);
        assert_eq!(&buf[25..], b"xy");
    }

    #[test]
    fn ack_without_blocks_is_30_bytes() {
        // atou §4.4: ACK bandwidth matters on slow return paths; no empty blocks.
        let ack = Ack::new(7, 1, 10, 64);
        assert_eq!(encode_ack(&ack).len(), ACK_MIN_LEN);
        assert_eq!(ACK_MIN_LEN, 30);
    }

    #[test]
    fn rejects_bad_magic_version_kind() {
        let mut buf = encode_data(&DATA, b"");
        buf[0] = b'X';
        assert_eq!(Packet::decode(&buf), Err(WireError::BadMagic));
        let mut buf = encode_data(&DATA, b"");
        buf[2] = 9;
        assert_eq!(Packet::decode(&buf), Err(WireError::UnsupportedVersion(9)));
        let mut buf = encode_data(&DATA, b"");
        buf[3] = 77;
        assert_eq!(Packet::decode(&buf), Err(WireError::UnknownKind(77)));
    }

    #[test]
    fn rejects_every_truncation_of_an_ack() {
        let mut ack = Ack::new(1, 2, 100, 50);
        ack.dsack = SackBlock::new(90, 91);
        assert!(ack.push_sack(SackBlock::new(105, 110).unwrap()));
        assert!(ack.push_sack(SackBlock::new(102, 103).unwrap()));
        let buf = encode_ack(&ack);
        for cut in 0..buf.len() {
            assert!(Packet::decode(&buf[..cut]).is_err(), "cut at {cut}");
        }
        assert_eq!(Packet::decode(&buf), Ok(Packet::Ack(ack)));
        let mut longer = buf.clone();
        longer.push(0);
        assert_eq!(Packet::decode(&longer), Err(WireError::TrailingBytes(1)));
    }

    #[test]
    fn rejects_empty_and_misplaced_sack_blocks() {
        let mut ack = Ack::new(1, 2, 100, 50);
        assert!(ack.push_sack(SackBlock::new(105, 110).unwrap()));
        let good = encode_ack(&ack);
        let mut empty = good.clone();
        empty[ACK_MIN_LEN + 4..ACK_MIN_LEN + 8].copy_from_slice(&0u32.to_be_bytes());
        assert_eq!(Packet::decode(&empty), Err(WireError::EmptySackBlock));
        let mut at_ack = good.clone();
        at_ack[ACK_MIN_LEN..ACK_MIN_LEN + 4].copy_from_slice(&0u32.to_be_bytes());
        assert_eq!(
            Packet::decode(&at_ack),
            Err(WireError::SackBlockNotAboveAck)
        );
        let mut five = good;
        five[29] = 5;
        assert_eq!(Packet::decode(&five), Err(WireError::TooManySackBlocks(5)));
    }

    #[test]
    fn rejects_sequence_overflow() {
        let h = DataHeader {
            seg: u64::MAX,
            ..DATA
        };
        let buf = encode_data(&h, b"z");
        assert_eq!(Packet::decode(&buf), Err(WireError::SequenceOverflow));
        let mut ack = Ack::new(1, 2, u64::MAX - 2, 50);
        assert!(ack.push_sack(SackBlock::new(u64::MAX - 1, u64::MAX).unwrap()));
        let mut buf = encode_ack(&ack);
        buf[ACK_MIN_LEN + 4..ACK_MIN_LEN + 8].copy_from_slice(&9u32.to_be_bytes());
        assert_eq!(Packet::decode(&buf), Err(WireError::SequenceOverflow));
    }

    #[test]
    fn rejects_unknown_flags() {
        let mut buf = encode_data(&DATA, b"");
        buf[24] = 0x80;
        assert_eq!(Packet::decode(&buf), Err(WireError::UnknownFlags(0x80)));
    }

    /// RFC 9000 §8.1.2: a retry carries a token, the hello echoes it after
    /// its fixed fields; anything between the two lengths is an error.
    #[test]
    fn a_retry_and_a_hello_with_its_token_round_trip() {
        let token: AddressToken = *b"0123456789abcdef";
        let mut buf = [0u8; 128];
        let n = Retry { conn_id: 7, token }.emit(&mut buf).unwrap();
        assert_eq!(n, RETRY_LEN);
        assert_eq!(
            Packet::decode(&buf[..n]),
            Ok(Packet::Retry(Retry { conn_id: 7, token }))
        );
        let hello = Hello {
            conn_id: 7,
            mss: 1400,
            maxidle_ms: 0,
            session: 3,
            receiver: ReceiverParams {
                rcvsegs: 10,
                rcvbuf: 0,
                delack_us: 0,
                quickack: 0,
                sack: true,
            },
        };
        let n = hello.emit_with_token(Some(&token), &mut buf).unwrap();
        assert_eq!(n, HELLO_WITH_TOKEN_LEN);
        assert_eq!(Packet::decode(&buf[..n]), Ok(Packet::Hello(hello)));
        assert_eq!(hello_token(&buf[..n]), Some(token));
        assert_eq!(hello_token(&buf[..HELLO_LEN]), None);
        assert_eq!(Packet::decode(&buf[..HELLO_LEN]), Ok(Packet::Hello(hello)));
        assert_eq!(
            Packet::decode(&buf[..HELLO_LEN + 1]),
            Err(WireError::TrailingBytes(1))
        );
        assert!(hello
            .emit_with_token(Some(&token), &mut buf[..HELLO_LEN])
            .is_err());
        assert_eq!(hello_token(&buf[..RETRY_LEN]), None);
    }

    #[test]
    fn push_sack_refuses_blocks_at_or_below_the_ack() {
        let mut ack = Ack::new(1, 2, 100, 50);
        assert!(!ack.push_sack(SackBlock::new(100, 101).unwrap()));
        assert!(ack.sack_blocks().is_empty());
    }

    fn arb_block_above(cum: u64) -> impl Strategy<Value = SackBlock> {
        (1u64..1_000_000, 1u64..100_000).prop_map(move |(d, l)| SackBlock {
            start: cum + d,
            end: cum + d + l,
        })
    }

    proptest! {
        #[test]
        fn data_round_trips(seg in 0..u64::MAX,
                            ts in any::<u32>(), fin in any::<bool>(), rx in any::<bool>(),
                            payload in proptest::collection::vec(any::<u8>(), 0..1500)) {
            let h = DataHeader { conn_id: 99, seg, timestamp: ts,
                                 flags: DataFlags { fin, retransmission: rx } };
            let buf = encode_data(&h, &payload);
            let parsed = Packet::decode(&buf).unwrap();
            prop_assert_eq!(parsed, Packet::Data(DataSegment { header: h, payload: &payload }));
        }

        #[test]
        fn ack_round_trips(cum in 0u64..(1 << 60), win in any::<u32>(), ts in any::<u32>(),
                           dsack in proptest::option::of((0u64..(1 << 60), 1u64..1000)),
                           blocks in proptest::collection::vec(arb_block_above(0), 0..=4)) {
            let mut ack = Ack::new(5, ts, cum, win);
            ack.dsack = dsack.map(|(s, l)| SackBlock { start: s, end: s + l });
            for b in blocks {
                let shifted = SackBlock { start: b.start + cum, end: b.end + cum };
                prop_assert!(ack.push_sack(shifted));
            }
            let buf = encode_ack(&ack);
            prop_assert_eq!(buf.len(), ack.encoded_len());
            prop_assert_eq!(Packet::decode(&buf).unwrap(), Packet::Ack(ack));
        }

        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..128)) {
            let _ = Packet::decode(&bytes);
        }

        #[test]
        fn decode_never_panics_behind_a_valid_header(kind in 1u8..=10,
                bytes in proptest::collection::vec(any::<u8>(), 0..128)) {
            let mut buf = vec![b'A', b'T', VERSION, kind, 0, 0, 0, 0, 0, 0, 0, 1];
            buf.extend_from_slice(&bytes);
            let _ = Packet::decode(&buf);
        }
    }

    fn encode(emit: impl Fn(&mut [u8]) -> Result<usize, WireError>) -> Vec<u8> {
        let mut buf = vec![0u8; CONTROL_MAX_LEN];
        let n = emit(&mut buf).unwrap();
        buf.truncate(n);
        buf
    }

    #[test]
    fn control_packets_round_trip_and_reject_extra_bytes() {
        let params = ReceiverParams {
            rcvsegs: 8192,
            rcvbuf: 4 << 20,
            delack_us: 200_000,
            quickack: 16,
            sack: true,
        };
        let hello = Hello {
            conn_id: 7,
            mss: 1472,
            maxidle_ms: 10_000,
            session: 0x1122_3344_5566_7788,
            receiver: params,
        };
        let welcome = Welcome {
            conn_id: 7,
            receiver: ReceiverParams {
                sack: false,
                ..params
            },
        };
        let close = Close {
            conn_id: 7,
            segments: 10,
            bytes: 14390,
        };
        let close_ack = CloseAck {
            conn_id: 7,
            stats: ReceiverStats {
                segments: 1,
                bytes: 2,
                acks: 3,
                duplicates: 4,
                out_of_order: 5,
                beyond_window: 6,
                bad_packets: 7,
            },
        };
        let cases: [(Vec<u8>, Packet<'_>, usize); 4] = [
            (encode(|b| hello.emit(b)), Packet::Hello(hello), HELLO_LEN),
            (
                encode(|b| welcome.emit(b)),
                Packet::Welcome(welcome),
                WELCOME_LEN,
            ),
            (encode(|b| close.emit(b)), Packet::Close(close), CLOSE_LEN),
            (
                encode(|b| close_ack.emit(b)),
                Packet::CloseAck(close_ack),
                CLOSE_ACK_LEN,
            ),
        ];
        for (bytes, packet, len) in cases {
            assert_eq!(bytes.len(), len);
            assert_eq!(Packet::decode(&bytes).unwrap(), packet);
            let mut long = bytes.clone();
            long.push(0);
            assert_eq!(Packet::decode(&long), Err(WireError::TrailingBytes(1)));
            assert!(Packet::decode(&bytes[..len - 1]).is_err());
        }
        assert_eq!(HELLO_LEN, 43);
    }

    #[test]
    fn a_reject_reads_the_same_in_any_version() {
        let reject = Reject {
            conn_id: 9,
            reason: RejectReason::UnsupportedVersion,
            version: 200,
        };
        let bytes = encode(|b| reject.emit(b));
        assert_eq!(bytes[2], 200);
        assert_eq!(Packet::decode(&bytes).unwrap(), Packet::Reject(reject));
        // Any other kind in a foreign version is refused, but peekable.
        let mut hello = encode(|b| {
            Hello {
                conn_id: 3,
                mss: 1472,
                maxidle_ms: 0,
                session: 0,
                receiver: ReceiverParams {
                    rcvsegs: 1,
                    rcvbuf: 1024,
                    delack_us: 0,
                    quickack: 0,
                    sack: false,
                },
            }
            .emit(b)
        });
        hello[2] = 1;
        assert_eq!(
            Packet::decode(&hello),
            Err(WireError::UnsupportedVersion(1))
        );
        let peek = HeaderPeek::read(&hello).unwrap();
        assert!(peek.is_hello());
        assert_eq!((peek.version, peek.conn_id), (1, 3));
        assert_eq!(HeaderPeek::read(b"XT\x01\x03aaaaaaaa"), None);
    }

    #[test]
    fn fetch_and_reply_round_trip_and_fragments_stay_inside() {
        let fetch = Fetch {
            conn_id: 4,
            offset: 2878,
        };
        let bytes = encode(|b| fetch.emit(b));
        assert_eq!(bytes.len(), FETCH_LEN);
        assert_eq!(Packet::decode(&bytes).unwrap(), Packet::Fetch(fetch));
        let frag = Reply::Fragment {
            conn_id: 4,
            offset: 10,
            total: 13,
            data: b"xyz",
        };
        let mut buf = vec![0u8; 64];
        let n = frag.emit(&mut buf).unwrap();
        assert_eq!(n, REPLY_HEADER_LEN + 3);
        assert_eq!(Packet::decode(&buf[..n]).unwrap(), Packet::Reply(frag));
        // One byte past the reply's end.
        buf[19] = 12;
        assert_eq!(Packet::decode(&buf[..n]), Err(WireError::BadReply));
        let pending = Reply::Pending { conn_id: 4 };
        let n = pending.emit(&mut buf).unwrap();
        assert_eq!(Packet::decode(&buf[..n]).unwrap(), Packet::Reply(pending));
        let mut with_data = buf[..n].to_vec();
        with_data.push(1);
        assert_eq!(Packet::decode(&with_data), Err(WireError::BadReply));
        let empty = Reply::Fragment {
            conn_id: 4,
            offset: 0,
            total: 0,
            data: b"",
        };
        let n = empty.emit(&mut buf).unwrap();
        assert_eq!(Packet::decode(&buf[..n]).unwrap(), Packet::Reply(empty));
    }
}

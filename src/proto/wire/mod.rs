//! The wire format. Documented byte by byte in `docs/protocol.md`.
//!
//! Every packet starts with the same 12-byte header (magic, version, kind,
//! connection id). Parsing is strict: lengths are checked against the buffer
//! before anything is read, unknown flag bits and trailing bytes are errors,
//! and nothing is allocated, so no input can panic or exhaust memory.
//!
//! One file per family of packets, each with a `mod field` that names
//! every fixed offset once for both its encoder and its decoder; all of
//! them read and write through [`codec`].

use thiserror::Error;

mod ack;
pub mod codec;
mod control;
mod data;
mod early;
mod header;
mod size_probe;

pub use ack::{Ack, SackBlock, ACK_MAX_LEN, ACK_MIN_LEN, MAX_SACK_BLOCKS};
pub use control::{
    hello_token, AddressToken, Close, CloseAck, Fetch, Hello, PathProbe, ReceiverParams,
    ReceiverStats, Reject, RejectReason, Reply, Retry, Welcome, CLOSE_ACK_LEN, CLOSE_LEN,
    CONTROL_MAX_LEN, FETCH_LEN, HELLO_LEN, HELLO_WITH_TOKEN_LEN, PATH_LEN, REJECT_LEN,
    REPLY_HEADER_LEN, RETRY_LEN, TOKEN_LEN, WELCOME_LEN,
};
pub use data::{DataFlags, DataHeader, DataSegment, DATA_HEADER_LEN};
pub use early::{early_segment, split_hello_params, split_welcome_params, EARLY_TAKEN};
pub use header::{HeaderPeek, HEADER_LEN, MAGIC, VERSION};
pub use size_probe::{SizeAck, SizeProbe, SIZE_ACK_LEN, SIZE_PROBE_MIN_LEN};

use codec::Truncated;
use header::{
    KIND_ACK, KIND_CLOSE, KIND_CLOSE_ACK, KIND_DATA, KIND_FETCH, KIND_HELLO, KIND_PATH_CHALLENGE,
    KIND_PATH_RESPONSE, KIND_REJECT, KIND_REPLY, KIND_RETRY, KIND_SIZE_ACK, KIND_SIZE_PROBE,
    KIND_WELCOME,
};

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

impl From<Truncated> for WireError {
    fn from(t: Truncated) -> WireError {
        let Truncated { needed, actual } = t;
        WireError::Truncated { needed, actual }
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
    /// Client to server, padded: does a datagram this large arrive?
    SizeProbe(SizeProbe),
    /// Server to client: it did.
    SizeAck(SizeAck),
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
            Packet::SizeProbe(_) => "size-probe",
            Packet::SizeAck(_) => "size-ack",
        }
    }

    /// Parses one datagram. Never panics; every field is validated.
    pub fn decode(buf: &'a [u8]) -> Result<Packet<'a>, WireError> {
        let (kind, conn_id) = header::decode_header(buf)?;
        match kind {
            KIND_DATA => data::decode_data(buf, conn_id).map(Packet::Data),
            KIND_ACK => ack::decode_ack(buf, conn_id).map(Packet::Ack),
            KIND_HELLO => control::decode_hello(buf, conn_id).map(Packet::Hello),
            KIND_WELCOME => control::decode_welcome(buf, conn_id).map(Packet::Welcome),
            KIND_CLOSE => control::decode_close(buf, conn_id).map(Packet::Close),
            KIND_CLOSE_ACK => control::decode_close_ack(buf, conn_id).map(Packet::CloseAck),
            KIND_REJECT => control::decode_reject(buf, conn_id).map(Packet::Reject),
            KIND_FETCH => control::decode_fetch(buf, conn_id).map(Packet::Fetch),
            KIND_REPLY => control::decode_reply(buf, conn_id).map(Packet::Reply),
            KIND_RETRY => control::decode_retry(buf, conn_id).map(Packet::Retry),
            KIND_PATH_CHALLENGE => {
                control::decode_path_probe(buf, conn_id).map(Packet::PathChallenge)
            }
            KIND_PATH_RESPONSE => {
                control::decode_path_probe(buf, conn_id).map(Packet::PathResponse)
            }
            KIND_SIZE_PROBE => size_probe::decode_size_probe(buf, conn_id).map(Packet::SizeProbe),
            KIND_SIZE_ACK => size_probe::decode_size_ack(buf, conn_id).map(Packet::SizeAck),
            other => Err(WireError::UnknownKind(other)),
        }
    }
}

/// Refuses a datagram shorter than the packet it says it is.
fn check_len(buf: &[u8], needed: usize) -> Result<(), WireError> {
    if buf.len() < needed {
        return Err(WireError::Truncated {
            needed,
            actual: buf.len(),
        });
    }
    Ok(())
}

/// Refuses a datagram shorter or longer than its fixed-length packet.
fn exact_len(buf: &[u8], len: usize) -> Result<(), WireError> {
    check_len(buf, len)?;
    if buf.len() > len {
        return Err(WireError::TrailingBytes(buf.len() - len));
    }
    Ok(())
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

    /// Every packet byte by byte, as docs/protocol.md lays it out, with a
    /// distinct value in every field so that a field moved, resized or
    /// swapped shows.
    #[test]
    fn every_packet_lays_out_as_documented() {
        const CONN: &[u8] = &[0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18];
        const PARAMS: &[u8] = &[1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 1, 4, 5];
        let conn_id = 0x1112_1314_1516_1718;
        let receiver = ReceiverParams {
            rcvsegs: 0x0101_0102,
            rcvbuf: 0x0202_0203,
            delack_us: 0x0303_0304,
            sack: true,
            quickack: 0x0405,
        };
        let hello = Hello {
            conn_id,
            mss: 0x2122_2324,
            maxidle_ms: 0x3132_3334,
            session: 0x4142_4344_4546_4748,
            receiver,
        };
        let hello_bytes = [
            b"AT\x06\x03",
            CONN,
            &[0x21, 0x22, 0x23, 0x24, 0x31, 0x32, 0x33, 0x34],
            &[0x41, 0x42, 0x43, 0x44, 0x45, 0x46, 0x47, 0x48],
            PARAMS,
        ]
        .concat();
        let mut buf = [0u8; 128];
        let n = hello.emit(&mut buf).unwrap();
        assert_eq!(buf[..n], hello_bytes[..]);
        let token: AddressToken = *b"0123456789abcdef";
        let n = hello.emit_with_token(Some(&token), &mut buf).unwrap();
        assert_eq!(buf[..n], [&hello_bytes[..], &token].concat()[..]);
        let stats = numbered_stats();
        let counters: Vec<u8> = (1..=7u64).flat_map(u64::to_be_bytes).collect();
        let frag = Reply::Fragment {
            conn_id,
            offset: 1,
            total: 4,
            data: b"xyz",
        };
        let probe = PathProbe {
            conn_id,
            token: 0x8182_8384_8586_8788,
        };
        let probe_token: &[u8] = &[0x81, 0x82, 0x83, 0x84, 0x85, 0x86, 0x87, 0x88];
        let cases: Vec<(Vec<u8>, Vec<u8>)> = vec![
            (
                encode(|b| Welcome { conn_id, receiver }.emit(b)),
                [b"AT\x06\x04", CONN, PARAMS].concat(),
            ),
            (
                encode(|b| {
                    Close {
                        conn_id,
                        segments: 0x5152_5354_5556_5758,
                        bytes: 0x6162_6364_6566_6768,
                    }
                    .emit(b)
                }),
                [
                    b"AT\x06\x05",
                    CONN,
                    &[0x51, 0x52, 0x53, 0x54, 0x55, 0x56, 0x57, 0x58],
                    &[0x61, 0x62, 0x63, 0x64, 0x65, 0x66, 0x67, 0x68],
                ]
                .concat(),
            ),
            (
                encode(|b| CloseAck { conn_id, stats }.emit(b)),
                [b"AT\x06\x06", CONN, &counters].concat(),
            ),
            (
                encode(|b| {
                    Reject {
                        conn_id,
                        reason: RejectReason::Busy,
                        version: 5,
                    }
                    .emit(b)
                }),
                [b"AT\x05\x07", CONN, &[3, 5]].concat(),
            ),
            (
                encode(|b| {
                    Fetch {
                        conn_id,
                        offset: 0x7172_7374,
                    }
                    .emit(b)
                }),
                [b"AT\x06\x08", CONN, &[0x71, 0x72, 0x73, 0x74]].concat(),
            ),
            (
                encode(|b| frag.emit(b)),
                [b"AT\x06\x09", CONN, &[0, 0, 0, 1, 0, 0, 0, 4, 1], b"xyz"].concat(),
            ),
            (
                encode(|b| probe.emit_challenge(b)),
                [b"AT\x06\x0a", CONN, probe_token].concat(),
            ),
            (
                encode(|b| probe.emit_response(b)),
                [b"AT\x06\x0b", CONN, probe_token].concat(),
            ),
            (
                encode(|b| Retry { conn_id, token }.emit(b)),
                [b"AT\x06\x0c", CONN, &token].concat(),
            ),
        ];
        for (got, want) in cases {
            assert_eq!(got, want);
        }
        let mut ack = Ack::new(conn_id, 0x9192_9394, 100, 0xa1a2_a3a4);
        ack.dsack = SackBlock::new(90, 91);
        assert!(ack.push_sack(SackBlock::new(105, 110).unwrap()));
        let ack_bytes = [
            b"AT\x06\x02",
            CONN,
            &[0x91, 0x92, 0x93, 0x94],
            &100u64.to_be_bytes(),
            &[0xa1, 0xa2, 0xa3, 0xa4, 1, 1],
            &90u64.to_be_bytes(),
            &[0, 0, 0, 1, 0, 0, 0, 5, 0, 0, 0, 5],
        ]
        .concat();
        assert_eq!(encode_ack(&ack), ack_bytes);
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

    /// Receiver counters 1 to 7 in wire order, so a layout test sees each
    /// counter land in its own place.
    fn numbered_stats() -> ReceiverStats {
        ReceiverStats {
            segments: 1,
            bytes: 2,
            acks: 3,
            duplicates: 4,
            out_of_order: 5,
            beyond_window: 6,
            bad_packets: 7,
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
            stats: numbered_stats(),
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

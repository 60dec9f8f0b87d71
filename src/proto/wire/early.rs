//! What an authenticated hello and its response carry as the handshake's
//! parameters (`crypto::handshake`'s `params`, encrypted and bound to the
//! handshake): the hello, then, from a client whose whole request stream
//! fits, the stream's one data segment (early data, docs/protocol.md
//! "Requests ride the hello"); the welcome, then [`EARLY_TAKEN`] when the
//! server took that segment.
//!
//! A server without early data refuses a hello whose parameters are
//! longer than a hello (its decoder wants the exact length): the client
//! then says the hello again without the segment.

use super::{check_len, DataSegment, Hello, Packet, Welcome, WireError, HELLO_LEN, WELCOME_LEN};

/// The byte after a welcome that says the hello's segment was taken.
pub const EARLY_TAKEN: u8 = 1;

/// A hello's parameters: the hello and, if one follows it, the early
/// segment's bytes (a whole data packet, checked by [`early_segment`]).
pub fn split_hello_params(params: &[u8]) -> Result<(Hello, Option<&[u8]>), WireError> {
    check_len(params, HELLO_LEN)?;
    let (hello, rest) = params.split_at(HELLO_LEN);
    let Packet::Hello(hello) = Packet::decode(hello)? else {
        return Err(WireError::UnknownKind(hello.get(3).copied().unwrap_or(0)));
    };
    Ok((hello, (!rest.is_empty()).then_some(rest)))
}

/// The early segment of `hello`: a data packet of the same connection,
/// its first and last (segment 0, FIN), at most `payload_size` bytes
/// (what any segment of the connection may carry). `None` for anything
/// else: the server then does not take it, and the client sends its
/// stream after the welcome.
pub fn early_segment<'a>(
    hello: &Hello,
    bytes: &'a [u8],
    payload_size: u64,
) -> Option<DataSegment<'a>> {
    match Packet::decode(bytes) {
        Ok(Packet::Data(seg))
            if seg.header.conn_id == hello.conn_id
                && seg.header.seg == 0
                && seg.header.flags.fin
                && !seg.header.flags.retransmission
                && seg.payload.len() as u64 <= payload_size =>
        {
            Some(seg)
        }
        _ => None,
    }
}

/// A response's parameters: the welcome, and whether the server took
/// the hello's early segment.
pub fn split_welcome_params(params: &[u8]) -> Result<(Welcome, bool), WireError> {
    check_len(params, WELCOME_LEN)?;
    let (welcome, rest) = params.split_at(WELCOME_LEN);
    let taken = match rest {
        [] => false,
        [EARLY_TAKEN] => true,
        [_] => return Err(WireError::UnknownFlags(rest[0])),
        _ => return Err(WireError::TrailingBytes(rest.len())),
    };
    let Packet::Welcome(welcome) = Packet::decode(welcome)? else {
        return Err(WireError::UnknownKind(welcome.get(3).copied().unwrap_or(0)));
    };
    Ok((welcome, taken))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::wire::{DataFlags, DataHeader, ReceiverParams};

    fn hello() -> Hello {
        Hello {
            conn_id: 7,
            mss: 1400,
            maxidle_ms: 0,
            session: 3,
            receiver: ReceiverParams {
                rcvsegs: 64,
                rcvbuf: 1 << 20,
                delack_us: 0,
                sack: true,
                quickack: 0,
            },
        }
    }

    fn segment(conn_id: u64, seg: u64, fin: bool, payload: &[u8]) -> Vec<u8> {
        let header = DataHeader {
            conn_id,
            seg,
            timestamp: 0,
            flags: DataFlags {
                fin,
                retransmission: false,
            },
        };
        DataSegment { header, payload }.to_vec()
    }

    #[test]
    fn a_hello_alone_or_with_a_segment_splits_and_only_a_whole_first_segment_is_early() {
        let mut params = vec![0u8; HELLO_LEN];
        hello().emit(&mut params).unwrap();
        assert_eq!(split_hello_params(&params).unwrap(), (hello(), None));
        assert!(split_hello_params(&params[..HELLO_LEN - 1]).is_err());
        let good = segment(7, 0, true, b"plan");
        params.extend_from_slice(&good);
        let (h, early) = split_hello_params(&params).unwrap();
        assert_eq!(early, Some(&good[..]));
        assert_eq!(early_segment(&h, &good, 4).unwrap().payload, b"plan");
        assert!(
            early_segment(&h, &good, 3).is_none(),
            "longer than a segment"
        );
        assert!(early_segment(&h, &segment(8, 0, true, b"x"), 4).is_none());
        assert!(early_segment(&h, &segment(7, 1, true, b"x"), 4).is_none());
        assert!(early_segment(&h, &segment(7, 0, false, b"x"), 4).is_none());
        assert!(early_segment(&h, b"garbage", 4).is_none());
    }

    #[test]
    fn a_welcome_says_whether_the_early_segment_was_taken() {
        let w = Welcome {
            conn_id: 7,
            receiver: hello().receiver,
        };
        let mut params = vec![0u8; WELCOME_LEN];
        w.emit(&mut params).unwrap();
        assert_eq!(split_welcome_params(&params).unwrap(), (w, false));
        params.push(EARLY_TAKEN);
        assert_eq!(split_welcome_params(&params).unwrap(), (w, true));
        *params.last_mut().unwrap() = 2;
        assert!(split_welcome_params(&params).is_err());
        params.push(0);
        assert!(split_welcome_params(&params).is_err());
    }
}

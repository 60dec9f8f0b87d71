//! Path-MTU probes (RFC 8899's DPLPMTUD, §4.1 "padding" probes): a client
//! sends padded probes of the sizes it wants to learn beside its hello; a
//! server answers each with a 24-byte ack that says what size arrived.

use super::codec::Reader;
use super::header::{emit_header, HEADER_LEN, KIND_SIZE_ACK, KIND_SIZE_PROBE};
use super::{check_len, exact_len, WireError};

/// The smallest probe: RFC 8899 §5.1.2's BASE_PLPMTU, the size every path
/// is taken to carry (RFC 9000 §14 takes 1,200 bytes of UDP payload too).
/// A shorter probe teaches nothing, and refusing it keeps every ack a
/// fiftieth of what arrived.
pub const SIZE_PROBE_MIN_LEN: usize = 1200;
/// Bytes of a probe's ack.
pub const SIZE_ACK_LEN: usize = field::SIZE.end;

mod field {
    use super::super::codec::Field;
    use super::HEADER_LEN;

    /// Unpredictable: only what saw the probe can ack it.
    pub(crate) const NONCE: Field = HEADER_LEN..HEADER_LEN + 8;
    /// In an ack: the probe's length as it arrived.
    pub(crate) const SIZE: Field = NONCE.end..NONCE.end + 4;
}

/// A probe: a nonce, then zero padding up to the size it tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SizeProbe {
    pub conn_id: u64,
    pub nonce: u64,
    /// The whole datagram's length.
    pub size: u32,
}

/// A server's answer to a probe: its nonce and the length that arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SizeAck {
    pub conn_id: u64,
    pub nonce: u64,
    pub size: u32,
}

impl SizeProbe {
    /// Writes the probe, `size` bytes, padding included.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        let len = self.size as usize;
        if len < SIZE_PROBE_MIN_LEN {
            return Err(WireError::Truncated {
                needed: SIZE_PROBE_MIN_LEN,
                actual: len,
            });
        }
        let mut w = emit_header(buf, len, KIND_SIZE_PROBE, self.conn_id)?;
        w.put_u64_at(field::NONCE, self.nonce);
        buf[field::NONCE.end..len].fill(0);
        Ok(len)
    }

    /// The ack that tells the prober this probe arrived whole.
    pub fn ack(&self) -> SizeAck {
        SizeAck {
            conn_id: self.conn_id,
            nonce: self.nonce,
            size: self.size,
        }
    }
}

impl SizeAck {
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        let mut w = emit_header(buf, SIZE_ACK_LEN, KIND_SIZE_ACK, self.conn_id)?;
        w.put_u64_at(field::NONCE, self.nonce);
        w.put_u32_at(field::SIZE, self.size);
        Ok(SIZE_ACK_LEN)
    }
}

pub(super) fn decode_size_probe(buf: &[u8], conn_id: u64) -> Result<SizeProbe, WireError> {
    check_len(buf, SIZE_PROBE_MIN_LEN)?;
    let r = Reader::new(buf);
    let nonce = r.u64_at(field::NONCE)?;
    // Padding is zeros, as every unused bit of this wire must be.
    if let Some(extra) = buf[field::NONCE.end..].iter().position(|b| *b != 0) {
        return Err(WireError::UnknownFlags(buf[field::NONCE.end + extra]));
    }
    Ok(SizeProbe {
        conn_id,
        nonce,
        size: u32::try_from(buf.len()).unwrap_or(u32::MAX),
    })
}

pub(super) fn decode_size_ack(buf: &[u8], conn_id: u64) -> Result<SizeAck, WireError> {
    exact_len(buf, SIZE_ACK_LEN)?;
    let r = Reader::new(buf);
    Ok(SizeAck {
        conn_id,
        nonce: r.u64_at(field::NONCE)?,
        size: r.u32_at(field::SIZE)?,
    })
}

#[cfg(test)]
mod tests {
    use super::super::Packet;
    use super::*;

    const CONN: u64 = 0x1112_1314_1516_1718;

    #[test]
    fn a_probe_and_its_ack_lay_out_as_documented_and_round_trip() {
        let probe = SizeProbe {
            conn_id: CONN,
            nonce: 0x8182_8384_8586_8788,
            size: 1300,
        };
        let mut buf = vec![0xffu8; 1400];
        assert_eq!(probe.emit(&mut buf), Ok(1300));
        assert_eq!(&buf[..12], b"AT\x06\x0d\x11\x12\x13\x14\x15\x16\x17\x18");
        assert_eq!(&buf[12..20], &0x8182_8384_8586_8788u64.to_be_bytes());
        assert!(buf[20..1300].iter().all(|b| *b == 0));
        assert_eq!(Packet::decode(&buf[..1300]), Ok(Packet::SizeProbe(probe)));
        let n = probe.ack().emit(&mut buf).unwrap();
        assert_eq!(
            buf[..n],
            [
                &b"AT\x06\x0e\x11\x12\x13\x14\x15\x16\x17\x18"[..],
                &0x8182_8384_8586_8788u64.to_be_bytes(),
                &1300u32.to_be_bytes(),
            ]
            .concat()[..]
        );
        assert_eq!(Packet::decode(&buf[..n]), Ok(Packet::SizeAck(probe.ack())));
    }

    #[test]
    fn a_short_probe_a_non_zero_pad_or_a_long_ack_does_not_decode() {
        let probe = SizeProbe {
            conn_id: CONN,
            nonce: 1,
            size: 1200,
        };
        let mut buf = vec![0u8; 1300];
        assert!(SizeProbe {
            size: 1199,
            ..probe
        }
        .emit(&mut buf)
        .is_err());
        probe.emit(&mut buf).unwrap();
        assert!(Packet::decode(&buf[..1199]).is_err());
        buf[1000] = 1;
        assert_eq!(
            Packet::decode(&buf[..1200]),
            Err(WireError::UnknownFlags(1))
        );
        let n = probe.ack().emit(&mut buf).unwrap();
        assert_eq!(
            Packet::decode(&buf[..n + 1]),
            Err(WireError::TrailingBytes(1))
        );
    }
}

//! Data segments: the header's fields, then the payload.

use super::codec::Reader;
use super::header::{self, emit_header, KIND_DATA};
use super::WireError;

/// Bytes before the payload of a data segment.
pub const DATA_HEADER_LEN: usize = field::PAYLOAD;

mod field {
    use super::super::codec::Field;
    use super::header::HEADER_LEN;

    pub(super) const SEG: Field = HEADER_LEN..HEADER_LEN + 8;
    pub(super) const TIMESTAMP: Field = SEG.end..SEG.end + 4;
    pub(super) const FLAGS: Field = TIMESTAMP.end..TIMESTAMP.end + 1;
    pub(super) const PAYLOAD: usize = FLAGS.end;
}

const DATA_FLAG_FIN: u8 = 0x01;
const DATA_FLAG_RETRANSMISSION: u8 = 0x02;
const DATA_FLAGS_KNOWN: u8 = DATA_FLAG_FIN | DATA_FLAG_RETRANSMISSION;

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
        let mut w = emit_header(buf, DATA_HEADER_LEN, KIND_DATA, self.conn_id)?;
        w.put_u64_at(field::SEG, self.seg);
        w.put_u32_at(field::TIMESTAMP, self.timestamp);
        w.put_u8_at(field::FLAGS, self.flags.to_byte());
        Ok(DATA_HEADER_LEN)
    }
}

/// A data segment as parsed from a datagram, borrowing its payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataSegment<'a> {
    pub header: DataHeader,
    pub payload: &'a [u8],
}

impl DataSegment<'_> {
    /// The whole packet, header then payload: for a segment sent outside
    /// the sender's own buffers (one riding the hello).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut packet = vec![0u8; DATA_HEADER_LEN + self.payload.len()];
        self.header
            .emit(&mut packet)
            .expect("a buffer of the header's length");
        packet[DATA_HEADER_LEN..].copy_from_slice(self.payload);
        packet
    }
}

pub(super) fn decode_data(buf: &[u8], conn_id: u64) -> Result<DataSegment<'_>, WireError> {
    super::check_len(buf, DATA_HEADER_LEN)?;
    let r = Reader::new(buf);
    let header = DataHeader {
        conn_id,
        seg: r.u64_at(field::SEG)?,
        timestamp: r.u32_at(field::TIMESTAMP)?,
        flags: DataFlags::from_byte(r.u8_at(field::FLAGS)?)?,
    };
    let payload = &buf[field::PAYLOAD..];
    header
        .seg
        .checked_add(1)
        .ok_or(WireError::SequenceOverflow)?;
    Ok(DataSegment { header, payload })
}

//! Acknowledgements: the cumulative ACK and window, then an optional
//! D-SACK block and up to [`MAX_SACK_BLOCKS`] SACK blocks.

use super::codec::{Reader, SliceWriter, Writer};
use super::header::{self, emit_header, KIND_ACK};
use super::WireError;

/// Bytes of an ACK without SACK or D-SACK blocks.
pub const ACK_MIN_LEN: usize = field::BLOCKS;
/// Most SACK blocks one ACK carries (atou carried three; RFC 2018 allows four
/// when no timestamp option competes for space, and ours has room).
pub const MAX_SACK_BLOCKS: usize = 4;
/// A D-SACK block: its first segment (u64), its length (u32).
const DSACK_LEN: usize = 8 + 4;
/// A SACK block: its first segment above the cumulative ACK (u32), its
/// length (u32).
const SACK_BLOCK_LEN: usize = 4 + 4;
/// Largest ACK on the wire.
pub const ACK_MAX_LEN: usize = ACK_MIN_LEN + DSACK_LEN + MAX_SACK_BLOCKS * SACK_BLOCK_LEN;

mod field {
    use super::super::codec::Field;
    use super::header::HEADER_LEN;

    pub(super) const ECHO_TIMESTAMP: Field = HEADER_LEN..HEADER_LEN + 4;
    pub(super) const CUM_ACK: Field = ECHO_TIMESTAMP.end..ECHO_TIMESTAMP.end + 8;
    pub(super) const WINDOW: Field = CUM_ACK.end..CUM_ACK.end + 4;
    pub(super) const FLAGS: Field = WINDOW.end..WINDOW.end + 1;
    pub(super) const SACK_COUNT: Field = FLAGS.end..FLAGS.end + 1;
    /// The D-SACK block if the flag says so, then the SACK blocks.
    pub(super) const BLOCKS: usize = SACK_COUNT.end;
}

const ACK_FLAG_DSACK: u8 = 0x01;
const ACK_FLAGS_KNOWN: u8 = ACK_FLAG_DSACK;

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
        ack_len(self.dsack.is_some(), self.sack_len)
    }

    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        let len = self.encoded_len();
        let mut w = emit_header(buf, len, KIND_ACK, self.conn_id)?;
        w.put_u32_at(field::ECHO_TIMESTAMP, self.echo_timestamp);
        w.put_u64_at(field::CUM_ACK, self.cum_ack);
        w.put_u32_at(field::WINDOW, self.window);
        let flags = if self.dsack.is_some() {
            ACK_FLAG_DSACK
        } else {
            0
        };
        w.put_u8_at(field::FLAGS, flags);
        w.put_u8_at(field::SACK_COUNT, self.sack_len);
        self.emit_blocks(&mut w.field(field::BLOCKS..len));
        Ok(len)
    }

    /// The blocks, in order, into the bytes after the fixed fields.
    fn emit_blocks(&self, w: &mut SliceWriter<'_>) {
        if let Some(d) = self.dsack {
            w.put_u64(d.start);
            w.put_u32(clamp_u32(d.len()));
        }
        for b in self.sack_blocks() {
            // Blocks lie within the receive window, which is a u32 of segments.
            w.put_u32(clamp_u32(b.start - self.cum_ack));
            w.put_u32(clamp_u32(b.len()));
        }
    }
}

/// An ACK's length on the wire: the fixed part, the D-SACK block if any,
/// then `nsack` SACK blocks.
fn ack_len(has_dsack: bool, nsack: u8) -> usize {
    ACK_MIN_LEN + if has_dsack { DSACK_LEN } else { 0 } + usize::from(nsack) * SACK_BLOCK_LEN
}

fn clamp_u32(v: u64) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

pub(super) fn decode_ack(buf: &[u8], conn_id: u64) -> Result<Ack, WireError> {
    super::check_len(buf, ACK_MIN_LEN)?;
    let fixed = Reader::new(buf);
    let flags = fixed.u8_at(field::FLAGS)?;
    if flags & !ACK_FLAGS_KNOWN != 0 {
        return Err(WireError::UnknownFlags(flags));
    }
    let nsack = fixed.u8_at(field::SACK_COUNT)?;
    if usize::from(nsack) > MAX_SACK_BLOCKS {
        return Err(WireError::TooManySackBlocks(nsack));
    }
    let has_dsack = flags & ACK_FLAG_DSACK != 0;
    super::exact_len(buf, ack_len(has_dsack, nsack))?;
    let mut ack = Ack::new(
        conn_id,
        fixed.u32_at(field::ECHO_TIMESTAMP)?,
        fixed.u64_at(field::CUM_ACK)?,
        fixed.u32_at(field::WINDOW)?,
    );
    let mut blocks = Reader::new(&buf[field::BLOCKS..]);
    if has_dsack {
        let start = blocks.u64()?;
        let len = u64::from(blocks.u32()?);
        ack.dsack = Some(block_from(start, len)?);
    }
    for _ in 0..nsack {
        let delta = u64::from(blocks.u32()?);
        let len = u64::from(blocks.u32()?);
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

//! Where a sender's payload bytes come from.
//!
//! The sender asks for the bytes at a stream offset whenever it builds a
//! segment, retransmissions included, so it keeps no copy of unacknowledged
//! data. Memory-to-memory runs (the simulator, `atou probe`) use
//! [`PatternSource`], whose bytes are a function of their offset, so the
//! receiver can check every byte without a copy of what was sent.

/// Supplies the bytes of the transfer stream.
pub trait PayloadSource {
    /// Fills `buf` with the stream's bytes starting at `offset`.
    fn read_at(&mut self, offset: u64, buf: &mut [u8]);
}

/// The byte at `offset` of the test pattern. Mixing the offset (rather than
/// `offset % 256`) makes a segment placed at the wrong offset show.
pub fn pattern_byte(offset: u64) -> u8 {
    (offset.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8
}

/// A stream whose bytes are [`pattern_byte`] of their offset.
#[derive(Debug, Default, Clone, Copy)]
pub struct PatternSource;

impl PayloadSource for PatternSource {
    fn read_at(&mut self, offset: u64, buf: &mut [u8]) {
        for (i, b) in buf.iter_mut().enumerate() {
            *b = pattern_byte(offset + i as u64);
        }
    }
}

/// Checks a received stream against the pattern, in order.
#[derive(Debug, Default, Clone)]
pub struct PatternVerifier {
    /// Bytes verified so far: the next offset expected.
    pub next_offset: u64,
    /// Offset of the first wrong byte or misplaced chunk, if any.
    pub first_error: Option<u64>,
}

impl PatternVerifier {
    /// Checks one in-order chunk; returns false on the first mismatch.
    pub fn check(&mut self, offset: u64, data: &[u8]) -> bool {
        if self.first_error.is_some() {
            return false;
        }
        if offset != self.next_offset {
            self.first_error = Some(self.next_offset);
            return false;
        }
        if let Some(i) = data
            .iter()
            .enumerate()
            .position(|(i, &b)| b != pattern_byte(offset + i as u64))
        {
            self.first_error = Some(offset + i as u64);
            return false;
        }
        self.next_offset += data.len() as u64;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verifier_catches_corruption_and_misplacement() {
        let mut src = PatternSource;
        let mut a = vec![0u8; 100];
        src.read_at(0, &mut a);
        let mut b = vec![0u8; 100];
        src.read_at(100, &mut b);
        let mut v = PatternVerifier::default();
        assert!(v.check(0, &a));
        assert!(!v.check(0, &b), "wrong offset");
        let mut v = PatternVerifier::default();
        assert!(v.check(0, &a));
        b[7] ^= 1;
        assert!(!v.check(100, &b));
        assert_eq!(v.first_error, Some(107));
    }
}

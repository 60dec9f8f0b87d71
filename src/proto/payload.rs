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

/// The 8 pattern bytes of the aligned word `offset / 8`. Mixing the word
/// number (rather than `offset % 256`) makes a segment placed at the wrong
/// offset show; whole words keep filling and checking at memory speed.
fn pattern_word(word: u64) -> u64 {
    (word ^ (word >> 29)).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// The byte at `offset` of the test pattern.
pub fn pattern_byte(offset: u64) -> u8 {
    pattern_word(offset / 8).to_le_bytes()[(offset % 8) as usize]
}

/// Bytes before the first aligned word, at most `len`.
fn unaligned_head(offset: u64, len: usize) -> usize {
    (((8 - offset % 8) % 8) as usize).min(len)
}

/// Fills `buf` with the pattern bytes from `offset`.
pub fn fill_pattern(offset: u64, buf: &mut [u8]) {
    let head = unaligned_head(offset, buf.len());
    let (first, body) = buf.split_at_mut(head);
    for (i, b) in first.iter_mut().enumerate() {
        *b = pattern_byte(offset + i as u64);
    }
    let at = offset + head as u64;
    let tail_at = at + (body.len() / 8 * 8) as u64;
    let mut words = body.chunks_exact_mut(8);
    for (k, w) in words.by_ref().enumerate() {
        w.copy_from_slice(&pattern_word(at / 8 + k as u64).to_le_bytes());
    }
    for (i, b) in words.into_remainder().iter_mut().enumerate() {
        *b = pattern_byte(tail_at + i as u64);
    }
}

/// The position of the first byte of `data` that is not the pattern at
/// `offset`, if any.
pub fn pattern_mismatch(offset: u64, data: &[u8]) -> Option<usize> {
    let bytewise =
        |from: usize, to: usize| (from..to).find(|&i| data[i] != pattern_byte(offset + i as u64));
    let head = unaligned_head(offset, data.len());
    if let Some(i) = bytewise(0, head) {
        return Some(i);
    }
    let at = offset + head as u64;
    let body = &data[head..];
    for (k, w) in body.chunks_exact(8).enumerate() {
        let word = u64::from_le_bytes(w.try_into().expect("chunks of 8"));
        if word != pattern_word(at / 8 + k as u64) {
            let from = head + 8 * k;
            return bytewise(from, from + 8);
        }
    }
    bytewise(head + body.len() / 8 * 8, data.len())
}

/// A stream whose bytes are the test pattern of their offset: a
/// function of the byte's 8-byte word number, so a segment placed at the
/// wrong offset shows (`pattern_byte`).
#[derive(Debug, Default, Clone, Copy)]
pub struct PatternSource;

impl PayloadSource for PatternSource {
    fn read_at(&mut self, offset: u64, buf: &mut [u8]) {
        fill_pattern(offset, buf);
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
        if let Some(i) = pattern_mismatch(offset, data) {
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

    #[test]
    fn word_fill_matches_the_byte_definition_at_any_alignment() {
        for offset in 0..17u64 {
            for len in [0usize, 1, 7, 8, 9, 23, 64] {
                let mut buf = vec![0u8; len];
                fill_pattern(offset, &mut buf);
                let want: Vec<u8> = (0..len as u64).map(|i| pattern_byte(offset + i)).collect();
                assert_eq!(buf, want, "offset {offset} len {len}");
                assert_eq!(pattern_mismatch(offset, &buf), None);
                if len > 0 {
                    buf[len - 1] ^= 0x40;
                    assert_eq!(pattern_mismatch(offset, &buf), Some(len - 1));
                }
            }
        }
        // A segment one word off is caught.
        let mut buf = vec![0u8; 64];
        fill_pattern(8, &mut buf);
        assert!(pattern_mismatch(0, &buf).is_some());
    }
}

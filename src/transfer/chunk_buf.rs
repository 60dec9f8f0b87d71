//! The buffer a chunk and its BLAKE3 value travel in, at both ends: filled
//! by a reader's positioned read or by the receiver's segments, hashed,
//! then sent or written, and handed back to a pool for the next chunk.
//!
//! Two costs it removes. The kernel copies a read into user memory and a
//! write out of it fastest when the user buffer starts on a page: on this
//! project's test machine (AMD EPYC, tmpfs) a 1 MiB `pread` into a buffer
//! at a page boundary cost 0.19 to 0.26 s of CPU per GiB, and 0.57 to
//! 0.73 s into one 16 bytes past it, where the allocator puts a `Vec`'s
//! data. And a reused buffer is not zeroed: its bytes are overwritten
//! before they are read, and only the first `len` of them are ever seen.

use std::fmt;
use std::ops::{Deref, DerefMut};

/// A chunk buffer: `len` bytes starting at a page boundary when it holds
/// a big chunk (see [`ChunkBuf::set_len`]).
#[derive(Default)]
pub(crate) struct ChunkBuf {
    mem: Vec<u8>,
    /// Where the bytes start in `mem`.
    start: usize,
    len: usize,
}

impl ChunkBuf {
    /// The boundary big chunks start at: a page.
    pub(crate) const ALIGN: usize = 4096;

    /// Chunks from this length up start on a page, for at most 1/16 more
    /// memory; smaller ones (the chunks of small files) are allocated to
    /// their length, so that a window full of tiny chunks costs what they
    /// hold.
    const ALIGNED_FROM: usize = 16 * Self::ALIGN;

    /// A buffer of `len` bytes: this one's memory if it is big enough (the
    /// bytes are what it held before: whoever fills it overwrites them
    /// all before they are read), otherwise new memory. New memory comes
    /// zeroed from the allocator, which for a chunk-sized block means
    /// fresh pages that no one has to clear by hand.
    pub(crate) fn set_len(&mut self, len: usize) {
        if self.start + len > self.mem.len() {
            let pad = if len >= Self::ALIGNED_FROM {
                Self::ALIGN - 1
            } else {
                0
            };
            self.mem = vec![0; len + pad];
            let to_page = self.mem.as_ptr().align_offset(Self::ALIGN);
            self.start = if to_page <= pad { to_page } else { 0 };
        }
        self.len = len;
    }
}

impl Deref for ChunkBuf {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.mem[self.start..self.start + self.len]
    }
}

impl DerefMut for ChunkBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.mem[self.start..self.start + self.len]
    }
}

impl fmt::Debug for ChunkBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ChunkBuf({} bytes)", self.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transfer::hash::CHUNK_SIZE;
    use crate::transfer::layout::CV_LEN;

    const FULL: usize = (CHUNK_SIZE + CV_LEN) as usize;

    #[test]
    fn a_full_chunk_starts_on_a_page() {
        for _ in 0..8 {
            let mut buf = ChunkBuf::default();
            buf.set_len(FULL);
            assert_eq!(buf.as_ptr() as usize % ChunkBuf::ALIGN, 0);
            assert_eq!(buf.len(), FULL);
        }
    }

    #[test]
    fn a_small_chunk_takes_its_length_only() {
        let mut buf = ChunkBuf::default();
        buf.set_len(10 + CV_LEN as usize);
        assert_eq!(buf.mem.len(), 42, "no page of padding for 42 bytes");
    }

    /// A buffer reused for a shorter chunk shows that chunk's length only:
    /// the bytes of the chunk it held before, past it, are never seen.
    #[test]
    fn a_reused_buffer_shows_only_the_new_length_and_keeps_its_memory() {
        let mut buf = ChunkBuf::default();
        buf.set_len(FULL);
        buf.fill(0xaa);
        let at = buf.as_ptr();
        buf.set_len(42);
        assert_eq!(buf.len(), 42);
        assert_eq!(buf.as_ptr(), at, "the same memory, not a new block");
        buf.set_len(FULL);
        assert_eq!(buf.as_ptr(), at, "grown back within its memory");
    }

    #[test]
    fn a_buffer_too_small_for_a_chunk_is_replaced_and_aligned() {
        let mut buf = ChunkBuf::default();
        buf.set_len(42);
        buf.set_len(FULL);
        assert_eq!(buf.len(), FULL);
        assert_eq!(buf.as_ptr() as usize % ChunkBuf::ALIGN, 0);
    }
}

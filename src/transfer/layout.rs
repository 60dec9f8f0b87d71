//! Where each chunk sits in a data stream. Both ends compute it from the
//! stream's header and the manifest's file sizes, so a segment's stream
//! offset alone says which file and which bytes it carries; the receiver
//! can place data that arrives out of order.

use super::hash::{chunk_len, CHUNK_SIZE};
use super::messages::{data_header_len, ChunkRef, DataHeader};

/// Bytes of the BLAKE3 value that follows each chunk's data.
pub const CV_LEN: u64 = 32;

/// One chunk in a data stream: its data at `offset`, then its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    pub chunk: ChunkRef,
    /// Stream offset of the chunk's first byte.
    pub offset: u64,
    /// Bytes of data (the value follows).
    pub len: u32,
}

impl Slot {
    /// Stream offset just past the chunk's value.
    pub fn end(&self) -> u64 {
        self.offset + u64::from(self.len) + CV_LEN
    }

    /// Where the chunk's data goes in its file.
    pub fn file_offset(&self) -> u64 {
        self.chunk.chunk * CHUNK_SIZE
    }
}

#[derive(Debug, Clone)]
pub struct Layout {
    pub header_len: u64,
    pub slots: Vec<Slot>,
}

impl Layout {
    /// The layout of a stream with this (checked) header.
    pub fn new(header: &DataHeader, file_sizes: &[u64]) -> Layout {
        let header_len = data_header_len(header.ranges.len()) as u64;
        let mut offset = header_len;
        let mut slots = Vec::new();
        for r in &header.ranges {
            let size = file_sizes[r.file as usize];
            for chunk in r.first..r.first + r.count {
                let len = chunk_len(size, chunk) as u32;
                slots.push(Slot {
                    chunk: ChunkRef {
                        file: r.file,
                        chunk,
                    },
                    offset,
                    len,
                });
                offset += u64::from(len) + CV_LEN;
            }
        }
        Layout { header_len, slots }
    }

    /// The stream's length.
    pub fn total_len(&self) -> u64 {
        self.slots.last().map_or(self.header_len, Slot::end)
    }

    /// The slot holding stream byte `offset`, if a slot does.
    pub fn slot_at(&self, offset: u64) -> Option<usize> {
        let i = self.slots.partition_point(|s| s.end() <= offset);
        (i < self.slots.len() && self.slots[i].offset <= offset).then_some(i)
    }
}

/// The ranges of a header that carries `chunks` in this order, merging
/// runs of consecutive chunks of one file.
pub fn header_for(chunks: &[ChunkRef]) -> DataHeader {
    use super::messages::ChunkRange;
    let mut ranges: Vec<ChunkRange> = Vec::new();
    for c in chunks {
        match ranges.last_mut() {
            Some(r) if r.file == c.file && r.first + r.count == c.chunk => r.count += 1,
            _ => ranges.push(ChunkRange {
                file: c.file,
                first: c.chunk,
                count: 1,
            }),
        }
    }
    DataHeader { ranges }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_follow_the_header_and_are_found_by_offset() {
        let sizes = [CHUNK_SIZE + 10, 0, 7];
        let chunks = [
            ChunkRef { file: 0, chunk: 0 },
            ChunkRef { file: 0, chunk: 1 },
            ChunkRef { file: 2, chunk: 0 },
        ];
        let header = header_for(&chunks);
        assert_eq!(header.ranges.len(), 2);
        let layout = Layout::new(&header, &sizes);
        let h = data_header_len(2) as u64;
        assert_eq!(layout.header_len, h);
        let s = &layout.slots;
        assert_eq!((s[0].offset, s[0].len), (h, CHUNK_SIZE as u32));
        assert_eq!((s[1].offset, s[1].len), (h + CHUNK_SIZE + 32, 10));
        assert_eq!(s[1].file_offset(), CHUNK_SIZE);
        assert_eq!(s[2].offset, s[1].end());
        assert_eq!(layout.total_len(), s[2].offset + 7 + 32);
        assert_eq!(layout.slot_at(0), None, "the header is no slot");
        assert_eq!(layout.slot_at(h), Some(0));
        assert_eq!(layout.slot_at(s[0].end() - 1), Some(0), "the value is");
        assert_eq!(layout.slot_at(s[0].end()), Some(1));
        assert_eq!(layout.slot_at(layout.total_len() - 1), Some(2));
        assert_eq!(layout.slot_at(layout.total_len()), None);
        let got: Vec<ChunkRef> = s.iter().map(|s| s.chunk).collect();
        assert_eq!(got, chunks);
    }
}

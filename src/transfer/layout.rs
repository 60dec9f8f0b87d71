//! Where each chunk sits in a data stream. Both ends compute it from the
//! stream's header and the manifest's file sizes, so a segment's stream
//! offset alone says which file and which bytes it carries; the receiver
//! can place data that arrives out of order.

use super::compress::{Encoding, FrameError, FrameHeader, FRAME_HEADER_LEN};
use super::hash::{chunk_len, CHUNK_SIZE};
use super::messages::{data_header_len, framed_header_len, ChunkRef, DataHeader};

/// Bytes of the BLAKE3 value that follows each chunk's data.
pub const CV_LEN: u64 = 32;

/// One chunk in a data stream: its data at `offset`, then its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    pub chunk: ChunkRef,
    /// Stream offset of the chunk's first byte.
    pub offset: u64,
    /// Bytes of the chunk's data, raw: what is hashed and written.
    pub len: u32,
    /// How it travels: raw, or compressed (framed streams only).
    pub encoding: Encoding,
    /// Bytes of it in the stream (the value follows): `len` for a raw
    /// chunk, less for a compressed one.
    pub wire_len: u32,
}

impl Slot {
    /// Stream offset just past the chunk's value.
    pub fn end(&self) -> u64 {
        self.offset + self.wire_bytes()
    }

    /// Bytes of the stream it takes: its data as sent and its value.
    pub fn wire_bytes(&self) -> u64 {
        u64::from(self.wire_len) + CV_LEN
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
        Layout::with_frames(header_len, header, file_sizes, |_, len| {
            Ok(FrameHeader {
                encoding: Encoding::Raw,
                wire_len: len,
            })
        })
        .expect("every chunk raw")
    }

    /// The layout of a framed stream (`--compress`) with this (checked)
    /// header and these frame headers, one per chunk: each is checked
    /// against its chunk's raw length ([`FrameHeader::parse`]), so no
    /// chunk takes more of the stream than it would raw.
    pub fn framed(
        header: &DataHeader,
        frames: &[[u8; FRAME_HEADER_LEN]],
        file_sizes: &[u64],
    ) -> Result<Layout, FrameError> {
        let chunks = frames.len() as u64;
        let header_len = framed_header_len(header.ranges.len(), chunks);
        let mut frames = frames.iter();
        let layout = Layout::with_frames(header_len, header, file_sizes, |_, len| {
            let frame = frames.next().ok_or(FrameError::Missing)?;
            FrameHeader::parse(frame, len)
        })?;
        match frames.next() {
            Some(_) => Err(FrameError::Missing),
            None => Ok(layout),
        }
    }

    fn with_frames(
        header_len: u64,
        header: &DataHeader,
        file_sizes: &[u64],
        mut frame: impl FnMut(ChunkRef, u32) -> Result<FrameHeader, FrameError>,
    ) -> Result<Layout, FrameError> {
        let mut offset = header_len;
        let mut slots = Vec::new();
        for r in &header.ranges {
            let size = file_sizes[r.file as usize];
            for chunk in r.first..r.first + r.count {
                let len = chunk_len(size, chunk) as u32;
                let chunk = ChunkRef {
                    file: r.file,
                    chunk,
                };
                let FrameHeader { encoding, wire_len } = frame(chunk, len)?;
                let slot = Slot {
                    chunk,
                    offset,
                    len,
                    encoding,
                    wire_len,
                };
                offset = slot.end();
                slots.push(slot);
            }
        }
        Ok(Layout { header_len, slots })
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

    /// A framed stream's chunks take their wire lengths; a frame that
    /// claims more than its chunk, or a frame too many or too few, is
    /// refused.
    #[test]
    fn a_framed_layout_places_chunks_by_their_wire_lengths() {
        let sizes = [CHUNK_SIZE + 10];
        let header = header_for(&[
            ChunkRef { file: 0, chunk: 0 },
            ChunkRef { file: 0, chunk: 1 },
        ]);
        let zstd = |n: u32| {
            FrameHeader {
                encoding: Encoding::Zstd,
                wire_len: n,
            }
            .encode()
        };
        let raw = |n: u32| {
            FrameHeader {
                encoding: Encoding::Raw,
                wire_len: n,
            }
            .encode()
        };
        let layout = Layout::framed(&header, &[zstd(1000), raw(10)], &sizes).unwrap();
        let h = framed_header_len(1, 2);
        let s = &layout.slots;
        assert_eq!(
            (s[0].offset, s[0].len, s[0].wire_len),
            (h, CHUNK_SIZE as u32, 1000)
        );
        assert_eq!(s[1].offset, h + 1000 + CV_LEN);
        assert_eq!(layout.total_len(), s[1].offset + 10 + CV_LEN);
        assert_eq!(layout.slot_at(h + 1000 + CV_LEN - 1), Some(0));
        for bad in [
            vec![zstd(CHUNK_SIZE as u32), raw(10)],
            vec![raw(CHUNK_SIZE as u32 - 1), raw(10)],
            vec![zstd(1000)],
            vec![zstd(1000), raw(10), raw(10)],
        ] {
            assert!(Layout::framed(&header, &bad, &sizes).is_err(), "{bad:?}");
        }
    }
}

//! Per-chunk compression for `--compress` (issue 30 point 4): each 1 MiB
//! chunk is compressed on its own with zstd (RFC 8878) on the sender's
//! reader threads, and goes raw, flagged, when that does not save at
//! least a twentieth of it; the receiver expands it into a buffer of the
//! chunk's planned raw length and no more, then checks BLAKE3 over the
//! raw bytes as for any chunk. Each chunk's *frame header* is one byte of
//! encoding and its wire length (big-endian `u32`).
//!
//! Every frame header is attacker-chosen: [`FrameHeader::parse`] refuses a
//! raw frame whose length is not the chunk's and a zstd frame not shorter
//! than it, so a frame never takes more of the stream than the raw chunk
//! would; [`ChunkDecompressor::decompress`] writes into the caller's
//! buffer of the raw length, which zstd never writes past (a "bomb" that
//! expands beyond it is refused, not allocated), and refuses one that
//! comes out short.
//!
//! The frame headers of a stream's chunks travel together in its framed
//! data header (`messages::DataHeader::encode_framed`), so both ends know
//! where every chunk sits before its bytes come (docs/transfer.md,
//! "Compression").

use super::hash::CHUNK_SIZE;

/// Bytes of a frame header: encoding, then the wire length.
pub const FRAME_HEADER_LEN: usize = 1 + 4;

/// How a chunk's bytes travel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// As they are: compression did not pay.
    Raw = 0,
    /// One zstd frame (RFC 8878 §3.1.1).
    Zstd = 1,
}

/// Why a chunk frame from the peer is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("a chunk frame of unknown encoding {0}")]
    UnknownEncoding(u8),
    #[error("a raw chunk frame of {wire} bytes for a chunk of {raw}")]
    RawLength { wire: u32, raw: u32 },
    #[error("a compressed chunk frame of {wire} bytes for a chunk of {raw}: not smaller")]
    NotSmaller { wire: u32, raw: u32 },
    #[error("a compressed chunk that does not expand to its {raw} bytes: {why}")]
    Corrupt { raw: u32, why: String },
    #[error("a framed data header whose frames are not one per chunk")]
    Missing,
}

/// A frame's header: how its chunk is encoded and how many bytes follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    pub encoding: Encoding,
    pub wire_len: u32,
}

impl FrameHeader {
    pub fn encode(&self) -> [u8; FRAME_HEADER_LEN] {
        let mut out = [0; FRAME_HEADER_LEN];
        out[0] = self.encoding as u8;
        out[1..].copy_from_slice(&self.wire_len.to_be_bytes());
        out
    }

    /// Reads the header of the frame of a chunk of `raw_len` bytes,
    /// refusing any that would make the frame longer than the chunk.
    pub fn parse(bytes: &[u8; FRAME_HEADER_LEN], raw_len: u32) -> Result<FrameHeader, FrameError> {
        let wire_len = u32::from_be_bytes(bytes[1..].try_into().expect("4 bytes"));
        let encoding = match bytes[0] {
            0 if wire_len == raw_len => Encoding::Raw,
            0 => {
                return Err(FrameError::RawLength {
                    wire: wire_len,
                    raw: raw_len,
                })
            }
            1 if wire_len < raw_len => Encoding::Zstd,
            1 => {
                return Err(FrameError::NotSmaller {
                    wire: wire_len,
                    raw: raw_len,
                })
            }
            other => return Err(FrameError::UnknownEncoding(other)),
        };
        Ok(FrameHeader { encoding, wire_len })
    }
}

/// The most a compressed chunk of `raw_len` bytes may take to be sent
/// compressed: under 0.95 of it. Below that saving, the receiver's work
/// to expand it costs more than the link time it saves on any path fast
/// enough to matter, and random or already compressed data (zstd adds a
/// few bytes to it) goes raw without a second look.
pub fn worth_sending_below(raw_len: usize) -> usize {
    raw_len - raw_len / 20
}

/// Log2 of the largest window a chunk's frame needs: the chunk itself.
const WINDOW_LOG: u32 = CHUNK_SIZE.trailing_zeros();

/// A zstd compressor for one reader thread, kept from chunk to chunk so
/// that its context is allocated once.
pub struct ChunkCompressor {
    zstd: zstd::bulk::Compressor<'static>,
    level: i32,
}

impl ChunkCompressor {
    pub fn new(level: i32) -> std::io::Result<ChunkCompressor> {
        let mut zstd = zstd::bulk::Compressor::new(level)?;
        // BLAKE3 covers the raw bytes; zstd's own checksum would be 4
        // bytes and a hash pass more per chunk for nothing.
        zstd.set_parameter(zstd::zstd_safe::CParameter::ChecksumFlag(false))?;
        zstd.set_parameter(zstd::zstd_safe::CParameter::WindowLog(WINDOW_LOG))?;
        Ok(ChunkCompressor { zstd, level })
    }

    pub fn level(&self) -> i32 {
        self.level
    }

    pub fn set_level(&mut self, level: i32) -> std::io::Result<()> {
        if level != self.level {
            self.zstd.set_compression_level(level)?;
            self.level = level;
        }
        Ok(())
    }

    /// Compresses `raw` into `out` (cleared first) if that pays
    /// ([`worth_sending_below`]); otherwise leaves `out` empty and says
    /// [`Encoding::Raw`]. zstd stops as soon as the output would not fit
    /// the bound, so a chunk that does not shrink costs no more memory
    /// than one that does.
    pub fn compress(&mut self, raw: &[u8], out: &mut Vec<u8>) -> Encoding {
        out.clear();
        let bound = worth_sending_below(raw.len());
        if bound == 0 {
            return Encoding::Raw;
        }
        out.reserve(bound - 1);
        // The Vec's capacity bounds zstd's output; it may be larger than
        // asked, so the length is checked again.
        match self.zstd.compress_to_buffer(raw, out) {
            Ok(n) if n < bound => Encoding::Zstd,
            _ => {
                out.clear();
                Encoding::Raw
            }
        }
    }
}

/// Pieces a round's data is sampled in before it is framed
/// ([`samples_pay`]): at most this many, of at most [`SAMPLE_BYTES`] each.
pub const SAMPLES: usize = 16;
pub const SAMPLE_BYTES: usize = 32 * 1024;

/// Whether framing a round pays, judged on `samples`: pieces read at
/// evenly spaced byte positions of what it sends. Each is compressed on
/// its own, as chunks are, at zstd's default level; together they must
/// save the twentieth a chunk must ([`worth_sending_below`]). A framed
/// stream waits for its chunks to be compressed before it starts, which
/// random or already compressed data would pay for nothing: 6 % of an
/// 8.4 MB random file's time at 100 Mbit/s (docs/transfer.md,
/// "Compression"). Where zstd cannot start, the answer is yes: the
/// framed path then does as it always did.
pub fn samples_pay(samples: &[Vec<u8>]) -> bool {
    let Ok(mut c) = ChunkCompressor::new(3) else {
        return true;
    };
    let mut out = Vec::new();
    let (mut raw, mut wire) = (0, 0);
    for s in samples {
        raw += s.len();
        wire += match c.compress(s, &mut out) {
            Encoding::Zstd => out.len(),
            Encoding::Raw => s.len(),
        };
    }
    raw > 0 && wire < worth_sending_below(raw)
}

/// A zstd decompressor for one writer thread, kept from chunk to chunk.
pub struct ChunkDecompressor {
    zstd: zstd::bulk::Decompressor<'static>,
}

impl ChunkDecompressor {
    pub fn new() -> std::io::Result<ChunkDecompressor> {
        // One-shot decompression (`ZSTD_decompressDCtx`) decodes straight
        // into the destination, which is its window: whatever window a
        // frame's header claims, nothing is allocated by it, and the
        // context is the same few hundred KB for every frame.
        Ok(ChunkDecompressor {
            zstd: zstd::bulk::Decompressor::new()?,
        })
    }

    /// Expands `wire` into `raw`, which has the chunk's planned length:
    /// zstd never writes past it, and anything but exactly that many
    /// bytes is refused.
    pub fn decompress(&mut self, wire: &[u8], raw: &mut [u8]) -> Result<(), FrameError> {
        let want = raw.len();
        let corrupt = |why: String| FrameError::Corrupt {
            raw: want as u32,
            why,
        };
        match self.zstd.decompress_to_buffer(wire, raw) {
            Ok(n) if n == want => Ok(()),
            Ok(n) => Err(corrupt(format!("{n} bytes"))),
            Err(e) => Err(corrupt(e.to_string())),
        }
    }
}

/// The zstd levels `--compress` moves between. Measured with `zstd
/// -bL -B1MiB -i2` (1 MiB blocks, as chunks) on a tar of this repo's
/// src/ and docs/ (5.9 MB), one core of this project's 2-core build
/// machine: level 1 461 MB/s at 6.15x, 3 295 MB/s at 6.67x, 5 149 MB/s
/// at 7.05x, 9 74 MB/s at 7.59x; past 9 each step costs more CPU for
/// under 1 % more ratio (zstd's own table says the same).
pub const LEVELS: std::ops::RangeInclusive<i32> = 1..=9;

/// Compressors slower than this many times the link's drain step a level
/// down: compression must never be the bottleneck, and the rates it is
/// judged on are averages over a chunk or more.
const DOWN_BELOW: f64 = 2.0;

/// Compressors at least this many times faster than the link's drain step
/// a level up. Its gap above [`DOWN_BELOW`] must exceed the costliest
/// single step, or a level would go up and straight back down: 4 to 5 is
/// that step, 2.1x the CPU in the figures of [`LEVELS`].
const UP_FROM: f64 = 5.0;

/// Chooses the compression level from two measured rates, both in raw
/// bytes per second: what the readers compress at the present level (all
/// of them together), and what the link takes (its wire rate over the
/// ratio so far, wire/raw). One step at a time, down when the
/// compressors run under [`DOWN_BELOW`] times the link, up from
/// [`UP_FROM`] times; between the two the level stays.
pub fn next_level(level: i32, compress_rate: f64, link_rate: f64) -> i32 {
    let level = level.clamp(*LEVELS.start(), *LEVELS.end());
    if compress_rate < DOWN_BELOW * link_rate {
        (level - 1).max(*LEVELS.start())
    } else if compress_rate >= UP_FROM * link_rate {
        (level + 1).min(*LEVELS.end())
    } else {
        level
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Text as source code is: repeated words, some structure.
    fn text(len: usize) -> Vec<u8> {
        let words = [
            "fn ", "let ", "self", ".len()", " -> ", "u64", "\n    ", "{ ", "}\n",
        ];
        let mut out = Vec::with_capacity(len);
        let mut i = 0usize;
        while out.len() < len {
            out.extend_from_slice(words[(i * 7 + i / 3) % words.len()].as_bytes());
            i += 1;
        }
        out.truncate(len);
        out
    }

    fn random(len: usize) -> Vec<u8> {
        use rand_core::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let mut out = vec![0; len];
        rng.fill_bytes(&mut out);
        out
    }

    /// A frame as a hostile sender may make it, within the window a
    /// chunk allows, so that only the output bound refuses it.
    fn zstd_frame(raw: &[u8]) -> Vec<u8> {
        let mut zstd = zstd::bulk::Compressor::new(3).unwrap();
        zstd.set_parameter(zstd::zstd_safe::CParameter::WindowLog(WINDOW_LOG))
            .unwrap();
        zstd.compress(raw).unwrap()
    }

    #[test]
    fn text_shrinks_and_comes_back_whole() {
        let raw = text(CHUNK_SIZE as usize);
        let mut c = ChunkCompressor::new(1).unwrap();
        let mut wire = Vec::new();
        assert_eq!(c.compress(&raw, &mut wire), Encoding::Zstd);
        assert!(wire.len() * 3 < raw.len(), "{} bytes", wire.len());
        let mut back = vec![0; raw.len()];
        ChunkDecompressor::new()
            .unwrap()
            .decompress(&wire, &mut back)
            .unwrap();
        assert_eq!(back, raw);
    }

    #[test]
    fn random_data_goes_raw() {
        let raw = random(CHUNK_SIZE as usize);
        let mut c = ChunkCompressor::new(9).unwrap();
        let mut wire = vec![1, 2, 3];
        assert_eq!(c.compress(&raw, &mut wire), Encoding::Raw);
        assert!(wire.is_empty());
        assert_eq!(c.compress(&[], &mut wire), Encoding::Raw, "nothing to save");
    }

    /// A round is framed when its samples together save a twentieth:
    /// text does, random data does not, and an eighth of text among
    /// random data (a saving of about 11 %) does.
    #[test]
    fn a_round_is_framed_only_when_its_samples_shrink() {
        let piece = |f: fn(usize) -> Vec<u8>| f(SAMPLE_BYTES);
        assert!(samples_pay(&vec![piece(text); SAMPLES]));
        let randoms: Vec<Vec<u8>> = (0..SAMPLES).map(|_| piece(random)).collect();
        assert!(!samples_pay(&randoms));
        let mut mixed = randoms.clone();
        mixed[0] = piece(text);
        mixed[1] = piece(text);
        assert!(samples_pay(&mixed), "2 of 16 pieces text: about 11 % saved");
        assert!(!samples_pay(&[]), "nothing to send, nothing to frame");
    }

    /// Half random, half zeros shrinks to about half: sent compressed;
    /// 97 % random saves under a twentieth: sent raw.
    #[test]
    fn only_a_saving_of_a_twentieth_is_sent_compressed() {
        let mut c = ChunkCompressor::new(3).unwrap();
        let mut wire = Vec::new();
        let mut half = random(1 << 16);
        half.resize(1 << 17, 0);
        assert_eq!(c.compress(&half, &mut wire), Encoding::Zstd);
        let mut most = random(97 * 1024);
        most.resize(100 * 1024, 0);
        assert_eq!(c.compress(&most, &mut wire), Encoding::Raw);
        assert_eq!(worth_sending_below(100 * 1024), 95 * 1024);
    }

    #[test]
    fn frame_headers_round_trip_and_never_claim_more_than_the_chunk() {
        for h in [
            FrameHeader {
                encoding: Encoding::Raw,
                wire_len: 100,
            },
            FrameHeader {
                encoding: Encoding::Zstd,
                wire_len: 99,
            },
        ] {
            assert_eq!(FrameHeader::parse(&h.encode(), 100), Ok(h));
        }
        let raw_short = [0, 0, 0, 0, 99];
        assert_eq!(
            FrameHeader::parse(&raw_short, 100),
            Err(FrameError::RawLength { wire: 99, raw: 100 })
        );
        for wire in [100u32, 101, u32::MAX] {
            let mut h = [1, 0, 0, 0, 0];
            h[1..].copy_from_slice(&wire.to_be_bytes());
            assert_eq!(
                FrameHeader::parse(&h, 100),
                Err(FrameError::NotSmaller { wire, raw: 100 })
            );
        }
        assert_eq!(
            FrameHeader::parse(&[2, 0, 0, 0, 1], 100),
            Err(FrameError::UnknownEncoding(2))
        );
    }

    /// 64 MiB of zeros compress to a few KiB: expanded into a chunk of
    /// 1 MiB, zstd stops at the end of the buffer and the frame is
    /// refused; nothing is allocated by the frame's own claim.
    #[test]
    fn a_bomb_is_refused_at_the_chunks_length() {
        let zeros = vec![0u8; 64 << 20];
        let bomb = zstd_frame(&zeros);
        assert!(bomb.len() < CHUNK_SIZE as usize / 20);
        let mut raw = vec![0xaa; CHUNK_SIZE as usize];
        let e = ChunkDecompressor::new()
            .unwrap()
            .decompress(&bomb, &mut raw)
            .unwrap_err();
        assert!(matches!(e, FrameError::Corrupt { raw, .. } if raw == CHUNK_SIZE as u32));
    }

    #[test]
    fn garbage_and_short_frames_are_refused() {
        let mut d = ChunkDecompressor::new().unwrap();
        let mut raw = vec![0; 4096];
        assert!(d.decompress(&random(300), &mut raw).is_err(), "garbage");
        let short = zstd_frame(&text(4000));
        assert!(d.decompress(&short, &mut raw).is_err(), "4000 of 4096");
        let mut frame = zstd_frame(&text(4096));
        let last = frame.len() - 1;
        frame.truncate(last);
        assert!(d.decompress(&frame, &mut raw).is_err(), "cut");
        assert!(d.decompress(&[], &mut raw).is_err(), "empty");
        let whole = zstd_frame(&text(4096));
        d.decompress(&whole, &mut raw).unwrap();
        assert_eq!(
            raw,
            text(4096),
            "the decompressor still works after refusals"
        );
    }

    #[test]
    fn the_level_climbs_only_while_the_link_is_the_bottleneck() {
        let mb = 1e6;
        // 10 Mbit/s of text at 4x: 5 MB/s raw; compressors at 400 MB/s.
        let mut level = 1;
        for _ in 0..20 {
            level = next_level(level, 400.0 * mb, 5.0 * mb);
        }
        assert_eq!(level, *LEVELS.end(), "a slow link: the best ratio");
        // A fast link (10 Gbit/s, 5 GB/s raw) against the same: down.
        for _ in 0..20 {
            level = next_level(level, 400.0 * mb, 5000.0 * mb);
        }
        assert_eq!(level, *LEVELS.start());
        // Between 2x and 5x: kept.
        assert_eq!(next_level(5, 499.0 * mb, 100.0 * mb), 5);
        assert_eq!(next_level(5, 200.0 * mb, 100.0 * mb), 5);
        assert_eq!(next_level(5, 199.0 * mb, 100.0 * mb), 4);
        assert_eq!(next_level(5, 500.0 * mb, 100.0 * mb), 6);
        // The measured 4 -> 5 step (319 to 149 MB/s): up at 5x, and the
        // slower level still holds.
        let link = 319.0 * mb / UP_FROM;
        assert_eq!(next_level(4, 319.0 * mb, link), 5);
        assert_eq!(next_level(5, 149.0 * mb, link), 5, "no swing back");
        assert_eq!(next_level(40, 1.0, 1e9), 8, "clamped first");
    }
}

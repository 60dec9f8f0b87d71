//! Per-chunk BLAKE3 values that merge into the file's BLAKE3 hash.
//!
//! BLAKE3 is a tree hash (BLAKE3 paper/spec §2.1, §5.1): the input is split into 1 KiB
//! chunks, and for an input of more than one chunk the left subtree holds the largest
//! power-of-two number of chunks that leaves at least one byte for the right subtree.
//! Because [`CHUNK_SIZE`] is a power-of-two multiple of 1 KiB, every transfer chunk but
//! the last is exactly 1024 BLAKE3 chunks and the last holds 1..=1024, so each transfer
//! chunk is a complete subtree of the file's tree. Its chaining value can be computed on
//! its own (sender and receiver check each chunk as it arrives, in any order), and the
//! values then merge into exactly `blake3::hash(file)`. For n >= 2 transfer chunks the
//! root's left subtree covers p chunks, p being the largest power of two below n.

use blake3::hazmat::{merge_subtrees_non_root, merge_subtrees_root, HasherExt, Mode};

/// 1 MiB: a power-of-two multiple of BLAKE3's 1 KiB chunk, so every transfer chunk is
/// a complete BLAKE3 subtree.
pub const CHUNK_SIZE: u64 = 1 << 20;

/// A 32-byte chunk value: a non-root chaining value, or the root hash for a one-chunk file.
pub type Cv = [u8; 32];

/// Number of transfer chunks in a file of `size` bytes (0 for an empty file).
pub fn chunk_count(size: u64) -> u64 {
    size.div_ceil(CHUNK_SIZE)
}

/// Length of chunk `index` of a file of `size` bytes (0 if there is no such chunk).
pub fn chunk_len(size: u64, index: u64) -> usize {
    if index >= chunk_count(size) {
        return 0;
    }
    // Bounded by CHUNK_SIZE, so the cast cannot truncate.
    (size - index * CHUNK_SIZE).min(CHUNK_SIZE) as usize
}

/// The 32-byte value the sender sends after chunk `index` and the receiver checks:
/// for a file of at most one chunk, the file's BLAKE3 hash itself (root finalization);
/// otherwise the non-root chaining value of the subtree at byte offset `index * CHUNK_SIZE`.
/// `data.len()` must equal `chunk_len(file_size, index)`.
pub fn chunk_cv(file_size: u64, index: u64, data: &[u8]) -> Cv {
    debug_assert_eq!(data.len(), chunk_len(file_size, index));
    let mut hasher = blake3::Hasher::new();
    if chunk_count(file_size) <= 1 {
        return *hasher.update(data).finalize().as_bytes();
    }
    hasher
        .set_input_offset(index * CHUNK_SIZE)
        .update(data)
        .finalize_non_root()
}

/// The file's BLAKE3 hash (identical to `blake3::hash(whole file)`) from its chunk values
/// in order. Returns `None` if `cvs.len() != chunk_count(file_size)`.
pub fn file_hash(file_size: u64, cvs: &[Cv]) -> Option<blake3::Hash> {
    if cvs.len() as u64 != chunk_count(file_size) {
        return None;
    }
    match cvs {
        [] => Some(blake3::hash(b"")),
        [only] => Some(blake3::Hash::from_bytes(*only)),
        _ => {
            let (left, right) = cvs.split_at(left_chunks(cvs.len()));
            Some(merge_subtrees_root(&merge(left), &merge(right), Mode::Hash))
        }
    }
}

/// What the finish carries for a file sent in part (`--shard`, a file
/// split by chunk ranges): the BLAKE3 hash, in a context of its own, of
/// the file's size, the range and the values of the range's chunks in
/// order. A range is not a subtree of the file's BLAKE3 tree, so it has no
/// hash of the file's kind; this one ties the values the receiver
/// verified to the sender's in the same way the file hash does.
pub fn part_digest(file_size: u64, first: u64, cvs: &[Cv]) -> Cv {
    let mut h = blake3::Hasher::new_derive_key("atou 2026-11 part of a file v1");
    h.update(&file_size.to_be_bytes());
    h.update(&first.to_be_bytes());
    h.update(&(cvs.len() as u64).to_be_bytes());
    for cv in cvs {
        h.update(cv);
    }
    *h.finalize().as_bytes()
}

/// Chunks in the left subtree of `n >= 2` chunks: the largest power of two below `n`.
fn left_chunks(n: usize) -> usize {
    1 << (n - 1).ilog2()
}

/// Non-root chaining value of the subtree spanning `cvs` (non-empty).
fn merge(cvs: &[Cv]) -> Cv {
    if let [only] = cvs {
        return *only;
    }
    let (left, right) = cvs.split_at(left_chunks(cvs.len()));
    merge_subtrees_non_root(&merge(left), &merge(right), Mode::Hash)
}

/// Lowercase hex of the first 8 bytes, for messages (e.g. "3f2a...").
pub fn short_hex(h: &[u8; 32]) -> String {
    h[..8].iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic pseudo-random contents (xorshift64).
    fn data(len: u64, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 32) as u8
            })
            .collect()
    }

    fn cvs_of(d: &[u8]) -> Vec<Cv> {
        let size = d.len() as u64;
        let mut at = 0;
        (0..chunk_count(size))
            .map(|i| {
                let len = chunk_len(size, i);
                let cv = chunk_cv(size, i, &d[at..at + len]);
                at += len;
                cv
            })
            .collect()
    }

    const C: u64 = CHUNK_SIZE;
    const SIZES: [u64; 12] = [
        0,
        1,
        1023,
        1024,
        C - 1,
        C,
        C + 1,
        2 * C,
        3 * C + 5,
        4 * C,
        5 * C + 1023,
        8 * C + 1,
    ];

    #[test]
    fn merged_cvs_equal_blake3_hash() {
        for (seed, size) in SIZES.into_iter().enumerate() {
            let d = data(size, seed as u64 + 7);
            let cvs = cvs_of(&d);
            assert_eq!(file_hash(size, &cvs), Some(blake3::hash(&d)), "size {size}");
        }
    }

    #[test]
    fn left_split_matches_blake3() {
        for n in 2..=70u64 {
            for last in [1, 1024, C - 1, C] {
                let size = (n - 1) * C + last;
                let left = left_chunks(n as usize) as u64 * C;
                assert_eq!(left, blake3::hazmat::left_subtree_len(size), "n {n}");
            }
        }
    }

    #[test]
    fn flipped_byte_changes_chunk_and_file() {
        for size in [C - 1, 3 * C + 5] {
            let mut d = data(size, 99);
            let good = cvs_of(&d);
            let i = chunk_count(size) / 2;
            d[(i * C) as usize + 17] ^= 0x01;
            let bad = cvs_of(&d);
            for (j, (g, b)) in good.iter().zip(&bad).enumerate() {
                assert_eq!(g == b, j as u64 != i, "size {size} chunk {j}");
            }
            assert_ne!(file_hash(size, &good), file_hash(size, &bad));
            assert_eq!(file_hash(size, &bad), Some(blake3::hash(&d)));
        }
    }

    #[test]
    fn chunk_order_matters() {
        let size = 3 * C + 5;
        let mut cvs = cvs_of(&data(size, 3));
        let good = file_hash(size, &cvs).unwrap();
        cvs.swap(0, 1);
        assert_ne!(file_hash(size, &cvs).unwrap(), good);
    }

    #[test]
    fn a_part_digest_depends_on_the_range_and_every_value() {
        let cvs: Vec<Cv> = (0..4u8).map(|i| [i; 32]).collect();
        let d = part_digest(4 * C, 0, &cvs);
        assert_ne!(d, part_digest(4 * C, 1, &cvs), "where it starts");
        assert_ne!(d, part_digest(5 * C, 0, &cvs), "the file's size");
        assert_ne!(d, part_digest(4 * C, 0, &cvs[..3]), "how many");
        let mut other = cvs.clone();
        other[2][31] ^= 1;
        assert_ne!(d, part_digest(4 * C, 0, &other), "a value");
        assert_eq!(d, part_digest(4 * C, 0, &cvs));
    }

    #[test]
    fn wrong_count_is_none() {
        let cv = [7u8; 32];
        assert_eq!(file_hash(0, &[cv]), None);
        assert_eq!(file_hash(1, &[]), None);
        assert_eq!(file_hash(C + 1, &[cv]), None);
        assert_eq!(file_hash(C, &[cv, cv]), None);
        assert_eq!(file_hash(0, &[]), Some(blake3::hash(b"")));
    }

    #[test]
    fn counts_and_lengths() {
        assert_eq!(chunk_count(0), 0);
        assert_eq!(chunk_count(1), 1);
        assert_eq!(chunk_count(C), 1);
        assert_eq!(chunk_count(C + 1), 2);
        assert_eq!(chunk_count(u64::MAX), 1 << 44);
        assert_eq!(chunk_len(0, 0), 0);
        assert_eq!(chunk_len(5, 0), 5);
        assert_eq!(chunk_len(5, 1), 0);
        assert_eq!(chunk_len(C, 0), C as usize);
        assert_eq!(chunk_len(2 * C + 3, 1), C as usize);
        assert_eq!(chunk_len(2 * C + 3, 2), 3);
        assert_eq!(chunk_len(u64::MAX, (1 << 44) - 1), C as usize - 1);
        assert_eq!(chunk_cv(0, 0, b""), *blake3::hash(b"").as_bytes());
        assert_eq!(short_hex(&[0xab; 32]), "abababababababab");
    }
}

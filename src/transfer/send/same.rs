//! Files sent once (`--compress`, issue 30 point 4): of the files a plan
//! sends whole, those whose bytes are byte for byte an earlier file's are
//! named in the plan ([`SameFile`]), and a receiver that has neither
//! writes each from its original's chunks as they arrive
//! ([`FilePlan::Copy`](crate::transfer::messages::FilePlan::Copy)).
//! A source tree of documentation repeats whole files (licences,
//! changelogs): per-chunk zstd cannot see a repeat across files, and rsync
//! -z's 32 KiB window cannot either.
//!
//! Finding them costs a read only where a repeat is possible: files are
//! grouped by size, a group's files by a BLAKE3 value of a few sampled
//! pieces (start, middle, end), and only files still grouped are read
//! whole and compared by their BLAKE3 hash. Every read goes through
//! [`Sources`], which checks each file is the one the walk saw, unchanged.

use std::collections::HashMap;
use std::ops::Range;

use crate::transfer::messages::SameFile;
use crate::transfer::source::Sources;
use crate::transfer::Error;

/// Bytes of each sampled piece.
const PIECE: u64 = 4096;
/// Bytes read at once when a file is hashed whole.
const READ: u64 = 1 << 20;

/// The files of `sizes` (not sent in part, per `parts`) whose bytes are
/// an earlier file's, each with the first file of its bytes, ascending.
pub(super) fn find(
    sources: &Sources,
    sizes: &[u64],
    parts: &[Option<Range<u64>>],
) -> Result<Vec<SameFile>, Error> {
    let mut by_size: HashMap<u64, Vec<usize>> = HashMap::new();
    for (f, &size) in sizes.iter().enumerate() {
        if size > 0 && parts.get(f).is_none_or(Option::is_none) {
            by_size.entry(size).or_default().push(f);
        }
    }
    let mut same = Vec::new();
    let mut buf = Vec::new();
    for (&size, files) in &by_size {
        if files.len() < 2 {
            continue;
        }
        for group in split_by(files, |f| sample(sources, f, size, &mut buf))? {
            for group in split_by(&group, |f| whole(sources, f, size, &mut buf))? {
                let of = group[0] as u32;
                same.extend(group[1..].iter().map(|&f| SameFile { file: f as u32, of }));
            }
        }
    }
    same.sort_unstable_by_key(|s| s.file);
    Ok(same)
}

/// `files` split by `key`, keeping only groups of two or more, each in
/// the order of `files` (so its first is its earliest file).
fn split_by(
    files: &[usize],
    mut key: impl FnMut(usize) -> Result<blake3::Hash, Error>,
) -> Result<Vec<Vec<usize>>, Error> {
    let mut groups: HashMap<blake3::Hash, Vec<usize>> = HashMap::new();
    for &f in files {
        groups.entry(key(f)?).or_default().push(f);
    }
    Ok(groups.into_values().filter(|g| g.len() >= 2).collect())
}

/// A value of pieces at the start, the middle and the end of file `f`.
fn sample(
    sources: &Sources,
    f: usize,
    size: u64,
    buf: &mut Vec<u8>,
) -> Result<blake3::Hash, Error> {
    let mut hasher = blake3::Hasher::new();
    let mut starts = vec![
        0,
        size.saturating_sub(PIECE) / 2,
        size.saturating_sub(PIECE),
    ];
    starts.dedup();
    for start in starts {
        let len = PIECE.min(size - start);
        read(sources, f, start, len, buf)?;
        hasher.update(buf);
    }
    Ok(hasher.finalize())
}

/// The BLAKE3 hash of the whole of file `f`.
fn whole(sources: &Sources, f: usize, size: u64, buf: &mut Vec<u8>) -> Result<blake3::Hash, Error> {
    let mut hasher = blake3::Hasher::new();
    let mut at = 0;
    while at < size {
        let len = READ.min(size - at);
        read(sources, f, at, len, buf)?;
        hasher.update(buf);
        at += len;
    }
    Ok(hasher.finalize())
}

fn read(sources: &Sources, f: usize, at: u64, len: u64, buf: &mut Vec<u8>) -> Result<(), Error> {
    buf.resize(len as usize, 0);
    sources.read_once(f, at, buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transfer::source::tests::sources;
    use std::fs;

    /// Only files byte for byte alike are named, each with the first of
    /// its bytes: not a file of the same size, nor one alike in every
    /// sampled piece but one byte between them, nor an empty one.
    #[test]
    fn only_files_alike_in_every_byte_are_named_with_the_first() {
        let dir = tempfile::tempdir().unwrap();
        let top = dir.path().join("t");
        fs::create_dir(&top).unwrap();
        let body: Vec<u8> = (0..3 * READ + 17).map(|i| (i % 251) as u8).collect();
        let mut near = body.clone();
        near[(READ + 5) as usize] ^= 1;
        let files: [(&str, &[u8]); 7] = [
            ("a", &body),
            ("b", &near),
            ("c", &body),
            ("d", b"short"),
            ("e", b"shorT"),
            ("f", b""),
            ("g", &body),
        ];
        for (name, bytes) in files {
            fs::write(top.join(name), bytes).unwrap();
        }
        fs::write(top.join("h"), b"").unwrap();
        let sources = sources(&top);
        let sizes: Vec<u64> = (0..8).map(|f| sources.size(f)).collect();
        let parts = vec![None; sizes.len()];
        let same = find(&sources, &sizes, &parts).unwrap();
        // Files in name order: a b c d e f g h = 0..8.
        let pairs: Vec<(u32, u32)> = same.iter().map(|s| (s.file, s.of)).collect();
        assert_eq!(pairs, [(2, 0), (6, 0)]);
        assert_eq!(sources.open_count(), 0, "every file read is closed again");
        // A file sent in part is never one of them.
        let mut parts = parts;
        parts[2] = Some(0..1);
        let same = find(&sources, &sizes, &parts).unwrap();
        let pairs: Vec<(u32, u32)> = same.iter().map(|s| (s.file, s.of)).collect();
        assert_eq!(pairs, [(6, 0)]);
    }
}

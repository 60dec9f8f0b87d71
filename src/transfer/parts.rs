//! A file split across shards (`--shard K/N`, docs/scale-out.md) arrives
//! in parts: each shard's session sends a range of its chunks, at the
//! same time as the others or long after, from other processes and hosts.
//! The parts are written into one partial file in the staging directory,
//! and the file takes its name only once every chunk is in and verified.
//!
//! No session sees the whole file, so what each one verified is kept in a
//! *record* beside the partial file, `HASH.chunks`: a header naming the
//! version of the file (size and mtime) and then, per chunk, the BLAKE3
//! value the sender sent and the receiver checked (all zeros for a chunk
//! not in yet). A session writes its part's values at its finish, once its
//! own check (the part's digest) has passed, under an exclusive `flock`
//! that every session of the file takes, in whatever process. The session
//! that fills the last gap verifies the rest of the file on disk against
//! the record before it renames it, so neither a crash between a chunk's
//! write and its record nor anything else that changed the partial file
//! is taken on trust; a single run trusts no more (a resume hashes its
//! partial file again).

use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::unix::fs::FileExt;

use rustix::fs::{flock, fstat, FileType, FlockOperation};

use super::dest::chunk_cv_on_disk;
use super::hash::{chunk_count, Cv, CHUNK_SIZE};
use crate::io::dest_dir::DestDir;

/// Identifies the record's layout; bumped on any change.
const MAGIC: &[u8; 16] = b"atou parts v1\n\0\0";
/// Magic, size, mtime seconds, mtime nanoseconds, 4 bytes of padding.
pub(crate) const HEADER_LEN: usize = 16 + 8 + 8 + 4 + 4;
/// A chunk whose value is not recorded yet.
const MISSING: Cv = [0; 32];

/// The version of a file its parts must all be of: a shard whose file
/// has another size or mtime is sending another file.
pub(crate) fn header(size: u64, mtime_sec: i64, mtime_nsec: u32) -> [u8; HEADER_LEN] {
    let mut h = [0; HEADER_LEN];
    h[..16].copy_from_slice(MAGIC);
    h[16..24].copy_from_slice(&size.to_be_bytes());
    h[24..32].copy_from_slice(&mtime_sec.to_be_bytes());
    h[32..36].copy_from_slice(&mtime_nsec.to_be_bytes());
    h
}

/// The record's name, beside the partial file `staged` (`HASH.part`).
pub(crate) fn record_name(staged: &str) -> String {
    format!("{}.chunks", staged.trim_end_matches(".part"))
}

fn slot(chunk: u64) -> u64 {
    HEADER_LEN as u64 + chunk * 32
}

fn not_regular() -> io::Error {
    io::Error::other("not a regular file")
}

/// Opens `name` in the staging directory (creating it if `create`) and
/// locks it; `None` when it does not exist. A record another session
/// removed while this one waited for the lock is looked up again.
fn open_locked(dest: &DestDir, name: &str, create: bool) -> io::Result<Option<File>> {
    for _ in 0..4 {
        let file = if create {
            dest.open_shared_staged(name)
        } else {
            dest.open_staged(name, true)
        };
        let file = match file {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        flock(&file, FlockOperation::LockExclusive)?;
        let st = fstat(&file)?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            return Err(not_regular());
        }
        if st.st_nlink > 0 {
            return Ok(Some(file));
        }
    }
    Ok(None)
}

/// At the plan: makes sure the record of the file's parts exists and is
/// of this version, starting it afresh (every chunk missing) if it is of
/// another (the sender's file changed since a part was recorded) or new.
pub(crate) fn start(
    dest: &DestDir,
    staged: &str,
    header: &[u8; HEADER_LEN],
    size: u64,
    fsync: bool,
) -> io::Result<()> {
    let Some(record) = open_locked(dest, &record_name(staged), true)? else {
        return Err(io::Error::from(io::ErrorKind::NotFound));
    };
    let mut have = [0; HEADER_LEN];
    let same = record.read_exact_at(&mut have, 0).is_ok() && have == *header;
    let len = slot(chunk_count(size));
    if same && record.metadata()?.len() == len {
        return Ok(());
    }
    record.set_len(0)?;
    record.write_all_at(header, 0)?;
    record.set_len(len)?;
    if fsync {
        record.sync_all()?;
    }
    Ok(())
}

/// What recording one session's part found.
#[derive(Debug)]
pub(crate) enum Recorded {
    /// Chunks other sessions have not sent yet; the file waits for them.
    // How many are missing: what the tests check; nothing else needs it yet.
    Waiting {
        #[cfg_attr(not(test), allow(dead_code))]
        missing: u64,
    },
    /// Every chunk is in and the partial file matches the record: the
    /// caller gives it its attributes and name, then calls
    /// [`Complete::done`]. The record stays locked until then.
    Complete(Complete),
    /// The file was completed and renamed by another session (this
    /// session's part had been recorded by an earlier run of its shard).
    PlacedBefore,
}

/// A complete file, with the record still locked.
#[derive(Debug)]
pub(crate) struct Complete {
    /// The partial file, open for reading and writing.
    pub file: File,
    record: File,
    name: String,
}

impl Complete {
    /// The file has its final name: the record goes, and with it the lock.
    pub(crate) fn done(self, dest: &DestDir) -> io::Result<()> {
        dest.remove_staged(&self.name)?;
        drop(self.record);
        Ok(())
    }
}

/// Why recording a part failed.
#[derive(Debug)]
pub(crate) enum PartError {
    Io(io::Error),
    /// The record is of another version of the file.
    OtherVersion,
    /// The record is gone, but the partial file is still there.
    RecordGone,
    /// Chunks on disk that other sessions recorded no longer match their
    /// values; they were dropped from the record. `(count, first)`.
    Changed(u64, u64),
}

impl From<io::Error> for PartError {
    fn from(e: io::Error) -> PartError {
        PartError::Io(e)
    }
}

/// At a session's finish, after its part's digest matched: records the
/// values of chunks `part` (`cvs`, one per chunk) and, when that fills
/// the last gap, verifies every other chunk on disk against the record.
pub(crate) fn record(
    dest: &DestDir,
    staged: &str,
    header: &[u8; HEADER_LEN],
    size: u64,
    part: &Range<u64>,
    cvs: &[Cv],
    fsync: bool,
) -> Result<Recorded, PartError> {
    let name = record_name(staged);
    let Some(record) = open_locked(dest, &name, false)? else {
        return match dest.look_staged(staged)? {
            crate::io::dest_dir::Found::Nothing => Ok(Recorded::PlacedBefore),
            _ => Err(PartError::RecordGone),
        };
    };
    let mut have = [0; HEADER_LEN];
    let chunks = chunk_count(size);
    if record.read_exact_at(&mut have, 0).is_err()
        || have != *header
        || record.metadata()?.len() != slot(chunks)
    {
        return Err(PartError::OtherVersion);
    }
    // Exists even if every chunk of this part was zeros (not written).
    let file = dest.open_shared_staged(staged)?;
    if fsync {
        // The data before the record of it.
        file.sync_data()?;
    }
    let ours: Vec<u8> = cvs.iter().flatten().copied().collect();
    record.write_all_at(&ours, slot(part.start))?;
    if fsync {
        record.sync_data()?;
    }
    let mut all = vec![0u8; (chunks * 32) as usize];
    record.read_exact_at(&mut all, HEADER_LEN as u64)?;
    let values: Vec<Cv> = all
        .chunks_exact(32)
        .map(|c| c.try_into().expect("32 bytes"))
        .collect();
    let missing = values.iter().filter(|v| **v == MISSING).count() as u64;
    if missing > 0 {
        return Ok(Recorded::Waiting { missing });
    }
    let changed = verify_on_disk(&file, size, part, &values)?;
    if let Some(&first) = changed.first() {
        for &i in &changed {
            record.write_all_at(&MISSING, slot(i))?;
        }
        if fsync {
            record.sync_data()?;
        }
        return Err(PartError::Changed(changed.len() as u64, first));
    }
    Ok(Recorded::Complete(Complete { file, record, name }))
}

/// The chunks outside `ours` whose data in `file` does not hash to its
/// recorded value, in order. (`ours` were verified by this session as
/// they arrived, or hashed from disk at its plan.) The chunks are hashed
/// on one thread per core, each taking every T-th chunk: this is most of
/// the completing session's finish, (N-1)/N of the file.
fn verify_on_disk(
    file: &File,
    size: u64,
    ours: &Range<u64>,
    values: &[Cv],
) -> io::Result<Vec<u64>> {
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(values.len().max(1));
    let stripe = |first: usize| -> io::Result<Vec<u64>> {
        let mut buf = vec![0u8; CHUNK_SIZE as usize];
        let mut changed = Vec::new();
        for (i, value) in values.iter().enumerate().skip(first).step_by(threads) {
            let i = i as u64;
            if ours.contains(&i) {
                continue;
            }
            if chunk_cv_on_disk(file, size, i, &mut buf)? != *value {
                changed.push(i);
            }
        }
        Ok(changed)
    };
    let stripes: Vec<io::Result<Vec<u64>>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|first| scope.spawn(move || stripe(first)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a hashing thread panicked"))
            .collect()
    });
    let mut changed = Vec::new();
    for s in stripes {
        changed.extend(s?);
    }
    changed.sort_unstable();
    Ok(changed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transfer::hash::{chunk_cv, chunk_len};
    use std::sync::Arc;

    struct Dir(std::path::PathBuf, Arc<DestDir>);

    impl Dir {
        fn new(tag: &str) -> Dir {
            let p = tempfile::Builder::new()
                .prefix(&format!("atou-parts-{tag}-"))
                .tempdir()
                .unwrap()
                .keep();
            let dest = Arc::new(DestDir::open(&p).unwrap());
            Dir(p, dest)
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn data(size: u64) -> Vec<u8> {
        (0..size).map(|i| (i * 7 % 251) as u8).collect()
    }

    fn cvs(size: u64, d: &[u8], part: Range<u64>) -> Vec<Cv> {
        part.map(|i| {
            let at = (i * CHUNK_SIZE) as usize;
            chunk_cv(size, i, &d[at..at + chunk_len(size, i)])
        })
        .collect()
    }

    /// Writes chunks `part` of `d` into the partial file, as the writers do.
    fn write(dir: &Dir, staged: &str, d: &[u8], part: Range<u64>) {
        let f = dir.1.open_shared_staged(staged).unwrap();
        let (a, b) = (
            (part.start * CHUNK_SIZE) as usize,
            ((part.end * CHUNK_SIZE) as usize).min(d.len()),
        );
        f.write_all_at(&d[a..b], a as u64).unwrap();
    }

    /// Records chunks `part` of `d` (already written) as a session's
    /// finish does.
    fn deliver(
        dir: &Dir,
        staged: &str,
        h: &[u8; HEADER_LEN],
        d: &[u8],
        part: Range<u64>,
    ) -> Result<Recorded, PartError> {
        let size = d.len() as u64;
        record(
            &dir.1,
            staged,
            h,
            size,
            &part,
            &cvs(size, d, part.clone()),
            false,
        )
    }

    /// Three parts, recorded in any order: the first two wait, the third
    /// completes; a later session of the same part finds it placed once
    /// the partial file has its name.
    #[test]
    fn the_part_that_fills_the_last_gap_completes_the_file() {
        let dir = Dir::new("fill");
        let size = 5 * CHUNK_SIZE + 77;
        let d = data(size);
        let h = header(size, 1_000, 5);
        let staged = "abc.part";
        let parts = [0..2, 2..4, 4..6];
        for (p, left) in [(&parts[2], 4), (&parts[0], 2)] {
            start(&dir.1, staged, &h, size, false).unwrap();
            write(&dir, staged, &d, p.clone());
            let r = record(
                &dir.1,
                staged,
                &h,
                size,
                p,
                &cvs(size, &d, p.clone()),
                false,
            );
            assert!(
                matches!(r, Ok(Recorded::Waiting { missing }) if missing == left),
                "{r:?}"
            );
        }
        start(&dir.1, staged, &h, size, false).unwrap();
        write(&dir, staged, &d, parts[1].clone());
        let r = record(
            &dir.1,
            staged,
            &h,
            size,
            &parts[1],
            &cvs(size, &d, parts[1].clone()),
            false,
        );
        let Ok(Recorded::Complete(c)) = r else {
            panic!("{r:?}")
        };
        assert_eq!(
            std::fs::read(dir.0.join(".atou-staging/abc.part")).unwrap(),
            d
        );
        dir.1
            .place(
                staged,
                &std::fs::File::open(&dir.0).unwrap().into(),
                b"f",
                false,
            )
            .unwrap();
        c.done(&dir.1).unwrap();
        assert!(!dir.0.join(".atou-staging/abc.chunks").exists());
        let again = record(
            &dir.1,
            staged,
            &h,
            size,
            &parts[0],
            &cvs(size, &d, parts[0].clone()),
            false,
        );
        assert!(matches!(again, Ok(Recorded::PlacedBefore)), "{again:?}");
    }

    /// A chunk another session recorded that was changed on disk since is
    /// caught by the session that completes the file, and dropped from the
    /// record so its shard sends it again.
    #[test]
    fn a_recorded_chunk_changed_on_disk_is_caught_and_dropped() {
        let dir = Dir::new("changed");
        let size = 4 * CHUNK_SIZE;
        let d = data(size);
        let h = header(size, 7, 0);
        let staged = "x.part";
        start(&dir.1, staged, &h, size, false).unwrap();
        write(&dir, staged, &d, 0..2);
        deliver(&dir, staged, &h, &d, 0..2).unwrap();
        // A crash before the write reached the disk, or a hand.
        let f = dir.1.open_shared_staged(staged).unwrap();
        f.write_all_at(b"!", CHUNK_SIZE + 9).unwrap();
        write(&dir, staged, &d, 2..4);
        let r = deliver(&dir, staged, &h, &d, 2..4);
        assert!(matches!(r, Err(PartError::Changed(1, 1))), "{r:?}");
        // Chunk 1 again, as its shard's rerun sends it: complete.
        write(&dir, staged, &d, 0..2);
        let r = deliver(&dir, staged, &h, &d, 0..2);
        assert!(matches!(r, Ok(Recorded::Complete(_))), "{r:?}");
    }

    /// A part of another version of the file (another size or mtime) is
    /// refused; a plan of the new version starts the record afresh.
    #[test]
    fn parts_of_another_version_are_not_mixed() {
        let dir = Dir::new("version");
        let size = 2 * CHUNK_SIZE;
        let d = data(size);
        let (old, new) = (header(size, 1, 0), header(size, 2, 0));
        let staged = "v.part";
        start(&dir.1, staged, &old, size, false).unwrap();
        write(&dir, staged, &d, 0..1);
        deliver(&dir, staged, &old, &d, 0..1).unwrap();
        start(&dir.1, staged, &new, size, false).unwrap();
        let r = deliver(&dir, staged, &old, &d, 1..2);
        assert!(matches!(r, Err(PartError::OtherVersion)), "{r:?}");
        // The new version's record holds nothing of the old one's.
        write(&dir, staged, &d, 1..2);
        let r = deliver(&dir, staged, &new, &d, 1..2);
        assert!(matches!(r, Ok(Recorded::Waiting { missing: 1 })), "{r:?}");
    }
}

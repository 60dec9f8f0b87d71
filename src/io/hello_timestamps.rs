//! `atou serve --dir`'s hello timestamps, kept across restarts.
//!
//! WireGuard keeps the newest handshake timestamp of each peer in memory
//! (whitepaper §5.1), so a restarted responder would take once more a
//! hello captured before the restart. `atou serve --dir DEST` keeps its
//! responder's table (`Responder::remembered`: each client key, the
//! newest hello timestamp accepted from it) in DEST's private staging
//! directory as [`HELLO_TIMESTAMPS`], loads it at start, and saves it
//! before the response to a hello that advanced it is sent
//! (`Server::hello_timestamps_to_save`): once a client holds a session,
//! no restart forgets the hello that made it.
//!
//! The file, big-endian:
//!
//! ```text
//! "ATHT"  version (1)  count (u32)  count × (client key: 32 bytes, timestamp: u64 ns)
//! BLAKE3 of everything before it (32 bytes)
//! ```
//!
//! At most [`MAX_ENTRIES`] entries (the responder's bound). A file that
//! cannot be read or does not decode stops the server at start, naming
//! the file and what to do: carrying on with an empty table would accept
//! the replays the file is there to refuse, and only this user can have
//! changed it (the staging directory is private, and a rename makes each
//! save whole), so a bad file is a fault to look at, not a state to
//! paper over.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use thiserror::Error;

use crate::io::dest_dir::{DestDir, HELLO_TIMESTAMPS, STAGING_DIR};
use crate::proto::crypto::handshake::DEFAULT_MAX_REMEMBERED;
use crate::proto::crypto::PublicKey;

const MAGIC: &[u8; 4] = b"ATHT";
const VERSION: u8 = 1;
const HEADER_LEN: usize = 4 + 1 + 4;
const ENTRY_LEN: usize = 32 + 8;
const CHECK_LEN: usize = 32;

/// Entries a file may hold: as many as the responder remembers.
pub const MAX_ENTRIES: usize = DEFAULT_MAX_REMEMBERED;
/// The largest file that can be valid (2.5 MiB).
pub const MAX_LEN: u64 = (HEADER_LEN + MAX_ENTRIES * ENTRY_LEN + CHECK_LEN) as u64;

/// The table as the file holds it: keys in order, so the same table is
/// the same bytes; past [`MAX_ENTRIES`], the newest are kept (the
/// responder, which makes the table, holds no more).
pub fn encode(remembered: &[(PublicKey, u64)]) -> Vec<u8> {
    let mut entries: Vec<&(PublicKey, u64)> = remembered.iter().collect();
    if entries.len() > MAX_ENTRIES {
        entries.sort_by_key(|&&(_, t)| std::cmp::Reverse(t));
        entries.truncate(MAX_ENTRIES);
    }
    entries.sort_by_key(|(k, _)| k.0);
    let mut bytes = Vec::with_capacity(HEADER_LEN + entries.len() * ENTRY_LEN + CHECK_LEN);
    bytes.extend_from_slice(MAGIC);
    bytes.push(VERSION);
    bytes.extend_from_slice(&(entries.len() as u32).to_be_bytes());
    for (key, timestamp) in entries {
        bytes.extend_from_slice(&key.0);
        bytes.extend_from_slice(&timestamp.to_be_bytes());
    }
    let check = blake3::hash(&bytes);
    bytes.extend_from_slice(check.as_bytes());
    bytes
}

/// What is wrong with bytes that should be a table.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("{0} bytes, too short to be one")]
    TooShort(usize),
    #[error("not a table of hello timestamps (wrong magic)")]
    WrongMagic,
    #[error("version {0} (this atou reads version {VERSION})")]
    Version(u8),
    #[error("{0} entries, more than {MAX_ENTRIES}")]
    TooMany(usize),
    #[error("{len} bytes for {count} entries (a torn or truncated write?)")]
    Torn { len: usize, count: usize },
    #[error("its checksum does not match (corrupted)")]
    Checksum,
}

/// The table in `bytes`, or what is wrong with them. Every length is
/// checked against the buffer before it is used.
pub fn decode(bytes: &[u8]) -> Result<Vec<(PublicKey, u64)>, DecodeError> {
    if bytes.len() < HEADER_LEN + CHECK_LEN {
        return Err(DecodeError::TooShort(bytes.len()));
    }
    let (body, check) = bytes.split_at(bytes.len() - CHECK_LEN);
    if &body[..4] != MAGIC {
        return Err(DecodeError::WrongMagic);
    }
    if body[4] != VERSION {
        return Err(DecodeError::Version(body[4]));
    }
    let count = u32::from_be_bytes(body[5..9].try_into().expect("4 bytes")) as usize;
    if count > MAX_ENTRIES {
        return Err(DecodeError::TooMany(count));
    }
    if body.len() != HEADER_LEN + count * ENTRY_LEN {
        return Err(DecodeError::Torn {
            len: bytes.len(),
            count,
        });
    }
    if blake3::hash(body).as_bytes() != check {
        return Err(DecodeError::Checksum);
    }
    Ok(body[HEADER_LEN..]
        .chunks_exact(ENTRY_LEN)
        .map(|e| {
            let key = PublicKey(e[..32].try_into().expect("32 bytes"));
            let timestamp = u64::from_be_bytes(e[32..].try_into().expect("8 bytes"));
            (key, timestamp)
        })
        .collect())
}

/// Why the table could not be loaded at start: which file, what is
/// wrong, and what to do.
#[derive(Debug, Error)]
pub enum LoadError {
    #[error("cannot open {} to read its hello timestamps: {}", .staging.display(), Cause(.error))]
    Open {
        staging: PathBuf,
        error: std::io::Error,
    },
    #[error(
        "cannot use the hello timestamps in {}: {why}. Without them a hello captured \
         before this start could be accepted again; restore the file, or remove it to \
         start without (hellos made in the 2 minutes before this start could then be \
         replayed once)",
        .path.display()
    )]
    Unusable { path: PathBuf, why: Unusable },
}

/// What is wrong with the file that is there.
#[derive(Debug, Error)]
pub enum Unusable {
    #[error("{}", Cause(.0))]
    Read(std::io::Error),
    #[error(transparent)]
    Decode(DecodeError),
}

/// Why a save failed; the clients whose accepted hellos it covered were
/// not answered.
#[derive(Debug, Error)]
pub enum SaveError {
    #[error(
        "cannot save the hello timestamps to {}: {}; the clients just accepted \
         were not answered (after a restart their hellos could be replayed)",
        .path.display(), Cause(.error)
    )]
    Write {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error(
        "cannot save the hello timestamps to {}: the thread that saves them is gone",
        .path.display()
    )]
    SaverGone { path: PathBuf },
}

/// DEST's table of hello timestamps: where it is saved, and what was
/// there at start.
#[derive(Debug, Clone)]
pub struct HelloTimestampFile {
    dest: Arc<DestDir>,
    loaded: Vec<(PublicKey, u64)>,
}

impl HelloTimestampFile {
    /// Opens DEST (its staging directory created, 0700, as for a
    /// transfer) and reads the table the last run saved; none is an empty
    /// table. An error says which file, what is wrong, and what to do.
    pub fn load(root: &Path) -> Result<HelloTimestampFile, LoadError> {
        let path = root.join(STAGING_DIR).join(HELLO_TIMESTAMPS);
        let dest = DestDir::open(root).map_err(|error| LoadError::Open {
            staging: root.join(STAGING_DIR),
            error,
        })?;
        let unusable = |why| LoadError::Unusable {
            path: path.clone(),
            why,
        };
        let loaded = match dest.read_staged_state(HELLO_TIMESTAMPS, MAX_LEN) {
            Ok(None) => Vec::new(),
            Ok(Some(bytes)) => decode(&bytes).map_err(|e| unusable(Unusable::Decode(e)))?,
            Err(e) => return Err(unusable(Unusable::Read(e))),
        };
        Ok(HelloTimestampFile {
            dest: Arc::new(dest),
            loaded,
        })
    }

    /// What the last run saved.
    pub fn loaded(&self) -> &[(PublicKey, u64)] {
        &self.loaded
    }

    pub fn path(&self) -> PathBuf {
        self.dest.path().join(STAGING_DIR).join(HELLO_TIMESTAMPS)
    }

    /// Replaces the file with `remembered`, atomically and durably.
    pub fn save(&self, remembered: &[(PublicKey, u64)]) -> std::io::Result<()> {
        self.dest
            .replace_staged_state(HELLO_TIMESTAMPS, &encode(remembered))
    }
}

/// Why a file operation failed, in words: no bare `(os error N)`.
struct Cause<'a>(&'a std::io::Error);

impl std::fmt::Display for Cause<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0.raw_os_error() {
            Some(libc::ELOOP) => f.write_str("it is a symlink, which atou never follows there"),
            Some(libc::ENOSPC) => f.write_str("no space left on the device"),
            Some(libc::EDQUOT) => f.write_str("disk quota exceeded"),
            Some(libc::EACCES | libc::EPERM) => f.write_str("permission denied"),
            Some(libc::EROFS) => f.write_str("read-only file system"),
            _ => f.write_str(&crate::util::text::io_error(self.0)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn key(b: u8) -> PublicKey {
        PublicKey([b; 32])
    }

    #[test]
    fn a_table_comes_back_as_it_was_saved() {
        let table = vec![(key(3), 30), (key(1), u64::MAX), (key(2), 0)];
        let mut back = decode(&encode(&table)).unwrap();
        back.sort_by_key(|&(_, t)| t);
        assert_eq!(back, vec![(key(2), 0), (key(3), 30), (key(1), u64::MAX)]);
        assert_eq!(decode(&encode(&[])).unwrap(), vec![]);
        assert_eq!(encode(&[]).len(), HEADER_LEN + CHECK_LEN);
    }

    /// Each way a file can be wrong is an error that says how, never an
    /// empty table.
    #[test]
    fn a_damaged_table_is_an_error_that_says_how() {
        let good = encode(&[(key(1), 10), (key(2), 20)]);
        let mut flipped = good.clone();
        flipped[HEADER_LEN + 5] ^= 1;
        let mut version = good.clone();
        version[4] = 9;
        let mut count = good.clone();
        count[5..9].copy_from_slice(&3u32.to_be_bytes());
        let mut huge = good.clone();
        huge[5..9].copy_from_slice(&u32::MAX.to_be_bytes());
        let cases: [(&[u8], &str); 7] = [
            (&[], "too short"),
            (&good[..good.len() - 1], "torn"),
            (&flipped, "checksum"),
            (&version, "version 9"),
            (&count, "torn"),
            (&huge, "more than"),
            (b"garbage garbage garbage garbage garbage garbage", "magic"),
        ];
        for (bytes, says) in cases {
            let e = decode(bytes).unwrap_err().to_string();
            assert!(e.contains(says), "`{e}` should say {says}");
        }
    }

    #[test]
    fn the_largest_table_fits_the_bound_and_one_more_entry_would_not() {
        let table: Vec<_> = (0..MAX_ENTRIES as u32 + 1)
            .map(|i| {
                let mut k = [0u8; 32];
                k[..4].copy_from_slice(&i.to_be_bytes());
                (PublicKey(k), u64::from(i))
            })
            .collect();
        let bytes = encode(&table);
        assert_eq!(bytes.len() as u64, MAX_LEN);
        assert_eq!(decode(&bytes).unwrap().len(), MAX_ENTRIES);
    }

    proptest! {
        /// Whatever the bytes, decoding returns without panicking; a
        /// saved file cut or changed anywhere does not decode.
        #[test]
        fn damaged_or_arbitrary_bytes_never_decode_nor_panic(
            bytes in proptest::collection::vec(any::<u8>(), 0..300),
            entries in proptest::collection::vec((any::<[u8; 32]>(), any::<u64>()), 0..6),
            at in any::<prop::sample::Index>(),
            flip in 1u8..=255,
        ) {
            let _ = decode(&bytes);
            let table: Vec<_> = entries.into_iter().map(|(k, t)| (PublicKey(k), t)).collect();
            let good = encode(&table);
            prop_assert_eq!(decode(&good).unwrap().len(), table.len());
            let cut = at.index(good.len());
            prop_assert!(decode(&good[..cut]).is_err());
            let mut changed = good.clone();
            changed[cut] ^= flip;
            prop_assert!(decode(&changed).is_err());
        }
    }
}

//! The receiver's side of the disk: checking a manifest against the
//! destination, partial files, and putting verified files in place.
//!
//! Every name is resolved beneath DEST's directory descriptor and no
//! symlink is ever followed ([`DestDir`]). Nothing is written until every
//! entry has been checked: a symlink or file in the way, an existing file
//! the policy does not let us replace, a symlink the policy refuses, or a
//! reserved name refuses the whole transfer. Data goes to a partial file in
//! DEST's private staging directory, and a file takes its final name only
//! at the finish, once its whole-file BLAKE3 hash matches the sender's. A
//! partial file left by an interrupted transfer is the resume state: the
//! chunks it holds are hashed and the sender sends only the ones that
//! differ.
//!
//! What is allowed (replacing files, modes, symlinks, syncing) is the
//! receiver's [`ReceivePolicy`]; the sender's [`Options`] only ask.

mod delete;
mod finish;
pub mod owners;
mod plan;
pub(crate) mod policy;
pub mod xattrs;

use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::fd::OwnedFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::hash::{Cv, CHUNK_SIZE};
use super::manifest::{Entry, RelPath};
use super::messages::{FilePlan, Options, Outcome, Xattr};
use super::parts;
use super::staged::ClaimId;
use super::Error;
use crate::io::dest_dir::{self, DestDir, Found};

pub use finish::{finish, Finished};
pub(super) use plan::chunk_cv_on_disk;
pub use plan::prepare;
pub use policy::{link_stays_beneath, ReceivePolicy, Requested, SymlinkPolicy, UserFlags};

use plan::Existing;

/// The value sent for a chunk a partial file does not hold: no chunk's
/// BLAKE3 value is all zeros, so the sender sends it.
pub const NOT_HELD: Cv = [0; 32];

/// Where a dry run's receiver plans, leaving DEST as it is: DEST itself
/// if it exists (the dry-run receiver creates nothing in it), else an
/// empty directory of our own, removed when dropped, so that DEST is not
/// created just to find that everything would be sent.
pub(crate) struct DryRunRoot {
    pub(crate) dest: PathBuf,
    temp: Option<PathBuf>,
}

impl DryRunRoot {
    pub(crate) fn new(dest: &Path) -> Result<DryRunRoot, Error> {
        if std::fs::symlink_metadata(dest).is_ok() {
            return Ok(DryRunRoot {
                dest: dest.to_path_buf(),
                temp: None,
            });
        }
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let temp =
            std::env::temp_dir().join(format!("atou-dry-run-{}-{nanos:09}", std::process::id()));
        std::fs::create_dir(&temp)
            .map_err(|e| Error::disk("create an empty directory for the dry run", &temp, e))?;
        Ok(DryRunRoot {
            dest: dest.to_path_buf(),
            temp: Some(temp),
        })
    }

    /// Where the receiver plans.
    pub(crate) fn path(&self) -> &Path {
        self.temp.as_deref().unwrap_or(&self.dest)
    }
}

impl Drop for DryRunRoot {
    fn drop(&mut self) {
        if let Some(t) = &self.temp {
            let _ = std::fs::remove_dir(t);
        }
    }
}

/// Creates DEST and its parents where a command was told to write
/// (`atou copy`'s local end, the far end of an ssh push); the error
/// names the path and the cause.
pub fn create_destination(root: &Path) -> Result<(), Error> {
    std::fs::create_dir_all(root).map_err(|e| Error::disk("create destination", root, e))
}

/// Why writing or finishing a transfer failed, by kind: the sender's
/// answer (and so its exit status) says which.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DestError {
    /// This end failed: its disk, its limits.
    Failed(String),
    /// This end will not: a file in the way (found once the data came).
    Refused(String),
    /// A file's hash differs from the sender's.
    Mismatch(String),
}

impl From<String> for DestError {
    fn from(why: String) -> DestError {
        DestError::Failed(why)
    }
}

/// What the disk did not do is this end's failure, whatever the kind
/// (the refusals are found while planning, before any data comes).
impl From<Error> for DestError {
    fn from(e: Error) -> DestError {
        DestError::Failed(e.to_string())
    }
}

impl std::fmt::Display for DestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DestError::Failed(why) | DestError::Refused(why) | DestError::Mismatch(why) => {
                f.write_str(why)
            }
        }
    }
}

impl DestError {
    /// The answer that tells the sender.
    pub fn outcome(&self) -> Outcome {
        match self {
            DestError::Failed(why) => Outcome::Failed(why.clone()),
            DestError::Refused(why) => Outcome::Refused(why.clone()),
            DestError::Mismatch(why) => Outcome::Mismatch(why.clone()),
        }
    }
}
/// Where one file of the manifest is going.
#[derive(Debug)]
pub struct FileTarget {
    pub rel: RelPath,
    pub size: u64,
    /// No partial file existed: chunks of zeros need not be written
    /// (unwritten ranges read as zeros, and the length is set when the
    /// file is complete), so sparse files stay sparse.
    pub fresh: bool,
    /// The mode it gets, after the policy.
    pub mode: u32,
    pub mtime: SystemTime,
    /// Chunks handed to writers and not yet written; the file is closed
    /// when this comes back to zero.
    pub writing: AtomicU64,
    /// Complete: its length, mode and mtime are set (and it is synced,
    /// with `fsync`). It takes its final name at the finish.
    pub ready: AtomicBool,
    dest: Arc<DestDir>,
    /// Its directory, relative to DEST (the SUBDIR included).
    dir: Vec<u8>,
    name: Vec<u8>,
    /// Its partial file's name in the staging directory.
    staged: String,
    /// The partial file exists (created by this transfer or an earlier one).
    created: AtomicBool,
    /// `--checksum`: an existing file of the same size, whose chunk values
    /// were sent as held. Untouched at the finish (no chunk differed), it is
    /// identical and stays; a chunk that differs replaces it, if the policy
    /// and the sender allow, starting from a copy of it.
    existing: Option<Existing>,
    /// Of a file split across shards, the part this session sends.
    pub part: Option<Part>,
    /// `-o` / `-g`: the owner and group it gets.
    owner: Option<dest_dir::Ids>,
    /// `-X` / `-A`: the attributes it gets.
    xattrs: Vec<Xattr>,
    xattr_tally: Arc<xattrs::Tally>,
    handle: Mutex<Option<File>>,
}

/// The part of a split file one session sends (src/transfer/parts.rs).
#[derive(Debug)]
pub struct Part {
    pub chunks: Range<u64>,
    /// The version of the file every part must be of.
    header: [u8; parts::HEADER_LEN],
}

/// The staging name of whatever goes to `rel` (relative to DEST): derived
/// from the path, so a rerun finds it, and not nameable by a manifest.
fn staged_name(rel: &[u8]) -> String {
    format!("{}.part", staging_key(rel))
}

/// The record, in the staging directory, of directory `rel` while the
/// transfer that created it has not yet given it its mode: a session
/// cancelled between its plan and its finish leaves the directory private
/// (0700), and the record tells the session that resumes that it may give
/// the directory its mode, though it now exists. `--staging-ttl` sweeps
/// records as it sweeps partial files.
fn pending_dir_record(rel: &[u8]) -> String {
    format!("{}.dir", staging_key(rel))
}

fn staging_key(rel: &[u8]) -> String {
    let mut h = blake3::Hasher::new();
    h.update(b"atou staging v1\0");
    h.update(rel);
    let hex = h.finalize().to_hex();
    hex[..32].to_string()
}

fn join_rel(dir: &[u8], name: &[u8]) -> Vec<u8> {
    if dir.is_empty() {
        name.to_vec()
    } else {
        [dir, b"/", name].concat()
    }
}

/// `rel` split into its directory and last component.
fn split_rel(rel: &[u8]) -> (&[u8], &[u8]) {
    match rel.iter().rposition(|&b| b == b'/') {
        Some(i) => (&rel[..i], &rel[i + 1..]),
        None => (&[][..], rel),
    }
}

fn split_first(rel: &[u8]) -> &[u8] {
    rel.split(|&b| b == b'/').next().unwrap_or(rel)
}

impl FileTarget {
    /// DEST/…/NAME, for messages (about its partial file too: that is the
    /// name a person knows it by).
    pub fn shown(&self) -> PathBuf {
        self.dest.shown(&join_rel(&self.dir, &self.name))
    }

    /// The open partial file, created if this transfer is the first to
    /// write it (`O_EXCL`: another transfer writing the same file at once
    /// is refused rather than interleaved).
    fn open(&self, handle: &mut Option<File>) -> Result<(), DestError> {
        if handle.is_some() {
            return Ok(());
        }
        if let Some(existing) = self.existing {
            if !self.created.load(Ordering::Acquire) {
                return self.start_from_existing(existing, handle);
            }
        }
        let file = if self.part.is_some() {
            // Other shards write their parts into it, at once or later.
            self.dest.open_shared_staged(&self.staged)
        } else if self.created.load(Ordering::Acquire) {
            self.dest.open_staged(&self.staged, true)
        } else {
            self.dest.create_staged(&self.staged)
        };
        let file = file.map_err(|e| match e.raw_os_error() {
            Some(libc::EEXIST) => DestError::Failed(format!(
                "`{}` is being received by another transfer at the same time; run this one again when it is done",
                self.rel
            )),
            _ => Error::disk("create", &self.shown(), e).into(),
        })?;
        self.created.store(true, Ordering::Release);
        *handle = Some(file);
        Ok(())
    }

    /// A chunk of an existing file differs: the new version starts as a
    /// copy of it, in the staging directory, so the chunks not sent are
    /// there.
    fn start_from_existing(
        &self,
        existing: Existing,
        handle: &mut Option<File>,
    ) -> Result<(), DestError> {
        if !existing.replace {
            return Err(DestError::Refused(format!(
                "`{}` already exists at the destination and differs from the sender's (BLAKE3); \
                 use --overwrite to replace it",
                self.rel
            )));
        }
        let dir = self
            .dest
            .open_dir(&self.dir)
            .map_err(|e| Error::disk("open", &self.dest.shown(&self.dir), e))?;
        let mut old = dest_dir::open_file(&dir, &self.name)
            .map_err(|e| Error::disk("read", &self.shown(), e))?;
        let mut new = self
            .dest
            .create_staged(&self.staged)
            .map_err(|e| Error::disk("create", &self.shown(), e))?;
        io::copy(&mut old, &mut new).map_err(|e| Error::disk("copy", &self.shown(), e))?;
        self.created.store(true, Ordering::Release);
        *handle = Some(new);
        Ok(())
    }

    /// Identical to the sender's file as it already is (`--checksum`, and
    /// no chunk of it differed): nothing to write or rename.
    fn unchanged_existing(&self) -> bool {
        self.existing.is_some() && !self.created.load(Ordering::Acquire)
    }

    /// Writes one verified chunk at its place, opening the file if needed
    /// (it stays open until [`chunk_done`](Self::chunk_done) closes it).
    pub fn write_chunk(&self, chunk: u64, data: &[u8]) -> Result<(), DestError> {
        if self.fresh && data.iter().all(|&b| b == 0) {
            return Ok(());
        }
        let mut handle = self.handle.lock().expect("writer panicked");
        self.open(&mut handle)?;
        let file = handle.as_ref().expect("opened above");
        file.write_all_at(data, chunk * CHUNK_SIZE)
            .map_err(|e| Error::disk("write", &self.shown(), e).into())
    }

    /// A chunk handed to a writer is done with, written or not: when it was
    /// the last one outstanding, the file is synced (with `fsync`) and
    /// closed.
    pub fn chunk_done(&self, fsync: bool) -> Result<(), Error> {
        if self.writing.fetch_sub(1, Ordering::AcqRel) != 1 {
            return Ok(());
        }
        match self.handle.lock().expect("writer panicked").take() {
            Some(file) if fsync => file
                .sync_all()
                .map_err(|e| Error::disk("sync", &self.shown(), e)),
            _ => Ok(()),
        }
    }

    /// Gives a file whose every chunk is verified its length, mode and
    /// mtime (and syncs it, with `fsync`). It keeps its staging name until
    /// the finish has compared its hash.
    pub fn make_ready(&self, fsync: bool) -> Result<(), DestError> {
        let mut handle = self.handle.lock().expect("writer panicked");
        self.open(&mut handle)?;
        let file = handle.take().expect("opened above");
        Ok(self.set_attrs(&file, fsync)?)
    }

    /// Writes a file of one chunk, already verified, and makes it ready at
    /// once: one open instead of two, which is most of the cost of a tree
    /// of small files.
    pub fn write_whole(&self, data: &[u8], fsync: bool) -> Result<(), DestError> {
        let mut handle = self.handle.lock().expect("writer panicked");
        self.open(&mut handle)?;
        let file = handle.take().expect("opened above");
        if !data.iter().all(|&b| b == 0) {
            file.write_all_at(data, 0)
                .map_err(|e| Error::disk("write", &self.shown(), e))?;
        }
        Ok(self.set_attrs(&file, fsync)?)
    }

    fn set_attrs(&self, file: &File, fsync: bool) -> Result<(), Error> {
        let at = self.shown();
        // Chunks of zeros at the end were not written, and a partial file
        // from an earlier attempt may be longer: the length is set here.
        let len = file
            .metadata()
            .map_err(|e| Error::disk("look at", &at, e))?
            .len();
        if len != self.size {
            file.set_len(self.size)
                .map_err(|e| Error::disk("size", &at, e))?;
        }
        if let Some(ids) = self.owner {
            dest_dir::set_owner(file, ids)
                .map_err(|e| Error::disk("set the owner and group of", &at, e))?;
        }
        // Before the mode: the mode's group bits then cap the ACL's mask,
        // as the receiver's umask caps every mode.
        self.xattr_tally.set_all(&at, &self.xattrs, |name, value| {
            crate::io::xattr::set(file, name, value)
        });
        dest_dir::set_mode(file, self.mode).map_err(|e| Error::disk("set the mode of", &at, e))?;
        file.set_times(std::fs::FileTimes::new().set_modified(self.mtime))
            .map_err(|e| Error::disk("set the mtime of", &at, e))?;
        if fsync {
            file.sync_all().map_err(|e| Error::disk("sync", &at, e))?;
        }
        self.ready.store(true, Ordering::Release);
        Ok(())
    }

    /// Renames the ready file to its final name in `dir` (its directory,
    /// opened beneath DEST).
    fn put_in_place(&self, dir: &OwnedFd, replace: bool) -> Result<(), Error> {
        self.dest
            .place(&self.staged, dir, &self.name, replace)
            .map_err(|e| Error::disk("rename into place", &self.shown(), e))
    }
}

/// What checking a plan request against the destination decided.
#[derive(Debug)]
pub struct Prepared {
    /// DEST/SUBDIR, for messages and reports.
    pub dest: PathBuf,
    pub entries: Vec<Entry>,
    pub files: Vec<Arc<FileTarget>>,
    pub plans: Vec<FilePlan>,
    /// Per file, per chunk: the BLAKE3 value of what the partial file
    /// already holds (resume), [`NOT_HELD`] past its end.
    pub held: Vec<Vec<Cv>>,
    /// Per entry: an identical one is already there (`--skip-existing`).
    pub skip: Vec<bool>,
    /// Per entry: a directory this transfer created (only those get the
    /// sender's mode and mtime, unless replacing is allowed and asked).
    pub created: Vec<bool>,
    /// What this session may do: the sender's asks, as the policy allows.
    pub options: Options,
    /// The mode each directory gets, from the policy it was planned under.
    dir_modes: Vec<u32>,
    dest_dir: Arc<DestDir>,
    /// DEST-relative path of each entry (the SUBDIR included).
    rels: Vec<Vec<u8>>,
    /// What this plan stages, as its sender's quota counts it
    /// (src/transfer/staged.rs): set by the receiver that admitted it,
    /// released at the finish.
    pub claim: Option<ClaimId>,
    /// What `--delete` removes at the finish; `None` without it.
    pub extraneous: Option<Box<delete::Extraneous>>,
    /// Per file, the files written from its chunks ([`FilePlan::Copy`]);
    /// empty when none are.
    pub copies: Vec<Vec<u32>>,
    /// `-o` / `-g`: per entry, the owner and group it gets; empty without.
    owners: Vec<dest_dir::Ids>,
    /// `-X` / `-A`: per entry, the attributes it gets (boxed: a plan's
    /// result waits in a queue beside smaller messages).
    xattrs: Box<xattrs::PlanXattrs>,
}

impl Prepared {
    /// After a finish that went well: the partial files of this plan that
    /// are gone, its files having taken their names (or, identical to what
    /// was there, never staged). A split file's stays while it waits for
    /// other shards' parts.
    pub fn unstaged_by_finish(&self) -> Vec<&str> {
        self.files
            .iter()
            .zip(&self.plans)
            .filter(|(t, plan)| {
                **plan != FilePlan::Skip
                    && (t.part.is_none()
                        || matches!(self.dest_dir.look_staged(&t.staged), Ok(Found::Nothing)))
            })
            .map(|(t, _)| t.staged.as_str())
            .collect()
    }
}

fn to_system_time(sec: i64, nsec: u32) -> SystemTime {
    if sec >= 0 {
        UNIX_EPOCH + Duration::new(sec as u64, nsec)
    } else {
        UNIX_EPOCH - Duration::from_secs(sec.unsigned_abs()) + Duration::from_nanos(u64::from(nsec))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every name a transfer stages is the hash of a path, 32 hex digits
    /// and a suffix, so no path a sender names (the server's own file
    /// name included) lets it create, replace or remove the server's
    /// table of hello timestamps.
    #[test]
    fn no_path_a_sender_names_stages_as_the_servers_own_file() {
        for rel in [
            &b"hello-timestamps"[..],
            b"hello-timestamps.new",
            b".atou-staging/hello-timestamps",
            b"a/b",
            b"",
        ] {
            let part = staged_name(rel);
            let link = format!("{}.link", &part[..32]);
            let record = parts::record_name(&part);
            for name in [&part, &link, &record] {
                assert!(!dest_dir::is_servers_own(name.as_bytes()), "{name}");
                assert!(name[..32].bytes().all(|b| b.is_ascii_hexdigit()), "{name}");
            }
        }
    }

    fn target(dest: &Arc<DestDir>, writing: u64) -> FileTarget {
        FileTarget {
            rel: RelPath::new(b"f".to_vec()).unwrap(),
            size: 2 * CHUNK_SIZE,
            fresh: true,
            mode: 0o644,
            mtime: SystemTime::UNIX_EPOCH,
            writing: AtomicU64::new(writing),
            ready: AtomicBool::new(false),
            dest: dest.clone(),
            dir: Vec::new(),
            name: b"f".to_vec(),
            staged: staged_name(b"f"),
            created: AtomicBool::new(false),
            existing: None,
            part: None,
            owner: None,
            xattrs: Vec::new(),
            xattr_tally: Default::default(),
            handle: Mutex::new(None),
        }
    }

    /// The file stays open while chunks are outstanding and is closed by the
    /// last one handed back, whether that one was written or not (a chunk
    /// that failed its check is handed back unwritten).
    #[test]
    fn the_last_chunk_handed_back_closes_the_file_written_or_not() {
        let dir = tempfile::Builder::new()
            .prefix("atou-dest-")
            .tempdir()
            .unwrap()
            .keep();
        let dest = Arc::new(DestDir::open(&dir).unwrap());
        let t = target(&dest, 2);
        t.write_chunk(0, &[7u8; 16]).unwrap();
        assert!(t.handle.lock().unwrap().is_some());
        t.chunk_done(false).unwrap();
        assert!(t.handle.lock().unwrap().is_some(), "one chunk still out");
        t.chunk_done(false).unwrap();
        assert!(
            t.handle.lock().unwrap().is_none(),
            "closed by the unwritten last chunk"
        );
        assert_eq!(t.writing.load(Ordering::Relaxed), 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

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

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::hash::{chunk_count, chunk_cv, chunk_len, file_hash, part_digest, Cv, CHUNK_SIZE};
use super::manifest::{Entry, EntryKind, RelPath};
use super::messages::{FilePlan, Options, Outcome, PlanRequest};
use super::parts::{self, PartError, Recorded};
use super::staged::{ClaimId, ToStage};
use crate::io::dest_dir::{self, DestDir, Found, STAGING_DIR};
use crate::text::shown;

/// The value sent for a chunk a partial file does not hold: no chunk's
/// BLAKE3 value is all zeros, so the sender sends it.
pub const NOT_HELD: Cv = [0; 32];

/// Creates DEST and its parents where a command was told to write
/// (`atou copy`'s local end, the far end of an ssh push); the error
/// names the path and the cause.
pub fn create_destination(root: &Path) -> Result<(), String> {
    std::fs::create_dir_all(root).map_err(|e| io_error("create destination", root, &e))
}

/// "cannot ACTION PATH: CAUSE", the cause in words rather than `Os { .. }`.
pub fn io_error(action: &str, path: &Path, e: &io::Error) -> String {
    let cause = match e.raw_os_error() {
        Some(libc::ENOSPC) => "no space left on the device".to_string(),
        Some(libc::EDQUOT) => "disk quota exceeded".to_string(),
        Some(libc::EACCES) | Some(libc::EPERM) => "permission denied".to_string(),
        Some(libc::EROFS) => "read-only file system".to_string(),
        Some(libc::ENOENT) => "no such file or directory".to_string(),
        Some(libc::ELOOP) | Some(libc::EXDEV) => {
            "a symlink is on the way, and atou never writes through symlinks at the destination"
                .to_string()
        }
        Some(libc::EEXIST) => "something else is there now".to_string(),
        _ => crate::text::io_error(e),
    };
    format!(
        "cannot {action} {}: {cause}",
        shown(path.as_os_str().as_encoded_bytes())
    )
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

/// Which symlinks a receiver creates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SymlinkPolicy {
    /// Every symlink as sent (`rsync -a`): nothing at the receiver follows
    /// them, but other programs may.
    All,
    /// Only relative symlinks that stay inside DEST, read as written
    /// (rsync's `--safe-links`); others refuse the transfer.
    #[default]
    Safe,
    /// No symlinks: a manifest holding one is refused.
    None,
}

/// What the receiver allows, whatever the sender asks: one type for every
/// receiver (`atou serve`, a local `atou copy`, the local end of a pull and
/// the far end of a push), built only from the receiving side's own flags
/// and its key's options. The sender's [`Options`] are requests checked
/// against it; a pull's sender is the remote, as untrusted as any peer.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ReceivePolicy {
    /// A sender that asks (`--overwrite`) may replace existing files and
    /// re-mode existing directories.
    pub allow_overwrite: bool,
    /// Permission bits cleared from every mode that arrives.
    pub umask: u32,
    /// setuid, setgid and sticky bits are kept rather than cleared.
    pub special_bits: bool,
    /// Sync every file and directory before the transfer is reported
    /// verified, whether or not the sender asks.
    pub fsync: bool,
    pub symlinks: SymlinkPolicy,
    /// The sender's key may not replace files, whatever `allow_overwrite`
    /// says (its authorized_keys line has no `overwrite`).
    pub key_forbids_overwrite: bool,
    /// What this receiver asked for, when it asked (a pull, a local
    /// copy): the manifest may hold nothing else. `None`: a server, which
    /// takes whatever names its senders choose beneath DEST.
    #[serde(skip)]
    pub requested: Option<Requested>,
    /// The receiving user's own directory (`atou copy`): refusals name
    /// this command's own flags rather than a server operator's.
    pub users_own: bool,
    /// The sender's key is confined to this directory beneath DEST (its
    /// `subdir=`): under `safe`, symlinks must lead beneath it, not merely
    /// beneath DEST.
    #[serde(skip)]
    pub confined_to: Option<Vec<u8>>,
}

/// What a receiver's own flags say of the files it takes into its user's
/// directory (`atou copy`'s receiving end): nothing replaced or re-moded
/// without `--overwrite`, no setuid, setgid or sticky bit without
/// `--perms`, symlinks as `--symlinks` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UserFlags {
    pub overwrite: bool,
    pub special_bits: bool,
    pub symlinks: SymlinkPolicy,
    pub fsync: bool,
}

impl ReceivePolicy {
    /// `atou serve --dir`'s defaults: a receiver for other people.
    pub fn server() -> ReceivePolicy {
        ReceivePolicy {
            allow_overwrite: false,
            umask: 0o022,
            special_bits: false,
            fsync: true,
            symlinks: SymlinkPolicy::Safe,
            key_forbids_overwrite: false,
            requested: None,
            users_own: false,
            confined_to: None,
        }
    }

    /// `atou copy` into the user's own directory: permission bits kept as
    /// `rsync -a` keeps them; the rest as the user's own flags say,
    /// whatever the sending end asks.
    pub fn user(flags: UserFlags, requested: Option<Requested>) -> ReceivePolicy {
        ReceivePolicy {
            allow_overwrite: flags.overwrite,
            umask: 0,
            special_bits: flags.special_bits,
            fsync: flags.fsync,
            symlinks: flags.symlinks,
            key_forbids_overwrite: false,
            requested,
            users_own: true,
            confined_to: None,
        }
    }

    /// The mode a file or directory gets.
    pub fn mode(&self, sent: u32) -> u32 {
        let keep = if self.special_bits { 0o7777 } else { 0o777 };
        sent & keep & !self.umask
    }
}

/// One name a receiver asked for at the top of the manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Wanted {
    /// This name exactly.
    Name(Vec<u8>),
    /// One entry of whatever name the sender gives it: a path whose last
    /// component is `.` or `..` (or none), which only the sending host
    /// can name.
    AnyOneName,
}

/// The top-level names a receiver asked for: a pull's `HOST:PATH`s, a
/// local copy's SRCs. Each entry at the top of the manifest must be one of
/// them (each used once), and everything else beneath one; the plan may
/// name no subdirectory. (scp's CVE-2019-6111 and rsync's CVE-2022-29154:
/// a remote that sends what it was not asked for.)
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requested {
    wanted: Vec<Wanted>,
    /// As the user wrote them, for the refusal.
    shown: Vec<String>,
}

impl Requested {
    /// From the paths as given to the sending end, which names each by its
    /// last component (`dir/` as `dir`), or, for one ending in `.` or
    /// `..`, by what that directory is called there.
    pub fn from_paths<S: AsRef<[u8]>>(paths: &[S]) -> Requested {
        let mut wanted = Vec::with_capacity(paths.len());
        let mut shown_paths = Vec::with_capacity(paths.len());
        for p in paths {
            let p = p.as_ref();
            let end = p.iter().rposition(|&b| b != b'/').map_or(0, |i| i + 1);
            let trimmed = &p[..end];
            let last = trimmed.rsplit(|&b| b == b'/').next().unwrap_or(b"");
            // `~` alone is the remote home, as `HOST:` is.
            let home = trimmed == b"~";
            wanted.push(match last {
                _ if home => Wanted::AnyOneName,
                b"" | b"." | b".." => Wanted::AnyOneName,
                name => Wanted::Name(name.to_vec()),
            });
            shown_paths.push(shown(p).to_string());
        }
        Requested {
            wanted,
            shown: shown_paths,
        }
    }

    /// From the names the sending end will use, when this end knows them
    /// (a local copy, whose sender is this process).
    pub fn exactly<S: AsRef<[u8]>>(names: &[S]) -> Requested {
        Requested {
            wanted: names
                .iter()
                .map(|n| Wanted::Name(n.as_ref().to_vec()))
                .collect(),
            shown: names
                .iter()
                .map(|n| shown(n.as_ref()).to_string())
                .collect(),
        }
    }

    /// Whether `request` holds only what was asked for; why not, naming
    /// the first entry that was not.
    pub fn check(&self, request: &PlanRequest) -> Result<(), String> {
        if let Some(sub) = &request.subdir {
            return Err(format!(
                "the sender named a subdirectory `{sub}` of the destination, which was not \
                 asked for; refused, nothing written"
            ));
        }
        let mut used = vec![false; self.wanted.len()];
        let mut tops: HashSet<&[u8]> = HashSet::new();
        for entry in &request.manifest.entries {
            let path = entry.path.as_bytes();
            let first = split_first(path);
            if first.len() < path.len() {
                if tops.contains(first) {
                    continue;
                }
            } else {
                let exact = self
                    .wanted
                    .iter()
                    .zip(&used)
                    .position(|(w, &u)| !u && matches!(w, Wanted::Name(n) if n == path));
                let slot = exact.or_else(|| {
                    self.wanted
                        .iter()
                        .zip(&used)
                        .position(|(w, &u)| !u && *w == Wanted::AnyOneName)
                });
                if let Some(i) = slot {
                    used[i] = true;
                    tops.insert(path);
                    continue;
                }
            }
            return Err(format!(
                "the sender sent `{}`, which was not asked for (asked for: {}); refused, \
                 nothing written",
                entry.path,
                self.shown.join(", ")
            ));
        }
        Ok(())
    }
}

/// How many symlinks one path may pass through, as Linux's ELOOP limit.
const MAX_LINK_HOPS: usize = 40;
/// How many components one link's resolution may walk, its own and those
/// of the links it passes through: each may cost a lookup on disk, and a
/// manifest of links with long targets through 40 links each must not
/// buy a planner's time by the million. Linux's 4096-byte PATH_MAX holds
/// at most 2048 components.
const MAX_LINK_STEPS: usize = 2048;

/// Does the symlink at `link` (a path beneath DEST) lead beneath `root`
/// (DEST itself when empty) once followed, through every link on the way?
/// rsync's `--safe-links` reads a target as text, so two links can pass
/// that test each and together leave DEST (`d/up -> ..` then
/// `etc -> d/up/d/up/../../etc`, rsync's CVE-2024-12088). Here each
/// component is resolved as the kernel would: a link the same manifest
/// creates (`links`, by path beneath DEST, whatever its place in the
/// manifest) or one already at the destination (`on_disk`) is followed
/// from its own directory; `..` may never climb above `root`; an absolute
/// target, more than [`MAX_LINK_HOPS`] links or more than
/// [`MAX_LINK_STEPS`] components walked, is refused. A name that is
/// nothing yet is taken as a directory to be.
pub fn link_stays_beneath(
    link: &[u8],
    target: &[u8],
    root: &[u8],
    links: &HashMap<Vec<u8>, Vec<u8>>,
    mut on_disk: impl FnMut(&[u8]) -> Option<Vec<u8>>,
) -> bool {
    let parts = |p: &[u8]| -> Vec<Vec<u8>> {
        p.split(|&b| b == b'/')
            .filter(|c| !c.is_empty())
            .map(<[u8]>::to_vec)
            .collect()
    };
    let root = parts(root);
    let floor = root.len();
    // Where the walk is: the link's directory.
    let mut at = parts(link);
    if at.pop().is_none() || at.len() < floor || at[..floor] != root[..] {
        return false;
    }
    if target.is_empty() || target.starts_with(b"/") {
        return false;
    }
    // Components still to walk, the next one last.
    let mut to_walk: Vec<Vec<u8>> = target
        .split(|&b| b == b'/')
        .rev()
        .map(<[u8]>::to_vec)
        .collect();
    let mut hops = 0;
    let mut steps = 0;
    while let Some(c) = to_walk.pop() {
        steps += 1;
        if steps > MAX_LINK_STEPS {
            return false;
        }
        match c.as_slice() {
            b"" | b"." => {}
            b".." => {
                if at.len() <= floor {
                    return false;
                }
                at.pop();
            }
            _ => {
                at.push(c);
                let path = at.join(&b'/');
                let Some(next) = links.get(&path).cloned().or_else(|| on_disk(&path)) else {
                    continue;
                };
                hops += 1;
                if hops > MAX_LINK_HOPS || next.is_empty() || next.starts_with(b"/") {
                    return false;
                }
                // Followed from the directory that holds the link.
                at.pop();
                to_walk.extend(next.split(|&b| b == b'/').rev().map(<[u8]>::to_vec));
            }
        }
    }
    true
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
    handle: Mutex<Option<File>>,
}

/// The part of a split file one session sends (src/transfer/parts.rs).
#[derive(Debug)]
pub struct Part {
    pub chunks: Range<u64>,
    /// The version of the file every part must be of.
    header: [u8; parts::HEADER_LEN],
}

/// An existing file `--checksum` compared.
#[derive(Debug, Clone, Copy)]
struct Existing {
    /// Replacing it is allowed and asked.
    replace: bool,
}

/// The staging name of whatever goes to `rel` (relative to DEST): derived
/// from the path, so a rerun finds it, and not nameable by a manifest.
fn staged_name(rel: &[u8]) -> String {
    let mut h = blake3::Hasher::new();
    h.update(b"atou staging v1\0");
    h.update(rel);
    let hex = h.finalize().to_hex();
    format!("{}.part", &hex[..32])
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
            Some(libc::EEXIST) => format!(
                "`{}` is being received by another transfer at the same time; run this one again when it is done",
                self.rel
            ),
            _ => io_error("create", &self.shown(), &e),
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
            .map_err(|e| io_error("open", &self.dest.shown(&self.dir), &e))?;
        let mut old = dest_dir::open_file(&dir, &self.name)
            .map_err(|e| io_error("read", &self.shown(), &e))?;
        let mut new = self
            .dest
            .create_staged(&self.staged)
            .map_err(|e| io_error("create", &self.shown(), &e))?;
        io::copy(&mut old, &mut new).map_err(|e| io_error("copy", &self.shown(), &e))?;
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
            .map_err(|e| io_error("write", &self.shown(), &e).into())
    }

    /// A chunk handed to a writer is done with, written or not: when it was
    /// the last one outstanding, the file is synced (with `fsync`) and
    /// closed.
    pub fn chunk_done(&self, fsync: bool) -> Result<(), String> {
        if self.writing.fetch_sub(1, Ordering::AcqRel) != 1 {
            return Ok(());
        }
        match self.handle.lock().expect("writer panicked").take() {
            Some(file) if fsync => file
                .sync_all()
                .map_err(|e| io_error("sync", &self.shown(), &e)),
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
                .map_err(|e| io_error("write", &self.shown(), &e))?;
        }
        Ok(self.set_attrs(&file, fsync)?)
    }

    fn set_attrs(&self, file: &File, fsync: bool) -> Result<(), String> {
        let at = self.shown();
        // Chunks of zeros at the end were not written, and a partial file
        // from an earlier attempt may be longer: the length is set here.
        let len = file
            .metadata()
            .map_err(|e| io_error("look at", &at, &e))?
            .len();
        if len != self.size {
            file.set_len(self.size)
                .map_err(|e| io_error("size", &at, &e))?;
        }
        dest_dir::set_mode(file, self.mode).map_err(|e| io_error("set the mode of", &at, &e))?;
        file.set_times(std::fs::FileTimes::new().set_modified(self.mtime))
            .map_err(|e| io_error("set the mtime of", &at, &e))?;
        if fsync {
            file.sync_all().map_err(|e| io_error("sync", &at, &e))?;
        }
        self.ready.store(true, Ordering::Release);
        Ok(())
    }

    /// Renames the ready file to its final name in `dir` (its directory,
    /// opened beneath DEST).
    fn put_in_place(&self, dir: &OwnedFd, replace: bool) -> Result<(), String> {
        self.dest
            .place(&self.staged, dir, &self.name, replace)
            .map_err(|e| io_error("rename into place", &self.shown(), &e))
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

/// Hashes the chunks a partial file holds, for a file of `size` bytes:
/// only over the bytes it has (a chunk it holds part of reads as zeros
/// past its end, which is what extending it gives); chunks wholly past
/// its end are [`NOT_HELD`], at no cost. Of a file sent in part, only the
/// part's chunks are hashed, and a chunk the file has no data in (a hole
/// left for another shard's part) is [`NOT_HELD`] too.
fn hash_partial(file: &File, size: u64, part: Option<&Range<u64>>) -> io::Result<Vec<Cv>> {
    let have = file.metadata()?.len();
    let mut buf = vec![0u8; CHUNK_SIZE as usize];
    (0..chunk_count(size))
        .map(|i| {
            if i * CHUNK_SIZE >= have && size > 0 {
                return Ok(NOT_HELD);
            }
            if let Some(part) = part {
                if !part.contains(&i)
                    || dest_dir::is_hole(file, i * CHUNK_SIZE, chunk_len(size, i))?
                {
                    return Ok(NOT_HELD);
                }
            }
            chunk_cv_on_disk(file, size, i, &mut buf)
        })
        .collect()
}

/// The value of chunk `i` of a `size`-byte file as `file` holds it now.
/// Past the file's end it reads as zeros, as extending the file to
/// `size` would leave it. `buf` holds at least one chunk.
pub(super) fn chunk_cv_on_disk(file: &File, size: u64, i: u64, buf: &mut [u8]) -> io::Result<Cv> {
    let data = &mut buf[..chunk_len(size, i)];
    data.fill(0);
    let mut at = 0;
    while at < data.len() {
        match file.read_at(&mut data[at..], i * CHUNK_SIZE + at as u64)? {
            0 => break,
            n => at += n,
        }
    }
    Ok(chunk_cv(size, i, data))
}

/// A cache of the last directory opened beneath DEST: entries come
/// grouped by directory, so most lookups hit.
struct DirCache<'a> {
    dest: &'a DestDir,
    last: Option<(Vec<u8>, OwnedFd)>,
}

impl<'a> DirCache<'a> {
    fn new(dest: &'a DestDir) -> Self {
        DirCache { dest, last: None }
    }

    fn get(&mut self, rel: &[u8]) -> io::Result<&OwnedFd> {
        if self.last.as_ref().is_none_or(|(r, _)| r != rel) {
            self.last = None;
            let fd = self.dest.open_dir(rel)?;
            self.last = Some((rel.to_vec(), fd));
        }
        Ok(&self.last.as_ref().expect("set above").1)
    }

    /// What `rel` is; `Nothing` when its directory does not exist yet.
    fn look(&mut self, rel: &[u8]) -> Result<Found, String> {
        let (dir, name) = split_rel(rel);
        match self.get(dir) {
            Ok(fd) => {
                dest_dir::look(fd, name).map_err(|e| io_error("look at", &self.dest.shown(rel), &e))
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(Found::Nothing),
            Err(e) => Err(io_error("look at", &self.dest.shown(rel), &e)),
        }
    }
}

fn symlink_in_the_way(path: &Path) -> String {
    format!(
        "{} is a symlink; atou does not write through symlinks in the destination",
        shown(path.as_os_str().as_encoded_bytes())
    )
}

/// Checks a plan request against the destination under `policy`, then
/// creates the directories (partial files are created by their first
/// write: pre-creating ten thousand of them cost 2.9 s on ext4 here).
/// Returns why not, as one line, if the transfer cannot go ahead; nothing
/// is written in that case unless the failure was in creating (a full
/// disk, say). Once every entry is checked and before anything is
/// created, `admit` is shown the files the plan will stage and may refuse
/// it (the sender's quota of staged files).
pub fn prepare(
    dest_dir: &Arc<DestDir>,
    policy: &ReceivePolicy,
    request: PlanRequest,
    checksum_budget: u64,
    admit: impl FnOnce(&[ToStage<'_>]) -> Result<(), String>,
) -> Result<Prepared, String> {
    // Bytes of existing files read to compare them by content.
    let mut checksummed: u64 = 0;
    let PlanRequest {
        options: asked,
        subdir,
        manifest,
        parts: sent_in_part,
    } = request;
    // Per file number: the chunks this session sends of a split file.
    let mut part_of: Vec<Option<Range<u64>>> = vec![None; super::file_sizes(&manifest).len()];
    for p in sent_in_part {
        if let Some(slot) = part_of.get_mut(p.file as usize) {
            *slot = Some(p.chunks);
        }
    }
    let options = Options {
        overwrite: asked.overwrite && policy.allow_overwrite && !policy.key_forbids_overwrite,
        skip_existing: asked.skip_existing,
        fsync: asked.fsync || policy.fsync,
        checksum: asked.checksum && asked.skip_existing,
        dry_run: asked.dry_run,
        shard: asked.shard,
    };
    let sub: Vec<u8> = subdir
        .as_ref()
        .map_or(Vec::new(), |s| s.as_bytes().to_vec());
    // The report's (the operator's) and the messages' (the peer's).
    let dest = if sub.is_empty() {
        dest_dir.path().to_path_buf()
    } else {
        dest_dir.path().join(std::ffi::OsStr::from_bytes(&sub))
    };
    let dest_shown = dest_dir.shown(&sub);
    let reserved = |rel: &[u8]| split_first(rel) == STAGING_DIR.as_bytes();
    let mut dirs = DirCache::new(dest_dir);
    // The subdirectory: every existing component must be a real directory.
    let mut to_create: Vec<Vec<u8>> = Vec::new();
    if let Some(s) = &subdir {
        if reserved(s.as_bytes()) {
            return Err(format!(
                "{STAGING_DIR} is reserved for atou's partial files"
            ));
        }
        let mut rel = Vec::new();
        for c in s.components() {
            rel = join_rel(&rel, c);
            if !to_create.is_empty() {
                to_create.push(rel.clone());
                continue;
            }
            match dirs.look(&rel)? {
                Found::Dir => {}
                Found::Nothing => to_create.push(rel.clone()),
                Found::Symlink => return Err(symlink_in_the_way(&dest_dir.shown(&rel))),
                _ => {
                    return Err(format!(
                        "{} exists and is not a directory",
                        shown(dest_dir.shown(&rel).as_os_str().as_encoded_bytes())
                    ))
                }
            }
        }
    }
    let dest_exists = to_create.is_empty();
    let mut plans = Vec::new();
    let mut held = Vec::new();
    let mut targets = Vec::new();
    // Per file: the length of the partial file an earlier attempt left.
    let mut left_staged: Vec<u64> = Vec::new();
    let mut conflicts = Vec::new();
    let mut skip = vec![false; manifest.entries.len()];
    let mut rels = Vec::with_capacity(manifest.entries.len());
    // Every link this manifest makes, wherever it stands in it: a link is
    // judged with all of them in place.
    let links: HashMap<Vec<u8>, Vec<u8>> = if policy.symlinks == SymlinkPolicy::Safe {
        manifest
            .entries
            .iter()
            .filter_map(|e| match &e.kind {
                EntryKind::Symlink { target } => {
                    Some((join_rel(&sub, e.path.as_bytes()), target.clone()))
                }
                _ => None,
            })
            .collect()
    } else {
        HashMap::new()
    };
    let link_root = policy.confined_to.clone().unwrap_or_default();
    for (i, entry) in manifest.entries.iter().enumerate() {
        let rel = join_rel(&sub, entry.path.as_bytes());
        if reserved(&rel) {
            return Err(format!(
                "`{}`: the name {STAGING_DIR} is reserved for atou's partial files",
                entry.path
            ));
        }
        let path = dest_dir.shown(&rel);
        // Parents are checked before children (the manifest guarantees
        // they come first); below a directory that does not exist yet
        // nothing exists.
        let found = if dest_exists {
            dirs.look(&rel)?
        } else {
            Found::Nothing
        };
        let in_the_way = |what: &str| {
            format!(
                "{} exists and is {what}; remove it or choose another destination",
                shown(path.as_os_str().as_encoded_bytes())
            )
        };
        match &entry.kind {
            EntryKind::Dir => match found {
                Found::Nothing | Found::Dir => {}
                Found::Symlink => return Err(symlink_in_the_way(&path)),
                _ => return Err(in_the_way("not a directory")),
            },
            EntryKind::File { size } => {
                let part = part_of.get(targets.len()).cloned().flatten();
                let mut plan = FilePlan::SendAll;
                let mut existing = None;
                // One session sees one part of a split file: it cannot
                // compare the whole by content, so with --checksum such a
                // file is never skipped (sent again with --overwrite, else
                // refused), rather than skipped on size and mtime.
                let by_content = options.checksum && part.is_none();
                match found {
                    Found::Dir => return Err(in_the_way("a directory")),
                    Found::Other => return Err(in_the_way("not a regular file")),
                    // rsync's -c: same size, compared by content below.
                    Found::File { size: have, .. } if by_content && have == *size => {
                        existing = Some(Existing {
                            replace: options.overwrite,
                        });
                    }
                    Found::File { size: have, mtime }
                        if options.skip_existing
                            && !options.checksum
                            && have == *size
                            && mtime == entry.mtime_sec =>
                    {
                        plan = FilePlan::Skip;
                        skip[i] = true;
                    }
                    Found::File { .. } | Found::Symlink if !options.overwrite => {
                        conflicts.push(entry.path.to_string());
                    }
                    _ => {}
                }
                let staged = staged_name(&rel);
                let mut cvs = Vec::new();
                let mut fresh = true;
                let mut left = 0;
                if plan != FilePlan::Skip {
                    match dest_dir.look_staged(&staged) {
                        Ok(Found::Nothing) if existing.is_some() => {
                            checksummed = checksummed.saturating_add(*size);
                            if checksummed > checksum_budget {
                                return Err(format!(
                                    "--checksum would have this server read more than {} of \
                                     existing files for one transfer, its limit \
                                     (--max-checksum); send without --checksum, or in parts",
                                    crate::units::format_size(checksum_budget)
                                ));
                            }
                            // Its chunks' values, as if it were a partial
                            // file: the sender sends only those that differ.
                            let (d, n) = split_rel(&rel);
                            cvs = dirs
                                .get(d)
                                .and_then(|fd| dest_dir::open_file(fd, n))
                                .and_then(|f| hash_partial(&f, *size, None))
                                .map_err(|e| io_error("read", &path, &e))?;
                            plan = FilePlan::Held(cvs.clone());
                            fresh = false;
                        }
                        Ok(Found::Nothing) => {}
                        Ok(Found::File { size: have, .. }) => {
                            // A partial file of a replacement in progress
                            // wins over the existing file.
                            existing = None;
                            left = have;
                            let at = dest_dir.path().join(STAGING_DIR).join(&staged);
                            cvs = dest_dir
                                .open_staged(&staged, false)
                                .and_then(|f| hash_partial(&f, *size, part.as_ref()))
                                .map_err(|e| io_error("read", &at, &e))?;
                            plan = FilePlan::Held(cvs.clone());
                            fresh = false;
                        }
                        Ok(_) => {
                            return Err(format!(
                                "the partial file of `{}` in {STAGING_DIR} is not a regular file; remove it",
                                entry.path
                            ))
                        }
                        Err(e) => return Err(io_error("look at", &path, &e)),
                    }
                }
                let (dir, name) = split_rel(&rel);
                plans.push(plan);
                held.push(cvs);
                left_staged.push(left);
                targets.push(Arc::new(FileTarget {
                    rel: entry.path.clone(),
                    size: *size,
                    fresh,
                    mode: policy.mode(entry.mode),
                    mtime: to_system_time(entry.mtime_sec, entry.mtime_nsec),
                    writing: AtomicU64::new(0),
                    ready: AtomicBool::new(false),
                    dest: dest_dir.clone(),
                    dir: dir.to_vec(),
                    name: name.to_vec(),
                    staged,
                    created: AtomicBool::new(!fresh && existing.is_none()),
                    existing,
                    part: part.map(|chunks| Part {
                        chunks,
                        header: parts::header(*size, entry.mtime_sec, entry.mtime_nsec),
                    }),
                    handle: Mutex::new(None),
                }));
            }
            EntryKind::Symlink { target } => {
                let allowed = match policy.symlinks {
                    SymlinkPolicy::All => true,
                    SymlinkPolicy::Safe => {
                        link_stays_beneath(&rel, target, &link_root, &links, |p| {
                            dirs_read_link(&mut dirs, p)
                        })
                    }
                    SymlinkPolicy::None => false,
                };
                if !allowed {
                    let (which, why) = match policy.symlinks {
                        SymlinkPolicy::None => ("none", "and symlinks are refused here"),
                        _ if policy.confined_to.is_some() => (
                            "safe",
                            "which leads out of this key's subdirectory once the links on its \
                             way are followed",
                        ),
                        _ => (
                            "safe",
                            "which leads out of the destination once the links on its way are \
                             followed",
                        ),
                    };
                    let what_to_do = if policy.users_own {
                        format!(
                            "refused under --symlinks {which}: copy again with --symlinks all to \
                             take it as it is, or --follow to copy what it points to"
                        )
                    } else {
                        format!(
                            "this server's symlink policy is {which}: its operator can start it \
                             with --symlinks all, or send with --follow"
                        )
                    };
                    return Err(format!(
                        "`{}` is a symlink to `{}`, {why}; {what_to_do}",
                        entry.path,
                        shown(target),
                    ));
                }
                match found {
                    Found::Dir => return Err(in_the_way("a directory")),
                    Found::Nothing => {}
                    Found::Symlink
                        if options.skip_existing
                            && dirs_read_link(&mut dirs, &rel).is_some_and(|t| t == *target) =>
                    {
                        skip[i] = true;
                    }
                    _ if !options.overwrite => conflicts.push(entry.path.to_string()),
                    _ => {}
                }
            }
        }
        rels.push(rel);
    }
    if !conflicts.is_empty() {
        let shown_names: Vec<&str> = conflicts.iter().take(5).map(String::as_str).collect();
        let more = if conflicts.len() > 5 {
            format!(" and {} more", conflicts.len() - 5)
        } else {
            String::new()
        };
        let what_to_do = if asked.overwrite && policy.users_own && !options.overwrite {
            "the sending end asked to replace them, but this copy was not given --overwrite"
        } else if asked.overwrite && policy.key_forbids_overwrite {
            "this client's key may not replace files here (its line in the server's authorized \
             keys has no `overwrite` option); use --skip-existing to keep identical files"
        } else if asked.overwrite && !policy.allow_overwrite {
            "this server does not let senders replace files (its operator can start it with \
             --allow-overwrite); use --skip-existing to keep identical files"
        } else {
            "use --overwrite to replace, or --skip-existing to keep identical files"
        };
        return Err(format!(
            "{} already exist{} in {}: {}{more}; {what_to_do}",
            if conflicts.len() == 1 {
                "1 entry".to_string()
            } else {
                format!("{} entries", conflicts.len())
            },
            if conflicts.len() == 1 { "s" } else { "" },
            shown(dest_shown.as_os_str().as_encoded_bytes()),
            shown_names.join(", ")
        ));
    }
    // A partial file holds at most its size, unless an earlier attempt
    // at another version of it left more (cut to size when complete).
    let to_stage: Vec<ToStage<'_>> = targets
        .iter()
        .zip(&plans)
        .zip(&left_staged)
        .filter(|((_, plan), _)| **plan != FilePlan::Skip)
        .map(|((t, _), &left)| ToStage {
            staged: &t.staged,
            bytes: t.size.max(left),
        })
        .collect();
    admit(&to_stage)?;
    // A dry run ends here: the answer is made, nothing is created.
    let created = if options.dry_run {
        Vec::new()
    } else {
        // Everything checked: now create. New directories are private
        // until the finish gives them their mode, as tar does.
        let sub_mode = 0o777 & !policy.umask;
        for rel in &to_create {
            make_dir(dest_dir, rel, sub_mode)?;
        }
        let mut created = vec![false; manifest.entries.len()];
        for (i, entry) in manifest.entries.iter().enumerate() {
            if entry.kind == EntryKind::Dir {
                created[i] = make_dir(dest_dir, &rels[i], 0o700)?;
            }
        }
        for (t, plan) in targets.iter().zip(&plans) {
            if let (Some(part), false) = (&t.part, *plan == FilePlan::Skip) {
                parts::start(dest_dir, &t.staged, &part.header, t.size, options.fsync)
                    .map_err(|e| io_error("start the record of the parts of", &t.shown(), &e))?;
            }
        }
        created
    };
    let manifest_modes = manifest
        .entries
        .iter()
        .map(|e| policy.mode(e.mode))
        .collect();
    Ok(Prepared {
        dest,
        entries: manifest.entries,
        files: targets,
        plans,
        held,
        skip,
        created,
        options,
        dir_modes: manifest_modes,
        dest_dir: dest_dir.clone(),
        rels,
        claim: None,
    })
}

/// What a session's part did to its split file.
enum PartFinish {
    /// It completed the file, now given its length, mode and mtime, still
    /// to be renamed.
    Completes(parts::Complete),
    /// Other parts are still to come.
    Waits,
    /// Another session completed and placed the file already (this part
    /// was recorded by an earlier run of its shard).
    PlacedBefore,
}

/// Checks one session's part of a split file against the sender's digest
/// of it and records it (src/transfer/parts.rs).
fn finish_part(
    t: &FileTarget,
    part: &Part,
    verified: &[Option<Cv>],
    sender_digest: &Cv,
    fsync: bool,
) -> Result<PartFinish, DestError> {
    let range = part.chunks.start as usize..part.chunks.end as usize;
    let cvs: Option<Vec<Cv>> = verified[range].iter().copied().collect();
    let Some(cvs) = cvs else {
        return Err(DestError::Failed(format!(
            "`{}`: not every chunk of its part arrived (a sender bug); run the transfer again",
            t.rel
        )));
    };
    let ours = part_digest(t.size, part.chunks.start, &cvs);
    if ours != *sender_digest {
        return Err(DestError::Mismatch(format!(
            "`{}`: its part (chunks {}..{}) hashes to {} here, {} at the sender; the file changed \
             while it was sent?",
            t.rel,
            part.chunks.start,
            part.chunks.end,
            super::hash::short_hex(&ours),
            super::hash::short_hex(sender_digest)
        )));
    }
    let recorded = parts::record(
        &t.dest,
        &t.staged,
        &part.header,
        t.size,
        &part.chunks,
        &cvs,
        fsync,
    );
    match recorded {
        Ok(Recorded::Waiting { .. }) => Ok(PartFinish::Waits),
        Ok(Recorded::PlacedBefore) => Ok(PartFinish::PlacedBefore),
        Ok(Recorded::Complete(complete)) => {
            t.set_attrs(&complete.file, fsync)?;
            Ok(PartFinish::Completes(complete))
        }
        Err(PartError::Io(e)) => Err(io_error("record the parts of", &t.shown(), &e).into()),
        Err(PartError::OtherVersion) => Err(DestError::Failed(format!(
            "`{}`: another shard is sending another version of it (another size or mtime); \
             every shard must send the same files: run them all again from one copy",
            t.rel
        ))),
        Err(PartError::RecordGone) => Err(DestError::Failed(format!(
            "`{}`: the record of its parts in {STAGING_DIR} is gone; run this shard again",
            t.rel
        ))),
        Err(PartError::Changed(count, first)) => Err(DestError::Mismatch(format!(
            "`{}`: {count} chunk(s) other shards sent, from chunk {first}, no longer hold on \
             disk here what they sent (a crash before they were synced, or a change); they were \
             dropped from its record: run the shards again (each sends only what is missing)",
            t.rel
        ))),
    }
}

fn split_first(rel: &[u8]) -> &[u8] {
    rel.split(|&b| b == b'/').next().unwrap_or(rel)
}

fn dirs_read_link(dirs: &mut DirCache<'_>, rel: &[u8]) -> Option<Vec<u8>> {
    let (dir, name) = split_rel(rel);
    dest_dir::read_link(dirs.get(dir).ok()?, name).ok()
}

/// Creates directory `rel` beneath DEST; whether it is new.
fn make_dir(dest: &DestDir, rel: &[u8], mode: u32) -> Result<bool, String> {
    let (dir, name) = split_rel(rel);
    dest.open_dir(dir)
        .and_then(|fd| dest.make_dir(&fd, name, mode))
        .map_err(|e| io_error("create directory", &dest.shown(rel), &e))
}

/// What the finish did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Finished {
    pub files: u64,
    /// Files split across shards whose part this session recorded, and
    /// which wait for other shards' parts before they take their name.
    pub waiting: u64,
    pub dirs: u64,
    pub symlinks: u64,
    pub skipped: u64,
}

/// Checks each file's BLAKE3 hash (merged from the values of its verified
/// chunks) against the sender's and only then renames it into place; then
/// creates the symlinks and sets the directories' modes and mtimes,
/// deepest first.
pub fn finish(
    prepared: &Prepared,
    verified: &[Vec<Option<Cv>>],
    sender_hashes: &[Cv],
) -> Result<Finished, DestError> {
    let mut done = Finished::default();
    if sender_hashes.len() != prepared.files.len() {
        return Err(DestError::Failed(format!(
            "the sender sent {} file hashes for {} files",
            sender_hashes.len(),
            prepared.files.len()
        )));
    }
    let fsync = prepared.options.fsync;
    let replace = prepared.options.overwrite;
    let dest_dir = &prepared.dest_dir;
    let mut dirs = DirCache::new(dest_dir);
    let mut synced_dirs: Vec<Vec<u8>> = Vec::new();
    // Directories whose mtime this session's own writes moved: the
    // parents of what it placed and of the directories it created.
    let mut written_into: HashSet<&[u8]> = HashSet::new();
    for (i, rel) in prepared.rels.iter().enumerate() {
        if prepared.created.get(i).copied().unwrap_or(false) {
            written_into.insert(split_rel(rel).0);
        }
    }
    let mut file_no = 0;
    for (i, entry) in prepared.entries.iter().enumerate() {
        let rel = &prepared.rels[i];
        let (dir_rel, name) = split_rel(rel);
        if prepared.skip[i] {
            done.skipped += 1;
            if matches!(entry.kind, EntryKind::File { .. }) {
                file_no += 1;
            }
            continue;
        }
        match &entry.kind {
            EntryKind::Dir => {}
            EntryKind::File { size } => {
                let n = file_no;
                file_no += 1;
                let t = &prepared.files[n];
                if let Some(part) = &t.part {
                    let placed = finish_part(t, part, &verified[n], &sender_hashes[n], fsync)?;
                    if let PartFinish::Completes(complete) = placed {
                        let fd = dirs
                            .get(dir_rel)
                            .map_err(|e| io_error("open", &dest_dir.shown(dir_rel), &e))?;
                        t.put_in_place(fd, replace)?;
                        complete.done(dest_dir).map_err(|e| {
                            io_error("remove the record of the parts of", &t.shown(), &e)
                        })?;
                        written_into.insert(dir_rel);
                        if fsync && synced_dirs.last().is_none_or(|d| d != dir_rel) {
                            synced_dirs.push(dir_rel.to_vec());
                        }
                        done.files += 1;
                    } else if let PartFinish::Waits = placed {
                        done.waiting += 1;
                    }
                    continue;
                }
                let cvs: Option<Vec<Cv>> = verified[n].iter().copied().collect();
                let Some(cvs) = cvs else {
                    return Err(DestError::Failed(format!(
                        "`{}`: not every chunk arrived (a sender bug); run the transfer again",
                        t.rel
                    )));
                };
                let ours = file_hash(*size, &cvs).expect("one value per chunk");
                if *ours.as_bytes() != sender_hashes[n] {
                    return Err(DestError::Mismatch(format!(
                        "`{}`: BLAKE3 {} here, {} at the sender; the file changed while it was sent?",
                        t.rel,
                        super::hash::short_hex(ours.as_bytes()),
                        super::hash::short_hex(&sender_hashes[n])
                    )));
                }
                if t.unchanged_existing() {
                    // --checksum found it identical: it stays as it is.
                    done.skipped += 1;
                    continue;
                }
                if !t.ready.load(Ordering::Acquire) {
                    t.make_ready(fsync)?;
                }
                let fd = dirs
                    .get(dir_rel)
                    .map_err(|e| io_error("open", &dest_dir.shown(dir_rel), &e))?;
                t.put_in_place(fd, replace)?;
                if !t.fresh {
                    // Sent whole this time, from a partial file a split run
                    // left: that run's record of parts goes with it.
                    let _ = dest_dir.remove_staged(&parts::record_name(&t.staged));
                }
                written_into.insert(dir_rel);
                if fsync && synced_dirs.last().is_none_or(|d| d != dir_rel) {
                    synced_dirs.push(dir_rel.to_vec());
                }
                done.files += 1;
            }
            EntryKind::Symlink { target } => {
                let staged = format!("{}.link", &staged_name(rel)[..32]);
                let shown_path = dest_dir.shown(rel);
                dest_dir
                    .symlink_staged(target, &staged)
                    .map_err(|e| io_error("create symlink", &shown_path, &e))?;
                let fd = dirs
                    .get(dir_rel)
                    .map_err(|e| io_error("open", &dest_dir.shown(dir_rel), &e))?;
                dest_dir
                    .place(&staged, fd, name, replace)
                    .map_err(|e| io_error("rename into place", &shown_path, &e))?;
                written_into.insert(dir_rel);
                done.symlinks += 1;
            }
        }
    }
    for (i, entry) in prepared.entries.iter().enumerate().rev() {
        let rel = &prepared.rels[i];
        let whole = prepared.created[i] || prepared.options.overwrite;
        // A shard's sibling sessions write into the directories it
        // created, after it may have set their mtimes; so whichever
        // session writes into a directory last sets its mtime again,
        // after its writes, and the last one standing is the sender's.
        let mtime_only = prepared.options.shard && written_into.contains(rel.as_slice());
        if entry.kind != EntryKind::Dir || !(whole || mtime_only) {
            continue;
        }
        let path = dest_dir.shown(rel);
        let fd = dest_dir
            .open_dir(rel)
            .map_err(|e| io_error("open", &path, &e))?;
        if fsync {
            dest_dir::sync_dir(&fd).map_err(|e| io_error("sync", &path, &e))?;
        }
        let mtime = to_system_time(entry.mtime_sec, entry.mtime_nsec);
        if whole {
            dest_dir::set_dir_attrs(fd, prepared.dir_modes[i], mtime)
                .map_err(|e| io_error("set the mode and mtime of", &path, &e))?;
            done.dirs += 1;
        } else {
            dest_dir::set_dir_mtime(fd, mtime)
                .map_err(|e| io_error("set the mtime of", &path, &e))?;
        }
    }
    if fsync {
        for rel in synced_dirs {
            let fd = dest_dir
                .open_dir(&rel)
                .map_err(|e| io_error("open", &dest_dir.shown(&rel), &e))?;
            dest_dir::sync_dir(&fd).map_err(|e| io_error("sync", &dest_dir.shown(&rel), &e))?;
        }
    }
    Ok(done)
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
            handle: Mutex::new(None),
        }
    }

    /// The file stays open while chunks are outstanding and is closed by the
    /// last one handed back, whether that one was written or not (a chunk
    /// that failed its check is handed back unwritten).
    #[test]
    fn the_last_chunk_handed_back_closes_the_file_written_or_not() {
        let dir = std::env::temp_dir().join(format!("atou-dest-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
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

    /// `link_stays_beneath` with the manifest's links `links` and nothing
    /// on disk but `disk`.
    fn beneath(link: &str, target: &str, root: &str, links: &[(&str, &str)]) -> bool {
        beneath_with_disk(link, target, root, links, &[])
    }

    fn beneath_with_disk(
        link: &str,
        target: &str,
        root: &str,
        links: &[(&str, &str)],
        disk: &[(&str, &str)],
    ) -> bool {
        let map = |l: &[(&str, &str)]| -> HashMap<Vec<u8>, Vec<u8>> {
            l.iter()
                .map(|(p, t)| (p.as_bytes().to_vec(), t.as_bytes().to_vec()))
                .collect()
        };
        let (links, disk) = (map(links), map(disk));
        link_stays_beneath(
            link.as_bytes(),
            target.as_bytes(),
            root.as_bytes(),
            &links,
            |p| disk.get(p).cloned(),
        )
    }

    #[test]
    fn a_link_read_as_text_stays_or_leaves() {
        assert!(beneath("l", "a/b", "", &[]));
        assert!(beneath("d/l", "../x", "", &[]));
        assert!(beneath("l", "./a/../b", "", &[]));
        assert!(!beneath("l", "../x", "", &[]));
        assert!(!beneath("l", "a/../../x", "", &[]));
        assert!(!beneath("a/b/c/l", "/etc/passwd", "", &[]));
        assert!(!beneath("l", "", "", &[]));
    }

    #[test]
    fn a_chain_of_links_is_judged_where_it_leads() {
        // rsync's CVE-2024-12088 under a key confined to alice: each link
        // stays inside DEST as text; together they reach /etc.
        let links = [
            ("alice/d/up", ".."),
            ("alice/etc", "d/up/d/up/d/up/../../../../../../../etc"),
        ];
        assert!(beneath("alice/d/up", "..", "alice", &links));
        assert!(!beneath("alice/etc", links[1].1, "alice", &links));
        // The same chain unconfined still climbs out of DEST.
        let links = [("d/up", ".."), ("etc", "d/up/d/up/../../etc")];
        assert!(!beneath("etc", links[1].1, "", &links));
        // A link later in the manifest counts as much as an earlier one.
        let links = [("a/evil", "../b/../x"), ("b", "../..")];
        assert!(!beneath("a/evil", "../b/../x", "", &links));
        assert!(beneath("a/evil", "../b/../x", "", &[]));
    }

    #[test]
    fn a_confined_key_cannot_link_into_a_sibling_key() {
        assert!(!beneath("alice/peek", "../bob", "alice", &[]));
        assert!(!beneath("alice/x/peek", "../../bob/secret", "alice", &[]));
        assert!(beneath("alice/x/peek", "../y", "alice", &[]));
        // Beneath DEST, for an unconfined key, that is fine.
        assert!(beneath("alice/peek", "../bob", "", &[]));
        // A link must itself stand beneath the root.
        assert!(!beneath("alice2/peek", "x", "alice", &[]));
    }

    #[test]
    fn links_already_at_the_destination_are_followed_too() {
        let disk = [("alice/old", "../../..")];
        assert!(!beneath_with_disk(
            "alice/new",
            "old/x",
            "alice",
            &[],
            &disk
        ));
        assert!(beneath_with_disk(
            "alice/new",
            "old2/x",
            "alice",
            &[],
            &disk
        ));
        // A loop is refused, not walked for ever.
        let loops = [("a", "b"), ("b", "a")];
        assert!(!beneath("c", "a", "", &loops));
        // An absolute link on the way is a way out.
        assert!(!beneath("c", "abs/x", "", &[("abs", "/etc")]));
        // A walk past the step budget is refused, however harmless.
        // `a` leads where it stands, in a thousand steps.
        let here = vec!["."; 1000].join("/");
        let chain = [("a", here.as_str())];
        assert!(beneath("c", "a", "", &chain));
        assert!(beneath("c", "a/a", "", &chain));
        assert!(!beneath("c", "a/a/a", "", &chain));
    }

    #[test]
    fn the_policy_strips_special_bits_and_applies_its_umask() {
        assert_eq!(ReceivePolicy::server().mode(0o4777), 0o755);
        assert_eq!(ReceivePolicy::server().mode(0o640), 0o640);
        let flags = UserFlags {
            overwrite: false,
            special_bits: false,
            symlinks: SymlinkPolicy::Safe,
            fsync: false,
        };
        assert_eq!(ReceivePolicy::user(flags, None).mode(0o4755), 0o755);
        assert_eq!(ReceivePolicy::user(flags, None).mode(0o777), 0o777);
        let kept = UserFlags {
            special_bits: true,
            ..flags
        };
        assert_eq!(ReceivePolicy::user(kept, None).mode(0o4755), 0o4755);
    }

    fn plan_of(subdir: Option<&str>, paths: &[&str]) -> PlanRequest {
        use super::super::manifest::Manifest;
        let entries = paths
            .iter()
            .map(|p| Entry {
                path: RelPath::new(p.as_bytes().to_vec()).unwrap(),
                kind: if p.ends_with(".txt") {
                    EntryKind::File { size: 1 }
                } else {
                    EntryKind::Dir
                },
                mode: 0o644,
                mtime_sec: 0,
                mtime_nsec: 0,
            })
            .collect();
        PlanRequest {
            options: Options::default(),
            subdir: subdir.map(|s| RelPath::new(s.as_bytes().to_vec()).unwrap()),
            manifest: Manifest { entries },
            parts: Vec::new(),
        }
    }

    #[test]
    fn a_plan_may_hold_only_the_names_asked_for() {
        let asked = Requested::from_paths(&["data/report.txt", "runs/", "logs"]);
        asked
            .check(&plan_of(
                None,
                &["report.txt", "runs", "runs/a.txt", "logs"],
            ))
            .unwrap();
        // Fewer than asked: a remote may have excluded some.
        asked.check(&plan_of(None, &["runs"])).unwrap();
        for bad in [
            vec![".bashrc"],
            vec!["report.txt", ".ssh", ".ssh/authorized_keys"],
            vec!["report.txt", "report.txt"],
            vec!["data"],
        ] {
            let why = asked.check(&plan_of(None, &bad)).unwrap_err();
            assert!(why.contains("which was not asked for"), "{bad:?}: {why}");
            assert!(why.contains("data/report.txt, runs/, logs"), "{why}");
        }
        let why = asked
            .check(&plan_of(Some("sub"), &["report.txt"]))
            .unwrap_err();
        assert!(why.contains("subdirectory `sub`"), "{why}");
    }

    #[test]
    fn a_path_ending_in_a_dot_takes_one_entry_of_any_name() {
        let asked = Requested::from_paths(&["work/.", "a.txt"]);
        asked
            .check(&plan_of(None, &["alice", "alice/x.txt", "a.txt"]))
            .unwrap();
        assert!(asked.check(&plan_of(None, &["alice", "bob"])).is_err());
        for home in ["", "~", "~/"] {
            let home = Requested::from_paths(&[home]);
            home.check(&plan_of(None, &["alice"])).unwrap();
            assert!(home.check(&plan_of(None, &["alice", "b.txt"])).is_err());
        }
        // A directory named `~` below the home is a name like any other.
        let tilde = Requested::from_paths(&["a/~"]);
        assert!(tilde.check(&plan_of(None, &["alice"])).is_err());
    }
}

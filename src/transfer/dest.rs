//! The receiver's side of the disk: checking a manifest against the
//! destination, partial files, and putting verified files in place.
//!
//! Nothing is written until every entry has been checked: a name that
//! would escape the destination (through an existing symlink), a file in
//! the way, or an existing file without `--overwrite` refuses the whole
//! transfer. Data goes to `NAME.atou-part`, which is renamed to `NAME` only
//! once every chunk of it has been verified and its BLAKE3 hash matches the
//! sender's. A partial file left by an interrupted transfer is the resume
//! state: its chunks are hashed and the sender sends only the ones that
//! differ.

use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::hash::{chunk_count, chunk_cv, file_hash, Cv, CHUNK_SIZE};
use super::manifest::{Entry, EntryKind, RelPath};
use super::messages::{FilePlan, Options, PlanRequest};

/// Suffix of a file being received.
pub const PART_SUFFIX: &str = ".atou-part";

/// "cannot ACTION PATH: CAUSE", the cause in words rather than `Os { .. }`.
pub fn io_error(action: &str, path: &Path, e: &io::Error) -> String {
    let cause = match e.raw_os_error() {
        Some(libc::ENOSPC) => "no space left on the device".to_string(),
        Some(libc::EDQUOT) => "disk quota exceeded".to_string(),
        Some(libc::EACCES) | Some(libc::EPERM) => "permission denied".to_string(),
        Some(libc::EROFS) => "read-only file system".to_string(),
        Some(libc::ENOENT) => "no such file or directory".to_string(),
        _ => {
            // "No such device (os error 19)" -> "No such device".
            let text = e.to_string();
            match text.find(" (os error") {
                Some(at) => text[..at].to_string(),
                None => text,
            }
        }
    };
    format!("cannot {action} {}: {cause}", path.display())
}

/// Where one file of the manifest is going.
#[derive(Debug)]
pub struct FileTarget {
    pub rel: RelPath,
    pub part: PathBuf,
    pub final_path: PathBuf,
    pub size: u64,
    /// Did not exist before this transfer: chunks of zeros need not be
    /// written (unwritten ranges read as zeros, and the length is set when
    /// the file is put in place), so sparse files stay sparse.
    pub fresh: bool,
    pub mode: u32,
    pub mtime: SystemTime,
    pub handle: Mutex<Option<File>>,
    /// Chunks handed to writers and not yet written; the file is closed
    /// when this comes back to zero.
    pub writing: AtomicU64,
    /// Renamed to its final name.
    pub in_place: AtomicBool,
}

impl FileTarget {
    /// Writes one verified chunk at its place, opening the file if needed
    /// (it stays open until [`chunk_done`](Self::chunk_done) closes it).
    pub fn write_chunk(&self, chunk: u64, data: &[u8]) -> Result<(), String> {
        use std::os::unix::fs::FileExt;
        if self.fresh && data.iter().all(|&b| b == 0) {
            return Ok(());
        }
        let mut handle = self.handle.lock().expect("writer panicked");
        if handle.is_none() {
            *handle = Some(
                OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .open(&self.part)
                    .map_err(|e| io_error("create", &self.part, &e))?,
            );
        }
        let file = handle.as_ref().expect("opened above");
        file.write_all_at(data, chunk * CHUNK_SIZE)
            .map_err(|e| io_error("write", &self.part, &e))
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
                .map_err(|e| io_error("sync", &self.part, &e)),
            _ => Ok(()),
        }
    }

    /// Sets the mode and mtime of a complete, verified file and renames it
    /// to its final name (syncing it first, and its directory after, with
    /// `fsync`).
    pub fn put_in_place(&self, fsync: bool) -> Result<(), String> {
        let file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(&self.part)
            .map_err(|e| io_error("create", &self.part, &e))?;
        self.finish_file(file, fsync)
    }

    /// Writes a file of one chunk, already verified, and puts it in place
    /// at once: one open instead of two, which is most of the cost of a
    /// tree of small files.
    pub fn write_whole(&self, data: &[u8], fsync: bool) -> Result<(), String> {
        use std::os::unix::fs::FileExt;
        let file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&self.part)
            .map_err(|e| io_error("create", &self.part, &e))?;
        if !data.iter().all(|&b| b == 0) {
            file.write_all_at(data, 0)
                .map_err(|e| io_error("write", &self.part, &e))?;
        }
        self.finish_file(file, fsync)
    }

    fn finish_file(&self, file: File, fsync: bool) -> Result<(), String> {
        // Chunks of zeros at the end were not written, and a partial file
        // from an earlier attempt may be longer: the length is set here.
        let len = file
            .metadata()
            .map_err(|e| io_error("look at", &self.part, &e))?
            .len();
        if len != self.size {
            file.set_len(self.size)
                .map_err(|e| io_error("size", &self.part, &e))?;
        }
        if fsync {
            file.sync_all()
                .map_err(|e| io_error("sync", &self.part, &e))?;
        }
        file.set_permissions(fs::Permissions::from_mode(self.mode))
            .map_err(|e| io_error("set the mode of", &self.part, &e))?;
        file.set_times(fs::FileTimes::new().set_modified(self.mtime))
            .map_err(|e| io_error("set the mtime of", &self.part, &e))?;
        drop(file);
        fs::rename(&self.part, &self.final_path)
            .map_err(|e| io_error("rename into place", &self.final_path, &e))?;
        if fsync {
            if let Some(dir) = self.final_path.parent() {
                File::open(dir)
                    .and_then(|d| d.sync_all())
                    .map_err(|e| io_error("sync", dir, &e))?;
            }
        }
        self.in_place.store(true, Ordering::Release);
        Ok(())
    }
}

/// What checking a plan request against the destination decided.
#[derive(Debug)]
pub struct Prepared {
    pub dest: PathBuf,
    pub entries: Vec<Entry>,
    pub files: Vec<std::sync::Arc<FileTarget>>,
    pub plans: Vec<FilePlan>,
    /// Per file, per chunk: the BLAKE3 value of what the partial file
    /// already holds (resume), if anything.
    pub held: Vec<Vec<Cv>>,
    /// Per entry: an identical one is already there (`--skip-existing`).
    pub skip: Vec<bool>,
    pub options: Options,
}

fn to_system_time(sec: i64, nsec: u32) -> SystemTime {
    if sec >= 0 {
        UNIX_EPOCH + Duration::new(sec as u64, nsec)
    } else {
        UNIX_EPOCH - Duration::from_secs(sec.unsigned_abs()) + Duration::from_nanos(u64::from(nsec))
    }
}

/// `path` with `.atou-part` added to its last component.
fn part_path(path: &Path) -> PathBuf {
    let mut name: OsString = path.as_os_str().to_owned();
    name.push(PART_SUFFIX);
    PathBuf::from(name)
}

/// Hashes a partial file's chunks as if it were `size` bytes long (bytes
/// past its end read as zeros, which is what extending it gives).
fn hash_partial(path: &Path, size: u64) -> io::Result<Vec<Cv>> {
    let mut file = File::open(path)?;
    let mut buf = vec![0u8; CHUNK_SIZE as usize];
    (0..chunk_count(size))
        .map(|i| {
            let len = super::hash::chunk_len(size, i);
            let data = &mut buf[..len];
            data.fill(0);
            file.seek(SeekFrom::Start(i * CHUNK_SIZE))?;
            let mut at = 0;
            while at < len {
                match file.read(&mut data[at..])? {
                    0 => break,
                    n => at += n,
                }
            }
            Ok(chunk_cv(size, i, data))
        })
        .collect()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Found {
    Nothing,
    Dir,
    File { size: u64, mtime: i64 },
    Symlink,
    Other,
}

fn look(path: &Path) -> Result<Found, String> {
    match fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => Ok(Found::Symlink),
        Ok(m) if m.is_dir() => Ok(Found::Dir),
        Ok(m) if m.is_file() => Ok(Found::File {
            size: m.len(),
            mtime: m.mtime(),
        }),
        Ok(_) => Ok(Found::Other),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Found::Nothing),
        Err(e) => Err(io_error("look at", path, &e)),
    }
}

/// Checks a plan request against the destination `root`, then creates the
/// directories (partial files are created by their first write: pre-sizing
/// ten thousand of them cost 2.9 s on ext4 here). Returns why not, as one line, if the
/// transfer cannot go ahead; nothing is written in that case unless the
/// failure was in creating (a full disk, say).
pub fn prepare(root: &Path, request: PlanRequest) -> Result<Prepared, String> {
    let PlanRequest {
        options,
        subdir,
        manifest,
    } = request;
    // The subdirectory: every existing component must be a real directory.
    let mut dest = root.to_path_buf();
    let mut to_create = Vec::new();
    if let Some(sub) = &subdir {
        for c in sub.components() {
            dest.push(OsString::from_vec(c.to_vec()));
            match look(&dest)? {
                Found::Dir => {}
                Found::Nothing => to_create.push(dest.clone()),
                Found::Symlink => {
                    return Err(format!(
                        "{} is a symlink; atou does not write through symlinks in the destination",
                        dest.display()
                    ))
                }
                _ => return Err(format!("{} exists and is not a directory", dest.display())),
            }
        }
    }
    let dest_exists = to_create.is_empty();
    let mut plans = Vec::new();
    let mut held = Vec::new();
    let mut targets = Vec::new();
    let mut conflicts = Vec::new();
    let mut skip = vec![false; manifest.entries.len()];
    for (i, entry) in manifest.entries.iter().enumerate() {
        let path = dest.join(entry.path.to_path());
        // Parents are checked before children (the manifest guarantees
        // they come first), so only the entry itself needs looking at;
        // below a directory that does not exist yet nothing exists.
        let found = if dest_exists {
            look(&path)?
        } else {
            Found::Nothing
        };
        let in_the_way = |what: &str| {
            format!(
                "{} exists and is {what}; remove it or choose another destination",
                path.display()
            )
        };
        match &entry.kind {
            EntryKind::Dir => match found {
                Found::Nothing | Found::Dir => {}
                Found::Symlink => {
                    return Err(format!(
                        "{} is a symlink; atou does not write through symlinks in the destination",
                        path.display()
                    ))
                }
                _ => return Err(in_the_way("not a directory")),
            },
            EntryKind::File { size } => {
                let mut plan = FilePlan::SendAll;
                match found {
                    Found::Dir => return Err(in_the_way("a directory")),
                    Found::Other => return Err(in_the_way("not a regular file")),
                    Found::File { size: have, mtime }
                        if options.skip_existing && have == *size && mtime == entry.mtime_sec =>
                    {
                        plan = FilePlan::Skip;
                        skip[i] = true;
                    }
                    Found::File { .. } | Found::Symlink if !options.overwrite => {
                        conflicts.push(entry.path.to_string());
                    }
                    _ => {}
                }
                let part = part_path(&path);
                if path.file_name().map_or(0, |n| n.len()) + PART_SUFFIX.len() > 255 {
                    return Err(format!(
                        "`{}`: the name is too long to add {PART_SUFFIX} for the partial file",
                        entry.path
                    ));
                }
                let mut cvs = Vec::new();
                let mut fresh = true;
                if plan != FilePlan::Skip {
                    match look(&part)? {
                        Found::Nothing => {}
                        Found::File { .. } => {
                            cvs = hash_partial(&part, *size)
                                .map_err(|e| io_error("read", &part, &e))?;
                            plan = FilePlan::Held(cvs.clone());
                            fresh = false;
                        }
                        _ => {
                            return Err(format!(
                                "{} exists and is not a regular file; remove it",
                                part.display()
                            ))
                        }
                    }
                }
                plans.push(plan);
                held.push(cvs);
                targets.push(std::sync::Arc::new(FileTarget {
                    rel: entry.path.clone(),
                    part,
                    final_path: path,
                    size: *size,
                    fresh,
                    mode: entry.mode,
                    mtime: to_system_time(entry.mtime_sec, entry.mtime_nsec),
                    handle: Mutex::new(None),
                    writing: AtomicU64::new(0),
                    in_place: AtomicBool::new(false),
                }));
            }
            EntryKind::Symlink { target } => match found {
                Found::Dir => return Err(in_the_way("a directory")),
                Found::Nothing => {}
                Found::Symlink
                    if options.skip_existing
                        && fs::read_link(&path)
                            .is_ok_and(|t| t.into_os_string().into_vec() == *target) =>
                {
                    skip[i] = true;
                }
                _ if !options.overwrite => conflicts.push(entry.path.to_string()),
                _ => {}
            },
        }
    }
    if !conflicts.is_empty() {
        let shown: Vec<&str> = conflicts.iter().take(5).map(String::as_str).collect();
        let more = if conflicts.len() > 5 {
            format!(" and {} more", conflicts.len() - 5)
        } else {
            String::new()
        };
        return Err(format!(
            "{} already exist{} in {}: {}{more}; use --overwrite to replace, or --skip-existing to keep identical files",
            if conflicts.len() == 1 { "1 entry".to_string() } else { format!("{} entries", conflicts.len()) },
            if conflicts.len() == 1 { "s" } else { "" },
            dest.display(),
            shown.join(", ")
        ));
    }
    // Everything checked: now create.
    for dir in &to_create {
        fs::create_dir(dir).map_err(|e| io_error("create directory", dir, &e))?;
    }
    for entry in &manifest.entries {
        if entry.kind == EntryKind::Dir {
            let path = dest.join(entry.path.to_path());
            match fs::create_dir(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(io_error("create directory", &path, &e)),
            }
        }
    }
    Ok(Prepared {
        dest,
        entries: manifest.entries,
        files: targets,
        plans,
        held,
        skip,
        options,
    })
}

/// What the finish did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Finished {
    pub files: u64,
    pub dirs: u64,
    pub symlinks: u64,
    pub skipped: u64,
}

/// Checks each file's BLAKE3 hash (merged from the values of its verified
/// chunks) against the sender's and puts in place those not there yet
/// (files resumed from a partial file, empty files); then creates the
/// symlinks and sets the directories' modes and mtimes, deepest first.
pub fn finish(
    prepared: &Prepared,
    verified: &[Vec<Option<Cv>>],
    sender_hashes: &[Cv],
) -> Result<Finished, String> {
    let mut done = Finished::default();
    if sender_hashes.len() != prepared.files.len() {
        return Err(format!(
            "the sender sent {} file hashes for {} files",
            sender_hashes.len(),
            prepared.files.len()
        ));
    }
    let mut file_no = 0;
    for (i, entry) in prepared.entries.iter().enumerate() {
        let path = prepared.dest.join(entry.path.to_path());
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
                let cvs: Option<Vec<Cv>> = verified[n].iter().copied().collect();
                let Some(cvs) = cvs else {
                    return Err(format!(
                        "`{}`: not every chunk arrived (a sender bug); run the transfer again",
                        t.rel
                    ));
                };
                let ours = file_hash(*size, &cvs).expect("one value per chunk");
                if *ours.as_bytes() != sender_hashes[n] {
                    return Err(format!(
                        "`{}`: BLAKE3 {} here, {} at the sender; the file changed while it was sent?",
                        t.rel,
                        super::hash::short_hex(ours.as_bytes()),
                        super::hash::short_hex(&sender_hashes[n])
                    ));
                }
                if !t.in_place.load(Ordering::Acquire) {
                    t.put_in_place(prepared.options.fsync)?;
                }
                done.files += 1;
            }
            EntryKind::Symlink { target } => {
                let tmp = part_path(&path);
                let _ = fs::remove_file(&tmp);
                std::os::unix::fs::symlink(OsString::from_vec(target.clone()), &tmp)
                    .map_err(|e| io_error("create symlink", &tmp, &e))?;
                fs::rename(&tmp, &path).map_err(|e| io_error("rename into place", &path, &e))?;
                done.symlinks += 1;
            }
        }
    }
    for entry in prepared.entries.iter().rev() {
        if entry.kind != EntryKind::Dir {
            continue;
        }
        let path = prepared.dest.join(entry.path.to_path());
        fs::set_permissions(&path, fs::Permissions::from_mode(entry.mode))
            .map_err(|e| io_error("set the mode of", &path, &e))?;
        let dir = File::open(&path).map_err(|e| io_error("open", &path, &e))?;
        dir.set_times(
            fs::FileTimes::new().set_modified(to_system_time(entry.mtime_sec, entry.mtime_nsec)),
        )
        .map_err(|e| io_error("set the mtime of", &path, &e))?;
        done.dirs += 1;
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(dir: &Path, writing: u64) -> FileTarget {
        FileTarget {
            rel: RelPath::new(b"f".to_vec()).unwrap(),
            part: dir.join("f.atou-part"),
            final_path: dir.join("f"),
            size: 2 * CHUNK_SIZE,
            fresh: true,
            mode: 0o644,
            mtime: SystemTime::UNIX_EPOCH,
            handle: Mutex::new(None),
            writing: AtomicU64::new(writing),
            in_place: AtomicBool::new(false),
        }
    }

    /// The file stays open while chunks are outstanding and is closed by the
    /// last one handed back, whether that one was written or not (a chunk
    /// that failed its check is handed back unwritten).
    #[test]
    fn the_last_chunk_handed_back_closes_the_file_written_or_not() {
        let dir = std::env::temp_dir().join(format!("atou-dest-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let t = target(&dir, 2);
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

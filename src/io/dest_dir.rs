//! The receiver's destination as one directory descriptor.
//!
//! Every name a peer sends is resolved beneath the descriptor of DEST with
//! `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)` (or, on kernels before
//! 5.6, a walk of `O_NOFOLLOW | O_DIRECTORY` opens, one component at a
//! time), and the last component is then acted on with the `*at` calls,
//! which never follow it either. So no symlink in DEST, planted before or
//! swapped in during a transfer, is ever followed: the kernel refuses the
//! path (`ELOOP`) instead of the check-then-open race a path-based receiver
//! has.
//!
//! Partial files live in `DEST/.atou-staging`, a directory private to the
//! receiving user (mode 0700, checked at every open), under names derived
//! from where they will go: a manifest cannot name them (the name
//! `.atou-staging` at the top of DEST is refused), so it cannot aim a
//! symlink at one, and `NAME.atou-part` is an ordinary name.
//!
//! The system calls go through rustix, the well-kept safe wrapper of the
//! Linux and POSIX `*at` family, so this module needs no `unsafe`.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use rustix::fs::{self as rfs, AtFlags, FileType, Mode, OFlags, RenameFlags, ResolveFlags};

/// The directory under DEST that holds partial files.
pub const STAGING_DIR: &str = ".atou-staging";

/// `atou serve`'s own file in the staging directory: the newest hello
/// timestamp of each client key (`crate::io::hello_timestamps`). A
/// partial file, staged symlink or record of parts is named by the
/// server, 32 hex digits of a hash and `.part`, `.link` or `.chunks`
/// (`transfer::dest::staged_name`), never by a sender, so no transfer can
/// create, replace or remove this name; the staging cleaner leaves it.
pub const HELLO_TIMESTAMPS: &str = "hello-timestamps";
/// Where [`HELLO_TIMESTAMPS`] is written before it is renamed into place
/// ([`DestDir::replace_staged_state`]).
const HELLO_TIMESTAMPS_NEW: &str = "hello-timestamps.new";

/// Whether `name` in the staging directory is the server's own state
/// rather than a transfer's leftovers.
pub fn is_servers_own(name: &[u8]) -> bool {
    name == HELLO_TIMESTAMPS.as_bytes() || name == HELLO_TIMESTAMPS_NEW.as_bytes()
}

/// What a name in a directory is, looked at without following it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    Nothing,
    Dir,
    File { size: u64, mtime: i64 },
    Symlink,
    Other,
}

/// How names are resolved beneath DEST.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolve {
    /// `openat2` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS` (Linux 5.6+).
    Openat2,
    /// One `openat(O_NOFOLLOW | O_DIRECTORY)` per component.
    Walk,
}

/// DEST, held open, and its private staging directory.
#[derive(Debug)]
pub struct DestDir {
    root: OwnedFd,
    /// `None` only for a dry run's DEST without a staging directory
    /// ([`DestDir::open_unchanged`]): nothing is staged there.
    staging: Option<OwnedFd>,
    path: PathBuf,
    /// What messages call DEST: its path, or for a server, whose
    /// messages go to its peers, a name that does not show the host's
    /// file system.
    shown_as: Option<PathBuf>,
    resolve: Resolve,
}

fn to_io(e: rustix::io::Errno) -> io::Error {
    io::Error::from_raw_os_error(e.raw_os_error())
}

fn found(st: &rfs::Stat) -> Found {
    match FileType::from_raw_mode(st.st_mode) {
        FileType::Directory => Found::Dir,
        FileType::RegularFile => Found::File {
            size: st.st_size as u64,
            mtime: st.st_mtime,
        },
        FileType::Symlink => Found::Symlink,
        _ => Found::Other,
    }
}

const DIR_FLAGS: OFlags = OFlags::DIRECTORY
    .union(OFlags::RDONLY)
    .union(OFlags::CLOEXEC)
    .union(OFlags::NOFOLLOW);

impl DestDir {
    /// Opens DEST (the operator's own choice, so a symlink there is taken as
    /// given) and creates or opens its staging directory, which must be a
    /// real directory owned by this user and closed to others.
    pub fn open(path: &Path) -> io::Result<DestDir> {
        Self::open_with_staging(path, true)
    }

    /// As [`DestDir::open`], resolving names the given way (tests use this
    /// to run the fallback walk on kernels that have `openat2`).
    pub fn open_with(path: &Path, resolve: Resolve) -> io::Result<DestDir> {
        let root: OwnedFd = File::open(path)?.into();
        Self::with_resolve(root, path, resolve)
    }

    /// As [`DestDir::open`] for a dry run: DEST is left exactly as it is,
    /// its staging directory opened if there is one, not created.
    pub fn open_unchanged(path: &Path) -> io::Result<DestDir> {
        Self::open_with_staging(path, false)
    }

    fn open_with_staging(path: &Path, create: bool) -> io::Result<DestDir> {
        let root: OwnedFd = File::open(path)?.into();
        if FileType::from_raw_mode(rfs::fstat(&root).map_err(to_io)?.st_mode) != FileType::Directory
        {
            return Err(io::Error::from_raw_os_error(libc::ENOTDIR));
        }
        let resolve = match rfs::openat2(
            &root,
            ".",
            DIR_FLAGS,
            Mode::empty(),
            ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS,
        ) {
            Ok(_) => Resolve::Openat2,
            Err(_) => Resolve::Walk,
        };
        Self::with_resolve_staging(root, path, resolve, create)
    }

    fn with_resolve(root: OwnedFd, path: &Path, resolve: Resolve) -> io::Result<DestDir> {
        Self::with_resolve_staging(root, path, resolve, true)
    }

    fn with_resolve_staging(
        root: OwnedFd,
        path: &Path,
        resolve: Resolve,
        create: bool,
    ) -> io::Result<DestDir> {
        if !create && look(&root, STAGING_DIR.as_bytes())? == Found::Nothing {
            return Ok(DestDir {
                root,
                staging: None,
                path: path.to_path_buf(),
                shown_as: None,
                resolve,
            });
        }
        match rfs::mkdirat(&root, STAGING_DIR, Mode::from_raw_mode(0o700)) {
            Ok(()) => {}
            Err(e) if e == rustix::io::Errno::EXIST => {}
            Err(e) => return Err(to_io(e)),
        }
        let staging = rfs::openat(&root, STAGING_DIR, DIR_FLAGS, Mode::empty()).map_err(to_io)?;
        let st = rfs::fstat(&staging).map_err(to_io)?;
        if st.st_uid != rustix::process::geteuid().as_raw() || st.st_mode & 0o077 != 0 {
            return Err(io::Error::other(format!(
                "{} is not private to this user (it must be a directory of ours with mode 0700); remove it",
                path.join(STAGING_DIR).display()
            )));
        }
        Ok(DestDir {
            root,
            staging: Some(staging),
            path: path.to_path_buf(),
            shown_as: None,
            resolve,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn resolve(&self) -> Resolve {
        self.resolve
    }

    /// Messages call DEST `name` rather than its path.
    pub fn shown_as(mut self, name: impl Into<PathBuf>) -> DestDir {
        self.shown_as = Some(name.into());
        self
    }

    /// `rel` under DEST, for messages.
    pub fn shown(&self, rel: &[u8]) -> PathBuf {
        let root = self.shown_as.as_ref().unwrap_or(&self.path);
        if rel.is_empty() {
            root.clone()
        } else {
            root.join(std::ffi::OsStr::from_bytes(rel))
        }
    }

    /// Opens directory `rel` (`b""` for DEST itself) beneath DEST; any
    /// symlink on the way is an error (`ELOOP`), never followed.
    pub fn open_dir(&self, rel: &[u8]) -> io::Result<OwnedFd> {
        let rel = if rel.is_empty() { &b"."[..] } else { rel };
        match self.resolve {
            // No O_NOFOLLOW here: RESOLVE_NO_SYMLINKS covers the last
            // component too, and says ELOOP rather than ENOTDIR.
            Resolve::Openat2 => rfs::openat2(
                &self.root,
                rel,
                DIR_FLAGS.difference(OFlags::NOFOLLOW),
                Mode::empty(),
                ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
            )
            .map_err(to_io),
            Resolve::Walk => {
                let mut dir =
                    rfs::openat(&self.root, ".", DIR_FLAGS, Mode::empty()).map_err(to_io)?;
                for c in rel
                    .split(|&b| b == b'/')
                    .filter(|c| !c.is_empty() && *c != b".")
                {
                    if c == b".." {
                        return Err(io::Error::from_raw_os_error(libc::EXDEV));
                    }
                    // O_NOFOLLOW | O_DIRECTORY: a symlink fails with ENOTDIR
                    // or ELOOP, so the walk never leaves DEST.
                    dir = rfs::openat(&dir, c, DIR_FLAGS, Mode::empty()).map_err(|e| {
                        if e == rustix::io::Errno::NOTDIR
                            && matches!(look(&dir, c), Ok(Found::Symlink))
                        {
                            io::Error::from_raw_os_error(libc::ELOOP)
                        } else {
                            to_io(e)
                        }
                    })?;
                }
                Ok(dir)
            }
        }
    }

    /// Creates directory `name` in `dir` with `mode`; `Ok(false)` if a
    /// directory (not a symlink to one) is already there.
    pub fn make_dir(&self, dir: &OwnedFd, name: &[u8], mode: u32) -> io::Result<bool> {
        match rfs::mkdirat(dir, name, Mode::from_raw_mode(mode)) {
            Ok(()) => Ok(true),
            Err(e) if e == rustix::io::Errno::EXIST => match look(dir, name)? {
                Found::Dir => Ok(false),
                Found::Symlink => Err(io::Error::from_raw_os_error(libc::ELOOP)),
                _ => Err(io::Error::from_raw_os_error(libc::ENOTDIR)),
            },
            Err(e) => Err(to_io(e)),
        }
    }

    /// The staging directory; a dry run's DEST may have none.
    fn staging(&self) -> io::Result<&OwnedFd> {
        self.staging
            .as_ref()
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))
    }

    /// A partial file, created new: `O_CREAT | O_EXCL | O_NOFOLLOW`, mode 0600.
    pub fn create_staged(&self, name: &str) -> io::Result<File> {
        rfs::openat(
            self.staging()?,
            name,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )
        .map(File::from)
        .map_err(to_io)
    }

    /// A file in the staging directory that several transfers share (a
    /// file split across shards, and the record of its parts): opened for
    /// reading and writing, created (mode 0600) if missing, never through
    /// a symlink.
    pub fn open_shared_staged(&self, name: &str) -> io::Result<File> {
        rfs::openat(
            self.staging()?,
            name,
            OFlags::RDWR | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )
        .map(File::from)
        .map_err(to_io)
    }

    /// A partial file that exists, for reading or writing.
    pub fn open_staged(&self, name: &str, write: bool) -> io::Result<File> {
        let access = if write { OFlags::RDWR } else { OFlags::RDONLY };
        rfs::openat(
            self.staging()?,
            name,
            access | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map(File::from)
        .map_err(to_io)
    }

    /// The server's own file `name` in the staging directory, read whole
    /// if it is a regular file of at most `max_len` bytes; `None` if
    /// there is none. Never through a symlink (`ELOOP`), and a FIFO
    /// planted there does not block the open (`O_NONBLOCK`, then refused
    /// as not a regular file).
    pub fn read_staged_state(&self, name: &str, max_len: u64) -> io::Result<Option<Vec<u8>>> {
        use std::io::Read;
        let file = match rfs::openat(
            self.staging()?,
            name,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => File::from(fd),
            Err(e) if e == rustix::io::Errno::NOENT => return Ok(None),
            Err(e) => return Err(to_io(e)),
        };
        let st = rfs::fstat(&file).map_err(to_io)?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            return Err(io::Error::other("not a regular file"));
        }
        if st.st_size as u64 > max_len {
            return Err(io::Error::other(format!(
                "{} bytes, more than the {max_len} it can hold",
                st.st_size
            )));
        }
        let mut bytes = Vec::with_capacity(st.st_size as usize);
        // Bounded again: the file may have grown since the fstat.
        file.take(max_len + 1).read_to_end(&mut bytes)?;
        if bytes.len() as u64 > max_len {
            return Err(io::Error::other(format!(
                "more than the {max_len} bytes it can hold"
            )));
        }
        Ok(Some(bytes))
    }

    /// Replaces the server's own file `name` in the staging directory
    /// with `bytes`, atomically and durably: written to a new file
    /// beside it (mode 0600, `O_EXCL | O_NOFOLLOW`), synced, renamed over
    /// `name`, and the directory synced, so that a crash at any point
    /// leaves the old contents or the new, never a mix (the rename is
    /// atomic, POSIX rename(2)), and a power loss after the return keeps
    /// the new.
    pub fn replace_staged_state(&self, name: &str, bytes: &[u8]) -> io::Result<()> {
        use std::io::Write;
        let staging = self.staging()?;
        let new = format!("{name}.new");
        // Left by a crash mid-write: its contents are not wanted.
        match rfs::unlinkat(staging, new.as_str(), AtFlags::empty()) {
            Ok(()) => {}
            Err(e) if e == rustix::io::Errno::NOENT => {}
            Err(e) => return Err(to_io(e)),
        }
        let mut file = File::from(
            rfs::openat(
                staging,
                new.as_str(),
                OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o600),
            )
            .map_err(to_io)?,
        );
        let written = file.write_all(bytes).and_then(|()| file.sync_all());
        if let Err(e) = written {
            let _ = rfs::unlinkat(staging, new.as_str(), AtFlags::empty());
            return Err(e);
        }
        rfs::renameat(staging, new.as_str(), staging, name).map_err(to_io)?;
        rfs::fsync(staging).map_err(to_io)
    }

    pub fn look_staged(&self, name: &str) -> io::Result<Found> {
        match &self.staging {
            Some(staging) => look(staging, name.as_bytes()),
            None => Ok(Found::Nothing),
        }
    }

    pub fn remove_staged(&self, name: &str) -> io::Result<()> {
        rfs::unlinkat(self.staging()?, name, AtFlags::empty()).map_err(to_io)
    }

    /// Creates a symlink to `target` in the staging directory; nothing
    /// here ever follows it.
    pub fn symlink_staged(&self, target: &[u8], name: &str) -> io::Result<()> {
        match rfs::unlinkat(self.staging()?, name, AtFlags::empty()) {
            Ok(()) => {}
            Err(e) if e == rustix::io::Errno::NOENT => {}
            Err(e) => return Err(to_io(e)),
        }
        rfs::symlinkat(target, self.staging()?, name).map_err(to_io)
    }

    /// Makes `staged` in the staging directory another name of the
    /// regular file `name` in `dir` (link(2), never following a symlink);
    /// anything else there is refused, the staged name removed.
    pub fn hard_link_staged(&self, dir: &OwnedFd, name: &[u8], staged: &str) -> io::Result<()> {
        let staging = self.staging()?;
        match rfs::unlinkat(staging, staged, AtFlags::empty()) {
            Ok(()) => {}
            Err(e) if e == rustix::io::Errno::NOENT => {}
            Err(e) => return Err(to_io(e)),
        }
        rfs::linkat(dir, name, staging, staged, AtFlags::empty()).map_err(to_io)?;
        let st = rfs::statat(staging, staged, AtFlags::SYMLINK_NOFOLLOW).map_err(to_io)?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            let _ = rfs::unlinkat(staging, staged, AtFlags::empty());
            return Err(io::Error::other("not a regular file"));
        }
        Ok(())
    }

    /// Moves a staged file or symlink to `name` in `dir`. Without
    /// `replace`, an entry already there is never replaced
    /// (`RENAME_NOREPLACE`: no check-then-rename race). A symlink already at
    /// `name` is replaced as a name; its target is never touched.
    pub fn place(&self, staged: &str, dir: &OwnedFd, name: &[u8], replace: bool) -> io::Result<()> {
        let flags = if replace {
            RenameFlags::empty()
        } else {
            RenameFlags::NOREPLACE
        };
        rfs::renameat_with(self.staging()?, staged, dir, name, flags).map_err(to_io)
    }

    /// Gives the staged entry `name` (a symlink, before it takes its
    /// name) its owner and group, not following it: in the private staging
    /// directory no one else can swap it meanwhile.
    pub fn set_staged_owner(&self, name: &str, ids: Ids) -> io::Result<()> {
        let (uid, gid) = ids.rustix();
        rfs::chownat(self.staging()?, name, uid, gid, AtFlags::SYMLINK_NOFOLLOW).map_err(to_io)
    }

    /// Sets an extended attribute of the staged entry `name` (a symlink,
    /// before it takes its name), not following it.
    pub fn set_staged_xattr(&self, name: &str, attr: &[u8], value: &[u8]) -> io::Result<()> {
        super::xattr::set_at(self.staging()?, name, attr, value)
    }

    /// The regular files in the staging directory whose names end in
    /// `suffix`, with their mtimes (seconds since the epoch); nothing is
    /// followed, and names that are not UTF-8 (none of atou's) are left
    /// out.
    pub fn staged_files_ending(&self, suffix: &str) -> io::Result<Vec<(String, i64)>> {
        let Some(staging) = &self.staging else {
            return Ok(Vec::new());
        };
        let mut found = Vec::new();
        for entry in rfs::Dir::read_from(staging).map_err(to_io)? {
            let entry = entry.map_err(to_io)?;
            let Ok(name) = entry.file_name().to_str() else {
                continue;
            };
            if !name.ends_with(suffix) {
                continue;
            }
            if let Ok(Found::File { mtime, .. }) = look(staging, name.as_bytes()) {
                found.push((name.to_string(), mtime));
            }
        }
        Ok(found)
    }

    /// Removes the partial files, staged symlinks, records of parts and
    /// claims in the staging directory that have not changed since
    /// `before`: what transfers abandoned long ago left (a transfer in
    /// progress writes its partial file as data comes). Returns the
    /// entries and bytes removed. Nothing else is touched
    /// ([`HELLO_TIMESTAMPS`] included), and nothing is followed.
    pub fn remove_staged_unchanged_since(&self, before: SystemTime) -> io::Result<(u64, u64)> {
        let Some(staging) = &self.staging else {
            return Ok((0, 0));
        };
        let before = before
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
        let (mut entries, mut bytes) = (0, 0);
        for entry in rfs::Dir::read_from(staging).map_err(to_io)? {
            let entry = entry.map_err(to_io)?;
            let name = entry.file_name();
            // The server's own state is no transfer's leftover, however
            // long no client has come.
            if matches!(name.to_bytes(), b"." | b"..") || is_servers_own(name.to_bytes()) {
                continue;
            }
            let Ok(st) = rfs::statat(staging, name, AtFlags::SYMLINK_NOFOLLOW) else {
                continue;
            };
            let kind = FileType::from_raw_mode(st.st_mode);
            if !matches!(kind, FileType::RegularFile | FileType::Symlink) || st.st_mtime >= before {
                continue;
            }
            if rfs::unlinkat(staging, name, AtFlags::empty()).is_ok() {
                entries += 1;
                bytes += st.st_blocks as u64 * 512;
            }
        }
        Ok((entries, bytes))
    }

    /// Removes the staging directory if it holds nothing (no partial file
    /// to resume); only when no other transfer can be using it.
    pub fn remove_staging_if_empty(&self) {
        let _ = rfs::unlinkat(&self.root, STAGING_DIR, AtFlags::REMOVEDIR);
    }

    /// The size of DEST's file system in bytes (statvfs: blocks times
    /// fragment size).
    pub fn filesystem_size(&self) -> io::Result<u64> {
        let st = rfs::fstatvfs(&self.root).map_err(to_io)?;
        Ok(st.f_blocks.saturating_mul(st.f_frsize))
    }
}

/// What `name` in `dir` is, not following it.
pub fn look(dir: &impl AsFd, name: &[u8]) -> io::Result<Found> {
    match rfs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(found(&st)),
        Err(e) if e == rustix::io::Errno::NOENT => Ok(Found::Nothing),
        Err(e) => Err(to_io(e)),
    }
}

/// The names in directory `dir` (not `.` and `..`), each with what it is,
/// looked at without following it; a name gone meanwhile is left out.
pub fn entries(dir: &OwnedFd) -> io::Result<Vec<(Vec<u8>, Found)>> {
    let mut names = Vec::new();
    for entry in rfs::Dir::read_from(dir).map_err(to_io)? {
        let entry = entry.map_err(to_io)?;
        let name = entry.file_name().to_bytes();
        if matches!(name, b"." | b"..") {
            continue;
        }
        match look(dir, name)? {
            Found::Nothing => {}
            found => names.push((name.to_vec(), found)),
        }
    }
    Ok(names)
}

/// Removes `name` from `dir`, never following it: an empty directory with
/// `is_dir`, anything else but a directory without. A name already gone
/// is `Ok`.
pub fn remove(dir: &OwnedFd, name: &[u8], is_dir: bool) -> io::Result<()> {
    let flags = if is_dir {
        AtFlags::REMOVEDIR
    } else {
        AtFlags::empty()
    };
    match rfs::unlinkat(dir, name, flags) {
        Err(e) if e == rustix::io::Errno::NOENT => Ok(()),
        r => r.map_err(to_io),
    }
}

/// The (device, inode) of `name` in `dir`, not following it.
pub fn inode(dir: &impl AsFd, name: &[u8]) -> io::Result<(u64, u64)> {
    let st = rfs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW).map_err(to_io)?;
    Ok((st.st_dev, st.st_ino))
}

/// The target of symlink `name` in `dir`.
pub fn read_link(dir: &impl AsFd, name: &[u8]) -> io::Result<Vec<u8>> {
    rfs::readlinkat(dir, name, Vec::new())
        .map(|c| c.into_bytes())
        .map_err(to_io)
}

/// Opens regular file `name` in `dir` for reading, not following a symlink.
pub fn open_file(dir: &impl AsFd, name: &[u8]) -> io::Result<File> {
    rfs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map(File::from)
    .map_err(to_io)
}

/// Sets a directory's mode and mtime through its descriptor.
pub fn set_dir_attrs(dir: OwnedFd, mode: u32, mtime: SystemTime) -> io::Result<()> {
    rfs::fchmod(&dir, Mode::from_raw_mode(mode)).map_err(to_io)?;
    set_dir_mtime(dir, mtime)
}

/// The owner and group an entry gets (`-o`, `-g`); `None`: left as
/// created.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Ids {
    pub uid: Option<u32>,
    pub gid: Option<u32>,
}

impl Ids {
    fn rustix(self) -> (Option<rfs::Uid>, Option<rfs::Gid>) {
        (
            self.uid.map(rfs::Uid::from_raw),
            self.gid.map(rfs::Gid::from_raw),
        )
    }
}

/// Gives the open file or directory `fd` its owner and group; before its
/// mode, since a change of owner clears setuid and setgid bits.
pub fn set_owner(fd: &impl AsFd, ids: Ids) -> io::Result<()> {
    let (uid, gid) = ids.rustix();
    rfs::fchown(fd, uid, gid).map_err(to_io)
}

/// Sets a directory's mtime alone: its mode is not ours to change.
pub fn set_dir_mtime(dir: OwnedFd, mtime: SystemTime) -> io::Result<()> {
    File::from(dir).set_times(std::fs::FileTimes::new().set_modified(mtime))
}

/// Syncs a directory (after a rename into it, with `fsync`).
pub fn sync_dir(dir: &OwnedFd) -> io::Result<()> {
    rfs::fsync(dir).map_err(to_io)
}

/// Sets a file's mode exactly (no umask applies to fchmod).
/// Whether `len` bytes at `offset` in `file` are a hole: no data there
/// (`SEEK_DATA` finds none before their end). A file system without
/// `SEEK_DATA` reports data everywhere, which is only slower.
pub fn is_hole(file: &File, offset: u64, len: usize) -> io::Result<bool> {
    match rfs::seek(file, rfs::SeekFrom::Data(offset)) {
        Ok(data) => Ok(data >= offset + len as u64),
        // No data at or after offset.
        Err(e) if e == rustix::io::Errno::NXIO => Ok(true),
        Err(e) => Err(to_io(e)),
    }
}

pub fn set_mode(file: &File, mode: u32) -> io::Result<()> {
    rfs::fchmod(file, Mode::from_raw_mode(mode)).map_err(to_io)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// A directory of the test's own; kept afterwards, as a failed
    /// test's files are wanted.
    fn scratch(name: &str) -> PathBuf {
        tempfile::Builder::new()
            .prefix(&format!("atou-destdir-{name}-"))
            .tempdir()
            .unwrap()
            .keep()
    }

    /// A symlink anywhere on the way, to a directory outside DEST or
    /// inside it, is refused by both ways of resolving.
    #[test]
    fn no_symlink_on_the_way_is_followed_either_way() {
        let base = scratch("walk");
        let dest = base.join("dest");
        let outside = base.join("outside");
        std::fs::create_dir_all(dest.join("real/deeper")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        symlink(&outside, dest.join("out")).unwrap();
        symlink("real", dest.join("inner")).unwrap();
        for resolve in [Resolve::Openat2, Resolve::Walk] {
            let d = DestDir::open_with(&dest, resolve).unwrap();
            if resolve == Resolve::Openat2 && DestDir::open(&dest).unwrap().resolve() != resolve {
                continue; // this kernel has no openat2
            }
            assert!(d.open_dir(b"real/deeper").is_ok(), "{resolve:?}");
            for bad in [&b"out"[..], b"inner", b"inner/deeper", b"out/x"] {
                let e = d.open_dir(bad).unwrap_err();
                assert!(
                    matches!(
                        e.raw_os_error(),
                        Some(libc::ELOOP) | Some(libc::ENOTDIR) | Some(libc::ENOENT)
                    ),
                    "{resolve:?} {}: {e}",
                    String::from_utf8_lossy(bad)
                );
            }
            assert!(d.open_dir(b"..").is_err(), "{resolve:?}: .. leaves DEST");
        }
        std::fs::remove_dir_all(&base).unwrap();
    }

    /// Another user's (or a world-writable) staging directory is refused.
    #[test]
    fn a_staging_directory_open_to_others_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dest = scratch("staging");
        std::fs::create_dir(dest.join(STAGING_DIR)).unwrap();
        std::fs::set_permissions(
            dest.join(STAGING_DIR),
            std::fs::Permissions::from_mode(0o777),
        )
        .unwrap();
        let e = DestDir::open(&dest).unwrap_err().to_string();
        assert!(e.contains("not private"), "{e}");
        std::fs::remove_dir_all(dest.join(STAGING_DIR)).unwrap();
        symlink("/tmp", dest.join(STAGING_DIR)).unwrap();
        assert!(DestDir::open(&dest).is_err(), "a symlinked staging dir");
        std::fs::remove_dir_all(&dest).unwrap();
    }

    /// A dry run's DEST is opened as it is: no staging directory is made,
    /// nothing is staged there (every staged write fails), and one that
    /// exists is opened with the same privacy check.
    #[test]
    fn a_dry_run_opens_dest_without_making_its_staging_directory() {
        let dest = scratch("unchanged");
        let d = DestDir::open_unchanged(&dest).unwrap();
        assert!(!dest.join(STAGING_DIR).exists());
        assert_eq!(d.look_staged("x").unwrap(), Found::Nothing);
        assert!(d.create_staged("x").is_err());
        assert!(d.open_staged("x", true).is_err());
        assert!(!dest.join(STAGING_DIR).exists());
        drop(d);
        DestDir::open(&dest).unwrap();
        std::fs::write(dest.join(STAGING_DIR).join("part"), b"p").unwrap();
        let d = DestDir::open_unchanged(&dest).unwrap();
        assert!(matches!(
            d.look_staged("part").unwrap(),
            Found::File { size: 1, .. }
        ));
        use std::os::unix::fs::PermissionsExt;
        let open = std::fs::Permissions::from_mode(0o777);
        std::fs::set_permissions(dest.join(STAGING_DIR), open).unwrap();
        assert!(DestDir::open_unchanged(&dest).is_err(), "not private");
        std::fs::remove_dir_all(&dest).unwrap();
    }

    /// The server's own state file is replaced whole (no `.new` left,
    /// mode 0600), read back only as a regular file of bounded size, never
    /// through a symlink at either name, without blocking on a FIFO, and
    /// the staging cleaner leaves it however old it is.
    #[test]
    fn the_servers_own_state_is_replaced_whole_and_read_only_as_a_regular_file() {
        use std::os::unix::fs::PermissionsExt;
        let base = scratch("state");
        let dest = base.join("dest");
        std::fs::create_dir_all(&dest).unwrap();
        let victim = base.join("victim");
        std::fs::write(&victim, b"keep").unwrap();
        let d = DestDir::open(&dest).unwrap();
        let staging = dest.join(STAGING_DIR);
        let new = format!("{HELLO_TIMESTAMPS}.new");
        assert!(is_servers_own(new.as_bytes()));
        assert_eq!(d.read_staged_state(HELLO_TIMESTAMPS, 100).unwrap(), None);
        d.replace_staged_state(HELLO_TIMESTAMPS, b"one").unwrap();
        // A crash mid-write left the new name, here as a symlink out.
        symlink(&victim, staging.join(&new)).unwrap();
        d.replace_staged_state(HELLO_TIMESTAMPS, b"two!").unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
        assert!(!staging.join(&new).exists() && staging.join(&new).symlink_metadata().is_err());
        assert_eq!(
            d.read_staged_state(HELLO_TIMESTAMPS, 100).unwrap().unwrap(),
            b"two!"
        );
        let table = staging.join(HELLO_TIMESTAMPS);
        let mode = std::fs::metadata(&table).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let e = d.read_staged_state(HELLO_TIMESTAMPS, 3).unwrap_err();
        assert!(e.to_string().contains("more than the 3"), "{e}");

        // However old, the cleaner leaves it; a partial file as old goes.
        let old = std::time::SystemTime::now() - std::time::Duration::from_secs(86_400);
        let part = staging.join("0123456789abcdef0123456789abcdef.part");
        std::fs::write(&part, b"p").unwrap();
        for f in [&table, &part] {
            let f = std::fs::File::options().write(true).open(f).unwrap();
            f.set_times(std::fs::FileTimes::new().set_modified(old))
                .unwrap();
        }
        let later = std::time::SystemTime::now();
        assert_eq!(d.remove_staged_unchanged_since(later).unwrap().0, 1);
        assert!(table.is_file() && !part.exists());

        std::fs::remove_file(&table).unwrap();
        symlink(&victim, &table).unwrap();
        let e = d.read_staged_state(HELLO_TIMESTAMPS, 100).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ELOOP), "{e}");
        std::fs::remove_file(&table).unwrap();
        rfs::mknodat(
            d.staging().unwrap(),
            HELLO_TIMESTAMPS,
            FileType::Fifo,
            Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        let e = d.read_staged_state(HELLO_TIMESTAMPS, 100).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
        std::fs::remove_dir_all(&base).unwrap();
    }

    /// Without replace, an existing name is never clobbered; with it, a
    /// symlink at the name is replaced and its target left alone.
    #[test]
    fn place_replaces_only_when_told_and_never_through_a_symlink() {
        let base = scratch("place");
        let dest = base.join("dest");
        std::fs::create_dir_all(&dest).unwrap();
        std::fs::write(base.join("victim"), b"keep").unwrap();
        symlink(base.join("victim"), dest.join("x")).unwrap();
        let d = DestDir::open(&dest).unwrap();
        let root = d.open_dir(b"").unwrap();
        use std::io::Write;
        d.create_staged("s1").unwrap().write_all(b"new").unwrap();
        assert_eq!(
            d.place("s1", &root, b"x", false)
                .unwrap_err()
                .raw_os_error(),
            Some(libc::EEXIST)
        );
        d.place("s1", &root, b"x", true).unwrap();
        assert_eq!(std::fs::read(dest.join("x")).unwrap(), b"new");
        assert_eq!(std::fs::read(base.join("victim")).unwrap(), b"keep");
        assert!(d.create_staged("s2").is_ok());
        assert!(d.create_staged("s2").is_err(), "O_EXCL");
        std::fs::remove_dir_all(&base).unwrap();
    }
}

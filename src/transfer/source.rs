//! The sender's side of the file system: sources are walked and opened
//! relative to directory descriptors, never by a path a local user could
//! change between two system calls (the rsync CVE-2024-12747 class).
//!
//! The walk ([`super::manifest::walk`]) looks at each entry through an
//! `O_PATH` descriptor opened beneath its parent's, without following a
//! symlink (unless `--follow`), and records each file's [`Stamp`]. To
//! read a file, [`Sources`] walks down from the source the user named
//! the same way, opens it `O_NOFOLLOW`, checks it is the inode the walk
//! saw (dev, ino) and unchanged (size, mtime, ctime), reads every chunk
//! of the round from that one descriptor, and checks again after each
//! read. A file that changed fails the transfer, naming it, as GNU tar
//! says "file changed as we read it": never "every file verified".

use std::fs::{File, Metadata};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rustix::fs::{Mode, OFlags};

use super::hash::CHUNK_SIZE;
use super::manifest::RelPath;
use super::{Change, Error};

/// What identifies a file and tells whether it changed: compared after
/// the walk, at the open and after every read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    pub mtime: (i64, i64),
    pub ctime: (i64, i64),
}

impl Stamp {
    pub fn of(md: &Metadata) -> Stamp {
        Stamp {
            dev: md.dev(),
            ino: md.ino(),
            size: md.size(),
            mtime: (md.mtime(), md.mtime_nsec()),
            ctime: (md.ctime(), md.ctime_nsec()),
        }
    }

    fn same_inode(&self, other: &Stamp) -> bool {
        (self.dev, self.ino) == (other.dev, other.ino)
    }
}

fn flags(follow: bool) -> OFlags {
    let base = OFlags::CLOEXEC | OFlags::NOCTTY;
    if follow {
        base
    } else {
        base | OFlags::NOFOLLOW
    }
}

/// An `O_PATH` descriptor for `name` beneath `parent`, or for the path
/// `top` itself when there is no parent; a symlink is the link itself
/// unless `follow`. (A `File` only to reach fstat: it cannot be read.)
pub(crate) fn open_entry(
    parent: Option<&File>,
    top: &Path,
    name: &Path,
    follow: bool,
) -> io::Result<File> {
    let how = flags(follow) | OFlags::PATH;
    let fd = match parent {
        Some(dir) => rustix::fs::openat(dir, name, how, Mode::empty())?,
        None => rustix::fs::open(top, how, Mode::empty())?,
    };
    Ok(File::from(fd))
}

/// The names in the directory `dir` (an `O_PATH` descriptor of it), "."
/// and ".." left out.
pub(crate) fn list_dir(dir: &File) -> io::Result<Vec<Vec<u8>>> {
    let fd = rustix::fs::openat(
        dir,
        ".",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let mut names = Vec::new();
    for entry in rustix::fs::Dir::new(fd)? {
        let name = entry?.file_name().to_bytes().to_vec();
        if name != b"." && name != b".." {
            names.push(name);
        }
    }
    Ok(names)
}

/// The target of the symlink `link` (an `O_PATH` descriptor of it).
pub(crate) fn read_link(link: &File) -> io::Result<Vec<u8>> {
    Ok(rustix::fs::readlinkat(link.as_fd(), "", Vec::new())?.into_bytes())
}

/// Where a file is: the source the user named and the components below
/// it, with what the walk saw.
#[derive(Debug, Clone)]
pub(crate) struct SourceSpec {
    /// The source as named by the user (the walk's top).
    pub top: Arc<PathBuf>,
    /// Its path in the manifest, whose first component is the top's.
    pub path: RelPath,
    /// Where it is, for messages (shown escaped: the tree may be hostile).
    pub shown: PathBuf,
    pub stamp: Stamp,
    pub follow: bool,
}

impl SourceSpec {
    /// Opens the file beneath its top, one component at a time, each a
    /// directory and none a symlink (unless `follow`), and checks that it
    /// is the file the walk saw, unchanged.
    fn open(&self) -> Result<File, Error> {
        let opened = open_beneath(
            &self.top,
            &self.path,
            flags(self.follow) | OFlags::RDONLY | OFlags::NONBLOCK,
        );
        let fd = opened.map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) | Some(libc::ENOTDIR) => self.changed(Change::Symlinked),
            Some(libc::ENOENT) => self.changed(Change::Removed),
            _ => self.unreadable("open", e),
        })?;
        let file = File::from(fd);
        let now = self.stamp_of(&file)?;
        if !now.same_inode(&self.stamp) {
            return Err(self.changed(Change::Replaced));
        }
        self.unchanged(now)?;
        Ok(file)
    }

    fn stamp_of(&self, file: &File) -> Result<Stamp, Error> {
        let md = file.metadata().map_err(|e| self.unreadable("read", e))?;
        if !md.is_file() {
            return Err(self.changed(Change::NotAFile));
        }
        Ok(Stamp::of(&md))
    }

    fn unchanged(&self, now: Stamp) -> Result<(), Error> {
        if now == self.stamp {
            return Ok(());
        }
        Err(self.changed(Change::Modified))
    }

    fn changed(&self, change: Change) -> Error {
        Error::Changed {
            path: self.shown.clone(),
            change,
        }
    }

    fn unreadable(&self, action: &'static str, source: io::Error) -> Error {
        Error::Unreadable {
            action,
            path: self.shown.clone(),
            source,
        }
    }
}

/// Opens `path` (a manifest path, whose first component is the top's)
/// beneath `top`, one component at a time, each a directory and none a
/// symlink unless `how` follows, the last with `how`.
fn open_beneath(top: &Path, path: &RelPath, how: OFlags) -> io::Result<OwnedFd> {
    let below: Vec<&[u8]> = path.components().skip(1).collect();
    let Some((last, dirs)) = below.split_last() else {
        return Ok(rustix::fs::open(top, how, Mode::empty())?);
    };
    let follow = !how.contains(OFlags::NOFOLLOW);
    let dir_how = flags(follow) | OFlags::PATH | OFlags::DIRECTORY;
    let mut dir = rustix::fs::open(top, dir_how, Mode::empty())?;
    for name in dirs {
        dir = rustix::fs::openat(&dir, as_path(name), dir_how, Mode::empty())?;
    }
    Ok(rustix::fs::openat(&dir, as_path(last), how, Mode::empty())?)
}

/// An `O_PATH` descriptor of the entry the walk saw at `path` beneath
/// `top` (its device and inode `id`), opened as [`SourceSpec`] opens a
/// file: `None` if something else is there now.
pub(crate) fn open_walked(
    top: &Path,
    path: &RelPath,
    follow: bool,
    id: (u64, u64),
) -> io::Result<Option<File>> {
    let file = File::from(open_beneath(top, path, flags(follow) | OFlags::PATH)?);
    let md = file.metadata()?;
    Ok(((md.dev(), md.ino()) == id).then_some(file))
}

fn as_path(name: &[u8]) -> &Path {
    use std::os::unix::ffi::OsStrExt;
    Path::new(std::ffi::OsStr::from_bytes(name))
}

/// A file opened for the chunks one round reads from it.
#[derive(Default)]
struct Open {
    file: Option<Arc<File>>,
    /// Chunk reads scheduled and not yet done.
    pending: u64,
}

/// The files being sent, by file number: each opened once for the reads
/// scheduled with [`Sources::expect`] and closed after the last of them.
pub(crate) struct Sources {
    specs: Vec<SourceSpec>,
    open: Mutex<Vec<Open>>,
}

impl Sources {
    pub(crate) fn new(specs: Vec<SourceSpec>) -> Sources {
        let open = specs.iter().map(|_| Open::default()).collect();
        Sources {
            specs,
            open: Mutex::new(open),
        }
    }

    pub(crate) fn size(&self, file: usize) -> u64 {
        self.specs[file].stamp.size
    }

    /// `reads` more chunk reads of `file` are coming: keep it open for them.
    pub(crate) fn expect(&self, file: usize, reads: u64) {
        self.lock()[file].pending += reads;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Open>> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reads chunk `chunk` of `file` into `buf` (its length), from the
    /// file's one descriptor, and checks it did not change meanwhile.
    pub(crate) fn read_chunk(&self, file: usize, chunk: u64, buf: &mut [u8]) -> Result<(), Error> {
        self.read_at(file, chunk * CHUNK_SIZE, buf)
    }

    /// Reads `buf`'s length of `file` from `offset`, as
    /// [`Sources::read_chunk`] does a chunk: one read scheduled.
    pub(crate) fn read_at(&self, file: usize, offset: u64, buf: &mut [u8]) -> Result<(), Error> {
        let spec = &self.specs[file];
        let result = self.with_file(file).and_then(|f| {
            read_exact_at(spec, &f, buf, offset)?;
            spec.unchanged(spec.stamp_of(&f)?)
        });
        let mut open = self.lock();
        let o = &mut open[file];
        o.pending = o.pending.saturating_sub(1);
        if o.pending == 0 || result.is_err() {
            o.file = None;
        }
        result
    }

    /// Reads `buf`'s length of `file` from `offset` outside any round's
    /// schedule (a sample, a compare): the read is scheduled and done, so
    /// the file is closed after it unless a round's reads keep it open.
    pub(crate) fn read_once(&self, file: usize, offset: u64, buf: &mut [u8]) -> Result<(), Error> {
        self.expect(file, 1);
        self.read_at(file, offset, buf)
    }

    /// The file's descriptor, opened now if no reader has it open. The
    /// open runs outside the lock, so readers of different files do not
    /// wait for each other's opens; of two readers that open one file at
    /// once, the first to finish keeps its descriptor.
    fn with_file(&self, file: usize) -> Result<Arc<File>, Error> {
        if let Some(f) = &self.lock()[file].file {
            return Ok(f.clone());
        }
        let opened = Arc::new(self.specs[file].open()?);
        let mut open = self.lock();
        Ok(open[file].file.get_or_insert(opened).clone())
    }

    #[cfg(test)]
    /// Files open now (for tests of the descriptor budget).
    pub(crate) fn open_count(&self) -> usize {
        self.lock().iter().filter(|o| o.file.is_some()).count()
    }
}

fn read_exact_at(spec: &SourceSpec, file: &File, buf: &mut [u8], offset: u64) -> Result<(), Error> {
    let mut at = 0;
    while at < buf.len() {
        match file.read_at(&mut buf[at..], offset + at as u64) {
            Ok(0) => {
                let listed = spec.stamp.size;
                return Err(spec.changed(Change::Shrank { listed }));
            }
            Ok(n) => at += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(spec.unreadable("read", e)),
        }
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::transfer::manifest::{walk, EntryKind};
    use std::fs;

    struct Tmp(PathBuf);

    impl Tmp {
        fn new(name: &str) -> Tmp {
            let dir = tempfile::Builder::new()
                .prefix(&format!("atou-source-{name}-"))
                .tempdir()
                .unwrap()
                .keep();
            Tmp(dir)
        }
    }

    impl Drop for Tmp {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    /// The files of a walk of `src`, as the sender sets them up (the
    /// readers' tests use it too).
    pub(crate) fn sources(src: &Path) -> Sources {
        let specs = walk(&[src.to_path_buf()], false, &Default::default())
            .unwrap()
            .into_iter()
            .filter(|e| matches!(e.entry.kind, EntryKind::File { .. }))
            .map(|e| SourceSpec {
                top: e.top.clone(),
                path: e.entry.path.clone(),
                shown: e.source.clone(),
                stamp: e.stamp.unwrap(),
                follow: false,
            })
            .collect();
        Sources::new(specs)
    }

    fn read(s: &Sources, file: usize, chunk: u64) -> Result<Vec<u8>, String> {
        let len = super::super::hash::chunk_len(s.size(file), chunk);
        let mut buf = vec![0; len];
        s.read_chunk(file, chunk, &mut buf)
            .map(|()| buf)
            .map_err(|e| e.to_string())
    }

    /// Three chunks of one file are read from one descriptor, opened at
    /// the first and closed after the last that was asked for.
    #[test]
    fn a_file_is_opened_once_for_its_chunks_and_closed_after() {
        let tmp = Tmp::new("once");
        let f = tmp.0.join("f");
        fs::write(&f, vec![7u8; 2 * CHUNK_SIZE as usize + 5]).unwrap();
        let s = sources(&f);
        s.expect(0, 3);
        assert_eq!(s.open_count(), 0);
        assert_eq!(read(&s, 0, 0).unwrap().len(), CHUNK_SIZE as usize);
        assert_eq!(s.open_count(), 1);
        assert_eq!(read(&s, 0, 1).unwrap(), vec![7u8; CHUNK_SIZE as usize]);
        assert_eq!(read(&s, 0, 2).unwrap(), vec![7u8; 5]);
        assert_eq!(s.open_count(), 0);
    }

    /// After the walk, a directory above a file is swapped for a symlink
    /// to another directory holding a file of the same name and size: it
    /// is not followed, whatever the link points at.
    #[test]
    fn a_directory_above_a_source_swapped_for_a_symlink_is_not_followed() {
        let tmp = Tmp::new("dirswap");
        let tree = tmp.0.join("tree");
        fs::create_dir_all(tree.join("sub")).unwrap();
        fs::write(tree.join("sub/f"), b"public").unwrap();
        let elsewhere = tmp.0.join("elsewhere");
        fs::create_dir_all(&elsewhere).unwrap();
        fs::write(elsewhere.join("f"), b"secret").unwrap();
        let s = sources(&tree);
        fs::rename(tree.join("sub"), tmp.0.join("sub.real")).unwrap();
        std::os::unix::fs::symlink(&elsewhere, tree.join("sub")).unwrap();
        s.expect(0, 1);
        let err = read(&s, 0, 0).unwrap_err();
        assert!(
            err.contains("tree/sub/f") && err.contains("not followed"),
            "{err}"
        );
        // Even a link back to the very directory is not followed.
        fs::remove_file(tree.join("sub")).unwrap();
        std::os::unix::fs::symlink(tmp.0.join("sub.real"), tree.join("sub")).unwrap();
        s.expect(0, 1);
        assert!(read(&s, 0, 0).unwrap_err().contains("not followed"));
    }

    /// A file whose name holds an escape sequence is named escaped: the
    /// tree may belong to whoever wants to drive the sender's terminal.
    #[test]
    fn a_hostile_name_in_a_message_is_escaped() {
        let tmp = Tmp::new("escape");
        let tree = tmp.0.join("tree");
        fs::create_dir_all(&tree).unwrap();
        fs::write(tree.join("a\x1b[2Jb"), b"x").unwrap();
        let s = sources(&tree);
        fs::remove_file(tree.join("a\x1b[2Jb")).unwrap();
        s.expect(0, 1);
        let err = read(&s, 0, 0).unwrap_err();
        assert!(err.contains("tree/a\\x1b[2Jb was removed"), "{err}");
    }

    /// A file replaced by another (a rename over it: same name, size and
    /// bytes, another inode) is refused; so is one that changed in place.
    #[test]
    fn a_replaced_or_changed_source_is_refused_with_its_name() {
        let tmp = Tmp::new("replaced");
        let tree = tmp.0.join("tree");
        fs::create_dir_all(&tree).unwrap();
        fs::write(tree.join("a"), b"same").unwrap();
        fs::write(tree.join("b"), b"same").unwrap();
        let s = sources(&tree);
        fs::write(tmp.0.join("new"), b"same").unwrap();
        fs::rename(tmp.0.join("new"), tree.join("a")).unwrap();
        s.expect(0, 1);
        let err = read(&s, 0, 0).unwrap_err();
        assert!(err.contains("tree/a was replaced by another file"), "{err}");
        let f = fs::OpenOptions::new()
            .write(true)
            .open(tree.join("b"))
            .unwrap();
        f.write_all_at(b"SAME", 0).unwrap();
        f.set_modified(std::time::SystemTime::UNIX_EPOCH).unwrap();
        s.expect(1, 1);
        let err = read(&s, 1, 0).unwrap_err();
        assert!(
            err.ends_with("tree/b changed while it was being sent; run again"),
            "{err}"
        );
    }
}

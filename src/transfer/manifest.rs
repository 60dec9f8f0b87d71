//! The manifest: every entry of the trees being sent, sent before any data.
//!
//! The receiver decodes and validates it before anything touches its disk,
//! so [`Manifest::decode`] is a security boundary: it never panics, checks
//! every length against the bytes left before reading, allocates at most a
//! small multiple of the input, and names the offending path in every error.
//!
//! # Encoding (all integers big-endian)
//!
//! ```text
//! offset  size  field
//!      0     4  magic b"ATMF"
//!      4     1  version = 1
//!      5     4  entry count (u32, at most MAX_ENTRIES)
//!      9        entries, back to back, each:
//!        +0  1  kind: 1 dir, 2 file, 3 symlink
//!        +1  4  mode (u32, permission bits only: <= 0o7777)
//!        +5  8  mtime seconds (i64, since the Unix epoch)
//!       +13  4  mtime nanoseconds (u32, < 1_000_000_000)
//!       +17  2  path length N (u16)
//!       +19  N  path: '/'-separated bytes (see RelPath)
//!             file:    8  size in bytes (u64)
//!             symlink: 2  target length T (u16), then T target bytes
//! ```
//!
//! Nothing may follow the last entry.
//!
//! # Validity
//!
//! Every path is a valid [`RelPath`]; no path appears twice; every entry's
//! parent is a directory entry listed earlier, so nothing can be placed under
//! a file or a symlink. Symlink targets are stored as given (they may point
//! anywhere): the writer creates them last-level only and never follows them.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::OsStr;
use std::fmt;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use thiserror::Error;

use crate::proto::wire::codec::{Reader, Truncated, Writer};

use super::exclude::Filters;
use super::source::{self, Stamp};

pub const MAGIC: [u8; 4] = *b"ATMF";
pub const VERSION: u8 = 1;
/// Most entries one manifest may hold.
pub const MAX_ENTRIES: u64 = 1 << 24;
/// Longest path, and longest symlink target, in bytes.
pub const MAX_PATH_LEN: usize = 4096;
/// Longest path component in bytes.
pub const MAX_COMPONENT_LEN: usize = 255;
const HEADER_LEN: usize = 4 + 1 + 4;
/// A directory entry with a one-byte name: the smallest entry on the wire.
const MIN_ENTRY_LEN: usize = 1 + 4 + 8 + 4 + 2 + 1;
const KIND_DIR: u8 = 1;
const KIND_FILE: u8 = 2;
const KIND_SYMLINK: u8 = 3;
const KIND_HARDLINK: u8 = 4;

// One escaping function for every name shown to a person (src/util/text.rs).
use crate::util::text::{shown, shown_path, Escaped};

/// The start of a long name, for messages about names that are too long.
fn head(bytes: &[u8]) -> String {
    const SHOWN: usize = 48;
    match bytes.get(..SHOWN) {
        Some(start) if bytes.len() > SHOWN => format!("{}…", Escaped(start)),
        _ => Escaped(bytes).to_string(),
    }
}

/// Why a name cannot be a [`RelPath`]. Each variant holds the raw name.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum NameError {
    #[error("empty path")]
    Empty,
    #[error("`{}`: path is {len} bytes long (at most {MAX_PATH_LEN} allowed)", head(.name))]
    TooLong { name: Vec<u8>, len: usize },
    #[error("`{}`: a component is {len} bytes long (at most 255 allowed)", head(.name))]
    ComponentTooLong { name: Vec<u8>, len: usize },
    #[error("`{}`: absolute paths are not allowed in the destination", shown(.name))]
    Absolute { name: Vec<u8> },
    /// `component` is "." or "..".
    #[error("`{}`: `{component}` {}", shown(.name), dot_problem(.component))]
    DotComponent {
        name: Vec<u8>,
        component: &'static str,
    },
    #[error("`{}`: empty component (a trailing or doubled `/`)", shown(.name))]
    EmptyComponent { name: Vec<u8> },
    #[error("`{}`: contains a NUL byte", shown(.name))]
    Nul { name: Vec<u8> },
}

fn dot_problem(component: &str) -> &'static str {
    match component {
        ".." => "would leave the destination",
        _ => "components are not allowed",
    }
}

/// A relative path inside the destination, '/'-separated bytes, validated:
/// non-empty; at most 4096 bytes; components non-empty (no leading, trailing
/// or double '/'), not "." or "..", at most 255 bytes each; no NUL byte.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RelPath(Vec<u8>);

impl RelPath {
    pub fn new(name: Vec<u8>) -> Result<RelPath, NameError> {
        use NameError as N;
        let len = name.len();
        if name.is_empty() {
            return Err(N::Empty);
        } else if name.contains(&0) {
            return Err(N::Nul { name });
        } else if len > MAX_PATH_LEN {
            return Err(N::TooLong { name, len });
        } else if name[0] == b'/' {
            return Err(N::Absolute { name });
        }
        for c in name.split(|&b| b == b'/') {
            let component = match c {
                b"" => return Err(N::EmptyComponent { name }),
                b"." => ".",
                b".." => "..",
                c if c.len() > MAX_COMPONENT_LEN => {
                    let len = c.len();
                    return Err(N::ComponentTooLong { name, len });
                }
                _ => continue,
            };
            return Err(N::DotComponent { name, component });
        }
        Ok(RelPath(name))
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    pub fn components(&self) -> impl Iterator<Item = &[u8]> {
        self.0.split(|&b| b == b'/')
    }

    /// `None` for a single component.
    pub fn parent(&self) -> Option<RelPath> {
        let slash = self.0.iter().rposition(|&b| b == b'/')?;
        Some(RelPath(self.0[..slash].to_vec()))
    }

    /// `self/name`, validated as a whole.
    pub fn join(&self, name: &[u8]) -> Result<RelPath, NameError> {
        RelPath::new([&self.0, &b"/"[..], name].concat())
    }

    pub fn to_path(&self) -> &Path {
        Path::new(OsStr::from_bytes(&self.0))
    }
}

impl fmt::Display for RelPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        Escaped(&self.0).fmt(f)
    }
}

impl fmt::Debug for RelPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{}\"", Escaped(&self.0))
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntryKind {
    Dir,
    File {
        size: u64,
    },
    Symlink {
        target: Vec<u8>,
    },
    /// Another name of the file at `target`, a file listed earlier in the
    /// same manifest (`--hard-links`, as rsync -H): made with link(2) at
    /// the finish, never written.
    HardLink {
        target: RelPath,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub path: RelPath,
    pub kind: EntryKind,
    /// Permission bits (mode & 0o7777).
    pub mode: u32,
    pub mtime_sec: i64,
    /// Below 1_000_000_000.
    pub mtime_nsec: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Manifest {
    pub entries: Vec<Entry>,
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ManifestError {
    #[error("manifest truncated: {needed} bytes needed, {actual} present")]
    Truncated { needed: usize, actual: usize },
    #[error("not an atou manifest (bad magic)")]
    BadMagic,
    #[error("manifest version {0} is not supported (this build reads version {VERSION})")]
    UnsupportedVersion(u8),
    #[error("manifest entry {index}: unknown entry kind {kind}")]
    UnknownKind { index: usize, kind: u8 },
    #[error("{0} unexpected bytes after the last manifest entry")]
    TrailingBytes(usize),
    #[error("manifest has {0} entries (at most {MAX_ENTRIES} allowed)")]
    TooManyEntries(u64),
    #[error("manifest entry {index}: {error}")]
    BadName { index: usize, error: NameError },
    #[error("`{0}` appears twice in the manifest")]
    Duplicate(RelPath),
    #[error("`{path}`: its parent directory `{parent}` is not listed before it")]
    ParentMissing { path: RelPath, parent: RelPath },
    /// `what` is "a file" or "a symlink".
    #[error("`{path}`: its parent `{parent}` is {what}, not a directory")]
    ParentNotDir {
        path: RelPath,
        parent: RelPath,
        what: &'static str,
    },
    #[error("`{path}`: symlink target {problem}")]
    BadTarget {
        path: RelPath,
        problem: &'static str,
    },
    #[error("`{path}`: a hard link to `{target}`, which is not a file listed before it")]
    BadLinkTarget { path: RelPath, target: RelPath },
    #[error("`{path}`: mode {mode:#o} has bits beyond 0o7777")]
    BadMode { path: RelPath, mode: u32 },
    #[error("`{path}`: mtime nanoseconds {nsec} not below 1000000000")]
    BadMtime { path: RelPath, nsec: u32 },
}

impl From<Truncated> for ManifestError {
    fn from(t: Truncated) -> ManifestError {
        let Truncated { needed, actual } = t;
        ManifestError::Truncated { needed, actual }
    }
}

/// A u16 length, then that many bytes.
fn length_prefixed<'a>(r: &mut Reader<'a>) -> Result<&'a [u8], Truncated> {
    let len = r.u16()?;
    r.bytes(len.into())
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    let len = u16::try_from(bytes.len()).expect("validated manifest: length fits in u16");
    out.put_u16(len);
    out.put_slice(bytes);
}

fn target_problem(target: &[u8]) -> Option<&'static str> {
    match target {
        [] => Some("is empty"),
        t if t.len() > MAX_PATH_LEN => Some("is longer than 4096 bytes"),
        t if t.contains(&0) => Some("contains a NUL byte"),
        _ => None,
    }
}

impl Manifest {
    /// Bytes of the manifest on the wire.
    ///
    /// # Panics
    /// If a symlink target is longer than 65535 bytes or there are more than
    /// `u32::MAX` entries; [`Manifest::validate`] rejects both.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_LEN + self.entries.len() * 40);
        out.extend_from_slice(&MAGIC);
        out.push(VERSION);
        let count = u32::try_from(self.entries.len()).expect("validated manifest: entry count");
        out.put_u32(count);
        for e in &self.entries {
            out.push(match e.kind {
                EntryKind::Dir => KIND_DIR,
                EntryKind::File { .. } => KIND_FILE,
                EntryKind::Symlink { .. } => KIND_SYMLINK,
                EntryKind::HardLink { .. } => KIND_HARDLINK,
            });
            out.put_u32(e.mode);
            out.put_i64(e.mtime_sec);
            out.put_u32(e.mtime_nsec);
            put_bytes(&mut out, e.path.as_bytes());
            match &e.kind {
                EntryKind::Dir => {}
                EntryKind::File { size } => out.put_u64(*size),
                EntryKind::Symlink { target } => put_bytes(&mut out, target),
                EntryKind::HardLink { target } => put_bytes(&mut out, target.as_bytes()),
            }
        }
        out
    }

    /// Parses and validates; never panics.
    pub fn decode(bytes: &[u8]) -> Result<Manifest, ManifestError> {
        let mut r = Reader::new(bytes);
        if r.array()? != MAGIC {
            return Err(ManifestError::BadMagic);
        }
        let version = r.u8()?;
        if version != VERSION {
            return Err(ManifestError::UnsupportedVersion(version));
        }
        let count = r.u32()?;
        if u64::from(count) > MAX_ENTRIES {
            return Err(ManifestError::TooManyEntries(count.into()));
        }
        // Every entry takes at least MIN_ENTRY_LEN bytes, so this bounds the
        // allocation below by the input length.
        let count = count as usize;
        if count > r.remaining() / MIN_ENTRY_LEN {
            let (needed, actual) = (HEADER_LEN + count * MIN_ENTRY_LEN, bytes.len());
            return Err(ManifestError::Truncated { needed, actual });
        }
        let mut entries = Vec::with_capacity(count);
        for index in 0..count {
            let kind = r.u8()?;
            if !(KIND_DIR..=KIND_HARDLINK).contains(&kind) {
                return Err(ManifestError::UnknownKind { index, kind });
            }
            let mode = r.u32()?;
            let mtime_sec = r.i64()?;
            let mtime_nsec = r.u32()?;
            let path = RelPath::new(length_prefixed(&mut r)?.to_vec())
                .map_err(|error| ManifestError::BadName { index, error })?;
            let kind = match kind {
                KIND_DIR => EntryKind::Dir,
                KIND_FILE => EntryKind::File { size: r.u64()? },
                KIND_SYMLINK => EntryKind::Symlink {
                    target: length_prefixed(&mut r)?.to_vec(),
                },
                _ => EntryKind::HardLink {
                    target: RelPath::new(length_prefixed(&mut r)?.to_vec())
                        .map_err(|error| ManifestError::BadName { index, error })?,
                },
            };
            let entry = Entry {
                path,
                kind,
                mode,
                mtime_sec,
                mtime_nsec,
            };
            entries.push(entry);
        }
        if r.remaining() != 0 {
            return Err(ManifestError::TrailingBytes(r.remaining()));
        }
        let manifest = Manifest { entries };
        manifest.validate()?;
        Ok(manifest)
    }

    /// Every check of [`Manifest::decode`] beyond the byte layout, public so
    /// a sender can check what it built: paths unique; each parent a
    /// directory listed earlier; symlink targets non-empty, at most 4096
    /// bytes, without NUL; mode at most 0o7777; mtime_nsec below 1e9.
    pub fn validate(&self) -> Result<(), ManifestError> {
        use ManifestError as E;
        if self.entries.len() as u64 > MAX_ENTRIES {
            return Err(E::TooManyEntries(self.entries.len() as u64));
        }
        let mut seen: HashMap<&RelPath, &EntryKind> = HashMap::with_capacity(self.entries.len());
        for e in &self.entries {
            let path = || e.path.clone();
            let (mode, nsec) = (e.mode, e.mtime_nsec);
            if mode > 0o7777 {
                return Err(E::BadMode { path: path(), mode });
            }
            if nsec >= 1_000_000_000 {
                return Err(E::BadMtime { path: path(), nsec });
            }
            if let EntryKind::Symlink { target } = &e.kind {
                if let Some(problem) = target_problem(target) {
                    return Err(E::BadTarget {
                        path: path(),
                        problem,
                    });
                }
            }
            if let EntryKind::HardLink { target } = &e.kind {
                if !matches!(seen.get(target), Some(EntryKind::File { .. })) {
                    let target = target.clone();
                    return Err(E::BadLinkTarget {
                        path: path(),
                        target,
                    });
                }
            }
            if let Some(parent) = e.path.parent() {
                let what = match seen.get(&parent) {
                    Some(EntryKind::Dir) => None,
                    Some(EntryKind::File { .. }) => Some("a file"),
                    Some(EntryKind::Symlink { .. }) => Some("a symlink"),
                    Some(EntryKind::HardLink { .. }) => Some("a hard link"),
                    None => {
                        return Err(E::ParentMissing {
                            path: path(),
                            parent,
                        })
                    }
                };
                if let Some(what) = what {
                    return Err(E::ParentNotDir {
                        path: path(),
                        parent,
                        what,
                    });
                }
            }
            if seen.insert(&e.path, &e.kind).is_some() {
                return Err(E::Duplicate(path()));
            }
        }
        Ok(())
    }

    /// Sum of the sizes of all files, saturating.
    pub fn total_file_bytes(&self) -> u64 {
        self.entries.iter().fold(0, |sum, e| match e.kind {
            EntryKind::File { size } => sum.saturating_add(size),
            _ => sum,
        })
    }

    pub fn file_count(&self) -> usize {
        let files = self
            .entries
            .iter()
            .filter(|e| matches!(e.kind, EntryKind::File { .. }));
        files.count()
    }
}

/// One entry plus where it is on the sender's disk.
#[derive(Debug, Clone)]
pub struct LocalEntry {
    pub entry: Entry,
    /// Its path here, for messages.
    pub source: PathBuf,
    /// The SRC it was found under, as the user named it: files are
    /// opened beneath it (see `transfer::source`).
    pub top: Arc<PathBuf>,
    /// For a file: what the walk saw, checked again when it is read.
    pub stamp: Option<Stamp>,
    /// Its owner and group here, (uid, gid): sent with `-o` / `-g`.
    pub owner: (u32, u32),
    /// Its device and inode as the walk saw them: what is opened again
    /// to read it (its attributes, `-X` / `-A`) must be it.
    pub id: (u64, u64),
}

#[derive(Debug, Error)]
pub enum WalkError {
    #[error("cannot read {}: {error}", shown_path(.path))]
    Io { path: PathBuf, error: io::Error },
    #[error("cannot send {}: {error}", shown_path(.path))]
    Name { path: PathBuf, error: NameError },
    #[error("{} is a {what}; only files, directories and symlinks are sent", shown_path(.path))]
    Unsupported { path: PathBuf, what: &'static str },
    /// Two sources with the same final component.
    #[error("two sources are both named `{name}`; give each a different name")]
    DuplicateName { name: String },
    /// The source is "/".
    #[error("{} has no name to send it under; send what is inside it", shown_path(.path))]
    NoName { path: PathBuf },
    #[error("{} line {line}: {error}", shown_path(.list))]
    Listed {
        list: PathBuf,
        line: usize,
        error: NameError,
    },
    /// A directory inside itself: a symlink loop (with `follow`) or a bind mount.
    #[error("{} leads back to a directory that contains it (a symlink loop)", shown_path(.path))]
    Loop { path: PathBuf },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> WalkError + '_ {
    |error| WalkError::Io {
        path: path.into(),
        error,
    }
}

fn name_err(path: &Path) -> impl FnOnce(NameError) -> WalkError + '_ {
    |error| WalkError::Name {
        path: path.into(),
        error,
    }
}

/// Walks each SRC: the entry for SRC itself is named by SRC's final
/// component (for "." or a path ending in "/", the canonicalised directory's
/// name; "/" itself is an error); directories are walked recursively,
/// children sorted by name bytes, parents before children. Symlinks are
/// recorded as symlinks unless `follow`, in which case what they point at is
/// sent; a directory met again inside itself is an error naming the path.
/// An entry `filters` leaves out is not sent, and an excluded directory is
/// not descended into: an excluded file is never opened, and an entry is
/// looked at (an `O_PATH` open and `fstat`, no read) only when its kind
/// could change what the rules decide (a rule for directories alone).
pub fn walk(
    sources: &[PathBuf],
    follow: bool,
    filters: &Filters,
) -> Result<Vec<LocalEntry>, WalkError> {
    let mut out = Vec::new();
    let mut names = HashSet::new();
    for src in sources {
        let (source, name) = top_name(src)?;
        let rel = RelPath::new(name).map_err(name_err(&source))?;
        if !names.insert(rel.clone()) {
            let name = rel.to_string();
            return Err(WalkError::DuplicateName { name });
        }
        let top = Arc::new(source.clone());
        walk_one(source, rel, top, follow, filters, &mut out)?;
    }
    Ok(out)
}

/// `--hard-links` (rsync -H): of the files in `entries` that are one
/// file (device and inode, as the walk saw them), the first keeps its
/// bytes and the others become hard links to it.
pub fn keep_hard_links(entries: &mut [LocalEntry]) {
    let mut first: HashMap<(u64, u64), RelPath> = HashMap::new();
    for e in entries.iter_mut() {
        let (EntryKind::File { .. }, Some(stamp)) = (&e.entry.kind, e.stamp) else {
            continue;
        };
        match first.get(&(stamp.dev, stamp.ino)) {
            Some(target) => {
                e.entry.kind = EntryKind::HardLink {
                    target: target.clone(),
                };
                e.stamp = None;
            }
            None => {
                first.insert((stamp.dev, stamp.ino), e.entry.path.clone());
            }
        }
    }
}

/// One path of a `--files-from` list: the directory it is relative to
/// and its path from there, which is also its path in the manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    pub dir: PathBuf,
    pub path: RelPath,
}

/// The paths of a `--files-from` list `text`, relative to `base`, as
/// rsync reads one: a path a line; blank lines and lines starting with
/// `#` or `;` skipped; leading `/`, empty and `.` components dropped; a
/// `/./` marks where the sent path starts (`sub/./a/b` sends `a/b` from
/// `base/sub`). `list` names the list in errors.
pub fn read_files_from(text: &[u8], base: &Path, list: &Path) -> Result<Vec<Listed>, WalkError> {
    let mut out = Vec::new();
    for (i, line) in text.split(|&b| b == b'\n').enumerate() {
        if line.is_empty() || line[0] == b'#' || line[0] == b';' {
            continue;
        }
        let (head, tail) = match line.windows(3).position(|w| w == b"/./") {
            Some(at) => (&line[..at], &line[at + 3..]),
            None => (&b""[..], line),
        };
        let tidy = |part: &[u8]| -> Vec<u8> {
            let kept: Vec<&[u8]> = part
                .split(|&b| b == b'/')
                .filter(|c| !matches!(*c, b"" | b"."))
                .collect();
            kept.join(&b'/')
        };
        let at_line = |error| WalkError::Listed {
            list: list.to_path_buf(),
            line: i + 1,
            error,
        };
        let path = RelPath::new(tidy(tail)).map_err(at_line)?;
        let head = tidy(head);
        if !head.is_empty() {
            // Checked as a path of its own: no `..` to climb out of base.
            RelPath::new(head.clone()).map_err(at_line)?;
        }
        let dir = base.join(OsStr::from_bytes(&head));
        out.push(Listed { dir, path });
    }
    Ok(out)
}

/// The names the manifest of `listed` starts with, each once.
pub fn listed_tops(listed: &[Listed]) -> Vec<Vec<u8>> {
    let mut tops: Vec<Vec<u8>> = Vec::new();
    for l in listed {
        let top = l.path.components().next().unwrap_or_default().to_vec();
        if !tops.contains(&top) {
            tops.push(top);
        }
    }
    tops
}

/// Walks the paths of a `--files-from` list (as `rsync -a -r
/// --files-from`): each path arrives under its own path from its list
/// directory, the directories on its way are sent as directories (without
/// their other contents), and a listed directory is walked whole, as
/// [`walk`] walks a SRC. Entries come once each, parents first, children
/// sorted by name bytes.
pub fn walk_listed(
    listed: &[Listed],
    follow: bool,
    filters: &Filters,
) -> Result<Vec<LocalEntry>, WalkError> {
    let mut by_path: BTreeMap<Vec<Vec<u8>>, LocalEntry> = BTreeMap::new();
    let key = |path: &RelPath| -> Vec<Vec<u8>> { path.components().map(<[u8]>::to_vec).collect() };
    for l in listed {
        let names: Vec<&[u8]> = l.path.components().collect();
        let top = Arc::new(l.dir.join(OsStr::from_bytes(names[0])));
        for depth in 1..names.len() {
            let path = RelPath::new(names[..depth].join(&b'/')).map_err(name_err(&l.dir))?;
            if by_path.contains_key(&key(&path)) {
                continue;
            }
            let source = l.dir.join(path.to_path());
            let md = if follow {
                fs::metadata(&source)
            } else {
                fs::symlink_metadata(&source)
            }
            .map_err(io_err(&source))?;
            if !md.is_dir() {
                let error = io::Error::from_raw_os_error(libc::ENOTDIR);
                return Err(WalkError::Io {
                    path: source,
                    error,
                });
            }
            let entry = Entry {
                path: path.clone(),
                kind: EntryKind::Dir,
                mode: md.mode() & 0o7777,
                mtime_sec: md.mtime(),
                mtime_nsec: md.mtime_nsec().clamp(0, 999_999_999) as u32,
            };
            let local = LocalEntry {
                entry,
                source,
                top: top.clone(),
                stamp: None,
                owner: (md.uid(), md.gid()),
                id: (md.dev(), md.ino()),
            };
            by_path.insert(key(&path), local);
        }
        let mut walked = Vec::new();
        let source = l.dir.join(l.path.to_path());
        walk_one(source, l.path.clone(), top, follow, filters, &mut walked)?;
        for e in walked {
            by_path.entry(key(&e.entry.path)).or_insert(e);
        }
    }
    Ok(by_path.into_values().collect())
}

/// Where to read SRC from, and the name to send it under.
pub fn top_name(src: &Path) -> Result<(PathBuf, Vec<u8>), WalkError> {
    let last = src.as_os_str().as_bytes().rsplit(|&b| b == b'/').next();
    match last {
        Some(last) if !matches!(last, b"" | b"." | b"..") => Ok((src.into(), last.to_vec())),
        _ => {
            let canon = fs::canonicalize(src).map_err(io_err(src))?;
            match canon.file_name() {
                Some(name) => Ok((canon.clone(), name.as_bytes().to_vec())),
                None => Err(WalkError::NoName { path: src.into() }),
            }
        }
    }
}

/// Depth-first with an explicit stack, so a deep tree cannot overflow ours;
/// `ancestors` holds the (dev, ino) of the directories above the entry.
///
/// Each entry is looked at through an `O_PATH` descriptor opened beneath
/// its parent directory's descriptor (see [`super::source`]), so a
/// directory swapped for a symlink while the walk runs is seen as the
/// symlink, never walked through; only SRC itself is opened by its path.
/// At most one descriptor per level of the tree is open at a time.
fn walk_one(
    source: PathBuf,
    rel: RelPath,
    top: Arc<PathBuf>,
    follow: bool,
    filters: &Filters,
    out: &mut Vec<LocalEntry>,
) -> Result<(), WalkError> {
    let mut stack: Vec<(Option<Arc<fs::File>>, PathBuf, RelPath, usize)> =
        vec![(None, source, rel, 0)];
    let mut ancestors: Vec<(u64, u64)> = Vec::new();
    while let Some((parent, source, path, depth)) = stack.pop() {
        ancestors.truncate(depth);
        // Rules that name it whatever it is: not even looked at.
        if filters.excludes_any_kind(path.as_bytes()) {
            continue;
        }
        let name = source.file_name().map_or(source.as_path(), Path::new);
        let fd = source::open_entry(parent.as_deref(), &source, name, follow)
            .map_err(io_err(&source))?;
        drop(parent);
        let md = fd.metadata().map_err(io_err(&source))?;
        let ft = md.file_type();
        if filters.excludes(path.as_bytes(), ft.is_dir()) {
            // A `DIR/` rule, or one before it for directories alone: an
            // excluded directory is neither listed nor descended into.
            continue;
        }
        let mut stamp = None;
        let kind = if ft.is_dir() {
            EntryKind::Dir
        } else if ft.is_file() {
            stamp = Some(Stamp::of(&md));
            EntryKind::File { size: md.len() }
        } else if ft.is_symlink() {
            let target = source::read_link(&fd).map_err(io_err(&source))?;
            EntryKind::Symlink { target }
        } else {
            let what = match () {
                _ if ft.is_socket() => "socket",
                _ if ft.is_fifo() => "FIFO",
                _ if ft.is_block_device() => "block device",
                _ if ft.is_char_device() => "character device",
                _ => "special file",
            };
            return Err(WalkError::Unsupported { path: source, what });
        };
        if ft.is_dir() {
            let id = (md.dev(), md.ino());
            if ancestors.contains(&id) {
                return Err(WalkError::Loop { path: source });
            }
            ancestors.push(id);
            let mut names = source::list_dir(&fd).map_err(io_err(&source))?;
            // Pushed in descending order so that they pop in ascending order.
            names.sort_by(|a, b| b.cmp(a));
            let dir = Arc::new(fd);
            for name in names {
                let child_source = source.join(OsStr::from_bytes(&name));
                let child = path.join(&name).map_err(name_err(&child_source))?;
                stack.push((Some(dir.clone()), child_source, child, depth + 1));
            }
        }
        let entry = Entry {
            path,
            kind,
            mode: md.mode() & 0o7777,
            mtime_sec: md.mtime(),
            mtime_nsec: md.mtime_nsec().clamp(0, 999_999_999) as u32,
        };
        out.push(LocalEntry {
            entry,
            source,
            top: top.clone(),
            stamp,
            owner: (md.uid(), md.gid()),
            id: (md.dev(), md.ino()),
        });
    }
    Ok(())
}

/// The manifest of walked entries, in the same order.
pub fn manifest_of(entries: &[LocalEntry]) -> Manifest {
    let entries = entries.iter().map(|e| e.entry.clone()).collect();
    Manifest { entries }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::os::unix::fs::symlink;
    use ManifestError as E;

    /// A fresh directory under the system temp dir, removed on drop.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(tag: &str) -> TempDir {
            let dir = tempfile::Builder::new()
                .prefix(&format!("atou-manifest-{tag}-"))
                .tempdir()
                .unwrap()
                .keep();
            TempDir(dir)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    /// An entry with an unchecked path, for encoding invalid manifests.
    fn raw(path: &[u8], kind: EntryKind) -> Entry {
        let (path, mode, mtime_sec, mtime_nsec) = (RelPath(path.to_vec()), 0o644, 1 << 30, 5);
        Entry {
            path,
            kind,
            mode,
            mtime_sec,
            mtime_nsec,
        }
    }

    fn file(path: &[u8]) -> Entry {
        raw(path, EntryKind::File { size: 3 })
    }

    fn dir(path: &[u8]) -> Entry {
        raw(path, EntryKind::Dir)
    }

    fn link(target: &[u8]) -> EntryKind {
        EntryKind::Symlink {
            target: target.to_vec(),
        }
    }

    /// A hard link names a file listed before it, nothing else: a
    /// hostile manifest cannot link to a directory, a symlink, a later
    /// entry or a path it does not carry.
    #[test]
    fn a_hard_link_must_name_an_earlier_file() {
        let link = |target: &[u8]| {
            let target = RelPath(target.to_vec());
            raw(b"t/l", EntryKind::HardLink { target })
        };
        let good = vec![dir(b"t"), file(b"t/f"), link(b"t/f")];
        let m = Manifest { entries: good };
        assert_eq!(Manifest::decode(&m.encode()).unwrap(), m);
        for entries in [
            vec![dir(b"t"), link(b"t/f"), file(b"t/f")],
            vec![dir(b"t"), file(b"t/g"), link(b"t")],
            vec![dir(b"t"), link(b"../etc/passwd")],
            vec![dir(b"t"), file(b"t/f"), link(b"t/x")],
        ] {
            let err = decode_err(entries);
            assert!(
                matches!(err, E::BadLinkTarget { .. } | E::BadName { .. }),
                "{err}"
            );
        }
    }

    #[track_caller]
    fn decode_err(entries: Vec<Entry>) -> ManifestError {
        Manifest::decode(&Manifest { entries }.encode()).unwrap_err()
    }

    fn sample() -> Manifest {
        let odd = Entry {
            mode: 0o7777,
            mtime_sec: -1,
            mtime_nsec: 999_999_999,
            ..file(b"d/sp ace")
        };
        let entries = vec![
            dir(b"d"),
            file("d/ünï côde.txt".as_bytes()),
            file(b"-rf"),
            raw(b"d/link", link(b"../../etc/passwd")),
            odd,
        ];
        Manifest { entries }
    }

    #[test]
    fn round_trip_all_kinds() {
        let m = sample();
        m.validate().unwrap();
        assert_eq!(Manifest::decode(&m.encode()).unwrap(), m);
        assert_eq!((m.file_count(), m.total_file_bytes()), (3, 9));
        let empty = Manifest::default();
        assert_eq!(Manifest::decode(&empty.encode()).unwrap(), empty);
    }

    #[test]
    fn rejects_unsafe_names() {
        let long_component = [b'a'; 256];
        let long_path = [b"a/".repeat(2048), b"a".to_vec()].concat();
        let cases: [(&[u8], &str); 8] = [
            (b"../x", "entry 0: `../x`: `..` would leave the destination"),
            (b"/abs", "`/abs`: absolute paths are not allowed"),
            (b"a//b", "`a//b`: empty component"),
            (b"a/", "`a/`: empty component"),
            (b"a/./b", "`a/./b`: `.` components are not allowed"),
            (b"a\0b", "`a\\x00b`: contains a NUL byte"),
            (&long_component, "a component is 256 bytes long"),
            (
                &long_path,
                "`a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/…`: path is 4097 bytes",
            ),
        ];
        for (name, message) in cases {
            let err = decode_err(vec![file(name)]);
            assert!(matches!(err, E::BadName { index: 0, .. }), "{err:?}");
            assert!(err.to_string().contains(message), "{err}");
            assert!(RelPath::new(name.to_vec()).is_err());
        }
        let empty = decode_err(vec![file(b"")]);
        assert!(matches!(
            empty,
            E::BadName {
                error: NameError::Empty,
                ..
            }
        ));
    }

    #[test]
    fn rejects_bad_structure() {
        let dup = decode_err(vec![dir(b"a"), dir(b"a")]);
        assert_eq!(dup.to_string(), "`a` appears twice in the manifest");
        let err = decode_err(vec![file(b"a"), file(b"a/b")]);
        assert_eq!(
            err.to_string(),
            "`a/b`: its parent `a` is a file, not a directory"
        );
        let err = decode_err(vec![raw(b"l", link(b"/etc")), file(b"l/passwd")]);
        assert!(
            matches!(
                err,
                E::ParentNotDir {
                    what: "a symlink",
                    ..
                }
            ),
            "{err:?}"
        );
        let err = decode_err(vec![file(b"d/x"), dir(b"d")]);
        let expected = "`d/x`: its parent directory `d` is not listed before it";
        assert_eq!(err.to_string(), expected);
        for t in [&b""[..], b"a\0b", &[b'x'; 4097]] {
            let err = decode_err(vec![raw(b"l", link(t))]);
            assert!(matches!(err, E::BadTarget { .. }));
        }
        let err = decode_err(vec![Entry {
            mode: 0o10000,
            ..file(b"f")
        }]);
        assert!(matches!(err, E::BadMode { .. }));
        let err = decode_err(vec![Entry {
            mtime_nsec: 1_000_000_000,
            ..file(b"f")
        }]);
        assert!(matches!(err, E::BadMtime { .. }));
    }

    #[test]
    fn rejects_bad_bytes() {
        let enc = sample().encode();
        for cut in 0..enc.len() {
            assert!(Manifest::decode(&enc[..cut]).is_err(), "cut at {cut}");
        }
        let decode_changed = |at: usize, byte: u8| {
            let mut bad = enc.clone();
            bad[at] = byte;
            Manifest::decode(&bad)
        };
        assert_eq!(decode_changed(0, b'X'), Err(E::BadMagic));
        assert_eq!(decode_changed(4, 2), Err(E::UnsupportedVersion(2)));
        let unknown = decode_changed(HEADER_LEN, 9);
        assert_eq!(unknown, Err(E::UnknownKind { index: 0, kind: 9 }));
        let long = [&enc[..], &[0]].concat();
        assert_eq!(Manifest::decode(&long), Err(E::TrailingBytes(1)));
        let huge = Manifest::decode(b"ATMF\x01\xff\xff\xff\xff");
        assert_eq!(huge, Err(E::TooManyEntries(u32::MAX.into())));
        let many = Manifest::decode(b"ATMF\x01\x00\xff\xff\xff\x01\x00\x00");
        assert!(matches!(many, Err(E::Truncated { .. })), "{many:?}");
    }

    #[test]
    fn display_escapes_control_characters() {
        let p = RelPath::new(b"a\x1b[31m\n\t\xff\xe2\x80\xaeb".to_vec()).unwrap();
        assert_eq!(p.to_string(), "a\\x1b[31m\\n\\t\u{fffd}\\u{202e}b");
        assert_eq!(format!("{p:?}"), "\"a\\x1b[31m\\n\\t\u{fffd}\\u{202e}b\"");
        let q = RelPath::new(b"a/b/c".to_vec()).unwrap();
        assert_eq!(q.parent().unwrap().as_bytes(), b"a/b");
        assert_eq!(q.components().collect::<Vec<_>>(), [b"a", b"b", b"c"]);
        assert_eq!(q.join(b"d").unwrap().to_path(), Path::new("a/b/c/d"));
        assert!(q.join(b"..").is_err());
        assert_eq!(RelPath::new(b"a".to_vec()).unwrap().parent(), None);
    }

    /// A tree at `<tmp>/top`: `dirs` (with their parents) and `files`
    /// with their contents.
    fn tree(name: &str, dirs: &[&str], files: &[(&str, &str)]) -> (TempDir, PathBuf) {
        let tmp = TempDir::new(name);
        let root = tmp.0.join("top");
        for dir in dirs {
            fs::create_dir_all(root.join(dir)).unwrap();
        }
        for (file, contents) in files {
            fs::write(root.join(file), contents).unwrap();
        }
        (tmp, root)
    }

    #[test]
    fn walks_a_tree_parents_first() {
        let (tmp, root) = tree(
            "tree",
            &["sub", "empty"],
            &[
                ("sub/inner.txt", "hello"),
                ("empty.txt", ""),
                ("-rf", ""),
                ("sp ace", ""),
                ("ünï", ""),
            ],
        );
        symlink("sub/inner.txt", root.join("link")).unwrap();
        let walked = walk(std::slice::from_ref(&root), false, &Filters::default()).unwrap();
        let m = manifest_of(&walked);
        m.validate().unwrap();
        let names: Vec<String> = m.entries.iter().map(|e| e.path.to_string()).collect();
        let expected = "top top/-rf top/empty top/empty.txt top/link top/sp ace top/sub \
                        top/sub/inner.txt top/ünï";
        assert_eq!(names.join(" "), expected);
        let kind = |i: usize| &m.entries[i].kind;
        assert_eq!(
            (kind(2), kind(4)),
            (&EntryKind::Dir, &link(b"sub/inner.txt"))
        );
        assert_eq!(
            (kind(3), kind(7)),
            (&EntryKind::File { size: 0 }, &EntryKind::File { size: 5 })
        );
        assert_eq!(walked[7].source, root.join("sub/inner.txt"));
        assert_eq!((m.file_count(), m.total_file_bytes()), (5, 5));
        // A trailing '/' names the directory itself; "/" has no name.
        let slash = PathBuf::from(format!("{}/", root.join("sub").display()));
        assert_eq!(
            walk(&[slash], false, &Filters::default()).unwrap()[0]
                .entry
                .path
                .as_bytes(),
            b"sub"
        );
        let root_dir = walk(&[PathBuf::from("/")], false, &Filters::default());
        assert!(matches!(root_dir, Err(WalkError::NoName { .. })));
        let twice = walk(
            &[root.join("sub"), tmp.0.join("top/sub")],
            false,
            &Filters::default(),
        );
        assert!(matches!(twice, Err(WalkError::DuplicateName { .. })));
    }

    /// Excluded entries are left out and an excluded directory is not
    /// descended into: a socket inside it, which the walk refuses when it
    /// meets one, is never met; an excluded socket is not looked at.
    #[test]
    fn excluded_entries_are_skipped_and_not_descended_into() {
        let (_tmp, root) = tree(
            "exclude",
            &["cache/deep", "src"],
            &[
                ("src/a.c", "c"),
                ("src/a.o", "o"),
                ("cache.txt", "not a directory"),
            ],
        );
        let _in_cache =
            std::os::unix::net::UnixListener::bind(root.join("cache/deep/sock")).unwrap();
        let _top_sock = std::os::unix::net::UnixListener::bind(root.join("x.sock")).unwrap();
        let everything = walk(std::slice::from_ref(&root), false, &Filters::default());
        assert!(matches!(everything, Err(WalkError::Unsupported { .. })));
        let mut ex = Filters::default();
        for p in ["cache/", "*.o", "*.sock"] {
            ex.add_exclude(p).unwrap();
        }
        let walked = walk(std::slice::from_ref(&root), false, &ex).unwrap();
        let names: Vec<String> = walked.iter().map(|e| e.entry.path.to_string()).collect();
        assert_eq!(names.join(" "), "top top/cache.txt top/src top/src/a.c");
        manifest_of(&walked).validate().unwrap();
        // The top SRC itself can be excluded, as in rsync.
        let mut all = Filters::default();
        all.add_exclude("/top").unwrap();
        assert!(walk(&[root], false, &all).unwrap().is_empty());
    }

    #[test]
    fn follow_and_loops() {
        let tmp = TempDir::new("follow");
        fs::write(tmp.0.join("target"), b"abc").unwrap();
        symlink("target", tmp.0.join("link")).unwrap();
        let kind = |follow| {
            walk(&[tmp.0.join("link")], follow, &Filters::default()).unwrap()[0]
                .entry
                .kind
                .clone()
        };
        assert_eq!(kind(true), EntryKind::File { size: 3 });
        assert_eq!(kind(false), link(b"target"));
        let d = vec![tmp.0.join("d")];
        fs::create_dir(&d[0]).unwrap();
        symlink("..", d[0].join("up")).unwrap();
        assert!(walk(&d, false, &Filters::default()).is_ok());
        let err = walk(&d, true, &Filters::default()).unwrap_err();
        assert!(matches!(err, WalkError::Loop { .. }), "{err}");
        assert!(
            err.to_string()
                .ends_with("d/up/d leads back to a directory that contains it (a symlink loop)"),
            "{err}"
        );
        let sock = tmp.0.join("sock");
        let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        let err = walk(&[sock], false, &Filters::default())
            .unwrap_err()
            .to_string();
        assert!(err.ends_with("sock is a socket; only files, directories and symlinks are sent"));
    }

    /// Valid manifests: each item goes under an earlier directory (or the
    /// top) when the joined name is valid and new.
    fn arb_manifest() -> impl Strategy<Value = Manifest> {
        let name = prop::collection::vec(1..=255u8, 1..12);
        let kind = prop_oneof![
            Just(EntryKind::Dir),
            any::<u64>().prop_map(|size| EntryKind::File { size }),
            prop::collection::vec(1..=255u8, 1..40)
                .prop_map(|target| EntryKind::Symlink { target }),
        ];
        let item = (
            any::<usize>(),
            name,
            kind,
            0..=0o7777u32,
            any::<i64>(),
            0..1_000_000_000u32,
        );
        prop::collection::vec(item, 0..40).prop_map(|items| {
            let (mut dirs, mut seen, mut entries) = (vec![], HashSet::new(), vec![]);
            for (at, mut name, kind, mode, mtime_sec, mtime_nsec) in items {
                name.iter_mut()
                    .filter(|b| **b == b'/')
                    .for_each(|b| *b = b'_');
                let path = match at % (dirs.len() + 1) {
                    0 => RelPath::new(name),
                    i => RelPath::join(&dirs[i - 1], &name),
                };
                let Ok(path) = path else { continue };
                if !seen.insert(path.clone()) {
                    continue;
                }
                if kind == EntryKind::Dir {
                    dirs.push(path.clone());
                }
                entries.push(Entry {
                    path,
                    kind,
                    mode,
                    mtime_sec,
                    mtime_nsec,
                });
            }
            Manifest { entries }
        })
    }

    proptest! {
        #[test]
        fn decode_never_panics(header: bool, tail in prop::collection::vec(any::<u8>(), 0..512)) {
            let bytes = if header { [&b"ATMF\x01"[..], &tail].concat() } else { tail };
            if let Ok(m) = Manifest::decode(&bytes) {
                prop_assert_eq!(m.encode(), bytes);
            }
        }

        #[test]
        fn valid_manifests_round_trip(m in arb_manifest(), at: usize, flip: u8) {
            prop_assert_eq!(m.validate(), Ok(()));
            let mut enc = m.encode();
            prop_assert_eq!(&Manifest::decode(&enc).unwrap(), &m);
            // A corrupted encoding is an error or another valid manifest.
            let i = at % enc.len();
            enc[i] ^= flip;
            if let Ok(other) = Manifest::decode(&enc) {
                prop_assert_eq!(other.encode(), enc);
            }
        }
    }
}

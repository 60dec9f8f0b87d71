//! What a sender and a receiver say to each other inside a session.
//!
//! Every transport connection of a session carries one request stream and
//! gets one reply (see [`crate::proto::endpoint::server`]). The first byte of the
//! stream says which request it is:
//!
//! | request | stream | reply |
//! |---|---|---|
//! | `P` plan | options, destination subdirectory, [manifest](super::manifest) | refused (why), or per file: send all, skip, or the BLAKE3 values of the chunks a partial file already holds |
//! | `D` data | the chunks it carries ([`DataHeader`]), then each chunk's bytes followed by its 32-byte BLAKE3 value | the chunks that failed their check, or why the stream failed |
//! | `F` finish | every file's BLAKE3 hash | files verified and in place, or why not |
//! | `A` abort | why the sender gives up | done |
//!
//! All integers are big-endian. Files are numbered in manifest order,
//! counting only file entries. Every request, data header and answer ends
//! with the BLAKE3 hash of what precedes it (chunks carry their own), so
//! whatever a path corrupts past the UDP checksum is caught: a message is
//! refused as corrupted, a chunk is sent again. Decoding checks every
//! length against the bytes present and never allocates more than the
//! input implies.

use thiserror::Error;

use crate::proto::wire::codec::{Reader, Truncated, Writer};

use super::compress::FRAME_HEADER_LEN;
use super::hash::{chunk_count, Cv};
use super::manifest::{Manifest, ManifestError, NameError, RelPath};

const KIND_PLAN: u8 = b'P';
const KIND_DATA: u8 = b'D';
/// A data stream of a `--compress` session: the header also lists each
/// chunk's frame (encoding and wire length, [`FrameHeader`]).
const KIND_DATA_FRAMED: u8 = b'Z';
const KIND_FINISH: u8 = b'F';
const KIND_ABORT: u8 = b'A';
/// Bumped on any incompatible change below. A plan is written in the
/// oldest version that can say what it asks ([`SESSION_VERSION_FIRST`]
/// when no option of the second byte is set), so a receiver that
/// predates an option refuses only the plans that use it.
const SESSION_VERSION: u8 = 2;
/// The plan without the second option byte.
const SESSION_VERSION_FIRST: u8 = 1;
/// Second byte: chunks may travel compressed (`--compress`, framed data
/// streams, [`KIND_DATA_FRAMED`]).
const OPT2_COMPRESS: u8 = 0x04;

const OPT_OVERWRITE: u8 = 0x01;
const OPT_SKIP_EXISTING: u8 = 0x02;
const OPT_FSYNC: u8 = 0x04;
const OPT_CHECKSUM: u8 = 0x08;
/// A dry run: plan, answer, change nothing. A receiver that predates it
/// refuses the bit as unknown rather than reading the plan as a real one.
const OPT_DRY_RUN: u8 = 0x10;
/// One shard of a tree that other sessions send the rest of: the receiver
/// sets the mtime of each directory it writes into (docs/scale-out.md). A
/// receiver that predates it refuses the bit rather than leave directory
/// mtimes to whichever shard happened to finish last.
const OPT_SHARD: u8 = 0x20;
/// The plan lists files it sends in part (a file split across shards by
/// chunk ranges). A receiver that predates it refuses the bit rather than
/// wait for chunks no session of its own will send.
const OPT_PARTS: u8 = 0x40;
/// The sender sends its finish with its last data, before the streams'
/// answers (docs/transfer.md, "The pipeline"). A receiver that predates it
/// refuses the bit rather than check the files before their data is in;
/// the sender then asks again without it and finishes after the answers.
const OPT_FINISH_AHEAD: u8 = 0x80;
const OPTS_KNOWN: u8 = OPT_FINISH_AHEAD
    | OPT_OVERWRITE
    | OPT_SKIP_EXISTING
    | OPT_FSYNC
    | OPT_CHECKSUM
    | OPT_DRY_RUN
    | OPT_SHARD
    | OPT_PARTS;
// Every bit of the first byte is known: the options after these are in
// the second byte, which only SESSION_VERSION 2 has.
const _: () = assert!(OPTS_KNOWN == u8::MAX);

/// `--delete`: the receiver removes, in each directory the manifest
/// lists, what the manifest does not list and the sender's filter rules
/// do not protect (the rules follow the subdirectory). A receiver that
/// predates it refuses the plan's version rather than leave a mirror
/// half made.
const OPT2_DELETE: u8 = 0x01;
/// `-o` / `-g`: each entry's owner and group follow the rules (the ids, and
/// unless `--numeric-ids` the names of those ids here). A receiver that
/// predates it refuses the plan's version rather than leave every file
/// its own.
const OPT2_OWNERS: u8 = 0x02;
/// `-X` / `-A`: entries' extended attributes and POSIX ACLs follow the
/// rules ([`Xattrs`]). A receiver that predates it refuses the plan's
/// version rather than drop them.
const OPT2_XATTRS: u8 = 0x08;
/// Files the sender read as byte for byte another file of the plan
/// ([`SameFile`], `--compress`): the receiver may write them from that
/// file's chunks ([`FilePlan::Copy`]) and none of theirs is sent. A
/// receiver that predates it refuses the bit, and the sender asks again
/// without it.
pub const OPT2_SAME: u8 = 0x10;
const OPTS2_KNOWN: u8 = OPT2_DELETE | OPT2_OWNERS | OPT2_COMPRESS | OPT2_XATTRS | OPT2_SAME;

/// What an [`Xattrs`] section holds.
const XA_XATTRS: u8 = 0x01;
const XA_ACLS: u8 = 0x02;
/// Longest extended attribute name (Linux's XATTR_NAME_MAX).
pub const XATTR_NAME_MAX: usize = 255;
/// Largest extended attribute value (Linux's XATTR_SIZE_MAX).
pub const XATTR_VALUE_MAX: usize = 64 * 1024;
/// Bytes of names and values one entry may carry: Linux lists at most
/// 64 KiB of names, and no file system this side of XFS holds more than
/// a few values of 64 KiB.
pub const XATTR_ENTRY_BYTES_MAX: usize = 1 << 20;
/// Bytes of names and values a whole plan may carry.
pub const XATTR_PLAN_BYTES_MAX: usize = 16 << 20;

/// Which of an entry's ids a plan sends ([`Ownership`]).
const OWN_USER: u8 = 0x01;
const OWN_GROUP: u8 = 0x02;
const OWN_NUMERIC: u8 = 0x04;
/// Longest user or group name a plan carries (Linux allows 32).
pub const ID_NAME_MAX: usize = 255;

/// Bytes of the filter rules a `--delete` plan carries, at most.
pub const PROTECT_RULES_MAX: usize = 64 * 1024;
/// Names a plan reply lists of what `--delete` removes, and their bytes
/// at most; the rest are counted.
pub const DELETIONS_LISTED_MAX: usize = 10_000;
pub const DELETIONS_LISTED_BYTES: usize = 1 << 20;

/// Longest message a reply or error carries.
const MESSAGE_MAX: usize = 4096;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum MessageError {
    #[error("message truncated")]
    Truncated,
    #[error("unknown request kind {0:#04x}")]
    UnknownKind(u8),
    #[error("session protocol version {0}, this atou speaks {SESSION_VERSION}")]
    Version(u8),
    /// Only from a receiver older than the last option bit (the sender
    /// knows its refusal by this wording).
    #[error("unknown option bits {0:#04x}")]
    UnknownOptions(u8),
    #[error("filter rules of {0} bytes (at most {PROTECT_RULES_MAX})")]
    RulesTooLong(usize),
    #[error("filter rule {0:?}: {1}")]
    BadRule(String, String),
    #[error("a deleted entry's path: {0}")]
    DeletedPath(NameError),
    #[error("{0} unexpected bytes at the end")]
    TrailingBytes(usize),
    #[error("destination subdirectory: {0}")]
    Subdir(NameError),
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    #[error("chunk {chunk} of file {file} does not exist")]
    NoSuchChunk { file: u32, chunk: u64 },
    #[error("file number {0} is not in the manifest")]
    NoSuchFile(u32),
    #[error("chunk {chunk} of file {file} appears twice")]
    RepeatedChunk { file: u32, chunk: u64 },
    #[error("{got} values for {want} items")]
    WrongCount { got: u64, want: u64 },
    #[error("extended attributes: {0}")]
    BadXattr(&'static str),
    #[error("unknown status {0}")]
    UnknownStatus(u8),
    #[error("a message that is not UTF-8")]
    NotUtf8,
    #[error("a message of {0} bytes (at most {MESSAGE_MAX})")]
    TextTooLong(usize),
    #[error("same-file pair {index}: {why}")]
    BadSame { index: usize, why: &'static str },
    #[error("file part {index}: {why}")]
    BadPart { index: usize, why: &'static str },
    #[error(
        "a message corrupted in transit (its BLAKE3 hash does not match); run the transfer again"
    )]
    Corrupt,
}

/// Bytes of the hash that ends every message.
const SEAL_LEN: usize = 32;

/// Appends the BLAKE3 hash of `out` to it.
fn seal(mut out: Vec<u8>) -> Vec<u8> {
    let hash = blake3::hash(&out);
    out.extend_from_slice(hash.as_bytes());
    out
}

/// The message without its hash, if the hash matches.
fn open(bytes: &[u8]) -> Result<&[u8], MessageError> {
    if bytes.len() < SEAL_LEN {
        return Err(MessageError::Truncated);
    }
    let (body, hash) = bytes.split_at(bytes.len() - SEAL_LEN);
    if blake3::hash(body).as_bytes()[..] != *hash {
        return Err(MessageError::Corrupt);
    }
    Ok(body)
}

impl From<Truncated> for MessageError {
    fn from(_: Truncated) -> MessageError {
        MessageError::Truncated
    }
}

/// A count of items of at least `item_len` bytes each, refused when the
/// rest of the input could not hold that many.
fn count(r: &mut Reader<'_>, item_len: usize) -> Result<usize, MessageError> {
    let n = r.u32()? as usize;
    if n.saturating_mul(item_len) > r.remaining() {
        return Err(MessageError::Truncated);
    }
    Ok(n)
}

fn cv(r: &mut Reader<'_>) -> Result<Cv, MessageError> {
    Ok(r.array()?)
}

fn text(r: &mut Reader<'_>) -> Result<String, MessageError> {
    let n = usize::from(r.u16()?);
    if n > MESSAGE_MAX {
        return Err(MessageError::TextTooLong(n));
    }
    String::from_utf8(r.bytes(n)?.to_vec()).map_err(|_| MessageError::NotUtf8)
}

/// Nothing may follow a message's last field.
fn end(r: &Reader<'_>) -> Result<(), MessageError> {
    match r.remaining() {
        0 => Ok(()),
        n => Err(MessageError::TrailingBytes(n)),
    }
}

fn put_text(out: &mut Vec<u8>, s: &str) {
    let mut end = s.len().min(MESSAGE_MAX);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    out.put_u16(end as u16);
    out.put_slice(&s.as_bytes()[..end]);
}

/// What the sender asks of the receiver for existing files.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Options {
    /// Replace existing files.
    pub overwrite: bool,
    /// Leave alone existing files of the same size and modification time.
    pub skip_existing: bool,
    /// Sync each file to disk before it is renamed into place.
    pub fsync: bool,
    /// With `skip_existing`: compare existing files of the same size by
    /// their BLAKE3 chunk values, not by mtime (rsync's `-c`).
    pub checksum: bool,
    /// Only the plan: the receiver answers what it would do and creates
    /// nothing; no data follows (rsync's `-n`).
    pub dry_run: bool,
    /// One shard of a tree (`--shard K/N`): other sessions send the rest
    /// into the same directories, so each directory this session writes
    /// into gets its mtime set at the finish, after the writes.
    pub shard: bool,
    /// The finish may come before the data streams are answered: the
    /// receiver answers it once they are, naming chunks still missing.
    pub finish_ahead: bool,
    /// Data streams are framed: each chunk raw or zstd
    /// ([`DataHeader::encode_framed`]).
    pub compress: bool,
    /// `--delete`: remove from each directory the manifest lists what the
    /// manifest does not list (rsync's `--delete`), at the finish.
    pub delete: bool,
}

/// The first request of a session: where, how, and what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanRequest {
    pub options: Options,
    /// Under the receiver's directory; `None` for the directory itself.
    pub subdir: Option<RelPath>,
    pub manifest: Manifest,
    /// Files this session sends only part of, by file number, ascending;
    /// other sessions (shards) send the rest.
    pub parts: Vec<FilePart>,
    /// With `delete`: the sender's filter rules, as `--filter` reads them
    /// (`- P`, `+ P`), in order. What they exclude is protected from
    /// deletion, as rsync protects it; empty without `delete`.
    pub protect: Vec<String>,
    /// `-o` / `-g`: whose each entry is; `None` without either.
    pub owners: Option<Ownership>,
    /// `-X` / `-A`: each entry's extended attributes; `None` without
    /// either.
    pub xattrs: Option<Xattrs>,
    /// Files whose bytes are another file's ([`OPT2_SAME`]), ascending by
    /// file; empty when none are.
    pub same: Vec<SameFile>,
}

/// File `file` holds the same bytes as the earlier file `of` (file
/// numbers; equal sizes, neither sent in part, `of` not itself one of
/// these).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SameFile {
    pub file: u32,
    pub of: u32,
}

/// Bytes of one [`SameFile`] on the wire.
const SAME_LEN: usize = 4 + 4;

/// One extended attribute: its full name (`user.x`,
/// `system.posix_acl_access`) and its value, as the kernel gives them.
pub type Xattr = (Vec<u8>, Vec<u8>);

/// The extended attributes of a manifest's entries at the sender (rsync's
/// `-X`, and `-A` as the ACLs' `system.posix_acl_*` attributes).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Xattrs {
    /// `-X`: attributes other than the ACLs.
    pub xattrs: bool,
    /// `-A`: POSIX ACLs.
    pub acls: bool,
    /// The entries that have any, by manifest entry number, ascending.
    pub entries: Vec<(u32, Vec<Xattr>)>,
}

/// Who owns each entry of a manifest at the sender (rsync's `-o`, `-g`,
/// `--numeric-ids`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ownership {
    /// `-o`: files get their owner.
    pub user: bool,
    /// `-g`: files get their group.
    pub group: bool,
    /// `--numeric-ids`: by number; otherwise by name where the receiver
    /// knows the name, by number where it does not (rsync's rule).
    pub numeric: bool,
    /// Per manifest entry, in order: (uid, gid) at the sender.
    pub ids: Vec<(u32, u32)>,
    /// The names of the uids and gids in `ids` at the sender, where they
    /// have one; empty with `numeric`.
    pub user_names: Vec<(u32, String)>,
    pub group_names: Vec<(u32, String)>,
}

/// A file a session sends in part: chunks `chunks` of file `file`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilePart {
    /// File number (manifest order, files only).
    pub file: u32,
    /// A non-empty range of its chunks; not all of them.
    pub chunks: std::ops::Range<u64>,
}

/// Bytes of one part on the wire: file, first, end.
const PART_LEN: usize = 4 + 8 + 8;

/// The chunks a data stream carries, in stream order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkRange {
    /// File number (manifest order, files only).
    pub file: u32,
    pub first: u64,
    pub count: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataHeader {
    pub ranges: Vec<ChunkRange>,
}

/// A request, as the receiver reads it from a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// Boxed: a plan is ten times the size of the other requests.
    Plan(Box<PlanRequest>),
    /// The header; the chunks follow it in the stream.
    Data(DataHeader),
    /// Every file's BLAKE3 hash, in file order.
    Finish(Vec<Cv>),
    /// The sender gives up, and why: the receiver ends the session now
    /// rather than when it goes idle.
    Abort(String),
}

/// Bytes of a data header with `ranges` ranges, its hash included.
pub fn data_header_len(ranges: usize) -> usize {
    1 + 4 + ranges.saturating_mul(12).saturating_add(SEAL_LEN)
}

/// Bytes of a framed data header (kind `Z`) with `ranges` ranges and
/// `chunks` chunks in them, its hash included: the plain header's, and
/// one frame header per chunk.
pub fn framed_header_len(ranges: usize, chunks: u64) -> u64 {
    (data_header_len(ranges) as u64).saturating_add(chunks.saturating_mul(FRAME_HEADER_LEN as u64))
}

/// The length of the data header (either kind) at the start of a stream,
/// as soon as the bytes in say it: after five for a plain header, after
/// its ranges for a framed one (their counts say how many frames follow).
/// `None` until then, or when the stream is not data.
pub fn data_header_len_of(prefix: &[u8]) -> Option<u64> {
    let kind = *prefix.first()?;
    let n = u32::from_be_bytes(prefix.get(1..5)?.try_into().expect("4 bytes")) as usize;
    match kind {
        KIND_DATA => Some(data_header_len(n) as u64),
        KIND_DATA_FRAMED => {
            let ranges = prefix.get(5..5usize.saturating_add(n.saturating_mul(12)))?;
            let chunks = ranges
                .chunks_exact(12)
                .map(|r| u64::from(u32::from_be_bytes(r[8..].try_into().expect("4 bytes"))))
                .fold(0u64, u64::saturating_add);
            Some(framed_header_len(n, chunks))
        }
        _ => None,
    }
}

/// Whether a stream that starts with this byte is data (either kind).
pub fn is_data_kind(first: u8) -> bool {
    first == KIND_DATA || first == KIND_DATA_FRAMED
}

impl PlanRequest {
    pub fn encode(&self) -> Vec<u8> {
        let manifest = self.manifest.encode();
        let mut out = Vec::with_capacity(manifest.len() + 64);
        out.push(KIND_PLAN);
        let o = &self.options;
        let opts2 = if o.delete { OPT2_DELETE } else { 0 }
            | if self.owners.is_some() {
                OPT2_OWNERS
            } else {
                0
            }
            | if o.compress { OPT2_COMPRESS } else { 0 }
            | if self.xattrs.is_some() {
                OPT2_XATTRS
            } else {
                0
            }
            | if self.same.is_empty() { 0 } else { OPT2_SAME };
        out.push(if opts2 == 0 {
            SESSION_VERSION_FIRST
        } else {
            SESSION_VERSION
        });
        out.push(
            if o.overwrite { OPT_OVERWRITE } else { 0 }
                | if o.skip_existing {
                    OPT_SKIP_EXISTING
                } else {
                    0
                }
                | if o.fsync { OPT_FSYNC } else { 0 }
                | if o.checksum { OPT_CHECKSUM } else { 0 }
                | if o.dry_run { OPT_DRY_RUN } else { 0 }
                | if o.shard { OPT_SHARD } else { 0 }
                | if o.finish_ahead { OPT_FINISH_AHEAD } else { 0 }
                | if self.parts.is_empty() { 0 } else { OPT_PARTS },
        );
        if opts2 != 0 {
            out.push(opts2);
        }
        let subdir = self.subdir.as_ref().map_or(&[][..], |s| s.as_bytes());
        out.put_u16(subdir.len() as u16);
        out.extend_from_slice(subdir);
        if !self.parts.is_empty() {
            out.put_u32(self.parts.len() as u32);
            for p in &self.parts {
                out.put_u32(p.file);
                out.put_u64(p.chunks.start);
                out.put_u64(p.chunks.end);
            }
        }
        if o.delete {
            let rules = self.protect.join("\n");
            out.put_u32(rules.len() as u32);
            out.extend_from_slice(rules.as_bytes());
        }
        if let Some(own) = &self.owners {
            own.encode(&mut out);
        }
        if let Some(xattrs) = &self.xattrs {
            xattrs.encode(&mut out);
        }
        if !self.same.is_empty() {
            out.put_u32(self.same.len() as u32);
            for s in &self.same {
                out.put_u32(s.file);
                out.put_u32(s.of);
            }
        }
        out.extend_from_slice(&manifest);
        seal(out)
    }
}

impl DataHeader {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(data_header_len(self.ranges.len()));
        out.push(KIND_DATA);
        out.put_u32(self.ranges.len() as u32);
        for r in &self.ranges {
            out.put_u32(r.file);
            out.put_u32(r.first as u32);
            out.put_u32(r.count as u32);
        }
        seal(out)
    }

    /// The framed header (kind `Z`) of a stream whose chunks travel as
    /// `frames`, one per chunk in stream order.
    pub fn encode_framed(&self, frames: &[[u8; FRAME_HEADER_LEN]]) -> Vec<u8> {
        let mut out = self.encode();
        out.truncate(out.len() - SEAL_LEN);
        out[0] = KIND_DATA_FRAMED;
        for f in frames {
            out.extend_from_slice(f);
        }
        seal(out)
    }

    /// Reads a framed data header (kind `Z`) from the start of a stream;
    /// `Ok(None)` when more bytes are needed. Returns the header, each
    /// chunk's frame header as sent (checked against the chunk by
    /// [`crate::transfer::layout::Layout::framed`]), and its length.
    #[allow(clippy::type_complexity)]
    pub fn parse_framed(
        prefix: &[u8],
    ) -> Result<Option<(DataHeader, Vec<[u8; FRAME_HEADER_LEN]>, usize)>, MessageError> {
        match prefix.first() {
            None => return Ok(None),
            Some(&KIND_DATA_FRAMED) => {}
            Some(&other) => return Err(MessageError::UnknownKind(other)),
        }
        let Some(len) = data_header_len_of(prefix) else {
            return Ok(None);
        };
        if (prefix.len() as u64) < len {
            return Ok(None);
        }
        let len = len as usize;
        let mut r = Reader::new(open(&prefix[..len])?);
        r.u8()?;
        let ranges = read_ranges(&mut r)?;
        let frames = (0..r.remaining() / FRAME_HEADER_LEN)
            .map(|_| r.array())
            .collect::<Result<_, _>>()?;
        end(&r)?;
        Ok(Some((DataHeader { ranges }, frames, len)))
    }

    /// Reads a data header from the start of a stream; `Ok(None)` when
    /// more bytes are needed. Returns the header and its length.
    pub fn parse(prefix: &[u8]) -> Result<Option<(DataHeader, usize)>, MessageError> {
        let mut head = Reader::new(prefix);
        let (Ok(kind), Ok(n)) = (head.u8(), head.u32()) else {
            return Ok(None);
        };
        if kind != KIND_DATA {
            return Err(MessageError::UnknownKind(kind));
        }
        let len = data_header_len(n as usize);
        if prefix.len() < len {
            return Ok(None);
        }
        // The hash checked, the kind and count read again from what it covers.
        let mut r = Reader::new(open(&prefix[..len])?);
        r.u8()?;
        let ranges = read_ranges(&mut r)?;
        Ok(Some((DataHeader { ranges }, len)))
    }

    /// Checks the ranges against the files' sizes: every chunk exists and
    /// none is named twice.
    pub fn check(&self, file_sizes: &[u64]) -> Result<(), MessageError> {
        let mut seen: Vec<(u32, u64, u64)> = Vec::with_capacity(self.ranges.len());
        for r in &self.ranges {
            let size = *file_sizes
                .get(r.file as usize)
                .ok_or(MessageError::NoSuchFile(r.file))?;
            let end = r.first.saturating_add(r.count);
            if r.count == 0 || end > chunk_count(size) {
                return Err(MessageError::NoSuchChunk {
                    file: r.file,
                    chunk: end.saturating_sub(1),
                });
            }
            seen.push((r.file, r.first, end));
        }
        seen.sort_unstable();
        for w in seen.windows(2) {
            if w[0].0 == w[1].0 && w[1].1 < w[0].2 {
                return Err(MessageError::RepeatedChunk {
                    file: w[1].0,
                    chunk: w[1].1,
                });
            }
        }
        Ok(())
    }
}

impl Ownership {
    fn encode(&self, out: &mut Vec<u8>) {
        out.push(
            if self.user { OWN_USER } else { 0 }
                | if self.group { OWN_GROUP } else { 0 }
                | if self.numeric { OWN_NUMERIC } else { 0 },
        );
        out.put_u32(self.ids.len() as u32);
        for &(uid, gid) in &self.ids {
            out.put_u32(uid);
            out.put_u32(gid);
        }
        for names in [&self.user_names, &self.group_names] {
            out.put_u32(names.len() as u32);
            for (id, name) in names {
                let name = &name.as_bytes()[..name.len().min(ID_NAME_MAX)];
                out.put_u32(*id);
                out.push(name.len() as u8);
                out.extend_from_slice(name);
            }
        }
    }

    fn decode(r: &mut Reader<'_>) -> Result<Ownership, MessageError> {
        let what = r.u8()?;
        if what & !(OWN_USER | OWN_GROUP | OWN_NUMERIC) != 0 {
            return Err(MessageError::UnknownOptions(what));
        }
        let n = count(r, 8)?;
        let ids = (0..n)
            .map(|_| Ok((r.u32()?, r.u32()?)))
            .collect::<Result<Vec<_>, MessageError>>()?;
        let mut names = || -> Result<Vec<(u32, String)>, MessageError> {
            let n = count(r, 4 + 1)?;
            (0..n)
                .map(|_| {
                    let id = r.u32()?;
                    let len = usize::from(r.u8()?);
                    let name =
                        std::str::from_utf8(r.bytes(len)?).map_err(|_| MessageError::NotUtf8)?;
                    Ok((id, name.to_string()))
                })
                .collect()
        };
        let user_names = names()?;
        let group_names = names()?;
        Ok(Ownership {
            user: what & OWN_USER != 0,
            group: what & OWN_GROUP != 0,
            numeric: what & OWN_NUMERIC != 0,
            ids,
            user_names,
            group_names,
        })
    }
}

/// A data header's ranges, after its kind: a count, then each range (the
/// caller has checked the header's length against the bytes in).
fn read_ranges(r: &mut Reader<'_>) -> Result<Vec<ChunkRange>, MessageError> {
    let n = count(r, 12)?;
    (0..n)
        .map(|_| {
            Ok(ChunkRange {
                file: r.u32()?,
                first: u64::from(r.u32()?),
                count: u64::from(r.u32()?),
            })
        })
        .collect()
}

impl Xattrs {
    fn encode(&self, out: &mut Vec<u8>) {
        out.push(if self.xattrs { XA_XATTRS } else { 0 } | if self.acls { XA_ACLS } else { 0 });
        out.put_u32(self.entries.len() as u32);
        for (entry, attrs) in &self.entries {
            out.put_u32(*entry);
            out.put_u16(attrs.len() as u16);
            for (name, value) in attrs {
                out.push(name.len() as u8);
                out.extend_from_slice(name);
                out.put_u32(value.len() as u32);
                out.extend_from_slice(value);
            }
        }
    }

    /// Every length is checked against its cap before anything is copied:
    /// names of 1 to [`XATTR_NAME_MAX`] bytes, values of at most
    /// [`XATTR_VALUE_MAX`], [`XATTR_ENTRY_BYTES_MAX`] an entry and
    /// [`XATTR_PLAN_BYTES_MAX`] a plan; entries ascending, each named once.
    fn decode(r: &mut Reader<'_>) -> Result<Xattrs, MessageError> {
        let what = r.u8()?;
        if what & !(XA_XATTRS | XA_ACLS) != 0 {
            return Err(MessageError::UnknownOptions(what));
        }
        let n = count(r, 4 + 2)?;
        let mut entries: Vec<(u32, Vec<Xattr>)> = Vec::with_capacity(n);
        let mut plan_bytes = 0usize;
        for _ in 0..n {
            let entry = r.u32()?;
            if entries.last().is_some_and(|(last, _)| *last >= entry) {
                return Err(MessageError::BadXattr("entries out of order"));
            }
            let attrs = count_u16(r, 1 + 1 + 4)?;
            let mut entry_bytes = 0usize;
            let mut list = Vec::with_capacity(attrs);
            for _ in 0..attrs {
                let name_len = usize::from(r.u8()?);
                if name_len == 0 {
                    return Err(MessageError::BadXattr("an empty name"));
                }
                let name = r.bytes(name_len)?;
                let value_len = r.u32()? as usize;
                if value_len > XATTR_VALUE_MAX {
                    return Err(MessageError::BadXattr("a value over 64 KiB"));
                }
                entry_bytes += name_len + value_len;
                plan_bytes += name_len + value_len;
                if entry_bytes > XATTR_ENTRY_BYTES_MAX || plan_bytes > XATTR_PLAN_BYTES_MAX {
                    return Err(MessageError::BadXattr("over the size caps"));
                }
                let value = r.bytes(value_len)?;
                list.push((name.to_vec(), value.to_vec()));
            }
            entries.push((entry, list));
        }
        Ok(Xattrs {
            xattrs: what & XA_XATTRS != 0,
            acls: what & XA_ACLS != 0,
            entries,
        })
    }
}

/// A count of items of at least `item_len` bytes each, in two bytes.
fn count_u16(r: &mut Reader<'_>, item_len: usize) -> Result<usize, MessageError> {
    let n = usize::from(r.u16()?);
    if n.saturating_mul(item_len) > r.remaining() {
        return Err(MessageError::Truncated);
    }
    Ok(n)
}

/// A plan reply's list of what `--delete` removes.
fn read_deletions(r: &mut Reader<'_>) -> Result<Deletions, MessageError> {
    let total = r.u64()?;
    let n = count(r, DELETION_LEN)?;
    if n > DELETIONS_LISTED_MAX || n as u64 > total {
        return Err(MessageError::WrongCount {
            got: n as u64,
            want: total.min(DELETIONS_LISTED_MAX as u64),
        });
    }
    let mut listed = Vec::with_capacity(n);
    for _ in 0..n {
        let is_dir = match r.u8()? {
            0 => false,
            1 => true,
            other => return Err(MessageError::UnknownStatus(other)),
        };
        let len = usize::from(r.u16()?);
        let path = RelPath::new(r.bytes(len)?.to_vec()).map_err(MessageError::DeletedPath)?;
        listed.push((path, is_dir));
    }
    Ok(Deletions { listed, total })
}

/// A `--delete` plan's filter rules: one per line, each one `--filter`
/// reads, within [`PROTECT_RULES_MAX`] bytes.
fn protect_rules(r: &mut Reader<'_>) -> Result<Vec<String>, MessageError> {
    let n = r.u32()? as usize;
    if n > PROTECT_RULES_MAX {
        return Err(MessageError::RulesTooLong(n));
    }
    let text = std::str::from_utf8(r.bytes(n)?).map_err(|_| MessageError::NotUtf8)?;
    if text.is_empty() {
        return Ok(Vec::new());
    }
    let mut check = super::exclude::Filters::default();
    text.split('\n')
        .map(|rule| {
            check
                .add_rule(rule)
                .map_err(|e| MessageError::BadRule(rule.to_string(), e.to_string()))?;
            Ok(rule.to_string())
        })
        .collect()
}

/// Each part names a file of the manifest once, in ascending order, and
/// a non-empty range of its chunks that is not all of them: a receiver
/// then never waits on, or records, a chunk that does not exist.
fn check_parts(parts: &[FilePart], file_sizes: &[u64]) -> Result<(), MessageError> {
    let mut last = None;
    for (index, p) in parts.iter().enumerate() {
        let bad = |why| Err(MessageError::BadPart { index, why });
        let Some(&size) = file_sizes.get(p.file as usize) else {
            return bad("no such file in the manifest");
        };
        if last.is_some_and(|l| p.file <= l) {
            return bad("files out of order, or named twice");
        }
        last = Some(p.file);
        let chunks = chunk_count(size);
        if p.chunks.is_empty() || p.chunks.end > chunks {
            return bad("an empty range, or chunks the file does not have");
        }
        if p.chunks.start == 0 && p.chunks.end == chunks {
            return bad("every chunk of the file: not a part");
        }
    }
    Ok(())
}

/// Each same-file pair names two files of the manifest of one size, not
/// empty and neither sent in part, the copy after its original, copies
/// ascending and each named once, and no original a copy itself: the
/// receiver then writes a copy only from chunks it is sent.
fn check_same(
    same: &[SameFile],
    parts: &[FilePart],
    file_sizes: &[u64],
) -> Result<(), MessageError> {
    let copies: std::collections::HashSet<u32> = same.iter().map(|s| s.file).collect();
    let in_part = |f: u32| parts.binary_search_by_key(&f, |p| p.file).is_ok();
    let mut last = None;
    for (index, s) in same.iter().enumerate() {
        let bad = |why| Err(MessageError::BadSame { index, why });
        let (Some(&size), Some(&of_size)) = (
            file_sizes.get(s.file as usize),
            file_sizes.get(s.of as usize),
        ) else {
            return bad("no such file in the manifest");
        };
        if last.is_some_and(|l| s.file <= l) {
            return bad("files out of order, or named twice");
        }
        last = Some(s.file);
        if s.of >= s.file || copies.contains(&s.of) {
            return bad("an original after its copy, or one that is a copy itself");
        }
        if size != of_size || size == 0 {
            return bad("files of different sizes, or empty");
        }
        if in_part(s.file) || in_part(s.of) {
            return bad("a file sent in part");
        }
    }
    Ok(())
}

/// Encodes a finish request.
pub fn encode_finish(hashes: &[Cv]) -> Vec<u8> {
    let mut out = Vec::with_capacity(5 + hashes.len() * 32);
    out.push(KIND_FINISH);
    out.put_u32(hashes.len() as u32);
    for h in hashes {
        out.extend_from_slice(h);
    }
    seal(out)
}

/// Encodes an abort request.
pub fn encode_abort(why: &str) -> Vec<u8> {
    let mut out = vec![KIND_ABORT];
    put_text(&mut out, why);
    seal(out)
}

impl Request {
    /// Decodes a whole plan or finish request. (A data stream is read with
    /// [`DataHeader::parse`] as it arrives.)
    pub fn decode(bytes: &[u8]) -> Result<Request, MessageError> {
        if bytes.first() == Some(&KIND_DATA) {
            return match DataHeader::parse(bytes)? {
                Some((h, len)) if len == bytes.len() => Ok(Request::Data(h)),
                Some((_, len)) => Err(MessageError::TrailingBytes(bytes.len() - len)),
                None => Err(MessageError::Truncated),
            };
        }
        let mut r = Reader::new(open(bytes)?);
        match r.u8()? {
            KIND_PLAN => {
                let version = r.u8()?;
                if !(SESSION_VERSION_FIRST..=SESSION_VERSION).contains(&version) {
                    return Err(MessageError::Version(version));
                }
                // Every bit is known (OPTS_KNOWN).
                let opts = r.u8()?;
                let opts2 = if version >= 2 { r.u8()? } else { 0 };
                if opts2 & !OPTS2_KNOWN != 0 {
                    return Err(MessageError::UnknownOptions(opts2 & !OPTS2_KNOWN));
                }
                let n = usize::from(r.u16()?);
                let subdir = r.bytes(n)?;
                let subdir = if subdir.is_empty() {
                    None
                } else {
                    Some(RelPath::new(subdir.to_vec()).map_err(MessageError::Subdir)?)
                };
                let mut parts = Vec::new();
                if opts & OPT_PARTS != 0 {
                    let n = count(&mut r, PART_LEN)?;
                    for _ in 0..n {
                        let file = r.u32()?;
                        let start = r.u64()?;
                        let end = r.u64()?;
                        parts.push(FilePart {
                            file,
                            chunks: start..end,
                        });
                    }
                }
                let protect = if opts2 & OPT2_DELETE != 0 {
                    protect_rules(&mut r)?
                } else {
                    Vec::new()
                };
                let owners = if opts2 & OPT2_OWNERS != 0 {
                    Some(Ownership::decode(&mut r)?)
                } else {
                    None
                };
                let xattrs = if opts2 & OPT2_XATTRS != 0 {
                    Some(Xattrs::decode(&mut r)?)
                } else {
                    None
                };
                let same = if opts2 & OPT2_SAME != 0 {
                    let n = count(&mut r, SAME_LEN)?;
                    (0..n)
                        .map(|_| {
                            Ok(SameFile {
                                file: r.u32()?,
                                of: r.u32()?,
                            })
                        })
                        .collect::<Result<Vec<_>, MessageError>>()?
                } else {
                    Vec::new()
                };
                let manifest = Manifest::decode(r.rest())?;
                let sizes = super::file_sizes(&manifest);
                check_parts(&parts, &sizes)?;
                check_same(&same, &parts, &sizes)?;
                if let Some((last, _)) = xattrs.as_ref().and_then(|x| x.entries.last()) {
                    if *last as usize >= manifest.entries.len() {
                        return Err(MessageError::NoSuchFile(*last));
                    }
                }
                if let Some(own) = &owners {
                    if own.ids.len() != manifest.entries.len() {
                        return Err(MessageError::WrongCount {
                            got: own.ids.len() as u64,
                            want: manifest.entries.len() as u64,
                        });
                    }
                }
                Ok(Request::Plan(Box::new(PlanRequest {
                    options: Options {
                        overwrite: opts & OPT_OVERWRITE != 0,
                        skip_existing: opts & OPT_SKIP_EXISTING != 0,
                        fsync: opts & OPT_FSYNC != 0,
                        checksum: opts & OPT_CHECKSUM != 0,
                        dry_run: opts & OPT_DRY_RUN != 0,
                        shard: opts & OPT_SHARD != 0,
                        finish_ahead: opts & OPT_FINISH_AHEAD != 0,
                        compress: opts2 & OPT2_COMPRESS != 0,
                        delete: opts2 & OPT2_DELETE != 0,
                    },
                    subdir,
                    manifest,
                    parts,
                    protect,
                    owners,
                    xattrs,
                    same,
                })))
            }
            KIND_ABORT => {
                let why = text(&mut r)?;
                end(&r)?;
                Ok(Request::Abort(why))
            }
            KIND_FINISH => {
                let n = count(&mut r, 32)?;
                let hashes = (0..n).map(|_| cv(&mut r)).collect::<Result<_, _>>()?;
                end(&r)?;
                Ok(Request::Finish(hashes))
            }
            other => Err(MessageError::UnknownKind(other)),
        }
    }
}

/// What the receiver will do with one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FilePlan {
    /// Send every chunk.
    SendAll,
    /// An identical file is already there (`--skip-existing`).
    Skip,
    /// A partial file from an earlier attempt: the BLAKE3 value of each of
    /// its chunks as it stands. Chunks whose value matches the sender's are
    /// not sent again.
    Held(Vec<Cv>),
    /// Written from the chunks of the file the plan named it the same as
    /// ([`SameFile`]), as they are written: none of its own is sent. Only
    /// ever the answer for a file the plan so named.
    Copy,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlanReply {
    Refused(String),
    /// The receiver is at one of its limits now: come back after about
    /// `retry_after`. Nothing of the session is kept.
    Busy {
        retry_after: std::time::Duration,
        why: String,
    },
    Accepted {
        /// One plan per file, in file order.
        plans: Vec<FilePlan>,
        /// What `--delete` removes at the finish (or, in a dry run, would);
        /// `None` when the plan did not ask.
        deletions: Option<Deletions>,
    },
}

/// What `--delete` removes: the entries in the manifest's directories that
/// the manifest does not list, each named once (a directory stands for
/// what it holds).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Deletions {
    /// The first [`DELETIONS_LISTED_MAX`] of them, paths relative to
    /// DEST/SUBDIR as the manifest's are, and whether each is a directory.
    pub listed: Vec<(RelPath, bool)>,
    /// How many in all.
    pub total: u64,
}

/// Bytes of a listed deletion besides its path: the kind and the length.
const DELETION_LEN: usize = 1 + 2;

const STATUS_OK: u8 = 0;
const STATUS_FAILED: u8 = 1;
/// An [`Outcome`] only: the receiver will not (a file in the way, found
/// once the data came), and the one that says a file's hash differs.
const STATUS_REFUSED: u8 = 2;
const STATUS_MISMATCH: u8 = 3;
/// A [`PlanReply`] only: busy now, with when to come back (ms, u32).
const STATUS_BUSY: u8 = 4;

/// A failure: its status, the longest text, the hash.
fn failed_max_len() -> u64 {
    (1 + 2 + MESSAGE_MAX + SEAL_LEN) as u64
}
const PLAN_SEND_ALL: u8 = 0;
const PLAN_SKIP: u8 = 1;
const PLAN_HELD: u8 = 2;
const PLAN_COPY: u8 = 3;

impl PlanReply {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        match self {
            PlanReply::Refused(why) => {
                out.push(STATUS_FAILED);
                put_text(&mut out, why);
            }
            PlanReply::Busy { retry_after, why } => {
                out.push(STATUS_BUSY);
                let ms = u32::try_from(retry_after.as_millis()).unwrap_or(u32::MAX);
                out.put_u32(ms);
                put_text(&mut out, why);
            }
            PlanReply::Accepted { plans, deletions } => {
                out.push(STATUS_OK);
                out.put_u32(plans.len() as u32);
                for f in plans {
                    match f {
                        FilePlan::SendAll => out.push(PLAN_SEND_ALL),
                        FilePlan::Skip => out.push(PLAN_SKIP),
                        FilePlan::Copy => out.push(PLAN_COPY),
                        FilePlan::Held(cvs) => {
                            out.push(PLAN_HELD);
                            out.put_u32(cvs.len() as u32);
                            for cv in cvs {
                                out.extend_from_slice(cv);
                            }
                        }
                    }
                }
                if let Some(d) = deletions {
                    let mut bytes = 0;
                    let fits = d
                        .listed
                        .iter()
                        .take(DELETIONS_LISTED_MAX)
                        .take_while(|(p, _)| {
                            bytes += p.as_bytes().len();
                            bytes <= DELETIONS_LISTED_BYTES
                        });
                    let listed = &d.listed[..fits.count()];
                    out.put_u64(d.total.max(listed.len() as u64));
                    out.put_u32(listed.len() as u32);
                    for (path, is_dir) in listed {
                        out.push(u8::from(*is_dir));
                        out.put_u16(path.as_bytes().len() as u16);
                        out.extend_from_slice(path.as_bytes());
                    }
                }
            }
        }
        seal(out)
    }

    /// The longest plan reply a manifest whose files have these sizes can
    /// get: every file held in part (a status, a count and a value per
    /// chunk), or a refusal, and with `deletions` the longest list of them;
    /// so the client never accepts more.
    pub fn max_len(file_sizes: &[u64], deletions: bool) -> u64 {
        let held = file_sizes
            .iter()
            .fold(1 + 4 + SEAL_LEN as u64, |sum, &size| {
                sum.saturating_add(chunk_count(size).saturating_mul(32).saturating_add(1 + 4))
            });
        let listed = if deletions {
            (8 + 4 + DELETIONS_LISTED_MAX * DELETION_LEN + DELETIONS_LISTED_BYTES) as u64
        } else {
            0
        };
        held.saturating_add(listed).max(failed_max_len() + 4)
    }

    /// Decodes a plan reply for a manifest whose files have these sizes;
    /// `deletions`: the plan asked for `--delete`, so a list of them ends
    /// the answer.
    pub fn decode(
        bytes: &[u8],
        file_sizes: &[u64],
        deletions: bool,
    ) -> Result<PlanReply, MessageError> {
        let mut r = Reader::new(open(bytes)?);
        let reply = match r.u8()? {
            STATUS_FAILED => PlanReply::Refused(text(&mut r)?),
            STATUS_BUSY => PlanReply::Busy {
                retry_after: std::time::Duration::from_millis(u64::from(r.u32()?)),
                why: text(&mut r)?,
            },
            STATUS_OK => {
                let n = count(&mut r, 1)?;
                if n != file_sizes.len() {
                    return Err(MessageError::WrongCount {
                        got: n as u64,
                        want: file_sizes.len() as u64,
                    });
                }
                let mut files = Vec::with_capacity(n);
                for &size in file_sizes {
                    files.push(match r.u8()? {
                        PLAN_SEND_ALL => FilePlan::SendAll,
                        PLAN_SKIP => FilePlan::Skip,
                        PLAN_COPY => FilePlan::Copy,
                        PLAN_HELD => {
                            let k = count(&mut r, 32)?;
                            if k as u64 != chunk_count(size) {
                                return Err(MessageError::WrongCount {
                                    got: k as u64,
                                    want: chunk_count(size),
                                });
                            }
                            FilePlan::Held((0..k).map(|_| cv(&mut r)).collect::<Result<_, _>>()?)
                        }
                        other => return Err(MessageError::UnknownStatus(other)),
                    });
                }
                let deletions = if deletions {
                    Some(read_deletions(&mut r)?)
                } else {
                    None
                };
                PlanReply::Accepted {
                    plans: files,
                    deletions,
                }
            }
            other => return Err(MessageError::UnknownStatus(other)),
        };
        end(&r)?;
        Ok(reply)
    }
}

/// A chunk, by file number and index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ChunkRef {
    pub file: u32,
    pub chunk: u64,
}

/// The answer to a data stream, or to a finish request: done (with the
/// chunks that failed their check, for a data stream), or not and why.
/// The kinds of "not" are apart so that the sender can tell its user (and
/// a script, by the exit status) whether to retry, change the command, or
/// look at the data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Done {
        bad: Vec<ChunkRef>,
    },
    /// The receiver failed: its disk, its limits, the session's end.
    Failed(String),
    /// The receiver will not: a file in the way, found once the data came
    /// (`--checksum` without `--overwrite`).
    Refused(String),
    /// A file's whole BLAKE3 hash at the receiver differs from the sender's.
    Mismatch(String),
}

impl Outcome {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        match self {
            Outcome::Done { bad } => {
                out.push(STATUS_OK);
                out.put_u32(bad.len() as u32);
                for c in bad {
                    out.put_u32(c.file);
                    out.put_u32(c.chunk as u32);
                }
            }
            Outcome::Failed(why) | Outcome::Refused(why) | Outcome::Mismatch(why) => {
                out.push(match self {
                    Outcome::Refused(_) => STATUS_REFUSED,
                    Outcome::Mismatch(_) => STATUS_MISMATCH,
                    _ => STATUS_FAILED,
                });
                put_text(&mut out, why);
            }
        }
        seal(out)
    }

    /// The longest answer to a stream of `chunks` chunks (every one
    /// failed its check) or to a finish (`chunks` 0): so the client never
    /// accepts more.
    pub fn max_len(chunks: u64) -> u64 {
        let done = chunks
            .saturating_mul(8)
            .saturating_add(1 + 4 + SEAL_LEN as u64);
        done.max(failed_max_len())
    }

    pub fn decode(bytes: &[u8]) -> Result<Outcome, MessageError> {
        let mut r = Reader::new(open(bytes)?);
        let outcome = match r.u8()? {
            STATUS_OK => {
                let n = count(&mut r, 8)?;
                let bad = (0..n)
                    .map(|_| {
                        Ok(ChunkRef {
                            file: r.u32()?,
                            chunk: u64::from(r.u32()?),
                        })
                    })
                    .collect::<Result<_, MessageError>>()?;
                Outcome::Done { bad }
            }
            STATUS_FAILED => Outcome::Failed(text(&mut r)?),
            STATUS_REFUSED => Outcome::Refused(text(&mut r)?),
            STATUS_MISMATCH => Outcome::Mismatch(text(&mut r)?),
            other => return Err(MessageError::UnknownStatus(other)),
        };
        end(&r)?;
        Ok(outcome)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transfer::manifest::{Entry, EntryKind};

    fn rel(s: &str) -> RelPath {
        RelPath::new(s.as_bytes().to_vec()).unwrap()
    }

    fn manifest() -> Manifest {
        let entry = |path: &str, kind| Entry {
            path: rel(path),
            kind,
            mode: 0o644,
            mtime_sec: 1_700_000_000,
            mtime_nsec: 5,
        };
        Manifest {
            entries: vec![
                entry("d", EntryKind::Dir),
                entry("d/a", EntryKind::File { size: 3 << 20 }),
                entry("d/b", EntryKind::File { size: 0 }),
            ],
        }
    }

    #[test]
    fn requests_round_trip_and_every_truncation_fails() {
        let plan = PlanRequest {
            options: Options {
                overwrite: true,
                skip_existing: false,
                fsync: true,
                checksum: true,
                dry_run: true,
                shard: true,
                finish_ahead: true,
                delete: false,
                compress: false,
            },
            subdir: Some(rel("in/here")),
            manifest: manifest(),
            parts: vec![FilePart {
                file: 0,
                chunks: 1..3,
            }],
            protect: Vec::new(),
            owners: None,
            xattrs: None,
            same: Vec::new(),
        };
        let mirror = PlanRequest {
            options: Options {
                delete: true,
                ..Options::default()
            },
            subdir: None,
            manifest: manifest(),
            parts: Vec::new(),
            protect: vec!["- *.o".into(), "+ keep/".into()],
            owners: Some(Ownership {
                user: true,
                group: true,
                numeric: false,
                ids: vec![(1000, 100), (0, 0), (1000, 65534)],
                user_names: vec![(0, "root".into()), (1000, "alice".into())],
                group_names: vec![(0, "root".into())],
            }),
            xattrs: Some(Xattrs {
                xattrs: true,
                acls: true,
                entries: vec![
                    (0, vec![(b"user.a".to_vec(), vec![0; XATTR_VALUE_MAX])]),
                    (
                        2,
                        vec![
                            (b"user.b".to_vec(), Vec::new()),
                            (b"user.c".to_vec(), b"x".to_vec()),
                        ],
                    ),
                ],
            }),
            same: Vec::new(),
        };
        let header = DataHeader {
            ranges: vec![ChunkRange {
                file: 0,
                first: 1,
                count: 2,
            }],
        };
        // Only a plan that asks for something of the second option byte
        // is written in the version that has it: older receivers still
        // take the rest.
        assert_eq!(plan.encode()[1], SESSION_VERSION_FIRST);
        assert_eq!(mirror.encode()[1], SESSION_VERSION);
        let cases = [
            (plan.encode(), Request::Plan(Box::new(plan))),
            (mirror.encode(), Request::Plan(Box::new(mirror))),
            (header.encode(), Request::Data(header)),
            (
                encode_finish(&[[7; 32], [9; 32]]),
                Request::Finish(vec![[7; 32], [9; 32]]),
            ),
        ];
        for (bytes, want) in cases {
            assert_eq!(Request::decode(&bytes).unwrap(), want);
            for cut in 0..bytes.len() {
                assert!(Request::decode(&bytes[..cut]).is_err(), "cut {cut}");
            }
        }
    }

    /// A hostile plan's parts: a file that is not there, named twice or
    /// out of order, an empty range, chunks past the end, or every chunk.
    #[test]
    fn parts_that_name_no_real_part_of_a_file_are_refused() {
        // manifest(): file 0 has 3 chunks, file 1 none.
        let plan = |parts: Vec<(u32, std::ops::Range<u64>)>| {
            PlanRequest {
                parts: parts
                    .into_iter()
                    .map(|(file, chunks)| FilePart { file, chunks })
                    .collect(),
                ..bare_plan()
            }
            .encode()
        };
        let ok = plan(vec![(0, 2..3)]);
        assert!(matches!(Request::decode(&ok), Ok(Request::Plan(p)) if p.parts.len() == 1));
        for (parts, why) in [
            (vec![(2, 0..1)], "no such file"),
            (vec![(1, 0..1)], "chunks the file does not have"),
            (vec![(0, 1..1)], "an empty range"),
            (vec![(0, 2..4)], "chunks the file does not have"),
            (vec![(0, 0..3)], "not a part"),
            (vec![(0, 0..1), (0, 1..2)], "named twice"),
        ] {
            let e = Request::decode(&plan(parts.clone())).unwrap_err();
            assert!(e.to_string().contains(why), "{parts:?}: {e}");
        }
    }

    /// A hostile plan's same-file pairs: each must name two files of the
    /// manifest of one size, not empty, the original first and not itself
    /// a copy, neither sent in part, copies ascending and once each; a
    /// good one goes and comes back as it was.
    #[test]
    fn same_file_pairs_that_could_copy_what_was_not_sent_are_refused() {
        let file = |path: &str, size| Entry {
            path: rel(path),
            kind: EntryKind::File { size },
            mode: 0o644,
            mtime_sec: 0,
            mtime_nsec: 0,
        };
        // Files 0, 1, 2 and 4 of 5 MiB, 3 of 7 bytes, 5 and 6 empty.
        let manifest = Manifest {
            entries: vec![
                file("a", 5 << 20),
                file("b", 5 << 20),
                file("c", 5 << 20),
                file("d", 7),
                file("e", 5 << 20),
                file("f", 0),
                file("g", 0),
            ],
        };
        let plan = |same: &[(u32, u32)], parts: Vec<FilePart>| {
            PlanRequest {
                manifest: manifest.clone(),
                same: same
                    .iter()
                    .map(|&(file, of)| SameFile { file, of })
                    .collect(),
                parts,
                ..bare_plan()
            }
            .encode()
        };
        let ok = plan(&[(1, 0), (2, 0), (4, 0)], Vec::new());
        let Ok(Request::Plan(p)) = Request::decode(&ok) else {
            panic!("a good plan refused");
        };
        let pairs: Vec<(u32, u32)> = p.same.iter().map(|s| (s.file, s.of)).collect();
        assert_eq!(pairs, [(1, 0), (2, 0), (4, 0)]);
        for cut in 0..ok.len() {
            assert!(Request::decode(&ok[..cut]).is_err(), "cut {cut}");
        }
        let part = || {
            vec![FilePart {
                file: 2,
                chunks: 0..1,
            }]
        };
        for (same, parts, why) in [
            (vec![(7, 0)], Vec::new(), "no such file"),
            (vec![(1, 9)], Vec::new(), "no such file"),
            (vec![(3, 0)], Vec::new(), "different sizes"),
            (vec![(6, 5)], Vec::new(), "empty"),
            (vec![(0, 1)], Vec::new(), "an original after its copy"),
            (vec![(1, 1)], Vec::new(), "an original after its copy"),
            (vec![(1, 0), (2, 1)], Vec::new(), "a copy itself"),
            (vec![(2, 0), (1, 0)], Vec::new(), "out of order"),
            (vec![(2, 0), (2, 1)], Vec::new(), "named twice"),
            (vec![(2, 0)], part(), "in part"),
            (vec![(4, 2)], part(), "in part"),
        ] {
            let e = Request::decode(&plan(&same, parts)).unwrap_err();
            assert!(e.to_string().contains(why), "{same:?}: {e}");
        }
        // Without any, the plan is what it was before the bit.
        assert_eq!(
            plan(&[], Vec::new()),
            PlanRequest {
                manifest: manifest.clone(),
                ..bare_plan()
            }
            .encode()
        );
    }

    /// A plan of `manifest()` asking nothing more.
    fn bare_plan() -> PlanRequest {
        PlanRequest {
            options: Options::default(),
            subdir: None,
            manifest: manifest(),
            parts: Vec::new(),
            protect: Vec::new(),
            owners: None,
            xattrs: None,
            same: Vec::new(),
        }
    }

    #[test]
    fn a_flipped_bit_anywhere_is_caught() {
        let bytes = bare_plan().encode();
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x10;
            assert!(Request::decode(&bad).is_err(), "byte {i}");
        }
        let mut o = Outcome::Failed("disk full".into()).encode();
        o[3] ^= 1;
        assert_eq!(Outcome::decode(&o), Err(MessageError::Corrupt));
    }

    #[test]
    fn a_subdir_that_climbs_out_is_refused() {
        let mut bytes = PlanRequest {
            subdir: Some(rel("ab")),
            ..bare_plan()
        }
        .encode();
        bytes[5..7].copy_from_slice(b"..");
        // Sealed again, as a hostile sender would.
        bytes.truncate(bytes.len() - SEAL_LEN);
        let bytes = seal(bytes);
        assert!(matches!(
            Request::decode(&bytes),
            Err(MessageError::Subdir(_))
        ));
    }

    #[test]
    fn data_headers_are_checked_against_the_files() {
        let sizes = [3 << 20, 0];
        let h = |file, first, count| DataHeader {
            ranges: vec![ChunkRange { file, first, count }],
        };
        assert!(h(0, 0, 3).check(&sizes).is_ok());
        assert!(h(0, 2, 2).check(&sizes).is_err(), "past the last chunk");
        assert!(h(1, 0, 1).check(&sizes).is_err(), "an empty file has none");
        assert!(h(2, 0, 1).check(&sizes).is_err(), "no such file");
        let twice = DataHeader {
            ranges: vec![
                ChunkRange {
                    file: 0,
                    first: 0,
                    count: 2,
                },
                ChunkRange {
                    file: 0,
                    first: 1,
                    count: 1,
                },
            ],
        };
        assert!(matches!(
            twice.check(&sizes),
            Err(MessageError::RepeatedChunk { chunk: 1, .. })
        ));
        // Parsing waits for the whole header.
        let bytes = h(0, 0, 3).encode();
        assert_eq!(DataHeader::parse(&bytes[..7]).unwrap(), None);
        assert_eq!(
            DataHeader::parse(&bytes).unwrap(),
            Some((h(0, 0, 3), bytes.len()))
        );
    }

    /// A framed header carries a frame header per chunk; its length is
    /// known once its ranges are in; a flipped bit or a cut is refused.
    #[test]
    fn framed_headers_round_trip_and_say_their_length_early() {
        use crate::transfer::compress::{Encoding, FrameHeader};
        let header = DataHeader {
            ranges: vec![
                ChunkRange {
                    file: 0,
                    first: 1,
                    count: 2,
                },
                ChunkRange {
                    file: 2,
                    first: 0,
                    count: 1,
                },
            ],
        };
        let frame = |encoding, wire_len| FrameHeader { encoding, wire_len }.encode();
        let frames = [
            frame(Encoding::Zstd, 7),
            frame(Encoding::Raw, 9),
            frame(Encoding::Zstd, 3),
        ];
        let bytes = header.encode_framed(&frames);
        assert_eq!(bytes.len() as u64, framed_header_len(2, 3));
        assert!(is_data_kind(bytes[0]));
        assert_eq!(data_header_len_of(&bytes[..5 + 23]), None, "ranges not in");
        assert_eq!(
            data_header_len_of(&bytes[..5 + 24]),
            Some(bytes.len() as u64)
        );
        let mut longer = bytes.clone();
        longer.extend_from_slice(b"chunk bytes");
        assert_eq!(
            DataHeader::parse_framed(&longer).unwrap(),
            Some((header.clone(), frames.to_vec(), bytes.len()))
        );
        for cut in 0..bytes.len() {
            assert_eq!(DataHeader::parse_framed(&bytes[..cut]).unwrap(), None);
        }
        let mut bad = bytes.clone();
        bad[bytes.len() - 40] ^= 1;
        assert_eq!(
            DataHeader::parse_framed(&bad),
            Err(MessageError::Corrupt),
            "a frame's length changed"
        );
        assert!(DataHeader::parse(&bytes).is_err(), "not a plain header");
        assert!(DataHeader::parse_framed(&header.encode()).is_err());
    }

    /// `--compress` goes as a second byte of options under version 2, and
    /// only then: a plan without it is what any receiver reads.
    #[test]
    fn only_a_compressed_plan_takes_the_second_options_byte() {
        let plan = |compress| PlanRequest {
            options: Options {
                compress,
                ..Options::default()
            },
            ..bare_plan()
        };
        let plain = plan(false).encode();
        let compressed = plan(true).encode();
        assert_eq!(plain[1], SESSION_VERSION_FIRST);
        assert_eq!(compressed[1], SESSION_VERSION);
        assert_eq!(compressed[3], OPT2_COMPRESS);
        assert_eq!(compressed.len(), plain.len() + 1);
        for (bytes, compress) in [(plain, false), (compressed, true)] {
            let Request::Plan(p) = Request::decode(&bytes).unwrap() else {
                panic!()
            };
            assert_eq!(p.options.compress, compress);
        }
        // A second byte with a bit this build does not know is refused.
        let mut unknown = plan(true).encode();
        unknown.truncate(unknown.len() - SEAL_LEN);
        unknown[3] |= 0x80;
        assert_eq!(
            Request::decode(&seal(unknown)),
            Err(MessageError::UnknownOptions(0x80))
        );
    }

    #[test]
    fn replies_round_trip() {
        let sizes = [3 << 20, 0, 5];
        let plans = vec![
            FilePlan::Held(vec![[1; 32], [2; 32], [3; 32]]),
            FilePlan::SendAll,
            FilePlan::Skip,
        ];
        let plan = accepted(plans.clone());
        assert_eq!(
            PlanReply::decode(&plan.encode(), &sizes, false).unwrap(),
            plan
        );
        let mirror = PlanReply::Accepted {
            plans,
            deletions: Some(Deletions {
                listed: vec![(rel("d/old"), true), (rel("d/x"), false)],
                total: 7,
            }),
        };
        assert_eq!(
            PlanReply::decode(&mirror.encode(), &sizes, true).unwrap(),
            mirror
        );
        // Each side knows whether the plan asked: a list where none was
        // asked for, or none where one was, does not decode.
        assert!(PlanReply::decode(&mirror.encode(), &sizes, false).is_err());
        assert!(PlanReply::decode(&plan.encode(), &sizes, true).is_err());
        let wrong = accepted(vec![FilePlan::Held(vec![[1; 32]])]);
        assert!(PlanReply::decode(&wrong.encode(), &sizes[..1], false).is_err());
        let refused = PlanReply::Refused("no room".into());
        assert_eq!(
            PlanReply::decode(&refused.encode(), &sizes, false).unwrap(),
            refused
        );
        let busy = PlanReply::Busy {
            retry_after: std::time::Duration::from_millis(1500),
            why: "x".repeat(MESSAGE_MAX),
        };
        assert_eq!(
            PlanReply::decode(&busy.encode(), &sizes, false).unwrap(),
            busy
        );
        for o in [
            Outcome::Done {
                bad: vec![ChunkRef { file: 3, chunk: 9 }],
            },
            Outcome::Failed("disk full".into()),
            Outcome::Refused("in the way".into()),
            Outcome::Mismatch("changed".into()),
        ] {
            assert_eq!(Outcome::decode(&o.encode()).unwrap(), o);
        }
        // A long message is cut at a character boundary, not mid-character.
        let long = "é".repeat(3000);
        let Outcome::Failed(back) = Outcome::decode(&Outcome::Failed(long).encode()).unwrap()
        else {
            panic!()
        };
        assert!(back.len() <= MESSAGE_MAX && back.chars().all(|c| c == 'é'));
    }

    /// The reply limits a client sets are never below what an honest
    /// receiver sends: the longest of each kind fits exactly or with room.
    #[test]
    fn reply_limits_hold_the_longest_honest_replies() {
        let sizes = [200 << 20, 0, 5];
        let held = vec![
            FilePlan::Held(vec![[1; 32]; 200]),
            FilePlan::Held(vec![]),
            FilePlan::Held(vec![[2; 32]]),
        ];
        let len = accepted(held.clone()).encode().len() as u64;
        assert_eq!(len, PlanReply::max_len(&sizes, false));
        // The longest list of deletions: as many names as are listed,
        // their bytes up to the limit.
        let name = |i: usize| rel(&format!("{i:0>199}"));
        let most = DELETIONS_LISTED_BYTES / 199;
        let mirror = PlanReply::Accepted {
            plans: held,
            deletions: Some(Deletions {
                listed: (0..most + 5).map(|i| (name(i), false)).collect(),
                total: 1 << 40,
            }),
        };
        let bytes = mirror.encode();
        assert!(bytes.len() as u64 <= PlanReply::max_len(&sizes, true));
        let PlanReply::Accepted {
            deletions: Some(back),
            ..
        } = PlanReply::decode(&bytes, &sizes, true).unwrap()
        else {
            panic!("not accepted")
        };
        assert_eq!((back.listed.len(), back.total), (most, 1 << 40));
        let refused = PlanReply::Refused("x".repeat(5000)).encode();
        let busy = PlanReply::Busy {
            retry_after: std::time::Duration::from_secs(1),
            why: "x".repeat(5000),
        }
        .encode();
        assert_eq!(refused.len() as u64 + 4, PlanReply::max_len(&[], false));
        assert_eq!(busy.len() as u64, PlanReply::max_len(&[], false));
        let bad = vec![ChunkRef { file: 1, chunk: 2 }; 1000];
        let done = Outcome::Done { bad }.encode();
        assert_eq!(done.len() as u64, Outcome::max_len(1000));
        let failed = Outcome::Failed("y".repeat(5000)).encode();
        assert_eq!(failed.len() as u64, Outcome::max_len(0));
        // A manifest's worth of huge files saturates instead of wrapping.
        assert_eq!(PlanReply::max_len(&vec![u64::MAX; 1 << 16], true), u64::MAX);
    }

    fn accepted(plans: Vec<FilePlan>) -> PlanReply {
        PlanReply::Accepted {
            plans,
            deletions: None,
        }
    }

    /// A `--delete` plan's rules are the sender's to choose: each must be
    /// one `--filter` reads, within the budget; an option bit of the
    /// second byte that this receiver does not know refuses the plan.
    #[test]
    fn a_mirrors_rules_and_unknown_second_options_are_checked() {
        let mirror = |protect: Vec<String>| {
            PlanRequest {
                options: Options {
                    delete: true,
                    ..Options::default()
                },
                protect,
                ..bare_plan()
            }
            .encode()
        };
        let refused = |bytes: Vec<u8>| Request::decode(&bytes).unwrap_err().to_string();
        assert!(refused(mirror(vec!["merge .rules".into()])).contains("merge .rules"));
        let long = vec![format!("- {}", "x".repeat(1000)); 70];
        assert!(refused(mirror(long)).contains("filter rules of"));
        // The option byte after the first, with a bit no receiver knows.
        let mut body = mirror(Vec::new());
        body.truncate(body.len() - SEAL_LEN);
        body[3] |= 0x80;
        assert!(refused(seal(body)).contains("unknown option bits 0x80"));
        // Owners for fewer entries than the manifest has.
        let short = PlanRequest {
            owners: Some(Ownership {
                user: true,
                ids: vec![(1, 1); 2],
                ..Ownership::default()
            }),
            ..bare_plan()
        };
        assert!(refused(short.encode()).contains("2 values for 3 items"));
        // Attributes: each cap and rule a hostile sender could break.
        let with = |entries: Vec<(u32, Vec<Xattr>)>| {
            PlanRequest {
                xattrs: Some(Xattrs {
                    xattrs: true,
                    acls: false,
                    entries,
                }),
                ..bare_plan()
            }
            .encode()
        };
        let attr = |len: usize| vec![(b"user.x".to_vec(), vec![7; len])];
        assert!(refused(with(vec![(0, attr(XATTR_VALUE_MAX + 1))])).contains("over 64 KiB"));
        assert!(refused(with(vec![(3, attr(1))])).contains("file number 3"));
        assert!(refused(with(vec![(1, attr(1)), (1, attr(1))])).contains("out of order"));
        assert!(refused(with(vec![(0, vec![(Vec::new(), Vec::new())])])).contains("empty name"));
        let many = (0..XATTR_ENTRY_BYTES_MAX / XATTR_VALUE_MAX + 1)
            .map(|i| (format!("user.{i}").into_bytes(), vec![0; XATTR_VALUE_MAX]))
            .collect();
        assert!(refused(with(vec![(0, many)])).contains("over the size caps"));
        // A value longer than what is left: truncated, nothing allocated.
        let mut body = with(vec![(0, attr(1000))]);
        body.truncate(body.len() - SEAL_LEN);
        let at = body
            .windows(4)
            .position(|w| w == 1000u32.to_be_bytes())
            .unwrap();
        body[at..at + 4].copy_from_slice(&60_000u32.to_be_bytes());
        assert!(refused(seal(body)).contains("truncated"));
    }
}

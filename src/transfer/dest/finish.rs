//! The finish: each file's BLAKE3 hash checked against the sender's before
//! it takes its name (a split file's part checked and recorded, the file
//! placed by whichever part completes it), the symlinks made, and the
//! directories given their modes and mtimes, deepest first.

use std::collections::HashSet;
use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering;

use super::plan::{link_target_rel, DirCache};
use super::{
    pending_dir_record, split_rel, staging_key, to_system_time, DestError, FileTarget, Part,
    Prepared,
};
use crate::io::dest_dir::{self, STAGING_DIR};
use crate::transfer::hash::{file_hash, part_digest, short_hex, Cv};
use crate::transfer::manifest::EntryKind;
use crate::transfer::parts::{self, PartError, Recorded};
use crate::transfer::Error;

/// What the finish did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Finished {
    pub files: u64,
    /// Files split across shards whose part this session recorded, and
    /// which wait for other shards' parts before they take their name.
    pub waiting: u64,
    pub dirs: u64,
    pub symlinks: u64,
    pub hard_links: u64,
    pub skipped: u64,
    /// Entries `--delete` removed.
    pub deleted: u64,
    /// `-X` / `-A`: attributes set, and those not set (refused by the
    /// file system, or left out by this receiver's policy).
    pub xattrs_set: u64,
    pub xattrs_not_set: u64,
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

/// Checks each file's BLAKE3 hash (merged from the values of its verified
/// chunks) against the sender's and only then renames it into place; then
/// creates the symlinks and sets the directories' modes and mtimes,
/// deepest first.
pub fn finish(
    prepared: &Prepared,
    verified: &[Vec<Option<Cv>>],
    sender_hashes: &[Cv],
) -> Result<Finished, DestError> {
    if sender_hashes.len() != prepared.files.len() {
        return Err(DestError::Failed(format!(
            "the sender sent {} file hashes for {} files",
            sender_hashes.len(),
            prepared.files.len()
        )));
    }
    let mut finisher = Finisher::new(prepared);
    let mut file_no = 0;
    for (i, entry) in prepared.entries.iter().enumerate() {
        let rel = prepared.rels[i].as_slice();
        let is_file = matches!(entry.kind, EntryKind::File { .. });
        if prepared.skip[i] {
            finisher.done.skipped += 1;
        } else if is_file {
            let n = file_no;
            let t = &prepared.files[n];
            let (dir_rel, _) = split_rel(rel);
            match &t.part {
                Some(part) => {
                    finisher.split_file(t, part, dir_rel, &verified[n], &sender_hashes[n])?
                }
                None => finisher.whole_file(t, dir_rel, &verified[n], &sender_hashes[n])?,
            }
        } else if let EntryKind::Symlink { target } = &entry.kind {
            finisher.symlink(rel, target, prepared.owners.get(i).copied(), i)?;
        } else if let EntryKind::HardLink { target } = &entry.kind {
            finisher.hard_link(rel, &link_target_rel(rel, entry, target))?;
        }
        if is_file {
            file_no += 1;
        }
    }
    if let Some(extraneous) = &prepared.extraneous {
        let mut changed = Vec::new();
        let removed = super::delete::remove(&prepared.dest_dir, extraneous, &mut changed);
        finisher.done.deleted = removed?;
        finisher.deleted_in.extend(changed);
    }
    finisher.directories()?;
    finisher.sync_placed_dirs()?;
    finisher.done.xattrs_set = prepared.xattrs.tally.set.load(Ordering::Relaxed);
    finisher.done.xattrs_not_set = prepared.xattrs.tally.refused.load(Ordering::Relaxed);
    Ok(finisher.done)
}

/// One finish under way.
struct Finisher<'a> {
    prepared: &'a Prepared,
    dirs: DirCache<'a>,
    fsync: bool,
    replace: bool,
    /// Directories files were placed in, to sync at the end (with fsync).
    to_sync: Vec<Vec<u8>>,
    /// Directories whose mtime this session's own writes moved: the
    /// parents of what it placed and of the directories it created.
    written_into: HashSet<&'a [u8]>,
    /// Directories `--delete` removed something from.
    deleted_in: HashSet<Vec<u8>>,
    done: Finished,
}

impl<'a> Finisher<'a> {
    fn new(prepared: &'a Prepared) -> Self {
        let mut written_into = HashSet::new();
        for (i, rel) in prepared.rels.iter().enumerate() {
            if prepared.created.get(i).copied().unwrap_or(false) {
                written_into.insert(split_rel(rel).0);
            }
        }
        Finisher {
            prepared,
            dirs: DirCache::new(&prepared.dest_dir),
            fsync: prepared.options.fsync,
            replace: prepared.options.overwrite,
            to_sync: Vec::new(),
            written_into,
            deleted_in: HashSet::new(),
            done: Finished::default(),
        }
    }

    /// Directory `dir_rel` beneath DEST, opened (or the one last opened).
    fn open_dir(&mut self, dir_rel: &[u8]) -> Result<&OwnedFd, Error> {
        let prepared = self.prepared;
        let dest_dir = &prepared.dest_dir;
        self.dirs
            .get(dir_rel)
            .map_err(|e| Error::disk("open", &dest_dir.shown(dir_rel), e))
    }

    /// A file took its name in `dir_rel`.
    fn placed_file(&mut self, dir_rel: &'a [u8]) {
        self.written_into.insert(dir_rel);
        if self.fsync && self.to_sync.last().is_none_or(|d| d != dir_rel) {
            self.to_sync.push(dir_rel.to_vec());
        }
        self.done.files += 1;
    }

    /// A file sent whole: ready once its hash matches the sender's, then
    /// renamed into place, unless `--checksum` found it identical to the
    /// file already there.
    fn whole_file(
        &mut self,
        t: &FileTarget,
        dir_rel: &'a [u8],
        verified: &[Option<Cv>],
        sender_hash: &Cv,
    ) -> Result<(), DestError> {
        check_file_hash(t, verified, sender_hash)?;
        if t.unchanged_existing() {
            // --checksum found it identical: it stays as it is.
            self.done.skipped += 1;
            return Ok(());
        }
        if !t.ready.load(Ordering::Acquire) {
            t.make_ready(self.fsync)?;
        }
        let replace = self.replace;
        t.put_in_place(self.open_dir(dir_rel)?, replace)?;
        if !t.fresh {
            // Sent whole this time, from a partial file a split run
            // left: that run's record of parts goes with it.
            let _ = self
                .prepared
                .dest_dir
                .remove_staged(&parts::record_name(&t.staged));
        }
        self.placed_file(dir_rel);
        Ok(())
    }

    /// This session's part of a split file: checked and recorded; the
    /// part that completes the file renames it into place.
    fn split_file(
        &mut self,
        t: &FileTarget,
        part: &Part,
        dir_rel: &'a [u8],
        verified: &[Option<Cv>],
        sender_digest: &Cv,
    ) -> Result<(), DestError> {
        match finish_part(t, part, verified, sender_digest, self.fsync)? {
            PartFinish::Completes(complete) => {
                let replace = self.replace;
                t.put_in_place(self.open_dir(dir_rel)?, replace)?;
                complete
                    .done(&self.prepared.dest_dir)
                    .map_err(|e| Error::disk("remove the record of the parts of", &t.shown(), e))?;
                self.placed_file(dir_rel);
            }
            PartFinish::Waits => self.done.waiting += 1,
            PartFinish::PlacedBefore => {}
        }
        Ok(())
    }

    /// A hard link to the file at `target` (placed earlier in this
    /// finish, or kept), made under a staging name and renamed into place.
    fn hard_link(&mut self, rel: &'a [u8], target: &[u8]) -> Result<(), DestError> {
        let dest_dir = &self.prepared.dest_dir;
        let staged = format!("{}.hlink", staging_key(rel));
        let shown_path = dest_dir.shown(rel);
        let (target_dir, target_name) = split_rel(target);
        let target_fd = self.open_dir(target_dir)?;
        dest_dir
            .hard_link_staged(target_fd, target_name, &staged)
            .map_err(|e| Error::disk("create hard link", &shown_path, e))?;
        self.place_staged(rel, &staged)?;
        // rename(2) onto another name of the same file leaves both.
        let _ = dest_dir.remove_staged(&staged);
        self.done.hard_links += 1;
        Ok(())
    }

    /// Renames `staged` to `rel`, replacing only when allowed.
    fn place_staged(&mut self, rel: &'a [u8], staged: &str) -> Result<(), DestError> {
        let dest_dir = &self.prepared.dest_dir;
        let (dir_rel, name) = split_rel(rel);
        let replace = self.replace;
        let fd = self.open_dir(dir_rel)?;
        dest_dir
            .place(staged, fd, name, replace)
            .map_err(|e| Error::disk("rename into place", &dest_dir.shown(rel), e))?;
        self.written_into.insert(dir_rel);
        Ok(())
    }

    /// A symlink, made under a staging name and renamed into place.
    fn symlink(
        &mut self,
        rel: &'a [u8],
        target: &[u8],
        owner: Option<dest_dir::Ids>,
        entry: usize,
    ) -> Result<(), DestError> {
        let dest_dir = &self.prepared.dest_dir;
        let staged = format!("{}.link", staging_key(rel));
        dest_dir
            .symlink_staged(target, &staged)
            .map_err(|e| Error::disk("create symlink", &dest_dir.shown(rel), e))?;
        if let Some(ids) = owner {
            dest_dir
                .set_staged_owner(&staged, ids)
                .map_err(|e| Error::disk("set the owner and group of", &dest_dir.shown(rel), e))?;
        }
        if let Some(attrs) = self.prepared.xattrs.per_entry.get(entry) {
            // Linux refuses user.* on a symlink (EPERM): a warning, as for
            // any attribute a file system refuses.
            self.prepared
                .xattrs
                .tally
                .set_all(&dest_dir.shown(rel), attrs, |name, value| {
                    dest_dir.set_staged_xattr(&staged, name, value)
                });
        }
        self.place_staged(rel, &staged)?;
        self.done.symlinks += 1;
        Ok(())
    }

    /// The directories' modes and mtimes, deepest first, so that setting
    /// one does not move its parent's mtime again.
    fn directories(&mut self) -> Result<(), DestError> {
        let prepared = self.prepared;
        for (i, entry) in prepared.entries.iter().enumerate().rev() {
            let rel = &prepared.rels[i];
            let whole = prepared.created[i] || prepared.options.overwrite;
            // A shard's sibling sessions write into the directories it
            // created, after it may have set their mtimes; so whichever
            // session writes into a directory last sets its mtime again,
            // after its writes, and the last one standing is the sender's.
            // A mirror (`--delete`) likewise: its removals and writes moved
            // the mtimes of directories that were there before.
            let written = self.written_into.contains(rel.as_slice());
            let mtime_only = ((prepared.options.shard || prepared.options.delete) && written)
                || self.deleted_in.contains(rel.as_slice());
            if entry.kind != EntryKind::Dir || !(whole || mtime_only) {
                continue;
            }
            let dest_dir = &prepared.dest_dir;
            let path = dest_dir.shown(rel);
            let fd = dest_dir
                .open_dir(rel)
                .map_err(|e| Error::disk("open", &path, e))?;
            if self.fsync {
                dest_dir::sync_dir(&fd).map_err(|e| Error::disk("sync", &path, e))?;
            }
            let mtime = to_system_time(entry.mtime_sec, entry.mtime_nsec);
            if whole {
                if let Some(&ids) = prepared.owners.get(i) {
                    dest_dir::set_owner(&fd, ids)
                        .map_err(|e| Error::disk("set the owner and group of", &path, e))?;
                }
                if let Some(attrs) = prepared.xattrs.per_entry.get(i) {
                    prepared.xattrs.tally.set_all(&path, attrs, |name, value| {
                        crate::io::xattr::set(&fd, name, value)
                    });
                }
                dest_dir::set_dir_attrs(fd, prepared.dir_modes[i], mtime)
                    .map_err(|e| Error::disk("set the mode and mtime of", &path, e))?;
                if prepared.created[i] {
                    // Gone already when a shard's sibling finished first.
                    let _ = dest_dir.remove_staged(&pending_dir_record(rel));
                }
                self.done.dirs += 1;
            } else {
                dest_dir::set_dir_mtime(fd, mtime)
                    .map_err(|e| Error::disk("set the mtime of", &path, e))?;
            }
        }
        Ok(())
    }

    /// With fsync, the directories files took their names in.
    fn sync_placed_dirs(&self) -> Result<(), DestError> {
        if !self.fsync {
            return Ok(());
        }
        let dest_dir = &self.prepared.dest_dir;
        for rel in &self.to_sync {
            let fd = dest_dir
                .open_dir(rel)
                .map_err(|e| Error::disk("open", &dest_dir.shown(rel), e))?;
            dest_dir::sync_dir(&fd).map_err(|e| Error::disk("sync", &dest_dir.shown(rel), e))?;
        }
        Ok(())
    }
}

/// A file sent whole: its BLAKE3 hash, merged from the values of its
/// verified chunks, against the sender's.
fn check_file_hash(
    t: &FileTarget,
    verified: &[Option<Cv>],
    sender_hash: &Cv,
) -> Result<(), DestError> {
    let cvs: Option<Vec<Cv>> = verified.iter().copied().collect();
    let Some(cvs) = cvs else {
        return Err(DestError::Failed(format!(
            "`{}`: not every chunk arrived (a sender bug); run the transfer again",
            t.rel
        )));
    };
    let ours = file_hash(t.size, &cvs).expect("one value per chunk");
    if ours.as_bytes() != sender_hash {
        return Err(DestError::Mismatch(format!(
            "`{}`: BLAKE3 {} here, {} at the sender; the file changed while it was sent?",
            t.rel,
            short_hex(ours.as_bytes()),
            short_hex(sender_hash)
        )));
    }
    Ok(())
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
    let cvs = check_part_digest(t, part, verified, sender_digest)?;
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
        Err(e) => Err(part_error(t, e)),
    }
}

/// The values of the part's chunks, once every one arrived and their
/// digest matches the sender's.
fn check_part_digest(
    t: &FileTarget,
    part: &Part,
    verified: &[Option<Cv>],
    sender_digest: &Cv,
) -> Result<Vec<Cv>, DestError> {
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
            short_hex(&ours),
            short_hex(sender_digest)
        )));
    }
    Ok(cvs)
}

/// Why recording a part failed, as the sender is told.
fn part_error(t: &FileTarget, e: PartError) -> DestError {
    match e {
        PartError::Io(e) => Error::disk("record the parts of", &t.shown(), e).into(),
        PartError::OtherVersion => DestError::Failed(format!(
            "`{}`: another shard is sending another version of it (another size or mtime); \
             every shard must send the same files: run them all again from one copy",
            t.rel
        )),
        PartError::RecordGone => DestError::Failed(format!(
            "`{}`: the record of its parts in {STAGING_DIR} is gone; run this shard again",
            t.rel
        )),
        PartError::Changed(count, first) => DestError::Mismatch(format!(
            "`{}`: {count} chunk(s) other shards sent, from chunk {first}, no longer hold on \
             disk here what they sent (a crash before they were synced, or a change); they were \
             dropped from its record: run the shards again (each sends only what is missing)",
            t.rel
        )),
    }
}

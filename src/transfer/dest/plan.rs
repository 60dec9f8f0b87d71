//! Checking a plan request against the destination: a prelude for the
//! whole request (the options granted, the subdirectory, the links the
//! manifest makes), then one check per kind of entry (a directory, a
//! regular file — whole, or this session's part of a split one — and a
//! symlink), then the conflicts, the staging quota and, once all of that
//! passed, the directories.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::policy::{link_stays_beneath, ReceivePolicy, SymlinkPolicy};
use super::{
    join_rel, pending_dir_record, split_first, split_rel, staged_name, to_system_time, FileTarget,
    Part, Prepared, NOT_HELD,
};
use crate::io::dest_dir::{self, DestDir, Found, STAGING_DIR};
use crate::transfer::exclude::Filters;
use crate::transfer::hash::{chunk_count, chunk_cv, chunk_len, Cv, CHUNK_SIZE};
use crate::transfer::manifest::{Entry, EntryKind, Manifest, RelPath};
use crate::transfer::messages::{FilePart, FilePlan, Options, PlanRequest, SameFile, Xattr};
use crate::transfer::parts;
use crate::transfer::staged::ToStage;
use crate::transfer::Error;
use crate::util::text::shown;

/// An existing file `--checksum` compared.
#[derive(Debug, Clone, Copy)]
pub(super) struct Existing {
    /// Replacing it is allowed and asked.
    pub(super) replace: bool,
}

/// What an entry's check decided, from what is at its path and the
/// options; anything in the way that no option lets us replace is an
/// error instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Decision {
    /// Nothing is there, or the sender may replace what is: write it.
    Write,
    /// A file of the same size is there: compare it by content
    /// (`--checksum`).
    Compare,
    /// An identical one is there already (`--skip-existing`): leave it.
    Skip,
    /// Something is there that may not be replaced: listed with the
    /// others, it refuses the transfer once every entry is checked.
    Conflict,
}

/// What the disk already holds of a file about to be sent, as the BLAKE3
/// value of each chunk ([`NOT_HELD`] for a chunk it does not hold).
#[derive(Debug, PartialEq, Eq)]
enum Held {
    /// Nothing: every chunk is sent.
    Nothing,
    /// The existing file, of the same size, compared by content
    /// (`--checksum`).
    Existing(Vec<Cv>),
    /// The partial file an earlier attempt left, `len` bytes long.
    Partial { cvs: Vec<Cv>, len: u64 },
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
    admit: impl FnOnce(&[ToStage<'_>]) -> Result<(), Error>,
) -> Result<Prepared, Error> {
    let PlanRequest {
        options: asked,
        subdir,
        manifest,
        parts: sent_in_part,
        protect,
        owners,
        xattrs,
        same,
    } = request;
    super::delete::check_allowed(&asked, policy)?;
    if let Some(own) = &owners {
        super::owners::check_allowed(own, policy)?;
    }
    let owners = owners.as_ref().map_or(Vec::new(), super::owners::resolve);
    let xattr_tally = Arc::new(super::xattrs::Tally::default());
    let xattrs = match &xattrs {
        Some(x) => {
            super::xattrs::check_allowed(x, policy)?;
            let mut left_out = 0;
            let resolved = super::xattrs::resolve(x, policy, manifest.entries.len(), &mut left_out);
            xattr_tally.refused.fetch_add(left_out, Ordering::Relaxed);
            resolved
        }
        None => Vec::new(),
    };
    let options = granted(&asked, policy);
    let sub: Vec<u8> = subdir
        .as_ref()
        .map_or(Vec::new(), |s| s.as_bytes().to_vec());
    // The report's (the operator's) and the messages' (the peer's).
    let dest = if sub.is_empty() {
        dest_dir.path().to_path_buf()
    } else {
        dest_dir.path().join(OsStr::from_bytes(&sub))
    };
    let dest_shown = dest_dir.shown(&sub);
    let mut dirs = DirCache::new(dest_dir);
    let to_create = check_subdir(&mut dirs, subdir.as_ref())?;
    let entries = manifest.entries.len();
    let mut planner = Planner {
        dest_dir,
        policy,
        options,
        dirs,
        dest_exists: to_create.is_empty(),
        links: manifest_links(&manifest, &sub, policy),
        link_root: policy.confined_to.clone().unwrap_or_default(),
        part_of: parts_by_file(&manifest, sent_in_part),
        checksummed: 0,
        checksum_budget,
        plans: Vec::new(),
        held: Vec::new(),
        targets: Vec::new(),
        left_staged: Vec::new(),
        skip: vec![false; entries],
        rels: Vec::with_capacity(entries),
        conflicts: Vec::new(),
        numbers: None,
        owner: None,
        xattrs: Vec::new(),
        xattr_tally: xattr_tally.clone(),
    };
    for (i, entry) in manifest.entries.iter().enumerate() {
        planner.owner = owners.get(i).copied();
        planner.xattrs = xattrs.get(i).cloned().unwrap_or_default();
        planner.check_entry(entry, join_rel(&sub, entry.path.as_bytes()))?;
    }
    if !planner.conflicts.is_empty() {
        let conflicts = &planner.conflicts;
        let why = conflicts_refusal(conflicts, &asked, &planner, &dest_shown);
        return Err(Error::Refused { why });
    }
    admit(&planner.to_stage())?;
    let copies = take_copies(&same, &mut planner.plans);
    let extraneous = if options.delete {
        let mut rules = Filters::default();
        for rule in &protect {
            rules.add_rule(rule).map_err(|e| Error::Refused {
                why: format!("--delete's filter rule {rule:?}: {e}"),
            })?;
        }
        Some(Box::new(super::delete::find(
            dest_dir, &sub, &manifest, rules,
        )?))
    } else {
        None
    };
    // A dry run ends here: the answer is made, nothing is created.
    let created = if options.dry_run {
        Vec::new()
    } else {
        planner.create(&to_create, &manifest.entries)?
    };
    let dir_modes = manifest.entries.iter().map(|e| policy.mode(e.mode));
    Ok(Prepared {
        dest,
        dir_modes: dir_modes.collect(),
        entries: manifest.entries,
        files: planner.targets,
        plans: planner.plans,
        held: planner.held,
        skip: planner.skip,
        created,
        options,
        dest_dir: dest_dir.clone(),
        rels: planner.rels,
        claim: None,
        extraneous,
        copies,
        owners,
        xattrs: Box::new(super::xattrs::PlanXattrs {
            per_entry: xattrs,
            tally: xattr_tally,
        }),
    })
}

/// Of the files the sender read as another's bytes, those this receiver
/// writes from that file's chunks: both sent whole and fresh (nothing of
/// either is here, in place or staged), so no chunk of the copy is sent.
/// Any other (its original skipped or held in part, say) is sent as
/// planned. Returns, per file, the files written from its chunks.
fn take_copies(same: &[SameFile], plans: &mut [FilePlan]) -> Vec<Vec<u32>> {
    let mut copies = Vec::new();
    for s in same {
        let (file, of) = (s.file as usize, s.of as usize);
        if plans.get(file) == Some(&FilePlan::SendAll) && plans.get(of) == Some(&FilePlan::SendAll)
        {
            plans[file] = FilePlan::Copy;
            if copies.is_empty() {
                copies = vec![Vec::new(); plans.len()];
            }
            copies[of].push(s.file);
        }
    }
    copies
}

/// What this session may do: the sender's asks, as the policy allows.
/// Replacing needs both sides (and the key's leave); syncing is on if
/// either asks; `--checksum` only refines `--skip-existing`.
fn granted(asked: &Options, policy: &ReceivePolicy) -> Options {
    Options {
        overwrite: asked.overwrite && policy.allow_overwrite && !policy.key_forbids_overwrite,
        skip_existing: asked.skip_existing,
        fsync: asked.fsync || policy.fsync,
        checksum: asked.checksum && asked.skip_existing,
        dry_run: asked.dry_run,
        shard: asked.shard,
        finish_ahead: asked.finish_ahead,
        compress: asked.compress,
        // Refused before this unless the policy allows it.
        delete: asked.delete,
    }
}

/// Per file number: the chunks this session sends of a split file.
fn parts_by_file(manifest: &Manifest, sent_in_part: Vec<FilePart>) -> Vec<Option<Range<u64>>> {
    let mut part_of = vec![None; crate::transfer::file_sizes(manifest).len()];
    for p in sent_in_part {
        if let Some(slot) = part_of.get_mut(p.file as usize) {
            *slot = Some(p.chunks);
        }
    }
    part_of
}

/// Every link this manifest makes, wherever it stands in it, by its path
/// beneath DEST: under `safe`, a link is judged with all of them in place.
fn manifest_links(
    manifest: &Manifest,
    sub: &[u8],
    policy: &ReceivePolicy,
) -> HashMap<Vec<u8>, Vec<u8>> {
    if policy.symlinks != SymlinkPolicy::Safe {
        return HashMap::new();
    }
    manifest
        .entries
        .iter()
        .filter_map(|e| match &e.kind {
            EntryKind::Symlink { target } => {
                Some((join_rel(sub, e.path.as_bytes()), target.clone()))
            }
            _ => None,
        })
        .collect()
}

/// The path beneath DEST of a hard link's target: the link's `rel` is
/// its manifest path under the subdirectory, and so is the target's.
pub(super) fn link_target_rel(rel: &[u8], entry: &Entry, target: &RelPath) -> Vec<u8> {
    let sub = &rel[..rel.len() - entry.path.as_bytes().len()];
    [sub, target.as_bytes()].concat()
}

/// A name the manifest may not use: the staging directory's.
fn reserved(rel: &[u8]) -> bool {
    split_first(rel) == STAGING_DIR.as_bytes()
}

/// The subdirectory: every existing component must be a real directory.
/// Returns the components still to create, parents first (none: DEST/SUBDIR
/// exists).
fn check_subdir(dirs: &mut DirCache<'_>, subdir: Option<&RelPath>) -> Result<Vec<Vec<u8>>, Error> {
    let mut to_create: Vec<Vec<u8>> = Vec::new();
    let Some(s) = subdir else {
        return Ok(to_create);
    };
    if reserved(s.as_bytes()) {
        return Err(Error::Reserved { entry: None });
    }
    let dest_dir = dirs.dest;
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
                return Err(Error::SubdirInTheWay {
                    path: dest_dir.shown(&rel),
                })
            }
        }
    }
    Ok(to_create)
}

/// One plan request being checked, entry by entry, and what it found.
struct Planner<'a> {
    dest_dir: &'a Arc<DestDir>,
    policy: &'a ReceivePolicy,
    options: Options,
    dirs: DirCache<'a>,
    /// DEST/SUBDIR exists: below one that does not, nothing exists.
    dest_exists: bool,
    /// Every link the manifest makes, under `safe` ([`manifest_links`]).
    links: HashMap<Vec<u8>, Vec<u8>>,
    /// Where a `safe` link must lead beneath: the key's own directory, or
    /// DEST itself when empty.
    link_root: Vec<u8>,
    /// Per file number: the chunks this session sends of a split file.
    part_of: Vec<Option<Range<u64>>>,
    /// Bytes of existing files read to compare them by content, and the
    /// most this receiver reads for one transfer.
    checksummed: u64,
    checksum_budget: u64,
    /// Per file.
    plans: Vec<FilePlan>,
    held: Vec<Vec<Cv>>,
    targets: Vec<Arc<FileTarget>>,
    /// Per file: the length of the partial file an earlier attempt left.
    left_staged: Vec<u64>,
    /// Per entry: an identical one is there already.
    skip: Vec<bool>,
    /// Per entry: its path beneath DEST (the SUBDIR included).
    rels: Vec<Vec<u8>>,
    /// Entries in the way that may not be replaced.
    conflicts: Vec<String>,
    /// Entry numbers by their path beneath DEST, made at the first hard
    /// link (a manifest without one never pays for it).
    numbers: Option<HashMap<Vec<u8>, usize>>,
    /// `-o` / `-g`: the owner and group of the entry being checked.
    owner: Option<dest_dir::Ids>,
    /// `-X` / `-A`: the attributes of the entry being checked.
    xattrs: Vec<Xattr>,
    xattr_tally: Arc<super::xattrs::Tally>,
}

impl<'a> Planner<'a> {
    /// Checks the next entry (at `rel` beneath DEST) against what is
    /// there, by its kind.
    fn check_entry(&mut self, entry: &Entry, rel: Vec<u8>) -> Result<(), Error> {
        if reserved(&rel) {
            return Err(Error::Reserved {
                entry: Some(entry.path.to_string()),
            });
        }
        let path = self.dest_dir.shown(&rel);
        // Parents are checked before children (the manifest guarantees
        // they come first); below a directory that does not exist yet
        // nothing exists.
        let found = if self.dest_exists {
            self.dirs.look(&rel)?
        } else {
            Found::Nothing
        };
        let decision = match &entry.kind {
            EntryKind::Dir => check_dir(found, &path).map(|()| Decision::Write)?,
            EntryKind::File { size } => self.check_file(entry, *size, &rel, found, &path)?,
            EntryKind::Symlink { target } => {
                self.check_symlink(entry, target, &rel, found, &path)?
            }
            EntryKind::HardLink { target } => {
                let target = link_target_rel(&rel, entry, target);
                self.check_hard_link(&rel, &target, found, &path)?
            }
        };
        // Entries are checked in order, so this one's number is how many
        // were checked before it.
        let i = self.rels.len();
        match decision {
            Decision::Skip => self.skip[i] = true,
            Decision::Conflict => self.conflicts.push(entry.path.to_string()),
            Decision::Write | Decision::Compare => {}
        }
        if let Some(numbers) = &mut self.numbers {
            numbers.insert(rel.clone(), i);
        }
        self.rels.push(rel);
        Ok(())
    }

    /// A hard link at `rel` to the file at `target` (both beneath DEST):
    /// with --skip-existing, a name that is already that file, which this
    /// transfer leaves as it is, stays; else as any entry in the way.
    fn check_hard_link(
        &mut self,
        rel: &[u8],
        target: &[u8],
        found: Found,
        path: &Path,
    ) -> Result<Decision, Error> {
        let options = self.options;
        match found {
            Found::Dir => Err(in_the_way(path, "a directory")),
            Found::Nothing => Ok(Decision::Write),
            Found::File { .. } if options.skip_existing && self.is_kept_same_file(rel, target) => {
                Ok(Decision::Skip)
            }
            _ if !options.overwrite => Ok(Decision::Conflict),
            _ => Ok(Decision::Write),
        }
    }

    /// Whether `rel` is the file at `target` (one inode) and this
    /// transfer skips the entry at `target`.
    fn is_kept_same_file(&mut self, rel: &[u8], target: &[u8]) -> bool {
        let rels = &self.rels;
        let numbers = self.numbers.get_or_insert_with(|| {
            rels.iter()
                .enumerate()
                .map(|(i, r)| (r.clone(), i))
                .collect()
        });
        let Some(&j) = numbers.get(target) else {
            return false;
        };
        if !self.skip[j] {
            return false;
        }
        let mut inode = |rel: &[u8]| {
            let (dir, name) = split_rel(rel);
            let fd = self.dirs.get(dir).ok()?;
            dest_dir::inode(fd, name).ok()
        };
        let here = inode(rel);
        here.is_some() && here == inode(target)
    }

    /// A regular file, whole or this session's part of a split one: what
    /// is at its path decides first, then what its partial file (or, to
    /// compare, the existing file) already holds.
    fn check_file(
        &mut self,
        entry: &Entry,
        size: u64,
        rel: &[u8],
        found: Found,
        path: &Path,
    ) -> Result<Decision, Error> {
        let part = self.part_of.get(self.targets.len()).cloned().flatten();
        // One session sees one part of a split file: it cannot compare
        // the whole by content, so with --checksum such a file is never
        // skipped (sent again with --overwrite, else refused), rather than
        // skipped on size and mtime.
        let by_content = self.options.checksum && part.is_none();
        let decision = file_decision(found, entry, size, &self.options, by_content, path)?;
        let staged = staged_name(rel);
        let held = match decision {
            Decision::Skip => Held::Nothing,
            _ => {
                let compare = decision == Decision::Compare;
                self.held_of(entry, size, rel, &staged, compare, part.as_ref())?
            }
        };
        let existing = matches!(held, Held::Existing(_)).then_some(Existing {
            replace: self.options.overwrite,
        });
        let fresh = held == Held::Nothing;
        let partial = matches!(held, Held::Partial { .. });
        let (cvs, left) = match held {
            Held::Nothing => (Vec::new(), 0),
            Held::Existing(cvs) => (cvs, 0),
            Held::Partial { cvs, len } => (cvs, len),
        };
        self.plans.push(match decision {
            Decision::Skip => FilePlan::Skip,
            _ if fresh => FilePlan::SendAll,
            _ => FilePlan::Held(cvs.clone()),
        });
        self.held.push(cvs);
        self.left_staged.push(left);
        let (dir, name) = split_rel(rel);
        self.targets.push(Arc::new(FileTarget {
            rel: entry.path.clone(),
            size,
            fresh,
            mode: self.policy.mode(entry.mode),
            mtime: to_system_time(entry.mtime_sec, entry.mtime_nsec),
            writing: AtomicU64::new(0),
            ready: AtomicBool::new(false),
            dest: self.dest_dir.clone(),
            dir: dir.to_vec(),
            name: name.to_vec(),
            staged,
            created: AtomicBool::new(partial),
            existing,
            part: part.map(|chunks| Part {
                chunks,
                header: parts::header(size, entry.mtime_sec, entry.mtime_nsec),
            }),
            owner: self.owner,
            xattrs: std::mem::take(&mut self.xattrs),
            xattr_tally: self.xattr_tally.clone(),
            handle: Mutex::new(None),
        }));
        Ok(decision)
    }

    /// What the disk already holds of a file about to be sent: the partial
    /// file an earlier attempt left (which wins over an existing file it
    /// was replacing) or else, to `compare`, the existing file.
    fn held_of(
        &mut self,
        entry: &Entry,
        size: u64,
        rel: &[u8],
        staged: &str,
        compare: bool,
        part: Option<&Range<u64>>,
    ) -> Result<Held, Error> {
        match self.dest_dir.look_staged(staged) {
            Ok(Found::Nothing) if compare => self.hash_existing(rel, size).map(Held::Existing),
            Ok(Found::Nothing) => Ok(Held::Nothing),
            Ok(Found::File { size: len, .. }) => {
                let at = self.dest_dir.path().join(STAGING_DIR).join(staged);
                let cvs = self
                    .dest_dir
                    .open_staged(staged, false)
                    .and_then(|f| hash_partial(&f, size, part))
                    .map_err(|e| Error::disk("read", &at, e))?;
                Ok(Held::Partial { cvs, len })
            }
            Ok(_) => Err(Error::StagedInTheWay {
                entry: entry.path.to_string(),
            }),
            Err(e) => Err(Error::disk("look at", &self.dest_dir.shown(rel), e)),
        }
    }

    /// The existing file's chunk values, as if it were a partial file: the
    /// sender sends only those that differ. What is read counts against
    /// this receiver's `--max-checksum`.
    fn hash_existing(&mut self, rel: &[u8], size: u64) -> Result<Vec<Cv>, Error> {
        self.checksummed = self.checksummed.saturating_add(size);
        if self.checksummed > self.checksum_budget {
            let why = format!(
                "--checksum would have this server read more than {} of existing files for \
                 one transfer, its limit (--max-checksum); send without --checksum, or in parts",
                crate::util::units::format_size(self.checksum_budget)
            );
            return Err(Error::OverBudget { why });
        }
        let (d, n) = split_rel(rel);
        self.dirs
            .get(d)
            .and_then(|fd| dest_dir::open_file(fd, n))
            .and_then(|f| hash_partial(&f, size, None))
            .map_err(|e| Error::disk("read", &self.dest_dir.shown(rel), e))
    }

    /// A symlink: refused unless the policy allows it, judged where it
    /// leads; then what is at its path decides.
    fn check_symlink(
        &mut self,
        entry: &Entry,
        target: &[u8],
        rel: &[u8],
        found: Found,
        path: &Path,
    ) -> Result<Decision, Error> {
        if !self.symlink_allowed(rel, target) {
            let why = symlink_refusal(self.policy, entry, target);
            return Err(Error::Refused { why });
        }
        let options = self.options;
        match found {
            Found::Dir => Err(in_the_way(path, "a directory")),
            Found::Nothing => Ok(Decision::Write),
            Found::Symlink
                if options.skip_existing
                    && dirs_read_link(&mut self.dirs, rel).is_some_and(|t| t == target) =>
            {
                Ok(Decision::Skip)
            }
            _ if !options.overwrite => Ok(Decision::Conflict),
            _ => Ok(Decision::Write),
        }
    }

    /// Whether the policy takes a symlink at `rel` to `target`.
    fn symlink_allowed(&mut self, rel: &[u8], target: &[u8]) -> bool {
        match self.policy.symlinks {
            SymlinkPolicy::All => true,
            SymlinkPolicy::Safe => {
                let dirs = &mut self.dirs;
                link_stays_beneath(rel, target, &self.link_root, &self.links, |p| {
                    dirs_read_link(dirs, p)
                })
            }
            SymlinkPolicy::None => false,
        }
    }

    /// The files the plan stages, for the sender's quota. A partial file
    /// holds at most its size, unless an earlier attempt at another
    /// version of it left more (cut to size when complete).
    fn to_stage(&self) -> Vec<ToStage<'_>> {
        self.targets
            .iter()
            .zip(&self.plans)
            .zip(&self.left_staged)
            .filter(|((_, plan), _)| **plan != FilePlan::Skip)
            .map(|((t, _), &left)| ToStage {
                staged: &t.staged,
                bytes: t.size.max(left),
            })
            .collect()
    }

    /// Everything checked: now create the subdirectory's missing
    /// components, the directories and the records of split files' parts.
    /// New directories are private until the finish gives them their
    /// mode, as tar does. Returns, per entry, whether it is a directory
    /// this transfer created.
    fn create(&self, to_create: &[Vec<u8>], entries: &[Entry]) -> Result<Vec<bool>, Error> {
        let dest_dir = self.dest_dir;
        let sub_mode = 0o777 & !self.policy.umask;
        for rel in to_create {
            make_dir(dest_dir, rel, sub_mode)?;
        }
        let mut created = vec![false; entries.len()];
        for (i, entry) in entries.iter().enumerate() {
            if entry.kind == EntryKind::Dir {
                created[i] = make_private_dir(dest_dir, &self.rels[i])?;
            }
        }
        for (t, plan) in self.targets.iter().zip(&self.plans) {
            if let (Some(part), false) = (&t.part, *plan == FilePlan::Skip) {
                parts::start(
                    dest_dir,
                    &t.staged,
                    &part.header,
                    t.size,
                    self.options.fsync,
                )
                .map_err(|e| Error::disk("start the record of the parts of", &t.shown(), e))?;
            }
        }
        Ok(created)
    }
}

/// A directory: nothing there yet, or a directory, which it merges into.
fn check_dir(found: Found, path: &Path) -> Result<(), Error> {
    match found {
        Found::Nothing | Found::Dir => Ok(()),
        Found::Symlink => Err(symlink_in_the_way(path)),
        _ => Err(in_the_way(path, "not a directory")),
    }
}

/// A regular file, by what is at its `path`: only a regular file or a
/// symlink may be replaced, and only with `--overwrite`; with
/// `--skip-existing` one of the same size is compared by content
/// (`by_content`, rsync's `-c`) or else by mtime.
fn file_decision(
    found: Found,
    entry: &Entry,
    size: u64,
    options: &Options,
    by_content: bool,
    path: &Path,
) -> Result<Decision, Error> {
    match found {
        Found::Dir => Err(in_the_way(path, "a directory")),
        Found::Other => Err(in_the_way(path, "not a regular file")),
        Found::File { size: have, .. } if by_content && have == size => Ok(Decision::Compare),
        Found::File { size: have, mtime }
            if options.skip_existing
                && !options.checksum
                && have == size
                && mtime == entry.mtime_sec =>
        {
            Ok(Decision::Skip)
        }
        Found::File { .. } | Found::Symlink if !options.overwrite => Ok(Decision::Conflict),
        _ => Ok(Decision::Write),
    }
}

/// Why a symlink the policy does not take refuses the transfer, and what
/// the receiving user (or the server's operator) can do about it.
fn symlink_refusal(policy: &ReceivePolicy, entry: &Entry, target: &[u8]) -> String {
    let (which, why) = match policy.symlinks {
        SymlinkPolicy::None => ("none", "and symlinks are refused here"),
        _ if policy.confined_to.is_some() => (
            "safe",
            "which leads out of this key's subdirectory once the links on its way are followed",
        ),
        _ => (
            "safe",
            "which leads out of the destination once the links on its way are followed",
        ),
    };
    let what_to_do = if policy.users_own {
        format!(
            "refused under --symlinks {which}: copy again with --symlinks all to take it as it \
             is, or --follow to copy what it points to"
        )
    } else {
        format!(
            "this server's symlink policy is {which}: its operator can start it with \
             --symlinks all, or send with --follow"
        )
    };
    format!(
        "`{}` is a symlink to `{}`, {why}; {what_to_do}",
        entry.path,
        shown(target),
    )
}

/// The one line that refuses a transfer for the entries in the way: the
/// first five of them, and why they may not be replaced here.
fn conflicts_refusal(
    conflicts: &[String],
    asked: &Options,
    planner: &Planner<'_>,
    dest_shown: &Path,
) -> String {
    let policy = planner.policy;
    let shown_names: Vec<&str> = conflicts.iter().take(5).map(String::as_str).collect();
    let more = if conflicts.len() > 5 {
        format!(" and {} more", conflicts.len() - 5)
    } else {
        String::new()
    };
    let what_to_do = if asked.overwrite && policy.users_own && !planner.options.overwrite {
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
    format!(
        "{} already exist{} in {}: {}{more}; {what_to_do}",
        if conflicts.len() == 1 {
            "1 entry".to_string()
        } else {
            format!("{} entries", conflicts.len())
        },
        if conflicts.len() == 1 { "s" } else { "" },
        shown(dest_shown.as_os_str().as_encoded_bytes()),
        shown_names.join(", ")
    )
}

fn in_the_way(path: &Path, what: &'static str) -> Error {
    Error::InTheWay {
        path: path.to_path_buf(),
        what,
    }
}

fn symlink_in_the_way(path: &Path) -> Error {
    Error::SymlinkInTheWay {
        path: path.to_path_buf(),
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
pub(in crate::transfer) fn chunk_cv_on_disk(
    file: &File,
    size: u64,
    i: u64,
    buf: &mut [u8],
) -> io::Result<Cv> {
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
pub(super) struct DirCache<'a> {
    dest: &'a DestDir,
    last: Option<(Vec<u8>, OwnedFd)>,
}

impl<'a> DirCache<'a> {
    pub(super) fn new(dest: &'a DestDir) -> Self {
        DirCache { dest, last: None }
    }

    pub(super) fn get(&mut self, rel: &[u8]) -> io::Result<&OwnedFd> {
        if self.last.as_ref().is_none_or(|(r, _)| r != rel) {
            self.last = None;
            let fd = self.dest.open_dir(rel)?;
            self.last = Some((rel.to_vec(), fd));
        }
        Ok(&self.last.as_ref().expect("set above").1)
    }

    /// What `rel` is; `Nothing` when its directory does not exist yet.
    fn look(&mut self, rel: &[u8]) -> Result<Found, Error> {
        let (dir, name) = split_rel(rel);
        match self.get(dir) {
            Ok(fd) => dest_dir::look(fd, name)
                .map_err(|e| Error::disk("look at", &self.dest.shown(rel), e)),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(Found::Nothing),
            Err(e) => Err(Error::disk("look at", &self.dest.shown(rel), e)),
        }
    }
}
fn dirs_read_link(dirs: &mut DirCache<'_>, rel: &[u8]) -> Option<Vec<u8>> {
    let (dir, name) = split_rel(rel);
    dest_dir::read_link(dirs.get(dir).ok()?, name).ok()
}

/// Directory `rel`, created private (0700) until the finish gives it its
/// mode. Its pending record goes into the staging directory first, so a
/// session cancelled before its finish leaves the record beside the
/// directory. Returns whether this transfer created the directory: this
/// session, or one cancelled before it (whose record is still there);
/// never a directory that was there without a record.
fn make_private_dir(dest: &DestDir, rel: &[u8]) -> Result<bool, Error> {
    let record = pending_dir_record(rel);
    let shown = || dest.shown(rel);
    let looked = dest
        .look_staged(&record)
        .map_err(|e| Error::disk("look for the record of", &shown(), e))?;
    if matches!(looked, Found::File { .. }) {
        make_dir(dest, rel, 0o700)?;
        return Ok(true);
    }
    let (dir, name) = split_rel(rel);
    let there = dest
        .open_dir(dir)
        .and_then(|fd| dest_dir::look(&fd, name))
        .map_err(|e| Error::disk("look at", &shown(), e))?;
    if there != Found::Nothing {
        // check_dir has refused anything but a directory.
        return Ok(false);
    }
    dest.open_shared_staged(&record)
        .map_err(|e| Error::disk("record the new directory", &shown(), e))?;
    let made = make_dir(dest, rel, 0o700)?;
    if !made {
        // Another transfer made it between the look and here: its to mode.
        let _ = dest.remove_staged(&record);
    }
    Ok(made)
}

/// Creates directory `rel` beneath DEST; whether it is new.
fn make_dir(dest: &DestDir, rel: &[u8], mode: u32) -> Result<bool, Error> {
    let (dir, name) = split_rel(rel);
    dest.open_dir(dir)
        .and_then(|fd| dest.make_dir(&fd, name, mode))
        .map_err(|e| Error::disk("create directory", &dest.shown(rel), e))
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::transfer::dest::policy::UserFlags;

    /// DEST in the temp directory, made empty, removed when dropped.
    struct TempDest {
        path: PathBuf,
        dest: Arc<DestDir>,
    }

    impl TempDest {
        fn new(name: &str) -> TempDest {
            let path = tempfile::Builder::new()
                .prefix(&format!("atou-plan-{name}-"))
                .tempdir()
                .unwrap()
                .keep();
            let dest = Arc::new(DestDir::open(&path).unwrap());
            TempDest { path, dest }
        }

        fn plan(
            &self,
            policy: &ReceivePolicy,
            options: Options,
            entries: Vec<Entry>,
        ) -> Result<Prepared, String> {
            self.plan_within(u64::MAX, policy, options, entries, Vec::new())
        }

        fn plan_within(
            &self,
            checksum_budget: u64,
            policy: &ReceivePolicy,
            options: Options,
            entries: Vec<Entry>,
            parts: Vec<FilePart>,
        ) -> Result<Prepared, String> {
            let request = PlanRequest {
                options,
                subdir: None,
                manifest: Manifest { entries },
                parts,
                protect: Vec::new(),
                owners: None,
                xattrs: None,
                same: Vec::new(),
            };
            prepare(&self.dest, policy, request, checksum_budget, |_| Ok(()))
                .map_err(|e| e.to_string())
        }
    }

    impl Drop for TempDest {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }

    const MTIME: i64 = 1_000_000_000;

    fn entry(path: &str, kind: EntryKind) -> Entry {
        Entry {
            path: RelPath::new(path.as_bytes().to_vec()).unwrap(),
            kind,
            mode: 0o644,
            mtime_sec: MTIME,
            mtime_nsec: 0,
        }
    }

    fn file(path: &str, size: u64) -> Entry {
        entry(path, EntryKind::File { size })
    }

    fn link(path: &str, target: &str) -> Entry {
        let target = target.as_bytes().to_vec();
        entry(path, EntryKind::Symlink { target })
    }

    fn skip_existing() -> Options {
        Options {
            skip_existing: true,
            ..Options::default()
        }
    }

    fn write_with_mtime(path: &Path, data: &[u8], mtime: i64) {
        std::fs::write(path, data).unwrap();
        let file = File::options().write(true).open(path).unwrap();
        file.set_modified(to_system_time(mtime, 0)).unwrap();
    }

    /// A file is written from its original's chunks only where both are
    /// sent whole and fresh: under a skipped or partly held original, or
    /// held itself, it is sent as planned.
    #[test]
    fn a_copy_is_taken_only_where_both_files_are_sent_whole() {
        use FilePlan::{Copy, Held, SendAll, Skip};
        let mut plans = vec![
            SendAll,
            SendAll,
            Skip,
            SendAll,
            Held(Vec::new()),
            SendAll,
            Held(Vec::new()),
        ];
        let same = [(1, 0), (3, 2), (4, 0), (5, 0), (6, 0)].map(|(file, of)| SameFile { file, of });
        let copies = take_copies(&same, &mut plans);
        assert_eq!(
            plans,
            [
                SendAll,
                Copy,
                Skip,
                SendAll,
                Held(Vec::new()),
                Copy,
                Held(Vec::new())
            ]
        );
        assert_eq!(copies[0], [1, 5]);
        assert!(copies[1..].iter().all(Vec::is_empty));
        let mut none = vec![SendAll; 2];
        assert!(take_copies(&[], &mut none).is_empty());
    }

    /// A session cancelled between its plan and its finish leaves the
    /// directories it created private (0700); the session that resumes
    /// the transfer must give them their mode, though they now exist.
    #[test]
    fn directories_a_cancelled_session_created_get_their_mode_from_the_next() {
        use std::os::unix::fs::PermissionsExt;
        let d = TempDest::new("dir-resumed");
        let dirs = || {
            let mut top = entry("top", EntryKind::Dir);
            top.mode = 0o755;
            let mut sub = entry("top/sub", EntryKind::Dir);
            sub.mode = 0o750;
            vec![top, sub]
        };
        let policy = ReceivePolicy::server();
        let cancelled = d.plan(&policy, Options::default(), dirs()).unwrap();
        drop(cancelled);
        let mode = |rel: &str| {
            let meta = std::fs::metadata(d.path.join(rel)).unwrap();
            meta.permissions().mode() & 0o777
        };
        assert_eq!(mode("top"), 0o700, "private until a finish");
        let resumed = d.plan(&policy, Options::default(), dirs()).unwrap();
        let done = super::super::finish(&resumed, &[], &[]).unwrap();
        assert_eq!((mode("top"), mode("top/sub")), (0o755, 0o750));
        assert_eq!(done.dirs, 2);
        // Directories that were there before any session stay as they were.
        std::fs::create_dir(d.path.join("theirs")).unwrap();
        std::fs::set_permissions(d.path.join("theirs"), PermissionsExt::from_mode(0o700)).unwrap();
        let mut theirs = entry("theirs", EntryKind::Dir);
        theirs.mode = 0o755;
        let plan = d.plan(&policy, Options::default(), vec![theirs]).unwrap();
        super::super::finish(&plan, &[], &[]).unwrap();
        assert_eq!(
            mode("theirs"),
            0o700,
            "re-moded a directory it did not create"
        );
        let staging = std::fs::read_dir(d.path.join(STAGING_DIR)).map_or(0, |r| r.count());
        assert_eq!(staging, 0, "records left in the staging directory");
    }

    #[test]
    fn a_file_planned_where_a_directory_stands_is_refused_before_anything_is_made() {
        let d = TempDest::new("file-on-dir");
        std::fs::create_dir(d.path.join("f")).unwrap();
        let why = d
            .plan(
                &ReceivePolicy::server(),
                Options::default(),
                vec![entry("new", EntryKind::Dir), file("f", 10)],
            )
            .unwrap_err();
        assert!(
            why.ends_with("f exists and is a directory; remove it or choose another destination"),
            "{why}"
        );
        assert!(!d.path.join("new").exists(), "nothing created");
    }

    #[test]
    fn a_directory_planned_where_a_file_or_a_symlink_stands_is_refused() {
        let d = TempDest::new("dir-on-file");
        std::fs::write(d.path.join("x"), b"x").unwrap();
        std::os::unix::fs::symlink("x", d.path.join("y")).unwrap();
        let policy = ReceivePolicy::server();
        let dir = |p| vec![entry(p, EntryKind::Dir)];
        let why = d.plan(&policy, Options::default(), dir("x")).unwrap_err();
        assert!(why.contains("x exists and is not a directory"), "{why}");
        let why = d.plan(&policy, Options::default(), dir("y")).unwrap_err();
        assert!(
            why.contains("y is a symlink; atou does not write through symlinks"),
            "{why}"
        );
        d.plan(&policy, Options::default(), dir("z")).unwrap();
        assert!(d.path.join("z").is_dir());
    }

    #[test]
    fn a_symlink_is_taken_or_refused_as_the_policy_says() {
        let d = TempDest::new("links");
        let server = ReceivePolicy::server();
        let out = || vec![link("l", "../outside")];
        let why = d.plan(&server, Options::default(), out()).unwrap_err();
        assert!(
            why.starts_with("`l` is a symlink to `../outside`, which leads out of the destination"),
            "{why}"
        );
        assert!(
            why.contains("this server's symlink policy is safe"),
            "{why}"
        );
        d.plan(&server, Options::default(), vec![link("l", "inside")])
            .unwrap();
        let flags = |symlinks| UserFlags {
            overwrite: false,
            special_bits: false,
            symlinks,
            fsync: false,
            delete: false,
            owners: false,
            xattrs: false,
            acls: false,
        };
        let all = ReceivePolicy::user(flags(SymlinkPolicy::All), None);
        d.plan(&all, Options::default(), out()).unwrap();
        let none = ReceivePolicy::user(flags(SymlinkPolicy::None), None);
        let why = d
            .plan(&none, Options::default(), vec![link("l", "inside")])
            .unwrap_err();
        assert!(why.contains("symlinks are refused here"), "{why}");
        assert!(why.contains("copy again with --symlinks all"), "{why}");
        // A link already at the destination is followed on the way.
        std::os::unix::fs::symlink("..", d.path.join("up")).unwrap();
        let why = d
            .plan(&server, Options::default(), vec![link("l", "up/x")])
            .unwrap_err();
        assert!(why.contains("leads out of the destination"), "{why}");
    }

    #[test]
    fn a_symlink_already_there_is_kept_only_when_it_leads_to_the_same_place() {
        let d = TempDest::new("same-link");
        std::os::unix::fs::symlink("t", d.path.join("l")).unwrap();
        let policy = ReceivePolicy::server();
        let same = d
            .plan(&policy, skip_existing(), vec![link("l", "t")])
            .unwrap();
        assert_eq!(same.skip, [true]);
        let why = d
            .plan(&policy, skip_existing(), vec![link("l", "u")])
            .unwrap_err();
        assert!(why.starts_with("1 entry already exists in"), "{why}");
    }

    #[test]
    fn an_existing_file_is_skipped_on_its_size_and_mtime_or_is_a_conflict() {
        let d = TempDest::new("skip");
        write_with_mtime(&d.path.join("f"), b"12345", MTIME);
        let policy = ReceivePolicy::server();
        let same = d
            .plan(&policy, skip_existing(), vec![file("f", 5)])
            .unwrap();
        assert_eq!(same.plans, [FilePlan::Skip]);
        assert_eq!(same.skip, [true]);
        let why = d
            .plan(&policy, skip_existing(), vec![file("f", 6)])
            .unwrap_err();
        assert!(why.contains("1 entry already exists in"), "{why}");
        assert!(why.contains(": f; "), "{why}");
        assert!(
            why.ends_with("use --overwrite to replace, or --skip-existing to keep identical files"),
            "{why}"
        );
        // Replacing needs both the sender's ask and the policy's leave.
        let overwrite = Options {
            overwrite: true,
            ..Options::default()
        };
        let why = d.plan(&policy, overwrite, vec![file("f", 6)]).unwrap_err();
        assert!(
            why.contains("this server does not let senders replace files"),
            "{why}"
        );
        let allowing = ReceivePolicy {
            allow_overwrite: true,
            ..ReceivePolicy::server()
        };
        let replaced = d.plan(&allowing, overwrite, vec![file("f", 6)]).unwrap();
        assert_eq!(replaced.plans, [FilePlan::SendAll]);
        assert!(replaced.files[0].fresh);
    }

    #[test]
    fn an_existing_file_compared_by_content_is_reported_as_held() {
        let d = TempDest::new("checksum");
        let data = b"hello, world";
        write_with_mtime(&d.path.join("f"), data, MTIME + 7);
        let checksum = Options {
            skip_existing: true,
            checksum: true,
            ..Options::default()
        };
        let size = data.len() as u64;
        let prepared = d
            .plan(&ReceivePolicy::server(), checksum, vec![file("f", size)])
            .unwrap();
        let cvs = vec![chunk_cv(size, 0, data)];
        assert_eq!(prepared.plans, [FilePlan::Held(cvs.clone())]);
        assert_eq!(prepared.held, [cvs]);
        let t = &prepared.files[0];
        assert!(t.existing.is_some() && !t.fresh, "compared, not sent fresh");
        assert!(t.unchanged_existing(), "identical until a chunk differs");
        // What is read to compare counts against the receiver's budget.
        let why = d
            .plan_within(
                size - 1,
                &ReceivePolicy::server(),
                checksum,
                vec![file("f", size)],
                Vec::new(),
            )
            .unwrap_err();
        assert!(why.contains("(--max-checksum)"), "{why}");
    }

    #[test]
    fn a_partial_file_reports_the_chunks_it_holds() {
        let d = TempDest::new("partial");
        let size = CHUNK_SIZE + 100;
        let first = vec![7u8; CHUNK_SIZE as usize];
        let staged = d.dest.create_staged(&staged_name(b"f")).unwrap();
        staged.write_all_at(&first, 0).unwrap();
        let prepared = d
            .plan(
                &ReceivePolicy::server(),
                Options::default(),
                vec![file("f", size)],
            )
            .unwrap();
        let cvs = vec![chunk_cv(size, 0, &first), NOT_HELD];
        assert_eq!(prepared.plans, [FilePlan::Held(cvs)]);
        let t = &prepared.files[0];
        assert!(
            !t.fresh && t.existing.is_none(),
            "resumed from the partial file"
        );
        assert!(
            t.created.load(std::sync::atomic::Ordering::Acquire),
            "the partial file is there to reopen"
        );
    }

    #[test]
    fn a_split_files_partial_file_reports_only_its_parts_chunks() {
        let d = TempDest::new("split");
        let size = 3 * CHUNK_SIZE;
        let chunk = vec![9u8; CHUNK_SIZE as usize];
        let staged = d.dest.create_staged(&staged_name(b"f")).unwrap();
        staged.write_all_at(&chunk, 0).unwrap();
        staged.write_all_at(&chunk, CHUNK_SIZE).unwrap();
        let part = FilePart {
            file: 0,
            chunks: 1..3,
        };
        let prepared = d
            .plan_within(
                u64::MAX,
                &ReceivePolicy::server(),
                Options::default(),
                vec![file("f", size)],
                vec![part],
            )
            .unwrap();
        // Chunk 0 is another shard's; chunk 2 is past the partial file's end.
        let cvs = vec![NOT_HELD, chunk_cv(size, 1, &chunk), NOT_HELD];
        assert_eq!(prepared.plans, [FilePlan::Held(cvs)]);
        assert_eq!(prepared.files[0].part.as_ref().unwrap().chunks, 1..3);
    }

    #[test]
    fn the_staging_directory_cannot_be_named() {
        let d = TempDest::new("reserved");
        let why = d
            .plan(
                &ReceivePolicy::server(),
                Options::default(),
                vec![file(&format!("{STAGING_DIR}/x"), 1)],
            )
            .unwrap_err();
        assert!(
            why.contains("is reserved for atou's partial files"),
            "{why}"
        );
    }
}

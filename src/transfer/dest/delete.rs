//! `--delete`: what the manifest's directories hold at the receiver that
//! the manifest does not list. Found when the plan is checked (so a dry
//! run can list it) and removed at the finish, after every file took its
//! name: a transfer that fails removes nothing (rsync's `--delete-after`).
//!
//! Only directories the manifest lists are looked in, so nothing outside
//! the transferred roots is touched, and neither DEST itself nor a key's
//! subdirectory is ever one of them. What the sender's filter rules
//! exclude is protected, as rsync protects it without
//! `--delete-excluded`: an excluded name is left, and a directory holding
//! one is left with it. Every name is resolved beneath DEST's descriptor
//! and removed with `unlinkat`, never followed: a symlink is removed as a
//! link, and a directory swapped for a symlink meanwhile is not entered.

use std::collections::HashSet;
use std::io;
use std::os::fd::OwnedFd;

use super::plan::DirCache;
use super::{join_rel, split_rel, ReceivePolicy};
use crate::io::dest_dir::{self, DestDir, Found};
use crate::transfer::exclude::Filters;
use crate::transfer::manifest::{EntryKind, Manifest, RelPath};
use crate::transfer::messages::{Deletions, Options};
use crate::transfer::Error;

/// What one plan removes: paths relative to DEST/SUBDIR (as the
/// manifest's are), each a directory or not, and the rules that protect
/// what lies beneath the directories among them.
#[derive(Debug, Default)]
pub struct Extraneous {
    found: Vec<(Vec<u8>, bool)>,
    protect: Filters,
    /// The plan's SUBDIR beneath DEST.
    sub: Vec<u8>,
}

impl Extraneous {
    /// The plan reply's account of it.
    pub fn deletions(&self) -> Deletions {
        Deletions {
            listed: self
                .found
                .iter()
                // A path past the longest a manifest may name is removed
                // all the same, only not listed.
                .filter_map(|(p, d)| RelPath::new(p.clone()).ok().map(|p| (p, *d)))
                .collect(),
            total: self.found.len() as u64,
        }
    }
}

/// Whether this receiver may delete at all; why not, as the refusal says.
pub(super) fn check_allowed(asked: &Options, policy: &ReceivePolicy) -> Result<(), Error> {
    if !asked.delete {
        return Ok(());
    }
    let why = if asked.shard {
        // Other shards' files are not in this one's manifest.
        "--delete cannot be used with --shard: each shard would delete the others' files"
    } else if policy.allow_delete && !policy.key_forbids_delete {
        return Ok(());
    } else if policy.users_own {
        "the sending end asked to delete what it does not send (--delete), but this copy was \
         not given --delete"
    } else if !policy.allow_delete {
        "this server does not let senders delete files (its operator can start it with \
         --allow-delete)"
    } else {
        "this client's key may not delete files here (its line in the server's authorized \
         keys has no `delete` option)"
    };
    Err(Error::Refused {
        why: why.to_string(),
    })
}

/// In each directory of `manifest` that stands in DEST/`sub`, the names
/// the manifest does not list and `protect` does not exclude.
pub(super) fn find(
    dest_dir: &DestDir,
    sub: &[u8],
    manifest: &Manifest,
    protect: Filters,
) -> Result<Extraneous, Error> {
    let listed: HashSet<&[u8]> = manifest.entries.iter().map(|e| e.path.as_bytes()).collect();
    let mut found = Vec::new();
    for entry in &manifest.entries {
        if entry.kind != EntryKind::Dir {
            continue;
        }
        let rel = entry.path.as_bytes();
        let at = join_rel(sub, rel);
        let dir = match open_existing_dir(dest_dir, &at) {
            Ok(Some(dir)) => dir,
            // Not there yet (the plan creates it), or not a directory (the
            // plan replaces it or refused): nothing of it to delete.
            Ok(None) => continue,
            Err(e) => return Err(Error::disk("open", &dest_dir.shown(&at), e)),
        };
        let mut names =
            dest_dir::entries(&dir).map_err(|e| Error::disk("list", &dest_dir.shown(&at), e))?;
        // By directory, each in name order: the listing reads as rsync's,
        // and the removal opens each directory once.
        names.sort_by(|a, b| a.0.cmp(&b.0));
        for (name, what) in names {
            let path = join_rel(rel, &name);
            let is_dir = what == Found::Dir;
            if listed.contains(path.as_slice()) || protect.excludes(&path, is_dir) {
                continue;
            }
            found.push((path, is_dir));
        }
    }
    Ok(Extraneous {
        found,
        protect,
        sub: sub.to_vec(),
    })
}

/// Directory `rel` beneath DEST, `None` if nothing (or not a directory)
/// is there.
fn open_existing_dir(dest_dir: &DestDir, rel: &[u8]) -> io::Result<Option<OwnedFd>> {
    match dest_dir.open_dir(rel) {
        Ok(dir) => Ok(Some(dir)),
        Err(e) if gone_or_not_a_dir(&e) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Nothing there, or not a directory (a symlink on the way included).
fn gone_or_not_a_dir(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOENT | libc::ENOTDIR | libc::ELOOP)
    )
}

/// Removes what [`find`] found; returns the entries removed
/// (a directory's contents counted one by one), and adds to `written_into`
/// the directories whose contents changed.
pub(super) fn remove(
    dest_dir: &DestDir,
    extraneous: &Extraneous,
    written_into: &mut Vec<Vec<u8>>,
) -> Result<u64, Error> {
    let mut removed = 0;
    // `found` is by directory: each is opened once.
    let mut dirs = DirCache::new(dest_dir);
    for (rel, _) in &extraneous.found {
        let at = join_rel(&extraneous.sub, rel);
        let (parent, name) = split_rel(&at);
        let dir = match dirs.get(parent) {
            Ok(dir) => dir,
            Err(e) if gone_or_not_a_dir(&e) => continue,
            Err(e) => return Err(Error::disk("open", &dest_dir.shown(parent), e)),
        };
        let gone = remove_entry(
            dest_dir,
            dir,
            &at,
            name,
            rel,
            &extraneous.protect,
            &mut removed,
        )
        .map_err(|e| Error::disk("delete", &dest_dir.shown(&at), e))?;
        if gone {
            written_into.push(parent.to_vec());
        }
    }
    Ok(removed)
}

/// Removes `name` (at `at` beneath DEST, `rel` as the rules see it) from
/// `dir`, a directory with whatever it holds that `protect` does not
/// protect. Returns whether it is gone.
fn remove_entry(
    dest_dir: &DestDir,
    dir: &OwnedFd,
    at: &[u8],
    name: &[u8],
    rel: &[u8],
    protect: &Filters,
    removed: &mut u64,
) -> io::Result<bool> {
    match dest_dir::look(dir, name)? {
        Found::Nothing => return Ok(false),
        Found::Dir => {}
        _ => {
            dest_dir::remove(dir, name, false)?;
            *removed += 1;
            return Ok(true);
        }
    }
    let inner = match open_existing_dir(dest_dir, at)? {
        Some(inner) => inner,
        // Swapped for a link or a file since it was looked at: removed as
        // what it is now, never entered.
        None => {
            dest_dir::remove(dir, name, false)?;
            *removed += 1;
            return Ok(true);
        }
    };
    let mut kept = false;
    for (child, what) in dest_dir::entries(&inner)? {
        let child_rel = join_rel(rel, &child);
        if protect.excludes(&child_rel, what == Found::Dir) {
            kept = true;
            continue;
        }
        let child_at = join_rel(at, &child);
        kept |= !remove_entry(
            dest_dir, &inner, &child_at, &child, &child_rel, protect, removed,
        )?;
    }
    if kept {
        return Ok(false);
    }
    match dest_dir::remove(dir, name, true) {
        Ok(()) => {
            *removed += 1;
            Ok(true)
        }
        // Something new in it since it was listed: it stays.
        Err(e) if e.raw_os_error() == Some(libc::ENOTEMPTY) => Ok(false),
        Err(e) => Err(e),
    }
}

//! The one receive policy every receiver uses (`atou serve`, a local
//! `atou copy`, the local end of a pull, the far end of a push), the names
//! a receiver asked for, and how a symlink is judged: where it leads once
//! the links on its way are followed.

use std::collections::{HashMap, HashSet};

use super::split_first;
use crate::transfer::messages::PlanRequest;
use crate::transfer::Error;
use crate::util::text::shown;

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
/// and its key's options. The sender's options (overwrite, modes, fsync) are requests checked
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
    /// Which symlinks are created; [`SymlinkPolicy::Safe`] by default.
    pub symlinks: SymlinkPolicy,
    /// The sender's key may not replace files, whatever `allow_overwrite`
    /// says (its authorized_keys line has no `overwrite`).
    pub key_forbids_overwrite: bool,
    /// A sender that asks (`--delete`) may remove, in the directories it
    /// sends, what it does not send.
    pub allow_delete: bool,
    /// The sender's key may not delete, whatever `allow_delete` says (its
    /// authorized_keys line has no `delete`).
    pub key_forbids_delete: bool,
    /// The sender's key may not ask `-o`/`-g`, whatever `allow_owners`
    /// says (its authorized_keys line has no `owners`).
    pub key_forbids_owners: bool,
    /// The sender's key may not ask `-X` (no `xattrs` on its line).
    pub key_forbids_xattrs: bool,
    /// The sender's key may not ask `-A` (no `acls` on its line).
    pub key_forbids_acls: bool,
    /// A sender that asks (`-o`, `-g`) may give what it sends its owners and
    /// groups, where this receiver runs as root.
    pub allow_owners: bool,
    /// Which extended attributes a sender that asks (`-X`) may set.
    pub allow_xattrs: XattrGrant,
    /// A sender that asks (`-A`) may set POSIX ACLs.
    pub allow_acls: bool,
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
    /// `--overwrite`: existing files may be replaced, directories re-moded.
    pub overwrite: bool,
    /// `--perms`: setuid, setgid and sticky bits are kept.
    pub special_bits: bool,
    /// `--symlinks`: which symlinks are created.
    pub symlinks: SymlinkPolicy,
    /// `--fsync`: every file and directory is synced before the transfer
    /// is reported verified.
    pub fsync: bool,
    /// `--delete`: what the sending end does not send may be removed from
    /// the directories it sends.
    pub delete: bool,
    /// `-o` / `-g`: entries may get the sending end's owners and groups.
    pub owners: bool,
    /// `-X`: entries may get the sending end's extended attributes, in
    /// every namespace this user may set.
    pub xattrs: bool,
    /// `-A`: entries may get the sending end's POSIX ACLs.
    pub acls: bool,
}

/// The extended attributes (`-X`) a receiver sets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum XattrGrant {
    /// None: a plan that asks is refused.
    #[default]
    None,
    /// `user.*` alone; the other namespaces a sender sends are left out.
    User,
    /// `user.*`, and `security.*` and `trusted.*` where the receiver runs
    /// as root (`security.capability` gives a program privileges).
    All,
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
            allow_delete: false,
            key_forbids_delete: false,
            key_forbids_owners: false,
            key_forbids_xattrs: false,
            key_forbids_acls: false,
            allow_owners: false,
            allow_xattrs: XattrGrant::None,
            allow_acls: false,
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
            allow_delete: flags.delete,
            key_forbids_delete: false,
            key_forbids_owners: false,
            key_forbids_xattrs: false,
            key_forbids_acls: false,
            allow_owners: flags.owners,
            // security.capability grants a program privileges as a
            // setuid bit does: the namespaces past user.* go with the
            // special bits (-p), whatever the other end sends.
            allow_xattrs: match (flags.xattrs, flags.special_bits) {
                (false, _) => XattrGrant::None,
                (true, false) => XattrGrant::User,
                (true, true) => XattrGrant::All,
            },
            allow_acls: flags.acls,
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
    pub fn check(&self, request: &PlanRequest) -> Result<(), Error> {
        if let Some(sub) = &request.subdir {
            return Err(Error::UnaskedSubdir {
                subdir: sub.to_string(),
            });
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
            return Err(Error::UnaskedEntry {
                entry: entry.path.to_string(),
                asked: self.shown.join(", "),
            });
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
/// target, more than 40 links (`MAX_LINK_HOPS`) or more than 2048
/// components walked (`MAX_LINK_STEPS`), is refused. A name that is
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
#[cfg(test)]
mod tests {
    use super::*;
    use crate::transfer::manifest::{Entry, EntryKind, Manifest, RelPath};

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
            delete: false,
            owners: false,
            xattrs: false,
            acls: false,
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
            options: crate::transfer::messages::Options::default(),
            subdir: subdir.map(|s| RelPath::new(s.as_bytes().to_vec()).unwrap()),
            manifest: Manifest { entries },
            parts: Vec::new(),
            protect: Vec::new(),
            owners: None,
            xattrs: None,
            same: Vec::new(),
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
            let why = asked.check(&plan_of(None, &bad)).unwrap_err().to_string();
            assert!(why.contains("which was not asked for"), "{bad:?}: {why}");
            assert!(why.contains("data/report.txt, runs/, logs"), "{why}");
        }
        let why = asked
            .check(&plan_of(Some("sub"), &["report.txt"]))
            .unwrap_err()
            .to_string();
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

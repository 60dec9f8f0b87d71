//! The per-key quota of staged partial files (`atou serve
//! --max-staged-per-key`).
//!
//! A transfer's partial files stay in DEST's staging directory until its
//! finish, and an abandoned transfer's stay there to be resumed until
//! `--staging-ttl` removes them. Without a quota, one key could plan huge
//! files, abandon the transfers and repeat, and fill the disk that every
//! other key writes to. So every plan the server accepts is a *claim*: the
//! files it will stage, each at the size the plan announces (a partial
//! file never holds more: chunks are placed by that size; a sparse file
//! counts at its full size, whatever it holds), or at what an earlier
//! attempt left in its partial file if that is more. A claim is held by
//! whoever sent the plan: its key, or for a client without one (`--no-auth`)
//! its address. One owner's claims together may hold at most the quota;
//! a plan that would take them over it is refused before anything is
//! written.
//!
//! Each staged file is counted once, in the newest claim that names it: a
//! resumed transfer takes its files over from its own earlier claim
//! rather than counting them again (another key sending the same file
//! takes it over just the same). A file leaves the count when it takes
//! its name at a finish; a claim leaves with its last file, or when
//! `--staging-ttl` removes it as it removes partial files (a claim keeps
//! the time of its plan).
//!
//! The server writes each claim into the staging directory (`HASH.claim`,
//! which no peer can name), so a restarted server counts what transfers
//! abandoned before it left. In memory the ledger keeps an entry of about
//! 40 bytes per staged file; one owner's files are bounded by
//! `--max-files`, as one transfer's entries are.

use std::collections::{HashMap, HashSet};
use std::io::{self, Read, Write};
use std::net::IpAddr;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::io::dest_dir::{DestDir, Found, STAGING_DIR};
use crate::transfer::Error;
use crate::util::units::{format_size, format_whole_duration};

/// Identifies a claim's layout; bumped on any change.
const MAGIC: &[u8; 16] = b"atou claim v1\n\0\0";
const OWNER_LEN: usize = 33;
/// Magic, owner, count of files.
const HEADER_LEN: usize = 16 + OWNER_LEN + 8;
/// A file's id and bytes.
const ENTRY_LEN: usize = 16 + 8;
const SUFFIX: &str = ".claim";

/// Who holds a claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Owner {
    /// An authenticated client, by its public key.
    Key([u8; 32]),
    /// A client without a key (a server started with `--no-auth`), by its
    /// address.
    Addr(IpAddr),
}

impl Owner {
    fn encode(&self) -> [u8; OWNER_LEN] {
        let mut b = [0; OWNER_LEN];
        match self {
            Owner::Key(key) => {
                b[0] = 1;
                b[1..].copy_from_slice(key);
            }
            Owner::Addr(ip) => {
                b[0] = 2;
                let v6 = match ip {
                    IpAddr::V4(v4) => v4.to_ipv6_mapped(),
                    IpAddr::V6(v6) => *v6,
                };
                b[1..17].copy_from_slice(&v6.octets());
            }
        }
        b
    }

    fn decode(b: &[u8]) -> Option<Owner> {
        match b.first()? {
            1 => Some(Owner::Key(b.get(1..OWNER_LEN)?.try_into().ok()?)),
            2 => {
                let octets: [u8; 16] = b.get(1..17)?.try_into().ok()?;
                let v6 = std::net::Ipv6Addr::from(octets);
                Some(Owner::Addr(
                    v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
                ))
            }
            _ => None,
        }
    }

    /// The owner as its refusal names it.
    fn called(&self) -> &'static str {
        match self {
            Owner::Key(_) => "this client's key",
            Owner::Addr(_) => "this client's address",
        }
    }
}

/// A file a plan will stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ToStage<'a> {
    /// Its partial file's name in the staging directory.
    pub staged: &'a str,
    /// The most its partial file can hold: the size the plan announces,
    /// or what an earlier attempt left there if that is more.
    pub bytes: u64,
}

/// A staged file, by 16 bytes of the BLAKE3 of its partial file's name.
type FileId = [u8; 16];

fn file_id(staged: &str) -> FileId {
    let hash = blake3::hash(staged.as_bytes());
    hash.as_bytes()[..16].try_into().expect("16 bytes")
}

/// A claim, by a number of this process's.
pub(crate) type ClaimId = u64;

#[derive(Debug)]
struct Claim {
    owner: Owner,
    /// Its file in the staging directory.
    file: String,
    /// When its plan was accepted: a rewritten claim keeps it as its
    /// mtime, so `--staging-ttl` counts from the plan.
    planned: SystemTime,
    /// Files it counts now (others may have taken some over).
    files: u64,
}

/// What one owner's claims hold.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Held {
    pub files: u64,
    pub bytes: u64,
}

#[derive(Debug, Default)]
struct Ledger {
    /// Each staged file: the claim that counts it, and its bytes.
    held: HashMap<FileId, (ClaimId, u64)>,
    claims: HashMap<ClaimId, Claim>,
    owners: HashMap<Owner, Held>,
    next: ClaimId,
}

impl Ledger {
    /// Keeps `claim` under a new id.
    fn add(&mut self, claim: Claim) -> ClaimId {
        let id = self.next;
        self.next += 1;
        self.claims.insert(id, claim);
        id
    }

    /// Counts `id` in `claim` (taking it from the claim that counted it,
    /// returned).
    fn hold(&mut self, id: FileId, claim: ClaimId, bytes: u64) -> Option<ClaimId> {
        let was = self.unhold(id);
        let owner = self.claims.get_mut(&claim).map(|c| {
            c.files += 1;
            c.owner
        });
        if let Some(owner) = owner {
            let held = self.owners.entry(owner).or_default();
            held.files += 1;
            held.bytes = held.bytes.saturating_add(bytes);
            self.held.insert(id, (claim, bytes));
        }
        was
    }

    /// Stops counting `id`; the claim that counted it.
    fn unhold(&mut self, id: FileId) -> Option<ClaimId> {
        let (claim, bytes) = self.held.remove(&id)?;
        if let Some(c) = self.claims.get_mut(&claim) {
            c.files = c.files.saturating_sub(1);
            if let Some(held) = self.owners.get_mut(&c.owner) {
                held.files = held.files.saturating_sub(1);
                held.bytes = held.bytes.saturating_sub(bytes);
                if held.files == 0 {
                    self.owners.remove(&c.owner);
                }
            }
        }
        Some(claim)
    }

    /// Stops counting every file of the claims in `gone`, and forgets them.
    fn forget_claims(&mut self, gone: &HashSet<ClaimId>) {
        if gone.is_empty() {
            return;
        }
        let ids: Vec<FileId> = self
            .held
            .iter()
            .filter(|(_, (claim, _))| gone.contains(claim))
            .map(|(&id, _)| id)
            .collect();
        for id in ids {
            self.unhold(id);
        }
        self.claims.retain(|c, _| !gone.contains(c));
    }
}

/// The quota, and the ledger of who holds what in the staging directory.
#[derive(Debug)]
pub(crate) struct StagedQuota {
    /// Most bytes one owner's claims may count.
    max_bytes: u64,
    /// Most files one owner's claims may count.
    max_files: u64,
    /// `--staging-ttl`, for the refusal's advice.
    ttl: Option<Duration>,
    ledger: Mutex<Ledger>,
}

fn to_time(secs: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(secs.max(0) as u64)
}

fn encode(owner: Owner, files: &[(FileId, u64)]) -> Vec<u8> {
    let mut b = Vec::with_capacity(HEADER_LEN + files.len() * ENTRY_LEN);
    b.extend_from_slice(MAGIC);
    b.extend_from_slice(&owner.encode());
    b.extend_from_slice(&(files.len() as u64).to_be_bytes());
    for (id, bytes) in files {
        b.extend_from_slice(id);
        b.extend_from_slice(&bytes.to_be_bytes());
    }
    b
}

/// A claim's owner and files; `None` if it is not one of ours, whole.
fn decode(b: &[u8]) -> Option<(Owner, Vec<(FileId, u64)>)> {
    if b.len() < HEADER_LEN || &b[..16] != MAGIC {
        return None;
    }
    let owner = Owner::decode(&b[16..16 + OWNER_LEN])?;
    let count = u64::from_be_bytes(b[16 + OWNER_LEN..HEADER_LEN].try_into().ok()?);
    let body = &b[HEADER_LEN..];
    if body.len() % ENTRY_LEN != 0 || (body.len() / ENTRY_LEN) as u64 != count {
        return None;
    }
    let files = body
        .chunks_exact(ENTRY_LEN)
        .map(|e| {
            let id: FileId = e[..16].try_into().expect("16 bytes");
            let bytes = u64::from_be_bytes(e[16..].try_into().expect("8 bytes"));
            (id, bytes)
        })
        .collect();
    Some((owner, files))
}

/// Writes a claim under a new name (`O_EXCL`: never over another), with
/// `planned` as its mtime; its name.
fn write_claim(
    dest: &DestDir,
    owner: Owner,
    files: &[(FileId, u64)],
    planned: SystemTime,
) -> io::Result<String> {
    let bytes = encode(owner, files);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    for attempt in 0u32..8 {
        let mut h = blake3::Hasher::new();
        h.update(b"atou claim name v1\0");
        h.update(&nanos.to_be_bytes());
        h.update(&std::process::id().to_be_bytes());
        h.update(&attempt.to_be_bytes());
        h.update(&bytes[16..HEADER_LEN]);
        let name = format!("{}{SUFFIX}", &h.finalize().to_hex()[..32]);
        let mut file = match dest.create_staged(&name) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        };
        let written = file
            .write_all(&bytes)
            .and_then(|()| file.set_times(std::fs::FileTimes::new().set_modified(planned)));
        if let Err(e) = written {
            let _ = dest.remove_staged(&name);
            return Err(e);
        }
        return Ok(name);
    }
    Err(io::Error::from_raw_os_error(libc::EEXIST))
}

impl StagedQuota {
    /// The quota (`max_bytes` and `max_files` per owner), with the claims
    /// already in DEST's staging directory: what transfers before this
    /// server's start left. A claim that is not whole (a crash while it
    /// was written) is left for `--staging-ttl`, uncounted.
    pub(crate) fn load(
        dest: &DestDir,
        max_bytes: u64,
        max_files: u64,
        ttl: Option<Duration>,
    ) -> io::Result<StagedQuota> {
        let quota = StagedQuota {
            max_bytes,
            max_files,
            ttl,
            ledger: Mutex::new(Ledger::default()),
        };
        let mut found = dest.staged_files_ending(SUFFIX)?;
        // Oldest first: a file named by two claims counts in the newer.
        found.sort_by(|a, b| (a.1, &a.0).cmp(&(b.1, &b.0)));
        let mut ledger = quota.lock();
        let mut touched = HashSet::new();
        for (name, mtime) in found {
            let mut bytes = Vec::new();
            let read = dest
                .open_staged(&name, false)
                .and_then(|mut f| f.read_to_end(&mut bytes));
            let Some((owner, files)) = read.ok().and_then(|_| decode(&bytes)) else {
                continue;
            };
            let claim = ledger.add(Claim {
                owner,
                file: name,
                planned: to_time(mtime),
                files: 0,
            });
            for (id, bytes) in files {
                touched.extend(ledger.hold(id, claim, bytes));
            }
        }
        // Claims whose files newer ones took over are written again
        // without them, so a later start does not count them twice.
        quota.settle(&mut ledger, dest, touched);
        drop(ledger);
        Ok(quota)
    }

    fn lock(&self) -> MutexGuard<'_, Ledger> {
        // A planner that panicked left the counts as they were between
        // two whole updates: they are still the best there is.
        self.ledger.lock().unwrap_or_else(|e| e.into_inner())
    }

    #[cfg(test)]
    /// What `owner`'s claims count now.
    pub(crate) fn held(&self, owner: Owner) -> Held {
        self.lock().owners.get(&owner).copied().unwrap_or_default()
    }

    /// Takes `files`, the files a plan from `owner` will stage, into the
    /// count, unless that would take the owner's claims over the quota:
    /// then why not, for the sender. With `record` (not a dry run) the
    /// claim is written and counted, and its id returned (`None` for a
    /// plan that stages nothing); a resumed transfer's files are taken
    /// over from the claims that counted them.
    pub(crate) fn admit(
        &self,
        dest: &DestDir,
        owner: Owner,
        files: &[ToStage<'_>],
        record: bool,
    ) -> Result<Option<ClaimId>, Error> {
        let mut ledger = self.lock();
        let before = ledger.owners.get(&owner).copied().unwrap_or_default();
        let ids: Vec<(FileId, u64)> = files.iter().map(|f| (file_id(f.staged), f.bytes)).collect();
        // What the owner's claims count already of this plan's files.
        let mut again = Held::default();
        let mut this = Held::default();
        for (id, bytes) in &ids {
            this.files += 1;
            this.bytes = this.bytes.saturating_add(*bytes);
            if let Some(&(claim, had)) = ledger.held.get(id) {
                if ledger.claims.get(&claim).is_some_and(|c| c.owner == owner) {
                    again.files += 1;
                    again.bytes += had;
                }
            }
        }
        let others = Held {
            files: before.files.saturating_sub(again.files),
            bytes: before.bytes.saturating_sub(again.bytes),
        };
        let after = Held {
            files: others.files + this.files,
            bytes: others.bytes.saturating_add(this.bytes),
        };
        // An owner already over (the quota was lowered) may still resume
        // what it holds: only a plan that adds is refused.
        if after.bytes > self.max_bytes && after.bytes > before.bytes {
            let why = self.over_bytes(owner, others.bytes, this.bytes);
            return Err(Error::OverBudget { why });
        }
        if after.files > self.max_files && after.files > before.files {
            let why = self.over_files(owner, others.files, this.files);
            return Err(Error::OverBudget { why });
        }
        if !record || ids.is_empty() {
            return Ok(None);
        }
        let planned = SystemTime::now();
        let file = write_claim(dest, owner, &ids, planned).map_err(|e| {
            Error::disk(
                "record what this transfer stages in",
                &dest.shown(STAGING_DIR.as_bytes()),
                e,
            )
        })?;
        let claim = ledger.add(Claim {
            owner,
            file,
            planned,
            files: 0,
        });
        let mut touched = HashSet::new();
        for (id, bytes) in ids {
            touched.extend(ledger.hold(id, claim, bytes));
        }
        touched.remove(&claim);
        self.settle(&mut ledger, dest, touched);
        Ok(Some(claim))
    }

    fn advice(&self) -> String {
        let wait = match self.ttl {
            Some(ttl) => format!(
                "or wait until this server removes partial files untouched for {} \
                 (--staging-ttl)",
                format_whole_duration(ttl)
            ),
            None => "this server keeps abandoned partial files until they are resumed \
                     (--staging-ttl 0)"
                .to_string(),
        };
        format!(
            "to free it, run the unfinished transfers again to the end (a resumed \
             transfer is not counted twice), {wait}"
        )
    }

    fn over_bytes(&self, owner: Owner, others: u64, this: u64) -> String {
        let quota = format_size(self.max_bytes);
        if others == 0 {
            return format!(
                "this transfer would stage {} of partial files, over this server's quota of \
                 {quota} per key (--max-staged-per-key); send less at a time, or ask its \
                 operator to raise the quota",
                format_size(this)
            );
        }
        format!(
            "{} already has {} staged here in partial files of unfinished transfers \
             (abandoned ones included), and this transfer would stage {} more: over this \
             server's quota of {quota} per key (--max-staged-per-key); {}",
            owner.called(),
            format_size(others),
            format_size(this),
            self.advice()
        )
    }

    fn over_files(&self, owner: Owner, others: u64, this: u64) -> String {
        let limit = self.max_files;
        if others == 0 {
            return format!(
                "this transfer would stage {this} files, over this server's limit of {limit} \
                 (--max-files); send fewer at a time"
            );
        }
        format!(
            "{} already has {others} files staged here in unfinished transfers (abandoned \
             ones included), and this transfer would stage {this} more: over this server's \
             limit of {limit} per key (--max-files); {}",
            owner.called(),
            self.advice()
        )
    }

    /// A finished transfer's claim: its files in `gone` (those that took
    /// their names, or were never staged) leave the count, whichever
    /// claim counted them; the claim goes with its last file. Its split
    /// files still waiting for other shards stay counted.
    pub(crate) fn release<'a>(
        &self,
        dest: &DestDir,
        claim: ClaimId,
        gone: impl IntoIterator<Item = &'a str>,
    ) {
        let mut ledger = self.lock();
        let mut touched = HashSet::new();
        for staged in gone {
            touched.extend(ledger.unhold(file_id(staged)));
        }
        // Even one that lost none of its files, if it has none left.
        if ledger.claims.get(&claim).is_some_and(|c| c.files == 0) {
            touched.insert(claim);
        }
        self.settle(&mut ledger, dest, touched);
    }

    /// Takes back the claim of a plan that failed after it was admitted
    /// (creating its directories, say): nothing of it was staged.
    pub(crate) fn withdraw(&self, dest: &DestDir, claim: ClaimId) {
        let mut ledger = self.lock();
        let Some(file) = ledger.claims.get(&claim).map(|c| c.file.clone()) else {
            return;
        };
        ledger.forget_claims(&HashSet::from([claim]));
        let _ = dest.remove_staged(&file);
    }

    /// After `--staging-ttl` swept the staging directory: claims whose
    /// files it removed leave the count.
    pub(crate) fn forget_swept(&self, dest: &DestDir) {
        let mut ledger = self.lock();
        let swept: HashSet<ClaimId> = ledger
            .claims
            .iter()
            .filter(|(_, c)| matches!(dest.look_staged(&c.file), Ok(Found::Nothing)))
            .map(|(&id, _)| id)
            .collect();
        ledger.forget_claims(&swept);
    }

    /// Brings the claims in `touched`, which lost files, up to date on
    /// disk: one with none left is removed, another written again with
    /// what it counts now (under a new name, then the old one removed, so
    /// a crash leaves the old one or both, never none). One that cannot
    /// be written again keeps its old file, which says more than it
    /// counts: a later start counts a file twice rather than not at all.
    fn settle(&self, ledger: &mut Ledger, dest: &DestDir, touched: HashSet<ClaimId>) {
        let (empty, shrunk): (Vec<ClaimId>, Vec<ClaimId>) = touched
            .into_iter()
            .filter(|c| ledger.claims.contains_key(c))
            .partition(|c| ledger.claims[c].files == 0);
        for claim in empty {
            if let Some(c) = ledger.claims.remove(&claim) {
                let _ = dest.remove_staged(&c.file);
            }
        }
        if shrunk.is_empty() {
            return;
        }
        let mut files: HashMap<ClaimId, Vec<(FileId, u64)>> =
            shrunk.iter().map(|&c| (c, Vec::new())).collect();
        for (&id, &(claim, bytes)) in &ledger.held {
            if let Some(list) = files.get_mut(&claim) {
                list.push((id, bytes));
            }
        }
        for (claim, list) in files {
            let c = ledger.claims.get_mut(&claim).expect("kept above");
            if let Ok(file) = write_claim(dest, c.owner, &list, c.planned) {
                let _ = dest.remove_staged(&c.file);
                c.file = file;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    /// A directory of the test's own; kept afterwards, as a failed
    /// test's files are wanted.
    fn scratch(name: &str) -> std::path::PathBuf {
        tempfile::Builder::new()
            .prefix(&format!("atou-staged-{name}-"))
            .tempdir()
            .unwrap()
            .keep()
    }

    fn files<'a>(names: &[&'a str], bytes: u64) -> Vec<ToStage<'a>> {
        names
            .iter()
            .map(|&staged| ToStage { staged, bytes })
            .collect()
    }

    fn claims_in(dir: &std::path::Path) -> usize {
        std::fs::read_dir(dir.join(STAGING_DIR))
            .unwrap()
            .filter(|e| e.as_ref().unwrap().path().extension() == Some("claim".as_ref()))
            .count()
    }

    const ALICE: Owner = Owner::Key([1; 32]);
    const BOB: Owner = Owner::Key([2; 32]);

    /// An abandoned claim counts until its files are resumed and finish;
    /// the resume takes them over instead of counting them twice; another
    /// owner has a count of its own; and a restarted server counts the
    /// same from the claims on disk.
    #[test]
    fn claims_count_per_owner_once_per_file_and_across_a_restart() {
        let dir = scratch("count");
        let dest = DestDir::open(&dir).unwrap();
        let quota = StagedQuota::load(&dest, 16 * MIB, 100, None).unwrap();
        let first = files(&["a.part", "b.part"], 6 * MIB);
        let abandoned = quota.admit(&dest, ALICE, &first, true).unwrap();
        assert!(abandoned.is_some());
        let held = Held {
            files: 2,
            bytes: 12 * MIB,
        };
        assert_eq!(quota.held(ALICE), held);
        // Another 6 MiB of another file is over 16 MiB.
        let why = quota
            .admit(&dest, ALICE, &files(&["c.part"], 6 * MIB), true)
            .unwrap_err()
            .to_string();
        assert!(why.contains("already has 12.00 MiB staged"), "{why}");
        assert!(why.contains("6.00 MiB more"), "{why}");
        assert!(why.contains("--max-staged-per-key"), "{why}");
        assert!(why.contains("--staging-ttl 0"), "{why}");
        // A dry run is told the same and counts nothing.
        assert!(quota
            .admit(&dest, ALICE, &files(&["c.part"], 6 * MIB), false)
            .is_err());
        assert!(quota
            .admit(&dest, ALICE, &files(&["c.part"], MIB), false)
            .unwrap()
            .is_none());
        assert_eq!(quota.held(ALICE), held);
        // Bob's count is his own.
        quota
            .admit(&dest, BOB, &files(&["c.part"], 15 * MIB), true)
            .unwrap();
        assert_eq!(quota.held(BOB).bytes, 15 * MIB);

        // After a restart, the same counts, from the claims on disk.
        drop(quota);
        let quota = StagedQuota::load(&dest, 16 * MIB, 100, None).unwrap();
        assert_eq!(quota.held(ALICE), held);
        assert_eq!(quota.held(BOB).bytes, 15 * MIB);
        assert!(quota
            .admit(&dest, ALICE, &files(&["d.part"], 6 * MIB), true)
            .is_err());

        // The resume (one more small file) takes a and b over from the
        // abandoned claim, which goes: 13 MiB, not 25.
        let mut resume = files(&["a.part", "b.part"], 6 * MIB);
        resume.push(ToStage {
            staged: "e.part",
            bytes: MIB,
        });
        let resumed = quota.admit(&dest, ALICE, &resume, true).unwrap().unwrap();
        assert_eq!(quota.held(ALICE).bytes, 13 * MIB);
        assert_eq!(claims_in(&dir), 2, "Bob's and the resume's");
        // Its finish: a and e took their names, b waits for other parts.
        quota.release(&dest, resumed, ["a.part", "e.part"]);
        assert_eq!(
            quota.held(ALICE),
            Held {
                files: 1,
                bytes: 6 * MIB
            }
        );
        drop(quota);
        let quota = StagedQuota::load(&dest, 16 * MIB, 100, None).unwrap();
        assert_eq!(quota.held(ALICE).bytes, 6 * MIB, "the claim was rewritten");
        quota
            .admit(&dest, ALICE, &files(&["d.part"], 10 * MIB), true)
            .unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A plan over the quota alone is refused with advice of its own; an
    /// owner over a lowered quota may still resume what it holds, not add
    /// to it; the count of files has its limit too.
    #[test]
    fn a_plan_that_adds_over_the_quota_is_refused_and_one_that_does_not_is_not() {
        let dir = scratch("over");
        let dest = DestDir::open(&dir).unwrap();
        let quota =
            StagedQuota::load(&dest, 16 * MIB, 3, Some(Duration::from_secs(7 * 86_400))).unwrap();
        let why = quota
            .admit(&dest, ALICE, &files(&["huge.part"], 1 << 40), true)
            .unwrap_err()
            .to_string();
        assert!(why.contains("would stage 1.00 TiB"), "{why}");
        assert!(why.contains("send less at a time"), "{why}");
        quota
            .admit(&dest, ALICE, &files(&["a.part"], 10 * MIB), true)
            .unwrap();
        drop(quota);
        // Lowered to 8 MiB: Alice holds 10 and may resume them, no more.
        let quota =
            StagedQuota::load(&dest, 8 * MIB, 3, Some(Duration::from_secs(7 * 86_400))).unwrap();
        quota
            .admit(&dest, ALICE, &files(&["a.part"], 10 * MIB), true)
            .unwrap();
        let why = quota
            .admit(&dest, ALICE, &files(&["b.part"], 1), true)
            .unwrap_err()
            .to_string();
        assert!(why.contains("--staging-ttl"), "{why}");
        assert!(why.contains("7d"), "{why}");
        let why = quota
            .admit(&dest, BOB, &files(&["1", "2", "3", "4"], 0), true)
            .unwrap_err()
            .to_string();
        assert!(why.contains("--max-files"), "{why}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Claims that `--staging-ttl` swept leave the count; one withdrawn
    /// goes at once; claims that are not whole are not counted.
    #[test]
    fn swept_withdrawn_and_broken_claims_count_nothing() {
        let dir = scratch("swept");
        let dest = DestDir::open(&dir).unwrap();
        let quota = StagedQuota::load(&dest, 16 * MIB, 100, None).unwrap();
        let claim = quota
            .admit(&dest, ALICE, &files(&["a.part"], 10 * MIB), true)
            .unwrap()
            .unwrap();
        quota.withdraw(&dest, claim);
        assert_eq!(quota.held(ALICE), Held::default());
        assert_eq!(claims_in(&dir), 0);
        quota
            .admit(&dest, ALICE, &files(&["a.part"], 10 * MIB), true)
            .unwrap();
        let old = SystemTime::now() - Duration::from_secs(3600);
        assert_eq!(dest.remove_staged_unchanged_since(old).unwrap().0, 0);
        quota.forget_swept(&dest);
        assert_eq!(quota.held(ALICE).bytes, 10 * MIB, "not old enough");
        let later = SystemTime::now() + Duration::from_secs(3600);
        assert_eq!(dest.remove_staged_unchanged_since(later).unwrap().0, 1);
        quota.forget_swept(&dest);
        assert_eq!(quota.held(ALICE), Held::default());
        // Half a claim (a crash as it was written) is not counted.
        let whole = encode(ALICE, &[(file_id("x.part"), MIB)]);
        let staging = dir.join(STAGING_DIR);
        std::fs::write(staging.join("broken.claim"), &whole[..whole.len() - 1]).unwrap();
        std::fs::write(staging.join("whole.claim"), &whole).unwrap();
        let quota = StagedQuota::load(&dest, 16 * MIB, 100, None).unwrap();
        assert_eq!(quota.held(ALICE).bytes, MIB);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn owners_survive_their_encoding() {
        for owner in [
            ALICE,
            Owner::Addr("192.0.2.7".parse().unwrap()),
            Owner::Addr("2001:db8::1".parse().unwrap()),
        ] {
            assert_eq!(Owner::decode(&owner.encode()), Some(owner));
        }
        assert_eq!(Owner::decode(&[3; OWNER_LEN]), None);
    }
}

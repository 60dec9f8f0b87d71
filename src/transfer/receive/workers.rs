//! The receiver's threads, where its disk work runs: a pool of writers
//! (check a chunk's BLAKE3 value, write it at its place), a pool of
//! planners (check a plan against the disk, finish a transfer), and the
//! staging cleaner. Jobs go in through [`Workers`]; what they finish comes
//! back as [`Done`], and the waker tells the serving loop to look.

use std::ops::Range;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use super::session::{
    granted, Grant, Job, PlanJob, PlanView, SessionKey, WriteFailure, WriteJob, Written,
};
use super::ReceiveConfig;
use crate::io::dest_dir::DestDir;
use crate::transfer::chunk_buf::ChunkBuf;
use crate::transfer::compress::{ChunkDecompressor, Encoding, FrameError};
use crate::transfer::dest::{self, DestError, Finished, Prepared, ReceivePolicy};
use crate::transfer::hash::{chunk_cv, Cv};
use crate::transfer::layout::CV_LEN;
use crate::transfer::messages::{Deletions, FilePlan, Options, PlanRequest, Request};
use crate::transfer::staged::{Owner, StagedQuota, ToStage};
use crate::transfer::Error;

impl PlanView for Prepared {
    fn dest(&self) -> &Path {
        &self.dest
    }

    fn plans(&self) -> &[FilePlan] {
        &self.plans
    }

    fn options(&self) -> Options {
        self.options
    }

    fn deletions(&self) -> Option<Deletions> {
        self.extraneous.as_ref().map(|e| e.deletions())
    }

    fn held(&self) -> &[Vec<Cv>] {
        &self.held
    }

    fn size(&self, file: usize) -> u64 {
        self.files[file].size
    }

    fn part(&self, file: usize) -> Option<Range<u64>> {
        self.files[file].part.as_ref().map(|p| p.chunks.clone())
    }

    fn copies(&self, file: usize) -> &[u32] {
        self.copies.get(file).map_or(&[], Vec::as_slice)
    }

    fn rel(&self, file: usize) -> String {
        self.files[file].rel.to_string()
    }

    fn is_ready(&self, file: usize) -> bool {
        self.files[file].ready.load(Ordering::Acquire)
    }

    fn start_writing(&self, file: usize) {
        self.files[file].writing.fetch_add(1, Ordering::AcqRel);
    }
}

/// Work done by other threads.
pub(super) enum Done {
    Write(Written),
    Plan {
        session: SessionKey,
        conn_id: u64,
        /// Boxed: a plan's result waits in a queue beside smaller messages.
        result: Box<Result<Prepared, Error>>,
    },
    /// A plan that must wait for a place (a `--checksum` plan while
    /// others take their share of the planners).
    PlanBusy {
        session: SessionKey,
        conn_id: u64,
        why: String,
    },
    Finish {
        session: SessionKey,
        conn_id: u64,
        result: Result<Finished, DestError>,
    },
    Ready {
        session: SessionKey,
        result: Result<(), DestError>,
    },
    /// The staging directory's abandoned entries were removed.
    StagingCleaned {
        entries: u64,
        bytes: u64,
        ttl: Duration,
    },
}

/// The receiver's threads, by the queues that feed them.
pub(super) struct Workers {
    jobs: mpsc::Sender<Job<Prepared>>,
    plan_jobs: mpsc::SyncSender<PlanJob<Prepared>>,
    done_rx: mpsc::Receiver<Done>,
    notify: Arc<Notify>,
}

impl Workers {
    /// Starts the writers, the planners and (with a staging TTL, unless a
    /// dry run) the staging cleaner.
    pub(super) fn start(
        config: &ReceiveConfig,
        dest: &Arc<DestDir>,
        quota: Option<Arc<StagedQuota>>,
        dry_runs_only: bool,
    ) -> Result<Workers, Error> {
        let (jobs, job_rx) = mpsc::channel::<Job<Prepared>>();
        let (plan_jobs, plan_rx) = mpsc::sync_channel(config.limits.plan_queue);
        let (done_tx, done_rx) = mpsc::channel();
        let notify = Arc::new(Notify::new());
        let job_rx = Arc::new(Mutex::new(job_rx));
        let plan_rx = Arc::new(Mutex::new(plan_rx));
        let cannot =
            |e: std::io::Error| Error::System(format!("cannot start a receiver thread: {e}"));
        for i in 0..config.writers.max(1) {
            let (j, d, n) = (job_rx.clone(), done_tx.clone(), notify.clone());
            thread::Builder::new()
                .name(format!("atou-writer-{i}"))
                .spawn(move || writer(j, d, n))
                .map_err(cannot)?;
        }
        let checksumming = Arc::new(AtomicUsize::new(0));
        for i in 0..config.limits.planners.max(1) {
            let (j, d, n) = (plan_rx.clone(), done_tx.clone(), notify.clone());
            let dest = dest.clone();
            let rules = PlanRules {
                policy: config.policy.clone(),
                max_entries: config.limits.max_entries,
                max_checksum_bytes: config.limits.max_checksum_bytes,
                checksumming: checksumming.clone(),
                max_checksumming: config.limits.planners.max(2) - 1,
                dry_runs_only,
                quota: quota.clone(),
            };
            thread::Builder::new()
                .name(format!("atou-planner-{i}"))
                .spawn(move || planner(j, dest, rules, d, n))
                .map_err(cannot)?;
        }
        if let (Some(ttl), false) = (config.limits.staging_ttl, dry_runs_only) {
            start_staging_cleaner(dest, ttl, quota, done_tx, notify.clone()).map_err(cannot)?;
        }
        Ok(Workers {
            jobs,
            plan_jobs,
            done_rx,
            notify,
        })
    }

    pub(super) fn write(&self, job: Job<Prepared>) {
        let _ = self.jobs.send(job);
    }

    /// Queues a job for the planners; hands it back if none can take it
    /// now (the queue is full).
    pub(super) fn plan(&self, job: PlanJob<Prepared>) -> Result<(), PlanJob<Prepared>> {
        self.plan_jobs.try_send(job).map_err(|e| match e {
            mpsc::TrySendError::Full(job) | mpsc::TrySendError::Disconnected(job) => job,
        })
    }

    /// Something another thread finished, if anything is waiting.
    pub(super) fn done(&self) -> Option<Done> {
        self.done_rx.try_recv().ok()
    }

    pub(super) fn waker(&self) -> Arc<Notify> {
        self.notify.clone()
    }
}

/// A planner's orders: what its receiver lets plans do.
#[derive(Debug, Clone)]
struct PlanRules {
    policy: ReceivePolicy,
    max_entries: usize,
    max_checksum_bytes: u64,
    /// `--checksum` plans being checked now, over every planner, and how
    /// many may be.
    checksumming: Arc<AtomicUsize>,
    max_checksumming: usize,
    /// Answer dry runs only, refusing any other plan (the receiver of a
    /// dry run, which must change nothing at its destination).
    dry_runs_only: bool,
    /// Each sender's quota of staged files, shared by every planner.
    quota: Option<Arc<StagedQuota>>,
}

fn writer(
    jobs: Arc<Mutex<mpsc::Receiver<Job<Prepared>>>>,
    done: mpsc::Sender<Done>,
    notify: Arc<Notify>,
) {
    let mut expander = Expander::default();
    loop {
        // The queue's lock is let go before the work: writers write at
        // the same time, each taking the next job when it is done.
        let job = jobs.lock().expect("a writer panicked").recv();
        let result = match job {
            Ok(Job::Write(job)) => Done::Write(write_chunk(job, &mut expander)),
            Ok(Job::MakeReady {
                session,
                plan,
                file,
                fsync,
            }) => {
                let result = plan.files[file].make_ready(fsync);
                Done::Ready { session, result }
            }
            Err(_) => return,
        };
        let _ = done.send(result);
        notify.notify_one();
    }
}

/// A writer's means to expand compressed chunks (`--compress`): its
/// decompressor, made at the first such chunk, and one chunk's buffer,
/// reused. Each writer holds at most a chunk more than it would without.
#[derive(Default)]
pub(super) struct Expander {
    zstd: Option<ChunkDecompressor>,
    raw: ChunkBuf,
}

impl Expander {
    /// The chunk's raw bytes from its bytes as sent: `raw_len` of them
    /// exactly, never more (docs/security.md, "Compressed chunks").
    pub(super) fn expand(&mut self, wire: &[u8], raw_len: u32) -> Result<&[u8], FrameError> {
        let zstd = match &mut self.zstd {
            Some(z) => z,
            None => {
                self.zstd
                    .insert(ChunkDecompressor::new().map_err(|e| FrameError::Corrupt {
                        raw: raw_len,
                        why: e.to_string(),
                    })?)
            }
        };
        self.raw.set_len(raw_len as usize);
        zstd.decompress(wire, &mut self.raw)?;
        Ok(&self.raw)
    }
}

/// Checks a chunk against the value its sender gave and writes it. A
/// compressed chunk that does not expand to exactly its length fails as
/// one whose value does not match: named in the answer, sent again.
fn write_chunk(job: WriteJob<Prepared>, expander: &mut Expander) -> Written {
    let t = &job.plan.files[job.file];
    let len = job.buf.len() - CV_LEN as usize;
    let (wire, sent_cv) = job.buf.split_at(len);
    let data = match job.encoding {
        Encoding::Raw => Some(wire),
        Encoding::Zstd => expander.expand(wire, job.raw_len).ok(),
    };
    let result = match data {
        Some(data) if chunk_cv(t.size, job.chunk, data)[..] == *sent_cv => {
            let cv: Cv = sent_cv.try_into().expect("32 bytes");
            let write = |t: &dest::FileTarget| {
                if job.whole {
                    t.write_whole(data, job.fsync)
                } else {
                    t.write_chunk(job.chunk, data)
                }
            };
            // The files the sender read as this one's bytes get the same
            // verified chunk (FilePlan::Copy), each opened for it alone.
            let copied = || {
                for &c in job.plan.copies(job.file) {
                    let copy = &job.plan.files[c as usize];
                    copy.writing.fetch_add(1, Ordering::AcqRel);
                    let written = write(copy);
                    let closed = copy.chunk_done(job.fsync);
                    written?;
                    closed?;
                }
                Ok(())
            };
            write(t)
                .and_then(|()| copied())
                .map(|()| cv)
                .map_err(WriteFailure::Io)
        }
        _ => Err(WriteFailure::Corrupt),
    };
    // Every outcome hands the chunk back, so the last one closes the file.
    let closed = t.chunk_done(job.fsync);
    let result = result.and_then(|cv| closed.map(|()| cv).map_err(|e| WriteFailure::Io(e.into())));
    Written {
        to: job.to,
        result,
        buf: job.buf,
    }
}

/// How often the staging directory is looked at for abandoned entries.
const STAGING_SWEEP_EVERY: Duration = Duration::from_secs(3600);

/// Removes abandoned partial files now and every hour on a thread of its
/// own, for as long as the receiver holds DEST; what went is reported
/// through `done`.
fn start_staging_cleaner(
    dest: &Arc<DestDir>,
    ttl: Duration,
    quota: Option<Arc<StagedQuota>>,
    done: mpsc::Sender<Done>,
    notify: Arc<Notify>,
) -> std::io::Result<()> {
    let sweep = move |dest: &DestDir| {
        let before = std::time::SystemTime::now()
            .checked_sub(ttl)
            .unwrap_or(std::time::UNIX_EPOCH);
        let swept = dest.remove_staged_unchanged_since(before);
        // Claims go as their partial files do, and stop counting.
        if let Some(quota) = &quota {
            quota.forget_swept(dest);
        }
        if let Ok((entries, bytes)) = swept {
            if entries > 0 {
                let _ = done.send(Done::StagingCleaned {
                    entries,
                    bytes,
                    ttl,
                });
                notify.notify_one();
            }
        }
    };
    let held = Arc::downgrade(dest);
    sweep(dest);
    thread::Builder::new()
        .name("atou-staging".into())
        .spawn(move || loop {
            // Wakes often to see the receiver gone; sweeps hourly.
            let next = Instant::now() + STAGING_SWEEP_EVERY;
            while Instant::now() < next {
                thread::sleep(Duration::from_secs(1));
                if held.strong_count() == 0 {
                    return;
                }
            }
            match held.upgrade() {
                Some(dest) => sweep(&dest),
                None => return,
            }
        })?;
    Ok(())
}

/// A planner: checks plans against the disk and finishes transfers, off
/// the I/O thread. Plans are decoded here too: a manifest's decode is
/// work in proportion to its size.
fn planner(
    jobs: Arc<Mutex<mpsc::Receiver<PlanJob<Prepared>>>>,
    dest: Arc<DestDir>,
    rules: PlanRules,
    done: mpsc::Sender<Done>,
    notify: Arc<Notify>,
) {
    loop {
        let job = match jobs.lock().expect("a planner panicked").recv() {
            Ok(job) => job,
            Err(_) => return,
        };
        let result = match job {
            PlanJob::Plan {
                session,
                conn_id,
                bytes,
                grant,
                owner,
            } => match plan_one(&dest, &rules, &bytes, grant, owner) {
                Planned::Ready(result) => Done::Plan {
                    session,
                    conn_id,
                    result: Box::new(result),
                },
                Planned::Busy(why) => Done::PlanBusy {
                    session,
                    conn_id,
                    why,
                },
            },
            PlanJob::Finish {
                session,
                conn_id,
                plan,
                verified,
                hashes,
            } => {
                let result = dest::finish(&plan, &verified, &hashes);
                if let (Ok(_), Some(quota), Some(claim)) = (&result, &rules.quota, plan.claim) {
                    quota.release(&dest, claim, plan.unstaged_by_finish());
                }
                Done::Finish {
                    session,
                    conn_id,
                    result,
                }
            }
        };
        let _ = done.send(result);
        notify.notify_one();
    }
}

/// What a plan request comes to.
// One a plan, moved at once into a `Done`: its size costs nothing.
#[allow(clippy::large_enum_variant)]
enum Planned {
    /// Checked against the disk: prepared, or refused and why.
    Ready(Result<Prepared, Error>),
    /// Not now: come back later.
    Busy(String),
}

/// Decodes and checks one plan request from `owner` under `rules`.
fn plan_one(
    dest: &Arc<DestDir>,
    rules: &PlanRules,
    bytes: &[u8],
    grant: Option<Grant>,
    owner: Owner,
) -> Planned {
    let plan = match Request::decode(bytes) {
        Ok(Request::Plan(plan)) => plan,
        Ok(_) => return Planned::Ready(Err(Error::NotAPlan)),
        Err(e) => return Planned::Ready(Err(Error::MalformedPlan(e))),
    };
    if rules.dry_runs_only && !plan.options.dry_run {
        let why = "this receiver answers dry runs only (--dry-run) and writes nothing";
        return Planned::Ready(Err(Error::Refused { why: why.into() }));
    }
    if plan.manifest.entries.len() > rules.max_entries {
        let why = format!(
            "a transfer of {} entries, over this server's limit of {} (--max-files); send it \
             in parts",
            plan.manifest.entries.len(),
            rules.max_entries
        );
        return Planned::Ready(Err(Error::OverBudget { why }));
    }
    // A --checksum plan reads existing files whole: it may hold a planner
    // only while another is left for plans without it.
    let _place = if plan.options.checksum && plan.options.skip_existing {
        match ChecksumPlace::take(&rules.checksumming, rules.max_checksumming) {
            Some(place) => Some(place),
            None => {
                return Planned::Busy(format!(
                    "this server is busy: {} --checksum plans are being checked, its limit \
                     (one fewer than --planners)",
                    rules.max_checksumming
                ))
            }
        }
    } else {
        None
    };
    Planned::Ready(prepare(dest, rules, *plan, grant, owner))
}

/// Checks a decoded plan against the disk, counting what it stages
/// against `owner`'s quota.
fn prepare(
    dest: &Arc<DestDir>,
    rules: &PlanRules,
    plan: PlanRequest,
    grant: Option<Grant>,
    owner: Owner,
) -> Result<Prepared, Error> {
    let policy = &rules.policy;
    let record = !plan.options.dry_run;
    let mut claim = None;
    let admit = |files: &[ToStage<'_>]| match &rules.quota {
        Some(quota) => quota.admit(dest, owner, files, record).map(|c| claim = c),
        None => Ok(()),
    };
    let prepared = policy
        .requested
        .as_ref()
        .map_or(Ok(()), |r| r.check(&plan))
        .and_then(|()| granted(plan, policy, grant))
        .and_then(|(plan, policy)| {
            fits(dest, &plan)?;
            dest::prepare(dest, &policy, plan, rules.max_checksum_bytes, admit)
        });
    match (prepared, &rules.quota, claim) {
        (Ok(mut p), _, claim) => {
            p.claim = claim;
            Ok(p)
        }
        // Admitted, then failed (creating its directories): nothing of
        // it is staged.
        (Err(why), Some(quota), Some(claim)) => {
            quota.withdraw(dest, claim);
            Err(why)
        }
        (Err(why), ..) => Err(why),
    }
}

/// One of the places `--checksum` plans share; given back when dropped.
struct ChecksumPlace<'a>(&'a AtomicUsize);

impl<'a> ChecksumPlace<'a> {
    fn take(taken: &'a AtomicUsize, places: usize) -> Option<ChecksumPlace<'a>> {
        if taken.fetch_add(1, Ordering::AcqRel) >= places {
            taken.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(ChecksumPlace(taken))
    }
}

impl Drop for ChecksumPlace<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The session keeps a value per chunk it is told of: a manifest cannot
/// claim more than DEST's whole file system, checked before anything is
/// allocated or written.
fn fits(dest: &DestDir, plan: &PlanRequest) -> Result<(), Error> {
    let total = crate::transfer::file_sizes(&plan.manifest)
        .iter()
        .fold(0u64, |a, &s| a.saturating_add(s));
    match dest.filesystem_size() {
        Ok(fs_size) if total > fs_size => Err(Error::OverBudget {
            why: format!(
                "the files add up to {}, more than the whole file system of {} ({})",
                crate::util::units::format_size(total),
                dest.shown(b"").display(),
                crate::util::units::format_size(fs_size)
            ),
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A compressed chunk expands to its length or is refused: a bomb
    /// (64 MiB of zeros in a frame of a few KiB) stops at the chunk's
    /// buffer, and garbage fails; the expander works on after both.
    #[test]
    fn an_expander_gives_exactly_the_chunks_length_or_nothing() {
        let mut expander = Expander::default();
        let text: Vec<u8> = b"fn main() { let x = 1; }\n".repeat(400);
        let frame = zstd::bulk::compress(&text, 3).unwrap();
        let bomb = zstd::bulk::compress(&vec![0u8; 64 << 20], 3).unwrap();
        assert!(expander.expand(&bomb, 1 << 20).is_err(), "the bomb");
        assert!(expander.expand(&text[..300], 1 << 20).is_err(), "garbage");
        assert!(
            expander.expand(&frame, text.len() as u32 + 1).is_err(),
            "short"
        );
        assert_eq!(
            expander.expand(&frame, text.len() as u32).unwrap(),
            &text[..]
        );
    }

    #[test]
    fn checksum_plans_share_their_places_and_give_them_back() {
        let taken = AtomicUsize::new(0);
        let first = ChecksumPlace::take(&taken, 1).expect("a place");
        assert!(ChecksumPlace::take(&taken, 1).is_none(), "only one place");
        assert_eq!(taken.load(Ordering::Relaxed), 1);
        drop(first);
        let again = ChecksumPlace::take(&taken, 1);
        assert!(again.is_some(), "given back when dropped");
    }
}

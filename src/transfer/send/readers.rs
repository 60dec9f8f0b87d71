//! The reading side of a send: a pool of reader threads that read chunks
//! with positioned reads and hash them as they go, for whichever data
//! stream (or the resume compare) asks, and each stream's [`FileFeed`],
//! which reads ahead within its budget and frees what is acknowledged.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;

use tokio::sync::Notify;

use super::session::Plan;
use super::{Progress, StreamLive};
use crate::io::coupling::GroupMember;
use crate::io::StreamFeed;
use crate::proto::PayloadSource;
use crate::transfer::chunk_buf::ChunkBuf;
use crate::transfer::compress::{next_level, ChunkCompressor, Encoding, FrameHeader};
use crate::transfer::hash::{chunk_cv, chunk_len, Cv};
use crate::transfer::layout::{header_for, Layout, CV_LEN};
use crate::transfer::messages::ChunkRef;
use crate::transfer::messages::DataHeader;
use crate::transfer::source::Sources;
use crate::transfer::Error;

/// A chunk read from disk: its data as it is to be sent (raw, or
/// compressed) followed by its BLAKE3 value (of the raw data).
struct ReadDone {
    slot: usize,
    result: Result<ChunkBuf, Error>,
    encoding: Encoding,
}

struct ReadJob {
    sources: Arc<Sources>,
    file: usize,
    chunk: u64,
    slot: usize,
    /// Compress it if that pays (`--compress`).
    compress: bool,
    done: mpsc::Sender<ReadDone>,
    notify: Arc<Notify>,
}

/// What the readers share for `--compress`: the level they compress at,
/// and what they compressed and how long it took, for
/// [`Readers::step_level`].
struct Compression {
    level: AtomicI32,
    raw_bytes: AtomicU64,
    nanos: AtomicU64,
}

impl Default for Compression {
    fn default() -> Compression {
        Compression {
            // zstd's own default, in the middle of compress::LEVELS.
            level: AtomicI32::new(3),
            raw_bytes: AtomicU64::new(0),
            nanos: AtomicU64::new(0),
        }
    }
}

/// A reader thread's compressor (made at its first chunk to compress)
/// and the buffer it compresses into, reused.
#[derive(Default)]
struct ReaderZstd {
    compressor: Option<ChunkCompressor>,
    out: Vec<u8>,
}

/// Compresses a chunk just read (`buf`: data then value) if that pays:
/// the frame goes into a buffer of its own length from the pool, and the
/// raw one back to it.
fn compress_chunk(
    buf: ChunkBuf,
    zstd: &mut ReaderZstd,
    shared: &Compression,
    pool: &ChunkPool,
) -> (ChunkBuf, Encoding) {
    let level = shared.level.load(Ordering::Relaxed);
    let compressor = match &mut zstd.compressor {
        Some(c) => c,
        None => match ChunkCompressor::new(level) {
            Ok(c) => zstd.compressor.insert(c),
            Err(_) => return (buf, Encoding::Raw),
        },
    };
    if compressor.set_level(level).is_err() {
        return (buf, Encoding::Raw);
    }
    let len = buf.len() - CV_LEN as usize;
    let started = std::time::Instant::now();
    let encoding = compressor.compress(&buf[..len], &mut zstd.out);
    shared
        .nanos
        .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
    shared.raw_bytes.fetch_add(len as u64, Ordering::Relaxed);
    if encoding == Encoding::Raw {
        return (buf, encoding);
    }
    let wire = zstd.out.len();
    let mut framed = pool.take(wire + CV_LEN as usize);
    framed[..wire].copy_from_slice(&zstd.out);
    framed[wire..].copy_from_slice(&buf[len..]);
    pool.give(buf);
    (framed, encoding)
}

/// Chunk buffers handed back once the receiver has acknowledged them, so
/// that a reader neither zeroes nor faults in a fresh megabyte for every
/// chunk (a 1 GiB copy spent 4 % of its CPU in memset doing so).
#[derive(Default)]
struct ChunkPool(Mutex<Vec<ChunkBuf>>);

impl ChunkPool {
    /// Enough for the read-ahead of a few streams; past it buffers are
    /// freed, so an idle pool holds at most this many megabytes.
    const KEEP: usize = 32;

    /// A buffer of `len` bytes, holding whatever its last chunk left: the
    /// reader overwrites every one of them.
    fn take(&self, len: usize) -> ChunkBuf {
        let mut buf = self.0.lock().expect("pool lock").pop().unwrap_or_default();
        buf.set_len(len);
        buf
    }

    fn give(&self, buf: ChunkBuf) {
        let mut pool = self.0.lock().expect("pool lock");
        if pool.len() < Self::KEEP {
            pool.push(buf);
        }
    }
}

/// Reads a chunk from its file's one descriptor (see [`Sources`]) and
/// appends its BLAKE3 value.
fn read_chunk(job: &ReadJob, pool: &ChunkPool) -> Result<ChunkBuf, Error> {
    let size = job.sources.size(job.file);
    let len = chunk_len(size, job.chunk);
    let mut buf = pool.take(len + CV_LEN as usize);
    job.sources
        .read_chunk(job.file, job.chunk, &mut buf[..len])?;
    let cv = chunk_cv(size, job.chunk, &buf[..len]);
    buf[len..].copy_from_slice(&cv);
    Ok(buf)
}

/// Reader threads: read and hash chunks for whichever stream asks.
pub(super) struct Readers {
    jobs: mpsc::Sender<ReadJob>,
    pool: Arc<ChunkPool>,
    compression: Arc<Compression>,
    threads: usize,
}

impl Readers {
    pub(super) fn start(n: usize) -> Readers {
        let (jobs, rx) = mpsc::channel::<ReadJob>();
        let rx = Arc::new(Mutex::new(rx));
        let pool = Arc::new(ChunkPool::default());
        let compression = Arc::new(Compression::default());
        for i in 0..n.max(1) {
            let rx = rx.clone();
            let pool = pool.clone();
            let shared = compression.clone();
            let mut zstd = ReaderZstd::default();
            thread::Builder::new()
                .name(format!("atou-reader-{i}"))
                .spawn(move || loop {
                    let job = match rx.lock().expect("a reader panicked").recv() {
                        Ok(j) => j,
                        Err(_) => return,
                    };
                    let (result, encoding) = match read_chunk(&job, &pool) {
                        Ok(buf) if job.compress => {
                            let (buf, encoding) = compress_chunk(buf, &mut zstd, &shared, &pool);
                            (Ok(buf), encoding)
                        }
                        other => (other, Encoding::Raw),
                    };
                    let _ = job.done.send(ReadDone {
                        slot: job.slot,
                        result,
                        encoding,
                    });
                    job.notify.notify_one();
                })
                .expect("cannot start a reader thread");
        }
        Readers {
            jobs,
            pool,
            compression,
            threads: n.max(1),
        }
    }

    /// Steps the compression level (`compress::next_level`) from what the
    /// readers compressed since the last step, all of them together, and
    /// `link_rate`: the raw bytes per second the receiver acknowledged.
    pub(super) fn step_level(&self, link_rate: f64) {
        let c = &self.compression;
        let raw = c.raw_bytes.swap(0, Ordering::Relaxed);
        let nanos = c.nanos.swap(0, Ordering::Relaxed);
        if raw == 0 || nanos == 0 || link_rate <= 0.0 {
            return;
        }
        let compress_rate = raw as f64 * 1e9 / nanos as f64 * self.threads as f64;
        let level = c.level.load(Ordering::Relaxed);
        c.level.store(
            next_level(level, compress_rate, link_rate),
            Ordering::Relaxed,
        );
    }

    /// Reads and hashes `chunks` of `sources`; their values, in the order
    /// the reads finish, or the first read that failed.
    pub(super) fn values(
        &self,
        sources: &Arc<Sources>,
        chunks: &[ChunkRef],
    ) -> Result<Vec<(ChunkRef, Cv)>, Error> {
        let (tx, rx) = mpsc::channel();
        let notify = Arc::new(Notify::new());
        for c in chunks {
            sources.expect(c.file as usize, 1);
        }
        for (slot, c) in chunks.iter().enumerate() {
            let _ = self.jobs.send(ReadJob {
                sources: sources.clone(),
                file: c.file as usize,
                chunk: c.chunk,
                slot,
                compress: false,
                done: tx.clone(),
                notify: notify.clone(),
            });
        }
        drop(tx);
        let mut values = Vec::with_capacity(chunks.len());
        for done in rx {
            let buf = done.result?;
            let len = buf.len() - CV_LEN as usize;
            values.push((chunks[done.slot], buf[len..].try_into().expect("32 bytes")));
        }
        Ok(values)
    }
}

/// One data stream's bytes: its header, then chunks read ahead by the
/// readers, each freed once acknowledged.
pub(super) struct FileFeed {
    header: Vec<u8>,
    layout: Layout,
    sources: Arc<Sources>,
    jobs: mpsc::Sender<ReadJob>,
    pool: Arc<ChunkPool>,
    done_tx: mpsc::Sender<ReadDone>,
    done_rx: mpsc::Receiver<ReadDone>,
    notify: Arc<Notify>,
    /// Chunks read and not yet acknowledged, by slot.
    ready: BTreeMap<usize, ChunkBuf>,
    /// Next slot to ask the readers for.
    next_request: usize,
    /// Bytes asked for or held, not yet freed.
    held_bytes: u64,
    budget: u64,
    /// Every slot below this one is acknowledged and freed.
    first_held: usize,
    /// Every stream byte below this is ready.
    contiguous: u64,
    cvs: Vec<(ChunkRef, Cv)>,
    shown: Shown,
    /// Stream bytes of acknowledged data counted into progress so far.
    counted: u64,
    siblings: Siblings,
    /// Its place among the streams coupled as one flow; `None`: a flow
    /// of its own.
    coupled: Option<GroupMember>,
    /// Of a framed stream (`--compress`): the bytes its chunks take in it.
    wire_bytes: Option<u64>,
}

/// Where a data stream's progress shows.
pub(super) struct Shown {
    pub(super) progress: Arc<Progress>,
    /// This stream's place in `progress.current`.
    pub(super) index: usize,
    /// The files' names, for `progress.current`.
    pub(super) names: Arc<Vec<String>>,
    pub(super) live: Arc<StreamLive>,
}

/// The streams of one round, as each sees the others finish: once every
/// byte of a stream is acknowledged, the rest hear of it once each
/// (`StreamFeed::sibling_done`).
#[derive(Debug, Clone, Default)]
pub(super) struct Siblings {
    /// Streams of the round whose every byte is acknowledged.
    finished: Arc<AtomicUsize>,
    /// How many of them this stream has heard of, itself included.
    heard: usize,
    done: bool,
}

impl Siblings {
    /// This stream has `acked` of its `total` bytes acknowledged.
    fn acked(&mut self, acked: u64, total: u64) {
        if !self.done && acked >= total {
            self.done = true;
            self.finished.fetch_add(1, Ordering::Relaxed);
            self.heard += 1;
        }
    }

    /// True when another stream has finished since the last call.
    fn news(&mut self) -> bool {
        let finished = self.finished.load(Ordering::Relaxed);
        let news = finished > self.heard;
        self.heard = finished;
        news
    }
}

impl FileFeed {
    /// Stream `shown.index` of a round, carrying `share` of `plan`'s
    /// files, read ahead by `readers` within `budget` bytes.
    pub(super) fn new(
        share: &[ChunkRef],
        plan: &Plan,
        readers: &Readers,
        budget: u64,
        shown: Shown,
        siblings: Siblings,
    ) -> FileFeed {
        let header = header_for(share);
        let layout = Layout::new(&header, &plan.sizes);
        let (done_tx, done_rx) = mpsc::channel();
        FileFeed {
            header: header.encode(),
            wire_bytes: None,
            layout,
            sources: plan.sources.clone(),
            jobs: readers.jobs.clone(),
            pool: readers.pool.clone(),
            done_tx,
            done_rx,
            notify: Arc::new(Notify::new()),
            ready: BTreeMap::new(),
            next_request: 0,
            held_bytes: 0,
            budget,
            first_held: 0,
            contiguous: 0,
            cvs: Vec::new(),
            shown,
            counted: 0,
            siblings,
            coupled: None,
        }
    }

    /// Stream `shown.index` of a round of a `--compress` session: every
    /// chunk of `share` (at most `budget` bytes of them, raw) is read and
    /// compressed where that pays before the stream can start, for its
    /// framed header lists each chunk's length as sent
    /// (docs/transfer.md, "Compression"). Blocks until they are.
    pub(super) fn framed(
        share: &[ChunkRef],
        plan: &Plan,
        readers: &Readers,
        shown: Shown,
        siblings: Siblings,
    ) -> Result<FileFeed, Error> {
        let header = header_for(share);
        let raw = Layout::new(&header, &plan.sizes);
        let (done_tx, done_rx) = mpsc::channel();
        let notify = Arc::new(Notify::new());
        for (i, slot) in raw.slots.iter().enumerate() {
            let _ = readers.jobs.send(ReadJob {
                sources: plan.sources.clone(),
                file: slot.chunk.file as usize,
                chunk: slot.chunk.chunk,
                slot: i,
                compress: true,
                done: done_tx.clone(),
                notify: notify.clone(),
            });
        }
        let mut ready = BTreeMap::new();
        let mut frames = vec![[0; crate::transfer::compress::FRAME_HEADER_LEN]; raw.slots.len()];
        let mut cvs = Vec::with_capacity(raw.slots.len());
        let mut first_error = None;
        for _ in 0..raw.slots.len() {
            let done = done_rx.recv().expect("the readers outlive the feed");
            let buf = match done.result {
                Ok(buf) => buf,
                Err(e) => {
                    first_error.get_or_insert(e);
                    continue;
                }
            };
            let wire_len = buf.len() - CV_LEN as usize;
            cvs.push((
                raw.slots[done.slot].chunk,
                buf[wire_len..].try_into().expect("32 bytes"),
            ));
            frames[done.slot] = FrameHeader {
                encoding: done.encoding,
                wire_len: wire_len as u32,
            }
            .encode();
            ready.insert(done.slot, buf);
        }
        if let Some(e) = first_error {
            return Err(e);
        }
        let layout = Layout::framed(&header, &frames, &plan.sizes)
            .expect("frames made by compress::ChunkCompressor fit their chunks");
        let held: u64 = layout.slots.iter().map(|s| s.wire_bytes()).sum();
        let count = layout.slots.len();
        let contiguous = layout.total_len();
        Ok(FileFeed {
            header: DataHeader::encode_framed(&header, &frames),
            wire_bytes: Some(held - count as u64 * CV_LEN),
            layout,
            sources: plan.sources.clone(),
            jobs: readers.jobs.clone(),
            pool: readers.pool.clone(),
            done_tx,
            done_rx,
            notify,
            ready,
            next_request: count,
            held_bytes: held,
            budget: held,
            first_held: 0,
            contiguous,
            cvs,
            shown,
            counted: 0,
            siblings,
            coupled: None,
        })
    }

    /// Of a framed stream, the bytes its chunks took as sent (their
    /// values not counted); `None` for a plain one.
    pub(super) fn wire_bytes(&self) -> Option<u64> {
        self.wire_bytes
    }

    /// The same stream, coupled with others of its round as `member`
    /// of their group (`None`: on its own).
    pub(super) fn coupled(self, member: Option<GroupMember>) -> FileFeed {
        FileFeed {
            coupled: member,
            ..self
        }
    }

    /// The stream's length: header, chunks and their values.
    pub(super) fn stream_len(&self) -> u64 {
        self.layout.total_len()
    }

    pub(super) fn chunks(&self) -> usize {
        self.layout.slots.len()
    }

    /// File bytes the stream carries.
    pub(super) fn file_bytes(&self) -> u64 {
        self.layout.slots.iter().map(|s| u64::from(s.len)).sum()
    }

    pub(super) fn live(&self) -> &Arc<StreamLive> {
        &self.shown.live
    }

    /// Counts into progress what of the stream's `file_bytes` was
    /// acknowledged but not yet counted, once the connection is over.
    pub(super) fn count_rest(&mut self) {
        let rest = self.file_bytes().saturating_sub(self.counted);
        self.shown.progress.done.fetch_add(rest, Ordering::Relaxed);
        self.shown.live.bytes.fetch_add(rest, Ordering::Relaxed);
        self.counted += rest;
    }

    /// The values of the chunks read so far.
    pub(super) fn values(&self) -> &[(ChunkRef, Cv)] {
        &self.cvs
    }

    /// The values of the chunks read so far, taken out.
    pub(super) fn take_values(&mut self) -> Vec<(ChunkRef, Cv)> {
        std::mem::take(&mut self.cvs)
    }

    fn slot_bytes(&self, i: usize) -> u64 {
        self.layout.slots[i].wire_bytes()
    }

    /// Takes in the chunks the readers have finished.
    fn take_reads(&mut self) -> Result<(), Error> {
        while let Ok(done) = self.done_rx.try_recv() {
            let buf = done.result?;
            let slot = self.layout.slots[done.slot];
            let len = slot.wire_len as usize;
            let cv: Cv = buf[len..].try_into().expect("32 bytes");
            self.cvs.push((slot.chunk, cv));
            self.ready.insert(done.slot, buf);
        }
        Ok(())
    }

    /// Frees what the receiver has acknowledged, counting it as done.
    fn free_acked(&mut self, acked: u64) {
        while self.first_held < self.next_request
            && self.layout.slots[self.first_held].end() <= acked
        {
            let Some(buf) = self.ready.remove(&self.first_held) else {
                break;
            };
            self.pool.give(buf);
            self.held_bytes -= self.slot_bytes(self.first_held);
            let len = u64::from(self.layout.slots[self.first_held].len);
            self.shown.progress.done.fetch_add(len, Ordering::Relaxed);
            self.shown.live.bytes.fetch_add(len, Ordering::Relaxed);
            self.counted += len;
            self.first_held += 1;
            self.show_current();
        }
    }

    /// Names the file of the first chunk not yet acknowledged as this
    /// stream's current one.
    fn show_current(&self) {
        let Some(next) = self.layout.slots.get(self.first_held) else {
            return;
        };
        let Shown {
            progress,
            index,
            names,
            ..
        } = &self.shown;
        let name = &names[next.chunk.file as usize];
        let mut current = progress.current.lock().expect("progress lock");
        if current.get(*index) != Some(name) {
            if let Some(c) = current.get_mut(*index) {
                c.clone_from(name);
            }
        }
    }

    /// Asks the readers for more, within the budget (always at least one
    /// chunk).
    fn read_ahead(&mut self) {
        while self.next_request < self.layout.slots.len()
            && (self.held_bytes == 0
                || self.held_bytes + self.slot_bytes(self.next_request) <= self.budget)
        {
            let i = self.next_request;
            let slot = self.layout.slots[i];
            let _ = self.jobs.send(ReadJob {
                sources: self.sources.clone(),
                file: slot.chunk.file as usize,
                chunk: slot.chunk.chunk,
                slot: i,
                compress: false,
                done: self.done_tx.clone(),
                notify: self.notify.clone(),
            });
            self.held_bytes += self.slot_bytes(i);
            self.next_request += 1;
        }
    }

    /// Moves the end of the bytes ready from the start over every chunk
    /// now in memory.
    fn extend_contiguous(&mut self) -> u64 {
        let mut end = self.contiguous.max(self.layout.header_len);
        let mut i = self.layout.slot_at(end).unwrap_or(self.layout.slots.len());
        while i < self.layout.slots.len() && self.ready.contains_key(&i) {
            end = self.layout.slots[i].end();
            i += 1;
        }
        self.contiguous = end;
        end
    }
}

impl PayloadSource for FileFeed {
    fn read_at(&mut self, mut offset: u64, mut buf: &mut [u8]) {
        while !buf.is_empty() {
            let (src, at): (&[u8], u64) = if offset < self.layout.header_len {
                (&self.header, offset)
            } else {
                let i = self
                    .layout
                    .slot_at(offset)
                    .expect("the sender reads inside the stream");
                let data = self
                    .ready
                    .get(&i)
                    .expect("the sender reads only bytes made available");
                (data, offset - self.layout.slots[i].offset)
            };
            let n = (src.len() - at as usize).min(buf.len());
            buf[..n].copy_from_slice(&src[at as usize..at as usize + n]);
            buf = &mut buf[n..];
            offset += n as u64;
        }
    }
}

impl StreamFeed for FileFeed {
    fn refill(&mut self, acked: u64) -> Result<Option<u64>, crate::io::FeedError> {
        self.siblings.acked(acked, self.layout.total_len());
        // The transport's feed speaks in messages: the read's error ends
        // the connection as its one line.
        self.take_reads().map_err(|e| e.to_string())?;
        self.free_acked(acked);
        self.read_ahead();
        Ok(Some(self.extend_contiguous()))
    }

    fn waker(&self) -> Option<Arc<Notify>> {
        Some(self.notify.clone())
    }

    fn sibling_done(&mut self) -> bool {
        self.siblings.news()
    }

    fn coupling(&mut self, delivered: u64) -> Option<(u64, f64, u64)> {
        let finished = self.siblings.done;
        self.coupled.as_mut().map(|m| m.couple(delivered, finished))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transfer::hash::CHUNK_SIZE;
    use crate::transfer::source::tests::sources;

    /// A pooled buffer is reused, not zeroed, for a shorter chunk: the
    /// stream gets that chunk's bytes and value, never the bytes the
    /// buffer held past them, and the value is of those bytes only.
    #[test]
    fn a_reused_buffer_carries_only_the_shorter_chunks_bytes_and_value() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let size = CHUNK_SIZE + 10;
        let data: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let sources = Arc::new(sources(&path));
        let pool = ChunkPool::default();
        let mut stale = ChunkBuf::default();
        stale.set_len((CHUNK_SIZE + CV_LEN) as usize);
        stale.fill(0xee);
        let reused = stale.as_ptr();
        pool.give(stale);
        sources.expect(0, 1);
        let job = ReadJob {
            sources,
            file: 0,
            chunk: 1,
            slot: 0,
            compress: false,
            done: mpsc::channel().0,
            notify: Arc::new(Notify::new()),
        };
        let buf = read_chunk(&job, &pool).unwrap();
        assert_eq!(buf.as_ptr(), reused, "the pooled buffer, reused");
        let tail = &data[CHUNK_SIZE as usize..];
        let mut want = tail.to_vec();
        want.extend_from_slice(&chunk_cv(size, 1, tail));
        assert_eq!(*buf, want[..], "10 bytes and their value");
    }

    /// Each stream hears of every other stream's finish once, and never
    /// of its own.
    #[test]
    fn a_stream_hears_once_of_each_other_stream_finishing() {
        let a = Siblings::default();
        let (mut a, mut b, mut c) = (a.clone(), a.clone(), a);
        a.acked(50, 100);
        assert!(!a.news() && !b.news() && !c.news());
        a.acked(100, 100);
        a.acked(100, 100);
        assert!(!a.news(), "its own finish");
        assert!(b.news());
        assert!(!b.news(), "once");
        b.acked(100, 100);
        assert!(a.news());
        assert!(!b.news());
        assert!(c.news(), "two finishes, heard as news");
        assert!(!c.news());
    }
}

//! Runs the [`crate::netem`] model in real time: one thread per direction
//! takes packets from a channel, holds them as the model says and hands them
//! to a sender when they are due.
//!
//! The channel's `recv_timeout` is the timer: it wakes for the next packet
//! or the model's next release, whichever is first, with the futex's
//! precision (tens of microseconds) rather than a runtime's millisecond tick,
//! which matters for `rate` at 100 Mbit/s (one 1500-byte packet per 120 µs).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::netem::{Datagram, Netem, NetemStats};
use crate::proto::Time;

/// Longest sleep between checks of the stop flag.
const IDLE_WAKE: Duration = Duration::from_millis(100);
/// How often the counts are published to [`Direction::stats`]: not per
/// packet, which would take a lock on the forwarding path.
const PUBLISH_EVERY: Duration = Duration::from_millis(50);

/// A direction running on its own thread.
pub(crate) struct Direction {
    stats: Arc<Mutex<NetemStats>>,
    thread: Option<JoinHandle<()>>,
}

impl Direction {
    /// Starts a thread that feeds `input` through `netem` into `output`.
    /// `epoch` is time zero for the model; `stop` ends the thread.
    pub(crate) fn spawn<P, F>(
        name: &str,
        mut netem: Netem<P>,
        input: Receiver<P>,
        mut output: F,
        epoch: Instant,
        stop: Arc<AtomicBool>,
    ) -> std::io::Result<Direction>
    where
        P: Datagram + Send + 'static,
        F: FnMut(P) + Send + 'static,
    {
        let stats = Arc::new(Mutex::new(NetemStats::default()));
        let shared = Arc::clone(&stats);
        let now = move || Time::from_nanos(epoch.elapsed().as_nanos() as u64);
        let thread = std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || {
                let mut published = Instant::now();
                while !stop.load(Ordering::Relaxed) {
                    let t = now();
                    while let Some(p) = netem.poll(t) {
                        output(p);
                    }
                    if published.elapsed() >= PUBLISH_EVERY {
                        *shared.lock().unwrap_or_else(|e| e.into_inner()) = netem.stats();
                        published = Instant::now();
                    }
                    let wait = netem
                        .next_release()
                        .map_or(IDLE_WAKE, |at| at.saturating_since(t).min(IDLE_WAKE));
                    match input.recv_timeout(wait) {
                        Ok(p) => {
                            netem.enqueue(now(), p);
                            // Take whatever else is waiting before sleeping.
                            while let Ok(p) = input.try_recv() {
                                netem.enqueue(now(), p);
                            }
                        }
                        Err(RecvTimeoutError::Timeout) => {}
                        Err(RecvTimeoutError::Disconnected) => break,
                    }
                }
                *shared.lock().unwrap_or_else(|e| e.into_inner()) = netem.stats();
            })?;
        Ok(Direction {
            stats,
            thread: Some(thread),
        })
    }

    /// What the model has done so far.
    pub(crate) fn stats(&self) -> NetemStats {
        *self.stats.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits for the thread to end (after `stop` is set) and returns the
    /// final counts.
    pub(crate) fn join(mut self) -> NetemStats {
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.stats()
    }
}

/// What a relay did with its sources (client addresses).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub(crate) struct SourceStats {
    /// Sources given a socket and a thread towards the server.
    pub opened: u64,
    /// Of those, forgotten after `--idle` without a datagram.
    pub reclaimed: u64,
    /// Sources held now.
    pub live: u64,
    /// Datagrams dropped because `--max-sources` were held already.
    pub refused: u64,
}

/// A relay's per-source state (a socket and a thread each), capped at
/// `max` sources and forgotten after `idle` without a datagram from the
/// source: whoever can send UDP to the relay cannot make it hold more.
/// Time comes in as an argument.
#[derive(Debug)]
pub(crate) struct SourceTable<T> {
    entries: std::collections::HashMap<std::net::SocketAddr, (T, Instant)>,
    max: usize,
    idle: Duration,
    stats: SourceStats,
}

impl<T> SourceTable<T> {
    pub(crate) fn new(max: usize, idle: Duration) -> SourceTable<T> {
        SourceTable {
            entries: std::collections::HashMap::new(),
            max,
            idle,
            stats: SourceStats::default(),
        }
    }

    /// The state of `source`, which just sent a datagram: held already,
    /// or made by `open` if there is room; `None` when the table is full
    /// (the datagram is counted as refused) or `open` failed.
    pub(crate) fn admit<E>(
        &mut self,
        now: Instant,
        source: std::net::SocketAddr,
        open: impl FnOnce() -> Result<T, E>,
    ) -> Result<Option<&T>, E> {
        use std::collections::hash_map::Entry;
        let room = self.entries.len() < self.max;
        match self.entries.entry(source) {
            Entry::Occupied(e) => {
                let (value, seen) = e.into_mut();
                *seen = now;
                Ok(Some(value))
            }
            Entry::Vacant(_) if !room => {
                self.stats.refused += 1;
                Ok(None)
            }
            Entry::Vacant(e) => {
                let (value, _) = e.insert((open()?, now));
                self.stats.opened += 1;
                Ok(Some(value))
            }
        }
    }

    /// Removes and returns the sources idle for `idle` or longer.
    pub(crate) fn reclaim(&mut self, now: Instant) -> Vec<T> {
        let idle = self.idle;
        let stale: Vec<std::net::SocketAddr> = self
            .entries
            .iter()
            .filter(|(_, (_, seen))| now.saturating_duration_since(*seen) >= idle)
            .map(|(a, _)| *a)
            .collect();
        self.stats.reclaimed += stale.len() as u64;
        stale
            .iter()
            .filter_map(|a| self.entries.remove(a).map(|(v, _)| v))
            .collect()
    }

    /// Removes and returns every source (the relay is stopping).
    pub(crate) fn drain(&mut self) -> Vec<T> {
        self.entries.drain().map(|(_, (v, _))| v).collect()
    }

    pub(crate) fn max(&self) -> usize {
        self.max
    }

    pub(crate) fn idle(&self) -> Duration {
        self.idle
    }

    pub(crate) fn stats(&self) -> SourceStats {
        SourceStats {
            live: self.entries.len() as u64,
            ..self.stats
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    fn admit(t: &mut SourceTable<u16>, now: Instant, port: u16) -> Option<u16> {
        let opened: Result<_, ()> = t.admit(now, addr(port), || Ok(port));
        opened.unwrap().copied()
    }

    /// N sources are held; the N+1th is refused (not opened) and counted,
    /// and a source already held still gets through.
    #[test]
    fn a_source_beyond_the_cap_is_refused_and_counted() {
        let t0 = Instant::now();
        let mut t = SourceTable::new(3, Duration::from_secs(60));
        for port in 1..=3 {
            assert_eq!(admit(&mut t, t0, port), Some(port));
        }
        let mut opened = false;
        let refused: Result<_, ()> = t.admit(t0, addr(4), || {
            opened = true;
            Ok(4)
        });
        assert_eq!(refused, Ok(None));
        assert!(!opened, "nothing is opened for a refused source");
        assert_eq!(admit(&mut t, t0, 4), None);
        assert_eq!(admit(&mut t, t0, 2), Some(2));
        let s = t.stats();
        assert_eq!((s.opened, s.live, s.refused, s.reclaimed), (3, 3, 2, 0));
    }

    /// A source idle for the timeout is reclaimed (the count of live
    /// sources goes down and its state is handed back to be closed); one
    /// that sent meanwhile stays; the freed room takes a new source.
    #[test]
    fn a_source_idle_past_the_timeout_is_reclaimed() {
        let t0 = Instant::now();
        let idle = Duration::from_secs(60);
        let mut t = SourceTable::new(2, idle);
        admit(&mut t, t0, 1);
        admit(&mut t, t0, 2);
        admit(&mut t, t0 + Duration::from_secs(30), 2);
        assert!(t.reclaim(t0 + idle - Duration::from_millis(1)).is_empty());
        assert_eq!(t.reclaim(t0 + idle), vec![1]);
        assert_eq!(t.stats().live, 1);
        assert_eq!(admit(&mut t, t0 + idle, 3), Some(3));
        assert_eq!(t.reclaim(t0 + idle + Duration::from_secs(30)), vec![2]);
        let s = t.stats();
        assert_eq!((s.opened, s.live, s.refused, s.reclaimed), (3, 1, 0, 2));
    }
}

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
pub struct Direction {
    stats: Arc<Mutex<NetemStats>>,
    thread: Option<JoinHandle<()>>,
}

impl Direction {
    /// Starts a thread that feeds `input` through `netem` into `output`.
    /// `epoch` is time zero for the model; `stop` ends the thread.
    pub fn spawn<P, F>(
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
    pub fn stats(&self) -> NetemStats {
        *self.stats.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits for the thread to end (after `stop` is set) and returns the
    /// final counts.
    pub fn join(mut self) -> NetemStats {
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.stats()
    }
}
